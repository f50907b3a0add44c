//! Takeover: refused while fresh, exact expectations, judged by the watch, one winner, and the
//! pause between the last look and the commit.

use crate::common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;

// PROTOCOL §7.4 step 6
#[test]
fn takeover_is_refused_while_fresh() {
    let mut d = MemDisk::new();
    claim(&mut d, "a", 1, 0).unwrap();
    let e = takeover(&mut d, "b", 2, 10_000).unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_ACTIVE_REFUSED");
    assert_eq!(
        status(&mut d, 10_000).head.unwrap().epoch.owner_id.as_str(),
        "a"
    );
}

// PROTOCOL §7.4 step 6, I6
#[test]
fn takeover_with_a_wrong_expectation_is_a_race_and_changes_no_owner() {
    let mut d = MemDisk::new();
    claim(&mut d, "a", 1, 0).unwrap();
    let mut exp = expect_head(&mut d, 60_000);
    exp.owner_id = id("someone-else");
    let e = d
        .run(
            &mut Takeover::new(takeover_params("b", 2, 60_000, exp)),
            &all_alive,
        )
        .unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_RACE");
    let mut exp = expect_head(&mut d, 60_000);
    exp.heartbeat_at = t(1);
    let e = d
        .run(
            &mut Takeover::new(takeover_params("b", 2, 60_000, exp)),
            &all_alive,
        )
        .unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_RACE");
    assert_eq!(status(&mut d, 60_000).head.unwrap().generation().get(), 1);
}

// PROTOCOL §7.4 steps 3 and 7 (issue #17: refusals write nothing; issue #19: an accepted
// takeover writes its epoch and the old generation's cutoff, no intent)
#[test]
fn a_refused_takeover_writes_nothing_and_an_accepted_one_its_epoch_and_cutoff() {
    let mut d = MemDisk::new();
    claim(&mut d, "a", 1, 0).unwrap();
    let before = d.files.clone();
    // Not watched long enough (the owner is fresh): refused, nothing written.
    let e = takeover(&mut d, "b", 2, 10_000).unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_ACTIVE_REFUSED", "{e}");
    assert_eq!(d.files, before);
    // A mismatched expectation: refused, nothing written, retried as often as you like.
    for _ in 2..20 {
        let mut exp = expect_head(&mut d, 60_000);
        exp.owner_id = id("x");
        let e = d
            .run(
                &mut Takeover::new(takeover_params("b", 2, 60_000, exp)),
                &all_alive,
            )
            .unwrap_err();
        assert_eq!(e.code().as_str(), "TAKEOVER_RACE", "{e}");
    }
    // Watched long enough (60 s in this one-clock world), yet a watch that says less than
    // stale_after is refused whatever the wall age: no clock comparison decides.
    let exp = expect_head(&mut d, 60_000);
    let mut p = takeover_params("b", 2, 60_000, exp);
    p.trigger = TakeoverTrigger::Operator {
        watched_unchanged_ms: TimingPolicy::default().stale_after_ms(),
    };
    let e = d.run(&mut Takeover::new(p), &all_alive).unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_ACTIVE_REFUSED", "{e}");
    assert_eq!(d.files, before);
    let judged = expect_head(&mut d, 60_000);
    takeover(&mut d, "c", 3, 60_000).unwrap();
    let written: Vec<_> = d
        .files
        .keys()
        .filter(|f| !before.contains_key(f))
        .cloned()
        .collect();
    let g1 = Generation::new(1).unwrap();
    let g2 = Generation::new(2).unwrap();
    assert_eq!(written, vec![FileRef::Epoch(g2), FileRef::Cutoff(g1)]);
    // The epoch carries what the takeover judged: the audit record an intent held before.
    let epoch: EpochRecord = decode(&d.files[&FileRef::Epoch(g2)]).unwrap();
    let retired = epoch.retired.unwrap();
    assert_eq!(retired.reason, RetireReason::TakenOver);
    assert_eq!(
        retired.observed,
        Some(Observation {
            heartbeat_at: judged.heartbeat_at,
            heartbeat_count: judged.heartbeat_count.unwrap(),
            watched_ms: Some(lease_core::ghost::simulated_watch(&judged, t(60_000))),
            mode: TakeoverMode::Operator,
        })
    );
}

// PROTOCOL §7.4, §10: a heartbeat dated in the future (the owner's clock runs fast) does not
// delay a takeover once it was watched unchanged for stale_after; a wall age beyond
// stale_after (the owner's clock runs slow) does not allow one without the watch.
#[test]
fn takeover_is_judged_by_the_watch_never_by_the_wall_age() {
    let mut d = MemDisk::new();
    // The owner's clock is 60 s ahead of the taker's: claimed "at" 60 000, seen at 1 000.
    claim(&mut d, "a", 1, 60_000).unwrap();
    let exp = expect_head(&mut d, 1_000);
    let stale_after = TimingPolicy::default().stale_after_ms();
    let mut p = takeover_params("b", 2, 1_000, exp);
    p.trigger = TakeoverTrigger::Operator {
        watched_unchanged_ms: stale_after + 1,
    };
    let l = d.run(&mut Takeover::new(p), &all_alive).unwrap();
    assert_eq!(l.generation.get(), 2);
    // The new owner's clock is 60 s behind: its claim looks 60 s old, but without a watch
    // longer than stale_after nobody takes it over.
    let exp = expect_head(&mut d, 120_000);
    let mut p = takeover_params("c", 3, 120_000, exp);
    p.trigger = TakeoverTrigger::Automatic {
        watched_unchanged_ms: stale_after,
    };
    let before = d.files.clone();
    let e = d.run(&mut Takeover::new(p), &all_alive).unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_ACTIVE_REFUSED", "{e}");
    assert_eq!(d.files, before);
}

// PROTOCOL §7.4, I1
#[test]
fn two_concurrent_takeovers_have_one_winner() {
    let mut d = MemDisk::new();
    claim(&mut d, "a", 1, 0).unwrap();
    let exp = expect_head(&mut d, 60_000);
    let mut t1 = Takeover::new(takeover_params("b", 2, 60_000, exp.clone()));
    let mut t2 = Takeover::new(takeover_params("c", 3, 60_000, exp));
    // Interleave step by step.
    let (mut i1, mut i2) = (None, None);
    let (mut r1, mut r2) = (None, None);
    while r1.is_none() || r2.is_none() {
        if r1.is_none() {
            match t1.next(i1.take()) {
                Step::Io(req) => i1 = Some(d.perform(req, &all_alive)),
                Step::Done(r) => r1 = Some(r),
            }
        }
        if r2.is_none() {
            match t2.next(i2.take()) {
                Step::Io(req) => i2 = Some(d.perform(req, &all_alive)),
                Step::Done(r) => r2 = Some(r),
            }
        }
    }
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert!(r1.is_ok() != r2.is_ok(), "{r1:?} {r2:?}");
    let loser = if r1.is_ok() { r2 } else { r1 };
    assert_eq!(loser.unwrap_err().code().as_str(), "TAKEOVER_RACE");
}

// PROTOCOL §7.4 steps 5–8, OQ-5 (issue #17): the takeover reads its monotonic clock before
// its last look at the owner's beat and right before its commit; more than half the owner's
// heartbeat interval between them is TAKEOVER_RACE (an owner that resumed meanwhile may
// have beaten unseen), and nothing is written (issue #19: no intent either).
#[test]
fn a_takeover_paused_between_its_last_look_and_its_commit_races() {
    for (pause_ms, ok) in [(0u64, true), (2_500, true), (2_501, false), (60_000, false)] {
        let mut d = MemDisk::new();
        claim(&mut d, "a", 1, 0).unwrap();
        let exp = expect_head(&mut d, 100_000);
        let before = d.files.clone();
        let mut op = Takeover::new(takeover_params("b", 2, 100_000, exp));
        let mut input = None;
        let mut clocks = 0;
        let result = loop {
            match op.next(input.take()) {
                Step::Io(req) => {
                    if matches!(req, Request::Monotonic) {
                        clocks += 1;
                        if clocks == 2 {
                            // The taker was paused after its look at the beat.
                            d.mono_ns += pause_ms * 1_000_000;
                        }
                    }
                    input = Some(d.perform(req, &all_alive));
                }
                Step::Done(r) => break r,
            }
        };
        assert_eq!(clocks, 2, "pause {pause_ms}");
        let epoch2 = FileRef::Epoch(Generation::new(2).unwrap());
        if ok {
            assert_eq!(result.unwrap().generation.get(), 2, "pause {pause_ms}");
        } else {
            let e = result.unwrap_err();
            assert_eq!(e.code().as_str(), "TAKEOVER_RACE", "pause {pause_ms}: {e}");
            assert!(
                e.to_string()
                    .contains("half the owner's heartbeat interval"),
                "{e}"
            );
            assert!(!d.files.contains_key(&epoch2), "no epoch after the race");
            assert_eq!(d.files, before, "the race wrote nothing");
        }
    }
}
