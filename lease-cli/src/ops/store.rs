//! `runlease store`: read and write a run's store.
//!
//! Inside a command of the run's owner (issue #20) every verb goes through the owner's
//! store socket (`lease_run::store_client`): reads and writes alike, stamped with the
//! owner's generation and checked against its secret. Elsewhere the readers read a free
//! (or dead-owner) run's store writing nothing, and the writers refuse with the next step;
//! a run held by an owner is refused with its holder named.

use crate::error::CliError;
use crate::holder::held_description;
use crate::open::{folder_only, open_lease};
use crate::output::Out;
use crate::stamps::wall_now;
use crate::text::{Quoting, command_line, shell_path};
use lease_core::{Code, LeaseOps};
use lease_run::engine_store::EngineReader;
use lease_run::store_client::{SOCKET_VAR, StoreClient};
use lease_run::store_read::StoreReader;
use lease_run::{Batch, Commit, Document, Write};
use serde_json::{Value, json};
use std::io::Write as _;
use std::path::Path;

/// `obj` with `bytes` added as `value` when they are UTF-8 text, else as `value_hex`.
fn with_value(mut obj: Value, bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => obj["value"] = Value::String(s.to_string()),
        Err(_) => {
            obj["value_hex"] = Value::String(hex::encode(bytes));
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

/// Where a verb reads and writes: the owner's socket (inside one of its commands), or the
/// store itself, read-only (a free run).
enum Source {
    Served(StoreClient),
    Local(Box<StoreReader>),
    /// Over an engine (etcd): a view built from the engine's log, whoever owns the run.
    Engine(Box<EngineReader>),
}

/// Whether this process is a command of the owner of the run at `dir`, serving its store:
/// `RUNLEASE_STORE_SOCKET` is set and `RUNLEASE_RUN` is the same folder (device and inode;
/// a command may name its run by any path). Whether the socket's owner serves that folder
/// is proved when connecting: `StoreClient::from_env` refuses (64, both runs named) an
/// environment whose `RUNLEASE_RUN` names another run than its socket serves.
pub(crate) fn served_here(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let (Some(_), Some(run)) = (
        std::env::var_os(SOCKET_VAR),
        std::env::var_os("RUNLEASE_RUN"),
    ) else {
        return false;
    };
    match (std::fs::metadata(dir), std::fs::metadata(run)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

fn source(dir: &Path, authority: &lease_run::Authority) -> Result<Source, CliError> {
    if served_here(dir) {
        return match StoreClient::from_env()? {
            Some(c) => Ok(Source::Served(c)),
            None => Err(CliError::of(
                Code::Internal,
                "the store socket vanished from the environment",
            )),
        };
    }
    if authority.url().is_some() {
        // The store is committed in the engine (docs/PROTOCOL.md §18): read it there,
        // from any host and whoever owns the run; the run folder is not read.
        let lease = open_lease(dir, authority, None)?;
        if lease.auth.commits_in_engine() {
            return EngineReader::open(&*lease.auth)
                .map(|r| Source::Engine(Box::new(r)))
                .map_err(|e| {
                    CliError::from(e)
                        .with_hint(format!("the store was read from {}", lease.auth.describe()))
                });
        }
    }
    open(dir, authority).map(|r| Source::Local(Box::new(r)))
}

impl Source {
    fn get(&mut self, key: &str) -> Result<Option<Document>, CliError> {
        Ok(match self {
            Source::Served(c) => c.get(key)?,
            Source::Local(r) => r.store().get(key).map_err(lease_run::RunError::from)?,
            Source::Engine(r) => r.store().get(key).map_err(lease_run::RunError::from)?,
        })
    }

    /// Every document under `prefix`, in key order, to `each` until it returns false:
    /// through the socket a page at a time (the whole answer may be larger than a frame).
    fn each_doc(
        &mut self,
        prefix: &str,
        mut each: impl FnMut(&Document) -> bool,
    ) -> Result<(), CliError> {
        let docs = match self {
            Source::Served(c) => {
                let mut after: Option<String> = None;
                loop {
                    let (page, more) = c.scan_prefix_page(prefix, after.as_deref(), None)?;
                    for d in &page {
                        if !each(d) {
                            return Ok(());
                        }
                    }
                    after = page.last().map(|d| d.key.clone());
                    if !more {
                        return Ok(());
                    }
                }
            }
            Source::Local(r) => r.store().scan_prefix(prefix),
            Source::Engine(r) => r.store().scan_prefix(prefix),
        }
        .map_err(lease_run::RunError::from)?;
        for d in &docs {
            if !each(d) {
                break;
            }
        }
        Ok(())
    }

    /// The commits after `after`, at most `max`, and whether more may follow.
    fn commits_page(&mut self, after: u64, max: usize) -> Result<(Vec<Commit>, bool), CliError> {
        let page = match self {
            Source::Served(c) => return Ok(c.commits_page(after, Some(max as u64))?),
            Source::Local(r) => r.store().commits_page(after, max),
            Source::Engine(r) => r.store().commits_page(after, max),
        }
        .map_err(lease_run::RunError::from)?;
        let more = page.len() == max;
        Ok((page, more))
    }
}

fn open(dir: &Path, authority: &lease_run::Authority) -> Result<StoreReader, CliError> {
    // The store lives in the run folder whatever the authority, but the lease that says
    // whether the run is free does not: over etcd this reader cannot judge it yet.
    folder_only("store", authority)?;
    StoreReader::open(dir).map_err(|e| {
        let err = CliError::from(e);
        match err.code {
            lease_core::Code::OwnerLockHeld
            | lease_core::Code::RunAlreadyActive
            | lease_core::Code::RunStaleRequiresTakeover => holder_named(dir, err).with_hint(
                "its owner has the store open: its commands read and write it through the owner (runlease store inside `runlease run`); others read it once the run is released",
            ),
            lease_core::Code::StoreBusy => {
                err.with_hint(format!(
                    "next: runlease run --retire-dead {} -- true (an owner's open replays it; --retire-dead frees a run whose owner died first)",
                    shell_path(dir)
                ))
            }
            // The store is not what the lease chain vouches for (rewound below its seal or
            // floor, another store, or commits above a rolled-back chain): nothing of it is
            // printed as the run's state (issue #28); doctor reports the same code.
            code @ (lease_core::Code::StoreBehindSeal
            | lease_core::Code::StoreIdentityMismatch
            | lease_core::Code::ChainBroken) => {
                let finding = if code == lease_core::Code::ChainBroken {
                    "BROKEN_CHAIN"
                } else {
                    code.as_str()
                };
                err.with_hint(format!(
                    "next: runlease doctor -- {} (its finding {finding} names the repair; every writer refuses the run until then)",
                    shell_path(dir)
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
        .and_then(|d| d.status(wall_now().ok()?, false).ok());
    match view.filter(|v| v.head.as_ref().is_some_and(|h| h.is_active())) {
        Some(v) => {
            let (text, extra) = held_description(&v);
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
    let mut r = source(dir, authority)?;
    let run = dir.display().to_string();
    let doc = r.get(key)?;
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
    let mut r = source(dir, authority)?;
    let run = dir.display().to_string();
    r.each_doc(prefix, |d| {
        if out.json {
            out.json_line(&doc_json(&run, d))
        } else {
            out.line(&format!("{}\t{}", d.key, String::from_utf8_lossy(&d.value)))
        }
    })?;
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
    let mut r = source(dir, authority)?;
    let run = dir.display().to_string();
    let mut after = since;
    loop {
        let (page, more) = r.commits_page(after, PAGE)?;
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
        if !more || page.is_empty() {
            return Ok(0);
        }
    }
}

/// What a writer verb commits, and how to say it again (for the next step it prints).
#[derive(Debug, Clone)]
pub struct WriteRequest {
    /// The batch.
    pub batch: Batch,
    /// The verb, then its arguments after the run folder, as given (`put`, KEY, VALUE).
    pub args: Vec<String>,
}

impl WriteRequest {
    /// `put KEY VALUE` (`-`: the value is stdin, read whole).
    pub fn put(key: String, value: String) -> Result<WriteRequest, CliError> {
        let bytes = if value == "-" {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut v).map_err(|e| {
                CliError::of(
                    Code::IoError,
                    format!("cannot read the value from stdin: {e}"),
                )
            })?;
            v
        } else {
            value.clone().into_bytes()
        };
        Ok(WriteRequest {
            batch: Batch::new().put(key.clone(), bytes),
            args: vec!["put".into(), key, value],
        })
    }

    /// `delete KEY`.
    pub fn delete(key: String) -> WriteRequest {
        WriteRequest {
            batch: Batch::new().delete(key.clone()),
            args: vec!["delete".into(), key],
        }
    }

    /// `commit --put K=V ... --delete K ... --log TEXT ...` (puts, then deletes; a key both
    /// put and deleted is refused, as is a `--put` without `=`).
    pub fn commit(
        puts: &[String],
        deletes: &[String],
        logs: &[String],
    ) -> Result<WriteRequest, CliError> {
        let mut batch = Batch::new();
        let mut args = vec!["commit".to_string()];
        let mut put_keys = std::collections::BTreeSet::new();
        for p in puts {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| CliError::usage(format!("--put {p:?}: expected KEY=VALUE")))?;
            put_keys.insert(k.to_string());
            batch = batch.put(k, v);
            args.extend(["--put".to_string(), p.clone()]);
        }
        for k in deletes {
            if put_keys.contains(k) {
                return Err(CliError::usage(format!(
                    "key {k:?} is both put and deleted in one commit; nothing was written"
                )));
            }
            batch = batch.delete(k.clone());
            args.extend(["--delete".to_string(), k.clone()]);
        }
        for l in logs {
            batch = batch.log(l.clone());
            args.extend(["--log".to_string(), l.clone()]);
        }
        Ok(WriteRequest { batch, args })
    }
}

/// `runlease store put|delete|commit RUN ...`: commit one batch through the owner's
/// socket, inside a command of the run's owner; refused elsewhere (the store has one
/// writer, its owner): a free run with the next step that makes this process such a
/// command, a held run with its holder named. Prints the new sequence.
pub fn store_write(
    dir: &Path,
    authority: &lease_run::Authority,
    req: &WriteRequest,
    out: Out,
) -> Result<i32, CliError> {
    let run = dir.display().to_string();
    if !served_here(dir) {
        // Judge the run as the readers do (holder named, a crashed owner's WAL, a missing
        // store); a run this process could read is one nobody owns: say how to write.
        let reader = open(dir, authority)?;
        let quoted: Vec<String> = req.args.iter().map(|a| shell_path(Path::new(a))).collect();
        let (verb, rest) = quoted
            .split_first()
            .map_or(("put", &[][..]), |(v, r)| (v.as_str(), r));
        let d = shell_path(dir);
        let retire = if reader.owner_dead() {
            "--retire-dead "
        } else {
            ""
        };
        drop(reader);
        return Err(CliError::of(
            Code::RunNotHeld,
            format!(
                "run {run}: nothing was written: only the run's owner writes its store, and this process is not one of its commands ({SOCKET_VAR} is unset or names another run)"
            ),
        )
        .with_hint(format!(
            "next: runlease run {retire}{d} -- runlease store {verb} {d} {}",
            rest.join(" ")
        )));
    }
    let mut client = StoreClient::from_env()?.ok_or_else(|| {
        CliError::of(
            Code::Internal,
            "the store socket vanished from the environment",
        )
    })?;
    let seq = client.commit(&req.batch).map_err(|e| {
        let err = CliError::from(e);
        if err.code != Code::OutcomeUnknown {
            return err;
        }
        // Issue #31: in the store, its floor unknown; committing it again blindly would
        // commit it twice.
        let argv = ["runlease", "store", "log", "--"]
            .map(String::from)
            .into_iter()
            .chain([run.clone()])
            .collect::<Vec<_>>();
        err.with_hint(format!(
            "look before committing again: `{}` lists the commits with their writes and log entries",
            command_line(&argv, Quoting::Terminal)
        ))
    })?;
    let generation = client.generation();
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/store-write/1",
            "ok": true,
            "run": run,
            "seq": seq,
            "generation": generation,
            "writes": req.batch.writes.len(),
            "log": req.batch.log.len(),
        }));
    } else {
        out.line(&format!(
            "committed #{seq} to {run} as generation {generation}"
        ));
    }
    Ok(0)
}
