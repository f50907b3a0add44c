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
use crate::procs::boottime_ns;
use lease_core::LeaseError;
use lease_core::ops::{
    Expectation, Head, ReleaseParams, Request, Response, RetireParams, Retired, Status, StatusView,
    TakeoverParams, TakeoverTrigger,
};
use lease_core::watch::{StaleWatch, Verdict, watch_key};
use lease_core::{
    FileRef, Generation, Identity, LeaseOps, RetirementRecord, Timestamp, decode_for,
};
use lease_fs::lock::OwnerLock;
use lease_fs::{ProcLiveness, RunDir, this_holder};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Longest pause between two reads of a watched record.
const WATCH_POLL: Duration = Duration::from_millis(250);

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

    /// Watch the owner's record on this process's own `CLOCK_BOOTTIME` until it has stayed
    /// unchanged (generation, owner, heartbeat time and count) for more than the owner's
    /// `stale_after` (PROTOCOL §10: no other host's wall clock decides). Read-only.
    ///
    /// `expect` is the operator's observation: a head that differs from it when the watch
    /// starts is `TAKEOVER_RACE` (75). A record that changes while watched is an owner that
    /// is alive: `TAKEOVER_ACTIVE_REFUSED` (76), naming how long it was watched. `progress`
    /// is called before each pause with the time watched and the time needed. Returns the
    /// exact observation that was watched (its count filled in) and how long.
    pub fn watch(
        &self,
        expect: &Expectation,
        mut progress: impl FnMut(Duration, Duration),
    ) -> Result<(Expectation, Duration), RunError> {
        let run = self.auth.run_id().to_string();
        let mut watch = StaleWatch::new();
        let began = boottime_ns();
        loop {
            let view = self.auth.status(crate::run::wall_now()?, false)?;
            if let Status::Invalid(e) = view.status {
                return Err(RunError::Lease(e));
            }
            let head = match view.head.filter(Head::is_active) {
                Some(h) => h,
                None => {
                    return Err(RunError::Lease(LeaseError::TakeoverRace {
                        run,
                        detail: "the owner released or was replaced while being watched; nothing to take over".into(),
                    }));
                }
            };
            if let Some(key) = watch.watching() {
                if *key != watch_key(&head) {
                    let watched = Duration::from_nanos(boottime_ns().saturating_sub(began));
                    return Err(RunError::Lease(LeaseError::TakeoverActiveRefused {
                        run,
                        held: Box::new(head.held_by()),
                        age_ms: crate::run::wall_now()?.millis_since(head.heartbeat_at()),
                        stale_after_ms: head.epoch.policy.stale_after_ms(),
                        watched_ms: u64::try_from(watched.as_millis()).unwrap_or(u64::MAX),
                    }));
                }
            } else if let Some(why) = expect.mismatch(&head) {
                return Err(RunError::Lease(LeaseError::TakeoverRace {
                    run,
                    detail: why,
                }));
            }
            match watch.observe(&head, boottime_ns()) {
                Verdict::TakeOver { watched } => return Ok((Expectation::of(&head), watched)),
                Verdict::Watching { watched, needed } => {
                    progress(watched, needed);
                    let poll = head.epoch.policy.heartbeat().min(WATCH_POLL);
                    std::thread::sleep(
                        poll.min(needed.saturating_sub(watched) + Duration::from_millis(1)),
                    );
                }
            }
        }
    }

    /// Take over exactly `expect` as an operator would, `watched` being how long
    /// [`Replacer::watch`] saw it unchanged (refused if that is not more than the owner's
    /// `stale_after`, or if the head differs: nothing is written then), and release at once
    /// so the run is free for its next owner. `now` is read for each of the two steps.
    pub fn takeover_and_release(
        &self,
        owner: &Observed,
        expect: Expectation,
        watched: Duration,
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
            trigger: TakeoverTrigger::Operator {
                watched_unchanged_ms: u64::try_from(watched.as_millis()).unwrap_or(u64::MAX),
            },
            nonce,
        })?;
        let cutoff = self.read_cutoff(owner.head.generation());
        let released = now().and_then(|now| {
            self.auth.release(ReleaseParams {
                lease: lease.clone(),
                now,
                seal: None,
            })
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
