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
//!   head that changed meanwhile is a race, never a wrong replacement;
//! - `run.json` follows the owner change ([`RunJsonUpdate`]): it is rewritten `failed`,
//!   as the generation that replaced the owner, with a detail saying what happened, so it
//!   no longer says `running` for a generation that lost the lease. A takeover writes it
//!   while its own generation is still the active head (before it releases: no other
//!   owner can claim in between); a retirement writes it holding the kernel owner lock
//!   (no owner on this host can claim in between). An unreadable `run.json` or one
//!   written by a newer generation is left as it is (reported by `doctor`, never
//!   repaired).
//!
//! ```no_run
//! use lease_run::replace::Replacer;
//! use lease_run::Authority;
//! # fn main() -> Result<(), lease_run::RunError> {
//! let r = Replacer::for_retire(std::path::Path::new("/srv/runs/job-1"), &Authority::RunFolder)?;
//! let now = lease_run::wall_now()?;
//! if let Some(owner) = r.observe(now)? {
//!     let owner_id = lease_core::Identity::new("ops-retire-1").unwrap();
//!     let retired = r.retire(&owner, owner_id, now)?;
//!     println!("retired generation {}; its events count through {}", retired.retired, retired.cutoff);
//!     println!("run.json: {:?}", retired.run_json);
//! }
//! # Ok(()) }
//! ```

use crate::authority::{Authority, FolderAuthority, LeaseAuthority};
use crate::clock::boottime_ns;
use crate::error::RunError;
use lease_core::LeaseError;
use lease_core::ops::{
    Expectation, Head, ReleaseParams, Request, Response, RetireParams, Status, StatusView,
    TakeoverParams, TakeoverTrigger,
};
use lease_core::watch::{StaleWatch, Verdict, watch_key};
use lease_core::{
    EpochState, FileRef, Generation, Identity, LeaseOps, RetirementRecord, RunState, RunStatus,
    Timestamp, decode_for, encode,
};
use lease_fs::lock::OwnerLock;
use lease_fs::{ProcLiveness, RunDir, primitives, this_holder};
use std::path::{Path, PathBuf};
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
    /// The takeover may have replaced a live owner (its heartbeat changed after the
    /// takeover's last look, PROTOCOL §7.4 step 11, OQ-5): that owner is fenced at its next
    /// heartbeat, or stops at its self-fence.
    pub preempted: Option<lease_core::ops::Preempted>,
    /// What became of `run.json` (written before the release, as [`TakenOver::generation`]).
    pub run_json: RunJsonUpdate,
}

/// What a retirement did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retired {
    /// The retired generation.
    pub retired: Generation,
    /// The new, free (`retired`) epoch.
    pub generation: Generation,
    /// The cutoff recorded for the retired generation (its events up to this sequence
    /// count).
    pub cutoff: u64,
    /// What became of `run.json` (written as [`Retired::generation`]).
    pub run_json: RunJsonUpdate,
}

/// What a replacement did to `run.json` (the advisory record of PROTOCOL §4 that
/// `runlease run` writes), so it does not keep saying `running` for the generation that
/// lost the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunJsonUpdate {
    /// Rewritten `failed` as `generation` (the replacement's), `detail` saying what
    /// happened; the heartbeat time of the replaced record kept.
    Written {
        /// The generation it was written as.
        generation: Generation,
    },
    /// Left as it was: no run folder on this host (the lease in etcd), `run.json`
    /// unreadable (reported by `doctor`, never repaired) or written by a newer generation,
    /// the owner lock held by another process, the head moved on, or the write failed.
    Left {
        /// Why, in one sentence.
        why: String,
    },
}

/// The lease of one run, opened to replace its owner (see the module docs).
pub struct Replacer {
    auth: Arc<dyn LeaseAuthority>,
    /// The run folder on this host, if any (`run.json` lives there whatever the authority).
    folder: Option<Arc<RunDir>>,
    path: PathBuf,
    lock: Option<OwnerLock>,
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
                // The folder is opened once (`O_NOFOLLOW|O_DIRECTORY`) and held: the owner
                // lock, the liveness probe, every record and `run.json` are reached beneath
                // that descriptor, never by looking `path` up again.
                let mut dir = RunDir::open(path)?;
                let held = dir
                    .real_fs()
                    .cloned()
                    .ok_or_else(|| RunError::Io("the run folder is not on the real disk".into()))?;
                // No `owner.lock` yet: no owner on this host ever took it, and creating it
                // would be a write by what may turn out a refusal (issue #28: a retirement
                // of a free run created it). The lock is then taken, creating the file, only
                // to write run.json after a retirement (`follow_owner_change`).
                let lock_exists = dir.fs().exists(lease_fs::lock::LOCK_FILE).map_err(|e| {
                    RunError::from(lease_fs::FsError::io(
                        dir.run_id().as_str(),
                        "stat",
                        lease_fs::lock::LOCK_FILE,
                        e,
                    ))
                })?;
                let lock = if lock && lock_exists {
                    let l =
                        OwnerLock::acquire_timeout_in(&held, RETIRE_LOCK_TIMEOUT).map_err(|e| {
                            RunError::from(lease_fs::FsError::io(
                                dir.run_id().as_str(),
                                "lock",
                                lease_fs::lock::LOCK_FILE,
                                e,
                            ))
                        })?;
                    if l.is_some() {
                        // Holding the lock ourselves, its being held is no sign of life.
                        dir.set_liveness(Arc::new(ProcLiveness::in_root(&held).holding_lock()));
                    }
                    l
                } else {
                    None
                };
                let dir = Arc::new(dir);
                Ok(Replacer {
                    auth: Arc::new(FolderAuthority(dir.clone())),
                    folder: Some(dir),
                    path: path.to_path_buf(),
                    lock,
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
                    // run.json stays in the folder, if this host has one.
                    folder: RunDir::open(path).ok().map(Arc::new),
                    path: path.to_path_buf(),
                    lock: None,
                })
            }
        }
    }

    /// The lease (for reads the caller wants to show).
    pub fn lease(&self) -> &dyn LeaseAuthority {
        &*self.auth
    }

    /// Observe the owner at wall time `now` (liveness probed) and judge the replacement
    /// by the one admission rule ([`crate::admission::judge`], the rule `runlease run`,
    /// `status` and `doctor` use): an invalid head is the error (`RECORD_INVALID` and the
    /// like: nothing may replace the owner until it is repaired); a free run is `None`;
    /// then rollback evidence (`run.json`, the newest event ahead of the chain:
    /// `CHAIN_BROKEN`, 65, since a replacement would issue generations a second time), the
    /// folder's layout and command records, every record and both chains (a replacement
    /// finalizes the old owner's cutoff over the whole log), names above the head: any
    /// refusal is the error (65, or 76 for an unprovable command, naming the file), and
    /// nothing was written.
    pub fn observe(&self, now: Timestamp) -> Result<Option<Observed>, RunError> {
        let view = self.auth.status(now, true)?;
        if let Status::Invalid(e) = &view.status {
            return Err(RunError::Lease(e.clone()));
        }
        let Some(head) = view.head.clone().filter(Head::is_active) else {
            return Ok(None);
        };
        let action = if self.lock.is_some() {
            crate::admission::Action::Retire
        } else {
            crate::admission::Action::Takeover
        };
        let run_json = match &self.folder {
            Some(f) => Some(crate::admission::read_run_json_of(&*self.auth, f)?),
            None => None,
        };
        let folder = match (&self.folder, &run_json) {
            (Some(dir), Some(run_json)) => Some(crate::admission::Folder {
                dir,
                run_json,
                // The store is judged as the next claim will judge it (one rule for every
                // writer): read with SQLite `immutable`, and only when no write-ahead log is
                // beside it, so an owner that has it open (a live-looking one being taken
                // over) is never read under.
                store_root: dir.real_fs().map(|f| &**f),
            }),
            _ => None,
        };
        let admitted = crate::admission::judge(&*self.auth, folder, view, action)?;
        Ok(Some(Observed {
            view: admitted.view,
            head,
        }))
    }

    /// Retire exactly `owner`'s head if it is definitely dead (`RETIRE_REFUSED_NOT_DEAD`,
    /// 76, otherwise; `TAKEOVER_RACE`, 75, if the head changed), as `owner_id` at wall
    /// time `now`; then `run.json` is rewritten `failed` as the retirement's generation,
    /// holding the owner lock ([`RunJsonUpdate`]; with etcd the lock is taken for the
    /// write if it can be).
    pub fn retire(
        &self,
        owner: &Observed,
        owner_id: Identity,
        now: Timestamp,
    ) -> Result<Retired, RunError> {
        let holder = this_holder()?;
        let r = self.auth.retire(RetireParams {
            run_id: self.auth.run_id().clone(),
            owner_id: owner_id.clone(),
            holder: holder.clone(),
            policy: owner.head.epoch.policy,
            now,
            expect: Some(Expectation::of(&owner.head)),
        })?;
        let old = &owner.head.epoch;
        let detail = format!(
            "generation {} (owner {}, pid {} on {}) was found dead and retired as generation {}; its events count through sequence {}",
            r.retired, old.owner_id, old.holder.pid, old.holder.host, r.generation, r.cutoff
        );
        let run_json = self.follow_owner_change(
            Writer {
                generation: r.generation,
                owner_id: &owner_id,
                holder,
                state: EpochState::Retired,
            },
            detail,
        );
        // A retirement frees the run as a release does: compact if due (best-effort, never
        // this retirement's error; its order of writes is the prune's own, PROTOCOL §7.10),
        // so a crash loop whose owners are retired and never release stays bounded.
        let _ = crate::compact::after_release(
            &*self.auth,
            self.auth.folder(),
            r.generation,
            owner_id.clone(),
        );
        Ok(Retired {
            retired: r.retired,
            generation: r.generation,
            cutoff: r.cutoff,
            run_json,
        })
    }

    /// Watch the owner's record on this process's own `CLOCK_BOOTTIME` until it has stayed
    /// unchanged (generation, owner, heartbeat time and count) for more than the owner's
    /// `stale_after` (PROTOCOL §10: no other host's wall clock decides). Read-only.
    ///
    /// `expect` is the operator's observation (`takeover --expect-owner … --expect-heartbeat
    /// …`), a compare token as in the takeover itself (PROTOCOL §7.4 JUDGE): the same
    /// generation and owner with a heartbeat written after the one expected (a later time,
    /// or the same time with a higher count) is an owner that wrote since it was observed,
    /// alive: `TAKEOVER_ACTIVE_REFUSED` (76); any other difference when the watch starts
    /// (another generation or owner, a heartbeat the owner has not written, such as a date
    /// in the future or an earlier one) means the observation is wrong or out of date:
    /// `TAKEOVER_RACE` (75, "observe again"), nothing written. A record that changes
    /// *while watched* is an owner that is alive: `TAKEOVER_ACTIVE_REFUSED` (76), naming
    /// how long it was watched. `progress` is called before each pause with the
    /// time watched and the time needed. Returns the exact observation that was watched
    /// (its count filled in) and how long.
    ///
    /// To watch from this process's own look a moment ago, use
    /// [`watch_observed`](Self::watch_observed).
    pub fn watch(
        &self,
        expect: &Expectation,
        progress: impl FnMut(Duration, Duration),
    ) -> Result<(Expectation, Duration), RunError> {
        self.watch_from(expect, false, progress)
    }

    /// [`watch`](Self::watch) from `observed`, this process's own [`observe`](Self::observe)
    /// (`takeover --yes`, or the one confirmed at the prompt): the watch continues that
    /// look, so the same generation and owner with another heartbeat when the watch starts
    /// is a record that changed while watched, an owner that is alive:
    /// `TAKEOVER_ACTIVE_REFUSED` (76) after 0 ms (issue #17: a 100 ms-heartbeat owner
    /// beats between the look and the watch's first read). Another generation or owner is
    /// `TAKEOVER_RACE` (75).
    pub fn watch_observed(
        &self,
        observed: &Observed,
        progress: impl FnMut(Duration, Duration),
    ) -> Result<(Expectation, Duration), RunError> {
        self.watch_from(&Expectation::of(&observed.head), true, progress)
    }

    /// [`watch`](Self::watch) (`own`: false) and [`watch_observed`](Self::watch_observed)
    /// (`own`: true).
    fn watch_from(
        &self,
        expect: &Expectation,
        own: bool,
        mut progress: impl FnMut(Duration, Duration),
    ) -> Result<(Expectation, Duration), RunError> {
        let run = self.auth.run_id().to_string();
        // A beat stamped on this host's clock starts the watch at its stamp (PROTOCOL
        // §10, the same-clock rule): a same-boot owner that stopped long ago is taken over
        // at once, and the time left is measured on one clock.
        let mut watch = StaleWatch::on_clock(self.auth.clock_domain());
        let began = boottime_ns();
        loop {
            let view = self.auth.status(crate::clock::wall_now()?, false)?;
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
            // An owner that wrote is alive (76): a record that changed while watched, or
            // the same generation and owner with a heartbeat written after the look (this
            // process's own look: any other beat; the operator's: a later time, or the
            // same time with a higher count). Any other difference from the operator's
            // expectation (another generation or owner, a beat the owner has not written
            // such as a date in the future) is a race (75): observe again. Answering 75
            // for a later beat would send `status`'s own advice round in a loop for an
            // owner that beats but whose wall clock makes it look stale (PROTOCOL §10).
            let alive_after = match watch.watching() {
                Some(key) if *key != watch_key(&head) => {
                    Some(Duration::from_nanos(boottime_ns().saturating_sub(began)))
                }
                Some(_) => None,
                None => match expect.mismatch(&head) {
                    None => None,
                    Some(_)
                        if expect.generation.is_none_or(|g| g == head.generation())
                            && expect.owner_id == head.epoch.owner_id
                            && (own || wrote_since(expect, &head)) =>
                    {
                        Some(Duration::ZERO)
                    }
                    Some(why) => {
                        return Err(RunError::Lease(LeaseError::TakeoverRace {
                            run,
                            detail: format!(
                                "{why}: the expectation does not match generation {}'s record (owner {}, heartbeat {} #{}); nothing was written",
                                head.generation(),
                                head.epoch.owner_id,
                                head.heartbeat_at(),
                                head.heartbeat_count()
                            ),
                        }));
                    }
                },
            };
            if let Some(watched) = alive_after {
                return Err(RunError::Lease(LeaseError::TakeoverActiveRefused {
                    run,
                    held: Box::new(head.held_by()),
                    age_ms: crate::clock::wall_now()?.millis_since(head.heartbeat_at()),
                    stale_after_ms: head.epoch.policy.stale_after_ms(),
                    watched_ms: u64::try_from(watched.as_millis()).unwrap_or(u64::MAX),
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
    /// so the run is free for its next owner. `now` is read for each step. In between,
    /// while the takeover's generation is still the active head, `run.json` is rewritten
    /// `failed` as that generation ([`RunJsonUpdate`]).
    pub fn takeover_and_release(
        &self,
        owner: &Observed,
        expect: Expectation,
        watched: Duration,
        owner_id: Identity,
        now: impl Fn() -> Result<Timestamp, RunError>,
    ) -> Result<TakenOver, RunError> {
        let holder = this_holder()?;
        let (lease, preempted) = self.auth.takeover_reporting(TakeoverParams {
            run_id: self.auth.run_id().clone(),
            owner_id: owner_id.clone(),
            holder: holder.clone(),
            policy: owner.head.epoch.policy,
            now: now()?,
            expect,
            trigger: TakeoverTrigger::Operator {
                watched_unchanged_ms: u64::try_from(watched.as_millis()).unwrap_or(u64::MAX),
            },
        })?;
        let cutoff = self.read_cutoff(owner.head.generation());
        let old = &owner.head.epoch;
        let detail = format!(
            "generation {} (owner {}, pid {} on {}) was stale and taken over by an operator as generation {}, which released the run at once; {}",
            old.generation,
            old.owner_id,
            old.holder.pid,
            old.holder.host,
            lease.generation,
            match cutoff {
                Some(c) => format!("its events count through sequence {c}"),
                None => "its cutoff could not be read".into(),
            }
        );
        let run_json = self.follow_owner_change(
            Writer {
                generation: lease.generation,
                owner_id: &owner_id,
                holder,
                state: EpochState::Active,
            },
            detail,
        );
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
            preempted,
            run_json,
        })
    }

    /// Rewrite `run.json` after this replacer changed the owner (module docs), as `w`:
    /// only while the head is still `w`'s epoch (its active takeover, or its retirement)
    /// and, for a retirement, holding the owner lock. Order of writes: a temp file
    /// `.tmp-*` beside `run.json` is written and fsynced, renamed over `run.json`, and the
    /// run folder fsynced (`primitives::replace`, durable). A crash before the rename
    /// leaves the old `run.json` (and an orphan temp file, which `doctor` reports and
    /// `--clean-temp` removes); after it, the new one. Either way the chain already
    /// changed: `status` reads the owner from the chain, and a `run.json` written by an
    /// older generation than the head is out of date (PROTOCOL §4), which the next
    /// `runlease run` overwrites.
    fn follow_owner_change(&self, w: Writer<'_>, detail: String) -> RunJsonUpdate {
        let left = |why: String| RunJsonUpdate::Left { why };
        let Some(folder) = &self.folder else {
            return left("there is no run folder on this host".into());
        };
        // A retirement leaves the run free: only the owner lock keeps a new owner on
        // this host from claiming (and writing run.json) meanwhile.
        let mut taken = None;
        if w.state != EpochState::Active && self.lock.is_none() {
            // Beneath the held root of the folder (no second lookup of the run's path).
            let taking = match folder.real_fs() {
                Some(held) => OwnerLock::acquire_timeout_in(held, RETIRE_LOCK_TIMEOUT),
                None => OwnerLock::acquire_timeout(&self.path, RETIRE_LOCK_TIMEOUT),
            };
            match taking {
                Ok(Some(l)) => taken = Some(l),
                Ok(None) => {
                    return left("another process on this host holds the run's owner lock".into());
                }
                Err(e) => return left(format!("the owner lock cannot be taken: {e}")),
            }
        }
        let now = match crate::clock::wall_now() {
            Ok(n) => n,
            Err(e) => return left(e.to_string()),
        };
        let head = match self.auth.status(now, false) {
            Ok(v) => v.head,
            Err(e) => {
                return left(format!(
                    "the head cannot be read: {}",
                    e.code().prefixed(&e)
                ));
            }
        };
        let ours = head.as_ref().is_some_and(|h| {
            h.generation() == w.generation
                && h.epoch.state == w.state
                && h.epoch.owner_id == *w.owner_id
        });
        if !ours {
            return left(format!(
                "the run moved on from generation {} before run.json was written",
                w.generation
            ));
        }
        let previous = match crate::admission::read_run_json_of(&*self.auth, folder)
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            Ok(p) => p,
            Err(e) => return left(format!("{e}; it is left as it is (runlease doctor)")),
        };
        if let Some(p) = previous.as_ref().filter(|p| p.generation >= w.generation) {
            return left(format!(
                "run.json was written by generation {}, not older than {}",
                p.generation, w.generation
            ));
        }
        let record = RunStatus {
            run_id: self.auth.run_id().clone(),
            status: RunState::Failed,
            generation: w.generation,
            sealed_sequence: None,
            wake_at: None,
            holder: Some(w.holder),
            heartbeat_at: previous.and_then(|p| p.heartbeat_at),
            updated_at: now,
            detail: Some(truncate_detail(detail)),
        };
        let written = encode(&record).map_err(RunError::from).and_then(|b| {
            if self.auth.commits_in_engine() {
                // The engine's copy first, under the guard of this generation (issue #32).
                let put = self
                    .auth
                    .perform(lease_core::ops::Request::ReplaceGuarded {
                        file: FileRef::RunStatus,
                        bytes: b.clone(),
                        generation: w.generation,
                    })?;
                if put != lease_core::ops::Response::Done {
                    return Err(RunError::InvalidArgument(format!(
                        "the run moved on from generation {} before run.json was written",
                        w.generation
                    )));
                }
            }
            // The data fsynced before the rename, the folder not (issue #33, PROTOCOL §9:
            // the old run.json or the new, each whole, are both valid after a power loss).
            primitives::replace_whole(&**folder.fs(), &FileRef::RunStatus.path(), &b).map_err(|e| {
                RunError::from(lease_fs::FsError::io(
                    self.auth.run_id().as_str(),
                    "replace",
                    "run.json",
                    e,
                ))
            })
        });
        drop(taken);
        match written {
            Ok(()) => RunJsonUpdate::Written {
                generation: w.generation,
            },
            Err(e) => left(format!(
                "writing run.json failed: {}",
                e.code().prefixed(&e)
            )),
        }
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

/// Whether `head`'s heartbeat was written after the one `expect` names (the same owner
/// beat since that look): a later time, or the same time with a higher count.
fn wrote_since(expect: &Expectation, head: &Head) -> bool {
    let at = head.heartbeat_at();
    at > expect.heartbeat_at
        || (at == expect.heartbeat_at
            && expect
                .heartbeat_count
                .is_some_and(|c| head.heartbeat_count() > c))
}

/// Who changed the owner, for [`Replacer::follow_owner_change`].
struct Writer<'a> {
    /// The generation it created (a takeover's active epoch, a retirement).
    generation: Generation,
    owner_id: &'a Identity,
    holder: lease_core::Holder,
    /// The state of that epoch while `run.json` is written.
    state: EpochState,
}

/// `detail` cut to the record's limit (at a character boundary).
fn truncate_detail(mut d: String) -> String {
    let mut cut = lease_core::records::DETAIL_MAX_BYTES;
    if d.len() > cut {
        while !d.is_char_boundary(cut) {
            cut -= 1;
        }
        d.truncate(cut);
    }
    d
}
