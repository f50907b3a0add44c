//! One process: its gate, state, uids, tracer and environment, held by a pidfd so a signal
//! never reaches a reused pid, and the group signal.

use super::stat::proc_info;
use rustix::process::{Pid, Signal};

/// The gate every command starts as (`argv[0..4]`, then the command's argv): it stops
/// itself so its record is written before the program runs (see the crate docs).
pub const GATE: [&str; 4] = [
    "/bin/sh",
    "-c",
    r#"kill -STOP $$ && exec "$@""#,
    "lease-run-gate",
];

/// Whether `pid` is still the gate (has not exec'd the program yet), from its command line.
pub fn is_gate(pid: u32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mut want = Vec::new();
    for a in GATE {
        want.extend_from_slice(a.as_bytes());
        want.push(0);
    }
    cmdline.starts_with(&want)
}

/// The state letter of `/proc/<pid>/stat` (`T` = stopped, `t` = stopped by a tracer),
/// `None` if gone.
pub fn state_of(pid: u32) -> Option<char> {
    lease_fs::probe::read_stat(pid)
        .ok()
        .flatten()
        .map(|st| st.state)
}

/// Whether `pid` (or group `pid`) may be signalled at all: never 0 or 1 (`kill(-1)` would
/// signal every process; 1 is init), never this process or its own group (a record naming
/// us is refused by the survivor check instead of killing the owner).
pub(super) fn signallable(pid: u32, own: u32) -> bool {
    pid > 1 && pid != own && i32::try_from(pid).is_ok()
}

/// Send `sig` to process group `pgid` (errors ignored: ESRCH when it is gone, EPERM).
/// Group 0, 1 and this process's own group are never signalled.
pub fn kill_group(pgid: u32, sig: Signal) {
    // Our own group from /proc, not getpgrp(2): in a pid namespace whose init inherited a
    // group from outside, the kernel reports 0 (and rustix's getpgrp asserts it is not),
    // which is right: a group not visible here cannot be named by a pgid from here. If it
    // cannot be read at all, nothing is signalled.
    let Some(own) = proc_info(std::process::id()).map(|p| p.pgrp) else {
        return;
    };
    if !signallable(pgid, own) || pgid == std::process::id() {
        return;
    }
    if let Some(p) = Pid::from_raw(i32::try_from(pgid).unwrap_or(0)) {
        let _ = rustix::process::kill_process_group(p, sig);
    }
}

/// A process held by a pidfd, confirmed to be the one meant (same pid and start time, not
/// exited) *while the pidfd was open*: every signal goes through the pidfd
/// (`pidfd_send_signal`), so a pid that is reused after this check can never be hit
/// (PROTOCOL §11.1). Dropping it closes the pidfd.
#[derive(Debug)]
pub struct HeldProcess {
    /// Pid.
    pub pid: u32,
    /// Start time (clock ticks after boot).
    pub start_time: u64,
    fd: rustix::fd::OwnedFd,
}

impl HeldProcess {
    /// Open `pid` by pidfd and confirm it is the process that started at `start_time` and
    /// has not exited. `None` when it is gone, reused, a zombie, pid 0 or 1, this process,
    /// or pidfds are unavailable (never a guess: an unconfirmed process is not signalled).
    ///
    /// Order: `pidfd_open` first, then `/proc/<pid>/stat`, then a poll of the pidfd. If the
    /// pid was reused before the open, the stat shows another start time; if the process
    /// exits after the stat, the poll shows it. Either way nothing is held.
    pub fn open(pid: u32, start_time: u64) -> Option<HeldProcess> {
        if !signallable(pid, std::process::id()) {
            return None;
        }
        let p = Pid::from_raw(i32::try_from(pid).ok()?)?;
        let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()?;
        let info = proc_info(pid)?;
        if info.start_time != start_time || info.zombie {
            return None;
        }
        let held = HeldProcess {
            pid,
            start_time,
            fd,
        };
        (!held.exited()).then_some(held)
    }

    /// [`HeldProcess::open`] for a child of this process: after the pidfd is open, `/proc` must
    /// still show this process as its parent and `start_time` as its start time. A child
    /// of ours cannot have its pid reused until we reap it, so the pidfd is that child.
    pub fn child(pid: u32, start_time: u64) -> Option<HeldProcess> {
        let held = HeldProcess::open(pid, start_time)?;
        let info = proc_info(pid)?;
        (info.ppid == std::process::id() && info.start_time == start_time).then_some(held)
    }

    /// [`HeldProcess::open`] with the start time `/proc` shows for `pid` now: for a pid just
    /// listed by the kernel (a cgroup's members), where the open confirms that the process
    /// is still the one listed.
    pub fn current(pid: u32) -> Option<HeldProcess> {
        HeldProcess::open(pid, proc_info(pid)?.start_time)
    }

    /// Whether the process has exited (its pidfd is readable); a zombie has.
    pub fn exited(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &self.fd,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut fds, Some(&zero)) {
            Ok(n) => n > 0,
            // Cannot tell: treat as exited, so nothing is signalled on a guess.
            Err(_) => true,
        }
    }

    /// Send `sig` through the pidfd. A process that is already gone is fine (`Ok`);
    /// `EPERM` is returned as such ("not permitted", never "survived").
    pub fn signal(&self, sig: Signal) -> std::io::Result<()> {
        match rustix::process::pidfd_send_signal(&self.fd, sig) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// The real and effective uid of `pid` (`Uid:` of `/proc/<pid>/status`).
pub fn uids_of(pid: u32) -> Option<(u32, u32)> {
    let value = status_field(pid, "Uid:")?;
    let mut f = value.split_whitespace();
    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
}

/// The value of field `key` (with its colon) of `/proc/<pid>/status`, `None` if the file
/// cannot be read or has no such field.
pub(super) fn status_field(pid: u32, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::to_string)
}

/// The pid of the process tracing `pid` (`TracerPid:` of `/proc/<pid>/status`; 0 when
/// none), `None` if it cannot be read.
pub fn tracer_of(pid: u32) -> Option<u32> {
    status_field(pid, "TracerPid:")?.trim().parse().ok()
}

/// What `/proc/<pid>/environ` says of one variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvVar {
    /// Set, with this value.
    Set(String),
    /// Not set (the process has no such variable, or cleared its environment).
    Unset,
    /// The environment cannot be read (another uid, a non-dumpable process, gone).
    Unreadable,
}

/// The variable `name` in the environment `pid` was started with.
pub fn env_var(pid: u32, name: &str) -> EnvVar {
    let Ok(bytes) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return EnvVar::Unreadable;
    };
    let prefix = format!("{name}=");
    for entry in bytes.split(|b| *b == 0) {
        if let Some(v) = entry.strip_prefix(prefix.as_bytes()) {
            return match std::str::from_utf8(v) {
                Ok(v) => EnvVar::Set(v.to_string()),
                Err(_) => EnvVar::Unset,
            };
        }
    }
    EnvVar::Unset
}

/// This process's effective uid.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}
