//! Replacing an owner from outside the run: the retirement of a definitely-dead owner and
//! an operator's exact takeover (`runlease retire`, `runlease takeover`), with the
//! decisions a library user must not skip:
//!
//! - a retirement on a run folder first takes the kernel owner lock if it can (within
//!   200 ms), so "dead" is judged holding it and no new owner on this host starts meanwhile
//!   (the lock is let go when the [`Replacer`] is dropped); with etcd, "dead" is the owner's
//!   etcd lease gone and no local lock is taken;
//! - an invalid record refuses the replacement (nothing may replace the owner until it is
//!   repaired), and so does any unreadable record or broken chain anywhere: every record is
//!   verified first, because a replacement finalizes the old owner's cutoff over the whole
//!   event log;
//! - the replacement acts on exactly the head that was observed (an [`Expectation`]), so a
//!   head that changed meanwhile is a race, never a wrong replacement.
//!
//! ```no_run
//! use lease_run::replace::Replacer;
//! use lease_run::Authority;
//! # fn main() -> Result<(), lease_run::RunError> {
//! let r = Replacer::for_retire(std::path::Path::new("/srv/runs/job-1"), &Authority::RunFolder)?;
//! let now = lease_run::wall_now()?;
//! if let Some(owner) = r.observe(now)? {
//!     let owner_id = lease_core::Identity::new("ops-retire-1").unwrap();
//!     let retired = r.retire(&owner, owner_id, now, 7)?;
//!     println!("retired generation {}; its events count through {}", retired.retired, retired.cutoff);
//! }
//! # Ok(()) }
//! ```

use crate::authority::{Authority, FolderAuthority, LeaseAuthority};
use crate::error::RunError;
use lease_core::ops::{
    Expectation, Head, ReleaseParams, Request, Response, RetireParams, Retired, Status, StatusView,
    TakeoverParams, TakeoverTrigger,
};
use lease_core::{
    FileRef, Generation, Identity, LeaseOps, RetirementRecord, Timestamp, decode_for,
};
use lease_fs::lock::OwnerLock;
use lease_fs::{ProcLiveness, RunDir, this_holder};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How long a retirement tries to take the kernel owner lock.
const RETIRE_LOCK_TIMEOUT: Duration = Duration::from_millis(200);

/// Deadline of one etcd step of a replacement.
#[cfg(feature = "etcd")]
const ETCD_STEP: Duration = Duration::from_secs(10);

/// The owner a replacement acts on: what was observed, and its active head. Only
/// [`Replacer::observe`] makes one, after verifying the run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Observed {
    /// The status view (liveness probed).
    pub view: StatusView,
    /// Its active head.
    pub head: Head,
}

/// What an exact takeover did.
#[derive(Debug)]
pub struct TakenOver {
    /// The generation this takeover owned for an instant.
    pub generation: Generation,
    /// The release that followed at once: the generation that freed the run, or why it
    /// failed (the takeover itself stands: the old owner is fenced either way).
    pub released: Result<Generation, RunError>,
    /// The old owner's cutoff: its events count through this sequence.
    pub cutoff: Option<u64>,
}

/// The lease of one run, opened to replace its owner (see the module docs).
pub struct Replacer {
    auth: Arc<dyn LeaseAuthority>,
    _lock: Option<OwnerLock>,
}

impl Replacer {
    /// Open the run at `path` for a retirement: on a run folder the kernel owner lock is
    /// taken if it can be (module docs). A missing folder is `RUN_NOT_FOUND` (64).
    pub fn for_retire(path: &Path, authority: &Authority) -> Result<Replacer, RunError> {
        Replacer::open(path, authority, true)
    }

    /// Open the run at `path` for an exact takeover (no lock is taken: the stale owner may
    /// be alive and hold it; its lease is replaced, not its process).
    pub fn for_takeover(path: &Path, authority: &Authority) -> Result<Replacer, RunError> {
        Replacer::open(path, authority, false)
    }

    fn open(path: &Path, authority: &Authority, lock: bool) -> Result<Replacer, RunError> {
        match authority {
            Authority::RunFolder => {
                let mut dir = RunDir::open(path)?;
                let lock = if lock {
                    let l = OwnerLock::acquire_timeout(path, RETIRE_LOCK_TIMEOUT).map_err(|e| {
                        RunError::Io(format!(
                            "cannot take the owner lock of {}: {e}",
                            path.display()
                        ))
                    })?;
                    if l.is_some() {
                        // Holding the lock ourselves, its being held is no sign of life.
                        dir.set_liveness(Arc::new(ProcLiveness::new(path).holding_lock()));
                    }
                    l
                } else {
                    None
                };
                Ok(Replacer {
                    auth: Arc::new(FolderAuthority(Arc::new(dir))),
                    _lock: lock,
                })
            }
            #[cfg(feature = "etcd")]
            Authority::Etcd(addr) => {
                let run_id = lease_fs::run_id_of(path)?;
                let auth = crate::authority::EtcdLease::connect(
                    addr,
                    run_id,
                    crate::authority::EtcdLease::options(ETCD_STEP, ETCD_STEP),
                )?;
                let _ = lock;
                Ok(Replacer {
                    auth: Arc::new(auth),
                    _lock: None,
                })
            }
        }
    }

    /// The lease (for reads the caller wants to show).
    pub fn lease(&self) -> &dyn LeaseAuthority {
        &*self.auth
    }

    /// Observe the owner at wall time `now` (liveness probed) and verify the run. An
    /// invalid head is the error (`RECORD_INVALID` and the like: nothing may replace the
    /// owner until it is repaired); a free run is `None`; then every record and both chains
    /// are verified (a replacement finalizes the old owner's cutoff over the whole log):
    /// an unreadable record or a broken chain anywhere is the error (65, naming the file).
    pub fn observe(&self, now: Timestamp) -> Result<Option<Observed>, RunError> {
        let view = self.auth.status(now, true)?;
        if let Status::Invalid(e) = &view.status {
            return Err(RunError::Lease(e.clone()));
        }
        let Some(head) = view.head.clone().filter(Head::is_active) else {
            return Ok(None);
        };
        self.auth.verify()?;
        Ok(Some(Observed { view, head }))
    }

    /// Retire exactly `owner`'s head if it is definitely dead (`RETIRE_REFUSED_NOT_DEAD`,
    /// 76, otherwise; `TAKEOVER_RACE`, 75, if the head changed), as `owner_id` at wall
    /// time `now`.
    pub fn retire(
        &self,
        owner: &Observed,
        owner_id: Identity,
        now: Timestamp,
        nonce: u64,
    ) -> Result<Retired, RunError> {
        self.auth.retire(RetireParams {
            run_id: self.auth.run_id().clone(),
            owner_id,
            holder: this_holder()?,
            policy: owner.head.epoch.policy,
            now,
            expect: Some(Expectation::of(&owner.head)),
            nonce,
        })
    }

    /// Take over exactly `expect` as an operator would (refused if the owner is fresh or
    /// the head differs from it), and release at once so the run is free for its next
    /// owner. `now` is read for each of the two steps.
    pub fn takeover_and_release(
        &self,
        owner: &Observed,
        expect: Expectation,
        owner_id: Identity,
        now: impl Fn() -> Result<Timestamp, RunError>,
        nonce: u64,
    ) -> Result<TakenOver, RunError> {
        let lease = self.auth.takeover(TakeoverParams {
            run_id: self.auth.run_id().clone(),
            owner_id,
            holder: this_holder()?,
            policy: owner.head.epoch.policy,
            now: now()?,
            expect,
            trigger: TakeoverTrigger::Operator,
            nonce,
        })?;
        let cutoff = self.read_cutoff(owner.head.generation());
        // The release, then the automatic compaction (crate::compact: best-effort, never
        // this release's error; its order of writes is the prune's own, PROTOCOL §7.10).
        let released = now().and_then(|now| {
            crate::compact::release(
                &*self.auth,
                self.auth.folder(),
                ReleaseParams {
                    lease: lease.clone(),
                    now,
                    seal: None,
                },
            )
            .map(|r| r.generation)
        });
        Ok(TakenOver {
            generation: lease.generation,
            released,
            cutoff,
        })
    }

    fn read_cutoff(&self, g: Generation) -> Option<u64> {
        match self.auth.perform(Request::Read(FileRef::Cutoff(g))) {
            Ok(Response::Content(Some(b))) => {
                decode_for::<RetirementRecord>(self.auth.run_id(), &b)
                    .ok()
                    .map(|r| r.events_through)
            }
            _ => None,
        }
    }
}
