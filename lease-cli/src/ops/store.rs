//! `store get`, `store list` and `store log`: read a free run's store, writing nothing
//! (issue #20, first piece: the owner does not serve its store to its commands yet, so a
//! held run is refused with its holder named).

use crate::common::{CliError, Out};
use lease_core::LeaseOps;
use lease_run::store_read::StoreReader;
use lease_run::{Commit, Document, Write};
use serde_json::{Value, json};
use std::io::Write as _;
use std::path::Path;

/// `obj` with `bytes` added as `value` when they are UTF-8 text, else as `value_hex`.
fn with_value(mut obj: Value, bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => obj["value"] = Value::String(s.to_string()),
        Err(_) => {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            obj["value_hex"] = Value::String(hex);
        }
    }
    obj
}

fn doc_json(run: &str, d: &Document) -> Value {
    with_value(
        json!({
            "schema": "runlease/cli/store-doc/1",
            "ok": true,
            "run": run,
            "key": d.key,
            "updated_seq": d.updated_seq,
        }),
        &d.value,
    )
}

fn open(dir: &Path, authority: &lease_run::Authority) -> Result<StoreReader, CliError> {
    // The store lives in the run folder whatever the authority, but the lease that says
    // whether the run is free does not: over etcd this reader cannot judge it yet.
    crate::common::folder_only("store", authority)?;
    StoreReader::open(dir).map_err(|e| {
        let err = CliError::from(e);
        match err.code {
            lease_core::Code::OwnerLockHeld
            | lease_core::Code::RunAlreadyActive
            | lease_core::Code::RunStaleRequiresTakeover => holder_named(dir, err).with_hint(
                "its owner has the store open; reading a held run's store (through its owner) is not available yet: read it once the run is released",
            ),
            lease_core::Code::StoreBusy => {
                err.with_hint(format!(
                    "next: runlease run --retire-dead {} -- true (an owner's open replays it; --retire-dead frees a run whose owner died first)",
                    crate::common::shell_path(dir)
                ))
            }
            _ => err,
        }
    })
}

/// A refusal over a held run, with who holds it (read-only status, best effort: the
/// refusal stands as it is when the lease cannot be read).
fn holder_named(dir: &Path, err: CliError) -> CliError {
    let view = lease_run::folder::RunDir::open(dir)
        .ok()
        .and_then(|d| d.status(crate::common::wall_now().ok()?, false).ok());
    match view.filter(|v| v.head.as_ref().is_some_and(|h| h.is_active())) {
        Some(v) => {
            let (text, extra) = crate::common::held_description(&v);
            let mut e = err.with_hint(text);
            e.extra = Some(extra);
            e
        }
        None => err,
    }
}

/// `runlease store get RUN KEY`: the value on stdout as it is (no newline added); exit 1,
/// printing nothing (with `--json`: `"found": false`), when the key does not exist.
pub fn store_get(
    dir: &Path,
    authority: &lease_run::Authority,
    key: &str,
    out: Out,
) -> Result<i32, CliError> {
    let r = open(dir, authority)?;
    let run = dir.display().to_string();
    let doc = r.store().get(key).map_err(lease_run::RunError::from)?;
    match (doc, out.json) {
        (Some(d), true) => {
            let mut v = doc_json(&run, &d);
            v["found"] = json!(true);
            out.json_line(&v);
            Ok(0)
        }
        (Some(d), false) => {
            let mut o = std::io::stdout().lock();
            let _ = o.write_all(&d.value).and_then(|()| o.flush());
            Ok(0)
        }
        (None, json) => {
            if json {
                out.json_line(&json!({
                    "schema": "runlease/cli/store-doc/1",
                    "ok": true,
                    "run": run,
                    "key": key,
                    "found": false,
                }));
            }
            Ok(1)
        }
    }
}

/// `runlease store list RUN [PREFIX]`: every document whose key starts with PREFIX, in key
/// order: `KEY<TAB>VALUE` per line (the value shown terminal-safe), or one JSON object each.
pub fn store_list(
    dir: &Path,
    authority: &lease_run::Authority,
    prefix: &str,
    out: Out,
) -> Result<i32, CliError> {
    let r = open(dir, authority)?;
    let run = dir.display().to_string();
    for d in r
        .store()
        .scan_prefix(prefix)
        .map_err(lease_run::RunError::from)?
    {
        let shown = if out.json {
            out.json_line(&doc_json(&run, &d))
        } else {
            out.line(&format!("{}\t{}", d.key, String::from_utf8_lossy(&d.value)))
        };
        if !shown {
            break;
        }
    }
    Ok(0)
}

fn commit_json(run: &str, c: &Commit) -> Value {
    let writes: Vec<Value> = c
        .writes
        .iter()
        .map(|w| match w {
            Write::Put { key, value } => with_value(json!({"op": "put", "key": key}), value),
            Write::Delete { key } => json!({"op": "delete", "key": key}),
        })
        .collect();
    let log: Vec<Value> = c.log.iter().map(|e| with_value(json!({}), e)).collect();
    json!({
        "schema": "runlease/cli/store-commit/1",
        "ok": true,
        "run": run,
        "seq": c.seq,
        "generation": c.token,
        "committed_at": c.committed_at,
        "writes": writes,
        "log": log,
    })
}

fn commit_human(c: &Commit) -> String {
    let mut parts: Vec<String> = c
        .writes
        .iter()
        .map(|w| match w {
            Write::Put { key, value } => format!("put {key} ({} bytes)", value.len()),
            Write::Delete { key } => format!("delete {key}"),
        })
        .collect();
    parts.extend(
        c.log
            .iter()
            .map(|e| format!("log {:?}", String::from_utf8_lossy(e))),
    );
    let what = if parts.is_empty() {
        "nothing".to_string()
    } else {
        parts.join(", ")
    };
    format!(
        "#{} generation {} at {}: {what}",
        c.seq, c.token, c.committed_at
    )
}

/// `runlease store log RUN [--since SEQ]`: the commits after SEQ, oldest first, read a
/// page at a time.
pub fn store_log(
    dir: &Path,
    authority: &lease_run::Authority,
    since: u64,
    out: Out,
) -> Result<i32, CliError> {
    const PAGE: usize = 256;
    let r = open(dir, authority)?;
    let run = dir.display().to_string();
    let mut after = since;
    loop {
        let page = r
            .store()
            .commits_page(after, PAGE)
            .map_err(lease_run::RunError::from)?;
        for c in &page {
            let shown = if out.json {
                out.json_line(&commit_json(&run, c))
            } else {
                out.line(&commit_human(c))
            };
            if !shown {
                return Ok(0);
            }
            after = c.seq;
        }
        if page.len() < PAGE {
            return Ok(0);
        }
    }
}
