//! Encode writes only what decode reads: fixed inputs at the edges of the encoding (payload
//! floats, the record size limit, payload nesting).

use crate::checks::assert_encoded_event_decodes;
use crate::samples::first_event;
use serde_json::{Number, Value};

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
