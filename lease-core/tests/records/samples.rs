//! The record kinds under test (`Subject`), type-erased samples of them, every decoder, and
//! fixed records for the encoding-edge tests.

use crate::record_strategies::{
    checkpoint, command_record, epoch_record, event, heartbeat_record, retirement_record,
    run_status, takeover_intent,
};
use lease_core::*;
use proptest::prelude::*;
use serde_json::Value;
use std::fmt;

// ---------------------------------------------------------------------------------------
// Record kinds under test, with the paths of their typed fields
// ---------------------------------------------------------------------------------------

/// Paths (object keys from the top) of fields of one type in a record's JSON.
pub(crate) type Paths = &'static [&'static [&'static str]];

pub(crate) trait Subject: Record + Clone + fmt::Debug + PartialEq + 'static {
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
    /// Identity fields that must also be words (`Identity::check_word`: owner ids, hosts).
    const WORDS: Paths = &[];
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
    const WORDS: Paths = &[&["owner_id"], &["holder", "host"], &["retired", "owner_id"]];
}

impl Subject for HeartbeatRecord {
    fn strategy() -> BoxedStrategy<Self> {
        heartbeat_record().boxed()
    }
    const POSITIVE: Paths = &[&["generation"]];
    const U64: Paths = &[&["count"], &["store_head"], &["mono", "ns"]];
    const U32: Paths = &[];
    const TIMESTAMPS: Paths = &[&["heartbeat_at"]];
    const IDENTITIES: Paths = &[&["owner_id"], &["mono", "clock"]];
    const WORDS: Paths = &[&["owner_id"]];
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
    const WORDS: Paths = &[&["owner_id"]];
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
    const WORDS: Paths = &[
        &["expected_owner_id"],
        &["taker_owner_id"],
        &["taker_holder", "host"],
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
    const WORDS: Paths = &[&["holder", "host"]];
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
    const WORDS: Paths = &[&["owner_id"]];
}

/// One valid record of any kind, type-erased: its canonical bytes, its JSON, and a decoder
/// that re-encodes what it decodes.
#[derive(Clone)]
pub(crate) struct Sample {
    pub(crate) version: &'static str,
    pub(crate) bytes: Vec<u8>,
    pub(crate) value: Value,
    pub(crate) decode: DecodeFn,
    pub(crate) positive: Paths,
    pub(crate) u64s: Paths,
    pub(crate) u32s: Paths,
    pub(crate) timestamps: Paths,
    pub(crate) identities: Paths,
    pub(crate) words: Paths,
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

pub(crate) fn decode_then_encode<R: Record>(bytes: &[u8]) -> Result<Vec<u8>, LeaseError> {
    encode(&decode::<R>(bytes)?)
}

pub(crate) fn must_encode<R: Record + fmt::Debug>(record: &R) -> Vec<u8> {
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
        words: R::WORDS,
    }
}

pub(crate) fn any_sample() -> impl Strategy<Value = Sample> {
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
pub(crate) type DecodeFn = fn(&[u8]) -> Result<Vec<u8>, LeaseError>;
pub(crate) const DECODERS: [(&str, DecodeFn); 8] = [
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
// Fixed records for the encoding-edge tests
// ---------------------------------------------------------------------------------------

pub(crate) fn first_event(payload: Value) -> Event {
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
