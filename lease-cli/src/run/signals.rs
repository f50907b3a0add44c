//! Signals while `runlease run` opens and owns the run: before the command starts a
//! SIGINT, SIGTERM or SIGHUP aborts the open ([`PENDING_SIGNAL`]); after, it is forwarded
//! to the command ([`Fwd`]), and a second stop signal or `--kill-after` kills its tree.

use crate::error::CliError;
use crate::text::human_duration;
use lease_core::Code;
use rustix::process::{Pid, Signal};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

/// The first signal received before the command started (0: none).
pub(super) static PENDING_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// What happened to the command's process group.
#[derive(Debug, Clone)]
pub(super) enum ChildState {
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
pub(super) struct Fwd {
    child: Mutex<ChildState>,
    /// Whether a SIGINT or SIGTERM was already forwarded to the running command: the next
    /// one escalates to SIGKILL of its whole tree.
    stop_forwarded: std::sync::atomic::AtomicBool,
    /// `--kill-after`.
    kill_after: Option<std::time::Duration>,
}

impl Fwd {
    pub(super) fn set(&self, s: ChildState) {
        *self.child.lock().unwrap_or_else(|p| p.into_inner()) = s;
    }

    fn state(&self) -> ChildState {
        self.child.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The command started as group `pgid`: the signal thread forwards to it through `to`
    /// from now on, and a signal that arrived before is sent now.
    pub(super) fn started(&self, pgid: Pid, to: lease_run::CommandSignaller) {
        let mut c = self.child.lock().unwrap_or_else(|p| p.into_inner());
        *c = ChildState::Running(pgid, Some(to.clone()));
        let pending = PENDING_SIGNAL.swap(0, Ordering::SeqCst);
        if let Some(s) = Signal::from_named_raw(pending).filter(|_| pending != 0) {
            to.signal(s);
        }
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

/// Handle SIGINT, SIGTERM, SIGHUP and SIGUSR1 from now on, on a thread of their own: the
/// returned [`Fwd`] is what the thread forwards to, the handle closes it.
pub(super) fn listen(
    kill_after: Option<std::time::Duration>,
) -> Result<(Arc<Fwd>, signal_hook::iterator::Handle), CliError> {
    let fwd = Arc::new(Fwd {
        child: Mutex::new(ChildState::NotStarted),
        stop_forwarded: std::sync::atomic::AtomicBool::new(false),
        kill_after,
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
    Ok((fwd, signal_handle))
}

/// The first signal that arrived before the command started, if any, as the error `run` ends
/// with (128+N, `INTERRUPTED`): nothing was claimed.
pub(super) fn check_pending_signal() -> Result<(), CliError> {
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
