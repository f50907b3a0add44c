//! `takeover` and `retire`: replace a stale or dead owner from the command line.

use crate::common::{
    CliError, Out, held_description, human_ms, is_stale, new_nonce, new_owner_id, open_lease,
    shell_path, wall_now,
};
use lease_core::Code;
use lease_core::LeaseOps;
use lease_core::ops::{
    Expectation, ReleaseParams, RetireParams, Status, StatusView, TakeoverParams, TakeoverTrigger,
};
use lease_core::{FileRef, Generation, Identity, RetirementRecord, TimingPolicy, decode_for};
use lease_fs::lock::OwnerLock;
use lease_fs::{ProcLiveness, this_holder};
use lease_run::{Authority as RunAuthority, LeaseAuthority};
use serde_json::{Value, json};
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

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
        return Err(CliError::of(
            Code::TakeoverRace,
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
                return Err(CliError::of(
                    Code::TakeoverActiveRefused,
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
                    return Err(CliError::of(
                        Code::Aborted,
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
            CliError::of(
                Code::IoError,
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
