//! verify: walk both hash chains, read-only.

use super::read::{ReadEvents, ReadState};
use crate::canonical::encode;
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, RunId};
use crate::ops::common::epochs_of;
use crate::ops::{Operation, Response, Step};

/// What [`Verify`] checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Epochs whose link was checked (from the checkpoint floor, or generation 1).
    pub epochs: u64,
    /// Events whose link was checked.
    pub events: u64,
    /// Stray epoch files below the floor (a claimer that lost a race with compaction).
    pub strays: Vec<Generation>,
    /// The checkpoint floor the epoch chain was verified from.
    pub floor: Option<Generation>,
    /// A finalized cutoff (or the checkpoint) names events past the log's last sequence.
    /// Not an error by itself: after a power loss, an event whose folder fsync had not
    /// completed (so it was never acknowledged) can vanish below a cutoff that a finalizer
    /// made durable; after a plain crash it means the log's tail was deleted.
    pub short_tail: Option<ShortTail>,
}

/// The log ends before a sequence that the chain says was there (see
/// [`VerifyReport::short_tail`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortTail {
    /// The highest sequence a finalized cutoff or the checkpoint names.
    pub named: u64,
    /// Who names it: the retired generation of the cutoff, or `None` for the checkpoint.
    pub by_cutoff_of: Option<Generation>,
    /// The last sequence in the log (0 when the log is empty).
    pub tail: u64,
}

/// Walk both hash chains and report the first broken link as `CHAIN_BROKEN` (or a missing
/// record as `EVENT_LOG_GAP` / `CHAIN_BROKEN`). Read-only.
#[derive(Debug, Clone)]
pub struct Verify {
    read: ReadEvents,
    all_gens: Vec<Generation>,
    st: u8,
}

impl Verify {
    /// Start verifying `run`.
    pub fn new(run: RunId) -> Verify {
        Verify {
            read: ReadEvents::chain_only(run, None),
            all_gens: Vec::new(),
            st: 0,
        }
    }
}

impl Operation for Verify {
    type Output = VerifyReport;
    fn next(&mut self, input: Option<Response>) -> Step<VerifyReport> {
        // Snoop the epochs listing so strays below the floor can be reported.
        if self.st == 0 {
            if let (ReadState::ListEpochs, Some(Response::Listing(l))) = (&self.read.st, &input) {
                self.all_gens = epochs_of(l.clone());
            }
        }
        let view = match self.read.next(input) {
            Step::Io(r) => return Step::Io(r),
            Step::Done(Err(e)) => return Step::Done(Err(e)),
            Step::Done(Ok(v)) => v,
        };
        self.st = 1;
        let run = self.read.run.to_string();
        let chain = &view.chain;
        let floor = chain.checkpoint.as_ref().map(|c| c.floor_generation);
        let mut expected_gen = floor.unwrap_or(Generation::FIRST);
        let mut prev: Option<Digest> = None;
        let mut count = 0u64;
        for (g, e) in &chain.epochs {
            if *g != expected_gen {
                return Step::Done(Err(LeaseError::ChainBroken {
                    run,
                    chain: "epoch",
                    at: expected_gen.get(),
                    detail: format!("epoch {expected_gen} is missing (next present: {g})"),
                }));
            }
            let bytes = match encode(e) {
                Ok(b) => b,
                Err(err) => return Step::Done(Err(err)),
            };
            let hash = Digest::of(&bytes);
            match (&prev, &chain.checkpoint) {
                (None, Some(cp)) => {
                    if hash != cp.floor_epoch_hash {
                        return Step::Done(Err(LeaseError::ChainBroken {
                            run,
                            chain: "epoch",
                            at: g.get(),
                            detail: "the floor epoch does not match the checkpoint's hash".into(),
                        }));
                    }
                }
                (None, None) => {}
                (Some(p), _) => {
                    if e.prev_hash.as_ref() != Some(p) {
                        return Step::Done(Err(LeaseError::ChainBroken {
                            run,
                            chain: "epoch",
                            at: g.get(),
                            detail: format!(
                                "prev_hash does not match the hash of epoch {}",
                                g.get() - 1
                            ),
                        }));
                    }
                }
            }
            prev = Some(hash);
            count += 1;
            expected_gen = match g.next(&self.read.run) {
                Ok(n) => n,
                Err(err) => return Step::Done(Err(err)),
            };
        }
        let strays = self
            .all_gens
            .iter()
            .copied()
            .filter(|g| floor.is_some_and(|f| *g < f))
            .collect();
        let tail = view.last.as_ref().map_or(0, |(s, _)| s.get());
        let by_cutoff = chain
            .cutoffs
            .iter()
            .map(|(g, through)| (*through, Some(*g)))
            .max_by_key(|(through, _)| *through);
        let by_checkpoint = chain
            .checkpoint
            .as_ref()
            .map(|c| (c.through_sequence, None));
        let short_tail = by_cutoff
            .into_iter()
            .chain(by_checkpoint)
            .max_by_key(|(through, _)| *through)
            .filter(|(through, _)| *through > tail)
            .map(|(named, by_cutoff_of)| ShortTail {
                named,
                by_cutoff_of,
                tail,
            });
        Step::Done(Ok(VerifyReport {
            epochs: count,
            events: tail,
            strays,
            floor,
            short_tail,
        }))
    }
}
