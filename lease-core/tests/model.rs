//! Property test: random interleavings of 2-3 owners driving the real step machines over
//! the in-memory authority, one request at a time, with pauses (an actor is simply not
//! stepped), crashes (an actor's in-flight operation and lease are dropped and its process
//! dies), clock jumps and injected invalid records. A ghost model records what each actor
//! was told; the invariants of docs/PROTOCOL.md §8 are checked after every step and at the
//! end.
//!
//! `RUNLEASE_DEEP=1` runs 100x more cases.

mod common;

use common::{BOOT, id, run_id, t};
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
    Heartbeat(Heartbeat, Option<Generation>),
    Append(Append, Option<Sequence>),
    Takeover(Takeover),
    Retire(Retire),
    Release(Release),
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Claim(_) => "claim",
            Op::Heartbeat(..) => "heartbeat",
            Op::Append(..) => "append",
            Op::Takeover(_) => "takeover",
            Op::Retire(_) => "retire",
            Op::Release(_) => "release",
        }
    }
}

struct Actor {
    name: String,
    incarnation: u32,
    pid: u32,
    lease: Option<OwnedLease>,
    beats: u64,
    op: Option<Op>,
    input: Option<Response>,
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
    /// Processes alive, by pid.
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
    /// An invalid record was injected: no ownership change may succeed from then on.
    corrupted: bool,
    /// Every file hand-corrupted and not yet rewritten by its owner.
    corrupted_files: BTreeSet<FileRef>,
    epochs_at_corruption: usize,
    log: Vec<String>,
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
            corrupted: false,
            corrupted_files: BTreeSet::new(),
            epochs_at_corruption: 0,
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
                granted: Vec::new(),
                granted_max_at_start: 0,
            });
        }
        w
    }

    fn spawn_pid(&mut self) -> u32 {
        self.next_pid += 1;
        self.alive.insert(self.next_pid);
        self.next_pid
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
                Op::Heartbeat(Heartbeat::new(&l, now, actor.beats).unwrap(), None)
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
                Op::Takeover(Takeover::new(TakeoverParams {
                    run_id: run_id(),
                    owner_id: actor.owner_id(),
                    holder: actor.holder(),
                    policy: TimingPolicy::default(),
                    now,
                    expect: Expectation::of(&h),
                    trigger: TakeoverTrigger::Operator,
                    nonce,
                }))
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
            "{} starts {} at {}",
            actor.owner_id(),
            op.name(),
            self.now
        ));
        actor.op = Some(op);
        actor.input = None;
        actor.granted_max_at_start = self.max_granted;
    }

    fn step(&mut self, a: usize) {
        let Some(mut op) = self.actors[a].op.take() else {
            return;
        };
        let input = self.actors[a].input.take();
        // The generation above the actor's own when the heartbeat started.
        let step = match &mut op {
            Op::Claim(o) => map(o.next(input), |l| Out::Lease(Some(l))),
            Op::Takeover(o) => map(o.next(input), |l| Out::Lease(Some(l))),
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
                if let (Op::Append(_, created), Request::CreateExclusive(FileRef::Event(s), _)) =
                    (&mut op, &req)
                {
                    *created = Some(*s);
                }
                if let (Op::Release(_), Request::CreateExclusive(FileRef::Epoch(_), _)) =
                    (&op, &req)
                {
                    // An owner may release despite a corrupted heartbeat record of its own
                    // (the release does not read it); the released generation's heartbeat is
                    // never read again.
                    self.corrupted_files
                        .retain(|f| !matches!(f, FileRef::Beat(_)));
                    self.corrupted = !self.corrupted_files.is_empty();
                }
                if let Request::Replace(f, ..) = &req {
                    // The live owner's next heartbeat replaces its own (hand-corrupted)
                    // heartbeat record: from then on the run is valid again.
                    if self.corrupted_files.remove(f) {
                        self.corrupted = !self.corrupted_files.is_empty();
                    }
                }
                let alive = self.alive.clone();
                let resp = self.disk.perform(req, &World::liveness(&alive));
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

    fn finish(&mut self, a: usize, op: Op, result: Result<Out, LeaseError>) {
        let who = self.actors[a].owner_id();
        self.log.push(format!(
            "{who} {} -> {}",
            op.name(),
            match &result {
                Ok(_) => "ok".to_string(),
                Err(e) => e.code().to_string(),
            }
        ));
        if let Err(e) = &result {
            assert_ne!(e.code(), "PROTOCOL_VIOLATION", "{e}");
        }
        match (op, result) {
            (Op::Claim(_) | Op::Takeover(_), Ok(Out::Lease(Some(l)))) => {
                assert!(
                    !self.corrupted,
                    "an ownership change succeeded over an invalid record"
                );
                // Every grant is above every grant completed before this operation started
                // (grants that overlap in time may complete in either order: the later one
                // simply learns it is fenced at its next heartbeat).
                let before = self.actors[a].granted_max_at_start;
                assert!(
                    l.generation.get() > before,
                    "granted generation {} although {before} was granted before it started",
                    l.generation
                );
                self.max_granted = self.max_granted.max(l.generation.get());
                // I1: no other actor holds the same generation.
                for (i, other) in self.actors.iter().enumerate() {
                    if i != a {
                        assert!(
                            !other.granted.contains(&l.generation),
                            "generation {} granted twice",
                            l.generation
                        );
                    }
                }
                let actor = &mut self.actors[a];
                if let Some(&last) = actor.granted.last() {
                    assert!(l.generation > last, "an actor's generations must increase");
                }
                actor.granted.push(l.generation);
                actor.lease = Some(l);
                actor.beats = 0;
            }
            (Op::Retire(_), Ok(_)) => {
                assert!(!self.corrupted, "retirement over an invalid record");
            }
            (Op::Heartbeat(_, higher_at_start), Ok(_)) => {
                let mine = self.actors[a].lease.as_ref().unwrap().generation;
                // I6: a heartbeat that started after the owner was superseded never succeeds.
                assert!(
                    higher_at_start.is_none_or(|h| h <= mine),
                    "a superseded owner's heartbeat succeeded"
                );
            }
            (Op::Heartbeat(..), Err(e)) | (Op::Release(_), Err(e)) if e.code() == "FENCED" => {
                self.actors[a].lease = None;
            }
            (Op::Release(_), Ok(_)) => {
                self.actors[a].lease = None;
            }
            (Op::Append(_, created), Ok(Out::Appended(ap))) => {
                assert_eq!(created, Some(ap.sequence));
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
        self.corrupted = true;
        self.corrupted_files.insert(target);
        self.epochs_at_corruption = self.epoch_count();
    }

    fn check_step(&mut self) {
        if let Some(h) = self.head() {
            // Generations never go down.
            assert!(
                h.get() >= self.max_head,
                "head went from {} to {h}",
                self.max_head
            );
            self.max_head = h.get();
        }
        if self.corrupted {
            assert_eq!(
                self.epoch_count(),
                self.epochs_at_corruption,
                "a new epoch appeared after an invalid record; trace:\n{}",
                self.log.join("\n")
            );
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
                assert!(self.corrupted, "the log must be readable: {e}");
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
        let counted: BTreeSet<u64> = view
            .events
            .iter()
            .filter(|e| e.authority.counts())
            .map(|e| e.event.sequence.get())
            .collect();
        // Every acknowledged append counts; no refused one does.
        for s in &self.acked {
            assert!(counted.contains(s), "acknowledged event {s} does not count");
        }
        for s in &self.refused {
            assert!(!counted.contains(s), "fenced event {s} counts");
        }
        // The authoritative history is generation-monotone.
        let mut max_gen = 0;
        for e in view.events.iter().filter(|e| e.authority.counts()) {
            assert!(
                e.event.generation.get() >= max_gen,
                "event {} of generation {} counts after generation {max_gen}",
                e.event.sequence,
                e.event.generation
            );
            max_gen = e.event.generation.get();
        }
        // No event of a retired generation past its cutoff counts.
        for e in &view.events {
            if let Some(&c) = view.chain.cutoffs.get(&e.event.generation) {
                if e.authority.counts() {
                    assert!(e.event.sequence.get() <= c);
                }
            }
        }
        if !self.corrupted {
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
        prop_assert!(w.max_head < 10_000);
    }

    #[test]
    fn three_owners_keep_every_protocol_invariant(acts in actions(400)) {
        let w = run_actions(3, &acts);
        prop_assert!(w.max_head < 10_000);
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
        if !w.refused.is_empty() {
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
