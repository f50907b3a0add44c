//! Read and check the store's record log (§18.4), read-only.

use super::{fenced, log_invalid};
use crate::canonical::decode_for;
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, RunId, Sequence};
use crate::layout::{Dir, FileRef};
use crate::ops::{Operation, Request, Response, Step, violation};
use crate::store_log::{SnapshotManifest, StoreRecord, StoreTail};

/// Records asked for per [`Request::ReadStoreRecords`].
pub const READ_PAGE_RECORDS: u32 = 256;
/// Bytes asked for per [`Request::ReadStoreRecords`] (a page ends after the record that
/// reaches it).
pub const READ_PAGE_BYTES: u64 = 4 << 20;

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
