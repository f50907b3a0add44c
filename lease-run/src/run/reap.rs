//! Reaping: the commands an older incarnation left, proved ours before any signal.

use crate::error::RunError;
use crate::procs::{self, INCARNATION_VAR};
use lease_core::canonical::MAX_RECORD_BYTES;
use lease_core::{CommandRecord, Dir, FileRef, Generation, decode_for};
use lease_fs::{FsError, RunDir, primitives, probe};
use rustix::process::Signal;
use std::time::{Duration, Instant};

/// Reap or refuse the commands recorded by older generations (owner lock held).
///
/// PROTOCOL §11.1: a process is signalled only once it is proved to be one that a
/// recording incarnation started: same boot, the same real and effective uid as this
/// process, started no earlier than the recorded command, and either carrying in its
/// environment the secret whose digest the record holds ([`CommandRecord::incarnation_digest`])
/// or holding among its descriptors the incarnation's mark the record names
/// ([`CommandRecord::mark`], [`procs::holds_mark`]: this proof survives `env -i`, `setsid`
/// and `nohup`). From that check to every signal it is held by a pidfd ([`procs::HeldProcess`]),
/// so a reused pid is never hit. The record's pid and group select nothing to kill: they
/// only name a leader that is alive but unprovable, which refuses the open
/// (`RUN_COMMAND_UNPROVEN`) and is left alone. A descendant that both dropped its
/// environment and closed the mark's descriptor cannot be found and is not signalled (a
/// cgroup, when the run had one, still catches it: `reap_cgroups`).
///
/// One scan of `/proc` judges the leaders of all the records (this boot's), before anything
/// is signalled: one unproven leader refuses the open with nothing signalled. Then one stop
/// loop stops every process proved for any of the records, rescanning every 10 ms (so what
/// they fork meanwhile is caught too); each process is judged once (pid and start time).
/// Order of writes: the records are removed only once every proved process is gone, one
/// after the other, each durably (`primitives::remove` syncs `commands/`); a crash in
/// between leaves records whose processes are gone, which the next open judges gone and
/// removes.
pub(super) fn reap_or_refuse(
    dir: &RunDir,
    ours: Generation,
    grace: Duration,
    kill_wait: Duration,
) -> Result<(), RunError> {
    let run = dir.run_id().as_str().to_string();
    let io = |op: &'static str, p: &str, e| FsError::io(&run, op, p, e);
    let boot = probe::boot_id().map_err(|e| RunError::os("boot id", e))?;
    let older: Vec<(String, CommandRecord)> = command_records(dir)?
        .into_iter()
        .filter(|(_, r)| r.generation < ours)
        .collect();
    // Another boot's records: their processes died with that boot.
    let this_boot: Vec<&(String, CommandRecord)> = older
        .iter()
        .filter(|(_, r)| r.boot_id.as_str() == boot)
        .collect();
    if !this_boot.is_empty() {
        let recs: Vec<&CommandRecord> = this_boot.iter().map(|(_, r)| r).collect();
        let mut prover = Prover::for_records(&recs);
        let procs = procs::scan();
        for (p, rec) in &this_boot {
            if let Err(why) = prover.leader(rec, &procs) {
                return Err(RunError::CommandUnproven {
                    run: run.clone(),
                    file: p.clone(),
                    pid: rec.pid,
                    start_time: rec.start_time,
                    why,
                });
            }
        }
        match stop_proven(&mut prover, procs, grace, kill_wait) {
            Ok(()) => {}
            Err(StopFailed::Survives(pid, i)) => {
                return Err(RunError::CommandsSurvive {
                    run: run.clone(),
                    pid,
                    pgid: recs[i].pgid,
                    generation: recs[i].generation.get(),
                });
            }
            Err(StopFailed::NotPermitted(pid, i, e)) => {
                return Err(RunError::NotPermitted {
                    run: run.clone(),
                    pid,
                    generation: recs[i].generation.get(),
                    detail: e.to_string(),
                });
            }
        }
    }
    for (p, _) in &older {
        primitives::remove(&**dir.fs(), p, true).map_err(|e| io("remove", p, e))?;
    }
    Ok(())
}

/// What a command record's processes are now, judged as [`Run::open`](crate::Run::open) would judge them
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

/// The most command records a judgement of a run reads (issue #29). A run leaves one
/// record per command still running when its owner was killed; a folder holding more was
/// filled by hand, and judging it would cost time in proportion to its size (5,000 forged
/// records made `status` take 28 s and every open fail with `STEP_TIMEOUT`). Past it, every
/// judgement (the open's preflight, its reaping, `status`, `doctor`) refuses with
/// `RUN_COMMAND_RECORDS_OVER_LIMIT` (65) after one listing of `commands/`, before reading
/// any record.
pub const MAX_COMMAND_RECORDS: usize = 1024;

/// The process table as one judgement of the command records sees it: one scan of
/// `/proc`, indexed by pid. Judging any number of records against it costs one lookup per
/// record and one proof per process (a [`Prover`] for all the records at once), never
/// records × processes reads.
pub(crate) struct ProcIndex {
    by_pid: std::collections::BTreeMap<u32, procs::ProcInfo>,
}

impl ProcIndex {
    fn scan() -> ProcIndex {
        ProcIndex {
            by_pid: procs::scan().into_iter().map(|p| (p.pid, p)).collect(),
        }
    }

    /// The live (not exited) process with `pid` and `start_time`, as a one-element slice
    /// for [`Prover::leader`].
    fn leader(&self, pid: u32, start_time: u64) -> Vec<procs::ProcInfo> {
        self.by_pid
            .get(&pid)
            .filter(|q| q.start_time == start_time && !q.zombie)
            .into_iter()
            .copied()
            .collect()
    }
}

thread_local! {
    /// The scan shared by the judgements inside [`one_proc_scan`] on this thread.
    static SHARED_SCAN: std::cell::RefCell<Option<std::rc::Rc<std::cell::OnceCell<std::rc::Rc<ProcIndex>>>>> =
        const { std::cell::RefCell::new(None) };
}

/// Run `f` with every judgement of command records inside it (on this thread) sharing one
/// scan of `/proc`, taken at the first judgement that needs it: for a read-only operation
/// that judges the records more than once (`status`: the records it shows and the
/// admission rule's; `doctor`: its facts and the admission rule's). Reaping never uses it:
/// what it signals is judged on a fresh scan. Nested calls share the outer scan.
pub fn one_proc_scan<T>(f: impl FnOnce() -> T) -> T {
    let outer = SHARED_SCAN.with(|s| s.borrow().is_some());
    if outer {
        return f();
    }
    SHARED_SCAN.with(|s| *s.borrow_mut() = Some(Default::default()));
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            SHARED_SCAN.with(|s| *s.borrow_mut() = None);
        }
    }
    let _reset = Reset;
    f()
}

/// The process index for one judgement: the shared scan inside [`one_proc_scan`], else a
/// fresh one.
fn proc_index() -> std::rc::Rc<ProcIndex> {
    let shared = SHARED_SCAN.with(|s| s.borrow().clone());
    match shared {
        Some(cell) => cell
            .get_or_init(|| std::rc::Rc::new(ProcIndex::scan()))
            .clone(),
        None => std::rc::Rc::new(ProcIndex::scan()),
    }
}

/// Judge every command record of `dir` like the next open would (PROTOCOL §11.1), reading
/// `/proc` only: nothing is signalled or written. An unreadable or misnamed record is an
/// error, as it is for the open; so is a folder of more than [`MAX_COMMAND_RECORDS`]
/// (`RUN_COMMAND_RECORDS_OVER_LIMIT`).
///
/// Cost (issue #29): one listing of `commands/`, one read per record (at most
/// [`MAX_COMMAND_RECORDS`]), one scan of `/proc` however many records there are
/// (an index of the process table; shared with the other judgements of the operation inside
/// [`one_proc_scan`]), and one proof per process for all the records at once, as reaping
/// judges them (a process started before every record costs nothing beyond its `stat`).
pub fn audit_commands(dir: &RunDir) -> Result<Vec<CommandAudit>, RunError> {
    let boot = probe::boot_id().map_err(|e| RunError::os("boot id", e))?;
    let records = command_records(dir)?;
    let this_boot: Vec<&CommandRecord> = records
        .iter()
        .map(|(_, r)| r)
        .filter(|r| r.boot_id.as_str() == boot)
        .collect();
    // The process table is read once, and only if a record of this boot needs judging: a
    // run with no command records (every clean release leaves none) costs no /proc scan.
    // One prover for all of them, as reaping judges them: each process judged once.
    let mut judged = None;
    let mut proved: std::collections::BTreeMap<usize, Vec<u32>> = Default::default();
    if !this_boot.is_empty() {
        let index = proc_index();
        let mut prover = Prover::for_records(&this_boot);
        for q in index.by_pid.values() {
            if let Ok(i) = prover.which(q) {
                proved.entry(i).or_default().push(q.pid);
            }
        }
        judged = Some((index, prover));
    }
    let mut out = Vec::new();
    let mut i = 0;
    for (p, rec) in &records {
        let state = match &mut judged {
            Some((index, prover)) if rec.boot_id.as_str() == boot => {
                let mine = proved.remove(&i).unwrap_or_default();
                i += 1;
                match prover.leader(rec, &index.leader(rec.pid, rec.start_time)) {
                    Err(why) => CommandState::Unproven { why },
                    Ok(()) if mine.is_empty() => CommandState::Gone,
                    Ok(()) => CommandState::Proved(mine),
                }
            }
            _ => CommandState::Gone,
        };
        out.push(CommandAudit {
            file: p.clone(),
            generation: rec.generation,
            pid: rec.pid,
            start_time: rec.start_time,
            state,
        });
    }
    Ok(out)
}

/// Every command record of `dir` (its path and content), validated: decoded strictly and
/// matching its name. A record removed meanwhile (its command ended) is skipped; an
/// unreadable or misnamed one is the error, naming the file. More than
/// [`MAX_COMMAND_RECORDS`] named like records is `RUN_COMMAND_RECORDS_OVER_LIMIT` (65),
/// before any is read.
pub(crate) fn command_records(dir: &RunDir) -> Result<Vec<(String, CommandRecord)>, RunError> {
    let run = dir.run_id().as_str();
    let io = |op: &'static str, p: &str, e| FsError::io(run, op, p, e);
    let names = dir
        .fs()
        .list(Dir::Commands.path())
        .map_err(|e| io("list", Dir::Commands.path(), e))?;
    let files: Vec<FileRef> = names
        .iter()
        .filter_map(|n| Dir::Commands.parse_name(n))
        .filter(|f| matches!(f, FileRef::Command { .. }))
        .collect();
    if files.len() > MAX_COMMAND_RECORDS {
        return Err(RunError::CommandRecordsOverLimit {
            run: run.to_string(),
            dir: Dir::Commands.path().to_string(),
            count: files.len(),
            limit: MAX_COMMAND_RECORDS,
        });
    }
    let mut out = Vec::new();
    for f in files {
        let FileRef::Command { generation, pid } = f else {
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

/// What one command record lets a [`Prover`] accept.
struct Claim {
    run: lease_core::RunId,
    generation: Generation,
    digest: Option<lease_core::Digest>,
    /// The mark and its sealed content ([`lease_core::CommandMark::content`]).
    mark: Option<(lease_core::CommandMark, Vec<u8>)>,
    started_no_earlier: u64,
}

/// Decides, once per process (pid and start time), whether it is proved to be one that the
/// incarnation of one of its command records started (see [`reap_or_refuse`]); when it is,
/// which record.
struct Prover {
    claims: Vec<Claim>,
    euid: u32,
    seen: std::collections::BTreeMap<(u32, u64), Result<usize, String>>,
}

impl Prover {
    /// A prover for several records at once (one judgement per process, however many).
    fn for_records(recs: &[&CommandRecord]) -> Prover {
        let claims = recs
            .iter()
            .map(|rec| Claim {
                run: rec.run_id.clone(),
                generation: rec.generation,
                digest: rec.incarnation.clone(),
                mark: match (&rec.mark, &rec.incarnation) {
                    (Some(m), Some(d)) => Some((
                        m.clone(),
                        lease_core::CommandMark::content(&rec.run_id, rec.generation, d),
                    )),
                    _ => None,
                },
                started_no_earlier: rec.start_time,
            })
            .collect();
        Prover {
            claims,
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
        self.which(q).map(|_| ())
    }

    /// The index of the record `q` is proved to belong to; otherwise what is missing.
    fn which(&mut self, q: &procs::ProcInfo) -> Result<usize, String> {
        if q.zombie {
            return Err("it has exited".into());
        }
        let key = (q.pid, q.start_time);
        if let Some(r) = self.seen.get(&key) {
            return r.clone();
        }
        let r = self.decide(q);
        self.seen.insert(key, r.clone());
        r
    }

    fn decide(&self, q: &procs::ProcInfo) -> Result<usize, String> {
        let candidates: Vec<usize> = (0..self.claims.len())
            .filter(|i| q.start_time >= self.claims[*i].started_no_earlier)
            .collect();
        let Some(first) = candidates.first().map(|i| &self.claims[*i]) else {
            return Err("it started before the recorded command".into());
        };
        if candidates.iter().all(|i| self.claims[*i].digest.is_none()) {
            return Err(
                "its record was written by a runlease without process proof (no incarnation digest)"
                    .into(),
            );
        }
        match procs::uids_of(q.pid) {
            Some((r, e)) if r == self.euid && e == self.euid => {}
            Some((r, e)) => {
                return Err(format!(
                    "it runs as uid {r} (effective {e}), not as this process's uid {}",
                    self.euid
                ));
            }
            None => return Err("its /proc/PID/status cannot be read".into()),
        }
        let env = procs::env_var(q.pid, INCARNATION_VAR);
        if let procs::EnvVar::Set(v) = &env {
            for i in &candidates {
                let c = &self.claims[*i];
                let digest = CommandRecord::incarnation_digest(&c.run, c.generation, v);
                if c.digest.as_ref() == Some(&digest) {
                    return Ok(*i);
                }
            }
        }
        // The mark: one look at the descriptors per distinct mark.
        let mut looked: Vec<&lease_core::CommandMark> = Vec::new();
        for i in &candidates {
            if let Some((m, content)) = &self.claims[*i].mark {
                if looked.contains(&m) {
                    continue;
                }
                looked.push(m);
                if procs::holds_mark(q.pid, m, content) {
                    return Ok(*i);
                }
            }
        }
        let g = first.generation;
        let no_mark = if looked.is_empty() {
            String::new()
        } else {
            format!(", and holds no descriptor of generation {g}'s mark")
        };
        Err(match env {
            procs::EnvVar::Set(_) => {
                format!("its {INCARNATION_VAR} is not the secret of generation {g}{no_mark}")
            }
            procs::EnvVar::Unset => format!(
                "it does not carry generation {g}'s {INCARNATION_VAR} secret in its environment{no_mark}"
            ),
            procs::EnvVar::Unreadable => format!("its environment cannot be read{no_mark}"),
        })
    }
}

enum StopFailed {
    /// A survivor, and the index of the record it was proved for.
    Survives(u32, usize),
    NotPermitted(u32, usize, std::io::Error),
}

/// Stop every process `prover` proves ours, found afresh by a scan every 10 ms (the first
/// loop uses `first`, the scan the leaders were judged on), so what they fork meanwhile is
/// caught too: SIGTERM once each, SIGKILL after `grace`, through pidfds; done when none is
/// left, or the first survivor after `grace + kill_wait`.
fn stop_proven(
    prover: &mut Prover,
    first: Vec<procs::ProcInfo>,
    grace: Duration,
    kill_wait: Duration,
) -> Result<(), StopFailed> {
    let kill_at = Instant::now() + grace;
    let end = kill_at + kill_wait;
    let mut termed = std::collections::BTreeSet::new();
    let mut scan = Some(first);
    loop {
        let procs = scan.take().unwrap_or_else(procs::scan);
        let live: Vec<(procs::HeldProcess, usize)> = procs
            .iter()
            .filter_map(|q| prover.which(q).ok().map(|i| (q, i)))
            .filter_map(|(q, i)| procs::HeldProcess::open(q.pid, q.start_time).map(|h| (h, i)))
            .collect();
        let Some((first, i)) = live.first() else {
            return Ok(());
        };
        let now = Instant::now();
        if now >= end {
            return Err(StopFailed::Survives(first.pid, *i));
        }
        for (h, i) in &live {
            let sig = if now >= kill_at {
                Signal::KILL
            } else if termed.insert((h.pid, h.start_time)) {
                Signal::TERM
            } else {
                continue;
            };
            if let Err(e) = h.signal(sig) {
                if e.raw_os_error() == Some(rustix::io::Errno::PERM.raw_os_error()) {
                    return Err(StopFailed::NotPermitted(h.pid, *i, e));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The cgroup identities (generation, identity, recorded start time) that the command
/// records of `dir` written on this boot name, for [`crate::cgroup::judge`].
pub(crate) fn recorded_cgroups(
    records: &[(String, CommandRecord)],
    boot: &str,
) -> Vec<(u64, lease_core::CommandCgroup, u64)> {
    records
        .iter()
        .filter(|(_, r)| r.boot_id.as_str() == boot)
        .filter_map(|(_, r)| r.cgroup.map(|c| (r.generation.get(), c, r.start_time)))
        .collect()
}

/// Kill what older incarnations of this run left in their cgroups (descendants that left
/// their process group and session, or dropped their environment, escape the records;
/// they cannot leave a cgroup), and remove the emptied directories. Called before
/// [`reap_or_refuse`] (which removes the records naming the cgroups).
///
/// Only [`crate::cgroup::Verdict::Ours`] is touched (issue #29): a directory directly below
/// this owner's own cgroup, named `runlease-<key>-<g>` for an older generation `g`, with the
/// id and owner a command record of `g` (this boot) names, owned by this effective uid.
/// Anything else named like it is logged at `warn`, reported by `doctor`
/// (`CGROUP_NOT_PROVEN`) and never signalled or removed; it never refuses the open.
///
/// In a cgroup of ours: SIGTERM to each member held by a pidfd and confirmed a member
/// after the open ([`crate::cgroup::Cgroup::member`]), of this uid and started no earlier
/// than the recorded command; `grace`; then `cgroup.kill`, up to `kill_wait`; a member that
/// survives refuses the open (`RUN_COMMANDS_SURVIVE`, 76). `cgroup.kill` is the proof for
/// the members it kills: the kernel kills exactly the members at that moment, and a
/// directory this run created, owned by this uid, admits only processes born inside it
/// (our commands' descendants) or moved in by this uid or root. Its identity is checked
/// again right before each `cgroup.kill` and the `rmdir`.
pub(super) fn reap_cgroups(
    dir: &RunDir,
    key: &str,
    ours: Generation,
    grace: Duration,
    kill_wait: Duration,
) -> Result<(), RunError> {
    let run = dir.run_id().as_str();
    let Some(parent) = crate::cgroup::own_dir() else {
        return Ok(());
    };
    let named = crate::cgroup::named_below(&parent, key, ours.get());
    if named.is_empty() {
        return Ok(());
    }
    let boot = probe::boot_id().map_err(|e| RunError::os("boot id", e))?;
    let recorded = recorded_cgroups(&command_records(dir)?, &boot);
    let idents: Vec<(u64, lease_core::CommandCgroup)> =
        recorded.iter().map(|(g, c, _)| (*g, *c)).collect();
    let euid = procs::euid();
    for n in named {
        if let crate::cgroup::Verdict::NotOurs { why } = crate::cgroup::judge(&n, &idents, euid) {
            tracing::warn!(
                run,
                cgroup = %n.path.display(),
                %why,
                "a cgroup named like this run's is not proved its own: left alone (never signalled or removed)"
            );
            continue;
        }
        let cg = crate::cgroup::Cgroup::at(n.path.clone());
        let started_no_earlier = recorded
            .iter()
            .filter(|(g, c, _)| *g == n.generation && *c == n.identity)
            .map(|(_, _, st)| *st)
            .min()
            .unwrap_or(u64::MAX);
        let live = || -> Vec<u32> {
            cg.pids()
                .into_iter()
                .filter(|p| !matches!(procs::state_of(*p), None | Some('Z') | Some('X')))
                .collect()
        };
        let gone = |within: Duration, kill: bool| {
            let end = Instant::now() + within;
            loop {
                let l = live();
                if l.is_empty() {
                    return None;
                }
                if Instant::now() >= end {
                    return l.first().copied();
                }
                if kill && crate::cgroup::unchanged(&n) {
                    cg.kill();
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        for pid in cg.pids() {
            if let Some(h) = cg.member(pid) {
                let ours = h.start_time >= started_no_earlier
                    && procs::uids_of(pid).is_some_and(|(_, e)| e == euid);
                if ours {
                    let _ = h.signal(Signal::TERM);
                }
            }
        }
        let survivor = gone(grace, false).and_then(|_| {
            if crate::cgroup::unchanged(&n) {
                cg.kill();
            }
            gone(kill_wait, true)
        });
        if let Some(pid) = survivor {
            return Err(RunError::CommandsSurvive {
                run: run.to_string(),
                pid,
                pgid: 0,
                generation: n.generation,
            });
        }
        if crate::cgroup::unchanged(&n) {
            cg.remove_within(Duration::from_secs(1));
        }
    }
    Ok(())
}

/// A directory named like one of this run's cgroups that runlease leaves alone (issue #29):
/// not proved its own (the cgroup module's `Verdict::NotOurs`), so never signalled or removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupAudit {
    /// Its path.
    pub path: std::path::PathBuf,
    /// The generation its name says.
    pub generation: u64,
    /// The uid that owns it.
    pub uid: u32,
    /// Its members now (`cgroup.procs`).
    pub members: Vec<u32>,
    /// Why it is not proved this run's.
    pub why: String,
}

/// The directories named like this run's cgroups (`runlease-<key>-<g>`, `<key>` from the
/// run folder's absolute path and run id) directly below this process's own cgroup that
/// the next open would leave alone (the open's judgement, read-only), except
/// generation `skip` (a live owner's own). One listing of this cgroup and of `commands/`;
/// nothing signalled or written. Empty without a cgroup2 mount.
pub fn audit_cgroups(dir: &RunDir, skip: Option<u64>) -> Result<Vec<CgroupAudit>, RunError> {
    let Some(parent) = crate::cgroup::own_dir() else {
        return Ok(Vec::new());
    };
    let root = dir
        .real_fs()
        .map(|f| f.root_path().to_path_buf())
        .unwrap_or_else(|| dir.root().to_path_buf());
    let key = crate::cgroup::run_key(&root, dir.run_id().as_str());
    let named = crate::cgroup::named_below(&parent, &key, u64::MAX);
    if named.is_empty() {
        return Ok(Vec::new());
    }
    let boot = probe::boot_id().map_err(|e| RunError::os("boot id", e))?;
    let idents: Vec<(u64, lease_core::CommandCgroup)> =
        recorded_cgroups(&command_records(dir)?, &boot)
            .into_iter()
            .map(|(g, c, _)| (g, c))
            .collect();
    let euid = procs::euid();
    Ok(named
        .into_iter()
        .filter(|n| Some(n.generation) != skip)
        .filter_map(|n| match crate::cgroup::judge(&n, &idents, euid) {
            crate::cgroup::Verdict::Ours => None,
            crate::cgroup::Verdict::NotOurs { why } => Some(CgroupAudit {
                members: crate::procs::pids_in(&n.path),
                path: n.path,
                generation: n.generation,
                uid: n.identity.uid,
                why,
            }),
        })
        .collect())
}
