//! Structured rejections, every record kind: unknown and missing fields, versions, and each
//! field type's non-canonical forms are `RECORD_INVALID` or `SCHEMA_UNSUPPORTED`.

use crate::cases;
use crate::checks::{check_rejected_or_canonical, check_rejected_with};
use crate::json_paths::{
    is_other_numeric_version, object_at_mut, schema_fields, schema_objects, set_path,
    version_prefix, with_raw,
};
use crate::samples::any_sample;
use crate::strategies::{json, text};
use lease_core::canonical::canonical_value_bytes;
use lease_core::*;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use serde_json::{Map, Value};

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
