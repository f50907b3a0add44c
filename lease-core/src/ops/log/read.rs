//! Reading the log (PROTOCOL §7.9): the log first, then the chain, every link checked,
//! each event judged; and the streaming second pass.

use super::standing::{ChainView, Standing, judge_event};
use super::{decode_event, gap};
use super::{decode_mark, mark_mismatch, mark_past_end, marks_of};
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, Identity, RunId, Sequence};
use crate::layout::{Dir, FileRef};
use crate::ops::common::{
    Cut, Finalize, Tail, decode_checkpoint, decode_cutoff, decode_epoch, epochs_of,
    newest_checkpoint, numbers_of, removed_cutoff,
};
use crate::ops::{Operation, Request, Response, Step, listing, step_try, sub_step, violation};
use crate::records::Event;
use crate::time::Timestamp;

/// One step of reading the log in order: the answer to `Read(event s)`, decoded, checked
/// to link to `prev` (the hash of event `s - 1`, `None` for the first), and its hash. A
/// missing event is `EVENT_LOG_GAP`, a broken link `CHAIN_BROKEN`. Shared by
/// [`ReadEvents`] and [`JudgeLog`], the two readers that walk the log.
fn read_linked(
    run: &RunId,
    s: Sequence,
    answer: Option<Response>,
    prev: Option<&Digest>,
    highest: u64,
) -> Result<(Event, Digest), LeaseError> {
    let bytes = match answer {
        Some(Response::Content(Some(b))) => b,
        Some(Response::Content(None)) => {
            return Err(gap(run, s.get(), highest.max(s.get() + 1)));
        }
        other => return Err(violation("Content", &other)),
    };
    let ev = decode_event(run, s, &bytes)?;
    if ev.prev_hash.as_ref() != prev {
        return Err(LeaseError::ChainBroken {
            run: run.to_string(),
            chain: "event",
            at: s.get(),
            detail: format!(
                "prev_hash {:?} does not match the hash of event {}",
                ev.prev_hash.as_ref().map(Digest::as_str),
                s.get() - 1
            ),
        });
    }
    Ok((ev, Digest::of(&bytes)))
}

/// An event with its judgment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgedEvent {
    /// The event.
    pub event: Event,
    /// Its hash.
    pub hash: Digest,
    /// Whether it counts.
    pub standing: Standing,
}

/// The second pass of a streaming read of the log. The first,
/// [`ReadEvents::chain_only`], reads every event and checks its link, then reads the chain
/// (log first, PROTOCOL §7.9); this one reads each event of `1..=last` again, one at a
/// time, and judges it against that chain, so memory does not grow with the log. Events
/// are immutable and the set was fixed by the first pass; each link is checked again and
/// the last hash must be the first pass's, so the second pass judged the very log the
/// first verified (else `CHAIN_BROKEN`: it changed under the reader).
///
/// ```
/// # use lease_core::ops::{JudgeLog, ReadEvents, Step, Operation};
/// # use lease_core::{mem::MemDisk, RunId};
/// # let mut disk = MemDisk::new();
/// # let live = |_: &lease_core::Holder| unreachable!();
/// let run = RunId::new("r").unwrap();
/// let view = disk.run(&mut ReadEvents::chain_only(run.clone(), None), &live).unwrap();
/// let mut pass = JudgeLog::new(run, view);
/// while let Some(req) = pass.request() {
///     let judged = pass.feed(disk.perform(req, &live)).unwrap();
///     println!("{} {:?}", judged.event.sequence, judged.standing);
/// }
/// ```
#[derive(Debug, Clone)]
pub struct JudgeLog {
    run: RunId,
    chain: ChainView,
    last: Option<(Sequence, Digest)>,
    next: u64,
    prev: Option<Digest>,
}

impl JudgeLog {
    /// Start the second pass over what [`ReadEvents::chain_only`] returned.
    pub fn new(run: RunId, view: EventLogView) -> JudgeLog {
        JudgeLog {
            run,
            chain: view.chain,
            last: view.last,
            next: 1,
            prev: None,
        }
    }

    /// The chain events are judged against.
    pub fn chain(&self) -> &ChainView {
        &self.chain
    }

    /// The next request (a `Read` of the next event), `None` once every event is judged.
    pub fn request(&self) -> Option<Request> {
        let (last, _) = self.last.as_ref()?;
        if self.next > last.get() {
            return None;
        }
        Sequence::new(self.next).map(|s| Request::Read(FileRef::Event(s)))
    }

    /// Feed the answer to [`JudgeLog::request`]: the event, judged.
    pub fn feed(&mut self, r: Response) -> Result<JudgedEvent, LeaseError> {
        let run = &self.run;
        let Some(s) = Sequence::new(self.next) else {
            return Err(violation("nothing (every event was judged)", &Some(r)));
        };
        // The first pass checked this link already: breaking it now means the log
        // changed while it was read.
        let (event, hash) = read_linked(
            run,
            s,
            Some(r),
            self.prev.as_ref(),
            self.last.as_ref().map_or(0, |(l, _)| l.get()),
        )
        .map_err(|e| match e {
            LeaseError::ChainBroken {
                run,
                chain,
                at,
                detail,
            } => LeaseError::ChainBroken {
                run,
                chain,
                at,
                detail: format!("{detail} (the log changed while it was read)"),
            },
            other => other,
        })?;
        if let Some((last, want)) = &self.last {
            if s == *last && hash != *want {
                return Err(LeaseError::ChainBroken {
                    run: run.to_string(),
                    chain: "event",
                    at: s.get(),
                    detail: "the log changed while it was read (its last event differs between the two passes)".into(),
                });
            }
        }
        self.prev = Some(hash.clone());
        self.next += 1;
        Ok(JudgedEvent {
            standing: judge_event(&event, &self.chain),
            event,
            hash,
        })
    }
}

/// The authoritative view of the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventLogView {
    /// Every event on disk, in order, with its judgment (empty from
    /// [`ReadEvents::chain_only`], which keeps none).
    pub events: Vec<JudgedEvent>,
    /// The chain it was judged against.
    pub chain: ChainView,
    /// The last event of the log (its sequence and hash), `None` for an empty log: the
    /// log is `1..=last`, every link checked.
    pub last: Option<(Sequence, Digest)>,
    /// The highest generation any event of the log is stamped with (`verify`: an event of a
    /// generation above the head means newer epochs were deleted).
    pub top_generation: Option<Generation>,
}

/// Read the whole log and judge it: the log FIRST, then epochs, cutoffs and the checkpoint
/// (R3, PROTOCOL §8), finalizing pending cutoffs when `finalize` is set (R2).
#[derive(Debug, Clone)]
pub struct ReadEvents {
    pub(super) run: RunId,
    finalize: Option<(Identity, Timestamp)>,
    pub(super) st: ReadState,
    events: Vec<(Event, Digest)>,
    /// The highest event sequence counted: the log read is `1..=highest`.
    highest: u64,
    epoch_gens: Vec<Generation>,
    cutoff_gens: Vec<Generation>,
    chain: ChainView,
    pending: Vec<(Generation, Identity, Generation)>,
    restarts: u32,
    /// Keep every event (`false`: [`ReadEvents::chain_only`]).
    keep: bool,
    /// The last event read, for the next link and the result.
    last: Option<(Sequence, Digest)>,
    top_generation: Option<Generation>,
    /// Start at the newest verified-prefix mark instead of event 1 ([`ReadEvents::tail`]).
    from_mark: bool,
    /// The mark the walk started from (`None`: event 1).
    pub(super) started_at: Option<Sequence>,
    /// Events read and linked by this walk (the mark's own event not counted).
    pub(super) walked: u64,
}

/// How often a tail reader lists the marks again after the newest one vanished (a newer
/// mark's writer removed it) before it walks the whole log instead.
const MARK_RETRIES: u32 = 8;

/// How often a reader re-reads the chain after a concurrent prune before giving up.
const MAX_RESTARTS: u32 = 8;

#[derive(Debug, Clone)]
pub(super) enum ReadState {
    Start,
    /// Tail mode: the marks listed (the count of earlier tries).
    ListMarks(u32),
    /// Tail mode: mark `s` read.
    ReadMark(Sequence, u32),
    /// Tail mode: the mark's event read, to compare with the mark's hash.
    ReadMarkEvent(Sequence, Digest),
    /// Tail mode: the mark's event is missing; is there an event after it?
    MarkGap(Sequence),
    /// Tail mode: the end of the log found from the mark's event.
    Tail(Tail),
    /// Tail mode, after the walk: is there an event two past the end (a gap below it)?
    ProbePastEnd(Sequence),
    ListEvents,
    ReadEvent(usize),
    ListCheckpoints,
    ReadCheckpoint(Generation),
    ListEpochs,
    ReadEpoch(usize),
    ListCutoffs,
    ReadCutoff(usize),
    Recheck,
    /// A finalizing reader fsyncs the folders of the cutoffs and the checkpoint it read
    /// before it judges by them (SYNC), the rest of the list still to go.
    SyncRead(Vec<Dir>),
    Finalize(Finalize),
    Done,
}

impl ReadEvents {
    /// Read `run`'s log. With `finalize = Some((reader_id, now))`, pending cutoffs are
    /// finalized (a write); with `None` the reader is read-only and such events are
    /// judged [`Standing::Pending`].
    pub fn new(run: RunId, finalize: Option<(Identity, Timestamp)>) -> ReadEvents {
        ReadEvents {
            run,
            finalize,
            st: ReadState::Start,
            events: Vec::new(),
            highest: 0,
            epoch_gens: Vec::new(),
            cutoff_gens: Vec::new(),
            chain: ChainView::default(),
            pending: Vec::new(),
            restarts: 0,
            keep: true,
            last: None,
            top_generation: None,
            from_mark: false,
            started_at: None,
            walked: 0,
        }
    }

    /// Like [`ReadEvents::chain_only`], but the walk of the log starts at the newest
    /// verified-prefix mark (PROTOCOL §13.1): its event is read and must hash to what the
    /// mark recorded (else `CHAIN_BROKEN`), the end of the log is found from there with
    /// `Exists` probes (TAIL, never a listing of `events/`), and only the events after
    /// the mark are read and linked. Without a mark it is [`ReadEvents::chain_only`]
    /// exactly. What lies below the mark is `verify`'s to check, not this reader's.
    pub fn tail(run: RunId) -> ReadEvents {
        ReadEvents {
            from_mark: true,
            ..ReadEvents::chain_only(run, None)
        }
    }

    /// Like [`ReadEvents::new`], but no event is kept: every event is still read in order
    /// and its link checked, then only the last one's sequence and hash remain
    /// ([`EventLogView::last`]), so memory does not grow with the log. For `verify`, and
    /// for a second pass that judges events one at a time ([`JudgeLog`]).
    pub fn chain_only(run: RunId, finalize: Option<(Identity, Timestamp)>) -> ReadEvents {
        ReadEvents {
            keep: false,
            ..ReadEvents::new(run, finalize)
        }
    }

    /// Tail mode: the mark's event `m` checked, the log ends at `end`: read `m+1..=end`
    /// in order (the gaps and links a whole walk would find there), then the chain.
    fn walk_from_mark(&mut self, m: Sequence, end: u64) -> Step<EventLogView> {
        self.highest = end;
        if let Some(n) = Sequence::new(m.get() + 1).filter(|n| n.get() <= end) {
            self.st = ReadState::ReadEvent(m.get() as usize);
            return Step::Io(Request::Read(FileRef::Event(n)));
        }
        self.past_end()
    }

    /// After the walk: in tail mode, the guard's probe past the end (`Exists(end + 2)`,
    /// as append's GUARD probes, §7.6: a stray there is the gap a whole walk reports);
    /// then the chain. A stray further out is the whole `verify`'s to find (§13.1).
    fn past_end(&mut self) -> Step<EventLogView> {
        if let Some(s) = Sequence::new(self.highest.saturating_add(2))
            .filter(|_| self.started_at.is_some() && self.highest < u64::MAX - 1)
        {
            self.st = ReadState::ProbePastEnd(s);
            return Step::Io(Request::Exists(FileRef::Event(s)));
        }
        self.st = ReadState::ListCheckpoints;
        Step::Io(Request::List(Dir::Checkpoints))
    }

    fn next_pending(&mut self) -> Step<EventLogView> {
        if let (Some((by, now)), Some((g, owner, sup))) =
            (self.finalize.clone(), self.pending.pop())
        {
            let f = Finalize::new(self.run.clone(), g, owner, sup, by, now).lazy();
            self.st = ReadState::Finalize(f);
            return self.next(None);
        }
        let chain = std::mem::take(&mut self.chain);
        let events = std::mem::take(&mut self.events)
            .into_iter()
            .map(|(event, hash)| JudgedEvent {
                standing: judge_event(&event, &chain),
                event,
                hash,
            })
            .collect();
        Step::Done(Ok(EventLogView {
            events,
            chain,
            last: self.last.clone(),
            top_generation: self.top_generation,
        }))
    }
}

impl Operation for ReadEvents {
    type Output = EventLogView;
    fn next(&mut self, mut input: Option<Response>) -> Step<EventLogView> {
        let run = self.run.clone();
        loop {
            match std::mem::replace(&mut self.st, ReadState::Done) {
                ReadState::Start => {
                    if self.from_mark {
                        self.st = ReadState::ListMarks(0);
                        return Step::Io(Request::List(Dir::Marks));
                    }
                    self.st = ReadState::ListEvents;
                    return Step::Io(Request::CountEvents);
                }
                ReadState::ListMarks(tries) => {
                    let l = step_try!(listing(input.take()));
                    match marks_of(l).pop() {
                        Some(m) if tries < MARK_RETRIES => {
                            self.st = ReadState::ReadMark(m, tries);
                            return Step::Io(Request::Read(FileRef::Mark(m)));
                        }
                        // No mark (or they keep vanishing): the whole log, from event 1.
                        _ => {
                            self.from_mark = false;
                            self.st = ReadState::ListEvents;
                            return Step::Io(Request::CountEvents);
                        }
                    }
                }
                ReadState::ReadMark(m, tries) => match input.take() {
                    Some(Response::Content(Some(b))) => {
                        let mark = step_try!(decode_mark(&run, m, &b));
                        self.st = ReadState::ReadMarkEvent(m, mark.through_hash);
                        return Step::Io(Request::Read(FileRef::Event(m)));
                    }
                    // Removed since the listing by the writer of a newer mark: list again.
                    Some(Response::Content(None)) => {
                        self.st = ReadState::ListMarks(tries + 1);
                        return Step::Io(Request::List(Dir::Marks));
                    }
                    other => return Step::Done(Err(violation("Content", &other))),
                },
                ReadState::ReadMarkEvent(m, want) => match input.take() {
                    Some(Response::Content(Some(b))) => {
                        let ev = step_try!(decode_event(&run, m, &b));
                        let hash = Digest::of(&b);
                        if hash != want {
                            return Step::Done(Err(mark_mismatch(&run, m)));
                        }
                        self.started_at = Some(m);
                        self.top_generation = Some(ev.generation);
                        self.last = Some((m, hash));
                        let t = Tail::new(m.get());
                        let end = sub_step!(self.st, ReadState::Tail, [], t, None);
                        return self.walk_from_mark(m, end);
                    }
                    Some(Response::Content(None)) => match m.next(&run) {
                        Ok(after) => {
                            self.st = ReadState::MarkGap(m);
                            return Step::Io(Request::Exists(FileRef::Event(after)));
                        }
                        Err(e) => return Step::Done(Err(e)),
                    },
                    other => return Step::Done(Err(violation("Content", &other))),
                },
                // What a whole walk finds for the same log: a gap at `m` when a later event
                // exists, else a log that ends before the mark.
                ReadState::MarkGap(m) => match input.take() {
                    Some(Response::Exists(true)) => {
                        return Step::Done(Err(gap(&run, m.get(), m.get() + 1)));
                    }
                    Some(Response::Exists(false)) => {
                        return Step::Done(Err(mark_past_end(&run, m, None)));
                    }
                    other => return Step::Done(Err(violation("Exists", &other))),
                },
                ReadState::Tail(t) => {
                    let end = sub_step!(self.st, ReadState::Tail, [], t, input.take());
                    let Some(m) = self.started_at else {
                        return Step::Done(Err(violation("a mark", &None)));
                    };
                    return self.walk_from_mark(m, end);
                }
                ReadState::ListEvents => {
                    // The log is 1..=highest. With fewer files than that, some sequence is
                    // missing: the sequential read below stops at the first one
                    // (EVENT_LOG_GAP names it). Events appended after the count are not
                    // this reader's (log first, R3).
                    let Some(Response::EventCount { highest, .. }) = input.take() else {
                        return Step::Done(Err(violation("EventCount", &input)));
                    };
                    self.highest = highest;
                    self.st = ReadState::ReadEvent(0);
                    input = None;
                    if let Some(s) = Sequence::new(1).filter(|_| highest >= 1) {
                        return Step::Io(Request::Read(FileRef::Event(s)));
                    }
                }
                ReadState::ReadEvent(i) => {
                    if (i as u64) < self.highest {
                        let Some(s) = Sequence::new(i as u64 + 1) else {
                            return Step::Done(Err(violation("a sequence", &input)));
                        };
                        let prev = self.last.as_ref().map(|(_, h)| h);
                        let (ev, hash) =
                            step_try!(read_linked(&run, s, input.take(), prev, self.highest));
                        self.last = Some((s, hash.clone()));
                        self.walked += 1;
                        self.top_generation = self.top_generation.max(Some(ev.generation));
                        if self.keep {
                            self.events.push((ev, hash));
                        }
                        if let Some(n) =
                            Sequence::new(i as u64 + 2).filter(|n| n.get() <= self.highest)
                        {
                            self.st = ReadState::ReadEvent(i + 1);
                            return Step::Io(Request::Read(FileRef::Event(n)));
                        }
                    }
                    return self.past_end();
                }
                ReadState::ProbePastEnd(s) => match input.take() {
                    Some(Response::Exists(false)) => {
                        self.st = ReadState::ListCheckpoints;
                        return Step::Io(Request::List(Dir::Checkpoints));
                    }
                    Some(Response::Exists(true)) => {
                        return Step::Done(Err(gap(&run, s.get() - 1, s.get())));
                    }
                    other => return Step::Done(Err(violation("Exists", &other))),
                },
                ReadState::ListCheckpoints => {
                    let l = step_try!(listing(input.take()));
                    let top = newest_checkpoint(l);
                    match top {
                        Some(g) => {
                            self.st = ReadState::ReadCheckpoint(g);
                            return Step::Io(Request::Read(FileRef::Checkpoint(g)));
                        }
                        None => {
                            self.st = ReadState::ListEpochs;
                            return Step::Io(Request::List(Dir::Epochs));
                        }
                    }
                }
                ReadState::ReadCheckpoint(g) => {
                    match input.take() {
                        Some(Response::Content(Some(b))) => match decode_checkpoint(&run, g, &b) {
                            Ok(cp) => self.chain.checkpoint = Some(cp),
                            Err(e) => return Step::Done(Err(e)),
                        },
                        // Removed by a newer prune between list and read: start over.
                        Some(Response::Content(None)) => {
                            self.st = ReadState::ListCheckpoints;
                            return Step::Io(Request::List(Dir::Checkpoints));
                        }
                        other => return Step::Done(Err(violation("Content", &other))),
                    }
                    self.st = ReadState::ListEpochs;
                    return Step::Io(Request::List(Dir::Epochs));
                }
                ReadState::ListEpochs => {
                    let l = step_try!(listing(input.take()));
                    let floor = self.chain.checkpoint.as_ref().map(|c| c.floor_generation);
                    self.epoch_gens = epochs_of(l)
                        .into_iter()
                        .filter(|g| floor.is_none_or(|f| *g >= f))
                        .collect();
                    self.st = ReadState::ReadEpoch(0);
                    if let Some(&g) = self.epoch_gens.first() {
                        return Step::Io(Request::Read(FileRef::Epoch(g)));
                    }
                    input = None;
                }
                ReadState::ReadEpoch(i) => {
                    if i < self.epoch_gens.len() {
                        let g = self.epoch_gens[i];
                        match input.take() {
                            Some(Response::Content(Some(b))) => match decode_epoch(&run, g, &b) {
                                Ok(e) => {
                                    self.chain.epochs.insert(g, e);
                                }
                                Err(e) => return Step::Done(Err(e)),
                            },
                            // A stray below a concurrent prune's new floor: skip it.
                            Some(Response::Content(None)) => {}
                            other => return Step::Done(Err(violation("Content", &other))),
                        }
                        if let Some(&n) = self.epoch_gens.get(i + 1) {
                            self.st = ReadState::ReadEpoch(i + 1);
                            return Step::Io(Request::Read(FileRef::Epoch(n)));
                        }
                    }
                    self.st = ReadState::ListCutoffs;
                    return Step::Io(Request::List(Dir::Cutoffs));
                }
                ReadState::ListCutoffs => {
                    let l = step_try!(listing(input.take()));
                    let floor = self.chain.checkpoint.as_ref().map(|c| c.floor_generation);
                    let mut gens = numbers_of(l, |f| f.generation_in(Dir::Cutoffs));
                    gens.retain(|g| floor.is_none_or(|f| *g >= f));
                    self.cutoff_gens = gens;
                    self.st = ReadState::ReadCutoff(0);
                    if let Some(&g) = self.cutoff_gens.first() {
                        return Step::Io(Request::Read(FileRef::Cutoff(g)));
                    }
                    input = None;
                }
                ReadState::ReadCutoff(i) => {
                    if i < self.cutoff_gens.len() {
                        let g = self.cutoff_gens[i];
                        match input.take() {
                            Some(Response::Content(Some(b))) => match decode_cutoff(&run, g, &b) {
                                Ok(c) => {
                                    self.chain.cutoffs.insert(g, c.events_through);
                                    self.chain.cutoff_records.insert(g, (c, Digest::of(&b)));
                                }
                                Err(e) => return Step::Done(Err(e)),
                            },
                            Some(Response::Content(None)) => {}
                            other => return Step::Done(Err(violation("Content", &other))),
                        }
                        if let Some(&n) = self.cutoff_gens.get(i + 1) {
                            self.st = ReadState::ReadCutoff(i + 1);
                            return Step::Io(Request::Read(FileRef::Cutoff(n)));
                        }
                    }
                    // A prune may have moved the floor while we read the chain (and removed
                    // epochs or cutoffs we then missed): confirm the newest checkpoint is
                    // still the one we read, else read the chain again (PROTOCOL OQ-15).
                    self.st = ReadState::Recheck;
                    return Step::Io(Request::List(Dir::Checkpoints));
                }
                ReadState::Recheck => {
                    let l = step_try!(listing(input.take()));
                    let top = newest_checkpoint(l);
                    let read = self.chain.checkpoint.as_ref().map(|c| c.floor_generation);
                    if top != read {
                        self.restarts += 1;
                        if self.restarts > MAX_RESTARTS {
                            return Step::Done(Err(LeaseError::ConcurrentChange {
                                run: run.to_string(),
                                detail: "the chain was compacted repeatedly while reading".into(),
                            }));
                        }
                        self.chain = ChainView::default();
                        self.st = ReadState::ListCheckpoints;
                        return Step::Io(Request::List(Dir::Checkpoints));
                    }
                    self.pending = self.chain.pending_cutoffs();
                    // A "pending" cutoff whose generation + 2 is in the chain is not pending:
                    // that epoch's creator had it (GATE), and the epochs were listed before
                    // the cutoffs, so it was removed (issue #17). Every reader says so,
                    // read-only or not, rather than calling its events "not counted yet".
                    if let Some((g, _, _)) = self.pending.iter().find(|(g, _, _)| {
                        g.get()
                            .checked_add(2)
                            .and_then(Generation::new)
                            .is_some_and(|b| self.chain.epochs.contains_key(&b))
                    }) {
                        return Step::Done(Err(removed_cutoff(&run, *g)));
                    }
                    // SYNC (PROTOCOL §7.0, §7.9): a finalizing reader's judgement is the
                    // one the run stands by (I12), so what it read must be durable first:
                    // a cutoff or checkpoint can be visible before its creator fsynced the
                    // folder. A read-only reader (verify, `events` without finalizing)
                    // reports what is visible and syncs nothing.
                    let mut dirs = Vec::new();
                    if self.finalize.is_some() {
                        if self.chain.checkpoint.is_some() {
                            dirs.push(Dir::Checkpoints);
                        }
                        if !self.chain.cutoffs.is_empty() {
                            dirs.push(Dir::Cutoffs);
                        }
                    }
                    if let Some(d) = dirs.pop() {
                        self.st = ReadState::SyncRead(dirs);
                        return Step::Io(Request::SyncDir(d));
                    }
                    return self.next_pending();
                }
                ReadState::SyncRead(mut dirs) => {
                    let got = input.take();
                    if !matches!(got, Some(Response::Done)) {
                        return Step::Done(Err(violation("Done", &got)));
                    }
                    if let Some(d) = dirs.pop() {
                        self.st = ReadState::SyncRead(dirs);
                        return Step::Io(Request::SyncDir(d));
                    }
                    return self.next_pending();
                }
                ReadState::Finalize(f) => {
                    let v = sub_step!(self.st, ReadState::Finalize, [], f, input.take());
                    match v {
                        Cut::Record(c) => {
                            self.chain.cutoffs.insert(c.generation, c.events_through);
                            let hash = match crate::canonical::encode(&c) {
                                Ok(b) => Digest::of(&b),
                                Err(e) => return Step::Done(Err(e)),
                            };
                            self.chain.cutoff_records.insert(c.generation, (c, hash));
                            return self.next_pending();
                        }
                        Cut::Compacted(_) => {
                            // A prune ran while we read the chain: read the chain again (the log
                            // itself is immutable and stays as read).
                            self.restarts += 1;
                            if self.restarts > MAX_RESTARTS {
                                return Step::Done(Err(LeaseError::ConcurrentChange {
                                    run: run.to_string(),
                                    detail: "the chain was compacted repeatedly while reading"
                                        .into(),
                                }));
                            }
                            self.chain = ChainView::default();
                            self.pending.clear();
                            self.st = ReadState::ListCheckpoints;
                            return Step::Io(Request::List(Dir::Checkpoints));
                        }
                    }
                }
                ReadState::Done => {
                    return Step::Done(Err(violation("nothing (operation finished)", &input)));
                }
            }
        }
    }
}
