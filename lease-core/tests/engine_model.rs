//! Exhaustive, bounded, breadth-first model check of the engine-committed store (PROTOCOL.md
//! §18, issue #32) *as implemented*: lease-core's step machines (claim, retire, the store
//! log's read and commit) over an etcd-like engine, the in-memory authority, whose every
//! request is one atomic step (a guarded create is one transaction with its compares).
//!
//! The network is the nemesis. Any request of a store commit may be answered, have its
//! answer lost after it took effect, or be held in the network (a partition) and delivered
//! at any later point, or never; an actor whose answer is lost resolves the commit with the
//! same record ([`CommitRecord::again`]), as lease-run does. Owners on other hosts retire the
//! owner (its etcd lease expired while it was cut off: the engine's liveness says dead),
//! claim, catch up by reading the log, and commit, while the deposed owner keeps trying.
//! Owners also snapshot and truncate the log behind the snapshot (§18.5) while a reader
//! without a lease reads it (`runlease store get` over etcd), and reads again when told
//! `CONCURRENT_CHANGE`.
//!
//! Checked in every state: **S1** every acknowledged record is in the log, byte for byte;
//! **S2** no record of a generation lands once an epoch above it exists (checked when it
//! lands, including a late delivery), and no record whose writer was told `FENCED` or
//! `CONCURRENT_CHANGE` is ever in the log; **S3** the log reads as one valid chain, and a
//! slot is never held by two different records over time; and, when a read answers (an
//! owner's catch-up or a reader's), it holds every record acknowledged before it began:
//! among its records, or folded into its snapshot (whose `through_hash` leads back to it).
//!
//! `RUNLEASE_MODEL=ci` (`cargo xtask model`) and `deep` (`cargo xtask model --deep`)
//! explore larger configurations than the default `cargo test` bound.

mod common;

use common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::store_log::*;
use lease_core::*;
use std::collections::{HashSet, VecDeque};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Do {
    Claim,
    /// Retire the owner whose etcd lease expired (the engine says it is gone).
    Retire,
    /// Catch up: read the log as the owner.
    Read,
    Commit,
    /// Snapshot the owner's view at its tail, then truncate the log behind it (§18.5).
    Snapshot,
    /// Read the log without a lease (a reader on any host: `runlease store get` over etcd).
    Observe,
}

#[derive(Clone, Debug)]
enum Op {
    Claim(Claim),
    Retire(Retire),
    /// With the number of records acknowledged when it began.
    Read(ReadStoreLog, usize),
    Commit(CommitRecord),
    Snapshot(WriteSnapshot),
    Truncate(TruncateStoreLog),
    /// With the number of records acknowledged when it began.
    Observe(ReadStoreLog, usize),
}

#[derive(Clone, Debug)]
struct Actor {
    name: char,
    pid: u32,
    script: Vec<Do>,
    pc: usize,
    op: Option<Op>,
    pending: Option<Request>,
    lease: Option<OwnedLease>,
    tail: StoreTail,
    /// A commit whose answer was lost: resolved before anything else.
    unresolved: Option<CommitRecord>,
    /// A snapshot written: truncate behind it next.
    truncate: Option<FileRef>,
}

#[derive(Clone)]
struct World {
    disk: MemDisk,
    actors: Vec<Actor>,
    /// Requests held by the network, deliverable later.
    network: Vec<Request>,
    losses_left: u8,
    acked: Vec<(u64, Vec<u8>)>,
    refused: Vec<Vec<u8>>,
    /// Every store record that ever landed, by sequence (a ghost: truncation removes
    /// records from the engine, not from here), to judge acknowledged records a snapshot
    /// covers.
    landed: std::collections::BTreeMap<u64, Vec<u8>>,
    /// Reads without a lease told `CONCURRENT_CHANGE` (coverage only: not in the
    /// fingerprint).
    observer_retries: u32,
}

struct Config {
    name: &'static str,
    scripts: Vec<(char, Vec<Do>)>,
    losses: u8,
    max_states: usize,
}

fn world(c: &Config) -> World {
    World {
        disk: MemDisk::new(),
        actors: c
            .scripts
            .iter()
            .enumerate()
            .map(|(i, (name, script))| Actor {
                name: *name,
                pid: i as u32 + 1,
                script: script.clone(),
                pc: 0,
                op: None,
                pending: None,
                lease: None,
                tail: StoreTail::default(),
                unresolved: None,
                truncate: None,
            })
            .collect(),
        network: Vec::new(),
        losses_left: c.losses,
        acked: Vec::new(),
        refused: Vec::new(),
        landed: Default::default(),
        observer_retries: 0,
    }
}

impl World {
    fn fingerprint(&self) -> u128 {
        let actors: Vec<String> = self
            .actors
            .iter()
            .map(|a| {
                format!(
                    "{}{}:{:?}:{:?}:{:?}:{:?}:{:?}:{:?}",
                    a.name,
                    a.pc,
                    a.op,
                    a.pending,
                    a.lease.as_ref().map(|l| l.generation),
                    a.tail,
                    a.unresolved.as_ref().map(|u| u.record().to_vec()),
                    a.truncate
                )
            })
            .collect();
        hash128(&format!(
            "{:?}|{actors:?}|{:?}|{}|{:?}|{:?}|{:?}",
            self.disk.files, self.network, self.losses_left, self.acked, self.refused, self.landed
        ))
    }

    /// Perform `req` on the engine; a store record that lands is checked against S2.
    fn perform(&mut self, req: Request) -> Result<Response, String> {
        // Any request that creates a store record (a guarded create, or a plain one a
        // wrong machine might send) is judged when it lands.
        let landing = match &req {
            Request::CreateGuarded {
                file: FileRef::StoreRecord(_),
                bytes,
                ..
            }
            | Request::CreateExclusive(FileRef::StoreRecord(_), bytes) => Some(bytes.clone()),
            _ => None,
        };
        let epochs_before: Vec<u64> = self
            .disk
            .files
            .keys()
            .filter_map(|f| match f {
                FileRef::Epoch(g) => Some(g.get()),
                _ => None,
            })
            .collect();
        let resp = self.disk.perform(req, &all_dead);
        if let (Some(bytes), Response::Created) = (landing, &resp) {
            let r: StoreRecord = decode(&bytes).map_err(|e| e.to_string())?;
            let g = r.generation.get();
            if let Some(h) = epochs_before.iter().find(|h| **h > g) {
                return Err(format!(
                    "S2: record {} of generation {g} landed after epoch {h} existed",
                    r.sequence.get()
                ));
            }
            // A slot a truncation emptied may be filled again by a late delivery of the
            // same record (the guard lets the current owner's own late request in); a
            // different record there would be a fork.
            let seq = r.sequence.get();
            match self.landed.get(&seq) {
                Some(before) if *before != bytes => {
                    return Err(format!(
                        "S3: slot {seq} held two different records over time"
                    ));
                }
                _ => {
                    self.landed.insert(seq, bytes);
                }
            }
        }
        Ok(resp)
    }

    /// Start actor `i`'s next operation; `None` if it has nothing to do.
    fn start(&mut self, i: usize) -> Option<String> {
        let a = &mut self.actors[i];
        if a.op.is_some() {
            return None;
        }
        let name = a.name.to_string();
        let (op, line) = if let Some(u) = &a.unresolved {
            (
                Op::Commit(u.again()),
                format!("{name} resolves record {}", u.sequence().get()),
            )
        } else if let Some(file) = a.truncate.take() {
            (
                Op::Truncate(TruncateStoreLog::new(file)),
                format!("{name} truncates behind {file}"),
            )
        } else {
            let what = *a.script.get(a.pc)?;
            a.pc += 1;
            match what {
                Do::Claim => (
                    Op::Claim(Claim::new(ClaimParams {
                        run_id: run_id(),
                        owner_id: id(&name),
                        holder: holder(a.pid),
                        policy: TimingPolicy::default(),
                        now: t(100),
                        store_floor: None,
                    })),
                    format!("{name} claims"),
                ),
                Do::Retire => (
                    Op::Retire(Retire::new(RetireParams {
                        run_id: run_id(),
                        owner_id: id(&name),
                        holder: holder(a.pid),
                        policy: TimingPolicy::default(),
                        now: t(100),
                        expect: None,
                    })),
                    format!("{name} retires the owner"),
                ),
                Do::Read => {
                    let l = a.lease.as_ref()?;
                    (
                        Op::Read(
                            ReadStoreLog::new(run_id(), Some(l.generation), 0),
                            self.acked.len(),
                        ),
                        format!("{name} reads the log"),
                    )
                }
                Do::Commit => {
                    let l = a.lease.as_ref()?;
                    let b = RecordBatch {
                        id: id(&format!("{name}{}", a.pc)),
                        writes: vec![RecordWrite {
                            key: "k".into(),
                            value: Some(Blob(vec![a.pc as u8])),
                        }],
                        log: vec![],
                    };
                    let op = CommitRecord::new(
                        l,
                        CommitParams {
                            tail: a.tail.clone(),
                            batches: vec![b],
                            now: t(100),
                            budget: DEFAULT_BUDGET_BYTES,
                        },
                    )
                    .ok()?;
                    let line = format!("{name} commits record {}", op.sequence().get());
                    (Op::Commit(op), line)
                }
                Do::Snapshot => {
                    let l = a.lease.as_ref()?;
                    let (through, _) = a.tail.last.clone()?;
                    // The image stands for the view's contents (never read back here: the
                    // model judges records, and a snapshot by its manifest's chain).
                    let image = format!("image of {name} through {}", through.get()).into_bytes();
                    let nonce = u64::from(a.pid) * 100 + a.pc as u64;
                    let op = WriteSnapshot::new(l, &a.tail, image, nonce, t(100)).ok()?;
                    (
                        Op::Snapshot(op),
                        format!("{name} snapshots through {}", through.get()),
                    )
                }
                Do::Observe => (
                    Op::Observe(ReadStoreLog::new(run_id(), None, 0), self.acked.len()),
                    format!("{name} reads the log without a lease"),
                ),
            }
        };
        a.op = Some(op);
        Some(line)
    }

    /// Feed actor `i`'s operation `input`; store its next request or finish it.
    fn feed(&mut self, i: usize, input: Option<Response>) -> Result<(), String> {
        let a = &mut self.actors[i];
        let Some(op) = a.op.as_mut() else {
            return Ok(());
        };
        macro_rules! drive {
            ($m:expr, $done:ident => $body:block) => {
                match $m.next(input) {
                    Step::Io(r) => {
                        a.pending = Some(r);
                        return Ok(());
                    }
                    Step::Done($done) => $body,
                }
            };
        }
        match op {
            Op::Claim(m) => drive!(m, r => {
                a.op = None;
                if let Ok(l) = r {
                    a.lease = Some(l);
                    a.tail = StoreTail::default();
                }
            }),
            Op::Retire(m) => drive!(m, _r => { a.op = None; }),
            Op::Read(m, acked_before) => {
                let before = *acked_before;
                drive!(m, r => {
                    a.op = None;
                    match r {
                        Ok(view) => {
                            holds_acked(&self.landed, &self.acked[..before], &view)
                                .map_err(|e| format!("a catch-up read lacks acknowledged {e}"))?;
                            a.tail = view.tail;
                        }
                        Err(e) if e.code() == Code::Fenced => a.lease = None,
                        Err(e) => return Err(format!("an owner's read of a valid log failed: {e}")),
                    }
                })
            }
            Op::Commit(m) => {
                let bytes = m.record().to_vec();
                drive!(m, r => {
                    a.op = None;
                    a.unresolved = None;
                    match r {
                        Ok(c) => {
                            self.acked.push((c.sequence.get(), bytes));
                            a.tail = c.tail;
                        }
                        Err(e) if matches!(e.code(), Code::Fenced | Code::ConcurrentChange) => {
                            self.refused.push(bytes);
                            if e.code() == Code::Fenced {
                                a.lease = None;
                            }
                        }
                        Err(e) => return Err(format!("a commit failed unexpectedly: {e}")),
                    }
                })
            }
            Op::Snapshot(m) => drive!(m, r => {
                a.op = None;
                match r {
                    Ok(file) => a.truncate = Some(file),
                    Err(e) if e.code() == Code::Fenced => a.lease = None,
                    Err(e) => return Err(format!("a snapshot failed unexpectedly: {e}")),
                }
            }),
            Op::Truncate(m) => drive!(m, r => {
                a.op = None;
                if let Err(e) = r {
                    return Err(format!("a truncation failed: {e}"));
                }
            }),
            Op::Observe(m, acked_before) => {
                let before = *acked_before;
                drive!(m, r => {
                    a.op = None;
                    match r {
                        Ok(view) => {
                            holds_acked(&self.landed, &self.acked[..before], &view)
                                .map_err(|e| format!("a reader without a lease lacks acknowledged {e}"))?;
                        }
                        // A truncation under the read: the reader reads again (EngineReader).
                        Err(e) if e.code() == Code::ConcurrentChange => {
                            a.pc -= 1;
                            self.observer_retries += 1;
                        }
                        Err(e) => return Err(format!("a reader's read of a valid log failed: {e}")),
                    }
                })
            }
        }
        Ok(())
    }

    fn successors(&self) -> Vec<(World, String)> {
        let mut out = Vec::new();
        for i in 0..self.actors.len() {
            let a = &self.actors[i];
            if a.op.is_none() {
                let mut w = self.clone();
                if let Some(line) = w.start(i) {
                    let r = w.feed(i, None);
                    out.push(w.checked(r, line));
                }
                continue;
            }
            let Some(req) = a.pending.clone() else {
                continue;
            };
            let who = a.name;
            // Answered.
            let mut w = self.clone();
            w.actors[i].pending = None;
            let r = w
                .perform(req.clone())
                .and_then(|resp| w.feed(i, Some(resp)));
            let again = if w.observer_retries > self.observer_retries {
                " (a truncation under the read: it reads again)"
            } else {
                ""
            };
            out.push(w.checked(r, format!("{who}: {} answered{again}", describe(&req))));
            // A store commit's or a snapshot's request, lost: its answer (it landed), or
            // itself (held). A commit is then resolved; a snapshot is abandoned (its
            // writer counts it failed and writes the next one with another nonce).
            let commit = matches!(self.actors[i].op, Some(Op::Commit(_)));
            let snapshot = matches!(self.actors[i].op, Some(Op::Snapshot(_)));
            if (commit || snapshot) && self.losses_left > 0 {
                for landed in [true, false] {
                    let mut w = self.clone();
                    w.losses_left -= 1;
                    let a = &mut w.actors[i];
                    a.pending = None;
                    if let Some(Op::Commit(m)) = a.op.take() {
                        a.unresolved = Some(m);
                    }
                    let r = if landed {
                        w.perform(req.clone()).map(|_| ())
                    } else {
                        w.network.push(req.clone());
                        Ok(())
                    };
                    let what = if landed {
                        "took effect, its answer lost"
                    } else {
                        "held by the network"
                    };
                    out.push(w.checked(r, format!("{who}: {} {what}", describe(&req))));
                }
            }
        }
        for k in 0..self.network.len() {
            let mut w = self.clone();
            let req = w.network.remove(k);
            let r = w.perform(req.clone()).map(|_| ());
            out.push(w.checked(r, format!("the network delivers {} late", describe(&req))));
        }
        out
    }

    fn checked(mut self, r: Result<(), String>, line: String) -> (World, String) {
        let line = match r.and_then(|()| self.check()) {
            Ok(()) => line,
            Err(e) => format!("{line}\n  VIOLATION: {e}"),
        };
        (self, line)
    }

    /// S1, S2 (refused records never in the log) and S3 (one valid chain).
    fn check(&mut self) -> Result<(), String> {
        // S3 first: the log as any reader reads it, whole.
        let mut d = self.disk.clone();
        let view = d
            .run(&mut ReadStoreLog::new(run_id(), None, 0), &all_dead)
            .map_err(|e| format!("S3: the log does not read as one chain: {e}"))?;
        for (seq, bytes) in &self.acked {
            let f = FileRef::StoreRecord(Sequence::new(*seq).unwrap());
            if self.landed.get(seq) != Some(bytes) {
                return Err(format!("S1: acknowledged record {seq} never landed"));
            }
            // In the engine as it was acknowledged, or folded into the snapshot readers
            // start from (its chain leads back to it).
            if self.disk.files.get(&f) != Some(bytes) {
                covers(&self.landed, &view, *seq, bytes)
                    .map_err(|e| format!("S1: acknowledged record {seq} is not in the log: {e}"))?;
            }
        }
        let log: Vec<&Vec<u8>> = self
            .disk
            .files
            .iter()
            .filter(|(f, _)| matches!(f, FileRef::StoreRecord(_)))
            .map(|(_, b)| b)
            .collect();
        for bytes in &self.refused {
            if log.contains(&bytes) {
                return Err("S2: a record its writer was told was refused is in the log".into());
            }
        }
        Ok(())
    }
}

/// Whether the log `view` (as a read answered it) holds every record of `acked` (those
/// acknowledged before the read began); the first it lacks, as `record N: why`.
fn holds_acked(
    landed: &std::collections::BTreeMap<u64, Vec<u8>>,
    acked: &[(u64, Vec<u8>)],
    view: &StoreLogView,
) -> Result<(), String> {
    for (seq, bytes) in acked {
        covers(landed, view, *seq, bytes).map_err(|e| format!("record {seq}: {e}"))?;
    }
    Ok(())
}

/// Whether the log `view` (as a reader found it) holds the acknowledged record `seq`
/// (`bytes`): among its records, or folded into its snapshot, whose `through_hash` leads
/// back along the landed records' `prev_hash` links to exactly these bytes.
fn covers(
    landed: &std::collections::BTreeMap<u64, Vec<u8>>,
    view: &StoreLogView,
    seq: u64,
    bytes: &[u8],
) -> Result<(), String> {
    let h = Digest::of(bytes);
    if view
        .records
        .iter()
        .any(|x| x.record.sequence.get() == seq && x.hash == h)
    {
        return Ok(());
    }
    let Some((_, m)) = view
        .snapshot
        .as_ref()
        .filter(|(_, m)| m.through.get() >= seq)
    else {
        return Err("not among the records read and no snapshot covers it".into());
    };
    let mut k = m.through.get();
    let mut want = m.through_hash.clone();
    loop {
        let Some(b) = landed.get(&k) else {
            return Err(format!(
                "the snapshot's chain reaches record {k}, which never landed"
            ));
        };
        if Digest::of(b) != want {
            return Err(format!(
                "the snapshot's chain does not lead to the record {k} that landed"
            ));
        }
        if k == seq {
            return if b.as_slice() == bytes {
                Ok(())
            } else {
                Err(format!("the snapshot folds in another record {seq}"))
            };
        }
        let r: StoreRecord = decode(b).map_err(|e| e.to_string())?;
        want = r.prev_hash.ok_or("the chain ends before the record")?;
        k -= 1;
    }
}

fn describe(r: &Request) -> String {
    match r {
        Request::CreateGuarded { file, .. } => format!("guarded create of {file}"),
        Request::CreateExclusive(f, _) => format!("create of {f}"),
        Request::Read(f) => format!("read of {f}"),
        Request::List(d) => format!("list of {}", d.path()),
        other => format!("{other:?}").chars().take(60).collect(),
    }
}

fn hash128(s: &str) -> u128 {
    use std::hash::{Hash, Hasher};
    let mut a = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut a);
    let mut b = std::collections::hash_map::DefaultHasher::new();
    (s.len(), s).hash(&mut b);
    b.write_u64(0x9e37_79b9_7f4a_7c15);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

/// What the exploration covered (so a run that never reached the cases it is for says so):
/// distinct states in which some record was refused; checked transitions that lost an
/// answer, held a request, delivered one late, or started a resolution. A late delivery
/// seldom makes a new state: the guard makes it inert (it lands as the lost answer's
/// landing would have, or is refused), which is the point.
#[derive(Debug, Default)]
struct Coverage {
    refused: usize,
    lost: usize,
    held: usize,
    late: usize,
    resolutions: usize,
    /// Truncations started, and reads without a lease that met a truncation (and so read
    /// again: the state after is one seen before, so these are counted as transitions).
    truncations: usize,
    observer_retries: usize,
}

/// Breadth-first exploration: ((states, shortest violating trace), what it covered).
fn explore_covering(c: &Config) -> ((usize, Option<Vec<String>>), Coverage) {
    let mut cov = Coverage::default();
    let start = world(c);
    let mut seen: HashSet<u128> = HashSet::new();
    seen.insert(start.fingerprint());
    let mut links: Vec<(usize, String)> = vec![(usize::MAX, "start".into())];
    let mut queue: VecDeque<(World, usize)> = VecDeque::from([(start, 0)]);
    while let Some((w, idx)) = queue.pop_front() {
        for (next, line) in w.successors() {
            if line.contains("VIOLATION") {
                let mut steps = vec![line];
                let mut i = idx;
                while i != 0 && i != usize::MAX {
                    steps.push(links[i].1.clone());
                    i = links[i].0;
                }
                steps.reverse();
                return ((seen.len(), Some(steps)), cov);
            }
            // Every successor was checked (`World::checked`), new or not.
            cov.lost += usize::from(line.contains("answer lost"));
            cov.held += usize::from(line.contains("held by the network"));
            cov.late += usize::from(line.contains("late"));
            cov.resolutions += usize::from(line.contains("resolves"));
            cov.truncations += usize::from(line.contains("truncates"));
            cov.observer_retries += usize::from(line.contains("reads again"));
            if seen.insert(next.fingerprint()) {
                cov.refused += usize::from(!next.refused.is_empty());
                links.push((idx, line));
                if seen.len() < c.max_states {
                    queue.push_back((next, links.len() - 1));
                }
            }
        }
    }
    ((seen.len(), None), cov)
}

fn configs(mode: &str) -> Vec<Config> {
    use Do::*;
    let scale = match mode {
        "deep" => 8.0,
        "ci" => 1.0,
        _ => 0.05,
    };
    let cap = |n: f64| (n * scale) as usize;
    let deep = mode == "deep";
    let mut a = vec![Claim, Commit, Commit];
    let mut b = vec![Retire, Claim, Read, Commit];
    if mode == "ci" || deep {
        a.push(Commit);
        b.push(Commit);
    }
    if deep {
        a.push(Commit);
    }
    vec![
        Config {
            name: "owner committing with lost answers vs a taker on another host (retire, claim, catch up, commit)",
            scripts: vec![('a', a.clone()), ('b', b.clone())],
            losses: if deep { 4 } else { 2 },
            max_states: cap(150_000.0),
        },
        Config {
            name: "two takers in turn, the deposed owners' commits in flight",
            scripts: vec![
                ('a', vec![Claim, Commit, Commit]),
                ('b', vec![Retire, Claim, Read, Commit, Commit]),
                ('c', vec![Retire, Claim, Read, Commit]),
            ],
            losses: if deep { 2 } else { 1 },
            max_states: cap(150_000.0),
        },
        Config {
            name: "snapshots and truncation by an owner and its taker, a reader without a lease, lost answers",
            scripts: vec![
                ('a', vec![Claim, Commit, Commit, Snapshot, Commit]),
                ('b', vec![Retire, Claim, Read, Commit, Snapshot, Commit]),
                ('o', vec![Observe, Observe]),
            ],
            losses: if deep { 2 } else { 1 },
            max_states: cap(150_000.0),
        },
    ]
}

#[test]
// A test of lease-core, not lease-core: it reads its bound from the environment
// (`cargo xtask model` sets it) and times itself for the report line.
#[expect(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "the test's own configuration and timing, not the core's"
)]
fn engine_model_check_the_store_log_as_implemented() {
    let mode = std::env::var("RUNLEASE_MODEL").unwrap_or_default();
    for c in configs(&mode) {
        let started = std::time::Instant::now();
        let ((states, violation), cov) = explore_covering(&c);
        if let Some(trace) = violation {
            panic!(
                "engine model ({}): invariant violated after {states} states:\n{}",
                c.name,
                trace.join("\n")
            );
        }
        println!(
            "engine model states explored: {states}, invariant violations: 0 ({}; {}; {:.1} s)",
            c.name,
            if states < c.max_states {
                "exhaustive"
            } else {
                "bounded"
            },
            started.elapsed().as_secs_f64()
        );
        println!("engine model coverage: {cov:?}");
        assert!(states > 50, "the model explored too little: {states}");
        assert!(
            cov.refused > 0 && cov.lost > 0 && cov.held > 0 && cov.late > 0 && cov.resolutions > 0,
            "the model did not reach every case it is for: {cov:?}"
        );
        if c.name.starts_with("snapshots") {
            // A reader racing a truncation needs more than the default bound's states.
            assert!(
                cov.truncations > 0 && cov.observer_retries > 0,
                "the snapshot configuration did not truncate under a reader: {cov:?}"
            );
        }
    }
}

/// The checker can fail: a committer that takes any record found in its slot for its own
/// (no comparison of the bytes) is caught (the planted bug is in this test's own copy of
/// the answer handling: an `AlreadyExists` answered as `Created`).
#[test]
fn engine_model_catches_a_commit_acknowledged_without_its_record() {
    let c = Config {
        name: "planted bug",
        scripts: vec![
            ('a', vec![Do::Claim, Do::Commit, Do::Commit]),
            ('b', vec![Do::Retire, Do::Claim, Do::Read, Do::Commit]),
        ],
        losses: 1,
        max_states: 200_000,
    };
    let mut start = world(&c);
    // Drive a schedule by hand: a claims and its commit's request is held by the network;
    // b retires a, claims, reads and commits into the same slot; the planted bug then
    // answers a's resolution (which finds b's record) as committed.
    let mut w = start.clone();
    let run = |w: &mut World, i: usize| {
        w.start(i);
        w.feed(i, None).unwrap();
        while let Some(req) = w.actors[i].pending.take() {
            let resp = w.perform(req).unwrap();
            w.feed(i, Some(resp)).unwrap();
        }
    };
    run(&mut w, 0); // a claims
    w.start(0);
    w.feed(0, None).unwrap();
    let held = w.actors[0].pending.take().unwrap();
    if let Some(Op::Commit(m)) = w.actors[0].op.take() {
        w.actors[0].unresolved = Some(m);
    }
    w.network.push(held);
    for _ in 0..4 {
        run(&mut w, 1); // b: retire, claim, read, commit
    }
    assert_eq!(w.acked.len(), 1, "b's commit is acknowledged");
    // The planted bug: a's resolution is told "committed" whatever the slot holds.
    let u = w.actors[0].unresolved.take().unwrap();
    w.acked.push((u.sequence().get(), u.record().to_vec()));
    let e = w.check().unwrap_err();
    assert!(e.starts_with("S1"), "{e}");
    // And the real machine, on the same schedule, is told FENCED and the state is valid.
    let mut ok = start.clone();
    run(&mut ok, 0);
    ok.start(0);
    ok.feed(0, None).unwrap();
    let held = ok.actors[0].pending.take().unwrap();
    if let Some(Op::Commit(m)) = ok.actors[0].op.take() {
        ok.actors[0].unresolved = Some(m);
    }
    ok.network.push(held);
    for _ in 0..4 {
        run(&mut ok, 1);
    }
    run(&mut ok, 0); // a resolves
    assert_eq!(ok.refused.len(), 1, "a's record is refused");
    ok.check().unwrap();
    start.check().unwrap();
}
