//! The typed error of lease-fs: protocol errors from lease-core plus I/O and layout errors,
//! each naming the run and the file.

use lease_core::Code;
use lease_core::LeaseError;
use std::io;

/// Every failure of the file-system adapter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// A protocol outcome (held, fenced, invalid record, ...), see [`LeaseError`].
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The run folder does not exist.
    #[error("run folder {path} does not exist")]
    RunNotFound {
        /// The folder.
        path: String,
    },
    /// The run root was renamed, replaced, deleted or unmounted while open.
    #[error("run folder {path} changed underneath: {detail}; nothing was written through it")]
    RootChanged {
        /// The folder.
        path: String,
        /// What changed.
        detail: String,
    },
    /// Something in the run folder is not what the layout allows (a symlink, a file where
    /// a folder should be, a folder where a file should be), or a path named like a record
    /// that is not a record file (a directory, symlink, FIFO, socket, device or a file over
    /// the record limit: [`crate::fs::NotARecord`], the same error from every primitive).
    #[error("run {run}: {path}: {detail}")]
    LayoutInvalid {
        /// The run.
        run: String,
        /// The offending path, relative to the run root.
        path: String,
        /// What is wrong.
        detail: String,
    },
    /// The run folder, or a file or folder in it that runlease reads or writes, is not
    /// owned by the effective uid or is open to others (a folder writable by group or
    /// others, a file with any group or other permission bit). Refused before anything is
    /// read or written through it; nothing is ever chmodded. (`runlease` exits 77, sysexits `EX_NOPERM`).
    #[error("run {run}: {detail}")]
    NotOwned {
        /// The run.
        run: String,
        /// The offending path relative to the run root (`""`: the root itself).
        path: String,
        /// Its owner uid.
        uid: u32,
        /// Its permission bits.
        mode: u32,
        /// What is wrong and the fix (names the absolute path, owner and mode).
        detail: String,
    },
    /// An existing folder that is not empty and is not a run yet (no `lease/epochs/`), or
    /// the current folder, one of its parents or `/`, was given to a command that creates a
    /// run only in a missing or empty folder. Nothing was written; `runlease init` (or
    /// `run --init`) makes it a run explicitly. sysexits `EX_USAGE` (64).
    #[error("{path}: {detail}")]
    FolderForeign {
        /// The folder.
        path: String,
        /// Why it is refused and what to do.
        detail: String,
    },
    /// Another process on this host holds the run's kernel owner lock (`owner.lock`):
    /// [`crate::OwnedRun::claim`] wrote nothing (exit 76 in the CLI).
    #[error("run {run}: another process on this host holds its owner lock")]
    OwnerLockHeld {
        /// The run folder.
        run: String,
    },
    /// A system call failed.
    #[error("run {run}: {op} {path}: {source}")]
    Io {
        /// The run.
        run: String,
        /// The operation (`read`, `link`, `fsync`, ...).
        op: &'static str,
        /// The path, relative to the run root.
        path: String,
        /// The OS error.
        source: io::Error,
    },
}

impl FsError {
    /// Stable machine-readable code.
    pub fn code(&self) -> Code {
        match self {
            FsError::Lease(e) => e.code(),
            FsError::RunNotFound { .. } => Code::RunNotFound,
            FsError::OwnerLockHeld { .. } => Code::OwnerLockHeld,
            FsError::RootChanged { .. } => Code::RunRootChanged,
            FsError::LayoutInvalid { .. } => Code::RunLayoutInvalid,
            FsError::NotOwned { .. } => Code::RunNotOwned,
            FsError::FolderForeign { .. } => Code::RunFolderForeign,
            FsError::Io { .. } => Code::IoError,
        }
    }

    /// The protocol error inside, if this is one.
    pub fn lease(&self) -> Option<&LeaseError> {
        match self {
            FsError::Lease(e) => Some(e),
            _ => None,
        }
    }

    /// Whether this is a fence (`FENCED`, from the protocol inside): nothing the caller's
    /// generation writes counts any more. The same judgement as `lease_run::RunError::is_fenced`.
    ///
    /// ```
    /// use lease_core::{Generation, LeaseError};
    /// use lease_fs::FsError;
    /// let e = FsError::from(LeaseError::Fenced {
    ///     run: "r".into(),
    ///     generation: Generation::new(2).unwrap(),
    ///     detail: "superseded by generation 3".into(),
    /// });
    /// assert!(e.is_fenced());
    /// assert!(!FsError::RunNotFound { path: "/r".into() }.is_fenced());
    /// ```
    pub fn is_fenced(&self) -> bool {
        self.code() == Code::Fenced
    }

    /// Wrap an `io::Error` of operation `op` on `path`, classifying layout problems.
    pub fn io(run: &str, op: &'static str, path: &str, source: io::Error) -> FsError {
        // A path named like a record that is not a record file (PROTOCOL §5.1): one
        // classification, whichever primitive met it (read, exists, list, count).
        if let Some(n) = crate::fs::not_a_record_in(&source) {
            return FsError::LayoutInvalid {
                run: run.to_string(),
                path: n.path.clone(),
                detail: n.describe(),
            };
        }
        // An untrusted file or folder (lease-fs's check on the descriptor it holds).
        if let Some(n) = crate::real::not_owned_in(&source) {
            return FsError::NotOwned {
                run: run.to_string(),
                path: n.path.clone(),
                uid: n.uid,
                mode: n.mode,
                detail: n.describe(),
            };
        }
        // lease-fs wraps refusals in an error naming the path (`io::Error::new` with the
        // original error as source), which has no raw errno of its own: look through it.
        let raw = source.raw_os_error().or_else(|| {
            let mut cur = source
                .get_ref()
                .map(|e| e as &(dyn std::error::Error + 'static));
            while let Some(e) = cur {
                if let Some(raw) = e
                    .downcast_ref::<io::Error>()
                    .and_then(io::Error::raw_os_error)
                {
                    return Some(raw);
                }
                cur = e.source();
            }
            None
        });
        // ELOOP (symlink with O_NOFOLLOW), ENOTDIR, EISDIR, EXDEV from RESOLVE_BENEATH.
        if matches!(raw, Some(40) | Some(20) | Some(21) | Some(18))
            || source.kind() == io::ErrorKind::NotADirectory
            || source.kind() == io::ErrorKind::IsADirectory
        {
            return FsError::LayoutInvalid {
                run: run.to_string(),
                path: path.to_string(),
                detail: format!(
                    "{op}: {source} (symlinks and misplaced files or folders are refused, never followed)"
                ),
            };
        }
        FsError::Io {
            run: run.to_string(),
            op,
            path: path.to_string(),
            source,
        }
    }
}

/// Every lease-fs specific code (protocol codes are in
/// [`lease_core::ERROR_CODES`]).
pub const FS_ERROR_CODES: &[Code] = &[
    Code::RunNotFound,
    Code::RunRootChanged,
    Code::RunLayoutInvalid,
    Code::IoError,
    Code::RunNotOwned,
    Code::RunFolderForeign,
    Code::OwnerLockHeld,
];
