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
//! A ghost model records what each actor was told; checked after every request and at the
//! end:
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
use lease_core::mem::MemDisk;
use lease_core::ops::{
    Append, AppendParams, Appended, Claim, ClaimParams, Expectation, Heartbeat, LivenessEvidence,
    Operation, OwnedLease, OwnerLock, ProcessState, ReadEvents, Release, ReleaseParams, Request,
    Response, Retire, RetireParams, StatusView, Step, Takeover, TakeoverParams, TakeoverTrigger,
    Verify,
};
use lease_core::{
    EpochRecord, FileRef, Generation, Holder, Identity, LeaseError, Sequence, TimingPolicy, decode,
};
use std::collections::BTreeSet;

/// Most actions read from one input.
pub const MAX_ACTIONS: usize = 4096;
/// Requests after which an operation is considered stuck (no operation needs nearly this
/// many: a claim gives up after a few lost races, an append after its collision limit).
const MAX_OP_REQUESTS: u32 = 50_000;

enum Op {
    Claim(Claim),
    /// The head generation when the heartbeat started (set at its first request).
    Heartbeat(Heartbeat, Option<Generation>),
    /// The sequence of the event this append created, if any.
    Append(Append, Option<Sequence>),
    /// What the taker observed.
    Takeover(Takeover, Expectation),
    Retire(Retire),
    Release(Release),
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Claim(_) => "claim",
            Op::Heartbeat(..) => "heartbeat",
            Op::Append(..) => "append",
            Op::Takeover(..) => "takeover",
            Op::Retire(_) => "retire",
            Op::Release(_) => "release",
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
    op: Option<Op>,
    input: Option<Response>,
    requests: u32,
    /// Every generation this actor was ever granted (across incarnations).
    granted: Vec<Generation>,
    /// `World::max_granted` when the in-flight operation started.
    granted_max_at_start: u64,
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
    nonce: u64,
    /// Processes alive, by pid (pids are never reused).
    alive: BTreeSet<u32>,
    next_pid: u32,
    /// Ghost: sequences whose append returned success.
    acked: BTreeSet<u64>,
    /// Ghost: sequences created by an append that then answered FENCED.
    refused: BTreeSet<u64>,
    /// Highest head generation ever observed.
    max_head: u64,
    /// Highest generation ever granted to an actor.
    max_granted: u64,
    /// An invalid record was injected: no ownership change may succeed until it is gone.
    /// Hand-corrupted records still on disk: while any is, no ownership change may succeed.
    corrupted: BTreeSet<FileRef>,
    epochs_at_corruption: usize,
    log: Vec<String>,
}

fn liveness(alive: &BTreeSet<u32>) -> impl Fn(&Holder) -> LivenessEvidence + '_ {
    move |h: &Holder| {
        let up = alive.contains(&h.pid);
        LivenessEvidence {
            observer_boot_id: id(BOOT),
            process: if up {
                ProcessState::Running {
                    start_time: h.start_time,
                }
            } else {
                ProcessState::Gone
            },
            owner_lock: if up { OwnerLock::Held } else { OwnerLock::Free },
        }
    }
}

impl World {
    fn new(n: usize) -> World {
        let mut w = World {
            disk: MemDisk::new(),
            actors: Vec::new(),
            now: 0,
            nonce: 0,
            alive: BTreeSet::new(),
            next_pid: 100,
            acked: BTreeSet::new(),
            refused: BTreeSet::new(),
            max_head: 0,
            max_granted: 0,
            corrupted: BTreeSet::new(),
            epochs_at_corruption: 0,
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
                granted: Vec::new(),
                granted_max_at_start: 0,
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

    fn head(&self) -> Option<Generation> {
        self.disk
            .files
            .keys()
            .filter_map(|f| match f {
                FileRef::Epoch(g) => Some(*g),
                _ => None,
            })
            .max()
    }

    fn epoch_count(&self) -> usize {
        self.disk
            .files
            .keys()
            .filter(|f| matches!(f, FileRef::Epoch(_)))
            .count()
    }

    fn epoch(&self, g: Generation) -> Option<EpochRecord> {
        decode::<EpochRecord>(self.disk.files.get(&FileRef::Epoch(g))?).ok()
    }

    fn start(&mut self, a: usize, kind: u8) {
        if self.actors[a].op.is_some() {
            return;
        }
        let now = t(self.now);
        self.nonce += 1;
        let nonce = self.nonce;
        let actor = &mut self.actors[a];
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
                    Ok(h) => Op::Heartbeat(h, None),
                    Err(e) => self.fail(format!("heartbeat refused to start: {e}")),
                }
            }
            (2, Some(l)) => Op::Append(
                Append::new(
                    &l,
                    AppendParams {
                        event_type: id("e"),
                        payload: serde_json::json!({"by": actor.owner_id().as_str()}),
                        now,
                        tail_hint: None,
                    },
                ),
                None,
            ),
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
                Op::Takeover(
                    Takeover::new(TakeoverParams {
                        run_id: run_id(),
                        owner_id: actor.owner_id(),
                        holder: actor.holder(),
                        policy: TimingPolicy::default(),
                        now,
                        expect: expect.clone(),
                        trigger: TakeoverTrigger::Operator,
                        nonce,
                    }),
                    expect,
                )
            }
            (4, None) => Op::Retire(Retire::new(RetireParams {
                run_id: run_id(),
                owner_id: actor.owner_id(),
                holder: actor.holder(),
                policy: TimingPolicy::default(),
                now,
                expect: None,
                nonce,
            })),
            (5, Some(l)) => Op::Release(Release::new(ReleaseParams {
                lease: l,
                now,
                seal: None,
            })),
            _ => return,
        };
        let actor = &mut self.actors[a];
        self.log.push(format!(
            "{} starts {} at +{} ms",
            actor.owner_id(),
            op.name(),
            self.now
        ));
        actor.op = Some(op);
        actor.input = None;
        actor.requests = 0;
        actor.granted_max_at_start = self.max_granted;
    }

    /// Perform the actor's next request (or finish its operation).
    fn step(&mut self, a: usize) {
        let Some(mut op) = self.actors[a].op.take() else {
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
            Op::Takeover(o, _) => map(o.next(input), |l| Out::Lease(Some(l))),
            Op::Retire(o) => map(o.next(input), |_| Out::Lease(None)),
            Op::Heartbeat(o, higher_at_start) => {
                if higher_at_start.is_none() && input.is_none() {
                    *higher_at_start = self.head();
                }
                map(o.next(input), |_| Out::Unit)
            }
            Op::Append(o, _) => map(o.next(input), Out::Appended),
            Op::Release(o) => map(o.next(input), |_| Out::Unit),
        };
        match step {
            Step::Io(req) => {
                let event_create = matches!(req, Request::CreateExclusive(FileRef::Event(_), _));
                let epoch_create = match &req {
                    Request::CreateExclusive(FileRef::Epoch(g), _) => Some(*g),
                    _ => None,
                };
                if let (Op::Append(_, created), Request::CreateExclusive(FileRef::Event(s), _)) =
                    (&mut op, &req)
                {
                    *created = Some(*s);
                }
                if let (Op::Release(_), Some(_)) = (&op, epoch_create) {
                    // An owner may release despite a corrupted heartbeat record of its own
                    // (the release does not read it); the released generation's heartbeat
                    // is never read again.
                    self.corrupted.retain(|f| !matches!(f, FileRef::Beat(_)));
                }
                if let Request::Replace(f, ..) = &req {
                    // The live owner's next heartbeat replaces its own (hand-corrupted)
                    // heartbeat record: from then on the run is valid again.
                    self.corrupted.remove(f);
                }
                let alive = self.alive.clone();
                let resp = self.disk.perform(req, &liveness(&alive));
                if let (Some(g), Response::Created) = (epoch_create, &resp) {
                    self.check_epoch_created(a, &op, g);
                }
                if let (Op::Append(_, created), Response::AlreadyExists, true) =
                    (&mut op, &resp, event_create)
                {
                    *created = None;
                }
                self.actors[a].input = Some(resp);
                self.actors[a].op = Some(op);
            }
            Step::Done(result) => self.finish(a, op, result),
        }
        self.check_step();
    }

    /// An operation of actor `a` just created epoch `g`.
    fn check_epoch_created(&mut self, a: usize, op: &Op, g: Generation) {
        let who = self.actors[a].owner_id();
        self.log
            .push(format!("{who} {} created epoch {g}", op.name()));
        let prev = g.prev().and_then(|p| self.epoch(p).map(|e| (p, e)));
        match op {
            Op::Takeover(_, expect) => {
                // A takeover commits only over exactly the owner it observed.
                let Some((p, e)) = prev else {
                    self.fail(format!(
                        "takeover created epoch {g} with no valid epoch below"
                    ));
                };
                if expect.generation.is_some_and(|x| x != p) || e.owner_id != expect.owner_id {
                    self.fail(format!(
                        "takeover created epoch {g} over generation {p} owner {}, but observed generation {:?} owner {}",
                        e.owner_id, expect.generation, expect.owner_id
                    ));
                }
            }
            Op::Retire(_) => {
                // A retirement commits only over a holder that is dead (pids never revive).
                let Some((p, e)) = prev else {
                    self.fail(format!(
                        "retirement created epoch {g} with no valid epoch below"
                    ));
                };
                if self.alive.contains(&e.holder.pid) {
                    self.fail(format!(
                        "retirement created epoch {g} over generation {p} whose holder pid {} is alive",
                        e.holder.pid
                    ));
                }
            }
            Op::Release(_) => {
                // A release supersedes only its own generation.
                let mine = self.actors[a].lease.as_ref().map(|l| l.generation);
                if g.prev() != mine {
                    self.fail(format!(
                        "release by {who} (generation {mine:?}) created epoch {g}"
                    ));
                }
            }
            _ => {}
        }
    }

    fn finish(&mut self, a: usize, op: Op, result: Result<Out, LeaseError>) {
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
        if let Err(e) = &result
            && e.code() == "PROTOCOL_VIOLATION"
        {
            self.fail(format!("{who} {}: {e}", op.name()));
        }
        match (op, result) {
            (Op::Claim(_) | Op::Takeover(..), Ok(Out::Lease(Some(l)))) => {
                if !self.corrupted.is_empty() {
                    self.fail("an ownership change succeeded over an invalid record".into());
                }
                // Every grant is above every grant completed before this operation started
                // (grants that overlap in time may complete in either order: the later one
                // learns it is fenced at its next heartbeat).
                let before = self.actors[a].granted_max_at_start;
                if l.generation.get() <= before {
                    self.fail(format!(
                        "granted generation {} although {before} was granted before the operation started",
                        l.generation
                    ));
                }
                self.max_granted = self.max_granted.max(l.generation.get());
                for (i, other) in self.actors.iter().enumerate() {
                    if i != a && other.granted.contains(&l.generation) {
                        self.fail(format!(
                            "generation {} granted to {who} and to {}",
                            l.generation, other.name
                        ));
                    }
                }
                if let Some(&last) = self.actors[a].granted.last()
                    && l.generation <= last
                {
                    self.fail(format!("{who} was granted {} after {last}", l.generation));
                }
                let actor = &mut self.actors[a];
                actor.granted.push(l.generation);
                actor.lease = Some(l);
                actor.beats = 0;
            }
            (Op::Retire(_), Ok(_)) if !self.corrupted.is_empty() => {
                self.fail("a retirement succeeded over an invalid record".into());
            }
            (Op::Heartbeat(_, higher_at_start), Ok(_)) => {
                let mine = self.actors[a].lease.as_ref().map(|l| l.generation);
                if let (Some(h), Some(m)) = (higher_at_start, mine)
                    && h > m
                {
                    self.fail(format!(
                            "{who}'s heartbeat of generation {m} succeeded although {h} existed when it started"
                        ));
                }
            }
            (Op::Heartbeat(..) | Op::Release(_), Err(e)) if e.code() == "FENCED" => {
                self.actors[a].lease = None;
            }
            (Op::Release(_), Ok(_)) => {
                self.actors[a].lease = None;
            }
            (Op::Append(_, created), Ok(Out::Appended(ap))) => {
                if created != Some(ap.sequence) {
                    self.fail(format!(
                        "append reported event {} but created {created:?}",
                        ap.sequence
                    ));
                }
                self.acked.insert(ap.sequence.get());
                if ap.superseded_by.is_some() {
                    self.actors[a].lease = None;
                }
            }
            (Op::Append(_, created), Err(e)) if e.code() == "FENCED" => {
                if let Some(s) = created {
                    self.refused.insert(s.get());
                }
                self.actors[a].lease = None;
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
        if self.corrupted.is_empty() {
            self.epochs_at_corruption = self.epoch_count();
        }
        self.corrupted.insert(target);
    }

    fn check_step(&mut self) {
        if let Some(h) = self.head() {
            if h.get() < self.max_head {
                self.fail(format!("head went from {} down to {h}", self.max_head));
            }
            self.max_head = h.get();
        }
        if !self.corrupted.is_empty() && self.epoch_count() != self.epochs_at_corruption {
            self.fail("a new epoch appeared while a record was invalid".into());
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
                if self.corrupted.is_empty() {
                    self.fail(format!("the log must be readable: {e}"));
                }
                return;
            }
        };
        let counted: BTreeSet<u64> = view
            .events
            .iter()
            .filter(|e| e.authority.counts())
            .map(|e| e.event.sequence.get())
            .collect();
        for s in &self.acked {
            if !counted.contains(s) {
                self.fail(format!("acknowledged event {s} does not count"));
            }
        }
        for s in &self.refused {
            if counted.contains(s) {
                self.fail(format!(
                    "event {s} counts although its append answered FENCED"
                ));
            }
        }
        for e in &view.events {
            if let Some(&c) = view.chain.cutoffs.get(&e.event.generation)
                && e.authority.counts()
                && e.event.sequence.get() > c
            {
                self.fail(format!(
                    "event {} of generation {} counts past its cutoff {c}",
                    e.event.sequence, e.event.generation
                ));
            }
        }
        if self.corrupted.is_empty()
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
