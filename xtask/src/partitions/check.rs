//! The checker: one trial's history and its recovered event log in, a verdict out
//! (definitions in the module docs of [`super`]).

use std::collections::{BTreeMap, BTreeSet};

use super::history::{Line, Outcome, Seen};

/// One append, its invoke joined with its outcome.
#[derive(Debug, Clone)]
struct Op {
    generation: u64,
    t0: u64,
    outcome: Outcome,
    seq: Option<u64>,
    t1: Option<u64>,
}

/// What one trial's check found. Each finding names the records it is about.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Appends invoked.
    pub ops: u64,
    /// Appends acknowledged.
    pub acked: u64,
    /// Reads judged (exit 0).
    pub reads: u64,
    /// Reads that showed some event `pending` (undecided).
    pub undecided_reads: u64,
    /// Acknowledged appends not counting at the sequence they were acknowledged with.
    pub lost: Vec<String>,
    /// Events of a deposed generation that count (or were seen counting).
    pub deposed_counted: Vec<String>,
    /// Two owners in effect at once.
    pub double_owner: Vec<String>,
    /// Reads that missed an acknowledged append or un-saw a counting one.
    pub stale_reads: Vec<String>,
    /// Anything else that makes the trial fail (an event nobody attempted, ...).
    pub problems: Vec<String>,
    /// How many `runlease run`s exited with each code (75 fenced, 76 held, 137 killed by
    /// the harness at the end; 65 or 70 would be a refusal of a healthy run).
    pub run_exits: BTreeMap<i32, u64>,
    /// Failover samples, ms (see the module docs).
    pub failovers_ms: Vec<u64>,
    /// Time without an acknowledged write (append or store commit) for more than 1 s, ns.
    pub unavailable_ns: u64,
    /// The window `unavailable_ns` is out of.
    pub window_ns: u64,
    /// Store writes invoked ([`check_store`]).
    pub store_ops: u64,
    /// Store writes acknowledged.
    pub store_acked: u64,
    /// Store writes answered `FENCED` (or refused): committed nowhere.
    pub store_fenced: u64,
    /// Store writes whose outcome is unknown (their worker killed, `OUTCOME_UNKNOWN`, ...).
    pub store_unknown: u64,
    /// Final reads of the store judged (exit 0).
    pub store_reads: u64,
    /// Acknowledged store writes whose key does not hold their value in a final read.
    pub store_lost: Vec<String>,
    /// Store writes present in a final read although answered `FENCED` (or invoked after
    /// a newer generation's command had started).
    pub store_deposed_counted: Vec<String>,
}

impl Verdict {
    /// Whether the trial passed.
    pub fn passed(&self) -> bool {
        self.lost.is_empty()
            && self.deposed_counted.is_empty()
            && self.double_owner.is_empty()
            && self.stale_reads.is_empty()
            && self.store_lost.is_empty()
            && self.store_deposed_counted.is_empty()
            && self.problems.is_empty()
    }
}

/// What one read saw of each operation's event: its sequence, and whether it was shown
/// `pending` (else counting).
type ReadView<'a> = BTreeMap<&'a str, (u64, bool)>;

/// A gap between acknowledged writes up to this long is not unavailability.
const AVAILABLE_GAP_NS: u64 = 1_000_000_000;

/// Judge `history` against `log` (the events after the closing recovery); `window` is
/// the span over which unavailability is measured (the workload's, `(start, end)` ns).
pub fn check(history: &[Line], log: &[Seen], window: (u64, u64)) -> Verdict {
    let mut v = Verdict::default();
    let mut ops: BTreeMap<&str, Op> = BTreeMap::new();
    let mut starts: Vec<(u64, u64, &str, usize)> = Vec::new(); // (t, generation, owner, host)
    for l in history {
        match l {
            Line::Invoke {
                id, generation, t, ..
            } => {
                let fresh = ops
                    .insert(
                        id,
                        Op {
                            generation: *generation,
                            t0: *t,
                            outcome: Outcome::Info,
                            seq: None,
                            t1: None,
                        },
                    )
                    .is_none();
                if !fresh {
                    v.problems.push(format!("operation {id} invoked twice"));
                }
            }
            Line::Start {
                host,
                generation,
                owner,
                t,
                ..
            } => starts.push((*t, *generation, owner, *host)),
            Line::Exit { rc, .. } => *v.run_exits.entry(*rc).or_default() += 1,
            _ => {}
        }
    }
    for l in history {
        if let Line::Complete {
            id,
            outcome,
            seq,
            t,
            ..
        } = l
        {
            match ops.get_mut(id.as_str()) {
                Some(op) => {
                    op.outcome = *outcome;
                    op.seq = *seq;
                    op.t1 = Some(*t);
                }
                None => v
                    .problems
                    .push(format!("operation {id} completed, never invoked")),
            }
        }
    }
    v.ops = ops.len() as u64;
    let acked: Vec<(&str, &Op)> = ops
        .iter()
        .filter(|(_, o)| o.outcome == Outcome::Ok)
        .map(|(id, o)| (*id, o))
        .collect();
    v.acked = acked.len() as u64;
    starts.sort();

    // One owner per generation.
    let mut owner_of: BTreeMap<u64, (&str, usize)> = BTreeMap::new();
    for &(_, generation, owner, host) in &starts {
        if let Some((o, h)) = owner_of.insert(generation, (owner, host)) {
            v.double_owner.push(format!(
                "generation {generation} started twice: owner {o} on h{h}, owner {owner} on h{host}"
            ));
        }
    }
    // Acknowledged order: no generation is acknowledged after a newer one was.
    let mut by_t1: Vec<(u64, u64, &str)> = acked
        .iter()
        .filter_map(|(id, o)| o.t1.map(|t1| (t1, o.generation, *id)))
        .collect();
    by_t1.sort();
    for (id, o) in &acked {
        // The newest generation acknowledged before this append was invoked.
        if let Some((t1, g, other)) = by_t1
            .iter()
            .filter(|(t1, g, _)| *t1 < o.t0 && *g > o.generation)
            .max_by_key(|(_, g, _)| *g)
        {
            v.double_owner.push(format!(
                "{id} (generation {}) acknowledged although invoked after {other} of generation {g} was acknowledged at t={t1}",
                o.generation
            ));
        }
    }

    // Lost: an acknowledged append must count, at its sequence, in the recovered log.
    let counting: BTreeMap<&str, &Seen> = log
        .iter()
        .filter(|e| e.counts)
        .filter_map(|e| e.id.as_deref().map(|id| (id, e)))
        .collect();
    for (id, o) in &acked {
        match counting.get(id) {
            Some(e) if Some(e.seq) == o.seq && e.generation == o.generation => {}
            Some(e) => v.lost.push(format!(
                "{id} acknowledged as sequence {:?} of generation {} counts as sequence {} of generation {}",
                o.seq, o.generation, e.seq, e.generation
            )),
            None => v.lost.push(format!(
                "{id} acknowledged as sequence {:?} of generation {} does not count in the log",
                o.seq, o.generation
            )),
        }
    }

    // Deposed writes: what counts was neither refused nor invoked after a newer
    // generation's command started; and every counting event was attempted.
    let deposed = |id: &str, seen: &Seen, whence: &str| -> Option<String> {
        let op = ops.get(id)?;
        if op.outcome == Outcome::Fail {
            return Some(format!(
                "{id} of generation {} was answered FENCED but counts ({whence}, sequence {})",
                op.generation, seen.seq
            ));
        }
        let newer = starts
            .iter()
            .find(|(t, g, _, _)| *g > op.generation && *t < op.t0)?;
        Some(format!(
            "{id} of generation {} counts ({whence}, sequence {}) although invoked after generation {}'s command started (t={})",
            op.generation, seen.seq, newer.1, newer.0
        ))
    };
    for e in log.iter().filter(|e| e.counts) {
        match e.id.as_deref() {
            Some(id) if ops.contains_key(id) => v.deposed_counted.extend(deposed(id, e, "log")),
            _ => v.problems.push(format!(
                "event {} of generation {} counts but no operation of this trial wrote it",
                e.seq, e.generation
            )),
        }
    }

    // Reads: linearizable over acknowledged appends. A read sees every append
    // acknowledged before it was invoked, never un-sees what an earlier read saw counting,
    // and never sees a deposed write counting. An event a read shows `pending` (its
    // generation superseded, its cutoff not written yet) is undecided in that read: seen,
    // neither counting nor not.
    let reads: Vec<(usize, u64, u64, ReadView)> = history
        .iter()
        .filter_map(|l| match l {
            Line::Read {
                host,
                t0,
                t1,
                rc: 0,
                events,
            } => {
                let mut seen = BTreeMap::new();
                for e in events {
                    if let Some(id) = e.id.as_deref() {
                        if e.counts {
                            v.deposed_counted.extend(deposed(id, e, "a read"));
                        }
                        if e.counts || e.pending {
                            seen.insert(id, (e.seq, e.pending));
                        }
                    }
                }
                if events.iter().any(|e| e.pending) {
                    v.undecided_reads += 1;
                }
                Some((*host, *t0, *t1, seen))
            }
            _ => None,
        })
        .collect();
    v.reads = reads.len() as u64;
    for (host, t0, _, seen) in &reads {
        for (id, o) in &acked {
            if o.t1.is_some_and(|t1| t1 < *t0) && seen.get(id).map(|s| s.0) != o.seq {
                v.stale_reads.push(format!(
                    "a read from h{host} at t={t0} misses {id} (sequence {:?}), acknowledged at t={:?}",
                    o.seq, o.t1
                ));
            }
        }
    }
    for (h1, a0, a1, a) in &reads {
        for (h2, b0, _, b) in &reads {
            if a1 < b0 {
                let gone: Vec<&&str> = a
                    .iter()
                    .filter(|(id, (seq, pending))| {
                        !pending && b.get(*id).map(|s| s.0) != Some(*seq)
                    })
                    .map(|(id, _)| id)
                    .collect();
                if !gone.is_empty() {
                    v.stale_reads.push(format!(
                        "a read from h{h2} at t={b0} no longer sees as counting {gone:?}, which a read from h{h1} at t={a0} saw counting"
                    ));
                }
            }
        }
    }

    // Every acknowledged write, appends and store commits: (generation, completed).
    let mut store_gen: BTreeMap<&str, u64> = BTreeMap::new();
    let mut writes: Vec<(u64, u64)> = acked
        .iter()
        .filter_map(|(_, o)| o.t1.map(|t1| (o.generation, t1)))
        .collect();
    for l in history {
        match l {
            Line::StoreInvoke {
                key, generation, ..
            } => {
                store_gen.insert(key, *generation);
            }
            Line::StoreComplete {
                key,
                outcome: Outcome::Ok,
                t,
                ..
            } => writes.extend(store_gen.get(key.as_str()).map(|g| (*g, *t))),
            _ => {}
        }
    }

    // Failover: for each owner change, from the last acknowledged write of an older
    // generation to the newer generation's command start.
    for &(t, generation, _, _) in &starts {
        let last_old = writes
            .iter()
            .filter(|(g, t1)| *g < generation && *t1 < t)
            .map(|(_, t1)| *t1)
            .max();
        if let Some(t1) = last_old {
            v.failovers_ms.push((t - t1) / 1_000_000);
        }
    }

    // Unavailability: time in the window more than 1 s after the last acknowledged write.
    let (w0, w1) = window;
    v.window_ns = w1.saturating_sub(w0);
    let mut marks: Vec<u64> = writes
        .iter()
        .map(|(_, t1)| *t1)
        .filter(|t| (w0..=w1).contains(t))
        .collect();
    marks.sort_unstable();
    let mut prev = w0;
    for t in marks.into_iter().chain([w1]) {
        v.unavailable_ns += (t - prev).saturating_sub(AVAILABLE_GAP_NS);
        prev = t;
    }
    v
}

/// One store write, its invoke joined with its outcome.
#[derive(Debug, Clone)]
struct Put<'a> {
    value: &'a str,
    generation: u64,
    t0: u64,
    outcome: Outcome,
    rc: Option<i32>,
    code: Option<&'a str>,
    seq: Option<u64>,
}

/// Judge the store writes of `history` (`store_invoke` / `store_complete`) against its
/// final reads of the store (`store_read`, each a new owner's view caught up from the
/// engine), into `v` (definitions in the module docs of [`super`]): an acknowledged write
/// must be in every final read with its value (else **store_lost**); a write answered
/// `FENCED`, or invoked after a newer generation's command started, must be in none (else
/// **store_deposed_counted**); a write whose outcome is unknown may be in them or not. A
/// key no write put, a value other than its write's, no final read that succeeded, or one
/// that failed (a healthy run refused) are problems.
pub fn check_store(history: &[Line], v: &mut Verdict) {
    let mut puts: BTreeMap<&str, Put> = BTreeMap::new();
    let mut starts: Vec<(u64, u64)> = Vec::new(); // (t, generation)
    let mut reads = Vec::new();
    for l in history {
        match l {
            Line::StoreInvoke {
                key,
                value,
                generation,
                t,
                ..
            } => {
                let put = Put {
                    value,
                    generation: *generation,
                    t0: *t,
                    outcome: Outcome::Info,
                    rc: None,
                    code: None,
                    seq: None,
                };
                if puts.insert(key, put).is_some() {
                    v.problems.push(format!("store write {key} invoked twice"));
                }
            }
            Line::Start { generation, t, .. } => starts.push((*t, *generation)),
            Line::StoreRead {
                host, rc, docs, t0, ..
            } => reads.push((*host, *t0, *rc, docs)),
            _ => {}
        }
    }
    for l in history {
        if let Line::StoreComplete {
            key,
            outcome,
            rc,
            code,
            seq,
            ..
        } = l
        {
            match puts.get_mut(key.as_str()) {
                Some(p) => {
                    p.outcome = *outcome;
                    p.rc = Some(*rc);
                    p.code = code.as_deref();
                    p.seq = *seq;
                }
                None => v
                    .problems
                    .push(format!("store write {key} completed, never invoked")),
            }
        }
    }
    v.store_ops = puts.len() as u64;
    let count = |o: Outcome| puts.values().filter(|p| p.outcome == o).count() as u64;
    v.store_acked = count(Outcome::Ok);
    v.store_fenced = count(Outcome::Fail);
    v.store_unknown = count(Outcome::Info);
    starts.sort();

    let judged: Vec<_> = reads.iter().filter(|r| r.2 == 0).collect();
    v.store_reads = judged.len() as u64;
    for (host, t0, rc, _) in reads.iter().filter(|r| r.2 != 0) {
        v.problems.push(format!(
            "the final store read from h{host} (t={t0}) exited {rc}: a free run refused"
        ));
    }
    if judged.is_empty() {
        v.problems
            .push("no final read of the store succeeded: the store writes are not judged".into());
        return;
    }

    // Lost: every acknowledged write's key holds its value in every final read.
    for (key, p) in puts.iter().filter(|(_, p)| p.outcome == Outcome::Ok) {
        let wrong: Vec<String> = judged
            .iter()
            .filter_map(|(host, _, _, docs)| match docs.get(*key) {
                Some(val) if val == p.value => None,
                Some(val) => Some(format!("h{host} has {val:?}")),
                None => Some(format!("h{host} has no such key")),
            })
            .collect();
        if !wrong.is_empty() {
            v.store_lost.push(format!(
                "store write {key} = {:?} of generation {} acknowledged as commit {:?}, but in the final read {}",
                p.value,
                p.generation,
                p.seq,
                wrong.join(", ")
            ));
        }
    }

    // Deposed: nothing present was refused or invoked after a newer generation's command
    // started; and everything present was written by a write of this trial, as written.
    let mut deposed: BTreeSet<String> = BTreeSet::new();
    let mut problems: BTreeSet<String> = BTreeSet::new();
    for (host, _, _, docs) in &judged {
        for (key, val) in docs.iter() {
            let Some(p) = puts.get(key.as_str()) else {
                problems.insert(format!(
                    "the store holds {key} = {val:?} (final read from h{host}), which no write of this trial put"
                ));
                continue;
            };
            if val != p.value {
                problems.insert(format!(
                    "the store holds {key} = {val:?} (final read from h{host}), but its write put {:?}",
                    p.value
                ));
            }
            if p.outcome == Outcome::Fail {
                deposed.insert(format!(
                    "store write {key} of generation {} was answered {} (exit {}) but is in the store",
                    p.generation,
                    p.code.unwrap_or("FENCED"),
                    p.rc.unwrap_or(-1)
                ));
            } else if let Some((t, g)) = starts.iter().find(|(t, g)| *g > p.generation && *t < p.t0)
            {
                deposed.insert(format!(
                    "store write {key} of generation {} is in the store although invoked after generation {g}'s command started (t={t})",
                    p.generation
                ));
            }
        }
    }
    v.store_deposed_counted.extend(deposed);
    v.problems.extend(problems);
}
