//! The event log: append with a fencing post-check, authoritative reads, chain verification.

use super::common::{
    Cut, Finalize, Tail, decode_checkpoint, decode_cutoff, decode_epoch, epochs_of,
    newest_checkpoint,
};
use super::{Operation, OwnedLease, Request, Response, Step, sub_step, violation};
use crate::canonical::{decode_for, encode};
use crate::error::{LeaseError, RecordKind};
use crate::ids::{Digest, Generation, Identity, RunId, Sequence};
use crate::layout::{Dir, FileRef};
use crate::records::{Checkpoint, EpochRecord, EpochState, Event, RetirementRecord};
use crate::time::Timestamp;
use std::collections::BTreeMap;

/// Give up after this many sequence collisions in one append.
pub const MAX_APPEND_COLLISIONS: u32 = 10_000;

fn fenced(run: &RunId, generation: Generation, detail: impl Into<String>) -> LeaseError {
    LeaseError::Fenced {
        run: run.to_string(),
        generation,
        detail: detail.into(),
    }
}

/// One step of reading the log in order: the answer to `Read(event s)`, decoded, checked
/// to link to `prev` (the hash of event `s - 1`, `None` for the first), and its hash. A
/// missing event is `EVENT_LOG_GAP`, a broken link `CHAIN_BROKEN`. Shared by
/// [`ReadEvents`] and [`JudgeLog`], the two readers that walk the log.
fn read_linked(
    run: &RunId,
    s: Sequence,
    answer: Option<Response>,
    prev: Option<&Digest>,
) -> Result<(Event, Digest), LeaseError> {
    let bytes = match answer {
        Some(Response::Content(Some(b))) => b,
        Some(Response::Content(None)) => {
            return Err(LeaseError::EventLogGap {
                run: run.to_string(),
                missing: s.get(),
            });
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

pub(crate) fn decode_event(run: &RunId, s: Sequence, bytes: &[u8]) -> Result<Event, LeaseError> {
    let file = FileRef::Event(s).path();
    let ev: Event = decode_for(run, bytes).map_err(|e| e.in_file(&file))?;
    if ev.sequence != s {
        return Err(LeaseError::RecordInvalid {
            run: run.to_string(),
            kind: RecordKind::Event,
            file: Some(file),
            detail: format!("file name says sequence {s}, content says {}", ev.sequence),
        });
    }
    Ok(ev)
}

// ---------------------------------------------------------------------------------------
// append

/// Arguments of an append.
#[derive(Debug, Clone)]
pub struct AppendParams {
    /// Event type.
    pub event_type: Identity,
    /// Payload (any JSON).
    pub payload: serde_json::Value,
    /// Wall time.
    pub now: Timestamp,
    /// The last event this appender knows of (sequence and hash), to avoid searching.
    pub tail_hint: Option<(Sequence, Digest)>,
}

/// A successful append: the event is durable and authoritative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// Its sequence.
    pub sequence: Sequence,
    /// Its hash (the next append's `prev_hash`; pass it back as the tail hint).
    pub hash: Digest,
    /// Set when the owner was superseded while appending but the event fell within its
    /// cutoff: the event counts, and the owner must stop (every later write is fenced).
    pub superseded_by: Option<Generation>,
}

/// Append one event as the owner of `lease`.
///
/// Steps: pre-check (the cutoff of this generation must not exist; skip if it does: fenced),
/// find the tail (from the hint, else an `Exists` gallop), read the last event for its hash,
/// create the next sequence exclusively (on collision read the winner and try the next),
/// then the post-check: read this generation's cutoff; if absent, list epochs; if a higher
/// generation exists, finalize (or read) the cutoff. The answer always equals the event's
/// authority: acknowledged iff `sequence <= cutoff` or no cutoff exists and nothing
/// superseded this generation at the post-check.
#[derive(Debug, Clone)]
pub struct Append {
    lease: OwnedLease,
    p: AppendParams,
    st: AppendState,
    collisions: u32,
}

#[derive(Debug, Clone)]
enum AppendState {
    Start,
    PreCheck,
    HintProbe(Sequence, Digest),
    Tail(Tail),
    ReadPrev(Sequence),
    Create(Sequence, Digest),
    ReadWinner(Sequence),
    PostCutoff(Sequence, Digest),
    /// The cutoff the post-check read, while its folder is fsynced (SYNC).
    PostSync(Sequence, Digest, Box<RetirementRecord>),
    PostList(Sequence, Digest),
    Finalize(Sequence, Digest, Generation, Finalize),
    Done,
}

impl Append {
    /// Start an append.
    pub fn new(lease: &OwnedLease, p: AppendParams) -> Append {
        Append {
            lease: lease.clone(),
            p,
            st: AppendState::Start,
            collisions: 0,
        }
    }

    fn create(&mut self, s: Sequence, prev: Option<Digest>) -> Step<Appended> {
        let ev = Event {
            run_id: self.lease.run_id.clone(),
            sequence: s,
            generation: self.lease.generation,
            owner_id: self.lease.owner_id.clone(),
            event_type: self.p.event_type.clone(),
            payload: self.p.payload.clone(),
            timestamp: self.p.now,
            prev_hash: prev,
        };
        let bytes = match encode(&ev) {
            Ok(b) => b,
            Err(e) => return Step::Done(Err(e)),
        };
        self.st = AppendState::Create(s, Digest::of(&bytes));
        Step::Io(Request::CreateExclusive(FileRef::Event(s), bytes))
    }

    fn after_tail(&mut self, tail: u64) -> Step<Appended> {
        let run = &self.lease.run_id;
        match Sequence::new(tail) {
            None => self.create(Sequence::FIRST, None),
            Some(t) => {
                if let Err(e) = t.next(run) {
                    return Step::Done(Err(e));
                }
                self.st = AppendState::ReadPrev(t);
                Step::Io(Request::Read(FileRef::Event(t)))
            }
        }
    }
}

impl Operation for Append {
    type Output = Appended;
    fn next(&mut self, mut input: Option<Response>) -> Step<Appended> {
        let run = self.lease.run_id.clone();
        let g = self.lease.generation;
        loop {
            match std::mem::replace(&mut self.st, AppendState::Done) {
                AppendState::Start => {
                    self.st = AppendState::PreCheck;
                    return Step::Io(Request::Exists(FileRef::Cutoff(g)));
                }
                AppendState::PreCheck => match input.take() {
                    Some(Response::Exists(true)) => {
                        return Step::Done(Err(fenced(
                            &run,
                            g,
                            "this generation has been retired (its cutoff exists); nothing was appended",
                        )));
                    }
                    Some(Response::Exists(false)) => match self.p.tail_hint.clone() {
                        Some((s, h)) => {
                            let next = match s.next(&run) {
                                Ok(n) => n,
                                Err(e) => return Step::Done(Err(e)),
                            };
                            self.st = AppendState::HintProbe(s, h);
                            return Step::Io(Request::Exists(FileRef::Event(next)));
                        }
                        None => {
                            self.st = AppendState::Tail(Tail::new(0));
                        }
                    },
                    other => return Step::Done(Err(violation("Exists", &other))),
                },
                AppendState::HintProbe(s, h) => match input.take() {
                    Some(Response::Exists(false)) => {
                        let next = match s.next(&run) {
                            Ok(n) => n,
                            Err(e) => return Step::Done(Err(e)),
                        };
                        return self.create(next, Some(h));
                    }
                    Some(Response::Exists(true)) => {
                        self.st = AppendState::Tail(Tail::new(s.get() + 1));
                    }
                    other => return Step::Done(Err(violation("Exists", &other))),
                },
                AppendState::Tail(t) => {
                    let v = sub_step!(self.st, AppendState::Tail, [], t, input.take());
                    return self.after_tail(v);
                }
                AppendState::ReadPrev(t) | AppendState::ReadWinner(t) => {
                    let bytes = match input.take() {
                        Some(Response::Content(Some(b))) => b,
                        Some(Response::Content(None)) => {
                            return Step::Done(Err(LeaseError::EventLogGap {
                                run: run.to_string(),
                                missing: t.get(),
                            }));
                        }
                        other => return Step::Done(Err(violation("Content", &other))),
                    };
                    if let Err(e) = decode_event(&run, t, &bytes) {
                        return Step::Done(Err(e));
                    }
                    let next = match t.next(&run) {
                        Ok(n) => n,
                        Err(e) => return Step::Done(Err(e)),
                    };
                    return self.create(next, Some(Digest::of(&bytes)));
                }
                AppendState::Create(s, hash) => match input.take() {
                    Some(Response::Created) => {
                        self.st = AppendState::PostCutoff(s, hash);
                        return Step::Io(Request::Read(FileRef::Cutoff(g)));
                    }
                    Some(Response::AlreadyExists) => {
                        self.collisions += 1;
                        if self.collisions >= MAX_APPEND_COLLISIONS {
                            return Step::Done(Err(LeaseError::EventContention {
                                run: run.to_string(),
                                attempts: self.collisions,
                            }));
                        }
                        self.st = AppendState::ReadWinner(s);
                        return Step::Io(Request::Read(FileRef::Event(s)));
                    }
                    other => return Step::Done(Err(violation("Created/AlreadyExists", &other))),
                },
                AppendState::PostCutoff(s, hash) => match input.take() {
                    Some(Response::Content(Some(b))) => {
                        let cutoff = match decode_cutoff(&run, g, &b) {
                            Ok(c) => c,
                            Err(e) => return Step::Done(Err(e)),
                        };
                        // SYNC (PROTOCOL §7.0, §7.6 step 5): the cutoff may be linked but
                        // not yet durable (its finalizer has not fsynced `lease/cutoffs/`).
                        // Answering from it before it is durable let a power loss take it
                        // away while the event survived, and the event then counted after
                        // a FENCED answer (issue #14).
                        self.st = AppendState::PostSync(s, hash, Box::new(cutoff));
                        return Step::Io(Request::SyncDir(Dir::Cutoffs));
                    }
                    Some(Response::Content(None)) => {
                        self.st = AppendState::PostList(s, hash);
                        return Step::Io(Request::List(Dir::Epochs));
                    }
                    other => return Step::Done(Err(violation("Content", &other))),
                },
                AppendState::PostSync(s, hash, cutoff) => match input.take() {
                    Some(Response::Done) => {
                        let by = cutoff.superseded_by;
                        return Step::Done(judge_append(
                            &run,
                            g,
                            s,
                            hash,
                            &Cut::Record(*cutoff),
                            by,
                        ));
                    }
                    other => return Step::Done(Err(violation("Done", &other))),
                },
                AppendState::PostList(s, hash) => {
                    let listing = match input.take() {
                        Some(Response::Listing(l)) => l,
                        other => return Step::Done(Err(violation("Listing", &other))),
                    };
                    match epochs_of(listing).last().copied().filter(|&top| top > g) {
                        None => {
                            return Step::Done(Ok(Appended {
                                sequence: s,
                                hash,
                                superseded_by: None,
                            }));
                        }
                        Some(top) => {
                            let by = match g.next(&run) {
                                Ok(n) => n,
                                Err(e) => return Step::Done(Err(e)),
                            };
                            let f = Finalize::new(
                                run.clone(),
                                g,
                                self.lease.owner_id.clone(),
                                by,
                                self.lease.owner_id.clone(),
                                self.p.now,
                            )
                            .lazy();
                            self.st = AppendState::Finalize(s, hash, top, f);
                        }
                    }
                }
                AppendState::Finalize(s, hash, top, f) => {
                    let (s, hash, top, v) = sub_step!(
                        self.st,
                        AppendState::Finalize,
                        [s, hash, top],
                        f,
                        input.take()
                    );
                    return Step::Done(judge_append(&run, g, s, hash, &v, top));
                }
                AppendState::Done => {
                    return Step::Done(Err(violation("nothing (operation finished)", &input)));
                }
            }
        }
    }
}

fn judge_append(
    run: &RunId,
    g: Generation,
    s: Sequence,
    hash: Digest,
    cutoff: &Cut,
    by: Generation,
) -> Result<Appended, LeaseError> {
    if cutoff.counts(s.get()) {
        Ok(Appended {
            sequence: s,
            hash,
            superseded_by: Some(by),
        })
    } else {
        Err(fenced(
            run,
            g,
            format!("{}: event {s} does not count", cutoff.describe()),
        ))
    }
}

// ---------------------------------------------------------------------------------------
// authority

/// What a reader knows of the epoch chain, for judging events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainView {
    /// The newest checkpoint, if the chain was compacted.
    pub checkpoint: Option<Checkpoint>,
    /// Epochs at or above the checkpoint floor.
    pub epochs: BTreeMap<Generation, EpochRecord>,
    /// Finalized cutoffs (`events_through`) by retired generation.
    pub cutoffs: BTreeMap<Generation, u64>,
}

impl ChainView {
    /// The head generation.
    pub fn head(&self) -> Option<Generation> {
        self.epochs.keys().next_back().copied()
    }

    /// Active generations that were superseded and have no finalized cutoff yet.
    pub fn pending_cutoffs(&self) -> Vec<(Generation, Identity, Generation)> {
        let floor = self.checkpoint.as_ref().map(|c| c.floor_generation);
        self.epochs
            .values()
            .filter_map(|e| e.retired.as_ref().map(|r| (r, e.generation)))
            .filter(|(r, _)| !self.cutoffs.contains_key(&r.generation))
            .filter(|(r, _)| floor.is_none_or(|f| r.generation >= f))
            .map(|(r, by)| (r.generation, r.owner_id.clone(), by))
            .collect()
    }
}

/// Whether an event counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authority {
    /// It counts.
    Authoritative,
    /// Written by a superseded generation past its cutoff: shown, never counted.
    PastCutoff {
        /// The generation's cutoff.
        cutoff: u64,
    },
    /// Its generation was superseded and the cutoff is not finalized yet (read-only reader).
    Pending,
    /// Its owner id is not the owner of its generation.
    NotOwner,
    /// Its generation is a released or retired (free) epoch: nobody owned it.
    FreeGeneration,
    /// No epoch with its generation exists.
    UnknownGeneration,
    /// Below the checkpoint floor and excluded by it.
    ExcludedByCheckpoint,
}

impl Authority {
    /// Whether the event counts.
    pub fn counts(&self) -> bool {
        matches!(self, Authority::Authoritative)
    }
}

/// Judge one event against the chain (pure).
///
/// A finalized cutoff always applies, even when its generation is the newest epoch on
/// disk (so deleting or corrupting a newer epoch can never make a retired owner's late
/// events count).
pub fn judge_event(ev: &Event, chain: &ChainView) -> Authority {
    if let Some(cp) = &chain.checkpoint {
        if ev.generation < cp.floor_generation {
            let s = ev.sequence.get();
            return if s <= cp.through_sequence && cp.not_authoritative.binary_search(&s).is_err() {
                Authority::Authoritative
            } else {
                Authority::ExcludedByCheckpoint
            };
        }
    }
    let Some(epoch) = chain.epochs.get(&ev.generation) else {
        return Authority::UnknownGeneration;
    };
    if epoch.state != EpochState::Active {
        return Authority::FreeGeneration;
    }
    if epoch.owner_id != ev.owner_id {
        return Authority::NotOwner;
    }
    if let Some(&cutoff) = chain.cutoffs.get(&ev.generation) {
        return if ev.sequence.get() <= cutoff {
            Authority::Authoritative
        } else {
            Authority::PastCutoff { cutoff }
        };
    }
    if chain.head() == Some(ev.generation) {
        Authority::Authoritative
    } else {
        Authority::Pending
    }
}

// ---------------------------------------------------------------------------------------
// reading the log

/// An event with its judgment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgedEvent {
    /// The event.
    pub event: Event,
    /// Its hash.
    pub hash: Digest,
    /// Whether it counts.
    pub authority: Authority,
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
///     println!("{} {:?}", judged.event.sequence, judged.authority);
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
        let (event, hash) =
            read_linked(run, s, Some(r), self.prev.as_ref()).map_err(|e| match e {
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
            authority: judge_event(&event, &self.chain),
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
}

/// Read the whole log and judge it: the log FIRST, then epochs, cutoffs and the checkpoint
/// (rule 3), finalizing pending cutoffs when `finalize` is set (rule 2).
#[derive(Debug, Clone)]
pub struct ReadEvents {
    run: RunId,
    finalize: Option<(Identity, Timestamp)>,
    st: ReadState,
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
}

/// How often a reader re-reads the chain after a concurrent prune before giving up.
const MAX_RESTARTS: u32 = 8;

#[derive(Debug, Clone)]
enum ReadState {
    Start,
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
    /// judged [`Authority::Pending`].
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
                authority: judge_event(&event, &chain),
                event,
                hash,
            })
            .collect();
        Step::Done(Ok(EventLogView {
            events,
            chain,
            last: self.last.clone(),
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
                    self.st = ReadState::ListEvents;
                    return Step::Io(Request::CountEvents);
                }
                ReadState::ListEvents => {
                    // The log is 1..=highest. With fewer files than that, some sequence is
                    // missing: the sequential read below stops at the first one
                    // (EVENT_LOG_GAP names it). Events appended after the count are not
                    // this reader's (log first, rule 3).
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
                        let (ev, hash) = match read_linked(&run, s, input.take(), prev) {
                            Ok(linked) => linked,
                            Err(e) => return Step::Done(Err(e)),
                        };
                        self.last = Some((s, hash.clone()));
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
                    self.st = ReadState::ListCheckpoints;
                    return Step::Io(Request::List(Dir::Checkpoints));
                }
                ReadState::ListCheckpoints => {
                    let Some(Response::Listing(l)) = input.take() else {
                        return Step::Done(Err(violation("Listing", &input)));
                    };
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
                    let Some(Response::Listing(l)) = input.take() else {
                        return Step::Done(Err(violation("Listing", &input)));
                    };
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
                    let Some(Response::Listing(l)) = input.take() else {
                        return Step::Done(Err(violation("Listing", &input)));
                    };
                    let floor = self.chain.checkpoint.as_ref().map(|c| c.floor_generation);
                    let mut gens: Vec<Generation> = l
                        .into_iter()
                        .filter_map(|f| match f {
                            FileRef::Cutoff(g) => Some(g),
                            _ => None,
                        })
                        .filter(|g| floor.is_none_or(|f| *g >= f))
                        .collect();
                    gens.sort_unstable();
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
                    let Some(Response::Listing(l)) = input.take() else {
                        return Step::Done(Err(violation("Listing", &input)));
                    };
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

// ---------------------------------------------------------------------------------------
// verify

/// What [`Verify`] checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    /// Epochs whose link was checked (from the checkpoint floor, or generation 1).
    pub epochs: u64,
    /// Events whose link was checked.
    pub events: u64,
    /// Stray epoch files below the floor (a claimer that lost a race with compaction).
    pub strays: Vec<Generation>,
    /// The checkpoint floor the epoch chain was verified from.
    pub floor: Option<Generation>,
    /// A finalized cutoff (or the checkpoint) names events past the log's last sequence.
    /// Not an error by itself: after a power loss, an event whose folder fsync had not
    /// completed (so it was never acknowledged) can vanish below a cutoff that a finalizer
    /// made durable; after a plain crash it means the log's tail was deleted.
    pub short_tail: Option<ShortTail>,
}

/// The log ends before a sequence that the chain says was there (see
/// [`VerifyReport::short_tail`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortTail {
    /// The highest sequence a finalized cutoff or the checkpoint names.
    pub named: u64,
    /// Who names it: the retired generation of the cutoff, or `None` for the checkpoint.
    pub by_cutoff_of: Option<Generation>,
    /// The last sequence in the log (0 when the log is empty).
    pub tail: u64,
}

/// Walk both hash chains and report the first broken link as `CHAIN_BROKEN` (or a missing
/// record as `EVENT_LOG_GAP` / `CHAIN_BROKEN`). Read-only.
#[derive(Debug, Clone)]
pub struct Verify {
    read: ReadEvents,
    all_gens: Vec<Generation>,
    st: u8,
}

impl Verify {
    /// Start verifying `run`.
    pub fn new(run: RunId) -> Verify {
        Verify {
            read: ReadEvents::chain_only(run, None),
            all_gens: Vec::new(),
            st: 0,
        }
    }
}

impl Operation for Verify {
    type Output = VerifyReport;
    fn next(&mut self, input: Option<Response>) -> Step<VerifyReport> {
        // Snoop the epochs listing so strays below the floor can be reported.
        if self.st == 0 {
            if let (ReadState::ListEpochs, Some(Response::Listing(l))) = (&self.read.st, &input) {
                self.all_gens = epochs_of(l.clone());
            }
        }
        let view = match self.read.next(input) {
            Step::Io(r) => return Step::Io(r),
            Step::Done(Err(e)) => return Step::Done(Err(e)),
            Step::Done(Ok(v)) => v,
        };
        self.st = 1;
        let run = self.read.run.to_string();
        let chain = &view.chain;
        let floor = chain.checkpoint.as_ref().map(|c| c.floor_generation);
        let mut expected_gen = floor.unwrap_or(Generation::FIRST);
        let mut prev: Option<Digest> = None;
        let mut count = 0u64;
        for (g, e) in &chain.epochs {
            if *g != expected_gen {
                return Step::Done(Err(LeaseError::ChainBroken {
                    run,
                    chain: "epoch",
                    at: expected_gen.get(),
                    detail: format!("epoch {expected_gen} is missing (next present: {g})"),
                }));
            }
            let bytes = match encode(e) {
                Ok(b) => b,
                Err(err) => return Step::Done(Err(err)),
            };
            let hash = Digest::of(&bytes);
            match (&prev, &chain.checkpoint) {
                (None, Some(cp)) => {
                    if hash != cp.floor_epoch_hash {
                        return Step::Done(Err(LeaseError::ChainBroken {
                            run,
                            chain: "epoch",
                            at: g.get(),
                            detail: "the floor epoch does not match the checkpoint's hash".into(),
                        }));
                    }
                }
                (None, None) => {}
                (Some(p), _) => {
                    if e.prev_hash.as_ref() != Some(p) {
                        return Step::Done(Err(LeaseError::ChainBroken {
                            run,
                            chain: "epoch",
                            at: g.get(),
                            detail: format!(
                                "prev_hash does not match the hash of epoch {}",
                                g.get() - 1
                            ),
                        }));
                    }
                }
            }
            prev = Some(hash);
            count += 1;
            expected_gen = match g.next(&self.read.run) {
                Ok(n) => n,
                Err(err) => return Step::Done(Err(err)),
            };
        }
        let strays = self
            .all_gens
            .iter()
            .copied()
            .filter(|g| floor.is_some_and(|f| *g < f))
            .collect();
        let tail = view.last.as_ref().map_or(0, |(s, _)| s.get());
        let by_cutoff = chain
            .cutoffs
            .iter()
            .map(|(g, through)| (*through, Some(*g)))
            .max_by_key(|(through, _)| *through);
        let by_checkpoint = chain
            .checkpoint
            .as_ref()
            .map(|c| (c.through_sequence, None));
        let short_tail = by_cutoff
            .into_iter()
            .chain(by_checkpoint)
            .max_by_key(|(through, _)| *through)
            .filter(|(through, _)| *through > tail)
            .map(|(named, by_cutoff_of)| ShortTail {
                named,
                by_cutoff_of,
                tail,
            });
        Step::Done(Ok(VerifyReport {
            epochs: count,
            events: tail,
            strays,
            floor,
            short_tail,
        }))
    }
}
