//! Property test: random interleavings of 2-3 owners driving the real step machines over
//! the in-memory authority, one request at a time, with pauses (an actor is simply not
//! stepped), crashes (an actor's in-flight operation and lease are dropped and its process
//! dies), clock jumps and injected invalid records. The shared ghost model
//! (`lease_core::ghost`, feature `ghost`) records what each actor was told; the invariants
//! of docs/PROTOCOL.md §8 are checked after every step and at the end.
//!
//! `RUNLEASE_DEEP=1` runs 100x more cases.

mod common;

use common::{BOOT, id, run_id, t};
use lease_core::ghost::{Ghost, OpGhost, OpKind, Told, simulated_evidence};
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

fn cases(default: u32) -> ProptestConfig {
    let deep = std::env::var_os("RUNLEASE_DEEP").is_some_and(|v| !v.is_empty());
    ProptestConfig::with_cases(if deep { default * 100 } else { default })
}

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

struct Actor {
    name: String,
    incarnation: u32,
    pid: u32,
    lease: Option<OwnedLease>,
    beats: u64,
    op: Option<(Op, OpGhost)>,
    input: Option<Response>,
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
    /// Processes alive, by pid.
    alive: BTreeSet<u32>,
    next_pid: u32,
    /// What each actor was told (grants across incarnations are labelled by actor name),
    /// and the hand-corrupted records.
    ghost: Ghost,
    log: Vec<String>,
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
        for i in 0..n {
            let pid = w.spawn_pid();
            w.actors.push(Actor {
                name: ["a", "b", "c"][i].into(),
                incarnation: 0,
                pid,
                lease: None,
                beats: 0,
                op: None,
                input: None,
            });
        }
        w
    }

    fn fail(&self, what: String) -> ! {
        panic!("{what}; trace:\n{}", self.log.join("\n"));
    }

    fn spawn_pid(&mut self) -> u32 {
        self.next_pid += 1;
        self.alive.insert(self.next_pid);
        self.next_pid
    }

    fn liveness(alive: &BTreeSet<u32>) -> impl Fn(&Holder) -> LivenessEvidence + '_ {
        move |h: &Holder| simulated_evidence(id(BOOT), h, alive.contains(&h.pid))
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
                Op::Heartbeat(Heartbeat::new(&l, now, actor.beats).unwrap())
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
                // Observe atomically, then take over on what was seen (it may be stale by the
                // time the takeover's steps run: that is the race being tested).
                let alive = self.alive.clone();
                let view = self.disk.run(
                    &mut StatusView::read(run_id(), now, false),
                    &World::liveness(&alive),
                );
                let Ok(StatusView { head: Some(h), .. }) = view else {
                    return;
                };
                let actor = &mut self.actors[a];
                let expect = Expectation::of(&h);
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
            "{} starts {} at {}",
            actor.owner_id(),
            op.name(),
            self.now
        ));
        actor.op = Some((op, ghost));
        actor.input = None;
    }

    fn step(&mut self, a: usize) {
        let Some((mut op, mut ghost)) = self.actors[a].op.take() else {
            return;
        };
        let input = self.actors[a].input.take();
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
                self.ghost.on_request(&mut ghost, &req);
                let alive = self.alive.clone();
                let resp = self.disk.perform(req, &World::liveness(&alive));
                self.ghost.on_response(&mut ghost, event_create, &resp);
                self.actors[a].input = Some(resp);
                self.actors[a].op = Some((op, ghost));
            }
            Step::Done(result) => self.finish(a, op, ghost, result),
        }
        self.check_step();
    }

    fn finish(&mut self, a: usize, op: Op, ghost: OpGhost, result: Result<Out, LeaseError>) {
        let who = self.actors[a].owner_id();
        self.log.push(format!(
            "{who} {} -> {}",
            op.name(),
            match &result {
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
        if let Err(v) = self.ghost.finish(&ghost, &actor.name, mine, told) {
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

    fn corrupt(&mut self, which: u32) {
        // Only between operations: an operation that observed the head before the
        // corruption may legitimately finish on what it saw.
        if self.actors.iter().any(|a| a.op.is_some()) {
            return;
        }
        let Some(h) = self.head() else { return };
        let target = if which % 2 == 0 {
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
            &World::liveness(&alive),
        );
        let view = match view {
            Ok(v) => v,
            Err(e) => {
                assert!(self.ghost.is_corrupted(), "the log must be readable: {e}");
                return;
            }
        };
        // The streaming read (chain only, then one event at a time) judges every event
        // exactly as the whole-log read did (the finalizing read above left nothing pending).
        let live = World::liveness(&alive);
        let lean = self
            .disk
            .run(&mut ReadEvents::chain_only(run_id(), None), &live)
            .expect("the streaming read");
        assert!(lean.events.is_empty());
        assert_eq!(
            lean.last.as_ref().map(|(s, _)| s.get()),
            view.events.last().map(|e| e.event.sequence.get())
        );
        let mut pass = lease_core::ops::JudgeLog::new(run_id(), lean);
        let mut streamed = Vec::new();
        while let Some(req) = pass.request() {
            let resp = self.disk.perform(req, &live);
            streamed.push(pass.feed(resp).expect("second pass"));
        }
        assert_eq!(
            streamed,
            view.events,
            "streamed judgments differ; trace:\n{}",
            self.log.join("\n")
        );
        // Every acknowledged append counts, no refused one does, the counted history is
        // generation-monotone, no event of a retired generation past its cutoff counts.
        if let Err(v) = self.ghost.check_log(&view) {
            self.fail(v);
        }
        if !self.ghost.is_corrupted() {
            self.disk
                .run(&mut Verify::new(run_id()), &World::liveness(&alive))
                .expect("both hash chains verify");
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

fn run_actions(n: usize, actions: &[(usize, u8, u32)]) -> World {
    let mut w = World::new(n);
    for &(a, code, param) in actions {
        let a = a % n;
        match code {
            0..=6 => w.step(a),
            7..=9 => w.start(a, (param % 6) as u8),
            10 => w.start(a, 2),
            11 => w.now += u64::from(param % 400) * 100,
            12 if param % 4 == 0 => w.crash(a),
            13 if param % 50 == 0 => w.corrupt(param / 50),
            _ => w.step(a),
        }
    }
    // Let every in-flight operation finish (a paused actor resumes).
    for _ in 0..10_000 {
        let busy: Vec<usize> = (0..n).filter(|&i| w.actors[i].op.is_some()).collect();
        if busy.is_empty() {
            break;
        }
        for i in busy {
            w.step(i);
        }
    }
    w.check_end();
    w
}

fn actions(len: usize) -> impl Strategy<Value = Vec<(usize, u8, u32)>> {
    proptest::collection::vec((0..3usize, 0..16u8, 0..10_000u32), 1..len)
}

proptest! {
    #![proptest_config(cases(96))]

    #[test]
    fn two_owners_keep_every_protocol_invariant(acts in actions(300)) {
        let w = run_actions(2, &acts);
        prop_assert!(w.ghost.max_head < 10_000);
    }

    #[test]
    fn three_owners_keep_every_protocol_invariant(acts in actions(400)) {
        let w = run_actions(3, &acts);
        prop_assert!(w.ghost.max_head < 10_000);
    }
}

/// The generator actually reaches the interesting states (takeovers, retirements, fenced
/// appends): otherwise the properties above would pass vacuously.
#[test]
fn the_model_test_reaches_takeovers_retirements_and_fenced_appends() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for _ in 0..200 {
        let acts = actions(400).new_tree(&mut runner).unwrap().current();
        let w = run_actions(3, &acts);
        for line in &w.log {
            for key in [
                "takeover -> ok",
                "retire -> ok",
                "append -> FENCED",
                "heartbeat -> FENCED",
                "release -> ok",
                "crashes",
            ] {
                if line.ends_with(key) || line.contains(key) {
                    *seen.entry(key).or_default() += 1;
                }
            }
        }
        if !w.ghost.refused.is_empty() {
            *seen.entry("refused event on disk").or_default() += 1;
        }
    }
    for key in [
        "takeover -> ok",
        "retire -> ok",
        "append -> FENCED",
        "heartbeat -> FENCED",
        "release -> ok",
        "crashes",
    ] {
        assert!(
            seen.get(key).copied().unwrap_or(0) > 0,
            "never saw {key}: {seen:?}"
        );
    }
}
