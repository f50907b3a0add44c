//! PROTOCOL §13.1 (issue #33): verified-prefix marks. The tail check (`Verify::tail`) that
//! `append`, `run`, `status` and every change of owner make reads the log only from the
//! newest mark, and refuses whatever the whole `verify` refuses among the events after the
//! mark, with the same code; what lies below the mark is left to `verify` (and `doctor`),
//! which also checks every mark against its event. A mark is written only after `events/`
//! was made durable, so a power loss never leaves one above the log's durable end.

mod common;

use common::*;
use lease_core::mem::{MemDisk, MemTransport};
use lease_core::ops::*;
use lease_core::*;
use proptest::prelude::*;

fn seq(n: u64) -> Sequence {
    Sequence::new(n).unwrap()
}

fn verify(d: &mut MemDisk) -> Result<VerifyReport, LeaseError> {
    d.run(&mut Verify::new(run_id()), &all_alive)
}

fn verify_tail(d: &mut MemDisk) -> Result<VerifyReport, LeaseError> {
    d.run(&mut Verify::tail(run_id()), &all_alive)
}

fn mark(d: &mut MemDisk, at: u64) {
    let r = verify_tail(d).unwrap();
    let (s, h) = r.last.unwrap();
    assert_eq!(s.get(), at, "the log ends where the test wants its mark");
    d.run(
        &mut WriteMark::new(run_id(), s, h, id("marker"), t(1)).unwrap(),
        &all_alive,
    )
    .unwrap();
}

/// A run of one owner with `n` events and a mark at each of `marks` (written in order, as
/// the log reached them).
fn log(n: u64, marks: &[u64]) -> (MemDisk, OwnedLease) {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    for i in 1..=n {
        append(&mut d, &l, i, i).unwrap();
        if marks.contains(&i) {
            mark(&mut d, i);
        }
    }
    (d, l)
}

fn marks_on(d: &MemDisk) -> Vec<u64> {
    d.files
        .keys()
        .filter_map(|f| match f {
            FileRef::Mark(s) => Some(s.get()),
            _ => None,
        })
        .collect()
}

fn code(r: &Result<VerifyReport, LeaseError>) -> Option<&'static str> {
    r.as_ref().err().map(|e| e.code().as_str())
}

/// Change one byte of event `s`'s payload (the file stays a valid record, its hash changes).
fn edit(d: &mut MemDisk, s: u64) {
    let f = FileRef::Event(seq(s));
    let bytes = d.files.get(&f).unwrap().clone();
    let text = String::from_utf8(bytes).unwrap();
    let edited = text.replacen("\"n\":", "\"n\":1", 1);
    assert_ne!(edited, text);
    d.files.insert(f, edited.into_bytes());
}

// §13.1: the walk starts at the mark and reads only what follows it.
#[test]
fn the_tail_check_reads_only_the_events_after_the_newest_mark() {
    let (mut d, _) = log(150, &[64, 128]);
    assert_eq!(marks_on(&d), [128], "a new mark removes the older ones");
    let r = verify_tail(&mut d).unwrap();
    assert_eq!(r.started_at, Some(seq(128)));
    assert_eq!(r.walked, 22);
    assert_eq!(r.last.as_ref().map(|(s, _)| s.get()), Some(150));
    assert_eq!(r.mark_due(), None, "22 events are fewer than MARK_EVERY");
    let whole = verify(&mut d).unwrap();
    assert_eq!(
        (whole.started_at, whole.walked, whole.events),
        (None, 150, 150)
    );
    // Without a mark the tail check is the whole walk, and a mark is then due.
    let (mut d, _) = log(150, &[]);
    let r = verify_tail(&mut d).unwrap();
    assert_eq!((r.started_at, r.walked), (None, 150));
    assert_eq!(r.mark_due().map(|(s, _)| s.get()), Some(150));
}

// §13.1: the appender of every MARK_EVERY-th event leaves a mark (in-process owners check
// nothing else), so the tail stays short however the log was written.
#[test]
fn the_appender_of_every_mark_every_th_event_leaves_a_mark() {
    let tr = MemTransport::new(run_id());
    let l = tr
        .claim(ClaimParams {
            run_id: run_id(),
            owner_id: id("a"),
            holder: holder(1),
            policy: TimingPolicy::default(),
            now: t(0),
            store_floor: None,
        })
        .unwrap();
    for n in 1..=(2 * MARK_EVERY + 5) {
        tr.append(
            &l,
            AppendParams {
                event_type: id("e"),
                payload: serde_json::json!(n),
                now: t(n),
                tail_hint: None,
            },
        )
        .unwrap();
    }
    let mut d = tr.disk();
    assert_eq!(marks_on(&d), [2 * MARK_EVERY]);
    let r = verify_tail(&mut d).unwrap();
    assert_eq!(r.walked, 5);
}

// §13.1 trade-off: tampering below the mark is `verify`'s to find, not the tail check's.
#[test]
fn tampering_below_the_mark_is_found_by_verify_only() {
    let (mut d, _) = log(100, &[64]);
    edit(&mut d, 10);
    assert!(verify_tail(&mut d).is_ok());
    assert_eq!(code(&verify(&mut d)), Some("CHAIN_BROKEN"));
}

// §13.1: the mark's own event is checked against the mark, by both.
#[test]
fn an_edited_or_deleted_marked_event_is_refused_by_both_with_one_code() {
    let (mut d, _) = log(100, &[64]);
    edit(&mut d, 64);
    assert_eq!(code(&verify_tail(&mut d)), Some("CHAIN_BROKEN"));
    assert_eq!(code(&verify(&mut d)), Some("CHAIN_BROKEN"));
    // The log cut at or below the mark (a restore of an older copy): a mark past the end.
    let (mut d, _) = log(70, &[64]);
    for s in 64..=70 {
        d.files.remove(&FileRef::Event(seq(s)));
    }
    assert_eq!(code(&verify_tail(&mut d)), Some("CHAIN_BROKEN"));
    assert_eq!(code(&verify(&mut d)), Some("CHAIN_BROKEN"));
    // The marked event alone deleted: a gap at the mark, for both.
    let (mut d, _) = log(70, &[64]);
    d.files.remove(&FileRef::Event(seq(64)));
    assert_eq!(code(&verify_tail(&mut d)), Some("EVENT_LOG_GAP"));
    assert_eq!(code(&verify(&mut d)), Some("EVENT_LOG_GAP"));
}

// §13.1: a mark is a record: one of another run, or whose content names another event, is
// RECORD_INVALID naming its file; nothing is repaired.
#[test]
fn a_forged_or_misnamed_mark_is_refused_naming_its_file() {
    let (mut d, _) = log(70, &[64]);
    let f = FileRef::Mark(seq(64));
    let good = d.files.get(&f).unwrap().clone();
    d.files.remove(&f);
    d.files.insert(FileRef::Mark(seq(65)), good);
    for r in [verify_tail(&mut d), verify(&mut d)] {
        let e = r.unwrap_err();
        assert_eq!(e.code().as_str(), "RECORD_INVALID");
        assert!(
            e.to_string()
                .contains("lease/marks/00000000000000000065.json"),
            "{e}"
        );
    }
}

// §13.1 order of writes: `events/` durable before the mark. An event linked by another
// appender but not yet made durable, marked, then a power loss: the mark must not outlive
// it (the planted mutant `mark_before_events_durable` breaks this).
#[test]
fn a_power_loss_never_leaves_a_mark_above_the_durable_log() {
    let (mut d, l) = log(63, &[]);
    // Event 64, linked but its folder not fsynced (an appender between link and fsync).
    let tail = d.files.get(&FileRef::Event(seq(63))).unwrap().clone();
    let ev = Event {
        run_id: run_id(),
        sequence: seq(64),
        generation: l.generation,
        owner_id: l.owner_id.clone(),
        event_type: id("e"),
        payload: serde_json::json!(64),
        timestamp: t(64),
        prev_hash: Some(Digest::of(&tail)),
    };
    d.link(FileRef::Event(seq(64)), encode(&ev).unwrap());
    mark(&mut d, 64);
    d.power_loss(false);
    verify_tail(&mut d).expect("the tail check after the power loss");
    verify(&mut d).expect("verify after the power loss");
}

// §13.1: a mark written by an appender after `verify` counted the log is not a log cut
// short (verify probes the event before it says so).
#[test]
fn a_mark_above_the_log_verify_counted_is_not_a_deletion_when_its_event_exists() {
    let (mut d, l) = log(63, &[]);
    // Verify over a transport that appends and marks between its walk and its listing of
    // the marks: simulate with a snapshot of the order — run verify's steps by hand.
    let mut v = Verify::new(run_id());
    let mut input = None;
    let mut appended = false;
    let report = loop {
        match v.next(input.take()) {
            Step::Done(r) => break r,
            Step::Io(req) => {
                if matches!(req, Request::List(Dir::Marks)) && !appended {
                    append(&mut d, &l, 64, 64).unwrap();
                    mark(&mut d, 64);
                    appended = true;
                }
                input = Some(d.perform(req, &all_alive));
            }
        }
    };
    assert!(appended, "verify lists the marks");
    let r = report.unwrap();
    assert_eq!(r.events, 63, "verify judged the log it counted");
}

#[derive(Debug, Clone)]
enum Damage {
    Edit(u64),
    Delete(u64),
    /// Delete every event from here on.
    Cut(u64),
    /// Move the last event one place further out (a gap below it, where append's guard
    /// and the tail check probe; a stray further out is `verify`'s alone, §7.6, §13.1).
    MoveLast,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    // §13.1, the rule of issue #33: whatever `verify` rejects after the mark, the tail
    // check rejects with the same code; below the mark only `verify` looks.
    #[test]
    fn the_tail_check_refuses_what_verify_refuses_after_the_mark(
        n in 2u64..140,
        mark_at in prop::option::of(1u64..140),
        damage in prop_oneof![
            (1u64..140).prop_map(Damage::Edit),
            (1u64..140).prop_map(Damage::Delete),
            (1u64..140).prop_map(Damage::Cut),
            Just(Damage::MoveLast),
        ],
    ) {
        let marks: Vec<u64> = mark_at.filter(|m| *m <= n).into_iter().collect();
        let (mut d, _) = log(n, &marks);
        let m = marks.first().copied().unwrap_or(0);
        let at = match damage {
            Damage::Edit(s) if s <= n => { edit(&mut d, s); s }
            Damage::Delete(s) if s <= n => { d.files.remove(&FileRef::Event(seq(s))); s }
            Damage::Cut(s) if s <= n => {
                for x in s..=n { d.files.remove(&FileRef::Event(seq(x))); }
                // The cut reaches the end of the log: past the mark whatever `s` is.
                n
            }
            Damage::MoveLast => {
                let b = d.files.remove(&FileRef::Event(seq(n))).unwrap();
                d.files.insert(FileRef::Event(seq(n + 1)), b);
                n
            }
            _ => return Ok(()),
        };
        let whole = verify(&mut d);
        let tail = verify_tail(&mut d);
        if at >= m {
            prop_assert_eq!(code(&tail), code(&whole), "damage {:?} at or after the mark {}", damage, m);
        } else {
            prop_assert!(tail.is_ok(), "below the mark {} the tail check does not look: {:?}", m, tail);
            prop_assert!(whole.is_err(), "verify finds {:?}", damage);
        }
    }
}
