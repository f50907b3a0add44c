//! The event log: append with a fencing post-check, authoritative reads, chain verification.
//!
//! `append` writes, `authority` judges an event against the chain (pure), `read` walks the
//! log and the chain ([`ReadEvents`], [`JudgeLog`]), `verify` checks both hash chains.

mod append;
mod mark;
mod read;
mod standing;
mod verify;

pub use append::{Append, AppendParams, Appended, MAX_APPEND_COLLISIONS};
pub use mark::{LogEnd, MARK_EVERY, WriteMark};
pub(crate) use mark::{decode_mark, mark_mismatch, mark_past_end, marks_of};
pub use read::{EventLogView, JudgeLog, JudgedEvent, ReadEvents};
pub use standing::{ChainView, Standing, judge_event};
pub use verify::{ShortTail, Verify, VerifyReport};

use crate::error::LeaseError;
use crate::ids::{RunId, Sequence};
use crate::layout::FileRef;
use crate::records::Event;

/// `EVENT_LOG_GAP`: event `missing` is absent though `later` exists (0: it existed a moment
/// ago).
fn gap(run: &RunId, missing: u64, later: u64) -> LeaseError {
    LeaseError::EventLogGap {
        run: run.to_string(),
        missing,
        later,
    }
}

pub(crate) fn decode_event(run: &RunId, s: Sequence, bytes: &[u8]) -> Result<Event, LeaseError> {
    crate::ops::common::decode_named(run, FileRef::Event(s), s.get(), bytes)
}
