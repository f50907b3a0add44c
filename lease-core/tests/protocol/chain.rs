//! Verify and rollback evidence: broken links, short logs, bound cutoffs, deleted epochs, and
//! checkpoints.

use crate::common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;

// PROTOCOL §13
#[test]
fn verify_reports_the_first_broken_link() {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    for n in 1..=3 {
        append(&mut d, &l, n, n).unwrap();
    }
    release(&mut d, &l, 10).unwrap();
    claim(&mut d, "b", 2, 20).unwrap();
    assert!(d.run(&mut Verify::new(run_id()), &all_alive).is_ok());
    // Swap in a different, valid event 2: event 3's link breaks.
    let mut e2: Event = decode(&d.files[&FileRef::Event(Sequence::new(2).unwrap())]).unwrap();
    e2.payload = serde_json::json!("edited");
    d.files.insert(
        FileRef::Event(Sequence::new(2).unwrap()),
        encode(&e2).unwrap(),
    );
    let e = d.run(&mut Verify::new(run_id()), &all_alive).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN");
    assert!(e.to_string().contains("event chain broken at 3"), "{e}");
}

// PROTOCOL §13
#[test]
fn verify_reports_a_log_that_ends_before_a_finalized_cutoff() {
    let mut d = MemDisk::new();
    let old = claim(&mut d, "a", 1, 0).unwrap();
    for n in 1..=2 {
        append(&mut d, &old, n, n).unwrap();
    }
    takeover(&mut d, "b", 2, 60_000).unwrap();
    let report = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert_eq!(report.short_tail, None, "an intact log is not short");
    // The cutoff of generation 1 says "through 2"; delete the log's tail.
    d.files.remove(&FileRef::Event(Sequence::new(2).unwrap()));
    let report = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert_eq!(
        report.short_tail,
        Some(ShortTail {
            named: 2,
            by_cutoff_of: Some(Generation::FIRST),
            tail: 1,
        })
    );
}

// Issue #17, rollback evidence (PROTOCOL §4 `cutoff_hash`, §7.0 FINALIZE, §13). A run where
// every cutoff but the newest is bound: a (g1) appends 1, b takes over (g2, cutoff 1
// through 1), b appends 2, b releases (g3 binds cutoff 1), c claims (g4 binds cutoff 2).
fn bound_run() -> (MemDisk, OwnedLease) {
    let mut d = MemDisk::new();
    let a = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &a, 1, 1).unwrap();
    let b = takeover(&mut d, "b", 2, 60_000).unwrap();
    append(&mut d, &b, 60_001, 2).unwrap();
    release(&mut d, &b, 60_002).unwrap();
    claim(&mut d, "c", 3, 60_003).unwrap();
    (d, a)
}

fn epoch_of(d: &MemDisk, g: u64) -> EpochRecord {
    decode(&d.files[&FileRef::Epoch(Generation::new(g).unwrap())]).unwrap()
}

fn verify(d: &mut MemDisk) -> Result<VerifyReport, LeaseError> {
    d.run(&mut Verify::new(run_id()), &all_alive)
}

#[test]
fn each_epoch_binds_the_cutoff_its_gate_finalized() {
    let (mut d, _) = bound_run();
    let cut =
        |d: &MemDisk, g: u64| Digest::of(&d.files[&FileRef::Cutoff(Generation::new(g).unwrap())]);
    assert_eq!(
        epoch_of(&d, 2).cutoff_hash,
        None,
        "epoch 1 superseded nobody"
    );
    assert_eq!(epoch_of(&d, 3).cutoff_hash, Some(cut(&d, 1)));
    assert_eq!(epoch_of(&d, 4).cutoff_hash, Some(cut(&d, 2)));
    let report = verify(&mut d).unwrap();
    assert_eq!((report.epochs, report.events), (4, 2));
}

#[test]
fn a_deleted_bound_cutoff_is_chain_broken_and_never_finalized_again() {
    let (mut d, zombie) = bound_run();
    let cutoff1 = FileRef::Cutoff(Generation::FIRST);
    d.files.remove(&cutoff1);
    let e = verify(&mut d).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
    assert!(
        e.to_string()
            .contains("lease/cutoffs/00000000000000000001.json is missing"),
        "{e}"
    );
    // A read-only reader does not call them "not counted yet" (pending): removed.
    let e = d
        .run(&mut ReadEvents::new(run_id(), None), &all_alive)
        .unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
    // A finalizing reader refuses rather than deciding generation 1's events again.
    let e = read_events(&mut d, 70_000).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
    assert!(
        !d.files.contains_key(&cutoff1),
        "the reader re-created the cutoff"
    );
    // The zombie of generation 1 appends (its PRE-check finds no cutoff): its event must
    // never be acknowledged. Before the binding, the lazy FINALIZE of its POST-check
    // re-created cutoff 1 through the new tail and acknowledged it.
    let e = append(&mut d, &zombie, 70_001, 3).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
    assert!(!d.files.contains_key(&cutoff1));
}

/// PROTOCOL §7.0 L4, found by the model checker's concurrent reader (OQ-15 configuration):
/// a lazy FINALIZE read `cutoff 1` missing while the releaser was about to create it; the
/// release then ended and a claim created epoch 3 before the finalizer's `Exists(epoch 3)`.
/// Epoch 3 existing means its creator had cutoff 1, but here it was created, not removed:
/// the finalizer reads it again and uses it instead of answering `CHAIN_BROKEN` on a sound
/// run.
#[test]
fn a_lazy_finalize_overtaken_by_the_cutoff_and_the_next_claim_uses_the_cutoff() {
    let mut d = MemDisk::new();
    let a = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &a, 1, 1).unwrap();
    let mut rel = Release::new(ReleaseParams {
        lease: a.clone(),
        now: t(2),
        seal: None,
    });
    // The release up to its eager FINALIZE's create of cutoff 1 (not yet performed).
    let mut ri = None;
    let cutoff = loop {
        match rel.next(ri.take()) {
            Step::Io(r @ Request::CreateExclusive(FileRef::Cutoff(_), _)) => break r,
            Step::Io(r) => ri = Some(d.perform(r, &all_alive)),
            Step::Done(r) => panic!("release ended early: {r:?}"),
        }
    };
    // A finalizing reader sees epoch 2 retire generation 1, no cutoff: it reads cutoff 1
    // (missing) lazily.
    let mut reader = ReadEvents::new(run_id(), Some((id("reader"), t(3))));
    let mut input = None;
    loop {
        match reader.next(input.take()) {
            Step::Io(r @ Request::Read(FileRef::Cutoff(_))) => {
                input = Some(d.perform(r, &all_alive));
                assert_eq!(input, Some(Response::Content(None)));
                break;
            }
            Step::Io(r) => input = Some(d.perform(r, &all_alive)),
            Step::Done(r) => panic!("reader ended early: {r:?}"),
        }
    }
    // The release creates cutoff 1 and ends; b claims generation 3.
    ri = Some(d.perform(cutoff, &all_alive));
    loop {
        match rel.next(ri.take()) {
            Step::Io(r) => ri = Some(d.perform(r, &all_alive)),
            Step::Done(r) => break assert_eq!(r.unwrap().get(), 2),
        }
    }
    assert_eq!(claim(&mut d, "b", 2, 4).unwrap().generation.get(), 3);
    let view = loop {
        match reader.next(input.take()) {
            Step::Io(r) => input = Some(d.perform(r, &all_alive)),
            Step::Done(r) => break r.unwrap(),
        }
    };
    assert_eq!(counted(&view), [1]);
    assert_eq!(counted(&read_events(&mut d, 5).unwrap()), [1]);
}

#[test]
fn an_edited_bound_cutoff_is_chain_broken() {
    let (mut d, _) = bound_run();
    let f = FileRef::Cutoff(Generation::FIRST);
    let mut c: RetirementRecord = decode(&d.files[&f]).unwrap();
    c.events_through = 2;
    d.files.insert(f, encode(&c).unwrap());
    let e = verify(&mut d).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
    assert!(e.to_string().contains("was changed"), "{e}");
}

#[test]
fn a_cutoff_that_disagrees_with_its_epoch_is_chain_broken() {
    // The newest cutoff (2) is not bound yet by hash, but it must still name its epoch's
    // owner and successor.
    let mut d = MemDisk::new();
    let a = claim(&mut d, "a", 1, 0).unwrap();
    release(&mut d, &a, 1).unwrap();
    let f = FileRef::Cutoff(Generation::FIRST);
    let good = d.files[&f].clone();
    let mut c: RetirementRecord = decode(&good).unwrap();
    c.owner_id = id("someone-else");
    d.files.insert(f, encode(&c).unwrap());
    let e = verify(&mut d).unwrap_err();
    assert!(e.to_string().contains("names owner someone-else"), "{e}");
    let mut c: RetirementRecord = decode(&good).unwrap();
    c.superseded_by = Generation::new(5).unwrap();
    d.files.insert(f, encode(&c).unwrap());
    let e = verify(&mut d).unwrap_err();
    assert!(e.to_string().contains("superseded by generation 5"), "{e}");
    d.files.insert(f, good);
    verify(&mut d).unwrap();
}

#[test]
fn deleted_newest_epochs_are_chain_broken() {
    // a: g1 appends 1, releases (g2); b: g3 appends 2, releases (g4).
    let mut d = MemDisk::new();
    let a = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &a, 1, 1).unwrap();
    release(&mut d, &a, 2).unwrap();
    let b = claim(&mut d, "b", 2, 3).unwrap();
    append(&mut d, &b, 4, 2).unwrap();
    release(&mut d, &b, 5).unwrap();
    verify(&mut d).unwrap();
    let epoch = |g: u64| FileRef::Epoch(Generation::new(g).unwrap());
    // Only the released head: cutoff 3 names epoch 4 as its successor.
    let mut d4 = d.clone();
    d4.files.remove(&epoch(4));
    let e = verify(&mut d4).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN");
    assert!(e.to_string().contains("epoch 4 superseded it"), "{e}");
    // Epochs 3 and 4: cutoff 3 exists without its epoch.
    d.files.remove(&epoch(4));
    d.files.remove(&epoch(3));
    let e = verify(&mut d).unwrap_err();
    assert!(e.to_string().contains("newest epochs were deleted"), "{e}");
    // And its cutoff too: event 2 still names generation 3.
    d.files
        .remove(&FileRef::Cutoff(Generation::new(3).unwrap()));
    let e = verify(&mut d).unwrap_err();
    assert!(
        e.to_string().contains("events of generation 3 exist"),
        "{e}"
    );
    // A beat above the head says the same (no event, no cutoff left).
    let mut d = MemDisk::new();
    let a = claim(&mut d, "a", 1, 0).unwrap();
    release(&mut d, &a, 1).unwrap();
    let b = claim(&mut d, "b", 2, 2).unwrap();
    heartbeat(&mut d, &b, 3, 1).unwrap();
    d.files.remove(&epoch(3));
    let e = verify(&mut d).unwrap_err();
    assert!(
        e.to_string()
            .contains("lease/beats/00000000000000000003.json exists"),
        "{e}"
    );
}

#[test]
fn a_checkpoint_binds_its_last_event_and_verify_checks_it() {
    let mut d = MemDisk::new();
    let mut now = 0;
    for i in 0..6u64 {
        now += 10;
        let l = claim(&mut d, &format!("o{i}"), 10 + i as u32, now).unwrap();
        append(&mut d, &l, now + 1, i).unwrap();
        release(&mut d, &l, now + 2).unwrap();
    }
    let report = d
        .run(
            &mut Prune::new(PruneParams {
                run_id: run_id(),
                keep: 2,
                by: id("pruner"),
                now: t(now + 3),
            }),
            &all_alive,
        )
        .unwrap();
    let floor = report.floor.unwrap();
    let cp: Checkpoint = decode(&d.files[&FileRef::Checkpoint(floor)]).unwrap();
    let last = FileRef::Event(Sequence::new(6).unwrap());
    assert_eq!(cp.through_sequence, 6);
    assert_eq!(cp.through_hash, Some(Digest::of(&d.files[&last])));
    verify(&mut d).unwrap();
    // Rewrite the last event (no later event links to it, so only the checkpoint can tell).
    let mut ev: Event = decode(&d.files[&last]).unwrap();
    ev.payload = serde_json::json!("rewritten");
    d.files.insert(last, encode(&ev).unwrap());
    let e = verify(&mut d).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
    assert!(e.to_string().contains("through_hash differs"), "{e}");
    // With a later event appended after it, the hash is read from the event itself.
    let mut d2 = d.clone();
    d2.files.remove(&last);
    let mut ev: Event = decode(&d.files[&last]).unwrap();
    ev.payload = serde_json::json!({ "n": 5 });
    d2.files.insert(last, encode(&ev).unwrap());
    verify(&mut d2).unwrap();
    let l = claim(&mut d2, "late", 99, now + 10).unwrap();
    append(&mut d2, &l, now + 11, 7).unwrap();
    verify(&mut d2).unwrap();
}
