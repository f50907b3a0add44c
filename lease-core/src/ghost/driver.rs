//! # One actor driver for every model-based checker (issue #30)
//!
//! The proptest (`lease-core/tests/model.rs`), the `transitions` fuzz target
//! (`fuzz/src/transitions.rs`) and the breadth-first model checker
//! (`lease-fs/tests/model_check/`) drive their actors with this code: the operation of each
//! kind ([`AnyOp`], built by [`build`] as an owner of lease-run would), what an actor is
//! ([`Actor`]), how an operation ends for it and what it is then told ([`end`]), how a
//! concurrent reader is judged ([`check_reader`]).
//!
//! The proptest and the fuzzer also share the whole world: [`MemWorld`], over
//! [`crate::mem::MemDisk`], with every actor kind (claim, heartbeat, append, takeover, retirement,
//! release, prune, a concurrent finalizing reader), process crashes, clock jumps,
//! hand-corrupted records and power loss (a create's link is visible before its directory
//! fsync, unsynced heartbeats and removals can be undone or torn: [`crate::mem::MemDisk::power_loss`]).
//! They differ only in how they turn their input into [`Action`]s. The model checker runs
//! the same actors one system call at a time over lease-fs's simulated file system, which
//! this crate cannot name; it calls the same [`build`], [`Actor::begin`], [`Actor::advance`]
//! and [`end`] around its own execution of each request.
//!
//! Everything here is pure, like the rest of the crate: time is the world's number of
//! milliseconds ([`at`]), nothing reads a clock or the environment.

//!
//! Where it stands: here the world's time and names ([`at`], [`run_id`], [`boot_id`]) and
//! liveness ([`is_up`], [`evidence`], [`watched`]); `op.rs` the operation of each kind and
//! how it is built, `actor.rs` an actor, `end.rs` how an operation ends and a reader is
//! judged, `world.rs` [`MemWorld`].

mod actor;
mod end;
mod op;
mod world;

pub use actor::{Actor, Next, Site};
pub use end::{Decisions, Ended, check_reader, end};
pub use op::{AnyOp, Out, build, takeover_plan};
pub use world::{Action, KINDS, MemWorld};

use std::collections::BTreeSet;

use super::{simulated_evidence, simulated_watch};
use crate::ops::{Expectation, Head, LivenessEvidence};
use crate::{Holder, Identity, RunId, Timestamp};

/// Milliseconds since the Unix epoch of the world's time 0 (2026-12-02T00:00:00Z).
pub const T0_MS: u64 = 1_796_169_600_000;

/// The world's time `ms` after its start.
pub fn at(ms: u64) -> Timestamp {
    Timestamp::EPOCH.plus_millis(T0_MS.saturating_add(ms))
}

/// An identity from a literal of this module (always valid).
pub(super) fn ident(s: &str) -> Identity {
    Identity::new(s).unwrap_or_else(|e| panic!("identity literal {s:?}: {e}"))
}

/// The run every driven world works on.
pub fn run_id() -> RunId {
    RunId::new("model").unwrap_or_else(|e| panic!("run id literal: {e}"))
}

/// The boot id (and monotonic clock domain) of boot number `boot`: a power loss starts
/// the next one, and every holder of an older boot is dead.
pub fn boot_id(boot: u32) -> Identity {
    ident(&format!("boot-{boot}"))
}

/// Whether holder `h` is up in the driven world on boot `boot`: it ran on this boot and its
/// (pid, start time) is one of `live`.
pub fn is_up(boot: u32, live: &BTreeSet<(u32, u64)>, h: &Holder) -> bool {
    live.contains(&(h.pid, h.start_time)) && h.boot_id == boot_id(boot)
}

/// The liveness evidence of the driven world on boot `boot` ([`is_up`]).
pub fn evidence(boot: u32, live: &BTreeSet<(u32, u64)>, h: &Holder) -> LivenessEvidence {
    simulated_evidence(boot_id(boot), h, is_up(boot, live, h))
}

/// How long a taker on boot `boot` at world time `now` has watched head `h` unchanged: a
/// beat stamped on this boot's monotonic clock is aged by lease-core's own watch (the
/// same-clock rule, PROTOCOL §10); any other head as if the taker began watching when its
/// beat was written ([`simulated_watch`]).
pub fn watched(h: &Head, boot: u32, now: u64) -> u64 {
    let clock = boot_id(boot);
    let stamped = h
        .beat
        .as_ref()
        .and_then(|b| b.mono.as_ref())
        .is_some_and(|m| m.clock == clock);
    if !stamped {
        return simulated_watch(&Expectation::of(h), at(now));
    }
    let mut watch = crate::watch::StaleWatch::on_clock(Some(clock));
    match watch.observe(h, now.saturating_mul(1_000_000)) {
        crate::watch::Verdict::TakeOver { watched }
        | crate::watch::Verdict::Watching { watched, .. } => {
            u64::try_from(watched.as_millis()).unwrap_or(u64::MAX)
        }
    }
}
