//! The command's end: waiting for it without reaping it (so its group id stays reserved
//! while signals may still go to it), reaping it, its exit status as runlease's exit code.

use super::signals::{ChildState, Fwd};
use crate::error::CliError;
use lease_core::Code;
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use std::os::unix::process::ExitStatusExt;

/// Block until the command `pid` has exited, without reaping it. A stop by SIGTTIN or
/// SIGTTOU (the command touched the terminal, which is not handed to it) terminates it.
pub(super) fn wait_exited(pid: Pid) -> Result<(), CliError> {
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
pub(super) async fn reap_status(
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
pub(super) async fn reap(fwd: &Fwd, cmd: &mut lease_run::RunCommand) -> Result<i32, CliError> {
    reap_status(fwd, cmd).await.map(|s| exit_code(&s))
}

/// A command's exit status as runlease's exit code: its code, or 128+N for signal N (so
/// 143 is both; `run.json`'s detail, [`FinalStatus::of_exit`](lease_run::FinalStatus::of_exit), tells them apart).
pub(super) fn exit_code(status: &std::process::ExitStatus) -> i32 {
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}
