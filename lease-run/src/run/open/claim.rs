//! The claim step: the lease claimed, taken over or retired as the admission rule allowed,
//! and the seal and floor the chain then requires.

use super::state::*;
use crate::authority::LeaseAuthority;
use crate::clock::boottime_ns;
use crate::clock::{new_owner_id, wall_now};
use crate::error::RunError;
use crate::run::StepName;
use crate::run::step::{blocking, timed};
use crate::sync::lock_std;
use lease_core::Code;
use lease_core::Identity;
use lease_core::LeaseOps;
use lease_core::ops::{
    ClaimParams, Expectation, OwnedLease, RetireParams, Status, TakeoverParams, TakeoverTrigger,
};
use lease_fs::this_holder;
use std::sync::{Arc, Mutex};

/// (3) claim; or exact takeover of a stale owner; or retire a definitely-dead owner
/// and claim (with etcd, "dead" is judged by the owner's etcd lease).
///
/// Returns the lease and the `CLOCK_BOOTTIME` instant the claim started (the run's first
/// beat). A claim or takeover that fails after its epoch was created (an I/O error at its
/// recheck or finalize) left this owner's epoch at the head: it is found by its owner id
/// and holder (read-only, as ADOPTION would) and kept as the lease, so the undo hands it
/// back instead of leaving an active claim without an owner. Then the seal and floor the
/// chain requires of this owner are read, so an undo from any later step re-issues the
/// seal.
pub(super) async fn claim(st: &mut Opening, cx: &Ctx<'_>) -> Result<(OwnedLease, u64), RunError> {
    let (name, opts) = (&cx.name, cx.opts);
    let (cb, deadline) = (&opts.on_step, opts.step_deadline);
    let dir = st.auth.clone();
    let (retire_dead, verified) = (opts.retire_dead, st.verified);
    let mark_due = st.mark_due.take();
    let policy = durable_where_needed(dir.as_ref(), opts.policy);
    let takeover = opts.takeover.clone();
    // No watch, no takeover: without one the core refuses (watched 0 ms), writing nothing.
    let trigger = match opts.takeover_watched {
        None => TakeoverTrigger::Operator {
            watched_unchanged_ms: 0,
        },
        Some(d) => TakeoverTrigger::Automatic {
            watched_unchanged_ms: u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
        },
    };
    let carry = st.carry_seal.clone();
    let chosen = opts.owner_id.clone();
    let preempted = Arc::new(Mutex::new(None));
    let preempted_out = preempted.clone();
    let claim_started = boottime_ns();
    let (lease, failed) = timed(
        cb,
        StepName::Claim,
        blocking(name, StepName::Claim, deadline, move || {
            let holder = this_holder()?;
            let owner_id = match chosen {
                Some(id) => id,
                None => new_owner_id()?,
            };
            let attempt = claim_blocking(
                &*dir,
                ClaimAttempt {
                    owner_id: owner_id.clone(),
                    holder: holder.clone(),
                    policy,
                    takeover,
                    trigger,
                    retire_dead,
                    verified,
                },
            );
            let (lease, failed) = match attempt {
                Ok((l, p)) => {
                    *lock_std(&preempted) = p;
                    // The claim succeeded: leave the mark the preflight made due
                    // (PROTOCOL §13.1). Best-effort: a failure costs the next tail check
                    // a longer walk, nothing else.
                    if let (Some((s, h)), Ok(now)) = (mark_due, wall_now()) {
                        if let Err(e) = dir.write_mark(s, h, l.owner_id.clone(), now) {
                            tracing::debug!(error = %e, "the verified-prefix mark was not written");
                        }
                    }
                    (l, None)
                }
                Err(e) => match own_head(&*dir, &owner_id, &holder) {
                    Some(l) => (l, Some(e)),
                    None => return Err(e),
                },
            };
            if let Ok(req) = dir.store_requirements(lease.generation) {
                *lock_std(&carry) = req.seal().cloned();
            }
            Ok((lease, failed))
        }),
    )
    .await?;
    st.lease = Some(lease.clone());
    // OQ-5: the replaced owner, if its beat changed after the takeover's last look, may run
    // on until its self-fence (at most its `self_fence_after` after that beat started, then
    // its commands are killed): this owner's commands start after that, plus our own kill
    // timings as the margin for its kill (its own are not recorded).
    if let Some(p) = lock_std(&preempted_out).take() {
        let wait = std::time::Duration::from_millis(p.self_fence_after_ms)
            + opts.term_grace
            + opts.kill_wait;
        let at = boottime_ns().saturating_add(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX));
        st.commands_after = Some((p, at));
    }
    match failed {
        None => Ok((lease, claim_started)),
        Some(e) => Err(e),
    }
}

/// What one claim step attempts ([`claim_blocking`]).
pub(super) struct ClaimAttempt {
    owner_id: Identity,
    holder: lease_core::Holder,
    policy: lease_core::TimingPolicy,
    takeover: Option<Expectation>,
    trigger: TakeoverTrigger,
    retire_dead: bool,
    /// The preflight verified the run already.
    verified: bool,
}

/// The claim step's lease operations (blocking).
pub(super) fn claim_blocking(
    dir: &dyn LeaseAuthority,
    a: ClaimAttempt,
) -> Result<(OwnedLease, Option<lease_core::ops::Preempted>), RunError> {
    if let Some(expect) = a.takeover.clone() {
        // Replacing an owner finalizes its cutoff over the log and writes on top of the
        // chain: a broken record anywhere refuses it (65, naming the file), as doctor
        // advises ("do not take over"). The preflight verified it (under the owner lock,
        // with the same call) unless told otherwise.
        if !a.verified {
            dir.verify_tail()?;
        }
        return dir.takeover_reporting(TakeoverParams {
            run_id: dir.run_id().clone(),
            owner_id: a.owner_id,
            holder: a.holder,
            policy: a.policy,
            now: wall_now()?,
            expect,
            trigger: a.trigger,
        });
    }
    claim_or_retire(dir, a).map(|l| (l, None))
}

/// The policy the claim records: `policy`, but with durable heartbeats when the run folder
/// is on a file system that may lose unsynced writes while the owner lives (NFS, SMB,
/// FUSE, …; PROTOCOL §5.3). lease-fs makes every beat there durable anyway; recording it
/// in the epoch makes `status` and every reader say so. One warning (the CLI shows it).
pub(super) fn durable_where_needed(
    dir: &dyn LeaseAuthority,
    policy: lease_core::TimingPolicy,
) -> lease_core::TimingPolicy {
    use lease_core::HeartbeatDurability::{Durable, Local};
    match dir.folder() {
        Some(f) if policy.heartbeat_durability() == Local && f.fs().loses_unsynced_writes() => {
            tracing::warn!(
                run = %f.root().display(),
                "the run folder is on a network or user-space file system, which can lose unsynced writes: heartbeats are durable (fsynced) there"
            );
            policy.with_durability(Durable)
        }
        _ => policy,
    }
}

/// The claim step without a takeover: claim, or retire a dead holder (`retire_dead`).
pub(super) fn claim_or_retire(
    dir: &dyn LeaseAuthority,
    a: ClaimAttempt,
) -> Result<OwnedLease, RunError> {
    let claim = |owner_id: Identity, holder: lease_core::Holder| -> Result<ClaimParams, RunError> {
        Ok(ClaimParams {
            run_id: dir.run_id().clone(),
            owner_id,
            holder,
            policy: a.policy,
            now: wall_now()?,
            store_floor: None,
        })
    };
    match dir.claim(claim(a.owner_id.clone(), a.holder.clone())?) {
        Ok(l) => Ok(l),
        // Held (76): the status below decides whether the holder is dead.
        Err(e)
            if a.retire_dead
                && matches!(
                    e.code(),
                    Code::RunAlreadyActive
                        | Code::RunStaleRequiresTakeover
                        | Code::RunDeadRequiresRetirement
                        | Code::TakeoverActiveRefused
                        | Code::RetireRefusedNotDead
                ) =>
        {
            let view = dir.status(wall_now()?, true)?;
            match (&view.status, &view.head) {
                (Status::Dead, Some(head)) => {
                    // Verified by the preflight only if it saw the owner dead already.
                    if !a.verified {
                        dir.verify_tail()?;
                    }
                    let retirer = new_owner_id()?;
                    let retired = dir.retire(RetireParams {
                        run_id: dir.run_id().clone(),
                        owner_id: retirer.clone(),
                        holder: a.holder.clone(),
                        policy: a.policy,
                        now: wall_now()?,
                        expect: Some(Expectation::of(head)),
                    })?;
                    // The retirement freed the run as a release does: compact if due
                    // (best-effort, never this open's error; the prune's own order of
                    // writes, PROTOCOL §7.10), so owners that crash and are retired, and
                    // never release, still leave a bounded `lease/`.
                    let _ = crate::compact::after_release(
                        dir,
                        dir.folder(),
                        retired.generation,
                        retirer,
                    );
                    // The first claim was refused: it created nothing under this id.
                    dir.claim(claim(a.owner_id, a.holder)?)
                }
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// The lease of this open's own epoch if it is the active head (`owner_id` and `holder`
/// ours): a claim or takeover that failed after creating it. Read-only; `None` when the
/// head cannot be read or is not ours.
pub(super) fn own_head(
    dir: &dyn LeaseAuthority,
    owner_id: &Identity,
    holder: &lease_core::Holder,
) -> Option<OwnedLease> {
    let view = dir.status(wall_now().ok()?, false).ok()?;
    let h = view.head?;
    (h.is_active() && h.epoch.owner_id == *owner_id && h.epoch.holder == *holder).then(|| {
        OwnedLease {
            run_id: dir.run_id().clone(),
            generation: h.generation(),
            owner_id: owner_id.clone(),
            holder: holder.clone(),
            policy: h.epoch.policy,
            epoch_hash: h.hash.clone(),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::FolderAuthority;
    use lease_core::Transport;
    use lease_core::ops::ReleaseParams;
    use lease_fs::RunDir;

    /// A claim that failed after creating its epoch is recognised by its owner id and
    /// holder (and only then), with the lease the claim would have returned.
    #[test]
    fn own_head_finds_only_this_opens_own_active_epoch() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(RunDir::create(&tmp.path().join("own")).unwrap());
        let auth = FolderAuthority(dir.clone());
        let (me, holder) = (new_owner_id().unwrap(), this_holder().unwrap());
        assert!(own_head(&auth, &me, &holder).is_none(), "no epoch yet");
        let lease = auth
            .claim(ClaimParams {
                run_id: auth.run_id().clone(),
                owner_id: me.clone(),
                holder: holder.clone(),
                policy: lease_core::TimingPolicy::default(),
                now: wall_now().unwrap(),
                store_floor: None,
            })
            .unwrap();
        assert_eq!(own_head(&auth, &me, &holder), Some(lease.clone()));
        let other = new_owner_id().unwrap();
        assert!(
            own_head(&auth, &other, &holder).is_none(),
            "another owner id"
        );
        let elsewhere = lease_core::Holder {
            pid: holder.pid + 1,
            ..holder.clone()
        };
        assert!(
            own_head(&auth, &me, &elsewhere).is_none(),
            "another process"
        );
        auth.release(ReleaseParams {
            lease,
            now: wall_now().unwrap(),
            seal: None,
        })
        .unwrap();
        assert!(
            own_head(&auth, &me, &holder).is_none(),
            "released: not active"
        );
    }
}
