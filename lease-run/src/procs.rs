//! Processes on this host, read from `/proc`: the clock, process groups, sessions and the
//! descendants of the run's commands; and signals to them.

use rustix::process::{Pid, Signal};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// `CLOCK_BOOTTIME` in nanoseconds: monotonic and counting time spent suspended (the same
/// reading lease-fs answers the core's `Request::Monotonic` with).
pub fn boottime_ns() -> u64 {
    lease_fs::run_dir::boottime_ns()
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
    let line = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &line)
}

/// Every process visible in this pid namespace's `/proc`.
pub fn scan() -> Vec<ProcInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        proc_info(pid)
    })
    .collect()
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

/// What the run tracks of its commands: their process groups and every descendant seen
/// so far (pid with its start time, so a reused pid is never signalled).
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
}

/// The environment variable that carries an incarnation's secret to its commands.
pub const INCARNATION_VAR: &str = "RUNLEASE_INCARNATION";

impl Tracked {
    /// Refresh from a scan: add every process whose group or session is a recorded group,
    /// or whose parent is a known descendant (to a fixpoint); forget known pids that are gone
    /// or reused, and groups with no process left at all (not even a zombie, so the number
    /// could be reused).
    pub fn refresh(&mut self, procs: &[ProcInfo]) {
        self.known
            .retain(|pid, st| procs.iter().any(|p| p.pid == *pid && p.start_time == *st));
        if let Some(cg) = &self.cgroup {
            for pid in crate::cgroup::pids_in(cg) {
                if let Some(p) = procs.iter().find(|p| p.pid == pid && !p.zombie) {
                    self.known.insert(p.pid, p.start_time);
                }
            }
        }
        loop {
            let mut added = false;
            for p in procs {
                if self.known.contains_key(&p.pid) {
                    continue;
                }
                let member = self.known.contains_key(&p.ppid) || self.group_member(p, procs);
                if member {
                    self.known.insert(p.pid, p.start_time);
                    added = true;
                }
            }
            if !added {
                break;
            }
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
    /// incarnation's secret.
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
            let members = crate::cgroup::pids_in(cg);
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
    let procs = scan();
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
        let procs = scan();
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
pub fn owner_ancestor(holder: &lease_core::Holder) -> Result<OwnerAncestor, crate::RunError> {
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
