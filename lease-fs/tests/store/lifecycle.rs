//! Claim, takeover and release in order: refusals, expectation races, pre-#19 intents.

use crate::{claim, id, me, new_run, t, takeover};
use lease_core::LeaseOps;
use lease_core::ops::{Expectation, TakeoverTrigger};
use lease_core::*;

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
