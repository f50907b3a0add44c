//! JSON manipulation: fields by path, raw literals, and the schema fields of a record.

use lease_core::canonical::canonical_value_bytes;
use serde_json::{Map, Value};

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
pub(crate) fn set_path(value: &mut Value, path: &[&str], new: Value) -> bool {
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
pub(crate) fn with_raw(value: &Value, path: &[&str], raw: &str) -> Option<Vec<u8>> {
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
pub(crate) fn schema_objects(value: &Value) -> Vec<Vec<String>> {
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

pub(crate) fn object_at_mut<'a>(
    value: &'a mut Value,
    path: &[String],
) -> Option<&'a mut Map<String, Value>> {
    let mut at = value;
    for key in path {
        at = at.as_object_mut()?.get_mut(key)?;
    }
    at.as_object_mut()
}

/// Every schema field of a record's JSON, as a path.
pub(crate) fn schema_fields(value: &Value) -> Vec<Vec<String>> {
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

pub(crate) fn version_prefix(version: &str) -> &str {
    version.rsplit_once('/').map_or("", |(p, _)| p)
}

/// Whether `v` names the same record kind as `version` with another numeric version.
pub(crate) fn is_other_numeric_version(version: &str, v: &str) -> bool {
    v != version
        && v.strip_prefix(version_prefix(version))
            .and_then(|r| r.strip_prefix('/'))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()))
}
