//! The engine-committed store's operations (PROTOCOL.md §18, issue #32): commit one record
//! under the engine's guard, read and check the record log, write and read a snapshot.
//!
//! Like the lease's, each is a sans-IO step machine over the [`Request`] vocabulary: an
//! engine transport (lease-etcd) performs [`Request::CreateGuarded`] as one atomic step,
//! so the engine itself refuses a deposed generation's record.

use super::{Operation, OwnedLease, Request, Response, Step, violation};
use crate::canonical::{decode_for, encode};
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, Identity, RunId, Sequence};
use crate::layout::{Dir, FileRef};
use crate::store_log::{
    MAX_CHUNK_BYTES, MAX_CHUNKS, MAX_STORE_RECORD_BYTES, RecordBatch, SnapshotManifest,
    StoreRecord, StoreTail,
};
use crate::time::Timestamp;

/// Records asked for per [`Request::ReadStoreRecords`].
pub const READ_PAGE_RECORDS: u32 = 256;
/// Bytes asked for per [`Request::ReadStoreRecords`] (a page ends after the record that
/// reaches it).
pub const READ_PAGE_BYTES: u64 = 4 << 20;

fn fenced(run: &RunId, generation: Generation, detail: impl Into<String>) -> LeaseError {
    LeaseError::Fenced {
        run: run.to_string(),
        generation,
        detail: detail.into(),
    }
}

fn log_invalid(run: &RunId, file: FileRef, detail: impl Into<String>) -> LeaseError {
    LeaseError::StoreLogInvalid {
        run: run.to_string(),
        file: file.path(),
        detail: detail.into(),
    }
}

/// What [`CommitRecord`] is given.
#[derive(Debug, Clone)]
pub struct CommitParams {
    /// Where the log ends, as the owner knows it (its last commit's answer, or its
    /// catch-up's [`StoreLogView::tail`]).
    pub tail: StoreTail,
    /// The client commits of this record, in order (at least one; see
    /// [`crate::store_log::pack_batches`] to split a large group).
    pub batches: Vec<RecordBatch>,
    /// The owner's wall time (stamped, informative).
    pub now: Timestamp,
    /// The run's byte budget ([`crate::store_log::DEFAULT_BUDGET_BYTES`] by default).
    pub budget: u64,
}

/// A committed record: where it is, and the log's new tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The record's sequence.
    pub sequence: Sequence,
    /// Its hash (the next record links to it).
    pub hash: Digest,
    /// The store sequence of its first batch.
    pub first_commit: Sequence,
    /// The tail after it.
    pub tail: StoreTail,
}

/// Commit one record of the engine-committed store (PROTOCOL.md §18.3).
///
/// One [`Request::CreateGuarded`] of `store/log/<s>` with `s` the tail's next sequence:
/// `Created` is the commit; `Superseded` is `FENCED` (a newer epoch exists; nothing was
/// written, and nothing of this record ever will be); `AlreadyExists` reads the slot:
/// exactly this record's bytes are this writer's own earlier attempt (committed), a record
/// of a newer generation is `FENCED`; any other record is `FENCED` too when a listing of
/// the epochs shows one above this writer's, else `CONCURRENT_CHANGE` (the tail it built
/// on was stale; read the log again).
///
/// A transport failure leaves the outcome unknown: the caller resolves it with
/// [`CommitRecord::again`], the same record in the same slot, never a new one, until an
/// answer comes (§18.3: the retry's create finds its own bytes if the first landed).
#[derive(Debug, Clone)]
pub struct CommitRecord {
    run: RunId,
    generation: Generation,
    slot: Sequence,
    bytes: Vec<u8>,
    done: Committed,
    st: CommitState,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum CommitState {
    Start,
    Create,
    ReadSlot,
    /// The slot holds another record of this generation or an older one: is this writer
    /// deposed (an epoch above it, rule R4's listing), or was its tail stale?
    Recheck(Box<LeaseError>),
    Done,
}

impl CommitRecord {
    /// Build the record for `lease` after `p.tail`. Refused before any request:
    /// `ARGUMENT_INVALID` (no batch), `STORE_COMMIT_TOO_LARGE` (the record exceeds one
    /// engine request, [`MAX_STORE_RECORD_BYTES`]), `STORE_BUDGET_EXCEEDED` (the run's
    /// store would pass `p.budget`), `GENERATION_OVERFLOW`.
    pub fn new(lease: &OwnedLease, p: CommitParams) -> Result<CommitRecord, LeaseError> {
        let run = &lease.run_id;
        if p.batches.is_empty() {
            return Err(LeaseError::ArgumentInvalid {
                what: "batches",
                reason: "a store record holds at least one commit".into(),
            });
        }
        let overflow = |what| LeaseError::Overflow {
            run: run.to_string(),
            what,
            value: u64::MAX,
        };
        let slot = Sequence::new(p.tail.next_sequence()).ok_or(overflow("sequence"))?;
        let first_commit = Sequence::new(p.tail.commits.saturating_add(1))
            .filter(|_| p.tail.commits < u64::MAX)
            .ok_or(overflow("sequence"))?;
        let count = u64::try_from(p.batches.len()).unwrap_or(u64::MAX);
        let record = StoreRecord {
            run_id: run.clone(),
            sequence: slot,
            generation: lease.generation,
            owner_id: lease.owner_id.clone(),
            prev_hash: p.tail.last.as_ref().map(|(_, h)| h.clone()),
            first_commit,
            timestamp: p.now,
            batches: p.batches,
        };
        let bytes = crate::canonical::encode_any_size(&record)?;
        let size = bytes.len() as u64;
        if bytes.len() > MAX_STORE_RECORD_BYTES {
            return Err(LeaseError::CommitTooLarge {
                run: run.to_string(),
                bytes: size,
                limit: MAX_STORE_RECORD_BYTES as u64,
            });
        }
        if p.tail.bytes.saturating_add(size) > p.budget {
            return Err(LeaseError::BudgetExceeded {
                run: run.to_string(),
                used: p.tail.bytes,
                adding: size,
                budget: p.budget,
            });
        }
        let hash = Digest::of(&bytes);
        let done = Committed {
            sequence: slot,
            hash: hash.clone(),
            first_commit,
            tail: StoreTail {
                last: Some((slot, hash)),
                commits: p.tail.commits.saturating_add(count),
                bytes: p.tail.bytes.saturating_add(size),
            },
        };
        Ok(CommitRecord {
            run: run.clone(),
            generation: lease.generation,
            slot,
            bytes,
            done,
            st: CommitState::Start,
        })
    }

    /// The record's canonical bytes (what the slot holds once committed).
    pub fn record(&self) -> &[u8] {
        &self.bytes
    }

    /// The record's sequence (its slot).
    pub fn sequence(&self) -> Sequence {
        self.slot
    }

    /// The same record in the same slot, from the start: how an unanswered commit is
    /// resolved (§18.3). Never build a new record for a slot whose outcome is unknown.
    pub fn again(&self) -> CommitRecord {
        CommitRecord {
            st: CommitState::Start,
            ..self.clone()
        }
    }

    fn finish(&mut self, r: Result<Committed, LeaseError>) -> Step<Committed> {
        self.st = CommitState::Done;
        Step::Done(r)
    }

    /// The slot holds `found`, which is not this record: `FENCED` if a newer generation
    /// wrote it, else `CONCURRENT_CHANGE` (which [`Operation::next`] refines with a listing
    /// of the epochs).
    fn judge_other(&self, found: &[u8]) -> LeaseError {
        let file = FileRef::StoreRecord(self.slot);
        match decode_for::<StoreRecord>(&self.run, found) {
            Err(e) => e.in_file(file.path()),
            Ok(r) if r.generation > self.generation => fenced(
                &self.run,
                self.generation,
                format!(
                    "store record {} was committed by generation {} (owner {})",
                    self.slot.get(),
                    r.generation.get(),
                    r.owner_id.as_str()
                ),
            ),
            Ok(r) => LeaseError::ConcurrentChange {
                run: self.run.to_string(),
                detail: format!(
                    "store record {} already holds a commit of generation {} (owner {}): the log's tail this commit built on was stale",
                    self.slot.get(),
                    r.generation.get(),
                    r.owner_id.as_str()
                ),
            },
        }
    }
}

impl Operation for CommitRecord {
    type Output = Committed;

    fn next(&mut self, input: Option<Response>) -> Step<Committed> {
        let file = FileRef::StoreRecord(self.slot);
        match (std::mem::replace(&mut self.st, CommitState::Done), input) {
            (CommitState::Start, None) => {
                self.st = CommitState::Create;
                // mutant store_record_unguarded: a plain exclusive create (no epoch guard).
                if crate::mutant::mutant("store_record_unguarded") {
                    return Step::Io(Request::CreateExclusive(file, self.bytes.clone()));
                }
                Step::Io(Request::CreateGuarded {
                    file,
                    bytes: self.bytes.clone(),
                    generation: self.generation,
                })
            }
            (CommitState::Create, Some(Response::Created)) => {
                let done = self.done.clone();
                self.finish(Ok(done))
            }
            (CommitState::Create, Some(Response::Superseded)) => {
                let e = fenced(
                    &self.run,
                    self.generation,
                    format!(
                        "the engine refused store record {}: an epoch above generation {} exists",
                        self.slot.get(),
                        self.generation.get()
                    ),
                );
                self.finish(Err(e))
            }
            (CommitState::Create, Some(Response::AlreadyExists)) => {
                self.st = CommitState::ReadSlot;
                Step::Io(Request::Read(file))
            }
            (CommitState::ReadSlot, Some(Response::Content(Some(found)))) => {
                if found == self.bytes {
                    let done = self.done.clone();
                    return self.finish(Ok(done));
                }
                let e = self.judge_other(&found);
                if e.code() == crate::Code::ConcurrentChange {
                    self.st = CommitState::Recheck(Box::new(e));
                    return Step::Io(Request::List(Dir::Epochs));
                }
                self.finish(Err(e))
            }
            (CommitState::Recheck(stale), Some(Response::Listing(epochs))) => {
                let above = epochs.iter().find_map(|f| match f {
                    FileRef::Epoch(h) if *h > self.generation => Some(*h),
                    _ => None,
                });
                let e = match above {
                    Some(h) => fenced(
                        &self.run,
                        self.generation,
                        format!(
                            "store record {} is taken and generation {} exists",
                            self.slot.get(),
                            h.get()
                        ),
                    ),
                    None => *stale,
                };
                self.finish(Err(e))
            }
            (CommitState::ReadSlot, Some(Response::Content(None))) => {
                let e = LeaseError::ConcurrentChange {
                    run: self.run.to_string(),
                    detail: format!(
                        "store record {} existed, then vanished while it was read",
                        self.slot.get()
                    ),
                };
                self.finish(Err(e))
            }
            (_, got) => {
                let e = violation("the answer to a store commit's request", &got);
                self.finish(Err(e))
            }
        }
    }
}

/// A record read from the log, checked, with its hash and size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedRecord {
    /// The record.
    pub record: StoreRecord,
    /// SHA-256 of its bytes.
    pub hash: Digest,
}

/// The record log as [`ReadStoreLog`] found and checked it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoreLogView {
    /// The newest snapshot's manifest, if any: the log starts after its `through`.
    pub snapshot: Option<(FileRef, SnapshotManifest)>,
    /// The records after the snapshot (or after `keep_after`), in order, checked.
    pub records: Vec<LoggedRecord>,
    /// Where the log ends: what the next commit builds on.
    pub tail: StoreTail,
    /// The hash of record `keep_after` when it was read (so a local view that stopped
    /// there can tell whether it is a prefix of this log), or the snapshot's
    /// `through_hash` when `keep_after` is its `through`.
    pub hash_at_keep_after: Option<Digest>,
}

/// Read and check the store's record log (PROTOCOL.md §18.4), read-only.
///
/// Lists the snapshots and reads the newest manifest, then reads the records after it in
/// pages ([`Request::ReadStoreRecords`]) and checks each: the name and the content agree,
/// the sequences follow one another, each links to the hash of the one before (the first
/// to the manifest's `through_hash`, record 1 to nothing), commits are numbered on, and
/// generations never go down (nor below the snapshot's). A record above `as_of` (the
/// reader's own generation) is `FENCED`: the reader was replaced. A missing record below a
/// later one, a broken link or a wrong number is `STORE_LOG_INVALID`, unless the
/// snapshots changed while it read (a truncation after a new snapshot), which is
/// `CONCURRENT_CHANGE` (read again). At the end of the log the snapshots are listed again:
/// an end that a truncation made (a newer snapshot now) is `CONCURRENT_CHANGE` too, never a
/// shorter log. Records up to `keep_after` are checked and counted, not kept (a local view
/// already holds them).
#[derive(Debug, Clone)]
pub struct ReadStoreLog {
    run: RunId,
    as_of: Option<Generation>,
    keep_after: u64,
    view: StoreLogView,
    manifests: Vec<FileRef>,
    next: u64,
    prev: Option<Digest>,
    generation: Option<Generation>,
    first_through: Option<Sequence>,
    st: ReadLogState,
}

#[derive(Debug, Clone)]
enum ReadLogState {
    Start,
    Listed,
    Manifest,
    Records,
    /// A record is missing: did a newer snapshot appear meanwhile?
    Confirm(Box<LeaseError>),
    /// The end of the log was reached: was it the end, or did a truncation behind a newer
    /// snapshot remove the records after the reader's position?
    End,
    Done,
}

impl ReadStoreLog {
    /// Read `run`'s record log as an owner of `as_of` (or as an observer with `None`),
    /// keeping the records after `keep_after`.
    pub fn new(run: RunId, as_of: Option<Generation>, keep_after: u64) -> ReadStoreLog {
        ReadStoreLog {
            run,
            as_of,
            keep_after,
            view: StoreLogView::default(),
            manifests: Vec::new(),
            next: 1,
            prev: None,
            generation: None,
            first_through: None,
            st: ReadLogState::Start,
        }
    }

    fn read_page(&self) -> Request {
        match Sequence::new(self.next) {
            Some(from) => Request::ReadStoreRecords {
                from,
                max_count: READ_PAGE_RECORDS,
                max_bytes: READ_PAGE_BYTES,
            },
            None => Request::List(Dir::StoreSnapshots),
        }
    }

    fn newest(manifests: &[FileRef]) -> Option<Sequence> {
        manifests
            .iter()
            .filter_map(|f| match f {
                FileRef::Snapshot { through, .. } => Some(*through),
                _ => None,
            })
            .max()
    }

    /// Check one record of the page; `Err` stops the read.
    fn take(&mut self, seq: Sequence, bytes: &[u8]) -> Result<(), LeaseError> {
        let file = FileRef::StoreRecord(seq);
        if seq.get() != self.next {
            let expected = FileRef::StoreRecord(Sequence::new(self.next).unwrap_or(seq));
            return Err(log_invalid(
                &self.run,
                expected,
                format!(
                    "record {} is missing but record {} exists",
                    self.next,
                    seq.get()
                ),
            ));
        }
        let r: StoreRecord = decode_for(&self.run, bytes).map_err(|e| e.in_file(file.path()))?;
        if r.sequence != seq {
            return Err(log_invalid(
                &self.run,
                file,
                format!("the record says it is record {}", r.sequence.get()),
            ));
        }
        if r.prev_hash != self.prev {
            return Err(log_invalid(
                &self.run,
                file,
                "its prev_hash is not the hash of the record (or snapshot) before it",
            ));
        }
        if r.first_commit.get() != self.view.tail.commits.saturating_add(1) {
            return Err(log_invalid(
                &self.run,
                file,
                format!(
                    "its first commit is {}, the log before it ends at commit {}",
                    r.first_commit.get(),
                    self.view.tail.commits
                ),
            ));
        }
        if self.generation.is_some_and(|g| r.generation < g) {
            return Err(log_invalid(
                &self.run,
                file,
                format!(
                    "its generation {} is below the generation {} of an earlier record or the snapshot",
                    r.generation.get(),
                    self.generation.map_or(0, Generation::get)
                ),
            ));
        }
        if let Some(own) = self.as_of.filter(|g| r.generation > *g) {
            return Err(fenced(
                &self.run,
                own,
                format!(
                    "store record {} was committed by generation {}",
                    seq.get(),
                    r.generation.get()
                ),
            ));
        }
        let hash = Digest::of(bytes);
        if seq.get() == self.keep_after {
            self.view.hash_at_keep_after = Some(hash.clone());
        }
        self.view.tail.commits = r.last_commit();
        self.view.tail.bytes = self.view.tail.bytes.saturating_add(bytes.len() as u64);
        self.view.tail.last = Some((seq, hash.clone()));
        self.generation = Some(r.generation);
        self.prev = Some(hash.clone());
        self.next = seq.get().saturating_add(1);
        if seq.get() > self.keep_after {
            self.view.records.push(LoggedRecord { record: r, hash });
        }
        Ok(())
    }

    fn fail(&mut self, e: LeaseError) -> Step<StoreLogView> {
        self.st = ReadLogState::Done;
        Step::Done(Err(e))
    }
}

impl Operation for ReadStoreLog {
    type Output = StoreLogView;

    fn next(&mut self, input: Option<Response>) -> Step<StoreLogView> {
        match (std::mem::replace(&mut self.st, ReadLogState::Done), input) {
            (ReadLogState::Start, None) => {
                self.st = ReadLogState::Listed;
                Step::Io(Request::List(Dir::StoreSnapshots))
            }
            (ReadLogState::Listed, Some(Response::Listing(files))) => {
                let mut manifests: Vec<FileRef> = files
                    .into_iter()
                    .filter(|f| matches!(f, FileRef::Snapshot { .. }))
                    .collect();
                // Newest first; two snapshots of one record: the lower nonce.
                manifests.sort_by_key(|f| match f {
                    FileRef::Snapshot { through, nonce } => {
                        (std::cmp::Reverse(through.get()), *nonce)
                    }
                    _ => (std::cmp::Reverse(0), 0),
                });
                self.first_through = Self::newest(&manifests);
                self.manifests = manifests;
                match self.manifests.first() {
                    Some(m) => {
                        self.st = ReadLogState::Manifest;
                        Step::Io(Request::Read(*m))
                    }
                    None => {
                        self.st = ReadLogState::Records;
                        Step::Io(self.read_page())
                    }
                }
            }
            (ReadLogState::Manifest, Some(Response::Content(None))) => {
                self.fail(LeaseError::ConcurrentChange {
                    run: self.run.to_string(),
                    detail: "a snapshot's manifest vanished while it was read".into(),
                })
            }
            (ReadLogState::Manifest, Some(Response::Content(Some(bytes)))) => {
                let Some(&file) = self.manifests.first() else {
                    return self.fail(violation("a listed manifest", &None));
                };
                let m: SnapshotManifest = match decode_for(&self.run, &bytes) {
                    Ok(m) => m,
                    Err(e) => return self.fail(e.in_file(file.path())),
                };
                let named = FileRef::Snapshot {
                    through: m.through,
                    nonce: m.nonce,
                };
                if named != file {
                    return self.fail(log_invalid(
                        &self.run,
                        file,
                        format!(
                            "the manifest says it is snapshot {}-{:016x}",
                            m.through.get(),
                            m.nonce
                        ),
                    ));
                }
                if let Some(own) = self.as_of.filter(|g| m.generation > *g) {
                    return self.fail(fenced(
                        &self.run,
                        own,
                        format!(
                            "a snapshot was written by generation {}",
                            m.generation.get()
                        ),
                    ));
                }
                self.next = m.through.get().saturating_add(1);
                self.prev = Some(m.through_hash.clone());
                self.generation = Some(m.generation);
                self.view.tail = StoreTail {
                    last: Some((m.through, m.through_hash.clone())),
                    commits: m.commits.get(),
                    bytes: m.size,
                };
                if m.through.get() == self.keep_after {
                    self.view.hash_at_keep_after = Some(m.through_hash.clone());
                }
                self.view.snapshot = Some((file, m));
                self.st = ReadLogState::Records;
                Step::Io(self.read_page())
            }
            (ReadLogState::Records, Some(Response::Records(page))) => {
                let n = page.len();
                let bytes: u64 = page.iter().map(|(_, b)| b.len() as u64).sum();
                for (seq, b) in &page {
                    if let Err(e) = self.take(*seq, b) {
                        if matches!(e, LeaseError::StoreLogInvalid { .. }) {
                            // Missing or unlinked: a truncation after a newer snapshot, or
                            // a damaged log? The snapshots tell.
                            self.st = ReadLogState::Confirm(Box::new(e));
                            return Step::Io(Request::List(Dir::StoreSnapshots));
                        }
                        return self.fail(e);
                    }
                }
                let cut = n >= READ_PAGE_RECORDS as usize || bytes >= READ_PAGE_BYTES;
                if n > 0 && cut {
                    self.st = ReadLogState::Records;
                    return Step::Io(self.read_page());
                }
                // An empty page is the end of the log only if no truncation removed what
                // followed: a truncation comes after its snapshot's manifest, and the
                // newest manifest stays until a newer one exists, so the same newest
                // snapshot now as at the start means nothing was truncated past it.
                // (Found by the engine model: a reader that listed no snapshot, then
                // read record 1 after a snapshot and truncation, took the log for empty.)
                // mutant store_read_end_unchecked: the empty page taken for the end.
                if crate::mutant::mutant("store_read_end_unchecked") {
                    self.st = ReadLogState::Done;
                    return Step::Done(Ok(std::mem::take(&mut self.view)));
                }
                self.st = ReadLogState::End;
                Step::Io(Request::List(Dir::StoreSnapshots))
            }
            (ReadLogState::End, Some(Response::Listing(files))) => {
                if Self::newest(&files) != self.first_through {
                    return self.fail(LeaseError::ConcurrentChange {
                        run: self.run.to_string(),
                        detail: "a new snapshot truncated the store's log while it was read".into(),
                    });
                }
                self.st = ReadLogState::Done;
                Step::Done(Ok(std::mem::take(&mut self.view)))
            }
            (ReadLogState::Confirm(e), Some(Response::Listing(files))) => {
                if Self::newest(&files) != self.first_through {
                    return self.fail(LeaseError::ConcurrentChange {
                        run: self.run.to_string(),
                        detail: "a new snapshot truncated the store's log while it was read".into(),
                    });
                }
                self.fail(*e)
            }
            (_, got) => self.fail(violation("the answer to a store log read", &got)),
        }
    }
}

/// Read a snapshot's image (PROTOCOL.md §18.5), read-only: each chunk in order, each
/// checked against the manifest's hash; returns the image. A chunk missing or different is
/// `STORE_LOG_INVALID`, unless the manifest itself was removed meanwhile (a newer snapshot
/// replaced it), which is `CONCURRENT_CHANGE`.
#[derive(Debug, Clone)]
pub struct ReadSnapshot {
    run: RunId,
    file: FileRef,
    manifest: SnapshotManifest,
    image: Vec<u8>,
    index: u32,
    st: SnapState,
}

#[derive(Debug, Clone)]
enum SnapState {
    Start,
    Chunk,
    Confirm(Box<LeaseError>),
    Done,
}

impl ReadSnapshot {
    /// Read the image of the snapshot `file` whose manifest is `manifest` (from
    /// [`StoreLogView::snapshot`]).
    pub fn new(run: RunId, file: FileRef, manifest: SnapshotManifest) -> ReadSnapshot {
        ReadSnapshot {
            run,
            file,
            manifest,
            image: Vec::new(),
            index: 0,
            st: SnapState::Start,
        }
    }

    fn chunk(&self) -> FileRef {
        let (through, nonce) = (self.manifest.through, self.manifest.nonce);
        FileRef::SnapshotChunk {
            through,
            nonce,
            index: self.index,
        }
    }

    fn fail(&mut self, e: LeaseError) -> Step<Vec<u8>> {
        self.st = SnapState::Done;
        Step::Done(Err(e))
    }
}

impl Operation for ReadSnapshot {
    type Output = Vec<u8>;

    fn next(&mut self, input: Option<Response>) -> Step<Vec<u8>> {
        match (std::mem::replace(&mut self.st, SnapState::Done), input) {
            (SnapState::Start, None) => {
                self.st = SnapState::Chunk;
                Step::Io(Request::Read(self.chunk()))
            }
            (SnapState::Chunk, Some(Response::Content(found))) => {
                let chunk = self.chunk();
                let want = self.manifest.chunks.get(self.index as usize).cloned();
                let problem = match (&found, &want) {
                    (None, _) => Some("the chunk is missing".to_string()),
                    (Some(b), _) if b.len() > MAX_CHUNK_BYTES => {
                        Some(format!("the chunk holds {} bytes", b.len()))
                    }
                    (Some(b), Some(h)) if Digest::of(b) != *h => {
                        Some("the chunk's hash is not the manifest's".into())
                    }
                    (Some(_), None) => Some("the manifest lists fewer chunks".into()),
                    _ => None,
                };
                if let Some(p) = problem {
                    self.st = SnapState::Confirm(Box::new(log_invalid(&self.run, chunk, p)));
                    return Step::Io(Request::Exists(self.file));
                }
                self.image.extend_from_slice(&found.unwrap_or_default());
                self.index += 1;
                if (self.index as usize) < self.manifest.chunks.len() {
                    self.st = SnapState::Chunk;
                    return Step::Io(Request::Read(self.chunk()));
                }
                if self.image.len() as u64 != self.manifest.size {
                    let e = log_invalid(
                        &self.run,
                        self.file,
                        format!(
                            "the chunks hold {} bytes, the manifest says {}",
                            self.image.len(),
                            self.manifest.size
                        ),
                    );
                    return self.fail(e);
                }
                self.st = SnapState::Done;
                Step::Done(Ok(std::mem::take(&mut self.image)))
            }
            (SnapState::Confirm(e), Some(Response::Exists(still))) => {
                if still {
                    return self.fail(*e);
                }
                self.fail(LeaseError::ConcurrentChange {
                    run: self.run.to_string(),
                    detail: "the snapshot was removed while it was read (a newer one replaced it)"
                        .into(),
                })
            }
            (_, got) => self.fail(violation("the answer to a snapshot read", &got)),
        }
    }
}

/// Write a snapshot of the store under the engine's guard (PROTOCOL.md §18.5): each chunk
/// of at most [`MAX_CHUNK_BYTES`] with [`Request::CreateGuarded`], then the manifest, the
/// same way. Until the manifest exists nobody reads the chunks; once it does, the records
/// up to `through` may be removed. `Superseded` at any step is `FENCED`.
#[derive(Debug, Clone)]
pub struct WriteSnapshot {
    run: RunId,
    generation: Generation,
    manifest: SnapshotManifest,
    manifest_bytes: Vec<u8>,
    image: Vec<u8>,
    index: u32,
    st: WriteSnapState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteSnapState {
    Start,
    Chunk,
    Manifest,
    Done,
}

impl WriteSnapshot {
    /// A snapshot by `lease` of the image `image` (the store after record `tail.last`),
    /// named with `nonce` (random: two writers never share chunk names). Refused before any
    /// request: `ARGUMENT_INVALID` (an empty log, or an image too large for
    /// [`MAX_CHUNKS`] chunks).
    pub fn new(
        lease: &OwnedLease,
        tail: &StoreTail,
        image: Vec<u8>,
        nonce: u64,
        now: Timestamp,
    ) -> Result<WriteSnapshot, LeaseError> {
        let Some((through, through_hash)) = tail.last.clone() else {
            return Err(LeaseError::ArgumentInvalid {
                what: "tail",
                reason: "a snapshot folds in at least one record".into(),
            });
        };
        let commits = Sequence::new(tail.commits).ok_or(LeaseError::ArgumentInvalid {
            what: "tail",
            reason: "a snapshot folds in at least one commit".into(),
        })?;
        let chunks: Vec<Digest> = if image.is_empty() {
            vec![Digest::of(&[])]
        } else {
            image.chunks(MAX_CHUNK_BYTES).map(Digest::of).collect()
        };
        if chunks.len() > MAX_CHUNKS as usize {
            return Err(LeaseError::ArgumentInvalid {
                what: "image",
                reason: format!("{} bytes need more than {MAX_CHUNKS} chunks", image.len()),
            });
        }
        let manifest = SnapshotManifest {
            run_id: lease.run_id.clone(),
            through,
            through_hash,
            commits,
            generation: lease.generation,
            owner_id: lease.owner_id.clone(),
            nonce,
            chunks,
            size: image.len() as u64,
            timestamp: now,
        };
        let manifest_bytes = encode(&manifest)?;
        Ok(WriteSnapshot {
            run: lease.run_id.clone(),
            generation: lease.generation,
            manifest,
            manifest_bytes,
            image,
            index: 0,
            st: WriteSnapState::Start,
        })
    }

    /// The manifest's file.
    pub fn file(&self) -> FileRef {
        FileRef::Snapshot {
            through: self.manifest.through,
            nonce: self.manifest.nonce,
        }
    }

    fn chunk_request(&self) -> Request {
        let i = self.index as usize;
        let start = i * MAX_CHUNK_BYTES;
        let end = (start + MAX_CHUNK_BYTES).min(self.image.len());
        Request::CreateGuarded {
            file: FileRef::SnapshotChunk {
                through: self.manifest.through,
                nonce: self.manifest.nonce,
                index: self.index,
            },
            bytes: self.image.get(start..end).unwrap_or_default().to_vec(),
            generation: self.generation,
        }
    }

    fn fail(&mut self, e: LeaseError) -> Step<FileRef> {
        self.st = WriteSnapState::Done;
        Step::Done(Err(e))
    }

    fn refused(&self, what: &str, got: &Response) -> LeaseError {
        match got {
            Response::Superseded => fenced(
                &self.run,
                self.generation,
                format!("the engine refused the snapshot's {what}: a newer epoch exists"),
            ),
            _ => LeaseError::ConcurrentChange {
                run: self.run.to_string(),
                detail: format!(
                    "the snapshot's {what} already exists (its nonce {:016x} was used before)",
                    self.manifest.nonce
                ),
            },
        }
    }
}

impl Operation for WriteSnapshot {
    type Output = FileRef;

    fn next(&mut self, input: Option<Response>) -> Step<FileRef> {
        match (self.st, input) {
            (WriteSnapState::Start, None) => {
                self.st = WriteSnapState::Chunk;
                Step::Io(self.chunk_request())
            }
            (WriteSnapState::Chunk, Some(Response::Created)) => {
                self.index += 1;
                if (self.index as usize) < self.manifest.chunks.len() {
                    return Step::Io(self.chunk_request());
                }
                self.st = WriteSnapState::Manifest;
                Step::Io(Request::CreateGuarded {
                    file: self.file(),
                    bytes: self.manifest_bytes.clone(),
                    generation: self.generation,
                })
            }
            (WriteSnapState::Manifest, Some(Response::Created)) => {
                self.st = WriteSnapState::Done;
                Step::Done(Ok(self.file()))
            }
            (st @ (WriteSnapState::Chunk | WriteSnapState::Manifest), Some(got))
                if matches!(got, Response::Superseded | Response::AlreadyExists) =>
            {
                let what = if st == WriteSnapState::Chunk {
                    "chunk"
                } else {
                    "manifest"
                };
                let e = self.refused(what, &got);
                self.fail(e)
            }
            (_, got) => self.fail(violation("the answer to a snapshot write", &got)),
        }
    }
}

/// A new commit id for a batch: a word made from the owner's id and a caller-chosen random
/// number (the core draws no randomness).
pub fn commit_id(owner: &Identity, nonce: u64) -> Identity {
    Identity::word("commit id", format!("{}-{nonce:016x}", owner.as_str()))
        .or_else(|_| Identity::word("commit id", format!("c-{nonce:016x}")))
        .unwrap_or_else(|_| owner.clone())
}

/// What [`TruncateStoreLog`] removed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Truncated {
    /// Records removed (all at or below the snapshot's `through`).
    pub records: u64,
    /// Older snapshots' manifests and chunks removed, and chunks left without a manifest
    /// by a writer that died (all of snapshots older than this one).
    pub snapshot_files: u64,
}

/// Remove what the snapshot `keep` made unnecessary (PROTOCOL.md §18.5): every record up
/// to its `through`, then every older snapshot (manifest first, then its chunks), and
/// chunks of older snapshots that never got a manifest. Run after `keep`'s manifest was
/// created: a reader that began before it finds records missing and reads again
/// (`CONCURRENT_CHANGE`, [`ReadStoreLog`]), one that begins after starts from `keep`.
///
/// Removals are plain deletes (§17): each removes only what the durable manifest of `keep`
/// already covers, so a late removal by a deposed owner changes no answer. Snapshots at
/// `keep`'s `through` or above are never touched.
#[derive(Debug, Clone)]
pub struct TruncateStoreLog {
    through: Sequence,
    keep: FileRef,
    removing: Vec<FileRef>,
    done: Truncated,
    st: TruncState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TruncState {
    Start,
    ListedLog,
    ListedSnapshots,
    Removing,
    Done,
}

impl TruncateStoreLog {
    /// Truncate up to the snapshot `keep` (a [`FileRef::Snapshot`]; anything else removes
    /// nothing).
    pub fn new(keep: FileRef) -> TruncateStoreLog {
        let through = match keep {
            FileRef::Snapshot { through, .. } => through,
            _ => Sequence::FIRST,
        };
        TruncateStoreLog {
            through,
            keep,
            removing: Vec::new(),
            done: Truncated::default(),
            st: TruncState::Start,
        }
    }

    fn next_removal(&mut self) -> Step<Truncated> {
        match self.removing.pop() {
            Some(f) => {
                match f {
                    FileRef::StoreRecord(_) => self.done.records += 1,
                    _ => self.done.snapshot_files += 1,
                }
                self.st = TruncState::Removing;
                Step::Io(Request::Remove(f, super::Durability::NoFsync))
            }
            None => {
                self.st = TruncState::Done;
                Step::Done(Ok(std::mem::take(&mut self.done)))
            }
        }
    }
}

impl Operation for TruncateStoreLog {
    type Output = Truncated;

    fn next(&mut self, input: Option<Response>) -> Step<Truncated> {
        if !matches!(self.keep, FileRef::Snapshot { .. }) {
            self.st = TruncState::Done;
            return Step::Done(Ok(Truncated::default()));
        }
        match (self.st, input) {
            (TruncState::Start, None) => {
                self.st = TruncState::ListedLog;
                Step::Io(Request::List(Dir::StoreLog))
            }
            (TruncState::ListedLog, Some(Response::Listing(files))) => {
                let mut records: Vec<FileRef> = files
                    .into_iter()
                    .filter(|f| matches!(f, FileRef::StoreRecord(s) if *s <= self.through))
                    .collect();
                // Popped from the end: the oldest record goes first, so what is left is
                // always a suffix of the log (a reader never meets a hole below a record).
                records.sort();
                records.reverse();
                self.removing = records;
                self.st = TruncState::ListedSnapshots;
                Step::Io(Request::List(Dir::StoreSnapshots))
            }
            (TruncState::ListedSnapshots, Some(Response::Listing(files))) => {
                let older = |t: &Sequence| *t < self.through;
                let mut manifests = Vec::new();
                let mut chunks = Vec::new();
                for f in files {
                    match f {
                        FileRef::Snapshot { through, .. } if older(&through) => manifests.push(f),
                        FileRef::SnapshotChunk { through, .. } if older(&through) => chunks.push(f),
                        _ => {}
                    }
                }
                // Removal order (popped from the end): records, then manifests, then
                // chunks, so no manifest ever names a removed chunk.
                let mut order = chunks;
                order.extend(manifests);
                order.append(&mut self.removing);
                self.removing = order;
                self.next_removal()
            }
            (TruncState::Removing, Some(Response::Done)) => self.next_removal(),
            (_, got) => {
                self.st = TruncState::Done;
                Step::Done(Err(violation("the answer to a store log truncation", &got)))
            }
        }
    }
}
