//! Commit one record of the engine-committed store under the engine's guard (§18.3), and
//! the commit ids of its batches.

use super::fenced;
use crate::canonical::decode_for;
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, Identity, RunId, Sequence};
use crate::layout::{Dir, FileRef};
use crate::ops::{Operation, OwnedLease, Request, Response, Step, violation};
use crate::store_log::{MAX_STORE_RECORD_BYTES, RecordBatch, StoreRecord, StoreTail};
use crate::time::Timestamp;

/// What [`CommitRecord`] is given.
#[derive(Debug, Clone)]
pub struct CommitParams {
    /// Where the log ends, as the owner knows it (its last commit's answer, or its
    /// catch-up's [`super::StoreLogView::tail`]).
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

/// A new commit id for a batch: a word made from the owner's id and a caller-chosen random
/// number (the core draws no randomness).
pub fn commit_id(owner: &Identity, nonce: u64) -> Identity {
    Identity::word("commit id", format!("{}-{nonce:016x}", owner.as_str()))
        .or_else(|_| Identity::word("commit id", format!("c-{nonce:016x}")))
        .unwrap_or_else(|_| owner.clone())
}
