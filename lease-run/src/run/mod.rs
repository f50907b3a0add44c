//! The run: open, commands, self-fence and watchdog, reaping, release.
//!
//! One file per job: [`Run`] and the state its tasks share (here); the open options
//! (`options`); each step timed under a deadline (`step`); open with its undo (`open`);
//! the preflight of an open (`preflight`); `run.json` writes (`status`); the heartbeat
//! task (`heartbeat`); the watchdog thread (`watchdog`); the store handle (`store`); the
//! spawn gate (`spawn`); reaping an older incarnation's commands (`reap`); release
//! (`release`).

mod background;
mod events;
mod heartbeat;
mod open;
mod options;
pub(crate) mod reap;
mod release;
mod serve;
mod signals;
mod spawn;
mod status;
mod step;
mod store;
mod watchdog;

pub use crate::procs::INCARNATION_VAR;
pub use heartbeat::{HeartbeatFailure, HeartbeatWarnings};
pub use options::{MIN_FENCE_MARGIN, OpenOptions};
pub use reap::{
    CgroupAudit, CommandAudit, CommandState, MAX_COMMAND_RECORDS, audit_cgroups, audit_commands,
    one_proc_scan,
};
pub use release::FinalStatus;
pub use signals::{CommandSignaller, Served};
pub use spawn::{Command, RunCommand};
pub use step::{StepCallback, StepName};
pub use store::RunStore;
pub use watchdog::WATCHDOG_TICK;

use crate::authority::LeaseAuthority;
use crate::clock::boottime_ns;
use crate::error::RunError;
use crate::fence::FenceCore;
use crate::procs::Tracked;
use crate::sync::lock_std;
#[cfg(doc)]
use lease_core::CommandRecord;
use lease_core::ops::OwnedLease;
use lease_core::{Generation, LeaseError, RunStatus, TimingPolicy, must_self_fence};
use lease_fs::RunDir;
use lease_fs::lock::OwnerLock;
use lease_sqlite::Store;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
#[cfg(feature = "test-hooks")]
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Where the fence stands.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FenceState {
    Live,
    /// Fenced; commands being killed.
    Fenced(String),
    /// Fenced and every tracked process is gone.
    Confirmed(String),
}

/// State shared by the async tasks and the watchdog OS thread (atomics and short std
/// mutexes only: the watchdog never waits on the tokio runtime).
struct Shared {
    run: String,
    policy: TimingPolicy,
    /// The beat, the fence flag and reason, the store slot and head ([`FenceCore`]).
    core: FenceCore<Store>,
    /// Set when the release stopped every command: the watchdog may end.
    stop: AtomicBool,
    /// Test hook: heartbeats are skipped (a stuck heartbeat).
    beats_suspended: AtomicBool,
    tracked: Mutex<Tracked>,
    fence_tx: watch::Sender<FenceState>,
    exit_on_fence: bool,
    /// The generation: the fencing token of every commit.
    generation: Generation,
    /// This incarnation's secret, in every command's environment as
    /// `RUNLEASE_INCARNATION`; its records carry only its digest
    /// ([`CommandRecord::incarnation_digest`]). 128 random bits, never written to disk.
    incarnation: String,
    /// The number of the next heartbeat, held for the whole of a beat
    /// ([`heartbeat::beat`]): the heartbeat task and the store server's durable beats take
    /// turns, so beat numbers only grow.
    beat_count: tokio::sync::Mutex<u64>,
    /// A release requested by a command over the store socket ([`Run::release_requested`]).
    release_request: tokio::sync::Notify,
    /// The store socket's name once served (`@runlease-store-…`, an abstract Unix socket),
    /// given to commands as [`crate::store_socket::SOCKET_VAR`].
    store_socket: std::sync::OnceLock<String>,
    /// The guard process ([`crate::guard`]), started at the first command when
    /// [`OpenOptions::guard`] names a program. Lock order: this, then `tracked`.
    guard: Mutex<GuardSlot>,
    /// Set at the `seal` step when the authority commits the store (issue #32): the
    /// engine's log state beside the view that `core` holds. Lock order: `core`'s store
    /// slot, then this.
    engine: std::sync::OnceLock<EngineSlot>,
    /// Set at the `seal` step when the store is deferred (issue #33): what its first
    /// access needs to open it ([`open::open_deferred`]).
    deferred: std::sync::OnceLock<DeferredStore>,
}

/// A store the open did not open (issue #33, PROTOCOL §9): the claimed-over head was a
/// clean release whose seal the preflight checked the store against, read-only. The first
/// access opens and checks it again; a release that finds it never opened carries the seal.
struct DeferredStore {
    /// The run's id (the store is bound to it).
    run_id: lease_core::RunId,
    /// The held run root; `store/` is opened beneath it.
    root: Arc<lease_fs::RealFs>,
    /// `store/` as a path, for messages.
    store_dir: std::path::PathBuf,
    /// The seal and floor the chain requires (the seal is always there).
    req: lease_core::seal::Requirements,
}

/// The engine-committed store's state beside its view (docs/PROTOCOL.md §18).
struct EngineSlot {
    /// The authority that creates the records.
    auth: Arc<dyn LeaseAuthority>,
    /// The log's tail and a commit whose answer was lost.
    log: Mutex<crate::engine_store::EngineLog>,
}

/// The guard: the program to start, the running one, and whether it was told it is done.
#[derive(Debug, Default)]
struct GuardSlot {
    program: Option<crate::guard::GuardProgram>,
    running: Option<crate::guard::Guard>,
    finished: bool,
}

impl Shared {
    /// A heartbeat that started at `started_ns` succeeded: the beat moves forward, then
    /// the guard (if one runs) learns the new self-fence deadline.
    fn note_beat(&self, started_ns: u64) {
        self.core.note_beat(started_ns);
        if let Some(g) = &lock_std(&self.guard).running {
            g.deadline(self.fence_deadline_ns());
        }
    }

    /// The self-fence deadline on `CLOCK_BOOTTIME` (ns): the start of the last successful
    /// heartbeat + `self_fence_after`, as [`Shared::lapsed`] judges it.
    fn fence_deadline_ns(&self) -> u64 {
        let after = u64::try_from(self.policy.self_fence_after().as_nanos()).unwrap_or(u64::MAX);
        self.core.beat_ns().saturating_add(after)
    }

    /// Hand command leader `pid` (our stopped, unreaped spawn gate) to the guard, starting
    /// the guard first if this is the first command: (1) the guard started (with the
    /// tracking lock held, so the watchdog never adopts it), (2) the current deadline,
    /// (3) the run's cgroup directory if it has one, (4) the leader's pidfd. Nothing to do
    /// without a guard program, or once the guard was told it is done.
    fn guard_leader(&self, pid: u32) -> Result<(), RunError> {
        let mut slot = lock_std(&self.guard);
        if slot.finished {
            return Ok(());
        }
        let Some(program) = slot.program.clone() else {
            return Ok(());
        };
        let io = |what: &str, e: std::io::Error| {
            RunError::os(
                format!(
                    "run {}: the guard process ({}): {what}",
                    self.run,
                    program.program.display()
                ),
                e,
            )
        };
        if slot.running.is_none() {
            let mut t = self.tracked();
            let g = crate::guard::Guard::start(&program).map_err(|e| io("cannot start it", e))?;
            t.guard = Some(g.id);
            let cg = t.cgroup.clone();
            drop(t);
            g.deadline(self.fence_deadline_ns());
            if let Some(cg) = cg {
                g.cgroup(&cg)
                    .map_err(|e| io("cannot hand it the cgroup", e))?;
            }
            slot.running = Some(g);
        }
        if let Some(g) = &slot.running {
            g.leader(pid)
                .map_err(|e| io(&format!("cannot hand it command {pid}"), e))?;
        }
        Ok(())
    }

    /// Tell the guard it is done (the commands were stopped, confirmed gone after a fence,
    /// or handed over): it exits without killing, and no later command starts one.
    fn guard_finish(&self) {
        let mut slot = lock_std(&self.guard);
        slot.finished = true;
        if let Some(g) = slot.running.take() {
            g.finish();
        }
    }

    fn is_fenced(&self) -> bool {
        self.core.is_fenced()
    }

    fn lapsed(&self, now_ns: u64) -> bool {
        // mutant watchdog_never_lapses: the run's watchdog never self-fences (§7.11, §10).
        if lease_core::mutant::mutant("watchdog_never_lapses") {
            return false;
        }
        must_self_fence(
            &self.policy,
            Duration::from_nanos(self.core.beat_ns()),
            Duration::from_nanos(now_ns),
        )
    }

    /// Time left until the self-fence deadline (zero once past it).
    fn until_lapse(&self, now_ns: u64) -> Duration {
        let age = Duration::from_nanos(now_ns.saturating_sub(self.core.beat_ns()));
        self.policy.self_fence_after().saturating_sub(age)
    }

    /// Record the first fence (sticky).
    fn fence(&self, reason: String) {
        if self.core.fence(reason.clone()) {
            tracing::warn!(run = %self.run, %reason, "run fenced");
            self.fence_tx.send_replace(FenceState::Fenced(reason));
        }
    }

    /// The error that reports this run fenced for `reason`.
    fn fenced_error(&self, reason: String) -> RunError {
        RunError::Fenced {
            run: self.run.clone(),
            reason,
        }
    }

    /// Fence for `reason` (recorded if it is the first) and the error that reports it.
    fn fence_and_refuse(&self, reason: String) -> RunError {
        self.fence(reason.clone());
        self.fenced_error(reason)
    }

    /// The first fence's reason (from the core: whoever sees the flag finds it, even
    /// before the watch channel is updated).
    fn fence_reason(&self) -> Option<String> {
        self.core.reason()
    }

    /// Errors once fenced or past the self-fence deadline (which fences).
    fn check_live(&self) -> Result<(), RunError> {
        if !self.is_fenced() && self.lapsed(boottime_ns()) {
            self.fence(self.lapse_reason());
        }
        match self.fence_reason() {
            None => Ok(()),
            Some(reason) => Err(self.fenced_error(reason)),
        }
    }

    /// Why a lapse fences, measured now: how long since the last successful heartbeat
    /// started (on `CLOCK_BOOTTIME`, so a suspended or stopped owner counts the pause),
    /// and the last failed heartbeat with its code and message if one failed since then
    /// (none: the heartbeats did not run, as in a stopped or starved owner).
    fn lapse_reason(&self) -> String {
        let age = boottime_ns().saturating_sub(self.core.beat_ns());
        let lapsed = lease_core::lapse_reason(&self.policy, Duration::from_nanos(age));
        match self.core.failure_since_beat() {
            Some(f) => format!(
                "{lapsed}; the last heartbeat failed with {}",
                f.code.prefixed(&f.message)
            ),
            None => lapsed,
        }
    }

    fn tracked(&self) -> std::sync::MutexGuard<'_, Tracked> {
        lock_std(&self.tracked)
    }

    /// The head to report in the next heartbeat (read before it starts).
    fn reported_store_head(&self) -> Option<u64> {
        // With the store in the engine the floor protects nothing: the engine's log is the
        // store, and every acknowledged commit is in it (§18). Beats carry no head.
        if self.engine.get().is_some() {
            return None;
        }
        self.core.reported_head()
    }

    /// The error a commit gate or a closed handle reports once fenced.
    fn fenced_lease_error(&self, detail: String) -> LeaseError {
        LeaseError::Fenced {
            run: self.run.clone(),
            generation: self.generation,
            detail,
        }
    }
}

/// An open run: the lease is ours, `run.json` says `running`, the heartbeat, the
/// self-fence timer and the watchdog are running.
pub struct Run {
    dir: Arc<RunDir>,
    auth: Arc<dyn LeaseAuthority>,
    lease: OwnedLease,
    lock: Option<OwnerLock>,
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    current: Mutex<RunStatus>,
    opts: OpenOptions,
    path: PathBuf,
    /// OQ-5: the takeover that opened this run may have replaced a live owner; commands
    /// start once `CLOCK_BOOTTIME` reaches this (ns), after that owner's self-fence.
    commands_after: Option<u64>,
    /// Dropping this handle releases the run in the background (cleared once a release
    /// took it over, or for the copy the background release itself works on).
    armed: bool,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("path", &self.path)
            .field("generation", &self.lease.generation)
            .finish_non_exhaustive()
    }
}

impl Run {
    /// Who superseded this owner ([`crate::superseded_by`] of its generation): after a
    /// fence, whether it was taken over or retired, by whom and when. `None` when nobody
    /// did (it fenced itself on a lapse) or the next epoch cannot be read. Read-only.
    pub fn superseded_by(&self) -> Option<crate::Superseded> {
        crate::superseded_by(&*self.auth, self.lease.generation)
    }
}

impl Run {
    /// The run's generation (the fencing token).
    pub fn generation(&self) -> Generation {
        self.lease.generation
    }

    /// The lease.
    pub fn lease(&self) -> &OwnedLease {
        &self.lease
    }

    /// How long [`Run::spawn`] still waits before it starts a command: non-zero only when
    /// the takeover that opened this run may have replaced a live owner (its heartbeat
    /// changed after the takeover's last look, PROTOCOL §7.4 step 11, OQ-5), until that
    /// owner's self-fence has surely stopped it and its commands.
    pub fn commands_wait(&self) -> std::time::Duration {
        let now = boottime_ns();
        self.commands_after.map_or(std::time::Duration::ZERO, |at| {
            std::time::Duration::from_nanos(at.saturating_sub(now))
        })
    }

    /// The run folder (`run.json`, command records, owner lock, store; with the default
    /// authority also the lease).
    pub fn dir(&self) -> &RunDir {
        &self.dir
    }

    /// The lease's authority (the run folder, or an etcd cluster): status, events and
    /// the other lease operations of this run.
    pub fn authority(&self) -> &Arc<dyn LeaseAuthority> {
        &self.auth
    }

    /// The cgroup v2 directory holding this incarnation's commands, if one could be
    /// created (see [`OpenOptions::cgroup`]).
    pub fn cgroup(&self) -> Option<PathBuf> {
        self.shared.tracked().cgroup.clone()
    }

    /// The run folder's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How long until the self-fence deadline (zero once past it): `self_fence_after`
    /// minus the age of the start of the last successful heartbeat (CLOCK_BOOTTIME).
    pub fn time_to_self_fence(&self) -> Duration {
        self.shared.until_lapse(boottime_ns())
    }

    /// Errors with [`RunError::Fenced`] once the run is fenced or its last successful
    /// heartbeat started more than `self_fence_after` ago (CLOCK_BOOTTIME). Call it right
    /// before any commit.
    pub fn check_live(&self) -> Result<(), RunError> {
        self.shared.check_live()
    }

    /// Resolves when the run is fenced **and** every tracked command process is gone,
    /// with the fence as an error.
    pub async fn fenced(&self) -> RunError {
        let mut rx = self.shared.fence_tx.subscribe();
        loop {
            if let FenceState::Confirmed(reason) = &*rx.borrow_and_update() {
                return self.shared.fenced_error(reason.clone());
            }
            if rx.changed().await.is_err() {
                return self.shared.fenced_error("the watchdog ended".into());
            }
        }
    }

    /// Fault injection for tests: skip heartbeats from now on (a stuck heartbeat), so the
    /// run self-fences after `self_fence_after`. Only with the `test-hooks` feature.
    #[cfg(feature = "test-hooks")]
    pub fn suspend_heartbeats(&self) {
        self.shared.beats_suspended.store(true, Ordering::SeqCst);
    }
}

impl Drop for Run {
    /// Dropping a run that was not released (an early `?`, a panic, a cancelled task)
    /// stops its heartbeat at once and releases it as `failed` in the background: a thread
    /// of its own (with a runtime of its own, so it works whatever state the caller's
    /// runtime is in) runs [`Run::release`]'s steps, commands stopped first. A later
    /// [`Run::open`] of the same path in this process waits for it ([`Run::settle`]). A
    /// fenced run is not released (the lease is someone else's); the watchdog finishes the
    /// kill. If the process exits before the background release is done, the run is left
    /// as after a crash: its owner is dead, and `retire` (or `open` with `retire_dead`)
    /// frees it.
    fn drop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        if !std::mem::take(&mut self.armed) || self.shared.is_fenced() {
            return;
        }
        let run = Run {
            dir: self.dir.clone(),
            auth: self.auth.clone(),
            lease: self.lease.clone(),
            lock: self.lock.take(),
            shared: self.shared.clone(),
            tasks: Vec::new(),
            current: Mutex::new(lock_std(&self.current).clone()),
            opts: self.opts.clone(),
            path: self.path.clone(),
            commands_after: self.commands_after,
            armed: false,
        };
        let pending = background::Pending::start(&self.path);
        let name = self.shared.run.clone();
        let spawned = std::thread::Builder::new()
            .name("lease-run-drop-release".into())
            .spawn(move || {
                let _pending = pending;
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::warn!(run = %name, error = %e, "a dropped run cannot be released: no runtime; it self-fences");
                        return;
                    }
                };
                let r = rt.block_on(run.release_with(
                    FinalStatus::Failed {
                        detail: DROPPED_DETAIL.into(),
                    },
                    false,
                ));
                match r {
                    Ok(g) => tracing::info!(run = %name, generation = g.get(), "a dropped run was released as failed"),
                    Err(e) => tracing::warn!(run = %name, error = %e, "the release of a dropped run failed"),
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(run = %self.shared.run, error = %e, "a dropped run cannot be released: no thread; it self-fences");
        }
    }
}

/// The `failed` detail of a run released because its handle was dropped unreleased.
const DROPPED_DETAIL: &str = "the run's handle was dropped without a release (an early return, a panic or a cancelled task); it was released in the background";
