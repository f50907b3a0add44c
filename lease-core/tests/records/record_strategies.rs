//! Strategies for record parts, whole records and the layout's file references.

use crate::mutations::mutation;
use crate::strategies::{
    DAY_MS, below_max_u64, digest, identity, json, pid, positive_u64, run_id, text, text_char,
    timestamp, truncate_to, u64_biased, word,
};
use lease_core::records::DETAIL_MAX_BYTES;
use lease_core::*;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

// ---------------------------------------------------------------------------------------
// Strategies: record parts and records
// ---------------------------------------------------------------------------------------

fn generation(v: u64) -> Generation {
    Generation::new(v).unwrap_or_else(|| panic!("strategy built generation 0"))
}

fn sequence(v: u64) -> Sequence {
    Sequence::new(v).unwrap_or_else(|| panic!("strategy built sequence 0"))
}

fn durability() -> impl Strategy<Value = HeartbeatDurability> + Clone {
    prop_oneof![
        Just(HeartbeatDurability::Local),
        Just(HeartbeatDurability::Durable)
    ]
}

/// Only safe policies: heartbeat h in 100..=10 000, self-fence f >= 2h, stale
/// s >= max(4h, f + h, 1000), all <= 24 h; often exactly at the minima.
fn policy() -> impl Strategy<Value = TimingPolicy> + Clone {
    (
        prop_oneof![Just(100u64), 100u64..=10_000, Just(10_000)],
        prop_oneof![Just(0u64), 0u64..=50_000, 0u64..=40_000_000],
        prop_oneof![Just(0u64), 0u64..=100_000, 0u64..=DAY_MS],
        durability(),
    )
        .prop_map(|(h, df, ds, d)| {
            let f = 2 * h + df;
            let lowest_stale = (4 * h).max(f + h).max(1000);
            let s = (lowest_stale + ds).min(DAY_MS);
            TimingPolicy::from_millis(h, f, s, d)
                .unwrap_or_else(|e| panic!("strategy built a bad policy {h}/{f}/{s}: {e}"))
        })
}

fn holder() -> impl Strategy<Value = Holder> + Clone {
    (word(), identity(), pid(), u64_biased()).prop_map(|(host, boot_id, pid, start_time)| Holder {
        host,
        boot_id,
        pid,
        start_time,
    })
}

pub(crate) fn epoch_record() -> impl Strategy<Value = EpochRecord> {
    (
        run_id(),
        positive_u64(),
        0u8..3,
        word(),
        word(),
        holder(),
        timestamp(),
        policy(),
        proptest::option::of((identity(), u64_biased())),
        proptest::option::of(u64_biased()),
        digest(),
        any::<bool>(),
    )
        .prop_map(
            |(
                run_id,
                g,
                state,
                owner_id,
                other,
                holder,
                claimed_at,
                policy,
                seal,
                store_floor,
                prev,
                taken_over,
            )| {
                // Both forms of the optional `observed` (absent when none; issue #19), where
                // it is allowed (a takeover or a retirement), derived from the other draws.
                let observation = |reason| {
                    let ms = claimed_at.unix_millis();
                    (reason != RetireReason::Released && ms % 3 != 0).then(|| Observation {
                        heartbeat_at: claimed_at,
                        heartbeat_count: store_floor.unwrap_or(0),
                        watched_ms: (reason == RetireReason::TakenOver).then_some(ms % 100_000),
                        mode: match (reason, ms % 2) {
                            (RetireReason::TakenOver, 0) => TakeoverMode::Operator,
                            (RetireReason::TakenOver, _) => TakeoverMode::Automatic,
                            _ => TakeoverMode::RetireDead,
                        },
                    })
                };
                let retired_owner = |g: u64, owner_id: Identity, reason| RetiredOwner {
                    generation: generation(g - 1),
                    owner_id,
                    reason,
                    observed: observation(reason),
                };
                let (g, state, retired, seal) = match state {
                    0 => {
                        let retired = (g >= 2 && taken_over)
                            .then(|| retired_owner(g, other, RetireReason::TakenOver));
                        (g, EpochState::Active, retired, None)
                    }
                    1 => {
                        let g = g.max(2);
                        let retired = retired_owner(g, owner_id.clone(), RetireReason::Released);
                        let seal = seal.map(|(store_id, sequence)| Seal {
                            store_id,
                            sequence,
                            generation: generation(g - 1),
                        });
                        (g, EpochState::Released, Some(retired), seal)
                    }
                    _ => {
                        let g = g.max(2);
                        let retired = retired_owner(g, other, RetireReason::Dead);
                        (g, EpochState::Retired, Some(retired), None)
                    }
                };
                // Both forms of the optional `cutoff_hash` (absent when none), only where
                // it is allowed (generation 3 and up).
                let cutoff_hash =
                    (g >= 3 && claimed_at.unix_millis() % 2 == 0).then(|| prev.clone());
                EpochRecord {
                    run_id,
                    generation: generation(g),
                    cutoff_hash,
                    prev_hash: (g != 1).then_some(prev),
                    state,
                    owner_id,
                    holder,
                    claimed_at,
                    policy,
                    retired,
                    seal,
                    store_floor,
                }
            },
        )
}

pub(crate) fn heartbeat_record() -> impl Strategy<Value = HeartbeatRecord> {
    (
        run_id(),
        positive_u64(),
        word(),
        timestamp(),
        positive_u64(),
        proptest::option::of(any::<u64>()),
        proptest::option::of((identity(), any::<u64>())),
    )
        .prop_map(
            |(run_id, g, owner_id, heartbeat_at, count, store_head, mono)| HeartbeatRecord {
                run_id,
                generation: generation(g),
                owner_id,
                heartbeat_at,
                count,
                store_head,
                mono: mono.map(|(clock, ns)| MonoStamp { clock, ns }),
            },
        )
}

pub(crate) fn retirement_record() -> impl Strategy<Value = RetirementRecord> {
    below_max_u64()
        .prop_flat_map(|g| (Just(g), prop_oneof![Just(g + 1), (g + 1)..=u64::MAX]))
        .prop_flat_map(|(g, by)| {
            (
                run_id(),
                Just(g),
                word(),
                Just(by),
                u64_biased(),
                timestamp(),
                identity(),
            )
        })
        .prop_map(
            |(run_id, g, owner_id, by, events_through, finalized_at, finalized_by)| {
                RetirementRecord {
                    run_id,
                    generation: generation(g),
                    owner_id,
                    superseded_by: generation(by),
                    events_through,
                    finalized_at,
                    finalized_by,
                }
            },
        )
}

fn takeover_mode() -> impl Strategy<Value = TakeoverMode> + Clone {
    prop_oneof![
        Just(TakeoverMode::Operator),
        Just(TakeoverMode::Automatic),
        Just(TakeoverMode::RetireDead),
    ]
}

pub(crate) fn takeover_intent() -> impl Strategy<Value = TakeoverIntent> {
    (
        run_id(),
        below_max_u64(),
        word(),
        timestamp(),
        u64_biased(),
        word(),
        holder(),
        timestamp(),
        takeover_mode(),
    )
        .prop_map(
            |(run_id, expected, owner, hb_at, hb_count, taker, taker_holder, at, mode)| {
                TakeoverIntent {
                    run_id,
                    generation: generation(expected + 1),
                    expected_generation: generation(expected),
                    expected_owner_id: owner,
                    expected_heartbeat_at: hb_at,
                    expected_heartbeat_count: hb_count,
                    taker_owner_id: taker,
                    taker_holder,
                    requested_at: at,
                    mode,
                }
            },
        )
}

pub(crate) fn checkpoint() -> impl Strategy<Value = Checkpoint> {
    u64_biased()
        .prop_flat_map(|through| {
            let not_authoritative = if through == 0 {
                Just(Vec::new()).boxed()
            } else {
                vec(prop_oneof![1..=through, Just(through), Just(1)], 0..8)
                    .prop_map(|mut v| {
                        v.sort_unstable();
                        v.dedup();
                        v
                    })
                    .boxed()
            };
            (
                run_id(),
                positive_u64(),
                digest(),
                Just(through),
                not_authoritative,
                timestamp(),
                identity(),
            )
        })
        .prop_map(
            |(run_id, floor, hash, through, not_authoritative, created_at, created_by)| {
                Checkpoint {
                    run_id,
                    floor_generation: generation(floor),
                    through_hash: (through > 0 && floor % 2 == 0).then(|| hash.clone()),
                    floor_epoch_hash: hash,
                    through_sequence: through,
                    unjudged_from: (through > 0 && floor % 3 == 0)
                        .then_some(1 + floor % through.max(1)),
                    not_authoritative,
                    created_at,
                    created_by,
                }
            },
        )
}

pub(crate) fn run_status() -> impl Strategy<Value = RunStatus> {
    let detail = prop_oneof![
        4 => text(40),
        1 => vec(proptest::char::range(' ', '~'), 4090..=4100).prop_map(|c| c.into_iter().collect()),
        1 => vec(text_char(), 1020..=1100).prop_map(|c| c.into_iter().collect()),
    ]
    .prop_map(|s| truncate_to(s, DETAIL_MAX_BYTES));
    (
        run_id(),
        select(vec![
            RunState::Running,
            RunState::Paused,
            RunState::Done,
            RunState::Failed,
        ]),
        positive_u64(),
        proptest::option::of(u64_biased()),
        proptest::option::of(timestamp()),
        proptest::option::of(holder()),
        proptest::option::of(timestamp()),
        timestamp(),
        proptest::option::of(detail),
    )
        .prop_map(
            |(run_id, status, g, sealed, wake, holder, hb, updated_at, detail)| RunStatus {
                run_id,
                status,
                generation: generation(g),
                sealed_sequence: sealed,
                wake_at: wake.filter(|_| status == RunState::Paused),
                holder,
                heartbeat_at: hb,
                updated_at,
                detail,
            },
        )
}

pub(crate) fn command_record() -> impl Strategy<Value = CommandRecord> {
    (
        run_id(),
        positive_u64(),
        // A command leads its own group (pgid = pid) and is never pid 0 or 1.
        pid().prop_map(|p| p.max(2)),
        proptest::option::of(digest()),
        u64_biased(),
        identity(),
        vec(text(24), 1..6),
        timestamp(),
        // The cgroup id is never 0 (no inode) or 1 (the root cgroup).
        proptest::option::of(
            (2u64..=u64::MAX, proptest::num::u32::ANY)
                .prop_map(|(id, uid)| lease_core::CommandCgroup { id, uid }),
        ),
    )
        .prop_map(
            |(run_id, g, pid, incarnation, start_time, boot_id, mut argv, started_at, cgroup)| {
                if argv[0].is_empty() {
                    argv[0].push('x');
                }
                // The mark (issue #29) exists only with a digest, named after it.
                let mark = incarnation.as_ref().filter(|_| pid % 2 == 0).map(|d| {
                    lease_core::CommandMark {
                        name: lease_core::CommandMark::name_for(d),
                        dev: start_time,
                        ino: u64::from(pid),
                    }
                });
                CommandRecord {
                    run_id,
                    generation: generation(g),
                    pid,
                    pgid: pid,
                    start_time,
                    boot_id,
                    argv,
                    started_at,
                    incarnation,
                    cgroup,
                    mark,
                }
            },
        )
}

pub(crate) fn event() -> impl Strategy<Value = Event> {
    (
        run_id(),
        positive_u64(),
        positive_u64(),
        word(),
        identity(),
        json(),
        timestamp(),
        digest(),
    )
        .prop_map(
            |(run_id, seq, g, owner_id, event_type, payload, timestamp, prev)| Event {
                run_id,
                sequence: sequence(seq),
                generation: generation(g),
                owner_id,
                event_type,
                payload,
                timestamp,
                prev_hash: (seq != 1).then_some(prev),
            },
        )
}

// ---------------------------------------------------------------------------------------
// Strategies: layout file references and directory entry names
// ---------------------------------------------------------------------------------------

pub(crate) fn file_ref() -> impl Strategy<Value = FileRef> {
    prop_oneof![
        positive_u64().prop_map(|g| FileRef::Epoch(generation(g))),
        positive_u64().prop_map(|g| FileRef::Beat(generation(g))),
        positive_u64().prop_map(|g| FileRef::Cutoff(generation(g))),
        positive_u64().prop_map(|g| FileRef::Checkpoint(generation(g))),
        positive_u64().prop_map(|s| FileRef::Event(sequence(s))),
        (positive_u64(), u64_biased()).prop_map(|(g, nonce)| FileRef::Intent {
            generation: generation(g),
            nonce,
        }),
        (positive_u64(), pid()).prop_map(|(g, pid)| FileRef::Command {
            generation: generation(g),
            pid,
        }),
    ]
}

pub(crate) fn entry_name() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any::<String>(),
        2 => text(40),
        4 => proptest::string::string_regex(
            "(\\.|\\.tmp-|\\.\\./|/)?[0-9+ -]{0,3}[0-9]{17,20}(-[0-9a-fA-F+ x-]{0,18})?(\\.json)?(\\.tmp|/|/\\.\\.|\\.json)?"
        )
        .unwrap_or_else(|e| panic!("bad regex: {e}")),
        4 => (file_ref(), vec(mutation(), 0..3)).prop_map(|(f, ms)| {
            let mut b = f.file_name().into_bytes();
            for m in &ms {
                m.apply(&mut b);
            }
            String::from_utf8_lossy(&b).into_owned()
        }),
    ]
}
