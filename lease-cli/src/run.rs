//! `runlease run`: own a run and run one command under the lease, on the lease-run
//! lifecycle ([`lease_run::Run`]).
//!
//! # What this does
//!
//! 1. Create the run folder if missing, or use an empty one or a run (`lease/epochs/`);
//!    a non-empty folder that is not a run, or `.`/`..`/`/` that is not one, only with
//!    `--init` (`RUN_FOLDER_FOREIGN`, 64). The root, every existing layout folder and the
//!    root files must be ours and not open to others (`RUN_NOT_OWNED`, 77); nothing is
//!    chmodded. Then check its layout (a misplaced file or a symlinked folder is refused,
//!    65, before anything is written). Before all of this, check that the program can be
//!    started (126 not executable, 127 not found: nothing is created or claimed).
//! 2. Open the run with [`Run::open`] (its crate docs give the order): kernel owner lock,
//!    `run.json`, claim (with `--retire-dead`, a definitely-dead owner is retired first;
//!    with `--takeover-stale`, a stale owner's record is first watched unchanged for its
//!    `stale_after` on `CLOCK_BOOTTIME`, then taken over as an `automatic` takeover),
//!    heartbeat (reporting the store head), the self-fence on `CLOCK_BOOTTIME` and the
//!    watchdog thread, the layout, reap-or-refuse of a killed incarnation's commands (so a
//!    command left running by a `kill -9`ed `runlease run` is killed by the next owner on
//!    this boot), the store and its seal check. A held run is refused (exit 76, the holder
//!    named) or waited for (`--wait`; a progress line on a terminal only).
//! 3. Spawn the command with [`Run::spawn`]: its command record is durable before it
//!    runs; it gets `RUNLEASE_RUN` (the absolute run folder), `RUNLEASE_GENERATION` and
//!    `RUNLEASE_OWNER`; its own process group; stdio inherited, except that a terminal
//!    stdin is replaced by `/dev/null` in runlease itself before the spawn (the command
//!    is not in the terminal's foreground group: reading the terminal would stop it). A
//!    command stopped by SIGTTIN/SIGTTOU anyway is terminated with a message.
//! 4. SIGINT, SIGTERM and SIGHUP are forwarded to the command; a second SIGINT or SIGTERM,
//!    or `--kill-after DURATION` past the first, SIGKILLs the command and everything it
//!    started, and the run is then released `failed` as usual. SIGUSR1 releases nothing
//!    (any process of this user could send it); it is only kept from terminating the
//!    owner. Forwarding goes through lease-run's `Run::command_signaller` (every process
//!    the run tracks, proved ours; its group once the run was handed over). Before the
//!    command started these signals abort the open: 128+N, and an open run is released
//!    `failed`. A request on
//!    the store socket (`Run::release_requested`, checked with the command's secret) is a
//!    *release request* (from `runlease release` run by the command):
//!    [`Run::release_detached`] hands the run over (`run.json` `paused`, store sealed, lease
//!    released) while the command runs on without the lease, untracked (its later
//!    `runlease append` exits 75); runlease exits with its code when it ends.
//! 5. On the command's exit: [`Run::release`] (anything left in its group is stopped, the
//!    store sealed, `run.json` `done` for exit 0, else `failed` with the exit code or signal
//!    as detail, the lease released) and runlease exits with the command's code (128+N if
//!    it was killed by signal N).
//! 6. On a fence (lost lease, or no successful heartbeat for `self_fence_after`): once
//!    the watchdog has confirmed every command process dead, runlease exits 75 without
//!    writing anything more. While runlease is stopped (SIGSTOP, a frozen VM) its watchdog
//!    is stopped too: the guard process it started beside the command (this binary as
//!    `runlease __guard`, [`GUARD_ARG`]; lease-run's `guard`) kills the command by the
//!    self-fence deadline instead, and a resumed runlease fences and exits 75 as above.
//!
//! **Semantics that changed with lease-run** (see the report's DECISIONS): the kernel
//! owner lock is taken first, so while any process on this host holds it (a stopped or
//! stuck owner, even one already replaced, which also still holds the store open) `run`
//! refuses with 76 and says how to unwedge it, instead of claiming a free run without the
//! lock. **Partial:** the command's arguments must be UTF-8 (they are recorded in the
//! command record); the terminal is not handed to the command (no `tcsetpgrp`).

use crate::error::{CliError, EX_SOFTWARE};
use crate::holder::{held_description, policy_json};
use crate::open::{Lease, init_run, open_lease};
use crate::output::{Out, Progress};
use crate::stamps::wall_now;
use crate::text::{human_duration, shell_path};
use lease_cli::cli::WaitFor;
use lease_core::Code;
use lease_core::LeaseOps;
use lease_core::{HeartbeatDurability, TimingPolicy};
use lease_run::{
    Acquire, AcquireError, Acquired, Authority, FinalStatus, Held, NextStep, OpenOptions, Run,
    RunError, Wait,
};
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use serde_json::json;
use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

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
    /// `--kill-after`: SIGKILL the command's tree this long after a forwarded SIGINT or
    /// SIGTERM if it still runs.
    pub kill_after: Option<std::time::Duration>,
    /// `--init`: make RUN_DIR a run even if it is a non-empty folder or `.`, `..`, `/`.
    pub init: bool,
    /// The command and its arguments.
    pub command: Vec<OsString>,
    /// Where the lease lives (`--authority`).
    pub authority: Authority,
}

/// The first signal received before the command started (0: none).
static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// What happened to the command's process group.
#[derive(Debug, Clone)]
enum ChildState {
    NotStarted,
    /// Running (or exited but not yet reaped, so its pid is still its group id). Signals
    /// go to the run's commands through lease-run's `CommandSignaller` (every tracked,
    /// proved-ours process: the library's own forwarding, as `Run::release_on_signals`
    /// does); once the run was handed over (`release_detached`: nothing is tracked any
    /// more), to the group itself.
    Running(Pid, Option<lease_run::CommandSignaller>),
    /// Reaped: the group id may be reused, never signal it again.
    Reaped,
}

/// State shared with the signal thread.
struct Fwd {
    child: Mutex<ChildState>,
    /// Whether a SIGINT or SIGTERM was already forwarded to the running command: the next
    /// one escalates to SIGKILL of its whole tree.
    stop_forwarded: std::sync::atomic::AtomicBool,
    /// `--kill-after`.
    kill_after: Option<std::time::Duration>,
}

impl Fwd {
    fn set(&self, s: ChildState) {
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    fn state(&self) -> ChildState {
        self.child.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The name of a signal runlease handles, for its messages.
fn signal_name(sig: i32) -> &'static str {
    match sig {
        signal_hook::consts::SIGINT => "SIGINT",
        signal_hook::consts::SIGTERM => "SIGTERM",
        signal_hook::consts::SIGHUP => "SIGHUP",
        signal_hook::consts::SIGUSR1 => "SIGUSR1",
        _ => "a signal",
    }
}

/// SIGKILL the command and everything the run tracks of it (its groups, known
/// descendants and adopted orphans through pidfds, its cgroup through `cgroup.kill`), or
/// its group once the run was handed over. The command's exit is then seen as usual and
/// the run released `failed` (signal 9), cleanly.
fn escalate(state: ChildState, why: &str) {
    let ChildState::Running(pgid, to) = state else {
        return;
    };
    // Never `eprintln!` on this thread: it panics on a closed stderr.
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("runlease: {why}: killing the command and everything it started (SIGKILL)\n"),
    );
    match to {
        Some(to) => to.signal(Signal::KILL),
        None => {
            let _ = rustix::process::kill_process_group(pgid, Signal::KILL);
        }
    }
}

/// The search path `/bin/sh` (dash) uses when `PATH` is unset; the spawn gate's `exec`
/// looks the program up with it then.
const SH_DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Check that `program` can be started the way the spawn gate's `/bin/sh` `exec` will
/// start it (execvp's lookup: a name with a `/` is used as it is; a bare name is searched
/// in `PATH`, an empty entry meaning the current folder, and `/bin/sh`'s default path
/// when `PATH` is unset): 127 when not found, 126 when found but not a file this process
/// may execute (`faccessat(X_OK, AT_EACCESS)`: the effective ids, as `execve` judges).
/// Checked first of all, before the run folder is created or anything claimed, so
/// `runlease run DIR -- no-such-program` leaves no trace. A program that vanishes between
/// this check and the exec gets the same codes from the shell (after the claim).
fn check_program(program: &str) -> Result<(), CliError> {
    let executable = |p: &Path| -> std::io::Result<bool> {
        let m = std::fs::metadata(p)?;
        Ok(m.is_file()
            && rustix::fs::accessat(
                rustix::fs::CWD,
                p,
                rustix::fs::Access::EXEC_OK,
                rustix::fs::AtFlags::EACCESS,
            )
            .is_ok())
    };
    let not_started = |exit: i32, why: &str| {
        CliError::new(
            Code::CommandNotStarted,
            exit,
            format!("cannot start {program}: {why}; nothing was created or claimed"),
        )
    };
    if program.contains('/') {
        return match executable(Path::new(program)) {
            Ok(true) => Ok(()),
            Ok(false) => Err(not_started(126, "not an executable file")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(not_started(127, "no such file"))
            }
            Err(e) => Err(not_started(126, &e.to_string())),
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| SH_DEFAULT_PATH.into());
    let mut found_other = false;
    for d in std::env::split_paths(&path) {
        let d = if d.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            d
        };
        match executable(&d.join(program)) {
            Ok(true) => return Ok(()),
            Ok(false) => found_other = true,
            Err(_) => {}
        }
    }
    if found_other {
        Err(not_started(126, "found in PATH but not an executable file"))
    } else {
        Err(not_started(127, "not found in PATH"))
    }
}

/// The hidden first argument that makes `runlease` the guard process of a `runlease run`
/// (`lease_run::guard`): the owner re-executes its own binary with it at the first
/// command, so the command is killed by the self-fence deadline even while the owner is
/// stopped (issue #31).
pub(crate) const GUARD_ARG: &str = "__guard";

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
    let argv: Vec<String> = opts
        .command
        .iter()
        .map(|a| {
            a.to_str().map(str::to_string).ok_or_else(|| {
                CliError::usage(format!(
                    "the command's arguments must be UTF-8 (they are recorded in the run's command record): {}",
                    a.to_string_lossy()
                ))
            })
        })
        .collect::<Result<_, _>>()?;
    if argv.first().is_none_or(|p| p.is_empty()) {
        return Err(CliError::usage("no command given after `--`"));
    }
    // The program first: one that cannot be started creates nothing (no folder, no
    // layout, no claim).
    check_program(&argv[0])?;
    // This host as the holder the claim records: a host name no record may hold is
    // refused here (ARGUMENT_INVALID naming it), before the folder is created.
    lease_run::folder::this_holder().map_err(CliError::from)?;
    // lease-run's own checks of the options (e.g. the stale_after - self_fence_after
    // margin its watchdog needs), before anything is created.
    let abs_guess = std::path::absolute(&opts.dir).unwrap_or_else(|_| opts.dir.clone());
    OpenOptions {
        policy,
        authority: opts.authority.clone(),
        ..OpenOptions::default()
    }
    .validate(&abs_guess)
    .map_err(|e| CliError::usage(CliError::from(e).message))?;

    let fwd = Arc::new(Fwd {
        child: Mutex::new(ChildState::NotStarted),
        stop_forwarded: std::sync::atomic::AtomicBool::new(false),
        kill_after: opts.kill_after,
    });
    // Signals first, so a Ctrl-C while we open is not lost: before the command starts it
    // aborts the open; after, it is forwarded to the command's group. A second SIGINT or
    // SIGTERM (or `--kill-after` past the first) SIGKILLs the command's tree. SIGUSR1 is
    // handled only so that it cannot terminate the owner: it releases nothing (any process
    // of this user could send it; a release request comes over the store socket, which
    // checks the command's secret).
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGHUP,
        signal_hook::consts::SIGUSR1,
    ])
    .map_err(|e| CliError::of(Code::IoError, format!("cannot handle signals: {e}")))?;
    let signal_handle = signals.handle();
    {
        let fwd = Arc::clone(&fwd);
        std::thread::spawn(move || {
            for sig in signals.forever() {
                let c = fwd.state();
                match (sig, c) {
                    (signal_hook::consts::SIGUSR1, _) => {
                        let _ = std::io::Write::write_fmt(
                            &mut std::io::stderr(),
                            format_args!(
                                "runlease: SIGUSR1 ignored: it releases nothing (run `runlease release` inside the command: it asks over the store socket)\n"
                            ),
                        );
                    }
                    (_, c @ ChildState::Running(..)) => {
                        let stop = sig == signal_hook::consts::SIGINT
                            || sig == signal_hook::consts::SIGTERM;
                        if stop && fwd.stop_forwarded.swap(true, Ordering::SeqCst) {
                            escalate(c, &format!("a second stop signal ({})", signal_name(sig)));
                            continue;
                        }
                        if let (ChildState::Running(pgid, to), Some(s)) =
                            (&c, Signal::from_named_raw(sig))
                        {
                            match to {
                                Some(to) => to.signal(s),
                                None => {
                                    let _ = rustix::process::kill_process_group(*pgid, s);
                                }
                            }
                        }
                        if let (true, Some(after)) = (stop, fwd.kill_after) {
                            let fwd = Arc::clone(&fwd);
                            std::thread::spawn(move || {
                                std::thread::sleep(after);
                                // Only the same command, still running (not reaped).
                                let now = fwd.state();
                                if let (ChildState::Running(p, _), ChildState::Running(q, _)) =
                                    (&c, &now)
                                {
                                    if p == q {
                                        escalate(
                                            now,
                                            &format!(
                                                "the command still runs {} after {}",
                                                human_duration(after),
                                                signal_name(sig)
                                            ),
                                        );
                                    }
                                }
                            });
                        }
                    }
                    (_, ChildState::NotStarted) => {
                        let _ = PENDING_SIGNAL.compare_exchange(
                            0,
                            sig,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        );
                    }
                    (_, ChildState::Reaped) => {}
                }
            }
        });
    }

    // A missing or empty folder, or a run; a foreign folder only with --init. Everything
    // that exists is judged (owner, mode) before the first write; nothing is chmodded.
    let rundir = init_run(&opts.dir, opts.init)?.run;
    // The layout and every command record, as the open will judge them: refused (65, 76)
    // before anything is written. The open judges them again under the owner lock, with
    // the lease half of the preflight (the log as `verify` checks it, names above the
    // head, the store the chain names).
    lease_run::preflight(&rundir).map_err(CliError::from)?;
    // `init_run` opened the folder once (a symlink as its last component refused) and
    // holds it: the owner's open works on that very directory (`OpenOptions::folder`),
    // never on a second lookup of the path. The name shown is the argument made absolute
    // (lexically: no lookup), the one the held folder was opened at.
    let held = rundir.real_fs().cloned();
    let abs = held
        .as_ref()
        .map(|f| f.root_path().to_path_buf())
        .unwrap_or_else(|| abs_guess.clone());
    // The observer's view of the lease (the folder itself, or etcd); lease-run opens its
    // own connection for the owner.
    let rundir = open_lease(&opts.dir, &opts.authority, Some(rundir))?;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::of(Code::IoError, format!("cannot start the runtime: {e}")))?;
    let r = rt.block_on(run_async(
        &rundir, &abs, held, &opts, policy, &argv, &fwd, out,
    ));
    signal_handle.close();
    // A blocking step past its deadline must not keep the process alive.
    rt.shutdown_background();
    r
}

#[allow(clippy::too_many_arguments)]
async fn run_async(
    rundir: &Lease,
    abs: &Path,
    held: Option<Arc<lease_run::folder::RealFs>>,
    opts: &RunOpts,
    policy: TimingPolicy,
    argv: &[String],
    fwd: &Fwd,
    out: Out,
) -> Result<i32, CliError> {
    let (run, how) = acquire(abs, held, opts, policy, out).await?;
    let lease = run.lease().clone();
    // Every failed heartbeat is said when it happens, with its code and message (the
    // file it names), so the cause is known before the lease lapses; the fence message
    // names the last one again.
    let _warner = AbortOnDrop(tokio::spawn(warn_heartbeat_failures(
        run.heartbeat_warnings(),
        lease.policy.self_fence_after(),
    )));
    let how = match how {
        Acquired::RetiredDead { from } if lease.generation.get() > from.generation().get() + 1 => {
            format!(
                "retired dead owner {} (generation {}) and claimed",
                from.epoch.owner_id,
                from.generation()
            )
        }
        Acquired::TookOver {
            from,
            watched: Some(watched),
        } => format!(
            "took over from stale owner {} (generation {}, unchanged for {}) and own",
            from.epoch.owner_id,
            from.generation(),
            human_duration(watched)
        ),
        Acquired::TookOver {
            from,
            watched: None,
        } => format!(
            "took over from stale owner {} (generation {}) and own",
            from.epoch.owner_id,
            from.generation()
        ),
        _ => "claimed".to_string(),
    };
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/run/1",
            "event": "owned",
            "run": abs.display().to_string(),
            "run_id": lease.run_id.to_string(),
            "generation": lease.generation.get(),
            "owner_id": lease.owner_id.to_string(),
            "how": how,
            "policy": policy_json(&lease.policy),
            "owner_lock": true,
        }));
    } else {
        out.info(&format!(
            "{how} {} at generation {} as owner {}",
            opts.dir.display(),
            lease.generation,
            lease.owner_id,
        ));
    }
    // PROTOCOL §5.3: on a network or user-space file system lease-run records durable
    // heartbeats whatever was asked; say so once.
    if lease.policy.heartbeat_durability() != policy.heartbeat_durability() && !out.json {
        out.info(&format!(
            "note: {} is on a network or user-space file system (NFS, SMB, FUSE, …), which can lose unsynced writes: heartbeats are durable (fsynced) there",
            opts.dir.display()
        ));
    }

    // A signal that arrived while we opened: release (nothing ran) and stop.
    let pending = PENDING_SIGNAL.load(Ordering::SeqCst);
    if pending != 0 {
        let detail = format!("interrupted by signal {pending} before the command started");
        let released = run.release(FinalStatus::Failed { detail }).await;
        return Err(CliError::new(
            Code::Interrupted,
            128 + pending,
            format!(
                "interrupted by signal {pending} before the command started; {}",
                match released {
                    Ok(()) => "the run was released".to_string(),
                    Err(e) => format!("releasing the run failed: {}", e.code().prefixed(&e)),
                }
            ),
        ));
    }

    if std::io::stdin().is_terminal() {
        // The command is not in the terminal's foreground group: reading the terminal
        // would stop it. It gets end-of-file instead (runlease itself reads no input).
        if let Ok(null) = std::fs::File::open("/dev/null") {
            let _ = rustix::stdio::dup2_stdin(&null);
        }
    }
    // RUNLEASE_RUN (the absolute folder), RUNLEASE_GENERATION and RUNLEASE_OWNER are set
    // by lease-run's spawn itself, for library owners and this CLI alike.
    let mut cmd = match run.spawn(argv, &[]).await {
        Ok(c) => c,
        Err(e) => {
            let e = CliError::from(e);
            if e.code == Code::Fenced {
                drop(run);
                return Err(e.with_hint("nothing was started or released"));
            }
            let released = run
                .release(FinalStatus::Failed {
                    detail: format!("{}: {}", e.code, e.message),
                })
                .await;
            return Err(match released {
                Ok(()) => e.with_hint("the run was released"),
                Err(r) => e.with_hint(format!(
                    "releasing the run failed: {}",
                    r.code().prefixed(&r)
                )),
            });
        }
    };
    let pgid = Pid::from_raw(i32::try_from(cmd.pid()).unwrap_or(i32::MAX))
        .ok_or_else(|| CliError::of(Code::Internal, "the command has no valid pid"))?;
    {
        // The signal thread forwards from now on; a signal that arrived before is sent now.
        let to = run.command_signaller();
        let mut c = fwd.child.lock().unwrap_or_else(|p| p.into_inner());
        *c = ChildState::Running(pgid, Some(to.clone()));
        let pending = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
        if let Some(s) = Signal::from_named_raw(pending).filter(|_| pending != 0) {
            to.signal(s);
        }
    }

    // Wait for the command to exit WITHOUT reaping it (a blocking thread), so its pid (=
    // the group id) stays reserved while the signal thread may still signal the group.
    let (exit_tx, mut exit_rx) = tokio::sync::oneshot::channel::<Result<(), CliError>>();
    {
        let pid = pgid;
        std::thread::spawn(move || {
            let _ = exit_tx.send(wait_exited(pid));
        });
    }

    enum Ended {
        Exited(Result<(), CliError>),
        Fenced(RunError),
        ReleaseRequested,
    }
    let ended = tokio::select! {
        r = &mut exit_rx => Ended::Exited(r.unwrap_or(Ok(()))),
        e = run.fenced() => Ended::Fenced(e),
        () = run.release_requested() => Ended::ReleaseRequested,
    };
    let mut on_request = None;
    let mut release_error = None;
    // Whether the lease was already fenced when the command's exit was seen: then the
    // fence's kill ended it (the watchdog may kill before the fence is reported here).
    let mut fenced_first = false;
    let run = match ended {
        Ended::Exited(r) => {
            r?;
            fenced_first = run.check_live().is_err();
            Some(run)
        }
        Ended::Fenced(e) => {
            // Every command process is confirmed dead; collect the exit code.
            let code = reap(fwd, &mut cmd).await?;
            drop(run);
            return Err(fenced_error(rundir, &lease, e, code));
        }
        Ended::ReleaseRequested => {
            // From here on the command runs without the lease, untracked by the run (the
            // detached release clears the tracking first): signals go to its group itself.
            fwd.set(ChildState::Running(pgid, None));
            match run
                .release_detached(FinalStatus::Paused { wake_at: None })
                .await
            {
                Ok(()) => {
                    let g = released_as(rundir).unwrap_or(lease.generation.get());
                    on_request = Some(g);
                    eprintln!(
                        "runlease: released generation {} as generation {g} on request; the command runs on without the lease",
                        lease.generation
                    );
                }
                Err(e @ RunError::Fenced { .. }) => {
                    // The commands were killed before the fence was reported.
                    let code = reap(fwd, &mut cmd).await?;
                    return Err(fenced_error(rundir, &lease, e, code));
                }
                Err(e) => {
                    eprintln!(
                        "runlease: warning: the release request failed: {}; the run self-fences once its heartbeat lapses",
                        e.code().prefixed(&e)
                    );
                    release_error = Some(CliError::from(e));
                }
            }
            let r = exit_rx.await.unwrap_or(Ok(()));
            r?;
            None
        }
    };
    let status = reap_status(fwd, &mut cmd).await?;
    let code = exit_code(&status);
    if let Some(e) = release_error {
        return Err(e.with_hint(format!("the command exited with {code}")));
    }
    let released = match (run, on_request) {
        (Some(run), _) => {
            // The true cause from the status itself: exit 143 is not signal 15.
            match run.release(FinalStatus::of_exit(status)).await {
                Ok(()) => released_as(rundir).unwrap_or(lease.generation.get()),
                Err(e @ RunError::Fenced { .. }) => {
                    // Fenced while releasing: the command had ended, by the fence's kill
                    // or by itself before the fence was seen.
                    let ended = if fenced_first {
                        "runlease killed the command when the lease was fenced"
                    } else {
                        "the command had exited by itself before the fence was seen; whatever it left running was stopped"
                    };
                    return Err(fenced_error_as(rundir, &lease, e, code, ended));
                }
                Err(e) => {
                    return Err(
                        CliError::from(e).with_hint(format!("the command exited with {code}"))
                    );
                }
            }
        }
        (None, Some(g)) => g,
        (None, None) => lease.generation.get(),
    };
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/run/1",
            "event": "released",
            "run": abs.display().to_string(),
            "generation": lease.generation.get(),
            "released_as": released,
            "command_exit": code,
            "on_request": on_request.is_some(),
        }));
    } else if on_request.is_none() {
        out.info(&format!(
            "released {} (generation {released}); the command exited with {code}",
            opts.dir.display(),
        ));
    } else {
        out.info(&format!(
            "the command exited with {code} (the run was released as generation {released} on its request)"
        ));
    }
    Ok(code)
}

/// A task aborted when its handle is dropped (the heartbeat warnings end with `run_async`).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Say each failed heartbeat on stderr (not suppressed by `--quiet`: it is a warning),
/// until the run is fenced or released.
async fn warn_heartbeat_failures(
    mut warnings: lease_run::HeartbeatWarnings,
    self_fence_after: std::time::Duration,
) {
    let mut seen = 0;
    while let Some(f) = warnings.next().await {
        let missed = match f.failures - seen {
            1 => String::new(),
            n => format!(" ({} more failed before it)", n - 1),
        };
        seen = f.failures;
        // Never `eprintln!`: it panics on a closed stderr.
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!(
                "runlease: warning: heartbeat failed{missed}: {}; this owner fences itself once {} pass without a successful heartbeat (its command is killed, exit 75)\n",
                f.code.prefixed(&f.message),
                human_duration(self_fence_after),
            ),
        );
    }
}

/// The generation of the release epoch at the head (after our release).
fn released_as(rundir: &Lease) -> Option<u64> {
    let view = rundir.auth.status(wall_now().ok()?, false).ok()?;
    view.head.map(|h| h.generation().get())
}

fn fenced_error(
    rundir: &Lease,
    lease: &lease_core::ops::OwnedLease,
    e: RunError,
    code: i32,
) -> CliError {
    fenced_error_as(
        rundir,
        lease,
        e,
        code,
        "runlease killed the command when the lease was fenced",
    )
}

/// [`fenced_error`], saying how the command ended (`ended`: killed by runlease, or exited
/// before) and who replaced the owner, if anyone did ([`replaced_by`]).
fn fenced_error_as(
    rundir: &Lease,
    lease: &lease_core::ops::OwnedLease,
    e: RunError,
    code: i32,
    ended: &str,
) -> CliError {
    let reason = match &e {
        RunError::Fenced { reason, .. } => reason.clone(),
        other => other.to_string(),
    };
    let by = replaced_by(rundir, lease.generation)
        .map(|w| format!("; {w}"))
        .unwrap_or_default();
    CliError::of(
        Code::Fenced,
        format!(
            "run {}: generation {} is fenced ({reason}{by}); {ended} (it exited with {code}); nothing was released or written",
            lease.run_id, lease.generation
        ),
    )
    .with_extra(json!({"generation": lease.generation.get(), "command_exit": code}))
}

/// Who replaced generation `g`, from the epoch after it (read-only; `None` when there is
/// none, as when the owner fenced itself on a lapse nobody acted on yet, or it cannot be
/// read): "taken over by generation N (owner, pid on host) at T", or "retired as dead …".
fn replaced_by(rundir: &Lease, g: lease_core::Generation) -> Option<String> {
    use lease_core::ops::{Request, Response};
    let next = g.next(&rundir.auth.run_id().clone()).ok()?;
    let bytes = match rundir
        .auth
        .perform(Request::Read(lease_core::FileRef::Epoch(next)))
        .ok()?
    {
        Response::Content(Some(b)) => b,
        _ => return None,
    };
    let e: lease_core::EpochRecord = lease_core::decode_for(rundir.auth.run_id(), &bytes).ok()?;
    let retired = e.retired.as_ref().filter(|r| r.generation == g)?;
    let how = match retired.reason {
        lease_core::RetireReason::TakenOver => "taken over",
        lease_core::RetireReason::Dead => "retired as dead",
        _ => return None,
    };
    // What the replacer judged (recorded in the epoch since issue #19): the beat it saw last
    // and, for a takeover, how long it watched that beat unchanged.
    let judged = match &retired.observed {
        Some(o) => match o.watched_ms {
            Some(ms) => format!(
                ", after watching heartbeat #{} ({}) unchanged for {ms} ms ({})",
                o.heartbeat_count,
                o.heartbeat_at,
                match o.mode {
                    lease_core::TakeoverMode::Automatic => "automatic",
                    _ => "operator",
                }
            ),
            None => format!(
                ", its last heartbeat #{} ({})",
                o.heartbeat_count, o.heartbeat_at
            ),
        },
        None => String::new(),
    };
    Some(format!(
        "{how} by generation {} (owner {}, pid {} on {}) at {}{judged}",
        e.generation, e.owner_id, e.holder.pid, e.holder.host, e.claimed_at
    ))
}

/// Block until the command `pid` has exited, without reaping it. A stop by SIGTTIN or
/// SIGTTOU (the command touched the terminal, which is not handed to it) terminates it.
fn wait_exited(pid: Pid) -> Result<(), CliError> {
    loop {
        match rustix::process::waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::STOPPED | WaitIdOptions::NOWAIT,
        ) {
            Ok(Some(st)) if st.stopped() => {
                // Consume this stop report so the next wait blocks until something new.
                let _ = rustix::process::waitid(
                    WaitId::Pid(pid),
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
                    let _ = rustix::process::kill_process_group(pid, Signal::TERM);
                    let _ = rustix::process::kill_process_group(pid, Signal::CONT);
                }
            }
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            // Already reaped elsewhere (cannot happen: only `reap` reaps it).
            Err(rustix::io::Errno::CHILD) => return Ok(()),
            Err(e) => {
                return Err(CliError::of(
                    Code::IoError,
                    format!("waiting for the command failed: {e}"),
                ));
            }
        }
    }
}

/// Reap the command (it has exited, or is being killed) and return its exit status. The
/// signal thread stops signalling its group first.
async fn reap_status(
    fwd: &Fwd,
    cmd: &mut lease_run::RunCommand,
) -> Result<std::process::ExitStatus, CliError> {
    fwd.set(ChildState::Reaped);
    // The raw status: a fence's kill is reported by the caller, with the exit code.
    cmd.wait_raw()
        .await
        .map_err(|e| CliError::of(Code::IoError, format!("reaping the command failed: {e}")))
}

/// [`reap_status`] as runlease's exit code (128+N for signal N).
async fn reap(fwd: &Fwd, cmd: &mut lease_run::RunCommand) -> Result<i32, CliError> {
    reap_status(fwd, cmd).await.map(|s| exit_code(&s))
}

/// A command's exit status as runlease's exit code: its code, or 128+N for signal N (so
/// 143 is both; `run.json`'s detail, [`FinalStatus::of_exit`], tells them apart).
fn exit_code(status: &std::process::ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}

/// The CLI's hooks into [`Run::acquire`]: the terminal progress line, the "waited" note,
/// and stopping when a signal arrived before the command started.
struct Observer {
    progress: Progress,
    dir: PathBuf,
    held_once: bool,
    /// Not a terminal and not quiet: say once per watched record what the watch is for.
    announce: bool,
    /// The (generation, heartbeat count) last announced.
    announced: Option<(u64, u64)>,
}

impl lease_run::AcquireObserver for Observer {
    fn progress(&mut self, p: lease_run::Progress<'_>) {
        match p {
            lease_run::Progress::Waiting { held, elapsed } => {
                self.held_once = true;
                let who = match held.view.head.as_ref().filter(|h| h.is_active()) {
                    Some(h) if !matches!(held.next, NextStep::WaitForLockHolder) => format!(
                        "held by owner {} (pid {} on {}, generation {})",
                        h.epoch.owner_id,
                        h.epoch.holder.pid,
                        h.epoch.holder.host,
                        h.generation()
                    ),
                    _ => "its owner lock is held".into(),
                };
                self.progress.show(&format!(
                    "waiting {} for {}: {who}",
                    human_duration(elapsed),
                    self.dir.display(),
                ));
            }
            lease_run::Progress::Unavailable { error, elapsed } => {
                self.progress.show(&format!(
                    "waiting {} for {}: the lease authority did not answer ({}); trying again",
                    human_duration(elapsed),
                    self.dir.display(),
                    error.code(),
                ));
            }
            lease_run::Progress::Watching {
                head,
                watched,
                needed,
            } => {
                let key = (head.generation().get(), head.heartbeat_count());
                if self.announce && self.announced != Some(key) {
                    self.announced = Some(key);
                    eprintln!(
                        "runlease: watching owner {} of {} (generation {}): it is taken over only if its record stays unchanged for {} on this host's clock",
                        head.epoch.owner_id,
                        self.dir.display(),
                        head.generation(),
                        human_duration(needed),
                    );
                }
                self.progress.show(&format!(
                    "owner {} of {}: record unchanged for {} of the {} needed before an automatic takeover",
                    head.epoch.owner_id,
                    self.dir.display(),
                    human_duration(watched),
                    human_duration(needed),
                ))
            }
            _ => {}
        }
    }

    fn proceed(&mut self) -> bool {
        PENDING_SIGNAL.load(Ordering::SeqCst) == 0
    }
}

/// Own the run with [`Run::acquire`] (claim, or as the flags allow retire a dead owner or
/// take over a stale one; wait while it is held if `--wait` was given) and render its
/// refusals.
async fn acquire(
    abs: &Path,
    held: Option<Arc<lease_run::folder::RealFs>>,
    opts: &RunOpts,
    policy: TimingPolicy,
    out: Out,
) -> Result<(Run, Acquired), CliError> {
    let began = Instant::now();
    let wait = match opts.wait {
        None => Wait::No,
        Some(WaitFor::Forever) => Wait::Forever,
        Some(WaitFor::For(d)) => Wait::Until(began + d),
    };
    let o = OpenOptions {
        policy,
        authority: opts.authority.clone(),
        // The folder was made a run (or refused) by `init_run`; lease-run must never
        // create one behind that check, and works on the folder it opened.
        create: false,
        folder: held,
        // A process outside this one kills the command by the self-fence deadline even
        // while this process is stopped (issue #31): this binary, `runlease __guard`.
        guard: Some(lease_run::guard::GuardProgram::this_executable([GUARD_ARG])),
        ..OpenOptions::default()
    };
    let how = Acquire::from_flags(opts.retire_dead, opts.takeover_stale);
    let mut observer = Observer {
        progress: Progress::new(out),
        dir: opts.dir.clone(),
        held_once: false,
        announce: !out.quiet && !out.json && !std::io::stderr().is_terminal(),
        announced: None,
    };
    let r = Run::acquire(abs, how, wait, o, &mut observer).await;
    observer.progress.clear();
    match r {
        Ok(owned) => {
            if observer.held_once {
                // The one line a non-terminal stderr gets about the wait.
                out.info(&format!(
                    "waited {} for {}",
                    human_duration(began.elapsed()),
                    opts.dir.display()
                ));
            }
            Ok(owned)
        }
        Err(AcquireError::Stopped) => {
            check_pending_signal()?;
            Err(CliError::new(
                Code::Interrupted,
                EX_SOFTWARE,
                "the acquire stopped without a signal; nothing was claimed",
            ))
        }
        Err(AcquireError::Held(held)) => Err(held_error(&held, &opts.dir)),
        Err(AcquireError::Run(e)) => Err(CliError::from(e)),
        Err(e) => Err(CliError::of(Code::Internal, format!("acquire: {e}"))),
    }
}

/// The next step for a run held by the owner this process runs under.
const OWN_OWNER_HINT: &str = "that owner is the `runlease run` this process runs under (RUNLEASE_OWNER): a nested run of the same folder would wait for itself; use the run you already own, or another run folder";

/// A held-run refusal of [`Run::acquire`] as the CLI says it: the code (76), who holds
/// the run, and its next step as flags and commands of `runlease`.
fn held_error(held: &Held, dir: &Path) -> CliError {
    let run = &held.run;
    let err = if held.next == NextStep::WaitForLockHolder {
        CliError::of(
            held.code,
            format!(
                "run {run} is free, but a process on this host still holds its owner lock (an owner that is starting or stopping, or a stopped one already replaced, which also still holds the store); wait (--wait), or resume or end that process"
            ),
        )
        .with_extra(json!({"state": held.view.status.name()}))
    } else {
        let hint = match &held.next {
            NextStep::NestedRun => OWN_OWNER_HINT.to_string(),
            NextStep::RetireDead => format!(
                "the owner is definitely dead: add --retire-dead, or run `runlease retire {}`",
                shell_path(dir)
            ),
            NextStep::TakeoverStale => "the owner is stale: add --takeover-stale, or see `runlease status` for an exact `runlease takeover`".into(),
            NextStep::ResumeOrEndOwner { pid } => format!(
                "its process still holds the owner lock and the store (stopped or stuck?): if it runs on this host, resume it (`kill -CONT {pid}`: it fences itself, kills its command and exits 75) or end it, then add --takeover-stale (or --retire-dead once it is gone); --wait waits for it"
            ),
            _ => "wait (--wait), or ask the owner to release".into(),
        };
        let (desc, extra) = held_description(&held.view);
        let lock_note = if held.code == Code::RunAlreadyActive
            && held.view.head.as_ref().is_none_or(|h| !h.is_active())
        {
            " (a process on this host holds its owner lock: it is starting or stopping)"
        } else {
            ""
        };
        CliError::of(held.code, format!("run {run} is {desc}{lock_note}; {hint}")).with_extra(extra)
    };
    match held.gave_up_after {
        Some(d) => err.with_hint(format!("gave up after waiting {}", human_duration(d))),
        None => err,
    }
}

fn check_pending_signal() -> Result<(), CliError> {
    let sig = PENDING_SIGNAL.load(Ordering::SeqCst);
    if sig != 0 {
        return Err(CliError::new(
            Code::Interrupted,
            128 + sig,
            format!("interrupted by signal {sig} before the command started; nothing was claimed"),
        ));
    }
    Ok(())
}
