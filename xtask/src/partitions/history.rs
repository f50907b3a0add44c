//! The history of one trial: one JSON object per line, written by the workers (the
//! commands under `runlease run`) and by the driver, every line with one `write(2)` on an
//! `O_APPEND` descriptor, so concurrent writers never interleave and a killed writer leaves
//! whole lines. Times are CLOCK_MONOTONIC ns, one clock for every process of the machine
//! (libfaketime, which steps the hosts' wall clocks, is told not to touch it).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// What an operation's outcome says about its effect (Jepsen's vocabulary).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Acknowledged: `runlease append` exited 0, so the event counts (PROTOCOL I9).
    Ok,
    /// Definitely without effect that counts: exit 75 (`FENCED`).
    Fail,
    /// Unknown: any other exit (unavailable, outcome unknown, killed).
    Info,
}

impl Outcome {
    /// The outcome of an append that exited with `rc`.
    pub fn of_append(rc: i32) -> Outcome {
        match rc {
            0 => Outcome::Ok,
            75 => Outcome::Fail,
            _ => Outcome::Info,
        }
    }

    /// The outcome of a `runlease store put` (inside a command, through the owner's socket)
    /// that exited with `rc`: 0 committed; 75 (`FENCED`: the owner was deposed, released
    /// or past its self-fence deadline, or the engine's guard refused the record) and 77
    /// (`STORE_REQUEST_REFUSED`: the socket refused the request) wrote nothing; anything
    /// else may have been committed (71 `OUTCOME_UNKNOWN`, 74 the socket failed
    /// mid-request, a killed client).
    pub fn of_store(rc: i32) -> Outcome {
        match rc {
            0 => Outcome::Ok,
            75 | 77 => Outcome::Fail,
            _ => Outcome::Info,
        }
    }
}

/// One event as a read (`runlease events --json`) returned it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// Its sequence number.
    pub seq: u64,
    /// Its generation.
    pub generation: u64,
    /// The operation id in its payload (`None`: an event no operation of this harness
    /// wrote).
    pub id: Option<String>,
    /// Whether it counts (`authoritative`).
    pub counts: bool,
    /// Not decided yet (`authority: pending`: its generation was superseded and its cutoff
    /// is not written yet; a read-only reader does not finalize it). Neither counting nor
    /// not counting.
    #[serde(default)]
    pub pending: bool,
}

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "k", rename_all = "snake_case")]
pub enum Line {
    /// The command of generation `generation` started on `host` (its claim is complete).
    Start {
        /// Host (1-based).
        host: usize,
        /// `RUNLEASE_GENERATION`.
        generation: u64,
        /// `RUNLEASE_OWNER`.
        owner: String,
        /// When.
        t: u64,
    },
    /// An append is about to be attempted.
    Invoke {
        /// Unique operation id, also the event's payload `id`.
        id: String,
        /// Host.
        host: usize,
        /// The generation it writes as.
        generation: u64,
        /// When (before the `runlease append` process starts).
        t: u64,
    },
    /// An append's outcome (absent when its worker was killed first: then `info`).
    Complete {
        /// The id of its `invoke`.
        id: String,
        /// ok / fail / info.
        outcome: Outcome,
        /// `runlease append`'s exit code.
        rc: i32,
        /// The sequence number it was acknowledged with.
        seq: Option<u64>,
        /// When (after the process exited).
        t: u64,
    },
    /// A read of the whole log through the authority from `host`.
    Read {
        /// Host.
        host: usize,
        /// Invoked.
        t0: u64,
        /// Completed.
        t1: u64,
        /// `runlease events`'s exit code (only `0` reads are judged).
        rc: i32,
        /// What it returned.
        events: Vec<Seen>,
    },
    /// A fault the nemesis injected, or its heal.
    Nemesis {
        /// When.
        t: u64,
        /// What, for the reader (`isolate h2`, `heal`, ...).
        op: String,
    },
    /// A store write (`runlease store put RUN KEY VALUE` inside a command) is about to be
    /// attempted. Keys are unique per write, so a key present in the store names the write
    /// that put it.
    StoreInvoke {
        /// The document's key (unique in the trial).
        key: String,
        /// The value written.
        value: String,
        /// Host.
        host: usize,
        /// The generation it writes as (its owner's).
        generation: u64,
        /// When (before the `runlease store put` process starts).
        t: u64,
    },
    /// A store write's outcome (absent when its worker was killed first: then `info`).
    StoreComplete {
        /// The key of its `store_invoke`.
        key: String,
        /// ok / fail / info ([`Outcome::of_store`]).
        outcome: Outcome,
        /// `runlease store put`'s exit code.
        rc: i32,
        /// The error code it printed (`FENCED`, `OUTCOME_UNKNOWN`, ...), if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<String>,
        /// The commit's sequence it was acknowledged with.
        seq: Option<u64>,
        /// When (after the process exited).
        t: u64,
    },
    /// A read of the whole store at the trial's end, as a new owner on `host`
    /// (`runlease run --retire-dead … -- runlease store list`): the view it caught up from
    /// the engine.
    StoreRead {
        /// Host.
        host: usize,
        /// Invoked.
        t0: u64,
        /// Completed.
        t1: u64,
        /// `runlease run`'s exit code (only `0` reads are judged; -2: it exited 0 but its
        /// output did not parse).
        rc: i32,
        /// Every document it listed, key to value (a value that is not UTF-8 as
        /// `hex:<hex>`).
        docs: BTreeMap<String, String>,
    },
    /// A `runlease run` on `host` exited with `rc`.
    Exit {
        /// Host.
        host: usize,
        /// Its exit code.
        rc: i32,
        /// When.
        t: u64,
    },
}

/// Append `line` to the history at `path`.
pub fn put(path: &Path, line: &Line) -> std::io::Result<()> {
    let text = serde_json::to_string(line).map_err(std::io::Error::other)?;
    crate::torture::procs::append_line(path, &text)
}

/// Parse a history; a line that does not parse is an error naming it.
pub fn parse(text: &str) -> Result<Vec<Line>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("history: bad line {l:?}: {e}")))
        .collect()
}

/// One line of `runlease events --json`: the whole object, its sequence, generation and
/// whether it counts (`authoritative`); an error names the line. Shared with the torture's
/// checker.
pub(crate) fn event_line(l: &str) -> Result<(serde_json::Value, u64, u64, bool), String> {
    use serde_json::Value;
    let v: Value = serde_json::from_str(l).map_err(|e| format!("events: bad JSON {l:?}: {e}"))?;
    let u = |k: &str| {
        v.get(k)
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("events: no {k} in {l}"))
    };
    let (seq, generation) = (u("sequence")?, u("generation")?);
    let counts = v
        .get("authoritative")
        .and_then(Value::as_bool)
        .ok_or_else(|| format!("events: no authoritative in {l}"))?;
    Ok((v, seq, generation, counts))
}

/// Parse `runlease events --json` output into what a read saw.
pub fn parse_events(text: &str) -> Result<Vec<Seen>, String> {
    use serde_json::Value;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (v, seq, generation, counts) = event_line(l)?;
            Ok(Seen {
                seq,
                generation,
                id: v
                    .get("payload")
                    .and_then(|p| p.get("id"))
                    .and_then(Value::as_str)
                    .map(str::to_string),
                counts,
                pending: v.get("authority").and_then(Value::as_str) == Some("pending"),
            })
        })
        .collect()
}

/// What `runlease --json store put` printed: the commit's sequence (`seq`) when it
/// committed, else the error's `code`.
pub fn store_written(stdout: &[u8]) -> (Option<u64>, Option<String>) {
    let first = stdout.split(|b| *b == b'\n').next().unwrap_or_default();
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(first) else {
        return (None, None);
    };
    (
        v.get("seq").and_then(serde_json::Value::as_u64),
        v.get("code")
            .and_then(serde_json::Value::as_str)
            .map(str::to_string),
    )
}

/// Parse `runlease --json store list` output (`runlease/cli/store-doc/1` objects, one a
/// line) into key -> value; lines of another schema (none expected) are skipped, a bad
/// document is an error naming the line.
pub fn parse_store_docs(text: &str) -> Result<BTreeMap<String, String>, String> {
    use serde_json::Value;
    let mut docs = BTreeMap::new();
    for l in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value =
            serde_json::from_str(l).map_err(|e| format!("store list: bad JSON {l:?}: {e}"))?;
        if v.get("schema").and_then(Value::as_str) != Some("runlease/cli/store-doc/1") {
            continue;
        }
        let key = v
            .get("key")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("store list: no key in {l}"))?;
        let value = match (
            v.get("value").and_then(Value::as_str),
            v.get("value_hex").and_then(Value::as_str),
        ) {
            (Some(s), _) => s.to_string(),
            (None, Some(h)) => format!("hex:{h}"),
            (None, None) => return Err(format!("store list: no value in {l}")),
        };
        if docs.insert(key.to_string(), value).is_some() {
            return Err(format!("store list: key {key:?} listed twice"));
        }
    }
    Ok(docs)
}
