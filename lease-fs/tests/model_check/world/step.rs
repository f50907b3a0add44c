//! An actor's transitions: an operation started, one system call, its end, `run.json`.

use super::{RUN_JSON, RunJsonWrite, World, check_no_unseen_beat, id, run_id, t};
use lease_core::ghost::driver::{
    self, AnyOp, Ended, Next, Out, Site, build, check_reader, takeover_plan,
};
use lease_core::ghost::{OpGhost, OpKind as Kind, check_takeover_retired};
use lease_core::ops::{ReadEvents, Request, Response, StatusView};
use lease_core::*;
use lease_fs::SimFs;
use lease_fs::fs::Fs;
use lease_fs::primitives::PrimOp;
use lease_fs::run_dir::{Exec, prim_response, start_request};

impl World {
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
