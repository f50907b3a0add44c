//! verify: walk both hash chains, read-only.

use super::read::{EventLogView, ReadEvents, ReadState};
use super::standing::ChainView;
use super::{decode_mark, gap, mark_mismatch, mark_past_end, marks_of};
use crate::canonical::encode;
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, RunId, Sequence};
use crate::layout::{Dir, FileRef};
use crate::ops::common::{epochs_of, removed_cutoff};
use crate::ops::{Operation, Request, Response, Step, listing, step_try, violation};
use crate::records::{EpochRecord, EpochState};

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
    /// Where the walk of the log started: `None` from event 1 (a whole walk, `verify`),
    /// `Some(m)` from the verified-prefix mark `m` ([`Verify::tail`]).
    pub started_at: Option<Sequence>,
    /// How many events this walk read and linked (the mark's own event not counted).
    pub walked: u64,
    /// The last event of the log as the walk found it (its sequence and hash), `None`
    /// for an empty log: where a new mark may be written ([`crate::ops::WriteMark`]).
    pub last: Option<(Sequence, Digest)>,
}

impl VerifyReport {
    /// The mark a writer should leave once its own write succeeded: the walk read at
    /// least [`crate::ops::MARK_EVERY`] events past the mark it started from.
    pub fn mark_due(&self) -> Option<(Sequence, Digest)> {
        (self.walked >= crate::ops::MARK_EVERY)
            .then(|| self.last.clone())
            .flatten()
    }
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
///
/// Beyond the links (PROTOCOL.md §13): each epoch against the one before it (§4's
/// `retired` rules, and the cutoff it binds by `cutoff_hash`); each cutoff against its
/// epoch (owner, `superseded_by`); the checkpoint's `through_hash` against its event; and
/// records that name a generation above the head (an event, a beat, a cutoff whose
/// successor is missing), which mean the newest epochs were deleted. Those last findings
/// are confirmed by listing the epochs again at the end, so a claim or release that ran
/// while `verify` read is not mistaken for a deletion.
#[derive(Debug, Clone)]
pub struct Verify {
    read: ReadEvents,
    all_gens: Vec<Generation>,
    st: VerifyState,
}

#[derive(Debug, Clone)]
enum VerifyState {
    Reading,
    /// The chain and the log checked; reading event `through_sequence` for the checkpoint.
    Through(Box<Pending>, u64, Digest),
    /// Whole walk only: every mark checked against its event (the rest still to read).
    Marks(Box<Pending>),
    /// Mark `s` read (the rest still to check).
    ReadMark(Box<Pending>, Vec<Sequence>, Sequence),
    /// The event of mark `s` read, to compare with its hash.
    MarkEvent(Box<Pending>, Vec<Sequence>, Sequence, Digest),
    /// Mark `s` is above the log this walk read: an event appended (and marked) since, or
    /// a log whose tail was deleted?
    MarkAbove(Box<Pending>, Vec<Sequence>, Sequence),
    ListBeats(Box<Pending>),
    /// A record names a generation above the head: is the head still the one verified?
    Confirm(Box<Pending>, Box<LeaseError>),
    Done,
}

/// What the in-memory checks left: the report and what still needs a read.
#[derive(Debug, Clone)]
struct Pending {
    report: VerifyReport,
    head: Option<Generation>,
}

impl Verify {
    /// Start verifying `run`: the whole log from event 1, and every verified-prefix mark
    /// against its event (`runlease verify`, `doctor`).
    pub fn new(run: RunId) -> Verify {
        Verify {
            read: ReadEvents::chain_only(run, None),
            all_gens: Vec::new(),
            st: VerifyState::Reading,
        }
    }

    /// Start verifying `run` from its newest verified-prefix mark (PROTOCOL §13.1): the
    /// same checks as [`Verify::new`] on the epochs, cutoffs, checkpoint and beats, but
    /// the log is walked only from the mark (whose event must still hash to what the mark
    /// recorded), so the cost does not grow with the log. Whatever [`Verify::new`]
    /// rejects among the events after the mark, this rejects with the same code; what
    /// lies below the mark is left to [`Verify::new`]. Without a mark it is
    /// [`Verify::new`]'s walk. `append`, `run`, `status` and the admission of a new owner
    /// use it.
    pub fn tail(run: RunId) -> Verify {
        Verify {
            read: ReadEvents::tail(run),
            all_gens: Vec::new(),
            st: VerifyState::Reading,
        }
    }

    /// After the checkpoint's event: the marks (a walk from event 1 only: `verify`, or a
    /// tail check that found no mark), then the beats.
    fn after_through(&mut self, pending: Box<Pending>) -> Step<VerifyReport> {
        if pending.report.started_at.is_none() {
            self.st = VerifyState::Marks(pending);
            return Step::Io(Request::List(Dir::Marks));
        }
        self.beats(pending)
    }

    fn beats(&mut self, pending: Box<Pending>) -> Step<VerifyReport> {
        self.st = VerifyState::ListBeats(pending);
        Step::Io(Request::List(Dir::Beats))
    }

    /// The next mark to check, or the beats.
    fn next_mark(&mut self, pending: Box<Pending>, mut rest: Vec<Sequence>) -> Step<VerifyReport> {
        let Some(s) = rest.pop() else {
            return self.beats(pending);
        };
        let tail = pending.report.last.as_ref().map_or(0, |(l, _)| l.get());
        if s.get() > tail {
            self.st = VerifyState::MarkAbove(pending, rest, s);
            return Step::Io(Request::Exists(FileRef::Event(s)));
        }
        self.st = VerifyState::ReadMark(pending, rest, s);
        Step::Io(Request::Read(FileRef::Mark(s)))
    }

    fn broken(&self, chain: &'static str, at: u64, detail: String) -> LeaseError {
        LeaseError::ChainBroken {
            run: self.read.run.to_string(),
            chain,
            at,
            detail,
        }
    }

    /// `CHAIN_BROKEN` at cutoff `g`, its detail led by the cutoff's path.
    fn broken_cutoff(&self, g: Generation, detail: String) -> LeaseError {
        self.broken(
            "cutoff",
            g.get(),
            format!("{} {detail}", FileRef::Cutoff(g).path()),
        )
    }

    /// The checks that need no further read. `Ok` carries the report, and a record of the
    /// log above the head (if any) for the confirmation.
    fn check_view(&self, view: &EventLogView) -> Result<(Pending, Option<LeaseError>), LeaseError> {
        let chain = &view.chain;
        let floor = chain.checkpoint.as_ref().map(|c| c.floor_generation);
        let mut expected_gen = floor.unwrap_or(Generation::FIRST);
        let mut prev: Option<(Digest, &EpochRecord)> = None;
        let mut count = 0u64;
        // The first epoch that binds a cutoff: from there on every epoch must (older
        // writers did not; an edit that drops the field also breaks the next link).
        let mut binding_since: Option<Generation> = None;
        for (g, e) in &chain.epochs {
            if *g != expected_gen {
                return Err(self.broken(
                    "epoch",
                    expected_gen.get(),
                    format!("epoch {expected_gen} is missing (next present: {g})"),
                ));
            }
            let hash = Digest::of(&encode(e)?);
            match (&prev, &chain.checkpoint) {
                (None, Some(cp)) => {
                    if hash != cp.floor_epoch_hash {
                        return Err(self.broken(
                            "epoch",
                            g.get(),
                            "the floor epoch does not match the checkpoint's hash".into(),
                        ));
                    }
                }
                (None, None) => {}
                (Some((p, pe)), _) => {
                    if e.prev_hash.as_ref() != Some(p) {
                        return Err(self.broken(
                            "epoch",
                            g.get(),
                            format!("prev_hash does not match the hash of epoch {}", g.get() - 1),
                        ));
                    }
                    self.check_pair(pe, e, floor, &mut binding_since, chain)?;
                }
            }
            prev = Some((hash, e));
            count += 1;
            expected_gen = g.next(&self.read.run)?;
        }
        let head = chain.head();
        let mut above: Option<LeaseError> = None;
        for (g, (c, _)) in &chain.cutoff_records {
            let Some(e) = chain.epochs.get(g) else {
                // Below the floor cutoffs are not listed; above the head: see below.
                above.get_or_insert_with(|| {
                    self.broken(
                        "epoch",
                        g.get(),
                        format!(
                            "{} exists but {} does not: the newest epochs were deleted",
                            FileRef::Cutoff(*g).path(),
                            FileRef::Epoch(*g).path()
                        ),
                    )
                });
                continue;
            };
            if e.state != EpochState::Active || c.owner_id != e.owner_id {
                return Err(self.broken_cutoff(
                    *g,
                    format!(
                        "names owner {} but epoch {g} is {} by {}",
                        c.owner_id,
                        state_name(e.state),
                        e.owner_id
                    ),
                ));
            }
            if c.superseded_by.get() != g.get().saturating_add(1) {
                return Err(self.broken_cutoff(
                    *g,
                    format!(
                        "says superseded by generation {}, not {}",
                        c.superseded_by,
                        g.get().saturating_add(1)
                    ),
                ));
            }
            if Some(*g) == head {
                above.get_or_insert_with(|| {
                    self.broken(
                        "epoch",
                        g.get().saturating_add(1),
                        format!(
                            "{} says epoch {} superseded it, and {} is missing: the newest epochs were deleted",
                            FileRef::Cutoff(*g).path(),
                            g.get().saturating_add(1),
                            first_missing(Some(*g))
                        ),
                    )
                });
            }
        }
        if let (Some(top), h) = (view.top_generation, head) {
            if h.is_none_or(|h| top > h) {
                above.get_or_insert_with(|| {
                    self.broken(
                        "epoch",
                        top.get(),
                        format!(
                            "events of generation {top} exist but the newest epoch is {}: {} is missing (the newest epochs were deleted)",
                            h.map_or("none".to_string(), |h| h.to_string()),
                            first_missing(h)
                        ),
                    )
                });
            }
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
        Ok((
            Pending {
                report: VerifyReport {
                    epochs: count,
                    events: tail,
                    strays,
                    floor,
                    short_tail,
                    started_at: self.read.started_at,
                    walked: self.read.walked,
                    last: view.last.clone(),
                },
                head,
            },
            above,
        ))
    }

    /// §4's chain rules between epoch `g − 1` (`p`) and `g` (`e`), and the cutoff `e` binds.
    fn check_pair(
        &self,
        p: &EpochRecord,
        e: &EpochRecord,
        floor: Option<Generation>,
        binding_since: &mut Option<Generation>,
        chain: &ChainView,
    ) -> Result<(), LeaseError> {
        let g = e.generation;
        match (&e.retired, p.state) {
            (Some(r), EpochState::Active) if r.owner_id == p.owner_id => {}
            (None, EpochState::Released | EpochState::Retired) => {}
            (Some(r), EpochState::Active) => {
                return Err(self.broken(
                    "epoch",
                    g.get(),
                    format!(
                        "it retired owner {} but epoch {} belongs to {}",
                        r.owner_id, p.generation, p.owner_id
                    ),
                ));
            }
            (retired, state) => {
                return Err(self.broken(
                    "epoch",
                    g.get(),
                    format!(
                        "epoch {} is {} and epoch {g} {} it",
                        p.generation,
                        state_name(state),
                        if retired.is_some() {
                            "says it retired"
                        } else {
                            "did not retire"
                        }
                    ),
                ));
            }
        }
        if e.cutoff_hash.is_some() && binding_since.is_none() {
            *binding_since = Some(g);
        }
        let Some(r) = &p.retired else {
            if e.cutoff_hash.is_some() {
                return Err(self.broken(
                    "epoch",
                    g.get(),
                    format!(
                        "cutoff_hash is set but epoch {} superseded nobody",
                        p.generation
                    ),
                ));
            }
            return Ok(());
        };
        // The cutoff of r was folded into the checkpoint: the floor epoch's hash binds it.
        if floor.is_some_and(|f| r.generation < f) {
            return Ok(());
        }
        let cutoff = FileRef::Cutoff(r.generation).path();
        match (&e.cutoff_hash, chain.cutoff_records.get(&r.generation)) {
            (Some(want), Some((_, have))) if want == have => Ok(()),
            (Some(_), Some(_)) => Err(self.broken(
                "cutoff",
                r.generation.get(),
                format!("{cutoff} was changed: its hash is not the one epoch {g} recorded"),
            )),
            // (The read of the log reports this first, for every reader.)
            (_, None) => Err(removed_cutoff(&self.read.run, r.generation)),
            (None, Some(_)) => match binding_since {
                Some(since) => Err(self.broken(
                    "epoch",
                    g.get(),
                    format!(
                        "epoch {g} does not bind {cutoff} (cutoff_hash is missing; every epoch since {since} has one)"
                    ),
                )),
                None => Ok(()),
            },
        }
    }
}

/// The path of the epoch after `head` (the first one a deletion took).
fn first_missing(head: Option<Generation>) -> String {
    let next = head.map_or(Some(1), |h| h.get().checked_add(1));
    match next.and_then(Generation::new) {
        Some(g) => FileRef::Epoch(g).path(),
        None => "an epoch above the last generation".into(),
    }
}

fn state_name(s: EpochState) -> &'static str {
    match s {
        EpochState::Active => "active",
        EpochState::Released => "released",
        EpochState::Retired => "retired",
    }
}

impl Operation for Verify {
    type Output = VerifyReport;
    fn next(&mut self, input: Option<Response>) -> Step<VerifyReport> {
        match std::mem::replace(&mut self.st, VerifyState::Done) {
            VerifyState::Reading => {
                // Snoop the epochs listing so strays below the floor can be reported.
                if let (ReadState::ListEpochs, Some(Response::Listing(l))) = (&self.read.st, &input)
                {
                    self.all_gens = epochs_of(l.clone());
                }
                let view = match self.read.next(input) {
                    Step::Io(r) => {
                        self.st = VerifyState::Reading;
                        return Step::Io(r);
                    }
                    Step::Done(Err(e)) => return Step::Done(Err(e)),
                    Step::Done(Ok(v)) => v,
                };
                let (pending, above) = step_try!(self.check_view(&view));
                if let Some(e) = above {
                    self.st = VerifyState::Confirm(Box::new(pending), Box::new(e));
                    return Step::Io(Request::List(Dir::Epochs));
                }
                // OQ-8: the checkpoint names the hash of its last event.
                let through = view
                    .chain
                    .checkpoint
                    .as_ref()
                    .and_then(|c| c.through_hash.clone().map(|h| (c.through_sequence, h)));
                match (through, &view.last) {
                    (Some((t, want)), Some((s, have))) if t == s.get() && &want != have => {
                        return Step::Done(Err(self.through_mismatch(t)));
                    }
                    (Some((t, want)), Some((s, _))) if t < s.get() => {
                        if let Some(seq) = Sequence::new(t) {
                            self.st = VerifyState::Through(Box::new(pending), t, want);
                            return Step::Io(Request::Read(FileRef::Event(seq)));
                        }
                    }
                    // Past the tail: `short_tail` reports it.
                    _ => {}
                }
                self.after_through(Box::new(pending))
            }
            VerifyState::Through(pending, t, want) => match input {
                Some(Response::Content(Some(b))) => {
                    if Digest::of(&b) != want {
                        return Step::Done(Err(self.through_mismatch(t)));
                    }
                    self.after_through(pending)
                }
                Some(Response::Content(None)) => {
                    Step::Done(Err(gap(&self.read.run, t, pending.report.events)))
                }
                other => Step::Done(Err(violation("Content", &other))),
            },
            VerifyState::Marks(pending) => {
                let l = step_try!(listing(input));
                self.next_mark(pending, marks_of(l))
            }
            VerifyState::MarkAbove(pending, rest, s) => match input {
                // Appended and marked after this walk counted the log.
                Some(Response::Exists(true)) => self.next_mark(pending, rest),
                Some(Response::Exists(false)) => {
                    let tail = pending.report.last.as_ref().map_or(0, |(l, _)| l.get());
                    Step::Done(Err(mark_past_end(&self.read.run, s, Some(tail))))
                }
                other => Step::Done(Err(violation("Exists", &other))),
            },
            VerifyState::ReadMark(pending, rest, s) => match input {
                Some(Response::Content(Some(b))) => match decode_mark(&self.read.run, s, &b) {
                    Ok(m) => {
                        self.st = VerifyState::MarkEvent(pending, rest, s, m.through_hash);
                        Step::Io(Request::Read(FileRef::Event(s)))
                    }
                    Err(e) => Step::Done(Err(e)),
                },
                // Removed since the listing by the writer of a newer mark.
                Some(Response::Content(None)) => self.next_mark(pending, rest),
                other => Step::Done(Err(violation("Content", &other))),
            },
            VerifyState::MarkEvent(pending, rest, s, want) => match input {
                Some(Response::Content(Some(b))) if Digest::of(&b) == want => {
                    self.next_mark(pending, rest)
                }
                Some(Response::Content(Some(_))) => {
                    Step::Done(Err(mark_mismatch(&self.read.run, s)))
                }
                // The walk read it a moment ago and events are never removed.
                Some(Response::Content(None)) => {
                    Step::Done(Err(gap(&self.read.run, s.get(), pending.report.events)))
                }
                other => Step::Done(Err(violation("Content", &other))),
            },
            VerifyState::ListBeats(pending) => {
                let l = step_try!(listing(input));
                let top = l
                    .into_iter()
                    .filter_map(|f| f.generation_in(Dir::Beats))
                    .max();
                match top {
                    Some(b) if pending.head.is_none_or(|h| b > h) => {
                        let e = self.broken(
                            "epoch",
                            b.get(),
                            format!(
                                "{} exists but the newest epoch is {}: {} is missing (the newest epochs were deleted)",
                                FileRef::Beat(b).path(),
                                pending.head.map_or("none".to_string(), |h| h.to_string()),
                                first_missing(pending.head)
                            ),
                        );
                        self.st = VerifyState::Confirm(pending, Box::new(e));
                        Step::Io(Request::List(Dir::Epochs))
                    }
                    _ => Step::Done(Ok(pending.report)),
                }
            }
            VerifyState::Confirm(pending, e) => {
                let l = step_try!(listing(input));
                let now = epochs_of(l).last().copied();
                if now == pending.head {
                    Step::Done(Err(*e))
                } else {
                    // Someone created an epoch while verify read: the record above the head
                    // is explained, not evidence of a deletion (the next verify sees it all).
                    Step::Done(Ok(pending.report))
                }
            }
            VerifyState::Done => Step::Done(Err(violation("nothing (verify finished)", &input))),
        }
    }
}

impl Verify {
    fn through_mismatch(&self, t: u64) -> LeaseError {
        self.broken(
            "event",
            t,
            format!(
                "event {t} is not the one the checkpoint recorded (through_hash differs): the log was rewritten below the checkpoint"
            ),
        )
    }
}
