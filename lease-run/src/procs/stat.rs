//! `/proc/<pid>/stat` read and scanned: one process, all of them, or only the pids allocated
//! since a counter reading (the windowed scan of the module docs).

use rustix::process::Pid;

/// The pids listed in `<dir>/cgroup.procs` (empty if unreadable).
pub(crate) fn pids_in(dir: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// One line of `/proc/<pid>/stat`, the fields we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcInfo {
    /// Pid.
    pub pid: u32,
    /// Parent pid (field 4).
    pub ppid: u32,
    /// Process group (field 5).
    pub pgrp: u32,
    /// Session (field 6).
    pub session: u32,
    /// Start time in clock ticks after boot (field 22).
    pub start_time: u64,
    /// State `Z` or `X`: exited, only its exit status remains.
    pub zombie: bool,
}

/// Parse a `/proc/<pid>/stat` line (through lease-fs's one parser of that file).
pub fn parse_stat(pid: u32, line: &str) -> Option<ProcInfo> {
    let st = lease_fs::probe::parse_stat(line)?;
    Some(ProcInfo {
        pid,
        zombie: matches!(st.state, 'Z' | 'X'),
        ppid: st.ppid,
        pgrp: st.pgrp,
        session: st.session,
        start_time: st.start_time,
    })
}

/// `/proc/<pid>/stat` of one process, `None` if it does not exist.
pub fn proc_info(pid: u32) -> Option<ProcInfo> {
    stat_at(rustix::fs::CWD, &format!("/proc/{pid}/stat"), pid)
}

/// Read one `/proc/<pid>/stat` (`rel`, relative to `dir`) and parse it: one `openat`, one
/// `read` into a stack buffer (a stat line is a few hundred bytes; the kernel hands the
/// whole line to the first read that has room for it), one `close`. `read_to_string` made
/// that a `statx` and five or six `read`s more per process, in every scan (issue #33).
/// `comm` may hold any bytes: decoded lossily, so such a process is not invisible.
pub(super) fn stat_at<Fd: rustix::fd::AsFd>(dir: Fd, rel: &str, pid: u32) -> Option<ProcInfo> {
    use rustix::fs::{Mode, OFlags, openat};
    let fd = openat(
        dir,
        rel,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .ok()?;
    let mut buf = [0u8; 1024];
    let mut len = 0;
    let mut long = Vec::new();
    loop {
        match rustix::io::read(&fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return None,
        }
        if buf[..len].ends_with(b"\n") {
            break;
        }
        if len == buf.len() {
            long.extend_from_slice(&buf);
            len = 0;
        }
    }
    long.extend_from_slice(&buf[..len]);
    parse_stat(pid, &String::from_utf8_lossy(&long))
}

/// Every process visible in this pid namespace's `/proc`.
pub fn scan() -> Vec<ProcInfo> {
    scan_where(|_| true)
}

/// The processes listed in `/proc` whose pid `wanted` accepts: one listing, and a
/// `/proc/<pid>/stat` read (through one descriptor of `/proc`) for each accepted pid only.
pub(super) fn scan_where(wanted: impl Fn(u32) -> bool) -> Vec<ProcInfo> {
    use rustix::fs::{Mode, OFlags, openat};
    let Ok(proc) = openat(
        rustix::fs::CWD,
        "/proc",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return Vec::new();
    };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        if !wanted(pid) {
            return None;
        }
        stat_at(&proc, &format!("{pid}/stat"), pid)
    })
    .collect()
}

/// The processes among `pids`, each looked up by number instead of listing `/proc`: a
/// `pidfd_open` first, which fails at once for a free number (`ESRCH`) and for a thread
/// that does not lead its group (`ENOENT`, `EINVAL` before Linux 6.9) (`/proc/<tid>` exists for those too, but a listing never shows
/// them, and they are not processes), then the `stat` of each process (a zombie
/// included). `None` when pidfds cannot say (an old kernel, no free descriptor): then
/// the caller lists `/proc`.
pub(super) fn probe(pids: impl Iterator<Item = u32>) -> Option<Vec<ProcInfo>> {
    use rustix::fs::{Mode, OFlags, openat};
    use rustix::io::Errno;
    let proc = openat(
        rustix::fs::CWD,
        "/proc",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut out = Vec::new();
    for pid in pids {
        let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
            continue;
        };
        match rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()) {
            Ok(_leader) => {
                if let Some(info) = stat_at(&proc, &format!("{pid}/stat"), pid) {
                    out.push(info);
                }
            }
            // No such process; a thread that does not lead its group (`ENOENT` since
            // Linux 6.9, `EINVAL` before).
            Err(Errno::SRCH | Errno::NOENT | Errno::INVAL) => {}
            Err(_) => return None,
        }
    }
    Some(out)
}

/// The pid counter of this pid namespace and the kernel's task counts at one moment: the
/// base of a [`PidWindow`] (issue #33).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidCounter {
    /// The last pid allocated in this process's pid namespace (the last field of
    /// `/proc/loadavg`, as `/proc/sys/kernel/ns_last_pid`).
    pub(super) last: u32,
    /// Tasks (threads) on the system then (`nr_threads`, the 4th field of `/proc/loadavg`).
    pub(super) tasks: u64,
    /// Tasks ever created (`processes` of `/proc/stat`), read **before** `last`.
    pub(super) forks: u64,
    /// `kernel.pid_max`.
    pub(super) pid_max: u32,
}

/// The first pid the kernel hands out after its counter wraps (`RESERVED_PIDS`): a lap of
/// the counter passes at least `pid_max - RESERVED_PIDS` numbers.
pub(super) const RESERVED_PIDS: u32 = 300;

impl PidCounter {
    /// Read the counter now: the fork count first, then the last pid and the task count
    /// (one read of `/proc/loadavg`), then `pid_max`. `None` if any cannot be read.
    pub fn read() -> Option<PidCounter> {
        let forks = forks_now()?;
        let (last, tasks) = loadavg_now()?;
        Some(PidCounter {
            last,
            tasks,
            forks,
            pid_max: pid_max_now()?,
        })
    }

    /// The pids allocated in this pid namespace since this reading, if that can be proved:
    /// the numbers after `last`, up to the last pid allocated now, around the wrap when the
    /// counter wrapped. `None` when the counter may have gone once around (or more) since:
    /// then a pid allocated since may be any number, and only a full scan finds it.
    ///
    /// The check (every quantity from the kernel, read in an order that errs on the side of
    /// `None`): the counter skips pids in use and allocates each free one it passes, so a
    /// lap passes `pid_max - 300` numbers, each either allocated during the lap or in use
    /// when passed; a number in use then was in use at the base (at most 3 per task then:
    /// its pid, group and session) or was allocated since. With `A` pids allocated since
    /// the base and `T` tasks then, a lap needs `2A + 3T >= pid_max - 300`. Every pid
    /// allocated is a task created, counted in `processes` (`A <= Δforks`), and the tasks at
    /// the base were at most `T` read then plus those created since (`<= Δforks`). So with
    /// `5·Δforks + 3T < pid_max - 300` the counter cannot have lapped. `pid_max` changed:
    /// `None`.
    ///
    /// **What this does not see** (PROTOCOL §11.1): a fork that fails after the kernel
    /// allocated its pid (a `pids.max` limit reached, no descriptor for `CLONE_PIDFD`) moves
    /// the counter without counting a fork, and a privileged process can set the counter
    /// itself (`ns_last_pid`, `clone3`'s `set_tid`). A process that made the counter lap
    /// that way gets pids outside the window.
    pub fn window_now(&self) -> Option<PidWindow> {
        let (last, tasks) = loadavg_now()?;
        let forks = forks_now()?;
        if pid_max_now()? != self.pid_max {
            return None;
        }
        let delta = forks.checked_sub(self.forks)?;
        let need = delta
            .checked_mul(5)?
            .checked_add(self.tasks.checked_mul(3)?)?;
        let lap = u64::from(self.pid_max.saturating_sub(RESERVED_PIDS));
        (need < lap).then_some(PidWindow {
            after: self.last,
            through: last,
            pid_max: self.pid_max,
            tasks,
        })
    }
}

/// The pids allocated between two readings of the pid counter ([`PidCounter::window_now`]):
/// the numbers after `after` up to `through`, cyclically below `pid_max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidWindow {
    pub(super) after: u32,
    pub(super) through: u32,
    pub(super) pid_max: u32,
    /// The system's task count at the second reading.
    pub(super) tasks: u64,
}

impl PidWindow {
    /// Whether `pid` may have been allocated in the window.
    pub fn contains(&self, pid: u32) -> bool {
        if self.after <= self.through {
            self.after < pid && pid <= self.through
        } else {
            pid > self.after || pid <= self.through
        }
    }

    /// The numbers in the window (all of them from 1 once the counter wrapped: from 300 on
    /// after its first wrap, below on a young system).
    pub(super) fn pids(&self) -> impl Iterator<Item = u32> {
        let from = self.after.saturating_add(1);
        let (a, b) = if self.after <= self.through {
            (from..=self.through, None)
        } else {
            (
                from..=self.pid_max.saturating_sub(1),
                Some(1..=self.through),
            )
        };
        a.chain(b.into_iter().flatten())
    }

    /// How many numbers [`PidWindow::pids`] yields.
    pub(super) fn len(&self) -> u64 {
        if self.after <= self.through {
            u64::from(self.through - self.after)
        } else {
            u64::from(self.pid_max.saturating_sub(1).saturating_sub(self.after))
                + u64::from(self.through)
        }
    }
}

/// `processes` of `/proc/stat`: tasks created since boot.
pub(super) fn forks_now() -> Option<u64> {
    read_procfs("/proc/stat")?
        .lines()
        .find_map(|l| l.strip_prefix("processes "))?
        .trim()
        .parse()
        .ok()
}

/// The last pid allocated in this pid namespace and the system's task count, from one
/// read of `/proc/loadavg` (`… running/tasks last_pid`).
pub(super) fn loadavg_now() -> Option<(u32, u64)> {
    let text = read_procfs("/proc/loadavg")?;
    let mut f = text.split_ascii_whitespace();
    let tasks = f.nth(3)?.split_once('/')?.1.parse().ok()?;
    let last = f.next()?.parse().ok()?;
    Some((last, tasks))
}

/// `kernel.pid_max`.
pub(super) fn pid_max_now() -> Option<u32> {
    read_procfs("/proc/sys/kernel/pid_max")?.trim().parse().ok()
}

/// The text of a file of `/proc`, only if it is the kernel's own (procfs): a container's
/// overlay of `/proc/loadavg` or `/proc/stat` (LXCFS, on FUSE) counts the container's
/// tasks, not the kernel's, and would make [`PidCounter::window_now`] unsound.
pub(super) fn read_procfs(path: &str) -> Option<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let fs = rustix::fs::fstatfs(&f).ok()?;
    if fs.f_type != rustix::fs::PROC_SUPER_MAGIC {
        return None;
    }
    let mut text = String::new();
    f.read_to_string(&mut text).ok()?;
    Some(text)
}
