//! Property tests of the record clauses of the protocol: one canonical byte form per record,
//! strict decoding that rejects (never panics on) anything else, and file names that cannot
//! escape their folder. Names say which clause they check.
//!
//! Case counts are small by default (the whole file runs in seconds in debug mode); set
//! `RUNLEASE_DEEP=1` (`cargo xtask test --deep`) for 100x as many.

mod checks;
mod json_paths;
mod mutations;
mod record_strategies;
mod samples;
mod strategies;

use checks::{
    assert_encoded_event_decodes, check_rejected_or_canonical, check_rejected_with,
    check_round_trip,
};
use json_paths::{
    is_other_numeric_version, object_at_mut, schema_fields, schema_objects, set_path,
    version_prefix, with_raw,
};
use lease_core::canonical::canonical_value_bytes;
use lease_core::*;
use mutations::{check_mutations, mutation};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::FileFailurePersistence;
use record_strategies::{entry_name, file_ref};
use samples::{DECODERS, Subject, any_sample, first_event};
use serde_json::{Map, Number, Value};
use strategies::{json, text, timestamp};

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
        check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID")?;
    }

    /// Every field is required (optional ones are written as `null`): removing any one field,
    /// `version` included, is `RECORD_INVALID`. The exceptions are the heartbeat's
    /// `store_head`, the command record's `incarnation`, the epoch's `cutoff_hash` and
    /// `retired.observed` and the checkpoint's `through_hash` and `unjudged_from`, omitted when empty (PROTOCOL.md §4); their forms are checked by `heartbeat_store_head_is_absent_when_empty_and_never_null`
    /// and `command_incarnation_is_absent_when_empty_and_never_null`.
    #[test]
    fn missing_fields_are_rejected_in_every_record(s in any_sample(), at in any::<Index>()) {
        let fields: Vec<Vec<String>> = schema_fields(&s.value)
            .into_iter()
            .filter(|p| !(s.version == HeartbeatRecord::VERSION && p == &["store_head"]))
            // And (issue #17) the heartbeat's `mono` stamp (its own fields are required).
            .filter(|p| !(s.version == HeartbeatRecord::VERSION && p == &["mono"]))
            // Also optional, omitted when absent (records from before issue #15).
            .filter(|p| !(s.version == CommandRecord::VERSION && p == &["incarnation"]))
            // And (issue #29) the command record's `cgroup` (its own fields are required).
            .filter(|p| !(s.version == CommandRecord::VERSION && p == &["cgroup"]))
            // And (issue #29) its `mark` (its own fields are required).
            .filter(|p| !(s.version == CommandRecord::VERSION && p == &["mark"]))
            // And (issue #17) the epoch's `cutoff_hash` and the checkpoint's `through_hash`.
            .filter(|p| !(s.version == EpochRecord::VERSION && p == &["cutoff_hash"]))
            .filter(|p| !(s.version == Checkpoint::VERSION && p == &["through_hash"]))
            // And (issue #30) the checkpoint's `unjudged_from`.
            .filter(|p| !(s.version == Checkpoint::VERSION && p == &["unjudged_from"]))
            // And (issue #19) the epoch's `retired.observed` (its own fields are required).
            .filter(|p| !(s.version == EpochRecord::VERSION && p == &["retired", "observed"]))
            .collect();
        let path = &fields[at.index(fields.len())];
        let mut v = s.value.clone();
        let (last, parent) = path.split_last().ok_or_else(|| TestCaseError::fail("empty path"))?;
        let map = object_at_mut(&mut v, parent).ok_or_else(|| TestCaseError::fail("no object"))?;
        prop_assert!(map.remove(last).is_some());
        check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID")?;
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
        check_rejected_with(&s, &bytes, "SCHEMA_UNSUPPORTED")?;
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
        check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID")?;
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
            check_rejected_with(&s, &bytes, "RECORD_INVALID")?;
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
            check_rejected_with(&s, &bytes, "RECORD_INVALID")?;
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
        check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID")?;
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
        check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID")?;
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
            check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID")?;
        }
    }

    /// Owner ids and host names are words (`Identity::check_word`, issue #28): a valid
    /// identity that is not one (shell metacharacters, a leading `-`, spaces, non-ASCII,
    /// bidi controls, over 128 bytes) is `RECORD_INVALID`, so it never reaches a next step.
    #[test]
    fn owner_ids_and_hosts_must_be_words(
        s in any_sample().prop_filter("has word fields", |s| !s.words.is_empty()),
        at in any::<Index>(),
        bad in select(vec![
            "$(touch PWNED)", "a;b", "`id`", "it's", "a\"b", "-rf", "--expect-owner", "a b",
            ".x", "_x", "a/b", "é", "a\u{202e}b", "a|b", "a&b", "a>b", "*",
        ])
        .prop_map(String::from)
        .boxed()
        .prop_union(Just("a".repeat(129)).boxed()),
    ) {
        let path = s.words[at.index(s.words.len())];
        let mut v = s.value.clone();
        if set_path(&mut v, path, Value::from(bad)) {
            check_rejected_with(&s, &canonical_value_bytes(&v), "RECORD_INVALID")?;
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
    assert_eq!(e.code().as_str(), "RECORD_INVALID");
}

/// The heartbeat's `mono` stamp (issue #17, the same-clock rule) is absent when empty, like
/// `store_head`: beats written before it existed keep their bytes, `null` is not canonical,
/// and a stamp is an object with exactly a clock name and a reading.
#[test]
fn heartbeat_mono_is_absent_when_empty_and_never_null() {
    let old_beat = b"{\"count\":3,\"generation\":2,\"heartbeat_at\":\"2026-12-02T00:00:00.000Z\",\"owner_id\":\"o\",\"run_id\":\"r\",\"version\":\"runlease/heartbeat/1\"}\n";
    let rec: HeartbeatRecord = decode(old_beat).unwrap();
    assert_eq!(rec.mono, None);
    assert_eq!(encode(&rec).unwrap(), old_beat.to_vec());
    let with = HeartbeatRecord {
        mono: Some(MonoStamp {
            clock: Identity::new("b/time:[1]").unwrap(),
            ns: 5_000_000_123,
        }),
        ..rec.clone()
    };
    let bytes = encode(&with).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(
        text.contains("\"mono\":{\"clock\":\"b/time:[1]\",\"ns\":5000000123},"),
        "{text}"
    );
    assert_eq!(decode::<HeartbeatRecord>(&bytes).unwrap(), with);
    for bad in [
        "\"mono\":null,",
        "\"mono\":{\"clock\":\"b\"},",
        "\"mono\":{\"clock\":\"b\",\"ns\":1,\"x\":2},",
        "\"mono\":{\"clock\":\"\",\"ns\":1},",
    ] {
        let forged = String::from_utf8(old_beat.to_vec())
            .unwrap()
            .replace("\"owner_id\"", &format!("{bad}\"owner_id\""));
        let e = decode::<HeartbeatRecord>(forged.as_bytes()).unwrap_err();
        assert_eq!(e.code().as_str(), "RECORD_INVALID", "{forged}");
    }
}

/// A stamp ages only on the clock it names, and never from the future.
#[test]
fn a_mono_stamp_ages_only_on_its_own_clock() {
    let clock = Identity::new("boot-a/time:[1]").unwrap();
    let other = Identity::new("boot-a/time:[2]").unwrap();
    let m = MonoStamp {
        clock: clock.clone(),
        ns: 10_000_000_000,
    };
    assert_eq!(m.age_ms_on(Some(&clock), 12_500_999_999), Some(2_500));
    assert_eq!(m.age_ms_on(Some(&clock), 10_000_000_000), Some(0));
    // Another time namespace of the same boot, no clock, a reading before the stamp.
    assert_eq!(m.age_ms_on(Some(&other), 12_500_000_000), None);
    assert_eq!(m.age_ms_on(None, 12_500_000_000), None);
    assert_eq!(m.age_ms_on(Some(&clock), 9_999_999_999), None);
}

/// The epoch's `retired.observed` (issue #19: what a takeover or retirement judged, once a
/// separate intent file) is absent when empty, so older epochs keep their bytes; `null` is
/// not canonical; and it must match the reason: never on a release, `operator`/`automatic`
/// with a watch on a takeover, `retire_dead` without one on a retirement.
#[test]
fn retired_observed_is_absent_when_empty_and_matches_its_reason() {
    let old = "{\"claimed_at\":\"2026-12-02T00:00:00.000Z\",\"generation\":3,\"holder\":{\"boot_id\":\"b\",\"host\":\"h\",\"pid\":7,\"start_time\":9},\"owner_id\":\"t\",\"policy\":{\"heartbeat_durability\":\"local\",\"heartbeat_ms\":5000,\"self_fence_after_ms\":15000,\"stale_after_ms\":20000},\"prev_hash\":\"HASH\",\"retired\":{\"generation\":2,\"owner_id\":\"o\",\"reason\":\"taken_over\"},\"run_id\":\"r\",\"seal\":null,\"state\":\"active\",\"store_floor\":null,\"version\":\"runlease/epoch/1\"}\n"
        .replace("HASH", &"b".repeat(64));
    let epoch: EpochRecord = decode(old.as_bytes()).unwrap();
    assert_eq!(epoch.retired.as_ref().unwrap().observed, None);
    assert_eq!(encode(&epoch).unwrap(), old.as_bytes().to_vec());
    let observed = |mode, watched_ms| Observation {
        heartbeat_at: epoch.claimed_at,
        heartbeat_count: 4,
        watched_ms,
        mode,
    };
    let with = |reason, state, o: Observation| {
        let mut e = epoch.clone();
        e.state = state;
        let r = e.retired.as_mut().unwrap();
        r.reason = reason;
        if reason == RetireReason::Released {
            r.owner_id = e.owner_id.clone();
        }
        r.observed = Some(o);
        e
    };
    let taken = with(
        RetireReason::TakenOver,
        EpochState::Active,
        observed(TakeoverMode::Automatic, Some(21_000)),
    );
    let text = String::from_utf8(encode(&taken).unwrap()).unwrap();
    assert!(text.contains("\"observed\":{"), "{text}");
    assert_eq!(decode::<EpochRecord>(text.as_bytes()).unwrap(), taken);
    let dead = with(
        RetireReason::Dead,
        EpochState::Retired,
        observed(TakeoverMode::RetireDead, None),
    );
    assert_eq!(
        decode::<EpochRecord>(&encode(&dead).unwrap()).unwrap(),
        dead
    );
    let null = old.replace(
        "\"reason\":\"taken_over\"",
        "\"observed\":null,\"reason\":\"taken_over\"",
    );
    assert_eq!(
        decode::<EpochRecord>(null.as_bytes())
            .unwrap_err()
            .code()
            .as_str(),
        "RECORD_INVALID"
    );
    for (why, bad) in [
        (
            "a release observed nothing",
            with(
                RetireReason::Released,
                EpochState::Released,
                observed(TakeoverMode::Operator, Some(21_000)),
            ),
        ),
        (
            "a takeover without a watch",
            with(
                RetireReason::TakenOver,
                EpochState::Active,
                observed(TakeoverMode::Operator, None),
            ),
        ),
        (
            "a takeover in retire_dead mode",
            with(
                RetireReason::TakenOver,
                EpochState::Active,
                observed(TakeoverMode::RetireDead, Some(21_000)),
            ),
        ),
        (
            "a retirement with a watch",
            with(
                RetireReason::Dead,
                EpochState::Retired,
                observed(TakeoverMode::RetireDead, Some(1)),
            ),
        ),
        (
            "a retirement in operator mode",
            with(
                RetireReason::Dead,
                EpochState::Retired,
                observed(TakeoverMode::Operator, None),
            ),
        ),
    ] {
        assert_eq!(
            encode(&bad).unwrap_err().code().as_str(),
            "RECORD_INVALID",
            "{why}"
        );
    }
}

/// The epoch's `cutoff_hash` and the checkpoint's `through_hash` (issue #17) are absent
/// when empty, like `store_head`: records written before they existed decode byte for byte,
/// `null` is not canonical, and a `cutoff_hash` below generation 3 (no cutoff of
/// generation − 2 to bind) is refused.
#[test]
fn cutoff_hash_and_through_hash_are_absent_when_empty_and_never_null() {
    let old_cp = "{\"created_at\":\"2026-12-02T00:00:00.000Z\",\"created_by\":\"p\",\"floor_epoch_hash\":\"HASH\",\"floor_generation\":4,\"not_authoritative\":[],\"run_id\":\"r\",\"through_sequence\":2,\"version\":\"runlease/checkpoint/1\"}\n"
        .replace("HASH", &"a".repeat(64));
    let cp: Checkpoint = decode(old_cp.as_bytes()).unwrap();
    assert_eq!(cp.through_hash, None);
    assert_eq!(cp.unjudged_from, None, "absent: every event judged");
    assert_eq!(encode(&cp).unwrap(), old_cp.as_bytes().to_vec());
    let with = Checkpoint {
        through_hash: Some(cp.floor_epoch_hash.clone()),
        ..cp.clone()
    };
    let text = String::from_utf8(encode(&with).unwrap()).unwrap();
    assert!(text.contains("\"through_hash\":\""), "{text}");
    assert_eq!(decode::<Checkpoint>(text.as_bytes()).unwrap(), with);
    let null = old_cp.replace(
        "\"through_sequence\"",
        "\"through_hash\":null,\"through_sequence\"",
    );
    assert_eq!(
        decode::<Checkpoint>(null.as_bytes())
            .unwrap_err()
            .code()
            .as_str(),
        "RECORD_INVALID"
    );
    let empty_log = Checkpoint {
        through_sequence: 0,
        ..with.clone()
    };
    assert_eq!(
        encode(&empty_log).unwrap_err().code().as_str(),
        "RECORD_INVALID",
        "through_hash without an event"
    );
    // unjudged_from (issue #30): written only when set, within 1..=through_sequence.
    let pending = Checkpoint {
        unjudged_from: Some(2),
        ..cp.clone()
    };
    let text = String::from_utf8(encode(&pending).unwrap()).unwrap();
    assert!(text.contains("\"unjudged_from\":2"), "{text}");
    assert_eq!(decode::<Checkpoint>(text.as_bytes()).unwrap(), pending);
    for bad in [Some(0), Some(3)] {
        let c = Checkpoint {
            unjudged_from: bad,
            ..cp.clone()
        };
        assert_eq!(
            encode(&c).unwrap_err().code().as_str(),
            "RECORD_INVALID",
            "{bad:?}"
        );
    }

    let old_epoch = "{\"claimed_at\":\"2026-12-02T00:00:00.000Z\",\"generation\":3,\"holder\":{\"boot_id\":\"b\",\"host\":\"h\",\"pid\":7,\"start_time\":9},\"owner_id\":\"o\",\"policy\":{\"heartbeat_durability\":\"local\",\"heartbeat_ms\":5000,\"self_fence_after_ms\":15000,\"stale_after_ms\":20000},\"prev_hash\":\"HASH\",\"retired\":{\"generation\":2,\"owner_id\":\"o\",\"reason\":\"released\"},\"run_id\":\"r\",\"seal\":null,\"state\":\"released\",\"store_floor\":null,\"version\":\"runlease/epoch/1\"}\n"
        .replace("HASH", &"b".repeat(64));
    let epoch: EpochRecord = decode(old_epoch.as_bytes()).unwrap();
    assert_eq!(epoch.cutoff_hash, None);
    assert_eq!(encode(&epoch).unwrap(), old_epoch.as_bytes().to_vec());
    let bound = EpochRecord {
        cutoff_hash: Some(cp.floor_epoch_hash.clone()),
        ..epoch.clone()
    };
    let text = String::from_utf8(encode(&bound).unwrap()).unwrap();
    assert!(text.contains("\"cutoff_hash\":\""), "{text}");
    assert_eq!(decode::<EpochRecord>(text.as_bytes()).unwrap(), bound);
    let null = String::from_utf8(encode(&epoch).unwrap())
        .unwrap()
        .replace("\"generation\"", "\"cutoff_hash\":null,\"generation\"");
    assert_eq!(
        decode::<EpochRecord>(null.as_bytes())
            .unwrap_err()
            .code()
            .as_str(),
        "RECORD_INVALID"
    );
    let low = EpochRecord {
        generation: Generation::new(2).unwrap(),
        retired: Some(RetiredOwner {
            generation: Generation::FIRST,
            ..epoch.retired.clone().unwrap()
        }),
        ..bound
    };
    assert_eq!(encode(&low).unwrap_err().code().as_str(), "RECORD_INVALID");
}

// Strict parsing of payload text (issue #15): duplicate keys and numbers that cannot be
// kept exactly are refused; everything serde_json itself writes parses back unchanged.
proptest! {
    // Failures persist next to this file (`records/main.proptest-regressions`), as they did
    // next to `records.rs`: proptest's default (`SourceParallel`) would pick the shared
    // `tests/proptest-regressions/main.txt` now that the source file is a `main.rs`.
    #![proptest_config(ProptestConfig::with_failure_persistence(
        FileFailurePersistence::WithSource("proptest-regressions")
    ))]

    #[test]
    fn strict_json_parses_back_what_serde_json_writes(v in json()) {
        let text = serde_json::to_string(&v).unwrap();
        match lease_core::canonical::parse_json_strict(&text) {
            Ok(back) => prop_assert_eq!(back, v),
            // Only integral floats at or past 2^53 may be refused (they may be rounded).
            Err(e) => prop_assert!(e.reason().contains("cannot be kept exactly"), "{e}: {text}"),
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
        cgroup: None,
        mark: None,
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
    // Issue #29: the cgroup identity, absent when `None` (checked above: no `cgroup` key
    // in `text`), round-trips; `null` is not canonical; id 0 (no inode) and 1 (the root
    // cgroup) are refused.
    assert!(!text.contains("cgroup"), "{text}");
    let cg = CommandRecord {
        cgroup: Some(lease_core::CommandCgroup { id: 9, uid: 1000 }),
        ..rec.clone()
    };
    let cg_text = String::from_utf8(encode(&cg).unwrap()).unwrap();
    assert!(
        cg_text.contains("\"cgroup\":{\"id\":9,\"uid\":1000}"),
        "{cg_text}"
    );
    assert_eq!(decode::<CommandRecord>(cg_text.as_bytes()).unwrap(), cg);
    let null = text.replacen("\"pgid\"", "\"cgroup\":null,\"pgid\"", 1);
    assert!(decode::<CommandRecord>(null.as_bytes()).is_err(), "{null}");
    for bad in ["0", "1"] {
        let t = cg_text.replacen("\"id\":9", &format!("\"id\":{bad}"), 1);
        let e = decode::<CommandRecord>(t.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("cgroup.id"), "{e}");
    }
    // Issue #29: the mark, absent when `None` (no `mark` key in `text`), round-trips
    // beside a digest and only named after it; without a digest, or named otherwise, it is
    // refused; its content is bound to the run, the generation and the digest.
    assert!(!text.contains("\"mark\""), "{text}");
    let digest = CommandRecord::incarnation_digest(&rec.run_id, rec.generation, "s");
    let marked = CommandRecord {
        incarnation: Some(digest.clone()),
        mark: Some(lease_core::CommandMark {
            name: lease_core::CommandMark::name_for(&digest),
            dev: 1,
            ino: 4_294_967_295,
        }),
        ..rec.clone()
    };
    assert!(lease_core::CommandMark::name_for(&digest).starts_with("runlease-inc-"));
    assert_eq!(lease_core::CommandMark::name_for(&digest).len(), 13 + 16);
    let marked_bytes = encode(&marked).unwrap();
    assert_eq!(decode::<CommandRecord>(&marked_bytes).unwrap(), marked);
    let no_digest = CommandRecord {
        incarnation: None,
        ..marked.clone()
    };
    assert!(
        encode(&no_digest).is_err()
            || decode::<CommandRecord>(&encode(&no_digest).unwrap()).is_err()
    );
    let marked_text = String::from_utf8(marked_bytes).unwrap();
    let renamed = marked_text.replacen("runlease-inc-", "runlease-inx-", 1);
    let e = decode::<CommandRecord>(renamed.as_bytes()).unwrap_err();
    assert!(e.to_string().contains("mark.name"), "{e}");
    let null = text.replacen("\"pgid\"", "\"mark\":null,\"pgid\"", 1);
    assert!(decode::<CommandRecord>(null.as_bytes()).is_err(), "{null}");
    assert_ne!(
        lease_core::CommandMark::content(&rec.run_id, rec.generation, &digest),
        lease_core::CommandMark::content(&RunId::new("q").unwrap(), rec.generation, &digest)
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
