//! The world of the engine model: actors running lease-core's machines over the in-memory
//! engine, the network holding requests, and every transition from a state.

use crate::checks::holds_acked;
use crate::common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::store_log::*;
use lease_core::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Do {
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
pub(crate) enum Op {
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
pub(crate) struct Actor {
    pub(crate) name: char,
    pub(crate) pid: u32,
    pub(crate) script: Vec<Do>,
    pub(crate) pc: usize,
    pub(crate) op: Option<Op>,
    pub(crate) pending: Option<Request>,
    pub(crate) lease: Option<OwnedLease>,
    pub(crate) tail: StoreTail,
    /// A commit whose answer was lost: resolved before anything else.
    pub(crate) unresolved: Option<CommitRecord>,
    /// A snapshot written: truncate behind it next.
    pub(crate) truncate: Option<FileRef>,
}

#[derive(Clone)]
pub(crate) struct World {
    pub(crate) disk: MemDisk,
    pub(crate) actors: Vec<Actor>,
    /// Requests held by the network, deliverable later.
    pub(crate) network: Vec<Request>,
    pub(crate) losses_left: u8,
    pub(crate) acked: Vec<(u64, Vec<u8>)>,
    pub(crate) refused: Vec<Vec<u8>>,
    /// Every store record that ever landed, by sequence (a ghost: truncation removes
    /// records from the engine, not from here), to judge acknowledged records a snapshot
    /// covers.
    pub(crate) landed: std::collections::BTreeMap<u64, Vec<u8>>,
    /// Reads without a lease told `CONCURRENT_CHANGE` (coverage only: not in the
    /// fingerprint).
    pub(crate) observer_retries: u32,
}

pub(crate) struct Config {
    pub(crate) name: &'static str,
    pub(crate) scripts: Vec<(char, Vec<Do>)>,
    pub(crate) losses: u8,
    pub(crate) max_states: usize,
}

pub(crate) fn world(c: &Config) -> World {
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
    pub(crate) fn fingerprint(&self) -> u128 {
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
    pub(crate) fn perform(&mut self, req: Request) -> Result<Response, String> {
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
    pub(crate) fn start(&mut self, i: usize) -> Option<String> {
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
    pub(crate) fn feed(&mut self, i: usize, input: Option<Response>) -> Result<(), String> {
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

    pub(crate) fn successors(&self) -> Vec<(World, String)> {
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
