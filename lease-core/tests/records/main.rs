//! Property tests of the record clauses of the protocol: one canonical byte form per record,
//! strict decoding that rejects (never panics on) anything else, and file names that cannot
//! escape their folder. Names say which clause they check.
//!
//! Case counts are small by default (the whole file runs in seconds in debug mode); set
//! `RUNLEASE_DEEP=1` (`cargo xtask test --deep`) for 100x as many.

mod arbitrary;
mod checks;
mod encode_edges;
mod json_paths;
mod layout;
mod mutations;
mod optional_fields;
mod record_strategies;
mod rejections;
mod samples;
mod strategies;
mod timestamps;

use checks::check_round_trip;
use lease_core::*;
use mutations::{check_mutations, mutation};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use samples::Subject;
use strategies::json;

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
