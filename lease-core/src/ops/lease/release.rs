//! release (PROTOCOL §7.3): create the next epoch as `released`, finalize this
//! generation's cutoff, remove the heartbeat.

use super::gate::{Gate, bind};
use super::{OwnedLease, fenced, next_epoch};
use crate::error::LeaseError;
use crate::ids::Generation;
use crate::layout::FileRef;
use crate::ops::common::{Finalize, Observe, Recheck};
use crate::ops::{Durability, Operation, Request, Response, Step, sub_step, violation};
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
#[derive(Debug, Clone)]
pub struct Release {
    p: ReleaseParams,
    st: ReleaseState,
}

#[derive(Debug, Clone)]
enum ReleaseState {
    Observe(Observe),
    Gate(Box<EpochRecord>, Gate),
    Create(Generation),
    Recheck(Generation, Recheck),
    Finalize(Generation, Finalize),
    Remove(Generation),
    Done,
}

impl Release {
    /// Start a release.
    pub fn new(p: ReleaseParams) -> Release {
        // The heartbeat record is not needed to release: a torn one must not block it.
        let obs = Observe::new(p.lease.run_id.clone()).without_beat();
        Release {
            p,
            st: ReleaseState::Observe(obs),
        }
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
                ReleaseState::Observe(mut obs) => {
                    let observed = match obs.next(input.take()) {
                        Step::Io(r) => {
                            self.st = ReleaseState::Observe(obs);
                            return Step::Io(r);
                        }
                        Step::Done(Err(e)) => return Step::Done(Err(e)),
                        Step::Done(Ok(o)) => o,
                    };
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
                    let rec = match next_epoch(
                        run,
                        Some(&head),
                        EpochState::Released,
                        &lease.owner_id,
                        &lease.holder,
                        lease.policy,
                        self.p.now,
                        Some(retired),
                        self.p.seal.clone(),
                        None,
                    ) {
                        Ok(x) => x,
                        Err(e) => return Step::Done(Err(e)),
                    };
                    let gate = Gate::new(run, Some(&head), &lease.owner_id, self.p.now);
                    self.st = ReleaseState::Gate(Box::new(rec), gate);
                }
                ReleaseState::Gate(rec, gate) => {
                    let (rec, cutoff) =
                        sub_step!(self.st, ReleaseState::Gate, [rec], gate, input.take());
                    let bound = match bind(*rec, cutoff) {
                        Ok(x) => x,
                        Err(e) => return Step::Done(Err(e)),
                    };
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
                    return match input {
                        Some(Response::Done) => Step::Done(Ok(g)),
                        other => Step::Done(Err(violation("Done", &other))),
                    };
                }
                ReleaseState::Done => {
                    return Step::Done(Err(violation("nothing (operation finished)", &input)));
                }
            }
        }
    }
}
