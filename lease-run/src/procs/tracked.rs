//! What the run counts as its own ([`Tracked`]): groups, sessions, descendants, adopted
//! orphans and marked processes, refreshed by a scan; and the kill that waits until none
//! is left.

use super::held::{EnvVar, HeldProcess, env_var, euid, kill_group, uids_of};
use super::mark::{ALL_LEADERS, Mark, any_runs_leader, holds_other_mark};
use super::stat::{PidCounter, ProcInfo, pids_in, probe, proc_info, scan, scan_where};
use rustix::process::Signal;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// What the run tracks of its commands: their process groups and every descendant seen
/// so far (pid with its start time, so a reused pid is never signalled).
///
/// What counts as the run's (each as (pid, start time), and every signal through a pidfd
/// confirmed to be that process, [`HeldProcess`]):
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
    pub(super) fn adoptable(&self, p: &ProcInfo, me: u32, own_group: Option<u32>) -> bool {
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
        if HeldProcess::child(p.pid, p.start_time).is_none() {
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
                .and_then(|st| HeldProcess::open(*g, *st))
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
                if let Some(h) = HeldProcess::open(*pid, *st) {
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
