//! The transition system: the world (simulated file system, actors, ghost), its
//! successors at system-call granularity, and the invariants checked in every state.

use lease_core::ghost::driver::{
    self, AnyOp, Ended, Next, Out, Site, build, check_reader, evidence, takeover_plan,
};
use lease_core::ghost::{
    Ghost, OpGhost, OpKind as Kind, check_takeover_retired, cutoffs_have_successors, status_valid,
};
use lease_core::ops::{
    LivenessEvidence, Operation, ReadEvents, Request, Response, StatusView, Step, Verify,
};
use lease_core::*;
use lease_fs::fs::Fs;
use lease_fs::primitives::PrimOp;
use lease_fs::run_dir::{Exec, prim_response, start_request};
use lease_fs::{Liveness, SimFs};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub(crate) fn hash128(s: &str) -> u128 {
    use std::hash::{Hash, Hasher};
    let mut a = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut a);
    let mut b = std::collections::hash_map::DefaultHasher::new();
    (s.len(), s).hash(&mut b);
    b.write_u64(0x9e37_79b9_7f4a_7c15);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

/// A copy of `lease/`: every file below it, by path, with its content.
pub(crate) type LeaseCopy = Arc<BTreeMap<String, Vec<u8>>>;

/// `run.json`, the run layer's record (PROTOCOL §4).
pub(crate) const RUN_JSON: &str = "run.json";

pub(crate) use lease_core::ghost::driver::{at as t, run_id};

pub(crate) fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

/// An actor: the shared driver's ([`driver::Actor`]: name, incarnation, lease, beats, the
/// operation in flight and its pending answer) and what this checker adds to run it one
/// system call at a time.
#[derive(Clone, Debug)]
pub(crate) struct Actor {
    pub(crate) core: driver::Actor,
    /// The operation's next request, computed but not yet executed.
    pub(crate) pending: Option<Request>,
    pub(crate) exec: Option<(PrimOp, String)>,
    /// Operations it may still start, by kind.
    pub(crate) budget: BTreeMap<Kind, u8>,
    pub(crate) crashes_left: u8,
    /// A takeover in flight: the world time of its last read of the owner's beat, and of
    /// its request to create the next epoch (its commit) (OQ-5).
    pub(crate) looked_at: Option<u64>,
    pub(crate) commit_at: Option<u64>,
    /// A heartbeat in flight: the world time it started (its self-fence reference).
    pub(crate) beat_started_at: Option<u64>,
    /// After a claim, takeover or retirement succeeded: `run.json` still to be written
    /// (lease-run writes it after the epoch is durable, before the command runs).
    pub(crate) run_json: Option<RunJsonWrite>,
}

/// `run.json` being written after an owner change, as lease-run does it: read the old one
/// (left alone if written by this generation or a newer one), then a durable replace
/// (temp file written and fsynced, renamed over `run.json`, the folder fsynced), one call
/// per step. Only in configurations with [`Config::run_layer`].
#[derive(Clone, Debug)]
pub(crate) enum RunJsonWrite {
    /// Read the old `run.json` next; then write it as this generation.
    Read(u64),
    /// The replace in flight, as this generation.
    Write(u64, PrimOp),
}

impl std::ops::Deref for Actor {
    type Target = driver::Actor;
    fn deref(&self) -> &driver::Actor {
        &self.core
    }
}

impl std::ops::DerefMut for Actor {
    fn deref_mut(&mut self) -> &mut driver::Actor {
        &mut self.core
    }
}

impl Actor {
    /// In the middle of an operation (or of the `run.json` write that follows one).
    pub(crate) fn busy(&self) -> bool {
        self.op.is_some() || self.run_json.is_some()
    }
    pub(crate) fn tmp(&self, dir: &str) -> String {
        let name = format!(".tmp-{}{}", self.name, self.incarnation);
        if dir.is_empty() {
            name
        } else {
            format!("{dir}/{name}")
        }
    }
}

#[derive(Clone)]
pub(crate) struct World {
    pub(crate) fs: SimFs,
    pub(crate) actors: Vec<Actor>,
    pub(crate) now: u64,
    pub(crate) boot: u32,
    /// What each actor was told (grants labelled by actor incarnation, `a0`), and the
    /// hand-corrupted record.
    pub(crate) ghost: Ghost,
    pub(crate) power_losses_left: u8,
    pub(crate) time_jumps_left: u8,
    pub(crate) corrupt_left: u8,
    /// The actor that ran last, and how many more preemptions (switching away from an
    /// actor in the middle of an operation) are allowed; `None` = unbounded.
    pub(crate) running: Option<usize>,
    pub(crate) preemptions_left: Option<u8>,
    /// Every heartbeat that succeeded: (generation, world time it finished) (OQ-5).
    pub(crate) beats_ok: Vec<(u64, u64)>,
    /// Actors behave as lease-run's owners ([`Config::run_layer`]).
    pub(crate) run_layer: bool,
    /// Claims, takeovers and retirements refuse on rollback evidence
    /// ([`Config::rollback_check`]).
    pub(crate) rollback_check: bool,
    /// Copies of `lease/` still to take, rollbacks still to make, and the copy taken
    /// (every file below `lease/`, by path), with its hash for the fingerprint.
    pub(crate) copies_left: u8,
    pub(crate) rollbacks_left: u8,
    pub(crate) lease_copy: Option<(LeaseCopy, u128)>,
    /// The policy claims and takeovers write ([`Config::durable_beats`]).
    pub(crate) policy: TimingPolicy,
}

/// Liveness as the world knows it: a holder is up iff it ran on this boot and a live
/// actor incarnation has its pid and start time (each live owner holds its kernel lock):
/// the driver's [`evidence`].
pub(crate) struct WorldLiveness {
    boot: u32,
    live: BTreeSet<(u32, u64)>,
    now_ms: u64,
}

impl Liveness for WorldLiveness {
    fn probe(&self, h: &Holder) -> LivenessEvidence {
        evidence(self.boot, &self.live, h)
    }

    /// The world's clock (ms, moved only by time jumps), as every actor's monotonic clock.
    fn monotonic_ns(&self) -> u64 {
        self.now_ms.saturating_mul(1_000_000)
    }

    /// The world's clock is one clock per boot: beats are stamped with it, and a taker on
    /// the same boot ages a stamped beat on it (PROTOCOL §10, the same-clock rule).
    fn clock_domain(&self) -> Option<lease_core::Identity> {
        Some(driver::boot_id(self.boot))
    }
}

pub(crate) const POLICY_STALE_MS: u64 = 20_000;

impl World {
    pub(crate) fn liveness(&self) -> WorldLiveness {
        WorldLiveness {
            boot: self.boot,
            live: self
                .actors
                .iter()
                .map(|a| (a.pid(), a.start_time()))
                .collect(),
            now_ms: self.now,
        }
    }

    /// The hand-corruption as the state knows it: the number of epochs when it happened.
    pub(crate) fn corrupted(&self) -> Option<usize> {
        self.ghost
            .is_corrupted()
            .then_some(self.ghost.epochs_at_corruption)
    }

    pub(crate) fn fingerprint(&self) -> u128 {
        let g = &self.ghost;
        hash128(&format!(
            "{}|{:?}|{}|{}|{:?}|{:?}|{:?}|{:?}|{}|{}|{}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{}|{}|{:?}",
            self.fs.fingerprint(),
            self.actors,
            self.now,
            self.boot,
            g.acked,
            g.refused,
            g.late,
            g.granted,
            g.max_granted,
            g.max_head,
            self.power_losses_left,
            self.time_jumps_left,
            self.corrupt_left,
            self.corrupted(),
            self.running,
            self.preemptions_left,
            self.beats_ok,
            g.writer,
            g.rolled_back,
            self.copies_left,
            self.rollbacks_left,
            self.lease_copy.as_ref().map(|(_, h)| *h)
        ))
    }

    /// What `check` depends on besides the head bookkeeping.
    pub(crate) fn check_key(&self) -> u128 {
        // Every ghost field `check_state` reads: a cached "ok" must not hide, say, a
        // granted generation that lost its epoch.
        hash128(&format!(
            "{}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{:?}|{}|{}|{:?}|{:?}|{:?}",
            self.fs.fingerprint(),
            self.now,
            self.boot,
            self.ghost.acked,
            self.ghost.refused,
            self.ghost.late,
            self.corrupted(),
            self.ghost.writer,
            self.ghost.rolled_back,
            self.ghost.granted,
            self.ghost.epochs_at_corruption,
            self.ghost.head_at_corruption,
            self.ghost.linked,
            self.ghost.cutoff_linked,
            self.ghost.durable_beats
        ))
    }

    pub(crate) fn head(&self) -> u64 {
        self.fs
            .list("lease/epochs")
            .unwrap_or_default()
            .iter()
            .filter_map(|n| Dir::Epochs.parse_name(n))
            .filter_map(|f| match f {
                FileRef::Epoch(g) => Some(g.get()),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    pub(crate) fn epoch_count(&self) -> usize {
        self.fs
            .list("lease/epochs")
            .unwrap_or_default()
            .iter()
            .filter(|n| Dir::Epochs.parse_name(n).is_some())
            .count()
    }

    /// Run an operation to completion on a fork (observations for starting operations and
    /// for checking invariants never change the explored state).
    pub(crate) fn observe<O: Operation>(&self, op: &mut O) -> Result<O::Output, LeaseError> {
        let fs = self.fs.fork();
        let live = self.liveness();
        let mut input = None;
        loop {
            match op.next(input.take()) {
                Step::Io(req) => {
                    let exec = match start_request(&fs, &live, req, |d| {
                        if d.is_empty() {
                            ".tmp-observer".into()
                        } else {
                            format!("{d}/.tmp-observer")
                        }
                    }) {
                        Ok(e) => e,
                        Err((op, p, e)) => {
                            return Err(LeaseError::ArgumentInvalid {
                                what: "io",
                                reason: format!("{op} {p}: {e}"),
                            });
                        }
                    };
                    input = Some(match exec {
                        Exec::Ready(r) => r,
                        Exec::Prim(prim, _) => {
                            let kind = prim.kind();
                            match prim.run(&fs) {
                                Ok(o) => prim_response(kind, o),
                                Err(e) => {
                                    return Err(LeaseError::ArgumentInvalid {
                                        what: "io",
                                        reason: e.to_string(),
                                    });
                                }
                            }
                        }
                    });
                }
                Step::Done(r) => return r,
            }
        }
    }

    /// One request on a fork, through `start_request` and `PrimOp` as an actor makes it.
    pub(crate) fn perform(&self, req: Request) -> Result<Response, String> {
        let fs = self.fs.fork();
        let live = self.liveness();
        let exec = start_request(&fs, &live, req, |d| format!("{d}/.tmp-observer"))
            .map_err(|(op, p, e)| format!("{op} {p}: {e}"))?;
        Ok(match exec {
            Exec::Ready(r) => r,
            Exec::Prim(prim, _) => {
                let kind = prim.kind();
                prim_response(kind, prim.run(&fs).map_err(|e| e.to_string())?)
            }
        })
    }

    /// The generation that last wrote `run.json` (`None`: none, or not a record).
    pub(crate) fn run_json_generation(&self) -> Option<u64> {
        let bytes = self.fs.read(RUN_JSON, 1 << 16).ok().flatten()?;
        decode_for::<RunStatus>(&run_id(), &bytes)
            .ok()
            .map(|r| r.generation.get())
    }

    /// Rollback evidence as a claim, takeover or retirement gathers it before it acts
    /// (lease-run's admission rule): the head (the highest epoch), the generation that
    /// wrote `run.json`, the newest event's generation (`CountEvents`, then that event
    /// read), judged by `lease_core::rollback::rollback_evidence`. The model has no store.
    pub(crate) fn rollback_evidence(&self) -> Option<lease_core::rollback::Evidence> {
        let head = self.head();
        let newest = match self.perform(Request::CountEvents) {
            Ok(Response::EventCount { highest, .. }) => Sequence::new(highest),
            _ => None,
        };
        let newest_gen =
            newest.and_then(|s| match self.perform(Request::Read(FileRef::Event(s))) {
                Ok(Response::Content(Some(b))) => decode_for::<Event>(&run_id(), &b)
                    .ok()
                    .map(|e| e.generation.get()),
                _ => None,
            });
        lease_core::rollback::rollback_evidence(head, self.run_json_generation(), newest_gen, None)
    }

    /// Every file below `lease/` (live), by path: what a copy of the folder holds.
    pub(crate) fn lease_files(&self) -> BTreeMap<String, Vec<u8>> {
        self.fs
            .snapshot_live()
            .into_iter()
            .filter(|(p, _)| p.starts_with("lease/"))
            .collect()
    }

    /// Copy `lease/` (between operations): the copy a later rollback restores.
    pub(crate) fn copy_lease(&mut self) -> String {
        self.copies_left -= 1;
        let files = self.lease_files();
        let h = hash128(&format!("{files:?}"));
        let line = format!("copy lease/ ({} files, head {})", files.len(), self.head());
        self.lease_copy = Some((Arc::new(files), h));
        line
    }

    /// Restore `lease/` from the copy (between operations), durably, keeping `events/` and
    /// `run.json` (issue #28): every file below `lease/` removed, each folder fsynced, the
    /// copy's files written back (durable).
    pub(crate) fn restore_lease(&mut self) -> Option<String> {
        let (copy, _) = self.lease_copy.clone()?;
        if *copy == self.lease_files() {
            return None;
        }
        self.rollbacks_left -= 1;
        let before = self.head();
        for d in Dir::ALL.iter().filter(|d| d.path().starts_with("lease/")) {
            for name in self.fs.list(d.path()).unwrap_or_default() {
                self.fs.unlink(&format!("{}/{name}", d.path())).unwrap();
            }
            self.fs.fsync_dir(d.path()).unwrap();
        }
        for (p, b) in copy.iter() {
            self.fs.put(p, b).unwrap();
        }
        self.ghost.rollback();
        Some(format!(
            "ROLLBACK: lease/ restored from the copy (head {before} -> {}), events/ and run.json kept",
            self.head()
        ))
    }

    pub(crate) fn start(&mut self, i: usize, kind: Kind) -> Option<String> {
        let head = self.head();
        let a = &self.actors[i];
        if a.op.is_some() || a.budget.get(&kind).copied().unwrap_or(0) == 0 {
            return None;
        }
        let plan = match (kind, &a.lease) {
            (Kind::Takeover, None) => {
                let view = self.observe(&mut StatusView::read(run_id(), t(self.now), false));
                Some(takeover_plan(view, self.boot, self.now)?)
            }
            _ => None,
        };
        let observed = plan.as_ref().map(|(e, _)| e.clone());
        let site = Site {
            now: self.now,
            boot: self.boot,
            policy: self.policy,
        };
        let op = build(kind, &self.actors[i], &site, plan)?;
        // The admission rule's rollback evidence, before anything is written (issue #28).
        if self.rollback_check && matches!(kind, Kind::Claim | Kind::Takeover | Kind::Retire) {
            if let Some(e) = self.rollback_evidence() {
                let a = &mut self.actors[i];
                *a.budget.get_mut(&kind).unwrap() -= 1;
                return Some(format!(
                    "{}{} starts {kind:?} at t={}: refused before writing, CHAIN_BROKEN ({e})",
                    a.name, a.incarnation, self.now
                ));
            }
        }
        let a = &mut self.actors[i];
        a.core.begin(&self.ghost, op, observed, head);
        *a.budget.get_mut(&kind).unwrap() -= 1;
        a.looked_at = None;
        a.commit_at = None;
        a.beat_started_at = Some(self.now);
        let line = format!(
            "{}{} starts {kind:?} at t={}",
            a.name, a.incarnation, self.now
        );
        Some(
            self.advance(i, line)
                .unwrap_or_else(|e| format!("VIOLATION: {e}")),
        )
    }

    /// One system call (or the completion) of actor `i`'s operation.
    pub(crate) fn step(&mut self, i: usize) -> Result<String, String> {
        if self.actors[i].op.is_none() {
            if let Some(w) = self.actors[i].run_json.take() {
                return self.step_run_json(i, w);
            }
        }
        let live = self.liveness();
        let a = &mut self.actors[i];
        let who = format!("{}{}", a.name, a.incarnation);
        if let Some((mut prim, path)) = a.exec.take() {
            let kind = prim.kind();
            let was_linked = prim.linked();
            let r = step_prim(&mut prim, &self.fs);
            // The ghost hears of an event the moment it became visible (its link), and of
            // the create's answer when it comes, steps later.
            let mine = a.lease.as_ref().map_or(0, |l| l.generation.get());
            let is_event = path.starts_with(Dir::Events.path());
            if let Some((_, g)) = a.op.as_mut() {
                if is_event && !was_linked && prim.linked() {
                    self.ghost.on_linked(g, &Response::Created, mine);
                }
                if !was_linked
                    && prim.linked()
                    && let Some(c) = cutoff_of(&path)
                {
                    self.ghost.on_cutoff_linked(c);
                }
                if let Some(Ok(o)) = &r {
                    self.ghost
                        .on_response(g, is_event, &prim_response(kind, *o));
                }
            }
            match r {
                None => {
                    a.exec = Some((prim, path.clone()));
                    return Ok(format!("{who}: {kind:?} {path}: next call"));
                }
                Some(Ok(o)) => {
                    a.input = Some(prim_response(kind, o));
                    let line = format!("{who}: {kind:?} {path} -> {:?}", a.input.as_ref().unwrap());
                    return self.advance(i, line);
                }
                Some(Err(e)) => {
                    return Err(format!(
                        "{who}: unexpected I/O error in {kind:?} {path}: {e}"
                    ));
                }
            }
        }
        let next = match a.pending.take() {
            Some(req) => Some(Next::Io(req)),
            None => a.core.advance(),
        };
        match next {
            None => Ok(String::new()),
            Some(Next::Io(req)) => {
                let Some((op, mut ghost)) = a.op.take() else {
                    return Ok(String::new());
                };
                let desc = format!("{req:?}");
                let desc: String = desc.chars().take(90).collect();
                let event_create = matches!(req, Request::CreateExclusive(FileRef::Event(_), _));
                self.ghost.on_request(&mut ghost, &req);
                if matches!(op, AnyOp::Takeover(_)) {
                    let a = &mut self.actors[i];
                    match &req {
                        // Its looks before the commit (step 11's re-read comes after).
                        Request::Read(FileRef::Beat(_)) if a.commit_at.is_none() => {
                            a.looked_at = Some(self.now)
                        }
                        Request::CreateExclusive(FileRef::Epoch(_), _) => {
                            a.commit_at = Some(self.now)
                        }
                        _ => {}
                    }
                }
                let a = &self.actors[i];
                let exec = start_request(&self.fs, &live, req, |d| a.tmp(d))
                    .map_err(|(op, p, e)| format!("{who}: unexpected I/O error {op} {p}: {e}"))?;
                let a = &mut self.actors[i];
                let mine = a.lease.as_ref().map_or(0, |l| l.generation.get());
                match exec {
                    Exec::Ready(r) => a.input = Some(r),
                    Exec::Prim(mut prim, path) => {
                        let kind = prim.kind();
                        let r = step_prim(&mut prim, &self.fs);
                        // Linked while a higher generation had already been granted: this
                        // writer is fenced and the event must never count. The link is
                        // noted when it happens (here or in a later step of `exec`), the
                        // create's answer when it comes.
                        if event_create && prim.linked() {
                            self.ghost.on_linked(&ghost, &Response::Created, mine);
                        }
                        if prim.linked()
                            && let Some(c) = cutoff_of(&path)
                        {
                            self.ghost.on_cutoff_linked(c);
                        }
                        match r {
                            None => a.exec = Some((prim, path)),
                            Some(Ok(o)) => a.input = Some(prim_response(kind, o)),
                            Some(Err(e)) => return Err(format!("{who}: I/O error {e}")),
                        }
                    }
                }
                if let Some(resp) = &a.input {
                    self.ghost.on_response(&mut ghost, event_create, resp);
                }
                a.op = Some((op, ghost));
                let line = format!("{who}: {desc}");
                if a.exec.is_none() {
                    // The request completed in this step: let the operation compute its
                    // next request (or finish) at once; that is local computation.
                    return self.advance(i, line);
                }
                Ok(line)
            }
            Some(Next::Done(op, ghost, result)) => self.finish(i, op, ghost, result),
        }
    }

    /// One call of the `run.json` write that follows an owner change ([`RunJsonWrite`]).
    fn step_run_json(&mut self, i: usize, w: RunJsonWrite) -> Result<String, String> {
        let prev = match &w {
            RunJsonWrite::Read(_) => Some(self.run_json_generation()),
            RunJsonWrite::Write(..) => None,
        };
        let (boot, now) = (self.boot, self.now);
        let a = &mut self.actors[i];
        let who = format!("{}{}", a.name, a.incarnation);
        match w {
            RunJsonWrite::Read(g) => {
                let prev = prev.flatten();
                if prev.is_some_and(|p| p >= g) {
                    return Ok(format!(
                        "{who}: Read run.json -> written by {prev:?}; left as it is"
                    ));
                }
                let record = RunStatus {
                    run_id: run_id(),
                    status: RunState::Running,
                    generation: Generation::new(g).unwrap(),
                    sealed_sequence: None,
                    wake_at: None,
                    holder: Some(a.holder(boot)),
                    heartbeat_at: None,
                    updated_at: t(now),
                    detail: None,
                };
                let bytes = encode(&record).map_err(|e| e.to_string())?;
                a.run_json = Some(RunJsonWrite::Write(
                    g,
                    PrimOp::replace(RUN_JSON, bytes, true, a.tmp("")),
                ));
                Ok(format!("{who}: Read run.json -> written by {prev:?}"))
            }
            RunJsonWrite::Write(g, mut prim) => match step_prim(&mut prim, &self.fs) {
                None => {
                    a.run_json = Some(RunJsonWrite::Write(g, prim));
                    Ok(format!("{who}: Replace run.json: next call"))
                }
                Some(Ok(_)) => Ok(format!("{who}: Replace run.json -> written by {g}")),
                Some(Err(e)) => Err(format!("{who}: unexpected I/O error writing run.json: {e}")),
            },
        }
    }

    /// After a response: run the operation's local computation up to its next request
    /// (kept pending, executed at the actor's next step) or its end.
    pub(crate) fn advance(&mut self, i: usize, line: String) -> Result<String, String> {
        let a = &mut self.actors[i];
        match a.core.advance() {
            None => Ok(line),
            Some(Next::Io(req)) => {
                a.pending = Some(req);
                Ok(line)
            }
            Some(Next::Done(op, ghost, result)) => {
                let end = self.finish(i, op, ghost, result)?;
                Ok(format!("{line}; {end}"))
            }
        }
    }

    pub(crate) fn finish(
        &mut self,
        i: usize,
        op: AnyOp,
        ghost: OpGhost,
        result: Result<Out, LeaseError>,
    ) -> Result<String, String> {
        let who = self.actors[i].who();
        if let (AnyOp::Takeover(t), Ok(Out::Lease(l))) = (&op, &result) {
            // OQ-5: a takeover that replaced an owner whose heartbeat succeeded after the
            // taker's last look at its beat says so (`Preempted`), so the new owner waits
            // for the old one's self-fence before it acts.
            let a = &self.actors[i];
            check_no_unseen_beat(
                &self.beats_ok,
                l.generation.get() - 1,
                a.looked_at,
                a.commit_at,
                t.preempted().is_some(),
            )
            .map_err(|v| format!("{who}: Takeover: {v}"))?;
            // The epoch it created must retire exactly the owner it observed.
            let bytes = self
                .fs
                .read(&FileRef::Epoch(l.generation).path(), 1 << 20)
                .ok()
                .flatten();
            let rec: Option<EpochRecord> = bytes.and_then(|b| decode(&b).ok());
            check_takeover_retired(&ghost, rec.as_ref())
                .map_err(|v| format!("{who}: Takeover: {v}"))?;
        }
        if let AnyOp::Read(_) = &op {
            check_reader(&self.ghost, &result, || {
                self.observe(&mut ReadEvents::new(
                    run_id(),
                    Some((id("checker"), t(self.now))),
                ))
            })
            .map_err(|v| format!("{who}: Read: {v}"))?;
        }
        // What it was told, checked and recorded; the actor's lease, beats and (when the
        // run layer exits on FENCED) process as lease-run's owner has them.
        let a = &mut self.actors[i];
        let (line, ended) = driver::end(
            &mut self.ghost,
            &mut a.core,
            &op,
            &ghost,
            &result,
            self.run_layer,
        )?;
        match ended {
            Ended::Granted(g) | Ended::Retired(g) if self.run_layer => {
                a.run_json = Some(RunJsonWrite::Read(g));
            }
            Ended::Beat => {
                let g = a.mine();
                // Its start is what the owner's self-fence counts from: the owner believes
                // it holds the run until then + self_fence_after.
                self.beats_ok
                    .push((g, a.beat_started_at.unwrap_or(self.now)));
            }
            _ => {}
        }
        Ok(line)
    }

    pub(crate) fn crash_actor(&mut self, i: usize) -> String {
        let a = &mut self.actors[i];
        let line = format!("{}{} crashes (process)", a.name, a.incarnation);
        a.crashes_left -= 1;
        a.core.crash();
        a.exec = None;
        a.pending = None;
        a.looked_at = None;
        a.commit_at = None;
        a.beat_started_at = None;
        a.run_json = None;
        line
    }

    pub(crate) fn power_loss(&mut self, tear: bool) -> String {
        self.power_losses_left -= 1;
        self.fs.recover(tear);
        // Links the power loss undid are no longer facts about the disk.
        let fs = &self.fs;
        self.ghost.power_loss(
            |g| {
                Generation::new(g)
                    .is_some_and(|g| fs.exists(&FileRef::Cutoff(g).path()).unwrap_or(false))
            },
            |s| {
                Sequence::new(s)
                    .is_some_and(|s| fs.exists(&FileRef::Event(s).path()).unwrap_or(false))
            },
        );
        self.boot += 1;
        for a in &mut self.actors {
            a.core.crash();
            a.exec = None;
            a.pending = None;
            a.run_json = None;
        }
        format!(
            "POWER LOSS (tear {tear}); every process is gone, boot {}",
            self.boot
        )
    }

    pub(crate) fn corrupt(&mut self) -> Option<String> {
        if self.actors.iter().any(Actor::busy) {
            return None;
        }
        let h = Generation::new(self.head())?;
        self.corrupt_left -= 1;
        let path = FileRef::Epoch(h).path();
        self.fs
            .put(&path, b"{\"version\":\"runlease/epoch/1\"}\n")
            .unwrap();
        let epochs = self.epoch_count();
        self.ghost.corrupt(FileRef::Epoch(h), epochs);
        Some(format!("hand-corrupt {path}"))
    }

    /// Every invariant that can be read off the state itself. `memo` caches the verdict of
    /// the expensive part by what it depends on.
    pub(crate) fn check(
        &mut self,
        after_power_loss: bool,
        memo: &mut std::collections::HashMap<u128, Result<(), String>>,
    ) -> Result<(), String> {
        // Un-acknowledged creations may be lost with the power; acknowledged ones are
        // checked below (granted generations keep their epoch).
        let head = self.head();
        self.ghost.observe_head(Some(head), after_power_loss)?;
        let key = self.check_key();
        if let Some(r) = memo.get(&key) {
            return r.clone();
        }
        let r = self.check_state();
        memo.insert(key, r.clone());
        r
    }

    pub(crate) fn check_state(&mut self) -> Result<(), String> {
        self.check_decisions()?;
        if self.ghost.is_corrupted() {
            return self.ghost.check_no_new_epoch(self.epoch_count());
        }
        if self.ghost.rolled_back {
            // The run is damaged from outside (issue #28): what must still hold is that no
            // decision (cutoff, checkpoint) contradicts what a writer was told, checked
            // above, and that no generation is granted twice (`Ghost::finish`).
            return Ok(());
        }
        // No heartbeat acknowledged as durable is lost (PROTOCOL §5.3).
        self.ghost.check_durable_beats(|g| {
            let f = FileRef::Beat(Generation::new(g)?);
            self.fs.read(&f.path(), 1 << 20).ok().flatten()
        })?;
        let floor = self
            .fs
            .list("lease/checkpoints")
            .unwrap_or_default()
            .iter()
            .filter_map(|n| Dir::Checkpoints.parse_name(n))
            .filter_map(|f| match f {
                FileRef::Checkpoint(g) => Some(g.get()),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        self.ghost.check_granted_epochs(floor, |g| {
            self.fs.exists(&FileRef::Epoch(g).path()).unwrap_or(false)
        })?;
        let cutoffs = self.fs.list("lease/cutoffs").unwrap_or_default();
        cutoffs_have_successors(
            cutoffs
                .iter()
                .filter_map(|n| match Dir::Cutoffs.parse_name(n) {
                    Some(FileRef::Cutoff(g)) => Some(g),
                    _ => None,
                }),
            self.head(),
            floor,
        )?;
        // The whole-run check, read-only, in every state (issue #17): cutoffs bound by the
        // epochs after them (none missing or changed), cutoffs that agree with their epochs,
        // no record above the head, the checkpoint's last event. A power loss or a crash at
        // any point must never make it report a broken chain.
        self.observe(&mut Verify::new(run_id()))
            .map_err(|e| format!("verify: {e}"))?;
        let view = self
            .observe(&mut ReadEvents::new(
                run_id(),
                Some((id("checker"), t(self.now))),
            ))
            .map_err(|e| format!("log unreadable: {e}"))?;
        self.ghost.check_log(&view)?;
        let status = self
            .observe(&mut StatusView::read(run_id(), t(self.now), false))
            .map_err(|e| format!("status: {e}"))?;
        status_valid(&status.status)
    }

    /// Every cutoff and checkpoint on disk against what each writer was told
    /// (`Ghost::check_decisions`: I4, I9, I5).
    fn check_decisions(&self) -> Result<(), String> {
        let read = |dir: Dir| -> Vec<Vec<u8>> {
            self.fs
                .list(dir.path())
                .unwrap_or_default()
                .iter()
                .filter(|n| dir.parse_name(n).is_some())
                .filter_map(|n| {
                    self.fs
                        .read(&format!("{}/{n}", dir.path()), 1 << 20)
                        .ok()
                        .flatten()
                })
                .collect()
        };
        driver::Decisions::read(read).check(&self.ghost)
    }

    /// Whether running actor `i` now is a preemption (another actor is in the middle of an
    /// operation), and whether one is still allowed.
    pub(crate) fn schedule(&self, i: usize) -> Option<u8> {
        let busy_other = self
            .running
            .is_some_and(|r| r != i && self.actors[r].busy());
        match (busy_other, self.preemptions_left) {
            (false, p) => Some(p.unwrap_or(u8::MAX)),
            (true, None) => Some(u8::MAX),
            (true, Some(0)) => None,
            (true, Some(p)) => Some(p - 1),
        }
    }

    pub(crate) fn successors(&self) -> Vec<(World, String, bool)> {
        let mut out = Vec::new();
        let n = self.actors.len();
        for i in 0..n {
            let Some(left) = self.schedule(i) else {
                // Switching to this actor would exceed the preemption bound; it may still
                // crash.
                if self.actors[i].crashes_left > 0
                    && (self.actors[i].busy() || self.actors[i].lease.is_some())
                {
                    let mut w = self.clone_deep();
                    let line = w.crash_actor(i);
                    out.push((w, line, false));
                }
                continue;
            };
            let left = self.preemptions_left.map(|_| left);
            if self.actors[i].busy() {
                let mut w = self.clone_deep();
                w.running = Some(i);
                w.preemptions_left = left;
                match w.step(i) {
                    Ok(line) => out.push((w, line, false)),
                    Err(msg) => {
                        let mut w = self.clone_deep();
                        w.actors.clear();
                        out.push((w, format!("VIOLATION: {msg}"), false));
                    }
                }
            } else {
                let kinds: Vec<Kind> = self.actors[i]
                    .budget
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(k, _)| *k)
                    .collect();
                for k in kinds {
                    let mut w = self.clone_deep();
                    w.running = Some(i);
                    w.preemptions_left = left;
                    if let Some(line) = w.start(i, k) {
                        if line.starts_with("VIOLATION") {
                            let mut w = self.clone_deep();
                            w.actors.clear();
                            out.push((w, line, false));
                        } else {
                            out.push((w, line, false));
                        }
                    }
                }
            }
            if self.actors[i].crashes_left > 0
                && (self.actors[i].busy() || self.actors[i].lease.is_some())
            {
                let mut w = self.clone_deep();
                let line = w.crash_actor(i);
                out.push((w, line, false));
            }
        }
        // Issue #28: a copy of lease/ taken between operations, and lease/ restored from it
        // later (events/ and run.json kept). The rollback restarts the head's watermark,
        // as a power loss does.
        let quiet = !self.actors.iter().any(Actor::busy);
        if quiet && self.copies_left > 0 {
            let mut w = self.clone_deep();
            let line = w.copy_lease();
            out.push((w, line, false));
        }
        if quiet && self.rollbacks_left > 0 {
            let mut w = self.clone_deep();
            if let Some(line) = w.restore_lease() {
                out.push((w, line, true));
            }
        }
        if self.power_losses_left > 0 && self.actors.iter().any(|a| a.busy() || a.lease.is_some()) {
            for tear in [false, true] {
                let mut w = self.clone_deep();
                let line = w.power_loss(tear);
                out.push((w, line, true));
            }
        }
        if self.time_jumps_left > 0 {
            let mut w = self.clone_deep();
            w.time_jumps_left -= 1;
            w.now += POLICY_STALE_MS + 1;
            out.push((
                w,
                format!("clock jumps to t={}", self.now + POLICY_STALE_MS + 1),
                false,
            ));
        }
        if self.corrupt_left > 0 {
            let mut w = self.clone_deep();
            if let Some(line) = w.corrupt() {
                out.push((w, line, false));
            }
        }
        out
    }

    pub(crate) fn clone_deep(&self) -> World {
        let mut w = self.clone();
        w.fs = self.fs.fork();
        w
    }
}

/// One visible system call of a primitive, merged with the private temp-file calls around
/// it (see `PrimOp::next_is_private`).
pub(crate) fn step_prim(prim: &mut PrimOp, fs: &SimFs) -> Option<std::io::Result<bool>> {
    loop {
        let r = prim.step(fs);
        if r.is_some() || !prim.next_is_private() {
            return r;
        }
    }
}

pub(crate) type ActorSpec = (char, Vec<(Kind, u8)>, u8);

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) name: &'static str,
    /// (name, operation budget, process crashes allowed)
    pub(crate) actors: Vec<ActorSpec>,
    pub(crate) power_losses: u8,
    pub(crate) time_jumps: u8,
    pub(crate) corrupt: u8,
    /// Preemption bound (`None`: every interleaving at system-call granularity).
    pub(crate) preemptions: Option<u8>,
    pub(crate) max_states: usize,
    /// Actors behave as lease-run's: they write `run.json` after each claim, takeover and
    /// retirement (the evidence a rollback of `lease/` leaves behind), and an owner told
    /// `FENCED` exits (a new incarnation: its holder is dead).
    pub(crate) run_layer: bool,
    /// Claims, takeovers and retirements refuse on rollback evidence (lease-run's
    /// admission rule, `lease_core::rollback`); `RUNLEASE_MODEL_NO_ROLLBACK_CHECK=1`
    /// turns it off, to show what the checker finds without it.
    pub(crate) rollback_check: bool,
    /// Copies of `lease/` that may be taken, and rollbacks of `lease/` to the copy
    /// (issue #28).
    pub(crate) copies: u8,
    pub(crate) rollbacks: u8,
    /// The policy claims and takeovers write: `durable` heartbeats (fsynced, so a power
    /// loss or a torn write never takes an acknowledged beat back, PROTOCOL §5.3) or the
    /// default `local`.
    pub(crate) durable_beats: bool,
    /// How much of a torn write reaches the disk (`SimFs::set_tear_fraction`; `None`: the
    /// simulated file system's half). A heartbeat slot is 2,048 bytes whose record fills
    /// the first few hundred: only a fraction below about 1/8 cuts into the record.
    pub(crate) tear: Option<(u64, u64)>,
}

/// What a configuration does not say: no faults, every interleaving, the folder layer
/// only, the rollback check on, the `local` heartbeat policy and the simulated file
/// system's own tear. Each configuration names itself, its actors and its state cap.
impl Default for Config {
    fn default() -> Config {
        Config {
            name: "",
            actors: Vec::new(),
            power_losses: 0,
            time_jumps: 0,
            corrupt: 0,
            preemptions: None,
            max_states: 0,
            run_layer: false,
            rollback_check: true,
            copies: 0,
            rollbacks: 0,
            durable_beats: false,
            tear: None,
        }
    }
}

pub(crate) fn world(c: &Config) -> World {
    let fs = SimFs::new();
    for d in Dir::ALL {
        fs.ensure_dir(d.path()).unwrap();
    }
    // Where power can fail, renames outrun their data (the file system the issue-#17
    // tester used): a `local` heartbeat, renamed into place unsynced, can come back empty
    // or torn, and the run must stay recoverable by the protocol alone (OQ-6).
    if c.power_losses > 0 {
        fs.set_renames_outrun_data(true);
    }
    if let Some((num, den)) = c.tear {
        fs.set_tear_fraction(num, den);
    }
    World {
        fs,
        actors: c
            .actors
            .iter()
            .map(|(name, budget, crashes)| Actor {
                core: driver::Actor::new(*name),
                pending: None,
                exec: None,
                budget: budget.iter().copied().collect(),
                crashes_left: *crashes,
                looked_at: None,
                commit_at: None,
                beat_started_at: None,
                run_json: None,
            })
            .collect(),
        now: 0,
        boot: 0,
        ghost: Ghost::new(),
        power_losses_left: c.power_losses,
        time_jumps_left: c.time_jumps,
        corrupt_left: c.corrupt,
        running: None,
        preemptions_left: c.preemptions,
        beats_ok: Vec::new(),
        run_layer: c.run_layer,
        rollback_check: c.rollback_check
            && std::env::var("RUNLEASE_MODEL_NO_ROLLBACK_CHECK").map_or(true, |v| v != "1"),
        copies_left: c.copies,
        rollbacks_left: c.rollbacks,
        lease_copy: None,
        policy: if c.durable_beats {
            TimingPolicy::default().with_durability(HeartbeatDurability::Durable)
        } else {
            TimingPolicy::default()
        },
    }
}

/// The generation of the cutoff at `path`, if it is one.
fn cutoff_of(path: &str) -> Option<u64> {
    let (dir, name) = path.rsplit_once('/')?;
    if dir != Dir::Cutoffs.path() {
        return None;
    }
    match Dir::Cutoffs.parse_name(name)? {
        FileRef::Cutoff(g) => Some(g.get()),
        _ => None,
    }
}

/// OQ-5's invariant: a takeover that replaced generation `g` after its last look at `g`'s
/// beat at `looked_at` (committing at `commit_at`) reports `preempted` whenever a heartbeat
/// of `g` that *started* after that look (a later world time) succeeded: that owner proved
/// alive after the look and runs on until it fences itself, `self_fence_after` after that
/// start. (A beat that started before the look and finished after it, a paused heartbeat,
/// gives its owner nothing past its start + `self_fence_after`, already before the look.)
pub(crate) fn check_no_unseen_beat(
    beats_ok: &[(u64, u64)],
    g: u64,
    looked_at: Option<u64>,
    commit_at: Option<u64>,
    reported: bool,
) -> Result<(), String> {
    let (Some(look), Some(commit)) = (looked_at, commit_at) else {
        return Err("takeover committed without a recorded look or commit".into());
    };
    match beats_ok.iter().find(|(bg, at)| *bg == g && *at > look) {
        Some((_, at)) if !reported => Err(format!(
            "takeover replaced generation {g} (its commit requested at t={commit}) without reporting it preempted a live owner, although its heartbeat that started at t={at}, after the taker's last look at t={look}, succeeded (OQ-5)"
        )),
        _ => Ok(()),
    }
}
