//! Processes on this host, read from `/proc`: the clock, process groups, sessions and the
//! descendants of the run's commands; and signals to them.
//!
//! ## What the kill reaches without a cgroup (issue #29)
//!
//! At a normal end, at release and on a fence, the owner kills everything [`Tracked`]
//! counts as the run's and reports "gone" only once none of it is left: the commands'
//! groups and sessions, their descendants by parent chain, every orphan reparented to the
//! owner as child subreaper (adopted through a pidfd taken while it is our child, even after
//! its parent and the command leader exited), and every process of this uid holding the
//! incarnation's [`Mark`] or carrying its secret, wherever it was reparented. After a crash
//! of the owner, the next owner proves a leftover by the same mark or secret
//! (`run::reap`, PROTOCOL §11.1): the mark is a descriptor, so `env -i`, `setsid`,
//! `nohup` and double forks keep it.
//!
//! **What can still escape without a cgroup:** a descendant that closes the mark's
//! descriptor (a daemon that closes every descriptor) **and** clears its environment **and**
//! is reparented to another subreaper than the owner (or the owner is gone: after a crash
//! only the mark and the secret prove); a descendant that execs a setuid or otherwise
//! privileged program (another uid, or not dumpable: `/proc/<pid>/fd` and `environ` cannot
//! be read, and it may not be signalled); a process in another pid namespace (not in our
//! `/proc`); one started by something outside the run's tree that a command asked for it
//! (`systemd-run`, `at`, a D-Bus activation). **How to close it:** run the owner where it
//! may create a cgroup v2 directory, e.g. with systemd's user-manager delegation,
//! `systemd-run --user --scope -p Delegate=yes runlease run ...`: every descendant is then
//! born in the run's cgroup and `cgroup.kill` ends it whatever it does, short of moving
//! itself out (which needs write access to another cgroup's `cgroup.procs`: root, or a
//! cgroup of the same delegated subtree; the scans below still look for such a process),
//! see [`crate::cgroup`].
//!
//! ## What a scan reads (issue #33)
//!
//! The kill is driven by scans of `/proc`: at release, on every watchdog tick (100 ms) and
//! for each forwarded signal. Without the run's cgroup each scan reads every process's
//! `/proc/<pid>/stat` ([`scan`]), so it costs in proportion to the machine's process count.
//! With the cgroup a scan ([`Tracked::snapshot`]) reads the stat of only the owner, the
//! known descendants and leaders, the cgroup's members, and the pids the kernel allocated
//! since the pid counter was read right before the run's first command ([`PidCounter`],
//! [`PidWindow`]): each number of that window is looked up (a `pidfd_open`, which fails at
//! once for a free number or a thread) while the window holds fewer numbers than half the
//! system's tasks, else `/proc` is listed once and filtered. Everything the rules above
//! count was started after that reading (descendants and group members after their
//! command; the sweep and the adoption rule take nothing that started before the first
//! command), so its pid is in that window, unless the counter has gone once around since.
//! That is ruled out from the kernel's own counts ([`PidCounter::window_now`]); when it
//! cannot be, the scan is full.
//!
//! **What the window gives up, and why only with a cgroup.** The lap check counts forks,
//! and two things move the counter without one: a fork that fails after its pid was
//! allocated (a `pids.max` limit reached, no free descriptor for `CLONE_PIDFD`), and a
//! privileged process setting the counter (`ns_last_pid`, `clone3`'s `set_tid`). A process
//! started after a lap made that way has a pid outside the window and is not read. In the
//! cgroup that changes nothing (members are read from `cgroup.procs`, and `cgroup.kill`
//! ends them whatever their pid). So a windowed scan can miss only a process **outside**
//! the cgroup (one that moved itself out, one handed the mark, one started with the secret
//! by something outside the run) **and** started after such an unseen lap. Without a
//! cgroup nothing else would reach it, so there every scan stays full. A process started
//! before the first command is no longer read at all (unless known or a member): before,
//! it could count only as a member that joined a command's group from the same session
//! (the group signal still reaches it while the leader lives), as a child of a process
//! moved into the cgroup by hand, or if it started in the same clock tick as the first
//! command: none of them started by the run. A windowed scan's cost follows what was
//! started since the first command (by anyone on the machine), not how many processes run.

use rustix::process::{Pid, Signal};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

pub use crate::clock::boottime_ns;

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
fn stat_at<Fd: rustix::fd::AsFd>(dir: Fd, rel: &str, pid: u32) -> Option<ProcInfo> {
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
fn scan_where(wanted: impl Fn(u32) -> bool) -> Vec<ProcInfo> {
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
fn probe(pids: impl Iterator<Item = u32>) -> Option<Vec<ProcInfo>> {
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
    last: u32,
    /// Tasks (threads) on the system then (`nr_threads`, the 4th field of `/proc/loadavg`).
    tasks: u64,
    /// Tasks ever created (`processes` of `/proc/stat`), read **before** `last`.
    forks: u64,
    /// `kernel.pid_max`.
    pid_max: u32,
}

/// The first pid the kernel hands out after its counter wraps (`RESERVED_PIDS`): a lap of
/// the counter passes at least `pid_max - RESERVED_PIDS` numbers.
const RESERVED_PIDS: u32 = 300;

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
    after: u32,
    through: u32,
    pid_max: u32,
    /// The system's task count at the second reading.
    tasks: u64,
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
    fn pids(&self) -> impl Iterator<Item = u32> {
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
    fn len(&self) -> u64 {
        if self.after <= self.through {
            u64::from(self.through - self.after)
        } else {
            u64::from(self.pid_max.saturating_sub(1).saturating_sub(self.after))
                + u64::from(self.through)
        }
    }
}

/// `processes` of `/proc/stat`: tasks created since boot.
fn forks_now() -> Option<u64> {
    read_procfs("/proc/stat")?
        .lines()
        .find_map(|l| l.strip_prefix("processes "))?
        .trim()
        .parse()
        .ok()
}

/// The last pid allocated in this pid namespace and the system's task count, from one
/// read of `/proc/loadavg` (`… running/tasks last_pid`).
fn loadavg_now() -> Option<(u32, u64)> {
    let text = read_procfs("/proc/loadavg")?;
    let mut f = text.split_ascii_whitespace();
    let tasks = f.nth(3)?.split_once('/')?.1.parse().ok()?;
    let last = f.next()?.parse().ok()?;
    Some((last, tasks))
}

/// `kernel.pid_max`.
fn pid_max_now() -> Option<u32> {
    read_procfs("/proc/sys/kernel/pid_max")?.trim().parse().ok()
}

/// The text of a file of `/proc`, only if it is the kernel's own (procfs): a container's
/// overlay of `/proc/loadavg` or `/proc/stat` (LXCFS, on FUSE) counts the container's
/// tasks, not the kernel's, and would make [`PidCounter::window_now`] unsound.
fn read_procfs(path: &str) -> Option<String> {
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
fn signallable(pid: u32, own: u32) -> bool {
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
pub struct Held {
    /// Pid.
    pub pid: u32,
    /// Start time (clock ticks after boot).
    pub start_time: u64,
    fd: rustix::fd::OwnedFd,
}

impl Held {
    /// Open `pid` by pidfd and confirm it is the process that started at `start_time` and
    /// has not exited. `None` when it is gone, reused, a zombie, pid 0 or 1, this process,
    /// or pidfds are unavailable (never a guess: an unconfirmed process is not signalled).
    ///
    /// Order: `pidfd_open` first, then `/proc/<pid>/stat`, then a poll of the pidfd. If the
    /// pid was reused before the open, the stat shows another start time; if the process
    /// exits after the stat, the poll shows it. Either way nothing is held.
    pub fn open(pid: u32, start_time: u64) -> Option<Held> {
        if !signallable(pid, std::process::id()) {
            return None;
        }
        let p = Pid::from_raw(i32::try_from(pid).ok()?)?;
        let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()?;
        let info = proc_info(pid)?;
        if info.start_time != start_time || info.zombie {
            return None;
        }
        let held = Held {
            pid,
            start_time,
            fd,
        };
        (!held.exited()).then_some(held)
    }

    /// [`Held::open`] for a child of this process: after the pidfd is open, `/proc` must
    /// still show this process as its parent and `start_time` as its start time. A child
    /// of ours cannot have its pid reused until we reap it, so the pidfd is that child.
    pub fn child(pid: u32, start_time: u64) -> Option<Held> {
        let held = Held::open(pid, start_time)?;
        let info = proc_info(pid)?;
        (info.ppid == std::process::id() && info.start_time == start_time).then_some(held)
    }

    /// [`Held::open`] with the start time `/proc` shows for `pid` now: for a pid just
    /// listed by the kernel (a cgroup's members), where the open confirms that the process
    /// is still the one listed.
    pub fn current(pid: u32) -> Option<Held> {
        Held::open(pid, proc_info(pid)?.start_time)
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
fn status_field(pid: u32, key: &str) -> Option<String> {
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

/// The lowest descriptor number [`Mark::create`] moves the mark to (the lowest free one at
/// or above it, when the soft `RLIMIT_NOFILE` allows; otherwise wherever `memfd_create` put
/// it): far above what programs use, below the usual soft limit of 1024. Its number in each
/// command is [`MARK_FD_VAR`].
pub const MARK_FD_MIN: i32 = 1000;

/// The variable that tells a command which descriptor holds its incarnation's mark (a
/// daemon that closes its descriptors can keep it, so a later owner still proves it).
pub const MARK_FD_VAR: &str = "RUNLEASE_INCARNATION_FD";

/// Serializes the moments a mark is inheritable (see [`Mark::inheritable`]): two runs of
/// one process never hand each other's mark to a command.
static MARK_SPAWN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Every command leader (pid, start time) of every run open in this process. A run adopts
/// its owner's children (the subreaper) and reaps adopted zombies; a zombie holds no
/// descriptor and no environment, so another run's exited command carries no evidence of
/// being another run's, and two runs in one process (a library that opens two, a test
/// binary's parallel tests) reaped each other's exited leaders, whose own run's wait then
/// failed `ECHILD` (seen in `cargo xtask containment` under load). Registered right after
/// the spawn, while the leader is stopped in its gate (so before it can exit), and kept
/// while a scan still shows it (an unreaped child's number cannot be reused).
static ALL_LEADERS: std::sync::Mutex<BTreeSet<(u32, u64)>> = std::sync::Mutex::new(BTreeSet::new());

/// Register a command leader of a run of this process ([`ALL_LEADERS`]).
pub(crate) fn register_leader(pid: u32, start_time: u64) {
    ALL_LEADERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((pid, start_time));
}

/// Whether `(pid, start_time)` is a command leader of some run of this process.
fn any_runs_leader(pid: u32, start_time: u64) -> bool {
    ALL_LEADERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&(pid, start_time))
}

/// An owner incarnation's mark (PROTOCOL §11.1, [`lease_core::CommandMark`]): a sealed
/// memfd named after the incarnation digest, holding the run, the generation and that
/// digest, kept open by the owner (close-on-exec) and inherited by each command at
/// [`MARK_FD_MIN`] or above. It survives `env -i`, `setsid`, `nohup` and double forks; a
/// process loses it only by closing the descriptor.
#[derive(Debug)]
pub struct Mark {
    fd: rustix::fd::OwnedFd,
    /// Its identity, as command records hold it.
    pub id: lease_core::CommandMark,
    content: Vec<u8>,
}

impl Mark {
    /// Create the mark of `run`'s owner at `generation` whose incarnation digest is
    /// `digest`: `memfd_create(name, CLOEXEC|ALLOW_SEALING)`, the content written, sealed
    /// (`SHRINK|GROW|WRITE|SEAL`: nobody, not even its holders, can change it), moved to
    /// [`MARK_FD_MIN`] or above, and its `(st_dev, st_ino)` read.
    pub fn create(
        run: &lease_core::RunId,
        generation: lease_core::Generation,
        digest: &lease_core::Digest,
    ) -> std::io::Result<Mark> {
        use rustix::fs::{MemfdFlags, SealFlags};
        use std::io::Write;
        let name = lease_core::CommandMark::name_for(digest);
        let content = lease_core::CommandMark::content(run, generation, digest);
        let fd = rustix::fs::memfd_create(
            name.as_str(),
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        let mut file = std::fs::File::from(fd);
        file.write_all(&content)?;
        let fd = rustix::fd::OwnedFd::from(file);
        rustix::fs::fcntl_add_seals(
            &fd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE | SealFlags::SEAL,
        )?;
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        let fd = if soft > u64::try_from(MARK_FD_MIN).unwrap_or(0) + 16 {
            rustix::io::fcntl_dupfd_cloexec(&fd, MARK_FD_MIN).unwrap_or(fd)
        } else {
            fd
        };
        let st = rustix::fs::fstat(&fd)?;
        Ok(Mark {
            fd,
            id: lease_core::CommandMark {
                name,
                dev: st.st_dev,
                ino: st.st_ino,
            },
            content,
        })
    }

    /// Its descriptor number in this process, the same in every command
    /// ([`MARK_FD_VAR`]).
    pub fn fd_number(&self) -> i32 {
        use rustix::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    /// Run `spawn` with the mark inheritable (close-on-exec cleared, then set again), under
    /// a process-wide lock that every run's spawns take, so a command of another run of
    /// this process never inherits it. **Limit:** a child that the embedding program
    /// spawns itself at that very moment, from another thread, inherits it too; a later
    /// owner of this run would then count that child as one of this incarnation's.
    pub fn inheritable<T>(&self, spawn: impl FnOnce() -> T) -> T {
        use rustix::io::{FdFlags, fcntl_setfd};
        let _one = MARK_SPAWN.lock().unwrap_or_else(|e| e.into_inner());
        let shared = fcntl_setfd(&self.fd, FdFlags::empty()).is_ok();
        let out = spawn();
        if shared {
            // If this fails the descriptor stays inheritable: the owner's later children
            // would carry the mark; better to say so than to hide it.
            if let Err(e) = fcntl_setfd(&self.fd, FdFlags::CLOEXEC) {
                tracing::warn!(error = %e, "the incarnation mark stays inheritable");
            }
        }
        out
    }

    /// Whether `pid` holds this very mark (see [`holds_mark`]).
    pub fn held_by(&self, pid: u32) -> bool {
        holds_mark(pid, &self.id, &self.content)
    }
}

/// Run `spawn` (a process that must carry no run's mark: the guard) under the lock every
/// mark-carrying spawn takes ([`Mark::inheritable`]), so no run's mark is inheritable
/// while it starts.
#[cfg(not(loom))]
pub(crate) fn spawn_unmarked<T>(spawn: impl FnOnce() -> T) -> T {
    let _one = MARK_SPAWN.lock().unwrap_or_else(|e| e.into_inner());
    spawn()
}

/// Whether process `pid` holds, among its open descriptors, the mark `mark` with sealed
/// content `content` (PROTOCOL §11.1): a descriptor whose link reads
/// `/memfd:<name> (deleted)`, whose `stat` (through the link) has the recorded
/// `(st_dev, st_ino)`, and which, opened read-only, is the same object, sealed against
/// writes, shrinking and growth, and holds exactly `content`. Needs the right to read
/// `/proc/<pid>/fd` (same uid and dumpable, or privilege); otherwise `false`.
pub fn holds_mark(pid: u32, mark: &lease_core::CommandMark, content: &[u8]) -> bool {
    use std::os::unix::fs::MetadataExt;
    let want = format!("/memfd:{} (deleted)", mark.name);
    for (path, link) in fd_links(pid) {
        if link.as_os_str() != want.as_str() {
            continue;
        }
        match std::fs::metadata(&path) {
            Ok(md) if (md.dev(), md.ino()) == (mark.dev, mark.ino) => {}
            _ => continue,
        }
        if mark_content_is(&path, mark, content) {
            return true;
        }
    }
    false
}

/// Open the descriptor `path` (`/proc/<pid>/fd/<n>`) read-only and check it is the mark:
/// same `(st_dev, st_ino)`, sealed, `content` exactly.
fn mark_content_is(path: &std::path::Path, mark: &lease_core::CommandMark, content: &[u8]) -> bool {
    use rustix::fs::SealFlags;
    use std::io::Read;
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let Ok(st) = rustix::fs::fstat(&file) else {
        return false;
    };
    if (st.st_dev, st.st_ino) != (mark.dev, mark.ino) {
        return false;
    }
    let sealed = SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE;
    if !rustix::fs::fcntl_get_seals(&file).is_ok_and(|s| s.contains(sealed)) {
        return false;
    }
    let mut got = Vec::with_capacity(content.len() + 1);
    let limit = u64::try_from(content.len() + 1).unwrap_or(u64::MAX);
    if file.take(limit).read_to_end(&mut got).is_err() {
        return false;
    }
    got == content
}

/// Whether `pid` holds a descriptor of *some* runlease incarnation's mark (a memfd named
/// `runlease-inc-…`) other than `ours`: a process of another run (of this process or of
/// another owner) that this run must not adopt.
fn holds_other_mark(pid: u32, ours: Option<&lease_core::CommandMark>) -> bool {
    let prefix = format!("/memfd:{}", lease_core::CommandMark::PREFIX);
    let own = ours.map(|m| format!("/memfd:{} (deleted)", m.name));
    fd_links(pid).any(|(_, l)| {
        let l = l.to_string_lossy();
        l.starts_with(&prefix) && own.as_deref() != Some(&*l)
    })
}

/// Each open descriptor of `pid` (`/proc/<pid>/fd/<n>`) with what its link says, read
/// lazily; nothing when the folder cannot be read (another uid, not dumpable, gone), and
/// a descriptor whose link cannot be read is skipped.
fn fd_links(pid: u32) -> impl Iterator<Item = (std::path::PathBuf, std::path::PathBuf)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            std::fs::read_link(&path).ok().map(|link| (path, link))
        })
}

/// What the run tracks of its commands: their process groups and every descendant seen
/// so far (pid with its start time, so a reused pid is never signalled).
///
/// What counts as the run's (each as (pid, start time), and every signal through a pidfd
/// confirmed to be that process, [`Held`]):
///
/// - every command leader and every member of a recorded group or session while its
///   leader exists (the number cannot have been reused), afterwards only a member that
///   carries the incarnation's secret or mark;
/// - every child of a process already counted (parent chain, to a fixpoint);
/// - with [`Tracked::adopt_children`] (the owner is a child subreaper,
///   `OpenOptions::subreaper`): every child of the owner process that started no
///   earlier than the run's first command, is not in the owner's own process group, and
///   carries no other incarnation's secret or mark. That is every orphan reparented to
///   the owner from a command's tree (confirmed by a pidfd opened while it is our child:
///   its ppid is still us and its start time the scan's; a child of ours cannot be
///   reused until we reap it). **The rule for an embedding program:** a child it spawns
///   itself in the owner's process group (the default of `std` and `tokio`) is never
///   counted; one it spawns in a new group or session while a run is open counts as
///   the run's and is killed (and, once a zombie, reaped) with its commands: turn
///   `subreaper` off in such a program, or start such children through `Run::command`.
///   `runlease run` spawns nothing else;
/// - every process of this uid, started no earlier than the first command, that holds
///   the incarnation's mark or carries its secret in its environment (the sweep): what
///   left the tree by reparenting to another subreaper still counts.
///
/// With the run's cgroup, "started no earlier than the first command" is judged, before any
/// `stat` is read, as "allocated a pid after the counter reading taken right before the
/// first command" (module docs, "What a scan reads").
#[derive(Debug, Default, Clone)]
pub struct Tracked {
    /// Recorded process groups (each command's pid = pgid).
    pub groups: BTreeSet<u32>,
    /// Descendants seen by a scan: pid → start time.
    pub known: BTreeMap<u32, u64>,
    /// The run incarnation's cgroup v2 directory, if one could be created: every member
    /// is tracked, and a SIGKILL goes through `cgroup.kill` too.
    pub cgroup: Option<std::path::PathBuf>,
    /// The incarnation's secret (`RUNLEASE_INCARNATION` in its commands' environment):
    /// a process found only by its group or session after that group's leader is gone is
    /// tracked only if it carries it (the group number may have been reused).
    pub secret: Option<String>,
    /// The incarnation's mark, created at the first spawn (`None` if memfds are not
    /// available: then the secret alone proves).
    pub mark: Option<std::sync::Arc<Mark>>,
    /// Command leaders (pid, start time): each is a tokio `Child` that its `RunCommand`
    /// reaps, so the watchdog never reaps one.
    pub leaders: BTreeSet<(u32, u64)>,
    /// The start time of the run's first command (clock ticks after boot): nothing that
    /// started earlier is adopted or swept; `None` until a command is spawned.
    pub since: Option<u64>,
    /// Adopt the owner's children (see the type's docs); set at spawn from
    /// `OpenOptions::subreaper`.
    pub adopt_children: bool,
    /// Processes the sweep judged not ours (pid, start time): each is judged once.
    pub(crate) not_ours: BTreeSet<(u32, u64)>,
    /// The run's guard process (pid, start time; `crate::guard`): a child of the owner in
    /// a group of its own, started after the first command, which must never be adopted.
    pub(crate) guard: Option<(u32, u64)>,
    /// The pid counter read right before the run's first command was started
    /// ([`Tracked::note_spawn`]): every process the run started has a pid allocated after
    /// it. With the run's cgroup, a scan reads only what was allocated since
    /// ([`Tracked::snapshot`]).
    pub(crate) pid_base: PidBase,
}

/// The pid counter before a run's first command (the `pid_base` of a [`Tracked`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum PidBase {
    /// No command was started yet.
    #[default]
    Unset,
    /// The counter could not be read before the first command: every scan is full.
    Unknown,
    /// The counter before the first command.
    At(PidCounter),
}

/// The environment variable that carries an incarnation's secret to its commands.
pub const INCARNATION_VAR: &str = "RUNLEASE_INCARNATION";

impl Tracked {
    /// Refresh from a scan ([`Tracked::snapshot`]): add every process whose group or
    /// session is a recorded group, whose parent is a known descendant, that is an
    /// adoptable child of the owner, or that the sweep proves (see the type's docs), to a
    /// fixpoint; forget known pids that are gone or reused, and groups with no process
    /// left in the scan (not even a zombie, so the number could be reused).
    pub fn refresh(&mut self, procs: &[ProcInfo]) {
        // One index of the scan: `not_ours` can hold every process of the host started
        // since the first command, and this runs on the watchdog's 100 ms tick.
        let seen: BTreeSet<(u32, u64)> = procs.iter().map(|p| (p.pid, p.start_time)).collect();
        let present = |pid: u32, st: u64| seen.contains(&(pid, st));
        self.known.retain(|pid, st| present(*pid, *st));
        self.leaders.retain(|(pid, st)| present(*pid, *st));
        self.not_ours.retain(|(pid, st)| present(*pid, *st));
        // Another run's leaders need not be in this run's snapshot ([`Tracked::snapshot`]):
        // one missing from it is looked up before it is forgotten.
        ALL_LEADERS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(pid, st)| {
                present(*pid, *st) || proc_info(*pid).is_some_and(|p| p.start_time == *st)
            });
        if let Some(cg) = &self.cgroup {
            for pid in pids_in(cg) {
                if let Some(p) = procs.iter().find(|p| p.pid == pid && !p.zombie) {
                    self.known.insert(p.pid, p.start_time);
                }
            }
        }
        let me = std::process::id();
        let own_group = procs.iter().find(|p| p.pid == me).map(|p| p.pgrp);
        self.descend(procs, me, own_group);
        if self.sweep(procs) {
            self.descend(procs, me, own_group);
        }
        let groups: Vec<u32> = self.groups.iter().copied().collect();
        for g in groups {
            let any = procs
                .iter()
                .any(|p| p.pgrp == g || p.session == g || p.pid == g);
            if !any {
                self.groups.remove(&g);
            }
        }
    }

    /// Called under the tracking lock right before each command is started
    /// (`fence::start_tracked`): before the first one, read the pid counter
    /// ([`Tracked::pid_base`]). Never later: a base read after a command started would
    /// leave that command's first processes outside every window.
    pub(crate) fn note_spawn(&mut self) {
        if self.pid_base == PidBase::Unset {
            self.pid_base = PidCounter::read().map_or(PidBase::Unknown, PidBase::At);
        }
    }

    /// The processes a [`Tracked::refresh`] needs to see (issue #33).
    ///
    /// With the run's cgroup and a pid window proved since the first command
    /// ([`PidCounter::window_now`]): a `/proc/<pid>/stat` read only for this process, the
    /// known descendants and leaders, the cgroup's members and every pid allocated since the
    /// first command was started (each number looked up by a `pidfd_open` while the window holds
    /// fewer numbers than half the system's tasks, else picked from one listing of `/proc`),
    /// so its cost follows what the run and the machine started since, not the machine's
    /// process count. Every process the
    /// run started was allocated in that window; so was everything the sweep and the
    /// adoption rule can count (they take nothing started before the first command).
    /// Otherwise (no cgroup, no window: the counter may have lapped, or could not be read)
    /// every process ([`scan`]).
    pub fn snapshot(&self) -> Vec<ProcInfo> {
        // Until the first command is started, nothing can be ours (no group, no member of
        // the cgroup, no descendant; nothing is adopted or swept before `since`): no scan.
        // From then on every snapshot reads, even when nothing is tracked: an orphan whose
        // parent and leader exited between two scans is reparented to this subreaper and
        // must be adopted then.
        let never_started = self.pid_base == PidBase::Unset
            && self.groups.is_empty()
            && self.known.is_empty()
            && self.since.is_none();
        if never_started {
            return Vec::new();
        }
        let window = match (&self.cgroup, self.pid_base) {
            (Some(_), PidBase::At(base)) => base.window_now(),
            _ => None,
        };
        let (Some(window), Some(cg)) = (window, &self.cgroup) else {
            return scan();
        };
        let me = std::process::id();
        let mut read: BTreeSet<u32> = self.known.keys().copied().collect();
        read.extend(self.leaders.iter().map(|(pid, _)| *pid));
        read.extend(pids_in(cg));
        read.insert(me);
        // Fewer numbers in the window than half the tasks on the system: look each one
        // up rather than list every process.
        if window.len().saturating_mul(2) <= window.tasks {
            let outside: Vec<u32> = read
                .iter()
                .copied()
                .filter(|p| !window.contains(*p))
                .collect();
            if let Some(procs) = probe(window.pids().chain(outside)) {
                return procs;
            }
        }
        scan_where(|pid| window.contains(pid) || read.contains(&pid))
    }

    /// Forget every process: the commands were handed over (`Run::release_detached`);
    /// nothing is adopted or swept any more.
    pub fn forget_all(&mut self) {
        self.groups.clear();
        self.known.clear();
        self.leaders.clear();
        self.since = None;
        self.adopt_children = false;
    }

    /// Add group members, children of known processes and adoptable children of the
    /// owner, to a fixpoint.
    fn descend(&mut self, procs: &[ProcInfo], me: u32, own_group: Option<u32>) {
        loop {
            let mut added = false;
            for p in procs {
                if self.known.contains_key(&p.pid) {
                    continue;
                }
                let member = self.known.contains_key(&p.ppid)
                    || self.group_member(p, procs)
                    || self.adoptable(p, me, own_group);
                if member {
                    self.known.insert(p.pid, p.start_time);
                    added = true;
                }
            }
            if !added {
                break;
            }
        }
    }

    /// Whether `p` is a child of the owner (`me`) that the run adopts (the type's docs):
    /// confirmed, for a live one, through a pidfd opened while it is our child.
    fn adoptable(&self, p: &ProcInfo, me: u32, own_group: Option<u32>) -> bool {
        if !self.adopt_children
            || p.ppid != me
            || p.pid == me
            || own_group == Some(p.pgrp)
            || self.since.is_none_or(|s| p.start_time < s)
            || self.guard == Some((p.pid, p.start_time))
            || any_runs_leader(p.pid, p.start_time)
        {
            return false;
        }
        if p.zombie {
            // Our unreaped child: its number cannot be reused until we reap it; nothing
            // is signalled, it is only reaped.
            return true;
        }
        if Held::child(p.pid, p.start_time).is_none() {
            return false;
        }
        // Ours by proof (a nested run's command may carry an outer run's mark besides
        // ours); otherwise any other incarnation's evidence makes it another run's.
        let env = env_var(p.pid, INCARNATION_VAR);
        let our_secret = matches!((&env, &self.secret), (EnvVar::Set(v), Some(s)) if v == s);
        if our_secret || self.mark.as_ref().is_some_and(|m| m.held_by(p.pid)) {
            return true;
        }
        !matches!(env, EnvVar::Set(_))
            && !holds_other_mark(p.pid, self.mark.as_ref().map(|m| &m.id))
    }

    /// The sweep: every live process of this uid started no earlier than the first command
    /// that holds the mark or carries the secret. Returns whether it added any.
    fn sweep(&mut self, procs: &[ProcInfo]) -> bool {
        let Some(since) = self.since else {
            return false;
        };
        let uid = euid();
        let mut added = false;
        for p in procs {
            let key = (p.pid, p.start_time);
            if p.zombie
                || p.start_time < since
                || self.known.contains_key(&p.pid)
                || self.not_ours.contains(&key)
            {
                continue;
            }
            if self.proves(p.pid, uid) {
                self.known.insert(p.pid, p.start_time);
                added = true;
            } else {
                self.not_ours.insert(key);
            }
        }
        added
    }

    /// Whether `pid` runs as `uid` (real and effective) and holds the mark or carries the
    /// secret.
    fn proves(&self, pid: u32, uid: u32) -> bool {
        use std::os::unix::fs::MetadataExt;
        // The owner of /proc/<pid> is its effective uid (when dumpable): a cheap first cut.
        if !std::fs::metadata(format!("/proc/{pid}")).is_ok_and(|m| m.uid() == uid) {
            return false;
        }
        if uids_of(pid) != Some((uid, uid)) {
            return false;
        }
        if let Some(s) = &self.secret {
            if env_var(pid, INCARNATION_VAR) == EnvVar::Set(s.clone()) {
                return true;
            }
        }
        self.mark.as_ref().is_some_and(|m| m.held_by(pid))
    }

    /// Whether group (or session) `g`'s leader, our command, still exists with its
    /// recorded start time (a zombie counts): while it does, the number cannot have been
    /// reused, so every member is one of ours.
    fn leader_pinned(&self, g: u32, procs: &[ProcInfo]) -> bool {
        self.known
            .get(&g)
            .is_some_and(|st| procs.iter().any(|q| q.pid == g && q.start_time == *st))
    }

    /// Whether `p` is a member of a recorded group or session that counts as ours: while
    /// that group's leader is pinned, or (after it is gone) when `p` carries the
    /// incarnation's secret or mark.
    fn group_member(&self, p: &ProcInfo, procs: &[ProcInfo]) -> bool {
        let in_group = self.groups.contains(&p.pgrp);
        let in_session = self.groups.contains(&p.session);
        if !in_group && !in_session {
            return false;
        }
        let pinned = (in_group && self.leader_pinned(p.pgrp, procs))
            || (in_session && self.leader_pinned(p.session, procs));
        pinned
            || self
                .secret
                .as_deref()
                .is_some_and(|s| env_var(p.pid, INCARNATION_VAR) == EnvVar::Set(s.to_string()))
            || self.mark.as_ref().is_some_and(|m| m.held_by(p.pid))
    }

    /// Whether `pid` is one of the command leaders (whatever its start time): a tokio
    /// `Child`, reaped only by its `RunCommand`.
    pub fn is_leader(&self, pid: u32) -> bool {
        self.leaders.iter().any(|(l, _)| *l == pid)
    }

    /// SIGKILL (or `sig`) every recorded group and every known descendant that still has
    /// its recorded start time.
    pub fn signal_all(&self, sig: Signal, procs: &[ProcInfo]) {
        if sig == Signal::KILL {
            if let Some(cg) = &self.cgroup {
                // Every member, including any forked since the scan.
                let _ = std::fs::write(cg.join("cgroup.kill"), "1");
            }
        }
        for g in &self.groups {
            // A group is signalled as a whole only while its leader (our command) is
            // confirmed alive through a pidfd, so the number cannot have been reused for
            // another group; otherwise its members are signalled one by one below (every
            // member is in `known` after a refresh).
            let leader_alive = self
                .known
                .get(g)
                .and_then(|st| Held::open(*g, *st))
                .is_some();
            if leader_alive {
                kill_group(*g, sig);
            }
        }
        for (pid, st) in &self.known {
            if procs
                .iter()
                .any(|p| p.pid == *pid && p.start_time == *st && !p.zombie)
            {
                // Through a pidfd confirmed to be that process: the pid may have been
                // reused since the scan.
                if let Some(h) = Held::open(*pid, *st) {
                    let _ = h.signal(sig);
                }
            }
        }
    }

    /// Whether a process that can still act (not a zombie) is tracked: in a recorded group
    /// or session, or a known descendant.
    pub fn any_alive(&self, procs: &[ProcInfo]) -> bool {
        self.first_alive(procs).is_some()
    }

    /// The first tracked process of `procs` that is alive (not a zombie), as its pid and
    /// process group: what a "survived SIGKILL" error names.
    pub fn first_alive(&self, procs: &[ProcInfo]) -> Option<(u32, u32)> {
        if let Some(cg) = &self.cgroup {
            let members = pids_in(cg);
            if let Some(p) = procs.iter().find(|p| !p.zombie && members.contains(&p.pid)) {
                return Some((p.pid, p.pgrp));
            }
        }
        procs
            .iter()
            .find(|p| {
                !p.zombie
                    && (self.known.get(&p.pid) == Some(&p.start_time)
                        || self.group_member(p, procs))
            })
            .map(|p| (p.pid, p.pgrp))
    }
}

/// Stop everything tracked: SIGTERM, wait up to `grace`, then SIGKILL, wait up to
/// `kill_wait`. Returns whether everything is gone. Blocking (call off the runtime).
pub fn terminate(tracked: &mut Tracked, grace: Duration, kill_wait: Duration) -> bool {
    let procs = tracked.snapshot();
    tracked.refresh(&procs);
    if !tracked.any_alive(&procs) {
        return true;
    }
    tracked.signal_all(Signal::TERM, &procs);
    if wait_gone(tracked, grace, None) {
        return true;
    }
    wait_gone(tracked, kill_wait, Some(Signal::KILL))
}

/// Poll every 10 ms until nothing tracked is alive or `within` passes; with `sig`, send it
/// on every poll. Returns whether everything is gone.
pub fn wait_gone(tracked: &mut Tracked, within: Duration, sig: Option<Signal>) -> bool {
    let end = Instant::now() + within;
    loop {
        let procs = tracked.snapshot();
        tracked.refresh(&procs);
        if !tracked.any_alive(&procs) {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        if let Some(s) = sig {
            tracked.signal_all(s, &procs);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_after_the_last_paren() {
        let line = "42 (a) b) (c) S 1 42 7 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0";
        let p = parse_stat(42, line).unwrap();
        assert_eq!((p.ppid, p.pgrp, p.session, p.start_time), (1, 42, 7, 12345));
        assert!(!p.zombie);
        assert!(boottime_ns() > 0);
    }

    #[test]
    fn another_runs_exited_leader_is_never_adopted() {
        // An exited child of this process, started after this run's first command, in
        // a group of its own: adoptable (reaped) unless it is some run's command leader.
        let me = std::process::id();
        let t = Tracked {
            adopt_children: true,
            since: Some(100),
            ..Tracked::default()
        };
        let z = ProcInfo {
            pid: 4_000_001,
            ppid: me,
            pgrp: 4_000_001,
            session: 1,
            start_time: 200,
            zombie: true,
        };
        assert!(t.adoptable(&z, me, Some(1)));
        register_leader(z.pid, z.start_time);
        assert!(!t.adoptable(&z, me, Some(1)));
        // The same number with another start time is another process.
        let other = ProcInfo {
            start_time: 300,
            ..z
        };
        assert!(t.adoptable(&other, me, Some(1)));
    }

    #[test]
    fn a_pid_window_runs_after_its_base_around_the_wrap() {
        let w = PidWindow {
            after: 100,
            through: 200,
            pid_max: 32_768,
            tasks: 0,
        };
        assert!(!w.contains(100) && w.contains(101) && w.contains(200) && !w.contains(201));
        assert!(!w.contains(1) && !w.contains(99));
        // The counter wrapped: from past the base to pid_max, then from the bottom.
        let w = PidWindow {
            after: 32_000,
            through: 400,
            pid_max: 32_768,
            tasks: 0,
        };
        assert!(w.contains(32_001) && w.contains(32_767) && w.contains(300));
        assert!(w.contains(400) && !w.contains(401) && !w.contains(32_000));
        // Nothing allocated since.
        let w = PidWindow {
            after: 7,
            through: 7,
            pid_max: 32_768,
            tasks: 0,
        };
        assert!(!w.contains(7) && !w.contains(8) && !w.contains(6));
        assert_eq!((w.len(), w.pids().count()), (0, 0));
        // What a probe looks up is exactly what the window holds.
        for (after, through) in [(100, 200), (32_000, 400), (32_766, 3), (5, 32_767)] {
            let w = PidWindow {
                after,
                through,
                pid_max: 32_768,
                tasks: 0,
            };
            let pids: Vec<u32> = w.pids().collect();
            assert_eq!(pids.len() as u64, w.len(), "{w:?}");
            assert!(pids.iter().all(|p| w.contains(*p) && *p > 0 && *p < 32_768));
            let held: BTreeSet<u32> = pids.iter().copied().collect();
            assert!(
                (1..32_768).all(|p| w.contains(p) == held.contains(&p)),
                "{w:?}"
            );
        }
    }

    /// A probe by number finds processes (a zombie too) and never a thread that does not
    /// lead its group, though `/proc/<tid>/stat` exists for it.
    #[test]
    fn a_probe_finds_processes_and_not_threads() {
        let me = std::process::id();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let _ = stop_rx.recv();
        });
        let tid: u32 = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .find(|t| *t != me)
            .expect("a thread besides the main one");
        assert!(proc_info(tid).is_some(), "/proc/<tid>/stat exists");
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let zombie = child.id();
        while state_of(zombie) != Some('Z') {
            std::thread::sleep(Duration::from_millis(1));
        }
        let found: Vec<u32> = probe([me, tid, zombie, 0, u32::MAX].into_iter())
            .expect("pidfds")
            .iter()
            .map(|p| p.pid)
            .collect();
        assert_eq!(found, vec![me, zombie]);
        stop_tx.send(()).unwrap();
        thread.join().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn no_window_once_enough_forks_could_have_lapped_the_counter() {
        let now = PidCounter::read().expect("/proc/loadavg and /proc/stat");
        if now.window_now().is_none() {
            // Only with more tasks than a sixth of pid_max (then every scan is full).
            assert!(3 * now.tasks + 5_000 >= u64::from(now.pid_max - RESERVED_PIDS));
        }
        // Every fork since boot counted against the base: more than a lap's worth on any
        // machine that ran a test suite.
        let long_ago = PidCounter { forks: 0, ..now };
        let forks = forks_now().unwrap();
        if 5 * forks + 3 * now.tasks >= u64::from(now.pid_max - RESERVED_PIDS) {
            assert_eq!(long_ago.window_now(), None);
        }
        // As many tasks as the pid space holds could make a single allocation a lap.
        let crowded = PidCounter {
            tasks: u64::from(now.pid_max),
            ..now
        };
        assert_eq!(crowded.window_now(), None);
        // pid_max changed since the base.
        let other_max = PidCounter {
            pid_max: now.pid_max - 1,
            ..now
        };
        assert_eq!(other_max.window_now(), None);
    }

    /// With a cgroup and a base, a snapshot reads what was started since the base (and
    /// what is tracked), not the processes that were there before.
    #[test]
    fn a_snapshot_reads_the_processes_started_since_the_first_command() {
        /// A `sleep` child, killed and reaped on drop.
        struct Sleep(std::process::Child);
        impl Drop for Sleep {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let sleep = || {
            let mut c = std::process::Command::new("sleep");
            c.arg("30");
            Sleep(c.spawn().unwrap())
        };
        let older = sleep();
        let cg = tempfile::tempdir().unwrap();
        std::fs::write(cg.path().join("cgroup.procs"), "").unwrap();
        let mut t = Tracked {
            cgroup: Some(cg.path().to_path_buf()),
            ..Tracked::default()
        };
        assert!(t.snapshot().is_empty(), "nothing started: nothing read");
        t.note_spawn();
        let PidBase::At(base) = t.pid_base else {
            panic!("no pid counter: {:?}", t.pid_base);
        };
        let newer = sleep();
        // Read once: a later spawn keeps the base.
        t.note_spawn();
        assert_eq!(t.pid_base, PidBase::At(base));
        let Some(window) = base.window_now() else {
            eprintln!("SKIPPED: too many tasks for a pid window here: {base:?}");
            return;
        };
        assert!(window.contains(newer.0.id()));
        let snap = t.snapshot();
        let pids: BTreeSet<u32> = snap.iter().map(|p| p.pid).collect();
        assert!(pids.contains(&newer.0.id()), "started since the base");
        assert!(pids.contains(&std::process::id()), "the owner itself");
        if !window.contains(older.0.id()) {
            assert!(!pids.contains(&older.0.id()), "started before the base");
        }
        // Without a cgroup every process is read.
        let full = Tracked {
            cgroup: None,
            ..t.clone()
        }
        .snapshot();
        assert!(full.iter().any(|p| p.pid == older.0.id()));
    }

    #[test]
    fn a_stat_line_is_read_whole_whatever_the_name() {
        let me = proc_info(std::process::id()).unwrap();
        assert_eq!(me.pid, std::process::id());
        assert_eq!(
            Some(me.start_time),
            lease_fs::probe::process_start_time(me.pid).unwrap()
        );
        assert_eq!(proc_info(0), None);
    }
}

/// Whether the holder of a lease is an owner this process runs under, as `runlease
/// release` asks before it writes a release (a direct release would fence that owner, which
/// then kills this very process). Nothing is ever signalled on this judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerAncestor {
    /// Not an ancestor of this process on this host and boot with the recorded start time
    /// (or not provable): never signalled.
    No,
    /// A proper ancestor with the recorded start time, running this very executable
    /// (a `runlease run` this process runs under).
    ThisBinary(u32),
    /// A proper ancestor with the recorded start time that runs another executable.
    OtherBinary(u32),
}

/// Judge `holder` (a lease's recorded holder) against this process: same host and boot,
/// a proper ancestor (parent chain, at most 64 steps), alive with the recorded start time
/// (so a reused pid is ruled out), and whether it runs this executable.
pub fn owner_ancestor(
    holder: &lease_core::Holder,
) -> Result<OwnerAncestor, crate::error::RunError> {
    let me = lease_fs::this_holder()?;
    let pid = holder.pid;
    let proved = holder.host == me.host
        && holder.boot_id == me.boot_id
        && is_ancestor(pid)
        && lease_fs::probe::live_process_start_time(pid)
            .is_ok_and(|t| t == Some(holder.start_time));
    Ok(match (proved, proved && same_executable(pid)) {
        (false, _) => OwnerAncestor::No,
        (true, true) => OwnerAncestor::ThisBinary(pid),
        (true, false) => OwnerAncestor::OtherBinary(pid),
    })
}

/// Whether `pid` is a proper ancestor of this process (walks the parent chain).
fn is_ancestor(pid: u32) -> bool {
    let mut p = std::process::id();
    for _ in 0..64 {
        match proc_info(p).map(|i| i.ppid) {
            Some(parent) if parent == pid => return true,
            Some(parent) if parent > 1 => p = parent,
            _ => return false,
        }
    }
    false
}

/// Whether process `pid` runs the same executable file as this process.
fn same_executable(pid: u32) -> bool {
    match (
        std::fs::read_link(format!("/proc/{pid}/exe")),
        std::fs::read_link("/proc/self/exe"),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
