//! FINALIZE(g, superseded_by) (PROTOCOL §7.0), eager and lazy, with its SYNC points.

use super::{Tail, decode_checkpoint, decode_cutoff, newest_checkpoint};
use crate::canonical::encode;
use crate::error::LeaseError;
use crate::ids::{Generation, Identity, RunId};
use crate::layout::{Dir, FileRef};
use crate::ops::{Operation, Request, Response, Step, step_try, sub_step, violation};
use crate::records::RetirementRecord;
use crate::time::Timestamp;

/// Sub-operation: finalize the cutoff of a superseded active generation (rules R1 and R2 of
/// docs/PROTOCOL.md §8): only after the superseding generation exists, take the log tail at
/// this moment and create the retirement record exclusively; the first finalizer wins and
/// everyone else reads its value.
#[derive(Debug, Clone)]
pub(crate) struct Finalize {
    run: RunId,
    generation: Generation,
    owner_id: Identity,
    superseded_by: Generation,
    by: Identity,
    now: Timestamp,
    lazy: bool,
    /// Lazy only: epoch `g + 2` was seen to exist after the cutoff was read missing, so the
    /// cutoff is read once more before it is called removed (see `CheckBound`).
    bound: bool,
    /// The cutoff another finalizer created (F3 `AlreadyExists`) was gone when read: a
    /// concurrent prune may have folded it since; the checkpoints decide (see `Reading`).
    vanished: bool,
    st: FinalizeState,
}

#[derive(Debug, Clone)]
enum FinalizeState {
    Start,
    /// Lazy finalization: read first, create only if missing.
    Checking,
    /// The cutoff is missing: is the generation below a checkpoint floor (compacted)?
    ListCheckpoints,
    ReadCheckpoint(Generation),
    /// Lazy only, the cutoff missing and no checkpoint folding it: does epoch `g + 2`
    /// exist? Its creator's GATE had this cutoff (and bound its hash), so it exists now or
    /// was removed, and re-creating it could count a zombie's fenced events (issue #17).
    /// It may also have been created (and `g + 2` after it) since it was read missing:
    /// it is read again before it is called removed.
    CheckBound,
    Tail(Tail),
    /// Lazy only: the superseding epoch this finalizer saw was created by someone else
    /// and may not be durable yet; `lease/epochs/` is fsynced before the cutoff is created
    /// (PROTOCOL §7.0 SYNC, OQ-1 hardening), so a cutoff never outlives its successor.
    SyncEpochs(Box<RetirementRecord>, Vec<u8>),
    Creating(Box<RetirementRecord>),
    Reading,
    /// A cutoff or checkpoint this actor *read* (someone else created it): its folder is
    /// being fsynced before the answer is given (PROTOCOL §7.0 SYNC).
    Syncing(Box<Cut>),
}

impl Finalize {
    pub(crate) fn new(
        run: RunId,
        generation: Generation,
        owner_id: Identity,
        superseded_by: Generation,
        by: Identity,
        now: Timestamp,
    ) -> Finalize {
        Finalize {
            run,
            generation,
            owner_id,
            superseded_by,
            by,
            now,
            lazy: false,
            bound: false,
            vanished: false,
            st: FinalizeState::Start,
        }
    }

    /// Read the cutoff first and create it only if missing (for callers that finalize a
    /// cutoff someone else most likely already wrote).
    pub(crate) fn lazy(mut self) -> Finalize {
        self.lazy = true;
        self
    }

    /// SYNC (PROTOCOL §7.0): a cutoff or checkpoint that was *read* (created by someone
    /// else, who may not have fsynced its folder yet) becomes the answer only once its
    /// folder is fsynced, so no caller acts on a record a power loss can still take away.
    /// A cutoff this finalizer created itself is durable already (`Created` comes after
    /// the folder's fsync) and needs none.
    fn sync(&mut self, decoded: Result<Cut, LeaseError>) -> Step<Cut> {
        match decoded {
            Ok(cut) => {
                let dir = match cut {
                    Cut::Record(_) => Dir::Cutoffs,
                    Cut::Compacted(_) => Dir::Checkpoints,
                };
                self.st = FinalizeState::Syncing(Box::new(cut));
                Step::Io(Request::SyncDir(dir))
            }
            Err(e) => Step::Done(Err(e)),
        }
    }

    /// The cutoff existed (another finalizer's create won) and is gone, with no checkpoint
    /// above it: removed by hand.
    fn vanished(&self) -> LeaseError {
        LeaseError::RecordInvalid {
            run: self.run.to_string(),
            kind: crate::error::RecordKind::Retirement,
            file: Some(FileRef::Cutoff(self.generation).path()),
            detail: "it existed a moment ago and is gone, and no checkpoint folds it: cutoffs are never removed above a checkpoint floor".into(),
        }
    }

    /// The cutoff is missing although epoch `g + 2`, whose creator had it, exists.
    fn removed(&self) -> LeaseError {
        removed_cutoff(&self.run, self.generation)
    }
}

/// `cutoff g` is missing although epoch `g + 2` exists: that epoch's creator finalized it
/// first (GATE), so it was removed (issue #17). One error for the finalizer, every reader
/// and `verify`.
pub(crate) fn removed_cutoff(run: &RunId, g: Generation) -> LeaseError {
    LeaseError::ChainBroken {
        run: run.to_string(),
        chain: "cutoff",
        at: g.get(),
        detail: format!(
            "{} is missing, but epoch {} exists, whose creator finalized it first: it was removed (restore it from a backup; re-creating it could count events that were refused)",
            FileRef::Cutoff(g).path(),
            g.get().saturating_add(2)
        ),
    }
}

/// The cutoff of a superseded generation: its retirement record, or, when a prune folded
/// it away, the checkpoint that judges its events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cut {
    Record(RetirementRecord),
    Compacted(crate::records::Checkpoint),
}

impl Cut {
    /// Does event `s` of the superseded generation count?
    pub(crate) fn counts(&self, s: u64) -> bool {
        match self {
            Cut::Record(r) => s <= r.events_through,
            Cut::Compacted(cp) => {
                s <= cp.through_sequence && cp.not_authoritative.binary_search(&s).is_err()
            }
        }
    }

    /// Human description for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Cut::Record(r) => format!(
                "superseded by generation {}; cutoff {}",
                r.superseded_by, r.events_through
            ),
            Cut::Compacted(cp) => format!(
                "compacted below checkpoint floor {} (through sequence {})",
                cp.floor_generation, cp.through_sequence
            ),
        }
    }
}

impl Operation for Finalize {
    type Output = Cut;
    fn next(&mut self, mut input: Option<Response>) -> Step<Cut> {
        loop {
            match std::mem::replace(&mut self.st, FinalizeState::Start) {
                FinalizeState::Start if self.lazy => {
                    self.st = FinalizeState::Checking;
                    return Step::Io(Request::Read(FileRef::Cutoff(self.generation)));
                }
                FinalizeState::Start => {
                    self.st = FinalizeState::Tail(Tail::new(0));
                    input = None;
                }
                FinalizeState::Checking => match input.take() {
                    Some(Response::Content(Some(b))) => {
                        return self
                            .sync(decode_cutoff(&self.run, self.generation, &b).map(Cut::Record));
                    }
                    Some(Response::Content(None)) => {
                        // Never re-create a cutoff that a prune folded into a checkpoint:
                        // the checkpoint (created before the cutoff was removed) decides.
                        self.st = FinalizeState::ListCheckpoints;
                        return Step::Io(Request::List(Dir::Checkpoints));
                    }
                    other => return Step::Done(Err(violation("Content", &other))),
                },
                FinalizeState::ListCheckpoints => match input.take() {
                    Some(Response::Listing(l)) => {
                        let top = newest_checkpoint(l);
                        match top {
                            Some(floor) if floor > self.generation => {
                                self.st = FinalizeState::ReadCheckpoint(floor);
                                return Step::Io(Request::Read(FileRef::Checkpoint(floor)));
                            }
                            _ if self.vanished => return Step::Done(Err(self.vanished())),
                            _ if self.bound => return Step::Done(Err(self.removed())),
                            _ => match self
                                .generation
                                .get()
                                .checked_add(2)
                                .and_then(Generation::new)
                            {
                                Some(binder) => {
                                    self.st = FinalizeState::CheckBound;
                                    return Step::Io(Request::Exists(FileRef::Epoch(binder)));
                                }
                                None => self.st = FinalizeState::Tail(Tail::new(0)),
                            },
                        }
                    }
                    other => return Step::Done(Err(violation("Listing", &other))),
                },
                FinalizeState::ReadCheckpoint(floor) => match input.take() {
                    Some(Response::Content(Some(b))) => {
                        return self
                            .sync(decode_checkpoint(&self.run, floor, &b).map(Cut::Compacted));
                    }
                    // A newer prune replaced it: look again.
                    Some(Response::Content(None)) => {
                        self.st = FinalizeState::ListCheckpoints;
                        return Step::Io(Request::List(Dir::Checkpoints));
                    }
                    other => return Step::Done(Err(violation("Content", &other))),
                },
                FinalizeState::CheckBound => match input.take() {
                    Some(Response::Exists(false)) => self.st = FinalizeState::Tail(Tail::new(0)),
                    Some(Response::Exists(true)) => {
                        // Epoch g+2's creator had the cutoff before it created g+2, so the
                        // cutoff exists now unless it was removed. It may have been created
                        // since it was read missing (a releaser's eager FINALIZE, then a
                        // claim of g+2, found by the model checker's concurrent reader):
                        // read it again; still missing and no checkpoint folding it →
                        // removed.
                        self.bound = true;
                        self.st = FinalizeState::Checking;
                        return Step::Io(Request::Read(FileRef::Cutoff(self.generation)));
                    }
                    other => return Step::Done(Err(violation("Exists", &other))),
                },
                FinalizeState::Tail(t) => {
                    let tail = sub_step!(self.st, FinalizeState::Tail, [], t, input.take());
                    // mutant cutoff_one_too_high: the cutoff counts one event past the tail (I4, I13).
                    let tail = if crate::mutant::mutant("cutoff_one_too_high") {
                        tail + 1
                    } else {
                        tail
                    };
                    let rec = RetirementRecord {
                        run_id: self.run.clone(),
                        generation: self.generation,
                        owner_id: self.owner_id.clone(),
                        superseded_by: self.superseded_by,
                        events_through: tail,
                        finalized_at: self.now,
                        finalized_by: self.by.clone(),
                    };
                    let bytes = step_try!(encode(&rec));
                    if self.lazy {
                        self.st = FinalizeState::SyncEpochs(Box::new(rec), bytes);
                        return Step::Io(Request::SyncDir(Dir::Epochs));
                    }
                    self.st = FinalizeState::Creating(Box::new(rec));
                    return Step::Io(Request::CreateExclusive(
                        FileRef::Cutoff(self.generation),
                        bytes,
                    ));
                }
                FinalizeState::SyncEpochs(rec, bytes) => {
                    return match input {
                        Some(Response::Done) => {
                            self.st = FinalizeState::Creating(rec);
                            Step::Io(Request::CreateExclusive(
                                FileRef::Cutoff(self.generation),
                                bytes,
                            ))
                        }
                        other => Step::Done(Err(violation("Done", &other))),
                    };
                }
                FinalizeState::Creating(rec) => {
                    return match input {
                        Some(Response::Created) => Step::Done(Ok(Cut::Record(*rec))),
                        Some(Response::AlreadyExists) => {
                            self.st = FinalizeState::Reading;
                            Step::Io(Request::Read(FileRef::Cutoff(self.generation)))
                        }
                        other => Step::Done(Err(violation("Created/AlreadyExists", &other))),
                    };
                }
                FinalizeState::Reading => {
                    return match input {
                        Some(Response::Content(Some(b))) => self
                            .sync(decode_cutoff(&self.run, self.generation, &b).map(Cut::Record)),
                        // Gone since `AlreadyExists`: a prune that moved the floor past it
                        // removes it after its checkpoint is durable, so look for that
                        // checkpoint before calling the run damaged (found by the model
                        // checker: a release or reader racing a prune).
                        Some(Response::Content(None)) => {
                            self.vanished = true;
                            self.st = FinalizeState::ListCheckpoints;
                            Step::Io(Request::List(Dir::Checkpoints))
                        }
                        other => Step::Done(Err(violation("Content", &other))),
                    };
                }
                FinalizeState::Syncing(cut) => {
                    return match input {
                        Some(Response::Done) => Step::Done(Ok(*cut)),
                        other => Step::Done(Err(violation("Done", &other))),
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Digest;
    use crate::records::Checkpoint;

    fn g(n: u64) -> Generation {
        Generation::new(n).unwrap()
    }

    /// FINALIZE(3, superseded by 4) by a fixed actor; eager unless `lazy`.
    fn finalize(lazy: bool) -> Finalize {
        let run = RunId::new("r").unwrap();
        let f = Finalize::new(
            run,
            g(3),
            Identity::new("owner").unwrap(),
            g(4),
            Identity::new("finalizer").unwrap(),
            Timestamp::EPOCH,
        );
        if lazy { f.lazy() } else { f }
    }

    fn io<T: std::fmt::Debug>(s: Step<T>) -> Request {
        match s {
            Step::Io(r) => r,
            other => panic!("expected a request, got {other:?}"),
        }
    }

    fn done<T: std::fmt::Debug>(s: Step<T>) -> Result<T, LeaseError> {
        match s {
            Step::Done(r) => r,
            other => panic!("expected the end, got {other:?}"),
        }
    }

    fn record(events_through: u64) -> RetirementRecord {
        RetirementRecord {
            run_id: RunId::new("r").unwrap(),
            generation: g(3),
            owner_id: Identity::new("owner").unwrap(),
            superseded_by: g(4),
            events_through,
            finalized_at: Timestamp::EPOCH,
            finalized_by: Identity::new("finalizer").unwrap(),
        }
    }

    #[test]
    fn a_cut_describes_its_cutoff_or_its_checkpoint() {
        assert_eq!(
            Cut::Record(record(7)).describe(),
            "superseded by generation 4; cutoff 7"
        );
        let cp = Checkpoint {
            run_id: RunId::new("r").unwrap(),
            floor_generation: g(5),
            floor_epoch_hash: Digest::of(b"epoch 5"),
            through_sequence: 9,
            through_hash: None,
            not_authoritative: vec![],
            unjudged_from: None,
            created_at: Timestamp::EPOCH,
            created_by: Identity::new("pruner").unwrap(),
        };
        assert_eq!(
            Cut::Compacted(cp).describe(),
            "compacted below checkpoint floor 5 (through sequence 9)"
        );
    }

    /// The eager finalizer created the superseding epoch itself: it takes the tail at once
    /// and creates the cutoff, with no read of the cutoff first and no fsync of
    /// `lease/epochs/` (the lazy path's SYNC).
    #[test]
    fn eager_finalize_takes_the_tail_and_creates_at_once() {
        let mut f = finalize(false);
        assert_eq!(
            io(f.next(None)),
            Request::Exists(FileRef::Event(crate::ids::Sequence::FIRST))
        );
        match io(f.next(Some(Response::Exists(false)))) {
            Request::CreateExclusive(FileRef::Cutoff(c), _) => assert_eq!(c, g(3)),
            other => panic!("expected the cutoff's create, got {other:?}"),
        }
        assert_eq!(
            done(f.next(Some(Response::Created))).unwrap(),
            Cut::Record(record(0))
        );
    }

    /// A checkpoint whose floor is not above the generation does not fold its cutoff: the
    /// lazy finalizer goes on to ask whether epoch `g + 2` exists, never reads it.
    #[test]
    fn a_checkpoint_at_or_below_the_generation_does_not_fold_its_cutoff() {
        for floor in [1, 3] {
            let mut f = finalize(true);
            assert_eq!(io(f.next(None)), Request::Read(FileRef::Cutoff(g(3))));
            assert_eq!(
                io(f.next(Some(Response::Content(None)))),
                Request::List(Dir::Checkpoints)
            );
            assert_eq!(
                io(f.next(Some(Response::Listing(vec![FileRef::Checkpoint(g(floor))])))),
                Request::Exists(FileRef::Epoch(g(5))),
                "checkpoint floor {floor}"
            );
        }
    }

    /// The cutoff another finalizer created (`AlreadyExists`) is gone when read and no
    /// checkpoint folds it: `RECORD_INVALID`, never a second create.
    #[test]
    fn a_cutoff_that_vanished_after_already_exists_is_invalid_not_recreated() {
        let mut f = finalize(false);
        io(f.next(None));
        io(f.next(Some(Response::Exists(false))));
        assert_eq!(
            io(f.next(Some(Response::AlreadyExists))),
            Request::Read(FileRef::Cutoff(g(3)))
        );
        assert_eq!(
            io(f.next(Some(Response::Content(None)))),
            Request::List(Dir::Checkpoints)
        );
        let e = done(f.next(Some(Response::Listing(vec![])))).unwrap_err();
        assert!(
            matches!(e, LeaseError::RecordInvalid { .. }),
            "expected RECORD_INVALID, got {e:?}"
        );
    }
}
