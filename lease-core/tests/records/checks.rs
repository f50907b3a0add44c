//! Checks shared by the property tests: canonical JSON shape, round trips, and the
//! rejection contract for untrusted bytes.

use crate::samples::{DecodeFn, Sample, Subject, must_encode};
use lease_core::*;
use proptest::prelude::*;
use serde_json::Value;

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

pub(crate) fn check_round_trip<R: Subject>(record: &R) -> Result<(), TestCaseError> {
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
pub(crate) fn check_rejected_or_canonical(
    decode: DecodeFn,
    bytes: &[u8],
) -> Result<(), TestCaseError> {
    match decode(bytes) {
        Ok(again) => prop_assert_eq!(
            again.as_slice(),
            bytes,
            "decoded a non-canonical input {:?}",
            String::from_utf8_lossy(bytes)
        ),
        Err(e) => prop_assert!(
            matches!(e.code().as_str(), "RECORD_INVALID" | "SCHEMA_UNSUPPORTED"),
            "unexpected error {} for {:?}",
            e,
            String::from_utf8_lossy(bytes)
        ),
    }
    Ok(())
}

pub(crate) fn check_rejected_with(
    sample: &Sample,
    bytes: &[u8],
    code: &str,
) -> Result<(), TestCaseError> {
    match (sample.decode)(bytes) {
        Ok(_) => prop_assert!(
            false,
            "{} accepted {:?}",
            sample.version,
            String::from_utf8_lossy(bytes)
        ),
        Err(e) => prop_assert_eq!(
            e.code().as_str(),
            code,
            "{} gave {} for {:?}",
            sample.version,
            e,
            String::from_utf8_lossy(bytes)
        ),
    }
    Ok(())
}

/// `encode` must refuse what `decode` would refuse: an event it writes is read back.
pub(crate) fn assert_encoded_event_decodes(event: &Event, what: &str) {
    if let Ok(bytes) = encode(event) {
        match decode::<Event>(&bytes) {
            Ok(back) => assert_eq!(&back, event, "{what}"),
            Err(e) => panic!("{what}: encode wrote an event that decode rejects: {e}"),
        }
    }
}
