//! Crash points and countdown faults on the simulated file system.
//!
//! For each durable operation (claim, heartbeat under the durable policy, release,
//! takeover, retirement, append, prune) the operation runs on a `SimFs` that loses power
//! after every one of its system calls, once keeping only what was fsynced and once also
//! tearing the last unsynced write. Every recovered state must parse, have at most one
//! owner, keep every event whose append returned success, verify both hash chains, and
//! let a new owner make progress. Prints `crash states explored: N`.

use lease_core::LeaseOps;
use lease_core::ops::{
    AuthorityLease, Expectation, LivenessEvidence, LockEvidence, OwnedLease, ProcessState, Status,
    TakeoverTrigger,
};
use lease_core::*;
use lease_fs::{FsError, Liveness, RunDir, SimFs};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

const BOOT: &str = "boot-sim";

fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_796_169_600_000 + ms).unwrap()
}

fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

fn holder(pid: u32) -> Holder {
    Holder {
        host: id("sim-host"),
        boot_id: id(BOOT),
        pid,
        start_time: 77,
    }
}

/// After a power loss every recorded process is gone and every lock free.
struct AllDead;
impl Liveness for AllDead {
    fn probe(&self, _: &Holder) -> LivenessEvidence {
        LivenessEvidence {
            observer_boot_id: id(BOOT),
            process: ProcessState::Gone,
            owner_lock: LockEvidence::Free,
            lease: AuthorityLease::NotKept,
        }
    }
}

fn run_on(sim: &SimFs) -> RunDir {
    RunDir::with_fs(
        Arc::new(sim.clone()),
        RunId::new("crashrun").unwrap(),
        Path::new("sim"),
        Arc::new(AllDead),
    )
}

fn durable() -> TimingPolicy {
    TimingPolicy::default().with_durability(HeartbeatDurability::Durable)
}

/// What the pre-state established before the operation under test.
struct Pre {
    lease: Option<OwnedLease>,
    acked: BTreeSet<u64>,
}

/// What the operation under test reported.
enum Outcome {
    Lease(OwnedLease),
    Appended(u64),
    Other,
}

fn is_crash(e: &FsError) -> bool {
    matches!(e, FsError::Io { source, .. } if lease_fs::sim::is_simulated_crash(source))
}

type Prepare = fn(&RunDir) -> Pre;
type Operate = fn(&RunDir, &Pre) -> Result<Outcome, FsError>;

/// Claim the run as owner `a` (holder pid 1) at t = 0 under `policy`.
fn claim_a(run: &RunDir, policy: TimingPolicy) -> lease_core::ops::OwnedLease {
    run.claim(lease_core::ops::ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: id("a"),
        holder: holder(1),
        policy,
        now: t(0),
        store_floor: None,
    })
    .unwrap()
}

fn pre_owned(run: &RunDir) -> Pre {
    pre_with_events(run, 2)
}

/// Owned, with 127 events: a mark at 64 (left by the appender of event 64), and the next
/// append (event 128) leaves a new mark and removes the one at 64 (PROTOCOL §13.1).
fn pre_marked(run: &RunDir) -> Pre {
    let pre = pre_with_events(run, 127);
    let marks = std::fs::read_dir(run.root().join("lease/marks"));
    assert!(
        marks.is_err() || run.verify_tail().unwrap().started_at.is_some(),
        "the appender of event 64 left a mark"
    );
    pre
}

fn pre_with_events(run: &RunDir, n: u64) -> Pre {
    let l = claim_a(run, durable());
    let mut acked = BTreeSet::new();
    for i in 0..n {
        acked.insert(
            run.append(
                &l,
                lease_core::ops::AppendParams {
                    event_type: id("e"),
                    payload: serde_json::json!(i),
                    now: t(1),
                    tail_hint: None,
                },
            )
            .unwrap()
            .sequence
            .get(),
        );
    }
    Pre {
        lease: Some(l),
        acked,
    }
}

/// Owned, with heartbeats 1 and 2 written (the next one is written in place).
fn pre_beaten(run: &RunDir) -> Pre {
    let pre = pre_owned(run);
    let l = pre.lease.as_ref().unwrap();
    run.heartbeat(l, t(2_000), 1, None).unwrap();
    run.heartbeat(l, t(3_000), 2, None).unwrap();
    pre
}

fn op_heartbeat_in_place(run: &RunDir, pre: &Pre) -> Result<Outcome, FsError> {
    run.heartbeat(pre.lease.as_ref().unwrap(), t(5_000), 3, None)
        .map(|_| Outcome::Other)
}

fn pre_empty(_: &RunDir) -> Pre {
    Pre {
        lease: None,
        acked: BTreeSet::new(),
    }
}

fn pre_churn(run: &RunDir) -> Pre {
    // Ten changes of owner with events, so prune has something to fold.
    let mut acked = BTreeSet::new();
    let mut last = None;
    for i in 0..10u64 {
        let l = run
            .claim(lease_core::ops::ClaimParams {
                run_id: run.run_id().clone(),
                owner_id: id(&format!("o{i}")),
                holder: holder(10 + i as u32),
                policy: durable(),
                now: t(i * 100),
                store_floor: None,
            })
            .unwrap();
        acked.insert(
            run.append(
                &l,
                lease_core::ops::AppendParams {
                    event_type: id("e"),
                    payload: serde_json::json!(i),
                    now: t(i * 100 + 1),
                    tail_hint: None,
                },
            )
            .unwrap()
            .sequence
            .get(),
        );
        // Without the release's own compaction (PROTOCOL §7.3 step 7): the tenth release
        // would be due, and the scenarios below want the whole history for their prune.
        run.release_compacting(
            lease_core::ops::ReleaseParams {
                lease: l.clone(),
                now: t(i * 100 + 2),
                seal: None,
            },
            None,
        )
        .unwrap();
        last = Some(l);
    }
    let _ = last;
    Pre { lease: None, acked }
}

fn op_claim(run: &RunDir, _: &Pre) -> Result<Outcome, FsError> {
    run.claim(lease_core::ops::ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: id("b"),
        holder: holder(2),
        policy: durable(),
        now: t(10),
        store_floor: None,
    })
    .map(Outcome::Lease)
}
fn op_heartbeat(run: &RunDir, pre: &Pre) -> Result<Outcome, FsError> {
    run.heartbeat(pre.lease.as_ref().unwrap(), t(5_000), 1, None)
        .map(|_| Outcome::Other)
}
fn op_release(run: &RunDir, pre: &Pre) -> Result<Outcome, FsError> {
    run.release(lease_core::ops::ReleaseParams {
        lease: pre.lease.as_ref().unwrap().clone(),
        now: t(5_000),
        seal: None,
    })
    .map(|_| Outcome::Other)
}
fn op_takeover(run: &RunDir, _: &Pre) -> Result<Outcome, FsError> {
    let head = run.status(t(60_000), false)?.head.unwrap();
    run.takeover(lease_core::ops::TakeoverParams {
        run_id: run.run_id().clone(),
        owner_id: id("b"),
        holder: holder(2),
        policy: durable(),
        now: t(60_000),
        expect: Expectation::of(&head),
        trigger: TakeoverTrigger::Operator {
            watched_unchanged_ms: lease_core::ghost::simulated_watch(
                &Expectation::of(&head),
                t(60_000),
            ),
        },
    })
    .map(Outcome::Lease)
}
fn op_retire(run: &RunDir, _: &Pre) -> Result<Outcome, FsError> {
    run.retire(lease_core::ops::RetireParams {
        run_id: run.run_id().clone(),
        owner_id: id("b"),
        holder: holder(2),
        policy: durable(),
        now: t(100),
        expect: None,
    })
    .map(|_| Outcome::Other)
}
fn op_append(run: &RunDir, pre: &Pre) -> Result<Outcome, FsError> {
    run.append(
        pre.lease.as_ref().unwrap(),
        lease_core::ops::AppendParams {
            event_type: id("e"),
            payload: serde_json::json!("x"),
            now: t(50),
            tail_hint: None,
        },
    )
    .map(|a| Outcome::Appended(a.sequence.get()))
}
fn op_prune(run: &RunDir, _: &Pre) -> Result<Outcome, FsError> {
    run.prune(lease_core::ops::PruneParams {
        run_id: run.run_id().clone(),
        keep: 3,
        by: id("pruner"),
        now: t(5_000),
    })
    .map(|_| Outcome::Other)
}

/// Churned and pruned (keep 3, floor 18), then the epochs (and cutoffs) of generations 2 and 5
/// put back below the floor, durably: the strays a claimer that lost to a compaction, or a
/// prune that crashed in its removals, leaves (what `verify` reports as `strays`).
fn pre_strays(run: &RunDir) -> Pre {
    let pre = pre_churn(run);
    let fs = run.fs();
    let mut saved = Vec::new();
    for g in [2u64, 5] {
        let g = Generation::new(g).unwrap();
        for f in [FileRef::Epoch(g), FileRef::Cutoff(g)] {
            let p = f.path();
            // Cutoffs exist for the claimed (odd) generations only.
            if let Some(bytes) = fs.read(&p, 1 << 20).unwrap() {
                saved.push((p, bytes));
            }
        }
    }
    op_prune(run, &pre).unwrap();
    for (p, bytes) in saved {
        assert!(lease_fs::primitives::create_exclusive(&**fs, &p, &bytes).unwrap());
    }
    let strays: Vec<u64> = run
        .verify()
        .unwrap()
        .strays
        .iter()
        .map(|g| g.get())
        .collect();
    assert_eq!(strays, [2, 5]);
    pre
}

/// A prune with nothing to compact (keep 3 again) removes the strays below the floor
/// (PROTOCOL §7.10 step 2, issue #28).
fn op_prune_strays(run: &RunDir, pre: &Pre) -> Result<Outcome, FsError> {
    op_prune(run, pre)
}

const SCENARIOS: [(&str, Prepare, Operate); 11] = [
    ("claim-empty", pre_empty, op_claim),
    ("claim-after-release", pre_churn, op_claim),
    ("heartbeat-durable", pre_owned, op_heartbeat),
    (
        "heartbeat-durable-in-place",
        pre_beaten,
        op_heartbeat_in_place,
    ),
    ("release", pre_owned, op_release),
    ("takeover", pre_owned, op_takeover),
    ("retire", pre_owned, op_retire),
    ("append", pre_owned, op_append),
    ("append-leaving-a-mark", pre_marked, op_append),
    ("prune", pre_churn, op_prune),
    ("prune-strays", pre_strays, op_prune_strays),
];

/// Check a recovered state; returns a description of the failure.
fn check_recovered(sim: &SimFs, pre: &Pre, outcome: Option<&Outcome>, what: &str) {
    let run = run_on(sim);
    let status = run
        .status(t(100_000), true)
        .unwrap_or_else(|e| panic!("{what}: status after recovery failed: {e}"));
    assert!(
        !matches!(status.status, Status::Invalid(_)),
        "{what}: recovered state is invalid: {:?}",
        status.status
    );
    let view = run
        .read_events(Some((id("recovery"), t(100_000))))
        .unwrap_or_else(|e| panic!("{what}: events unreadable after recovery: {e}"));
    let counted: BTreeSet<u64> = view
        .events
        .iter()
        .filter(|e| e.standing.counts())
        .map(|e| e.event.sequence.get())
        .collect();
    for s in &pre.acked {
        assert!(counted.contains(s), "{what}: acknowledged event {s} lost");
    }
    match outcome {
        Some(Outcome::Appended(s)) => {
            assert!(counted.contains(s), "{what}: acknowledged append {s} lost")
        }
        Some(Outcome::Lease(l)) => {
            // A returned lease is durable: its epoch is the head (nobody else ran).
            let head = status.head.as_ref().expect("head after a granted lease");
            assert_eq!(
                head.generation(),
                l.generation,
                "{what}: granted epoch lost"
            );
        }
        _ => {}
    }
    run.verify()
        .unwrap_or_else(|e| panic!("{what}: hash chains broken after recovery: {e}"));
    // The check every writer makes (from the newest verified-prefix mark) agrees.
    run.verify_tail()
        .unwrap_or_else(|e| panic!("{what}: the tail check refuses after recovery: {e}"));
    // Progress: a new owner gets the run (retiring the dead one if needed) and appends.
    let l = match status.status {
        Status::Free => run.claim(lease_core::ops::ClaimParams {
            run_id: run.run_id().clone(),
            owner_id: id("next"),
            holder: holder(3),
            policy: durable(),
            now: t(100_001),
            store_floor: None,
        }),
        Status::Dead | Status::Active | Status::Stale => {
            run.retire(lease_core::ops::RetireParams {
                run_id: run.run_id().clone(),
                owner_id: id("next"),
                holder: holder(3),
                policy: durable(),
                now: t(100_001),
                expect: None,
            })
            .unwrap_or_else(|e| panic!("{what}: cannot retire the dead owner: {e}"));
            run.claim(lease_core::ops::ClaimParams {
                run_id: run.run_id().clone(),
                owner_id: id("next"),
                holder: holder(3),
                policy: durable(),
                now: t(100_002),
                store_floor: None,
            })
        }
        Status::Invalid(_) => unreachable!(),
    }
    .unwrap_or_else(|e| panic!("{what}: no progress after recovery: {e}"));
    let a = run
        .append(
            &l,
            lease_core::ops::AppendParams {
                event_type: id("after"),
                payload: serde_json::json!(null),
                now: t(100_003),
                tail_hint: None,
            },
        )
        .unwrap_or_else(|e| panic!("{what}: cannot append after recovery: {e}"));
    let view = run.read_events(None).unwrap();
    assert!(
        view.events
            .iter()
            .any(|e| e.event.sequence == a.sequence && e.standing.counts())
    );
}

// PROTOCOL §9, I5, I10
#[test]
fn crash_points_every_operation_recovers_after_every_system_call() {
    let mut explored = 0u64;
    for (name, prepare, operate) in SCENARIOS {
        // Learn the operation's call count.
        let sim = SimFs::new();
        let pre = prepare(&run_on(&sim));
        let before = sim.calls();
        operate(&run_on(&sim), &pre).unwrap_or_else(|e| panic!("{name}: baseline failed: {e}"));
        let n = sim.calls() - before;
        assert!(n > 0, "{name}: no calls");
        for k in 0..=n {
            for tear in [false, true] {
                let sim = SimFs::new();
                let pre = prepare(&run_on(&sim));
                sim.crash_after(k);
                let result = operate(&run_on(&sim), &pre);
                let outcome = match &result {
                    Ok(o) => Some(o),
                    Err(e) => {
                        assert!(
                            k < n && is_crash(e),
                            "{name}: crash after {k}/{n}: unexpected error {e}"
                        );
                        None
                    }
                };
                sim.recover(tear);
                check_recovered(
                    &sim,
                    &pre,
                    outcome,
                    &format!("{name}: crash after call {k} of {n} (tear {tear})"),
                );
                explored += 1;
            }
        }
    }
    println!("crash states explored: {explored}");
    assert!(explored > 100);
}

// PROTOCOL §7.10 step 2, §9, I10 (issue #28: doctor's STRAY_EPOCHS named prune, which
// removed nothing). After a crash after any call of a prune that removes strays below the
// floor (and with the last write torn), the run recovers (checked above) and the next prune
// leaves none: the step doctor names always finishes the job.
#[test]
fn a_prune_of_strays_crashed_anywhere_is_finished_by_the_next_prune() {
    let sim = SimFs::new();
    let pre = pre_strays(&run_on(&sim));
    let before = sim.calls();
    op_prune_strays(&run_on(&sim), &pre).unwrap();
    let n = sim.calls() - before;
    assert!(run_on(&sim).verify().unwrap().strays.is_empty());
    for k in 0..n {
        for tear in [false, true] {
            let sim = SimFs::new();
            let pre = pre_strays(&run_on(&sim));
            sim.crash_after(k);
            assert!(op_prune_strays(&run_on(&sim), &pre).is_err());
            sim.recover(tear);
            let run = run_on(&sim);
            op_prune_strays(&run, &pre).unwrap();
            let v = run.verify().unwrap();
            assert!(
                v.strays.is_empty(),
                "crash after {k}/{n} (tear {tear}): {v:?}"
            );
            assert_eq!(v.floor, Some(Generation::new(18).unwrap()));
        }
    }
}

// PROTOCOL §5.1, §7.0 ADOPTION, I10
#[test]
fn countdown_faults_leave_the_run_owned_and_healthy_or_cleanly_not_owned() {
    let mut explored = 0u64;
    for (name, prepare, operate) in SCENARIOS {
        let sim = SimFs::new();
        let pre = prepare(&run_on(&sim));
        let before = sim.calls();
        operate(&run_on(&sim), &pre).unwrap();
        let n = sim.calls() - before;
        for k in 1..=n {
            for errno in [5, 28] {
                let sim = SimFs::new();
                let pre = prepare(&run_on(&sim));
                sim.fail_nth(k, errno);
                let run = run_on(&sim);
                let first = operate(&run, &pre);
                if let Err(e) = &first {
                    assert!(
                        matches!(e.code().as_str(), "IO_ERROR"),
                        "{name}: fault {errno} at call {k}: {e}"
                    );
                    // The same actor retries: it ends owned (adopting its own epoch) or
                    // with a clean protocol answer, never half-owned.
                    let retry = operate(&run, &pre);
                    if let Err(e) = &retry {
                        assert!(
                            matches!(
                                e.code().as_str(),
                                "FENCED" | "TAKEOVER_RACE" | "RUN_ALREADY_ACTIVE" | "IO_ERROR"
                            ),
                            "{name}: retry after fault {errno} at call {k}: {e}"
                        );
                    }
                }
                // No power loss here: the live state must already be healthy.
                let status = run.status(t(100_000), false).unwrap();
                assert!(
                    !matches!(status.status, Status::Invalid(_)),
                    "{name}: fault {errno} at call {k} left an invalid record"
                );
                run.read_events(Some((id("r"), t(100_000))))
                    .unwrap_or_else(|e| panic!("{name}: fault at {k}: {e}"));
                run.verify()
                    .unwrap_or_else(|e| panic!("{name}: fault at {k}: {e}"));
                explored += 1;
            }
        }
    }
    println!("fault states explored: {explored}");
}

// PROTOCOL §5.2, §7.13
#[test]
fn each_operation_uses_the_minimum_number_of_fsyncs() {
    // (scenario, expected fsyncs of file data + directories), per docs/PROTOCOL.md §7.
    let expected = [
        ("claim-empty", 2u64), // epoch create: temp + dir (folders already exist)
        // GATE reads the released generation's cutoff and syncs its folder first
        // (PROTOCOL §7.0 SYNC), then the epoch create: 1 + 2.
        ("claim-after-release", 3),
        ("heartbeat-durable", 2), // first beat, a fresh file: temp + dir
        ("heartbeat-durable-in-place", 1), // later beats: fdatasync of the file
        ("release", 4),           // epoch create 2 + cutoff create 2 (beat removal unsynced)
        ("takeover", 4),          // epoch 2 + cutoff 2 (issue #19: no intent)
        ("retire", 4),            // epoch 2 + cutoff 2 (issue #19: no intent)
        ("append", 2),            // event create: temp + dir
        // Nothing to compact: the checkpoint read is synced before the strays below its
        // floor are removed (removals unsynced).
        ("prune-strays", 1),
    ];
    for (name, want) in expected {
        let (_, prepare, operate) = SCENARIOS.iter().find(|s| s.0 == name).unwrap();
        let sim = SimFs::new();
        let run = run_on(&sim);
        for d in Dir::ALL {
            sim.put(&format!("{}/.keep", d.path()), b"").unwrap();
        }
        let pre = prepare(&run);
        sim.reset_counters();
        operate(&run, &pre).unwrap();
        let got = sim.fsync_count() + sim.fsync_dir_count();
        assert_eq!(got, want, "{name}: fsyncs");
    }
    // A local-policy heartbeat does not fsync at all.
    let sim = SimFs::new();
    let run = run_on(&sim);
    let l = claim_a(&run, TimingPolicy::default());
    sim.reset_counters();
    run.heartbeat(&l, t(1), 1, None).unwrap();
    run.heartbeat(&l, t(2), 2, None).unwrap();
    assert_eq!(sim.fsync_count() + sim.fsync_dir_count(), 0);
    // On a file system that may lose unsynced writes while the owner lives (NFS, FUSE, …),
    // the same `local` beats are durable: 2 for the fresh file, then 1 per beat.
    sim.set_loses_unsynced_writes(true);
    sim.reset_counters();
    run.heartbeat(&l, t(3), 3, None).unwrap();
    assert_eq!(sim.fsync_count() + sim.fsync_dir_count(), 1);
    let l2 = claim_a(&run, TimingPolicy::default());
    assert_eq!(l2.generation, l.generation, "adopted");
    sim.reset_counters();
    run.heartbeat(&l2, t(4), 1, None).unwrap();
    assert_eq!(sim.fsync_count() + sim.fsync_dir_count(), 2);
}

/// The system calls of one heartbeat after the first: the root check, the one in-place
/// write, (durable: its `fdatasync`), and the RECHECK listing. No file is created,
/// renamed or removed.
#[test]
fn a_heartbeat_after_the_first_is_one_write_in_place() {
    for (policy, want) in [(TimingPolicy::default(), 3u64), (durable(), 4)] {
        let sim = SimFs::new();
        let run = run_on(&sim);
        let l = claim_a(&run, policy);
        run.heartbeat(&l, t(1), 1, None).unwrap();
        let files = sim.snapshot_live().len();
        let before = sim.calls();
        run.heartbeat(&l, t(2), 2, None).unwrap();
        assert_eq!(sim.calls() - before, want, "{policy:?}");
        assert_eq!(sim.snapshot_live().len(), files, "no file created");
    }
}

/// A beat after the first whose file is gone (removed by hand, or lost with an unsynced
/// directory entry) writes a fresh file holding that beat's slot.
#[test]
fn a_missing_heartbeat_file_is_written_afresh() {
    let sim = SimFs::new();
    let run = run_on(&sim);
    let l = claim_a(&run, TimingPolicy::default());
    run.heartbeat(&l, t(1), 1, None).unwrap();
    let beat = lease_core::FileRef::Beat(l.generation).path();
    lease_fs::fs::Fs::unlink(&sim, &beat).unwrap();
    run.heartbeat(&l, t(2), 2, None).unwrap();
    let bytes = sim.snapshot_live()[&beat].clone();
    assert_eq!(bytes.len(), lease_core::beat::FILE_BYTES);
    let s = run.status(t(3), false).unwrap();
    assert_eq!(s.head.unwrap().heartbeat_count(), 2);
}

/// PROTOCOL §5.3 (OQ-6 closed): a power loss at any point of an in-place heartbeat, with
/// the write torn at any fraction, leaves the previous beat or the new one, never an
/// invalid run. Under `durable` the previous beat was fsynced, so it is at least that one.
#[test]
fn a_power_loss_during_an_in_place_heartbeat_leaves_a_whole_beat() {
    let mut states = 0;
    for policy in [TimingPolicy::default(), durable()] {
        for k in 0..4u64 {
            // Slot cuts at 0, 32 (inside the header), 128 (inside the record), 256, 1024
            // and 2048 (whole) bytes.
            for tear in [(0, 1), (1, 64), (1, 16), (1, 8), (1, 2), (1, 1)] {
                let sim = SimFs::new();
                sim.set_tear_fraction(tear.0, tear.1);
                let run = run_on(&sim);
                let l = claim_a(&run, policy);
                for n in 1..=3 {
                    run.heartbeat(&l, t(n * 1_000), n, None).unwrap();
                }
                sim.crash_after(k);
                let done = run.heartbeat(&l, t(4_000), 4, None).is_ok();
                sim.recover(true);
                let run = run_on(&sim);
                let s = run.status(t(4_500), false).unwrap();
                let head = s.head.as_ref().expect("a head");
                assert!(
                    matches!(s.status, Status::Active | Status::Stale),
                    "{policy:?} k={k} tear={tear:?}: {:?}",
                    s.status
                );
                assert!(head.torn_beat.is_none() || policy == TimingPolicy::default());
                let count = head.heartbeat_count();
                if policy == durable() {
                    // Beat 3 was fsynced: it, or beat 4, is what is there.
                    assert!(count == 3 || count == 4, "k={k} tear={tear:?}: {count}");
                    if done {
                        assert_eq!(count, 4, "an acknowledged durable beat survives");
                    }
                } else {
                    assert!(count <= 4, "{count}");
                }
                assert_eq!(
                    head.heartbeat_at(),
                    if count == 0 { t(0) } else { t(count * 1_000) }
                );
                states += 1;
            }
        }
    }
    assert_eq!(states, 48);
}

// PROTOCOL §5.3, I7: a power loss during a local heartbeat (the fresh file of beat 1, or
// a later beat in place) never makes the run invalid; a torn fresh file is no evidence.
#[test]
fn a_torn_local_heartbeat_never_makes_the_run_invalid() {
    for (beats_before, crash_after) in [(0u64, 3u64), (0, 2), (1, 2), (2, 2)] {
        let sim = SimFs::new();
        let run = run_on(&sim);
        let l = claim_a(&run, TimingPolicy::default());
        for n in 1..=beats_before {
            run.heartbeat(&l, t(n), n, None).unwrap();
        }
        // Beat 1: check_root, write_new temp, rename; later beats: check_root, write_at.
        sim.crash_after(crash_after);
        let _ = run.heartbeat(&l, t(10), beats_before + 1, None);
        sim.recover(true);
        let run = run_on(&sim);
        let s = run.status(t(100_000), false).unwrap();
        assert!(
            matches!(s.status, Status::Stale | Status::Active),
            "{beats_before}/{crash_after}: {:?}",
            s.status
        );
    }
}
