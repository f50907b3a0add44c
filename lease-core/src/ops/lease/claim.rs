//! claim (PROTOCOL §7.1): create the next epoch of a free run as `active`.

use super::gate::{Gate, bind};
use super::{OwnedLease, Writer};
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, Identity, RunId};
use crate::ops::common::{Finalize, Head, Observe, Observed, Recheck};
use crate::ops::observe::{Freshness, freshness};
use crate::ops::{Operation, Response, Step, step_try, sub_step, violation};
use crate::policy::TimingPolicy;
use crate::records::{EpochRecord, EpochState, Holder};
use crate::time::Timestamp;

/// Arguments of a claim.
#[derive(Debug, Clone)]
pub struct ClaimParams {
    /// The run.
    pub run_id: RunId,
    /// The new owner's id (unique per incarnation, e.g. a random UUID).
    pub owner_id: Identity,
    /// The new owner's process.
    pub holder: Holder,
    /// The policy it will run with.
    pub policy: TimingPolicy,
    /// The caller's wall time.
    pub now: Timestamp,
    /// A store head the claimer knows of, recorded as a floor (usually `None`).
    pub store_floor: Option<u64>,
}

/// Claim a free run: create the next epoch as `active`.
///
/// Refuses a fresh owner (`RUN_ALREADY_ACTIVE`) and a stale one
/// (`RUN_STALE_REQUIRES_TAKEOVER`); an invalid head is `RECORD_INVALID`.
#[derive(Debug, Clone)]
pub struct Claim {
    p: ClaimParams,
    st: ClaimState,
    retries: u32,
}

/// How many times a claim re-observes after losing a race before giving up.
const MAX_CLAIM_ROUNDS: u32 = 8;

#[derive(Debug, Clone)]
enum ClaimState {
    Observe(Observe),
    Gate(Box<(Option<Head>, EpochRecord)>, Gate),
    Create(Box<(Option<Head>, EpochRecord, Digest)>),
    Recheck(Box<(Option<Head>, EpochRecord, Digest)>, Recheck),
    Finalize(Box<EpochRecord>, Digest, Finalize),
    Done,
}

impl Claim {
    /// Start a claim.
    pub fn new(p: ClaimParams) -> Claim {
        let obs = Observe::new(p.run_id.clone());
        Claim {
            p,
            st: ClaimState::Observe(obs),
            retries: 0,
        }
    }

    /// This operation's writer of the next epoch.
    fn writer(&self) -> Writer<'_> {
        let p = &self.p;
        Writer::new(&p.run_id, &p.owner_id, &p.holder, p.policy, p.now)
    }
}

impl Operation for Claim {
    type Output = OwnedLease;
    fn next(&mut self, mut input: Option<Response>) -> Step<OwnedLease> {
        let run = self.p.run_id.clone();
        loop {
            match std::mem::replace(&mut self.st, ClaimState::Done) {
                ClaimState::Observe(obs) => {
                    let observed: Observed =
                        sub_step!(self.st, ClaimState::Observe, [], obs, input.take());
                    if let Some((rec, hash, fin)) = self.writer().own_epoch(observed.head.as_ref())
                    {
                        match fin {
                            Some(f) => {
                                self.st = ClaimState::Finalize(Box::new(rec), hash, f);
                                continue;
                            }
                            None => return Step::Done(Ok(self.writer().lease(&rec, hash))),
                        }
                    }
                    if let Some(h) = &observed.head {
                        if h.is_active() {
                            let held = Box::new(h.held_by());
                            return Step::Done(Err(match freshness(h, self.p.now) {
                                Freshness::Fresh { .. } => LeaseError::RunAlreadyActive {
                                    run: run.to_string(),
                                    held,
                                },
                                Freshness::Stale { age_ms } => {
                                    LeaseError::RunStaleRequiresTakeover {
                                        run: run.to_string(),
                                        held,
                                        age_ms,
                                        stale_after_ms: h.epoch.policy.stale_after_ms(),
                                    }
                                }
                            }));
                        }
                    }
                    let rec = step_try!(self.writer().next_epoch(
                        observed.head.as_ref(),
                        EpochState::Active,
                        None,
                        None,
                        self.p.store_floor,
                    ));
                    let gate =
                        Gate::new(&run, observed.head.as_ref(), &self.p.owner_id, self.p.now);
                    self.st = ClaimState::Gate(Box::new((observed.head, rec)), gate);
                }
                ClaimState::Gate(b, gate) => {
                    let (b, cutoff) = sub_step!(self.st, ClaimState::Gate, [b], gate, input.take());
                    let (head, rec) = *b;
                    let bound = step_try!(bind(rec, cutoff));
                    self.st = ClaimState::Create(Box::new((head, bound.rec, bound.hash)));
                    return Step::Io(bound.create);
                }
                ClaimState::Create(b) => match input.take() {
                    Some(Response::Created) => {
                        let g = b.1.generation;
                        self.st = ClaimState::Recheck(b, Recheck::new(g));
                    }
                    // mutant claim_already_exists_wins: a lost create taken as won (§7.1 step 5, I1).
                    Some(Response::AlreadyExists)
                        if crate::mutant::mutant("claim_already_exists_wins") =>
                    {
                        let g = b.1.generation;
                        self.st = ClaimState::Recheck(b, Recheck::new(g));
                    }
                    Some(Response::AlreadyExists) => {
                        // Another claimer won this generation: observe again, so the refusal
                        // names the winner (or, if it already released, claim the next one).
                        self.retries += 1;
                        if self.retries > MAX_CLAIM_ROUNDS {
                            return Step::Done(Err(race_claim(&run, b.1.generation)));
                        }
                        self.st = ClaimState::Observe(Observe::new(run.clone()));
                    }
                    other => return Step::Done(Err(violation("Created/AlreadyExists", &other))),
                },
                ClaimState::Recheck(b, rc) => {
                    let (b, higher) =
                        sub_step!(self.st, ClaimState::Recheck, [b], rc, input.take());
                    let (_, rec, hash) = *b;
                    if higher.is_some() {
                        // Compaction removed the generation we replaced and someone already
                        // went past it: our epoch is a stray below the head (ignored by every
                        // reader). We lost; observe again to report the real head.
                        self.retries += 1;
                        if self.retries > MAX_CLAIM_ROUNDS {
                            return Step::Done(Err(race_claim(&run, rec.generation)));
                        }
                        self.st = ClaimState::Observe(Observe::new(run.clone()));
                        continue;
                    }
                    return Step::Done(Ok(self.writer().lease(&rec, hash)));
                }
                ClaimState::Finalize(rec, hash, f) => {
                    let (rec, hash, _) =
                        sub_step!(self.st, ClaimState::Finalize, [rec, hash], f, input.take());
                    return Step::Done(Ok(self.writer().lease(&rec, hash)));
                }
                ClaimState::Done => {
                    return Step::Done(Err(violation("nothing (operation finished)", &input)));
                }
            }
        }
    }
}

fn race_claim(run: &RunId, g: Generation) -> LeaseError {
    LeaseError::TakeoverRace {
        run: run.to_string(),
        detail: format!(
            "lost {MAX_CLAIM_ROUNDS} claim races in a row (last at generation {g}); the run is changing owner quickly"
        ),
    }
}

/// A claim's refusal made precise: `RUN_ALREADY_ACTIVE` or `RUN_STALE_REQUIRES_TAKEOVER`
/// over a holder `holder_dead` proves dead (asked only for those two refusals) becomes
/// `RUN_DEAD_REQUIRES_RETIREMENT`, naming the same holder; any other error is returned as
/// it is. The claim's step machine never returns the dead code itself (it does not probe);
/// [`crate::LeaseOps::claim`] applies this after a read-only probing status.
pub fn refine_claim_refusal(e: LeaseError, holder_dead: impl FnOnce() -> bool) -> LeaseError {
    let held_refusal = matches!(
        e,
        LeaseError::RunAlreadyActive { .. } | LeaseError::RunStaleRequiresTakeover { .. }
    );
    if !held_refusal || !holder_dead() {
        return e;
    }
    match e {
        LeaseError::RunAlreadyActive { run, held }
        | LeaseError::RunStaleRequiresTakeover { run, held, .. } => {
            LeaseError::RunDeadRequiresRetirement { run, held }
        }
        other => other,
    }
}
