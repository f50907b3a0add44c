//! Checkers that prove they can fail (issue #30): every check of the ghost model
//! (`lease_core::ghost`) is fed a history that violates its invariant and must fire, and a
//! sound one and must pass. The sound histories are real: a claim, appends and a takeover
//! run over `MemDisk`; the violating ones are those histories with one fact changed (what
//! an actor was told, what reached the disk, or a reader's verdict).

mod common;

use std::collections::BTreeSet;

use common::*;
use lease_core::ghost::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;

fn g(n: u64) -> Generation {
    Generation::new(n).unwrap()
}

fn read_epoch(disk: &mut MemDisk, n: u64) -> EpochRecord {
    match disk.perform(Request::Read(FileRef::Epoch(g(n))), &all_alive) {
        Response::Content(Some(b)) => decode(&b).unwrap(),
        other => panic!("epoch {n}: {other:?}"),
    }
}

/// A's claim (generation 1) and two appends, then B's takeover at t=30 s (generation 2,
/// cutoff 1 through event 2), and B's append (event 3). Returns the disk, the takeover's
/// expectation and the log as read at the end.
fn history() -> (MemDisk, Expectation, EventLogView) {
    let mut disk = MemDisk::new();
    let a = claim(&mut disk, "owner-a", 1, 0).unwrap();
    append(&mut disk, &a, 10, 1).unwrap();
    append(&mut disk, &a, 20, 2).unwrap();
    let expect = expect_head(&mut disk, 30_000);
    let b = disk
        .run(
            &mut Takeover::new(takeover_params("owner-b", 2, 30_000, expect.clone())),
            &all_alive,
        )
        .unwrap();
    append(&mut disk, &b, 30_010, 3).unwrap();
    let view = read_events(&mut disk, 30_020).unwrap();
    (disk, expect, view)
}

fn set(xs: &[u64]) -> BTreeSet<u64> {
    xs.iter().copied().collect()
}

fn fenced() -> LeaseError {
    LeaseError::Fenced {
        run: "run-1".into(),
        generation: g(1),
        detail: "superseded".into(),
    }
}

fn op(ghost: &Ghost, kind: OpKind) -> OpGhost {
    ghost.begin(kind, None)
}

// --- Ghost::finish (I1, I7, I8, acknowledged = created, PROTOCOL_VIOLATION) ---

#[test]
fn finish_grants_once_and_increasing() {
    let mut gh = Ghost::new();
    let o = op(&gh, OpKind::Claim);
    assert!(gh.finish(&o, "a", 0, Ok(Told::Granted(g(1)))).is_ok());
    // Below a grant completed before the operation started (I1).
    let o = op(&gh, OpKind::Claim);
    assert!(gh.finish(&o, "b", 0, Ok(Told::Granted(g(1)))).is_err());
    // The same generation to two actors (overlapping operations).
    let mut gh = Ghost::new();
    let (o1, o2) = (op(&gh, OpKind::Claim), op(&gh, OpKind::Takeover));
    gh.finish(&o1, "a", 0, Ok(Told::Granted(g(1)))).unwrap();
    let e = gh.finish(&o2, "b", 0, Ok(Told::Granted(g(1)))).unwrap_err();
    assert!(e.contains("granted to a and to b"), "{e}");
    // One actor's grants decrease.
    let mut gh = Ghost::new();
    let (o1, o2) = (op(&gh, OpKind::Claim), op(&gh, OpKind::Claim));
    gh.finish(&o1, "a", 0, Ok(Told::Granted(g(2)))).unwrap();
    let e = gh.finish(&o2, "a", 0, Ok(Told::Granted(g(1)))).unwrap_err();
    assert!(e.contains("a was granted 1 after 2"), "{e}");
}

#[test]
fn finish_no_ownership_change_over_an_invalid_record() {
    let mut gh = Ghost::new();
    gh.corrupt(FileRef::Epoch(g(1)), 1);
    let o = op(&gh, OpKind::Takeover);
    assert!(gh.finish(&o, "b", 0, Ok(Told::Granted(g(2)))).is_err());
    let o = op(&gh, OpKind::Retire);
    assert!(gh.finish(&o, "b", 0, Ok(Told::Done)).is_err());
    let o = op(&gh, OpKind::Retire);
    assert!(Ghost::new().finish(&o, "b", 0, Ok(Told::Done)).is_ok());
}

#[test]
fn finish_superseded_heartbeat_or_release_never_succeeds() {
    for kind in [OpKind::Heartbeat, OpKind::Release] {
        let mut gh = Ghost::new();
        let mut o = op(&gh, kind);
        o.note_head(Some(2));
        assert!(gh.finish(&o, "a", 1, Ok(Told::Done)).is_err(), "{kind:?}");
        o.note_head(Some(1));
        assert!(gh.finish(&o, "a", 1, Ok(Told::Done)).is_ok(), "{kind:?}");
    }
}

#[test]
fn finish_acknowledged_is_created_and_fenced_is_refused() {
    let mut gh = Ghost::new();
    let mut o = op(&gh, OpKind::Append);
    let s = Sequence::new(3).unwrap();
    gh.on_request(&mut o, &Request::CreateExclusive(FileRef::Event(s), vec![]));
    assert!(gh.finish(&o, "a", 1, Ok(Told::Appended(4))).is_err());
    assert!(gh.finish(&o, "a", 1, Ok(Told::Appended(3))).is_ok());
    assert!(gh.acked.contains(&3));
    let mut o = op(&gh, OpKind::Append);
    let s = Sequence::new(4).unwrap();
    gh.on_request(&mut o, &Request::CreateExclusive(FileRef::Event(s), vec![]));
    gh.finish(&o, "a", 1, Err(&fenced())).unwrap();
    assert!(gh.refused.contains(&4));
    let pv = LeaseError::ProtocolViolation {
        detail: "expected Content".into(),
    };
    assert!(gh.finish(&o, "a", 1, Err(&pv)).is_err());
}

// --- observe_head (I2), check_no_new_epoch (I7), check_granted_epochs (I2) ---

#[test]
fn observe_head_never_goes_down_except_after_power_loss() {
    let mut gh = Ghost::new();
    gh.observe_head(Some(3), false).unwrap();
    assert!(gh.observe_head(Some(2), false).is_err());
    assert!(gh.observe_head(Some(2), true).is_ok());
    assert!(gh.observe_head(None, false).is_ok());
}

#[test]
fn no_new_epoch_after_an_invalid_record() {
    let mut gh = Ghost::new();
    assert!(gh.check_no_new_epoch(5).is_ok());
    gh.observe_head(Some(2), false).unwrap();
    gh.corrupt(FileRef::Beat(g(1)), 2);
    assert!(gh.check_no_new_epoch(2).is_ok());
    assert!(gh.check_no_new_epoch(3).is_err());
    // A prune removed epoch 1: fewer is fine; a new head is not, whatever the count.
    assert!(gh.check_no_new_epoch(1).is_ok());
    gh.observe_head(Some(3), false).unwrap();
    assert!(gh.check_no_new_epoch(1).is_err());
}

#[test]
fn granted_epochs_survive() {
    let mut gh = Ghost::new();
    let o = op(&gh, OpKind::Claim);
    gh.finish(&o, "a", 0, Ok(Told::Granted(g(2)))).unwrap();
    assert!(gh.check_granted_epochs(0, |x| x == g(2)).is_ok());
    assert!(gh.check_granted_epochs(0, |_| false).is_err());
    // Compacted below the checkpoint floor.
    assert!(gh.check_granted_epochs(3, |_| false).is_ok());
}

// --- check_acknowledged (I5), check_refused (I9), check_late (I9) ---

#[test]
fn acknowledged_refused_late() {
    let mut gh = Ghost::new();
    gh.acked.insert(1);
    gh.refused.insert(2);
    gh.late.insert(3);
    assert!(gh.check_acknowledged(&set(&[1])).is_ok());
    assert!(gh.check_acknowledged(&set(&[])).is_err());
    assert!(gh.check_refused(&set(&[1])).is_ok());
    assert!(gh.check_refused(&set(&[1, 2])).is_err());
    assert!(gh.check_late(&set(&[1])).is_ok());
    assert!(gh.check_late(&set(&[1, 3])).is_err());
}

// --- check_decisions (I4, I9, I5 against what each writer was told) ---

#[test]
fn decisions_against_what_writers_were_told() {
    let mut gh = Ghost::new();
    gh.acked.insert(1);
    gh.writer.insert(1, 1);
    gh.refused.insert(2);
    gh.writer.insert(2, 1);
    let none: Vec<(u64, u64, &[u64])> = vec![];
    assert!(gh.check_decisions([(1, 1)], none.clone()).is_ok());
    // Through the refused event.
    assert!(gh.check_decisions([(1, 2)], none.clone()).is_err());
    // Leaves the acknowledged one out.
    assert!(gh.check_decisions([(1, 0)], none).is_err());
    // Checkpoints: floor 2 through event 2 must list 2 (refused), not 1 (acknowledged).
    assert!(gh.check_decisions([], [(2, 2, &[2][..])]).is_ok());
    assert!(gh.check_decisions([], [(2, 2, &[][..])]).is_err());
    assert!(gh.check_decisions([], [(2, 2, &[1, 2][..])]).is_err());
}

// --- check_log and check_read (I5, I9, I13, I4 on a reader's answer) ---

#[test]
fn log_and_read_on_a_real_history() {
    let (_, _, view) = history();
    let mut gh = Ghost::new();
    gh.acked.extend([1, 2, 3]);
    assert_eq!(lease_core::ghost::counted(&view), set(&[1, 2, 3]));
    gh.check_log(&view).unwrap();
    gh.check_read(&view).unwrap();
    // A reader that drops an acknowledged event.
    let mut bad = view.clone();
    bad.events[1].standing = Standing::PastCutoff { cutoff: 1 };
    assert!(gh.check_log(&bad).is_err());
    assert!(gh.check_read(&bad).is_err());
    // A refused event counts.
    let mut gh2 = gh.clone();
    gh2.acked.remove(&3);
    gh2.refused.insert(3);
    assert!(gh2.check_log(&view).is_err());
    assert!(gh2.check_read(&view).is_err());
    // An acknowledged append past the reader's last event is not the reader's.
    let mut early = view.clone();
    early.events.truncate(2);
    early.last = Some((early.events[1].event.sequence, early.events[1].hash.clone()));
    assert!(gh.check_read(&early).is_ok());
    assert!(gh.check_log(&early).is_err());
}

// --- stable_judgements (I12), generation_monotone (I13) ---

#[test]
fn judgements_stable() {
    let (_, _, view) = history();
    assert!(stable_judgements(&view, &view).is_ok());
    let mut flipped = view.clone();
    flipped.events[0].standing = Standing::Pending;
    assert!(stable_judgements(&flipped, &view).is_err());
    let mut gone = view.clone();
    gone.events.truncate(1);
    assert!(stable_judgements(&view, &gone).is_err());
}

#[test]
fn history_generation_monotone() {
    let (_, _, view) = history();
    assert!(generation_monotone(&view).is_ok());
    // A zombie's event of generation 1 counting after generation 2's.
    let mut bad = view.clone();
    let mut zombie = bad.events[0].clone();
    zombie.event.sequence = Sequence::new(4).unwrap();
    bad.events.push(zombie);
    assert!(generation_monotone(&bad).is_err());
}

// --- within_cutoffs (the reader with itself) and Ghost::check_within_cutoffs (I4) ---

#[test]
fn within_cutoffs_by_the_readers_cutoffs() {
    let (_, _, view) = history();
    assert_eq!(view.chain.cutoffs.get(&g(1)), Some(&2));
    assert!(within_cutoffs(&view).is_ok());
    let mut bad = view.clone();
    bad.chain.cutoffs.insert(g(1), 1);
    assert!(within_cutoffs(&bad).is_err());
}

/// The ghost's own record of the order of links judges, not the cutoff value: a cutoff
/// written one too high (3 instead of 2) makes a zombie's event 3 of generation 1 count
/// by the reader's rule, and `within_cutoffs` is silent; the ghost saw event 3 linked
/// after generation 1's cutoff and fires.
#[test]
fn within_cutoffs_by_the_ghosts_facts() {
    let (_, _, view) = history();
    let mut gh = Ghost::new();
    let mut o = op(&gh, OpKind::Append);
    for s in [1, 2] {
        o.created_event = Some(s);
        gh.on_linked(&o, &Response::Created, 1);
    }
    gh.on_cutoff_linked(1);
    o.created_event = Some(3);
    gh.on_linked(&o, &Response::Created, 2);
    gh.check_within_cutoffs(&view).unwrap();

    // The mutant: cutoff 1 decided through 3, and a zombie of generation 1 linked event 3
    // after the cutoff.
    let mut bad = view.clone();
    bad.chain.cutoffs.insert(g(1), 3);
    bad.events[2].event.generation = g(1);
    bad.events[2].event.owner_id = bad.events[0].event.owner_id.clone();
    let mut zombie = gh.clone();
    zombie.on_linked(&o, &Response::Created, 1);
    assert!(
        within_cutoffs(&bad).is_ok(),
        "the reader's rule is blind to it"
    );
    let e = zombie.check_within_cutoffs(&bad).unwrap_err();
    assert!(e.contains("linked after generation 1's cutoff"), "{e}");
    assert!(zombie.check_log(&bad).is_err());
    // An event linked before the cutoff is fine whatever the cutoff says.
    assert!(gh.check_within_cutoffs(&bad).is_ok());
    // A power loss that undid the cutoff's link (it was never durable): the cutoff may be
    // decided again, through the later event, and that is sound.
    let mut lost = zombie.clone();
    lost.power_loss(|_| false, |_| true);
    assert!(lost.check_within_cutoffs(&bad).is_ok());
    let mut kept = zombie;
    kept.power_loss(|_| true, |_| true);
    assert!(kept.check_within_cutoffs(&bad).is_err());
}

// --- cutoffs_have_successors (I11), status_valid (I10) ---

#[test]
fn cutoffs_need_successors() {
    assert!(cutoffs_have_successors([g(1)], 2, 0).is_ok());
    assert!(cutoffs_have_successors([g(2)], 2, 0).is_err());
    assert!(cutoffs_have_successors([g(2)], 2, 3).is_ok());
}

#[test]
fn status_stays_valid() {
    assert!(status_valid(&Status::Active).is_ok());
    assert!(status_valid(&Status::Invalid(fenced())).is_err());
}

// --- check_epoch_created and check_takeover_retired (I6, I8) ---

#[test]
fn epoch_created_over_the_observed_owner() {
    let (mut disk, expect, _) = history();
    let e1 = read_epoch(&mut disk, 1);
    let gh = Ghost::new();
    let o = gh.begin(OpKind::Takeover, Some(expect.clone()));
    let alive = |_: &Holder| true;
    assert!(
        gh.check_epoch_created(&o, g(2), Some((g(1), &e1)), alive, None)
            .is_ok()
    );
    let mut other = expect.clone();
    other.owner_id = id("owner-z");
    let o2 = gh.begin(OpKind::Takeover, Some(other));
    assert!(
        gh.check_epoch_created(&o2, g(2), Some((g(1), &e1)), alive, None)
            .is_err()
    );
    assert!(gh.check_epoch_created(&o, g(2), None, alive, None).is_err());
    // A retirement over a live holder; a release of another generation.
    let r = gh.begin(OpKind::Retire, None);
    assert!(
        gh.check_epoch_created(&r, g(2), Some((g(1), &e1)), alive, None)
            .is_err()
    );
    assert!(
        gh.check_epoch_created(&r, g(2), Some((g(1), &e1)), |_| false, None)
            .is_ok()
    );
    let rel = gh.begin(OpKind::Release, None);
    assert!(
        gh.check_epoch_created(&rel, g(2), None, alive, Some(g(1)))
            .is_ok()
    );
    assert!(
        gh.check_epoch_created(&rel, g(3), None, alive, Some(g(1)))
            .is_err()
    );
}

/// The step-6 mutant's trace: the owner beat after the taker's look, and the takeover
/// replaced it anyway; its epoch records the beat it re-read, not the one the taker
/// expected.
#[test]
fn takeover_retired_exactly_what_the_taker_expected() {
    let (mut disk, expect, _) = history();
    let e2 = read_epoch(&mut disk, 2);
    let gh = Ghost::new();
    let o = gh.begin(OpKind::Takeover, Some(expect.clone()));
    check_takeover_retired(&o, Some(&e2)).unwrap();
    assert!(check_takeover_retired(&o, None).is_err());
    assert!(check_takeover_retired(&gh.begin(OpKind::Takeover, None), Some(&e2)).is_err());
    // Another owner.
    let mut other = e2.clone();
    other.retired.as_mut().unwrap().owner_id = id("owner-z");
    assert!(check_takeover_retired(&o, Some(&other)).is_err());
    // A later beat (count and time) than expected: the unseen beat.
    let mut later = e2.clone();
    let seen = later.retired.as_mut().unwrap().observed.as_mut().unwrap();
    seen.heartbeat_count += 1;
    seen.heartbeat_at = t(25_000);
    let e = check_takeover_retired(&o, Some(&later)).unwrap_err();
    assert!(e.contains("expected beat"), "{e}");
    // The time alone, or the count alone.
    let mut time_only = e2.clone();
    time_only
        .retired
        .as_mut()
        .unwrap()
        .observed
        .as_mut()
        .unwrap()
        .heartbeat_at = t(25_000);
    assert!(check_takeover_retired(&o, Some(&time_only)).is_err());
    let mut count_only = e2.clone();
    count_only
        .retired
        .as_mut()
        .unwrap()
        .observed
        .as_mut()
        .unwrap()
        .heartbeat_count += 1;
    assert!(check_takeover_retired(&o, Some(&count_only)).is_err());
    // No observation recorded at all.
    let mut blind = e2;
    blind.retired.as_mut().unwrap().observed = None;
    assert!(check_takeover_retired(&o, Some(&blind)).is_err());
}

// --- check_durable_beats (PROTOCOL §5.3), power loss and late events (I9) ---

/// A heartbeat file holding beat `count` of generation 1 of `rec`'s owner.
fn beat_file(count: u64) -> Vec<u8> {
    let rec = HeartbeatRecord {
        run_id: run_id(),
        generation: g(1),
        owner_id: id("owner-a"),
        heartbeat_at: t(count),
        count,
        store_head: None,
        mono: None,
    };
    lease_core::beat::fresh_file(count, &encode(&rec).unwrap()).unwrap()
}

#[test]
fn durable_beats_are_never_lost() {
    let mut gh = Ghost::new();
    assert!(
        gh.check_durable_beats(|_| None).is_ok(),
        "nothing acknowledged yet"
    );
    gh.on_durable_beat(1, 2);
    assert!(gh.check_durable_beats(|_| Some(beat_file(2))).is_ok());
    assert!(gh.check_durable_beats(|_| Some(beat_file(3))).is_ok());
    let older = gh.check_durable_beats(|_| Some(beat_file(1)));
    assert!(older.unwrap_err().contains("beat 1"));
    let torn = gh.check_durable_beats(|_| Some(vec![0; 64]));
    assert!(torn.unwrap_err().contains("no valid beat"));
    let gone = gh.check_durable_beats(|_| None);
    assert!(gone.unwrap_err().contains("gone"));
}

#[test]
fn durable_beats_are_not_judged_once_removed_or_corrupted_by_hand() {
    let mut gh = Ghost::new();
    gh.on_durable_beat(1, 2);
    let mut o = op(&gh, OpKind::Release);
    gh.on_request(
        &mut o,
        &Request::Remove(FileRef::Beat(g(1)), Durability::NoFsync),
    );
    assert!(gh.check_durable_beats(|_| None).is_ok());
    gh.on_durable_beat(1, 3);
    gh.corrupt(FileRef::Beat(g(1)), 1);
    assert!(gh.check_durable_beats(|_| None).is_ok());
}

#[test]
fn a_late_event_undone_by_power_loss_is_forgotten() {
    let mut gh = Ghost::new();
    let c = op(&gh, OpKind::Claim);
    gh.finish(&c, "b", 0, Ok(Told::Granted(g(2)))).unwrap();
    let mut a = op(&gh, OpKind::Append);
    gh.on_request(
        &mut a,
        &Request::CreateExclusive(FileRef::Event(Sequence::new(4).unwrap()), vec![]),
    );
    gh.on_linked(&a, &Response::Created, 1);
    let four: BTreeSet<u64> = [4].into();
    assert!(
        gh.check_late(&four).is_err(),
        "linked by generation 1 after 2 was granted"
    );
    // The power loss kept it: still late.
    gh.power_loss(|_| true, |_| true);
    assert!(gh.check_late(&four).is_err());
    // It undid the link: sequence 4 may be written again, by anyone.
    gh.power_loss(|_| true, |s| s != 4);
    assert!(gh.check_late(&four).is_ok());
}
