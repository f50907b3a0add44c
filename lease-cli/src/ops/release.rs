//! `release`: hand a run over, from a command under `runlease run` (by asking its owner) or with the token.

use super::log::{owned_head, token};
use crate::error::CliError;
use crate::open::open_lease;
use crate::output::Out;
use crate::stamps::wall_now;
use crate::text::human_duration;
use lease_core::Code;
use lease_core::Generation;
use lease_core::LeaseOps;
use lease_core::ops::{ReleaseParams, Status};
use lease_run::Authority as RunAuthority;
use lease_run::procs::OwnerAncestor;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

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

/// `runlease release [DIR]`: the owner hands the run over cleanly (the token comes from
/// `RUNLEASE_GENERATION`/`RUNLEASE_OWNER`, or the flags).
///
/// * The token must name the current, active head: a superseded, released or foreign
///   generation is `FENCED` (75) and nothing is written; release never touches someone
///   else's generation.
/// * **Under `runlease run`**: inside a command of an owner serving its store for this
///   generation, ask over the store socket (issue #20: the owner checks the secret, so any
///   copy of the binary may ask). Then wait (`--timeout`) until the head shows the
///   generation released by that owner. The owner releases from its heartbeat thread, so
///   no heartbeat follows the release; the command runs on without the lease. If someone
///   else supersedes the generation first: `FENCED` (75); no answer in time:
///   `RELEASE_TIMEOUT` (75). Without the socket (the command's environment was cleared),
///   when the holder is an ancestor of this process on this host and boot, nothing is
///   written and nothing signalled (`RELEASE_NOT_DELIVERED`, 76): a direct release would
///   fence that owner, which then kills this very command; and a signal proves nothing
///   about its sender (issue #29: SIGUSR1 no longer releases).
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
    let holder = &head.epoch.holder;
    // Inside a command of an owner that serves its store, for this generation: ask over
    // the store socket (the owner checks the secret, so this works whatever binary either
    // side is, e.g. after an in-place upgrade).
    let via_socket = if crate::ops::store::served_here(dir) {
        // The handshake too is bounded by --timeout: a stopped owner cannot answer it.
        match lease_run::store_client::StoreClient::from_env_within(o.timeout) {
            Ok(Some(c)) if c.generation() == generation.get() => Some(c),
            Ok(_) => None,
            Err(e) if e.code() == Code::IoError => {
                return Err(CliError::of(
                    Code::ReleaseTimeout,
                    format!(
                        "run {}: the owner (runlease run, pid {}) did not answer on its store socket within {} ({}); nothing was requested and it still holds the run",
                        run.run_id(),
                        holder.pid,
                        human_duration(o.timeout),
                        e
                    ),
                ));
            }
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };
    // Else, when lease-run proves the holder is an ancestor of this process (on this host
    // and boot with the recorded start time, so no reused pid), a direct release would
    // fence it and so kill this very command: refuse, writing and signalling nothing.
    let proved = match via_socket {
        Some(_) => OwnerAncestor::No,
        None => lease_run::procs::owner_ancestor(holder)?,
    };
    if let OwnerAncestor::ThisBinary(pid) | OwnerAncestor::OtherBinary(pid) = proved {
        let how = if matches!(proved, OwnerAncestor::ThisBinary(_)) {
            "run `runlease release` with the command's own environment (RUNLEASE_STORE_SOCKET and RUNLEASE_INCARNATION, which the owner checks): this process has no store socket for this generation"
        } else {
            "ask it to release through its own interface"
        };
        return Err(CliError::of(
            Code::ReleaseNotDelivered,
            format!(
                "run {}: generation {generation} is held by pid {pid}, an ancestor of this process; a direct release would fence it and kill this command, so nothing was written; {how}",
                run.run_id(),
            ),
        ));
    }
    let via_run = via_socket.is_some();
    let released_as = if let Some(mut c) = via_socket {
        // A stopped owner cannot answer: the request is bounded by --timeout too.
        c.set_timeout(o.timeout);
        if let Err(e) = c.request_release() {
            if e.code() != Code::IoError {
                return Err(e.into());
            }
            return Err(CliError::of(
                Code::ReleaseTimeout,
                format!(
                    "run {}: the owner (runlease run, pid {}) did not answer the release request for generation {generation} within {}; it still holds the run",
                    run.run_id(),
                    holder.pid,
                    human_duration(o.timeout)
                ),
            ));
        }
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
                    return Err(CliError::of(
                        Code::Fenced,
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
                return Err(CliError::of(
                    Code::ReleaseTimeout,
                    format!(
                        "run {}: the owner (runlease run, pid {}) did not release generation {generation} within {}; it still holds the run",
                        run.run_id(),
                        holder.pid,
                        human_duration(o.timeout)
                    ),
                ));
            }
        }
    } else {
        // The release, then lease-run's automatic compaction (best-effort: it never fails
        // the release; its order of writes is the prune's own, PROTOCOL §7.10).
        lease_run::compact::release(
            run,
            opened.folder.as_deref(),
            ReleaseParams {
                lease: lease.clone(),
                now: wall_now()?,
                seal: None,
            },
        )?
        .generation
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
