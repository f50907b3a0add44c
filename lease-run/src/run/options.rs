//! The options of [`Run::open`] and their validation.

#[cfg(doc)]
use super::Run;
use super::StepCallback;
use crate::authority::Authority;
use crate::error::RunError;
use lease_core::TimingPolicy;
use lease_core::ops::Expectation;
use lease_fs::RealFs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

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
    ///
    /// With it, the run **adopts the owner process's children**: every child of this
    /// process that started no earlier than the run's first command, is not in this
    /// process's own process group and carries no other run incarnation's secret or mark
    /// counts as one of the run's (an orphan reparented from a command's tree), and is
    /// killed with the commands at release and on a fence, and reaped once a zombie
    /// ([`crate::procs::Tracked`]). A child that the embedding program spawns itself in
    /// this process's group (the default of `std` and `tokio`) is never counted; one it
    /// spawns in a new group or session while a run is open is, and its exit status is
    /// then taken by the run: such a program should set this to false (a double-forked
    /// descendant is then reparented to init or another subreaper, and found only by the
    /// incarnation's mark or secret) or start those children with [`Run::command`].
    /// `runlease run` spawns nothing else.
    pub subreaper: bool,
    /// Put the commands in a cgroup v2 directory of their own when one can be created
    /// below this process's cgroup (default true); otherwise, or when false, they are
    /// tracked by process group, session and /proc scans only (see the crate docs).
    pub cgroup: bool,
    /// Where the lease lives (default [`Authority::RunFolder`]; with the cargo feature
    /// `etcd`, an etcd cluster). Only the lease moves: `run.json`, command records, the
    /// owner lock, the cgroup and the store stay in the run folder.
    pub authority: Authority,
    /// Serve the run's store to its commands over a local socket (default true; see
    /// [`crate::store_client`]): started with the heartbeat, announced to every command
    /// as `RUNLEASE_STORE_SOCKET`, stopped at release. A commit made through it is
    /// acknowledged only once it is durable **and** a durable heartbeat carrying its
    /// sequence has been written, so the floor a replacer records covers it even after a
    /// `kill -9` or a power loss (requests that arrive together share one store
    /// transaction and one beat: group commit). A command's `runlease release` arrives
    /// there too ([`Run::release_requested`]).
    pub serve_store: bool,
    /// Step timings.
    pub on_step: Option<StepCallback>,
    /// The run folder, already opened and held (e.g. `RunDir::real_fs` of the folder
    /// `runlease run` judged): the open works on this very directory through a duplicate
    /// of its descriptor, never looking the run path up again, and `path` only names the
    /// run (messages, `RUNLEASE_RUN`, the cgroup's name). `create` does not apply then.
    /// Default `None`: the open opens `path` itself, once (`O_NOFOLLOW|O_DIRECTORY`).
    pub folder: Option<Arc<RealFs>>,
    /// The owner id to claim as. Default `None`: a fresh one ([`crate::new_owner_id`]).
    /// [`crate::Run::acquire`] draws one for all its attempts, so a claim whose answer was
    /// lost (an etcd transaction that committed, its reply cut off) is adopted by the next
    /// attempt as this owner's own, instead of blocking it until it expires (issue #31).
    pub owner_id: Option<lease_core::Identity>,
    /// The guard process to start at the first command ([`crate::guard`], issue #31): a
    /// program outside this process, in a process group of its own, that kills the
    /// commands (the run's cgroup, else each leader and its group, proved by pidfds)
    /// once the self-fence deadline passes with no later one from this owner, even while
    /// this process is stopped (SIGSTOP, a frozen container) and its watchdog with it.
    /// The program must call [`crate::guard::serve_stdin`]. A guard that cannot be started
    /// fails the spawn (`SPAWN_FAILED`). Default `None` (the watchdog thread alone);
    /// `runlease run` sets it to its own binary (`runlease __guard`).
    pub guard: Option<crate::guard::GuardProgram>,
    /// Open the store lazily (default: true; issue #33, PROTOCOL §9): when the run was
    /// released cleanly with a seal and no change of owner recorded a higher head, the
    /// open checks the store against that seal read-only (the preflight) and does not
    /// open it; the first [`RunStore`](crate::RunStore) call opens and checks it, and a
    /// release that never opened it carries the seal forward. A command that never
    /// touches the store then costs no store open, seal or checkpoint (5 fsyncs). `false`
    /// opens it at the `store` step, as before: a store the preflight could not judge
    /// (say, one a crashed owner left with a write-ahead log) is then refused before the
    /// command starts rather than at its first commit.
    pub lazy_store: bool,
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
            serve_store: true,
            on_step: None,
            folder: None,
            owner_id: None,
            guard: None,
            lazy_store: true,
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
            .field("serve_store", &self.serve_store)
            .field("folder", &self.folder)
            .field("lazy_store", &self.lazy_store)
            .field("owner_id", &self.owner_id)
            .field("guard", &self.guard)
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
