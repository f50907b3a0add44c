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

use crate::canonical::decode_for;
use crate::error::{LeaseError, RecordKind};
use crate::ids::{RunId, Sequence};
use crate::layout::FileRef;
use crate::records::Event;

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
