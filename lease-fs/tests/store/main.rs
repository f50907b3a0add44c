//! The lease and the event log on a real disk: the named tests of issue #3.

use lease_core::LeaseOps;
use lease_core::ops::{Expectation, Standing, Status, TakeoverTrigger};
use lease_core::*;
use lease_fs::{FsError, RunDir, this_holder};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_796_169_600_000 + ms).unwrap()
}

fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

fn new_run(dir: &Path, name: &str) -> (PathBuf, RunDir) {
    let p = dir.join(name);
    let r = RunDir::create(&p).unwrap();
    (p, r)
}

/// A holder that is this process but with a distinct pid-like identity is not possible, so
/// tests that need several "owners" in one process use distinct owner ids and this holder.
fn me() -> Holder {
    this_holder().unwrap()
}

fn claim(run: &RunDir, owner: &str, now: u64) -> Result<lease_core::ops::OwnedLease, FsError> {
    run.claim(lease_core::ops::ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: id(owner),
        holder: me(),
        policy: TimingPolicy::default(),
        now: t(now),
        store_floor: None,
    })
}

fn takeover(run: &RunDir, owner: &str, now: u64) -> Result<lease_core::ops::OwnedLease, FsError> {
    let head = run.status(t(now), false).unwrap().head.unwrap();
    run.takeover(lease_core::ops::TakeoverParams {
        run_id: run.run_id().clone(),
        owner_id: id(owner),
        holder: me(),
        policy: TimingPolicy::default(),
        now: t(now),
        expect: Expectation::of(&head),
        trigger: TakeoverTrigger::Operator {
            watched_unchanged_ms: lease_core::ghost::simulated_watch(
                &Expectation::of(&head),
                t(now),
            ),
        },
    })
}

fn counted(run: &RunDir, now: u64) -> Vec<u64> {
    run.read_events(Some((id("reader"), t(now))))
        .unwrap()
        .events
        .iter()
        .filter(|e| e.standing.counts())
        .map(|e| e.event.sequence.get())
        .collect()
}

// PROTOCOL §7.1, I1
#[test]
fn eight_concurrent_claimers_threads_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = new_run(dir.path(), "race");
    let barrier = Arc::new(Barrier::new(8));
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let path = path.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let run = RunDir::open(&path).unwrap();
                barrier.wait();
                claim(&run, &format!("owner-{i}"), 0).map(|l| l.generation)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let winners = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(winners, 1, "{results:?}");
    for r in results.iter().filter_map(|r| r.as_ref().err()) {
        assert_eq!(r.code().as_str(), "RUN_ALREADY_ACTIVE", "{r}");
    }
}

/// Child-process entry point, inert unless the parent set `RUNLEASE_TEST_CHILD`.
#[test]
fn child_process_entry() {
    let Ok(mode) = std::env::var("RUNLEASE_TEST_CHILD") else {
        return;
    };
    let path = PathBuf::from(std::env::var("RUNLEASE_TEST_RUN").unwrap());
    let run = RunDir::open(&path).unwrap();
    match mode.as_str() {
        "claim" => {
            // Wait for the start signal (a file) so all children race together.
            let go = path.with_extension("go");
            while !go.exists() {
                std::thread::sleep(Duration::from_millis(1));
            }
            match run.claim(lease_core::ops::ClaimParams {
                run_id: run.run_id().clone(),
                owner_id: id(&format!("p{}", std::process::id())),
                holder: me(),
                policy: TimingPolicy::default(),
                now: t(0),
                store_floor: None,
            }) {
                Ok(l) => println!("RESULT won {}", l.generation),
                Err(e) => println!("RESULT {}", e.code().as_str()),
            }
        }
        "hold" => {
            let lock = lease_fs::lock::OwnerLock::try_acquire(&path)
                .unwrap()
                .unwrap();
            let l = run
                .claim(lease_core::ops::ClaimParams {
                    run_id: run.run_id().clone(),
                    owner_id: id(&format!("p{}", std::process::id())),
                    holder: me(),
                    policy: TimingPolicy::default(),
                    now: t(0),
                    store_floor: None,
                })
                .unwrap();
            println!("RESULT held {}", l.generation);
            std::thread::sleep(Duration::from_secs(60));
            drop(lock);
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn spawn_child(mode: &str, run: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RUNLEASE_TEST_CHILD", mode)
        .env("RUNLEASE_TEST_RUN", run)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn child_result(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r.trim().to_string()))
        .unwrap_or_else(|| format!("no result in {:?}", String::from_utf8_lossy(out)))
}

// PROTOCOL §7.1, I1
#[test]
fn eight_concurrent_claimers_processes_exactly_one_wins() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = new_run(dir.path(), "procrace");
    let children: Vec<_> = (0..8).map(|_| spawn_child("claim", &path)).collect();
    std::thread::sleep(Duration::from_millis(200));
    std::fs::write(path.with_extension("go"), b"").unwrap();
    let results: Vec<String> = children
        .into_iter()
        .map(|c| child_result(&c.wait_with_output().unwrap().stdout))
        .collect();
    assert_eq!(
        results.iter().filter(|r| r.starts_with("won")).count(),
        1,
        "{results:?}"
    );
    // Every loser is refused as held; the winner exits at once without releasing, so a
    // loser whose refusal probes liveness after that finds it dead and says to retire it.
    assert_eq!(
        results
            .iter()
            .filter(|r| *r == "RUN_ALREADY_ACTIVE" || *r == "RUN_DEAD_REQUIRES_RETIREMENT")
            .count(),
        7,
        "{results:?}"
    );
}

// PROTOCOL §7.1 step 3, §7.3, §10
#[test]
fn fresh_lease_refuses_a_second_claim_needs_takeover_when_stale_and_is_free_after_release() {
    let dir = tempfile::tempdir().unwrap();
    let (_, run) = new_run(dir.path(), "life");
    let l = claim(&run, "a", 0).unwrap();
    let e = claim(&run, "b", 1_000).unwrap_err();
    assert_eq!(e.code().as_str(), "RUN_ALREADY_ACTIVE");
    let e = claim(&run, "b", 20_001).unwrap_err();
    assert_eq!(e.code().as_str(), "RUN_STALE_REQUIRES_TAKEOVER");
    run.release(lease_core::ops::ReleaseParams {
        lease: l.clone(),
        now: t(20_002),
        seal: None,
    })
    .unwrap();
    let l2 = claim(&run, "b", 20_003).unwrap();
    assert_eq!(l2.generation.get(), 3);
}

// PROTOCOL §7.4 steps 3, 4 and 6, I6
#[test]
fn takeover_refused_while_fresh_race_on_wrong_expectation_and_writes_only_when_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "tk");
    claim(&run, "a", 0).unwrap();
    assert_eq!(
        takeover(&run, "b", 1_000).unwrap_err().code().as_str(),
        "TAKEOVER_ACTIVE_REFUSED"
    );
    let head = run.status(t(60_000), false).unwrap().head.unwrap();
    let mut wrong = Expectation::of(&head);
    wrong.heartbeat_at = t(5);
    let e = run
        .takeover(lease_core::ops::TakeoverParams {
            run_id: run.run_id().clone(),
            owner_id: id("b"),
            holder: me(),
            policy: TimingPolicy::default(),
            now: t(60_000),
            trigger: TakeoverTrigger::Operator {
                watched_unchanged_ms: lease_core::ghost::simulated_watch(&wrong, t(60_000)),
            },
            expect: wrong,
        })
        .unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_RACE");
    let mut wrong = Expectation::of(&head);
    wrong.owner_id = id("nobody");
    assert_eq!(
        run.takeover(lease_core::ops::TakeoverParams {
            run_id: run.run_id().clone(),
            owner_id: id("b"),
            holder: me(),
            policy: TimingPolicy::default(),
            now: t(60_000),
            trigger: TakeoverTrigger::Operator {
                watched_unchanged_ms: lease_core::ghost::simulated_watch(&wrong, t(60_000))
            },
            expect: wrong,
        })
        .unwrap_err()
        .code()
        .as_str(),
        "TAKEOVER_RACE"
    );
    let before = listing(&path);
    takeover(&run, "c", 60_000).unwrap();
    // Issue #17: a refusal writes nothing. Issue #19: the accepted takeover writes its epoch
    // and the old generation's cutoff, and no intent (its observation is in the epoch).
    let after = listing(&path);
    let written: Vec<_> = after.difference(&before).cloned().collect();
    assert_eq!(
        written,
        vec![
            "lease/cutoffs/00000000000000000001.json".to_string(),
            "lease/epochs/00000000000000000002.json".to_string()
        ]
    );
    let epoch: lease_core::EpochRecord = lease_core::canonical::decode(
        &std::fs::read(path.join("lease/epochs/00000000000000000002.json")).unwrap(),
    )
    .unwrap();
    let observed = epoch.retired.unwrap().observed.unwrap();
    assert_eq!(observed.mode, lease_core::TakeoverMode::Operator);
    assert_eq!(observed.heartbeat_at, head.heartbeat_at());
}

/// A run from before issue #19 keeps the intent files its takeovers wrote: they never
/// block status, verify or the next takeover, and compaction removes them with the
/// generations they belong to.
#[test]
fn intents_written_before_issue_19_are_read_past_and_compacted() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "old-intents");
    claim(&run, "a", 0).unwrap();
    let head = run.status(t(60_000), false).unwrap().head.unwrap();
    let intent = TakeoverIntent {
        run_id: run.run_id().clone(),
        generation: Generation::new(2).unwrap(),
        expected_generation: Generation::new(1).unwrap(),
        expected_owner_id: id("a"),
        expected_heartbeat_at: head.heartbeat_at(),
        expected_heartbeat_count: head.heartbeat_count(),
        taker_owner_id: id("b"),
        taker_holder: me(),
        requested_at: t(60_000),
        mode: TakeoverMode::Operator,
    };
    std::fs::create_dir_all(path.join("lease/intents")).unwrap();
    let name = path.join("lease/intents/00000000000000000002-00000000000000ab.json");
    std::fs::write(&name, encode(&intent).unwrap()).unwrap();
    // The old takeover's epoch and cutoff, as the new code writes them.
    takeover(&run, "b", 60_000).unwrap();
    run.verify().unwrap();
    let l = takeover(&run, "c", 120_000).unwrap();
    run.release(lease_core::ops::ReleaseParams {
        lease: l,
        now: t(120_001),
        seal: None,
    })
    .unwrap();
    assert!(name.exists(), "nothing removes an intent but compaction");
    run.prune(lease_core::ops::PruneParams {
        run_id: run.run_id().clone(),
        keep: 1,
        by: id("op"),
        now: t(120_002),
    })
    .unwrap();
    assert!(!name.exists(), "compaction removed the old intent");
    run.verify().unwrap();
}

/// Every file below `lease/`, as paths relative to the run folder.
fn listing(path: &std::path::Path) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for d in [
        "lease/epochs",
        "lease/beats",
        "lease/cutoffs",
        "lease/intents",
    ] {
        if let Ok(rd) = std::fs::read_dir(path.join(d)) {
            for e in rd {
                out.insert(format!("{d}/{}", e.unwrap().file_name().to_string_lossy()));
            }
        }
    }
    out
}

// PROTOCOL §7.4, I1
#[test]
fn two_concurrent_takeovers_have_exactly_one_winner() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "tk2");
    claim(&run, "a", 0).unwrap();
    let head = run.status(t(60_000), false).unwrap().head.unwrap();
    let barrier = Arc::new(Barrier::new(2));
    let hs: Vec<_> = (0..2u64)
        .map(|i| {
            let (path, head, barrier) = (path.clone(), head.clone(), barrier.clone());
            std::thread::spawn(move || {
                let run = RunDir::open(&path).unwrap();
                barrier.wait();
                run.takeover(lease_core::ops::TakeoverParams {
                    run_id: run.run_id().clone(),
                    owner_id: id(&format!("t{i}")),
                    holder: me(),
                    policy: TimingPolicy::default(),
                    now: t(60_000),
                    expect: Expectation::of(&head),
                    trigger: TakeoverTrigger::Operator {
                        watched_unchanged_ms: lease_core::ghost::simulated_watch(
                            &Expectation::of(&head),
                            t(60_000),
                        ),
                    },
                })
                .map(|l| l.generation)
            })
        })
        .collect();
    let rs: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(rs.iter().filter(|r| r.is_ok()).count(), 1, "{rs:?}");
    assert_eq!(
        rs.iter()
            .find_map(|r| r.as_ref().err())
            .unwrap()
            .code()
            .as_str(),
        "TAKEOVER_RACE"
    );
}

// PROTOCOL §7.2, §7.3, §7.6, I3, I8
#[test]
fn a_paused_owner_is_fenced_on_heartbeat_append_and_release_and_nothing_it_writes_counts() {
    let dir = tempfile::tempdir().unwrap();
    let (_, run) = new_run(dir.path(), "paused");
    let old = claim(&run, "old", 0).unwrap();
    run.append(
        &old,
        lease_core::ops::AppendParams {
            event_type: id("e"),
            payload: serde_json::json!(1),
            now: t(1),
            tail_hint: None,
        },
    )
    .unwrap();
    // The owner "pauses" (stops heartbeating); another takes over after staleness.
    let new = takeover(&run, "new", 60_000).unwrap();
    // It resumes: every operation reports fenced.
    assert_eq!(
        run.heartbeat(&old, t(60_001), 1, None)
            .unwrap_err()
            .code()
            .as_str(),
        "FENCED"
    );
    let e = run
        .append(
            &old,
            lease_core::ops::AppendParams {
                event_type: id("e"),
                payload: serde_json::json!(2),
                now: t(60_002),
                tail_hint: None,
            },
        )
        .unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED");
    assert_eq!(
        run.release(lease_core::ops::ReleaseParams {
            lease: old.clone(),
            now: t(60_003),
            seal: None
        })
        .unwrap_err()
        .code()
        .as_str(),
        "FENCED"
    );
    let s = run.status(t(60_004), false).unwrap();
    assert_eq!(s.status, Status::Active);
    assert_eq!(s.head.unwrap().epoch.owner_id, new.owner_id);
    assert_eq!(counted(&run, 60_005), vec![1]);
}

// PROTOCOL §7.5, §11
#[test]
fn a_sigkilled_owner_is_retired_at_once_and_a_live_one_never_is() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "dead");
    let mut child = spawn_child("hold", &path);
    // Wait until the child holds the run.
    let start = Instant::now();
    loop {
        let s = run.status(t(0), false).unwrap();
        if s.status == Status::Active {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "child never claimed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Alive (holds the owner lock, pid and start time match): never retired.
    let e = run
        .retire(lease_core::ops::RetireParams {
            run_id: run.run_id().clone(),
            owner_id: id("retirer"),
            holder: me(),
            policy: TimingPolicy::default(),
            now: t(1),
            expect: None,
        })
        .unwrap_err();
    assert_eq!(e.code().as_str(), "RETIRE_REFUSED_NOT_DEAD", "{e}");
    // A forged record whose pid matches the live child but whose start time does not: the
    // pid evidence says "dead", the held kernel lock says otherwise. Never retired.
    {
        let head = run.status(t(1), false).unwrap().head.unwrap();
        let mut forged = head.epoch.clone();
        forged.holder.start_time += 1;
        let bytes = encode(&forged).unwrap();
        let epoch_path = path.join(FileRef::Epoch(head.generation()).path());
        let original = std::fs::read(&epoch_path).unwrap();
        std::fs::write(&epoch_path, &bytes).unwrap();
        let e = run
            .retire(lease_core::ops::RetireParams {
                run_id: run.run_id().clone(),
                owner_id: id("retirer"),
                holder: me(),
                policy: TimingPolicy::default(),
                now: t(2),
                expect: None,
            })
            .unwrap_err();
        assert_eq!(e.code().as_str(), "RETIRE_REFUSED_NOT_DEAD", "{e}");
        std::fs::write(&epoch_path, original).unwrap();
    }
    // SIGKILL: retired at once, no waiting for staleness.
    child.kill().unwrap();
    child.wait().unwrap();
    let r = run
        .retire(lease_core::ops::RetireParams {
            run_id: run.run_id().clone(),
            owner_id: id("retirer"),
            holder: me(),
            policy: TimingPolicy::default(),
            now: t(3),
            expect: None,
        })
        .unwrap();
    assert_eq!(r.generation.get(), r.retired.get() + 1);
    assert_eq!(run.status(t(4), false).unwrap().status, Status::Free);
}

// PROTOCOL §7.6 step 4
#[test]
fn thirty_two_concurrent_appenders_get_sequences_1_to_32() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "appenders");
    let l = claim(&run, "a", 0).unwrap();
    let barrier = Arc::new(Barrier::new(32));
    let hs: Vec<_> = (0..32)
        .map(|i| {
            let (path, l, barrier) = (path.clone(), l.clone(), barrier.clone());
            std::thread::spawn(move || {
                let run = RunDir::open(&path).unwrap();
                barrier.wait();
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
                .get()
            })
        })
        .collect();
    let mut seqs: Vec<u64> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (1..=32).collect::<Vec<_>>());
    assert_eq!(counted(&run, 2), (1..=32).collect::<Vec<_>>());
    assert_eq!(run.verify().unwrap().events, 32);
}

// PROTOCOL §7.6 step 1, §7.9 step 6, I4
#[test]
fn a_retired_owners_late_append_never_counts_even_after_corrupting_the_newest_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "late");
    let old = claim(&run, "old", 0).unwrap();
    run.append(
        &old,
        lease_core::ops::AppendParams {
            event_type: id("e"),
            payload: serde_json::json!(1),
            now: t(1),
            tail_hint: None,
        },
    )
    .unwrap();
    let new = takeover(&run, "new", 60_000).unwrap();
    assert_eq!(
        run.append(
            &old,
            lease_core::ops::AppendParams {
                event_type: id("late"),
                payload: serde_json::json!(2),
                now: t(60_001),
                tail_hint: None
            }
        )
        .unwrap_err()
        .code()
        .as_str(),
        "FENCED"
    );
    // Delete the newest epoch by hand: the recorded cutoff still applies.
    let newest = path.join(FileRef::Epoch(new.generation).path());
    let saved = std::fs::read(&newest).unwrap();
    std::fs::remove_file(&newest).unwrap();
    assert_eq!(
        run.append(
            &old,
            lease_core::ops::AppendParams {
                event_type: id("late"),
                payload: serde_json::json!(3),
                now: t(60_002),
                tail_hint: None
            }
        )
        .unwrap_err()
        .code()
        .as_str(),
        "FENCED"
    );
    assert_eq!(counted(&run, 60_003), vec![1]);
    // Corrupt it instead: a typed error naming the file, never "counts". (Written 0600 as
    // runlease would: a record others may read is refused before it is read, 77.)
    std::fs::write(&newest, b"{\"version\":\"runlease/epoch/1\"}\n").unwrap();
    std::fs::set_permissions(&newest, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let e = run.read_events(None).unwrap_err();
    assert_eq!(e.code().as_str(), "RECORD_INVALID");
    assert!(e.to_string().contains("lease/epochs/"), "{e}");
    std::fs::write(&newest, saved).unwrap();
    let view = run.read_events(None).unwrap();
    assert!(
        view.events
            .iter()
            .all(|e| e.event.sequence.get() == 1 || !e.standing.counts())
    );
}

// PROTOCOL §3, §7.8, I7
#[test]
fn hostile_records_give_typed_errors_naming_the_file_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "hostile");
    let l = claim(&run, "a", 0).unwrap();
    let epoch_path = path.join(FileRef::Epoch(l.generation).path());
    let good = std::fs::read(&epoch_path).unwrap();
    let good_str = String::from_utf8(good.clone()).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() / 2].to_vec()),
        (
            "extra field",
            good_str.replacen("{", "{\"aaa\":1,", 1).into_bytes(),
        ),
        (
            "bad timestamp",
            good_str.replace(".000Z\"", "Z\"").into_bytes(),
        ),
        (
            "generation overflow",
            good_str
                .replace("\"generation\":1,", "\"generation\":18446744073709551616,")
                .into_bytes(),
        ),
        (
            "path escape in run id",
            good_str
                .replace("\"run_id\":\"hostile\"", "\"run_id\":\"../x\"")
                .into_bytes(),
        ),
    ];
    for (name, bytes) in cases {
        assert_ne!(bytes, good, "{name}: mutation did nothing");
        std::fs::write(&epoch_path, &bytes).unwrap();
        let before = snapshot(&path);
        let s = run.status(t(100_000), false).unwrap();
        match &s.status {
            Status::Invalid(e) => assert!(
                e.to_string()
                    .contains("lease/epochs/00000000000000000001.json"),
                "{name}: {e}"
            ),
            other => panic!("{name}: {other:?}"),
        }
        assert!(claim(&run, "b", 100_000).is_err(), "{name}");
        let e = run
            .takeover(lease_core::ops::TakeoverParams {
                run_id: run.run_id().clone(),
                owner_id: id("b"),
                holder: me(),
                policy: TimingPolicy::default(),
                now: t(100_000),
                expect: Expectation {
                    generation: None,
                    owner_id: id("a"),
                    heartbeat_at: t(0),
                    heartbeat_count: None,
                },
                trigger: TakeoverTrigger::Operator {
                    watched_unchanged_ms: 100_000,
                },
            })
            .unwrap_err();
        assert!(
            matches!(e.code().as_str(), "RECORD_INVALID" | "RUN_LAYOUT_INVALID"),
            "{name}: {e}"
        );
        assert_eq!(snapshot(&path), before, "{name}: something changed on disk");
    }
    std::fs::write(&epoch_path, &good).unwrap();
}

fn snapshot(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.display().to_string(),
                    std::fs::read(&p).unwrap_or_default(),
                ));
            }
        }
    }
    out.sort();
    out
}

// PROTOCOL §5.1
#[test]
fn a_symlinked_folder_or_a_folder_in_place_of_a_file_is_refused_and_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "links");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::create_dir(path.join("lease")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, path.join("lease/epochs")).unwrap();
    let e = claim(&run, "a", 0).unwrap_err();
    assert_eq!(e.code().as_str(), "RUN_LAYOUT_INVALID", "{e}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    std::fs::remove_file(path.join("lease/epochs")).unwrap();
    // A folder where the epoch file should be.
    std::fs::create_dir_all(path.join("lease/epochs/00000000000000000001.json")).unwrap();
    match run.status(t(0), false) {
        Ok(s) => assert!(matches!(s.status, Status::Invalid(_)), "{:?}", s.status),
        Err(e) => {
            assert_eq!(e.code().as_str(), "RUN_LAYOUT_INVALID", "{e}");
            assert!(
                e.to_string()
                    .contains("lease/epochs/00000000000000000001.json")
            );
        }
    }
    let e = claim(&run, "a", 0).unwrap_err();
    assert!(
        matches!(
            e.code().as_str(),
            "RUN_LAYOUT_INVALID" | "IO_ERROR" | "RECORD_INVALID"
        ),
        "{e}"
    );
    assert!(path.join("lease/epochs/00000000000000000001.json").is_dir());
}

// PROTOCOL §2
#[test]
fn a_claim_on_a_missing_run_folder_fails_within_100ms() {
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let e = RunDir::open(&dir.path().join("missing")).unwrap_err();
    assert!(start.elapsed() < Duration::from_millis(100));
    assert_eq!(e.code().as_str(), "RUN_NOT_FOUND");
    assert!(e.to_string().contains("missing"));
}

// PROTOCOL §5.1
#[test]
fn a_run_root_renamed_underneath_is_reported_and_not_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "moved");
    let l = claim(&run, "a", 0).unwrap();
    std::fs::rename(&path, dir.path().join("moved-away")).unwrap();
    std::fs::create_dir(&path).unwrap();
    let e = run.heartbeat(&l, t(1), 1, None).unwrap_err();
    assert_eq!(e.code().as_str(), "RUN_ROOT_CHANGED", "{e}");
    assert_eq!(
        std::fs::read_dir(&path).unwrap().count(),
        0,
        "nothing written to the new folder"
    );
}

// PROTOCOL §2 (temp files)
#[test]
fn orphan_temp_files_change_nothing_a_reader_sees_and_are_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "orphans");
    let l = claim(&run, "a", 0).unwrap();
    run.append(
        &l,
        lease_core::ops::AppendParams {
            event_type: id("e"),
            payload: serde_json::json!(1),
            now: t(1),
            tail_hint: None,
        },
    )
    .unwrap();
    let before_status = format!("{:?}", run.status(t(2), false).unwrap().head);
    let before_events = run.read_events(None).unwrap();
    for d in ["lease/epochs", "events", "lease/cutoffs"] {
        std::fs::create_dir_all(path.join(d)).unwrap();
        std::fs::write(path.join(d).join(".tmp-999-1-000000001"), b"garbage").unwrap();
    }
    assert_eq!(
        format!("{:?}", run.status(t(2), false).unwrap().head),
        before_status
    );
    assert_eq!(run.read_events(None).unwrap(), before_events);
    assert_eq!(run.clean_temp_files(0).unwrap(), 3);
    assert_eq!(run.read_events(None).unwrap(), before_events);
    assert!(matches!(
        before_events.events[0].standing,
        Standing::Authoritative
    ));
}

#[test]
fn the_run_id_of_a_path_ending_in_dot_or_dotdot_is_its_real_folder_name() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("myrun");
    std::fs::create_dir_all(run.join("sub")).unwrap();
    assert_eq!(
        lease_fs::run_id_of(&run.join("sub/..")).unwrap().as_str(),
        "myrun"
    );
    assert_eq!(
        lease_fs::run_id_of(&run.join(".")).unwrap().as_str(),
        "myrun"
    );
    // Not existing yet (runlease run creates it): resolved lexically.
    let missing = dir.path().join("newrun/x/..");
    assert_eq!(lease_fs::run_id_of(&missing).unwrap().as_str(), "newrun");
}
