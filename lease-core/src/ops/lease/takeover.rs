//! takeover (PROTOCOL §7.4): exact takeover of a stale owner.

use super::gate::{Gate, bind};
use super::{OwnedLease, Writer, created, finalize_superseded, race};
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, Identity, RunId};
use crate::layout::FileRef;
use crate::ops::common::{Finalize, Head, Observe, Recheck, read_beat};
use crate::ops::{Operation, Request, Response, Step, step_try, sub_step, violation};
use crate::policy::TimingPolicy;
use crate::records::{
    EpochRecord, EpochState, Holder, Observation, RetireReason, RetiredOwner, TakeoverMode,
};
use crate::time::Timestamp;

/// What the taker (or the operator) observed and expects still to be true.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expectation {
    /// The head generation, if the caller knows it.
    pub generation: Option<Generation>,
    /// The owner id.
    pub owner_id: Identity,
    /// The heartbeat time.
    pub heartbeat_at: Timestamp,
    /// The heartbeat counter, if the caller knows it.
    pub heartbeat_count: Option<u64>,
}

impl Expectation {
    /// The expectation matching exactly what `head` shows.
    pub fn of(head: &Head) -> Expectation {
        Expectation {
            generation: Some(head.generation()),
            owner_id: head.epoch.owner_id.clone(),
            heartbeat_at: head.heartbeat_at(),
            heartbeat_count: Some(head.heartbeat_count()),
        }
    }

    /// What differs between this expectation and `head` (`None`: it matches exactly).
    pub fn mismatch(&self, head: &Head) -> Option<String> {
        // mutant expectation_ignored: the exact observation is never compared (§7.4 JUDGE, I6).
        if crate::mutant::mutant("expectation_ignored") {
            return None;
        }
        if let Some(g) = self.generation {
            if g != head.generation() {
                return Some(format!(
                    "expected generation {g}, found {}",
                    head.generation()
                ));
            }
        }
        if self.owner_id != head.epoch.owner_id {
            return Some(format!(
                "expected owner {}, found {}",
                self.owner_id, head.epoch.owner_id
            ));
        }
        if self.heartbeat_at != head.heartbeat_at() {
            return Some(format!(
                "expected heartbeat {}, found {}",
                self.heartbeat_at,
                head.heartbeat_at()
            ));
        }
        if let Some(c) = self.heartbeat_count {
            if c != head.heartbeat_count() {
                return Some(format!(
                    "expected heartbeat #{c}, found #{}",
                    head.heartbeat_count()
                ));
            }
        }
        None
    }
}

/// Who asked for the takeover, and the evidence that the owner stopped: how long the taker
/// watched the owner's record (generation, owner, heartbeat time and count) **unchanged on
/// its own monotonic clock** (`CLOCK_BOOTTIME`). A takeover needs strictly more than the
/// owner's `stale_after`; no path compares the owner's wall clock with the taker's
/// (PROTOCOL §10): an owner whose clock runs slow is not stale while it beats, and one whose
/// clock runs fast (a heartbeat "in the future") is stale `stale_after` after it stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeoverTrigger {
    /// An operator confirmed the exact observation (`runlease takeover`), after watching.
    Operator {
        /// How long the observer watched the record unchanged, in ms.
        watched_unchanged_ms: u64,
    },
    /// A program (`runlease run --takeover-stale`), after watching.
    Automatic {
        /// How long the observer watched the record unchanged, in ms.
        watched_unchanged_ms: u64,
    },
}

impl TakeoverTrigger {
    /// How long the record was watched unchanged, in ms.
    pub fn watched_ms(self) -> u64 {
        match self {
            TakeoverTrigger::Operator {
                watched_unchanged_ms,
            }
            | TakeoverTrigger::Automatic {
                watched_unchanged_ms,
            } => watched_unchanged_ms,
        }
    }
}

/// Arguments of a takeover.
#[derive(Debug, Clone)]
pub struct TakeoverParams {
    /// The run.
    pub run_id: RunId,
    /// The taker's new owner id.
    pub owner_id: Identity,
    /// The taker's process.
    pub holder: Holder,
    /// The policy the taker will run with.
    pub policy: TimingPolicy,
    /// Wall time.
    pub now: Timestamp,
    /// The exact observation the takeover is conditioned on.
    pub expect: Expectation,
    /// Operator or automatic.
    pub trigger: TakeoverTrigger,
}

/// Exact takeover of a stale owner.
///
/// Judges the observed head first and refuses, **writing nothing**, any difference from the
/// expectation (`TAKEOVER_RACE`) or a watch no longer than the owner's `stale_after`
/// (`TAKEOVER_ACTIVE_REFUSED`). Then finalizes what GATE requires, re-reads the heartbeat and
/// judges again (a refusal there has still written no file of its own), creates the next
/// epoch as `active` for the taker with its observation in `retired.observed` (the audit
/// record; issue #19 folded the separate intent file into it), re-checks, then finalizes the
/// old generation's cutoff.
#[derive(Debug, Clone)]
pub struct Takeover {
    p: TakeoverParams,
    st: TakeoverState,
    preempted: Option<Preempted>,
}

/// A takeover that may have replaced a live owner (PROTOCOL §7.4 step 11, OQ-5): the
/// owner's beat changed between the takeover's last look and its re-read after the commit.
/// An owner whose heartbeat succeeded in that window believes it holds the run until its
/// next heartbeat (which finds the new epoch and fences it) or its self-fence, at most
/// `self_fence_after_ms` after that beat started; a new owner that must not overlap with
/// it waits that long (on its own monotonic clock) before it acts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preempted {
    /// The replaced generation.
    pub generation: Generation,
    /// Its owner.
    pub owner_id: Identity,
    /// The replaced owner's `self_fence_after`, in ms.
    pub self_fence_after_ms: u64,
}

#[derive(Debug, Clone)]
enum TakeoverState {
    Observe(Observe),
    Gate(Box<Head>, Gate),
    /// The monotonic reading before the last look at the owner's beat (OQ-5).
    ClockBefore(Box<Head>, Option<Digest>),
    Reread(Box<Head>, Option<Digest>, u64),
    /// The monotonic reading right before the commit: the look-to-commit window (OQ-5).
    ClockAfter(Box<(Head, EpochRecord, Digest, Request)>, u64),
    Create(Box<(Head, EpochRecord, Digest)>),
    Recheck(Box<(Head, EpochRecord, Digest)>, Recheck),
    Finalize(Box<(EpochRecord, Digest, Option<Head>)>, Finalize),
    /// Step 11: the owner's beat read again after the commit (OQ-5).
    Preempt(Box<(EpochRecord, Digest, Head)>),
    Done,
}

impl Takeover {
    /// Start a takeover.
    pub fn new(p: TakeoverParams) -> Takeover {
        let obs = Observe::new(p.run_id.clone());
        Takeover {
            p,
            st: TakeoverState::Observe(obs),
            preempted: None,
        }
    }

    /// After a successful takeover: whether it may have replaced a live owner (see
    /// [`Preempted`]). `None` also for an adopted retry (it did not read the beat).
    pub fn preempted(&self) -> Option<&Preempted> {
        self.preempted.as_ref()
    }

    /// The takeover's judgement of an observed head (step 6): the caller's expectation must
    /// match it exactly (`TAKEOVER_RACE`), and the caller must have watched it unchanged for
    /// more than the `stale_after` of the owner's epoch (`TAKEOVER_ACTIVE_REFUSED`). The wall
    /// age is reported, never judged.
    fn judge(&self, run: &RunId, head: &Head) -> Result<(), LeaseError> {
        if let Some(why) = self.p.expect.mismatch(head) {
            return Err(race(run, why));
        }
        let stale_after_ms = head.epoch.policy.stale_after_ms();
        let watched_ms = self.p.trigger.watched_ms();
        // mutant watch_ignored: a takeover without watching the owner stale (§7.4 step 3).
        if watched_ms > stale_after_ms || crate::mutant::mutant("watch_ignored") {
            return Ok(());
        }
        Err(LeaseError::TakeoverActiveRefused {
            run: run.to_string(),
            held: Box::new(head.held_by()),
            age_ms: self.p.now.millis_since(head.heartbeat_at()),
            stale_after_ms,
            watched_ms,
        })
    }

    /// GATE (step 5 since OQ-5: before the last look at the beat, so the look-to-commit
    /// window holds no finalization and no fsync).
    fn gate(&self, head: Box<Head>) -> TakeoverState {
        let gate = Gate::new(&self.p.run_id, Some(&head), &self.p.owner_id, self.p.now);
        TakeoverState::Gate(head, gate)
    }

    /// This operation's writer of the next epoch.
    fn writer(&self) -> Writer<'_> {
        let p = &self.p;
        Writer::new(&p.run_id, &p.owner_id, &p.holder, p.policy, p.now)
    }
}

impl Operation for Takeover {
    type Output = OwnedLease;
    fn next(&mut self, mut input: Option<Response>) -> Step<OwnedLease> {
        let run = self.p.run_id.clone();
        loop {
            match std::mem::replace(&mut self.st, TakeoverState::Done) {
                TakeoverState::Observe(obs) => {
                    let observed =
                        sub_step!(self.st, TakeoverState::Observe, [], obs, input.take());
                    if let Some((rec, hash, fin)) = self.writer().own_epoch(observed.head.as_ref())
                    {
                        match fin {
                            Some(f) => {
                                self.st = TakeoverState::Finalize(Box::new((rec, hash, None)), f);
                                continue;
                            }
                            None => return Step::Done(Ok(self.writer().lease(&rec, hash))),
                        }
                    }
                    let head = match observed.head {
                        Some(h) if h.is_active() => h,
                        Some(h) => {
                            return Step::Done(Err(race(
                                &run,
                                format!(
                                    "generation {} is {:?}: nothing to take over (claim the run instead)",
                                    h.generation(),
                                    h.epoch.state
                                ),
                            )));
                        }
                        None => {
                            return Step::Done(Err(race(
                                &run,
                                "no owner exists: nothing to take over (claim the run instead)",
                            )));
                        }
                    };
                    if let Err(e) = head.generation().next(&run) {
                        return Step::Done(Err(e));
                    }
                    // Refusals write nothing: the observation is judged before any write.
                    if let Err(e) = self.judge(&run, &head) {
                        return Step::Done(Err(e));
                    }
                    self.st = self.gate(Box::new(head));
                }
                TakeoverState::Gate(head, gate) => {
                    let (head, cutoff) =
                        sub_step!(self.st, TakeoverState::Gate, [head], gate, input.take());
                    self.st = TakeoverState::ClockBefore(head, cutoff);
                    return Step::Io(Request::Monotonic);
                }
                TakeoverState::ClockBefore(head, cutoff) => match input.take() {
                    Some(Response::Monotonic(t0)) => {
                        let g = head.generation();
                        self.st = TakeoverState::Reread(head, cutoff, t0);
                        return Step::Io(Request::Read(FileRef::Beat(g)));
                    }
                    other => return Step::Done(Err(violation("Monotonic", &other))),
                },
                TakeoverState::Reread(head, cutoff, t0) => {
                    let mut head = *head;
                    match input.take() {
                        Some(Response::Content(content)) => {
                            if let Err(e) = read_beat(&mut head, &run, content.as_deref()) {
                                return Step::Done(Err(e));
                            }
                        }
                        other => return Step::Done(Err(violation("Content", &other))),
                    }
                    // mutant takeover_skip_reread_judge: step 6's JUDGE of the re-read beat ignored (I6).
                    if let Err(e) = self.judge(&run, &head).or_else(|e| {
                        if crate::mutant::mutant("takeover_skip_reread_judge") {
                            Ok(())
                        } else {
                            Err(e)
                        }
                    }) {
                        return Step::Done(Err(e));
                    }
                    // The epoch records what was judged: the beat just re-read (equal to
                    // the expectation, which JUDGE checked), the watch and who asked.
                    let (mode, watched_ms) = match self.p.trigger {
                        TakeoverTrigger::Operator {
                            watched_unchanged_ms,
                        } => (TakeoverMode::Operator, watched_unchanged_ms),
                        TakeoverTrigger::Automatic {
                            watched_unchanged_ms,
                        } => (TakeoverMode::Automatic, watched_unchanged_ms),
                    };
                    let retired = RetiredOwner {
                        generation: head.generation(),
                        owner_id: head.epoch.owner_id.clone(),
                        reason: RetireReason::TakenOver,
                        observed: Some(Observation {
                            heartbeat_at: head.heartbeat_at(),
                            heartbeat_count: head.heartbeat_count(),
                            watched_ms: Some(watched_ms),
                            mode,
                        }),
                    };
                    let rec = step_try!(self.writer().next_epoch(
                        Some(&head),
                        EpochState::Active,
                        Some(retired),
                        None,
                        None,
                    ));
                    let bound = step_try!(bind(rec, cutoff));
                    self.st = TakeoverState::ClockAfter(
                        Box::new((head, bound.rec, bound.hash, bound.create)),
                        t0,
                    );
                    return Step::Io(Request::Monotonic);
                }
                TakeoverState::ClockAfter(b, t0) => {
                    let t1 = match input.take() {
                        Some(Response::Monotonic(t)) => t,
                        other => return Step::Done(Err(violation("Monotonic", &other))),
                    };
                    // OQ-5: the look at the beat (step 5) and the commit (step 8) must be
                    // close, or an owner that resumed meanwhile may have beaten unseen.
                    let (head, rec, hash, create) = *b;
                    let took_ms = t1.saturating_sub(t0) / 1_000_000;
                    let budget_ms = head.epoch.policy.heartbeat_ms() / 2;
                    // mutant takeover_clock_bound_skipped: a stalled look is committed (§7.4 step 7, OQ-5).
                    if took_ms > budget_ms && !crate::mutant::mutant("takeover_clock_bound_skipped")
                    {
                        return Step::Done(Err(race(
                            &run,
                            format!(
                                "{took_ms} ms passed between this takeover's last read of the owner's heartbeat and its commit, more than half the owner's heartbeat interval ({budget_ms} ms): the owner may have beaten meanwhile; observe again"
                            ),
                        )));
                    }
                    self.st = TakeoverState::Create(Box::new((head, rec, hash)));
                    return Step::Io(create);
                }
                TakeoverState::Create(b) => {
                    let g = b.1.generation;
                    if let Err(e) = created(&run, g, input.take()) {
                        return Step::Done(Err(e));
                    }
                    self.st = TakeoverState::Recheck(b, Recheck::new(g));
                }
                TakeoverState::Recheck(b, rc) => {
                    let (b, higher) =
                        sub_step!(self.st, TakeoverState::Recheck, [b], rc, input.take());
                    let (head, rec, hash) = *b;
                    let by = &self.p.owner_id;
                    let f = step_try!(finalize_superseded(
                        &run,
                        higher,
                        &head,
                        rec.generation,
                        by,
                        self.p.now,
                    ));
                    self.st = TakeoverState::Finalize(Box::new((rec, hash, Some(head))), f);
                }
                TakeoverState::Finalize(b, f) => {
                    let (b, _) = sub_step!(self.st, TakeoverState::Finalize, [b], f, input.take());
                    let (rec, hash, head) = *b;
                    match head {
                        // Step 11: read the replaced owner's beat once more.
                        Some(head) => {
                            let g = head.generation();
                            self.st = TakeoverState::Preempt(Box::new((rec, hash, head)));
                            return Step::Io(Request::Read(FileRef::Beat(g)));
                        }
                        None => return Step::Done(Ok(self.writer().lease(&rec, hash))),
                    }
                }
                TakeoverState::Preempt(b) => {
                    let (rec, hash, judged) = *b;
                    let mut now = judged.clone();
                    // Unreadable now (a zombie's torn write?) counts as changed: the
                    // report errs on the side of waiting.
                    let changed = match input.take() {
                        Some(Response::Content(None)) => judged.beat.is_some(),
                        Some(Response::Content(Some(bytes))) => {
                            match read_beat(&mut now, &run, Some(&bytes)) {
                                Ok(()) => {
                                    crate::watch::watch_key(&now)
                                        != crate::watch::watch_key(&judged)
                                }
                                Err(_) => true,
                            }
                        }
                        other => return Step::Done(Err(violation("Content", &other))),
                    };
                    if changed {
                        self.preempted = Some(Preempted {
                            generation: judged.generation(),
                            owner_id: judged.epoch.owner_id.clone(),
                            self_fence_after_ms: judged.epoch.policy.self_fence_after_ms(),
                        });
                    }
                    return Step::Done(Ok(self.writer().lease(&rec, hash)));
                }
                TakeoverState::Done => {
                    return Step::Done(Err(violation("nothing (operation finished)", &input)));
                }
            }
        }
    }
}
