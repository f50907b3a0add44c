//! # One actor driver for every model-based checker (issue #30)
//!
//! The proptest (`lease-core/tests/model.rs`), the `transitions` fuzz target
//! (`fuzz/src/transitions.rs`) and the breadth-first model checker
//! (`lease-fs/tests/model_check/`) drive their actors with this code: the operation of each
//! kind ([`AnyOp`], built by [`build`] as an owner of lease-run would), what an actor is
//! ([`Actor`]), how an operation ends for it and what it is then told ([`end`]), how a
//! concurrent reader is judged ([`check_reader`]).
//!
//! The proptest and the fuzzer also share the whole world: [`MemWorld`], over
//! [`MemDisk`], with every actor kind (claim, heartbeat, append, takeover, retirement,
//! release, prune, a concurrent finalizing reader), process crashes, clock jumps,
//! hand-corrupted records and power loss (a create's link is visible before its directory
//! fsync, unsynced heartbeats and removals can be undone or torn: [`MemDisk::power_loss`]).
//! They differ only in how they turn their input into [`Action`]s. The model checker runs
//! the same actors one system call at a time over lease-fs's simulated file system, which
//! this crate cannot name; it calls the same [`build`], [`Actor::begin`], [`Actor::advance`]
//! and [`end`] around its own execution of each request.
//!
//! Everything here is pure, like the rest of the crate: time is the world's number of
//! milliseconds ([`at`]), nothing reads a clock or the environment.

use std::collections::BTreeSet;

use super::{
    Ghost, OpGhost, OpKind, Told, Violation, cutoffs_have_successors, simulated_evidence,
    simulated_watch, stable_judgements, status_valid,
};
use crate::mem::MemDisk;
use crate::ops::{
    Append, AppendParams, Appended, Claim, ClaimParams, EventLogView, Expectation, Head, Heartbeat,
    JudgeLog, LivenessEvidence, Operation, OwnedLease, Prune, PruneParams, ReadEvents, Release,
    ReleaseParams, Request, Response, Retire, RetireParams, StatusView, Step, Takeover,
    TakeoverParams, TakeoverTrigger, Verify,
};
use crate::{
    Checkpoint, Dir, EpochRecord, FileRef, Generation, HeartbeatDurability, Holder, Identity,
    LeaseError, RetirementRecord, RunId, Sequence, Timestamp, TimingPolicy, decode,
};

/// Milliseconds since the Unix epoch of the world's time 0 (2026-12-02T00:00:00Z).
pub const T0_MS: u64 = 1_796_169_600_000;

/// The world's time `ms` after its start.
pub fn at(ms: u64) -> Timestamp {
    Timestamp::EPOCH.plus_millis(T0_MS.saturating_add(ms))
}

/// An identity from a literal of this module (always valid).
fn ident(s: &str) -> Identity {
    Identity::new(s).unwrap_or_else(|e| panic!("identity literal {s:?}: {e}"))
}

/// The run every driven world works on.
pub fn run_id() -> RunId {
    RunId::new("model").unwrap_or_else(|e| panic!("run id literal: {e}"))
}

/// The boot id (and monotonic clock domain) of boot number `boot`: a power loss starts
/// the next one, and every holder of an older boot is dead.
pub fn boot_id(boot: u32) -> Identity {
    ident(&format!("boot-{boot}"))
}

/// Whether holder `h` is up in the driven world on boot `boot`: it ran on this boot and its
/// (pid, start time) is one of `live`.
pub fn is_up(boot: u32, live: &BTreeSet<(u32, u64)>, h: &Holder) -> bool {
    live.contains(&(h.pid, h.start_time)) && h.boot_id == boot_id(boot)
}

/// The liveness evidence of the driven world on boot `boot` ([`is_up`]).
pub fn evidence(boot: u32, live: &BTreeSet<(u32, u64)>, h: &Holder) -> LivenessEvidence {
    simulated_evidence(boot_id(boot), h, is_up(boot, live, h))
}

/// How long a taker on boot `boot` at world time `now` has watched head `h` unchanged: a
/// beat stamped on this boot's monotonic clock is aged by lease-core's own watch (the
/// same-clock rule, PROTOCOL §10); any other head as if the taker began watching when its
/// beat was written ([`simulated_watch`]).
pub fn watched(h: &Head, boot: u32, now: u64) -> u64 {
    let clock = boot_id(boot);
    let stamped = h
        .beat
        .as_ref()
        .and_then(|b| b.mono.as_ref())
        .is_some_and(|m| m.clock == clock);
    if !stamped {
        return simulated_watch(&Expectation::of(h), at(now));
    }
    let mut watch = crate::watch::StaleWatch::on_clock(Some(clock));
    match watch.observe(h, now.saturating_mul(1_000_000)) {
        crate::watch::Verdict::TakeOver { watched }
        | crate::watch::Verdict::Watching { watched, .. } => {
            u64::try_from(watched.as_millis()).unwrap_or(u64::MAX)
        }
    }
}

/// An operation of any kind, in flight.
#[derive(Clone, Debug)]
pub enum AnyOp {
    /// [`Claim`].
    Claim(Claim),
    /// [`Heartbeat`].
    Heartbeat(Heartbeat),
    /// [`Append`].
    Append(Append),
    /// [`Takeover`].
    Takeover(Takeover),
    /// [`Retire`].
    Retire(Retire),
    /// [`Release`].
    Release(Release),
    /// [`Prune`].
    Prune(Prune),
    /// A finalizing reader of the log (PROTOCOL §7.9), racing the others.
    Read(ReadEvents),
}

/// What an operation answered, whatever its kind.
#[derive(Clone, Debug)]
pub enum Out {
    /// A claim's or takeover's lease.
    Lease(Box<OwnedLease>),
    /// An append's event.
    Appended(Box<Appended>),
    /// A heartbeat, release or prune that succeeded.
    Unit,
    /// A retirement's new (free) generation.
    Retired(u64),
    /// What a reader judged.
    Read(Box<EventLogView>),
}

fn map<T>(s: Step<T>, f: impl FnOnce(T) -> Out) -> Step<Out> {
    match s {
        Step::Io(r) => Step::Io(r),
        Step::Done(r) => Step::Done(r.map(f)),
    }
}

impl AnyOp {
    /// Its kind.
    pub fn kind(&self) -> OpKind {
        match self {
            AnyOp::Claim(_) => OpKind::Claim,
            AnyOp::Heartbeat(_) => OpKind::Heartbeat,
            AnyOp::Append(_) => OpKind::Append,
            AnyOp::Takeover(_) => OpKind::Takeover,
            AnyOp::Retire(_) => OpKind::Retire,
            AnyOp::Release(_) => OpKind::Release,
            AnyOp::Prune(_) => OpKind::Prune,
            AnyOp::Read(_) => OpKind::Read,
        }
    }

    /// The operation's next step, given the answer to its last request.
    pub fn next(&mut self, input: Option<Response>) -> Step<Out> {
        match self {
            AnyOp::Claim(o) => map(o.next(input), |l| Out::Lease(Box::new(l))),
            AnyOp::Takeover(o) => map(o.next(input), |l| Out::Lease(Box::new(l))),
            AnyOp::Retire(o) => map(o.next(input), |r| Out::Retired(r.generation.get())),
            AnyOp::Heartbeat(o) => map(o.next(input), |_| Out::Unit),
            AnyOp::Append(o) => map(o.next(input), |a| Out::Appended(Box::new(a))),
            AnyOp::Release(o) => map(o.next(input), |_| Out::Unit),
            AnyOp::Prune(o) => map(o.next(input), |_| Out::Unit),
            AnyOp::Read(o) => map(o.next(input), |v| Out::Read(Box::new(v))),
        }
    }
}

/// Where and when an operation starts: the world's time, boot and timing policy.
#[derive(Clone, Copy, Debug)]
pub struct Site {
    /// The world's time (ms since its start).
    pub now: u64,
    /// The boot the actors run on.
    pub boot: u32,
    /// The policy claims, takeovers and retirements write into their epoch.
    pub policy: TimingPolicy,
}

/// One actor: a process that runs one operation at a time, and the incarnations that
/// replace it after a crash.
#[derive(Clone, Debug)]
pub struct Actor {
    /// Its name (`a`, `b`, ...).
    pub name: char,
    /// Bumped at each crash (a new process, a new pid).
    pub incarnation: u32,
    /// The lease it holds.
    pub lease: Option<OwnedLease>,
    /// Its successful heartbeats in this generation (the next one is `beats + 1`).
    pub beats: u64,
    /// The operation in flight, with its ghost.
    pub op: Option<(AnyOp, OpGhost)>,
    /// The answer to the operation's last request, not yet fed to it.
    pub input: Option<Response>,
}

/// What an actor's operation does next ([`Actor::advance`]).
#[expect(
    clippy::large_enum_variant,
    reason = "a step's result, moved out at once; boxing would only add an allocation per step"
)]
pub enum Next {
    /// Perform this request (the operation stays in the actor).
    Io(Request),
    /// The operation ended (taken out of the actor): give it to [`end`].
    Done(AnyOp, OpGhost, Result<Out, LeaseError>),
}

impl Actor {
    /// A new actor, incarnation 0, holding nothing.
    pub fn new(name: char) -> Actor {
        Actor {
            name,
            incarnation: 0,
            lease: None,
            beats: 0,
            op: None,
            input: None,
        }
    }

    /// Its label: name and incarnation (`a0`), also its owner id and the ghost's label of
    /// what it was granted.
    pub fn who(&self) -> String {
        format!("{}{}", self.name, self.incarnation)
    }

    /// Its owner id.
    pub fn owner(&self) -> Identity {
        ident(&self.who())
    }

    /// Its process id (each incarnation its own).
    pub fn pid(&self) -> u32 {
        1000 + u32::from(self.name as u8) * 100 + self.incarnation
    }

    /// Its process's start time: with the pid, what identifies the incarnation (a pid
    /// two incarnations share is a reused pid).
    pub fn start_time(&self) -> u64 {
        u64::from(self.incarnation) + 1
    }

    /// Its holder record on boot `boot`.
    pub fn holder(&self, boot: u32) -> Holder {
        Holder {
            host: ident("host"),
            boot_id: boot_id(boot),
            pid: self.pid(),
            start_time: self.start_time(),
        }
    }

    /// The generation it holds (0: none).
    pub fn mine(&self) -> u64 {
        self.lease.as_ref().map_or(0, |l| l.generation.get())
    }

    /// Start `op` (its ghost begun now, with the head `head` noted).
    pub fn begin(&mut self, ghost: &Ghost, op: AnyOp, observed: Option<Expectation>, head: u64) {
        let mut g = ghost.begin(op.kind(), observed);
        g.note_head(Some(head));
        self.op = Some((op, g));
        self.input = None;
    }

    /// Feed the operation its pending answer and compute its next step (`None`: idle).
    pub fn advance(&mut self) -> Option<Next> {
        let (mut op, g) = self.op.take()?;
        match op.next(self.input.take()) {
            Step::Io(req) => {
                self.op = Some((op, g));
                Some(Next::Io(req))
            }
            Step::Done(r) => Some(Next::Done(op, g, r)),
        }
    }

    /// The process died: the next incarnation starts with nothing.
    pub fn crash(&mut self) {
        self.incarnation += 1;
        self.op = None;
        self.input = None;
        self.lease = None;
        self.beats = 0;
    }
}

/// The operation of `kind` actor `a` would start now, as lease-run's owner starts it
/// (`None` when it cannot: a heartbeat without a lease, a claim with one, a takeover
/// without `takeover`, the expectation and watch of the head it observed).
pub fn build(
    kind: OpKind,
    a: &Actor,
    site: &Site,
    takeover: Option<(Expectation, u64)>,
) -> Option<AnyOp> {
    let now = at(site.now);
    let policy = site.policy;
    Some(match (kind, a.lease.clone()) {
        (OpKind::Claim, None) => AnyOp::Claim(Claim::new(ClaimParams {
            run_id: run_id(),
            owner_id: a.owner(),
            holder: a.holder(site.boot),
            policy,
            now,
            store_floor: None,
        })),
        (OpKind::Heartbeat, Some(l)) => AnyOp::Heartbeat(
            Heartbeat::new(&l, now, a.beats + 1)
                .ok()?
                .on_clock(Some(boot_id(site.boot))),
        ),
        (OpKind::Append, Some(l)) => AnyOp::Append(Append::new(
            &l,
            AppendParams {
                event_type: ident("e"),
                payload: serde_json::json!(a.name.to_string()),
                now,
                tail_hint: None,
            },
        )),
        (OpKind::Release, Some(l)) => AnyOp::Release(Release::new(ReleaseParams {
            lease: l,
            now,
            seal: None,
        })),
        (OpKind::Takeover, None) => {
            let (expect, watched_unchanged_ms) = takeover?;
            AnyOp::Takeover(Takeover::new(TakeoverParams {
                run_id: run_id(),
                owner_id: a.owner(),
                holder: a.holder(site.boot),
                policy,
                now,
                expect,
                trigger: TakeoverTrigger::Operator {
                    watched_unchanged_ms,
                },
            }))
        }
        (OpKind::Retire, None) => AnyOp::Retire(Retire::new(RetireParams {
            run_id: run_id(),
            owner_id: a.owner(),
            holder: a.holder(site.boot),
            policy,
            now,
            expect: None,
        })),
        (OpKind::Prune, _) => AnyOp::Prune(Prune::new(PruneParams {
            run_id: run_id(),
            keep: 2,
            by: a.owner(),
            now,
        })),
        (OpKind::Read, _) => AnyOp::Read(ReadEvents::new(run_id(), Some((a.owner(), now)))),
        _ => return None,
    })
}

/// What a takeover starting now would expect and how long it has watched, from a status
/// read of the run: `None` unless the head is active (nothing to take over).
pub fn takeover_plan(
    view: Result<StatusView, LeaseError>,
    boot: u32,
    now: u64,
) -> Option<(Expectation, u64)> {
    let h = view.ok()?.head?;
    if !h.is_active() {
        return None;
    }
    Some((Expectation::of(&h), watched(&h, boot, now)))
}

/// What an operation's end changed for its actor ([`end`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// A claim or takeover was granted this generation.
    Granted(u64),
    /// A retirement freed the run at this generation.
    Retired(u64),
    /// A heartbeat succeeded.
    Beat,
    /// The actor learned it no longer owns the run (`FENCED`, or an append that counted
    /// but found its owner superseded); with `fenced_exits` its process exited.
    Fenced,
    /// Anything else.
    Other,
}

/// Error codes that say a run is damaged: a wrong answer unless a record was ever corrupted
/// by hand or `lease/` rolled back (crashes, power loss and concurrency never damage a run).
const DAMAGED: [&str; 4] = [
    "CHAIN_BROKEN",
    "RECORD_INVALID",
    "EVENT_LOG_GAP",
    "RUN_LAYOUT_INVALID",
];

/// Actor `a`'s operation `op` (ghost `g`) ended with `result`: check what it was told
/// against the ghost ([`Ghost::finish`], and no damage reported on a sound run), record
/// it, and apply it to the actor as lease-run's owner does: a grant is held, a successful
/// heartbeat counted (and noted in the ghost when durable), a release or a `FENCED` answer
/// drops the lease. With `fenced_exits` (lease-run's `runlease run`, which exits when
/// fenced) a fenced actor's process exits: the next incarnation starts. Answers the trace
/// line and what changed.
pub fn end(
    ghost: &mut Ghost,
    a: &mut Actor,
    op: &AnyOp,
    g: &OpGhost,
    result: &Result<Out, LeaseError>,
    fenced_exits: bool,
) -> Result<(String, Ended), Violation> {
    let who = a.who();
    let line = format!(
        "{who}: {:?} -> {}",
        g.kind,
        match result {
            Ok(Out::Lease(l)) => format!("ok, generation {}", l.generation),
            Ok(Out::Appended(ap)) => format!("ok, event {}", ap.sequence),
            Ok(_) => "ok".into(),
            Err(e) => e.code().to_string(),
        }
    );
    if let Err(e) = result
        && !ghost.ever_corrupted
        && !ghost.rolled_back
        && DAMAGED.contains(&e.code().as_str())
    {
        return Err(format!("{line}: a sound run was refused as damaged: {e}"));
    }
    let told = match result {
        Ok(Out::Lease(l)) => Ok(Told::Granted(l.generation)),
        Ok(Out::Appended(ap)) => Ok(Told::Appended(ap.sequence.get())),
        Ok(Out::Unit | Out::Retired(_) | Out::Read(_)) => Ok(Told::Done),
        Err(e) => Err(e),
    };
    ghost
        .finish(g, &who, a.mine(), told)
        .map_err(|v| format!("{line}: {v}"))?;
    let fenced = match (op, result) {
        (AnyOp::Claim(_) | AnyOp::Takeover(_), Ok(Out::Lease(l))) => {
            a.lease = Some((**l).clone());
            a.beats = 0;
            return Ok((line, Ended::Granted(l.generation.get())));
        }
        (AnyOp::Retire(_), Ok(Out::Retired(n))) => return Ok((line, Ended::Retired(*n))),
        (AnyOp::Heartbeat(_), Ok(_)) => {
            a.beats += 1;
            if let Some(l) = &a.lease
                && l.policy.heartbeat_durability() == HeartbeatDurability::Durable
            {
                ghost.on_durable_beat(l.generation.get(), a.beats);
            }
            return Ok((line, Ended::Beat));
        }
        (AnyOp::Release(_), Ok(_)) => {
            a.lease = None;
            false
        }
        (AnyOp::Append(_), Ok(Out::Appended(ap))) => ap.superseded_by.is_some(),
        (AnyOp::Append(_) | AnyOp::Heartbeat(_) | AnyOp::Release(_), Err(e)) => {
            e.code() == "FENCED"
        }
        _ => false,
    };
    if !fenced {
        return Ok((line, Ended::Other));
    }
    a.lease = None;
    if fenced_exits {
        a.crash();
    }
    Ok((line, Ended::Fenced))
}

/// A finalizing reader that ran concurrently with the other actors ended with `result`:
/// what it judged must pass the ghost's checks of a read of `1..=last`
/// ([`Ghost::check_read`]), and each verdict must be the one an atomic finalizing reader
/// gives right now (`now`, I12, OQ-15). It may give up only with `CONCURRENT_CHANGE`, on a
/// hand-corrupted record, or after a rollback of `lease/`.
pub fn check_reader(
    ghost: &Ghost,
    result: &Result<Out, LeaseError>,
    now: impl FnOnce() -> Result<EventLogView, LeaseError>,
) -> Result<(), Violation> {
    let view = match result {
        Ok(Out::Read(view)) => view,
        Ok(_) => return Err("a reader answered something else than a view".into()),
        Err(e) if e.code() == "CONCURRENT_CHANGE" || ghost.ever_corrupted => return Ok(()),
        _ if ghost.rolled_back => return Ok(()),
        Err(e) => return Err(format!("a finalizing reader failed: {e}")),
    };
    ghost.check_read(view)?;
    let now = now().map_err(|e| format!("log unreadable: {e}"))?;
    stable_judgements(view, &now)
}

/// The cutoffs and checkpoints on disk, as decided (what does not decode is `verify`'s to
/// report).
#[derive(Clone, Debug, Default)]
pub struct Decisions {
    /// Each cutoff: (generation, `events_through`).
    pub cutoffs: Vec<(u64, u64)>,
    /// Each checkpoint.
    pub checkpoints: Vec<Checkpoint>,
    /// The highest checkpoint floor (0: none).
    pub floor: u64,
}

impl Decisions {
    /// Decode them from `records(dir)`, the bytes of every record file in `dir`.
    pub fn read(records: impl Fn(Dir) -> Vec<Vec<u8>>) -> Decisions {
        let cutoffs = records(Dir::Cutoffs)
            .iter()
            .filter_map(|b| decode::<RetirementRecord>(b).ok())
            .map(|r| (r.generation.get(), r.events_through))
            .collect();
        let checkpoints: Vec<Checkpoint> = records(Dir::Checkpoints)
            .iter()
            .filter_map(|b| decode::<Checkpoint>(b).ok())
            .collect();
        let floor = checkpoints
            .iter()
            .map(|c| c.floor_generation.get())
            .max()
            .unwrap_or(0);
        Decisions {
            cutoffs,
            checkpoints,
            floor,
        }
    }

    /// Each decision against what each writer was told ([`Ghost::check_decisions`]: I4, I9,
    /// I5).
    pub fn check(&self, ghost: &Ghost) -> Result<(), Violation> {
        ghost.check_decisions(
            self.cutoffs.iter().copied(),
            self.checkpoints.iter().map(|c| {
                (
                    c.floor_generation.get(),
                    c.through_sequence,
                    c.not_authoritative.as_slice(),
                )
            }),
        )
    }
}

/// One thing that happens in a [`MemWorld`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// The actor performs its operation's next request (or its create's directory fsync).
    Step(usize),
    /// The actor runs its operation to the end.
    RunToEnd(usize),
    /// The actor starts an operation of this kind, if it can.
    Start(usize, OpKind),
    /// The clock advances this many milliseconds.
    Tick(u64),
    /// The actor's process dies; its next incarnation starts.
    Crash(usize),
    /// Power loss (every process dies, a new boot), optionally tearing the newest write
    /// that can tear.
    PowerLoss {
        /// Tear the newest unsynced heartbeat.
        tear: bool,
    },
    /// Between operations only: hand-corrupt the head's epoch (even) or heartbeat (odd).
    Corrupt(u8),
    /// Every actor runs its operation to the end, round-robin.
    Drain,
}

/// Every operation an actor may start, in [`OpKind`] order.
pub const KINDS: [OpKind; 8] = [
    OpKind::Claim,
    OpKind::Heartbeat,
    OpKind::Append,
    OpKind::Takeover,
    OpKind::Retire,
    OpKind::Release,
    OpKind::Prune,
    OpKind::Read,
];

/// Requests after which an operation counts as stuck (no operation needs nearly this many).
const MAX_OP_REQUESTS: u32 = 50_000;

/// The world of the proptest and the fuzzer: 2-3 [`Actor`]s over one [`MemDisk`], one
/// request at a time, checked against the ghost after every step and at the end.
#[derive(Debug)]
pub struct MemWorld {
    /// The run folder.
    pub disk: MemDisk,
    /// The actors.
    pub actors: Vec<Actor>,
    /// World time (ms).
    pub now: u64,
    /// Boot number (a power loss starts the next).
    pub boot: u32,
    /// The policy claims and takeovers write.
    pub policy: TimingPolicy,
    /// What each actor was told.
    pub ghost: Ghost,
    /// What happened, one line per step.
    pub log: Vec<String>,
    /// Per actor: a create it linked whose directory fsync is its next step.
    linking: Vec<Option<FileRef>>,
    /// Per actor: requests of its operation so far.
    requests: Vec<u32>,
    /// The files corrupted by hand, with the bytes written: a power loss that undoes the
    /// unsynced heartbeat written over one brings the corruption back.
    hand: Vec<(FileRef, Vec<u8>)>,
}

impl MemWorld {
    /// `n` actors (`a`, `b`, ...) on an empty run, claiming with `policy`.
    pub fn new(n: usize, policy: TimingPolicy) -> MemWorld {
        MemWorld {
            disk: MemDisk::new(),
            actors: ('a'..='z').take(n).map(Actor::new).collect(),
            now: 0,
            boot: 0,
            policy,
            ghost: Ghost::new(),
            log: Vec::new(),
            linking: vec![None; n],
            requests: vec![0; n],
            hand: Vec::new(),
        }
    }

    /// Apply `actions` (actor numbers taken modulo the number of actors), let every
    /// operation finish, then run the final checks. On a violation: what was violated and
    /// the trace.
    pub fn run(
        n: usize,
        policy: TimingPolicy,
        actions: impl IntoIterator<Item = Action>,
    ) -> Result<MemWorld, Violation> {
        let mut w = MemWorld::new(n, policy);
        let r = actions
            .into_iter()
            .try_for_each(|act| w.apply(act))
            .and_then(|()| w.drain())
            .and_then(|()| w.check_end());
        match r {
            Ok(()) => Ok(w),
            Err(v) => Err(format!("{v}\ntrace:\n  {}", w.log.join("\n  "))),
        }
    }

    /// Apply one action.
    pub fn apply(&mut self, act: Action) -> Result<(), Violation> {
        let n = self.actors.len();
        match act {
            Action::Step(a) => self.step(a % n),
            Action::RunToEnd(a) => {
                while self.actors[a % n].op.is_some() {
                    self.step(a % n)?;
                }
                Ok(())
            }
            Action::Start(a, kind) => self.start(a % n, kind),
            Action::Tick(ms) => {
                self.now = self.now.saturating_add(ms);
                Ok(())
            }
            Action::Crash(a) => {
                let i = a % n;
                self.log.push(format!("{} crashes", self.actors[i].who()));
                self.actors[i].crash();
                // A create it linked stays visible, not durable, until someone fsyncs the
                // directory or the power goes.
                self.linking[i] = None;
                Ok(())
            }
            Action::PowerLoss { tear } => self.power_loss(tear),
            Action::Corrupt(which) => {
                self.corrupt(which);
                Ok(())
            }
            Action::Drain => self.drain(),
        }
    }

    fn live(&self) -> BTreeSet<(u32, u64)> {
        self.actors
            .iter()
            .map(|a| (a.pid(), a.start_time()))
            .collect()
    }

    fn site(&self) -> Site {
        Site {
            now: self.now,
            boot: self.boot,
            policy: self.policy,
        }
    }

    /// Run an operation atomically on a copy of the disk (observations never change the
    /// world: a reader's directory fsync would).
    pub fn observe<O: Operation>(&self, op: &mut O) -> Result<O::Output, LeaseError> {
        let mut disk = self.disk.clone();
        disk.mono_ns = self.now.saturating_mul(1_000_000);
        let (boot, live) = (self.boot, self.live());
        disk.run(op, &|h| evidence(boot, &live, h))
    }

    fn epochs(&self) -> impl DoubleEndedIterator<Item = Generation> + '_ {
        // `FileRef::Epoch` sorts before every other kind: the range below the first beat.
        self.disk
            .files
            .range(..FileRef::Beat(Generation::FIRST))
            .filter_map(|(f, _)| match f {
                FileRef::Epoch(g) => Some(*g),
                _ => None,
            })
    }

    /// The head generation (0: none).
    pub fn head(&self) -> u64 {
        self.epochs().next_back().map_or(0, Generation::get)
    }

    fn start(&mut self, i: usize, kind: OpKind) -> Result<(), Violation> {
        if self.actors[i].op.is_some() {
            return Ok(());
        }
        let plan = if kind == OpKind::Takeover && self.actors[i].lease.is_none() {
            let view = self.observe(&mut StatusView::read(run_id(), at(self.now), false));
            match takeover_plan(view, self.boot, self.now) {
                Some(p) => Some(p),
                None => return Ok(()),
            }
        } else {
            None
        };
        let observed = plan.as_ref().map(|(e, _)| e.clone());
        let Some(op) = build(kind, &self.actors[i], &self.site(), plan) else {
            return Ok(());
        };
        let head = self.head();
        let a = &mut self.actors[i];
        a.begin(&self.ghost, op, observed, head);
        self.requests[i] = 0;
        self.log
            .push(format!("{} starts {kind:?} at +{} ms", a.who(), self.now));
        Ok(())
    }

    /// Actor `i` performs its next request, or its create's directory fsync, or ends its
    /// operation.
    fn step(&mut self, i: usize) -> Result<(), Violation> {
        if let Some(f) = self.linking[i].take() {
            // The create's directory fsync: the record is durable, the create answered.
            if let Some(dir) = f.dir() {
                self.disk.sync_dir(dir);
            }
            let a = &mut self.actors[i];
            if let Some((_, g)) = a.op.as_mut() {
                self.ghost
                    .on_response(g, matches!(f, FileRef::Event(_)), &Response::Created);
            }
            a.input = Some(Response::Created);
            return self.check_step();
        }
        self.requests[i] += 1;
        if self.requests[i] > MAX_OP_REQUESTS {
            return Err(format!(
                "{}: no answer after {MAX_OP_REQUESTS} requests",
                self.actors[i].who()
            ));
        }
        match self.actors[i].advance() {
            None => return Ok(()),
            Some(Next::Done(op, g, result)) => self.finish(i, &op, &g, &result)?,
            Some(Next::Io(req)) => self.perform(i, req)?,
        }
        self.check_step()
    }

    fn perform(&mut self, i: usize, req: Request) -> Result<(), Violation> {
        let mine = self.actors[i].mine();
        let Some((_, g)) = self.actors[i].op.as_mut() else {
            return Ok(());
        };
        self.ghost.on_request(g, &req);
        let resp = match req {
            Request::CreateExclusive(f, bytes) => {
                let resp = self.disk.link(f, bytes);
                if matches!(resp, Response::Created) {
                    // Linked: visible now, durable and answered at the actor's next step.
                    self.ghost.on_linked(g, &resp, mine);
                    if let FileRef::Cutoff(c) = f {
                        self.ghost.on_cutoff_linked(c.get());
                    }
                    self.linking[i] = Some(f);
                    if let FileRef::Epoch(e) = f {
                        self.check_epoch_created(i, e)?;
                    }
                    return Ok(());
                }
                let Some((_, g)) = self.actors[i].op.as_mut() else {
                    return Ok(());
                };
                self.ghost
                    .on_response(g, matches!(f, FileRef::Event(_)), &resp);
                resp
            }
            other => {
                self.disk.mono_ns = self.now.saturating_mul(1_000_000);
                let (boot, live) = (self.boot, self.live());
                self.disk.perform(other, &|h| evidence(boot, &live, h))
            }
        };
        self.actors[i].input = Some(resp);
        Ok(())
    }

    /// Actor `i`'s operation just linked epoch `e`: it must be one its kind may create
    /// over the epoch below (I6, I8; [`Ghost::check_epoch_created`]).
    fn check_epoch_created(&mut self, i: usize, e: Generation) -> Result<(), Violation> {
        let a = &self.actors[i];
        let Some((op, g)) = &a.op else { return Ok(()) };
        self.log
            .push(format!("{} {:?} created epoch {e}", a.who(), op.kind()));
        let prev = e.prev().and_then(|p| {
            let rec = decode::<EpochRecord>(self.disk.files.get(&FileRef::Epoch(p))?).ok()?;
            Some((p, rec))
        });
        let live = self.live();
        let mine = a.lease.as_ref().map(|l| l.generation);
        self.ghost
            .check_epoch_created(
                g,
                e,
                prev.as_ref().map(|(p, r)| (*p, r)),
                |h| is_up(self.boot, &live, h),
                mine,
            )
            .map_err(|v| format!("{} {:?}: {v}", a.who(), op.kind()))
    }

    fn finish(
        &mut self,
        i: usize,
        op: &AnyOp,
        g: &OpGhost,
        result: &Result<Out, LeaseError>,
    ) -> Result<(), Violation> {
        if let AnyOp::Read(_) = op {
            check_reader(&self.ghost, result, || {
                self.observe(&mut ReadEvents::new(
                    run_id(),
                    Some((ident("checker"), at(self.now))),
                ))
            })?;
        }
        if let (AnyOp::Takeover(_), Ok(Out::Lease(l))) = (op, result) {
            let rec = self
                .disk
                .files
                .get(&FileRef::Epoch(l.generation))
                .and_then(|b| decode::<EpochRecord>(b).ok());
            super::check_takeover_retired(g, rec.as_ref())?;
        }
        let (line, _) = end(&mut self.ghost, &mut self.actors[i], op, g, result, false)?;
        self.log.push(line);
        Ok(())
    }

    /// Every actor runs its operation to the end, round-robin (they still interleave).
    pub fn drain(&mut self) -> Result<(), Violation> {
        loop {
            let busy: Vec<usize> = (0..self.actors.len())
                .filter(|&i| self.actors[i].op.is_some())
                .collect();
            if busy.is_empty() {
                return Ok(());
            }
            for i in busy {
                self.step(i)?;
            }
        }
    }

    fn power_loss(&mut self, tear: bool) -> Result<(), Violation> {
        self.disk.power_loss(tear);
        let files = &self.disk.files;
        self.ghost.power_loss(
            |g| Generation::new(g).is_some_and(|g| files.contains_key(&FileRef::Cutoff(g))),
            |s| Sequence::new(s).is_some_and(|s| files.contains_key(&FileRef::Event(s))),
        );
        // A hand corruption of the head's heartbeat under an unsynced beat is back (an
        // older generation's heartbeat is never read again), and removals a prune made
        // without fsync may be undone: the baseline of I7 is the disk as it came back.
        self.ghost.observe_head(Some(self.head()), true)?;
        let (epochs, head) = (self.epochs().count(), Generation::new(self.head()));
        let back = self
            .hand
            .iter()
            .filter(|(f, bytes)| {
                head.is_some_and(|h| *f == FileRef::Beat(h))
                    && self.disk.files.get(f) == Some(bytes)
            })
            .map(|(f, _)| *f);
        let corrupted: BTreeSet<FileRef> =
            self.ghost.corrupted.iter().copied().chain(back).collect();
        for f in corrupted {
            self.ghost.corrupt(f, epochs);
        }
        self.boot += 1;
        for a in &mut self.actors {
            a.crash();
        }
        self.linking.iter_mut().for_each(|l| *l = None);
        self.log.push(format!(
            "POWER LOSS (tear {tear}): every process is gone, boot {}",
            self.boot
        ));
        self.check_state()
    }

    fn corrupt(&mut self, which: u8) {
        // Only between operations: an operation that observed the head before the
        // corruption may legitimately finish on what it saw.
        if self.actors.iter().any(|a| a.op.is_some()) {
            return;
        }
        let Some(h) = Generation::new(self.head()) else {
            return;
        };
        let target = if which % 2 == 0 {
            FileRef::Epoch(h)
        } else {
            FileRef::Beat(h)
        };
        if !self.disk.files.contains_key(&target) {
            return;
        }
        self.log.push(format!("corrupt {target}"));
        let bytes = b"{\"version\":\"runlease/epoch/1\"}\n".to_vec();
        self.disk.files.insert(target, bytes.clone());
        self.disk.volatile.remove(&target);
        self.hand.push((target, bytes));
        let epochs = self.epochs().count();
        self.ghost.corrupt(target, epochs);
    }

    /// After every step: the head never goes down (I2), no epoch appears while a record is
    /// invalid (I7), no durable heartbeat is lost.
    fn check_step(&mut self) -> Result<(), Violation> {
        self.ghost.observe_head(Some(self.head()), false)?;
        self.ghost.check_no_new_epoch(self.epochs().count())?;
        let files = &self.disk.files;
        self.ghost
            .check_durable_beats(|g| files.get(&FileRef::Beat(Generation::new(g)?)).cloned())
    }

    /// Every invariant read off the disk (after a power loss and at the end): what each
    /// cutoff and checkpoint decided against what each writer was told, granted epochs kept,
    /// cutoffs with successors, `verify`, the log's counted events, a valid status.
    fn check_state(&mut self) -> Result<(), Violation> {
        self.check_step()?;
        let d = Decisions::read(|dir| {
            self.disk
                .files
                .iter()
                .filter(|(f, _)| f.dir() == Some(dir))
                .map(|(_, b)| b.clone())
                .collect()
        });
        d.check(&self.ghost)?;
        if self.ghost.is_corrupted() {
            return Ok(());
        }
        let (cutoffs, floor) = (d.cutoffs, d.floor);
        let files = &self.disk.files;
        self.ghost
            .check_granted_epochs(floor, |g| files.contains_key(&FileRef::Epoch(g)))?;
        cutoffs_have_successors(
            cutoffs.iter().filter_map(|(g, _)| Generation::new(*g)),
            self.head(),
            floor,
        )?;
        self.observe(&mut Verify::new(run_id()))
            .map_err(|e| format!("verify: {e}"))?;
        let status = self
            .observe(&mut StatusView::read(run_id(), at(self.now), false))
            .map_err(|e| format!("status: {e}"))?;
        status_valid(&status.status)
    }

    /// The final checks: the state checks run after a power loss (decisions, granted
    /// epochs, cutoffs with successors, `verify`, status), then a finalizing read of the log
    /// (every acknowledged append counts, no refused or late one does, generation-monotone,
    /// within the cutoffs by the order of links), judged again one event at a time
    /// (the streaming read must agree).
    pub fn check_end(&mut self) -> Result<(), Violation> {
        self.check_state()?;
        self.disk.mono_ns = self.now.saturating_mul(1_000_000);
        let (boot, live) = (self.boot, self.live());
        let live = |h: &Holder| evidence(boot, &live, h);
        let finalize = Some((ident("final-reader"), at(self.now)));
        let view = match self
            .disk
            .run(&mut ReadEvents::new(run_id(), finalize), &live)
        {
            Ok(v) => v,
            Err(_) if self.ghost.is_corrupted() => return Ok(()),
            Err(e) => return Err(format!("the log must be readable: {e}")),
        };
        self.ghost.check_log(&view)?;
        // The streaming read (chain only, then one event at a time) judges every event as
        // the whole-log read did (the finalizing read above left nothing pending).
        let lean = self
            .disk
            .run(&mut ReadEvents::chain_only(run_id(), None), &live)
            .map_err(|e| format!("the streaming read: {e}"))?;
        let mut pass = JudgeLog::new(run_id(), lean);
        let mut streamed = Vec::new();
        while let Some(req) = pass.request() {
            let resp = self.disk.perform(req, &live);
            streamed.push(pass.feed(resp).map_err(|e| format!("second pass: {e}"))?);
        }
        if streamed != view.events {
            return Err("the streamed judgements differ from the whole-log read".into());
        }
        Ok(())
    }
}
