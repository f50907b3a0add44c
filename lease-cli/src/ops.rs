//! The inspection and repair subcommands: status, list, takeover, retire, release (not
//! yet), append, events, verify, doctor, prune.

use crate::common::{
    CliError, EX_SOFTWARE, Lease, Out, cli_identity, held_description, human_ms, is_stale,
    new_nonce, new_owner_id, open_lease, run_status_json, shell_path, status_human, status_json,
    wall_now,
};
use crate::diagnosis::{
    TEMP_MIN_AGE_SECS, render_detail, render_next, run_json_facts, short_tail_text,
};
use lease_core::Code;
use lease_core::LeaseOps;
use lease_core::diagnose::{CommandFacts, Facts, VerifyFacts, diagnose};
use lease_core::ops::{
    AppendParams, Authority, Expectation, OwnedLease, PruneParams, ReleaseParams, RetireParams,
    Status, StatusView, TakeoverParams, TakeoverTrigger,
};
use lease_core::{Dir, FileRef, Generation, Identity, RetirementRecord, TimingPolicy, decode_for};
use lease_fs::lock::OwnerLock;
use lease_fs::{ProcLiveness, this_holder};
use lease_run::{Authority as RunAuthority, LeaseAuthority};
use serde_json::{Value, json};
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// One doctor finding as printed.
struct Finding {
    code: &'static str,
    severity: &'static str,
    detail: String,
    next: String,
}

// ---------------------------------------------------------------------------------------
// status, list

/// Read one run's status (liveness probed).
fn read_status(dir: &Path, authority: &RunAuthority) -> Result<(Lease, StatusView), CliError> {
    let run = open_lease(dir, authority, None)?;
    if let Some(f) = &run.folder {
        // run.json and owner.lock of another uid or open to others: refused (77), not read.
        f.check_root_files()?;
    }
    let view = run.auth.status(wall_now()?, true)?;
    Ok((run, view))
}

/// A command record whose live process cannot be proved ours (PROTOCOL §11.1).
struct Unproven {
    file: String,
    pid: u32,
    why: String,
}

/// The command records `status` reports: those the next `runlease run` would refuse over
/// (`RUN_COMMAND_UNPROVEN`). Reads `/proc` only; signals nothing.
fn unproven_commands(run: &lease_fs::RunDir) -> Result<Vec<Unproven>, lease_run::RunError> {
    Ok(lease_run::audit_commands(run)?
        .into_iter()
        .filter_map(|a| match a.state {
            lease_run::CommandState::Unproven { why } => Some(Unproven {
                file: a.file,
                pid: a.pid,
                why,
            }),
            _ => None,
        })
        .collect())
}

/// `runlease status DIR...`: exit 0 when every status could be read (an invalid run is a
/// status, printed, not a failure); otherwise the exit code of the first run that could
/// not be read.
pub fn status(
    dirs: &[std::path::PathBuf],
    authority: &RunAuthority,
    out: Out,
) -> Result<i32, CliError> {
    let mut exit = 0;
    for (i, dir) in dirs.iter().enumerate() {
        match read_status(dir, authority) {
            Ok((run, view)) => {
                let unproven = run.folder.as_deref().map(unproven_commands);
                if out.json {
                    let mut v = status_json(dir, run.run_id().as_str(), &view, run.run_status());
                    if let Some(u) = &unproven {
                        v["unproven_commands"] = match u {
                            Ok(list) => json!(
                                list.iter()
                                    .map(|a| json!({"file": a.file, "pid": a.pid, "why": a.why}))
                                    .collect::<Vec<_>>()
                            ),
                            Err(e) => json!({"error": e.to_string()}),
                        };
                    }
                    out.json_line(&v);
                } else {
                    if i > 0 {
                        out.line("");
                    }
                    for l in status_human(dir, &view, &run.run_status()) {
                        out.line(&l);
                    }
                    match &unproven {
                        Some(Ok(list)) => {
                            for a in list {
                                out.line(&format!(
                                    "  unproven: {} names live pid {}, which runlease cannot prove it started ({}); it is left alone, and the next `runlease run` refuses until you stop that process yourself (if it is this run's old command) or remove the record (if it is not)",
                                    a.file, a.pid, a.why
                                ));
                            }
                        }
                        Some(Err(e)) => {
                            out.line(&format!("  command records: {e}"));
                        }
                        None => {}
                    }
                }
            }
            Err(e) => {
                let e = e.with_extra(json!({"run": dir.display().to_string()}));
                e.report(&out);
                if exit == 0 {
                    exit = e.exit;
                }
            }
        }
    }
    Ok(exit)
}

/// `runlease init DIR`: make DIR a run explicitly (an existing non-empty folder too); on a
/// run it only adds missing layout folders. Refuses (77) before any write when DIR, an
/// existing layout folder, `run.json` or `owner.lock` is not ours or open to others.
pub fn init(dir: &Path, out: Out) -> Result<i32, CliError> {
    let done = crate::common::init_run(dir, true)?;
    let run_id = done.run.run_id().to_string();
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/init/1",
            "ok": true,
            "run": dir.display().to_string(),
            "run_id": run_id,
            "found": done.found.name(),
            "created": done.created,
        }));
    } else {
        let what = match done.found {
            lease_fs::Found::Missing => "created the run folder",
            lease_fs::Found::Empty => "made the empty folder a run",
            lease_fs::Found::Run => "already a run",
            lease_fs::Found::Foreign => {
                "made the existing folder a run (what was there is untouched)"
            }
        };
        let created = if done.created.is_empty() {
            "nothing created".to_string()
        } else {
            format!("created {}", done.created.join(", "))
        };
        out.line(&format!(
            "{}: {what} (run id {run_id}; {created})",
            dir.display()
        ));
    }
    Ok(0)
}

/// `runlease list FOLDER`: one row per immediate subfolder holding a `lease/epochs/` folder.
pub fn list(folder: &Path, out: Out) -> Result<i32, CliError> {
    let entries = std::fs::read_dir(folder).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            CliError::new(
                "RUN_NOT_FOUND",
                64,
                format!("folder {} does not exist", folder.display()),
            )
        } else if e.kind() == std::io::ErrorKind::NotADirectory {
            CliError::usage(format!(
                "{} is not a folder: list takes the folder that holds run folders",
                folder.display()
            ))
        } else {
            CliError::new(
                "IO_ERROR",
                74,
                format!("cannot list {}: {e}", folder.display()),
            )
        }
    })?;
    let mut dirs: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        // Never follow symlinks: a run folder that is a symlink is refused anyway. A run
        // holds `lease/epochs/` (`RunDir::init`'s test), looked up beneath the folder.
        .filter(|p| lease_fs::is_run_folder(p).unwrap_or(false))
        .collect();
    dirs.sort();
    if !out.json {
        out.line(&format!(
            "{:<24} {:<8} {:>5} {:<36} {:<16} {:>7} {:>14}",
            "RUN", "STATE", "GEN", "OWNER", "HOST", "PID", "HEARTBEAT AGE"
        ));
    }
    for dir in &dirs {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match read_status(dir, &RunAuthority::RunFolder) {
            Ok((run, view)) => {
                if out.json {
                    out.json_line(&status_json(
                        dir,
                        run.run_id().as_str(),
                        &view,
                        run.run_status(),
                    ));
                    continue;
                }
                let h = view.head.as_ref();
                let active = h.is_some_and(|h| h.is_active());
                out.line(&format!(
                    "{:<24} {:<8} {:>5} {:<36} {:<16} {:>7} {:>14}",
                    name,
                    view.status.name(),
                    h.map_or("-".into(), |h| h.generation().to_string()),
                    h.filter(|_| active)
                        .map_or("-".into(), |h| h.epoch.owner_id.to_string()),
                    h.filter(|_| active)
                        .map_or("-".into(), |h| h.epoch.holder.host.to_string()),
                    h.filter(|_| active)
                        .map_or("-".into(), |h| h.epoch.holder.pid.to_string()),
                    view.age_ms.map_or("-".into(), human_ms),
                ));
            }
            Err(e) => {
                if out.json {
                    out.json_line(&json!({
                        "schema": "runlease/cli/error/1",
                        "ok": false,
                        "run": dir.display().to_string(),
                        "code": e.code,
                        "message": e.message,
                        "exit_code": e.exit,
                    }));
                } else {
                    out.line(&format!("{name:<24} error    {}: {}", e.code, e.message));
                }
            }
        }
    }
    if dirs.is_empty() && !out.json {
        out.line(&format!("(no runs below {})", folder.display()));
    }
    Ok(0)
}

// ---------------------------------------------------------------------------------------
// takeover, retire, release

/// Options of `runlease takeover`.
#[derive(Debug, Clone)]
pub struct TakeoverOpts {
    /// `--expect-owner`.
    pub expect_owner: Option<String>,
    /// `--expect-heartbeat`.
    pub expect_heartbeat: Option<String>,
    /// `--expect-generation`.
    pub expect_generation: Option<u64>,
    /// `--expect-count`.
    pub expect_count: Option<u64>,
    /// `--yes`.
    pub yes: bool,
}

fn read_cutoff(run: &dyn LeaseAuthority, g: Generation) -> Option<u64> {
    match run.perform(lease_core::ops::Request::Read(FileRef::Cutoff(g))) {
        Ok(lease_core::ops::Response::Content(Some(b))) => {
            decode_for::<RetirementRecord>(run.run_id(), &b)
                .ok()
                .map(|r| r.events_through)
        }
        _ => None,
    }
}

/// Read the status (probing liveness) for an operation that replaces the owner: an invalid
/// record is refused (nothing may replace the owner until it is repaired), a free run is a
/// race (`free_why` says what there is not to do).
fn active_owner(
    run: &dyn LeaseAuthority,
    dir: &Path,
    free_why: &str,
) -> Result<(StatusView, lease_core::ops::Head), CliError> {
    let view = run.status(wall_now()?, true)?;
    if let Status::Invalid(e) = &view.status {
        return Err(CliError::from(e.clone()).with_hint(format!(
            "nothing may replace the owner until the record is repaired: runlease doctor {}",
            shell_path(dir)
        )));
    }
    let Some(head) = view.head.clone().filter(|h| h.is_active()) else {
        return Err(CliError::new(
            "TAKEOVER_RACE",
            75,
            format!("run {} is free: {free_why}", run.run_id()),
        ));
    };
    Ok((view, head))
}

/// `runlease takeover DIR`: exact operator takeover of a stale owner; the CLI becomes the
/// owner for an instant and releases at once, so the run is free for the next `run`.
pub fn takeover(
    dir: &Path,
    authority: &RunAuthority,
    o: &TakeoverOpts,
    out: Out,
) -> Result<i32, CliError> {
    let lease = open_lease(dir, authority, None)?;
    let run = &*lease.auth;
    let (view, head) = active_owner(
        run,
        dir,
        "there is no owner to take over (claim it with runlease run)",
    )?;
    check_before_replacing(run)?;
    let (desc, held) = held_description(&view);
    if !out.json {
        out.info(&format!("observed {}: {desc}", dir.display()));
    }
    let expect = match (&o.expect_owner, &o.expect_heartbeat) {
        (Some(owner), Some(hb)) => Expectation {
            generation: o.expect_generation.and_then(Generation::new),
            owner_id: Identity::arg("--expect-owner", owner.clone())?,
            heartbeat_at: lease_core::Timestamp::parse(hb)
                .map_err(|e| CliError::usage(format!("--expect-heartbeat: {e}")))?,
            heartbeat_count: o.expect_count,
        },
        (None, None) => {
            let interactive = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
            if !o.yes && !interactive {
                return Err(CliError::usage(format!(
                    "not a terminal: pass --expect-owner and --expect-heartbeat with the values `runlease status --json {}` printed (expect_owner, expect_heartbeat), or --yes to take over exactly what is observed now",
                    shell_path(dir)
                )));
            }
            if view.status == Status::Active || (view.status == Status::Dead && !is_stale(&view)) {
                let hint = if view.status == Status::Dead {
                    format!("it is definitely dead: runlease retire {}", shell_path(dir))
                } else {
                    "wait, or ask the owner to release".into()
                };
                return Err(CliError::new(
                    "TAKEOVER_ACTIVE_REFUSED",
                    76,
                    format!("run {}: {desc}: the owner is fresh; {hint}", run.run_id()),
                )
                .with_extra(held));
            }
            if !o.yes {
                eprint!(
                    "runlease: take over owner {} (heartbeat {}, age {})? [y/N] ",
                    head.epoch.owner_id,
                    head.heartbeat_at(),
                    view.age_ms.map_or("?".into(), human_ms)
                );
                let _ = std::io::stderr().flush();
                let mut answer = String::new();
                let _ = std::io::stdin().lock().read_line(&mut answer);
                if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
                    return Err(CliError::new(
                        "ABORTED",
                        1,
                        "takeover not confirmed; nothing was changed",
                    ));
                }
            }
            Expectation::of(&head)
        }
        _ => {
            return Err(CliError::usage(
                "--expect-owner and --expect-heartbeat go together",
            ));
        }
    };
    let policy: TimingPolicy = head.epoch.policy;
    let lease = run.takeover(TakeoverParams {
        run_id: run.run_id().clone(),
        owner_id: new_owner_id()?,
        holder: this_holder()?,
        policy,
        now: wall_now()?,
        expect,
        trigger: TakeoverTrigger::Operator,
        nonce: new_nonce()?,
    })?;
    let cutoff = read_cutoff(run, head.generation());
    let released = run
        .release(ReleaseParams {
            lease: lease.clone(),
            now: wall_now()?,
            seal: None,
        })
        .map_err(|e| {
            CliError::from(e).with_hint(format!(
                "the takeover itself succeeded (generation {}); the old owner is fenced",
                lease.generation
            ))
        })?;
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/takeover/1",
            "ok": true,
            "run": dir.display().to_string(),
            "taken_over": held.get("holder").cloned().unwrap_or(Value::Null),
            "generation": lease.generation.get(),
            "released_as": released.get(),
            "cutoff": cutoff,
            "state": "free",
        }));
    } else {
        out.line(&format!(
            "took over {} from owner {} (generation {}, last heartbeat {}) as generation {}, then released it as generation {}: the run is free",
            dir.display(),
            head.epoch.owner_id,
            head.generation(),
            head.heartbeat_at(),
            lease.generation,
            released
        ));
        if let Some(c) = cutoff {
            out.line(&format!(
                "events of the old owner count through sequence {c}; anything it writes later is fenced and never counts"
            ));
        }
    }
    Ok(0)
}

/// Before replacing an owner (takeover, retirement): every record of the run must read and
/// the hash chains must hold (`verify`), as doctor's INVALID_RECORD and BROKEN_CHAIN advise
/// ("do not take over"). The protocol's OBSERVE checks only the head epoch and its beat,
/// but a replacement finalizes the old owner's cutoff over the event log and writes on
/// top of the chain: bad input anywhere is reported (65, naming the file), never acted on.
pub fn check_before_replacing(run: &dyn LeaseAuthority) -> Result<(), CliError> {
    run.verify().map(|_| ()).map_err(CliError::from)
}

/// `runlease retire DIR`: retire a definitely-dead owner (same boot, process gone, owner
/// lock free). Takes the owner lock first if it can.
pub fn retire(dir: &Path, authority: &RunAuthority, out: Out) -> Result<i32, CliError> {
    // The folder judges "dead" with the owner lock (taken if it can be); etcd by the
    // owner's etcd lease, which needs no local lock.
    let (lease, lock) = if *authority == RunAuthority::RunFolder {
        let mut run = crate::common::open_run(dir)?;
        let lock = OwnerLock::acquire_timeout(dir, Duration::from_millis(200)).map_err(|e| {
            CliError::new(
                "IO_ERROR",
                74,
                format!("cannot take the owner lock of {}: {e}", dir.display()),
            )
        })?;
        if lock.is_some() {
            run.set_liveness(Arc::new(ProcLiveness::new(dir).holding_lock()));
        }
        (open_lease(dir, authority, Some(run))?, lock)
    } else {
        (open_lease(dir, authority, None)?, None)
    };
    let run = &*lease.auth;
    let (view, head) = active_owner(run, dir, "there is no owner to retire")?;
    check_before_replacing(run)?;
    let retired = run
        .retire(RetireParams {
            run_id: run.run_id().clone(),
            owner_id: new_owner_id()?,
            holder: this_holder()?,
            policy: head.epoch.policy,
            now: wall_now()?,
            expect: Some(Expectation::of(&head)),
            nonce: new_nonce()?,
        })
        .map_err(|e| {
            let code = e.code();
            let err = CliError::from(e);
            if code == "RETIRE_REFUSED_NOT_DEAD" {
                let next = if is_stale(&view) {
                    format!(
                        "it is stale: runlease takeover {} --expect-owner {} --expect-heartbeat {}",
                        shell_path(dir),
                        head.epoch.owner_id,
                        head.heartbeat_at()
                    )
                } else {
                    "wait for it to become stale, then take over".into()
                };
                err.with_hint(next)
            } else {
                err
            }
        })?;
    drop(lock);
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/retire/1",
            "ok": true,
            "run": dir.display().to_string(),
            "retired_generation": retired.retired.get(),
            "retired_owner": head.epoch.owner_id.to_string(),
            "generation": retired.generation.get(),
            "cutoff": retired.cutoff,
            "state": "free",
        }));
    } else {
        out.line(&format!(
            "retired dead owner {} (generation {}, pid {} on {}) as generation {}: the run is free; its events through sequence {} count",
            head.epoch.owner_id,
            retired.retired,
            head.epoch.holder.pid,
            head.epoch.holder.host,
            retired.generation,
            retired.cutoff
        ));
    }
    Ok(0)
}

/// Options of `runlease release`.
#[derive(Debug, Clone)]
pub struct ReleaseOpts {
    /// `--generation` / `RUNLEASE_GENERATION`.
    pub generation: Option<u64>,
    /// `--owner` / `RUNLEASE_OWNER`.
    pub owner: Option<String>,
    /// How long to wait for a `runlease run` owner to release on request.
    pub timeout: Duration,
}

/// The parent pid of `pid` (from `/proc/PID/stat`), if readable.
fn parent_of(pid: u32) -> Option<u32> {
    lease_run::procs::proc_info(pid).map(|p| p.ppid)
}

/// Whether `pid` is a proper ancestor of this process (walks the parent chain).
fn is_ancestor(pid: u32) -> bool {
    let mut p = std::process::id();
    for _ in 0..64 {
        match parent_of(p) {
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

/// `runlease release [DIR]`: the owner hands the run over cleanly (the token comes from
/// `RUNLEASE_GENERATION`/`RUNLEASE_OWNER`, or the flags).
///
/// * The token must name the current, active head: a superseded, released or foreign
///   generation is `FENCED` (75) and nothing is written; release never touches someone
///   else's generation.
/// * **Under `runlease run`** (the head's holder is this host and boot and an ancestor of
///   this process, i.e. the `runlease run` running this command): send it SIGUSR1 and
///   wait (`--timeout`) until the head shows the generation released by that owner. The
///   owner releases from its heartbeat thread, so no heartbeat follows the release; the
///   command runs on without the lease. If someone else supersedes the generation first:
///   `FENCED` (75); no answer in time: `RELEASE_TIMEOUT` (75). An ancestor holder that is
///   not this runlease binary is not signalled (`RELEASE_NOT_DELIVERED`, 76).
/// * **Otherwise** (an owner that claimed without `runlease run` and handed its token to
///   this process): release directly, as that owner. If the owner process still
///   heartbeats, it is fenced at its next heartbeat (a `runlease run` owner then kills its
///   command and exits 75).
pub fn release(
    dir: &Path,
    authority: &RunAuthority,
    o: &ReleaseOpts,
    out: Out,
) -> Result<i32, CliError> {
    let (generation, owner) = token(o.generation, o.owner.as_ref())?;
    let opened = open_lease(dir, authority, None)?;
    let run = &*opened.auth;
    let (lease, head) = owned_head(run, generation, &owner, "nothing was released")?;
    let me = this_holder()?;
    let holder = &head.epoch.holder;
    // The recorded start time rules out a reused pid.
    let via_run = holder.host == me.host
        && holder.boot_id == me.boot_id
        && is_ancestor(holder.pid)
        && lease_fs::probe::live_process_start_time(holder.pid)
            .is_ok_and(|t| t == Some(holder.start_time));
    if via_run && !same_executable(holder.pid) {
        // SIGUSR1 would terminate a process that does not handle it: only a runlease of
        // this very binary is asked; a direct release would fence (and so kill) our owner.
        return Err(CliError::new(
            "RELEASE_NOT_DELIVERED",
            76,
            format!(
                "run {}: generation {generation} is held by pid {}, an ancestor of this process that is not this runlease binary; ask it to release through its own interface",
                run.run_id(),
                holder.pid
            ),
        ));
    }
    let released_as = if via_run {
        let pid = i32::try_from(holder.pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| CliError::new("INTERNAL", EX_SOFTWARE, "holder pid out of range"))?;
        rustix::process::kill_process(pid, rustix::process::Signal::USR1).map_err(|e| {
            CliError::new(
                "IO_ERROR",
                74,
                format!("cannot signal the owner (pid {}): {e}", holder.pid),
            )
        })?;
        let t = std::time::Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(20));
            let view = run.status(wall_now()?, false)?;
            if let Status::Invalid(e) = view.status {
                return Err(e.into());
            }
            match view.head {
                Some(h) if h.generation() > generation => {
                    let next = Generation::new(generation.get() + 1);
                    if Some(h.generation()) == next
                        && !h.is_active()
                        && h.epoch.state == lease_core::EpochState::Released
                        && h.epoch.owner_id == owner
                    {
                        break h.generation();
                    }
                    return Err(CliError::new(
                        "FENCED",
                        75,
                        format!(
                            "run {}: generation {generation} was superseded (the head is now generation {}, owner {}) before its owner released it",
                            run.run_id(),
                            h.generation(),
                            h.epoch.owner_id
                        ),
                    ));
                }
                _ => {}
            }
            if t.elapsed() > o.timeout {
                return Err(CliError::new(
                    "RELEASE_TIMEOUT",
                    75,
                    format!(
                        "run {}: the owner (runlease run, pid {}) did not release generation {generation} within {}; it still holds the run",
                        run.run_id(),
                        holder.pid,
                        human_ms(i64::try_from(o.timeout.as_millis()).unwrap_or(i64::MAX))
                    ),
                ));
            }
        }
    } else {
        run.release(ReleaseParams {
            lease: lease.clone(),
            now: wall_now()?,
            seal: None,
        })?
    };
    let how = if via_run { "owner" } else { "direct" };
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/release/1",
            "ok": true,
            "run": dir.display().to_string(),
            "generation": generation.get(),
            "released_as": released_as.get(),
            "how": how,
            "state": "free",
        }));
    } else {
        out.line(&format!(
            "released {} (generation {generation}) as generation {released_as}{}: the run is free",
            dir.display(),
            if via_run {
                " by its runlease run owner"
            } else {
                ""
            }
        ));
    }
    Ok(0)
}

// ---------------------------------------------------------------------------------------
// append, events

/// Options of `runlease append`.
#[derive(Debug, Clone)]
pub struct AppendOpts {
    /// `--type`.
    pub event_type: String,
    /// `--payload` (JSON text).
    pub payload: Option<String>,
    /// `--generation` / `RUNLEASE_GENERATION`.
    pub generation: Option<u64>,
    /// `--owner` / `RUNLEASE_OWNER`.
    pub owner: Option<String>,
}

/// The owner's token (generation and owner id) from the flags or the environment.
fn token(
    generation: Option<u64>,
    owner: Option<&String>,
) -> Result<(Generation, Identity), CliError> {
    let generation = generation
        .ok_or_else(|| {
            CliError::usage(
                "no generation: pass --generation or run under `runlease run` (RUNLEASE_GENERATION)",
            )
        })
        .and_then(|g| {
            Generation::new(g).ok_or_else(|| CliError::usage("--generation must be at least 1"))
        })?;
    let owner = owner.cloned().ok_or_else(|| {
        CliError::usage("no owner: pass --owner or run under `runlease run` (RUNLEASE_OWNER)")
    })?;
    Ok((generation, Identity::arg("owner id", owner)?))
}

/// Check that `(generation, owner)` is the run's current, active head and return the
/// lease that owner holds (its identity is the epoch on disk). A generation that does not
/// exist is a usage error (64); a superseded, released or foreign generation is `FENCED`
/// (75), with `nothing` saying what was not done.
fn owned_head(
    run: &dyn LeaseAuthority,
    generation: Generation,
    owner: &Identity,
    nothing: &str,
) -> Result<(OwnedLease, lease_core::ops::Head), CliError> {
    let view = run.status(wall_now()?, false)?;
    if let Status::Invalid(e) = view.status {
        return Err(e.into());
    }
    let fenced = |detail: String| {
        CliError::new(
            "FENCED",
            75,
            format!(
                "run {}: generation {generation} is fenced: {detail}; {nothing}",
                run.run_id()
            ),
        )
    };
    let head = match &view.head {
        None => {
            return Err(CliError::usage(format!(
                "run {} was never claimed: generation {generation} does not exist",
                run.run_id()
            )));
        }
        Some(h) if h.generation() < generation => {
            return Err(CliError::usage(format!(
                "generation {generation} does not exist (the head is {})",
                h.generation()
            )));
        }
        Some(h) if h.generation() > generation => {
            return Err(fenced(format!(
                "the run is at generation {}",
                h.generation()
            )));
        }
        Some(h) if !h.is_active() => {
            return Err(fenced("it was released".into()));
        }
        Some(h) if h.epoch.owner_id != *owner => {
            return Err(fenced(format!(
                "its owner is {}, not {owner}",
                h.epoch.owner_id
            )));
        }
        Some(h) => h.clone(),
    };
    let lease = OwnedLease {
        run_id: run.run_id().clone(),
        generation,
        owner_id: owner.clone(),
        holder: head.epoch.holder.clone(),
        policy: head.epoch.policy,
        epoch_hash: head.hash.clone(),
    };
    Ok((lease, head))
}

/// `runlease append DIR --type T`: append one event as the current owner (the token comes
/// from `RUNLEASE_GENERATION`/`RUNLEASE_OWNER`). Exit 0 only when the event is durable and
/// authoritative; 75 when the generation is fenced.
pub fn append(
    dir: &Path,
    authority: &RunAuthority,
    o: &AppendOpts,
    out: Out,
) -> Result<i32, CliError> {
    let (generation, owner) = token(o.generation, o.owner.as_ref())?;
    let event_type = Identity::arg("event type", o.event_type.clone())?;
    let payload: Value = match &o.payload {
        None => Value::Null,
        // Strict: a repeated key or a number that cannot be kept exactly is refused, never
        // merged or rounded into the durable event.
        Some(text) => lease_core::canonical::parse_json_strict(text)
            .map_err(|e| CliError::usage(format!("--payload is not valid JSON: {e}")))?,
    };
    let opened = open_lease(dir, authority, None)?;
    let run = &*opened.auth;
    // Act as that owner: the append's own pre- and post-checks decide whether it counts.
    let (lease, _) = owned_head(run, generation, &owner, "nothing was appended")?;
    let appended = run.append(
        &lease,
        AppendParams {
            event_type: event_type.clone(),
            payload,
            now: wall_now()?,
            tail_hint: None,
        },
    )?;
    if let Some(by) = appended.superseded_by {
        eprintln!(
            "runlease: warning: event {} counts, but generation {generation} was superseded by generation {by} meanwhile: stop writing",
            appended.sequence
        );
    }
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/append/1",
            "ok": true,
            "run": dir.display().to_string(),
            "sequence": appended.sequence.get(),
            "hash": appended.hash.to_string(),
            "generation": generation.get(),
            "type": event_type.to_string(),
            "superseded_by": appended.superseded_by.map(|g| g.get()),
        }));
    } else {
        out.line(&appended.sequence.to_string());
    }
    Ok(0)
}

/// The authority of an event: a short code and a human phrase.
fn authority_text(a: &Authority) -> (&'static str, String) {
    match a {
        Authority::Authoritative => ("counts", "counts".into()),
        Authority::PastCutoff { cutoff } => (
            "past_cutoff",
            format!("does not count: past its generation's cutoff {cutoff}"),
        ),
        Authority::Pending => (
            "pending",
            "not counted yet: its generation was superseded and the cutoff is not finalized".into(),
        ),
        Authority::NotOwner => (
            "not_owner",
            "does not count: not written by its generation's owner".into(),
        ),
        Authority::FreeGeneration => (
            "free_generation",
            "does not count: its generation had no owner".into(),
        ),
        Authority::UnknownGeneration => (
            "unknown_generation",
            "does not count: no such generation".into(),
        ),
        Authority::ExcludedByCheckpoint => (
            "excluded_by_checkpoint",
            "does not count: excluded by the checkpoint".into(),
        ),
    }
}

fn print_event(je: &lease_core::ops::JudgedEvent, out: &Out) -> bool {
    let e = &je.event;
    let (code, text) = authority_text(&je.authority);
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/event/1",
            "sequence": e.sequence.get(),
            "generation": e.generation.get(),
            "owner_id": e.owner_id.to_string(),
            "type": e.event_type.to_string(),
            "timestamp": e.timestamp.to_string(),
            "payload": e.payload,
            "hash": je.hash.to_string(),
            "authoritative": je.authority.counts(),
            "authority": code,
            "cutoff": match je.authority { Authority::PastCutoff { cutoff } => Some(cutoff), _ => None },
        }))
    } else {
        let mark = if je.authority.counts() { ' ' } else { '!' };
        out.line(&format!(
            "{mark}{:>6}  {}  gen {:<4} {:<20} {}  [{}]",
            e.sequence, e.timestamp, e.generation, e.event_type, e.payload, text
        ))
    }
}

/// `runlease events DIR [--follow]`: every event with its authority (non-authoritative
/// events are shown, marked `!`, never hidden). Read-only: pending cutoffs are not
/// finalized.
pub fn events(
    dir: &Path,
    authority: &RunAuthority,
    follow: bool,
    out: Out,
) -> Result<i32, CliError> {
    let opened = open_lease(dir, authority, None)?;
    let run = &*opened.auth;
    // Streamed: one event in memory at a time, whatever the log's length.
    let mut last = 0u64;
    let mut stdout_gone = false;
    run.for_each_event(&mut |je| {
        if !print_event(je, &out) {
            stdout_gone = true;
            return false;
        }
        last = je.event.sequence.get();
        true
    })?;
    if stdout_gone {
        return Ok(0);
    }
    if last == 0 && !out.json && !follow {
        out.line("(no events)");
    }
    if !follow {
        return Ok(0);
    }
    // Polls every 500 ms. On a run folder an idle poll is one `stat` of the next event's
    // name; only when it exists is the whole log re-read and re-judged (the judgment of
    // already printed events is not re-printed if it changes). Over etcd every poll reads.
    // The `stat` is made beneath the held run root, like every other read.
    let folder = match authority {
        RunAuthority::RunFolder => opened.folder.clone(),
        #[allow(unreachable_patterns)]
        _ => None,
    };
    loop {
        std::thread::sleep(Duration::from_millis(500));
        if let Some(f) = &folder {
            let next = lease_core::Sequence::new(last + 1).map(|s| FileRef::Event(s).path());
            if next.is_some_and(|p| !f.fs().exists(&p).unwrap_or(false)) {
                continue;
            }
        }
        let seen = last;
        run.for_each_event(&mut |je| {
            if je.event.sequence.get() <= seen {
                return true;
            }
            if !print_event(je, &out) {
                stdout_gone = true;
                return false;
            }
            last = je.event.sequence.get();
            true
        })?;
        if stdout_gone {
            return Ok(0);
        }
    }
}

// ---------------------------------------------------------------------------------------
// verify, doctor, prune

/// `runlease verify DIR`: both hash chains; 65 on `CHAIN_BROKEN`/`EVENT_LOG_GAP`/invalid
/// records.
pub fn verify(dir: &Path, authority: &RunAuthority, out: Out) -> Result<i32, CliError> {
    let opened = open_lease(dir, authority, None)?;
    let run = &*opened.auth;
    let r = run.verify()?;
    let strays: Vec<u64> = r.strays.iter().map(|g| g.get()).collect();
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/verify/1",
            "ok": true,
            "run": dir.display().to_string(),
            "epochs": r.epochs,
            "events": r.events,
            "floor": r.floor.map(|g| g.get()),
            "strays": strays,
            "short_tail": r.short_tail.as_ref().map(|t| json!({
                "named": t.named,
                "by_cutoff_of": t.by_cutoff_of.map(|g| g.get()),
                "tail": t.tail,
            })),
        }));
    } else {
        out.line(&format!(
            "{}: ok: {} epochs and {} events checked{}{}{}",
            dir.display(),
            r.epochs,
            r.events,
            r.floor
                .map(|f| format!(", checkpoint floor {f}"))
                .unwrap_or_default(),
            if strays.is_empty() {
                String::new()
            } else {
                format!(
                    ", stray epochs below the floor: {strays:?} (runlease prune {} removes them)",
                    shell_path(dir)
                )
            },
            r.short_tail
                .as_ref()
                .map(|t| format!(
                    "; note: {} (runlease doctor {} says what it means)",
                    short_tail_text(t),
                    shell_path(dir)
                ))
                .unwrap_or_default()
        ));
    }
    Ok(0)
}

/// One line for verify's `short_tail`: the log ends before a sequence the chain names.
/// Count `.tmp-*` files (total, older than the grace) in the run's protocol folders.
fn count_temp_files(fs: &dyn lease_fs::fs::Fs) -> (usize, usize) {
    let (mut total, mut old) = (0, 0);
    for d in Dir::ALL.iter().map(|d| d.path()).chain([""]) {
        // Beneath the held root; a missing or refused folder has nothing to count.
        let mut temps = Vec::new();
        let listed = fs.for_each_name(d, &mut |name| {
            if name.starts_with(lease_fs::primitives::TEMP_PREFIX) {
                temps.push(lease_fs::fs::join(d, name));
            }
        });
        if listed.is_err() {
            continue;
        }
        for t in temps {
            total += 1;
            if fs
                .age_secs(&t)
                .ok()
                .flatten()
                .is_some_and(|a| a >= TEMP_MIN_AGE_SECS)
            {
                old += 1;
            }
        }
    }
    (total, old)
}

/// `runlease doctor DIR [--clean-temp]`: findings with stable codes and one next step each.
/// Exit 0 unless a finding is a data error (`INVALID_RECORD`, `BROKEN_CHAIN`: 65).
pub fn doctor(dir: &Path, clean_temp: bool, out: Out) -> Result<i32, CliError> {
    let run = crate::common::open_run(dir)?;
    // Refused (77) before anything is read or removed, like every other subcommand.
    run.check_root_files()?;

    let mut cleaned = None;
    if clean_temp {
        cleaned = Some(run.clean_temp_files(TEMP_MIN_AGE_SECS)?);
    }
    // Gather the facts (reads only); lease-core's diagnosis decides what they mean.
    let view = run.status(wall_now()?, true)?;
    let mut facts = Facts::of_view(view.clone());
    facts.temp_files = count_temp_files(&**run.fs());
    facts.verify = match run.verify() {
        Ok(r) => VerifyFacts::Held(r),
        Err(e)
            if matches!(
                e.code(),
                Code::ChainBroken
                    | Code::EventLogGap
                    | Code::RecordInvalid
                    | Code::SchemaUnsupported
            ) =>
        {
            VerifyFacts::Failed {
                code: e.code(),
                message: e.to_string(),
            }
        }
        Err(e) => return Err(e.into()),
    };
    // run.json (written by `runlease run`): reported when unreadable, never repaired.
    facts.run_json = run_json_facts(&run_status_json(&run));
    // Command records (read by the next `runlease run` to reap a killed incarnation's
    // commands): one it cannot read, or one naming a process it cannot prove, refuses
    // the run.
    facts.commands = match crate::common::check_command_records(&run) {
        Ok(()) => CommandFacts::Clean,
        Err(e) if e.code == Code::RunCommandUnproven.as_str() => CommandFacts::Unproven {
            message: format!("{}: {}", e.code, e.message),
        },
        Err(e) if e.exit != 65 => return Err(e),
        Err(e) => CommandFacts::Invalid {
            message: format!("{}: {}", e.code, e.message),
        },
    };
    // The store is never opened: its owner holds it exclusively, and opening a WAL
    // database may run SQLite's recovery, a write, which doctor never does. Its presence
    // is looked at beneath the held root, without following a symlink.
    facts.store_present = run.fs().exists(lease_core::layout::STORE_FILE).ok();
    facts.stray_names = run.stray_names()?;
    let findings: Vec<_> = diagnose(&facts)
        .iter()
        .map(|f| Finding {
            code: f.code.as_str(),
            severity: f.severity.as_str(),
            detail: render_detail(f, &view),
            next: render_next(&f.next, dir),
        })
        .collect();
    let exit = if findings.iter().any(|f| f.severity == "error") {
        65
    } else {
        0
    };
    if let Some(n) = cleaned {
        if out.json {
            out.json_line(&json!({
                "schema": "runlease/cli/doctor/1",
                "run": dir.display().to_string(),
                "code": "TEMP_FILES_REMOVED",
                "severity": "info",
                "detail": format!("removed {n} temp file(s) older than {TEMP_MIN_AGE_SECS} s"),
                "count": n,
                "next_step": null,
            }));
        } else {
            out.line(&format!(
                "removed {n} temp file(s) older than {TEMP_MIN_AGE_SECS} s"
            ));
        }
    }
    for f in &findings {
        if out.json {
            out.json_line(&json!({
                "schema": "runlease/cli/doctor/1",
                "run": dir.display().to_string(),
                "code": f.code,
                "severity": f.severity,
                "detail": f.detail,
                "next_step": f.next,
            }));
        } else {
            out.line(&format!("{:<18} {}", f.code, f.detail));
            out.line(&format!("{:<18} next: {}", "", f.next));
        }
    }
    Ok(exit)
}

/// `runlease prune DIR [--keep N]`.
pub fn prune(dir: &Path, authority: &RunAuthority, keep: u64, out: Out) -> Result<i32, CliError> {
    let opened = open_lease(dir, authority, None)?;
    let run = &*opened.auth;
    // Refuse an invalid head up front, even when there would be nothing to prune: bad
    // input on disk is reported, never passed over with exit 0.
    if let Status::Invalid(e) = run.status(wall_now()?, false)?.status {
        return Err(e.into());
    }
    let r = run.prune(PruneParams {
        run_id: run.run_id().clone(),
        keep,
        by: cli_identity("prune"),
        now: wall_now()?,
    })?;
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/prune/1",
            "ok": true,
            "run": dir.display().to_string(),
            "keep": keep.max(2),
            "floor": r.floor.map(|g| g.get()),
            "removed": r.removed,
        }));
    } else {
        match r.floor {
            Some(f) => out.line(&format!(
                "{}: checkpoint floor {f}; removed {} file(s)",
                dir.display(),
                r.removed
            )),
            None => out.line(&format!(
                "{}: nothing to prune (at most {} generations)",
                dir.display(),
                keep.max(2)
            )),
        };
    }
    Ok(0)
}
