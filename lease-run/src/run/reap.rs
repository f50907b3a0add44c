//! Reaping: the commands an older incarnation left, proved ours before any signal.

#[cfg(doc)]
use super::Run;
use crate::error::RunError;
use crate::procs::{self, INCARNATION_VAR};
use lease_core::canonical::MAX_RECORD_BYTES;
use lease_core::{CommandRecord, Dir, FileRef, Generation, decode_for};
use lease_fs::{FsError, RunDir, primitives, probe};
use rustix::process::Signal;
use std::time::{Duration, Instant};

/// Reap or refuse the commands recorded by older generations (owner lock held).
///
/// PROTOCOL §11.1: a process is signalled only once it is proved to be one that the
/// recording incarnation started: same boot, the same real and effective uid as this
/// process, started no earlier than the recorded command, and carrying in its environment
/// the secret whose digest the record holds ([`CommandRecord::incarnation_digest`]); from
/// that check to every signal it is held by a pidfd ([`procs::Held`]), so a reused pid is
/// never hit. The record's pid and group select nothing to kill: they only name a leader
/// that is alive but unprovable, which refuses the open (`RUN_COMMAND_UNPROVEN`) and is
/// left alone. A descendant that dropped its environment cannot be found and is not
/// signalled (a cgroup, when the run had one, still catches it: `reap_cgroups`).
pub(super) fn reap_or_refuse(
    dir: &RunDir,
    ours: Generation,
    grace: Duration,
    kill_wait: Duration,
) -> Result<(), RunError> {
    let run = dir.run_id().as_str().to_string();
    let io = |op: &'static str, p: &str, e| FsError::io(&run, op, p, e);
    let boot = probe::boot_id().map_err(|e| RunError::Io(format!("boot id: {e}")))?;
    for (p, rec) in command_records(dir)? {
        let generation = rec.generation;
        if generation >= ours {
            continue;
        }
        if rec.boot_id.as_str() == boot {
            let mut prover = Prover::new(&rec);
            if let Err(why) = prover.leader(&rec, &procs::scan()) {
                return Err(RunError::CommandUnproven {
                    run: run.clone(),
                    file: p,
                    pid: rec.pid,
                    start_time: rec.start_time,
                    why,
                });
            }
            match stop_proven(&mut prover, grace, kill_wait) {
                Ok(()) => {}
                Err(StopFailed::Survives(pid)) => {
                    return Err(RunError::CommandsSurvive {
                        run: run.clone(),
                        pid,
                        pgid: rec.pgid,
                        generation: generation.get(),
                    });
                }
                Err(StopFailed::NotPermitted(pid, e)) => {
                    return Err(RunError::NotPermitted {
                        run: run.clone(),
                        pid,
                        generation: generation.get(),
                        detail: e.to_string(),
                    });
                }
            }
        }
        // Another boot: its processes died with that boot.
        primitives::remove(&**dir.fs(), &p, true).map_err(|e| io("remove", &p, e))?;
    }
    Ok(())
}

/// What a command record's processes are now, judged as [`Run::open`] would judge them
/// before reaping (PROTOCOL §11.1), without signalling anything: for `doctor` and `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandState {
    /// Nothing of it runs any more (or it ran on another boot).
    Gone,
    /// These live processes are proved to be its (the next open stops them).
    Proved(Vec<u32>),
    /// The recorded process (same pid and start time) is alive but cannot be proved ours:
    /// the next open is refused with `RUN_COMMAND_UNPROVEN` until an operator acts.
    Unproven {
        /// What is missing.
        why: String,
    },
}

/// One command record and the state of its processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandAudit {
    /// The record, relative to the run folder.
    pub file: String,
    /// The generation that started it.
    pub generation: Generation,
    /// The recorded pid.
    pub pid: u32,
    /// Its start time (clock ticks after boot).
    pub start_time: u64,
    /// What runs of it.
    pub state: CommandState,
}

/// Judge every command record of `dir` like the next open would (PROTOCOL §11.1), reading
/// `/proc` only: nothing is signalled or written. An unreadable or misnamed record is an
/// error, as it is for the open.
pub fn audit_commands(dir: &RunDir) -> Result<Vec<CommandAudit>, RunError> {
    let boot = probe::boot_id().map_err(|e| RunError::Io(format!("boot id: {e}")))?;
    // The process table is read once, and only if a record of this boot needs judging: a
    // run with no command records (every clean release leaves none) costs no /proc scan.
    let mut procs: Option<Vec<procs::ProcInfo>> = None;
    let mut out = Vec::new();
    for (p, rec) in command_records(dir)? {
        let (generation, pid) = (rec.generation, rec.pid);
        let state = if rec.boot_id.as_str() != boot {
            CommandState::Gone
        } else {
            let procs = procs.get_or_insert_with(procs::scan);
            let mut prover = Prover::new(&rec);
            match prover.leader(&rec, procs) {
                Err(why) => CommandState::Unproven { why },
                Ok(()) => {
                    let proved: Vec<u32> = procs
                        .iter()
                        .filter(|q| prover.check(q).is_ok())
                        .map(|q| q.pid)
                        .collect();
                    if proved.is_empty() {
                        CommandState::Gone
                    } else {
                        CommandState::Proved(proved)
                    }
                }
            }
        };
        out.push(CommandAudit {
            file: p,
            generation,
            pid,
            start_time: rec.start_time,
            state,
        });
    }
    Ok(out)
}

/// Every command record of `dir` (its path and content), validated: decoded strictly and
/// matching its name. A record removed meanwhile (its command ended) is skipped; an
/// unreadable or misnamed one is the error, naming the file.
fn command_records(dir: &RunDir) -> Result<Vec<(String, CommandRecord)>, RunError> {
    let run = dir.run_id().as_str();
    let io = |op: &'static str, p: &str, e| FsError::io(run, op, p, e);
    let names = dir
        .fs()
        .list(Dir::Commands.path())
        .map_err(|e| io("list", Dir::Commands.path(), e))?;
    let mut out = Vec::new();
    for n in names {
        let Some(f @ FileRef::Command { generation, pid }) = Dir::Commands.parse_name(&n) else {
            continue;
        };
        let p = f.path();
        let Some(bytes) = dir
            .fs()
            .read(&p, MAX_RECORD_BYTES)
            .map_err(|e| io("read", &p, e))?
        else {
            continue;
        };
        let rec: CommandRecord = decode_for(dir.run_id(), &bytes).map_err(|e| e.in_file(&p))?;
        if rec.pid != pid || rec.generation != generation {
            return Err(RunError::Fs(FsError::LayoutInvalid {
                run: run.to_string(),
                path: p,
                detail: "the record does not match its name".into(),
            }));
        }
        out.push((p, rec));
    }
    Ok(out)
}

/// Decides, once per process (pid and start time), whether it is proved to be one that the
/// incarnation of a command record started (see [`reap_or_refuse`]).
struct Prover {
    run: lease_core::RunId,
    generation: Generation,
    digest: Option<lease_core::Digest>,
    started_no_earlier: u64,
    euid: u32,
    seen: std::collections::BTreeMap<(u32, u64), Result<(), String>>,
}

impl Prover {
    fn new(rec: &CommandRecord) -> Prover {
        Prover {
            run: rec.run_id.clone(),
            generation: rec.generation,
            digest: rec.incarnation.clone(),
            started_no_earlier: rec.start_time,
            euid: procs::euid(),
            seen: std::collections::BTreeMap::new(),
        }
    }

    /// `Err(why)` when `rec`'s recorded process (same pid and start time) is alive in
    /// `procs` but not proved ours: the one case that refuses the open (and that doctor
    /// reports). `Ok` when it is proved, or gone.
    fn leader(&mut self, rec: &CommandRecord, procs: &[procs::ProcInfo]) -> Result<(), String> {
        match procs
            .iter()
            .find(|q| q.pid == rec.pid && q.start_time == rec.start_time && !q.zombie)
        {
            Some(l) => self.check(l),
            None => Ok(()),
        }
    }

    /// `Ok` when `q` is proved ours; otherwise what is missing (for messages).
    fn check(&mut self, q: &procs::ProcInfo) -> Result<(), String> {
        if q.zombie {
            return Err("it has exited".into());
        }
        if q.start_time < self.started_no_earlier {
            return Err("it started before the recorded command".into());
        }
        let key = (q.pid, q.start_time);
        if let Some(r) = self.seen.get(&key) {
            return r.clone();
        }
        let r = self.decide(q.pid);
        self.seen.insert(key, r.clone());
        r
    }

    fn decide(&self, pid: u32) -> Result<(), String> {
        let Some(digest) = &self.digest else {
            return Err(
                "its record was written by a runlease without process proof (no incarnation digest)"
                    .into(),
            );
        };
        match procs::uids_of(pid) {
            Some((r, e)) if r == self.euid && e == self.euid => {}
            Some((r, e)) => {
                return Err(format!(
                    "it runs as uid {r} (effective {e}), not as this process's uid {}",
                    self.euid
                ));
            }
            None => return Err("its /proc/PID/status cannot be read".into()),
        }
        match procs::env_var(pid, INCARNATION_VAR) {
            procs::EnvVar::Set(v)
                if CommandRecord::incarnation_digest(&self.run, self.generation, &v) == *digest =>
            {
                Ok(())
            }
            procs::EnvVar::Set(_) => Err(format!(
                "its {INCARNATION_VAR} is not the secret of generation {}",
                self.generation
            )),
            procs::EnvVar::Unset => Err(format!(
                "it does not carry generation {}'s {INCARNATION_VAR} secret in its environment",
                self.generation
            )),
            procs::EnvVar::Unreadable => Err("its environment cannot be read".into()),
        }
    }
}

enum StopFailed {
    Survives(u32),
    NotPermitted(u32, std::io::Error),
}

/// Stop every process `prover` proves ours, found afresh by a scan every 10 ms (so what
/// they fork meanwhile is caught too): SIGTERM once each, SIGKILL after `grace`, through
/// pidfds; done when none is left, or the first survivor after `grace + kill_wait`.
fn stop_proven(
    prover: &mut Prover,
    grace: Duration,
    kill_wait: Duration,
) -> Result<(), StopFailed> {
    let kill_at = Instant::now() + grace;
    let end = kill_at + kill_wait;
    let mut termed = std::collections::BTreeSet::new();
    loop {
        let live: Vec<procs::Held> = procs::scan()
            .iter()
            .filter(|q| prover.check(q).is_ok())
            .filter_map(|q| procs::Held::open(q.pid, q.start_time))
            .collect();
        let Some(first) = live.first() else {
            return Ok(());
        };
        let now = Instant::now();
        if now >= end {
            return Err(StopFailed::Survives(first.pid));
        }
        for h in &live {
            let sig = if now >= kill_at {
                Signal::KILL
            } else if termed.insert((h.pid, h.start_time)) {
                Signal::TERM
            } else {
                continue;
            };
            if let Err(e) = h.signal(sig) {
                if e.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error()) {
                    return Err(StopFailed::NotPermitted(h.pid, e));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Kill what older incarnations of this run left in their cgroups (descendants that left
/// their process group and session escape the records; they cannot leave a cgroup):
/// SIGTERM to each member, `grace`, `cgroup.kill`, up to `kill_wait`; a member that
/// survives refuses the open (`RUN_COMMANDS_SURVIVE`, 76). Emptied directories are removed.
pub(super) fn reap_cgroups(
    run: &str,
    key: &str,
    ours: Generation,
    grace: Duration,
    kill_wait: Duration,
) -> Result<(), RunError> {
    for cg in crate::cgroup::leftovers(key, ours.get()) {
        let gone = |within: Duration, kill: bool| {
            let end = Instant::now() + within;
            loop {
                let live: Vec<u32> = cg
                    .pids()
                    .into_iter()
                    .filter(|p| !matches!(procs::state_of(*p), None | Some('Z') | Some('X')))
                    .collect();
                if live.is_empty() {
                    return None;
                }
                if Instant::now() >= end {
                    return live.first().copied();
                }
                if kill {
                    cg.kill();
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        for pid in cg.pids() {
            // Through a pidfd confirmed to be the member just listed.
            if let Some(h) = procs::Held::current(pid) {
                let _ = h.signal(Signal::TERM);
            }
        }
        let survivor = gone(grace, false).and_then(|_| {
            cg.kill();
            gone(kill_wait, true)
        });
        if let Some(pid) = survivor {
            return Err(RunError::CommandsSurvive {
                run: run.to_string(),
                pid,
                pgid: 0,
                generation: cg
                    .path()
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.rsplit('-').next())
                    .and_then(|g| g.parse().ok())
                    .unwrap_or(0),
            });
        }
        cg.remove_within(Duration::from_secs(1));
    }
    Ok(())
}
