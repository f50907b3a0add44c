//! Issue #33: a library owner that only claims and releases through lease-fs, and never
//! prunes, keeps a bounded `lease/` folder, because every release compacts when due
//! (PROTOCOL §7.3 step 7). A crash after any system call of such a release leaves a run
//! that recovers, and its fsyncs are the release's plus the prune's (§7.13).

use lease_core::LeaseOps;
use lease_core::ops::{
    AuthorityLease, ClaimParams, CompactPolicy, LivenessEvidence, LockEvidence, OwnedLease,
    ProcessState, ReleaseParams, RetireParams, Status,
};
use lease_core::*;
use lease_fs::{FsError, Liveness, RunDir, SimFs, this_holder};
use std::path::Path;
use std::sync::Arc;

fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_796_169_600_000 + ms).unwrap()
}

fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

fn claim(run: &RunDir, owner: &str, holder: &Holder, now: u64) -> Result<OwnedLease, FsError> {
    run.claim(ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: id(owner),
        holder: holder.clone(),
        policy: TimingPolicy::default(),
        now: t(now),
        store_floor: None,
    })
}

fn release(run: &RunDir, lease: &OwnedLease, now: u64) -> Result<Generation, FsError> {
    run.release(ReleaseParams {
        lease: lease.clone(),
        now: t(now),
        seal: None,
    })
}

fn entries(root: &Path, dir: &str) -> usize {
    match std::fs::read_dir(root.join(dir)) {
        Ok(d) => d.count(),
        Err(_) => 0,
    }
}

// Issue #33, PROTOCOL §7.3 step 7
#[test]
fn two_hundred_reclaims_without_a_prune_keep_lease_epochs_small() {
    let p = CompactPolicy::DEFAULT;
    let bound = (p.every + p.keep + 2) as usize;
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("r");
    let run = RunDir::create(&root).unwrap();
    let holder = this_holder().unwrap();
    let mut most = [0usize; 3];
    for i in 0..200u64 {
        let l = claim(&run, "owner", &holder, 10 * i).unwrap();
        let g = release(&run, &l, 10 * i + 1).unwrap();
        assert_eq!(g.get(), 2 * i + 2);
        for (m, dir) in most
            .iter_mut()
            .zip(["lease/epochs", "lease/cutoffs", "lease/checkpoints"])
        {
            *m = (*m).max(entries(&root, dir));
        }
        assert!(
            most[0] <= bound,
            "cycle {i}: {} entries in lease/epochs (bound {bound})",
            most[0]
        );
    }
    assert!(most[1] <= bound, "{} cutoffs", most[1]);
    assert!(most[2] <= 1, "{} checkpoints", most[2]);
    // The chain still verifies, from the newest checkpoint.
    let v = run.verify().unwrap();
    assert!(v.floor.is_some());
    assert!(v.strays.is_empty());
    println!(
        "200 claim+release cycles, no prune: at most {} epochs, {} cutoffs, {} checkpoint(s)",
        most[0], most[1], most[2]
    );
}

/// After a power loss every recorded process is gone and every lock free.
struct AllDead;
impl Liveness for AllDead {
    fn probe(&self, h: &Holder) -> LivenessEvidence {
        LivenessEvidence {
            observer_boot_id: h.boot_id.clone(),
            process: ProcessState::Gone,
            owner_lock: LockEvidence::Free,
            lease: AuthorityLease::NotKept,
        }
    }
}

fn sim_holder() -> Holder {
    Holder {
        host: id("sim-host"),
        boot_id: id("boot-sim"),
        pid: 7,
        start_time: 77,
    }
}

fn run_on(sim: &SimFs) -> RunDir {
    RunDir::with_fs(
        Arc::new(sim.clone()),
        RunId::new("reclaim").unwrap(),
        Path::new("sim"),
        Arc::new(AllDead),
    )
}

/// Claims and releases (without the release's compaction) up to the claim of the
/// generation whose release is the first due one, with an event per cycle; returns that
/// lease and the acknowledged events.
fn before_the_due_release(run: &RunDir) -> (OwnedLease, u64) {
    let p = CompactPolicy::DEFAULT;
    let due = p.every + p.keep;
    let mut events = 0;
    let mut i = 0;
    loop {
        let l = claim(run, &format!("o{i}"), &sim_holder(), 100 * i).unwrap();
        run.append(
            &l,
            lease_core::ops::AppendParams {
                event_type: id("e"),
                payload: serde_json::json!(i),
                now: t(100 * i + 1),
                tail_hint: None,
            },
        )
        .unwrap();
        events += 1;
        if l.generation.get() + 1 == due {
            return (l, events);
        }
        run.release_compacting(
            ReleaseParams {
                lease: l,
                now: t(100 * i + 2),
                seal: None,
            },
            None,
        )
        .unwrap();
        i += 1;
    }
}

// PROTOCOL §7.13: a compacting release costs the release's fsyncs plus the prune's
#[test]
fn a_compacting_release_adds_the_prune_s_fsyncs() {
    let sim = SimFs::new();
    let run = run_on(&sim);
    let (l, _) = before_the_due_release(&run);
    sim.reset_counters();
    release(&run, &l, 10_000).unwrap();
    let fsyncs = sim.fsync_count() + sim.fsync_dir_count();
    // Release 4 (epoch 2, cutoff 2; the beat's removal unsynced) + the prune's checkpoint
    // 2 (its reads are not synced, its removals unsynced).
    assert_eq!(fsyncs, 6);
    assert!(
        sim.snapshot_live()
            .keys()
            .any(|k| k.starts_with("lease/checkpoints/")),
        "the release compacted"
    );
}

// PROTOCOL §7.3 step 7, §7.10, §9: a crash between any two steps leaves a valid state
#[test]
fn a_compacting_release_crashed_after_any_call_recovers() {
    let sim = SimFs::new();
    let run = run_on(&sim);
    let (l, _) = before_the_due_release(&run);
    let before = sim.calls();
    release(&run, &l, 10_000).unwrap();
    let n = sim.calls() - before;
    assert!(n > 20, "the release and its prune: {n} calls");
    let mut explored = 0;
    for k in 0..n {
        for tear in [false, true] {
            let sim = SimFs::new();
            let run = run_on(&sim);
            let (l, events) = before_the_due_release(&run);
            sim.crash_after(k);
            // Ok once the release itself is done (a crash in its compaction is not its
            // error); otherwise the simulated crash.
            let _ = release(&run, &l, 10_000);
            sim.recover(tear);
            let what = format!("crash after call {k} of {n} (tear {tear})");
            let run = run_on(&sim);
            let status = run
                .status(t(100_000), true)
                .unwrap_or_else(|e| panic!("{what}: status: {e}"));
            assert!(
                !matches!(status.status, Status::Invalid(_)),
                "{what}: {:?}",
                status.status
            );
            run.verify()
                .unwrap_or_else(|e| panic!("{what}: verify after recovery: {e}"));
            let counted = run
                .read_events(Some((id("recovery"), t(100_000))))
                .unwrap_or_else(|e| panic!("{what}: events: {e}"))
                .events
                .iter()
                .filter(|e| e.standing.counts())
                .count() as u64;
            assert_eq!(counted, events, "{what}: acknowledged events");
            // Progress: a new owner gets the run (retiring the crashed one if the release
            // was lost), releases it, and the release after that compacts as usual.
            if !matches!(status.status, Status::Free) {
                run.retire(RetireParams {
                    run_id: run.run_id().clone(),
                    owner_id: id("retirer"),
                    holder: sim_holder(),
                    policy: TimingPolicy::default(),
                    now: t(100_000),
                    expect: None,
                })
                .unwrap_or_else(|e| panic!("{what}: retire: {e}"));
            }
            for c in 0..10 {
                let l = claim(&run, "next", &sim_holder(), 200_000 + 10 * c)
                    .unwrap_or_else(|e| panic!("{what}: claim: {e}"));
                release(&run, &l, 200_000 + 10 * c + 1)
                    .unwrap_or_else(|e| panic!("{what}: release: {e}"));
            }
            let v = run.verify().unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(v.floor.is_some(), "{what}: compacted since");
            assert!(v.strays.is_empty(), "{what}: strays {:?}", v.strays);
            explored += 1;
        }
    }
    println!("crash states of a compacting release explored: {explored}");
}

// Issue #33: the system calls of a claim+release do not grow with the history
#[test]
fn the_calls_of_a_cycle_do_not_grow_with_the_history() {
    let p = CompactPolicy::DEFAULT;
    // One compaction period of claim+release cycles (each release adds two generations).
    let period = p.every / 2;
    let sim = SimFs::new();
    let run = run_on(&sim);
    let mut i = 0u64;
    let mut window = |cycles: u64| {
        let before = sim.calls();
        for _ in 0..cycles {
            let l = claim(&run, "owner", &sim_holder(), 10 * i).unwrap();
            release(&run, &l, 10 * i + 1).unwrap();
            i += 1;
        }
        sim.calls() - before
    };
    window(2 * period);
    let early = window(period);
    window(1_000 - 3 * period);
    let late = window(period);
    assert_eq!(
        late,
        early,
        "calls of {period} cycles: {early} after {} cycles, {late} after 1,000",
        2 * period
    );
}
