//! retire (PROTOCOL §7.5): retire a definitely-dead owner at once; the run becomes free.

use super::gate::{Gate, bind};
use super::takeover::Expectation;
use super::{Writer, created, finalize_superseded, race};
use crate::error::LeaseError;
use crate::ids::{Generation, Identity, RunId};
use crate::ops::common::{Cut, Finalize, Head, Observe, Recheck};
use crate::ops::observe::{LivenessEvidence, definitely_dead};
use crate::ops::{Operation, Request, Response, Step, step_try, sub_step, violation};
use crate::policy::TimingPolicy;
use crate::records::{
    EpochRecord, EpochState, Holder, Observation, RetireReason, RetiredOwner, TakeoverMode,
};
use crate::time::Timestamp;

/// Arguments of a dead-owner retirement.
#[derive(Debug, Clone)]
pub struct RetireParams {
    /// The run.
    pub run_id: RunId,
    /// The retirer's id (recorded as the writer of the `retired` epoch).
    pub owner_id: Identity,
    /// The retirer's process.
    pub holder: Holder,
    /// The retirer's policy (recorded in the epoch).
    pub policy: TimingPolicy,
    /// Wall time.
    pub now: Timestamp,
    /// If given, the head must match it exactly.
    pub expect: Option<Expectation>,
}

/// What a retirement did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retired {
    /// The retired generation.
    pub retired: Generation,
    /// The new, free (`retired`) epoch.
    pub generation: Generation,
    /// The cutoff recorded for the retired generation (its events up to this sequence
    /// count).
    pub cutoff: u64,
}

/// Retire a definitely-dead owner at once (no waiting for staleness): the run becomes free.
#[derive(Debug, Clone)]
pub struct Retire {
    p: RetireParams,
    st: RetireState,
}

#[derive(Debug, Clone)]
enum RetireState {
    Observe(Observe),
    Probe(Box<Head>),
    Gate(Box<(Head, EpochRecord)>, Gate),
    Create(Box<(Head, EpochRecord)>),
    Recheck(Box<(Head, EpochRecord)>, Recheck),
    Finalize(Generation, Generation, Finalize),
    Done,
}

impl Retire {
    /// This operation's writer of the next epoch.
    fn writer(&self) -> Writer<'_> {
        let p = &self.p;
        Writer::new(&p.run_id, &p.owner_id, &p.holder, p.policy, p.now)
    }

    /// Start a retirement.
    pub fn new(p: RetireParams) -> Retire {
        let obs = Observe::new(p.run_id.clone());
        Retire {
            p,
            st: RetireState::Observe(obs),
        }
    }
}

impl Operation for Retire {
    type Output = Retired;
    fn next(&mut self, mut input: Option<Response>) -> Step<Retired> {
        let run = self.p.run_id.clone();
        loop {
            match std::mem::replace(&mut self.st, RetireState::Done) {
                RetireState::Observe(obs) => {
                    let observed = sub_step!(self.st, RetireState::Observe, [], obs, input.take());
                    let head = match observed.head {
                        Some(h) if h.is_active() => h,
                        _ => {
                            return Step::Done(Err(race(
                                &run,
                                "no active owner to retire (the run is free)",
                            )));
                        }
                    };
                    if let Some(exp) = &self.p.expect {
                        if let Some(why) = exp.mismatch(&head) {
                            return Step::Done(Err(race(&run, why)));
                        }
                    }
                    let holder = head.epoch.holder.clone();
                    self.st = RetireState::Probe(Box::new(head));
                    return Step::Io(Request::ProbeLiveness(holder));
                }
                RetireState::Probe(head) => {
                    let ev: LivenessEvidence = match input.take() {
                        Some(Response::Liveness(ev)) => ev,
                        other => return Step::Done(Err(violation("Liveness", &other))),
                    };
                    if let Err(reason) = definitely_dead(&head.epoch.holder, &ev) {
                        return Step::Done(Err(LeaseError::RetireRefusedNotDead {
                            run: run.to_string(),
                            held: Box::new(head.held_by()),
                            reason,
                        }));
                    }
                    let retired = RetiredOwner {
                        generation: head.generation(),
                        owner_id: head.epoch.owner_id.clone(),
                        reason: RetireReason::Dead,
                        // The audit record (issue #19: once a separate intent file).
                        observed: Some(Observation {
                            heartbeat_at: head.heartbeat_at(),
                            heartbeat_count: head.heartbeat_count(),
                            watched_ms: None,
                            mode: TakeoverMode::RetireDead,
                        }),
                    };
                    let rec = step_try!(self.writer().next_epoch(
                        Some(&head),
                        EpochState::Retired,
                        Some(retired),
                        None,
                        None,
                    ));
                    let gate = Gate::new(&run, Some(&head), &self.p.owner_id, self.p.now);
                    self.st = RetireState::Gate(Box::new((*head, rec)), gate);
                }
                RetireState::Gate(b, gate) => {
                    let (b, cutoff) =
                        sub_step!(self.st, RetireState::Gate, [b], gate, input.take());
                    let (head, rec) = *b;
                    let bound = step_try!(bind(rec, cutoff));
                    self.st = RetireState::Create(Box::new((head, bound.rec)));
                    return Step::Io(bound.create);
                }
                RetireState::Recheck(b, rc) => {
                    let (b, higher) =
                        sub_step!(self.st, RetireState::Recheck, [b], rc, input.take());
                    let (head, rec) = *b;
                    let by = &self.p.owner_id;
                    match finalize_superseded(&run, higher, &head, rec.generation, by, self.p.now) {
                        Ok(f) => {
                            self.st = RetireState::Finalize(head.generation(), rec.generation, f);
                        }
                        Err(e) => return Step::Done(Err(e)),
                    }
                }
                RetireState::Create(b) => {
                    let g = b.1.generation;
                    if let Err(e) = created(&run, g, input.take()) {
                        return Step::Done(Err(e));
                    }
                    self.st = RetireState::Recheck(b, Recheck::new(g));
                }
                RetireState::Finalize(old, new, mut f) => {
                    return match f.next(input.take()) {
                        Step::Io(r) => {
                            self.st = RetireState::Finalize(old, new, f);
                            Step::Io(r)
                        }
                        Step::Done(Err(e)) => Step::Done(Err(e)),
                        Step::Done(Ok(Cut::Record(r))) => Step::Done(Ok(Retired {
                            retired: old,
                            generation: new,
                            cutoff: r.events_through,
                        })),
                        Step::Done(Ok(Cut::Compacted(_))) => Step::Done(Err(violation(
                            "a cutoff record for the generation just retired",
                            &None,
                        ))),
                    };
                }
                RetireState::Done => {
                    return Step::Done(Err(violation("nothing (operation finished)", &input)));
                }
            }
        }
    }
}
