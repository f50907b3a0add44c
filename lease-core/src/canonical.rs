//! Canonical encoding: exactly one byte form per record.
//!
//! JSON, object keys sorted by their UTF-8 bytes, no whitespace, integers in plain decimal,
//! strings escaped as `serde_json` escapes them, one trailing LF. The writer is our own (not
//! `serde_json::to_vec` of a map) so that no cargo feature unification (`preserve_order`) can
//! ever change the bytes. Decoding is strict: the input must be exactly what [`encode`] would
//! produce for the decoded value, so whitespace, unsorted or duplicate keys, `17.0` for an
//! integer and unknown fields are all rejected.

use crate::error::{LeaseError, RecordKind};
use crate::ids::Digest;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Largest record accepted, in bytes. Larger files are rejected before parsing.
pub const MAX_RECORD_BYTES: usize = 1 << 20;

/// A durable record: it has a kind, a stable version string and its own validation.
pub trait Record: Serialize + DeserializeOwned {
    /// Which record this is.
    const KIND: RecordKind;
    /// The version string stored in the `version` field, e.g. `runlease/epoch/1`.
    const VERSION: &'static str;
    /// Cross-field validation beyond what the field types check.
    fn validate(&self) -> Result<(), String>;
    /// The run id the record claims to belong to, if it carries one.
    fn run_id(&self) -> Option<&crate::RunId>;
}

/// `open`, then each of `items` written by `write` with a `,` between them, then `close`:
/// an array's or an object's body, without white space.
fn write_list<T>(
    out: &mut Vec<u8>,
    open: u8,
    items: impl IntoIterator<Item = T>,
    close: u8,
    mut write: impl FnMut(T, &mut Vec<u8>),
) {
    out.push(open);
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write(item, out);
    }
    out.push(close);
}

/// Write `v` canonically into `out` (no trailing LF).
pub fn write_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Value::String(s) => write_str(s, out),
        Value::Array(items) => write_list(out, b'[', items, b']', write_value),
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            write_list(out, b'{', keys, b'}', |k, out| {
                write_str(k, out);
                out.push(b':');
                write_value(&map[k], out);
            });
        }
    }
}

fn write_str(s: &str, out: &mut Vec<u8>) {
    // serde_json's string escaping is fixed by the JSON spec plus its own choices
    // (\b \f \n \r \t, other controls as \u00xx lowercase); it cannot fail for a str.
    let encoded = serde_json::to_string(s).unwrap_or_default();
    out.extend_from_slice(encoded.as_bytes());
}

/// Canonical bytes of any JSON value, with the trailing LF.
pub fn canonical_value_bytes(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_value(v, &mut out);
    out.push(b'\n');
    out
}

fn invalid(kind: RecordKind, detail: impl Into<String>) -> LeaseError {
    LeaseError::RecordInvalid {
        run: "?".into(),
        kind,
        file: None,
        detail: detail.into(),
    }
}

/// Encode a record canonically (with its `version` field and trailing LF).
///
/// Fails only if the record does not validate (a caller bug or a hand-built bad record);
/// nothing invalid is ever written.
pub fn encode<R: Record>(record: &R) -> Result<Vec<u8>, LeaseError> {
    let bytes = encode_any_size(record)?;
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(invalid(
            R::KIND,
            format!(
                "refusing to encode: {} bytes exceeds the {MAX_RECORD_BYTES}-byte limit",
                bytes.len()
            ),
        ));
    }
    Ok(bytes)
}

/// [`encode`] without the size limit: for a writer that reports an oversized record with
/// its own error (a store commit too large for one record, `STORE_COMMIT_TOO_LARGE`)
/// before anything is written. Never write its output without checking the size.
pub(crate) fn encode_any_size<R: Record>(record: &R) -> Result<Vec<u8>, LeaseError> {
    record
        .validate()
        .map_err(|d| invalid(R::KIND, format!("refusing to encode: {d}")))?;
    let mut value = serde_json::to_value(record)
        .map_err(|e| invalid(R::KIND, format!("cannot serialize: {e}")))?;
    match &mut value {
        Value::Object(map) => {
            map.insert("version".into(), Value::String(R::VERSION.into()));
        }
        _ => return Err(invalid(R::KIND, "record does not serialize to an object")),
    }
    // Never write what `decode` would refuse (found by the records proptest).
    if depth(&value) > MAX_DEPTH {
        return Err(invalid(
            R::KIND,
            format!("refusing to encode: nested deeper than {MAX_DEPTH} levels"),
        ));
    }
    Ok(canonical_value_bytes(&value))
}

/// Deepest nesting of arrays and objects accepted in a record (serde_json's parser stops
/// at 128; records themselves use 3 levels).
pub const MAX_DEPTH: usize = 100;

fn depth(v: &Value) -> usize {
    let mut max = 0;
    let mut stack = vec![(v, 1usize)];
    while let Some((v, d)) = stack.pop() {
        max = max.max(d);
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, d + 1))),
            Value::Object(map) => stack.extend(map.values().map(|i| (i, d + 1))),
            _ => {}
        }
    }
    max
}

/// Decode canonical bytes into a record, strictly.
///
/// Errors: [`LeaseError::RecordInvalid`] for anything malformed, non-canonical or failing
/// validation; [`LeaseError::SchemaUnsupported`] when the version string names this record
/// kind with another version.
pub fn decode<R: Record>(bytes: &[u8]) -> Result<R, LeaseError> {
    let kind = R::KIND;
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(invalid(
            kind,
            format!(
                "{} bytes exceeds the {MAX_RECORD_BYTES}-byte limit",
                bytes.len()
            ),
        ));
    }
    if bytes.is_empty() {
        return Err(invalid(kind, "file is empty (torn or truncated write?)"));
    }
    let Some(body) = bytes.strip_suffix(b"\n") else {
        return Err(invalid(
            kind,
            "does not end with a line feed (torn or truncated write?)",
        ));
    };
    let value: Value =
        serde_json::from_slice(body).map_err(|e| invalid(kind, format!("not valid JSON: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(invalid(kind, "not a JSON object"));
    };
    let version = match map.remove("version") {
        Some(Value::String(v)) => v,
        Some(_) => return Err(invalid(kind, "field `version` is not a string")),
        None => return Err(invalid(kind, "field `version` is missing")),
    };
    if version != R::VERSION {
        let prefix = R::VERSION.rsplit_once('/').map_or("", |(p, _)| p);
        if version
            .strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix('/'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
        {
            return Err(LeaseError::SchemaUnsupported {
                run: "?".into(),
                kind,
                file: None,
                version,
                supported: R::VERSION,
            });
        }
        return Err(invalid(
            kind,
            format!("version {version:?} is not {:?}", R::VERSION),
        ));
    }
    let record: R =
        serde_json::from_value(Value::Object(map)).map_err(|e| invalid(kind, e.to_string()))?;
    record.validate().map_err(|d| invalid(kind, d))?;
    let again = encode(&record)?;
    if again != bytes {
        return Err(invalid(
            kind,
            "not in canonical form (sorted keys, no whitespace, one trailing LF)",
        ));
    }
    Ok(record)
}

/// Decode, and check that the record belongs to `run`.
pub fn decode_for<R: Record>(run: &crate::RunId, bytes: &[u8]) -> Result<R, LeaseError> {
    let record: R = decode(bytes).map_err(|e| e.in_run(run))?;
    if let Some(found) = record.run_id() {
        if found != run {
            return Err(LeaseError::RecordInvalid {
                run: run.to_string(),
                kind: R::KIND,
                file: None,
                detail: format!(
                    "it belongs to run {:?}, not {:?}",
                    found.as_str(),
                    run.as_str()
                ),
            });
        }
    }
    Ok(record)
}

/// SHA-256 of a record's canonical bytes: the link value of the hash chains.
pub fn digest<R: Record>(record: &R) -> Result<Digest, LeaseError> {
    Ok(Digest::of(&encode(record)?))
}

/// Parse JSON text given by a person or a script (an event payload on the command line)
/// strictly: a key repeated in one object, and a number that cannot be kept exactly (an
/// integer outside `i64`/`u64`, or any integral float of magnitude 2^53 or more, such as
/// `1e300` or `18446744073709551616`), are refused instead of being merged or rounded
/// silently. Integers within `i64`/`u64` are kept exactly; fractions stay floats (they
/// round-trip, §3). Also refuses nesting deeper than [`MAX_DEPTH`].
///
/// ```
/// use lease_core::canonical::parse_json_strict;
/// assert!(parse_json_strict(r#"{"n":1,"big":18446744073709551615}"#).is_ok());
/// assert!(parse_json_strict(r#"{"n":1,"n":2}"#).unwrap_err().reason().contains("twice"));
/// assert!(parse_json_strict("18446744073709551616").is_err());
/// ```
pub fn parse_json_strict(text: &str) -> Result<Value, crate::InvalidValue> {
    use serde::de::Deserializer as _;
    let bad = |reason: String| crate::InvalidValue::new("JSON", reason);
    let mut de = serde_json::Deserializer::from_str(text);
    let v = de
        .deserialize_any(StrictVisitor)
        .map_err(|e| bad(e.to_string()))?;
    de.end().map_err(|e| bad(e.to_string()))?;
    if depth(&v) > MAX_DEPTH {
        return Err(bad(format!("nested deeper than {MAX_DEPTH} levels")));
    }
    Ok(v)
}

/// Builds a [`Value`] like serde_json's own, refusing duplicate keys and inexact numbers.
struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        // 2^53: above it not every integer is a float, so an integral float there may
        // already have been rounded (serde_json parses integers past u64 as floats).
        const EXACT: f64 = 9_007_199_254_740_992.0;
        if v.is_finite() && v.fract() == 0.0 && v.abs() >= EXACT {
            return Err(E::custom(format!(
                "the number {v:e} cannot be kept exactly (integers must fit in 64 bits; write large values as strings)"
            )));
        }
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("not a finite number"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictSeed)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if out.contains_key(&k) {
                return Err(serde::de::Error::custom(format!(
                    "the key {k:?} appears twice in one object"
                )));
            }
            let v = map.next_value_seed(StrictSeed)?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

struct StrictSeed;

impl<'de> serde::de::DeserializeSeed<'de> for StrictSeed {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}
