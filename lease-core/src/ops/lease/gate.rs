//! GATE (finalize before extend) and ADOPTION (PROTOCOL §7.0): the sub-steps only the
//! ownership changes take before they create the next epoch.

use super::Writer;
use crate::canonical::encode;
use crate::error::LeaseError;
use crate::ids::{Digest, Identity, RunId};
use crate::layout::FileRef;
use crate::ops::common::{Cut, Finalize, Head};
use crate::ops::{Operation, Request, Response, Step};
use crate::records::EpochRecord;
use crate::time::Timestamp;

/// "Finalize before extend": before creating generation `h + 1`, make sure the cutoff the
/// head's epoch names (the generation `h` superseded) is finalized. By induction every
/// superseded generation below the head has its cutoff before the chain moves on, so a
/// zombie can never finalize its own cutoff late (after newer owners wrote events) and
/// count (PROTOCOL.md OQ-2, reproduced by a scenario test).
///
/// Its output is the hash of the cutoff it finalized, which the new epoch records as its
/// `cutoff_hash` ([`bind`], issue #17, rollback evidence); `None` when the head superseded
/// nobody or the cutoff was already folded into a checkpoint.
#[derive(Debug, Clone)]
pub(super) struct Gate {
    finalize: Option<Finalize>,
}

/// An epoch bound to the cutoff its gate finalized, ready to create.
pub(super) struct Bound {
    pub(super) rec: EpochRecord,
    pub(super) hash: Digest,
    pub(super) create: Request,
}

/// Set `rec`'s `cutoff_hash` to what the gate answered and encode it: the epoch to create.
pub(super) fn bind(mut rec: EpochRecord, cutoff_hash: Option<Digest>) -> Result<Bound, LeaseError> {
    rec.cutoff_hash = cutoff_hash;
    let bytes = encode(&rec)?;
    Ok(Bound {
        hash: Digest::of(&bytes),
        create: Request::CreateExclusive(FileRef::Epoch(rec.generation), bytes),
        rec,
    })
}

impl Gate {
    /// The gate before extending the chain past `head`.
    pub(super) fn new(run: &RunId, head: Option<&Head>, by: &Identity, now: Timestamp) -> Gate {
        Gate {
            finalize: head.and_then(|h| retired_cutoff(run, &h.epoch, by, now)),
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

impl Writer<'_> {
    /// Adoption on retry: when the head is the writer's own active epoch (same owner id and
    /// holder: an earlier attempt of this very process created it and then failed with an
    /// I/O error after the commit), its record, hash and the lazy finalization of the cutoff
    /// it may not have written. A retry never wedges the run behind a lease nobody uses.
    pub(super) fn own_epoch(
        &self,
        head: Option<&Head>,
    ) -> Option<(EpochRecord, Digest, Option<Finalize>)> {
        let (owner, holder) = (self.owner_id, self.holder);
        let h = head
            .filter(|h| h.is_active() && &h.epoch.owner_id == owner && &h.epoch.holder == holder)?;
        Some((
            h.epoch.clone(),
            h.hash.clone(),
            retired_cutoff(self.run, &h.epoch, owner, self.now),
        ))
    }
}

impl Operation for Gate {
    /// The hash of the cutoff it finalized, if any.
    type Output = Option<Digest>;
    fn next(&mut self, input: Option<Response>) -> Step<Option<Digest>> {
        let Some(f) = &mut self.finalize else {
            return Step::Done(Ok(None));
        };
        match f.next(input) {
            Step::Io(r) => Step::Io(r),
            Step::Done(Err(e)) => Step::Done(Err(e)),
            // A cutoff already folded into a checkpoint is bound by the checkpoint's floor
            // epoch hash instead: nothing to name here.
            Step::Done(Ok(Cut::Compacted(_))) => Step::Done(Ok(None)),
            Step::Done(Ok(Cut::Record(r))) => match encode(&r) {
                Ok(b) => Step::Done(Ok(Some(Digest::of(&b)))),
                Err(e) => Step::Done(Err(e)),
            },
        }
    }
}
