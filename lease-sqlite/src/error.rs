//! The one typed error of lease-sqlite, with stable codes.
//!
//! Every message names the run and the store file. `runlease` maps the codes to sysexits
//! exit codes (README.md "Exit codes"): 64 usage, 65 data, 70 internal or unsupported
//! schema, 74 I/O, 75 fenced or temporary.

use lease_core::Code;
use lease_core::LeaseError;

/// Every failure of the store.
///
/// Each variant has a stable [`code`](StoreError::code); [`STORE_ERROR_CODES`] lists them
/// all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A protocol outcome from lease-core: `STORE_BEHIND_SEAL` and `STORE_IDENTITY_MISMATCH`
    /// from the seal check, or whatever the commit gate (the run layer's self-fence check)
    /// returned, usually `FENCED`. Its code is the inner error's. Its message is the inner
    /// one with the file added, and it reports no `source()` of its own (as a transparent
    /// wrapper): a chain printer (`anyhow`'s `{:#}`) then says the message once, not twice.
    /// The protocol error itself: [`StoreError::lease`].
    #[error("{error}{}", file_suffix(.file))]
    Lease {
        /// The store file, when the refusal concerns one.
        file: Option<String>,
        /// The protocol error.
        error: LeaseError,
    },
    /// A commit carried a fencing token below the highest one the store has accepted: its
    /// writer has been superseded. Nothing of the commit was written.
    #[error(
        "run {run}: store {file} refused a commit with token (generation) {token}: it has accepted token {max_token}; nothing was written"
    )]
    Fenced {
        /// The run.
        run: String,
        /// The store file.
        file: String,
        /// The refused token.
        token: u64,
        /// The highest token the store has accepted.
        max_token: u64,
    },
    /// A record of the engine's store log was applied to a view
    /// ([`crate::Store::apply_record`]) that is not at the record before it: its last
    /// record is not `record - 1`, or its last commit not `first_commit - 1`. Nothing was
    /// written. Code `CONCURRENT_CHANGE` (75, re-read and retry): the view moved, or is
    /// behind or ahead of what the caller read; read [`crate::Store::view_position`] and
    /// apply the records after it, or rebuild the view.
    #[error(
        "run {run}: view {file} is at record {at_record} (last commit {at_commits}); record {record} (first commit {first_commit}) applies only to the view at record {} and commit {}; nothing was written",
        .record.saturating_sub(1),
        .first_commit.saturating_sub(1)
    )]
    ViewNotAt {
        /// The run.
        run: String,
        /// The view file.
        file: String,
        /// The view's last applied record.
        at_record: u64,
        /// The view's last commit.
        at_commits: u64,
        /// The record that was to be applied.
        record: u64,
        /// Its first commit's sequence.
        first_commit: u64,
    },
    /// The store file is in use: this process already has it open (see the crate docs, "One
    /// connection per file per process"), or another process holds SQLite's exclusive lock
    /// on it. Retry once the other handle is closed.
    #[error("run {run}: store {file} is in use: {detail}")]
    Busy {
        /// The run.
        run: String,
        /// The store file.
        file: String,
        /// Who holds it, as far as known.
        detail: String,
    },
    /// The file in the store's place is not a valid runlease store database: not SQLite,
    /// truncated, damaged, empty, a directory or a symlink. It was not changed.
    #[error("run {run}: store {file} is not a valid store: {detail}; the file was left as it is")]
    Corrupt {
        /// The run.
        run: String,
        /// The store file.
        file: String,
        /// What is wrong.
        detail: String,
    },
    /// A store file, its write-ahead log or journal, or its folder is not trusted: owned
    /// by another uid than the effective one, or writable by group or others (the rule
    /// lease-fs applies to every record of a run, `RUN_NOT_OWNED`, 77). Nothing was read
    /// from it by SQLite and nothing was written.
    #[error("run {run}: store {file}: {detail}")]
    NotOwned {
        /// The run.
        run: String,
        /// The store file.
        file: String,
        /// Which file, its owner and mode, what is wrong and the fix.
        detail: String,
    },
    /// The store was created for another run: its SQLite `application_id` (set at creation
    /// from the run id, see the crate docs) is not this run's. It was not changed.
    #[error(
        "run {run}: store {file} belongs to another run (its application id is {found:08x}, this run's is {expected:08x}); the file was left as it is"
    )]
    OtherRun {
        /// The run.
        run: String,
        /// The store file.
        file: String,
        /// The application id found.
        found: u32,
        /// This run's.
        expected: u32,
    },
    /// A read-only open ([`crate::Store::open_read_only`]) found what only an owner's open
    /// can make readable: a write-ahead log left by an owner that did not close the store
    /// (a crash or a kill) holds its last commits, and replaying it writes. Nothing was
    /// changed; read again after the next owner's open (same code as `Busy`: retry later).
    #[error("run {run}: store {file} cannot be read without an owner: {detail}")]
    NeedsOwner {
        /// The run.
        run: String,
        /// The store file.
        file: String,
        /// What is there, and what to do.
        detail: String,
    },
    /// The store file does not exist and may not be created here (`create` was false, or a
    /// particular store was expected).
    #[error("run {run}: store {file} does not exist: {detail}")]
    Missing {
        /// The run.
        run: String,
        /// The store file.
        file: String,
        /// Why it was not created.
        detail: String,
    },
    /// The database has a schema version this build does not know (newer, unknown, or not
    /// a runlease store at all). It was not altered.
    #[error(
        "run {run}: store {file} has schema version {found}; this build reads version {supported}; the file was left as it is"
    )]
    SchemaUnsupported {
        /// The run.
        run: String,
        /// The store file.
        file: String,
        /// What was found (a version number, or a description).
        found: String,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// A durability setting did not take effect (read back differently); the store was not
    /// used.
    #[error("run {run}: store {file}: durability settings did not take: {mismatches}")]
    Pragma {
        /// The run.
        run: String,
        /// The store file.
        file: String,
        /// Each `pragma: wanted X, got Y`.
        mismatches: String,
    },
    /// A system call or SQLite I/O failed (disk full, I/O error, permission). A handle that
    /// saw one during a commit refuses every later call the same way.
    #[error("run {run}: store {file}: {op}: {detail}")]
    Io {
        /// The run.
        run: String,
        /// The store file (or the folder, for folder operations).
        file: String,
        /// The operation.
        op: &'static str,
        /// The OS or SQLite error.
        detail: String,
    },
    /// A caller-supplied argument is out of range (a token or sequence above `i64::MAX`).
    #[error("{what}: {reason}")]
    ArgumentInvalid {
        /// Which argument.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// An unexpected SQLite error (a bug here, or a store edited by hand).
    #[error("run {run}: store {file}: {op}: {detail}")]
    Internal {
        /// The run.
        run: String,
        /// The store file.
        file: String,
        /// The operation.
        op: &'static str,
        /// The SQLite error.
        detail: String,
    },
}

fn file_suffix(file: &Option<String>) -> String {
    match file {
        Some(f) => format!(" (store file {f})"),
        None => String::new(),
    }
}

impl From<LeaseError> for StoreError {
    fn from(error: LeaseError) -> Self {
        StoreError::Lease { file: None, error }
    }
}

impl StoreError {
    /// The stable, machine-readable code of this error.
    pub fn code(&self) -> Code {
        match self {
            StoreError::Lease { error, .. } => error.code(),
            StoreError::Fenced { .. } => Code::Fenced,
            StoreError::ViewNotAt { .. } => Code::ConcurrentChange,
            StoreError::Busy { .. } | StoreError::NeedsOwner { .. } => Code::StoreBusy,
            StoreError::Corrupt { .. } => Code::StoreCorrupt,
            StoreError::Missing { .. } => Code::StoreMissing,
            StoreError::OtherRun { .. } => Code::StoreIdentityMismatch,
            StoreError::NotOwned { .. } => Code::RunNotOwned,
            StoreError::SchemaUnsupported { .. } => Code::SchemaUnsupported,
            StoreError::Pragma { .. } => Code::StorePragma,
            StoreError::Io { .. } => Code::StoreIo,
            StoreError::ArgumentInvalid { .. } => Code::ArgumentInvalid,
            StoreError::Internal { .. } => Code::StoreInternal,
        }
    }

    /// The protocol error inside, if this is one.
    pub fn lease(&self) -> Option<&LeaseError> {
        match self {
            StoreError::Lease { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether this is a fence (`FENCED`): the store refused the generation's token (a
    /// higher one committed), or the commit gate said the run is fenced. Nothing the caller's
    /// generation commits counts any more.
    ///
    /// ```
    /// use lease_sqlite::StoreError;
    /// let e = StoreError::Fenced {
    ///     run: "r".into(),
    ///     file: "store/run.sqlite".into(),
    ///     token: 2,
    ///     max_token: 3,
    /// };
    /// assert!(e.is_fenced());
    /// ```
    pub fn is_fenced(&self) -> bool {
        self.code() == Code::Fenced
    }

    /// Attach the store file to a protocol error that does not name one yet.
    pub(crate) fn in_file(mut self, path: &str) -> Self {
        if let StoreError::Lease { file, .. } = &mut self {
            if file.is_none() {
                *file = Some(path.to_string());
            }
        }
        self
    }
}

/// Every lease-sqlite specific code (the seal codes `STORE_BEHIND_SEAL`
/// and `STORE_IDENTITY_MISMATCH`, 65, and `CONCURRENT_CHANGE`, 75, of a view not at the
/// record before, are in [`lease_core::ERROR_CODES`]).
pub const STORE_ERROR_CODES: &[Code] = &[
    Code::ArgumentInvalid,
    Code::StoreIdentityMismatch,
    Code::StoreCorrupt,
    Code::StoreMissing,
    Code::SchemaUnsupported,
    Code::StorePragma,
    Code::StoreInternal,
    Code::StoreIo,
    Code::Fenced,
    Code::StoreBusy,
    Code::RunNotOwned,
];

#[cfg(test)]
mod tests {
    use super::*;

    /// A chain printer (what `anyhow` does for `{:#}`: each error's message, then its
    /// `source()`'s) says a wrapped protocol error once, with the store file (issue #34).
    #[test]
    fn a_wrapped_lease_error_is_said_once_in_a_chain() {
        let e = StoreError::from(LeaseError::Fenced {
            run: "r".into(),
            generation: lease_core::Generation::new(2).unwrap(),
            detail: "superseded by generation 3".into(),
        })
        .in_file("store/run.sqlite");
        let mut chain = e.to_string();
        let mut cur = std::error::Error::source(&e);
        while let Some(s) = cur {
            chain.push_str(": ");
            chain.push_str(&s.to_string());
            cur = s.source();
        }
        assert_eq!(
            chain.matches("superseded by generation 3").count(),
            1,
            "{chain}"
        );
        assert!(chain.contains("store/run.sqlite"), "{chain}");
        assert!(e.is_fenced() && e.lease().is_some());
    }
}
