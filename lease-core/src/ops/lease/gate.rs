//! GATE (finalize before extend) and ADOPTION (PROTOCOL §7.0): the sub-steps only the
//! ownership changes take before they create the next epoch.

use crate::ids::{Digest, Identity, RunId};
use crate::ops::common::{Finalize, Head};
use crate::ops::{Operation, Request, Response, Step, violation};
use crate::records::{EpochRecord, Holder};
use crate::time::Timestamp;

/// "Finalize before extend": before creating generation `h + 1`, make sure the cutoff the
/// head's epoch names (the generation `h` superseded) is finalized. By induction every
/// superseded generation below the head has its cutoff before the chain moves on, so a
/// zombie can never finalize its own cutoff late (after newer owners wrote events) and
/// count (PROTOCOL.md §15 OQ-2, reproduced by a scenario test).
#[derive(Debug, Clone)]
pub(super) struct Gate {
    finalize: Option<Finalize>,
    then: Option<Request>,
}

impl Gate {
    pub(super) fn new(
        run: &RunId,
        head: Option<&Head>,
        by: &Identity,
        now: Timestamp,
        then: Request,
    ) -> Gate {
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
pub(super) fn own_epoch(
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
