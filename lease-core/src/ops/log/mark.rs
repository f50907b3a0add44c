//! Verified-prefix marks (PROTOCOL §13.1, issue #33): where a tail check of the log may
//! start instead of at event 1, and the operation that writes one.

use crate::canonical::encode;
use crate::error::LeaseError;
use crate::ids::{Digest, Identity, RunId, Sequence};
use crate::layout::{Dir, FileRef};
use crate::ops::{
    Durability, Operation, Request, Response, Step, listing, step_try, sub_step, violation,
};
use crate::records::VerifiedMark;
use crate::time::Timestamp;

/// A writer that checked at least this many events past the newest mark writes a new one
/// at the last event it checked, once its own write succeeded; and every appender whose
/// acknowledged event's sequence is a multiple of it writes one (after checking the tail):
/// so a tail check reads at most about twice this many events whatever the log's length.
pub const MARK_EVERY: u64 = 64;

/// The marks of a listing, oldest first.
pub(crate) fn marks_of(listing: Vec<FileRef>) -> Vec<Sequence> {
    crate::ops::common::numbers_of(listing, FileRef::mark)
}

/// Decode mark `s`, checked against its name and run.
pub(crate) fn decode_mark(
    run: &RunId,
    s: Sequence,
    bytes: &[u8],
) -> Result<VerifiedMark, LeaseError> {
    crate::ops::common::decode_named(run, FileRef::Mark(s), s.get(), bytes)
}

/// `CHAIN_BROKEN` for a mark whose event is not the one it recorded.
pub(crate) fn mark_mismatch(run: &RunId, s: Sequence) -> LeaseError {
    LeaseError::ChainBroken {
        run: run.to_string(),
        chain: "event",
        at: s.get(),
        detail: format!(
            "event {s} is not the one {} recorded (its hash differs): the log was rewritten below the mark",
            FileRef::Mark(s).path()
        ),
    }
}

/// `CHAIN_BROKEN` for a mark that names an event past the end of the log (`tail`: where
/// the log ends, when the caller walked it; `None`: event `s` and the one after it are
/// missing).
pub(crate) fn mark_past_end(run: &RunId, s: Sequence, tail: Option<u64>) -> LeaseError {
    let found = match tail {
        Some(t) => format!("the log ends at {t}"),
        None => format!("event {s} and the event after it are missing"),
    };
    LeaseError::ChainBroken {
        run: run.to_string(),
        chain: "event",
        at: s.get(),
        detail: format!(
            "{} says events 1..={s} were verified, but {found}: the log's tail was deleted (or the folder restored from an older copy)",
            FileRef::Mark(s).path()
        ),
    }
}

/// Write a verified-prefix mark at event `through` whose hash is `hash`, as the caller
/// checked it (by a tail check from the newest mark, [`crate::ops::Verify::tail`], or a
/// full [`crate::ops::Verify`]). Not a judgment of authority: a mark only says where a
/// later tail check may start.
///
/// Order of writes: `SyncDir(events)` (every event up to `through` durable first, so a
/// power loss never leaves a mark above the log's durable end) → `CreateExclusive(mark)`
/// (temp, write, fsync, link, fsync `lease/marks/`) → `List(marks)` → `Remove(older
/// mark, NoFsync)` each. A crash between any two steps leaves the log as it was and
/// either no new mark (the older ones still hold) or the new one beside older ones (the
/// newest is used; an older one that a power loss brings back is a valid mark too). A
/// mark that already exists (another writer's, of the same event) is kept as it is.
#[derive(Debug, Clone)]
pub struct WriteMark {
    through: Sequence,
    bytes: Vec<u8>,
    st: MarkState,
}

#[derive(Debug, Clone)]
enum MarkState {
    Start,
    Synced,
    Created,
    Removing(Vec<Sequence>),
    Done,
}

impl WriteMark {
    /// Mark events `1..=through` of `run` as verified, event `through` hashing to `hash`;
    /// `by` and `now` are recorded, never judged.
    pub fn new(
        run: RunId,
        through: Sequence,
        hash: Digest,
        by: Identity,
        now: Timestamp,
    ) -> Result<WriteMark, LeaseError> {
        let bytes = encode(&VerifiedMark {
            run_id: run,
            through_sequence: through,
            through_hash: hash,
            verified_at: now,
            verified_by: by,
        })?;
        Ok(WriteMark {
            through,
            bytes,
            st: MarkState::Start,
        })
    }

    fn remove_next(&mut self, mut older: Vec<Sequence>) -> Step<Sequence> {
        match older.pop() {
            Some(s) => {
                self.st = MarkState::Removing(older);
                Step::Io(Request::Remove(FileRef::Mark(s), Durability::NoFsync))
            }
            None => Step::Done(Ok(self.through)),
        }
    }
}

impl Operation for WriteMark {
    type Output = Sequence;
    fn next(&mut self, input: Option<Response>) -> Step<Sequence> {
        match std::mem::replace(&mut self.st, MarkState::Done) {
            MarkState::Start => {
                self.st = MarkState::Synced;
                if crate::mutant::mutant("mark_before_events_durable") {
                    return self.next(Some(Response::Done));
                }
                Step::Io(Request::SyncDir(Dir::Events))
            }
            MarkState::Synced => match input {
                Some(Response::Done) => {
                    self.st = MarkState::Created;
                    Step::Io(Request::CreateExclusive(
                        FileRef::Mark(self.through),
                        std::mem::take(&mut self.bytes),
                    ))
                }
                other => Step::Done(Err(violation("Done", &other))),
            },
            MarkState::Created => match input {
                Some(Response::Created | Response::AlreadyExists) => {
                    self.st = MarkState::Removing(Vec::new());
                    Step::Io(Request::List(Dir::Marks))
                }
                other => Step::Done(Err(violation("Created", &other))),
            },
            MarkState::Removing(older) => match input {
                Some(Response::Listing(l)) => {
                    let through = self.through;
                    let older = marks_of(l).into_iter().filter(|s| *s < through).collect();
                    self.remove_next(older)
                }
                Some(Response::Done) => self.remove_next(older),
                other => Step::Done(Err(violation("Listing or Done", &other))),
            },
            MarkState::Done => Step::Done(Err(violation("nothing (the mark is written)", &input))),
        }
    }
}

/// The last sequence of the log (0 when empty), found from the newest verified-prefix
/// mark with TAIL's `Exists` probes (PROTOCOL §7.0), never by listing `events/`: O(log n)
/// requests, whatever the log's length. Checks nothing (the mark is not read, its event
/// is assumed present): a bound and a place to look, for callers that then read and check
/// what they need ([`crate::ops::Verify::tail`] does).
#[derive(Debug, Clone)]
pub struct LogEnd {
    st: EndState,
}

#[derive(Debug, Clone)]
enum EndState {
    Start,
    Listed,
    Tail(crate::ops::common::Tail),
    Done,
}

impl LogEnd {
    /// Find the end of the log.
    pub fn new() -> LogEnd {
        LogEnd {
            st: EndState::Start,
        }
    }
}

impl Default for LogEnd {
    fn default() -> LogEnd {
        LogEnd::new()
    }
}

impl Operation for LogEnd {
    type Output = u64;
    fn next(&mut self, input: Option<Response>) -> Step<u64> {
        match std::mem::replace(&mut self.st, EndState::Done) {
            EndState::Start => {
                self.st = EndState::Listed;
                Step::Io(Request::List(Dir::Marks))
            }
            EndState::Listed => {
                let l = step_try!(listing(input));
                let from = marks_of(l).pop().map_or(0, Sequence::get);
                let t = crate::ops::common::Tail::new(from);
                Step::Done(Ok(sub_step!(self.st, EndState::Tail, [], t, None)))
            }
            EndState::Tail(t) => Step::Done(Ok(sub_step!(self.st, EndState::Tail, [], t, input))),
            EndState::Done => Step::Done(Err(violation("nothing (the end was found)", &input))),
        }
    }
}
