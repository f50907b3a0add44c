//! The common sub-steps of the operations (`docs/PROTOCOL.md` §7.0), shared by the
//! ownership changes (`lease`), the event log (`log`), the status read (`observe`) and
//! compaction (`prune`): OBSERVE the head, RECHECK supersession, find the log TAIL, and
//! FINALIZE a cutoff (with its SYNC points), plus the decoding of the records they read.
//! GATE and ADOPTION, used only by the ownership changes, live with them in `lease`.
//!
//! Every operation module imports these from here and none from another operation module,
//! so there is no import cycle between them.

mod decode;
mod finalize;
mod observe;
mod recheck;
mod tail;

pub(crate) use decode::{
    decode_beat, decode_checkpoint, decode_cutoff, decode_epoch, decode_named, epochs_of,
    newest_checkpoint, numbers_of,
};
pub(crate) use finalize::{Cut, Finalize, removed_cutoff};
pub use observe::Head;
pub(crate) use observe::{Observe, Observed, read_beat};
pub(crate) use recheck::Recheck;
pub(crate) use tail::Tail;
