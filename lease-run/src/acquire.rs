//! Owning a run the way an operator asks for it: [`Run::acquire`].
//!
//! [`Run::open`] makes **one** attempt with fixed options. `acquire` decides, from what an
//! observer sees of the run, how to attempt it ([`Acquire`]: claim, retire a definitely
//! dead owner, take over a stale one automatically or exactly), retries when the run
//! changed under an attempt, waits while it is held if asked to ([`Wait`]), and refuses a
//! held run with a typed [`Held`] that says who holds it and the one next step
//! ([`NextStep`]). `runlease run` is this function plus rendering; a library user gets the
//! same decisions.
//!
//! The automatic takeover is decided by lease-core's [`StaleWatch`] fed with this
//! process's `CLOCK_BOOTTIME`: the owner's record must stay unchanged for its
//! `stale_after` on *our* clock (no other host's wall clock decides).

use crate::clock::boottime_ns;
use crate::error::RunError;
use crate::run::{OpenOptions, Run};
use lease_core::ops::{Expectation, Head, Status, StatusView};
use lease_core::watch::{StaleWatch, Verdict, watch_key};
use lease_core::{Code, LeaseOps};
use lease_fs::lock::{probe_owner_lock, probe_owner_lock_in};
use lease_fs::{FsError, RealFs, RunDir, run_id_of};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How to own the run ([`Run::acquire`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquire {
    /// Claim a free run; a held one is refused (or waited for).
    Claim,
    /// Claim, or retire a definitely-dead owner (same boot, process gone, owner lock free;
    /// with etcd: its etcd lease is gone) and claim.
    ClaimOrRetireDead,
    /// Claim, or take over an owner that is stale (on this observer's wall clock) once its
    /// record stayed unchanged for its `stale_after` on this process's monotonic clock
    /// (an `automatic` takeover, PROTOCOL §7.4).
    TakeoverWhenStale,
    /// Both of the above: retire a dead owner, take over a stale one.
    ClaimOrReplace,
    /// Exact takeover of a stale owner as observed by an operator (`operator` trigger):
    /// refused if the owner is fresh or the observation differs.
    Takeover(Expectation),
}

impl Acquire {
    /// The mode for the two `runlease run` flags.
    pub fn from_flags(retire_dead: bool, takeover_stale: bool) -> Acquire {
        match (retire_dead, takeover_stale) {
            (false, false) => Acquire::Claim,
            (true, false) => Acquire::ClaimOrRetireDead,
            (false, true) => Acquire::TakeoverWhenStale,
            (true, true) => Acquire::ClaimOrReplace,
        }
    }

    fn retire_dead(&self) -> bool {
        matches!(self, Acquire::ClaimOrRetireDead | Acquire::ClaimOrReplace)
    }

    fn takeover_stale(&self) -> bool {
        matches!(self, Acquire::TakeoverWhenStale | Acquire::ClaimOrReplace)
    }
}

/// Whether to wait while the run is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Refuse at once.
    No,
    /// Wait until this instant, then refuse.
    Until(Instant),
    /// Wait as long as it takes.
    Forever,
}

/// After an attempt that did not own the run: whether, and how long, to pause before the
/// next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pause {
    /// Not waiting at all ([`Wait::No`]).
    NotWaiting,
    /// The deadline has passed.
    TimedOut,
    /// This long: `poll`, or less to meet the deadline, but at least 10 ms.
    For(Duration),
}

impl Wait {
    /// The pause at `now` before the next attempt, polling every `poll`.
    fn pause(self, now: Instant, poll: Duration) -> Pause {
        let until = match self {
            Wait::No => return Pause::NotWaiting,
            Wait::Until(t) => Some(t),
            Wait::Forever => None,
        };
        if until.is_some_and(|t| now >= t) {
            return Pause::TimedOut;
        }
        let remaining = until.map_or(poll, |t| t.saturating_duration_since(now));
        Pause::For(poll.min(remaining).max(Duration::from_millis(10)))
    }
}

/// How the run was obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquired {
    /// Claimed (free, or freed by an owner that released meanwhile).
    Claimed,
    /// A definitely-dead owner was retired (when the claim's generation is beyond
    /// `from`'s successor; otherwise the owner released meanwhile) and the run claimed.
    RetiredDead {
        /// The head that was dead.
        from: Head,
    },
    /// A stale owner was taken over.
    TookOver {
        /// The head that was taken over.
        from: Head,
        /// How long its record was watched unchanged (`None`: an operator's exact
        /// takeover).
        watched: Option<Duration>,
    },
}

/// The one next step for a held run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NextStep {
    /// Wait for the owner (or ask it to release).
    Wait,
    /// The owner is definitely dead: retire it (`--retire-dead`, `runlease retire`).
    RetireDead,
    /// The owner is stale: take it over (`--takeover-stale`, or an exact
    /// `runlease takeover` with the observation `runlease status` prints).
    TakeoverStale,
    /// The stale owner's process `pid` still holds the owner lock and the store on this
    /// host (stopped or stuck?): resume it (it fences itself, kills its command and exits
    /// 75) or end it, then replace it.
    ResumeOrEndOwner {
        /// The recorded owner process.
        pid: u32,
    },
    /// The run is free, but a process on this host still holds its owner lock (an owner
    /// starting or stopping, or a stopped one already replaced, which also still holds
    /// the store): wait, or resume or end that process.
    WaitForLockHolder,
    /// The holder is the owner this process runs under (`RUNLEASE_OWNER` of the same
    /// `RUNLEASE_RUN`): a nested acquire of the same run would wait for itself. Never
    /// waited for.
    NestedRun,
}

/// A refusal of a held run: who holds it and the next step.
#[derive(Debug, Clone)]
pub struct Held {
    /// `RUN_ALREADY_ACTIVE`, `RUN_STALE_REQUIRES_TAKEOVER`, `RUN_DEAD_REQUIRES_RETIREMENT`,
    /// `RETIRE_REFUSED_NOT_DEAD` or `OWNER_LOCK_HELD` (all 76).
    pub code: Code,
    /// The run id.
    pub run: String,
    /// What an observer saw of the run when it was refused.
    pub view: StatusView,
    /// Only the kernel owner lock said "held" (no claim was refused by the chain).
    pub lock_only: bool,
    /// What to do next.
    pub next: NextStep,
    /// With [`Wait::Until`]: how long this acquire waited before giving up.
    pub gave_up_after: Option<Duration>,
}

/// What [`Run::acquire`] reports while it waits or watches.
#[derive(Debug)]
#[non_exhaustive]
pub enum Progress<'a> {
    /// Held; waiting since `elapsed`.
    Waiting {
        /// The refusal the last attempt got.
        held: &'a Held,
        /// Time since the acquire began.
        elapsed: Duration,
    },
    /// The authority did not answer the last attempt (`UNAVAILABLE`: an etcd cluster
    /// without a leader, a member down; or `OUTCOME_UNKNOWN`: a write of it was sent and
    /// not answered, which the next attempt adopts if it landed); a waiting acquire tries
    /// again until its deadline.
    Unavailable {
        /// What the last attempt got.
        error: &'a RunError,
        /// Time since the acquire began.
        elapsed: Duration,
    },
    /// Watching a stale owner's record before an automatic takeover.
    Watching {
        /// The watched head.
        head: &'a Head,
        /// How long it has been unchanged.
        watched: Duration,
        /// Its owner's `stale_after` (a takeover needs strictly more).
        needed: Duration,
    },
}

/// Hooks of [`Run::acquire`]: progress reports and a way to stop. Both default to
/// nothing; `()` is the observer that observes nothing.
pub trait AcquireObserver: Send {
    /// A progress report (e.g. to draw a status line).
    fn progress(&mut self, _p: Progress<'_>) {}
    /// Called before each attempt; `false` stops the acquire with
    /// [`AcquireError::Stopped`] (e.g. a signal arrived). Nothing is held then.
    fn proceed(&mut self) -> bool {
        true
    }
}

impl AcquireObserver for () {}

/// Why [`Run::acquire`] did not own the run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// The run is held (see [`Held::next`]).
    #[error("run {} is held ({:?})", .0.run, .0.next)]
    Held(Box<Held>),
    /// [`AcquireObserver::proceed`] said stop; nothing was claimed.
    #[error("the acquire was stopped before the run was owned; nothing was claimed")]
    Stopped,
    /// Any other refusal or failure of an attempt.
    #[error(transparent)]
    Run(#[from] RunError),
}

impl AcquireError {
    /// The stable code: a held run's refusal code, else the attempt's; `None` when
    /// stopped (the observer that stopped it knows why).
    pub fn code(&self) -> Option<Code> {
        match self {
            AcquireError::Held(h) => Some(h.code),
            AcquireError::Stopped => None,
            AcquireError::Run(e) => Some(e.code()),
        }
    }
}

/// Kernel-lock wait of the first attempt.
const FIRST_LOCK_TIMEOUT: Duration = Duration::from_millis(200);
/// Longest pause between two attempts while waiting.
const MAX_WAIT_POLL: Duration = Duration::from_secs(1);

/// Whether `owner_id` of the run at `abs` is the owner this process runs under: the
/// environment a runlease owner gives its command (`RUNLEASE_OWNER`, `RUNLEASE_RUN`).
///
/// The folders are compared by identity (device and inode), never by resolving a path to
/// open it.
pub fn is_our_own_owner(owner_id: &str, abs: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    id(abs).is_some_and(|folder| is_our_own_owner_in(owner_id, folder))
}

/// [`is_our_own_owner`] of the run folder whose `(st_dev, st_ino)` is `folder` (a held
/// root's [`RealFs::root_id`]): `RUNLEASE_RUN` is stat-ed only to compare it.
fn is_our_own_owner_in(owner_id: &str, folder: (u64, u64)) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Ok(me), Some(run)) = (
        std::env::var("RUNLEASE_OWNER"),
        std::env::var_os("RUNLEASE_RUN"),
    ) else {
        return false;
    };
    owner_id == me && std::fs::metadata(run).is_ok_and(|m| (m.dev(), m.ino()) == folder)
}

/// One attempt's outcome.
enum Attempt {
    Owned(Box<(Run, Acquired)>),
    /// Held; `waited` says the attempt already paused (on the kernel lock).
    Held {
        held: Box<Held>,
        waited: bool,
    },
    /// Something changed (or an automatic takeover is still watching); decide again.
    Again,
}

impl Run {
    /// Own the run at the absolute `path` as `how` says, waiting while it is held as
    /// `wait` says (module docs). `opts` are the options of each attempt's [`Run::open`];
    /// its `retire_dead`, `takeover`, `takeover_watched` and `lock_timeout` are set per
    /// attempt. Every refusal leaves the run as it was.
    pub async fn acquire(
        path: &Path,
        how: Acquire,
        wait: Wait,
        opts: OpenOptions,
        observer: &mut dyn AcquireObserver,
    ) -> Result<(Run, Acquired), AcquireError> {
        opts.validate(path)?;
        let began = Instant::now();
        // The observer's view of the lease (the folder itself, or etcd): the lock
        // probed, never held.
        let (p, create, authority, deadline, fence_after) = (
            path.to_path_buf(),
            opts.create,
            opts.authority.clone(),
            opts.step_deadline,
            opts.policy.self_fence_after(),
        );
        let held = opts.folder.clone();
        // The run folder is opened once here (or was, by the caller: `opts.folder`) and
        // every attempt's open works on that same directory (a duplicate of its
        // descriptor), never on a second lookup of `path`.
        let (view_of, held): (Arc<dyn crate::authority::LeaseAuthority>, Arc<RealFs>) =
            tokio::task::spawn_blocking(move || {
                // With `create`, the folder is made here as the first attempt would make it.
                let folder = match held {
                    Some(f) => {
                        let run_id = lease_fs::run_id_held(&p, &f)?;
                        RunDir::in_real(
                            Arc::new(
                                f.try_clone()
                                    .map_err(|e| FsError::io(run_id.as_str(), "dup", "", e))?,
                            ),
                            run_id,
                        )
                    }
                    None if create => RunDir::create(&p)?,
                    None => RunDir::open(&p)?,
                };
                let real = folder
                    .real_fs()
                    .cloned()
                    .ok_or_else(|| RunError::Io("the run folder is not on the real disk".into()))?;
                let run_id = folder.run_id().clone();
                let view = authority.connect(Arc::new(folder), run_id, deadline, fence_after)?;
                Ok::<_, RunError>((view, real))
            })
            .await
            .map_err(|e| RunError::from_join("the observer's open", &e))??;
        // One owner id for every attempt: an attempt whose claim committed but whose
        // answer was lost is then found by the next one as its own (lease-core's adoption).
        let owner_id = match opts.owner_id.clone() {
            Some(id) => id,
            None => crate::new_owner_id()?,
        };
        let opts = OpenOptions {
            folder: Some(held),
            owner_id: Some(owner_id),
            ..opts
        };
        let status = |probe: bool| {
            let v = view_of.clone();
            async move {
                tokio::task::spawn_blocking(move || {
                    let now = crate::clock::wall_now()?;
                    let view = v.status(now, probe)?;
                    if let Status::Invalid(e) = view.status {
                        return Err(RunError::from(e));
                    }
                    Ok(view)
                })
                .await
                .map_err(|e| RunError::from_join("a status read", &e))?
            }
        };
        let poll = opts.policy.heartbeat().min(MAX_WAIT_POLL);
        let mut lock_timeout = FIRST_LOCK_TIMEOUT;
        // The clock a beat must be stamped on for the watch to start at its stamp (the
        // same-clock rule, PROTOCOL §10): this host's, for a folder; none for etcd.
        let mut watch = StaleWatch::on_clock(view_of.clock_domain());
        loop {
            if !observer.proceed() {
                return Err(AcquireError::Stopped);
            }
            let attempt = match attempt(
                path,
                &how,
                &opts,
                lock_timeout,
                &mut watch,
                observer,
                &status,
            )
            .await
            {
                // The authority did not answer (an etcd cluster without a leader, a member
                // down): a waiting acquire keeps waiting until its deadline (issue #31).
                // Also when a write of the attempt went unanswered (`OUTCOME_UNKNOWN`): the
                // next attempt, with the same owner id, adopts an epoch it created. And
                // when the run changed while an attempt judged it (`CONCURRENT_CHANGE`:
                // another host claimed it meanwhile): the next attempt observes it again.
                Err(AcquireError::Run(e))
                    if matches!(
                        e.code(),
                        Code::Unavailable | Code::OutcomeUnknown | Code::ConcurrentChange
                    ) =>
                {
                    let Pause::For(step) = wait.pause(Instant::now(), poll) else {
                        return Err(AcquireError::Run(e));
                    };
                    observer.progress(Progress::Unavailable {
                        error: &e,
                        elapsed: began.elapsed(),
                    });
                    tokio::time::sleep(step).await;
                    continue;
                }
                other => other?,
            };
            match attempt {
                Attempt::Owned(owned) => return Ok(*owned),
                Attempt::Again => continue,
                Attempt::Held { mut held, waited } => {
                    if held.next == NextStep::NestedRun {
                        return Err(AcquireError::Held(held));
                    }
                    let step = match wait.pause(Instant::now(), poll) {
                        Pause::For(step) => step,
                        over => {
                            if over == Pause::TimedOut {
                                held.gave_up_after = Some(began.elapsed());
                            }
                            return Err(AcquireError::Held(held));
                        }
                    };
                    observer.progress(Progress::Waiting {
                        held: &held,
                        elapsed: began.elapsed(),
                    });
                    if !waited {
                        tokio::time::sleep(step).await;
                    }
                    // Next time, wait on the kernel lock itself: we get it within 10 ms of
                    // the holder's exit.
                    lock_timeout = step;
                }
            }
        }
    }
}

async fn attempt<F, Fut>(
    path: &Path,
    how: &Acquire,
    opts: &OpenOptions,
    lock_timeout: Duration,
    watch: &mut StaleWatch,
    observer: &mut dyn AcquireObserver,
    status: &F,
) -> Result<Attempt, AcquireError>
where
    F: Fn(bool) -> Fut,
    Fut: std::future::Future<Output = Result<StatusView, RunError>>,
{
    let view = status(true).await?;
    let mut o = OpenOptions {
        lock_timeout,
        retire_dead: false,
        takeover: None,
        takeover_watched: None,
        ..opts.clone()
    };
    // A takeover is judged on this process's own monotonic clock only (PROTOCOL §10): the
    // head's record must stay unchanged for more than its `stale_after` while we watch,
    // whatever its wall age says (an owner whose clock is slow looks stale while it beats;
    // one whose clock is fast dates its beats in the future). A record that changes while
    // watched is an owner that is alive: held, and the wait policy decides.
    let watching = match (how, &view.status, &view.head) {
        (Acquire::Takeover(expect), _, Some(h))
            if h.is_active() && expect.mismatch(h).is_none() =>
        {
            Some(h)
        }
        (_, Status::Dead, Some(_)) if how.retire_dead() => None,
        (_, Status::Active | Status::Stale | Status::Dead, Some(h))
            if how.takeover_stale() && h.is_active() =>
        {
            Some(h)
        }
        _ => None,
    };
    // A process on this host holds the run's kernel owner lock (a live owner, or a stopped
    // one): no takeover can proceed around it, so nothing is watched and the open below
    // answers OWNER_LOCK_HELD at once, naming what to do (the lock is local to the run
    // folder whatever the authority). A momentary, non-blocking probe.
    let lock_held_here = watching.is_some()
        && !match &opts.folder {
            Some(f) => probe_owner_lock_in(f),
            None => probe_owner_lock(path),
        }
        .unwrap_or(true);
    let watching = watching.filter(|_| !lock_held_here);
    let mut took_over = None;
    if let Some(h) = watching {
        if watch.watching().is_some_and(|k| *k != watch_key(h)) {
            // The owner (or a successor) wrote while watched: it is alive, whatever its
            // wall age says. The next attempt watches the new record afresh.
            watch.reset();
            let run = view_of_run(path);
            return Ok(Attempt::Held {
                held: Box::new(Held {
                    code: Code::RunAlreadyActive,
                    run,
                    view,
                    lock_only: false,
                    next: NextStep::Wait,
                    gave_up_after: None,
                }),
                waited: false,
            });
        }
        match watch.observe(h, boottime_ns()) {
            Verdict::Watching { watched, needed } => {
                observer.progress(Progress::Watching {
                    head: h,
                    watched,
                    needed,
                });
                let poll = opts.policy.heartbeat().min(h.epoch.policy.heartbeat());
                tokio::time::sleep(
                    poll.min(needed.saturating_sub(watched) + Duration::from_millis(1)),
                )
                .await;
                return Ok(Attempt::Again);
            }
            Verdict::TakeOver { watched } => took_over = Some((h.clone(), watched)),
        }
    }
    let acquired = match (how, &view.status, &view.head, took_over) {
        (_, _, _, Some((from, watched))) => {
            o.takeover = Some(Expectation::of(&from));
            o.takeover_watched = Some(watched);
            Acquired::TookOver {
                from,
                watched: Some(watched),
            }
        }
        (Acquire::Takeover(expect), _, head, None) => {
            // Not the observation, or nothing to take over: the takeover's own refusal
            // says so, writing nothing.
            o.takeover = Some(expect.clone());
            match head {
                Some(h) => Acquired::TookOver {
                    from: h.clone(),
                    watched: None,
                },
                None => Acquired::Claimed,
            }
        }
        (_, Status::Dead, Some(h), None) if how.retire_dead() => {
            o.retire_dead = true;
            Acquired::RetiredDead { from: h.clone() }
        }
        _ => Acquired::Claimed,
    };
    // A replacement (takeover, retirement) verifies the whole run first inside the claim
    // step: bad input anywhere refuses it (65, naming the file) before any write.
    let err = match Run::open(path, o).await {
        Ok(run) => return Ok(Attempt::Owned(Box::new((run, acquired)))),
        Err(e) => e,
    };
    let run = view_of_run(path);
    let own = |view: &StatusView| {
        view.head.as_ref().is_some_and(|h| match &opts.folder {
            Some(f) => is_our_own_owner_in(h.epoch.owner_id.as_str(), f.root_id()),
            None => is_our_own_owner(h.epoch.owner_id.as_str(), path),
        })
    };
    match err.code() {
        Code::OwnerLockHeld => {
            // Another process on this host holds the kernel lock: a live owner, or one
            // that is starting, stopping, stopped or stuck (even if already replaced: it
            // also still holds the store). Never claimed around it (DECISIONS).
            let view = status(false).await?;
            let free = view.head.as_ref().is_none_or(|h| !h.is_active());
            let next = match (&view.status, &view.head) {
                _ if free => NextStep::WaitForLockHolder,
                _ if own(&view) => NextStep::NestedRun,
                (Status::Stale, Some(h)) => NextStep::ResumeOrEndOwner {
                    pid: h.epoch.holder.pid,
                },
                _ => NextStep::Wait,
            };
            let code = if free {
                Code::OwnerLockHeld
            } else if matches!(view.status, Status::Stale) {
                Code::RunStaleRequiresTakeover
            } else {
                Code::RunAlreadyActive
            };
            Ok(Attempt::Held {
                held: Box::new(Held {
                    code,
                    run,
                    view,
                    lock_only: true,
                    next,
                    gave_up_after: None,
                }),
                // Waiting on the kernel lock was the pause.
                waited: true,
            })
        }
        code @ (Code::RunAlreadyActive
        | Code::RunStaleRequiresTakeover
        | Code::RunDeadRequiresRetirement
        | Code::RetireRefusedNotDead) => {
            let view = status(true).await?;
            let next = match view.status {
                Status::Free => return Ok(Attempt::Again),
                _ if own(&view) => NextStep::NestedRun,
                Status::Dead => NextStep::RetireDead,
                Status::Stale => NextStep::TakeoverStale,
                _ => NextStep::Wait,
            };
            Ok(Attempt::Held {
                held: Box::new(Held {
                    code,
                    run,
                    view,
                    lock_only: false,
                    next,
                    gave_up_after: None,
                }),
                waited: false,
            })
        }
        // The owner's etcd lease outlived our watch (its last keep-alive came up to one
        // beat before its record stopped changing, and etcd's expiry lags a little): the
        // record is unchanged, so the watch stands and the takeover is tried again after
        // a short pause; etcd's own guard still refuses it while the lease lives. Resetting
        // here cost a whole second `stale_after` (failover 3.9 s at stale_after 2 s, found
        // by the engine store bench). A head that changed resets the watch at the next
        // attempt (`watch_key`).
        Code::TakeoverActiveRefused
            if !matches!(how, Acquire::Takeover(_)) && owner_lease_alive(&err) =>
        {
            let pause = opts.policy.heartbeat().min(MAX_WAIT_POLL) / 2;
            tokio::time::sleep(pause.max(Duration::from_millis(50))).await;
            Ok(Attempt::Again)
        }
        // The head changed under the watch: decide again (an operator's exact takeover
        // is not retried: its observation is the caller's).
        Code::TakeoverRace | Code::TakeoverActiveRefused
            if !matches!(how, Acquire::Takeover(_)) =>
        {
            watch.reset();
            Ok(Attempt::Again)
        }
        _ => Err(err.into()),
    }
}

/// Whether `err` is etcd's refusal of a takeover while the owner's etcd lease lives
/// (lease-etcd's `OwnerLeaseAlive`), as opposed to the core's refusal of a record that
/// was not watched long enough.
fn owner_lease_alive(err: &RunError) -> bool {
    #[cfg(feature = "etcd")]
    if matches!(
        err,
        RunError::Etcd(lease_etcd::EtcdError::OwnerLeaseAlive { .. })
    ) {
        return true;
    }
    let _ = err;
    false
}

/// The run id as text for a refusal (the folder's name; `?` if it has none).
fn view_of_run(path: &Path) -> String {
    run_id_of(path).map_or_else(|_| "?".into(), |r| r.to_string())
}
