//! The operations of the protocol as sans-IO step machines (quinn-style `next`).
//!
//! # Driver protocol
//!
//! An operation is created with everything the caller observed or decided (wall time, ids,
//! policy). The caller then calls [`Operation::next`] with `None`, performs the returned
//! [`Request`] exactly, and calls `next` again with the matching [`Response`]; it repeats
//! until it gets [`Step::Done`]. Requests must be performed one at a time, in the order
//! given, each completed (including its fsyncs) before the response is fed back. A caller
//! that crashes or gives up simply stops: every prefix of an operation's request sequence
//! leaves a state that `docs/PROTOCOL.md` §9 shows to be recoverable. If a request fails
//! with an I/O error the caller abandons the operation and reports its own typed error.
//!
//! [`drive`] runs an operation against a closure, for adapters and tests.

mod common;
mod lease;
mod log;
mod observe;
mod prune;
mod store;

pub use common::Head;
pub use lease::{
    Claim, ClaimParams, Expectation, Heartbeat, OwnedLease, Preempted, Release, ReleaseParams,
    Retire, RetireParams, Retired, Takeover, TakeoverParams, TakeoverTrigger, refine_claim_refusal,
};
pub use log::{
    Append, AppendParams, Appended, ChainView, EventLogView, JudgeLog, JudgedEvent, LogEnd,
    MARK_EVERY, MAX_APPEND_COLLISIONS, ReadEvents, ShortTail, Standing, Verify, VerifyReport,
    WriteMark, judge_event,
};
pub use observe::{
    AuthorityLease, Freshness, LivenessEvidence, LockEvidence, ProcessState, ReadStatus, Status,
    StatusView, definitely_dead, freshness,
};
pub use prune::{CompactPolicy, Prune, PruneParams, PruneReport};
pub use store::{
    CommitParams, CommitRecord, Committed, LoggedRecord, READ_PAGE_BYTES, READ_PAGE_RECORDS,
    ReadSnapshot, ReadStoreLog, StoreLogView, TruncateStoreLog, Truncated, WriteSnapshot,
    commit_id,
};

use crate::error::LeaseError;
use crate::layout::{Dir, FileRef};
use crate::records::Holder;

/// Whether a heartbeat write or a removal is made durable before its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Heartbeat: `fdatasync` after the in-place write (a fresh file: fsync it, rename,
    /// fsync the directory). Removal: fsync the directory.
    Fsync,
    /// No fsync (heartbeats under the `local` policy; removals nobody reads again).
    NoFsync,
}

/// One I/O request of an operation. Paths are always relative to the run root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// List a directory: answer [`Response::Listing`] with the entries whose names parse
    /// ([`Dir::parse_name`]); a missing directory is an empty listing.
    List(Dir),
    /// Count the event files of `events/` whose names parse, and find the highest
    /// sequence among them, without listing them: answer [`Response::EventCount`]. The log
    /// is `1..=highest` with no gap exactly when the two are equal (names are unique), so
    /// a reader learns that in memory that does not grow with the log.
    CountEvents,
    /// Read a whole file: answer [`Response::Content`] (`None` if it does not exist).
    Read(FileRef),
    /// Does the file exist: answer [`Response::Exists`].
    Exists(FileRef),
    /// Create the file only if it does not exist, atomically and durably (temp in the same
    /// directory, write, fsync, `link(2)`, fsync the directory, unlink the temp): answer
    /// [`Response::Created`] or [`Response::AlreadyExists`].
    CreateExclusive(FileRef, Vec<u8>),
    /// Write heartbeat `seq` of the heartbeat file `file` (PROTOCOL §5.2 WriteBeat), in
    /// the two-slot format of [`crate::beat`]: answer [`Response::Done`].
    ///
    /// - `seq == 1`, or the file is missing: replace the file whole with
    ///   [`crate::beat::fresh_file`]`(seq, record)` (temp, write, (fsync), rename, (fsync
    ///   dir)).
    /// - Otherwise: overwrite only the slot at [`crate::beat::slot_offset`]`(seq)` with
    ///   [`crate::beat::slot_bytes`]`(seq, record)` in one positioned write, then (with
    ///   [`Durability::Fsync`]) `fdatasync` the file. Nothing else is written, no file is
    ///   created, nothing is renamed.
    ///
    /// The caller numbers its beats 1, 2, … within one file; the slot it overwrites holds
    /// beat `seq − 2`, so the other slot keeps beat `seq − 1` whole whatever happens to
    /// this write.
    WriteBeat {
        /// The heartbeat file ([`FileRef::Beat`]).
        file: FileRef,
        /// The beat's number in this file (≥ 1).
        seq: u64,
        /// The canonical heartbeat record (the slot's payload).
        record: Vec<u8>,
        /// Whether the write is made durable before the answer.
        durability: Durability,
    },
    /// Remove the file (missing is fine), fsyncing its directory with
    /// [`Durability::Fsync`]: answer [`Response::Done`].
    Remove(FileRef, Durability),
    /// Gather liveness evidence about a holder: answer [`Response::Liveness`].
    ProbeLiveness(Holder),
    /// Make every entry the directory holds now durable (`fsync` of the directory):
    /// answer [`Response::Done`]. An operation issues it after it *read* a cutoff or a
    /// checkpoint and before it acts on it (answers, or creates a record that depends on
    /// it): another actor's record can be linked, so visible, before its creator fsynced
    /// the directory, and a power loss would then take away what the answer rested on
    /// (PROTOCOL §7.0 SYNC). An authority whose visible writes are already durable (etcd)
    /// answers at once.
    SyncDir(Dir),
    /// Create `file` with `bytes` only if it does not exist **and** no epoch above
    /// `generation` exists, the two checks and the write one atomic step of the authority
    /// (PROTOCOL §18.2, the engine's guard: on etcd one transaction comparing
    /// `create_revision(file) = 0` and `create_revision = 0` over every epoch key from
    /// `generation + 1` on). Answer [`Response::Created`]; [`Response::AlreadyExists`] (the
    /// file exists, nothing written); or [`Response::Superseded`] (the file is absent and
    /// an epoch above `generation` exists, nothing written). Retried by the transport after
    /// an unanswered attempt only as the same request, which finds its own bytes
    /// (`Created`) if the first landed. A transport that cannot make it one atomic step (a
    /// run folder) refuses it with an error and writes nothing.
    CreateGuarded {
        /// The file: a store record, a snapshot's chunk or its manifest.
        file: FileRef,
        /// Its content.
        bytes: Vec<u8>,
        /// The writer's generation: refused once any epoch above it exists.
        generation: crate::Generation,
    },
    /// Replace `file` with `bytes` only if no epoch above `generation` exists, the check
    /// and the write one atomic step of the authority (PROTOCOL §18.2's guard for a record
    /// that is rewritten: `run.json` in an engine). Answer [`Response::Done`] or
    /// [`Response::Superseded`] (nothing written). Retrying it is safe (the put is
    /// idempotent; once refused it is refused for ever). A transport that cannot make it
    /// one atomic step (a run folder) refuses it with an error and writes nothing.
    ReplaceGuarded {
        /// The file (`run.json`).
        file: FileRef,
        /// Its new content.
        bytes: Vec<u8>,
        /// The writer's generation: refused once any epoch above it exists.
        generation: crate::Generation,
    },
    /// Read the store's records (`store/log/`) from sequence `from` on, in sequence order:
    /// answer [`Response::Records`] with the records that exist, at most `max_count` of
    /// them, stopping once their bytes reach `max_bytes` (at least one when any exists at
    /// or above `from`). The transport does not judge gaps: the reader sees the sequence
    /// of each.
    ReadStoreRecords {
        /// The first sequence wanted.
        from: crate::Sequence,
        /// At most this many records.
        max_count: u32,
        /// Stop after the record that reaches this many bytes.
        max_bytes: u64,
    },
    /// Read the caller's own monotonic clock (nanoseconds; `CLOCK_BOOTTIME` where there is
    /// one, which keeps counting while the machine sleeps): answer
    /// [`Response::Monotonic`]. The core has no clock of its own; a takeover reads it
    /// before its last look at the owner's beat and right before its commit, and refuses
    /// when more than half the owner's heartbeat interval passed between (PROTOCOL §7.4,
    /// OQ-5). A driver without a clock may answer a constant (the window then reads as 0).
    Monotonic,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Entries of a listed directory (any order).
    Listing(Vec<FileRef>),
    /// The answer to [`Request::CountEvents`].
    EventCount {
        /// Event files whose names parse.
        count: u64,
        /// The highest sequence among them (0: none).
        highest: u64,
    },
    /// File content, `None` when absent.
    Content(Option<Vec<u8>>),
    /// Whether the file exists.
    Exists(bool),
    /// The exclusive create succeeded.
    Created,
    /// The exclusive create lost: the file already existed (its content is untouched).
    AlreadyExists,
    /// A replace or remove completed.
    Done,
    /// Liveness evidence.
    Liveness(LivenessEvidence),
    /// The caller's monotonic clock, in nanoseconds.
    Monotonic(u64),
    /// A [`Request::CreateGuarded`] refused because an epoch above the writer's generation
    /// exists: nothing was written, and nothing of this writer's ever will be (epochs above
    /// a generation never all disappear: prune keeps the head).
    Superseded,
    /// The answer to [`Request::ReadStoreRecords`]: `(sequence, bytes)` in ascending order.
    Records(Vec<(crate::Sequence, Vec<u8>)>),
}

/// What an operation wants next.
#[derive(Debug, Clone)]
pub enum Step<T> {
    /// Perform this request and feed back its response.
    Io(Request),
    /// The operation finished.
    Done(Result<T, LeaseError>),
}

/// A protocol operation driven by its caller.
pub trait Operation {
    /// What a successful operation returns.
    type Output;
    /// Advance: `None` on the first call, then the response to the last request.
    fn next(&mut self, input: Option<Response>) -> Step<Self::Output>;
}

/// Run `op` to completion, performing each request with `io`: one `Result`, in the
/// adapter's error type `E`, into which the operation's own refusal ([`LeaseError`])
/// converts. An `Err` from `io` (an I/O failure in the adapter) stops the operation. A
/// caller that must tell the two apart (a release whose compaction failed after it
/// committed) uses [`drive_split`].
///
/// ```
/// use lease_core::ops::{drive, LogEnd, Request, Response};
/// use lease_core::LeaseError;
/// // The last sequence of an empty event log (0): every probe answers "absent".
/// let end = drive(&mut LogEnd::new(), |req| -> Result<Response, LeaseError> {
///     Ok(match req {
///         Request::List(_) => Response::Listing(vec![]),
///         Request::Exists(_) => Response::Exists(false),
///         other => unreachable!("{other:?}"),
///     })
/// })?;
/// assert_eq!(end, 0);
/// # Ok::<(), LeaseError>(())
/// ```
pub fn drive<O: Operation, E: From<LeaseError>>(
    op: &mut O,
    io: impl FnMut(Request) -> Result<Response, E>,
) -> Result<O::Output, E> {
    drive_split(op, io)?.map_err(E::from)
}

/// [`drive`], keeping the adapter's failure (the outer `Err`: a request could not be
/// performed) apart from the operation's refusal (the inner `Err`).
pub fn drive_split<O: Operation, E>(
    op: &mut O,
    mut io: impl FnMut(Request) -> Result<Response, E>,
) -> Result<Result<O::Output, LeaseError>, E> {
    let mut input = None;
    loop {
        match op.next(input.take()) {
            Step::Io(req) => input = Some(io(req)?),
            Step::Done(result) => return Ok(result),
        }
    }
}

fn violation(expected: &str, got: &Option<Response>) -> LeaseError {
    LeaseError::ProtocolViolation {
        detail: format!("expected {expected}, got {got:?}"),
    }
}

/// The outcome of feeding a sub-machine.
pub(crate) enum Sub<T> {
    Io(Request),
    Done(Result<T, LeaseError>),
}

/// Drive a sub-operation one step.
pub(crate) fn sub<O: Operation>(op: &mut O, input: Option<Response>) -> Sub<O::Output> {
    match op.next(input) {
        Step::Io(r) => Sub::Io(r),
        Step::Done(r) => Sub::Done(r),
    }
}

/// `?` for an operation's `next`: evaluate to the `Ok` value of `$e`, or finish the
/// operation with its error (`return Step::Done(Err(e))`).
macro_rules! step_try {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return $crate::ops::Step::Done(Err(e)),
        }
    };
}
pub(crate) use step_try;

/// The listing that answered a `Request::List`, else a protocol violation naming what came.
pub(crate) fn listing(input: Option<Response>) -> Result<Vec<FileRef>, LeaseError> {
    match input {
        Some(Response::Listing(l)) => Ok(l),
        other => Err(violation("Listing", &other)),
    }
}

/// Unwrap a sub-machine step inside a parent's `next`: returns the parent's request or
/// error early, or evaluates to the sub-machine's output.
macro_rules! step_sub {
    ($op:expr, $input:expr) => {
        match $crate::ops::sub($op, $input) {
            $crate::ops::Sub::Io(r) => return $crate::ops::Step::Io(r),
            $crate::ops::Sub::Done(Err(e)) => return $crate::ops::Step::Done(Err(e)),
            $crate::ops::Sub::Done(Ok(v)) => v,
        }
    };
}
pub(crate) use step_sub;

/// Advance the sub-machine `$sub` held in state `$variant($stash.., $sub)` of `$st` by one
/// input: on a request, put the state back and return the request; on an error, return it;
/// on success, evaluate to `($stash.., output)` (or just `output` with no stash).
macro_rules! sub_step {
    ($st:expr, $variant:path, [], $sub:ident, $input:expr) => {{
        let mut $sub = $sub;
        match $sub.next($input) {
            $crate::ops::Step::Io(r) => {
                $st = $variant($sub);
                return $crate::ops::Step::Io(r);
            }
            $crate::ops::Step::Done(Err(e)) => return $crate::ops::Step::Done(Err(e)),
            $crate::ops::Step::Done(Ok(v)) => v,
        }
    }};
    ($st:expr, $variant:path, [$($stash:ident),+], $sub:ident, $input:expr) => {{
        let mut $sub = $sub;
        match $sub.next($input) {
            $crate::ops::Step::Io(r) => {
                $st = $variant($($stash,)+ $sub);
                return $crate::ops::Step::Io(r);
            }
            $crate::ops::Step::Done(Err(e)) => return $crate::ops::Step::Done(Err(e)),
            $crate::ops::Step::Done(Ok(v)) => ($($stash,)+ v),
        }
    }};
}
pub(crate) use sub_step;
