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
//! 2. Open the run with [`Run::open`](lease_run::Run::open) (its crate docs give the order): kernel owner lock,
//!    `run.json`, claim (with `--retire-dead`, a definitely-dead owner is retired first;
//!    with `--takeover-stale`, a stale owner's record is first watched unchanged for its
//!    `stale_after` on `CLOCK_BOOTTIME`, then taken over as an `automatic` takeover),
//!    heartbeat (reporting the store head), the self-fence on `CLOCK_BOOTTIME` and the
//!    watchdog thread, the layout, reap-or-refuse of a killed incarnation's commands (so a
//!    command left running by a `kill -9`ed `runlease run` is killed by the next owner on
//!    this boot), the store and its seal check. A held run is refused (exit 76, the holder
//!    named) or waited for (`--wait`; a progress line on a terminal only).
//! 3. Spawn the command with [`Run::spawn`](lease_run::Run::spawn): its command record is durable before it
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
//!    [`Run::release_detached`](lease_run::Run::release_detached) hands the run over (`run.json` `paused`, store sealed, lease
//!    released) while the command runs on without the lease, untracked (its later
//!    `runlease append` exits 75); runlease exits with its code when it ends.
//! 5. On the command's exit: [`Run::release`](lease_run::Run::release) (anything left in its group is stopped, the
//!    store sealed, `run.json` `done` for exit 0, else `failed` with the exit code or signal
//!    as detail, the lease released) and runlease exits with the command's code (128+N if
//!    it was killed by signal N).
//! 6. On a fence (lost lease, or no successful heartbeat for `self_fence_after`): once
//!    the watchdog has confirmed every command process dead, runlease exits 75 without
//!    writing anything more. While runlease is stopped (SIGSTOP, a frozen VM) its watchdog
//!    is stopped too: the guard process it started beside the command (this binary as
//!    `runlease __guard`, [`GUARD_ARG`]; lease-run's `guard`) kills the command by the
//!    self-fence deadline instead, and a resumed runlease fences and exits 75 as above.
//!    If runlease dies (`kill -9`), the guard kills the command at once.
//!
//! **Semantics that changed with lease-run** (see the report's DECISIONS): the kernel
//! owner lock is taken first, so while any process on this host holds it (a stopped or
//! stuck owner, even one already replaced, which also still holds the store open) `run`
//! refuses with 76 and says how to unwedge it, instead of claiming a free run without the
//! lock. **Partial:** the command's arguments must be UTF-8 (they are recorded in the
//! command record); the terminal is not handed to the command (no `tcsetpgrp`).

mod acquire;
mod args;
mod child;
mod report;
mod signals;

pub(crate) use acquire::GUARD_ARG;
pub use args::RunOpts;

use crate::error::CliError;
use crate::open::init_run;
use crate::output::Out;
use lease_core::Code;
use lease_core::TimingPolicy;
use lease_run::{FinalStatus, RunError};
use rustix::process::Pid;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// `runlease run`. Returns the exit code.
pub fn run(opts: RunOpts, out: Out) -> Result<i32, CliError> {
    let args::Checked {
        policy,
        argv,
        abs_guess,
    } = args::check(&opts)?;
    let (fwd, signal_handle) = signals::listen(opts.kill_after)?;

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

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::of(Code::IoError, format!("cannot start the runtime: {e}")))?;
    let r = rt.block_on(run_async(&abs, held, &opts, policy, &argv, &fwd, out));
    signal_handle.close();
    // A blocking step past its deadline must not keep the process alive.
    rt.shutdown_background();
    r
}

/// `run` on the runtime, from the claim on: own the run ([`acquire::acquire`]), start the
/// command, wait for its exit, a fence or a release request, release the run, report.
async fn run_async(
    abs: &Path,
    held: Option<Arc<lease_run::folder::RealFs>>,
    opts: &RunOpts,
    policy: TimingPolicy,
    argv: &[String],
    fwd: &signals::Fwd,
    out: Out,
) -> Result<i32, CliError> {
    let (run, how) = acquire::acquire(abs, held, opts, policy, out).await?;
    let lease = run.lease().clone();
    // The owner's own authority, kept past the release: after a fence, who superseded
    // this owner is read through it (`lease_run::superseded_by`).
    let auth = run.authority().clone();
    // Every failed heartbeat is said when it happens, with its code and message (the
    // file it names), so the cause is known before the lease lapses; the fence message
    // names the last one again.
    let _warner = report::AbortOnDrop(tokio::spawn(report::warn_heartbeat_failures(
        run.heartbeat_warnings(),
        lease.policy.self_fence_after(),
    )));
    report::owned(out, abs, &opts.dir, how, &lease, &policy);

    // A signal that arrived while we opened: release (nothing ran) and stop.
    let pending = signals::PENDING_SIGNAL.load(Ordering::SeqCst);
    if pending != 0 {
        let detail = format!("interrupted by signal {pending} before the command started");
        let released = run.release(FinalStatus::Failed { detail }).await;
        return Err(CliError::new(
            Code::Interrupted,
            128 + pending,
            format!(
                "interrupted by signal {pending} before the command started; {}",
                match released {
                    Ok(_) => "the run was released".to_string(),
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
                Ok(_) => e.with_hint("the run was released"),
                Err(r) => e.with_hint(format!(
                    "releasing the run failed: {}",
                    r.code().prefixed(&r)
                )),
            });
        }
    };
    let pgid = Pid::from_raw(i32::try_from(cmd.pid()).unwrap_or(i32::MAX))
        .ok_or_else(|| CliError::of(Code::Internal, "the command has no valid pid"))?;
    // The signal thread forwards from now on; a signal that arrived before is sent now.
    fwd.started(pgid, run.command_signaller());

    // Wait for the command to exit WITHOUT reaping it (a blocking thread), so its pid (=
    // the group id) stays reserved while the signal thread may still signal the group.
    let (exit_tx, mut exit_rx) = tokio::sync::oneshot::channel::<Result<(), CliError>>();
    {
        let pid = pgid;
        std::thread::spawn(move || {
            let _ = exit_tx.send(child::wait_exited(pid));
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
            let code = child::reap(fwd, &mut cmd).await?;
            drop(run);
            return Err(report::fenced_error(&*auth, &lease, e, code));
        }
        Ended::ReleaseRequested => {
            // From here on the command runs without the lease, untracked by the run (the
            // detached release clears the tracking first): signals go to its group itself.
            fwd.set(signals::ChildState::Running(pgid, None));
            match run
                .release_detached(FinalStatus::Paused { wake_at: None })
                .await
            {
                Ok(released) => {
                    let g = released.get();
                    on_request = Some(g);
                    eprintln!(
                        "runlease: released generation {} as generation {g} on request; the command runs on without the lease",
                        lease.generation
                    );
                }
                Err(e @ RunError::Fenced { .. }) => {
                    // The commands were killed before the fence was reported.
                    let code = child::reap(fwd, &mut cmd).await?;
                    return Err(report::fenced_error(&*auth, &lease, e, code));
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
    let status = child::reap_status(fwd, &mut cmd).await?;
    let code = child::exit_code(&status);
    if let Some(e) = release_error {
        return Err(e.with_hint(format!("the command exited with {code}")));
    }
    let released = match (run, on_request) {
        (Some(run), _) => {
            // The true cause from the status itself: exit 143 is not signal 15.
            match run.release(FinalStatus::of_exit(status)).await {
                Ok(released) => released.get(),
                Err(e @ RunError::Fenced { .. }) => {
                    // Fenced while releasing: the command had ended, by the fence's kill
                    // or by itself before the fence was seen.
                    let ended = if fenced_first {
                        "runlease killed the command when the lease was fenced"
                    } else {
                        "the command had exited by itself before the fence was seen; whatever it left running was stopped"
                    };
                    return Err(report::fenced_error_as(&*auth, &lease, e, code, ended));
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
    report::released(
        out,
        abs,
        &opts.dir,
        lease.generation,
        released,
        code,
        on_request.is_some(),
    );
    Ok(code)
}
