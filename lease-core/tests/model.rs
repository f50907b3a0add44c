//! Property test: random interleavings of 2-3 owners driving the real step machines over
//! the in-memory authority, one request at a time, through the actor driver shared with
//! the fuzzer and the model checker (`lease_core::ghost::driver::MemWorld`): every actor
//! kind (claim, heartbeat, append, takeover, retirement, release, prune, a concurrent
//! finalizing reader), pauses (an actor is simply not stepped), process crashes, power
//! loss (a create's link visible before its directory fsync; unsynced heartbeats and
//! removals undone or torn), clock jumps and hand-corrupted records. The invariants of
//! docs/PROTOCOL.md §8 are checked after every step, after each power loss and at the end.
//!
//! This file only turns proptest's input into the driver's actions.
//!
//! `RUNLEASE_DEEP=1` runs 100x more cases.

use lease_core::ghost::OpKind;
use lease_core::ghost::driver::{Action, KINDS, MemWorld};
use lease_core::{HeartbeatDurability, TimingPolicy};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn cases(default: u32) -> ProptestConfig {
    let deep = std::env::var_os("RUNLEASE_DEEP").is_some_and(|v| !v.is_empty());
    ProptestConfig::with_cases(if deep { default * 100 } else { default })
}

/// One proptest triple (actor, code, parameter) as a driver action.
fn action((a, code, p): (usize, u8, u32)) -> Action {
    match code {
        7..=9 => Action::Start(a, KINDS[p as usize % KINDS.len()]),
        10 => Action::Start(a, OpKind::Append),
        11 => Action::Tick(u64::from(p % 400) * 100),
        12 if p % 4 == 0 => Action::Crash(a),
        13 if p % 50 == 0 => Action::Corrupt((p / 50) as u8),
        14 if p % 60 == 0 => Action::PowerLoss {
            tear: (p / 60) % 2 == 1,
        },
        _ => Action::Step(a),
    }
}

fn run(n: usize, durable: bool, acts: &[(usize, u8, u32)]) -> MemWorld {
    let policy = if durable {
        TimingPolicy::default().with_durability(HeartbeatDurability::Durable)
    } else {
        TimingPolicy::default()
    };
    MemWorld::run(n, policy, acts.iter().copied().map(action)).unwrap_or_else(|v| panic!("{v}"))
}

fn actions(len: usize) -> impl Strategy<Value = Vec<(usize, u8, u32)>> {
    proptest::collection::vec((0..3usize, 0..16u8, 0..10_000u32), 1..len)
}

proptest! {
    #![proptest_config(cases(96))]

    #[test]
    fn two_owners_keep_every_protocol_invariant(acts in actions(300)) {
        let w = run(2, false, &acts);
        prop_assert!(w.ghost.max_head < 10_000);
    }

    #[test]
    fn three_owners_keep_every_protocol_invariant(acts in actions(400)) {
        let w = run(3, false, &acts);
        prop_assert!(w.ghost.max_head < 10_000);
    }

    #[test]
    fn two_owners_with_durable_heartbeats_keep_every_protocol_invariant(acts in actions(300)) {
        let w = run(2, true, &acts);
        prop_assert!(w.ghost.max_head < 10_000);
    }
}

/// The generator actually reaches the interesting states (takeovers, retirements, fenced
/// appends, power losses, late links, durable beats): otherwise the properties above would
/// pass vacuously.
#[test]
fn the_model_test_reaches_every_actor_kind_power_loss_and_late_links() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    const KEYS: [&str; 10] = [
        "Takeover -> ok",
        "Retire -> ok",
        "Append -> FENCED",
        "Heartbeat -> FENCED",
        "Release -> ok",
        "Prune -> ok",
        "Read -> ok",
        "crashes",
        "POWER LOSS (tear true)",
        "corrupt",
    ];
    /// Facts of the ghost at the end of a run, in the order `facts` below computes them.
    const FACTS: [&str; 4] = [
        "refused event on disk",
        "event linked late",
        "cutoff linked",
        "durable beat",
    ];
    let mut runner = TestRunner::deterministic();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for k in 0..600 {
        let acts = actions(400).new_tree(&mut runner).unwrap().current();
        let w = run(3 - k % 2, k % 4 == 1, &acts);
        for line in &w.log {
            for key in KEYS.into_iter().filter(|key| line.contains(key)) {
                *seen.entry(key).or_default() += 1;
            }
        }
        let facts = [
            !w.ghost.refused.is_empty(),
            !w.ghost.late.is_empty(),
            !w.ghost.cutoff_linked.is_empty(),
            !w.ghost.durable_beats.is_empty(),
        ];
        for (fact, _) in FACTS.into_iter().zip(facts).filter(|(_, held)| *held) {
            *seen.entry(fact).or_default() += 1;
        }
    }
    let wanted = KEYS.into_iter().chain(FACTS);
    for key in wanted {
        assert!(
            seen.get(key).copied().unwrap_or(0) > 0,
            "never saw {key}: {seen:?}"
        );
    }
}

/// The defect the shared driver found on its first deep run (issue #30), replayed: c1's
/// append of event 1 (generation 2) is refused (cutoff 2 says through 0), a2's prune
/// (floor 2) writes checkpoint 2 through event 1 without judging it (its generation is not
/// below the floor), and b1's prune (floor 3) judged only the events after checkpoint 2,
/// so checkpoint 3 listed event 1 as authoritative and removed cutoff 2: a write answered
/// FENCED counted (I9). A checkpoint now names the first event it left unjudged
/// (`unjudged_from`), and the next prune reads from there.
#[test]
fn a_prune_judges_the_events_an_earlier_checkpoint_left_unjudged() {
    let acts: Vec<(usize, u8, u32)> = vec![
        (0, 7, 9896),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 14, 1260),
        (0, 11, 4601),
        (2, 7, 763),
        (2, 13, 1),
        (2, 12, 501),
        (2, 0, 0),
        (2, 0, 0),
        (2, 0, 0),
        (2, 0, 0),
        (0, 11, 6201),
        (2, 0, 0),
        (2, 0, 0),
        (2, 13, 1),
        (2, 0, 0),
        (2, 14, 1),
        (0, 7, 811),
        (0, 0, 0),
        (0, 12, 173),
        (2, 12, 5),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (2, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (2, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (2, 10, 0),
        (0, 0, 0),
        (0, 0, 0),
        (2, 0, 0),
        (2, 0, 0),
        (2, 0, 0),
        (2, 0, 0),
        (2, 0, 0),
        (0, 0, 0),
        (2, 0, 0),
        (2, 0, 0),
        (0, 12, 252),
        (2, 12, 9),
        (0, 7, 7574),
        (0, 11, 4201),
        (0, 0, 0),
        (2, 7, 7107),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (2, 0, 0),
        (0, 0, 0),
        (2, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (2, 0, 0),
        (2, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        (2, 0, 0),
        (2, 12, 3173),
        (1, 7, 4702),
        (0, 0, 0),
        (2, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
    ];
    let w = run(3, false, &acts);
    let pruned = w.log.iter().filter(|l| l.ends_with("Prune -> ok")).count();
    assert!(pruned >= 2, "the replay still prunes twice: {:?}", w.log);
    assert!(!w.ghost.refused.is_empty(), "and has a refused event");
}
