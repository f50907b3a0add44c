//! Changes of ownership: claim, heartbeat, release, exact takeover, dead-owner retirement.
//!
//! Every change of owner is the exclusive creation of the next epoch file; of two racers
//! exactly one wins, and that creation fences everyone on the generation below. See
//! `docs/PROTOCOL.md` §7 for the numbered steps and §9 for the crash tables.

use super::common::{Cut, Finalize, Head, Observe, Observed, Recheck, decode_beat};
use super::observe::{Freshness, LivenessEvidence, definitely_dead, freshness};
use super::{Durability, Operation, Request, Response, Step, step_sub, sub_step, violation};
use crate::canonical::encode;
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, Identity, RunId};
use crate::layout::FileRef;
use crate::policy::{HeartbeatDurability, TimingPolicy};
use crate::records::{
    EpochRecord, EpochState, HeartbeatRecord, Holder, RetireReason, RetiredOwner, Seal,
    TakeoverIntent, TakeoverMode,
};
use crate::time::Timestamp;

/// Proof of ownership returned by claim and takeover; the argument of every owner operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedLease {
    /// The run.
    pub run_id: RunId,
    /// The owned generation: the fencing token to stamp on every write.
    pub generation: Generation,
    /// The owner id.
    pub owner_id: Identity,
    /// The owner's process.
    pub holder: Holder,
    /// The policy it runs with.
    pub policy: TimingPolicy,
    /// SHA-256 of the epoch record it created.
    pub epoch_hash: Digest,
}

fn fenced(run: &RunId, generation: Generation, detail: impl Into<String>) -> LeaseError {
    LeaseError::Fenced {
        run: run.to_string(),
        generation,
        detail: detail.into(),
    }
}

/// An intent file with our nonce already exists: fine if it is ours (a retry of the same
/// attempt), an argument error otherwise.
fn own_intent(
    run: &RunId,
    taker: &Identity,
    nonce: u64,
    input: Option<Response>,
) -> Result<(), LeaseError> {
    let bytes = match input {
        Some(Response::Content(Some(b))) => b,
        Some(Response::Content(None)) => {
            return Err(LeaseError::ArgumentInvalid {
                what: "nonce",
                reason: format!(
                    "the intent with nonce {nonce:016x} vanished; retry with a fresh nonce"
                ),
            });
        }
        other => return Err(violation("Content", &other)),
    };
    let intent: TakeoverIntent = crate::canonical::decode_for(run, &bytes)?;
    if &intent.taker_owner_id == taker {
        Ok(())
    } else {
        Err(LeaseError::ArgumentInvalid {
            what: "nonce",
            reason: format!(
                "an intent with nonce {nonce:016x} of another taker already exists; use a fresh random nonce"
            ),
        })
    }
}

fn race(run: &RunId, detail: impl Into<String>) -> LeaseError {
    LeaseError::TakeoverRace {
        run: run.to_string(),
        detail: detail.into(),
    }
}

/// Build the next epoch after `head` (or generation 1).
#[allow(clippy::too_many_arguments)]
fn next_epoch(
    run: &RunId,
    head: Option<&Head>,
    state: EpochState,
    owner_id: &Identity,
    holder: &Holder,
    policy: TimingPolicy,
    now: Timestamp,
    retired: Option<RetiredOwner>,
    seal: Option<Seal>,
    store_floor: Option<u64>,
) -> Result<(EpochRecord, Vec<u8>), LeaseError> {
    let (generation, prev_hash, inherited_floor) = match head {
        None => (Generation::FIRST, None, None),
        Some(h) => (
            h.generation().next(run)?,
            Some(h.hash.clone()),
            // A takeover or retirement read the superseded owner's beat: the store head
            // it reported there is a floor too (a crash leaves no seal).
            h.epoch
                .store_floor
                .max(h.epoch.seal.as_ref().map(|s| s.sequence))
                .max(h.beat.as_ref().and_then(|b| b.store_head)),
        ),
    };
    let rec = EpochRecord {
        run_id: run.clone(),
        generation,
        prev_hash,
        state,
        owner_id: owner_id.clone(),
        holder: holder.clone(),
        claimed_at: now,
        policy,
        retired,
        seal,
        // The floor never goes down along the chain.
        store_floor: store_floor.max(inherited_floor),
    };
    let bytes = encode(&rec)?;
    Ok((rec, bytes))
}

/// "Finalize before extend": before creating generation `h + 1`, make sure the cutoff the
/// head's epoch names (the generation `h` superseded) is finalized. By induction every
/// superseded generation below the head has its cutoff before the chain moves on, so a
/// zombie can never finalize its own cutoff late (after newer owners wrote events) and
/// count (PROTOCOL.md §15 OQ-2, reproduced by a scenario test).
#[derive(Debug, Clone)]
struct Gate {
    finalize: Option<Finalize>,
    then: Option<Request>,
}

impl Gate {
    fn new(run: &RunId, head: Option<&Head>, by: &Identity, now: Timestamp, then: Request) -> Gate {
        Gate {
            finalize: head.and_then(|h| retired_cutoff(run, &h.epoch, by, now)),
            then: Some(then),
        }
    }
}

/// The lazy finalization of the cutoff of the generation `epoch` superseded, if any.
fn retired_cutoff(
    run: &RunId,
    epoch: &EpochRecord,
    by: &Identity,
    now: Timestamp,
) -> Option<Finalize> {
    epoch.retired.as_ref().map(|r| {
        Finalize::new(
            run.clone(),
            r.generation,
            r.owner_id.clone(),
            epoch.generation,
            by.clone(),
            now,
        )
        .lazy()
    })
}

/// Adoption on retry: when the head is the caller's own active epoch (same owner id and
/// holder: an earlier attempt of this very process created it and then failed with an I/O
/// error after the commit), its record, hash and the lazy finalization of the cutoff it
/// may not have written. A retry never wedges the run behind a lease nobody uses.
fn own_epoch(
    run: &RunId,
    head: Option<&Head>,
    owner: &Identity,
    holder: &Holder,
    now: Timestamp,
) -> Option<(EpochRecord, Digest, Option<Finalize>)> {
    let h =
        head.filter(|h| h.is_active() && &h.epoch.owner_id == owner && &h.epoch.holder == holder)?;
    Some((
        h.epoch.clone(),
        h.hash.clone(),
        retired_cutoff(run, &h.epoch, owner, now),
    ))
}

impl Operation for Gate {
    /// The request to issue next (the epoch creation).
    type Output = Request;
    fn next(&mut self, input: Option<Response>) -> Step<Request> {
        if let Some(f) = &mut self.finalize {
            match f.next(input) {
                Step::Io(r) => return Step::Io(r),
                Step::Done(Err(e)) => return Step::Done(Err(e)),
                Step::Done(Ok(_)) => {}
            }
        }
        match self.then.take() {
            Some(r) => Step::Done(Ok(r)),
            None => Step::Done(Err(violation("nothing (gate finished)", &None))),
        }
    }
}

// ---------------------------------------------------------------------------------------
// claim

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
    Gate(Box<(Option<Head>, EpochRecord, Digest)>, Gate),
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

    fn lease(&self, rec: &EpochRecord, hash: Digest) -> OwnedLease {
        OwnedLease {
            run_id: self.p.run_id.clone(),
            generation: rec.generation,
            owner_id: self.p.owner_id.clone(),
            holder: self.p.holder.clone(),
            policy: self.p.policy,
            epoch_hash: hash,
        }
    }
}

impl Operation for Claim {
    type Output = OwnedLease;
    fn next(&mut self, mut input: Option<Response>) -> Step<OwnedLease> {
        let run = self.p.run_id.clone();
        loop {
            match std::mem::replace(&mut self.st, ClaimState::Done) {
                ClaimState::Observe(mut obs) => {
                    let observed: Observed = match obs.next(input.take()) {
                        Step::Io(r) => {
                            self.st = ClaimState::Observe(obs);
                            return Step::Io(r);
                        }
                        Step::Done(Err(e)) => return Step::Done(Err(e)),
                        Step::Done(Ok(o)) => o,
                    };
                    if let Some((rec, hash, fin)) = own_epoch(
                        &run,
                        observed.head.as_ref(),
                        &self.p.owner_id,
                        &self.p.holder,
                        self.p.now,
                    ) {
                        match fin {
                            Some(f) => {
                                self.st = ClaimState::Finalize(Box::new(rec), hash, f);
                                continue;
                            }
                            None => return Step::Done(Ok(self.lease(&rec, hash))),
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
                    let (rec, bytes) = match next_epoch(
                        &run,
                        observed.head.as_ref(),
                        EpochState::Active,
                        &self.p.owner_id,
                        &self.p.holder,
                        self.p.policy,
                        self.p.now,
                        None,
                        None,
                        self.p.store_floor,
                    ) {
                        Ok(x) => x,
                        Err(e) => return Step::Done(Err(e)),
                    };
                    let hash = Digest::of(&bytes);
                    let g = rec.generation;
                    let gate = Gate::new(
                        &run,
                        observed.head.as_ref(),
                        &self.p.owner_id,
                        self.p.now,
                        Request::CreateExclusive(FileRef::Epoch(g), bytes),
                    );
                    self.st = ClaimState::Gate(Box::new((observed.head, rec, hash)), gate);
                }
                ClaimState::Gate(b, gate) => {
                    let (b, create) = sub_step!(self.st, ClaimState::Gate, [b], gate, input.take());
                    self.st = ClaimState::Create(b);
                    return Step::Io(create);
                }
                ClaimState::Create(b) => match input.take() {
                    Some(Response::Created) => {
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
                ClaimState::Recheck(b, mut rc) => {
                    let higher = match rc.next(input.take()) {
                        Step::Io(r) => {
                            self.st = ClaimState::Recheck(b, rc);
                            return Step::Io(r);
                        }
                        Step::Done(Err(e)) => return Step::Done(Err(e)),
                        Step::Done(Ok(h)) => h,
                    };
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
                    return Step::Done(Ok(self.lease(&rec, hash)));
                }
                ClaimState::Finalize(rec, hash, mut f) => {
                    match f.next(input.take()) {
                        Step::Io(r) => {
                            self.st = ClaimState::Finalize(rec, hash, f);
                            return Step::Io(r);
                        }
                        Step::Done(Err(e)) => return Step::Done(Err(e)),
                        Step::Done(Ok(_)) => {}
                    }
                    return Step::Done(Ok(self.lease(&rec, hash)));
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

// ---------------------------------------------------------------------------------------
// heartbeat

/// One heartbeat of an owner: replace its heartbeat record, then check from a listing that
/// no higher generation exists (`FENCED` if one does).
///
/// The caller reads its monotonic clock *before* starting, and on success records that
/// reading as the start of the last successful heartbeat (the self-fence reference).
#[derive(Debug, Clone)]
pub struct Heartbeat {
    lease: OwnedLease,
    heartbeat_at: Timestamp,
    count: u64,
    bytes: Option<Vec<u8>>,
    recheck: Recheck,
    wrote: bool,
    rechecking: bool,
}

impl Heartbeat {
    /// Heartbeat number `count` (1, 2, ...) at wall time `now`.
    pub fn new(lease: &OwnedLease, now: Timestamp, count: u64) -> Result<Heartbeat, LeaseError> {
        let rec = HeartbeatRecord {
            run_id: lease.run_id.clone(),
            generation: lease.generation,
            owner_id: lease.owner_id.clone(),
            heartbeat_at: now,
            count: count.max(1),
            store_head: None,
        };
        Ok(Heartbeat {
            lease: lease.clone(),
            heartbeat_at: now,
            count: rec.count,
            bytes: Some(encode(&rec)?),
            recheck: Recheck::new(lease.generation),
            wrote: false,
            rechecking: false,
        })
    }
}

impl Heartbeat {
    /// Report the owner's store head (its last acknowledged commit, read when the heartbeat
    /// started) in the heartbeat record: whoever replaces this owner by takeover or
    /// retirement records it as the new epoch's `store_floor` (PROTOCOL.md §7.2).
    pub fn with_store_head(mut self, store_head: Option<u64>) -> Result<Heartbeat, LeaseError> {
        let rec = HeartbeatRecord {
            run_id: self.lease.run_id.clone(),
            generation: self.lease.generation,
            owner_id: self.lease.owner_id.clone(),
            heartbeat_at: self.heartbeat_at,
            count: self.count,
            store_head,
        };
        self.bytes = Some(encode(&rec)?);
        Ok(self)
    }
}

impl Operation for Heartbeat {
    type Output = ();
    fn next(&mut self, input: Option<Response>) -> Step<()> {
        if !self.wrote {
            self.wrote = true;
            let durability = match self.lease.policy.heartbeat_durability() {
                HeartbeatDurability::Local => Durability::NoFsync,
                HeartbeatDurability::Durable => Durability::Fsync,
            };
            return Step::Io(Request::Replace(
                FileRef::Beat(self.lease.generation),
                self.bytes.take().unwrap_or_default(),
                durability,
            ));
        }
        let input = if self.rechecking {
            input
        } else {
            match input {
                Some(Response::Done) => {
                    self.rechecking = true;
                    None
                }
                other => return Step::Done(Err(violation("Done", &other))),
            }
        };
        let higher = step_sub!(&mut self.recheck, input);
        match higher {
            None => Step::Done(Ok(())),
            Some(top) => Step::Done(Err(fenced(
                &self.lease.run_id,
                self.lease.generation,
                format!("superseded by generation {top}"),
            ))),
        }
    }
}

// ---------------------------------------------------------------------------------------
// release

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
    Gate(Generation, Gate),
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
                    };
                    let (rec, bytes) = match next_epoch(
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
                    let gate = Gate::new(
                        run,
                        Some(&head),
                        &lease.owner_id,
                        self.p.now,
                        Request::CreateExclusive(FileRef::Epoch(rec.generation), bytes),
                    );
                    self.st = ReleaseState::Gate(rec.generation, gate);
                }
                ReleaseState::Gate(g, gate) => {
                    let (g, create) =
                        sub_step!(self.st, ReleaseState::Gate, [g], gate, input.take());
                    self.st = ReleaseState::Create(g);
                    return Step::Io(create);
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

// ---------------------------------------------------------------------------------------
// takeover

/// What the taker (or the operator) observed and expects still to be true.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    /// The head generation, if the caller knows it.
    pub generation: Option<Generation>,
    /// The owner id.
    pub owner_id: Identity,
    /// The heartbeat time.
    pub heartbeat_at: Timestamp,
    /// The heartbeat counter, if the caller knows it.
    pub heartbeat_count: Option<u64>,
}

impl Expectation {
    /// The expectation matching exactly what `head` shows.
    pub fn of(head: &Head) -> Expectation {
        Expectation {
            generation: Some(head.generation()),
            owner_id: head.epoch.owner_id.clone(),
            heartbeat_at: head.heartbeat_at(),
            heartbeat_count: Some(head.heartbeat_count()),
        }
    }

    fn mismatch(&self, head: &Head) -> Option<String> {
        if let Some(g) = self.generation {
            if g != head.generation() {
                return Some(format!(
                    "expected generation {g}, found {}",
                    head.generation()
                ));
            }
        }
        if self.owner_id != head.epoch.owner_id {
            return Some(format!(
                "expected owner {}, found {}",
                self.owner_id, head.epoch.owner_id
            ));
        }
        if self.heartbeat_at != head.heartbeat_at() {
            return Some(format!(
                "expected heartbeat {}, found {}",
                self.heartbeat_at,
                head.heartbeat_at()
            ));
        }
        if let Some(c) = self.heartbeat_count {
            if c != head.heartbeat_count() {
                return Some(format!(
                    "expected heartbeat #{c}, found #{}",
                    head.heartbeat_count()
                ));
            }
        }
        None
    }
}

/// Who decides that the owner is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeoverTrigger {
    /// An operator confirmed the exact observation; wall-clock staleness suffices.
    Operator,
    /// A program: it must also have watched the record unchanged for `stale_after` on its
    /// own monotonic clock (immune to the owner's clock skew).
    Automatic {
        /// How long the observer watched the (heartbeat_at, count) pair unchanged, in ms.
        watched_unchanged_ms: u64,
    },
}

/// Arguments of a takeover.
#[derive(Debug, Clone)]
pub struct TakeoverParams {
    /// The run.
    pub run_id: RunId,
    /// The taker's new owner id.
    pub owner_id: Identity,
    /// The taker's process.
    pub holder: Holder,
    /// The policy the taker will run with.
    pub policy: TimingPolicy,
    /// Wall time.
    pub now: Timestamp,
    /// The exact observation the takeover is conditioned on.
    pub expect: Expectation,
    /// Operator or automatic.
    pub trigger: TakeoverTrigger,
    /// A random nonce naming this attempt's intent file.
    pub nonce: u64,
}

/// Exact takeover of a stale owner.
///
/// Writes a takeover intent for the attempt, re-reads the heartbeat, refuses a fresh owner
/// (`TAKEOVER_ACTIVE_REFUSED`) and any difference from the expectation (`TAKEOVER_RACE`),
/// creates the next epoch as `active` for the taker, re-checks, then finalizes the old
/// generation's cutoff.
#[derive(Debug, Clone)]
pub struct Takeover {
    p: TakeoverParams,
    st: TakeoverState,
}

#[derive(Debug, Clone)]
enum TakeoverState {
    Observe(Observe),
    Intent(Box<Head>),
    IntentCheck(Box<Head>),
    Reread(Box<Head>),
    Gate(Box<(Head, EpochRecord, Digest)>, Gate),
    Create(Box<(Head, EpochRecord, Digest)>),
    Recheck(Box<(Head, EpochRecord, Digest)>, Recheck),
    Finalize(Box<(EpochRecord, Digest)>, Finalize),
    Done,
}

impl Takeover {
    /// Start a takeover.
    pub fn new(p: TakeoverParams) -> Takeover {
        let obs = Observe::new(p.run_id.clone());
        Takeover {
            p,
            st: TakeoverState::Observe(obs),
        }
    }

    fn lease(&self, rec: &EpochRecord, hash: Digest) -> OwnedLease {
        OwnedLease {
            run_id: self.p.run_id.clone(),
            generation: rec.generation,
            owner_id: self.p.owner_id.clone(),
            holder: self.p.holder.clone(),
            policy: self.p.policy,
            epoch_hash: hash,
        }
    }
}

impl Operation for Takeover {
    type Output = OwnedLease;
    fn next(&mut self, mut input: Option<Response>) -> Step<OwnedLease> {
        let run = self.p.run_id.clone();
        loop {
            match std::mem::replace(&mut self.st, TakeoverState::Done) {
                TakeoverState::Observe(mut obs) => {
                    let observed = match obs.next(input.take()) {
                        Step::Io(r) => {
                            self.st = TakeoverState::Observe(obs);
                            return Step::Io(r);
                        }
                        Step::Done(Err(e)) => return Step::Done(Err(e)),
                        Step::Done(Ok(o)) => o,
                    };
                    if let Some((rec, hash, fin)) = own_epoch(
                        &run,
                        observed.head.as_ref(),
                        &self.p.owner_id,
                        &self.p.holder,
                        self.p.now,
                    ) {
                        match fin {
                            Some(f) => {
                                self.st = TakeoverState::Finalize(Box::new((rec, hash)), f);
                                continue;
                            }
                            None => return Step::Done(Ok(self.lease(&rec, hash))),
                        }
                    }
                    let head = match observed.head {
                        Some(h) if h.is_active() => h,
                        Some(h) => {
                            return Step::Done(Err(race(
                                &run,
                                format!(
                                    "generation {} is {:?}: nothing to take over (claim the run instead)",
                                    h.generation(),
                                    h.epoch.state
                                ),
                            )));
                        }
                        None => {
                            return Step::Done(Err(race(
                                &run,
                                "no owner exists: nothing to take over (claim the run instead)",
                            )));
                        }
                    };
                    let generation = match head.generation().next(&run) {
                        Ok(g) => g,
                        Err(e) => return Step::Done(Err(e)),
                    };
                    let mode = match self.p.trigger {
                        TakeoverTrigger::Operator => TakeoverMode::Operator,
                        TakeoverTrigger::Automatic { .. } => TakeoverMode::Automatic,
                    };
                    // The intent records the head it observed and what the caller expects of
                    // it; a mismatch is reported after the intent is durable.
                    let intent = TakeoverIntent {
                        run_id: run.clone(),
                        generation,
                        expected_generation: head.generation(),
                        expected_owner_id: self.p.expect.owner_id.clone(),
                        expected_heartbeat_at: self.p.expect.heartbeat_at,
                        expected_heartbeat_count: self
                            .p
                            .expect
                            .heartbeat_count
                            .unwrap_or(head.heartbeat_count()),
                        taker_owner_id: self.p.owner_id.clone(),
                        taker_holder: self.p.holder.clone(),
                        requested_at: self.p.now,
                        mode,
                    };
                    let bytes = match encode(&intent) {
                        Ok(b) => b,
                        Err(e) => return Step::Done(Err(e)),
                    };
                    self.st = TakeoverState::Intent(Box::new(head));
                    return Step::Io(Request::CreateExclusive(
                        FileRef::Intent {
                            generation,
                            nonce: self.p.nonce,
                        },
                        bytes,
                    ));
                }
                TakeoverState::Intent(head) => match input.take() {
                    Some(Response::Created) => {
                        let g = head.generation();
                        self.st = TakeoverState::Reread(head);
                        return Step::Io(Request::Read(FileRef::Beat(g)));
                    }
                    Some(Response::AlreadyExists) => {
                        // A retry of this very attempt, or a nonce collision: read it.
                        let file = FileRef::Intent {
                            generation: head.generation().next(&run).unwrap_or(head.generation()),
                            nonce: self.p.nonce,
                        };
                        self.st = TakeoverState::IntentCheck(head);
                        return Step::Io(Request::Read(file));
                    }
                    other => return Step::Done(Err(violation("Created/AlreadyExists", &other))),
                },
                TakeoverState::IntentCheck(head) => {
                    if let Err(e) = own_intent(&run, &self.p.owner_id, self.p.nonce, input.take()) {
                        return Step::Done(Err(e));
                    }
                    let g = head.generation();
                    self.st = TakeoverState::Reread(head);
                    return Step::Io(Request::Read(FileRef::Beat(g)));
                }
                TakeoverState::Reread(head) => {
                    let mut head = *head;
                    head.beat = match input.take() {
                        Some(Response::Content(None)) => None,
                        Some(Response::Content(Some(b))) => {
                            match decode_beat(&run, &head.epoch, &b) {
                                Ok(b) => Some(b),
                                Err(e) => return Step::Done(Err(e)),
                            }
                        }
                        other => return Step::Done(Err(violation("Content", &other))),
                    };
                    if let Some(why) = self.p.expect.mismatch(&head) {
                        return Step::Done(Err(race(&run, why)));
                    }
                    let stale_after_ms = head.epoch.policy.stale_after_ms();
                    let refuse =
                        |age_ms: i64, watched_ms: Option<u64>| LeaseError::TakeoverActiveRefused {
                            run: run.to_string(),
                            held: Box::new(head.held_by()),
                            age_ms,
                            stale_after_ms,
                            watched_ms,
                        };
                    match (freshness(&head, self.p.now), self.p.trigger) {
                        (Freshness::Fresh { age_ms }, TakeoverTrigger::Operator) => {
                            return Step::Done(Err(refuse(age_ms, None)));
                        }
                        (
                            Freshness::Fresh { age_ms },
                            TakeoverTrigger::Automatic {
                                watched_unchanged_ms,
                            },
                        ) => return Step::Done(Err(refuse(age_ms, Some(watched_unchanged_ms)))),
                        (
                            Freshness::Stale { age_ms },
                            TakeoverTrigger::Automatic {
                                watched_unchanged_ms,
                            },
                        ) if watched_unchanged_ms <= stale_after_ms => {
                            return Step::Done(Err(refuse(age_ms, Some(watched_unchanged_ms))));
                        }
                        _ => {}
                    }
                    let retired = RetiredOwner {
                        generation: head.generation(),
                        owner_id: head.epoch.owner_id.clone(),
                        reason: RetireReason::TakenOver,
                    };
                    let (rec, bytes) = match next_epoch(
                        &run,
                        Some(&head),
                        EpochState::Active,
                        &self.p.owner_id,
                        &self.p.holder,
                        self.p.policy,
                        self.p.now,
                        Some(retired),
                        None,
                        None,
                    ) {
                        Ok(x) => x,
                        Err(e) => return Step::Done(Err(e)),
                    };
                    let hash = Digest::of(&bytes);
                    let g = rec.generation;
                    let gate = Gate::new(
                        &run,
                        Some(&head),
                        &self.p.owner_id,
                        self.p.now,
                        Request::CreateExclusive(FileRef::Epoch(g), bytes),
                    );
                    self.st = TakeoverState::Gate(Box::new((head, rec, hash)), gate);
                }
                TakeoverState::Gate(b, gate) => {
                    let (b, create) =
                        sub_step!(self.st, TakeoverState::Gate, [b], gate, input.take());
                    self.st = TakeoverState::Create(b);
                    return Step::Io(create);
                }
                TakeoverState::Create(b) => match input.take() {
                    Some(Response::Created) => {
                        let g = b.1.generation;
                        self.st = TakeoverState::Recheck(b, Recheck::new(g));
                    }
                    Some(Response::AlreadyExists) => {
                        return Step::Done(Err(race(
                            &run,
                            format!(
                                "generation {} was created by someone else first",
                                b.1.generation
                            ),
                        )));
                    }
                    other => return Step::Done(Err(violation("Created/AlreadyExists", &other))),
                },
                TakeoverState::Recheck(b, mut rc) => {
                    let higher = match rc.next(input.take()) {
                        Step::Io(r) => {
                            self.st = TakeoverState::Recheck(b, rc);
                            return Step::Io(r);
                        }
                        Step::Done(Err(e)) => return Step::Done(Err(e)),
                        Step::Done(Ok(h)) => h,
                    };
                    let (head, rec, hash) = *b;
                    if let Some(top) = higher {
                        return Step::Done(Err(race(
                            &run,
                            format!("generation {top} exists above the one just created"),
                        )));
                    }
                    let f = Finalize::new(
                        run.clone(),
                        head.generation(),
                        head.epoch.owner_id.clone(),
                        rec.generation,
                        self.p.owner_id.clone(),
                        self.p.now,
                    );
                    self.st = TakeoverState::Finalize(Box::new((rec, hash)), f);
                }
                TakeoverState::Finalize(b, mut f) => {
                    match f.next(input.take()) {
                        Step::Io(r) => {
                            self.st = TakeoverState::Finalize(b, f);
                            return Step::Io(r);
                        }
                        Step::Done(Err(e)) => return Step::Done(Err(e)),
                        Step::Done(Ok(_)) => {}
                    }
                    let (rec, hash) = *b;
                    return Step::Done(Ok(self.lease(&rec, hash)));
                }
                TakeoverState::Done => {
                    return Step::Done(Err(violation("nothing (operation finished)", &input)));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// retire

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
    /// A random nonce naming this attempt's intent file.
    pub nonce: u64,
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
    Intent(Box<(Head, EpochRecord, Vec<u8>)>),
    IntentCheck(Box<(Head, EpochRecord, Vec<u8>)>),
    Gate(Box<(Head, EpochRecord)>, Gate),
    Create(Box<(Head, EpochRecord)>),
    Recheck(Box<(Head, EpochRecord)>, Recheck),
    Finalize(Generation, Generation, Finalize),
    Done,
}

impl Retire {
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
                RetireState::Observe(mut obs) => {
                    let observed = match obs.next(input.take()) {
                        Step::Io(r) => {
                            self.st = RetireState::Observe(obs);
                            return Step::Io(r);
                        }
                        Step::Done(Err(e)) => return Step::Done(Err(e)),
                        Step::Done(Ok(o)) => o,
                    };
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
                    };
                    let (rec, bytes) = match next_epoch(
                        &run,
                        Some(&head),
                        EpochState::Retired,
                        &self.p.owner_id,
                        &self.p.holder,
                        self.p.policy,
                        self.p.now,
                        Some(retired),
                        None,
                        None,
                    ) {
                        Ok(x) => x,
                        Err(e) => return Step::Done(Err(e)),
                    };
                    let intent = TakeoverIntent {
                        run_id: run.clone(),
                        generation: rec.generation,
                        expected_generation: head.generation(),
                        expected_owner_id: head.epoch.owner_id.clone(),
                        expected_heartbeat_at: head.heartbeat_at(),
                        expected_heartbeat_count: head.heartbeat_count(),
                        taker_owner_id: self.p.owner_id.clone(),
                        taker_holder: self.p.holder.clone(),
                        requested_at: self.p.now,
                        mode: TakeoverMode::RetireDead,
                    };
                    let ibytes = match encode(&intent) {
                        Ok(b) => b,
                        Err(e) => return Step::Done(Err(e)),
                    };
                    let g = rec.generation;
                    self.st = RetireState::Intent(Box::new((*head, rec, bytes)));
                    return Step::Io(Request::CreateExclusive(
                        FileRef::Intent {
                            generation: g,
                            nonce: self.p.nonce,
                        },
                        ibytes,
                    ));
                }
                RetireState::Intent(b) => match input.take() {
                    Some(Response::Created) => {
                        let (head, rec, bytes) = *b;
                        let g = rec.generation;
                        let gate = Gate::new(
                            &run,
                            Some(&head),
                            &self.p.owner_id,
                            self.p.now,
                            Request::CreateExclusive(FileRef::Epoch(g), bytes),
                        );
                        self.st = RetireState::Gate(Box::new((head, rec)), gate);
                    }
                    Some(Response::AlreadyExists) => {
                        let file = FileRef::Intent {
                            generation: b.1.generation,
                            nonce: self.p.nonce,
                        };
                        self.st = RetireState::IntentCheck(b);
                        return Step::Io(Request::Read(file));
                    }
                    other => return Step::Done(Err(violation("Created/AlreadyExists", &other))),
                },
                RetireState::IntentCheck(b) => {
                    if let Err(e) = own_intent(&run, &self.p.owner_id, self.p.nonce, input.take()) {
                        return Step::Done(Err(e));
                    }
                    let (head, rec, bytes) = *b;
                    let g = rec.generation;
                    let gate = Gate::new(
                        &run,
                        Some(&head),
                        &self.p.owner_id,
                        self.p.now,
                        Request::CreateExclusive(FileRef::Epoch(g), bytes),
                    );
                    self.st = RetireState::Gate(Box::new((head, rec)), gate);
                }
                RetireState::Gate(b, gate) => {
                    let (b, create) =
                        sub_step!(self.st, RetireState::Gate, [b], gate, input.take());
                    self.st = RetireState::Create(b);
                    return Step::Io(create);
                }
                RetireState::Recheck(b, rc) => {
                    let (b, v) = sub_step!(self.st, RetireState::Recheck, [b], rc, input.take());
                    match v {
                        Some(top) => {
                            return Step::Done(Err(race(
                                &run,
                                format!("generation {top} exists above the one just created"),
                            )));
                        }
                        None => {
                            let (head, rec) = *b;
                            let f = Finalize::new(
                                run.clone(),
                                head.generation(),
                                head.epoch.owner_id.clone(),
                                rec.generation,
                                self.p.owner_id.clone(),
                                self.p.now,
                            );
                            self.st = RetireState::Finalize(head.generation(), rec.generation, f);
                        }
                    }
                }
                RetireState::Create(b) => match input.take() {
                    Some(Response::Created) => {
                        let g = b.1.generation;
                        self.st = RetireState::Recheck(b, Recheck::new(g));
                    }
                    Some(Response::AlreadyExists) => {
                        return Step::Done(Err(race(
                            &run,
                            format!(
                                "generation {} was created by someone else first",
                                b.1.generation
                            ),
                        )));
                    }
                    other => return Step::Done(Err(violation("Created/AlreadyExists", &other))),
                },
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
