//! # The ghost model of runlease's model-based checkers (feature `ghost`)
//!
//! Three checkers drive the real step machines of [`crate::ops`] through random or
//! exhaustive interleavings of 2-3 actors: the proptest (`lease-core/tests/model.rs`, over
//! [`crate::mem::MemDisk`]), the breadth-first model checker and its random walks
//! (`lease-fs/tests/model_check/`, `cargo xtask model`, over lease-fs's simulated file
//! system) and the `transitions` fuzz target (`fuzz/src/transitions.rs`). They share this
//! one *ghost*: what each actor was told (grants, acknowledged and refused appends), what
//! was true when each operation started, which records were hand-corrupted, and the checks
//! of the invariants of `docs/PROTOCOL.md` §8 against it.
//!
//! The ghost is pure, like the rest of this crate: it performs no I/O and reads no clock.
//! The checker owns the disk, the actors and the schedule; it tells the ghost what happened
//! at fixed points ([`Ghost::begin`], [`Ghost::on_request`], [`Ghost::on_response`],
//! [`Ghost::on_linked`], [`Ghost::finish`], [`Ghost::corrupt`]) and asks it to check what
//! it read back ([`Ghost::observe_head`], [`Ghost::check_no_new_epoch`],
//! [`Ghost::check_granted_epochs`], [`Ghost::check_log`], ...). A check answers
//! `Err(description)` on a violation; the checker decides how to report it (a panic, or
//! the shortest trace).
//!
//! | invariant (§8) | check |
//! |---|---|
//! | I1 one owner per generation | [`Ghost::finish`]: a generation is granted to one actor, above every grant completed before the operation started, increasing per actor |
//! | I2 generations never decrease | [`Ghost::observe_head`]; [`Ghost::check_granted_epochs`] (a granted epoch survives power loss) |
//! | I4 nothing past a cutoff counts | [`Ghost::check_within_cutoffs`] (no event linked after its generation's cutoff was linked counts: the ghost's record of the order of links, not the cutoff's value); [`within_cutoffs`] (a reader's answer against its own cutoffs, blind to a cutoff written wrong); [`Ghost::check_decisions`] (every cutoff and checkpoint on disk against what each writer was told, so a cutoff decided a second time over a rolled-back chain is seen) |
//! | I5 acknowledged appends count | [`Ghost::check_acknowledged`] |
//! | I6 takeover only over the observed owner | [`check_takeover_retired`] (owner, generation, and the beat time and count the new epoch records as judged, against the taker's expectation [`OpGhost::observed`]), [`Ghost::check_epoch_created`] |
//! | I7 an invalid record blocks ownership changes | [`Ghost::finish`], [`Ghost::check_no_new_epoch`] |
//! | I8 a superseded heartbeat or release never succeeds | [`Ghost::finish`] (with [`OpGhost::head_at_start`]); [`Ghost::check_epoch_created`] (a release supersedes only its own generation) |
//! | I9 an append's answer is its event's authority | [`Ghost::check_refused`]; [`Ghost::check_late`] (an event linked after a newer grant never counts) |
//! | I10 every prefix is a valid state | [`status_valid`] |
//! | I11 a cutoff never outlives its successor | [`cutoffs_have_successors`] |
//! | I12 judgements are stable | [`stable_judgements`] (a concurrent reader against an atomic one); [`Ghost::check_read`] |
//! | I13 the counted history is generation-monotone | [`generation_monotone`] |
//!
//! Who checks what. Since issue #30 the three checkers drive their actors with one driver,
//! [`driver`]: the proptest and the fuzzer share its whole world ([`driver::MemWorld`], over
//! [`crate::mem::MemDisk`], one request at a time, a create's link and its directory fsync
//! as two steps), the model checker its actors, operations and ends (one system call at a
//! time over lease-fs's simulated file system). So they check the same things, at their
//! own granularity:
//!
//! | check | proptest and fuzzer ([`driver::MemWorld`]) | model checker |
//! |---|---|---|
//! | [`Ghost::finish`] (grants, I7 on success, superseded heartbeat or release, acknowledged = created, `PROTOCOL_VIOLATION`), no damage reported on a sound run | after each operation ([`driver::end`]) | after each operation ([`driver::end`]) |
//! | [`Ghost::observe_head`], [`Ghost::check_no_new_epoch`], [`Ghost::check_durable_beats`] | every step | every state |
//! | [`Ghost::on_linked`] / [`Ghost::check_late`], [`Ghost::on_cutoff_linked`] / [`Ghost::check_within_cutoffs`] | at each link | at each link |
//! | [`Ghost::check_log`] (acknowledged, refused, late, [`generation_monotone`], cutoffs by links, [`within_cutoffs`]) | at the end, and the streaming read agrees | every state |
//! | [`Ghost::check_decisions`], [`Ghost::check_granted_epochs`], [`cutoffs_have_successors`], `verify`, [`status_valid`] | after each power loss and at the end | every state |
//! | [`check_takeover_retired`] | each takeover | each takeover, with the model's OQ-5 look-to-commit check |
//! | [`Ghost::check_epoch_created`] | as each epoch is linked | no (its own [`check_takeover_retired`] and the model's OQ-5 check) |
//! | [`Ghost::check_read`], [`stable_judgements`] | as a reader ([`OpKind::Read`]) finishes ([`driver::check_reader`]) | the same |
//!
//! While a record is hand-corrupted the checkers check only [`Ghost::check_no_new_epoch`],
//! what each decision on disk says ([`Ghost::check_decisions`]) and what each operation was
//! told; an unreadable log is accepted then. After `lease/` was rolled back to an older copy ([`Ghost::rollback`],
//! the model checker's rollback fault, issue #28) the run is damaged from outside: the
//! model checker then checks [`Ghost::finish`] (no generation granted twice, I1) and
//! [`Ghost::check_decisions`] (I4/I9 against what each writer was told), not the reader's
//! view of the log, `verify`, the head's watermark or the granted epochs, which the
//! rollback itself breaks.

pub mod driver;

use std::collections::{BTreeMap, BTreeSet};

use crate::ops::{
    AuthorityLease, EventLogView, Expectation, LivenessEvidence, LockEvidence, ProcessState,
    Request, Response, Status,
};
use crate::{EpochRecord, FileRef, Generation, Holder, Identity, LeaseError};

/// What a violated invariant is reported as.
pub type Violation = String;

/// The kind of an actor's operation.
///
/// The order is the model checker's exploration order of operations to start: keep it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// [`crate::ops::Claim`].
    Claim,
    /// [`crate::ops::Heartbeat`].
    Heartbeat,
    /// [`crate::ops::Append`].
    Append,
    /// [`crate::ops::Takeover`].
    Takeover,
    /// [`crate::ops::Retire`].
    Retire,
    /// [`crate::ops::Release`].
    Release,
    /// [`crate::ops::Prune`].
    Prune,
    /// [`crate::ops::ReadEvents`], finalizing: a reader of the log (its answer is checked
    /// with [`Ghost::check_read`] and [`stable_judgements`]).
    Read,
}

/// Ghost data about one operation in flight.
#[derive(Clone, Debug)]
pub struct OpGhost {
    /// What the operation is.
    pub kind: OpKind,
    /// The head generation when the operation started, if the checker noted it
    /// ([`OpGhost::note_head`]): a heartbeat or release that started after its owner was
    /// superseded must not succeed (I8).
    pub head_at_start: Option<u64>,
    /// The highest generation granted to anyone when the operation started.
    pub granted_max_at_start: u64,
    /// The event sequence this append created, if any.
    pub created_event: Option<u64>,
    /// What a takeover observed (and must take over exactly).
    pub observed: Option<Expectation>,
}

impl OpGhost {
    /// Note the head generation as the operation starts (`None`: no epoch yet).
    pub fn note_head(&mut self, head: Option<u64>) {
        self.head_at_start = head;
    }
}

/// How an operation ended, as the ghost needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Told {
    /// A claim or takeover returned a lease of this generation.
    Granted(Generation),
    /// An append acknowledged this event sequence.
    Appended(u64),
    /// Any other success.
    Done,
}

/// What the actors were told, and what must therefore hold.
#[derive(Clone, Debug, Default)]
pub struct Ghost {
    /// Sequences whose append returned success: they must count (I5).
    pub acked: BTreeSet<u64>,
    /// Sequences created by an append that then answered `FENCED`: they must not count (I9).
    pub refused: BTreeSet<u64>,
    /// Events linked by a writer whose generation was below one already granted (returned)
    /// to someone: they must not count (only tracked through [`Ghost::on_linked`]).
    pub late: BTreeSet<u64>,
    /// Generation -> the actor it was granted to (the checker's label).
    pub granted: BTreeMap<u64, String>,
    /// Highest generation ever granted.
    pub max_granted: u64,
    /// Highest head generation observed (since the last power loss).
    pub max_head: u64,
    /// Hand-corrupted records still on disk: while any is, no ownership change may succeed
    /// and no epoch may appear (I7).
    pub corrupted: BTreeSet<FileRef>,
    /// The number of epochs when the last record was corrupted.
    pub epochs_at_corruption: usize,
    /// The head (as last observed) when the last record was corrupted.
    pub head_at_corruption: u64,
    /// A record was ever corrupted by hand (even if no longer invalid: an operation that
    /// read it before the owner's next beat or release repaired it may still answer that
    /// the run is damaged).
    pub ever_corrupted: bool,
    /// The generation that wrote each event in `acked`, `refused` and `late` (sequence ->
    /// generation), for [`Ghost::check_decisions`].
    pub writer: BTreeMap<u64, u64>,
    /// `lease/` was restored from an older copy ([`Ghost::rollback`]).
    pub rolled_back: bool,
    /// Every event the ghost saw linked (only tracked through [`Ghost::on_linked`]):
    /// sequence -> (its writer's generation, the link's place in [`Ghost::links`]).
    pub linked: BTreeMap<u64, (u64, u64)>,
    /// Every cutoff the ghost saw linked (only tracked through [`Ghost::on_cutoff_linked`]):
    /// generation -> the link's place in [`Ghost::links`] (the latest, if a power loss
    /// dropped an earlier one).
    pub cutoff_linked: BTreeMap<u64, u64>,
    /// The number of links the ghost saw: the order of [`Ghost::linked`] and
    /// [`Ghost::cutoff_linked`].
    pub links: u64,
    /// Generation -> the count of its newest heartbeat acknowledged as durable
    /// ([`Ghost::on_durable_beat`]): a power loss never takes it back (PROTOCOL §5.3).
    pub durable_beats: BTreeMap<u64, u64>,
}

impl Ghost {
    /// A new, empty ghost.
    pub fn new() -> Ghost {
        Ghost::default()
    }

    /// The ghost of an operation of `kind` starting now (`observed`: what a takeover saw).
    pub fn begin(&self, kind: OpKind, observed: Option<Expectation>) -> OpGhost {
        OpGhost {
            kind,
            head_at_start: None,
            granted_max_at_start: self.max_granted,
            created_event: None,
            observed,
        }
    }

    /// The checker restored `lease/` from an older copy (issue #28): the run is damaged
    /// from outside from now on.
    pub fn rollback(&mut self) {
        self.rolled_back = true;
    }

    /// Whether a hand-corrupted record is still on disk.
    pub fn is_corrupted(&self) -> bool {
        !self.corrupted.is_empty()
    }

    /// The checker hand-corrupted `target` (between operations); `epochs`: the number of
    /// epochs on disk.
    pub fn corrupt(&mut self, target: FileRef, epochs: usize) {
        if let FileRef::Beat(g) = target {
            // Its beats are gone by hand, not by a power loss.
            self.durable_beats.remove(&g.get());
        }
        self.corrupted.insert(target);
        self.ever_corrupted = true;
        self.epochs_at_corruption = epochs;
        self.head_at_corruption = self.max_head;
    }

    /// Operation `op` is about to perform `req`.
    pub fn on_request(&mut self, op: &mut OpGhost, req: &Request) {
        if let (OpKind::Append, Request::CreateExclusive(FileRef::Event(s), _)) = (op.kind, req) {
            op.created_event = Some(s.get());
        }
        if let (OpKind::Release, Request::CreateExclusive(FileRef::Epoch(_), _)) = (op.kind, req) {
            // An owner may release despite a corrupted heartbeat record of its own (the
            // release does not read it); the released generation's heartbeat is never
            // read again.
            self.corrupted.retain(|f| !matches!(f, FileRef::Beat(_)));
        }
        if let Request::Remove(FileRef::Beat(g), _) = req {
            // A released or pruned heartbeat file: its beats are no longer facts on disk.
            self.durable_beats.remove(&g.get());
        }
        if let Request::WriteBeat { file, .. } = req {
            // The live owner's next heartbeat makes its own (hand-corrupted) heartbeat file
            // valid again: beat 1 replaces it whole, a later beat writes a valid slot, and
            // the hand corruption (bytes that are not a valid slot, or a short record in
            // the older form, which a slot written past it turns into a torn first slot)
            // is ignored by readers from then on (`beat::read_slots`).
            self.corrupted.remove(file);
        }
    }

    /// Operation `op`'s request (an event creation iff `event_create`) was answered `resp`.
    pub fn on_response(&mut self, op: &mut OpGhost, event_create: bool, resp: &Response) {
        if let (OpKind::Append, Response::AlreadyExists, true) = (op.kind, resp, event_create) {
            op.created_event = None;
        }
    }

    /// Operation `op`, of an actor holding generation `mine` (0: none), was answered
    /// `resp`: an event it linked while a higher generation had already been granted is
    /// fenced and must never count.
    ///
    /// Every link is also recorded, in order, in [`Ghost::linked`]: the facts
    /// [`Ghost::check_within_cutoffs`] judges a reader by.
    pub fn on_linked(&mut self, op: &OpGhost, resp: &Response, mine: u64) {
        if let (OpKind::Append, Response::Created, Some(s)) = (op.kind, resp, op.created_event) {
            self.links += 1;
            self.linked.insert(s, (mine, self.links));
            if mine < self.max_granted {
                self.late.insert(s);
                self.writer.insert(s, mine);
            }
        }
    }

    /// Heartbeat `count` of generation `g` was acknowledged and was written durably
    /// (`Durability::Fsync`): from now on the heartbeat file holds it or a newer beat,
    /// whatever a power loss or a torn write does (PROTOCOL §5.3 `durable`).
    pub fn on_durable_beat(&mut self, g: u64, count: u64) {
        let c = self.durable_beats.entry(g).or_default();
        *c = (*c).max(count);
    }

    /// Every heartbeat acknowledged as durable is still on disk ([`Ghost::on_durable_beat`]):
    /// `read(g)` is generation `g`'s heartbeat file now, and its newest valid slot must
    /// hold that beat or a newer one. A hand-corrupted heartbeat file is not judged.
    pub fn check_durable_beats(
        &self,
        read: impl Fn(u64) -> Option<Vec<u8>>,
    ) -> Result<(), Violation> {
        for (&g, &n) in &self.durable_beats {
            let beat = Generation::new(g).map(FileRef::Beat);
            if beat.is_some_and(|f| self.corrupted.contains(&f)) {
                continue;
            }
            let bytes = read(g);
            let count = bytes
                .as_deref()
                .and_then(crate::beat::newest_record)
                .and_then(|r| crate::decode::<crate::HeartbeatRecord>(r).ok())
                .map(|r| r.count);
            if count.is_none_or(|c| c < n) {
                return Err(format!(
                    "heartbeat {n} of generation {g} was acknowledged as durable, but the heartbeat file now holds {} (PROTOCOL §5.3)",
                    match (count, bytes) {
                        (Some(c), _) => format!("beat {c}"),
                        (None, Some(_)) => "no valid beat".into(),
                        (None, None) => "nothing (it is gone)".into(),
                    }
                ));
            }
        }
        Ok(())
    }

    /// The cutoff of generation `g` became visible on disk (its link): no event of `g`
    /// linked after this may ever count (I4).
    pub fn on_cutoff_linked(&mut self, g: u64) {
        self.links += 1;
        self.cutoff_linked.insert(g, self.links);
    }

    /// A power loss: forget the links it undid (`cutoff_survived(g)`: generation `g`'s
    /// cutoff is still on disk; `event_survived(s)`: event `s` is), and the late events
    /// among them. A cutoff linked but
    /// never made durable may be decided again, through later events, and that is sound.
    pub fn power_loss(
        &mut self,
        cutoff_survived: impl Fn(u64) -> bool,
        event_survived: impl Fn(u64) -> bool,
    ) {
        self.cutoff_linked.retain(|&g, _| cutoff_survived(g));
        self.linked.retain(|&s, _| event_survived(s));
        // A late event whose link was undone is gone: its sequence may be written again,
        // by a writer that is not late. (Acknowledged and refused events were created
        // durably before their answer; they survive.)
        let lost: Vec<u64> = self
            .late
            .iter()
            .copied()
            .filter(|&s| !event_survived(s))
            .collect();
        for s in lost {
            self.late.remove(&s);
            if !self.acked.contains(&s) && !self.refused.contains(&s) {
                self.writer.remove(&s);
            }
        }
    }

    /// No event counts that its writer linked after its generation's cutoff was linked
    /// (I4), judged from the ghost's own record of the order of links
    /// ([`Ghost::on_linked`], [`Ghost::on_cutoff_linked`]), never from the cutoff values a
    /// reader used: a cutoff decided too high (one past the log's end) lets a zombie's
    /// later event count by the reader's rule, and this still sees it. Checks nothing for a
    /// checker that does not report links.
    pub fn check_within_cutoffs(&self, view: &EventLogView) -> Result<(), Violation> {
        for e in view.events.iter().filter(|e| e.standing.counts()) {
            let (s, g) = (e.event.sequence.get(), e.event.generation.get());
            if !view.chain.cutoffs.contains_key(&e.event.generation) {
                continue;
            }
            if let (Some(&(w, at)), Some(&cut)) = (self.linked.get(&s), self.cutoff_linked.get(&g))
                && w == g
                && at > cut
            {
                return Err(format!(
                    "event {s} of generation {g} counts, but it was linked after generation {g}'s cutoff was (I4)"
                ));
            }
        }
        Ok(())
    }

    /// Operation `op` of the actor labelled `actor`, holding generation `mine` (0: none),
    /// ended with `told`: check what it was told and record it.
    pub fn finish(
        &mut self,
        op: &OpGhost,
        actor: &str,
        mine: u64,
        told: Result<Told, &LeaseError>,
    ) -> Result<(), Violation> {
        if let Err(e) = told
            && e.code() == "PROTOCOL_VIOLATION"
        {
            return Err(format!("{e}"));
        }
        match (op.kind, told) {
            (OpKind::Claim | OpKind::Takeover, Ok(Told::Granted(g))) => {
                let g = g.get();
                if self.is_corrupted() {
                    return Err("an ownership change succeeded over an invalid record".into());
                }
                // Every grant is above every grant completed before this operation started
                // (grants that overlap in time may complete in either order: the later one
                // learns it is fenced at its next heartbeat).
                if g <= op.granted_max_at_start {
                    return Err(format!(
                        "granted generation {g} although {} was granted before the operation started",
                        op.granted_max_at_start
                    ));
                }
                if let Some(other) = self.granted.get(&g)
                    && other != actor
                {
                    return Err(format!("generation {g} granted to {other} and to {actor}"));
                }
                if let Some(last) = self
                    .granted
                    .iter()
                    .filter(|(_, who)| *who == actor)
                    .map(|(g, _)| *g)
                    .next_back()
                    && g <= last
                {
                    return Err(format!("{actor} was granted {g} after {last}"));
                }
                self.granted.insert(g, actor.to_string());
                self.max_granted = self.max_granted.max(g);
            }
            (OpKind::Retire, Ok(_)) if self.is_corrupted() => {
                return Err("a retirement succeeded over an invalid record".into());
            }
            (OpKind::Heartbeat | OpKind::Release, Ok(_)) => {
                if let Some(h) = op.head_at_start
                    && h > mine
                {
                    return Err(format!(
                        "a superseded owner's {} succeeded (generation {mine}, head {h} when it started)",
                        if op.kind == OpKind::Heartbeat {
                            "heartbeat"
                        } else {
                            "release"
                        }
                    ));
                }
            }
            (OpKind::Append, Ok(Told::Appended(s))) => {
                if op.created_event != Some(s) {
                    return Err(format!(
                        "acknowledged event {s} but created {:?}",
                        op.created_event
                    ));
                }
                self.acked.insert(s);
                self.writer.insert(s, mine);
            }
            (OpKind::Append, Err(e)) if e.code() == "FENCED" => {
                if let Some(s) = op.created_event {
                    self.refused.insert(s);
                    self.writer.insert(s, mine);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The head generation is now `head` (`None`: not observed, or no epoch): it never
    /// goes down (I2), except that a power loss may drop epochs whose creation was never
    /// acknowledged (`after_power_loss` restarts the watermark).
    pub fn observe_head(
        &mut self,
        head: Option<u64>,
        after_power_loss: bool,
    ) -> Result<(), Violation> {
        let Some(h) = head else { return Ok(()) };
        if after_power_loss {
            self.max_head = h;
        } else if h < self.max_head {
            return Err(format!("head went down from {} to {h}", self.max_head));
        }
        self.max_head = self.max_head.max(h);
        Ok(())
    }

    /// While a record is invalid, no epoch appears (I7): `epochs` is the number on disk,
    /// never more than when the record was corrupted, and the head (as last observed,
    /// [`Ghost::observe_head`]) never above the head then. Fewer is fine: a prune may
    /// remove epochs below its floor while a heartbeat record it does not read is invalid.
    pub fn check_no_new_epoch(&self, epochs: usize) -> Result<(), Violation> {
        if self.is_corrupted()
            && (epochs > self.epochs_at_corruption || self.max_head > self.head_at_corruption)
        {
            return Err("a new epoch appeared after an invalid record".into());
        }
        Ok(())
    }

    /// Granted generations survive any crash (their creation was durable before the lease
    /// was returned), unless compacted below the checkpoint floor `floor`.
    pub fn check_granted_epochs(
        &self,
        floor: u64,
        epoch_exists: impl Fn(Generation) -> bool,
    ) -> Result<(), Violation> {
        for &g in self.granted.keys() {
            if g >= floor && !Generation::new(g).is_some_and(&epoch_exists) {
                return Err(format!("granted generation {g} lost its epoch"));
            }
        }
        Ok(())
    }

    /// Every acknowledged append counts (I5).
    pub fn check_acknowledged(&self, counted: &BTreeSet<u64>) -> Result<(), Violation> {
        match self.acked.iter().find(|s| !counted.contains(s)) {
            Some(s) => Err(format!("acknowledged event {s} does not count")),
            None => Ok(()),
        }
    }

    /// No event whose append answered `FENCED` counts (I9).
    pub fn check_refused(&self, counted: &BTreeSet<u64>) -> Result<(), Violation> {
        match self.refused.iter().find(|s| counted.contains(s)) {
            Some(s) => Err(format!("event {s} whose append answered FENCED counts")),
            None => Ok(()),
        }
    }

    /// No event linked after its writer's generation was superseded by a granted one
    /// counts.
    pub fn check_late(&self, counted: &BTreeSet<u64>) -> Result<(), Violation> {
        match self.late.iter().find(|s| counted.contains(s)) {
            Some(s) => Err(format!(
                "event {s} counts although its writer's generation had been superseded by a granted one when it was written"
            )),
            None => Ok(()),
        }
    }

    /// I4 and I9 against what each writer was told, not against the cutoffs a reader
    /// used: every cutoff on disk, `(g, events_through)` in `cutoffs`, leaves out each
    /// event of generation `g` whose append answered `FENCED` or that was linked late,
    /// and counts each acknowledged one; every checkpoint on disk, `(floor, through,
    /// not_authoritative)` in `checkpoints`, lists as not authoritative exactly those of
    /// them written by a generation below its floor, up to `through`. A cutoff or
    /// checkpoint is immutable once created, so a wrong one makes the event's standing
    /// wrong for good: a retirement or takeover that issued a generation a second time over
    /// a rolled-back `lease/` and decided the cutoff again, through an event that had been
    /// refused (issue #28), is reported here as the cutoff is created, whatever a reader
    /// then makes of the damaged chain.
    pub fn check_decisions<'a>(
        &self,
        cutoffs: impl IntoIterator<Item = (u64, u64)>,
        checkpoints: impl IntoIterator<Item = (u64, u64, &'a [u64])>,
    ) -> Result<(), Violation> {
        let told_no = |s: &u64| self.refused.contains(s) || self.late.contains(s);
        let why_not = |s: u64| {
            if self.refused.contains(&s) {
                "was refused: its append answered FENCED"
            } else {
                "was linked after a newer generation had been granted: it must never count"
            }
        };
        for (g, through) in cutoffs {
            for (&s, _) in self.writer.iter().filter(|(_, w)| **w == g) {
                if told_no(&s) && s <= through {
                    return Err(format!(
                        "cutoff {g} counts events through {through}, but event {s} of generation {g} {} (I4, I9)",
                        why_not(s)
                    ));
                }
                if self.acked.contains(&s) && s > through {
                    return Err(format!(
                        "cutoff {g} counts events through {through}, but event {s} of generation {g} was acknowledged (I5, I9)"
                    ));
                }
            }
        }
        for (floor, through, not_authoritative) in checkpoints {
            for (&s, _) in self
                .writer
                .iter()
                .filter(|(s, w)| **w < floor && **s <= through)
            {
                let listed = not_authoritative.contains(&s);
                if told_no(&s) && !listed {
                    return Err(format!(
                        "checkpoint {floor} counts event {s}, which {} (I4, I9)",
                        why_not(s)
                    ));
                }
                if self.acked.contains(&s) && listed {
                    return Err(format!(
                        "checkpoint {floor} does not count event {s}, which was acknowledged (I5)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every check of an authoritative read of the log: [`Ghost::check_acknowledged`],
    /// [`Ghost::check_refused`], [`Ghost::check_late`], [`generation_monotone`] and
    /// [`within_cutoffs`], in that order.
    pub fn check_log(&self, view: &EventLogView) -> Result<(), Violation> {
        let counted = counted(view);
        self.check_acknowledged(&counted)?;
        self.check_refused(&counted)?;
        self.check_late(&counted)?;
        generation_monotone(view)?;
        self.check_within_cutoffs(view)?;
        within_cutoffs(view)
    }

    /// Every check of [`Ghost::check_log`] that applies to a reader that read the log
    /// `1..=last` (`view.last`) at some moment, checked when its answer comes: the
    /// acknowledged appends it read count (I5), and no event whose append answered
    /// `FENCED` (I9) or that was linked late counts, the counted events are
    /// generation-monotone (I13) and within their cutoffs (I4). Appends acknowledged with
    /// a sequence past `last` are not the reader's: they were linked after it counted the
    /// log (log first, R3).
    pub fn check_read(&self, view: &EventLogView) -> Result<(), Violation> {
        let last = view.last.as_ref().map_or(0, |(s, _)| s.get());
        let counted = counted(view);
        if let Some(s) = self.acked.range(..=last).find(|s| !counted.contains(s)) {
            return Err(format!(
                "a reader judged acknowledged event {s} as not counting: {:?}",
                standing_of(view, *s)
            ));
        }
        self.check_refused(&counted)?;
        self.check_late(&counted)?;
        generation_monotone(view)?;
        self.check_within_cutoffs(view)?;
        within_cutoffs(view)
    }

    /// Check an epoch `g` that operation `op` just created (as its creation is answered):
    /// `prev` is the valid epoch below it (if any), `alive` says whether a holder is alive,
    /// `mine` is the generation the actor holds. A takeover commits only over exactly the
    /// owner it observed (I6), a retirement only over a dead holder, a release supersedes
    /// only its own generation (I8).
    pub fn check_epoch_created(
        &self,
        op: &OpGhost,
        g: Generation,
        prev: Option<(Generation, &EpochRecord)>,
        alive: impl Fn(&Holder) -> bool,
        mine: Option<Generation>,
    ) -> Result<(), Violation> {
        match op.kind {
            OpKind::Takeover => {
                let Some((p, e)) = prev else {
                    return Err(format!(
                        "takeover created epoch {g} with no valid epoch below"
                    ));
                };
                let Some(expect) = &op.observed else {
                    return Err(format!("takeover created epoch {g} without an observation"));
                };
                if expect.generation.is_some_and(|x| x != p) || e.owner_id != expect.owner_id {
                    return Err(format!(
                        "takeover created epoch {g} over generation {p} owner {}, but observed generation {:?} owner {}",
                        e.owner_id, expect.generation, expect.owner_id
                    ));
                }
            }
            OpKind::Retire => {
                let Some((p, e)) = prev else {
                    return Err(format!(
                        "retirement created epoch {g} with no valid epoch below"
                    ));
                };
                if alive(&e.holder) {
                    return Err(format!(
                        "retirement created epoch {g} over generation {p} whose holder pid {} is alive",
                        e.holder.pid
                    ));
                }
            }
            OpKind::Release if g.prev() != mine => {
                return Err(format!("release (generation {mine:?}) created epoch {g}"));
            }
            _ => {}
        }
        Ok(())
    }
}

/// The liveness evidence of the checkers' simulated world, seen from `observer_boot_id`:
/// a holder whose process is `up` runs with its recorded start time and holds the owner
/// lock; otherwise its process is gone and the lock is free.
pub fn simulated_evidence(observer_boot_id: Identity, h: &Holder, up: bool) -> LivenessEvidence {
    LivenessEvidence {
        observer_boot_id,
        process: if up {
            ProcessState::Running {
                start_time: h.start_time,
            }
        } else {
            ProcessState::Gone
        },
        owner_lock: if up {
            LockEvidence::Held
        } else {
            LockEvidence::Free
        },
        lease: AuthorityLease::NotKept,
    }
}

/// The sequences of the events that count in `view`.
pub fn counted(view: &EventLogView) -> BTreeSet<u64> {
    view.events
        .iter()
        .filter(|e| e.standing.counts())
        .map(|e| e.event.sequence.get())
        .collect()
}

/// The standing `view` gave event `s`, if it judged it.
fn standing_of(view: &EventLogView, s: u64) -> Option<&crate::ops::Standing> {
    view.events
        .iter()
        .find(|e| e.event.sequence.get() == s)
        .map(|e| &e.standing)
}

/// Judgements are stable (I12): every event a reader judged (`read`, the answer of a
/// reader that ran concurrently with other operations) has the same verdict, counts or
/// does not count, as in `now`, the answer of an atomic finalizing reader run on the state
/// the reader finished in. A reader must never say "does not count" of an event the run
/// counts, nor the other way round (OQ-15: a reader racing a prune).
pub fn stable_judgements(read: &EventLogView, now: &EventLogView) -> Result<(), Violation> {
    for e in &read.events {
        let s = e.event.sequence.get();
        let Some(then) = standing_of(now, s) else {
            return Err(format!(
                "a reader judged event {s}, which is no longer in the log"
            ));
        };
        if e.standing.counts() != then.counts() {
            return Err(format!(
                "a reader judged event {s} (generation {}) {:?}, but the run judges it {then:?} (judgements must be stable, I12)",
                e.event.generation, e.standing
            ));
        }
    }
    Ok(())
}

/// The authoritative history is generation-monotone (I13): once an event of generation
/// `g` counts, no later event of an older generation counts (a zombie writing after its
/// successors).
pub fn generation_monotone(view: &EventLogView) -> Result<(), Violation> {
    let mut max_gen = 0;
    for e in view.events.iter().filter(|e| e.standing.counts()) {
        let g = e.event.generation.get();
        if g < max_gen {
            return Err(format!(
                "event {} of generation {g} counts after an event of generation {max_gen}",
                e.event.sequence
            ));
        }
        max_gen = g;
    }
    Ok(())
}

/// No event of a superseded generation past its cutoff counts (I4), by the reader's own
/// cutoffs (`view.chain.cutoffs`): a consistency check of the reader's answer with itself,
/// blind to a cutoff written wrong; [`Ghost::check_within_cutoffs`] judges from the
/// ghost's facts.
pub fn within_cutoffs(view: &EventLogView) -> Result<(), Violation> {
    for e in &view.events {
        if let Some(&c) = view.chain.cutoffs.get(&e.event.generation)
            && e.standing.counts()
            && e.event.sequence.get() > c
        {
            return Err(format!(
                "event {} of generation {} counts past its cutoff {c}",
                e.event.sequence, e.event.generation
            ));
        }
    }
    Ok(())
}

/// A cutoff never outlives its successor (I11, PROTOCOL §7.0 SYNC): every cutoff on disk,
/// even right after a power loss, has a higher epoch (`head`) or a checkpoint floor above
/// it.
pub fn cutoffs_have_successors(
    cutoffs: impl IntoIterator<Item = Generation>,
    head: u64,
    floor: u64,
) -> Result<(), Violation> {
    for g in cutoffs {
        if g.get() >= head && g.get() >= floor {
            return Err(format!(
                "cutoff {g} outlived its successor (head epoch {head})"
            ));
        }
    }
    Ok(())
}

/// Without outside interference the run never becomes invalid (I10).
pub fn status_valid(status: &Status) -> Result<(), Violation> {
    match status {
        Status::Invalid(e) => Err(format!(
            "the run became invalid without outside interference: {e}"
        )),
        _ => Ok(()),
    }
}

/// A takeover that returned generation `new`'s lease retired exactly the owner it
/// observed, at exactly the beat it observed (I6): `record` is epoch `new` as read back.
///
/// Judged against the ghost's own record of the takeover ([`OpGhost::observed`], the
/// expectation the taker was started with), never against the takeover's judgement: the
/// retired owner's generation and id, and the beat time and count its epoch records as
/// judged (`retired.observed`), must all equal what the taker expected. An owner whose
/// beat landed after the taker's look and that the takeover replaced anyway (a takeover
/// that skipped its re-read's judgement, §7.4 step 6) leaves a beat in the new epoch the
/// taker never expected.
pub fn check_takeover_retired(op: &OpGhost, record: Option<&EpochRecord>) -> Result<(), Violation> {
    let Some(exp) = &op.observed else {
        return Err("a takeover without an observation".into());
    };
    let Some(r) = record.and_then(|r| r.retired.as_ref()) else {
        return Err(format!(
            "a takeover's epoch retired no owner (expected {exp:?}, epoch {record:?})"
        ));
    };
    if r.owner_id != exp.owner_id || Some(r.generation) != exp.generation {
        return Err(format!(
            "took over an owner other than the one observed ({exp:?} vs {record:?})"
        ));
    }
    let Some(seen) = &r.observed else {
        return Err(format!(
            "a takeover's epoch records no observation of generation {} (I6)",
            r.generation
        ));
    };
    if seen.heartbeat_at != exp.heartbeat_at
        || exp
            .heartbeat_count
            .is_some_and(|c| c != seen.heartbeat_count)
    {
        return Err(format!(
            "took over generation {} at beat #{} ({}), but the taker expected beat {:?} ({}): the owner beat after the taker's look and was replaced anyway (I6)",
            r.generation,
            seen.heartbeat_count,
            seen.heartbeat_at,
            exp.heartbeat_count,
            exp.heartbeat_at
        ));
    }
    Ok(())
}

/// The watch a taker of the checkers' simulated world reports: the world has one clock, and
/// a watcher that began watching when the expected heartbeat was written has watched it
/// unchanged for its wall age (0 if dated later). Simulation only: a real taker measures
/// the watch on its own monotonic clock (`lease_core::watch`), never from a wall age.
pub fn simulated_watch(expect: &crate::ops::Expectation, now: crate::Timestamp) -> u64 {
    u64::try_from(now.millis_since(expect.heartbeat_at)).unwrap_or(0)
}
