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
//! see the `cgroup` module.
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

mod held;
mod mark;
mod stat;
mod tracked;

pub use crate::clock::boottime_ns;
pub use held::{
    EnvVar, GATE, HeldProcess, env_var, euid, is_gate, kill_group, state_of, tracer_of, uids_of,
};
pub(crate) use mark::register_leader;
#[cfg(not(loom))]
pub(crate) use mark::spawn_unmarked;
pub use mark::{MARK_FD_MIN, MARK_FD_VAR, Mark, holds_mark};
pub(crate) use stat::pids_in;
pub use stat::{PidCounter, PidWindow, ProcInfo, parse_stat, proc_info, scan};
pub use tracked::{INCARNATION_VAR, PidBase, Tracked, terminate, wait_gone};

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

#[cfg(test)]
mod tests;
