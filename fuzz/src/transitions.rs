//! `transitions`: random action sequences of 2-3 actors through the real step machines.
//!
//! The idea is that of `lease-core/tests/model.rs` (the proptest), re-stated here so the
//! fuzzer can steer it by coverage: each actor runs at most one operation at a time (claim,
//! heartbeat, append, exact takeover, dead-owner retirement, release) over one shared
//! [`MemDisk`], and the input decides which actor performs its next request, so operations
//! interleave at request granularity. Actors can also crash (their process dies, the
//! in-flight operation and lease are dropped, a new incarnation starts with a new pid), the
//! clock can jump, and a record can be corrupted between operations.
//!
//! The ghost model shared with the proptest and the model checker (`lease_core::ghost`,
//! feature `ghost`) records what each actor was told; checked after every request and at
//! the end:
//!
//! - no generation is granted to two actors, an actor's generations increase, and a grant
//!   is above every grant completed before its operation started;
//! - the head generation never decreases;
//! - a takeover creates its epoch only over the generation and owner it observed, and a
//!   retirement only over a holder that is dead;
//! - a heartbeat that started after its owner was superseded never succeeds;
//! - no ownership change succeeds (and no epoch appears) while a record is invalid;
//! - at the end, a finalizing `ReadEvents` counts every append that returned success, and
//!   none that returned `FENCED` after creating its event; no event past its generation's
//!   cutoff counts; and both hash chains verify;
//! - no operation ever reports `PROTOCOL_VIOLATION`.
//!
//! # Input
//!
//! Byte 0, bit 0: 2 or 3 actors. Then two bytes per action: `a` and `p`. Actor =
//! `(a & 3) % n`; code = `a >> 4`:
//!
//! | code  | action |
//! |-------|--------|
//! | 0-5, 15 | the actor performs its next request |
//! | 6     | the actor runs its operation to the end |
//! | 7-9   | the actor starts operation `p % 6` (claim, heartbeat, append, takeover, retire, release) if it can |
//! | 10    | the actor starts an append |
//! | 11    | the clock advances `p * 250` ms |
//! | 12    | the actor crashes |
//! | 13    | if `p % 8 == 0`, the head epoch (`p / 8` even) or its heartbeat is corrupted |
//! | 14    | every actor runs its operation to the end |
//!
//! At the end every in-flight operation is run to completion, then the final checks run.

use crate::fixtures::{BOOT, id, run_id, t};
use lease_core::ghost::{
    Ghost, OpGhost, OpKind, Told, counted, simulated_evidence, within_cutoffs,
};
use lease_core::mem::MemDisk;
use lease_core::ops::{
    Append, AppendParams, Appended, Claim, ClaimParams, Expectation, Heartbeat, LivenessEvidence,
    Operation, OwnedLease, ReadEvents, Release, ReleaseParams, Request, Response, Retire,
    RetireParams, StatusView, Step, Takeover, TakeoverParams, TakeoverTrigger, Verify,
};
use lease_core::{
    EpochRecord, FileRef, Generation, Holder, Identity, LeaseError, TimingPolicy, decode,
};
use std::collections::BTreeSet;

/// Most actions read from one input.
pub const MAX_ACTIONS: usize = 4096;
/// Requests after which an operation is considered stuck (no operation needs nearly this
/// many: a claim gives up after a few lost races, an append after its collision limit).
const MAX_OP_REQUESTS: u32 = 50_000;

enum Op {
    Claim(Claim),
    Heartbeat(Heartbeat),
    Append(Append),
    Takeover(Takeover),
    Retire(Retire),
    Release(Release),
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Claim(_) => "claim",
            Op::Heartbeat(_) => "heartbeat",
            Op::Append(_) => "append",
            Op::Takeover(_) => "takeover",
            Op::Retire(_) => "retire",
            Op::Release(_) => "release",
        }
    }

    fn kind(&self) -> OpKind {
        match self {
            Op::Claim(_) => OpKind::Claim,
            Op::Heartbeat(_) => OpKind::Heartbeat,
            Op::Append(_) => OpKind::Append,
            Op::Takeover(_) => OpKind::Takeover,
            Op::Retire(_) => OpKind::Retire,
            Op::Release(_) => OpKind::Release,
        }
    }
}

enum Out {
    Lease(Option<OwnedLease>),
    Unit,
    Appended(Appended),
}

fn map<T>(s: Step<T>, f: impl FnOnce(T) -> Out) -> Step<Out> {
    match s {
        Step::Io(r) => Step::Io(r),
        Step::Done(r) => Step::Done(r.map(f)),
    }
}

struct Actor {
    name: &'static str,
    incarnation: u32,
    pid: u32,
    lease: Option<OwnedLease>,
    beats: u64,
    /// The operation in flight, with its ghost (the head when a heartbeat started, the
    /// event an append created, what a takeover observed).
    op: Option<(Op, OpGhost)>,
    input: Option<Response>,
    requests: u32,
}

impl Actor {
    fn holder(&self) -> Holder {
        Holder {
            host: id("host-a"),
            boot_id: id(BOOT),
            pid: self.pid,
            start_time: 5000 + u64::from(self.pid),
        }
    }
    fn owner_id(&self) -> Identity {
        id(&format!("{}-{}", self.name, self.incarnation))
    }
}

struct World {
    disk: MemDisk,
    actors: Vec<Actor>,
    now: u64,
    /// Processes alive, by pid (pids are never reused).
    alive: BTreeSet<u32>,
    next_pid: u32,
    /// What each actor was told (grants across incarnations are labelled by actor name),
    /// and the hand-corrupted records still on disk.
    ghost: Ghost,
    log: Vec<String>,
}

fn liveness(alive: &BTreeSet<u32>) -> impl Fn(&Holder) -> LivenessEvidence + '_ {
    move |h: &Holder| simulated_evidence(id(BOOT), h, alive.contains(&h.pid))
}

impl World {
    fn new(n: usize) -> World {
        let mut w = World {
            disk: MemDisk::new(),
            actors: Vec::new(),
            now: 0,
            alive: BTreeSet::new(),
            next_pid: 100,
            ghost: Ghost::new(),
            log: Vec::new(),
        };
        for name in ["a", "b", "c"].into_iter().take(n) {
            let pid = w.spawn_pid();
            w.actors.push(Actor {
                name,
                incarnation: 0,
                pid,
                lease: None,
                beats: 0,
                op: None,
                input: None,
                requests: 0,
            });
        }
        w
    }

    fn fail(&self, what: String) -> ! {
        panic!("{what}\ntrace:\n  {}", self.log.join("\n  "));
    }

    fn spawn_pid(&mut self) -> u32 {
        self.next_pid += 1;
        self.alive.insert(self.next_pid);
        self.next_pid
    }

    /// The epoch files, in generation order: `FileRef::Epoch` sorts before every other
    /// kind, so they are the range below the first heartbeat (checked after every request:
    /// a scan of every file, events included, made long inputs quadratic).
    fn epochs(&self) -> impl DoubleEndedIterator<Item = Generation> + '_ {
        let first_beat = FileRef::Beat(Generation::FIRST);
        self.disk
            .files
            .range(..first_beat)
            .filter_map(|(f, _)| match f {
                FileRef::Epoch(g) => Some(*g),
                _ => None,
            })
    }

    fn head(&self) -> Option<Generation> {
        self.epochs().next_back()
    }

    fn epoch_count(&self) -> usize {
        self.epochs().count()
    }

    fn epoch(&self, g: Generation) -> Option<EpochRecord> {
        decode::<EpochRecord>(self.disk.files.get(&FileRef::Epoch(g))?).ok()
    }

    fn start(&mut self, a: usize, kind: u8) {
        if self.actors[a].op.is_some() {
            return;
        }
        let now = t(self.now);
        let actor = &mut self.actors[a];
        let mut observed = None;
        let op = match (kind, actor.lease.clone()) {
            (0, None) => Op::Claim(Claim::new(ClaimParams {
                run_id: run_id(),
                owner_id: actor.owner_id(),
                holder: actor.holder(),
                policy: TimingPolicy::default(),
                now,
                store_floor: None,
            })),
            (1, Some(l)) => {
                actor.beats += 1;
                match Heartbeat::new(&l, now, actor.beats) {
                    Ok(h) => Op::Heartbeat(h),
                    Err(e) => self.fail(format!("heartbeat refused to start: {e}")),
                }
            }
            (2, Some(l)) => Op::Append(Append::new(
                &l,
                AppendParams {
                    event_type: id("e"),
                    payload: serde_json::json!({"by": actor.owner_id().as_str()}),
                    now,
                    tail_hint: None,
                },
            )),
            (3, None) => {
                // Observe atomically, then take over on what was seen (it may be stale by
                // the time the takeover's steps run: that is the race being tested).
                let alive = self.alive.clone();
                let view = self.disk.run(
                    &mut StatusView::read(run_id(), now, false),
                    &liveness(&alive),
                );
                let Ok(StatusView { head: Some(h), .. }) = view else {
                    return;
                };
                let expect = Expectation::of(&h);
                let actor = &mut self.actors[a];
                observed = Some(expect.clone());
                Op::Takeover(Takeover::new(TakeoverParams {
                    run_id: run_id(),
                    owner_id: actor.owner_id(),
                    holder: actor.holder(),
                    policy: TimingPolicy::default(),
                    now,
                    trigger: TakeoverTrigger::Operator {
                        watched_unchanged_ms: lease_core::ghost::simulated_watch(&expect, now),
                    },
                    expect,
                }))
            }
            (4, None) => Op::Retire(Retire::new(RetireParams {
                run_id: run_id(),
                owner_id: actor.owner_id(),
                holder: actor.holder(),
                policy: TimingPolicy::default(),
                now,
                expect: None,
            })),
            (5, Some(l)) => Op::Release(Release::new(ReleaseParams {
                lease: l,
                now,
                seal: None,
            })),
            _ => return,
        };
        let ghost = self.ghost.begin(op.kind(), observed);
        let actor = &mut self.actors[a];
        self.log.push(format!(
            "{} starts {} at +{} ms",
            actor.owner_id(),
            op.name(),
            self.now
        ));
        actor.op = Some((op, ghost));
        actor.input = None;
        actor.requests = 0;
    }

    /// Perform the actor's next request (or finish its operation).
    fn step(&mut self, a: usize) {
        let Some((mut op, mut ghost)) = self.actors[a].op.take() else {
            return;
        };
        let input = self.actors[a].input.take();
        self.actors[a].requests += 1;
        if self.actors[a].requests > MAX_OP_REQUESTS {
            self.fail(format!(
                "{} {}: no answer after {MAX_OP_REQUESTS} requests",
                self.actors[a].owner_id(),
                op.name()
            ));
        }
        let step = match &mut op {
            Op::Claim(o) => map(o.next(input), |l| Out::Lease(Some(l))),
            Op::Takeover(o) => map(o.next(input), |l| Out::Lease(Some(l))),
            Op::Retire(o) => map(o.next(input), |_| Out::Lease(None)),
            Op::Heartbeat(o) => {
                // The head when the heartbeat started (at its first request).
                if ghost.head_at_start.is_none() && input.is_none() {
                    ghost.note_head(self.head().map(Generation::get));
                }
                map(o.next(input), |_| Out::Unit)
            }
            Op::Append(o) => map(o.next(input), Out::Appended),
            Op::Release(o) => map(o.next(input), |_| Out::Unit),
        };
        match step {
            Step::Io(req) => {
                let event_create = matches!(req, Request::CreateExclusive(FileRef::Event(_), _));
                let epoch_create = match &req {
                    Request::CreateExclusive(FileRef::Epoch(g), _) => Some(*g),
                    _ => None,
                };
                self.ghost.on_request(&mut ghost, &req);
                let alive = self.alive.clone();
                let resp = self.disk.perform(req, &liveness(&alive));
                if let (Some(g), Response::Created) = (epoch_create, &resp) {
                    self.check_epoch_created(a, &op, &ghost, g);
                }
                self.ghost.on_response(&mut ghost, event_create, &resp);
                self.actors[a].input = Some(resp);
                self.actors[a].op = Some((op, ghost));
            }
            Step::Done(result) => self.finish(a, op, ghost, result),
        }
        self.check_step();
    }

    /// An operation of actor `a` just created epoch `g`.
    fn check_epoch_created(&mut self, a: usize, op: &Op, ghost: &OpGhost, g: Generation) {
        let who = self.actors[a].owner_id();
        self.log
            .push(format!("{who} {} created epoch {g}", op.name()));
        let prev = g.prev().and_then(|p| self.epoch(p).map(|e| (p, e)));
        let mine = self.actors[a].lease.as_ref().map(|l| l.generation);
        // Pids never revive: a holder whose pid is not alive is dead.
        let alive = |h: &Holder| self.alive.contains(&h.pid);
        if let Err(v) = self.ghost.check_epoch_created(
            ghost,
            g,
            prev.as_ref().map(|(p, e)| (*p, e)),
            alive,
            mine,
        ) {
            self.fail(format!("{who} {}: {v}", op.name()));
        }
    }

    fn finish(&mut self, a: usize, op: Op, ghost: OpGhost, result: Result<Out, LeaseError>) {
        let who = self.actors[a].owner_id();
        self.log.push(format!(
            "{who} {} -> {}",
            op.name(),
            match &result {
                Ok(Out::Lease(Some(l))) => format!("ok, generation {}", l.generation),
                Ok(Out::Appended(ap)) => format!("ok, event {}", ap.sequence),
                Ok(_) => "ok".to_string(),
                Err(e) => e.code().to_string(),
            }
        ));
        let told = match &result {
            Ok(Out::Lease(Some(l))) => Ok(Told::Granted(l.generation)),
            Ok(Out::Appended(ap)) => Ok(Told::Appended(ap.sequence.get())),
            Ok(_) => Ok(Told::Done),
            Err(e) => Err(e),
        };
        let actor = &self.actors[a];
        let mine = actor.lease.as_ref().map_or(0, |l| l.generation.get());
        if let Err(v) = self.ghost.finish(&ghost, actor.name, mine, told) {
            self.fail(format!("{who} {}: {v}", op.name()));
        }
        let actor = &mut self.actors[a];
        match (op, result) {
            (Op::Claim(_) | Op::Takeover(_), Ok(Out::Lease(Some(l)))) => {
                actor.lease = Some(l);
                actor.beats = 0;
            }
            (Op::Heartbeat(_) | Op::Release(_), Err(e)) if e.code() == "FENCED" => {
                actor.lease = None;
            }
            (Op::Release(_), Ok(_)) => {
                actor.lease = None;
            }
            (Op::Append(_), Ok(Out::Appended(ap))) if ap.superseded_by.is_some() => {
                actor.lease = None;
            }
            (Op::Append(_), Err(e)) if e.code() == "FENCED" => {
                actor.lease = None;
            }
            _ => {}
        }
    }

    fn run_to_end(&mut self, a: usize) {
        while self.actors[a].op.is_some() {
            self.step(a);
        }
    }

    fn drain(&mut self) {
        // Round-robin, so operations still interleave while they finish.
        loop {
            let busy: Vec<usize> = (0..self.actors.len())
                .filter(|&i| self.actors[i].op.is_some())
                .collect();
            if busy.is_empty() {
                return;
            }
            for i in busy {
                self.step(i);
            }
        }
    }

    fn crash(&mut self, a: usize) {
        let actor = &mut self.actors[a];
        self.log.push(format!("{} crashes", actor.owner_id()));
        self.alive.remove(&actor.pid);
        actor.op = None;
        actor.input = None;
        actor.lease = None;
        actor.incarnation += 1;
        let pid = self.spawn_pid();
        self.actors[a].pid = pid;
    }

    fn corrupt(&mut self, which: u8) {
        // Only between operations: an operation that observed the head before the
        // corruption may legitimately finish on what it saw.
        if self.actors.iter().any(|a| a.op.is_some()) {
            return;
        }
        let Some(h) = self.head() else { return };
        let target = if which.is_multiple_of(2) {
            FileRef::Epoch(h)
        } else {
            FileRef::Beat(h)
        };
        if !self.disk.files.contains_key(&target) {
            return;
        }
        self.log.push(format!("corrupt {target}"));
        self.disk
            .files
            .insert(target, b"{\"version\":\"runlease/epoch/1\"}\n".to_vec());
        let epochs = self.epoch_count();
        self.ghost.corrupt(target, epochs);
    }

    fn check_step(&mut self) {
        let head = self.head().map(Generation::get);
        if let Err(v) = self.ghost.observe_head(head, false) {
            self.fail(v);
        }
        if let Err(v) = self.ghost.check_no_new_epoch(self.epoch_count()) {
            self.fail(v);
        }
    }

    fn check_end(&mut self) {
        let alive = self.alive.clone();
        let view = self.disk.run(
            &mut ReadEvents::new(run_id(), Some((id("final-reader"), t(self.now)))),
            &liveness(&alive),
        );
        let view = match view {
            Ok(v) => v,
            Err(e) => {
                if !self.ghost.is_corrupted() {
                    self.fail(format!("the log must be readable: {e}"));
                }
                return;
            }
        };
        // I5, I9 and I4 (not I13, `ghost::generation_monotone`, which the proptest and the
        // model checker check).
        let counted = counted(&view);
        let checks = self
            .ghost
            .check_acknowledged(&counted)
            .and_then(|()| self.ghost.check_refused(&counted))
            .and_then(|()| within_cutoffs(&view));
        if let Err(v) = checks {
            self.fail(v);
        }
        if !self.ghost.is_corrupted()
            && let Err(e) = self.disk.run(&mut Verify::new(run_id()), &liveness(&alive))
        {
            self.fail(format!("the hash chains do not verify: {e}"));
        }
    }
}

/// The check of the `transitions` target.
pub fn check(data: &[u8]) {
    let _ = run(data);
}

/// Run an input and return the trace of what happened (for triage: `examples/show.rs`).
pub fn trace(data: &[u8]) -> Vec<String> {
    run(data)
}

fn run(data: &[u8]) -> Vec<String> {
    let Some((&first, rest)) = data.split_first() else {
        return Vec::new();
    };
    let n = 2 + usize::from(first & 1);
    let mut w = World::new(n);
    for pair in rest.chunks_exact(2).take(MAX_ACTIONS) {
        let (b, p) = (pair[0], pair[1]);
        let a = usize::from(b & 3) % n;
        match b >> 4 {
            6 => w.run_to_end(a),
            7..=9 => w.start(a, p % 6),
            10 => w.start(a, 2),
            11 => w.now += u64::from(p) * 250,
            12 => w.crash(a),
            13 if p % 8 == 0 => w.corrupt(p / 8),
            14 => w.drain(),
            _ => w.step(a),
        }
    }
    w.drain();
    w.check_end();
    w.log
}
