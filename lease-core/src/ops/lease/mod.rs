//! Changes of ownership: claim, heartbeat, release, exact takeover, dead-owner retirement.
//!
//! Every change of owner is the exclusive creation of the next epoch file; of two racers
//! exactly one wins, and that creation fences everyone on the generation below. See
//! `docs/PROTOCOL.md` §7 for the numbered steps and §9 for the crash tables.
//!
//! One file per operation (`claim`, `heartbeat`, `release`, `takeover`, `retire`), GATE and
//! ADOPTION (PROTOCOL §7.0, used only here) in `gate`, and here what they share: the
//! [`OwnedLease`] they produce or consume, the building of the next epoch, and the errors.

mod claim;
mod gate;
mod heartbeat;
mod release;
mod retire;
mod takeover;

pub use claim::{Claim, ClaimParams, refine_claim_refusal};
pub use heartbeat::Heartbeat;
pub use release::{Release, ReleaseParams};
pub use retire::{Retire, RetireParams, Retired};
pub use takeover::{Expectation, Preempted, Takeover, TakeoverParams, TakeoverTrigger};

use super::common::{Finalize, Head};
use super::{Response, violation};
use crate::canonical::encode;
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, Identity, RunId};
use crate::policy::TimingPolicy;
use crate::records::{EpochRecord, EpochState, Holder, RetiredOwner, Seal};
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

fn race(run: &RunId, detail: impl Into<String>) -> LeaseError {
    LeaseError::TakeoverRace {
        run: run.to_string(),
        detail: detail.into(),
    }
}

/// The answer to a takeover's or retirement's exclusive create of its epoch `generation`
/// (PROTOCOL §7.4, §7.5): `Ok` when it was created; `TAKEOVER_RACE` when someone else
/// created that generation first.
fn created(
    run: &RunId,
    generation: Generation,
    answer: Option<Response>,
) -> Result<(), LeaseError> {
    match answer {
        Some(Response::Created) => Ok(()),
        Some(Response::AlreadyExists) => Err(race(
            run,
            format!("generation {generation} was created by someone else first"),
        )),
        other => Err(violation("Created/AlreadyExists", &other)),
    }
}

/// After a takeover's or retirement's RECHECK (`higher`: a generation seen above the one it
/// created): `TAKEOVER_RACE` if there is one, else the finalization of the cutoff of the
/// superseded `head`, by `by`, now superseded by `created`.
fn finalize_superseded(
    run: &RunId,
    higher: Option<Generation>,
    head: &Head,
    created: Generation,
    by: &Identity,
    now: Timestamp,
) -> Result<Finalize, LeaseError> {
    if let Some(top) = higher {
        return Err(race(
            run,
            format!("generation {top} exists above the one just created"),
        ));
    }
    Ok(Finalize::new(
        run.clone(),
        head.generation(),
        head.epoch.owner_id.clone(),
        created,
        by.clone(),
        now,
    ))
}

/// Who writes the next epoch, and when: what the parameters of every ownership change
/// share (a release takes the owner's own from its lease).
#[derive(Debug, Clone, Copy)]
struct Writer<'a> {
    run: &'a RunId,
    owner_id: &'a Identity,
    holder: &'a Holder,
    policy: TimingPolicy,
    now: Timestamp,
}

impl<'a> Writer<'a> {
    /// The writer `owner_id` (process `holder`, timing `policy`) of `run` at `now`.
    fn new(
        run: &'a RunId,
        owner_id: &'a Identity,
        holder: &'a Holder,
        policy: TimingPolicy,
        now: Timestamp,
    ) -> Self {
        Writer {
            run,
            owner_id,
            holder,
            policy,
            now,
        }
    }

    /// The lease this writer holds once its epoch `rec` (hashed `hash`) is the head.
    fn lease(&self, rec: &EpochRecord, hash: Digest) -> OwnedLease {
        OwnedLease {
            run_id: self.run.clone(),
            generation: rec.generation,
            owner_id: self.owner_id.clone(),
            holder: self.holder.clone(),
            policy: self.policy,
            epoch_hash: hash,
        }
    }

    /// Build the next epoch after `head` (or generation 1), in `state`, by this writer.
    fn next_epoch(
        &self,
        head: Option<&Head>,
        state: EpochState,
        retired: Option<RetiredOwner>,
        seal: Option<Seal>,
        store_floor: Option<u64>,
    ) -> Result<EpochRecord, LeaseError> {
        let run = self.run;
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
            owner_id: self.owner_id.clone(),
            holder: self.holder.clone(),
            claimed_at: self.now,
            policy: self.policy,
            retired,
            seal,
            // The floor never goes down along the chain.
            store_floor: store_floor.max(inherited_floor),
            // Set by GATE once it has finalized the cutoff it binds (gate.rs).
            cutoff_hash: None,
        };
        // Refuse now what could never be encoded (before GATE writes anything).
        encode(&rec)?;
        Ok(rec)
    }
}
