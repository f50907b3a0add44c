//! release (PROTOCOL §7.3): create the next epoch as `released`, finalize this
//! generation's cutoff, remove the heartbeat; then, when due, compact the lease (step 7,
//! issue #33: every user of the release gets it, not only lease-run).

use super::gate::{Gate, bind};
use super::{OwnedLease, Writer, fenced};
use crate::error::LeaseError;
use crate::ids::Generation;
use crate::layout::{Dir, FileRef};
use crate::ops::common::{Finalize, Observe, Recheck, newest_checkpoint};
use crate::ops::{
    CompactPolicy, Durability, Operation, Prune, PruneParams, PruneReport, Request, Response, Step,
    step_try, sub_step, violation,
};
use crate::records::{EpochRecord, EpochState, RetireReason, RetiredOwner, Seal};
use crate::time::Timestamp;

/// Arguments of a release.
#[derive(Debug, Clone)]
pub struct ReleaseParams {
    /// The lease being released.
    pub lease: OwnedLease,
    /// Wall time.
    pub now: Timestamp,
    /// The store's seal, if the run has a store.
    pub seal: Option<Seal>,
}

/// Release a lease: create the next epoch as `released` (with the seal), finalize this
/// generation's cutoff, remove the heartbeat file. A superseded owner's release changes
/// nothing and reports `FENCED`.
///
/// **Compaction (PROTOCOL §7.3 step 7, issue #33).** Then, unless turned off
/// ([`Release::compacting`]`(None)`), the release lists `lease/checkpoints/` (newest floor
/// `F0`, 1 if none) and, when [`CompactPolicy::is_due`] (by default
/// [`CompactPolicy::DEFAULT`]: every 16 generations, keeping 4), runs the [`Prune`] step
/// machine as a sub-step, as the releasing owner, at the release's `now`. Its writes and
/// their order are the prune's own (§7.10), so a crash between any two of them leaves a
/// valid state. It is best-effort: the release has already succeeded, so a refusal of the
/// prune still ends the release with its generation ([`Release::compaction`] keeps the
/// prune's outcome), and a driver whose request failed after [`Release::committed`] is
/// `Some` reports the release as done (as [`crate::LeaseOps::release`] does). A run whose
/// owners only claim and release, and never prune, so keeps a bounded `lease/` folder and
/// a claim or release costs the same at any history.
#[derive(Debug, Clone)]
pub struct Release {
    p: ReleaseParams,
    st: ReleaseState,
    compact: Option<CompactPolicy>,
    committed: Option<Generation>,
    compaction: Option<Result<PruneReport, LeaseError>>,
}

#[derive(Debug, Clone)]
enum ReleaseState {
    Observe(Observe),
    Gate(Box<EpochRecord>, Gate),
    Create(Generation),
    Recheck(Generation, Recheck),
    Finalize(Generation, Finalize),
    Remove(Generation),
    /// Step 7: `List(checkpoints)` answered → due or not.
    ListCheckpoints(Generation),
    /// Step 7: the prune, as a sub-step.
    Compact(Generation, Box<Prune>),
    Done,
}

impl Release {
    /// Start a release that compacts when due with [`CompactPolicy::DEFAULT`].
    pub fn new(p: ReleaseParams) -> Release {
        // The heartbeat record is not needed to release: a torn one must not block it.
        let obs = Observe::new(p.lease.run_id.clone()).without_beat();
        Release {
            p,
            st: ReleaseState::Observe(obs),
            compact: Some(CompactPolicy::DEFAULT),
            committed: None,
            compaction: None,
        }
    }

    /// Compact with `policy` after the release (`None`: never; the caller compacts by
    /// itself, as lease-run does after letting go of its owner lock).
    pub fn compacting(mut self, policy: Option<CompactPolicy>) -> Release {
        self.compact = policy;
        self
    }

    /// The `released` epoch's generation once the release itself (§7.3 steps 1–6) is done
    /// and durable: from then on nothing fails it, so a driver whose request fails later
    /// (one of the compaction's) answers with this generation.
    pub fn committed(&self) -> Option<Generation> {
        self.committed
    }

    /// What the compaction of step 7 did: `None` if it did not run (turned off, not due,
    /// or the release did not get that far); otherwise the prune's report or why it
    /// failed or refused (never the release's error).
    pub fn compaction(&self) -> Option<&Result<PruneReport, LeaseError>> {
        self.compaction.as_ref()
    }
}

impl Operation for Release {
    /// The generation of the `released` epoch.
    type Output = Generation;
    fn next(&mut self, mut input: Option<Response>) -> Step<Generation> {
        let lease = self.p.lease.clone();
        let run = &lease.run_id;
        loop {
            match std::mem::replace(&mut self.st, ReleaseState::Done) {
                ReleaseState::Observe(obs) => {
                    let observed = sub_step!(self.st, ReleaseState::Observe, [], obs, input.take());
                    let head = match observed.head {
                        Some(h) if h.generation() == lease.generation => h,
                        Some(h) => {
                            return Step::Done(Err(fenced(
                                run,
                                lease.generation,
                                format!(
                                    "superseded by generation {}; release changed nothing",
                                    h.generation()
                                ),
                            )));
                        }
                        None => {
                            return Step::Done(Err(fenced(
                                run,
                                lease.generation,
                                "no epoch exists; release changed nothing",
                            )));
                        }
                    };
                    if head.hash != lease.epoch_hash || !head.is_active() {
                        return Step::Done(Err(LeaseError::ChainBroken {
                            run: run.to_string(),
                            chain: "epoch",
                            at: lease.generation.get(),
                            detail: "the epoch on disk is not the one this owner created".into(),
                        }));
                    }
                    let retired = RetiredOwner {
                        generation: lease.generation,
                        owner_id: lease.owner_id.clone(),
                        reason: RetireReason::Released,
                        observed: None,
                    };
                    let rec = step_try!(
                        Writer::new(
                            run,
                            &lease.owner_id,
                            &lease.holder,
                            lease.policy,
                            self.p.now,
                        )
                        .next_epoch(
                            Some(&head),
                            EpochState::Released,
                            Some(retired),
                            self.p.seal.clone(),
                            None,
                        )
                    );
                    let gate = Gate::new(run, Some(&head), &lease.owner_id, self.p.now);
                    self.st = ReleaseState::Gate(Box::new(rec), gate);
                }
                ReleaseState::Gate(rec, gate) => {
                    let (rec, cutoff) =
                        sub_step!(self.st, ReleaseState::Gate, [rec], gate, input.take());
                    let bound = step_try!(bind(*rec, cutoff));
                    self.st = ReleaseState::Create(bound.rec.generation);
                    return Step::Io(bound.create);
                }
                ReleaseState::Recheck(g, rc) => {
                    let (g, v) = sub_step!(self.st, ReleaseState::Recheck, [g], rc, input.take());
                    match v {
                        Some(top) => {
                            // Our `released` epoch re-used a compacted generation number: it is a
                            // stray below the head and nobody will read it.
                            return Step::Done(Err(fenced(
                                run,
                                lease.generation,
                                format!(
                                    "generation {top} exists above the released one; release changed nothing"
                                ),
                            )));
                        }
                        None => {
                            let f = Finalize::new(
                                run.clone(),
                                lease.generation,
                                lease.owner_id.clone(),
                                g,
                                lease.owner_id.clone(),
                                self.p.now,
                            );
                            self.st = ReleaseState::Finalize(g, f);
                        }
                    }
                }
                ReleaseState::Create(g) => match input.take() {
                    Some(Response::Created) => {
                        self.st = ReleaseState::Recheck(g, Recheck::new(g));
                    }
                    Some(Response::AlreadyExists) => {
                        return Step::Done(Err(fenced(
                            run,
                            lease.generation,
                            format!(
                                "generation {g} was created by someone else first; release changed nothing"
                            ),
                        )));
                    }
                    other => return Step::Done(Err(violation("Created/AlreadyExists", &other))),
                },
                ReleaseState::Finalize(g, f) => {
                    let (g, _) = sub_step!(self.st, ReleaseState::Finalize, [g], f, input.take());
                    self.st = ReleaseState::Remove(g);
                    // The beat of a released generation is never read again; its removal
                    // need not be durable.
                    return Step::Io(Request::Remove(
                        FileRef::Beat(lease.generation),
                        Durability::NoFsync,
                    ));
                }
                ReleaseState::Remove(g) => {
                    match input.take() {
                        Some(Response::Done) => {}
                        other => return Step::Done(Err(violation("Done", &other))),
                    }
                    self.committed = Some(g);
                    if self.compact.is_none() {
                        return Step::Done(Ok(g));
                    }
                    // Step 7: one listing of `lease/checkpoints/` decides whether it is due.
                    self.st = ReleaseState::ListCheckpoints(g);
                    return Step::Io(Request::List(Dir::Checkpoints));
                }
                ReleaseState::ListCheckpoints(g) => {
                    let policy = self.compact.unwrap_or(CompactPolicy::DEFAULT);
                    let floor = match input.take() {
                        Some(Response::Listing(l)) => {
                            newest_checkpoint(l).unwrap_or(Generation::FIRST)
                        }
                        other => {
                            // Best-effort: the release stands; the answer is kept.
                            self.compaction = Some(Err(violation("Listing", &other)));
                            return Step::Done(Ok(g));
                        }
                    };
                    // A floor above the head (a checkpoint written by hand) is never due:
                    // `verify` and `doctor` report it.
                    if !policy.is_due(floor, g) {
                        return Step::Done(Ok(g));
                    }
                    let prune = Prune::new(PruneParams {
                        run_id: run.clone(),
                        keep: policy.keep,
                        by: lease.owner_id.clone(),
                        now: self.p.now,
                    });
                    self.st = ReleaseState::Compact(g, Box::new(prune));
                }
                ReleaseState::Compact(g, mut prune) => match prune.next(input.take()) {
                    Step::Io(r) => {
                        self.st = ReleaseState::Compact(g, prune);
                        return Step::Io(r);
                    }
                    Step::Done(r) => {
                        // A refusal (an invalid head, a concurrent prune, ...) is the
                        // compaction's, never the release's: the next release tries again.
                        self.compaction = Some(r);
                        return Step::Done(Ok(g));
                    }
                },
                ReleaseState::Done => {
                    return Step::Done(Err(violation("nothing (operation finished)", &input)));
                }
            }
        }
    }
}
