//! GATE (finalize before extend) and ADOPTION (PROTOCOL §7.0): the sub-steps only the
//! ownership changes take before they create the next epoch.

use crate::canonical::encode;
use crate::ids::{Digest, Identity, RunId};
use crate::layout::FileRef;
use crate::ops::common::{Cut, Finalize, Head};
use crate::ops::{Operation, Request, Response, Step, violation};
use crate::records::{EpochRecord, Holder};
use crate::time::Timestamp;

/// "Finalize before extend": before creating generation `h + 1`, make sure the cutoff the
/// head's epoch names (the generation `h` superseded) is finalized. By induction every
/// superseded generation below the head has its cutoff before the chain moves on, so a
/// zombie can never finalize its own cutoff late (after newer owners wrote events) and
/// count (PROTOCOL.md OQ-2, reproduced by a scenario test).
///
/// The gate then binds that cutoff into the chain: the new epoch's `cutoff_hash` is the
/// hash of the cutoff it finalized (issue #17, rollback evidence), and only then is the
/// epoch encoded. Its output is the epoch to create: the record, its bytes and its hash.
#[derive(Debug, Clone)]
pub(super) struct Gate {
    finalize: Option<Finalize>,
    rec: Option<Box<EpochRecord>>,
}

/// The epoch a [`Gate`] let through, bound to the cutoff it finalized.
pub(super) struct Bound {
    pub(super) rec: EpochRecord,
    pub(super) hash: Digest,
    pub(super) create: Request,
}

impl Gate {
    /// The gate before creating `rec` (whose `cutoff_hash` the gate sets).
    pub(super) fn new(
        run: &RunId,
        head: Option<&Head>,
        by: &Identity,
        now: Timestamp,
        rec: EpochRecord,
    ) -> Gate {
        Gate {
            finalize: head.and_then(|h| retired_cutoff(run, &h.epoch, by, now)),
            rec: Some(Box::new(rec)),
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
    /// The epoch to create, bound to the cutoff the gate finalized.
    type Output = Bound;
    fn next(&mut self, input: Option<Response>) -> Step<Bound> {
        let mut cutoff_hash = None;
        if let Some(f) = &mut self.finalize {
            match f.next(input) {
                Step::Io(r) => return Step::Io(r),
                Step::Done(Err(e)) => return Step::Done(Err(e)),
                // A cutoff already folded into a checkpoint is bound by the checkpoint's
                // floor epoch hash instead: nothing to name here.
                Step::Done(Ok(Cut::Compacted(_))) => {}
                Step::Done(Ok(Cut::Record(r))) => match encode(&r) {
                    Ok(b) => cutoff_hash = Some(Digest::of(&b)),
                    Err(e) => return Step::Done(Err(e)),
                },
            }
        }
        let Some(mut rec) = self.rec.take().map(|b| *b) else {
            return Step::Done(Err(violation("nothing (gate finished)", &None)));
        };
        rec.cutoff_hash = cutoff_hash;
        match encode(&rec) {
            Ok(bytes) => Step::Done(Ok(Bound {
                hash: Digest::of(&bytes),
                create: Request::CreateExclusive(FileRef::Epoch(rec.generation), bytes),
                rec,
            })),
            Err(e) => Step::Done(Err(e)),
        }
    }
}
