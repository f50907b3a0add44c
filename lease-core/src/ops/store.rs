//! The engine-committed store's operations (PROTOCOL.md §18, issue #32): commit one record
//! under the engine's guard, read and check the record log, write and read a snapshot.
//!
//! Like the lease's, each is a sans-IO step machine over the [`Request`] vocabulary: an
//! engine transport (lease-etcd) performs [`Request::CreateGuarded`] as one atomic step,
//! so the engine itself refuses a deposed generation's record.
//!
//! One module a job: `commit` (a record under the guard, and commit ids), `read` (the
//! record log, read and checked), `snapshot` (a snapshot's image written and read),
//! `truncate` (what a snapshot made unnecessary, removed). Here: the two refusals they
//! share.

mod commit;
mod read;
mod snapshot;
mod truncate;

pub use commit::{CommitParams, CommitRecord, Committed, commit_id};
pub use read::{LoggedRecord, READ_PAGE_BYTES, READ_PAGE_RECORDS, ReadStoreLog, StoreLogView};
pub use snapshot::{ReadSnapshot, WriteSnapshot};
pub use truncate::{TruncateStoreLog, Truncated};

use crate::error::LeaseError;
use crate::ids::{Generation, RunId};
use crate::layout::FileRef;

/// `FENCED`: `generation` of `run` was superseded; `detail` says how it was seen.
fn fenced(run: &RunId, generation: Generation, detail: impl Into<String>) -> LeaseError {
    LeaseError::Fenced {
        run: run.to_string(),
        generation,
        detail: detail.into(),
    }
}

/// `STORE_LOG_INVALID` about `file`: the log is damaged, not merely changing.
fn log_invalid(run: &RunId, file: FileRef, detail: impl Into<String>) -> LeaseError {
    LeaseError::StoreLogInvalid {
        run: run.to_string(),
        file: file.path(),
        detail: detail.into(),
    }
}
