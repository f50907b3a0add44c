//! The one next step for a run (what `status` prints), and the judgements it shares with
//! the findings: the store the chain names, a store refusal in `run.json`, `run.json`
//! ahead of the chain.

use super::{Facts, NamedStore, Next, RunJsonFacts};
use crate::code::Code;
use crate::ops::{Status, StatusView};
use crate::records::EpochRecord;
use crate::seal::seal_of;

/// The store codes a refused open leaves first in `run.json`'s detail that need an
/// operator (data errors, not a transient `STORE_BUSY`).
pub const STORE_REFUSALS: [Code; 4] = [
    Code::StoreBehindSeal,
    Code::StoreIdentityMismatch,
    Code::StoreMissing,
    Code::StoreCorrupt,
];

/// The store code of the last refused open: `run.json` is `failed` with a detail that is
/// one of [`STORE_REFUSALS`] or starts with `CODE:`.
pub fn store_refusal(run_json: &RunJsonFacts) -> Option<Code> {
    let RunJsonFacts::Written {
        failed: true,
        detail: Some(detail),
        ..
    } = run_json
    else {
        return None;
    };
    STORE_REFUSALS.into_iter().find(|c| {
        detail
            .strip_prefix(c.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
    })
}

/// When `run.json` was written by generation `written_by` and the lease chain's head is
/// `head` (0: no epoch): what is wrong, naming both, if the chain does not reach it (its
/// newest epochs deleted, or `lease/` restored from an older copy). An owner writes
/// `run.json` only after its epoch is durable, so no crash produces this; claiming would
/// hand out fencing tokens already given out.
pub fn chain_behind(written_by: u64, head: u64) -> Option<String> {
    (written_by > head).then(|| {
        let chain = if head == 0 {
            "the lease chain (lease/epochs/) has no epoch".to_string()
        } else {
            format!("the lease chain (lease/epochs/) ends at generation {head}")
        };
        format!(
            "run.json was written by generation {written_by}, but {chain}: epochs were deleted or restored from an older copy, and claiming would reuse fencing tokens already given out"
        )
    })
}

fn head_generation(view: &StatusView) -> u64 {
    view.head.as_ref().map_or(0, |h| h.epoch.generation.get())
}

pub(super) fn run_json_ahead(facts: &Facts) -> Option<String> {
    // An unreadable head says nothing about where the chain ends (its INVALID_RECORD is
    // the finding): "the chain has no epoch" would send the operator to restore lease/.
    if matches!(facts.view.status, Status::Invalid(_)) {
        return None;
    }
    match &facts.run_json {
        RunJsonFacts::Written { generation, .. } => {
            chain_behind(*generation, head_generation(&facts.view))
        }
        _ => None,
    }
}

/// How far ahead of this host's clock a heartbeat may be dated before it counts as "in
/// the future" (`FUTURE_HEARTBEAT`, and a takeover as the next step), in ms.
pub(super) const FUTURE_MS: i64 = 1000;

/// The one next step for the run as observed (what `status` prints): by its state, except
/// that a free run the next claim would refuse (an unreadable `run.json`, the last run's
/// store refusal, a store the head names that the folder lacks, `run.json` ahead of the
/// chain) needs doctor first.
pub fn next_step(facts: &Facts) -> Next {
    if matches!(facts.view.status, Status::Free) && facts.adoption_refusal.is_some() {
        return Next::Init;
    }
    let blocked = matches!(facts.run_json, RunJsonFacts::Invalid { .. })
        || store_refusal(&facts.run_json).is_some()
        || named_store_missing(facts)
        || run_json_ahead(facts).is_some()
        || facts.claim_refusal.is_some();
    if matches!(facts.view.status, Status::Free) && blocked {
        return Next::DoctorBeforeRun;
    }
    // A takeover or retirement asks the same admission rule as the claim (lease-run's
    // `admission::judge`): rollback evidence (run.json ahead of the chain) and everything
    // else it refuses refuse it too. Name the repair instead of a step that would be
    // refused (issue #28: a retirement on a rolled-back chain issued generations again).
    if matches!(facts.view.status, Status::Stale | Status::Dead) && blocked {
        return Next::DoctorDoNotTakeOver;
    }
    next_for_view(&facts.view)
}

/// The store `epoch` names for whoever owns the run after it ([`seal_of`]): its seal, or
/// a store floor above 0; `None` when it names none (a new store may then be created).
/// The one judgement of "the chain names a store" for doctor's `STORE_MISSING`, status's
/// next step and lease-run's preflight (which refuses a claim that would find it missing).
pub fn named_store(epoch: &EpochRecord) -> Option<NamedStore> {
    match seal_of(epoch) {
        (Some(s), _) => Some(NamedStore::Sealed {
            sequence: s.sequence,
            generation: s.generation,
            store_id: s.store_id.to_string(),
        }),
        (None, Some((floor, generation))) if floor > 0 => {
            Some(NamedStore::Floor { floor, generation })
        }
        _ => None,
    }
}

/// Whether the head names a store ([`named_store`]) that the folder was seen to lack.
fn named_store_missing(facts: &Facts) -> bool {
    facts.store_present == Some(false)
        && facts
            .view
            .head
            .as_ref()
            .is_some_and(|h| named_store(&h.epoch).is_some())
}

/// The next step by the view's state alone.
pub fn next_for_view(view: &StatusView) -> Next {
    // A beat in the future says nothing of liveness only when its age is a wall-clock age;
    // one stamped on this host's own clock was aged on it (PROTOCOL §10).
    let future = view.mono_age_ms.is_none() && view.age_ms.is_some_and(|a| a < -FUTURE_MS);
    match (&view.status, &view.head) {
        (Status::Free, _) => Next::Claim,
        // The authority holds the owner's lease alive: no wall clock decides, and a
        // takeover is refused until that lease expires (PROTOCOL §7.8, §11). Said apart
        // from a plain wait when a wall clock would have suggested a takeover.
        (Status::Active, Some(_)) if view.lease_alive() && (view.is_stale() || future) => {
            Next::WaitForLease
        }
        // A heartbeat dated more than a second ahead of this host's clock: the wall clock
        // cannot tell whether its owner still beats, and a takeover does not use it (it
        // watches the record on this host's clock, and refuses if the owner writes).
        (Status::Active, Some(h)) if future => Next::Takeover {
            owner_id: h.epoch.owner_id.to_string(),
            heartbeat_at: h.heartbeat_at().to_string(),
        },
        (Status::Active, _) => Next::Wait,
        (Status::Stale, Some(h)) => Next::Takeover {
            owner_id: h.epoch.owner_id.to_string(),
            heartbeat_at: h.heartbeat_at().to_string(),
        },
        (Status::Stale, None) => Next::ObserveAgain,
        (Status::Dead, _) => Next::Retire,
        (Status::Invalid(_), _) => Next::DoctorDoNotTakeOver,
    }
}
