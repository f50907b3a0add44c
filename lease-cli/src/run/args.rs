//! `runlease run`'s arguments: its options ([`RunOpts`]) checked before anything is
//! created or claimed: the timing policy, the command as UTF-8 words, whether its program
//! can be started, this host as a holder, lease-run's own checks of the options.

use crate::error::CliError;
use lease_cli::cli::WaitFor;
use lease_core::Code;
use lease_core::{HeartbeatDurability, TimingPolicy};
use lease_run::{Authority, OpenOptions};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

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

/// What [`check`] found the options to mean.
pub(super) struct Checked {
    /// The timing policy asked for.
    pub(super) policy: TimingPolicy,
    /// The command and its arguments, as the command record holds them.
    pub(super) argv: Vec<String>,
    /// The run folder made absolute as text (no lookup): what lease-run checks the
    /// options against, and the name shown if the folder is not held.
    pub(super) abs_guess: PathBuf,
}

/// Check the options before anything is created: the policy, the command (UTF-8, not
/// empty, its program startable), this host as the holder a claim records, and
/// lease-run's own checks of the options (64, 126, 127).
pub(super) fn check(opts: &RunOpts) -> Result<Checked, CliError> {
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
    Ok(Checked {
        policy,
        argv,
        abs_guess,
    })
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
