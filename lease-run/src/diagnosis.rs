//! Gathering what lease-core's one diagnosis ([`lease_core::diagnose`]) looks at, for a run
//! folder: reads only (nothing is written, removed or signalled; the store is never
//! opened). `runlease doctor` is [`gather_facts`], [`lease_core::diagnose::diagnose`] and
//! rendering.

use crate::error::RunError;
use crate::run::first_unproven;
use lease_core::canonical::MAX_RECORD_BYTES;
use lease_core::diagnose::{CommandFacts, Facts, RunJsonFacts, VerifyFacts};
use lease_core::{Code, Dir, FileRef, LeaseOps, RunStatus, Timestamp, decode_for};
use lease_fs::RunDir;
use lease_fs::fs::Fs;

/// Temp files younger than this are never removed by a temp-file clean-up (a writer may
/// still be using them), and only older ones count as orphaned.
pub const TEMP_MIN_AGE_SECS: u64 = 60;

/// Every fact of the run at `dir` that [`lease_core::diagnose::diagnose`] looks at, read
/// at wall time `now` with liveness probed. A data error (a broken chain, an unreadable
/// record, an unprovable command) is a fact; anything else (I/O, a folder that is not
/// ours) is the error.
pub fn gather_facts(dir: &RunDir, now: Timestamp) -> Result<Facts, RunError> {
    let view = dir.status(now, true)?;
    let mut facts = Facts::of_view(view);
    facts.temp_files = count_temp_files(&**dir.fs());
    facts.verify = match dir.verify() {
        Ok(r) => VerifyFacts::Held(r),
        Err(e)
            if matches!(
                e.code(),
                Code::ChainBroken
                    | Code::EventLogGap
                    | Code::RecordInvalid
                    | Code::SchemaUnsupported
                    | Code::RunLayoutInvalid
            ) =>
        {
            VerifyFacts::Failed {
                code: e.code(),
                message: e.code().prefixed(&e),
            }
        }
        Err(e) => return Err(e.into()),
    };
    // run.json (written by `runlease run`): reported when unreadable, never repaired.
    facts.run_json = run_json_facts(dir);
    // Command records (read by the next open to reap a killed incarnation's commands):
    // one it cannot read, or one naming a live process it cannot prove ours, refuses it.
    let mut commands_refusal = None;
    facts.commands = match first_unproven(dir) {
        Ok(None) => CommandFacts::Clean,
        Ok(Some(refusal)) => {
            let message = refusal.code().prefixed(&refusal);
            commands_refusal = Some((refusal.code(), message.clone()));
            CommandFacts::Unproven { message }
        }
        // Bad data in a record (not I/O, not a folder that is not ours): a finding.
        Err(e)
            if matches!(
                e.code(),
                Code::RecordInvalid | Code::RunLayoutInvalid | Code::ChainBroken
            ) =>
        {
            let message = e.code().prefixed(&e);
            commands_refusal = Some((e.code(), message.clone()));
            CommandFacts::Invalid { message }
        }
        Err(e) => return Err(e),
    };
    // The store is never opened: its owner holds it exclusively, and opening a WAL
    // database may run SQLite's recovery, a write. Its presence is looked at beneath the
    // held root, without following a symlink.
    facts.store_present = dir.fs().exists(lease_core::layout::STORE_FILE).ok();
    facts.stray_names = dir.stray_names()?;
    facts.adoption_refusal = adoption_refusal(dir);
    // What the next claim refuses, in the order its preflight checks ([`claim_refusal`]),
    // from the facts above where they hold it: the verify walk and the command audit are
    // not repeated, only the layout listing and the names above the head are added.
    let head = facts.view.head.as_ref().map_or(0, |h| h.generation().get());
    let verify_refusal = match &facts.verify {
        VerifyFacts::Failed { code, message } => Some((*code, message.clone())),
        _ => None,
    };
    facts.claim_refusal = match crate::run::list_layout(dir) {
        Err(e) => Some(as_finding(e)?),
        Ok(()) => match commands_refusal.or(verify_refusal) {
            Some(r) => Some(r),
            None => strays_refusal(dir, head)?,
        },
    };
    Ok(facts)
}

/// What `runlease run` would refuse of the folder `dir` itself (not a run, not empty:
/// `RUN_FOLDER_FOREIGN`), as its message; read only. `None` for a run, an empty folder, or
/// when it cannot be told (the claim then reports it).
pub fn adoption_refusal(dir: &RunDir) -> Option<String> {
    match RunDir::adoption_refusal(dir.root()) {
        Ok(Some(e)) => Some(e.code().prefixed(&e)),
        _ => None,
    }
}

/// What the next claim of the run folder `dir` would refuse before writing anything,
/// beyond the lease's state: the open's preflight ([`crate::preflight`]: every protocol
/// folder listed as the lease lists it, every command record judged), the whole log and
/// both chains exactly as `runlease verify` checks them, and heartbeats, cutoffs or command
/// records named above the head generation `head` (0: none). `Ok(None)` when it would
/// refuse none of these; a data error (65, or 76 for an unprovable command) is
/// `Some((code, CODE: message))` naming the file; anything else (I/O, a folder that is not
/// ours) is the error. Read-only; O(n) in the log's length (the verify walk), as the
/// claim's own preflight is. `status` asks it for a run whose next step would be a claim
/// or a replacement, so the step it names is one the claim will not refuse.
pub fn claim_refusal(dir: &RunDir, head: u64) -> Result<Option<(Code, String)>, RunError> {
    if let Err(e) = crate::preflight(dir) {
        return as_finding(e).map(Some);
    }
    if let Err(e) = dir.verify() {
        return as_finding(e.into()).map(Some);
    }
    strays_refusal(dir, head)
}

/// The last check of [`claim_refusal`]: heartbeats, cutoffs or command records named above
/// the head generation `head`.
fn strays_refusal(dir: &RunDir, head: u64) -> Result<Option<(Code, String)>, RunError> {
    let list = |d: Dir| Ok(dir.perform(lease_core::ops::Request::List(d))?);
    match crate::run::strays_above_in(dir.run_id().as_str(), &list, dir, head) {
        Ok(()) => Ok(None),
        Err(e) => as_finding(e).map(Some),
    }
}

/// A refusal of the claim's preflight as a finding (`code`, `CODE: message`) when it is
/// bad data on disk (65, or 76 for an unprovable command); anything else (I/O, a folder
/// that is not ours) stays the error.
fn as_finding(e: RunError) -> Result<(Code, String), RunError> {
    let code = e.code();
    if matches!(
        code,
        Code::RecordInvalid
            | Code::SchemaUnsupported
            | Code::ChainBroken
            | Code::EventLogGap
            | Code::RunLayoutInvalid
            | Code::RunCommandUnproven
    ) {
        Ok((code, code.prefixed(&e)))
    } else {
        Err(e)
    }
}

/// Read `run.json` beneath the held root, reporting, never repairing: `Ok(None)` when
/// there is none, `Err` with the error and its code (`CODE: message`, naming the file)
/// when it cannot be read or decoded. The one reader of `run.json` for observers
/// (`doctor`'s facts, `status`'s `run_status`).
pub fn read_run_json(dir: &RunDir) -> Result<Option<RunStatus>, String> {
    let p = FileRef::RunStatus.path();
    let bytes = match dir.fs().read(&p, MAX_RECORD_BYTES) {
        Ok(None) => return Ok(None),
        Ok(Some(b)) => b,
        Err(e) => return Err(format!("cannot read {p}: {e}")),
    };
    decode_for::<RunStatus>(dir.run_id(), &bytes)
        .map(Some)
        .map_err(|e| {
            let e = e.in_file(&p);
            e.code().prefixed(&e)
        })
}

/// What `run.json` says, as diagnosis facts ([`read_run_json`]).
pub fn run_json_facts(dir: &RunDir) -> RunJsonFacts {
    match read_run_json(dir) {
        Ok(None) => RunJsonFacts::Absent,
        Ok(Some(r)) => RunJsonFacts::Written {
            failed: r.status == lease_core::RunState::Failed,
            generation: r.generation.get(),
            detail: r.detail,
        },
        Err(message) => RunJsonFacts::Invalid { message },
    }
}

/// Count our temp files ([`lease_fs::primitives::is_temp_name`]: total, older than
/// [`TEMP_MIN_AGE_SECS`]) in the run's protocol folders and its root.
fn count_temp_files(fs: &dyn Fs) -> (usize, usize) {
    let (mut total, mut old) = (0, 0);
    for d in Dir::ALL.iter().map(|d| d.path()).chain([""]) {
        // Beneath the held root; a missing or refused folder has nothing to count.
        let mut temps = Vec::new();
        let listed = fs.for_each_name(d, &mut |name| {
            if lease_fs::primitives::is_temp_name(name) {
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
