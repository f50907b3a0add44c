//! [`OwnedRun`]: a claimed run folder held together with its kernel owner lock, with a
//! heartbeat that applies the self-fence rule and numbers its own beats.

use crate::error::FsError;
use crate::lock::OwnerLock;
use crate::real::RealFs;
use crate::run_dir::{ProcLiveness, RunDir, boottime_ns, open_error, run_id_of, this_holder};
use lease_core::ops::{ClaimParams, Expectation, OwnedLease, ReleaseParams, RetireParams, Status};
use lease_core::{
    Generation, Identity, LeaseError, LeaseOps, Seal, Timestamp, TimingPolicy, must_self_fence,
};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The lease of a run folder held by this process **with** the run's kernel owner lock:
/// what a claim on a [`RunDir`] ([`LeaseOps::claim`]) and
/// [`OwnerLock`] give separately, in one guard.
///
/// - [`OwnedRun::claim`] takes the owner lock first (held by another process of this host:
///   `OWNER_LOCK_HELD`, nothing written), then claims; its [`RunDir`] knows this process
///   holds the lock, so `status` through [`OwnedRun::dir`] never reports our own lock as
///   another owner's.
/// - [`OwnedRun::heartbeat`] numbers the beats itself (1, 2, ...) and applies the self-fence
///   rule ([`must_self_fence`], on `CLOCK_BOOTTIME`): past `self_fence_after` since the start
///   of the last successful heartbeat-class write (the claim, then each beat) it writes
///   nothing and answers `FENCED`, as does a heartbeat that finds a higher generation. A
///   fence is sticky: every later call answers `FENCED`.
/// - [`OwnedRun::append`] appends an event after the same self-fence check (past the
///   deadline nothing is written: `FENCED`), so an owner that stopped beating cannot keep
///   adding events that a replacer would have to judge. [`OwnedRun::heartbeat_due`] says
///   when the next beat is due (the policy's heartbeat interval since the last one).
/// - [`OwnedRun::release`] releases (refused once fenced: nothing is written) and lets the
///   lock go. **Dropping** an `OwnedRun` writes nothing and lets the lock go: the lease is
///   left as its owner's crash would leave it. While this process lives, its holder is
///   alive, so `status` says `active` (not `dead`) and a claim from this same process is
///   refused until the lease is stale (`stale_after` without a beat), then it is a
///   takeover; once the process has exited, `status` says `dead` and the run can be
///   retired (or claimed with lease-run's `retire_dead`). To give the run back, call
///   [`OwnedRun::release`].
///
/// ```
/// use lease_core::{Identity, Timestamp, TimingPolicy};
/// use lease_fs::{OwnedRun, RunDir, WallClock};
///
/// let tmp = tempfile::tempdir()?;
/// let path = tmp.path().join("job");
/// RunDir::create(&path)?;
/// let mut run = OwnedRun::claim(&path, Identity::new("worker-1")?, TimingPolicy::default(), Timestamp::now()?)?;
/// run.heartbeat(Timestamp::now()?)?; // beat 1, within self_fence_after of the claim
/// assert!(run.time_to_self_fence() > std::time::Duration::ZERO);
/// // A second owner on this host is refused by the lock before anything is written.
/// let e = OwnedRun::claim(&path, Identity::new("worker-2")?, TimingPolicy::default(), Timestamp::now()?).unwrap_err();
/// assert_eq!(e.code().as_str(), "OWNER_LOCK_HELD");
/// run.release(Timestamp::now()?, None)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct OwnedRun {
    dir: RunDir,
    lease: OwnedLease,
    _lock: OwnerLock,
    /// `CLOCK_BOOTTIME` ns at the start of the last successful heartbeat-class write.
    beat_ns: u64,
    /// The number of the last successful beat (0: the claim).
    count: u64,
    /// The store head each beat reports (see [`OwnedRun::report_store_head`]).
    store_head: Option<u64>,
    /// The first fence's cause (sticky).
    fenced: Option<String>,
    /// The last event this owner appended (the next append's tail hint).
    tail: Option<(lease_core::Sequence, lease_core::Digest)>,
}

impl std::fmt::Debug for OwnedRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedRun")
            .field("root", &self.dir.root())
            .field("generation", &self.lease.generation)
            .field("count", &self.count)
            .field("fenced", &self.fenced)
            .finish_non_exhaustive()
    }
}

impl OwnedRun {
    /// Take the owner lock of the existing run folder at `path`, then claim its lease as
    /// `owner_id` (this process as the holder) at wall time `now`. The lock is taken on
    /// the held root descriptor (a renamed root is followed). Refusals leave the folder as
    /// it was: the lock held elsewhere (`OWNER_LOCK_HELD`), the run held or stale
    /// (`RUN_ALREADY_ACTIVE`, `RUN_STALE_REQUIRES_TAKEOVER`, …: lease-core's codes).
    pub fn claim(
        path: &Path,
        owner_id: Identity,
        policy: TimingPolicy,
        now: Timestamp,
    ) -> Result<OwnedRun, FsError> {
        let (dir, lock) = Self::locked(path)?;
        Self::claim_locked(dir, lock, owner_id, policy, now)
    }

    /// [`OwnedRun::claim`], but a run whose owner is **definitely dead** (this boot, its
    /// process gone, its owner lock free: `status` says `dead`) is first retired as
    /// `retirer`, then claimed as `owner_id`: what a process that restarts after a crash of
    /// its predecessor wants. Returns the run and the retired generation, if one was.
    ///
    /// In order: the owner lock is taken first (held elsewhere: `OWNER_LOCK_HELD`, nothing
    /// written), so "dead" is judged holding it and no other owner on this host can start
    /// in between; the status is read with liveness probed; only if it says `dead` is the
    /// event log's tail verified (a retirement finalizes the dead owner's cutoff over it: an
    /// unreadable or forged event refuses, nothing written) and the owner retired,
    /// conditioned on exactly the head observed (a head that changed meanwhile is a race,
    /// never a wrong retirement); then the claim. A live, stale or released owner is not
    /// retired: the claim answers as [`OwnedRun::claim`] does (`RUN_ALREADY_ACTIVE`,
    /// `RUN_STALE_REQUIRES_TAKEOVER`, …). `retirer` and `owner_id` must differ (each epoch
    /// has its own owner id, PROTOCOL §1): `ARGUMENT_INVALID` otherwise, before anything.
    ///
    /// A crash between the retirement and the claim leaves a run released by the
    /// retirement (`free`): the next call claims it.
    pub fn claim_or_retire_dead(
        path: &Path,
        owner_id: Identity,
        retirer: Identity,
        policy: TimingPolicy,
        now: Timestamp,
    ) -> Result<(OwnedRun, Option<Generation>), FsError> {
        if retirer == owner_id {
            return Err(FsError::Lease(LeaseError::ArgumentInvalid {
                what: "retirer",
                reason: format!("the retirer's id and the owner's must differ (both {owner_id})"),
            }));
        }
        let (dir, lock) = Self::locked(path)?;
        let view = dir.status(now, true)?;
        let retired = match (&view.status, &view.head) {
            (Status::Dead, Some(head)) => {
                dir.verify_tail()?;
                let r = dir.retire(RetireParams {
                    run_id: dir.run_id().clone(),
                    owner_id: retirer,
                    holder: this_holder()?,
                    policy,
                    now,
                    expect: Some(Expectation::of(head)),
                })?;
                Some(r.retired)
            }
            _ => None,
        };
        let run = Self::claim_locked(dir, lock, owner_id, policy, now)?;
        Ok((run, retired))
    }

    /// The run folder at `path` opened with its owner lock taken on the held root
    /// descriptor (a renamed root is followed); held by another process of this host:
    /// `OWNER_LOCK_HELD`. Its [`RunDir`] knows this process holds the lock.
    fn locked(path: &Path) -> Result<(RunDir, OwnerLock), FsError> {
        let run_id = run_id_of(path)?;
        let name = path.display().to_string();
        let fs = RealFs::open(path).map_err(|e| open_error(&run_id, path, e))?;
        let lock = OwnerLock::try_acquire_in(&fs)
            .map_err(|e| FsError::io(run_id.as_str(), "lock", "owner.lock", e))?
            .ok_or_else(|| FsError::OwnerLockHeld { run: name.clone() })?;
        let dir = RunDir::with_fs(
            Arc::new(fs),
            run_id,
            path,
            Arc::new(ProcLiveness::new(path).holding_lock()),
        );
        Ok((dir, lock))
    }

    /// The claim, the owner lock held.
    fn claim_locked(
        dir: RunDir,
        lock: OwnerLock,
        owner_id: Identity,
        policy: TimingPolicy,
        now: Timestamp,
    ) -> Result<OwnedRun, FsError> {
        // The claim counts as the first heartbeat-class write: its start is the
        // self-fence reference until the first beat succeeds.
        let started = boottime_ns();
        let lease = dir.claim(ClaimParams {
            run_id: dir.run_id().clone(),
            owner_id,
            holder: this_holder()?,
            policy,
            now,
            store_floor: None,
        })?;
        Ok(OwnedRun {
            dir,
            lease,
            _lock: lock,
            beat_ns: started,
            count: 0,
            store_head: None,
            fenced: None,
            tail: None,
        })
    }

    /// The lease (generation = the fencing token).
    pub fn lease(&self) -> &OwnedLease {
        &self.lease
    }

    /// The run folder (status, events, append as this owner), knowing this process holds
    /// its owner lock.
    pub fn dir(&self) -> &RunDir {
        &self.dir
    }

    /// The number of the last successful heartbeat (0 before the first).
    pub fn heartbeats(&self) -> u64 {
        self.count
    }

    /// Report `head` (the store's last acknowledged commit) in every heartbeat from now
    /// on: whoever replaces this owner records it as its `store_floor` (PROTOCOL §7.2).
    pub fn report_store_head(&mut self, head: u64) {
        self.store_head = Some(head);
    }

    /// How long until the self-fence deadline (zero once past it).
    pub fn time_to_self_fence(&self) -> Duration {
        self.lease
            .policy
            .self_fence_after()
            .saturating_sub(self.since_beat())
    }

    /// Time since the start of the last successful heartbeat-class write, on
    /// `CLOCK_BOOTTIME` (a suspended host's sleep counts).
    fn since_beat(&self) -> Duration {
        Duration::from_nanos(boottime_ns().saturating_sub(self.beat_ns))
    }

    /// `FENCED` once fenced or past the self-fence deadline (which fences). Call it right
    /// before anything that must count only while this owner holds the run.
    pub fn check_live(&mut self) -> Result<(), FsError> {
        if self.fenced.is_none() {
            let now = boottime_ns();
            if must_self_fence(
                &self.lease.policy,
                Duration::from_nanos(self.beat_ns),
                Duration::from_nanos(now),
            ) {
                self.fenced = Some(lease_core::lapse_reason(
                    &self.lease.policy,
                    Duration::from_nanos(now.saturating_sub(self.beat_ns)),
                ));
            }
        }
        match &self.fenced {
            None => Ok(()),
            Some(reason) => Err(FsError::Lease(LeaseError::Fenced {
                run: self.lease.run_id.to_string(),
                generation: self.lease.generation,
                detail: reason.clone(),
            })),
        }
    }

    /// The next heartbeat at wall time `now` (number [`OwnedRun::heartbeats`] + 1). Past the
    /// self-fence deadline nothing is written (`FENCED`); a heartbeat answered `FENCED`
    /// (a higher generation exists) fences for good. On success the beat's start becomes
    /// the self-fence reference. Another failure (I/O) changes nothing: retry before the
    /// deadline ([`OwnedRun::time_to_self_fence`]).
    pub fn heartbeat(&mut self, now: Timestamp) -> Result<(), FsError> {
        self.check_live()?;
        let started = boottime_ns();
        match self
            .dir
            .heartbeat(&self.lease, now, self.count + 1, self.store_head)
        {
            Ok(()) => {
                self.beat_ns = self.beat_ns.max(started);
                self.count += 1;
                Ok(())
            }
            Err(e) => {
                if let Some(LeaseError::Fenced { detail, .. }) = e.lease() {
                    self.fenced = Some(detail.clone());
                }
                Err(e)
            }
        }
    }

    /// Whether the next heartbeat is due: the policy's heartbeat interval has passed since
    /// the start of the last successful heartbeat-class write (on `CLOCK_BOOTTIME`, so a
    /// wall clock stepped back or forward changes nothing). A loop that calls
    /// [`OwnedRun::heartbeat`] whenever this says so keeps the lease (a beat is due well
    /// before the self-fence deadline: the policy requires `heartbeat < self_fence_after`).
    pub fn heartbeat_due(&self) -> bool {
        self.since_beat() >= self.lease.policy.heartbeat()
    }

    /// Append an event of `event_type` with `payload` at wall time `now`, as this owner,
    /// after the self-fence check ([`OwnedRun::check_live`]: past the deadline, or once
    /// fenced, nothing is written and the answer is `FENCED`). The answer is lease-core's
    /// ([`LeaseOps::append`]): durable and counting when `Ok`; `superseded_by` set means it
    /// counts but this owner was replaced meanwhile, so the run is fenced from here on. The
    /// tail of the last append is passed on as the next one's hint.
    ///
    /// `payload` is anything serde serializes (a `serde_json::Value`, a struct deriving
    /// `Serialize`, a `&str`); one that cannot be serialized as JSON (a map with non-string
    /// keys) is `ARGUMENT_INVALID` before anything is checked or written.
    pub fn append(
        &mut self,
        event_type: Identity,
        payload: impl serde::Serialize,
        now: Timestamp,
    ) -> Result<lease_core::ops::Appended, FsError> {
        let payload = serde_json::to_value(payload).map_err(|e| {
            FsError::Lease(LeaseError::ArgumentInvalid {
                what: "payload",
                reason: format!("cannot be written as JSON: {e}"),
            })
        })?;
        self.check_live()?;
        let r = self.dir.append(
            &self.lease,
            lease_core::ops::AppendParams {
                event_type,
                payload,
                now,
                tail_hint: self.tail.clone(),
            },
        );
        match &r {
            Ok(a) => {
                self.tail = Some((a.sequence, a.hash.clone()));
                if let Some(g) = a.superseded_by {
                    self.fenced = Some(format!("superseded by generation {g}"));
                }
            }
            Err(e) => {
                if let Some(LeaseError::Fenced { detail, .. }) = e.lease() {
                    self.fenced = Some(detail.clone());
                }
            }
        }
        r
    }

    /// Release the lease at wall time `now` (with `seal`, the store's seal, if the run has
    /// one), then let the owner lock go. Refused with `FENCED` once fenced (nothing is
    /// written). Returns the release epoch's generation.
    pub fn release(mut self, now: Timestamp, seal: Option<Seal>) -> Result<Generation, FsError> {
        self.check_live()?;
        self.dir.release(ReleaseParams {
            lease: self.lease.clone(),
            now,
            seal,
        })
    }
}
