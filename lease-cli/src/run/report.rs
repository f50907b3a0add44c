//! What `runlease run` says of the run it owns beyond the command's own output: that it
//! owns it and how, each failed heartbeat as it happens, that it released it; and when the
//! owner was fenced, how the command ended and who replaced the owner.

use crate::error::CliError;
use crate::holder::policy_json;
use crate::output::Out;
use crate::text::human_duration;
use lease_core::ops::OwnedLease;
use lease_core::{Code, Generation, TimingPolicy};
use lease_run::{Acquired, RunError};
use serde_json::json;
use std::path::Path;

/// Say that the run is owned and how (claimed, a dead owner retired first, a stale one taken
/// over): the `owned` JSON object, or an informational line; and, in human output, that
/// heartbeats are durable where lease-run made them so (`asked` was the policy asked for).
pub(super) fn owned(
    out: Out,
    abs: &Path,
    dir: &Path,
    how: Acquired,
    lease: &OwnedLease,
    asked: &TimingPolicy,
) {
    let how = match how {
        Acquired::RetiredDead { from } if lease.generation.get() > from.generation().get() + 1 => {
            format!(
                "retired dead owner {} (generation {}) and claimed",
                from.epoch.owner_id,
                from.generation()
            )
        }
        Acquired::TookOver {
            from,
            watched: Some(watched),
        } => format!(
            "took over from stale owner {} (generation {}, unchanged for {}) and own",
            from.epoch.owner_id,
            from.generation(),
            human_duration(watched)
        ),
        Acquired::TookOver {
            from,
            watched: None,
        } => format!(
            "took over from stale owner {} (generation {}) and own",
            from.epoch.owner_id,
            from.generation()
        ),
        _ => "claimed".to_string(),
    };
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/run/1",
            "event": "owned",
            "run": abs.display().to_string(),
            "run_id": lease.run_id.to_string(),
            "generation": lease.generation.get(),
            "owner_id": lease.owner_id.to_string(),
            "how": how,
            "policy": policy_json(&lease.policy),
            "owner_lock": true,
        }));
    } else {
        out.info(&format!(
            "{how} {} at generation {} as owner {}",
            dir.display(),
            lease.generation,
            lease.owner_id,
        ));
    }
    // PROTOCOL §5.3: on a network or user-space file system lease-run records durable
    // heartbeats whatever was asked; say so once.
    if lease.policy.heartbeat_durability() != asked.heartbeat_durability() && !out.json {
        out.info(&format!(
            "note: {} is on a network or user-space file system (NFS, SMB, FUSE, …), which can lose unsynced writes: heartbeats are durable (fsynced) there",
            dir.display()
        ));
    }
}

/// Say that the run was released (`released`: the generation of the release epoch) and
/// how the command exited: the `released` JSON object, or an informational line.
pub(super) fn released(
    out: Out,
    abs: &Path,
    dir: &Path,
    generation: Generation,
    released: u64,
    code: i32,
    on_request: bool,
) {
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/run/1",
            "event": "released",
            "run": abs.display().to_string(),
            "generation": generation.get(),
            "released_as": released,
            "command_exit": code,
            "on_request": on_request,
        }));
    } else if !on_request {
        out.info(&format!(
            "released {} (generation {released}); the command exited with {code}",
            dir.display(),
        ));
    } else {
        out.info(&format!(
            "the command exited with {code} (the run was released as generation {released} on its request)"
        ));
    }
}

/// A task aborted when its handle is dropped (the heartbeat warnings end with `run_async`).
pub(super) struct AbortOnDrop(pub(super) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Say each failed heartbeat on stderr (not suppressed by `--quiet`: it is a warning),
/// until the run is fenced or released.
pub(super) async fn warn_heartbeat_failures(
    mut warnings: lease_run::HeartbeatWarnings,
    self_fence_after: std::time::Duration,
) {
    let mut seen = 0;
    while let Some(f) = warnings.next().await {
        let missed = match f.failures - seen {
            1 => String::new(),
            n => format!(" ({} more failed before it)", n - 1),
        };
        seen = f.failures;
        // Never `eprintln!`: it panics on a closed stderr.
        let _ = std::io::Write::write_fmt(
            &mut std::io::stderr(),
            format_args!(
                "runlease: warning: heartbeat failed{missed}: {}; this owner fences itself once {} pass without a successful heartbeat (its command is killed, exit 75)\n",
                f.code.prefixed(&f.message),
                human_duration(self_fence_after),
            ),
        );
    }
}

/// The `FENCED` error (75) `run` ends with when its owner was fenced and the fence's
/// kill ended the command, which exited with `code`; nothing was released or written.
pub(super) fn fenced_error(
    auth: &dyn lease_run::LeaseAuthority,
    lease: &lease_core::ops::OwnedLease,
    e: RunError,
    code: i32,
) -> CliError {
    fenced_error_as(
        auth,
        lease,
        e,
        code,
        "runlease killed the command when the lease was fenced",
    )
}

/// [`fenced_error`], saying how the command ended (`ended`: killed by runlease, or exited
/// before) and who replaced the owner, if anyone did ([`replaced_by`]).
pub(super) fn fenced_error_as(
    auth: &dyn lease_run::LeaseAuthority,
    lease: &lease_core::ops::OwnedLease,
    e: RunError,
    code: i32,
    ended: &str,
) -> CliError {
    let reason = match &e {
        RunError::Fenced { reason, .. } => reason.clone(),
        other => other.to_string(),
    };
    let by = replaced_by(auth, lease.generation)
        .map(|w| format!("; {w}"))
        .unwrap_or_default();
    CliError::of(
        Code::Fenced,
        format!(
            "run {}: generation {} is fenced ({reason}{by}); {ended} (it exited with {code}); nothing was released or written",
            lease.run_id, lease.generation
        ),
    )
    .with_extra(json!({"generation": lease.generation.get(), "command_exit": code}))
}

/// Who replaced generation `g` ([`lease_run::superseded_by`], typed), worded: "taken over
/// by generation N (owner, pid on host) at T", or "retired as dead …"; `None` when nobody
/// did (the owner fenced itself on a lapse nobody acted on yet) or it cannot be read.
fn replaced_by(auth: &dyn lease_run::LeaseAuthority, g: lease_core::Generation) -> Option<String> {
    let s = lease_run::superseded_by(auth, g)?;
    let how = match s.reason {
        lease_core::RetireReason::TakenOver => "taken over",
        lease_core::RetireReason::Dead => "retired as dead",
        _ => return None,
    };
    // What the replacer judged (recorded in the epoch since issue #19): the beat it saw last
    // and, for a takeover, how long it watched that beat unchanged.
    let judged = match &s.observed {
        Some(o) => match o.watched_ms {
            Some(ms) => format!(
                ", after watching heartbeat #{} ({}) unchanged for {ms} ms ({})",
                o.heartbeat_count,
                o.heartbeat_at,
                match o.mode {
                    lease_core::TakeoverMode::Automatic => "automatic",
                    _ => "operator",
                }
            ),
            None => format!(
                ", its last heartbeat #{} ({})",
                o.heartbeat_count, o.heartbeat_at
            ),
        },
        None => String::new(),
    };
    Some(format!(
        "{how} by generation {} (owner {}, pid {} on {}) at {}{judged}",
        s.generation, s.owner_id, s.holder.pid, s.holder.host, s.at
    ))
}
