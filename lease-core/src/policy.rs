//! The timing policy an owner runs with, validated at construction.

use crate::error::LeaseError;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Whether heartbeats are fsynced. The default is [`HeartbeatDurability::Local`], the
/// durability of [`TimingPolicy::DEFAULT`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeartbeatDurability {
    /// Liveness only: the heartbeat file is replaced without fsync. Right for a local disk,
    /// where a crash of the machine also changes the boot id and so proves the owner dead.
    #[default]
    Local,
    /// The heartbeat file and its directory are fsynced: for shared disks, where another
    /// machine judges staleness from what reached the server.
    Durable,
}

/// How often an owner heartbeats, when it fences itself, and when others may call it stale.
///
/// Constructed only through [`TimingPolicy::new`] (or deserialization, which runs the same
/// checks), so an unsafe combination cannot exist:
///
/// - `heartbeat >= 100 ms`, and every value `<= 24 h`;
/// - `self_fence_after >= 2 × heartbeat` (one late heartbeat does not fence the owner);
/// - `stale_after >= 4 × heartbeat` and `stale_after >= 1 s`;
/// - `stale_after - self_fence_after >= heartbeat`: the margin in which a self-fenced owner
///   kills its commands before anyone else may call it stale.
///
/// The defaults are 5 s / 15 s / 20 s (local durability): a heartbeat every 5 s, the owner
/// fences itself when its last successful heartbeat started 15 s ago (three missed beats),
/// others may call it stale after 20 s (four), leaving 5 s for the kill to be confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct TimingPolicy {
    heartbeat_ms: u64,
    self_fence_after_ms: u64,
    stale_after_ms: u64,
    heartbeat_durability: HeartbeatDurability,
}

const DAY_MS: u64 = 24 * 3600 * 1000;

impl TimingPolicy {
    /// The default policy: 5 s / 15 s / 20 s, local heartbeats.
    pub const DEFAULT: TimingPolicy = TimingPolicy {
        heartbeat_ms: 5_000,
        self_fence_after_ms: 15_000,
        stale_after_ms: 20_000,
        heartbeat_durability: HeartbeatDurability::Local,
    };

    /// Build a policy, refusing unsafe combinations with `POLICY_INVALID`.
    pub fn new(
        heartbeat: Duration,
        self_fence_after: Duration,
        stale_after: Duration,
        heartbeat_durability: HeartbeatDurability,
    ) -> Result<TimingPolicy, LeaseError> {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Self::from_millis(
            ms(heartbeat),
            ms(self_fence_after),
            ms(stale_after),
            heartbeat_durability,
        )
    }

    /// Same as [`TimingPolicy::new`] with millisecond values.
    pub fn from_millis(
        heartbeat_ms: u64,
        self_fence_after_ms: u64,
        stale_after_ms: u64,
        heartbeat_durability: HeartbeatDurability,
    ) -> Result<TimingPolicy, LeaseError> {
        let p = TimingPolicy {
            heartbeat_ms,
            self_fence_after_ms,
            stale_after_ms,
            heartbeat_durability,
        };
        p.check()
            .map_err(|reason| LeaseError::PolicyInvalid { reason })?;
        Ok(p)
    }

    fn check(&self) -> Result<(), String> {
        let (h, f, s) = (
            self.heartbeat_ms,
            self.self_fence_after_ms,
            self.stale_after_ms,
        );
        if h > DAY_MS || f > DAY_MS || s > DAY_MS {
            return Err(format!(
                "values must be at most 24 h (heartbeat {h} ms, self_fence_after {f} ms, stale_after {s} ms)"
            ));
        }
        if h < 100 {
            return Err(format!("heartbeat {h} ms is below the 100 ms floor"));
        }
        if f < 2 * h {
            return Err(format!(
                "self_fence_after {f} ms must be at least 2 x heartbeat ({} ms)",
                2 * h
            ));
        }
        if s < 1000 || s < 4 * h {
            return Err(format!(
                "stale_after {s} ms must be at least 1 s and at least 4 x heartbeat ({} ms)",
                4 * h
            ));
        }
        if s < f || s - f < h {
            return Err(format!(
                "stale_after {s} ms must exceed self_fence_after {f} ms by at least one heartbeat ({h} ms)"
            ));
        }
        Ok(())
    }

    /// Interval between heartbeats.
    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms)
    }
    /// The owner fences itself when its last successful heartbeat started this long ago.
    pub fn self_fence_after(&self) -> Duration {
        Duration::from_millis(self.self_fence_after_ms)
    }
    /// Others may call the owner stale when its heartbeat is this old.
    pub fn stale_after(&self) -> Duration {
        Duration::from_millis(self.stale_after_ms)
    }
    /// `stale_after` in milliseconds.
    pub fn stale_after_ms(&self) -> u64 {
        self.stale_after_ms
    }
    /// `heartbeat` in milliseconds.
    pub fn heartbeat_ms(&self) -> u64 {
        self.heartbeat_ms
    }
    /// `self_fence_after` in milliseconds.
    pub fn self_fence_after_ms(&self) -> u64 {
        self.self_fence_after_ms
    }
    /// Whether heartbeats are fsynced.
    pub fn heartbeat_durability(&self) -> HeartbeatDurability {
        self.heartbeat_durability
    }
    /// This policy with another heartbeat durability.
    pub fn with_durability(mut self, d: HeartbeatDurability) -> TimingPolicy {
        self.heartbeat_durability = d;
        self
    }
}

impl Default for TimingPolicy {
    fn default() -> Self {
        TimingPolicy::DEFAULT
    }
}

impl<'de> Deserialize<'de> for TimingPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            heartbeat_ms: u64,
            self_fence_after_ms: u64,
            stale_after_ms: u64,
            heartbeat_durability: HeartbeatDurability,
        }
        let r = Raw::deserialize(d)?;
        TimingPolicy::from_millis(
            r.heartbeat_ms,
            r.self_fence_after_ms,
            r.stale_after_ms,
            r.heartbeat_durability,
        )
        .map_err(serde::de::Error::custom)
    }
}

/// Self-fence rule: has the last heartbeat that *succeeded* started more than
/// `self_fence_after` ago, on the owner's suspend-aware monotonic clock?
///
/// `last_ok_started` and `now` are readings of the same monotonic clock (for example
/// `CLOCK_BOOTTIME` as a [`Duration`] since boot). A reading that goes backwards is treated
/// as "no time passed" (never fences spuriously, never un-fences: callers keep the fence
/// sticky).
pub fn must_self_fence(policy: &TimingPolicy, last_ok_started: Duration, now: Duration) -> bool {
    // mutant self_fence_late: the deadline pushed one heartbeat past self_fence_after (§7.11).
    if crate::mutant::mutant("self_fence_late") {
        return now.saturating_sub(last_ok_started)
            > policy.self_fence_after() + policy.heartbeat();
    }
    now.saturating_sub(last_ok_started) > policy.self_fence_after()
}

/// Why an owner fenced itself by the self-fence rule, `age` after the start of its last
/// successful heartbeat-class write: the one wording every layer uses.
pub fn lapse_reason(policy: &TimingPolicy, age: Duration) -> String {
    format!(
        "the lease lapsed: no successful heartbeat for {} ms (this owner fences itself after {} ms without one)",
        age.as_millis(),
        policy.self_fence_after_ms()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_defaults_are_valid_and_documented() {
        let d = TimingPolicy::default();
        assert_eq!(
            TimingPolicy::from_millis(5_000, 15_000, 20_000, HeartbeatDurability::Local).unwrap(),
            d
        );
        assert_eq!(d.heartbeat_durability(), HeartbeatDurability::default());
    }

    #[test]
    fn policy_refuses_unsafe_combinations() {
        use HeartbeatDurability::Local;
        for (h, f, s) in [
            (50, 1000, 2000),           // heartbeat below floor
            (5000, 9000, 20000),        // fence < 2 x heartbeat
            (5000, 15000, 19000),       // stale < 4 x heartbeat
            (200, 400, 900),            // stale < 1 s
            (5000, 16000, 20000),       // margin < heartbeat
            (5000, 25000, 20000),       // fence after stale
            (5000, 15000, 200_000_000), // more than a day
        ] {
            let e = TimingPolicy::from_millis(h, f, s, Local).unwrap_err();
            assert_eq!(e.code(), "POLICY_INVALID", "{h}/{f}/{s}");
        }
        assert!(TimingPolicy::from_millis(250, 500, 1000, Local).is_ok());
    }

    #[test]
    fn self_fence_counts_from_the_start_of_the_last_good_heartbeat() {
        let p = TimingPolicy::default();
        let s = Duration::from_secs(100);
        assert!(!must_self_fence(&p, s, s + Duration::from_secs(15)));
        assert!(must_self_fence(&p, s, s + Duration::from_millis(15_001)));
        assert!(!must_self_fence(&p, s, Duration::from_secs(1)));
    }

    /// Each rule refuses with its own reason, right at its bound; the bounds themselves
    /// are valid. Exactly 24 h is not over a day.
    #[test]
    fn each_rule_refuses_with_its_own_reason_at_its_bound() {
        use HeartbeatDurability::Local;
        let reason = |h, f, s| match TimingPolicy::from_millis(h, f, s, Local) {
            Err(LeaseError::PolicyInvalid { reason }) => reason,
            other => panic!("{h}/{f}/{s}: expected POLICY_INVALID, got {other:?}"),
        };
        for (h, f, s) in [
            (DAY_MS + 1, DAY_MS, DAY_MS),
            (5000, DAY_MS + 1, DAY_MS),
            (5000, 15000, DAY_MS + 1),
        ] {
            let r = reason(h, f, s);
            assert!(
                r.starts_with("values must be at most 24 h"),
                "{h}/{f}/{s}: {r}"
            );
        }
        let r = reason(DAY_MS, DAY_MS, DAY_MS);
        assert!(r.starts_with("self_fence_after"), "{r}");
        let r = reason(5000, DAY_MS, DAY_MS);
        assert!(r.contains("by at least one heartbeat"), "{r}");
        let r = reason(5000, 10_000, 15_000);
        assert!(r.contains("at least 4 x heartbeat (20000 ms)"), "{r}");
        for (h, f, s) in [
            (100, 200, 1000),
            (5000, 10_000, 20_000),
            (DAY_MS / 4, DAY_MS / 2, DAY_MS),
        ] {
            assert!(
                TimingPolicy::from_millis(h, f, s, Local).is_ok(),
                "{h}/{f}/{s}"
            );
        }
    }

    #[test]
    fn the_accessors_report_the_policy() {
        use HeartbeatDurability::{Durable, Local};
        let p = TimingPolicy::from_millis(1000, 3000, 5000, Durable).unwrap();
        let ms = Duration::from_millis;
        assert_eq!(
            (p.heartbeat(), p.self_fence_after(), p.stale_after()),
            (ms(1000), ms(3000), ms(5000))
        );
        assert_eq!(
            (
                p.heartbeat_ms(),
                p.self_fence_after_ms(),
                p.stale_after_ms()
            ),
            (1000, 3000, 5000)
        );
        assert_eq!(p.heartbeat_durability(), Durable);
        // Only the durability changes.
        assert_eq!(
            p.with_durability(Local),
            TimingPolicy::from_millis(1000, 3000, 5000, Local).unwrap()
        );
    }

    #[test]
    fn the_lapse_reason_names_the_age_and_the_bound() {
        let r = lapse_reason(&TimingPolicy::default(), Duration::from_millis(15_250));
        assert_eq!(
            r,
            "the lease lapsed: no successful heartbeat for 15250 ms (this owner fences itself after 15000 ms without one)"
        );
    }
}
