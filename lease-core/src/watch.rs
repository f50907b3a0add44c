//! The automatic takeover's watch (PROTOCOL.md §7.4, §10): a stale owner may be taken
//! over automatically only after the watcher saw its record **unchanged** for the owner's
//! `stale_after` on the watcher's own monotonic clock, so no other host's wall clock
//! decides.
//!
//! [`StaleWatch`] is a sans-IO machine: the caller feeds it each observed head with a
//! monotonic reading (e.g. `CLOCK_BOOTTIME` in nanoseconds, which keeps counting while
//! the machine sleeps) and gets back whether to keep watching or to take over. It reads
//! no clock and does no I/O.
//!
//! ```
//! use lease_core::watch::{StaleWatch, Verdict};
//! use std::time::Duration;
//!
//! let mut w = StaleWatch::new();
//! let key = (3, "owner-a".to_string(), "2026-12-03T10:00:00.000Z".to_string(), 7);
//! let stale_after = Duration::from_secs(20);
//! assert!(matches!(w.observe_key(key.clone(), stale_after, 1_000_000_000), Verdict::Watching { .. }));
//! // 20 s later on the same clock, the record is unchanged: still watching (strictly more is
//! // needed, in whole milliseconds, the unit the intent records and the core judges).
//! assert!(matches!(w.observe_key(key.clone(), stale_after, 21_000_999_999), Verdict::Watching { .. }));
//! let v = w.observe_key(key, stale_after, 21_001_000_000);
//! assert_eq!(v, Verdict::TakeOver { watched: Duration::from_millis(20_001) });
//! ```

use crate::ops::Head;
use std::time::Duration;

/// What identifies one observation of an owner: generation, owner id, heartbeat time
/// (as recorded, never compared with a clock) with the heartbeat file's hash, and
/// heartbeat count. Any change means the
/// owner (or a successor) wrote again, and the watch starts over.
pub type WatchKey = (u64, String, String, u64);

/// The key of an observed head.
pub fn watch_key(h: &Head) -> WatchKey {
    (
        h.generation().get(),
        h.epoch.owner_id.to_string(),
        // The whole file's hash as well as the record: any write to the heartbeat file
        // restarts the watch, even one whose newest valid slot reads the same (a torn
        // beat, OQ-6, judged as no beat; a slot in flight; a record written twice).
        match (&h.torn_beat, &h.beat_file) {
            (Some(torn), _) => format!("{} torn {torn}", h.heartbeat_at()),
            (None, Some(file)) => format!("{} file {file}", h.heartbeat_at()),
            (None, None) => h.heartbeat_at().to_string(),
        },
        h.heartbeat_count(),
    )
}

/// What the watcher should do after an observation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Keep watching: the record has been unchanged for `watched`, `needed` is the owner's
    /// `stale_after` (a takeover needs strictly more).
    Watching {
        /// How long the current observation has been unchanged.
        watched: Duration,
        /// The owner's `stale_after`.
        needed: Duration,
    },
    /// Unchanged for more than `stale_after`: an automatic takeover may proceed,
    /// conditioned on exactly this observation (it reports `watched` in its intent).
    TakeOver {
        /// How long the observation was unchanged.
        watched: Duration,
    },
}

/// The watch of one run (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaleWatch {
    since: Option<(WatchKey, u64)>,
    clock: Option<crate::Identity>,
}

impl StaleWatch {
    /// A watch that has seen nothing.
    pub fn new() -> StaleWatch {
        StaleWatch::default()
    }

    /// A watch that applies the same-clock rule (PROTOCOL.md §10) for a watcher whose
    /// monotonic readings come from the clock named `clock` (lease-fs:
    /// `lease_fs::probe::clock_domain`; `None`: never).
    pub fn on_clock(clock: Option<crate::Identity>) -> StaleWatch {
        StaleWatch { since: None, clock }
    }

    /// Observe `head` at monotonic reading `now_mono_ns`. When the watch knows its clock
    /// ([`StaleWatch::on_clock`]) and the head's beat was stamped on that same clock, the
    /// record has existed unchanged since its stamp, so a new observation starts there
    /// instead of now: a same-boot owner that stopped long ago is judged at once, with no
    /// watch and no wall clock. A stamp on another clock, a stamp ahead of `now_mono_ns`
    /// (not genuine), or no stamp: the watch starts now.
    pub fn observe(&mut self, head: &Head, now_mono_ns: u64) -> Verdict {
        let key = watch_key(head);
        if !matches!(&self.since, Some((k, _)) if *k == key) {
            let start = head
                .beat
                .as_ref()
                .and_then(|b| b.mono.as_ref())
                .filter(|m| m.age_ms_on(self.clock.as_ref(), now_mono_ns).is_some())
                .map_or(now_mono_ns, |m| m.ns);
            self.since = Some((key.clone(), start));
        }
        self.observe_key(key, head.epoch.policy.stale_after(), now_mono_ns)
    }

    /// Observe a record identified by `key` whose owner's `stale_after` is `stale_after`,
    /// at monotonic reading `now_mono_ns`. A changed key restarts the watch; a reading
    /// earlier than the start (a clock that is not monotonic) counts as no time watched.
    pub fn observe_key(
        &mut self,
        key: WatchKey,
        stale_after: Duration,
        now_mono_ns: u64,
    ) -> Verdict {
        let since = match &self.since {
            Some((k, since)) if *k == key => *since,
            _ => {
                self.since = Some((key, now_mono_ns));
                now_mono_ns
            }
        };
        // Whole milliseconds: the intent records `watched_unchanged_ms` and the core accepts
        // only more than `stale_after_ms`, so a verdict judged on nanoseconds (1000.4 ms >
        // 1000 ms) would be refused once truncated (1000 ms). Judge what is recorded.
        let watched = Duration::from_millis(now_mono_ns.saturating_sub(since) / 1_000_000);
        if watched.as_millis() > stale_after.as_millis() {
            Verdict::TakeOver { watched }
        } else {
            Verdict::Watching {
                watched,
                needed: stale_after,
            }
        }
    }

    /// The observation being watched, if any: a caller compares it with a new head's
    /// [`watch_key`] to tell that the owner wrote again (it is alive) before observing it.
    pub fn watching(&self) -> Option<&WatchKey> {
        self.since.as_ref().map(|(k, _)| k)
    }

    /// Forget the observation (the head changed under an attempt: decide again).
    pub fn reset(&mut self) {
        self.since = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(count: u64) -> WatchKey {
        (2, "o".into(), "2026-12-03T10:00:00.000Z".into(), count)
    }

    /// Still watching: `ms` watched of the `needed`.
    fn watching(ms: u64, needed: Duration) -> Verdict {
        Verdict::Watching {
            watched: Duration::from_millis(ms),
            needed,
        }
    }

    #[test]
    fn a_changed_record_restarts_the_watch() {
        let mut w = StaleWatch::new();
        let d = Duration::from_millis(100);
        assert!(matches!(
            w.observe_key(key(1), d, 0),
            Verdict::Watching { .. }
        ));
        // A new beat at 90 ms: the watch starts over there.
        assert!(matches!(
            w.observe_key(key(2), d, 90_000_000),
            Verdict::Watching { .. }
        ));
        assert_eq!(w.observe_key(key(2), d, 150_000_000), watching(60, d));
        assert_eq!(
            w.observe_key(key(2), d, 191_000_000),
            Verdict::TakeOver {
                watched: Duration::from_millis(101)
            }
        );
    }

    #[test]
    fn a_fraction_of_a_millisecond_past_stale_after_is_not_yet_more() {
        // What CI once hit: 1000.4 ms watched against a 1000 ms stale_after was a TakeOver
        // verdict whose intent (1000 ms) the core then refused as too brief.
        let mut w = StaleWatch::new();
        let d = Duration::from_millis(1000);
        w.observe_key(key(1), d, 0);
        assert_eq!(w.observe_key(key(1), d, 1_000_999_999), watching(1000, d));
        let Verdict::TakeOver { watched } = w.observe_key(key(1), d, 1_001_000_000) else {
            panic!("1001 ms watched is more than 1000 ms");
        };
        assert!(watched.as_millis() > d.as_millis());
    }

    #[test]
    fn exactly_stale_after_is_not_enough_and_a_backwards_clock_counts_nothing() {
        let mut w = StaleWatch::new();
        let d = Duration::from_millis(100);
        w.observe_key(key(1), d, 500_000_000);
        assert!(matches!(
            w.observe_key(key(1), d, 600_000_000),
            Verdict::Watching { .. }
        ));
        assert_eq!(w.observe_key(key(1), d, 400_000_000), watching(0, d));
        w.reset();
        assert_eq!(w.observe_key(key(1), d, 10_000_000_000), watching(0, d));
    }
}
