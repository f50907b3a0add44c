//! Concurrent claimers (threads and processes), takers and appenders: exactly one wins.

use crate::{child_result, claim, counted, id, me, new_run, spawn_child, t};
use lease_core::LeaseOps;
use lease_core::ops::{Expectation, TakeoverTrigger};
use lease_core::*;
use lease_fs::RunDir;
use std::sync::{Arc, Barrier};
use std::time::Duration;

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
