//! Automatic compaction after a release (`lease_run::compact`, issue #17): `lease/` stays
//! small over any number of changes of owner, every counted event still counts, a crash
//! anywhere in release + compaction leaves a recoverable run, and the temp-file collection
//! removes only our own orphaned regular files.

use lease_core::ops::{
    AppendParams, AuthorityLease, ClaimParams, Expectation, LivenessEvidence, LockEvidence,
    OwnedLease, ProcessState, ReleaseParams, RetireParams, Status, TakeoverParams, TakeoverTrigger,
};
use lease_core::{
    Code, Generation, HeartbeatDurability, Holder, Identity, RunId, Timestamp, TimingPolicy,
};
use lease_core::{LeaseOps, Transport};
use lease_fs::{FsError, Liveness, RunDir, SimFs};
use lease_run::compact::{self, COMPACT_EVERY, COMPACT_KEEP, Compaction};
use lease_run::{FinalStatus, FolderAuthority, LeaseAuthority, OpenOptions, Run, StepName};
use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

/// Synthetic wall times, well in the past of the real clock (the prune stamps its
/// checkpoint with the real one).
fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_700_000_000_000 + ms).unwrap()
}

fn holder(pid: u32) -> Holder {
    Holder {
        host: id("elsewhere"),
        boot_id: id("boot-x"),
        pid,
        start_time: 7,
    }
}

fn policy() -> TimingPolicy {
    TimingPolicy::from_millis(100, 300, 1000, HeartbeatDurability::Durable).unwrap()
}

/// Every recorded owner is definitely dead (for retirements).
struct AllDead;
impl Liveness for AllDead {
    fn probe(&self, _: &Holder) -> LivenessEvidence {
        LivenessEvidence {
            observer_boot_id: id("boot-x"),
            process: ProcessState::Gone,
            owner_lock: LockEvidence::Free,
            lease: AuthorityLease::NotKept,
        }
    }
}

fn claim(a: &FolderAuthority, owner: &str, pid: u32, now: u64) -> OwnedLease {
    a.claim(ClaimParams {
        run_id: a.run_id().clone(),
        owner_id: id(owner),
        holder: holder(pid),
        policy: policy(),
        now: t(now),
        store_floor: None,
    })
    .unwrap()
}

fn append(a: &FolderAuthority, l: &OwnedLease, now: u64) -> Result<u64, lease_run::RunError> {
    a.append(
        l,
        AppendParams {
            event_type: id("e"),
            payload: serde_json::json!(now),
            now: t(now),
            tail_hint: None,
        },
    )
    .map(|x| x.sequence.get())
}

fn release(a: &FolderAuthority, l: &OwnedLease, now: u64) -> compact::Released {
    compact::release(
        a,
        a.folder(),
        ReleaseParams {
            lease: l.clone(),
            now: t(now),
            seal: None,
        },
    )
    .unwrap()
}

/// Regular files anywhere below `lease/` (directories not counted).
fn lease_files(root: &Path) -> usize {
    fn walk(p: &Path) -> usize {
        std::fs::read_dir(p).map_or(0, |rd| {
            rd.map(|e| e.unwrap())
                .map(|e| {
                    let ft = e.file_type().unwrap();
                    if ft.is_dir() { walk(&e.path()) } else { 1 }
                })
                .sum()
        })
    }
    walk(&root.join("lease"))
}

fn counted(a: &FolderAuthority) -> BTreeSet<u64> {
    a.read_events(None)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.standing.counts())
        .map(|e| e.event.sequence.get())
        .collect()
}

fn folder_authority(path: &Path) -> FolderAuthority {
    let mut dir = RunDir::create(path).unwrap();
    dir.set_liveness(Arc::new(AllDead));
    FolderAuthority(Arc::new(dir))
}

// PROTOCOL §7.10, I5, I12: 300 changes of owner (plain cycles, takeovers with a zombie's
// late append, retirements), each release followed by the automatic compaction.
#[test]
fn three_hundred_cycles_keep_lease_under_100_files_and_every_counted_event_counts() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("run");
    let a = folder_authority(&path);
    let mut acked = BTreeSet::new();
    let (mut fenced, mut ran, mut most) = (0, 0, 0);
    let mut now = 0u64;
    for i in 0..300u32 {
        now += 10_000;
        let l = claim(&a, &format!("o{i}"), 100 + i, now);
        acked.insert(append(&a, &l, now + 1).unwrap());
        let releaser = match i % 10 {
            // Takeover of a stale owner, whose late append is then fenced.
            3 => {
                let head = a.status(t(now + 5_000), false).unwrap().head.unwrap();
                let taker = a
                    .takeover(TakeoverParams {
                        run_id: a.run_id().clone(),
                        owner_id: id(&format!("t{i}")),
                        holder: holder(9_000 + i),
                        policy: policy(),
                        now: t(now + 5_000),
                        expect: Expectation::of(&head),
                        // Simulated time: the record has not changed since the claim,
                        // 5 s ago, longer than the policy's stale_after.
                        trigger: TakeoverTrigger::Operator {
                            watched_unchanged_ms: 5_000,
                        },
                    })
                    .unwrap();
                let late = append(&a, &l, now + 5_001).unwrap_err();
                assert_eq!(late.code(), Code::Fenced);
                fenced += 1;
                acked.insert(append(&a, &taker, now + 5_002).unwrap());
                Some(taker)
            }
            // A dead owner retired; nobody releases this cycle.
            7 => {
                a.retire(RetireParams {
                    run_id: a.run_id().clone(),
                    owner_id: id(&format!("r{i}")),
                    holder: holder(8_000 + i),
                    policy: policy(),
                    now: t(now + 5_000),
                    expect: None,
                })
                .unwrap();
                None
            }
            _ => Some(l),
        };
        if let Some(owner) = releaser {
            let r = release(&a, &owner, now + 6_000);
            match r.compaction {
                Compaction::NotDue { .. } => {}
                Compaction::Ran { prune, temps } => {
                    let p = prune.unwrap();
                    assert!(p.floor.is_some(), "a due prune moved the floor");
                    assert_eq!(temps.unwrap().unwrap(), 0);
                    ran += 1;
                }
                other => panic!("cycle {i}: {other:?}"),
            }
        }
        let n = lease_files(&path);
        most = most.max(n);
        assert!(n < 100, "cycle {i}: {n} files in lease/");
    }
    assert_eq!(fenced, 30);
    // 300 cycles add about 640 generations: one compaction per COMPACT_EVERY of them.
    let head = a.status(t(now + 10_000), false).unwrap().head.unwrap();
    // (A due compaction waits for the next release when the crossing generation was a
    // retirement, so a few are later than every COMPACT_EVERY.)
    let expected = (head.generation().get() - COMPACT_KEEP) / COMPACT_EVERY;
    assert!(
        ran >= expected - expected / 10 && ran <= expected + 1,
        "{ran} compactions for {} generations",
        head.generation()
    );
    let epochs = std::fs::read_dir(path.join("lease/epochs"))
        .unwrap()
        .count() as u64;
    assert!(
        epochs <= COMPACT_EVERY + COMPACT_KEEP + 2,
        "{epochs} epochs"
    );
    // Verify holds from the floor; exactly the acknowledged events count (the fenced
    // late appends were refused and do not).
    let v = a.verify().unwrap();
    assert!(v.floor.is_some_and(|f| f.get() > 1), "{v:?}");
    assert_eq!(counted(&a), acked);
    println!(
        "300 cycles: {} generations, {ran} compactions, at most {most} files in lease/",
        head.generation()
    );
}

// The `Run` lifecycle's release compacts too (step `compact`, after `unlock`).
#[test]
fn run_release_compacts_after_unlocking() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("run");
    let steps = Arc::new(Mutex::new(Vec::new()));
    let s2 = steps.clone();
    let opts = OpenOptions {
        policy: TimingPolicy::from_millis(100, 300, 1000, HeartbeatDurability::Local).unwrap(),
        term_grace: Duration::from_millis(300),
        kill_wait: Duration::from_secs(1),
        on_step: Some(Arc::new(move |s: StepName, _| s2.lock().unwrap().push(s))),
        ..OpenOptions::default()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Each open + release adds two generations: due at the release of generation
    // COMPACT_EVERY + COMPACT_KEEP.
    let cycles = (COMPACT_EVERY + COMPACT_KEEP) / 2;
    rt.block_on(async {
        for i in 0..cycles {
            let run = Run::open(&path, opts.clone()).await.unwrap();
            let fin = if i % 2 == 0 {
                FinalStatus::Done
            } else {
                FinalStatus::Paused { wake_at: None }
            };
            run.release(fin).await.unwrap();
            let checkpoints = std::fs::read_dir(path.join("lease/checkpoints"))
                .map(|d| d.count())
                .unwrap_or(0);
            assert_eq!(checkpoints, usize::from(i + 1 == cycles), "cycle {i}");
        }
    });
    let names: Vec<&str> = steps.lock().unwrap().iter().map(|s| s.as_str()).collect();
    let unlock = names.iter().position(|n| *n == "unlock").unwrap();
    assert_eq!(names[unlock + 1], "compact");
    assert_eq!(
        names.iter().filter(|n| **n == "compact").count() as u64,
        cycles
    );
    let dir = RunDir::open(&path).unwrap();
    let v = dir.verify().unwrap();
    assert_eq!(
        v.floor.map(|f| f.get()),
        Some(2 * cycles - COMPACT_KEEP + 1)
    );
    let view = dir.status(t(0), false).unwrap();
    assert_eq!(view.status, Status::Free);
}

const SIM_RUN: &str = "simrun";

fn sim_authority(sim: &SimFs) -> FolderAuthority {
    FolderAuthority(Arc::new(RunDir::with_fs(
        Arc::new(sim.clone()),
        RunId::new(SIM_RUN).unwrap(),
        Path::new("sim"),
        Arc::new(AllDead),
    )))
}

/// A run one release short of a due compaction: its owner holds generation
/// `COMPACT_EVERY + COMPACT_KEEP − 1` and has appended; an orphaned temp in `lease/epochs/`
/// and one in `events/` are old enough to be collected.
fn pre_due(a: &FolderAuthority, sim: &SimFs) -> (OwnedLease, BTreeSet<u64>) {
    let mut acked = BTreeSet::new();
    let last = COMPACT_EVERY + COMPACT_KEEP - 1;
    let mut g = 0;
    let mut i = 0u32;
    loop {
        let l = claim(a, &format!("o{i}"), 10 + i, u64::from(i) * 100);
        g += 1;
        acked.insert(append(a, &l, u64::from(i) * 100 + 1).unwrap());
        if g == last {
            for orphan in [
                "lease/epochs/.tmp-1-1-000000001",
                "events/.tmp-1-2-000000002",
            ] {
                sim.put(orphan, b"half a record").unwrap();
                sim.set_age(orphan, 3_600).unwrap();
            }
            return (l, acked);
        }
        a.release(ReleaseParams {
            lease: l,
            now: t(u64::from(i) * 100 + 2),
            seal: None,
        })
        .unwrap();
        g += 1;
        i += 1;
    }
}

fn is_crash(e: &lease_run::RunError) -> bool {
    matches!(e, lease_run::RunError::Fs(FsError::Io { source, .. }) if lease_fs::sim::is_simulated_crash(source))
}

// PROTOCOL §7.10, §9, I5, I10: a power loss after every system call of release + the
// compaction (finalize, checkpoint, removals, temp collection), with and without a torn
// last write: every recovered state verifies, keeps every acknowledged event counted,
// and lets the next owner claim, append, release and compact.
#[test]
fn a_crash_anywhere_in_release_and_compaction_leaves_a_recoverable_run() {
    let op = |a: &FolderAuthority, l: &OwnedLease| {
        compact::release(
            a,
            a.folder(),
            ReleaseParams {
                lease: l.clone(),
                now: t(50_000),
                seal: None,
            },
        )
    };
    // The whole operation's call count, and that it does compact.
    let sim = SimFs::new();
    let a = sim_authority(&sim);
    let (l, _) = pre_due(&a, &sim);
    let before = sim.calls();
    let r = op(&a, &l).unwrap();
    let n = sim.calls() - before;
    match r.compaction {
        Compaction::Ran { prune, temps } => {
            assert!(prune.unwrap().floor.is_some());
            assert_eq!(temps.unwrap().unwrap(), 2);
        }
        other => panic!("{other:?}"),
    }
    let mut explored = 0;
    for k in 0..=n {
        for tear in [false, true] {
            let what = format!("crash after call {k} of {n} (tear {tear})");
            let sim = SimFs::new();
            let a = sim_authority(&sim);
            let (l, acked) = pre_due(&a, &sim);
            sim.crash_after(k);
            let result = op(&a, &l);
            match &result {
                Ok(r) => {
                    // A crash inside the compaction: the release stands, the compaction
                    // reports the failure (or the crash came after its last call).
                    if let Some(e) = r.compaction.failure() {
                        assert!(is_crash(e), "{what}: {e}");
                    }
                }
                Err(e) => assert!(is_crash(e), "{what}: {e}"),
            }
            sim.recover(tear);
            let a = sim_authority(&sim);
            let view = a
                .status(t(100_000), true)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                !matches!(view.status, Status::Invalid(_)),
                "{what}: {:?}",
                view.status
            );
            a.verify().unwrap_or_else(|e| panic!("{what}: {e}"));
            // Finalizing reader: every acknowledged event still counts.
            let view_ev = a
                .read_events(Some((id("reader"), t(100_000))))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let counts: BTreeSet<u64> = view_ev
                .events
                .iter()
                .filter(|e| e.standing.counts())
                .map(|e| e.event.sequence.get())
                .collect();
            assert!(
                acked.is_subset(&counts),
                "{what}: lost {acked:?} vs {counts:?}"
            );
            // Progress: retire the crashed owner if it still holds the run, then a cycle
            // whose release compacts whatever is due.
            if matches!(view.status, Status::Active | Status::Stale | Status::Dead) {
                a.retire(RetireParams {
                    run_id: a.run_id().clone(),
                    owner_id: id("next"),
                    holder: holder(3),
                    policy: policy(),
                    now: t(100_001),
                    expect: None,
                })
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            }
            let l = claim(&a, "next", 3, 100_002);
            let s = append(&a, &l, 100_003).unwrap_or_else(|e| panic!("{what}: {e}"));
            let r = release(&a, &l, 100_004);
            assert!(
                r.compaction.failure().is_none(),
                "{what}: {:?}",
                r.compaction
            );
            let v = a.verify().unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(v.floor.is_some(), "{what}: never compacted");
            let counts = counted(&a);
            assert!(counts.contains(&s) && acked.is_subset(&counts), "{what}");
            explored += 1;
        }
    }
    println!("crash states explored: {explored}");
    assert!(explored > 50);
}

/// Set `path`'s modification time (without following a symlink) `secs` into the past.
fn backdate(path: &Path, secs: u64) {
    let o = std::process::Command::new("touch")
        .args(["-h", "-d", &format!("@{}", now_secs() - secs)])
        .arg(path)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Claim + release cycles until the next release is due for compaction.
fn until_due(a: &FolderAuthority) -> OwnedLease {
    let mut i = 0u32;
    loop {
        let l = claim(a, &format!("o{i}"), 10 + i, u64::from(i) * 100);
        if l.generation.get() == COMPACT_EVERY + COMPACT_KEEP - 1 {
            return l;
        }
        let r = release(a, &l, u64::from(i) * 100 + 1);
        assert!(matches!(r.compaction, Compaction::NotDue { .. }));
        i += 1;
    }
}

// Trust model: the collection removes only our own old regular temp files; never a
// symlink (nor what it points to), a directory, a FIFO, another user's file, a young temp
// or a name outside our temp pattern.
#[test]
fn temp_collection_removes_only_our_old_regular_temp_files() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("run");
    let a = folder_authority(&path);
    let l = until_due(&a);
    append(&a, &l, 999_999).unwrap();
    let outside = tmp.path().join("precious");
    std::fs::write(&outside, b"not the run's").unwrap();
    let gone = [
        "lease/epochs/.tmp-1-1-000000001",
        "events/.tmp-1-2-000000002",
        ".tmp-1-3-000000003",
        "lease/cutoffs/.tmp-12345-store-00112233aabbccdd",
    ];
    for p in gone {
        std::fs::write(path.join(p), b"orphan").unwrap();
        backdate(&path.join(p), 7_200);
    }
    let link = path.join("lease/epochs/.tmp-2-1-000000001");
    std::os::unix::fs::symlink(&outside, &link).unwrap();
    backdate(&link, 7_200);
    let subdir = path.join("events/.tmp-3-1-000000001");
    std::fs::create_dir(&subdir).unwrap();
    std::fs::write(subdir.join("inside"), b"x").unwrap();
    backdate(&subdir, 7_200);
    let fifo = path.join("lease/epochs/.tmp-4-1-000000001");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    backdate(&fifo, 7_200);
    let young = path.join("lease/epochs/.tmp-5-1-000000001");
    std::fs::write(&young, b"a writer at work").unwrap();
    let foreign_name = path.join(".tmp-notes");
    std::fs::write(&foreign_name, b"someone's notes").unwrap();
    backdate(&foreign_name, 7_200);
    let mut kept = vec![
        link.clone(),
        subdir.clone(),
        fifo.clone(),
        young,
        foreign_name,
    ];
    // Another user's temp (only root can make one).
    if lease_fs::real::euid() == 0 {
        let theirs = path.join("events/.tmp-6-1-000000001");
        std::fs::write(&theirs, b"theirs").unwrap();
        std::os::unix::fs::chown(&theirs, Some(65_534), Some(65_534)).unwrap();
        backdate(&theirs, 7_200);
        kept.push(theirs);
    }
    let r = release(&a, &l, 1_000_000);
    match r.compaction {
        Compaction::Ran { prune, temps } => {
            prune.unwrap();
            assert_eq!(temps.unwrap().unwrap(), gone.len());
        }
        other => panic!("{other:?}"),
    }
    for p in gone {
        assert!(std::fs::symlink_metadata(path.join(p)).is_err(), "{p} kept");
    }
    for p in &kept {
        assert!(
            std::fs::symlink_metadata(p).is_ok(),
            "{} removed",
            p.display()
        );
    }
    assert_eq!(std::fs::read(&outside).unwrap(), b"not the run's");
    assert_eq!(std::fs::read(subdir.join("inside")).unwrap(), b"x");
    a.verify().unwrap();
}

// Bad input on disk is reported, never repaired, and never fails the release: a FIFO named
// like a cutoff the prune must read makes the compaction fail (reported, logged); the
// release stands, the FIFO stays, and the run goes on.
#[test]
fn a_compaction_that_meets_bad_input_fails_alone_and_the_release_stands() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("run");
    let a = folder_authority(&path);
    let l = until_due(&a);
    // Generation 1's cutoff is below the floor the prune will set: it reads it.
    let cutoff = path.join("lease/cutoffs/00000000000000000001.json");
    std::fs::remove_file(&cutoff).unwrap();
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&cutoff)
            .status()
            .unwrap()
            .success()
    );
    let before: Vec<_> = std::fs::read_dir(path.join("lease/epochs"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let r = release(&a, &l, 1_000_000);
    assert_eq!(
        r.generation,
        Generation::new(l.generation.get() + 1).unwrap()
    );
    let e = r
        .compaction
        .failure()
        .expect("the prune must refuse a FIFO");
    assert!(e.to_string().contains("00000000000000000001.json"), "{e}");
    assert!(
        std::fs::symlink_metadata(&cutoff)
            .unwrap()
            .file_type()
            .is_fifo()
    );
    // Nothing was removed; only the release epoch was added.
    let after = std::fs::read_dir(path.join("lease/epochs"))
        .unwrap()
        .count();
    assert_eq!(after, before.len() + 1);
    assert_eq!(
        std::fs::read_dir(path.join("lease/checkpoints"))
            .map(|d| d.count())
            .unwrap_or(0),
        0
    );
    let view = a.status(t(2_000_000), false).unwrap();
    assert_eq!(view.status, Status::Free);
    let l = claim(&a, "after", 77, 2_000_001);
    assert_eq!(l.generation.get(), r.generation.get() + 1);
}

// A forged checkpoint above the head would stop every later compaction: reported (with
// its file), never passed over; the release stands and nothing is removed.
#[test]
fn a_checkpoint_above_the_head_is_reported_not_passed_over() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("run");
    let a = folder_authority(&path);
    let l = until_due(&a);
    std::fs::create_dir_all(path.join("lease/checkpoints")).unwrap();
    let forged = path.join("lease/checkpoints/00000000000000009999.json");
    std::fs::write(&forged, b"{}\n").unwrap();
    let before = lease_files(&path);
    let r = release(&a, &l, 1_000_000);
    assert!(
        matches!(r.compaction, Compaction::Unknown(_)),
        "{:?}",
        r.compaction
    );
    let e = r.compaction.failure().unwrap();
    assert_eq!(e.code(), Code::ChainBroken);
    assert!(e.to_string().contains("00000000000000009999.json"), "{e}");
    // Only the release's own records were added: its epoch and the released cutoff.
    assert_eq!(lease_files(&path), before + 2);
    assert!(forged.exists());
}
