//! The run: open, commands, self-fence and watchdog, reaping, release.

use crate::authority::{Authority, LeaseAuthority};
use crate::error::RunError;
use crate::fence::{Access, FenceCore, Tick, Tracking, fence_tick, gate, start_tracked};
use crate::procs::{self, Tracked, boottime_ns};
use crate::sync::lock_std;
use lease_core::Code;
use lease_core::LeaseOps;
use lease_core::canonical::MAX_RECORD_BYTES;
use lease_core::ops::{
    ClaimParams, Expectation, OwnedLease, ReleaseParams, RetireParams, Status, TakeoverParams,
    TakeoverTrigger,
};
use lease_core::{
    CommandRecord, Dir, FileRef, Generation, Identity, LeaseError, RunState, RunStatus, Seal,
    Timestamp, TimingPolicy, decode_for, encode, must_self_fence,
};
use lease_fs::lock::OwnerLock;
use lease_fs::{FsError, ProcLiveness, RealFs, RunDir, primitives, probe, run_id_of, this_holder};
use lease_sqlite::{Batch, Commit, Document, Expected, Store, StoreError};
use rustix::process::Signal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument;

/// How often the watchdog thread (and the async self-fence timer) check the deadline.
pub const WATCHDOG_TICK: Duration = Duration::from_millis(100);

/// The steps of [`Run::open`] and [`Run::release`], in order, as reported to
/// [`OpenOptions::on_step`] and named in tracing spans (`lease_run.step`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepName {
    /// Open: take the kernel owner lock.
    OwnerLock,
    /// Open: read the previous `run.json`.
    ReadStatus,
    /// Open: claim the lease (or retire a dead owner, then claim).
    Claim,
    /// Open: write `run.json` status `running`.
    RunJson,
    /// Open: start the heartbeat, the self-fence timer and the watchdog thread.
    Heartbeat,
    /// Open: create `store/`, `work/`, `tmp/`.
    Layout,
    /// Open: reap or refuse the previous incarnation's commands.
    Commands,
    /// Open: open the store `store/run.sqlite` (created only when the chain names no
    /// store), after reading the seal and floor from the lease chain.
    Store,
    /// Open: the seal check against the seal and floor ([`lease_core::seal::requirements`]).
    Seal,
    /// Open: write `run.json` live (seal cleared).
    Live,
    /// Release: stop the commands (TERM, grace, KILL).
    StopCommands,
    /// Release: stop the heartbeat.
    StopHeartbeat,
    /// Release: barrier: take the store away from every [`RunStore`] handle (waiting for a
    /// commit in flight), so no commit can start after it.
    Barrier,
    /// Release: seal the store (sealed sequence = its head, bound to its id and generation).
    SealStore,
    /// Release: write the final `run.json`.
    FinalStatus,
    /// Release: release the lease.
    ReleaseLease,
    /// Release: stop the watchdog and drop the owner lock.
    Unlock,
}

impl StepName {
    /// The step's name (`owner-lock`, `run.json`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            StepName::OwnerLock => "owner-lock",
            StepName::ReadStatus => "read-status",
            StepName::Claim => "claim",
            StepName::RunJson => "run.json",
            StepName::Heartbeat => "heartbeat",
            StepName::Layout => "layout",
            StepName::Commands => "commands",
            StepName::Store => "store",
            StepName::Seal => "seal",
            StepName::Live => "live",
            StepName::StopCommands => "stop-commands",
            StepName::StopHeartbeat => "stop-heartbeat",
            StepName::Barrier => "barrier",
            StepName::SealStore => "seal-store",
            StepName::FinalStatus => "final-status",
            StepName::ReleaseLease => "release-lease",
            StepName::Unlock => "unlock",
        }
    }
}

/// Called after each step with its duration (also after a step that failed).
pub type StepCallback = Arc<dyn Fn(StepName, Duration) + Send + Sync>;

/// Options of [`Run::open`].
#[derive(Clone)]
pub struct OpenOptions {
    /// Heartbeat, self-fence and stale timings (validated by [`TimingPolicy`]).
    pub policy: TimingPolicy,
    /// Create the run folder if it is missing (default: true).
    pub create: bool,
    /// When the current owner is definitely dead (same boot, process gone, owner lock
    /// free), retire it and claim (default: false: such a run is refused).
    pub retire_dead: bool,
    /// Exact takeover of a stale owner instead of a claim (operator trigger): the owner id
    /// and heartbeat observation (time, and count if given) the caller saw, e.g. from
    /// `LeaseOps::status`; the takeover refuses a fresh owner (`TAKEOVER_ACTIVE_REFUSED`, 76)
    /// and any other observation (`TAKEOVER_RACE`, 75). The kernel owner lock is taken
    /// first as always, so a stale owner still running on this host must end (or be
    /// fenced and release its lock) before this open can proceed. Default `None`.
    pub takeover: Option<Expectation>,
    /// With [`OpenOptions::takeover`]: the caller watched that observation unchanged for
    /// this long on its own `CLOCK_BOOTTIME`, so the takeover is `automatic` (PROTOCOL
    /// §7.4: refused unless this exceeds the owner's `stale_after`; skew-immune) instead of
    /// `operator`. Default `None` (operator).
    pub takeover_watched: Option<Duration>,
    /// How long to retry the kernel owner lock (default 200 ms).
    pub lock_timeout: Duration,
    /// Deadline of every single open/release step (default 10 s).
    pub step_deadline: Duration,
    /// SIGTERM-to-SIGKILL grace when stopping or reaping commands (default 2 s).
    pub term_grace: Duration,
    /// How long to wait for SIGKILLed processes to be gone (default 2 s).
    pub kill_wait: Duration,
    /// On a fence, exit the process with 75 once the commands are confirmed gone (from
    /// the watchdog thread). Default false: the library reports [`RunError::Fenced`].
    pub exit_on_fence: bool,
    /// Make this process a child subreaper (`PR_SET_CHILD_SUBREAPER`, process-wide) at the
    /// `heartbeat` step, so orphaned descendants are reparented to it (default true).
    pub subreaper: bool,
    /// Put the commands in a cgroup v2 directory of their own when one can be created
    /// below this process's cgroup (default true); otherwise, or when false, they are
    /// tracked by process group, session and /proc scans only (see the crate docs).
    pub cgroup: bool,
    /// Where the lease lives (default [`Authority::RunFolder`]; with the cargo feature
    /// `etcd`, an etcd cluster). Only the lease moves: `run.json`, command records, the
    /// owner lock, the cgroup and the store stay in the run folder.
    pub authority: Authority,
    /// Step timings.
    pub on_step: Option<StepCallback>,
}

impl Default for OpenOptions {
    fn default() -> OpenOptions {
        OpenOptions {
            policy: TimingPolicy::default(),
            create: true,
            retire_dead: false,
            takeover: None,
            takeover_watched: None,
            lock_timeout: Duration::from_millis(200),
            step_deadline: Duration::from_secs(10),
            term_grace: Duration::from_secs(2),
            kill_wait: Duration::from_secs(2),
            exit_on_fence: false,
            subreaper: true,
            cgroup: true,
            authority: Authority::RunFolder,
            on_step: None,
        }
    }
}

impl std::fmt::Debug for OpenOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenOptions")
            .field("policy", &self.policy)
            .field("create", &self.create)
            .field("retire_dead", &self.retire_dead)
            .field("takeover", &self.takeover)
            .field("takeover_watched", &self.takeover_watched)
            .field("lock_timeout", &self.lock_timeout)
            .field("step_deadline", &self.step_deadline)
            .field("term_grace", &self.term_grace)
            .field("kill_wait", &self.kill_wait)
            .field("exit_on_fence", &self.exit_on_fence)
            .field("subreaper", &self.subreaper)
            .field("cgroup", &self.cgroup)
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

/// The smallest margin `stale_after − self_fence_after` lease-run accepts: the watchdog
/// notices a lapse within one tick and confirms the kill at the next, so a self-fenced
/// owner's commands are gone before anyone may call it stale.
pub const MIN_FENCE_MARGIN: Duration = Duration::from_millis(2 * 100);

impl OpenOptions {
    /// Check the options (and that `path` is absolute) without touching anything:
    /// `ARGUMENT_INVALID` (64) for a relative path, a zero `lock_timeout`, `step_deadline`
    /// or `kill_wait`, a timing policy whose `stale_after − self_fence_after` is below
    /// [`MIN_FENCE_MARGIN`] (unsafe: the kill could not be confirmed before the owner may be
    /// called stale), or both `retire_dead` and `takeover`.
    pub fn validate(&self, path: &Path) -> Result<(), RunError> {
        if !path.is_absolute() {
            return Err(RunError::InvalidArgument(format!(
                "the run path {} must be absolute",
                path.display()
            )));
        }
        for (what, d) in [
            ("lock_timeout", self.lock_timeout),
            ("step_deadline", self.step_deadline),
            ("kill_wait", self.kill_wait),
        ] {
            if d.is_zero() {
                return Err(RunError::InvalidArgument(format!("{what} must be > 0")));
            }
        }
        let margin = self
            .policy
            .stale_after()
            .saturating_sub(self.policy.self_fence_after());
        if margin < MIN_FENCE_MARGIN {
            return Err(RunError::InvalidArgument(format!(
                "unsafe timing: stale_after ({} ms) - self_fence_after ({} ms) must be at least {} ms so that a self-fenced owner's commands are killed before it may be called stale",
                self.policy.stale_after_ms(),
                self.policy.self_fence_after_ms(),
                MIN_FENCE_MARGIN.as_millis()
            )));
        }
        if self.retire_dead && self.takeover.is_some() {
            return Err(RunError::InvalidArgument(
                "retire_dead and takeover exclude each other: choose one way to replace the owner"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The final status a release writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalStatus {
    /// Stopped on purpose, to be resumed (optionally at `wake_at`).
    Paused {
        /// When to resume.
        wake_at: Option<Timestamp>,
    },
    /// Finished successfully.
    Done,
    /// Finished with a failure (`detail`, at most 4096 bytes).
    Failed {
        /// Why.
        detail: String,
    },
}

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
}

impl Shared {
    fn note_beat(&self, started_ns: u64) {
        self.core.note_beat(started_ns);
    }

    fn is_fenced(&self) -> bool {
        self.core.is_fenced()
    }

    fn lapsed(&self, now_ns: u64) -> bool {
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
            Some(reason) => Err(RunError::Fenced {
                run: self.run.clone(),
                reason,
            }),
        }
    }

    fn lapse_reason(&self) -> String {
        format!(
            "LEASE_LAPSED: the last successful heartbeat started more than {} ms ago",
            self.policy.self_fence_after_ms()
        )
    }

    fn tracked(&self) -> std::sync::MutexGuard<'_, Tracked> {
        lock_std(&self.tracked)
    }

    /// The head to report in the next heartbeat (read before it starts).
    fn reported_store_head(&self) -> Option<u64> {
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

/// The watchdog OS thread: every 100 ms, apply the self-fence rule on CLOCK_BOOTTIME,
/// learn the commands' descendants from /proc, and once fenced SIGKILL every tracked
/// process until all are gone; then confirm the fence (and exit 75 if asked).
fn watchdog(shared: Arc<Shared>) {
    loop {
        // Wake at the next tick, or right at the self-fence deadline if that comes first,
        // so the kill starts as soon as the deadline passes, not up to a tick later.
        let nap = if shared.is_fenced() {
            WATCHDOG_TICK
        } else {
            WATCHDOG_TICK.min(shared.until_lapse(boottime_ns()) + Duration::from_millis(1))
        };
        std::thread::sleep(nap);
        let fenced = shared.is_fenced();
        if !fenced && shared.stop.load(Ordering::SeqCst) {
            return;
        }
        if !fenced && shared.lapsed(boottime_ns()) {
            shared.fence(shared.lapse_reason());
        }
        // Learn the commands' descendants; once fenced, SIGKILL everything tracked (the
        // snapshot is taken under the tracking lock: see `fence::fence_tick`).
        if fence_tick(&shared.core, &shared.tracked) == Tick::Confirmed {
            // Close the store so the next owner can open it. A commit in flight holds the
            // slot: it finds the run fenced afterwards and drops the store itself.
            shared.core.drop_store_if_free();
            let reason = shared.fence_reason().unwrap_or_default();
            shared
                .fence_tx
                .send_replace(FenceState::Confirmed(reason.clone()));
            // After the fence is reported: a member just killed may stay listed for a
            // moment while it exits (rmdir is busy then); an empty directory left anyway
            // is removed by the next open of the run.
            let cg = shared.tracked().cgroup.clone();
            if let Some(cg) = cg {
                crate::cgroup::Cgroup::at(cg).remove_within(Duration::from_millis(250));
            }
            if shared.exit_on_fence {
                // Never `eprintln!`: it panics on a closed stderr, and this thread must
                // reach the exit.
                let _ = std::io::Write::write_fmt(
                    &mut std::io::stderr(),
                    format_args!(
                        "lease-run: fenced ({}): {reason}; commands killed, exiting 75\n",
                        shared.run
                    ),
                );
                std::process::exit(75);
            }
            return;
        }
    }
}

impl Tracking for Tracked {
    type Scan = Vec<procs::ProcInfo>;

    fn scan(&self) -> Self::Scan {
        if self.groups.is_empty() && self.known.is_empty() {
            Vec::new()
        } else {
            procs::scan()
        }
    }

    fn refresh_alive(&mut self, scan: &Self::Scan) -> bool {
        self.refresh(scan);
        reap_orphans(self, scan);
        self.any_alive(scan)
    }

    fn kill_all(&mut self, scan: &Self::Scan) {
        self.signal_all(Signal::KILL, scan);
    }
}

/// Reap zombie orphans reparented to this (subreaper) process that are tracked descendants
/// but not a command leader (those belong to tokio's `Child`).
fn reap_orphans(t: &Tracked, procs: &[procs::ProcInfo]) {
    let me = std::process::id();
    for p in procs {
        if p.zombie && p.ppid == me && !t.groups.contains(&p.pid) && t.known.contains_key(&p.pid) {
            if let Some(pid) = rustix::process::Pid::from_raw(i32::try_from(p.pid).unwrap_or(0)) {
                let _ = rustix::process::waitid(
                    rustix::process::WaitId::Pid(pid),
                    rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOHANG,
                );
            }
        }
    }
}

/// Wall-clock now as a protocol timestamp.
pub(crate) fn wall_now() -> Result<Timestamp, RunError> {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| RunError::Io("the wall clock is before 1970".into()))?
        .as_millis();
    u64::try_from(ms)
        .ok()
        .and_then(Timestamp::from_unix_millis)
        .ok_or_else(|| RunError::Io("the wall clock is out of range".into()))
}

pub use crate::procs::INCARNATION_VAR;

fn random_u64() -> Result<u64, RunError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| RunError::Io(format!("random: {e}")))?;
    Ok(u64::from_le_bytes(b))
}

fn new_owner_id() -> Result<Identity, RunError> {
    let (a, b) = (random_u64()?, random_u64()?);
    Identity::new(format!("run-{a:016x}{b:016x}"))
        .map_err(|e| RunError::Io(format!("owner id: {e}")))
}

/// Run a step: a tracing span, the duration reported to `on_step` (even on failure).
async fn timed<T>(
    on_step: &Option<StepCallback>,
    step: StepName,
    fut: impl std::future::Future<Output = Result<T, RunError>>,
) -> Result<T, RunError> {
    let span = tracing::info_span!("lease_run.step", step = step.as_str());
    let start = Instant::now();
    let r = fut.instrument(span).await;
    let took = start.elapsed();
    tracing::debug!(
        step = step.as_str(),
        ms = took.as_millis() as u64,
        ok = r.is_ok(),
        "step"
    );
    if let Some(cb) = on_step {
        cb(step, took);
    }
    r
}

/// Run blocking work off the runtime with a deadline. A step past its deadline is left
/// running in the blocking pool; the caller proceeds with `STEP_TIMEOUT`.
async fn blocking<T: Send + 'static>(
    run: &str,
    step: StepName,
    deadline: Duration,
    f: impl FnOnce() -> Result<T, RunError> + Send + 'static,
) -> Result<T, RunError> {
    match tokio::time::timeout(deadline, tokio::task::spawn_blocking(f)).await {
        Err(_) => Err(RunError::StepTimeout {
            run: run.to_string(),
            step: step.as_str(),
            ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
        }),
        Ok(Err(join)) => Err(RunError::Io(format!(
            "step {} panicked: {join}",
            step.as_str()
        ))),
        Ok(Ok(r)) => r,
    }
}

/// Write `run.json` as generation `lease.generation` only: the head must still be our
/// active epoch and the run not fenced, checked right before the atomic replace.
fn write_status_blocking(
    dir: &RunDir,
    auth: &dyn LeaseAuthority,
    shared: &Shared,
    lease: &OwnedLease,
    record: &RunStatus,
) -> Result<(), RunError> {
    shared.check_live()?;
    let view = auth.status(record.updated_at, false)?;
    let ours = view.head.as_ref().is_some_and(|h| {
        h.generation() == lease.generation && h.is_active() && h.epoch.owner_id == lease.owner_id
    });
    if !ours {
        // An unreadable head (edited by hand) cannot confirm the lease either: fenced,
        // but say which file, not that another owner came.
        let reason = match &view.status {
            Status::Invalid(e) => format!(
                "run.json not written: the lease head cannot be read to confirm generation {}: {e}",
                lease.generation
            ),
            _ => format!(
                "run.json not written: the lease head is no longer generation {} of this owner",
                lease.generation
            ),
        };
        shared.fence(reason.clone());
        return Err(RunError::Fenced {
            run: shared.run.clone(),
            reason,
        });
    }
    let bytes = encode(record)?;
    shared.check_live()?;
    primitives::replace(&**dir.fs(), &FileRef::RunStatus.path(), &bytes, true)
        .map_err(|e| FsError::io(lease.run_id.as_str(), "replace", "run.json", e))?;
    Ok(())
}

/// A handle on the run's store (`store/run.sqlite`), from [`Run::store`]. Cloneable and
/// `Send + Sync`: the one `lease_sqlite::Store` (`Send`, not `Sync`) sits behind a mutex,
/// so calls from several threads run one at a time.
///
/// Every call is **blocking** (a commit fsyncs the WAL): from async code call it inside
/// `tokio::task::spawn_blocking`, or use [`Run::commit`].
///
/// Every commit is stamped with the run's generation as its fencing token, and before it
/// starts it applies the self-fence rule ([`Run::check_live`], as the store's commit gate):
/// no commit begins once the run is fenced or its last successful heartbeat started more
/// than `self_fence_after` ago. Once the run is fenced every call answers `FENCED` and the
/// store is closed; after [`Run::release`] every call answers `RUN_RELEASED`.
#[derive(Clone)]
pub struct RunStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for RunStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStore")
            .field("run", &self.shared.run)
            .field("generation", &self.shared.generation)
            .finish_non_exhaustive()
    }
}

impl RunStore {
    fn with<T>(
        &self,
        f: impl FnOnce(&FenceCore<Store>, &mut Store) -> Result<T, StoreError>,
    ) -> Result<T, RunError> {
        match self.shared.core.with_store(f) {
            Ok(x) => Ok(x),
            Err(Access::Failed(e)) => Err(e.into()),
            Err(Access::Fenced) => {
                self.shared.check_live()?;
                Err(RunError::Fenced {
                    run: self.shared.run.clone(),
                    reason: "fenced".into(),
                })
            }
            Err(Access::Closed) => {
                self.shared.check_live()?;
                Err(RunError::Released {
                    run: self.shared.run.clone(),
                })
            }
        }
    }

    /// Commit `batch` as this run's generation; returns its sequence (durable when this
    /// returns). `FENCED` (75) if the run is fenced or past its self-fence deadline, or if
    /// the store has accepted a higher generation.
    pub fn commit(&self, batch: &Batch) -> Result<u64, RunError> {
        let g = self.shared.generation;
        self.with(|core, s| {
            let seq = s.commit(g, batch)?;
            core.acknowledge(seq);
            Ok(seq)
        })
    }

    /// The document at `key`, if any.
    pub fn get(&self, key: &str) -> Result<Option<Document>, RunError> {
        self.with(|_, s| s.get(key))
    }

    /// Every document whose key starts with `prefix`, in key order.
    pub fn scan_prefix(&self, prefix: &str) -> Result<Vec<Document>, RunError> {
        self.with(|_, s| s.scan_prefix(prefix))
    }

    /// The commits after sequence `after`, in order, with their writes and log entries.
    pub fn commits_since(&self, after: u64) -> Result<Vec<Commit>, RunError> {
        self.with(|_, s| s.commits_since(after))
    }

    /// The last committed sequence (0 for an empty store).
    pub fn head(&self) -> Result<u64, RunError> {
        self.with(|_, s| s.head())
    }

    /// The store's identity (created with it).
    pub fn store_id(&self) -> Result<String, RunError> {
        self.with(|_, s| s.identity().map(|i| i.store_id))
    }
}

/// A command started by [`Run::spawn`].
#[derive(Debug)]
pub struct RunCommand {
    pid: u32,
    child: tokio::process::Child,
}

impl RunCommand {
    /// Its pid (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Wait for it to exit. Its process group stays tracked: whatever it left behind is
    /// killed at release or fence.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
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
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("path", &self.path)
            .field("generation", &self.lease.generation)
            .finish_non_exhaustive()
    }
}

/// What open has done so far, for the undo.
struct Opening {
    dir: Arc<RunDir>,
    /// The held run root (the store folder is opened beneath it).
    root: Arc<RealFs>,
    auth: Arc<dyn LeaseAuthority>,
    lock: Option<OwnerLock>,
    lease: Option<OwnedLease>,
    shared: Option<Arc<Shared>>,
    tasks: Vec<JoinHandle<()>>,
    current: Option<RunStatus>,
    /// The seal the chain required at the `store` step (the replaced epoch's): re-issued
    /// by the undo of an open that fails before the store is live, so the next opener
    /// still checks the store's identity.
    carry_seal: Arc<Mutex<Option<Seal>>>,
}

impl Run {
    /// Open (claim) the run at the absolute `path`, in this order, each step timed:
    /// owner-lock → read-status → claim → run.json → heartbeat → layout → commands →
    /// store → seal → live. A failure undoes what was done (see the crate docs).
    pub async fn open(path: &Path, opts: OpenOptions) -> Result<Run, RunError> {
        opts.validate(path)?;
        let run_id = run_id_of(path)?;
        let name = path.display().to_string();
        let cb = opts.on_step.clone();
        let deadline = opts.step_deadline;

        // (1) owner lock (and, with etcd, the connection to the cluster).
        let (p, create, lock_timeout) = (path.to_path_buf(), opts.create, opts.lock_timeout);
        let (rid, nm) = (run_id.clone(), name.clone());
        let (authority, fence_after) = (opts.authority.clone(), opts.policy.self_fence_after());
        let (dir, lock, auth, root) = timed(
            &cb,
            StepName::OwnerLock,
            blocking(
                &name,
                StepName::OwnerLock,
                deadline + lock_timeout,
                move || {
                    let io =
                        |e: std::io::Error| FsError::io(rid.as_str(), "open run folder", &nm, e);
                    let fs = if create {
                        RealFs::create(&p)
                    } else {
                        RealFs::open(&p)
                    };
                    let fs = Arc::new(fs.map_err(|e| {
                        if e.kind() == std::io::ErrorKind::NotFound {
                            RunError::Fs(FsError::RunNotFound { path: nm.clone() })
                        } else {
                            io(e).into()
                        }
                    })?);
                    let end = Instant::now() + lock_timeout;
                    let lock = loop {
                        if let Some(l) = OwnerLock::try_acquire_in(&fs).map_err(io)? {
                            break l;
                        }
                        if Instant::now() >= end {
                            return Err(RunError::OwnerLockHeld { run: nm });
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    };
                    let dir = Arc::new(RunDir::with_fs(
                        fs.clone(),
                        rid.clone(),
                        &p,
                        Arc::new(ProcLiveness::new(&p).holding_lock()),
                    ));
                    let auth = authority.connect(dir.clone(), rid, deadline, fence_after)?;
                    Ok((dir, lock, auth, fs))
                },
            ),
        )
        .await?;

        let mut st = Opening {
            dir,
            root,
            auth,
            lock: Some(lock),
            lease: None,
            shared: None,
            tasks: Vec::new(),
            current: None,
            carry_seal: Arc::new(Mutex::new(None)),
        };
        match Run::open_steps(&mut st, path, &opts).await {
            Ok(()) => {}
            Err(e) => {
                Run::undo(st, &opts, &e).await;
                return Err(e);
            }
        }
        let (Some(lease), Some(shared), Some(current)) = (st.lease, st.shared, st.current) else {
            return Err(RunError::Io("open finished without a lease".into()));
        };
        Ok(Run {
            dir: st.dir,
            auth: st.auth,
            lease,
            lock: st.lock,
            shared,
            tasks: st.tasks,
            current: Mutex::new(current),
            opts,
            path: path.to_path_buf(),
        })
    }

    async fn open_steps(st: &mut Opening, path: &Path, opts: &OpenOptions) -> Result<(), RunError> {
        let name = path.display().to_string();
        let cb = &opts.on_step;
        let deadline = opts.step_deadline;

        // (2) previous run.json; an invalid one is refused and never overwritten. Then
        // the preflight (`preflight`): the layout, every command record, and run.json not
        // ahead of the lease chain. All of it reads only: a refusal here leaves the run
        // exactly as it was (only the owner lock is let go by the undo).
        let (dir, auth) = (st.dir.clone(), st.auth.clone());
        let previous = timed(
            cb,
            StepName::ReadStatus,
            blocking(&name, StepName::ReadStatus, deadline, move || {
                let p = FileRef::RunStatus.path();
                let bytes = dir
                    .fs()
                    .read(&p, MAX_RECORD_BYTES)
                    .map_err(|e| FsError::io(dir.run_id().as_str(), "read", &p, e))?;
                let previous = match bytes {
                    None => None,
                    Some(b) => {
                        Some(decode_for::<RunStatus>(dir.run_id(), &b).map_err(|e| e.in_file(p))?)
                    }
                };
                preflight(&dir)?;
                chain_reaches(&*auth, previous.as_ref())?;
                Ok(previous)
            }),
        )
        .await?;

        // (3) claim; or exact takeover of a stale owner; or retire a definitely-dead owner
        // and claim (with etcd, "dead" is judged by the owner's etcd lease).
        let dir = st.auth.clone();
        let (policy, retire_dead) = (opts.policy, opts.retire_dead);
        let takeover = opts.takeover.clone();
        let trigger = match opts.takeover_watched {
            None => TakeoverTrigger::Operator,
            Some(d) => TakeoverTrigger::Automatic {
                watched_unchanged_ms: u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
            },
        };
        let claim_started = boottime_ns();
        let lease = timed(
            cb,
            StepName::Claim,
            blocking(&name, StepName::Claim, deadline, move || {
                let holder = this_holder()?;
                if let Some(expect) = takeover {
                    // Replacing an owner finalizes its cutoff over the log and writes on
                    // top of the chain: a broken record anywhere refuses it (65, naming
                    // the file), as doctor advises ("do not take over").
                    dir.verify()?;
                    return dir.takeover(TakeoverParams {
                        run_id: dir.run_id().clone(),
                        owner_id: new_owner_id()?,
                        holder,
                        policy,
                        now: wall_now()?,
                        expect,
                        trigger,
                        nonce: random_u64()?,
                    });
                }
                let claim = |holder: lease_core::Holder| -> Result<ClaimParams, RunError> {
                    Ok(ClaimParams {
                        run_id: dir.run_id().clone(),
                        owner_id: new_owner_id()?,
                        holder,
                        policy,
                        now: wall_now()?,
                        store_floor: None,
                    })
                };
                match dir.claim(claim(holder.clone())?) {
                    Ok(l) => Ok(l),
                    // Held (76): the status below decides whether the holder is dead.
                    Err(e)
                        if retire_dead
                            && matches!(
                                e.code(),
                                Code::RunAlreadyActive
                                    | Code::RunStaleRequiresTakeover
                                    | Code::RunDeadRequiresRetirement
                                    | Code::TakeoverActiveRefused
                                    | Code::RetireRefusedNotDead
                            ) =>
                    {
                        let view = dir.status(wall_now()?, true)?;
                        match (&view.status, &view.head) {
                            (Status::Dead, Some(head)) => {
                                dir.verify()?;
                                dir.retire(RetireParams {
                                    run_id: dir.run_id().clone(),
                                    owner_id: new_owner_id()?,
                                    holder: holder.clone(),
                                    policy,
                                    now: wall_now()?,
                                    expect: Some(Expectation::of(head)),
                                    nonce: random_u64()?,
                                })?;
                                dir.claim(claim(holder)?)
                            }
                            _ => Err(e),
                        }
                    }
                    Err(e) => Err(e),
                }
            }),
        )
        .await?;
        st.lease = Some(lease.clone());

        let (fence_tx, _) = watch::channel(FenceState::Live);
        let incarnation = format!("{:016x}{:016x}", random_u64()?, random_u64()?);
        let shared = Arc::new(Shared {
            run: name.clone(),
            policy: opts.policy,
            core: FenceCore::new(claim_started),
            stop: AtomicBool::new(false),
            beats_suspended: AtomicBool::new(false),
            tracked: Mutex::new(Tracked {
                secret: Some(incarnation.clone()),
                ..Tracked::default()
            }),
            fence_tx,
            exit_on_fence: opts.exit_on_fence,
            generation: lease.generation,
            incarnation,
        });
        st.shared = Some(shared.clone());

        // (4) run.json: running, as the new generation.
        let now = wall_now()?;
        let record = RunStatus {
            run_id: lease.run_id.clone(),
            status: RunState::Running,
            generation: lease.generation,
            sealed_sequence: previous.as_ref().and_then(|p| p.sealed_sequence),
            wake_at: None,
            holder: Some(lease.holder.clone()),
            heartbeat_at: Some(now),
            updated_at: now,
            detail: None,
        };
        let (dir, auth, sh, l, r) = (
            st.dir.clone(),
            st.auth.clone(),
            shared.clone(),
            lease.clone(),
            record.clone(),
        );
        timed(
            cb,
            StepName::RunJson,
            blocking(&name, StepName::RunJson, deadline, move || {
                write_status_blocking(&dir, &*auth, &sh, &l, &r)
            }),
        )
        .await?;
        st.current = Some(record);

        // (5) heartbeat task, self-fence timer task, watchdog OS thread.
        let (dir, sh, l) = (st.auth.clone(), shared.clone(), lease.clone());
        let subreaper = opts.subreaper;
        if opts.cgroup {
            let key = crate::cgroup::run_key(path, lease.run_id.as_str());
            match crate::cgroup::Cgroup::create(&key, lease.generation.get()) {
                Ok(cg) => shared.tracked().cgroup = Some(cg.path().to_path_buf()),
                Err(reason) => tracing::info!(
                    run = %name,
                    %reason,
                    "no cgroup v2 subtree: commands are tracked by group, session and /proc scans"
                ),
            }
        }
        let tasks = timed(cb, StepName::Heartbeat, async move {
            if subreaper {
                if let Err(e) =
                    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
                {
                    tracing::warn!(error = %e, "cannot become a child subreaper");
                }
            }
            let hb = tokio::spawn(heartbeat_loop(dir, sh.clone(), l));
            let sh2 = sh.clone();
            let timer = tokio::spawn(async move {
                let mut tick = tokio::time::interval(WATCHDOG_TICK);
                loop {
                    tick.tick().await;
                    if sh2.is_fenced() {
                        return;
                    }
                    if sh2.lapsed(boottime_ns()) {
                        sh2.fence(sh2.lapse_reason());
                        return;
                    }
                }
            });
            std::thread::Builder::new()
                .name("lease-run-watchdog".into())
                .spawn(move || watchdog(sh))
                .map_err(|e| RunError::Io(format!("cannot start the watchdog thread: {e}")))?;
            Ok(vec![hb, timer])
        })
        .await?;
        st.tasks = tasks;

        // (6) layout.
        let dir = st.dir.clone();
        timed(
            cb,
            StepName::Layout,
            blocking(&name, StepName::Layout, deadline, move || {
                for d in ["store", "work", "tmp"] {
                    dir.fs()
                        .ensure_dir(d)
                        .map_err(|e| FsError::io(dir.run_id().as_str(), "mkdir", d, e))?;
                }
                Ok(())
            }),
        )
        .await?;

        // (7) reap or refuse the previous incarnations' commands.
        let dir = st.dir.clone();
        let (gen_, grace, kill_wait) = (lease.generation, opts.term_grace, opts.kill_wait);
        let key = crate::cgroup::run_key(path, lease.run_id.as_str());
        timed(
            cb,
            StepName::Commands,
            blocking(
                &name,
                StepName::Commands,
                deadline + 2 * (grace + kill_wait),
                move || {
                    reap_or_refuse(&dir, gen_, grace, kill_wait)?;
                    reap_cgroups(dir.run_id().as_str(), &key, gen_, grace, kill_wait)
                },
            ),
        )
        .await?;
        shared.check_live()?;

        // (8) store: the seal and floor from the lease chain (our epoch and the one our
        // claim replaced), then open `store/run.sqlite`. A new store is created only when
        // the chain names none (no seal, floor 0 or none); an expected store that is
        // missing is STORE_MISSING, never recreated.
        let dir = st.auth.clone();
        let (rid, g, carry) = (
            lease.run_id.clone(),
            lease.generation,
            st.carry_seal.clone(),
        );
        let root = st.root.clone();
        let store_dir = path.join(lease_core::layout::STORE_DIR);
        let (opened, seal, floor) = timed(
            cb,
            StepName::Store,
            blocking(&name, StepName::Store, deadline, move || {
                let own = dir.read_epoch(g)?.ok_or_else(|| {
                    RunError::Io(format!("epoch {g} vanished right after it was created"))
                })?;
                let replaced = match g.get().checked_sub(1).and_then(Generation::new) {
                    Some(prev) => dir.read_epoch(prev)?,
                    None => None,
                };
                let (seal, floor) = lease_core::seal::requirements(&own, replaced.as_ref());
                let seal = seal.cloned();
                *lock_std(&carry) = seal.clone();
                let create = seal.is_none() && floor.is_none_or(|(f, _)| f == 0);
                let expect = seal.as_ref().map(|s| Expected {
                    store_id: s.store_id.clone(),
                });
                // The store folder is opened beneath the held root (no symlink followed,
                // trust-checked), and the store's files only ever beneath that folder.
                let folder = root.open_dir(lease_core::layout::STORE_DIR).map_err(|e| {
                    FsError::io(rid.as_str(), "open", lease_core::layout::STORE_DIR, e)
                })?;
                let opened = Store::open_in(
                    &rid,
                    folder,
                    &store_dir,
                    lease_core::layout::STORE_FILE_NAME,
                    lease_sqlite::OpenOptions { create, expect },
                )?;
                Ok((opened, seal, floor))
            }),
        )
        .await?;

        // (9) seal: the store must be the sealed one, at or past the seal and the floor.
        // Then the commit gate (the self-fence rule) is installed and the store handed to
        // `RunStore` handles.
        let (sh, weak) = (shared.clone(), Arc::downgrade(&shared));
        let (run_s, g) = (name.clone(), lease.generation);
        timed(
            cb,
            StepName::Seal,
            blocking(&name, StepName::Seal, deadline, move || {
                let mut store = opened.check_seal(seal.as_ref(), floor)?;
                let head = store.head()?;
                store.set_commit_gate(Box::new(move || match weak.upgrade() {
                    Some(sh) => sh
                        .check_live()
                        .map_err(|e| StoreError::from(sh.fenced_lease_error(e.to_string()))),
                    None => Err(StoreError::from(LeaseError::Fenced {
                        run: run_s.clone(),
                        generation: g,
                        detail: "the run is gone".into(),
                    })),
                }));
                sh.core.install_store(store, head);
                Ok(())
            }),
        )
        .await?;
        shared.check_live()?;

        // (10) live: the seal is cleared while the run is live.
        let now = wall_now()?;
        let mut live = st.current.clone().unwrap_or(record_fallback(&lease, now));
        live.sealed_sequence = None;
        live.heartbeat_at = Some(now);
        live.updated_at = now;
        let (dir, auth, sh, l, r) = (
            st.dir.clone(),
            st.auth.clone(),
            shared.clone(),
            lease.clone(),
            live.clone(),
        );
        timed(
            cb,
            StepName::Live,
            blocking(&name, StepName::Live, deadline, move || {
                write_status_blocking(&dir, &*auth, &sh, &l, &r)
            }),
        )
        .await?;
        st.current = Some(live);
        Ok(())
    }

    /// Undo a failed open: stop the tasks; unless fenced: seal the store if it was opened
    /// (else re-issue the seal the chain required, stamped with this generation, which
    /// committed nothing), write `run.json` `failed` with `detail` = the error (code and
    /// message), and release the lease with that seal; drop the owner lock. Best effort,
    /// each step under its deadline.
    async fn undo(mut st: Opening, opts: &OpenOptions, err: &RunError) {
        for t in st.tasks.drain(..) {
            t.abort();
        }
        let name = st.dir.root().display().to_string();
        if let (Some(lease), Some(shared)) = (st.lease.clone(), st.shared.clone()) {
            let store = shared.core.take_store();
            if !shared.is_fenced() {
                if let Ok(now) = wall_now() {
                    let carried = lock_std(&st.carry_seal).clone().map(|s| Seal {
                        generation: lease.generation,
                        ..s
                    });
                    let mut rec = st.current.clone().unwrap_or(record_fallback(&lease, now));
                    rec.status = RunState::Failed;
                    rec.detail = Some(failure_detail(err));
                    rec.wake_at = None;
                    rec.updated_at = now;
                    let (dir, auth, sh, l) = (
                        st.dir.clone(),
                        st.auth.clone(),
                        shared.clone(),
                        lease.clone(),
                    );
                    let r = blocking(
                        &name,
                        StepName::FinalStatus,
                        opts.step_deadline,
                        move || {
                            let seal = match store {
                                Some(s) => Some(s.seal(l.generation)?),
                                None => carried,
                            };
                            rec.sealed_sequence = seal.as_ref().map(|s| s.sequence);
                            write_status_blocking(&dir, &*auth, &sh, &l, &rec)?;
                            auth.release(ReleaseParams {
                                lease: l.clone(),
                                now: wall_now()?,
                                seal,
                            })?;
                            Ok(())
                        },
                    )
                    .await;
                    if let Err(e) = r {
                        tracing::warn!(run = %name, error = %e, "undo of a failed open incomplete");
                    }
                }
            }
            // No command ran yet: the cgroup (if any) is empty and can go.
            if let Some(cg) = shared.tracked().cgroup.clone() {
                crate::cgroup::Cgroup::at(cg).remove();
            }
            // The watchdog ends once nothing is tracked (no command ran yet).
            shared.stop.store(true, Ordering::SeqCst);
        }
        st.lock.take();
    }

    /// The run's generation (the fencing token).
    pub fn generation(&self) -> Generation {
        self.lease.generation
    }

    /// The lease.
    pub fn lease(&self) -> &OwnedLease {
        &self.lease
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

    /// A handle on the run's store (see [`RunStore`]): commits carry this generation and
    /// none starts after the self-fence deadline.
    pub fn store(&self) -> RunStore {
        RunStore {
            shared: self.shared.clone(),
        }
    }

    /// Commit `batch` to the store off the async runtime (`spawn_blocking`); see
    /// [`RunStore::commit`].
    pub async fn commit(&self, batch: Batch) -> Result<u64, RunError> {
        let store = self.store();
        tokio::task::spawn_blocking(move || store.commit(&batch))
            .await
            .map_err(|e| RunError::Io(format!("commit task failed: {e}")))?
    }

    /// How long until the self-fence deadline (zero once past it): `self_fence_after`
    /// minus the age of the start of the last successful heartbeat (CLOCK_BOOTTIME).
    pub fn time_to_self_fence(&self) -> Duration {
        self.shared.until_lapse(boottime_ns())
    }

    /// The last `run.json` this run wrote.
    pub fn status(&self) -> RunStatus {
        lock_std(&self.current).clone()
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
                return RunError::Fenced {
                    run: self.shared.run.clone(),
                    reason: reason.clone(),
                };
            }
            if rx.changed().await.is_err() {
                return RunError::Fenced {
                    run: self.shared.run.clone(),
                    reason: "the watchdog ended".into(),
                };
            }
        }
    }

    /// Fault injection for tests: skip heartbeats from now on (a stuck heartbeat), so the
    /// run self-fences after `self_fence_after`. Only with the `test-hooks` feature.
    #[cfg(feature = "test-hooks")]
    pub fn suspend_heartbeats(&self) {
        self.shared.beats_suspended.store(true, Ordering::SeqCst);
    }

    /// Write `run.json` with `status` (and `detail`), as this generation only.
    pub async fn set_status(
        &self,
        status: RunState,
        detail: Option<String>,
        wake_at: Option<Timestamp>,
    ) -> Result<(), RunError> {
        let now = wall_now()?;
        let mut rec = self.status();
        rec.status = status;
        rec.detail = detail;
        rec.wake_at = wake_at;
        rec.updated_at = now;
        let (dir, auth, sh, l, r) = (
            self.dir.clone(),
            self.auth.clone(),
            self.shared.clone(),
            self.lease.clone(),
            rec.clone(),
        );
        blocking(
            &self.shared.run,
            StepName::FinalStatus,
            self.opts.step_deadline,
            move || write_status_blocking(&dir, &*auth, &sh, &l, &r),
        )
        .await?;
        *lock_std(&self.current) = rec;
        Ok(())
    }

    /// Start `argv` with `env` added, in its own process group, stdio inherited. Its
    /// [`CommandRecord`] is durable in `commands/` before the program starts: see the
    /// crate docs ("The spawn gate") for exactly what runs before.
    pub async fn spawn(
        &self,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<RunCommand, RunError> {
        if argv.is_empty() || argv[0].is_empty() {
            return Err(RunError::InvalidArgument(
                "argv must be non-empty with a non-empty program".into(),
            ));
        }
        self.check_live()?;
        let run = self.shared.run.clone();
        let spawn_err = |detail: String| RunError::Spawn {
            run: run.clone(),
            detail,
        };
        let mut cmd = tokio::process::Command::new(procs::GATE[0]);
        cmd.arg(procs::GATE[1])
            .arg(procs::GATE[2])
            .arg(procs::GATE[3])
            .args(argv)
            .process_group(0)
            .env("RUNLEASE_RUN", self.lease.run_id.as_str())
            .env(
                "RUNLEASE_GENERATION",
                self.lease.generation.get().to_string(),
            );
        // The authority, so `runlease append`/`release` in the command find the lease
        // where it lives; an inherited one must not point the command elsewhere.
        match self.opts.authority.url() {
            Some(url) => cmd.env("RUNLEASE_AUTHORITY", url),
            None => cmd.env_remove("RUNLEASE_AUTHORITY"),
        };
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        // The proof a later owner asks for before it signals a process this one started
        // (PROTOCOL §11.1); set after `env`, so a caller cannot override it.
        cmd.env(INCARNATION_VAR, &self.shared.incarnation);
        // Start and track in one critical section of the tracking lock, so the watchdog
        // never takes a snapshot without the group (`fence::fence_tick`).
        let (mut child, pid) = start_tracked(&self.shared.tracked, |t| {
            let child = cmd
                .spawn()
                .map_err(|e| spawn_err(format!("cannot start /bin/sh: {e}")))?;
            let pid = child
                .id()
                .ok_or_else(|| spawn_err("the child has no pid".into()))?;
            t.groups.insert(pid);
            // The leader's start time at once (it is our unreaped child, its pid cannot be
            // reused yet): its group counts as ours exactly while it exists (`procs`).
            if let Ok(Some(st)) = probe::process_start_time(pid) {
                t.known.insert(pid, st);
            }
            Ok::<_, RunError>((child, pid))
        })?;
        // Wait until the gate has stopped itself, then record, then continue it.
        let (dir, lease, argv2) = (self.dir.clone(), self.lease.clone(), argv.to_vec());
        let incarnation = CommandRecord::incarnation_digest(
            &lease.run_id,
            lease.generation,
            &self.shared.incarnation,
        );
        let cgroup = self.shared.tracked().cgroup.clone();
        let recorded = blocking(
            &run,
            StepName::Commands,
            self.opts.step_deadline,
            move || {
                let end = Instant::now() + Duration::from_secs(5);
                loop {
                    match procs::state_of(pid) {
                        // 't': the same stop seen by a tracer (runlease run under strace
                        // or a debugger); SIGCONT resumes it all the same.
                        Some('T' | 't') => break,
                        None | Some('Z') | Some('X') => {
                            return Err(RunError::Io(format!("command gate {pid} exited early")));
                        }
                        _ if Instant::now() >= end => {
                            return Err(RunError::Io(format!("command gate {pid} did not stop")));
                        }
                        _ => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
                if let Some(cg) = &cgroup {
                    // Before the program starts: all it ever forks is born inside.
                    crate::cgroup::Cgroup::at(cg.clone())
                        .add(pid)
                        .map_err(|e| {
                            RunError::Io(format!("cannot move {pid} into {}: {e}", cg.display()))
                        })?;
                }
                let start_time = probe::process_start_time(pid)
                    .map_err(|e| RunError::Io(format!("/proc/{pid}/stat: {e}")))?
                    .ok_or_else(|| RunError::Io(format!("command {pid} vanished")))?;
                let boot = probe::boot_id().map_err(|e| RunError::Io(format!("boot id: {e}")))?;
                let rec = CommandRecord {
                    run_id: lease.run_id.clone(),
                    generation: lease.generation,
                    pid,
                    pgid: pid,
                    start_time,
                    boot_id: Identity::arg("boot id", boot)?,
                    argv: argv2,
                    started_at: wall_now()?,
                    incarnation: Some(incarnation),
                };
                let f = FileRef::Command {
                    generation: lease.generation,
                    pid,
                };
                let p = f.path();
                let io = |e| FsError::io(lease.run_id.as_str(), "create", &p, e);
                dir.fs().ensure_dir(Dir::Commands.path()).map_err(io)?;
                let created =
                    primitives::create_exclusive(&**dir.fs(), &p, &encode(&rec)?).map_err(io)?;
                if !created {
                    return Err(RunError::Io(format!("{p} already exists")));
                }
                Ok(())
            },
        )
        .await;
        // Liveness is checked after the command is tracked and recorded: live → SIGCONT
        // (the program starts), else SIGKILL (it never ran).
        let live = recorded.and_then(|()| self.check_live());
        let gated = gate(
            live,
            || procs::kill_group(pid, Signal::CONT),
            || procs::kill_group(pid, Signal::KILL),
        );
        if let Err(e) = gated {
            let _ = child.wait().await;
            return Err(match e {
                RunError::Fenced { .. } => e,
                other => spawn_err(other.to_string()),
            });
        }
        // Under a tracer (`strace -f`, a debugger) the gate's SIGSTOP is first a
        // signal-delivery stop ('t'), and a SIGCONT sent then is lost when the tracer
        // re-injects the SIGSTOP: the gate would stay stopped for ever. So until the gate
        // has exec'd the program (or exited), a stopped gate gets SIGCONT again, for at
        // most 10 s. Its pid cannot be reused meanwhile: it is our unreaped child. Without
        // a tracer the exec follows the first SIGCONT within a millisecond or so.
        for _ in 0..10_000 {
            if !procs::is_gate(pid) {
                break;
            }
            if matches!(procs::state_of(pid), Some('T' | 't')) {
                procs::kill_group(pid, Signal::CONT);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(RunCommand { pid, child })
    }

    /// Release the run, in order, each step under its own deadline: stop-commands (TERM,
    /// grace, KILL; then their records are removed) → barrier (the store is taken from
    /// every [`RunStore`] handle, after any commit in flight: no commit can start after
    /// it) → seal-store (the seal: store id, head, this generation; the store's highest
    /// token is raised to this generation, the WAL checkpointed, the store closed) →
    /// final-status (`run.json` as `final_status`, `sealed_sequence` = the sealed head) →
    /// stop-heartbeat → release-lease (the release epoch carries the seal) → unlock.
    /// A fenced run reports the fence and writes nothing.
    pub async fn release(self, final_status: FinalStatus) -> Result<(), RunError> {
        self.release_with(final_status, false).await
    }

    /// Release the run like [`Run::release`], except that its commands are **detached**
    /// instead of stopped: for a command that asked its owner to hand the run over and
    /// goes on without the lease (`runlease release` under `runlease run`).
    ///
    /// In place of stop-commands: the watchdog stops tracking this generation's processes
    /// (they are no longer killed on a fence or at release), their command records are
    /// removed durably (so the next owner does not reap them), and the members of the
    /// incarnation's cgroup v2 directory, if any, are moved up into the owner's own cgroup
    /// and the directory removed ([`crate::cgroup::detach`]; a member that cannot be moved
    /// is logged, and the next open of the run kills it). All
    /// this happens before the barrier, the seal and the lease release, so a crash in
    /// between leaves a held run whose next owner finds no record (the commands are not
    /// reaped: they were handed over on purpose). What a detached command still holds:
    /// nothing that counts: the store is sealed and closed at the barrier that follows, and
    /// once the lease is released its generation is fenced everywhere (lease-fs appends
    /// answer `FENCED`).
    pub async fn release_detached(self, final_status: FinalStatus) -> Result<(), RunError> {
        self.release_with(final_status, true).await
    }

    async fn release_with(
        mut self,
        final_status: FinalStatus,
        detach: bool,
    ) -> Result<(), RunError> {
        let name = self.shared.run.clone();
        let cb = self.opts.on_step.clone();
        let deadline = self.opts.step_deadline;
        if let Err(e) = self.check_live() {
            return Err(self.finish_fenced(e).await);
        }

        let (sh, grace, kill_wait, dir, g) = (
            self.shared.clone(),
            self.opts.term_grace,
            self.opts.kill_wait,
            self.dir.clone(),
            self.lease.generation,
        );
        let stopped = timed(
            &cb,
            StepName::StopCommands,
            blocking(
                &name,
                StepName::StopCommands,
                grace + kill_wait + deadline,
                move || {
                    if detach {
                        let cg = {
                            let mut t = sh.tracked();
                            t.groups.clear();
                            t.known.clear();
                            t.cgroup.take()
                        };
                        if let Some(cg) = cg {
                            crate::cgroup::detach(&cg);
                        }
                        return remove_own_records(&dir, g);
                    }
                    let mut t = sh.tracked().clone();
                    let gone = procs::terminate(&mut t, grace, kill_wait);
                    let cg = t.cgroup.clone();
                    *sh.tracked() = t;
                    if !gone {
                        // Name a survivor (pid and group) from a fresh scan; one that died
                        // since still leaves its recorded group to name.
                        let (pid, pgid) = sh.tracked().first_alive(&procs::scan()).unwrap_or((
                            0,
                            sh.tracked().groups.iter().next().copied().unwrap_or(0),
                        ));
                        return Err(RunError::CommandsSurvive {
                            run: sh.run.clone(),
                            pid,
                            pgid,
                            generation: g.get(),
                        });
                    }
                    if let Some(cg) = cg {
                        crate::cgroup::Cgroup::at(cg).remove_within(Duration::from_secs(1));
                    }
                    remove_own_records(&dir, g)
                },
            ),
        )
        .await;
        if let Err(e) = stopped {
            // The watchdog keeps watching: once the lease lapses it SIGKILLs them again.
            for t in self.tasks.drain(..) {
                t.abort();
            }
            return Err(e);
        }

        // Barrier: take the store out of the shared slot. The slot's mutex is held by a
        // commit for its whole duration, so this waits for one in flight; afterwards every
        // `RunStore` call answers RUN_RELEASED.
        let sh = self.shared.clone();
        let store = timed(
            &cb,
            StepName::Barrier,
            blocking(&name, StepName::Barrier, deadline, move || {
                Ok(sh.core.take_store())
            }),
        )
        .await?;

        let sealed = timed(
            &cb,
            StepName::SealStore,
            blocking(&name, StepName::SealStore, deadline, move || match store {
                Some(s) => Ok(s.seal(g)?),
                None => Err(RunError::Io(
                    "the store was closed before the release (fenced?)".into(),
                )),
            }),
        )
        .await;
        let seal = match sealed {
            Ok(seal) => seal,
            Err(e) => {
                if self.check_live().is_err() || e.code() == Code::Fenced {
                    return Err(self.finish_fenced(e).await);
                }
                return Err(e);
            }
        };

        let now = wall_now()?;
        let mut rec = self.status();
        let (state, detail, wake_at) = match final_status {
            FinalStatus::Paused { wake_at } => (RunState::Paused, None, wake_at),
            FinalStatus::Done => (RunState::Done, None, None),
            FinalStatus::Failed { detail } => (RunState::Failed, Some(detail), None),
        };
        rec.status = state;
        rec.detail = detail;
        rec.wake_at = wake_at;
        rec.sealed_sequence = Some(seal.sequence);
        rec.updated_at = now;
        let (dir, auth, sh, l, r) = (
            self.dir.clone(),
            self.auth.clone(),
            self.shared.clone(),
            self.lease.clone(),
            rec.clone(),
        );
        let written = timed(
            &cb,
            StepName::FinalStatus,
            blocking(&name, StepName::FinalStatus, deadline, move || {
                write_status_blocking(&dir, &*auth, &sh, &l, &r)
            }),
        )
        .await;
        if let Err(e) = written {
            if matches!(e, RunError::Fenced { .. }) {
                return Err(self.finish_fenced(e).await);
            }
            return Err(e);
        }
        *lock_std(&self.current) = rec;

        timed(&cb, StepName::StopHeartbeat, async {
            for t in self.tasks.drain(..) {
                t.abort();
                let _ = tokio::time::timeout(deadline, t).await;
            }
            Ok(())
        })
        .await?;

        let (auth, l) = (self.auth.clone(), self.lease.clone());
        timed(
            &cb,
            StepName::ReleaseLease,
            blocking(&name, StepName::ReleaseLease, deadline, move || {
                auth.release(ReleaseParams {
                    lease: l.clone(),
                    now: wall_now()?,
                    seal: Some(seal),
                })?;
                Ok(())
            }),
        )
        .await?;

        timed(&cb, StepName::Unlock, async {
            self.shared.stop.store(true, Ordering::SeqCst);
            self.lock.take();
            Ok(())
        })
        .await
    }

    /// The fence path of release: stop the tasks, wait (bounded) for the watchdog to
    /// confirm the kill, drop the lock; nothing is written.
    async fn finish_fenced(&mut self, e: RunError) -> RunError {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        // Close the store (unless a commit holds it: it drops the store itself once it
        // sees the fence), so the next owner can open it.
        self.shared.core.drop_store_if_free();
        let wait = self.opts.kill_wait + WATCHDOG_TICK * 3;
        let confirmed = tokio::time::timeout(wait, self.fenced()).await;
        self.lock.take();
        confirmed.unwrap_or(e)
    }
}

impl Drop for Run {
    /// Dropping an unreleased run stops its heartbeat; the watchdog thread stays, so the
    /// run self-fences after `self_fence_after` and its commands are killed.
    fn drop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

/// `run.json`'s `detail` for a failure: the error's code and message (at most 4096 bytes).
fn failure_detail(err: &RunError) -> String {
    let msg = err.to_string();
    let mut d = if msg.starts_with(err.code().as_str()) {
        msg
    } else {
        format!("{}: {msg}", err.code())
    };
    if d.len() > lease_core::records::DETAIL_MAX_BYTES {
        let mut cut = lease_core::records::DETAIL_MAX_BYTES;
        while !d.is_char_boundary(cut) {
            cut -= 1;
        }
        d.truncate(cut);
    }
    d
}

fn record_fallback(lease: &OwnedLease, now: Timestamp) -> RunStatus {
    RunStatus {
        run_id: lease.run_id.clone(),
        status: RunState::Running,
        generation: lease.generation,
        sealed_sequence: None,
        wake_at: None,
        holder: Some(lease.holder.clone()),
        heartbeat_at: None,
        updated_at: now,
        detail: None,
    }
}

/// The heartbeat task: every `heartbeat`, one lease heartbeat off the runtime; a success
/// moves the beat (its CLOCK_BOOTTIME start) forward; `FENCED` fences.
async fn heartbeat_loop(dir: Arc<dyn LeaseAuthority>, shared: Arc<Shared>, lease: OwnedLease) {
    let mut tick = tokio::time::interval(shared.policy.heartbeat());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut count: u64 = 1;
    loop {
        tick.tick().await;
        if shared.is_fenced() {
            return;
        }
        if shared.beats_suspended.load(Ordering::SeqCst) {
            continue;
        }
        // The store head is read before the heartbeat starts: every commit acknowledged
        // before this point is covered by the floor a replacer records from this beat.
        let store_head = shared.reported_store_head();
        let started = boottime_ns();
        if shared.lapsed(started) {
            shared.fence(shared.lapse_reason());
            return;
        }
        let Ok(now) = wall_now() else { continue };
        // Bounded by the self-fence deadline: past it the run fences anyway, so a hung
        // authority (an etcd cluster that does not answer) costs no more than that.
        let left = shared.until_lapse(started);
        let until = Instant::now() + left;
        let (d, l) = (dir.clone(), lease.clone());
        let r = tokio::time::timeout(
            shared.policy.self_fence_after(),
            tokio::task::spawn_blocking(move || {
                d.heartbeat_within(&l, now, count, store_head, until)
            }),
        )
        .await;
        match r {
            Ok(Ok(Ok(()))) => {
                shared.note_beat(started);
                count += 1;
            }
            Ok(Ok(Err(e))) if e.code() == Code::Fenced => {
                shared.fence(e.to_string());
                return;
            }
            Ok(Ok(Err(e))) => tracing::warn!(run = %shared.run, error = %e, "heartbeat failed"),
            Ok(Err(e)) => tracing::warn!(run = %shared.run, error = %e, "heartbeat task failed"),
            Err(_) => tracing::warn!(run = %shared.run, "heartbeat timed out"),
        }
    }
}

/// Reap or refuse the commands recorded by older generations (owner lock held).
///
/// PROTOCOL §11.1: a process is signalled only once it is proved to be one that the
/// recording incarnation started: same boot, the same real and effective uid as this
/// process, started no earlier than the recorded command, and carrying in its environment
/// the secret whose digest the record holds ([`CommandRecord::incarnation_digest`]); from
/// that check to every signal it is held by a pidfd ([`procs::Held`]), so a reused pid is
/// never hit. The record's pid and group select nothing to kill: they only name a leader
/// that is alive but unprovable, which refuses the open (`RUN_COMMAND_UNPROVEN`) and is
/// left alone. A descendant that dropped its environment cannot be found and is not
/// signalled (a cgroup, when the run had one, still catches it: `reap_cgroups`).
fn reap_or_refuse(
    dir: &RunDir,
    ours: Generation,
    grace: Duration,
    kill_wait: Duration,
) -> Result<(), RunError> {
    let run = dir.run_id().as_str().to_string();
    let io = |op: &'static str, p: &str, e| FsError::io(&run, op, p, e);
    let boot = probe::boot_id().map_err(|e| RunError::Io(format!("boot id: {e}")))?;
    for (p, rec) in command_records(dir)? {
        let generation = rec.generation;
        if generation >= ours {
            continue;
        }
        if rec.boot_id.as_str() == boot {
            let mut prover = Prover::new(&rec);
            if let Err(why) = prover.leader(&rec, &procs::scan()) {
                return Err(RunError::CommandUnproven {
                    run: run.clone(),
                    file: p,
                    pid: rec.pid,
                    start_time: rec.start_time,
                    why,
                });
            }
            match stop_proven(&mut prover, grace, kill_wait) {
                Ok(()) => {}
                Err(StopFailed::Survives(pid)) => {
                    return Err(RunError::CommandsSurvive {
                        run: run.clone(),
                        pid,
                        pgid: rec.pgid,
                        generation: generation.get(),
                    });
                }
                Err(StopFailed::NotPermitted(pid, e)) => {
                    return Err(RunError::NotPermitted {
                        run: run.clone(),
                        pid,
                        generation: generation.get(),
                        detail: e.to_string(),
                    });
                }
            }
        }
        // Another boot: its processes died with that boot.
        primitives::remove(&**dir.fs(), &p, true).map_err(|e| io("remove", &p, e))?;
    }
    Ok(())
}

/// What a command record's processes are now, judged as [`Run::open`] would judge them
/// before reaping (PROTOCOL §11.1), without signalling anything: for `doctor` and `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandState {
    /// Nothing of it runs any more (or it ran on another boot).
    Gone,
    /// These live processes are proved to be its (the next open stops them).
    Proved(Vec<u32>),
    /// The recorded process (same pid and start time) is alive but cannot be proved ours:
    /// the next open is refused with `RUN_COMMAND_UNPROVEN` until an operator acts.
    Unproven {
        /// What is missing.
        why: String,
    },
}

/// One command record and the state of its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandAudit {
    /// The record, relative to the run folder.
    pub file: String,
    /// The generation that started it.
    pub generation: Generation,
    /// The recorded pid.
    pub pid: u32,
    /// Its start time (clock ticks after boot).
    pub start_time: u64,
    /// What runs of it.
    pub state: CommandState,
}

/// What an open checks before it writes anything, for runs it is about to claim: every
/// protocol folder of the layout is listed (the event folder counted) as the lease will
/// list it, so a misplaced file or a symlinked folder (`RUN_LAYOUT_INVALID`, 65) is refused
/// now instead of at the release, after the command ran; and every command record is read
/// and judged ([`audit_commands`]): an unreadable or misnamed one (65) or a live recorded
/// process that cannot be proved ours (`RUN_COMMAND_UNPROVEN`, 76) is refused before a
/// claim or a retirement, not while reaping after it. Read-only.
pub fn preflight(dir: &RunDir) -> Result<(), RunError> {
    for d in lease_core::Dir::ALL {
        let req = if d == lease_core::Dir::Events {
            lease_core::ops::Request::CountEvents
        } else {
            lease_core::ops::Request::List(d)
        };
        dir.perform(req)?;
    }
    for a in audit_commands(dir)? {
        if let CommandState::Unproven { why } = a.state {
            return Err(RunError::CommandUnproven {
                run: dir.run_id().to_string(),
                file: a.file,
                pid: a.pid,
                start_time: a.start_time,
                why,
            });
        }
    }
    Ok(())
}

/// `CHAIN_BROKEN` (65) when `run.json` was written by a generation the lease chain does
/// not reach (its newest epochs deleted, `lease/` restored from an older copy or emptied).
/// An owner writes `run.json` only after its epoch is durable, so no crash produces this;
/// claiming would hand out fencing tokens already given out (the store accepts an equal
/// token).
pub fn chain_reaches(
    auth: &dyn LeaseAuthority,
    run_json: Option<&RunStatus>,
) -> Result<(), RunError> {
    let Some(written_by) = run_json.map(|r| r.generation.get()) else {
        return Ok(());
    };
    let view = auth.status(wall_now()?, false)?;
    let head = view.head.as_ref().map_or(0, |h| h.epoch.generation.get());
    if written_by <= head {
        return Ok(());
    }
    let chain = if head == 0 {
        "the lease chain (lease/epochs/) has no epoch".to_string()
    } else {
        format!("the lease chain (lease/epochs/) ends at generation {head}")
    };
    Err(RunError::Lease(LeaseError::ChainBroken {
        run: auth.run_id().to_string(),
        chain: "epoch",
        at: written_by,
        detail: format!(
            "run.json was written by generation {written_by}, but {chain}: epochs were deleted or restored from an older copy, and claiming would reuse fencing tokens already given out; restore lease/ from a backup"
        ),
    }))
}

/// Judge every command record of `dir` like the next open would (PROTOCOL §11.1), reading
/// `/proc` only: nothing is signalled or written. An unreadable or misnamed record is an
/// error, as it is for the open.
pub fn audit_commands(dir: &RunDir) -> Result<Vec<CommandAudit>, RunError> {
    let boot = probe::boot_id().map_err(|e| RunError::Io(format!("boot id: {e}")))?;
    let procs = procs::scan();
    let mut out = Vec::new();
    for (p, rec) in command_records(dir)? {
        let (generation, pid) = (rec.generation, rec.pid);
        let state = if rec.boot_id.as_str() != boot {
            CommandState::Gone
        } else {
            let mut prover = Prover::new(&rec);
            match prover.leader(&rec, &procs) {
                Err(why) => CommandState::Unproven { why },
                Ok(()) => {
                    let proved: Vec<u32> = procs
                        .iter()
                        .filter(|q| prover.check(q).is_ok())
                        .map(|q| q.pid)
                        .collect();
                    if proved.is_empty() {
                        CommandState::Gone
                    } else {
                        CommandState::Proved(proved)
                    }
                }
            }
        };
        out.push(CommandAudit {
            file: p,
            generation,
            pid,
            start_time: rec.start_time,
            state,
        });
    }
    Ok(out)
}

/// Every command record of `dir` (its path and content), validated: decoded strictly and
/// matching its name. A record removed meanwhile (its command ended) is skipped; an
/// unreadable or misnamed one is the error, naming the file.
fn command_records(dir: &RunDir) -> Result<Vec<(String, CommandRecord)>, RunError> {
    let run = dir.run_id().as_str();
    let io = |op: &'static str, p: &str, e| FsError::io(run, op, p, e);
    let names = dir
        .fs()
        .list(Dir::Commands.path())
        .map_err(|e| io("list", Dir::Commands.path(), e))?;
    let mut out = Vec::new();
    for n in names {
        let Some(f @ FileRef::Command { generation, pid }) = Dir::Commands.parse_name(&n) else {
            continue;
        };
        let p = f.path();
        let Some(bytes) = dir
            .fs()
            .read(&p, MAX_RECORD_BYTES)
            .map_err(|e| io("read", &p, e))?
        else {
            continue;
        };
        let rec: CommandRecord = decode_for(dir.run_id(), &bytes).map_err(|e| e.in_file(&p))?;
        if rec.pid != pid || rec.generation != generation {
            return Err(RunError::Fs(FsError::LayoutInvalid {
                run: run.to_string(),
                path: p,
                detail: "the record does not match its name".into(),
            }));
        }
        out.push((p, rec));
    }
    Ok(out)
}

/// Decides, once per process (pid and start time), whether it is proved to be one that the
/// incarnation of a command record started (see [`reap_or_refuse`]).
struct Prover {
    run: lease_core::RunId,
    generation: Generation,
    digest: Option<lease_core::Digest>,
    started_no_earlier: u64,
    euid: u32,
    seen: std::collections::BTreeMap<(u32, u64), Result<(), String>>,
}

impl Prover {
    fn new(rec: &CommandRecord) -> Prover {
        Prover {
            run: rec.run_id.clone(),
            generation: rec.generation,
            digest: rec.incarnation.clone(),
            started_no_earlier: rec.start_time,
            euid: procs::euid(),
            seen: std::collections::BTreeMap::new(),
        }
    }

    /// `Err(why)` when `rec`'s recorded process (same pid and start time) is alive in
    /// `procs` but not proved ours: the one case that refuses the open (and that doctor
    /// reports). `Ok` when it is proved, or gone.
    fn leader(&mut self, rec: &CommandRecord, procs: &[procs::ProcInfo]) -> Result<(), String> {
        match procs
            .iter()
            .find(|q| q.pid == rec.pid && q.start_time == rec.start_time && !q.zombie)
        {
            Some(l) => self.check(l),
            None => Ok(()),
        }
    }

    /// `Ok` when `q` is proved ours; otherwise what is missing (for messages).
    fn check(&mut self, q: &procs::ProcInfo) -> Result<(), String> {
        if q.zombie {
            return Err("it has exited".into());
        }
        if q.start_time < self.started_no_earlier {
            return Err("it started before the recorded command".into());
        }
        let key = (q.pid, q.start_time);
        if let Some(r) = self.seen.get(&key) {
            return r.clone();
        }
        let r = self.decide(q.pid);
        self.seen.insert(key, r.clone());
        r
    }

    fn decide(&self, pid: u32) -> Result<(), String> {
        let Some(digest) = &self.digest else {
            return Err(
                "its record was written by a runlease without process proof (no incarnation digest)"
                    .into(),
            );
        };
        match procs::uids_of(pid) {
            Some((r, e)) if r == self.euid && e == self.euid => {}
            Some((r, e)) => {
                return Err(format!(
                    "it runs as uid {r} (effective {e}), not as this process's uid {}",
                    self.euid
                ));
            }
            None => return Err("its /proc/PID/status cannot be read".into()),
        }
        match procs::env_var(pid, INCARNATION_VAR) {
            procs::EnvVar::Set(v)
                if CommandRecord::incarnation_digest(&self.run, self.generation, &v) == *digest =>
            {
                Ok(())
            }
            procs::EnvVar::Set(_) => Err(format!(
                "its {INCARNATION_VAR} is not the secret of generation {}",
                self.generation
            )),
            procs::EnvVar::Unset => Err(format!(
                "it does not carry generation {}'s {INCARNATION_VAR} secret in its environment",
                self.generation
            )),
            procs::EnvVar::Unreadable => Err("its environment cannot be read".into()),
        }
    }
}

enum StopFailed {
    Survives(u32),
    NotPermitted(u32, std::io::Error),
}

/// Stop every process `prover` proves ours, found afresh by a scan every 10 ms (so what
/// they fork meanwhile is caught too): SIGTERM once each, SIGKILL after `grace`, through
/// pidfds; done when none is left, or the first survivor after `grace + kill_wait`.
fn stop_proven(
    prover: &mut Prover,
    grace: Duration,
    kill_wait: Duration,
) -> Result<(), StopFailed> {
    let kill_at = Instant::now() + grace;
    let end = kill_at + kill_wait;
    let mut termed = std::collections::BTreeSet::new();
    loop {
        let live: Vec<procs::Held> = procs::scan()
            .iter()
            .filter(|q| prover.check(q).is_ok())
            .filter_map(|q| procs::Held::open(q.pid, q.start_time))
            .collect();
        let Some(first) = live.first() else {
            return Ok(());
        };
        let now = Instant::now();
        if now >= end {
            return Err(StopFailed::Survives(first.pid));
        }
        for h in &live {
            let sig = if now >= kill_at {
                Signal::KILL
            } else if termed.insert((h.pid, h.start_time)) {
                Signal::TERM
            } else {
                continue;
            };
            if let Err(e) = h.signal(sig) {
                if e.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error()) {
                    return Err(StopFailed::NotPermitted(h.pid, e));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kill what older incarnations of this run left in their cgroups (descendants that left
/// their process group and session escape the records; they cannot leave a cgroup):
/// SIGTERM to each member, `grace`, `cgroup.kill`, up to `kill_wait`; a member that
/// survives refuses the open (`RUN_COMMANDS_SURVIVE`, 76). Emptied directories are removed.
fn reap_cgroups(
    run: &str,
    key: &str,
    ours: Generation,
    grace: Duration,
    kill_wait: Duration,
) -> Result<(), RunError> {
    for cg in crate::cgroup::leftovers(key, ours.get()) {
        let gone = |within: Duration, kill: bool| {
            let end = Instant::now() + within;
            loop {
                let live: Vec<u32> = cg
                    .pids()
                    .into_iter()
                    .filter(|p| !matches!(procs::state_of(*p), None | Some('Z') | Some('X')))
                    .collect();
                if live.is_empty() {
                    return None;
                }
                if Instant::now() >= end {
                    return live.first().copied();
                }
                if kill {
                    cg.kill();
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        for pid in cg.pids() {
            // Through a pidfd confirmed to be the member just listed.
            if let Some(h) = procs::Held::current(pid) {
                let _ = h.signal(Signal::TERM);
            }
        }
        let survivor = gone(grace, false).and_then(|_| {
            cg.kill();
            gone(kill_wait, true)
        });
        if let Some(pid) = survivor {
            return Err(RunError::CommandsSurvive {
                run: run.to_string(),
                pid,
                pgid: 0,
                generation: cg
                    .path()
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.rsplit('-').next())
                    .and_then(|g| g.parse().ok())
                    .unwrap_or(0),
            });
        }
        cg.remove_within(Duration::from_secs(1));
    }
    Ok(())
}

/// Remove this generation's command records (their processes are gone).
fn remove_own_records(dir: &RunDir, ours: Generation) -> Result<(), RunError> {
    let run = dir.run_id().as_str().to_string();
    let names = dir
        .fs()
        .list(Dir::Commands.path())
        .map_err(|e| FsError::io(&run, "list", Dir::Commands.path(), e))?;
    for n in names {
        if let Some(f @ FileRef::Command { generation, .. }) = Dir::Commands.parse_name(&n) {
            if generation == ours {
                let p = f.path();
                primitives::remove(&**dir.fs(), &p, true)
                    .map_err(|e| FsError::io(&run, "remove", &p, e))?;
            }
        }
    }
    Ok(())
}
