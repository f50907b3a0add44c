//! Compaction: fold old epochs, cutoffs, heartbeats and intents into a checkpoint so a run
//! that changes owner many times stays small, keeping the chain verifiable from the floor.

use super::common::{
    Cut, Finalize, Tail, decode_checkpoint, decode_cutoff, decode_epoch, epochs_of,
    newest_checkpoint, numbers_of,
};
use super::log::{ChainView, decode_event, judge_event};
use super::{Operation, Request, Response, Step, listing, step_try, sub_step, violation};
use crate::canonical::encode;
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, Identity, RunId, Sequence};
use crate::layout::{Dir, FileRef};
use crate::records::Checkpoint;
use crate::time::Timestamp;

/// Arguments of a prune.
#[derive(Debug, Clone)]
pub struct PruneParams {
    /// The run.
    pub run_id: RunId,
    /// How many of the newest epochs to keep (at least 2).
    pub keep: u64,
    /// Who prunes (recorded in the checkpoint and in cutoffs it finalizes).
    pub by: Identity,
    /// Wall time.
    pub now: Timestamp,
}

/// When a release compacts the lease (PROTOCOL §7.3 step 7): once the chain has grown by
/// `every` generations since the last checkpoint, prune keeping the newest `keep`.
///
/// The rule ([`CompactPolicy::is_due`]): with the newest checkpoint's floor `F0` (1 if
/// none) and the release epoch `H`, due when `H − F0 ≥ every + keep − 1`, that is when the
/// chain grew by `every` generations since the compaction that kept `keep` and made `F0`.
/// `lease/` then holds at most about `every + keep` generations' records after a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactPolicy {
    /// Compact once the chain grew by this many generations since the last checkpoint.
    pub every: u64,
    /// How many of the newest generations a compaction keeps (below 2 is raised to 2, as
    /// [`Prune`] does).
    pub keep: u64,
}

impl CompactPolicy {
    /// Every 16 generations (eight claim+release cycles), keeping the newest 4: `status`,
    /// `verify` and the seal/floor of the next owner read at most the last two
    /// (docs/DECISIONS.md, 2026-12-04).
    pub const DEFAULT: CompactPolicy = CompactPolicy { every: 16, keep: 4 };

    /// Whether a chain whose newest checkpoint is at `floor` (generation 1 when there is
    /// none) and whose head is `head` is due for compaction. A head below the floor (a
    /// checkpoint written by hand) is never due.
    pub fn is_due(&self, floor: Generation, head: Generation) -> bool {
        let span = self
            .every
            .saturating_add(self.keep.max(2))
            .saturating_sub(1);
        head.get().saturating_sub(floor.get()) >= span
    }
}

impl Default for CompactPolicy {
    fn default() -> CompactPolicy {
        CompactPolicy::DEFAULT
    }
}

/// What a prune did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneReport {
    /// The new floor, or `None` when there was nothing to compact (no new checkpoint).
    pub floor: Option<Generation>,
    /// Files removed: those below the new floor, or, with nothing to compact, the strays
    /// left below the existing checkpoint's floor (what `verify` reports as `strays`).
    pub removed: u64,
}

/// Compact the lease folder.
///
/// Steps: read the newest checkpoint (old floor F0); list epochs (head H); F = H − keep + 1;
/// read epochs F0..=F and cutoffs below F; finalize any pending cutoff below F; take the
/// log tail S; judge the events (S0, S] of generations below F; create checkpoint F
/// exclusively; then remove epochs, beats, cutoffs and intents below F and older
/// checkpoints. Every crash point leaves either the old files (valid) or the checkpoint
/// plus some old files (consistent: the checkpoint was derived from them).
///
/// **Nothing to compact, strays below the floor** (PROTOCOL §7.10 step 2; issue #28:
/// `doctor` reported `STRAY_EPOCHS` and named prune, which said "nothing to prune" and
/// left them): when F ≤ F0 but epochs below F0 are listed (a claimer that lost to a
/// compaction, or a prune that crashed in its removals), the prune removes what is below
/// the existing floor instead. Order: read checkpoint F0 (step 1), list epochs (step 2),
/// read the head epoch (an invalid head refuses, as for a compaction), `SyncDir
/// (checkpoints)` (F0 was read, not created: it becomes durable before anything it folds
/// is removed, §7.0 SYNC), then step 9's listings and `Remove(NoFsync)` of every record
/// below F0, in name order. A crash at any point leaves the durable checkpoint and some
/// of the files below it, which no reader uses; a lost removal is a stray again, removed
/// by the next prune.
#[derive(Debug, Clone)]
pub struct Prune {
    p: PruneParams,
    st: PruneState,
    chain: ChainView,
    floor: Generation,
    gens: Vec<Generation>,
    to_remove: Vec<FileRef>,
    removed: u64,
    tail: u64,
    not_authoritative: Vec<u64>,
    /// The first event read whose generation is at or above the new floor (left unjudged:
    /// the checkpoint's `unjudged_from`).
    unjudged_from: Option<u64>,
    prev_hash: Option<Digest>,
    /// Hash of event `tail` (the checkpoint's `through_hash`, OQ-8).
    through_hash: Option<Digest>,
    restarts: u32,
    head: Option<Generation>,
    /// Nothing to compact: only the strays below the existing floor are removed.
    strays_only: bool,
}

#[derive(Debug, Clone)]
enum PruneState {
    Start,
    ListCheckpoints,
    ReadCheckpoint(Generation),
    ListEpochs,
    CheckHead,
    /// `SyncDir(checkpoints)` before removing below a checkpoint this prune read.
    SyncFloor,
    ReadEpoch(usize),
    ListCutoffs,
    ReadCutoff(Vec<Generation>, usize),
    Finalize(Vec<(Generation, Identity, Generation)>, Finalize),
    Tail(Tail),
    ReadEvent(u64),
    /// No event to judge since the last checkpoint: read event `tail` for its hash only.
    ReadThrough,
    Create,
    List(usize),
    Remove(usize),
    Done,
}

const REMOVE_DIRS: [Dir; 5] = [
    Dir::Epochs,
    Dir::Beats,
    Dir::Cutoffs,
    Dir::Intents,
    Dir::Checkpoints,
];

impl Prune {
    /// Start a prune; `keep` below 2 is raised to 2.
    pub fn new(p: PruneParams) -> Prune {
        Prune {
            p: PruneParams {
                keep: p.keep.max(2),
                ..p
            },
            st: PruneState::Start,
            chain: ChainView::default(),
            floor: Generation::FIRST,
            gens: Vec::new(),
            to_remove: Vec::new(),
            removed: 0,
            tail: 0,
            not_authoritative: Vec::new(),
            unjudged_from: None,
            prev_hash: None,
            through_hash: None,
            restarts: 0,
            head: None,
            strays_only: false,
        }
    }

    fn nothing(&self) -> Step<PruneReport> {
        Step::Done(Ok(PruneReport {
            floor: None,
            removed: 0,
        }))
    }

    fn start_finalize(
        &mut self,
        mut pending: Vec<(Generation, Identity, Generation)>,
    ) -> Option<PruneState> {
        let (g, owner, by) = pending.pop()?;
        let f = Finalize::new(
            self.p.run_id.clone(),
            g,
            owner,
            by,
            self.p.by.clone(),
            self.p.now,
        )
        .lazy();
        Some(PruneState::Finalize(pending, f))
    }
}

impl Operation for Prune {
    type Output = PruneReport;
    fn next(&mut self, mut input: Option<Response>) -> Step<PruneReport> {
        let run = self.p.run_id.clone();
        loop {
            match std::mem::replace(&mut self.st, PruneState::Done) {
                PruneState::Start => {
                    self.st = PruneState::ListCheckpoints;
                    return Step::Io(Request::List(Dir::Checkpoints));
                }
                PruneState::ListCheckpoints => {
                    let l = step_try!(listing(input.take()));
                    let top = newest_checkpoint(l);
                    if let Some(g) = top {
                        self.st = PruneState::ReadCheckpoint(g);
                        return Step::Io(Request::Read(FileRef::Checkpoint(g)));
                    }
                    self.st = PruneState::ListEpochs;
                    return Step::Io(Request::List(Dir::Epochs));
                }
                PruneState::ReadCheckpoint(g) => {
                    match input.take() {
                        Some(Response::Content(Some(b))) => match decode_checkpoint(&run, g, &b) {
                            Ok(cp) => {
                                self.not_authoritative = cp.not_authoritative.clone();
                                self.chain.checkpoint = Some(cp);
                            }
                            Err(e) => return Step::Done(Err(e)),
                        },
                        Some(Response::Content(None)) => {
                            self.st = PruneState::ListCheckpoints;
                            return Step::Io(Request::List(Dir::Checkpoints));
                        }
                        other => return Step::Done(Err(violation("Content", &other))),
                    }
                    self.st = PruneState::ListEpochs;
                    return Step::Io(Request::List(Dir::Epochs));
                }
                PruneState::ListEpochs => {
                    let l = step_try!(listing(input.take()));
                    let old_floor = self
                        .chain
                        .checkpoint
                        .as_ref()
                        .map_or(Generation::FIRST, |c| c.floor_generation);
                    let gens = epochs_of(l);
                    let Some(&head) = gens.last() else {
                        return self.nothing();
                    };
                    self.head = Some(head);
                    let floor = head
                        .get()
                        .checked_sub(self.p.keep - 1)
                        // mutant prune_floor_one_too_high: the floor may reach the head (§7.10, I2).
                        .map(|f| {
                            if crate::mutant::mutant("prune_floor_one_too_high") {
                                f + 1
                            } else {
                                f
                            }
                        })
                        .and_then(Generation::new)
                        .filter(|f| *f > old_floor);
                    let Some(floor) = floor else {
                        // Nothing to compact; strays below the existing floor are removed
                        // (see the type's docs), after the head is checked.
                        let strays = self.chain.checkpoint.is_some()
                            && gens.first().is_some_and(|g| *g < old_floor);
                        if !strays {
                            return self.nothing();
                        }
                        self.strays_only = true;
                        self.floor = old_floor;
                        self.st = PruneState::CheckHead;
                        return Step::Io(Request::Read(FileRef::Epoch(head)));
                    };
                    self.floor = floor;
                    self.gens = gens
                        .into_iter()
                        .filter(|g| *g >= old_floor && *g <= floor)
                        .collect();
                    if self.gens.first() != Some(&old_floor) || self.gens.last() != Some(&floor) {
                        // Either a concurrent prune moved the floor since we read the
                        // checkpoint (look again), or epochs are really missing.
                        if self.restarts < 3 {
                            self.restarts += 1;
                            self.chain = ChainView::default();
                            self.not_authoritative.clear();
                            self.unjudged_from = None;
                            self.st = PruneState::ListCheckpoints;
                            return Step::Io(Request::List(Dir::Checkpoints));
                        }
                        return Step::Done(Err(LeaseError::ChainBroken {
                            run: run.to_string(),
                            chain: "epoch",
                            at: old_floor.get(),
                            detail: format!(
                                "epochs {old_floor}..={floor} are not all present; refusing to compact"
                            ),
                        }));
                    }
                    // Never compact while the head record is invalid: an operator repairing
                    // it may need the history (bad input is reported, never worked around).
                    self.st = PruneState::CheckHead;
                    return Step::Io(Request::Read(FileRef::Epoch(head)));
                }
                PruneState::CheckHead => {
                    let head = self.head.unwrap_or(Generation::FIRST);
                    match input.take() {
                        Some(Response::Content(Some(b))) => {
                            if let Err(e) = decode_epoch(&run, head, &b) {
                                return Step::Done(Err(e));
                            }
                        }
                        Some(Response::Content(None)) => {
                            return Step::Done(Err(LeaseError::ConcurrentChange {
                                run: run.to_string(),
                                detail: format!("head epoch {head} vanished"),
                            }));
                        }
                        other => return Step::Done(Err(violation("Content", &other))),
                    }
                    if self.strays_only {
                        self.st = PruneState::SyncFloor;
                        return Step::Io(Request::SyncDir(Dir::Checkpoints));
                    }
                    self.st = PruneState::ReadEpoch(0);
                    return Step::Io(Request::Read(FileRef::Epoch(self.gens[0])));
                }
                PruneState::SyncFloor => {
                    match input.take() {
                        Some(Response::Done) => {}
                        other => return Step::Done(Err(violation("Done", &other))),
                    }
                    self.st = PruneState::List(0);
                    return Step::Io(Request::List(REMOVE_DIRS[0]));
                }
                PruneState::ReadEpoch(i) => {
                    let g = self.gens[i];
                    match input.take() {
                        Some(Response::Content(Some(b))) => match decode_epoch(&run, g, &b) {
                            Ok(e) => {
                                if g == self.floor {
                                    self.prev_hash = Some(Digest::of(&b));
                                }
                                self.chain.epochs.insert(g, e);
                            }
                            Err(e) => return Step::Done(Err(e)),
                        },
                        Some(Response::Content(None)) => {
                            return Step::Done(Err(LeaseError::ConcurrentChange {
                                run: run.to_string(),
                                detail: format!(
                                    "epoch {g} vanished while compacting (another prune?)"
                                ),
                            }));
                        }
                        other => return Step::Done(Err(violation("Content", &other))),
                    }
                    if let Some(&n) = self.gens.get(i + 1) {
                        self.st = PruneState::ReadEpoch(i + 1);
                        return Step::Io(Request::Read(FileRef::Epoch(n)));
                    }
                    self.st = PruneState::ListCutoffs;
                    return Step::Io(Request::List(Dir::Cutoffs));
                }
                PruneState::ListCutoffs => {
                    let l = step_try!(listing(input.take()));
                    let old_floor = self.gens[0];
                    let mut gens = numbers_of(l, |f| f.generation_in(Dir::Cutoffs));
                    gens.retain(|g| *g >= old_floor && *g < self.floor);
                    if gens.is_empty() {
                        self.st = PruneState::ReadCutoff(gens, 0);
                        input = None;
                        continue;
                    }
                    let first = gens[0];
                    self.st = PruneState::ReadCutoff(gens, 0);
                    return Step::Io(Request::Read(FileRef::Cutoff(first)));
                }
                PruneState::ReadCutoff(gens, i) => {
                    if i < gens.len() {
                        let g = gens[i];
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
                        if let Some(&n) = gens.get(i + 1) {
                            self.st = PruneState::ReadCutoff(gens, i + 1);
                            return Step::Io(Request::Read(FileRef::Cutoff(n)));
                        }
                    }
                    let floor = self.floor;
                    let pending: Vec<_> = self
                        .chain
                        .pending_cutoffs()
                        .into_iter()
                        .filter(|(g, _, _)| *g < floor)
                        .collect();
                    match self.start_finalize(pending) {
                        Some(st) => self.st = st,
                        None => self.st = PruneState::Tail(Tail::new(0)),
                    }
                    input = None;
                }
                PruneState::Finalize(pending, f) => {
                    let (pending, v) =
                        sub_step!(self.st, PruneState::Finalize, [pending], f, input.take());
                    match v {
                        Cut::Record(c) => {
                            self.chain.cutoffs.insert(c.generation, c.events_through);
                        }
                        Cut::Compacted(_) => {
                            return Step::Done(Err(LeaseError::ConcurrentChange {
                                run: run.to_string(),
                                detail: "another prune created a newer checkpoint".into(),
                            }));
                        }
                    }
                    match self.start_finalize(pending) {
                        Some(st) => self.st = st,
                        None => self.st = PruneState::Tail(Tail::new(0)),
                    }
                }
                PruneState::Tail(t) => {
                    let tail = sub_step!(self.st, PruneState::Tail, [], t, input.take());
                    self.tail = tail;
                    // From the first event the old checkpoint left unjudged (a generation
                    // then at or above its floor, which this floor may pass), else from the
                    // first event after it.
                    let from = self.chain.checkpoint.as_ref().map_or(1, |c| {
                        // mutant prune_skips_unjudged: only the events after the old tail
                        // are read (§7.10 step 7, I9).
                        if crate::mutant::mutant("prune_skips_unjudged") {
                            return c.through_sequence + 1;
                        }
                        c.unjudged_from
                            .unwrap_or(c.through_sequence + 1)
                            .min(c.through_sequence + 1)
                    });
                    if from > tail {
                        let known = self.chain.checkpoint.as_ref().and_then(|c| {
                            c.through_hash
                                .clone()
                                .filter(|_| c.through_sequence == tail)
                        });
                        match (tail, known) {
                            (0, _) => self.through_hash = None,
                            (_, Some(h)) => self.through_hash = Some(h),
                            (t, None) => {
                                self.st = PruneState::ReadThrough;
                                return Step::Io(Request::Read(FileRef::Event(
                                    Sequence::new(t).unwrap_or(Sequence::FIRST),
                                )));
                            }
                        }
                        self.st = PruneState::Create;
                        continue;
                    }
                    self.st = PruneState::ReadEvent(from);
                    return Step::Io(Request::Read(FileRef::Event(
                        Sequence::new(from).unwrap_or(Sequence::FIRST),
                    )));
                }
                PruneState::ReadEvent(s) => {
                    let seq = Sequence::new(s).unwrap_or(Sequence::FIRST);
                    let ev = match input.take() {
                        Some(Response::Content(Some(b))) => match decode_event(&run, seq, &b) {
                            Ok(e) => {
                                if s == self.tail {
                                    self.through_hash = Some(Digest::of(&b));
                                }
                                e
                            }
                            Err(e) => return Step::Done(Err(e)),
                        },
                        Some(Response::Content(None)) => {
                            return Step::Done(Err(LeaseError::EventLogGap {
                                run: run.to_string(),
                                missing: s,
                                later: self.tail,
                            }));
                        }
                        other => return Step::Done(Err(violation("Content", &other))),
                    };
                    let old = self.chain.checkpoint.as_ref();
                    let judged_before = old.is_some_and(|c| {
                        s <= c.through_sequence && ev.generation < c.floor_generation
                    });
                    if ev.generation >= self.floor {
                        // Kept with its epoch and cutoff: judged by a later prune.
                        self.unjudged_from.get_or_insert(s);
                    } else if judged_before {
                        // The old checkpoint's verdict stands (carried in
                        // `not_authoritative`); its cutoff is gone.
                    } else {
                        match judge_event(&ev, &self.chain) {
                            a if a.counts() => {}
                            // A cutoff below the floor is missing (a concurrent prune folded it)
                            // or an epoch vanished: never guess "does not count".
                            super::Standing::Pending | super::Standing::UnknownGeneration
                                if ev.generation
                                    >= self
                                        .chain
                                        .checkpoint
                                        .as_ref()
                                        .map_or(Generation::FIRST, |c| c.floor_generation) =>
                            {
                                return Step::Done(Err(LeaseError::ConcurrentChange {
                                    run: run.to_string(),
                                    detail: format!(
                                        "the chain changed while judging event {s} (another prune?)"
                                    ),
                                }));
                            }
                            _ => self.not_authoritative.push(s),
                        }
                    }
                    if s < self.tail {
                        self.st = PruneState::ReadEvent(s + 1);
                        return Step::Io(Request::Read(FileRef::Event(
                            Sequence::new(s + 1).unwrap_or(Sequence::FIRST),
                        )));
                    }
                    self.st = PruneState::Create;
                }
                PruneState::ReadThrough => match input.take() {
                    Some(Response::Content(Some(b))) => {
                        let seq = Sequence::new(self.tail).unwrap_or(Sequence::FIRST);
                        if let Err(e) = decode_event(&run, seq, &b) {
                            return Step::Done(Err(e));
                        }
                        self.through_hash = Some(Digest::of(&b));
                        self.st = PruneState::Create;
                    }
                    Some(Response::Content(None)) => {
                        return Step::Done(Err(LeaseError::EventLogGap {
                            run: run.to_string(),
                            missing: self.tail,
                            later: self.tail,
                        }));
                    }
                    other => return Step::Done(Err(violation("Content", &other))),
                },
                PruneState::Create => {
                    if input.is_none() {
                        let cp = Checkpoint {
                            run_id: run.clone(),
                            floor_generation: self.floor,
                            floor_epoch_hash: match self.prev_hash.clone() {
                                Some(h) => h,
                                None => {
                                    return Step::Done(Err(violation("floor epoch read", &None)));
                                }
                            },
                            through_sequence: self.tail,
                            through_hash: self.through_hash.clone(),
                            // Events re-judged below the old checkpoint's tail come after
                            // its carried list: keep it strictly increasing.
                            not_authoritative: {
                                let mut n = self.not_authoritative.clone();
                                n.sort_unstable();
                                n.dedup();
                                n
                            },
                            unjudged_from: self.unjudged_from,
                            created_at: self.p.now,
                            created_by: self.p.by.clone(),
                        };
                        let bytes = step_try!(encode(&cp));
                        self.st = PruneState::Create;
                        return Step::Io(Request::CreateExclusive(
                            FileRef::Checkpoint(self.floor),
                            bytes,
                        ));
                    }
                    match input.take() {
                        Some(Response::Created) => {}
                        // Another prune's checkpoint F: it may be linked but not yet
                        // durable (its creator fsyncs the folder after the link), and
                        // removing what it folds before it is durable could leave neither
                        // after a power loss. Sync it first (§7.0 SYNC).
                        Some(Response::AlreadyExists) => {
                            self.st = PruneState::SyncFloor;
                            return Step::Io(Request::SyncDir(Dir::Checkpoints));
                        }
                        other => {
                            return Step::Done(Err(violation("Created/AlreadyExists", &other)));
                        }
                    }
                    self.st = PruneState::List(0);
                    return Step::Io(Request::List(REMOVE_DIRS[0]));
                }
                PruneState::List(i) => {
                    let l = step_try!(listing(input.take()));
                    let floor = self.floor;
                    self.to_remove.extend(l.into_iter().filter(|f| match *f {
                        FileRef::Epoch(g)
                        | FileRef::Beat(g)
                        | FileRef::Cutoff(g)
                        | FileRef::Checkpoint(g) => g < floor,
                        FileRef::Intent { generation, .. } => generation <= floor,
                        _ => false,
                    }));
                    if let Some(&d) = REMOVE_DIRS.get(i + 1) {
                        self.st = PruneState::List(i + 1);
                        return Step::Io(Request::List(d));
                    }
                    self.to_remove.sort();
                    self.st = PruneState::Remove(0);
                    input = None;
                }
                PruneState::Remove(i) => {
                    if i > 0 {
                        match input.take() {
                            Some(Response::Done) => self.removed += 1,
                            other => return Step::Done(Err(violation("Done", &other))),
                        }
                    }
                    if let Some(&f) = self.to_remove.get(i) {
                        self.st = PruneState::Remove(i + 1);
                        // Removed files are below the checkpoint floor: if a removal is lost
                        // in a crash the file is ignored and removed again by the next prune.
                        return Step::Io(Request::Remove(f, super::Durability::NoFsync));
                    }
                    return Step::Done(Ok(PruneReport {
                        floor: (!self.strays_only).then_some(self.floor),
                        removed: self.removed,
                    }));
                }
                PruneState::Done => {
                    return Step::Done(Err(violation("nothing (operation finished)", &input)));
                }
            }
        }
    }
}
