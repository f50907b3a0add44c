//! Property tests of the record clauses of the protocol: one canonical byte form per record,
//! strict decoding that rejects (never panics on) anything else, and file names that cannot
//! escape their folder. Names say which clause they check.
//!
//! Case counts are small by default (the whole file runs in seconds in debug mode); set
//! `RUNLEASE_DEEP=1` (`cargo xtask test --deep`) for 100x as many.

use lease_core::canonical::canonical_value_bytes;
use lease_core::records::DETAIL_MAX_BYTES;
use lease_core::*;
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use serde_json::{Map, Number, Value};
use std::fmt;

// ---------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------

/// `default` cases, or 100x as many when `RUNLEASE_DEEP` is set (non-empty).
///
/// Failure persistence is off so that a failing run never writes a regression file into the
/// source tree; the minimal failing input is printed in the test output instead.
fn cases(default: u32) -> ProptestConfig {
    let deep = std::env::var_os("RUNLEASE_DEEP").is_some_and(|v| !v.is_empty());
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(if deep { default * 100 } else { default })
    }
}

/// Milliseconds of 9999-12-31T23:59:59.999Z, the last representable timestamp.
const MAX_MS: u64 = 253_402_300_799_999;
const DAY_MS: u64 = 24 * 3600 * 1000;

// ---------------------------------------------------------------------------------------
// Strategies: scalars and identifiers
// ---------------------------------------------------------------------------------------

/// Any u64, biased towards small values and the top of the range.
fn u64_biased() -> impl Strategy<Value = u64> + Clone {
    prop_oneof![
        4 => 0u64..=16,
        4 => any::<u64>(),
        1 => (u64::MAX - 16)..=u64::MAX,
        1 => Just(1u64 << 53),
    ]
}

/// A value for a generation or a sequence (>= 1).
fn positive_u64() -> impl Strategy<Value = u64> + Clone {
    u64_biased().prop_map(|v| v.max(1))
}

/// A value in `1..u64::MAX` (so that `+ 1` exists).
fn below_max_u64() -> impl Strategy<Value = u64> + Clone {
    positive_u64().prop_map(|v| v.min(u64::MAX - 1))
}

fn pid() -> impl Strategy<Value = u32> + Clone {
    prop_oneof![3 => 1u32..=65_536, 2 => 1u32..=u32::MAX, 1 => Just(u32::MAX)]
}

/// A character allowed somewhere in an identity (no control characters; whitespace is
/// allowed inside, trimming takes care of the ends).
fn identity_char() -> impl Strategy<Value = char> + Clone {
    prop_oneof![
        8 => proptest::char::range('!', '~'),
        2 => Just(' '),
        2 => select(vec![
            '\u{a0}', '\u{3000}', '\u{2028}', '\u{200b}', '\u{feff}', '\u{fffd}', 'é', 'ß', '中',
            '😀', '\u{10ffff}', '"', '\\', '/', '\u{ad}',
        ]),
        3 => any::<char>().prop_map(|c| if c.is_control() { '?' } else { c }),
    ]
}

/// Make a valid identity out of arbitrary identity characters: trim, cut at 256 bytes (on a
/// character boundary), trim again, never empty.
fn fix_identity(chars: Vec<char>) -> Identity {
    let s: String = chars.into_iter().collect();
    let s = s.trim();
    let mut end = s.len().min(256);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let s = s[..end].trim();
    let s = if s.is_empty() { "x" } else { s };
    Identity::new(s).unwrap_or_else(|e| panic!("test strategy built a bad identity: {e}"))
}

fn identity() -> impl Strategy<Value = Identity> + Clone {
    prop_oneof![
        6 => vec(identity_char(), 1..24),
        1 => vec(proptest::char::range(' ', '~'), 250..=262),
        1 => vec(identity_char(), 60..=300),
    ]
    .prop_map(fix_identity)
}

fn run_id() -> impl Strategy<Value = RunId> {
    proptest::string::string_regex("[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
        .unwrap_or_else(|e| panic!("bad regex: {e}"))
        .prop_map(|s| RunId::new(s).unwrap_or_else(|e| panic!("bad run id strategy: {e}")))
}

fn timestamp() -> impl Strategy<Value = Timestamp> + Clone {
    prop_oneof![
        8 => 0..=MAX_MS,
        1 => Just(0),
        1 => Just(MAX_MS),
        // Around 2000-02-29 and the 2026 dates the rest of the project uses.
        2 => 951_696_000_000u64..951_955_200_000,
        2 => 1_790_000_000_000u64..1_800_000_000_000,
    ]
    .prop_map(|ms| Timestamp::from_unix_millis(ms).unwrap_or(Timestamp::EPOCH))
}

fn digest() -> impl Strategy<Value = Digest> + Clone {
    vec(any::<u8>(), 0..16).prop_map(|b| Digest::of(&b))
}

/// Characters of free text: controls, quotes, backslashes, unicode separators, astral.
fn text_char() -> impl Strategy<Value = char> + Clone {
    prop_oneof![
        6 => proptest::char::range(' ', '~'),
        2 => proptest::char::range('\0', '\u{1f}'),
        2 => select(vec![
            '\u{7f}', '\u{80}', '\u{9f}', '\u{2028}', '\u{2029}', '\u{feff}', '"', '\\', '/', 'é',
            '中', '😀', '\u{10ffff}', '\u{fffd}',
        ]),
        2 => any::<char>(),
    ]
}

fn text(max_chars: usize) -> impl Strategy<Value = String> + Clone {
    vec(text_char(), 0..max_chars).prop_map(|c| c.into_iter().collect())
}

/// Free text of at most `max` bytes, cut on a character boundary.
fn truncate_to(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Arbitrary JSON for event payloads: depth <= 4.
fn json() -> impl Strategy<Value = Value> + Clone {
    let leaf = prop_oneof![
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::Bool),
        2 => any::<i64>().prop_map(Value::from),
        1 => any::<u64>().prop_map(Value::from),
        2 => any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        1 => select(vec![0.0f64, -0.0, 1.0, 0.1, 1e300, -1e-300, 5e-324, 1e16, 9007199254740993.0])
            .prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        3 => text(16).prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::Array),
            btree_map(text(8), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

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
    (identity(), identity(), pid(), u64_biased()).prop_map(|(host, boot_id, pid, start_time)| {
        Holder {
            host,
            boot_id,
            pid,
            start_time,
        }
    })
}

fn epoch_record() -> impl Strategy<Value = EpochRecord> {
    (
        run_id(),
        positive_u64(),
        0u8..3,
        identity(),
        identity(),
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
                let retired_owner = |g: u64, owner_id: Identity, reason| RetiredOwner {
                    generation: generation(g - 1),
                    owner_id,
                    reason,
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
                EpochRecord {
                    run_id,
                    generation: generation(g),
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

fn heartbeat_record() -> impl Strategy<Value = HeartbeatRecord> {
    (
        run_id(),
        positive_u64(),
        identity(),
        timestamp(),
        positive_u64(),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(
            |(run_id, g, owner_id, heartbeat_at, count, store_head)| HeartbeatRecord {
                run_id,
                generation: generation(g),
                owner_id,
                heartbeat_at,
                count,
                store_head,
            },
        )
}

fn retirement_record() -> impl Strategy<Value = RetirementRecord> {
    below_max_u64()
        .prop_flat_map(|g| (Just(g), prop_oneof![Just(g + 1), (g + 1)..=u64::MAX]))
        .prop_flat_map(|(g, by)| {
            (
                run_id(),
                Just(g),
                identity(),
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

fn takeover_intent() -> impl Strategy<Value = TakeoverIntent> {
    (
        run_id(),
        below_max_u64(),
        identity(),
        timestamp(),
        u64_biased(),
        identity(),
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

fn checkpoint() -> impl Strategy<Value = Checkpoint> {
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
                    floor_epoch_hash: hash,
                    through_sequence: through,
                    not_authoritative,
                    created_at,
                    created_by,
                }
            },
        )
}

fn run_status() -> impl Strategy<Value = RunStatus> {
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

fn command_record() -> impl Strategy<Value = CommandRecord> {
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
    )
        .prop_map(
            |(run_id, g, pid, incarnation, start_time, boot_id, mut argv, started_at)| {
                if argv[0].is_empty() {
                    argv[0].push('x');
                }
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
                }
            },
        )
}

fn event() -> impl Strategy<Value = Event> {
    (
        run_id(),
        positive_u64(),
        positive_u64(),
        identity(),
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
// Record kinds under test, with the paths of their typed fields
// ---------------------------------------------------------------------------------------

/// Paths (object keys from the top) of fields of one type in a record's JSON.
type Paths = &'static [&'static [&'static str]];

trait Subject: Record + Clone + fmt::Debug + PartialEq + 'static {
    fn strategy() -> BoxedStrategy<Self>;
    /// Generation and sequence fields (positive u64).
    const POSITIVE: Paths;
    /// Plain u64 fields.
    const U64: Paths;
    /// u32 fields (pids).
    const U32: Paths;
    /// Timestamp fields (possibly nullable).
    const TIMESTAMPS: Paths;
    /// Identity fields.
    const IDENTITIES: Paths;
}

const POLICY_U64: [&[&str]; 3] = [
    &["policy", "heartbeat_ms"],
    &["policy", "self_fence_after_ms"],
    &["policy", "stale_after_ms"],
];

impl Subject for EpochRecord {
    fn strategy() -> BoxedStrategy<Self> {
        epoch_record().boxed()
    }
    const POSITIVE: Paths = &[
        &["generation"],
        &["retired", "generation"],
        &["seal", "generation"],
    ];
    const U64: Paths = &[
        &["holder", "start_time"],
        &["store_floor"],
        &["seal", "sequence"],
        POLICY_U64[0],
        POLICY_U64[1],
        POLICY_U64[2],
    ];
    const U32: Paths = &[&["holder", "pid"]];
    const TIMESTAMPS: Paths = &[&["claimed_at"]];
    const IDENTITIES: Paths = &[
        &["owner_id"],
        &["holder", "host"],
        &["holder", "boot_id"],
        &["retired", "owner_id"],
        &["seal", "store_id"],
    ];
}

impl Subject for HeartbeatRecord {
    fn strategy() -> BoxedStrategy<Self> {
        heartbeat_record().boxed()
    }
    const POSITIVE: Paths = &[&["generation"]];
    const U64: Paths = &[&["count"], &["store_head"]];
    const U32: Paths = &[];
    const TIMESTAMPS: Paths = &[&["heartbeat_at"]];
    const IDENTITIES: Paths = &[&["owner_id"]];
}

impl Subject for RetirementRecord {
    fn strategy() -> BoxedStrategy<Self> {
        retirement_record().boxed()
    }
    const POSITIVE: Paths = &[&["generation"], &["superseded_by"]];
    const U64: Paths = &[&["events_through"]];
    const U32: Paths = &[];
    const TIMESTAMPS: Paths = &[&["finalized_at"]];
    const IDENTITIES: Paths = &[&["owner_id"], &["finalized_by"]];
}

impl Subject for TakeoverIntent {
    fn strategy() -> BoxedStrategy<Self> {
        takeover_intent().boxed()
    }
    const POSITIVE: Paths = &[&["generation"], &["expected_generation"]];
    const U64: Paths = &[
        &["expected_heartbeat_count"],
        &["taker_holder", "start_time"],
    ];
    const U32: Paths = &[&["taker_holder", "pid"]];
    const TIMESTAMPS: Paths = &[&["expected_heartbeat_at"], &["requested_at"]];
    const IDENTITIES: Paths = &[
        &["expected_owner_id"],
        &["taker_owner_id"],
        &["taker_holder", "host"],
        &["taker_holder", "boot_id"],
    ];
}

impl Subject for Checkpoint {
    fn strategy() -> BoxedStrategy<Self> {
        checkpoint().boxed()
    }
    const POSITIVE: Paths = &[&["floor_generation"]];
    const U64: Paths = &[&["through_sequence"]];
    const U32: Paths = &[];
    const TIMESTAMPS: Paths = &[&["created_at"]];
    const IDENTITIES: Paths = &[&["created_by"]];
}

impl Subject for RunStatus {
    fn strategy() -> BoxedStrategy<Self> {
        run_status().boxed()
    }
    const POSITIVE: Paths = &[&["generation"]];
    const U64: Paths = &[&["sealed_sequence"], &["holder", "start_time"]];
    const U32: Paths = &[&["holder", "pid"]];
    const TIMESTAMPS: Paths = &[&["wake_at"], &["heartbeat_at"], &["updated_at"]];
    const IDENTITIES: Paths = &[&["holder", "host"], &["holder", "boot_id"]];
}

impl Subject for CommandRecord {
    fn strategy() -> BoxedStrategy<Self> {
        command_record().boxed()
    }
    const POSITIVE: Paths = &[&["generation"]];
    const U64: Paths = &[&["start_time"]];
    const U32: Paths = &[&["pid"], &["pgid"]];
    const TIMESTAMPS: Paths = &[&["started_at"]];
    const IDENTITIES: Paths = &[&["boot_id"]];
}

impl Subject for Event {
    fn strategy() -> BoxedStrategy<Self> {
        event().boxed()
    }
    const POSITIVE: Paths = &[&["sequence"], &["generation"]];
    const U64: Paths = &[];
    const U32: Paths = &[];
    const TIMESTAMPS: Paths = &[&["timestamp"]];
    const IDENTITIES: Paths = &[&["owner_id"], &["type"]];
}

/// One valid record of any kind, type-erased: its canonical bytes, its JSON, and a decoder
/// that re-encodes what it decodes.
#[derive(Clone)]
struct Sample {
    version: &'static str,
    bytes: Vec<u8>,
    value: Value,
    decode: DecodeFn,
    positive: Paths,
    u64s: Paths,
    u32s: Paths,
    timestamps: Paths,
    identities: Paths,
}

impl fmt::Debug for Sample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} record {}",
            self.version,
            String::from_utf8_lossy(&self.bytes)
        )
    }
}

fn decode_then_encode<R: Record>(bytes: &[u8]) -> Result<Vec<u8>, LeaseError> {
    encode(&decode::<R>(bytes)?)
}

fn must_encode<R: Record + fmt::Debug>(record: &R) -> Vec<u8> {
    encode(record).unwrap_or_else(|e| panic!("strategy built an unencodable {record:?}: {e}"))
}

fn sample<R: Subject>(record: R) -> Sample {
    let bytes = must_encode(&record);
    let value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("encode wrote invalid JSON for {record:?}: {e}"));
    Sample {
        version: R::VERSION,
        bytes,
        value,
        decode: decode_then_encode::<R>,
        positive: R::POSITIVE,
        u64s: R::U64,
        u32s: R::U32,
        timestamps: R::TIMESTAMPS,
        identities: R::IDENTITIES,
    }
}

fn any_sample() -> impl Strategy<Value = Sample> {
    prop_oneof![
        EpochRecord::strategy().prop_map(sample),
        HeartbeatRecord::strategy().prop_map(sample),
        RetirementRecord::strategy().prop_map(sample),
        TakeoverIntent::strategy().prop_map(sample),
        Checkpoint::strategy().prop_map(sample),
        RunStatus::strategy().prop_map(sample),
        CommandRecord::strategy().prop_map(sample),
        Event::strategy().prop_map(sample),
    ]
}

/// Every decoder, for inputs that are not derived from one record.
type DecodeFn = fn(&[u8]) -> Result<Vec<u8>, LeaseError>;
const DECODERS: [(&str, DecodeFn); 8] = [
    ("epoch", decode_then_encode::<EpochRecord>),
    ("heartbeat", decode_then_encode::<HeartbeatRecord>),
    ("retirement", decode_then_encode::<RetirementRecord>),
    ("takeover-intent", decode_then_encode::<TakeoverIntent>),
    ("checkpoint", decode_then_encode::<Checkpoint>),
    ("run-status", decode_then_encode::<RunStatus>),
    ("command", decode_then_encode::<CommandRecord>),
    ("event", decode_then_encode::<Event>),
];

// ---------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------

/// Walk canonical JSON bytes: every object's keys must be strictly increasing by bytes and
/// there must be no whitespace outside strings. Returns the top-level keys in order.
fn check_json_shape(bytes: &[u8]) -> Result<Vec<String>, TestCaseError> {
    enum Frame {
        Object {
            last: Option<String>,
            expect_key: bool,
        },
        Array,
    }
    let mut stack: Vec<Frame> = Vec::new();
    let mut top_keys = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                let start = i;
                i += 1;
                while bytes[i] != b'"' {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                let depth = stack.len();
                if let Some(Frame::Object { last, expect_key }) = stack.last_mut() {
                    if *expect_key {
                        let key: String = serde_json::from_slice(&bytes[start..=i])
                            .map_err(|e| TestCaseError::fail(format!("bad key: {e}")))?;
                        if let Some(prev) = last.as_ref() {
                            prop_assert!(
                                prev.as_bytes() < key.as_bytes(),
                                "keys out of order: {:?} then {:?}",
                                prev,
                                key
                            );
                        }
                        if depth == 1 {
                            top_keys.push(key.clone());
                        }
                        *last = Some(key);
                        *expect_key = false;
                    }
                }
            }
            b'{' => stack.push(Frame::Object {
                last: None,
                expect_key: true,
            }),
            b'[' => stack.push(Frame::Array),
            b'}' | b']' => {
                stack.pop();
            }
            b',' => {
                if let Some(Frame::Object { expect_key, .. }) = stack.last_mut() {
                    *expect_key = true;
                }
            }
            b' ' | b'\t' | b'\r' | b'\n' => {
                prop_assert!(
                    i == bytes.len() - 1,
                    "whitespace outside a string at byte {}",
                    i
                );
            }
            _ => {}
        }
        i += 1;
    }
    prop_assert!(stack.is_empty(), "unbalanced JSON");
    Ok(top_keys)
}

fn check_round_trip<R: Subject>(record: &R) -> Result<(), TestCaseError> {
    let bytes = must_encode(record);
    // decode(encode(x)) == x
    let decoded: R = decode(&bytes).map_err(|e| {
        TestCaseError::fail(format!(
            "canonical bytes did not decode: {e}\n{}",
            String::from_utf8_lossy(&bytes)
        ))
    })?;
    prop_assert_eq!(&decoded, record);
    // encode(decode(b)) == b
    prop_assert_eq!(must_encode(&decoded), bytes.clone());
    // Exactly one raw LF, at the end.
    prop_assert_eq!(bytes.last(), Some(&b'\n'));
    prop_assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 1);
    // Sorted keys everywhere, no whitespace; the top-level keys are the fields + version.
    let keys = check_json_shape(&bytes)?;
    let Value::Object(fields) = serde_json::to_value(record)
        .map_err(|e| TestCaseError::fail(format!("cannot serialize: {e}")))?
    else {
        return Err(TestCaseError::fail("record is not an object"));
    };
    let mut expected: Vec<String> = fields.keys().cloned().collect();
    expected.push("version".into());
    expected.sort_unstable();
    prop_assert_eq!(keys, expected);
    // The version field carries the record's version string.
    let value: Value = serde_json::from_slice(&bytes)
        .map_err(|e| TestCaseError::fail(format!("not JSON: {e}")))?;
    prop_assert_eq!(&value["version"], &Value::String(R::VERSION.into()));
    Ok(())
}

/// The decoding contract for untrusted bytes: `RECORD_INVALID` / `SCHEMA_UNSUPPORTED` with
/// their exit codes, or a record whose canonical bytes are exactly the input.
fn check_rejected_or_canonical(decode: DecodeFn, bytes: &[u8]) -> Result<(), TestCaseError> {
    match decode(bytes) {
        Ok(again) => prop_assert_eq!(
            again.as_slice(),
            bytes,
            "decoded a non-canonical input {:?}",
            String::from_utf8_lossy(bytes)
        ),
        Err(e) => prop_assert!(
            matches!(
                (e.code().as_str(), e.exit_code()),
                ("RECORD_INVALID", 65) | ("SCHEMA_UNSUPPORTED", 70)
            ),
            "unexpected error {} for {:?}",
            e,
            String::from_utf8_lossy(bytes)
        ),
    }
    Ok(())
}

fn check_rejected_with(
    sample: &Sample,
    bytes: &[u8],
    code: &str,
    exit_code: i32,
) -> Result<(), TestCaseError> {
    match (sample.decode)(bytes) {
        Ok(_) => prop_assert!(
            false,
            "{} accepted {:?}",
            sample.version,
            String::from_utf8_lossy(bytes)
        ),
        Err(e) => prop_assert_eq!(
            (e.code().as_str(), e.exit_code()),
            (code, exit_code),
            "{} gave {} for {:?}",
            sample.version,
            e,
            String::from_utf8_lossy(bytes)
        ),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Byte mutations
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Mutation {
    Flip(Index, u8),
    Replace(Index, u8),
    Truncate(Index),
    Insert(Index, u8),
    DuplicateLastLf,
    Delete(Index),
    SwapAdjacent(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 1u8..=255).prop_map(|(i, m)| Mutation::Flip(i, m)),
        (
            any::<Index>(),
            select(b"{}[]\",:\\0123456789-+.eEtrufalsn \n".to_vec())
        )
            .prop_map(|(i, b)| Mutation::Replace(i, b)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), select(vec![b' ', b'\n', b'\t', b'\r']))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        Just(Mutation::DuplicateLastLf),
        any::<Index>().prop_map(Mutation::Delete),
        any::<Index>().prop_map(Mutation::SwapAdjacent),
    ]
}

impl Mutation {
    fn apply(&self, b: &mut Vec<u8>) {
        match self {
            Mutation::Flip(i, mask) if !b.is_empty() => {
                let k = i.index(b.len());
                b[k] ^= mask;
            }
            Mutation::Replace(i, c) if !b.is_empty() => {
                let k = i.index(b.len());
                b[k] = *c;
            }
            Mutation::Truncate(i) if !b.is_empty() => b.truncate(i.index(b.len())),
            Mutation::Insert(i, c) => b.insert(i.index(b.len() + 1), *c),
            Mutation::DuplicateLastLf => b.push(b'\n'),
            Mutation::Delete(i) if !b.is_empty() => {
                b.remove(i.index(b.len()));
            }
            Mutation::SwapAdjacent(i) if b.len() >= 2 => {
                let k = i.index(b.len() - 1);
                b.swap(k, k + 1);
            }
            _ => {}
        }
    }
}

fn check_mutations<R: Subject>(record: &R, mutations: &[Mutation]) -> Result<(), TestCaseError> {
    let mut bytes = must_encode(record);
    for m in mutations {
        m.apply(&mut bytes);
        check_rejected_or_canonical(decode_then_encode::<R>, &bytes)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// JSON manipulation
// ---------------------------------------------------------------------------------------

/// Where to find the object holding `path`'s last key, if it exists (and is an object).
fn parent_mut<'a>(value: &'a mut Value, path: &[&str]) -> Option<&'a mut Map<String, Value>> {
    let (_, parents) = path.split_last()?;
    let mut at = value;
    for key in parents {
        at = at.as_object_mut()?.get_mut(*key)?;
    }
    at.as_object_mut()
}

/// Replace the field at `path` if it exists (a `null` option counts as existing when its
/// parent object exists); `false` if the path is absent.
fn set_path(value: &mut Value, path: &[&str], new: Value) -> bool {
    let Some(last) = path.last() else {
        return false;
    };
    match parent_mut(value, path).and_then(|m| m.get_mut(*last)) {
        Some(slot) => {
            *slot = new;
            true
        }
        None => false,
    }
}

const RAW_MARK: &str = "@@lease-core-records-test-raw-literal@@";

/// Canonical bytes of `value` with the field at `path` set to the raw JSON text `raw`
/// (so that literals like `18446744073709551616` or `-0` survive exactly).
fn with_raw(value: &Value, path: &[&str], raw: &str) -> Option<Vec<u8>> {
    let mut v = value.clone();
    if !set_path(&mut v, path, Value::String(RAW_MARK.into())) {
        return None;
    }
    let text = String::from_utf8(canonical_value_bytes(&v)).ok()?;
    let quoted = format!("\"{RAW_MARK}\"");
    assert_eq!(text.matches(&quoted).count(), 1, "marker collision");
    Some(text.replace(&quoted, raw).into_bytes())
}

/// Paths to every object in a record's JSON that is part of the record's schema (the root
/// and its nested records), excluding the free-form event payload.
fn schema_objects(value: &Value) -> Vec<Vec<String>> {
    let mut out = vec![vec![]];
    if let Value::Object(map) = value {
        for (k, v) in map {
            if k != "payload" && v.is_object() {
                out.push(vec![k.clone()]);
            }
        }
    }
    out
}

fn object_at_mut<'a>(value: &'a mut Value, path: &[String]) -> Option<&'a mut Map<String, Value>> {
    let mut at = value;
    for key in path {
        at = at.as_object_mut()?.get_mut(key)?;
    }
    at.as_object_mut()
}

/// Every schema field of a record's JSON, as a path.
fn schema_fields(value: &Value) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for obj in schema_objects(value) {
        let mut v = value.clone();
        if let Some(map) = object_at_mut(&mut v, &obj) {
            for k in map.keys() {
                let mut p = obj.clone();
                p.push(k.clone());
                out.push(p);
            }
        }
    }
    out
}

fn version_prefix(version: &str) -> &str {
    version.rsplit_once('/').map_or("", |(p, _)| p)
}

/// Whether `v` names the same record kind as `version` with another numeric version.
fn is_other_numeric_version(version: &str, v: &str) -> bool {
    v != version
        && v.strip_prefix(version_prefix(version))
            .and_then(|r| r.strip_prefix('/'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
}

// ---------------------------------------------------------------------------------------
// 1 + 2: canonical round trip and byte mutations, per record kind
// ---------------------------------------------------------------------------------------

macro_rules! per_record_kind {
    ($($ty:ty => $round_trip:ident, $mutated:ident;)*) => {$(
        proptest! {
            #![proptest_config(cases(96))]

            /// Canonical encoding: `decode(encode(x)) == x`, `encode(decode(b)) == b`, one
            /// trailing LF and no other raw LF, keys sorted, no whitespace.
            #[test]
            fn $round_trip(record in <$ty as Subject>::strategy()) {
                check_round_trip(&record)?;
            }

            /// Strict decoding: damaged bytes are `RECORD_INVALID`/`SCHEMA_UNSUPPORTED`, or
            /// happen to be another canonical record; never a panic.
            #[test]
            fn $mutated(
                record in <$ty as Subject>::strategy(),
                mutations in vec(mutation(), 1..5),
            ) {
                check_mutations(&record, &mutations)?;
            }
        }
    )*};
}

per_record_kind! {
    EpochRecord => canonical_encoding_round_trips_every_epoch_record,
        damaged_epoch_bytes_are_rejected_unless_canonical;
    HeartbeatRecord => canonical_encoding_round_trips_every_heartbeat_record,
        damaged_heartbeat_bytes_are_rejected_unless_canonical;
    RetirementRecord => canonical_encoding_round_trips_every_retirement_record,
        damaged_retirement_bytes_are_rejected_unless_canonical;
    TakeoverIntent => canonical_encoding_round_trips_every_takeover_intent,
        damaged_takeover_intent_bytes_are_rejected_unless_canonical;
    Checkpoint => canonical_encoding_round_trips_every_checkpoint,
        damaged_checkpoint_bytes_are_rejected_unless_canonical;
    RunStatus => canonical_encoding_round_trips_every_run_status,
        damaged_run_status_bytes_are_rejected_unless_canonical;
    CommandRecord => canonical_encoding_round_trips_every_command_record,
        damaged_command_record_bytes_are_rejected_unless_canonical;
    Event => canonical_encoding_round_trips_every_event,
        damaged_event_bytes_are_rejected_unless_canonical;
}

// ---------------------------------------------------------------------------------------
// 3: structured rejections, every record kind
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(128))]

    /// Records are strict: an unknown field, at the top or in a nested record, is
    /// `RECORD_INVALID`.
    #[test]
    fn unknown_fields_are_rejected_in_every_record(
        s in any_sample(),
        at in any::<Index>(),
        key in prop_oneof![
            text(12),
            select(vec!["Version", "run_id ", "extra", "versions", "__proto__", ""])
                .prop_map(String::from),
        ],
        extra in json(),
    ) {
        let objects = schema_objects(&s.value);
        let obj = &objects[at.index(objects.len())];
        let mut v = s.value.clone();
        let map = object_at_mut(&mut v, obj).ok_or_else(|| TestCaseError::fail("no object"))?;
        let mut key = key;
        while map.contains_key(&key) {
            key.push('_');
        }
        map.insert(key, extra);
        check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID", 65)?;
    }

    /// Every field is required (optional ones are written as `null`): removing any one field,
    /// `version` included, is `RECORD_INVALID`. The exceptions are the heartbeat's
    /// `store_head` and the command record's `incarnation`, omitted when empty (PROTOCOL.md
    /// §4); their forms are checked by `heartbeat_store_head_is_absent_when_empty_and_never_null`
    /// and `command_incarnation_is_absent_when_empty_and_never_null`.
    #[test]
    fn missing_fields_are_rejected_in_every_record(s in any_sample(), at in any::<Index>()) {
        let fields: Vec<Vec<String>> = schema_fields(&s.value)
            .into_iter()
            .filter(|p| !(s.version == HeartbeatRecord::VERSION && p == &["store_head"]))
            // Also optional, omitted when absent (records from before issue #15).
            .filter(|p| !(s.version == CommandRecord::VERSION && p == &["incarnation"]))
            .collect();
        let path = &fields[at.index(fields.len())];
        let mut v = s.value.clone();
        let (last, parent) = path.split_last().ok_or_else(|| TestCaseError::fail("empty path"))?;
        let map = object_at_mut(&mut v, parent).ok_or_else(|| TestCaseError::fail("no object"))?;
        prop_assert!(map.remove(last).is_some());
        check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID", 65)?;
    }

    /// Schema versions: the same record kind with another numeric version is
    /// `SCHEMA_UNSUPPORTED` (exit code 70) and names both versions.
    #[test]
    fn a_newer_version_of_the_same_kind_is_schema_unsupported(
        s in any_sample(),
        n in prop_oneof![Just(2u64), 2u64..=100, any::<u64>().prop_map(|n| n.max(2))],
    ) {
        let newer = format!("{}/{n}", version_prefix(s.version));
        let mut v = s.value.clone();
        prop_assert!(set_path(&mut v, &["version"], Value::String(newer.clone())));
        let bytes = canonical_value_bytes(&v);
        check_rejected_with(&s, &bytes, "SCHEMA_UNSUPPORTED", 70)?;
        match (s.decode)(&bytes) {
            Err(LeaseError::SchemaUnsupported { version, supported, .. }) => {
                prop_assert_eq!(version, newer);
                prop_assert_eq!(supported, s.version);
            }
            other => prop_assert!(false, "expected SchemaUnsupported, got {:?}", other),
        }
    }

    /// Schema versions: anything that is not this kind's version string (another kind's,
    /// a malformed one, a non-string) is `RECORD_INVALID`.
    #[test]
    fn a_garbage_version_is_record_invalid(
        s in any_sample(),
        garbage in prop_oneof![
            4 => select(vec![
                "", "{p}", "{p}/", "{p}/1 ", " {p}/1", "{p}/v2", "{p}/-1", "{p}/1.0", "{p}/+2",
                "{p}/1/", "{p}/١", "{p}/2\u{0}", "Runlease/epoch/1", "runlease/epoch/1/1",
                "runlease/heartbeat/1", "runlease/retirement/1", "runlease/takeover-intent/1",
                "runlease/checkpoint/1", "runlease/run-status/1", "runlease/command/1",
                "runlease/event/1", "runlease/epoch/2x", "runlease//1", "runlease/1",
            ])
            .prop_map(|t| Value::String(t.to_owned())),
            2 => text(24).prop_map(Value::String),
            1 => select(vec![
                Value::Null,
                Value::Bool(true),
                Value::from(1),
                Value::from(2.0),
                Value::Array(vec![]),
                Value::Object(Map::new()),
            ]),
        ],
    ) {
        let garbage = match garbage {
            Value::String(t) => Value::String(t.replace("{p}", version_prefix(s.version))),
            other => other,
        };
        if let Value::String(t) = &garbage {
            if t == s.version || is_other_numeric_version(s.version, t) {
                // The real version, or a numeric sibling, is not garbage.
                return Ok(());
            }
        }
        let mut v = s.value.clone();
        prop_assert!(set_path(&mut v, &["version"], garbage));
        check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID", 65)?;
    }

    /// Generations and sequences are positive integers in plain decimal: 0, negatives,
    /// fractions, quoted numbers, `1.0`, exponents and values above u64 are `RECORD_INVALID`.
    #[test]
    fn generations_and_sequences_must_be_positive_canonical_integers(
        s in any_sample(),
        at in any::<Index>(),
        raw in select(vec![
            "0", "-1", "-0", "1.5", "1.0", "1e0", "\"1\"", "18446744073709551616",
            "99999999999999999999999", "null", "true", "[1]", "{}",
        ]),
    ) {
        let path = s.positive[at.index(s.positive.len())];
        if let Some(bytes) = with_raw(&s.value, path, raw) {
            check_rejected_with(&s, &bytes, "RECORD_INVALID", 65)?;
        }
    }

    /// Counters, pids and policy values are unsigned integers in plain decimal: negatives,
    /// fractions, quoted numbers, `-0`, leading zeros and out-of-range values are
    /// `RECORD_INVALID`.
    #[test]
    fn unsigned_fields_must_be_canonical_in_range_integers(
        s in any_sample(),
        at in any::<Index>(),
        raw in select(vec![
            "-1", "-0", "1.5", "2.0", "1e2", "\"1\"", "18446744073709551616", "01", "true",
            "[]",
        ]),
        pid_raw in select(vec!["0", "4294967296", "-1", "1.0", "\"7\""]),
    ) {
        let all: Vec<(&[&str], &str)> = s
            .u64s
            .iter()
            .map(|p| (*p, raw))
            .chain(s.u32s.iter().map(|p| (*p, pid_raw)))
            .collect();
        if all.is_empty() {
            // Events have no unsigned fields besides their sequence and generation.
            return Ok(());
        }
        let (path, raw) = all[at.index(all.len())];
        if let Some(bytes) = with_raw(&s.value, path, raw) {
            check_rejected_with(&s, &bytes, "RECORD_INVALID", 65)?;
        }
    }

    /// Timestamps have exactly one text form, `YYYY-MM-DDTHH:MM:SS.mmmZ` in UTC: other
    /// RFC 3339 forms, impossible dates and non-strings are `RECORD_INVALID`.
    #[test]
    fn timestamps_must_be_canonical_utc_millis(
        s in any_sample(),
        at in any::<Index>(),
        bad in select(vec![
            "2026-12-02T15:50:42Z",
            "2026-12-02T15:50:42.123+00:00",
            "2026-02-30T00:00:00.000Z",
            "2026-12-02T15:50:42.12Z",
            "2026-12-02T15:50:42.1234Z",
            "2026-12-02t15:50:42.123z",
            "2026-12-02 15:50:42.123Z",
            "2026-12-02T24:00:00.000Z",
            "2026-12-02T23:60:00.000Z",
            "2026-12-02T23:59:60.000Z",
            "2026-13-02T00:00:00.000Z",
            "2026-00-02T00:00:00.000Z",
            "2026-12-00T00:00:00.000Z",
            "2100-02-29T00:00:00.000Z",
            "1969-12-31T23:59:59.999Z",
            "+2026-12-02T15:50:42.123Z",
            " 2026-12-02T15:50:42.123Z",
            "2026-12-02T15:50:42.123Z ",
            "２026-12-02T15:50:42.123Z",
            "",
        ]),
        non_string in prop_oneof![
            Just(Value::from(0)),
            Just(Value::from(1_796_169_600_000u64)),
            Just(Value::Bool(false)),
        ],
        use_non_string in any::<bool>(),
    ) {
        let path = s.timestamps[at.index(s.timestamps.len())];
        let mut v = s.value.clone();
        let new = if use_non_string { non_string } else { Value::String(bad.into()) };
        prop_assert!(set_path(&mut v, path, new));
        check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID", 65)?;
    }

    /// Run ids can never name a path: `../x`, `a/b`, hidden names and anything outside
    /// `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$` in a record is `RECORD_INVALID`.
    #[test]
    fn run_ids_that_could_name_a_path_are_rejected(
        s in any_sample(),
        bad in prop_oneof![
            select(vec![
                "../x", "a/b", "", ".", "..", ".hidden", "-a", "_a", "a b", "é", "a\\b", "a\0",
                "/abs", "a/../b", "run-1/", " run", "run\n",
            ])
            .prop_map(String::from),
            Just("a".repeat(129)),
            text(12).prop_filter("a valid run id", |t| RunId::new(t.clone()).is_err()),
        ],
    ) {
        let mut v = s.value.clone();
        prop_assert!(set_path(&mut v, &["run_id"], Value::String(bad)));
        check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID", 65)?;
    }

    /// Identities are non-empty, trimmed, free of control characters and at most 256 bytes:
    /// anything else in any identity field is `RECORD_INVALID`.
    #[test]
    fn identities_must_be_trimmed_non_empty_and_printable(
        s in any_sample(),
        at in any::<Index>(),
        bad in prop_oneof![
            select(vec![
                " padded", "", "padded ", "\tx", "x\n", "a\nb", "a\u{7f}b", "a\u{85}b",
                "\u{3000}x", "x\u{a0}", " ", "a\u{0}b",
            ])
            .prop_map(Value::from),
            Just(Value::from("x".repeat(257))),
            Just(Value::from("é".repeat(129))),
            Just(Value::Null),
            Just(Value::from(7)),
        ],
    ) {
        let path = s.identities[at.index(s.identities.len())];
        let mut v = s.value.clone();
        if set_path(&mut v, path, bad) {
            check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID", 65)?;
        }
    }

    /// Strict decoding: any schema field replaced by arbitrary JSON is rejected
    /// (`RECORD_INVALID`/`SCHEMA_UNSUPPORTED`) unless the result is another canonical record.
    #[test]
    fn any_field_replaced_by_arbitrary_json_is_rejected_unless_canonical(
        s in any_sample(),
        at in any::<Index>(),
        new in json(),
    ) {
        let fields = schema_fields(&s.value);
        let path = &fields[at.index(fields.len())];
        let path: Vec<&str> = path.iter().map(String::as_str).collect();
        let mut v = s.value.clone();
        prop_assert!(set_path(&mut v, &path, new));
        check_rejected_or_canonical(s.decode, &canonical_value_bytes(&v))?;
    }
}

// ---------------------------------------------------------------------------------------
// Encode writes only what decode reads: fixed inputs at the edges of the encoding
// ---------------------------------------------------------------------------------------

fn first_event(payload: Value) -> Event {
    Event {
        run_id: RunId::new("r").unwrap_or_else(|e| panic!("{e}")),
        sequence: Sequence::FIRST,
        generation: Generation::FIRST,
        owner_id: Identity::new("a").unwrap_or_else(|e| panic!("{e}")),
        event_type: Identity::new("t").unwrap_or_else(|e| panic!("{e}")),
        payload,
        timestamp: Timestamp::EPOCH,
        prev_hash: None,
    }
}

/// `encode` must refuse what `decode` would refuse: an event it writes is read back.
fn assert_encoded_event_decodes(event: &Event, what: &str) {
    if let Ok(bytes) = encode(event) {
        match decode::<Event>(&bytes) {
            Ok(back) => assert_eq!(&back, event, "{what}"),
            Err(e) => panic!("{what}: encode wrote an event that decode rejects: {e}"),
        }
    }
}

/// Canonical encoding of event payloads: a finite float that `encode` writes (shortest
/// round-trip form) must decode to the same float, or the event log is unreadable.
#[test]
fn canonical_encoding_round_trips_event_payload_floats() {
    for f in [
        985.6906946328695,
        -1.1320798696636883e-56,
        0.1,
        1e300,
        5e-324,
    ] {
        let number = Number::from_f64(f).unwrap_or_else(|| panic!("{f} is finite"));
        assert_encoded_event_decodes(&first_event(Value::Number(number)), &format!("{f:e}"));
    }
}

/// Record size limit: `encode` must not write a record larger than `decode` accepts
/// (`MAX_RECORD_BYTES`).
#[test]
fn encode_refuses_records_larger_than_decode_accepts() {
    let limit = lease_core::canonical::MAX_RECORD_BYTES;
    let event = first_event(Value::String("x".repeat(limit)));
    assert_encoded_event_decodes(&event, "a payload of MAX_RECORD_BYTES bytes");
}

/// Payload nesting: `encode` must not write a payload nested deeper than `decode` parses.
#[test]
fn encode_refuses_payloads_nested_deeper_than_decode_accepts() {
    let mut payload = Value::Null;
    for _ in 0..200 {
        payload = Value::Array(vec![payload]);
    }
    assert_encoded_event_decodes(&first_event(payload), "a payload nested 200 deep");
}

// ---------------------------------------------------------------------------------------
// 4: arbitrary bytes, every decoder
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(256))]

    /// Strict decoding of untrusted files: arbitrary bytes never panic any decoder, and are
    /// accepted only if they are exactly canonical.
    #[test]
    fn arbitrary_bytes_never_panic_and_decode_only_if_canonical(
        bytes in vec(any::<u8>(), 0..512),
    ) {
        for (_, decode) in DECODERS {
            check_rejected_or_canonical(decode, &bytes)?;
        }
    }

    /// Same, for inputs that are JSON objects ending in LF (so decoding reaches the version
    /// check and the field decoders), with and without each kind's version.
    #[test]
    fn arbitrary_json_objects_never_panic_and_decode_only_if_canonical(
        fields in btree_map(
            prop_oneof![
                select(vec![
                    "run_id", "generation", "sequence", "version", "owner_id", "prev_hash",
                    "payload", "type", "timestamp", "holder", "policy", "count",
                ])
                .prop_map(String::from),
                text(8),
            ],
            json(),
            0..8,
        ),
        with_version in any::<bool>(),
    ) {
        for (kind, decode) in DECODERS {
            let mut map: Map<String, Value> = fields.clone().into_iter().collect();
            if with_version {
                map.insert("version".into(), Value::String(format!("runlease/{kind}/1")));
            }
            check_rejected_or_canonical(decode, &canonical_value_bytes(&Value::Object(map)))?;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Timestamps
// ---------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(cases(256))]

    /// Timestamps have one 24-byte text form that parses back to the same instant.
    #[test]
    fn every_timestamp_has_one_canonical_text_form(t in timestamp()) {
        let text = t.to_string();
        prop_assert_eq!(text.len(), 24);
        prop_assert_eq!(Timestamp::parse(&text), Ok(t));
    }

    /// Parsing accepts only text that formatting would produce.
    #[test]
    fn timestamp_parsing_accepts_only_the_canonical_form(
        text in prop_oneof![
            proptest::string::string_regex(
                "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z"
            ).unwrap_or_else(|e| panic!("bad regex: {e}")),
            proptest::string::string_regex(
                "(19[7-9][0-9]|20[0-9]{2}|9999)-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\\.[0-9]{3}Z"
            ).unwrap_or_else(|e| panic!("bad regex: {e}")),
            text(30),
        ],
    ) {
        if let Ok(t) = Timestamp::parse(&text) {
            prop_assert_eq!(t.to_string(), text);
        }
    }
}

// ---------------------------------------------------------------------------------------
// 5: layout
// ---------------------------------------------------------------------------------------

fn file_ref() -> impl Strategy<Value = FileRef> {
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

fn entry_name() -> impl Strategy<Value = String> {
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

proptest! {
    #![proptest_config(cases(256))]

    /// Layout: a directory entry is accepted only if it is exactly the name the layout would
    /// write for the parsed file, so no name read from disk can escape its folder.
    #[test]
    fn layout_accepts_only_names_it_would_write(name in entry_name()) {
        for dir in Dir::ALL {
            if let Some(f) = dir.parse_name(&name) {
                prop_assert_eq!(f.file_name(), name.clone());
                prop_assert_eq!(f.dir(), Some(dir));
                prop_assert!(!name.contains('/') && !name.contains('\\'), "{:?}", name);
                prop_assert!(!name.starts_with('.'), "{:?}", name);
                prop_assert!(name.is_ascii(), "{:?}", name);
                prop_assert_eq!(f.path(), format!("{}/{}", dir.path(), name));
            }
        }
    }

    /// Layout: every file the protocol names is recognised in its own folder.
    #[test]
    fn layout_names_of_every_file_parse_back(f in file_ref()) {
        let dir = f.dir().ok_or_else(|| TestCaseError::fail("no folder"))?;
        prop_assert_eq!(dir.parse_name(&f.file_name()), Some(f));
    }
}

/// The heartbeat's `store_head` has one form per value: absent for `None` (so beats written
/// before the field existed decode byte for byte), a plain integer for `Some`; an explicit
/// `null` is not canonical and is rejected.
#[test]
fn heartbeat_store_head_is_absent_when_empty_and_never_null() {
    let old_beat = b"{\"count\":3,\"generation\":2,\"heartbeat_at\":\"2026-12-02T00:00:00.000Z\",\"owner_id\":\"o\",\"run_id\":\"r\",\"version\":\"runlease/heartbeat/1\"}\n";
    let rec: HeartbeatRecord = decode(old_beat).unwrap();
    assert_eq!(rec.store_head, None);
    assert_eq!(encode(&rec).unwrap(), old_beat.to_vec());

    let with = HeartbeatRecord {
        store_head: Some(17),
        ..rec.clone()
    };
    let bytes = encode(&with).unwrap();
    assert!(
        String::from_utf8(bytes.clone())
            .unwrap()
            .contains("\"store_head\":17,")
    );
    assert_eq!(decode::<HeartbeatRecord>(&bytes).unwrap(), with);

    let null = "{\"count\":3,\"generation\":2,\"heartbeat_at\":\"2026-12-02T00:00:00.000Z\",\"owner_id\":\"o\",\"run_id\":\"r\",\"store_head\":null,\"version\":\"runlease/heartbeat/1\"}\n";
    assert!(null.contains("\"store_head\":null"), "{null}");
    let e = decode::<HeartbeatRecord>(null.as_bytes()).unwrap_err();
    assert_eq!((e.code().as_str(), e.exit_code()), ("RECORD_INVALID", 65));
}

// Strict parsing of payload text (issue #15): duplicate keys and numbers that cannot be
// kept exactly are refused; everything serde_json itself writes parses back unchanged.
proptest! {
    #[test]
    fn strict_json_parses_back_what_serde_json_writes(v in json()) {
        let text = serde_json::to_string(&v).unwrap();
        match lease_core::canonical::parse_json_strict(&text) {
            Ok(back) => prop_assert_eq!(back, v),
            // Only integral floats at or past 2^53 may be refused (they may be rounded).
            Err(e) => prop_assert!(e.contains("cannot be kept exactly"), "{e}: {text}"),
        }
    }
}

#[test]
fn strict_json_refuses_duplicate_keys_and_inexact_numbers() {
    use lease_core::canonical::parse_json_strict as p;
    for bad in [
        r#"{"a":1,"a":1}"#,
        r#"{"x":{"k":[1,{"d":0,"d":1}]}}"#,
        "18446744073709551616",
        "-9223372036854775809",
        "1e300",
        "9007199254740992.0",
        "[1] [2]",
    ] {
        assert!(p(bad).is_err(), "{bad} was accepted");
    }
    for good in [
        "null",
        r#"{"a":1,"b":{"a":2}}"#,
        "18446744073709551615",
        "-9223372036854775808",
        "9007199254740991",
        "0.1",
        "1.5e10",
    ] {
        assert!(p(good).is_ok(), "{good} was refused");
    }
    assert_eq!(
        p("18446744073709551615").unwrap(),
        serde_json::json!(18_446_744_073_709_551_615u64)
    );
}

/// A command record without an incarnation digest (written before issue #15) has no
/// `incarnation` key at all; `"incarnation":null` is not canonical; a record's `pgid` must
/// be its `pid`.
#[test]
fn command_incarnation_is_absent_when_empty_and_never_null() {
    let rec = CommandRecord {
        run_id: RunId::new("r").unwrap(),
        generation: Generation::new(1).unwrap(),
        pid: 42,
        pgid: 42,
        start_time: 7,
        boot_id: Identity::new("b").unwrap(),
        argv: vec!["x".into()],
        started_at: Timestamp::from_unix_millis(0).unwrap(),
        incarnation: None,
    };
    let bytes = encode(&rec).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(!text.contains("incarnation"), "{text}");
    assert_eq!(decode::<CommandRecord>(&bytes).unwrap(), rec);
    let null = text.replacen("\"pgid\"", "\"incarnation\":null,\"pgid\"", 1);
    assert!(decode::<CommandRecord>(null.as_bytes()).is_err(), "{null}");
    let other_group = text.replacen("\"pgid\":42", "\"pgid\":43", 1);
    let e = decode::<CommandRecord>(other_group.as_bytes()).unwrap_err();
    assert!(e.to_string().contains("own process group"), "{e}");
    let with = CommandRecord {
        incarnation: Some(CommandRecord::incarnation_digest(
            &rec.run_id,
            rec.generation,
            "s",
        )),
        ..rec.clone()
    };
    assert_eq!(
        decode::<CommandRecord>(&encode(&with).unwrap()).unwrap(),
        with
    );
    // The digest is bound to the run and the generation.
    assert_ne!(
        CommandRecord::incarnation_digest(&rec.run_id, rec.generation, "s"),
        CommandRecord::incarnation_digest(&RunId::new("q").unwrap(), rec.generation, "s")
    );
    assert_ne!(
        CommandRecord::incarnation_digest(&rec.run_id, rec.generation, "s"),
        CommandRecord::incarnation_digest(&rec.run_id, Generation::new(2).unwrap(), "s")
    );
}
