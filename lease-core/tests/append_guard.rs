//! PROTOCOL §7.6 step 4, the GUARD: append never creates event `s` below an event that is
//! already there. A stray `event s+1` with `event s` absent is `EVENT_LOG_GAP`, the code
//! `verify` gives for the same log, and nothing is written; another appender that got
//! ahead (it created `s` and `s+1`) is a lost race, and the append goes on past it.

mod common;

use common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;

fn params(n: u64, hint: Option<(Sequence, Digest)>) -> AppendParams {
    AppendParams {
        event_type: id("test.event"),
        payload: serde_json::json!({ "n": n }),
        now: t(100 + n),
        tail_hint: hint,
    }
}

fn seq(n: u64) -> Sequence {
    Sequence::new(n).unwrap()
}

fn verify(d: &mut MemDisk) -> Result<VerifyReport, LeaseError> {
    d.run(&mut Verify::new(run_id()), &all_alive)
}

/// A run with events 1..=5 of one owner and a valid `event 7` past a gap at 6 (the log
/// had 7 events and event 6 was deleted by hand), and the hash of event 5.
fn log_with_stray_at_7() -> (MemDisk, OwnedLease, Digest) {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    let mut hashes = Vec::new();
    for n in 1..=7 {
        hashes.push(append(&mut d, &l, n, n).unwrap().hash);
    }
    d.files.remove(&FileRef::Event(seq(6))).unwrap();
    (d, l, hashes[4].clone())
}

// PROTOCOL §7.6 step 4, §13 (one rule for the log)
#[test]
fn a_stray_event_past_a_gap_is_refused_by_append_with_the_code_verify_gives() {
    for hint in [false, true] {
        let (mut d, l, h5) = log_with_stray_at_7();
        let verified = verify(&mut d).unwrap_err();
        assert_eq!(verified.code().as_str(), "EVENT_LOG_GAP");
        let before = d.files.clone();
        let e = d
            .run(
                &mut Append::new(&l, params(6, hint.then(|| (seq(5), h5.clone())))),
                &all_alive,
            )
            .unwrap_err();
        assert_eq!(e.code(), verified.code(), "hint {hint}: {e}");
        assert!(e.to_string().contains('6'), "names the missing event: {e}");
        assert_eq!(d.files, before, "hint {hint}: nothing was written");
    }
}

// PROTOCOL §7.6 step 4
#[test]
fn a_stray_far_past_the_tail_is_not_append_s_to_see_but_verify_s() {
    // The neighbourhood rule: append looks at `s` and `s+1` only. A stray further out
    // (event 9 with the log at 5) is the preflight's and verify's to find (§7.6).
    let (mut d, l, _) = log_with_stray_at_7();
    let seven = d.files.remove(&FileRef::Event(seq(7))).unwrap();
    d.files.insert(FileRef::Event(seq(9)), seven);
    let a = d
        .run(&mut Append::new(&l, params(6, None)), &all_alive)
        .unwrap();
    assert_eq!(a.sequence, seq(6));
    assert_eq!(verify(&mut d).unwrap_err().code().as_str(), "EVENT_LOG_GAP");
}

// PROTOCOL §7.6 step 4 (a lost race is not a gap), I5
#[test]
fn an_appender_that_got_ahead_between_tail_and_guard_is_a_lost_race_not_a_gap() {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    for n in 1..=5 {
        append(&mut d, &l, n, n).unwrap();
    }
    // A runs until it is about to probe `event 7` (its guard before creating 6); then B
    // appends 6 and 7; then A goes on.
    let mut a = Append::new(&l, params(100, None));
    let mut input = None;
    loop {
        match a.next(input.take()) {
            Step::Io(r) => {
                let guard = r == Request::Exists(FileRef::Event(seq(7)));
                if guard {
                    append(&mut d, &l, 6, 6).unwrap();
                    append(&mut d, &l, 7, 7).unwrap();
                }
                input = Some(d.perform(r, &all_alive));
                if guard {
                    break;
                }
            }
            Step::Done(r) => panic!("finished before its guard: {r:?}"),
        }
    }
    let got = loop {
        match a.next(input.take()) {
            Step::Io(r) => input = Some(d.perform(r, &all_alive)),
            Step::Done(r) => break r.unwrap(),
        }
    };
    assert_eq!(got.sequence, seq(8));
    let report = verify(&mut d).unwrap();
    assert_eq!(report.events, 8);
}

// PROTOCOL §7.6 step 4: the guard's cost
#[test]
fn the_guard_is_one_exists_per_append() {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    let first = append(&mut d, &l, 1, 1).unwrap();
    d.counts.clear();
    let hint = Some((first.sequence, first.hash));
    d.run(&mut Append::new(&l, params(2, hint)), &all_alive)
        .unwrap();
    // pre-check, hint probe of 2, guard probe of 3.
    assert_eq!(d.counts.get("exists"), Some(&3));
    assert_eq!(d.counts.get("create"), Some(&1));
}
