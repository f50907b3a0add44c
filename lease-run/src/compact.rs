//! Automatic compaction after a release (issue #17: bounded growth with no operator).
//!
//! Every change of owner adds files to `lease/` (a `runlease run` cycle: two epochs and a
//! cutoff; before issue #19 a takeover also an intent), and claim lists `lease/epochs/`. So, after every
//! successful release, whoever released runs the existing prune (PROTOCOL §7.10, the same
//! step machine as `runlease prune`) once the chain has grown by [`COMPACT_EVERY`]
//! generations since the last checkpoint, keeping the newest [`COMPACT_KEEP`], and in the
//! same step collects orphaned temp files ([`lease_fs::primitives::clean_temp_files`]:
//! only our temp names, only regular files of the effective uid, never through a symlink,
//! older than [`TEMP_MIN_AGE_SECS`]). `lease/` then holds at most `COMPACT_EVERY +
//! COMPACT_KEEP` generations' files after any release, whatever the number of runs.
//!
//! The releasers that get it: [`crate::Run::release`] and [`crate::Run::release_detached`]
//! (after the owner lock is let go), and every other hand-back that goes through
//! [`release`] (`runlease release` with the token, `runlease takeover`'s
//! takeover-then-release through [`crate::replace::Replacer`]).
//!
//! **Why lease-run compacts by itself (issue #33).** Every release of lease-core compacts
//! when due (PROTOCOL §7.3 step 7, [`CompactPolicy::DEFAULT`]), so every user of
//! `LeaseOps::release` gets it: a lease-fs `RunDir`, etcd, the model. lease-run's own
//! releases turn that off (`LeaseOps::release_compacting(p, None)`) and run the same prune
//! here instead, with the same rule and the same constants (one source: [`COMPACT_EVERY`]
//! and [`COMPACT_KEEP`] are lease-core's), for three reasons: the prune then runs after
//! `Run` has let go of the owner lock (a next owner is never held up by it); its outcome is
//! reported as a [`Compaction`] (the core's release only returns its generation), so the
//! report says truthfully whether a prune ran and what it did; and the temp collection goes
//! with it. Passing `None` is also what keeps the prune from running twice.
//!
//! **Best-effort.** The release has already succeeded and is durable when this runs: a
//! failed or interrupted compaction never fails it. The outcome is returned
//! ([`Compaction`]) and logged with `tracing` (a warning when something failed). The next
//! release tries again (a prune that failed left the old files, or them plus the checkpoint
//! derived from them: both consistent, PROTOCOL §7.10).
//!
//! **Never blocks the next owner.** It runs after the release epoch is durable and (in
//! `Run`) after the owner lock is let go, so a next owner may claim meanwhile: prune is
//! built for that (it removes only below `F = head − keep + 1 ≤ head − 1`, and a creator of
//! a compacted number loses in RECHECK, rule 5). A concurrent `runlease prune` makes one of
//! the two answer `CONCURRENT_CHANGE`, which is reported here, never guessed around.
//! Readers racing it re-read (OQ-15's fix, PROTOCOL §7.9).

use crate::authority::LeaseAuthority;
use crate::clock::wall_now;
use crate::error::RunError;
use lease_core::ops::{CompactPolicy, PruneParams, PruneReport, ReleaseParams, Request, Status};
use lease_core::{Dir, FileRef, Generation, Identity, LeaseError, LeaseOps};
use lease_fs::RunDir;

/// Temp files younger than this are never removed by a temp-file clean-up (a writer may
/// still be using them), and only older ones count as orphaned.
pub const TEMP_MIN_AGE_SECS: u64 = 60;

/// Compact once the chain has grown by this many generations since the last checkpoint
/// (docs/DECISIONS.md, 2026-12-04: eight `runlease run` cycles): lease-core's
/// [`CompactPolicy::DEFAULT`], the one every release uses.
pub const COMPACT_EVERY: u64 = CompactPolicy::DEFAULT.every;

/// How many of the newest generations an automatic compaction keeps (`runlease status`,
/// `verify` and the seal/floor of the next owner read at most the last two):
/// lease-core's [`CompactPolicy::DEFAULT`].
pub const COMPACT_KEEP: u64 = CompactPolicy::DEFAULT.keep;

/// What the compaction after a release did. Never an error of the release itself.
#[derive(Debug)]
#[non_exhaustive]
pub enum Compaction {
    /// Not due: the chain grew by fewer than [`COMPACT_EVERY`] generations since the
    /// checkpoint at `floor` (generation 1 when there is none).
    NotDue {
        /// The newest checkpoint's floor (1 if none).
        floor: Generation,
        /// The generation the release created.
        head: Generation,
    },
    /// Due, and run.
    Ran {
        /// The prune's report (its new floor and the files it removed), or why it failed
        /// or was refused (an invalid head refuses it, as it refuses `runlease prune`).
        prune: Result<PruneReport, RunError>,
        /// How many orphaned temp files were collected, or why not; `None` when there is
        /// no run folder to look in (the lease in etcd, opened without its folder).
        temps: Option<Result<usize, RunError>>,
    },
    /// Whether it was due could not be found out (the checkpoints could not be listed, or
    /// the wall clock is unusable): nothing was written.
    Unknown(RunError),
}

impl Compaction {
    /// The first failure, if any (for logs and reports).
    pub fn failure(&self) -> Option<&RunError> {
        match self {
            Compaction::NotDue { .. } => None,
            Compaction::Ran { prune, temps } => prune
                .as_ref()
                .err()
                .or_else(|| temps.as_ref().and_then(|t| t.as_ref().err())),
            Compaction::Unknown(e) => Some(e),
        }
    }
}

/// A release and the compaction that followed it.
#[derive(Debug)]
pub struct Released {
    /// The release epoch's generation (the run is free as of it).
    pub generation: Generation,
    /// What the automatic compaction did (best-effort: see the module docs).
    pub compaction: Compaction,
}

/// Whether a chain whose newest checkpoint is at `floor` (1 if none) and whose head is
/// `head` is due for compaction: it grew by [`COMPACT_EVERY`] generations since the
/// compaction that made `floor` (that one kept [`COMPACT_KEEP`], so its head was
/// `floor + COMPACT_KEEP − 1`).
pub fn is_due(floor: Generation, head: Generation) -> bool {
    CompactPolicy::DEFAULT.is_due(floor, head)
}

/// Release `p.lease` ([`LeaseOps::release_compacting`] without the core's compaction,
/// PROTOCOL §7.3 steps 1–6) and then compact if due ([`after_release`], the same rule as
/// step 7, reported). The release's own errors are returned as they are (`FENCED` and
/// the rest); the compaction's never are (they are in [`Released::compaction`]).
/// `folder` is the run folder whose temp files may be collected (`None`: none).
pub fn release(
    auth: &dyn LeaseAuthority,
    folder: Option<&RunDir>,
    p: ReleaseParams,
) -> Result<Released, RunError> {
    let by = p.lease.owner_id.clone();
    // The core's step 7 off: the compaction is this module's (see the module docs).
    let generation = auth.release_compacting(p, None)?;
    let compaction = after_release(auth, folder, generation, by);
    Ok(Released {
        generation,
        compaction,
    })
}

/// The compaction step after a successful release that created generation `released`,
/// run as `by` (recorded in the checkpoint and in any cutoff it finalizes). Logs its
/// outcome (`tracing`, target `lease_run::compact`) and returns it; never fails.
///
/// Order of writes: only the prune's own (PROTOCOL §7.10): any pending cutoff below the new
/// floor is finalized (`CreateExclusive`, durable) → `CreateExclusive(checkpoint F)`
/// (durable) → `Remove(NoFsync)` of the epochs, beats, cutoffs and older checkpoints below
/// `F` and the intents `≤ F`, in name order. Then the temp collection (per folder: `lstat`
/// → `unlinkat` each, one fsync of the folder if anything went). A crash between any two
/// steps leaves the old files, or them plus the checkpoint derived from them, plus or minus
/// some temps nobody reads: every one a valid state (`lease-fs/tests/crash.rs`'s prune
/// scenario, `lease-run/tests/compaction.rs`).
pub fn after_release(
    auth: &dyn LeaseAuthority,
    folder: Option<&RunDir>,
    released: Generation,
    by: Identity,
) -> Compaction {
    let run = auth.run_id().clone();
    let outcome = compact(auth, folder, released, by);
    match &outcome {
        Compaction::NotDue { .. } => {}
        Compaction::Ran { prune, temps } if outcome.failure().is_none() => {
            let (floor, removed) = match prune {
                Ok(r) => (r.floor.map(|f| f.get()), r.removed),
                Err(_) => (None, 0),
            };
            let temps = temps.as_ref().and_then(|t| t.as_ref().ok().copied());
            tracing::info!(
                target: "lease_run::compact",
                run = %run,
                released = released.get(),
                floor,
                removed,
                temps,
                "compacted the lease after the release"
            );
        }
        _ => {
            if let Some(e) = outcome.failure() {
                tracing::warn!(
                    target: "lease_run::compact",
                    run = %run,
                    released = released.get(),
                    code = e.code().as_str(),
                    "the compaction after the release failed (the release stands; the next release tries again): {e}"
                );
            }
        }
    }
    outcome
}

fn compact(
    auth: &dyn LeaseAuthority,
    folder: Option<&RunDir>,
    released: Generation,
    by: Identity,
) -> Compaction {
    let floor = match newest_checkpoint(auth) {
        Ok(f) => f.unwrap_or(Generation::FIRST),
        Err(e) => return Compaction::Unknown(e),
    };
    if floor > released {
        // A checkpoint above the head we just created: forged or left by hand. Reported,
        // never passed over (it would stop every later compaction); `verify` and `doctor`
        // say more.
        return Compaction::Unknown(RunError::Lease(LeaseError::ChainBroken {
            run: auth.run_id().to_string(),
            chain: "epoch",
            at: floor.get(),
            detail: format!(
                "{} names a floor above the head, generation {released} (written by hand?); no automatic compaction until it is repaired",
                FileRef::Checkpoint(floor).path()
            ),
        }));
    }
    if !is_due(floor, released) {
        return Compaction::NotDue {
            floor,
            head: released,
        };
    }
    let now = match wall_now() {
        Ok(now) => now,
        Err(e) => return Compaction::Unknown(e),
    };
    // Like `runlease prune`: an invalid head refuses the prune (reported, never passed
    // over); one OBSERVE, only when due.
    let prune = match auth.status(now, false) {
        Ok(view) => match view.status {
            Status::Invalid(e) => Err(RunError::Lease(e)),
            _ => auth.prune(PruneParams {
                run_id: auth.run_id().clone(),
                keep: COMPACT_KEEP,
                by,
                now,
            }),
        },
        Err(e) => Err(e),
    };
    let temps = folder.map(|dir| {
        dir.clean_temp_files(TEMP_MIN_AGE_SECS)
            .map_err(RunError::from)
    });
    Compaction::Ran { prune, temps }
}

/// The newest checkpoint's floor, from one listing of `lease/checkpoints/`.
fn newest_checkpoint(auth: &dyn LeaseAuthority) -> Result<Option<Generation>, RunError> {
    let files = crate::preflight::listed(
        auth.run_id().as_str(),
        Dir::Checkpoints,
        auth.perform(Request::List(Dir::Checkpoints))?,
    )?;
    Ok(files
        .into_iter()
        .filter_map(|f| match f {
            FileRef::Checkpoint(g) => Some(g),
            _ => None,
        })
        .max())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: u64) -> Generation {
        Generation::new(n).unwrap()
    }

    #[test]
    fn due_every_compact_every_generations_after_the_kept_ones() {
        // No checkpoint (floor 1): first due when the head reaches COMPACT_EVERY + KEEP.
        assert!(!is_due(g(1), g(COMPACT_EVERY + COMPACT_KEEP - 1)));
        assert!(is_due(g(1), g(COMPACT_EVERY + COMPACT_KEEP)));
        // After a compaction at head H the floor is H − KEEP + 1: due again at H + EVERY.
        let h = 1_000;
        let floor = g(h - COMPACT_KEEP + 1);
        assert!(!is_due(floor, g(h + COMPACT_EVERY - 1)));
        assert!(is_due(floor, g(h + COMPACT_EVERY)));
        // A head below the floor (a hand-edited checkpoint) is never due.
        assert!(!is_due(g(50), g(10)));
    }
}
