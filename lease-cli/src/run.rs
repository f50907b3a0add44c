//! `runlease run`: own a run and run one command under the lease.
//!
//! # What this does (and what it does not do yet)
//!
//! 1. Create the run folder if missing; take the kernel owner lock (200 ms); claim the lease
//!    with a fresh random owner id. A held run is refused (exit 76) or waited for
//!    (`--wait`); a stale owner is replaced only with `--takeover-stale` (after watching
//!    its record unchanged for its `stale_after` on our monotonic clock: an automatic
//!    takeover), a dead one only with `--retire-dead`.
//! 2. Spawn the command in its own process group with `RUNLEASE_RUN`,
//!    `RUNLEASE_GENERATION` and `RUNLEASE_OWNER`; stdio inherited, except that a terminal
//!    stdin is replaced by `/dev/null` (the group is not the terminal's foreground group, so
//!    reading the terminal would stop the command; a command stopped by SIGTTIN/SIGTTOU is
//!    terminated with a message). Handing the terminal over (tcsetpgrp, and restoring it,
//!    which needs SIGTTOU blocked) is not done yet.
//! 3. A heartbeat thread beats every `heartbeat` ms; a watchdog OS thread checks the
//!    self-fence rule every 100 ms. On a `FENCED` heartbeat or a self-fence the watchdog
//!    SIGKILLs the command's process group (and keeps doing so until it is reaped); runlease
//!    then exits 75 without writing anything more (a fenced owner must not write).
//! 4. SIGINT, SIGTERM and SIGHUP received by runlease are forwarded to the group.
//!    SIGUSR1 is a *release request* (sent by `runlease release` run from the command):
//!    the heartbeat thread, the only writer, stops beating and releases the lease at
//!    once (unless the owner is already fenced or self-fenced); the command keeps
//!    running without the lease (its later `runlease append` exit 75) and runlease exits
//!    with its code when it ends. A SIGUSR1 before the command started is ignored.
//! 5. When the command exits: anything it left in its process group is SIGKILLed, the
//!    heartbeat stops (barrier), the lease is released, the lock dropped, and runlease exits
//!    with the command's exit code (128+N if it was killed by signal N).
//!
//! **Partial (issue #7 / lease-run):** no `run.json`, no command records before start, no
//! reaping of a killed incarnation's commands, no cgroup or subreaper (a command that calls
//! `setsid` or double-forks into another group escapes the kill), no store or seal. The
//! clocks: the self-fence uses `std::time::Instant`, which is `CLOCK_MONOTONIC` on Linux;
//! the protocol's target is `CLOCK_BOOTTIME` (counts suspend), which the lease-run layer will
//! use. A suspended laptop therefore fences only on the first failed/late check after
//! resume, not at once.

use crate::common::{
    CliError, Out, held_description, human_ms, is_stale, new_nonce, new_owner_id, policy_json,
    wall_now,
};
use lease_cli::cli::WaitFor;
use lease_core::ops::{Expectation, OwnedLease, Status, StatusView, TakeoverTrigger};
use lease_core::{HeartbeatDurability, TimingPolicy, must_self_fence};
use lease_fs::lock::OwnerLock;
use lease_fs::{ProcLiveness, RunDir, this_holder};
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use serde_json::json;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long `run` tries to take the kernel owner lock per attempt.
const LOCK_TIMEOUT: Duration = Duration::from_millis(200);
/// How often the watchdog checks the self-fence rule.
const WATCHDOG_TICK: Duration = Duration::from_millis(100);
/// Longest pause between two attempts while waiting (`--wait`).
const MAX_WAIT_POLL: Duration = Duration::from_secs(1);

/// Options of `runlease run`.
#[derive(Debug, Clone)]
pub struct RunOpts {
    /// The run folder.
    pub dir: PathBuf,
    /// Heartbeat interval, ms.
    pub heartbeat_ms: u64,
    /// Stale after, ms.
    pub stale_after_ms: u64,
    /// Self-fence after, ms.
    pub self_fence_after_ms: u64,
    /// fsync every heartbeat.
    pub durable_heartbeats: bool,
    /// `--wait`.
    pub wait: Option<WaitFor>,
    /// `--takeover-stale`.
    pub takeover_stale: bool,
    /// `--retire-dead`.
    pub retire_dead: bool,
    /// The command and its arguments.
    pub command: Vec<OsString>,
}

/// The first signal received before the command started (0: none).
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// What happened to the command's process group.
#[derive(Debug, Clone, Copy)]
enum ChildState {
    NotStarted,
    /// Running (or exited but not yet reaped, so its pid is still its group id).
    Running(Pid),
    /// Reaped: the group id may be reused, never signal it again.
    Reaped,
}

/// State shared by the main thread, the heartbeat thread, the watchdog and the signal
/// forwarder.
struct Shared {
    policy: TimingPolicy,
    /// Monotonic reading at which the last successful heartbeat (or the claim) STARTED.
    last_ok_started: Mutex<Instant>,
    /// Why the owner is fenced, once it is.
    fenced: Mutex<Option<String>>,
    /// Set to stop the heartbeat and the watchdog.
    stop: Mutex<bool>,
    /// A release was requested (SIGUSR1); set while holding `stop` so no wake-up is lost.
    release_requested: AtomicBool,
    /// The generation the lease was released as, once released on request.
    released: Mutex<Option<lease_core::Generation>>,
    /// The kernel owner lock once the command runs: dropped right after a release (on
    /// request, by the heartbeat thread; else by the main thread at the end).
    owner_lock: Mutex<Option<OwnerLock>>,
    wake: Condvar,
    child: Mutex<ChildState>,
}

impl Shared {
    /// Sleep up to `d`; `true` if asked to stop.
    fn sleep(&self, d: Duration) -> bool {
        let Ok(guard) = self.stop.lock() else {
            return true;
        };
        match self.wake.wait_timeout_while(guard, d, |s| !*s) {
            Ok((g, _)) => *g,
            Err(_) => true,
        }
    }

    /// Like [`Shared::sleep`], but also wakes at once on a release request.
    fn sleep_or_release(&self, d: Duration) -> bool {
        let Ok(guard) = self.stop.lock() else {
            return true;
        };
        match self.wake.wait_timeout_while(guard, d, |s| {
            !*s && !self.release_requested.load(Ordering::SeqCst)
        }) {
            Ok((g, _)) => *g,
            Err(_) => true,
        }
    }

    fn request_release(&self) {
        if let Ok(_s) = self.stop.lock() {
            self.release_requested.store(true, Ordering::SeqCst);
        }
        self.wake.notify_all();
    }

    /// Drop the kernel owner lock (after a release, or when runlease stops owning).
    fn drop_owner_lock(&self) {
        let lock = self.owner_lock.lock().ok().and_then(|mut l| l.take());
        drop(lock);
    }

    fn released(&self) -> Option<lease_core::Generation> {
        self.released.lock().ok().and_then(|r| *r)
    }

    fn request_stop(&self) {
        if let Ok(mut s) = self.stop.lock() {
            *s = true;
        }
        self.wake.notify_all();
    }

    fn fence(&self, why: String) {
        if let Ok(mut f) = self.fenced.lock() {
            if f.is_none() {
                *f = Some(why);
            }
        }
        self.wake.notify_all();
    }

    fn fenced(&self) -> Option<String> {
        self.fenced.lock().ok().and_then(|f| f.clone())
    }

    fn last_ok(&self) -> Instant {
        self.last_ok_started
            .lock()
            .map(|t| *t)
            .unwrap_or_else(|p| *p.into_inner())
    }

    /// Whether the self-fence deadline has passed at `now` (PROTOCOL.md §7.11).
    fn self_fenced_at(&self, now: Instant) -> bool {
        let start = self.last_ok();
        // `must_self_fence` takes monotonic readings as durations from any common base.
        let base = start.min(now);
        must_self_fence(&self.policy, start - base, now - base)
    }

    /// Send `sig` to the command's process group, if it still exists (not yet reaped).
    fn signal_group(&self, sig: Signal) {
        if let Ok(c) = self.child.lock() {
            if let ChildState::Running(pgid) = *c {
                // ESRCH (already gone) is fine.
                let _ = rustix::process::kill_process_group(pgid, sig);
            }
        }
    }
}

/// How the lease was obtained.
struct Acquired {
    lease: OwnedLease,
    lock: Option<OwnerLock>,
    /// Monotonic reading taken when the claim/takeover started (counts as a heartbeat
    /// start, PROTOCOL.md §7.11 / OQ-16).
    started: Instant,
    how: String,
}

/// One attempt to own the run.
enum Attempt {
    Owned(Box<Acquired>),
    /// The run is held; `waited` says the attempt already paused (waiting on the lock).
    Held {
        err: CliError,
        waited: bool,
    },
    /// Something changed while watching; decide again at once.
    Again,
}

/// `runlease run`. Returns the exit code.
pub fn run(opts: RunOpts, out: Out) -> Result<i32, CliError> {
    let durability = if opts.durable_heartbeats {
        HeartbeatDurability::Durable
    } else {
        HeartbeatDurability::Local
    };
    let policy = TimingPolicy::from_millis(
        opts.heartbeat_ms,
        opts.self_fence_after_ms,
        opts.stale_after_ms,
        durability,
    )?;
    let program = opts
        .command
        .first()
        .cloned()
        .ok_or_else(|| CliError::usage("no command given after `--`"))?;

    // The state shared with the threads; `last_ok_started` is set again once we own the run.
    let shared = Arc::new(Shared {
        policy,
        last_ok_started: Mutex::new(Instant::now()),
        fenced: Mutex::new(None),
        stop: Mutex::new(false),
        release_requested: AtomicBool::new(false),
        released: Mutex::new(None),
        owner_lock: Mutex::new(None),
        wake: Condvar::new(),
        child: Mutex::new(ChildState::NotStarted),
    });

    // Signals first, so a Ctrl-C while we claim is not lost: before the command starts it
    // aborts the acquisition; after, it is forwarded to the command's group.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGUSR1,
    ])
    .map_err(|e| CliError::new("IO_ERROR", 74, format!("cannot handle signals: {e}")))?;
    let signal_handle = signals.handle();
    {
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || {
            for sig in signals.forever() {
                if sig == signal_hook::consts::SIGUSR1 {
                    // A release request; only meaningful while the command runs.
                    let running =
                        matches!(shared.child.lock().map(|c| *c), Ok(ChildState::Running(_)));
                    if running {
                        shared.request_release();
                    }
                    continue;
                }
                let Ok(c) = shared.child.lock() else { return };
                match *c {
                    ChildState::Running(pgid) => {
                        if let Some(s) = Signal::from_named_raw(sig) {
                            let _ = rustix::process::kill_process_group(pgid, s);
                        }
                    }
                    ChildState::NotStarted => {
                        let _ = PENDING_SIGNAL.compare_exchange(
                            0,
                            sig,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        );
                    }
                    ChildState::Reaped => {}
                }
            }
        });
    }

    let mut run = crate::common::create_run(&opts.dir)?;
    preflight_layout(&run)?;
    let abs = std::fs::canonicalize(&opts.dir)
        .or_else(|_| std::path::absolute(&opts.dir))
        .unwrap_or_else(|_| opts.dir.clone());

    let Acquired {
        lease,
        lock,
        started,
        how,
    } = acquire(&mut run, &abs, &opts, policy, out)?;
    let run = Arc::new(run);
    if let Ok(mut t) = shared.last_ok_started.lock() {
        *t = started;
    }

    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/run/1",
            "event": "owned",
            "run": abs.display().to_string(),
            "run_id": lease.run_id.to_string(),
            "generation": lease.generation.get(),
            "owner_id": lease.owner_id.to_string(),
            "how": how,
            "policy": policy_json(&policy),
            "owner_lock": lock.is_some(),
        }));
    } else {
        out.info(&format!(
            "{how} {} at generation {} as owner {}{}",
            opts.dir.display(),
            lease.generation,
            lease.owner_id,
            if lock.is_some() {
                ""
            } else {
                " (without the kernel owner lock: a stopping or replaced owner still holds it)"
            }
        ));
    }

    // A fenced owner starts nothing (the claim itself counts as the first heartbeat).
    if shared.self_fenced_at(Instant::now()) {
        drop(lock);
        return Err(CliError::new(
            "FENCED",
            75,
            format!(
                "run {}: generation {} self-fenced before the command could start (more than {} ms since the claim started); nothing was started or released",
                lease.run_id,
                lease.generation,
                policy.self_fence_after_ms()
            ),
        ));
    }

    // Spawn the command in its own process group.
    let mut cmd = std::process::Command::new(&program);
    cmd.args(&opts.command[1..])
        .env("RUNLEASE_RUN", &abs)
        .env("RUNLEASE_GENERATION", lease.generation.get().to_string())
        .env("RUNLEASE_OWNER", lease.owner_id.as_str())
        .process_group(0);
    if std::io::stdin().is_terminal() {
        // The command is not in the terminal's foreground group: reading the terminal
        // would stop it. It gets end-of-file instead (interactive commands: not yet).
        cmd.stdin(std::process::Stdio::null());
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // Nothing ran: hand the run back cleanly.
            let _ = run.release(&lease, wall_now()?, None);
            drop(lock);
            let exit = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            return Err(CliError::new(
                "COMMAND_NOT_STARTED",
                exit,
                format!(
                    "cannot start {}: {e}; the run was released",
                    program.to_string_lossy()
                ),
            ));
        }
    };
    let pgid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX))
        .ok_or_else(|| CliError::new("INTERNAL", 70, "the command has no valid pid"))?;
    {
        // The signal forwarder and the watchdog see the group from now on; a signal that
        // arrived before is forwarded now.
        let mut c = shared.child.lock().map_err(|_| poisoned())?;
        *c = ChildState::Running(pgid);
        let pending = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
        if let Some(s) = Signal::from_named_raw(pending).filter(|_| pending != 0) {
            let _ = rustix::process::kill_process_group(pgid, s);
        }
    }

    if let Ok(mut l) = shared.owner_lock.lock() {
        *l = lock;
    }
    let heartbeat = {
        let shared = Arc::clone(&shared);
        let run = Arc::clone(&run);
        let lease = lease.clone();
        std::thread::spawn(move || heartbeat_loop(&shared, &run, &lease, started))
    };
    let watchdog = {
        let shared = Arc::clone(&shared);
        std::thread::spawn(move || watchdog_loop(&shared))
    };

    // Wait for the command to exit WITHOUT reaping it, so its pid (= the group id) stays
    // reserved while anything may still signal the group. Stops are watched too: the
    // command runs in a background process group, so touching the terminal stops it
    // (SIGTTIN/SIGTTOU) and it would hang there holding the run.
    loop {
        match rustix::process::waitid(
            WaitId::Pid(pgid),
            WaitIdOptions::EXITED | WaitIdOptions::STOPPED | WaitIdOptions::NOWAIT,
        ) {
            Ok(Some(st)) if st.stopped() => {
                // Consume this stop report so the next wait blocks until something new.
                let _ = rustix::process::waitid(
                    WaitId::Pid(pgid),
                    WaitIdOptions::STOPPED | WaitIdOptions::NOHANG,
                );
                let sig = st.stopping_signal().unwrap_or(0);
                if sig == signal_hook::consts::SIGTTIN || sig == signal_hook::consts::SIGTTOU {
                    eprintln!(
                        "runlease: the command was stopped by {}: it tried to use the terminal, which runlease does not hand to commands yet (they run in their own background process group); terminating it",
                        if sig == signal_hook::consts::SIGTTIN {
                            "SIGTTIN"
                        } else {
                            "SIGTTOU"
                        }
                    );
                    shared.signal_group(Signal::TERM);
                    shared.signal_group(Signal::CONT);
                }
            }
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                return Err(CliError::new(
                    "IO_ERROR",
                    74,
                    format!("waiting for the command failed: {e}"),
                ));
            }
        }
    }
    let status = {
        let mut c = shared.child.lock().map_err(|_| poisoned())?;
        // Whatever the command left running in its group goes with it: nobody may act for
        // this generation after the release.
        let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
        let status = child.wait().map_err(|e| {
            CliError::new("IO_ERROR", 74, format!("reaping the command failed: {e}"))
        })?;
        *c = ChildState::Reaped;
        status
    };
    signal_handle.close();

    // Barrier: no heartbeat after this point.
    shared.request_stop();
    let _ = heartbeat.join();
    let _ = watchdog.join();

    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));

    let released_on_request = shared.released();
    let fenced = shared.fenced().or_else(|| {
        (released_on_request.is_none() && shared.self_fenced_at(Instant::now())).then(|| {
            format!(
                "self-fence: the last successful heartbeat started more than {} ms ago",
                policy.self_fence_after_ms()
            )
        })
    });
    if let Some(why) = fenced {
        shared.drop_owner_lock();
        return Err(CliError::new(
            "FENCED",
            75,
            format!(
                "run {}: generation {} is fenced ({why}); the command's process group was killed (it exited with {code}); nothing was released or written",
                lease.run_id, lease.generation
            ),
        )
        .with_extra(json!({"generation": lease.generation.get(), "command_exit": code})));
    }

    let released = match released_on_request {
        // Released while the command ran (SIGUSR1): nothing more to write.
        Some(g) => Ok(g),
        None => run.release(&lease, wall_now()?, None),
    };
    shared.drop_owner_lock();
    match released {
        Ok(g) => {
            if out.json {
                out.json_line(&json!({
                    "schema": "runlease/cli/run/1",
                    "event": "released",
                    "run": abs.display().to_string(),
                    "generation": lease.generation.get(),
                    "released_as": g.get(),
                    "command_exit": code,
                    "on_request": released_on_request.is_some(),
                }));
            } else if released_on_request.is_none() {
                out.info(&format!(
                    "released {} (generation {}); the command exited with {code}",
                    opts.dir.display(),
                    g
                ));
            } else {
                out.info(&format!(
                    "the command exited with {code} (the run was released as generation {g} on its request)"
                ));
            }
            Ok(code)
        }
        Err(e) => Err(CliError::from(e).with_hint(format!("the command exited with {code}"))),
    }
}

/// Before claiming: list every protocol folder, so a misplaced file or a symlinked folder
/// (`RUN_LAYOUT_INVALID`, 65) is refused before anything is written, instead of surfacing
/// at the release, after the command ran, with the run left claimed.
fn preflight_layout(run: &RunDir) -> Result<(), CliError> {
    for d in lease_core::Dir::ALL {
        run.perform(lease_core::ops::Request::List(d))?;
    }
    Ok(())
}

fn poisoned() -> CliError {
    CliError::new("INTERNAL", 70, "internal lock poisoned")
}

/// The heartbeat thread: beat every `heartbeat` ms, timed from the START of the previous
/// beat; record the monotonic start of each successful beat.
fn heartbeat_loop(shared: &Shared, run: &RunDir, lease: &OwnedLease, claim_started: Instant) {
    let interval = shared.policy.heartbeat();
    let mut count: u64 = 1;
    let mut next = claim_started + interval;
    loop {
        let wait = next.saturating_duration_since(Instant::now());
        if shared.sleep_or_release(wait) || shared.fenced().is_some() {
            return;
        }
        if shared.release_requested.load(Ordering::SeqCst) {
            release_on_request(shared, run, lease);
            return;
        }
        // Read the monotonic start and the wall time together, before the write (§10).
        let started = Instant::now();
        if shared.self_fenced_at(started) {
            // A self-fenced owner starts nothing; the watchdog kills the command.
            shared.fence(format!(
                "self-fence: the last successful heartbeat started more than {} ms ago",
                shared.policy.self_fence_after_ms()
            ));
            return;
        }
        let now = match wall_now() {
            Ok(t) => t,
            Err(e) => {
                eprintln!("runlease: warning: heartbeat skipped: {}", e.message);
                next = started + interval;
                continue;
            }
        };
        match run.heartbeat(lease, now, count) {
            Ok(()) => {
                if let Ok(mut t) = shared.last_ok_started.lock() {
                    if started > *t {
                        *t = started;
                    }
                }
                count += 1;
            }
            Err(e) if e.code() == "FENCED" => {
                shared.fence(e.to_string());
                return;
            }
            Err(e) => {
                // Not fatal by itself: the self-fence rule decides (PROTOCOL.md §7.2).
                eprintln!(
                    "runlease: warning: heartbeat #{count} failed: {e}; the owner self-fences {} ms after its last good heartbeat",
                    shared.policy.self_fence_after_ms()
                );
            }
        }
        next = started + interval;
    }
}

/// Release the lease on the command's request (SIGUSR1), from the heartbeat thread (the
/// only writer, so no heartbeat can follow the release). A fenced or self-fenced owner
/// writes nothing: it fences instead and the watchdog kills the command. On an error that
/// is not `FENCED`, the owner keeps the lease (the watchdog then enforces the self-fence
/// rule, since no heartbeat follows) and the requester times out.
fn release_on_request(shared: &Shared, run: &RunDir, lease: &OwnedLease) {
    if shared.self_fenced_at(Instant::now()) {
        shared.fence(format!(
            "self-fence: the last successful heartbeat started more than {} ms ago",
            shared.policy.self_fence_after_ms()
        ));
        return;
    }
    let now = match wall_now() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("runlease: warning: release request failed: {}", e.message);
            return;
        }
    };
    match run.release(lease, now, None) {
        Ok(g) => {
            if let Ok(mut r) = shared.released.lock() {
                *r = Some(g);
            }
            // A clean hand-over: the next owner on this host need not wait for our exit.
            shared.drop_owner_lock();
            eprintln!(
                "runlease: released generation {} as generation {g} on request; the command runs on without the lease",
                lease.generation
            );
        }
        Err(e) if e.code() == "FENCED" => shared.fence(e.to_string()),
        Err(e) => eprintln!("runlease: warning: release request failed: {e}"),
    }
}

/// The watchdog OS thread: every 100 ms, if the owner is fenced (a FENCED heartbeat) or
/// past its self-fence deadline, SIGKILL the command's group; keep doing it until the main
/// thread has reaped the command.
fn watchdog_loop(shared: &Shared) {
    loop {
        if shared.sleep(WATCHDOG_TICK) || shared.released().is_some() {
            // Released on request: there is no lease left to lose.
            return;
        }
        let now = Instant::now();
        if shared.fenced().is_none() && shared.self_fenced_at(now) {
            shared.fence(format!(
                "self-fence: the last successful heartbeat started more than {} ms ago",
                shared.policy.self_fence_after_ms()
            ));
        }
        if shared.fenced().is_some() {
            shared.signal_group(Signal::KILL);
        }
    }
}

fn check_pending_signal() -> Result<(), CliError> {
    let sig = PENDING_SIGNAL.load(Ordering::SeqCst);
    if sig != 0 {
        return Err(CliError::new(
            "INTERRUPTED",
            128 + sig,
            format!("interrupted by signal {sig} before the command started; nothing was claimed"),
        ));
    }
    Ok(())
}

/// A one-line progress message on stderr, only when stderr is a terminal.
struct Progress {
    tty: bool,
    shown: bool,
}

impl Progress {
    fn new(out: Out) -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal() && !out.quiet && !out.json,
            shown: false,
        }
    }
    fn show(&mut self, msg: &str) {
        if self.tty {
            let mut msg = msg.to_string();
            msg.truncate(200);
            eprint!("\r\x1b[Krunlease: {msg}");
            self.shown = true;
        }
    }
    fn clear(&mut self) {
        if self.shown {
            eprint!("\r\x1b[K");
            self.shown = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Own the run: claim, or (as the flags allow) retire a dead owner or take over a stale
/// one; wait while it is held if `--wait` was given.
fn acquire(
    run: &mut RunDir,
    abs: &Path,
    opts: &RunOpts,
    policy: TimingPolicy,
    out: Out,
) -> Result<Acquired, CliError> {
    let began = Instant::now();
    let deadline = match opts.wait {
        None => None,
        Some(WaitFor::Forever) => Some(None),
        Some(WaitFor::For(d)) => Some(Some(began + d)),
    };
    let poll = policy.heartbeat().min(MAX_WAIT_POLL);
    let mut progress = Progress::new(out);
    let mut lock_timeout = LOCK_TIMEOUT;
    let mut held_once = false;
    loop {
        check_pending_signal()?;
        match attempt(run, abs, opts, policy, lock_timeout, &mut progress)? {
            Attempt::Owned(a) => {
                if held_once {
                    // The one line a non-terminal stderr gets about the wait.
                    progress.clear();
                    out.info(&format!(
                        "waited {} for {}",
                        human_ms(i64::try_from(began.elapsed().as_millis()).unwrap_or(i64::MAX)),
                        opts.dir.display()
                    ));
                }
                return Ok(*a);
            }
            Attempt::Again => continue,
            Attempt::Held { err, waited } => {
                let Some(deadline) = deadline else {
                    return Err(err);
                };
                held_once = true;
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    return Err(err.with_hint(format!(
                        "gave up after waiting {}",
                        human_ms(i64::try_from(began.elapsed().as_millis()).unwrap_or(i64::MAX))
                    )));
                }
                let who = match err.extra.as_ref().and_then(|x| x.get("holder")) {
                    Some(h) => format!(
                        "held by owner {} (pid {} on {}, generation {})",
                        h["owner_id"].as_str().unwrap_or("?"),
                        h["pid"],
                        h["host"].as_str().unwrap_or("?"),
                        h["generation"]
                    ),
                    None => "its owner lock is held".into(),
                };
                progress.show(&format!(
                    "waiting {} for {}: {who}",
                    human_ms(i64::try_from(began.elapsed().as_millis()).unwrap_or(i64::MAX)),
                    opts.dir.display(),
                ));
                let remaining = deadline.map_or(poll, |d| d.saturating_duration_since(now));
                let step = poll.min(remaining).max(Duration::from_millis(10));
                if !waited {
                    std::thread::sleep(step);
                }
                // Next time, wait on the kernel lock itself: we get it within 10 ms of the
                // holder's exit.
                lock_timeout = step;
            }
        }
    }
}

/// The refusal for a held run: the claim's code (or `RUN_ALREADY_ACTIVE` when only the
/// owner lock told us), who holds it, and the next step.
fn held_error(run: &RunDir, code: Option<&str>, view: &StatusView, hint: &str) -> CliError {
    let (desc, extra) = held_description(view);
    let code = code.unwrap_or(match view.status {
        Status::Stale => "RUN_STALE_REQUIRES_TAKEOVER",
        _ => "RUN_ALREADY_ACTIVE",
    });
    let lock_note =
        if code == "RUN_ALREADY_ACTIVE" && view.head.as_ref().is_none_or(|h| !h.is_active()) {
            " (a process on this host holds its owner lock: it is starting or stopping)"
        } else {
            ""
        };
    CliError::new(
        code,
        76,
        format!("run {} is {desc}{lock_note}; {hint}", run.run_id()),
    )
    .with_extra(extra)
}

fn attempt(
    run: &mut RunDir,
    abs: &Path,
    opts: &RunOpts,
    policy: TimingPolicy,
    lock_timeout: Duration,
    progress: &mut Progress,
) -> Result<Attempt, CliError> {
    let lock = OwnerLock::acquire_timeout(abs, lock_timeout).map_err(|e| {
        CliError::new(
            "IO_ERROR",
            74,
            format!("cannot take the owner lock of {}: {e}", abs.display()),
        )
    })?;
    // Holding the lock proves no other live process on this boot holds it.
    let liveness = match &lock {
        Some(_) => ProcLiveness::new(abs).holding_lock(),
        None => ProcLiveness::new(abs),
    };
    run.set_liveness(Arc::new(liveness));
    let holder = this_holder()?;

    // Without the lock: a free run is claimed anyway (the exclusive creation of the next
    // epoch decides between racers; the lock only serves to prove a dead owner dead). The
    // lock is then held by a process that is stopping, or by a stopped owner that was
    // taken over: waiting for it would block every new owner until that process exits.
    let free_without_lock = lock.is_none() && {
        let view = run.status(wall_now()?, false)?;
        if let Status::Invalid(e) = view.status {
            return Err(e.into());
        }
        view.status == Status::Free
    };
    if lock.is_none() && !free_without_lock {
        let view = run.status(wall_now()?, true)?;
        if let Status::Invalid(e) = view.status {
            return Err(e.into());
        }
        if view.status == Status::Free {
            return Ok(Attempt::Again);
        }
        if view.status == Status::Stale && opts.takeover_stale {
            return watch_and_take_over(run, &view, opts, policy, None, progress);
        }
        let hint = match view.status {
            Status::Stale => {
                "its process still holds the owner lock (stopped?): add --takeover-stale, or see `runlease status`"
            }
            _ => "wait (--wait), or ask the owner to release",
        };
        return Ok(Attempt::Held {
            err: held_error(run, None, &view, hint),
            // Waiting on the kernel lock was the pause.
            waited: true,
        });
    }

    let started = Instant::now();
    let claimed = run.claim(new_owner_id()?, holder.clone(), policy, wall_now()?);
    let err = match claimed {
        Ok(lease) => {
            return Ok(Attempt::Owned(Box::new(Acquired {
                lease,
                lock,
                started,
                how: "claimed".into(),
            })));
        }
        Err(e)
            if matches!(
                e.code(),
                "RUN_ALREADY_ACTIVE" | "RUN_STALE_REQUIRES_TAKEOVER"
            ) =>
        {
            e
        }
        Err(e) => return Err(e.into()),
    };
    let view = run.status(wall_now()?, true)?;
    if let Status::Invalid(e) = view.status {
        return Err(e.into());
    }
    match (&view.status, &view.head) {
        (Status::Free, _) => Ok(Attempt::Again),
        (Status::Dead, Some(head)) if opts.retire_dead => {
            let retired = match run.retire(
                new_owner_id()?,
                holder.clone(),
                policy,
                wall_now()?,
                Some(Expectation::of(head)),
                new_nonce()?,
            ) {
                Ok(r) => r,
                Err(e) if e.code() == "TAKEOVER_RACE" => return Ok(Attempt::Again),
                Err(e) => return Err(e.into()),
            };
            let started = Instant::now();
            match run.claim(new_owner_id()?, holder, policy, wall_now()?) {
                Ok(lease) => Ok(Attempt::Owned(Box::new(Acquired {
                    lease,
                    lock,
                    started,
                    how: format!(
                        "retired dead owner {} (generation {}, its events through {} count) and claimed",
                        head.epoch.owner_id, retired.retired, retired.cutoff
                    ),
                }))),
                Err(e) if matches!(e.code(), "RUN_ALREADY_ACTIVE" | "TAKEOVER_RACE") => {
                    Ok(Attempt::Again)
                }
                Err(e) => Err(e.into()),
            }
        }
        (Status::Stale | Status::Dead, Some(_)) if opts.takeover_stale && is_stale(&view) => {
            watch_and_take_over(run, &view, opts, policy, lock, progress)
        }
        (status, _) => {
            let hint = match status {
                Status::Dead => format!(
                    "the owner is definitely dead: add --retire-dead, or run `runlease retire {}`",
                    crate::common::shell_path(&opts.dir)
                ),
                Status::Stale => "the owner is stale: add --takeover-stale, or see `runlease status` for an exact `runlease takeover`".into(),
                _ => "wait (--wait), or ask the owner to release".into(),
            };
            Ok(Attempt::Held {
                err: held_error(run, Some(err.code()), &view, &hint),
                waited: false,
            })
        }
    }
}

/// Automatic takeover: watch the stale head's `(generation, owner, heartbeat_at, count)`
/// on our monotonic clock, polling every heartbeat; once it has stayed unchanged for more
/// than the old owner's `stale_after`, take over with `TakeoverTrigger::Automatic`.
fn watch_and_take_over(
    run: &RunDir,
    first: &StatusView,
    opts: &RunOpts,
    policy: TimingPolicy,
    lock: Option<OwnerLock>,
    progress: &mut Progress,
) -> Result<Attempt, CliError> {
    let Some(head) = first.head.clone() else {
        return Ok(Attempt::Again);
    };
    let key = |h: &lease_core::ops::Head| {
        (
            h.generation(),
            h.epoch.owner_id.clone(),
            h.heartbeat_at(),
            h.heartbeat_count(),
        )
    };
    let watched_key = key(&head);
    let stale_after = head.epoch.policy.stale_after();
    let poll = policy.heartbeat().min(head.epoch.policy.heartbeat());
    let since = Instant::now();
    loop {
        let watched = since.elapsed();
        if watched > stale_after {
            break;
        }
        progress.show(&format!(
            "stale owner {} of {}: record unchanged for {} of the {} needed before an automatic takeover",
            head.epoch.owner_id,
            opts.dir.display(),
            human_ms(i64::try_from(watched.as_millis()).unwrap_or(i64::MAX)),
            human_ms(i64::try_from(stale_after.as_millis()).unwrap_or(i64::MAX)),
        ));
        std::thread::sleep(
            poll.min(stale_after.saturating_sub(watched) + Duration::from_millis(1)),
        );
        check_pending_signal()?;
        let view = run.status(wall_now()?, false)?;
        if view.head.as_ref().map(key) != Some(watched_key.clone()) {
            // It beat, released or was replaced: decide again.
            return Ok(Attempt::Again);
        }
    }
    progress.clear();
    let watched_unchanged_ms = u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX);
    let started = Instant::now();
    match run.takeover(
        new_owner_id()?,
        this_holder()?,
        policy,
        wall_now()?,
        Expectation::of(&head),
        TakeoverTrigger::Automatic {
            watched_unchanged_ms,
        },
        new_nonce()?,
    ) {
        Ok(lease) => Ok(Attempt::Owned(Box::new(Acquired {
            lease,
            lock,
            started,
            how: format!(
                "took over from stale owner {} (generation {}, unchanged for {}) and own",
                head.epoch.owner_id,
                head.generation(),
                human_ms(i64::try_from(watched_unchanged_ms).unwrap_or(i64::MAX))
            ),
        }))),
        Err(e) if matches!(e.code(), "TAKEOVER_RACE" | "TAKEOVER_ACTIVE_REFUSED") => {
            Ok(Attempt::Again)
        }
        Err(e) => Err(e.into()),
    }
}
