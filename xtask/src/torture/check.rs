//! The checker (pure): the history and the event log parsed, and judged against the
//! definitions of the module docs.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

use super::FENCED;

// ---------------------------------------------------------------------------------------
// The checker (pure).

/// A `start` line: a tenure's command began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub(super) slot: u64,
    pub(super) round: u64,
    pub(super) generation: u64,
    pub(super) owner: String,
    pub(super) t: u64,
}

/// An `append` line: one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub(super) slot: u64,
    pub(super) round: u64,
    pub(super) n: u64,
    pub(super) generation: u64,
    pub(super) owner: String,
    pub(super) rc: i32,
    pub(super) seq: Option<u64>,
    pub(super) t0: u64,
    pub(super) t1: u64,
}

impl Attempt {
    pub(super) fn key(&self) -> (u64, u64, u64) {
        (self.slot, self.round, self.n)
    }
}

/// One event of `runlease events --json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEvent {
    pub(super) sequence: u64,
    pub(super) generation: u64,
    pub(super) owner: String,
    pub(super) counts: bool,
    pub(super) authority: String,
    /// `(slot, round, n)` from the payload, if it has one.
    pub(super) key: Option<(u64, u64, u64)>,
}

/// The parsed history file.
#[derive(Debug, Default)]
pub struct History {
    pub(super) starts: Vec<Start>,
    pub(super) attempts: Vec<Attempt>,
}

/// `key=value` fields of a history line (the first word is its kind).
fn fields(line: &str) -> (String, HashMap<String, String>) {
    let mut words = line.split_whitespace();
    let kind = words.next().unwrap_or_default().to_string();
    let map = words
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (kind, map)
}

/// Parse the history file; malformed lines are errors.
pub(super) fn parse_history(text: &str) -> Result<History, String> {
    let mut h = History::default();
    for (i, line) in text.lines().enumerate() {
        let bad = || format!("history line {}: malformed: {line:?}", i + 1);
        let (kind, f) = fields(line);
        let num = |k: &str| f.get(k).and_then(|v| v.parse::<u64>().ok()).ok_or_else(bad);
        let owner = f.get("owner").cloned().ok_or_else(bad)?;
        match kind.as_str() {
            "start" => h.starts.push(Start {
                slot: num("slot")?,
                round: num("round")?,
                generation: num("gen")?,
                owner,
                t: num("t")?,
            }),
            "append" => h.attempts.push(Attempt {
                slot: num("slot")?,
                round: num("round")?,
                n: num("n")?,
                generation: num("gen")?,
                owner,
                rc: f.get("rc").and_then(|v| v.parse().ok()).ok_or_else(bad)?,
                seq: f.get("seq").and_then(|v| v.parse().ok()),
                t0: num("t0")?,
                t1: num("t1")?,
            }),
            _ => return Err(bad()),
        }
    }
    Ok(h)
}

/// Parse `runlease events --json` output.
pub(super) fn parse_events(text: &str) -> Result<Vec<LogEvent>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (v, sequence, generation, counts) = crate::partitions::event_line(l)?;
            let p = v.get("payload");
            let pu = |k: &str| p.and_then(|p| p.get(k)).and_then(Value::as_u64);
            let key = match (pu("slot"), pu("round"), pu("n")) {
                (Some(s), Some(r), Some(n)) => Some((s, r, n)),
                _ => None,
            };
            Ok(LogEvent {
                sequence,
                generation,
                owner: v
                    .get("owner_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                counts,
                authority: v
                    .get("authority")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                key,
            })
        })
        .collect()
}

/// What the checker found: each entry names the offending records.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Acknowledged attempts not faithfully in the log (see the module docs).
    pub(super) lost: Vec<String>,
    /// Violations of single ownership (see the module docs).
    pub(super) overlaps: Vec<String>,
    /// Anything else that makes the run fail (unknown events).
    pub(super) problems: Vec<String>,
}

/// Judge a history against the recovered event log (definitions in the module docs).
pub fn check(h: &History, events: &[LogEvent]) -> Verdict {
    let mut v = Verdict::default();
    let mut by_key: BTreeMap<(u64, u64, u64), Vec<&LogEvent>> = BTreeMap::new();
    for e in events {
        match e.key {
            Some(k) => by_key.entry(k).or_default().push(e),
            None => v
                .problems
                .push(format!("log event without a torture key: {e:?}")),
        }
    }
    // An event whose key has no history line is fine: its worker was killed between the
    // append and the line (or the answer was lost); it is never acknowledged.
    let acked: Vec<&Attempt> = h.attempts.iter().filter(|a| a.rc == 0).collect();

    // lost
    for a in &acked {
        let es = by_key.get(&a.key()).map(Vec::as_slice).unwrap_or_default();
        match es {
            [] => v
                .lost
                .push(format!("acknowledged but absent from the log: {a:?}")),
            [e] if e.counts
                && e.generation == a.generation
                && e.owner == a.owner
                && Some(e.sequence) == a.seq => {}
            [e] => v.lost.push(format!(
                "acknowledged but not counted as acknowledged: {a:?} vs log {e:?}"
            )),
            many => v.lost.push(format!(
                "acknowledged, but {} log events carry its key: {a:?} vs {many:?}",
                many.len()
            )),
        }
    }

    // 1. monotone log
    let mut prev: Option<&LogEvent> = None;
    let mut sorted: Vec<&LogEvent> = events.iter().collect();
    sorted.sort_by_key(|e| e.sequence);
    for e in sorted.iter().filter(|e| e.counts) {
        if let Some(p) = prev
            && e.generation < p.generation
        {
            v.overlaps.push(format!(
                "counting events not generation-monotone: {p:?} then {e:?}"
            ));
        }
        prev = Some(e);
    }

    // 2. one owner per generation
    let mut start_of: BTreeMap<u64, &Start> = BTreeMap::new();
    for s in &h.starts {
        if let Some(other) = start_of.insert(s.generation, s) {
            v.overlaps.push(format!(
                "two tenures started at one generation: {other:?} and {s:?}"
            ));
        }
    }
    let mut owner_of: BTreeMap<u64, &str> = BTreeMap::new();
    for e in events.iter().filter(|e| e.counts) {
        if let Some(o) = owner_of.insert(e.generation, &e.owner)
            && o != e.owner
        {
            v.overlaps.push(format!(
                "generation {} counts events of two owners ({o} and {}): {e:?}",
                e.generation, e.owner
            ));
        }
    }

    // 3. tenure: earliest start of any generation above g
    let min_above = |times: &BTreeMap<u64, u64>, g: u64| {
        times
            .range(g + 1..)
            .map(|(_, &t)| t)
            .min()
            .map(|t| (t, times.iter().find(|(_, tt)| **tt == t).map(|(g, _)| *g)))
    };
    let start_t: BTreeMap<u64, u64> = start_of.iter().map(|(&g, s)| (g, s.t)).collect();
    let mut ack_end: BTreeMap<u64, u64> = BTreeMap::new();
    for a in &acked {
        let t = ack_end.entry(a.generation).or_insert(a.t1);
        *t = (*t).min(a.t1);
    }
    for a in &acked {
        if let Some((t, g)) = min_above(&start_t, a.generation)
            && a.t0 > t
        {
            v.overlaps.push(format!(
                "acknowledged append started {} ms after the tenure of generation {g:?} began: {a:?}",
                (a.t0 - t) / 1_000_000
            ));
        }
        // 4. acknowledged order
        if let Some((t, g)) = min_above(&ack_end, a.generation)
            && a.t0 > t
        {
            v.overlaps.push(format!(
                "acknowledged append started {} ms after an acknowledged append of generation {g:?} ended: {a:?}",
                (a.t0 - t) / 1_000_000
            ));
        }
    }

    // 5. fenced never counts
    for a in h.attempts.iter().filter(|a| a.rc == FENCED) {
        for e in by_key.get(&a.key()).into_iter().flatten() {
            if e.counts {
                v.overlaps
                    .push(format!("fenced append counts in the log: {a:?} vs {e:?}"));
            }
        }
    }
    v
}
