//! [`MemWorld`]: the whole world of the proptest and the fuzzer, over [`MemDisk`].

use super::{
    Actor, AnyOp, Decisions, Next, Out, Site, at, build, check_reader, end, evidence, ident, is_up,
    run_id, takeover_plan,
};
use crate::ghost::{Ghost, OpGhost, OpKind, Violation, cutoffs_have_successors, status_valid};
use crate::mem::MemDisk;
use crate::ops::{JudgeLog, Operation, ReadEvents, Request, Response, StatusView, Verify};
use crate::{EpochRecord, FileRef, Generation, Holder, LeaseError, Sequence, TimingPolicy, decode};
use std::collections::BTreeSet;

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
            crate::ghost::check_takeover_retired(g, rec.as_ref())?;
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
