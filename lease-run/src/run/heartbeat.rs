//! The heartbeat task.

use super::Shared;
use super::status::wall_now;
use crate::authority::LeaseAuthority;
use crate::procs::boottime_ns;
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
    let mut count: u64 = 1;
    loop {
        tick.tick().await;
        if shared.is_fenced() {
            return;
        }
        if shared.beats_suspended.load(Ordering::SeqCst) {
            continue;
        }
        // The store head is read before the heartbeat starts: every commit acknowledged
        // before this point is covered by the floor a replacer records from this beat.
        let store_head = shared.reported_store_head();
        let started = boottime_ns();
        if shared.lapsed(started) {
            shared.fence(shared.lapse_reason());
            return;
        }
        let Ok(now) = wall_now() else { continue };
        // Bounded by the self-fence deadline: past it the run fences anyway, so a hung
        // authority (an etcd cluster that does not answer) costs no more than that.
        let left = shared.until_lapse(started);
        let until = Instant::now() + left;
        let (d, l) = (dir.clone(), lease.clone());
        let r = tokio::time::timeout(
            shared.policy.self_fence_after(),
            tokio::task::spawn_blocking(move || {
                d.heartbeat_within(&l, now, count, store_head, until)
            }),
        )
        .await;
        match r {
            Ok(Ok(Ok(()))) => {
                shared.note_beat(started);
                count += 1;
            }
            Ok(Ok(Err(e))) if e.code() == Code::Fenced => {
                // The reason is the cause alone ("superseded by generation 3"): the run and
                // the code are said once, by whoever reports the fence.
                let reason = match e.lease() {
                    Some(lease_core::LeaseError::Fenced { detail, .. }) => detail.clone(),
                    _ => e.to_string(),
                };
                shared.fence(reason);
                return;
            }
            Ok(Ok(Err(e))) => tracing::warn!(run = %shared.run, error = %e, "heartbeat failed"),
            Ok(Err(e)) => tracing::warn!(run = %shared.run, error = %e, "heartbeat task failed"),
            Err(_) => tracing::warn!(run = %shared.run, "heartbeat timed out"),
        }
    }
}
