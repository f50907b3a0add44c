//! What an open checks before it writes anything.

use super::reap::{CommandState, audit_commands};
use super::status::wall_now;
use crate::authority::LeaseAuthority;
use crate::error::RunError;
use lease_core::LeaseOps;
use lease_core::{LeaseError, RunStatus};
use lease_fs::RunDir;

/// What an open checks before it writes anything, for runs it is about to claim: every
/// protocol folder of the layout is listed (the event folder counted) as the lease will
/// list it, so a misplaced file or a symlinked folder (`RUN_LAYOUT_INVALID`, 65) is refused
/// now instead of at the release, after the command ran; and every command record is read
/// and judged ([`audit_commands`]): an unreadable or misnamed one (65) or a live recorded
/// process that cannot be proved ours (`RUN_COMMAND_UNPROVEN`, 76) is refused before a
/// claim or a retirement, not while reaping after it. Read-only.
pub fn preflight(dir: &RunDir) -> Result<(), RunError> {
    for d in lease_core::Dir::ALL {
        let req = if d == lease_core::Dir::Events {
            lease_core::ops::Request::CountEvents
        } else {
            lease_core::ops::Request::List(d)
        };
        dir.perform(req)?;
    }
    match first_unproven(dir)? {
        Some(refusal) => Err(refusal),
        None => Ok(()),
    }
}

/// The refusal (`RUN_COMMAND_UNPROVEN`, 76) for the first command record that names a live
/// process runlease cannot prove it started (PROTOCOL §11.1), if any; an unreadable or
/// misnamed record is the error. Reads `/proc` only. The next open refuses over it
/// ([`preflight`]) and `doctor` reports it (`diagnosis::gather_facts`).
pub(crate) fn first_unproven(dir: &RunDir) -> Result<Option<RunError>, RunError> {
    Ok(audit_commands(dir)?
        .into_iter()
        .find_map(|a| match a.state {
            CommandState::Unproven { why } => Some(RunError::CommandUnproven {
                run: dir.run_id().to_string(),
                file: a.file,
                pid: a.pid,
                start_time: a.start_time,
                why,
            }),
            _ => None,
        }))
}

/// `CHAIN_BROKEN` (65) when `run.json` was written by a generation the lease chain does
/// not reach (its newest epochs deleted, `lease/` restored from an older copy or emptied).
/// An owner writes `run.json` only after its epoch is durable, so no crash produces this;
/// claiming would hand out fencing tokens already given out (the store accepts an equal
/// token).
pub fn chain_reaches(
    auth: &dyn LeaseAuthority,
    run_json: Option<&RunStatus>,
) -> Result<(), RunError> {
    let Some(written_by) = run_json.map(|r| r.generation.get()) else {
        return Ok(());
    };
    let view = auth.status(wall_now()?, false)?;
    // An unreadable head is that record's error, not a chain that ends early.
    if let lease_core::ops::Status::Invalid(e) = view.status {
        return Err(RunError::Lease(e));
    }
    let head = view.head.as_ref().map_or(0, |h| h.epoch.generation.get());
    // The same judgement `status` and `doctor` make (lease-core's one diagnosis).
    let Some(what) = lease_core::diagnose::chain_behind(written_by, head) else {
        return Ok(());
    };
    Err(RunError::Lease(LeaseError::ChainBroken {
        run: auth.run_id().to_string(),
        chain: "epoch",
        at: written_by,
        detail: format!("{what}; restore lease/ from a backup"),
    }))
}
