//! `run.json`: the wall clock, the fenced write and the records an open or release writes.

use super::step::blocking;
use super::{Run, Shared, StepName};
use crate::authority::LeaseAuthority;
use crate::clock::wall_now;
use crate::error::RunError;
use crate::sync::lock_std;
use lease_core::LeaseOps;
use lease_core::ops::{OwnedLease, Status};
use lease_core::{FileRef, RunState, RunStatus, Timestamp, encode};
use lease_fs::{FsError, RunDir, primitives};
use std::sync::Arc;

/// [`write_status_blocking`] of `record` as a closure that owns what it needs, for a
/// blocking step (`open`'s run.json, a status change, the release's final status).
pub(super) fn status_write(
    dir: &Arc<RunDir>,
    auth: &Arc<dyn LeaseAuthority>,
    shared: &Arc<Shared>,
    lease: &OwnedLease,
    record: &RunStatus,
) -> impl FnOnce() -> Result<(), RunError> + Send + 'static {
    let (dir, auth, sh, l, r) = (
        dir.clone(),
        auth.clone(),
        shared.clone(),
        lease.clone(),
        record.clone(),
    );
    move || write_status_blocking(&dir, &*auth, &sh, &l, &r)
}

/// Write `run.json` as generation `lease.generation` only: the head must still be our
/// active epoch and the run not fenced, checked right before the atomic replace.
pub(super) fn write_status_blocking(
    dir: &RunDir,
    auth: &dyn LeaseAuthority,
    shared: &Shared,
    lease: &OwnedLease,
    record: &RunStatus,
) -> Result<(), RunError> {
    shared.check_live()?;
    let view = auth.status(record.updated_at, false)?;
    let ours = view.head.as_ref().is_some_and(|h| {
        h.generation() == lease.generation && h.is_active() && h.epoch.owner_id == lease.owner_id
    });
    if !ours {
        // An unreadable head (edited by hand) cannot confirm the lease either: fenced,
        // but say which file, not that another owner came.
        let reason = match &view.status {
            Status::Invalid(e) => format!(
                "run.json not written: the lease head cannot be read to confirm generation {}: {}",
                lease.generation,
                e.code().prefixed(e)
            ),
            _ => format!(
                "run.json not written: the lease head is no longer generation {} of this owner",
                lease.generation
            ),
        };
        return Err(shared.fence_and_refuse(reason));
    }
    let bytes = encode(record)?;
    shared.check_live()?;
    if auth.commits_in_engine() {
        // The run's status follows its lease (issue #32, PROTOCOL §18): put in the engine
        // under the guard first, so a deposed owner's late write never lands there; the
        // folder's copy below is this host's.
        let put = auth.perform(lease_core::ops::Request::ReplaceGuarded {
            file: FileRef::RunStatus,
            bytes: bytes.clone(),
            generation: lease.generation,
        })?;
        if put != lease_core::ops::Response::Done {
            let reason = format!(
                "run.json not written: the engine refused it (an epoch above generation {} exists)",
                lease.generation
            );
            return Err(shared.fence_and_refuse(reason));
        }
    }
    // Order of writes: temp → fsync → rename, no fsync of the run folder (issue #33):
    // after a power loss run.json is the old record or this one, each whole (its data was
    // fsynced first), and both are valid states: run.json is advisory, its generation is
    // never above the durable chain's (the epoch was durable before either write), and no
    // decision rests on this write surviving. One fsync instead of two.
    primitives::replace_whole(&**dir.fs(), &FileRef::RunStatus.path(), &bytes)
        .map_err(|e| FsError::io(lease.run_id.as_str(), "replace", "run.json", e))?;
    Ok(())
}

impl Run {
    /// The last `run.json` this run wrote.
    pub fn status(&self) -> RunStatus {
        lock_std(&self.current).clone()
    }

    /// Write `run.json` with `status` (and `detail`), as this generation only.
    pub async fn set_status(
        &self,
        status: RunState,
        detail: Option<String>,
        wake_at: Option<Timestamp>,
    ) -> Result<(), RunError> {
        let now = wall_now()?;
        let mut rec = self.status();
        rec.status = status;
        rec.detail = detail;
        rec.wake_at = wake_at;
        rec.updated_at = now;
        let write = status_write(&self.dir, &self.auth, &self.shared, &self.lease, &rec);
        blocking(
            &self.shared.run,
            StepName::FinalStatus,
            self.opts.step_deadline,
            write,
        )
        .await?;
        *lock_std(&self.current) = rec;
        Ok(())
    }
}

/// `run.json`'s `detail` for a failure: the error's code and message (at most 4096 bytes).
pub(super) fn failure_detail(err: &RunError) -> String {
    let msg = err.to_string();
    let mut d = if msg.starts_with(err.code().as_str()) {
        msg
    } else {
        format!("{}: {msg}", err.code())
    };
    if d.len() > lease_core::records::DETAIL_MAX_BYTES {
        let mut cut = lease_core::records::DETAIL_MAX_BYTES;
        while !d.is_char_boundary(cut) {
            cut -= 1;
        }
        d.truncate(cut);
    }
    d
}

pub(super) fn record_fallback(lease: &OwnedLease, now: Timestamp) -> RunStatus {
    RunStatus {
        run_id: lease.run_id.clone(),
        status: RunState::Running,
        generation: lease.generation,
        sealed_sequence: None,
        wake_at: None,
        holder: Some(lease.holder.clone()),
        heartbeat_at: None,
        updated_at: now,
        detail: None,
    }
}
