//! The heartbeat task, and the durable beat that covers acknowledged commits.

use super::{Run, Shared};
use crate::authority::LeaseAuthority;
use crate::clock::boottime_ns;
use crate::clock::wall_now;
use crate::error::RunError;
pub use crate::fence::HeartbeatFailure;
use lease_core::Code;
use lease_core::LeaseOps;
use lease_core::ops::OwnedLease;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The heartbeat task: at once, then every `heartbeat`, one lease heartbeat off the runtime; a success
/// moves the beat (its CLOCK_BOOTTIME start) forward; `FENCED` fences.
pub(super) async fn heartbeat_loop(
    dir: Arc<dyn LeaseAuthority>,
    shared: Arc<Shared>,
    lease: OwnedLease,
) {
    let mut tick = tokio::time::interval(shared.policy.heartbeat());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: the first beat follows the claim at once, so the record
    // carries this owner's monotonic stamp from the start and an observer on this clock
    // ages it there (PROTOCOL §10, the same-clock rule) instead of advising on the claim's
    // wall time for a whole interval. Cost: one beat (no fsync under `local`) per open.
    loop {
        tick.tick().await;
        if shared.is_fenced() {
            return;
        }
        if shared.beats_suspended.load(Ordering::SeqCst) {
            continue;
        }
        match beat(&dir, &shared, &lease, false).await {
            Ok(()) => {}
            Err(e) if shared.is_fenced() => {
                tracing::debug!(run = %shared.run, error = %e, "heartbeat fenced");
                return;
            }
            // Recorded by `beat` (the lapse's reason names the last one); said here with
            // its code, each time.
            Err(e) => tracing::warn!(
                run = %shared.run,
                code = %e.code(),
                error = %e,
                "heartbeat failed"
            ),
        }
    }
}

/// One heartbeat, numbered after the last (the count is held under the beat lock for the
/// whole beat, so the heartbeat task and a durable beat for the store server never write
/// the beat file at once or out of order). `durable` fsyncs it whatever the policy
/// ([`LeaseOps::heartbeat_durable_within`]). The store head reported is read once the
/// lock is held, before the beat starts: every commit acknowledged to the store slot
/// before that point is covered by the floor a replacer records from this beat.
///
/// A success moves the beat (its `CLOCK_BOOTTIME` start) forward. `FENCED`, `ETCD_NOSPACE`
/// (a full cluster refuses every write), or a start past the self-fence deadline, fences
/// the run and is returned as the fence.
pub(super) async fn beat(
    dir: &Arc<dyn LeaseAuthority>,
    shared: &Arc<Shared>,
    lease: &OwnedLease,
    durable: bool,
) -> Result<(), RunError> {
    let mut count = shared.beat_count.lock().await;
    shared.check_live()?;
    let store_head = shared.reported_store_head();
    let started = boottime_ns();
    if shared.lapsed(started) {
        shared.fence(shared.lapse_reason());
        return shared.check_live();
    }
    let now = wall_now()?;
    // Bounded by the self-fence deadline: past it the run fences anyway, so a hung
    // authority (an etcd cluster that does not answer) costs no more than that.
    let left = shared.until_lapse(started);
    let until = Instant::now() + left;
    let (d, l, n) = (dir.clone(), lease.clone(), *count);
    let r = tokio::time::timeout(
        shared.policy.self_fence_after(),
        tokio::task::spawn_blocking(move || {
            if durable {
                d.heartbeat_durable_within(&l, now, n, store_head, until)
            } else {
                d.heartbeat_within(&l, now, n, store_head, until)
            }
        }),
    )
    .await;
    match r {
        Ok(Ok(Ok(()))) => {
            shared.note_beat(started);
            *count += 1;
            Ok(())
        }
        Ok(Ok(Err(e))) if e.code() == Code::Fenced => {
            // The reason is the cause alone ("superseded by generation 3"): the run and
            // the code are said once, by whoever reports the fence.
            let reason = match e.lease() {
                Some(lease_core::LeaseError::Fenced { detail, .. }) => detail.clone(),
                _ => e.to_string(),
            };
            shared.fence(reason);
            shared.check_live()
        }
        // A full etcd cluster (its NOSPACE alarm) refuses every write until an operator
        // acts: no later beat can succeed, so the owner fences now, saying why, rather
        // than run on unheard until its deadline (issue #31).
        Ok(Ok(Err(e))) if e.code() == Code::EtcdNoSpace => {
            shared.fence(e.to_string());
            shared.check_live()
        }
        Ok(Ok(Err(e))) => Err(failed(shared, started, e)),
        Ok(Err(e)) => Err(failed(
            shared,
            started,
            RunError::Io(format!("run {}: heartbeat task failed: {e}", shared.run)),
        )),
        Err(_) => Err(failed(
            shared,
            started,
            RunError::Io(format!(
                "run {}: the heartbeat did not finish within {} ms",
                shared.run,
                shared.policy.self_fence_after().as_millis()
            )),
        )),
    }
}

/// Record a heartbeat's failure (not a fence) in the fence core, so the lapse it may lead
/// to names it and [`HeartbeatWarnings`] report it; return it.
fn failed(shared: &Shared, started: u64, e: RunError) -> RunError {
    shared.core.note_failure(started, e.code(), e.to_string());
    e
}

/// The heartbeat failures of a run as they happen ([`Run::heartbeat_warnings`]): each
/// failed heartbeat with its code and message (which names the file), so an owner can say
/// why its lease may lapse before it does.
#[derive(Clone)]
pub struct HeartbeatWarnings {
    shared: Arc<Shared>,
    seen: u64,
}

impl std::fmt::Debug for HeartbeatWarnings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeartbeatWarnings")
            .field("run", &self.shared.run)
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

impl HeartbeatWarnings {
    /// The next heartbeat failure not yet returned (its `failures` count says how many
    /// there were in all, so a jump means some were folded into this one); `None` once
    /// the run is fenced or released and every failure was returned. Checks at least
    /// twice per heartbeat interval (a heartbeat fails at most once per interval).
    pub async fn next(&mut self) -> Option<HeartbeatFailure> {
        let every = (self.shared.policy.heartbeat() / 2).min(super::WATCHDOG_TICK);
        loop {
            // Read the end first: a failure recorded before it is still returned.
            let ended = self.shared.is_fenced() || self.shared.stop.load(Ordering::SeqCst);
            if let Some(f) = self.shared.core.last_failure()
                && f.failures > self.seen
            {
                self.seen = f.failures;
                return Some(f);
            }
            if ended {
                return None;
            }
            tokio::time::sleep(every).await;
        }
    }
}

impl Run {
    /// The heartbeat failures of this run from now on, each with its code and message
    /// (a failure recorded before this call and not yet seen by anyone is returned first:
    /// the count starts at zero). A lapse of the lease names the last one in its fence
    /// reason.
    pub fn heartbeat_warnings(&self) -> HeartbeatWarnings {
        HeartbeatWarnings {
            shared: self.shared.clone(),
            seen: 0,
        }
    }

    /// The last heartbeat failure of this run, if one failed.
    pub fn last_heartbeat_failure(&self) -> Option<HeartbeatFailure> {
        self.shared.core.last_failure()
    }
}
