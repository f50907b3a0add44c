//! `transitions`: random action sequences of 2-3 actors through the real step machines.
//!
//! The world is the actor driver shared with the proptest and the model checker
//! (`lease_core::ghost::driver::MemWorld`, feature `ghost`); this module only decodes the
//! fuzzer's bytes into its actions, so the fuzzer steers by coverage what the proptest
//! samples at random. Each actor runs at most one operation at a time (claim, heartbeat,
//! append, exact takeover, dead-owner retirement, release, prune, a concurrent finalizing
//! reader) over one shared `MemDisk`, and the input decides which actor performs its next
//! request, so operations interleave at request granularity (a create's link and its
//! directory fsync are two steps: others can read a record before it is durable). Actors
//! can crash, the clock can jump, a record can be corrupted between operations, and the
//! power can fail (every process dies; what was not fsynced is undone, the newest unsynced
//! heartbeat possibly torn).
//!
//! Every invariant of the driver is checked (after every request, after a power loss and
//! at the end; see `lease_core::ghost` for the table): one owner per generation, the head
//! never goes down, takeovers and retirements only over what they observed, no superseded
//! heartbeat succeeds, nothing changes owner over an invalid record, acknowledged appends
//! count and refused or late ones do not, nothing past a cutoff counts (by the order of
//! links), readers' verdicts are stable, durable heartbeats survive power loss, the hash
//! chains verify, no `PROTOCOL_VIOLATION`.
//!
//! # Input
//!
//! Byte 0: bit 0, 2 or 3 actors; bit 1, heartbeats `durable` (else `local`). Then two bytes
//! per action: `a` and `p`. Actor = `(a & 3) % n`; code = `a >> 4`:
//!
//! | code  | action |
//! |-------|--------|
//! | 0-5   | the actor performs its next request |
//! | 6     | the actor runs its operation to the end |
//! | 7-9   | the actor starts operation `p % 8` (claim, heartbeat, append, takeover, retire, release, prune, read) if it can |
//! | 10    | the actor starts an append |
//! | 11    | the clock advances `p * 250` ms |
//! | 12    | the actor crashes |
//! | 13    | if `p % 8 == 0`, the head epoch (`p / 8` even) or its heartbeat is corrupted |
//! | 14    | every actor runs its operation to the end |
//! | 15    | if `p % 16 == 0`, power loss (tearing the newest unsynced heartbeat if `p / 16` is odd); else as 0-5 |
//!
//! At the end every in-flight operation is run to completion, then the final checks run.

use lease_core::ghost::OpKind;
use lease_core::ghost::driver::{Action, KINDS, MemWorld};
use lease_core::{HeartbeatDurability, TimingPolicy};

/// Most actions read from one input.
pub const MAX_ACTIONS: usize = 4096;

/// The check of the `transitions` target: panics with the violation and the trace.
pub fn check(data: &[u8]) {
    let _ = trace(data);
}

/// Run an input and return the trace of what happened (for triage: `examples/show.rs`).
/// Panics on a violation, with the trace up to it.
pub fn trace(data: &[u8]) -> Vec<String> {
    let Some((&first, rest)) = data.split_first() else {
        return Vec::new();
    };
    let n = 2 + usize::from(first & 1);
    let policy = if first & 2 != 0 {
        TimingPolicy::default().with_durability(HeartbeatDurability::Durable)
    } else {
        TimingPolicy::default()
    };
    let actions = rest
        .chunks_exact(2)
        .take(MAX_ACTIONS)
        .map(|pair| action(pair[0], pair[1]));
    match MemWorld::run(n, policy, actions) {
        Ok(w) => w.log,
        Err(v) => panic!("{v}"),
    }
}

/// One input pair as a driver action.
fn action(b: u8, p: u8) -> Action {
    let a = usize::from(b & 3);
    match b >> 4 {
        6 => Action::RunToEnd(a),
        7..=9 => Action::Start(a, KINDS[usize::from(p) % KINDS.len()]),
        10 => Action::Start(a, OpKind::Append),
        11 => Action::Tick(u64::from(p) * 250),
        12 => Action::Crash(a),
        13 if p.is_multiple_of(8) => Action::Corrupt(p / 8),
        14 => Action::Drain,
        15 if p.is_multiple_of(16) => Action::PowerLoss {
            tear: (p / 16) % 2 == 1,
        },
        _ => Action::Step(a),
    }
}
