//! Observing the head of the epoch chain, judging freshness and death, and the small
//! sub-operations every operation shares (finalize a cutoff, re-check supersession, find
//! the log tail).

use super::{Operation, Request, Response, Step, violation};
use crate::canonical::{decode_for, encode};
use crate::error::{HeldBy, LeaseError};
use crate::ids::{Digest, Generation, Identity, RunId, Sequence};
use crate::layout::{Dir, FileRef};
use crate::records::{EpochRecord, EpochState, HeartbeatRecord, Holder, RetirementRecord};
use crate::time::Timestamp;

/// The authoritative (highest) epoch with its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The epoch record.
    pub epoch: EpochRecord,
    /// SHA-256 of its canonical bytes (the next epoch's `prev_hash`).
    pub hash: Digest,
    /// Its heartbeat record, if any was written (active epochs only).
    pub beat: Option<HeartbeatRecord>,
}

impl Head {
    /// The head's generation.
    pub fn generation(&self) -> Generation {
        self.epoch.generation
    }
    /// Last heartbeat time: the beat's, else the claim time.
    pub fn heartbeat_at(&self) -> Timestamp {
        self.beat
            .as_ref()
            .map_or(self.epoch.claimed_at, |b| b.heartbeat_at)
    }
    /// Heartbeat counter: 0 when no heartbeat was written yet.
    pub fn heartbeat_count(&self) -> u64 {
        self.beat.as_ref().map_or(0, |b| b.count)
    }
    /// Whether the head is an active owner.
    pub fn is_active(&self) -> bool {
        self.epoch.state == EpochState::Active
    }
    /// Describe the holder for messages.
    pub fn held_by(&self) -> HeldBy {
        HeldBy {
            generation: self.epoch.generation,
            owner_id: self.epoch.owner_id.to_string(),
            host: self.epoch.holder.host.to_string(),
            pid: self.epoch.holder.pid,
            since: self.epoch.claimed_at,
            heartbeat_at: self.heartbeat_at(),
            heartbeat_count: self.heartbeat_count(),
        }
    }
}

/// Wall-clock freshness of an active head, as seen by an observer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Heartbeat age within `stale_after` (or in the future: clock skew counts as fresh).
    Fresh {
        /// Age in ms (negative when the heartbeat is ahead of the observer's clock).
        age_ms: i64,
    },
    /// Heartbeat older than `stale_after`.
    Stale {
        /// Age in ms.
        age_ms: i64,
    },
}

/// Judge the freshness of `head` at the observer's wall time `now`, using the
/// `stale_after` of the policy the owner recorded in its epoch.
pub fn freshness(head: &Head, now: Timestamp) -> Freshness {
    let age_ms = now.millis_since(head.heartbeat_at());
    let stale_after = head.epoch.policy.stale_after_ms();
    if age_ms > 0 && age_ms as u64 > stale_after {
        Freshness::Stale { age_ms }
    } else {
        Freshness::Fresh { age_ms }
    }
}

/// What the observer knows about a recorded process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// No process with that pid exists (in the observer's pid namespace).
    Gone,
    /// A process with that pid exists, with this start time.
    Running {
        /// Its start time in clock ticks since boot.
        start_time: u64,
    },
    /// Could not tell (permission, no /proc).
    Unknown,
}

/// What the observer knows about the run's kernel owner lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerLock {
    /// The observer could take it (so no live process holds it).
    Free,
    /// Some process holds it.
    Held,
    /// Could not tell.
    Unknown,
}

/// Liveness evidence gathered by an adapter about a [`Holder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivenessEvidence {
    /// The observer's own boot id.
    pub observer_boot_id: Identity,
    /// The recorded pid, as seen by the observer.
    pub process: ProcessState,
    /// The run's kernel owner lock.
    pub owner_lock: OwnerLock,
}

/// Is the holder definitely dead? Only when all of: the observer is on the same boot
/// (same boot id), the recorded process is gone or its pid now has another start time,
/// and the kernel owner lock is free. `Err` says which piece is missing.
pub fn definitely_dead(holder: &Holder, ev: &LivenessEvidence) -> Result<(), String> {
    if ev.observer_boot_id != holder.boot_id {
        return Err(format!(
            "it ran on boot {} (host {}) and this observer is on boot {}: liveness cannot be judged from here; wait for staleness and take over",
            holder.boot_id, holder.host, ev.observer_boot_id
        ));
    }
    match ev.process {
        ProcessState::Gone => {}
        ProcessState::Running { start_time } if start_time != holder.start_time => {}
        ProcessState::Running { .. } => {
            return Err(format!(
                "process {} with the recorded start time {} is alive",
                holder.pid, holder.start_time
            ));
        }
        ProcessState::Unknown => return Err("the process state cannot be read".into()),
    }
    match ev.owner_lock {
        OwnerLock::Free => Ok(()),
        OwnerLock::Held => Err("the kernel owner lock is still held".into()),
        OwnerLock::Unknown => Err("the kernel owner lock cannot be checked".into()),
    }
}

/// Sub-operation: list epochs, read the highest and its heartbeat.
#[derive(Debug, Clone)]
pub(crate) struct Observe {
    run: RunId,
    st: ObserveState,
    beat: bool,
    restarts: u32,
}

#[derive(Debug, Clone)]
enum ObserveState {
    Start,
    Listed,
    ReadEpoch(Generation),
    ReadBeat(Box<(EpochRecord, Digest)>),
}

/// The result of [`Observe`].
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    /// The head, if any epoch exists.
    pub head: Option<Head>,
}

impl Observe {
    pub(crate) fn new(run: RunId) -> Observe {
        Observe {
            run,
            st: ObserveState::Start,
            beat: true,
            restarts: 0,
        }
    }

    /// Do not read the head's heartbeat record (`Head::beat` stays `None`).
    pub(crate) fn without_beat(mut self) -> Observe {
        self.beat = false;
        self
    }
}

pub(crate) fn epochs_of(listing: Vec<FileRef>) -> Vec<Generation> {
    let mut v: Vec<Generation> = listing
        .into_iter()
        .filter_map(|f| match f {
            FileRef::Epoch(g) => Some(g),
            _ => None,
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The floor generation of the newest checkpoint in a listing of `lease/checkpoints`.
pub(crate) fn newest_checkpoint(listing: Vec<FileRef>) -> Option<Generation> {
    listing
        .into_iter()
        .filter_map(|f| match f {
            FileRef::Checkpoint(g) => Some(g),
            _ => None,
        })
        .max()
}

pub(crate) fn decode_epoch(
    run: &RunId,
    g: Generation,
    bytes: &[u8],
) -> Result<EpochRecord, LeaseError> {
    let file = FileRef::Epoch(g).path();
    let rec: EpochRecord = decode_for(run, bytes).map_err(|e| e.in_file(&file))?;
    if rec.generation != g {
        return Err(LeaseError::RecordInvalid {
            run: run.to_string(),
            kind: crate::error::RecordKind::Epoch,
            file: Some(file),
            detail: format!(
                "file name says generation {g}, content says {}",
                rec.generation
            ),
        });
    }
    Ok(rec)
}

impl Operation for Observe {
    type Output = Observed;
    fn next(&mut self, input: Option<Response>) -> Step<Observed> {
        match std::mem::replace(&mut self.st, ObserveState::Start) {
            ObserveState::Start => {
                self.st = ObserveState::Listed;
                Step::Io(Request::List(Dir::Epochs))
            }
            ObserveState::Listed => {
                let Some(Response::Listing(l)) = input else {
                    return Step::Done(Err(violation("Listing", &input)));
                };
                match epochs_of(l).last() {
                    None => Step::Done(Ok(Observed { head: None })),
                    Some(&h) => {
                        self.st = ObserveState::ReadEpoch(h);
                        Step::Io(Request::Read(FileRef::Epoch(h)))
                    }
                }
            }
            ObserveState::ReadEpoch(h) => {
                let bytes = match input {
                    Some(Response::Content(Some(b))) => b,
                    Some(Response::Content(None)) => {
                        // Listed a moment ago and gone now: epochs are only removed below a
                        // checkpoint floor, never the head, so this is concurrent compaction
                        // of a stray or outside interference. Start over, a bounded number of
                        // times.
                        self.restarts += 1;
                        if self.restarts > 8 {
                            return Step::Done(Err(LeaseError::ConcurrentChange {
                                run: self.run.to_string(),
                                detail: format!(
                                    "epoch {h} keeps vanishing between listing and reading"
                                ),
                            }));
                        }
                        self.st = ObserveState::Listed;
                        return Step::Io(Request::List(Dir::Epochs));
                    }
                    other => return Step::Done(Err(violation("Content", &other))),
                };
                let epoch = match decode_epoch(&self.run, h, &bytes) {
                    Ok(e) => e,
                    Err(e) => return Step::Done(Err(e)),
                };
                let hash = Digest::of(&bytes);
                if epoch.state == EpochState::Active && self.beat {
                    self.st = ObserveState::ReadBeat(Box::new((epoch, hash)));
                    Step::Io(Request::Read(FileRef::Beat(h)))
                } else {
                    Step::Done(Ok(Observed {
                        head: Some(Head {
                            epoch,
                            hash,
                            beat: None,
                        }),
                    }))
                }
            }
            ObserveState::ReadBeat(b) => {
                let (epoch, hash) = *b;
                let beat = match input {
                    Some(Response::Content(None)) => None,
                    Some(Response::Content(Some(bytes))) => {
                        match decode_beat(&self.run, &epoch, &bytes) {
                            Ok(b) => Some(b),
                            Err(e) => return Step::Done(Err(e)),
                        }
                    }
                    other => return Step::Done(Err(violation("Content", &other))),
                };
                Step::Done(Ok(Observed {
                    head: Some(Head { epoch, hash, beat }),
                }))
            }
        }
    }
}

pub(crate) fn decode_beat(
    run: &RunId,
    epoch: &EpochRecord,
    bytes: &[u8],
) -> Result<HeartbeatRecord, LeaseError> {
    let file = FileRef::Beat(epoch.generation).path();
    let beat: HeartbeatRecord = decode_for(run, bytes).map_err(|e| e.in_file(&file))?;
    if beat.generation != epoch.generation || beat.owner_id != epoch.owner_id {
        return Err(LeaseError::RecordInvalid {
            run: run.to_string(),
            kind: crate::error::RecordKind::Heartbeat,
            file: Some(file),
            detail: format!(
                "heartbeat of generation {} owner {} does not belong to epoch {} owner {}",
                beat.generation, beat.owner_id, epoch.generation, epoch.owner_id
            ),
        });
    }
    Ok(beat)
}

/// Sub-operation: "is any generation above `mine`?" from a listing (never a stat of
/// `mine + 1`, which compaction could make miss a newer one).
#[derive(Debug, Clone)]
pub(crate) struct Recheck {
    mine: Generation,
    asked: bool,
}

impl Recheck {
    pub(crate) fn new(mine: Generation) -> Recheck {
        Recheck { mine, asked: false }
    }
}

impl Operation for Recheck {
    /// `Some(highest)` when superseded.
    type Output = Option<Generation>;
    fn next(&mut self, input: Option<Response>) -> Step<Option<Generation>> {
        if !self.asked {
            self.asked = true;
            return Step::Io(Request::List(Dir::Epochs));
        }
        match input {
            Some(Response::Listing(l)) => {
                let top = epochs_of(l).last().copied();
                Step::Done(Ok(top.filter(|&t| t > self.mine)))
            }
            other => Step::Done(Err(violation("Listing", &other))),
        }
    }
}

/// Sub-operation: find the last sequence of the gap-free event log with `Exists` probes:
/// gallop up from a known-present hint, then binary search. O(log n) requests.
#[derive(Debug, Clone)]
pub(crate) struct Tail {
    /// Highest sequence known to exist (0 = none).
    lo: u64,
    /// Lowest sequence known to be absent, once found.
    hi: Option<u64>,
    step: u64,
    probing: u64,
}

impl Tail {
    /// `hint`: a sequence the caller knows exists (0 for none).
    pub(crate) fn new(hint: u64) -> Tail {
        Tail {
            lo: hint,
            hi: None,
            step: 1,
            probing: 0,
        }
    }

    fn probe(&mut self) -> Step<u64> {
        let candidate = match self.hi {
            None => self.lo.saturating_add(self.step),
            Some(hi) => {
                if hi - self.lo <= 1 {
                    return Step::Done(Ok(self.lo));
                }
                self.lo + (hi - self.lo) / 2
            }
        };
        match Sequence::new(candidate) {
            Some(s) if candidate > self.lo => {
                self.probing = candidate;
                Step::Io(Request::Exists(FileRef::Event(s)))
            }
            _ => Step::Done(Ok(self.lo)),
        }
    }
}

impl Operation for Tail {
    type Output = u64;
    fn next(&mut self, input: Option<Response>) -> Step<u64> {
        match input {
            None => self.probe(),
            Some(Response::Exists(true)) => {
                self.lo = self.probing;
                if self.hi.is_none() {
                    self.step = self.step.saturating_mul(2);
                }
                self.probe()
            }
            Some(Response::Exists(false)) => {
                self.hi = Some(self.probing);
                self.probe()
            }
            other => Step::Done(Err(violation("Exists", &other))),
        }
    }
}

/// Sub-operation: finalize the cutoff of a superseded active generation (rule 1 and 2 of
/// ARCHITECTURE.md §3): only after the superseding generation exists, take the log tail at
/// this moment and create the retirement record exclusively; the first finalizer wins and
/// everyone else reads its value.
#[derive(Debug, Clone)]
pub(crate) struct Finalize {
    run: RunId,
    generation: Generation,
    owner_id: Identity,
    superseded_by: Generation,
    by: Identity,
    now: Timestamp,
    lazy: bool,
    st: FinalizeState,
}

#[derive(Debug, Clone)]
enum FinalizeState {
    Start,
    /// Lazy finalization: read first, create only if missing.
    Checking,
    /// The cutoff is missing: is the generation below a checkpoint floor (compacted)?
    ListCheckpoints,
    ReadCheckpoint(Generation),
    Tail(Tail),
    /// Lazy only: the superseding epoch this finalizer saw was created by someone else
    /// and may not be durable yet; `lease/epochs/` is fsynced before the cutoff is created
    /// (PROTOCOL §7.0 SYNC, OQ-1 hardening), so a cutoff never outlives its successor.
    SyncEpochs(Box<RetirementRecord>, Vec<u8>),
    Creating(Box<RetirementRecord>),
    Reading,
    /// A cutoff or checkpoint this actor *read* (someone else created it): its folder is
    /// being fsynced before the answer is given (PROTOCOL §7.0 SYNC).
    Syncing(Box<Cut>),
}

impl Finalize {
    pub(crate) fn new(
        run: RunId,
        generation: Generation,
        owner_id: Identity,
        superseded_by: Generation,
        by: Identity,
        now: Timestamp,
    ) -> Finalize {
        Finalize {
            run,
            generation,
            owner_id,
            superseded_by,
            by,
            now,
            lazy: false,
            st: FinalizeState::Start,
        }
    }

    /// Read the cutoff first and create it only if missing (for callers that finalize a
    /// cutoff someone else most likely already wrote).
    pub(crate) fn lazy(mut self) -> Finalize {
        self.lazy = true;
        self
    }

    /// SYNC (PROTOCOL §7.0): a cutoff or checkpoint that was *read* (created by someone
    /// else, who may not have fsynced its folder yet) becomes the answer only once its
    /// folder is fsynced, so no caller acts on a record a power loss can still take away.
    /// A cutoff this finalizer created itself is durable already (`Created` comes after
    /// the folder's fsync) and needs none.
    fn sync(&mut self, decoded: Result<Cut, LeaseError>) -> Step<Cut> {
        match decoded {
            Ok(cut) => {
                let dir = match cut {
                    Cut::Record(_) => Dir::Cutoffs,
                    Cut::Compacted(_) => Dir::Checkpoints,
                };
                self.st = FinalizeState::Syncing(Box::new(cut));
                Step::Io(Request::SyncDir(dir))
            }
            Err(e) => Step::Done(Err(e)),
        }
    }
}

pub(crate) fn decode_cutoff(
    run: &RunId,
    g: Generation,
    bytes: &[u8],
) -> Result<RetirementRecord, LeaseError> {
    let file = FileRef::Cutoff(g).path();
    let rec: RetirementRecord = decode_for(run, bytes).map_err(|e| e.in_file(&file))?;
    if rec.generation != g {
        return Err(LeaseError::RecordInvalid {
            run: run.to_string(),
            kind: crate::error::RecordKind::Retirement,
            file: Some(file),
            detail: format!(
                "file name says generation {g}, content says {}",
                rec.generation
            ),
        });
    }
    Ok(rec)
}

/// The cutoff of a superseded generation: its retirement record, or, when a prune folded
/// it away, the checkpoint that judges its events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cut {
    Record(RetirementRecord),
    Compacted(crate::records::Checkpoint),
}

impl Cut {
    /// Does event `s` of the superseded generation count?
    pub(crate) fn counts(&self, s: u64) -> bool {
        match self {
            Cut::Record(r) => s <= r.events_through,
            Cut::Compacted(cp) => {
                s <= cp.through_sequence && cp.not_authoritative.binary_search(&s).is_err()
            }
        }
    }

    /// Human description for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Cut::Record(r) => format!(
                "superseded by generation {}; cutoff {}",
                r.superseded_by, r.events_through
            ),
            Cut::Compacted(cp) => format!(
                "compacted below checkpoint floor {} (through sequence {})",
                cp.floor_generation, cp.through_sequence
            ),
        }
    }
}

impl Operation for Finalize {
    type Output = Cut;
    fn next(&mut self, mut input: Option<Response>) -> Step<Cut> {
        loop {
            match std::mem::replace(&mut self.st, FinalizeState::Start) {
                FinalizeState::Start if self.lazy => {
                    self.st = FinalizeState::Checking;
                    return Step::Io(Request::Read(FileRef::Cutoff(self.generation)));
                }
                FinalizeState::Start => {
                    self.st = FinalizeState::Tail(Tail::new(0));
                    input = None;
                }
                FinalizeState::Checking => match input.take() {
                    Some(Response::Content(Some(b))) => {
                        return self
                            .sync(decode_cutoff(&self.run, self.generation, &b).map(Cut::Record));
                    }
                    Some(Response::Content(None)) => {
                        // Never re-create a cutoff that a prune folded into a checkpoint:
                        // the checkpoint (created before the cutoff was removed) decides.
                        self.st = FinalizeState::ListCheckpoints;
                        return Step::Io(Request::List(Dir::Checkpoints));
                    }
                    other => return Step::Done(Err(violation("Content", &other))),
                },
                FinalizeState::ListCheckpoints => match input.take() {
                    Some(Response::Listing(l)) => {
                        let top = newest_checkpoint(l);
                        match top {
                            Some(floor) if floor > self.generation => {
                                self.st = FinalizeState::ReadCheckpoint(floor);
                                return Step::Io(Request::Read(FileRef::Checkpoint(floor)));
                            }
                            _ => self.st = FinalizeState::Tail(Tail::new(0)),
                        }
                    }
                    other => return Step::Done(Err(violation("Listing", &other))),
                },
                FinalizeState::ReadCheckpoint(floor) => match input.take() {
                    Some(Response::Content(Some(b))) => {
                        return self.sync(
                            super::log::decode_checkpoint(&self.run, floor, &b).map(Cut::Compacted),
                        );
                    }
                    // A newer prune replaced it: look again.
                    Some(Response::Content(None)) => {
                        self.st = FinalizeState::ListCheckpoints;
                        return Step::Io(Request::List(Dir::Checkpoints));
                    }
                    other => return Step::Done(Err(violation("Content", &other))),
                },
                FinalizeState::Tail(mut t) => {
                    let tail = match t.next(input.take()) {
                        Step::Io(r) => {
                            self.st = FinalizeState::Tail(t);
                            return Step::Io(r);
                        }
                        Step::Done(Err(e)) => return Step::Done(Err(e)),
                        Step::Done(Ok(v)) => v,
                    };
                    let rec = RetirementRecord {
                        run_id: self.run.clone(),
                        generation: self.generation,
                        owner_id: self.owner_id.clone(),
                        superseded_by: self.superseded_by,
                        events_through: tail,
                        finalized_at: self.now,
                        finalized_by: self.by.clone(),
                    };
                    let bytes = match encode(&rec) {
                        Ok(b) => b,
                        Err(e) => return Step::Done(Err(e)),
                    };
                    if self.lazy {
                        self.st = FinalizeState::SyncEpochs(Box::new(rec), bytes);
                        return Step::Io(Request::SyncDir(Dir::Epochs));
                    }
                    self.st = FinalizeState::Creating(Box::new(rec));
                    return Step::Io(Request::CreateExclusive(
                        FileRef::Cutoff(self.generation),
                        bytes,
                    ));
                }
                FinalizeState::SyncEpochs(rec, bytes) => {
                    return match input {
                        Some(Response::Done) => {
                            self.st = FinalizeState::Creating(rec);
                            Step::Io(Request::CreateExclusive(
                                FileRef::Cutoff(self.generation),
                                bytes,
                            ))
                        }
                        other => Step::Done(Err(violation("Done", &other))),
                    };
                }
                FinalizeState::Creating(rec) => {
                    return match input {
                        Some(Response::Created) => Step::Done(Ok(Cut::Record(*rec))),
                        Some(Response::AlreadyExists) => {
                            self.st = FinalizeState::Reading;
                            Step::Io(Request::Read(FileRef::Cutoff(self.generation)))
                        }
                        other => Step::Done(Err(violation("Created/AlreadyExists", &other))),
                    };
                }
                FinalizeState::Reading => {
                    return match input {
                        Some(Response::Content(Some(b))) => {
                            self.sync(decode_cutoff(&self.run, self.generation, &b).map(Cut::Record))
                        }
                        Some(Response::Content(None)) => Step::Done(Err(LeaseError::RecordInvalid {
                            run: self.run.to_string(),
                            kind: crate::error::RecordKind::Retirement,
                            file: Some(FileRef::Cutoff(self.generation).path()),
                            detail: "it existed a moment ago and is gone: cutoffs are never removed above a checkpoint floor".into(),
                        })),
                        other => Step::Done(Err(violation("Content", &other))),
                    };
                }
                FinalizeState::Syncing(cut) => {
                    return match input {
                        Some(Response::Done) => Step::Done(Ok(*cut)),
                        other => Step::Done(Err(violation("Done", &other))),
                    };
                }
            }
        }
    }
}

/// How a run looks to an observer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Never claimed, released or retired: anyone may claim.
    Free,
    /// A fresh owner.
    Active,
    /// The owner stopped heartbeating: an exact takeover may replace it.
    Stale,
    /// The owner is definitely dead: it may be retired at once.
    Dead,
    /// A record is invalid: nothing may replace the owner until an operator repairs it.
    Invalid(LeaseError),
}

impl Status {
    /// Lowercase name (`free`, `active`, `stale`, `dead`, `invalid`).
    pub fn name(&self) -> &'static str {
        match self {
            Status::Free => "free",
            Status::Active => "active",
            Status::Stale => "stale",
            Status::Dead => "dead",
            Status::Invalid(_) => "invalid",
        }
    }
}

/// The result of [`StatusView`]'s operation: the state plus what it was judged from.
#[derive(Debug, Clone)]
pub struct StatusView {
    /// The judgment.
    pub status: Status,
    /// The head, when it could be read.
    pub head: Option<Head>,
    /// Heartbeat age on the observer's wall clock, for an active head.
    pub age_ms: Option<i64>,
    /// Why the owner is not proven dead (or why it is), when liveness was probed.
    pub liveness: Option<Result<(), String>>,
}

impl StatusView {
    /// Start a status read of `run` at wall time `now`. With `probe_liveness`, an active
    /// head's holder is probed (a [`Request::ProbeLiveness`]) to tell `dead` from the rest.
    pub fn read(run: RunId, now: Timestamp, probe_liveness: bool) -> ReadStatus {
        ReadStatus {
            obs: Observe::new(run),
            now,
            probe: probe_liveness,
            pending: None,
        }
    }
}

/// Status read operation (see [`StatusView::read`]).
#[derive(Debug, Clone)]
pub struct ReadStatus {
    obs: Observe,
    now: Timestamp,
    probe: bool,
    pending: Option<Box<(Head, Freshness)>>,
}

impl Operation for ReadStatus {
    type Output = StatusView;
    fn next(&mut self, input: Option<Response>) -> Step<StatusView> {
        if let Some(p) = self.pending.take() {
            let (head, fr) = *p;
            let Some(Response::Liveness(ev)) = input else {
                return Step::Done(Err(violation("Liveness", &input)));
            };
            let verdict = definitely_dead(&head.epoch.holder, &ev);
            let age = match fr {
                Freshness::Fresh { age_ms } | Freshness::Stale { age_ms } => age_ms,
            };
            let status = match (&verdict, fr) {
                (Ok(()), _) => Status::Dead,
                (Err(_), Freshness::Fresh { .. }) => Status::Active,
                (Err(_), Freshness::Stale { .. }) => Status::Stale,
            };
            return Step::Done(Ok(StatusView {
                status,
                head: Some(head),
                age_ms: Some(age),
                liveness: Some(verdict),
            }));
        }
        let observed = match self.obs.next(input) {
            Step::Io(r) => return Step::Io(r),
            Step::Done(Err(e)) => {
                return match e {
                    LeaseError::RecordInvalid { .. } | LeaseError::SchemaUnsupported { .. } => {
                        Step::Done(Ok(StatusView {
                            status: Status::Invalid(e),
                            head: None,
                            age_ms: None,
                            liveness: None,
                        }))
                    }
                    e => Step::Done(Err(e)),
                };
            }
            Step::Done(Ok(o)) => o,
        };
        let Some(head) = observed.head else {
            return Step::Done(Ok(StatusView {
                status: Status::Free,
                head: None,
                age_ms: None,
                liveness: None,
            }));
        };
        if !head.is_active() {
            return Step::Done(Ok(StatusView {
                status: Status::Free,
                head: Some(head),
                age_ms: None,
                liveness: None,
            }));
        }
        let fr = freshness(&head, self.now);
        if self.probe {
            let holder = head.epoch.holder.clone();
            self.pending = Some(Box::new((head, fr)));
            return Step::Io(Request::ProbeLiveness(holder));
        }
        let (status, age) = match fr {
            Freshness::Fresh { age_ms } => (Status::Active, age_ms),
            Freshness::Stale { age_ms } => (Status::Stale, age_ms),
        };
        Step::Done(Ok(StatusView {
            status,
            head: Some(head),
            age_ms: Some(age),
            liveness: None,
        }))
    }
}
