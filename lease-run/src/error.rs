//! The typed error of lease-run, with a stable code (the CLI maps codes to exit codes).

use lease_core::Code;
use lease_core::LeaseError;
use lease_fs::FsError;
use lease_sqlite::StoreError;

/// Why a run operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// A lease-fs error (I/O, layout, or a protocol error from lease-core met on the run
    /// folder).
    #[error(transparent)]
    Fs(#[from] FsError),
    /// A protocol error from lease-core raised by the run layer itself, whichever backend
    /// holds the lease (not labelled a file-system error).
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// A store error (lease-sqlite): a refused seal or floor (`STORE_BEHIND_SEAL`,
    /// `STORE_IDENTITY_MISMATCH`), a corrupt or missing store, a fenced commit, I/O.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An etcd authority error (feature `etcd`): its own codes
    /// (`UNAVAILABLE` 69 when the cluster did not answer in time, protocol codes as on the
    /// file system).
    #[cfg(feature = "etcd")]
    #[error(transparent)]
    Etcd(#[from] lease_etcd::EtcdError),
    /// Bad options, refused before anything was touched.
    #[error("{0}")]
    InvalidArgument(String),
    /// Another process on this host holds the run's kernel owner lock.
    #[error("run {run}: another process on this host holds its owner lock")]
    OwnerLockHeld {
        /// The run folder.
        run: String,
    },
    /// A command of a killed incarnation is still alive and could not be killed.
    #[error(
        "run {run}: command pid {pid} (group {pgid}) of generation {generation} survived SIGKILL; its record is kept"
    )]
    CommandsSurvive {
        /// The run.
        run: String,
        /// Its pid.
        pid: u32,
        /// Its process group.
        pgid: u32,
        /// The generation that started it.
        generation: u64,
    },
    /// A live process matches a command record of a killed incarnation (same boot, pid and
    /// start time) but cannot be proved to be the one that incarnation started (it does not
    /// carry the incarnation's secret, or the record predates it): it is left alone, and
    /// the open is refused, because if it is the old command it must not run beside a new
    /// one (PROTOCOL §11.1).
    #[error(
        "run {run}: {file} names live process {pid} (started {start_time} ticks after boot), but {why}; runlease signals only processes it can prove it started, so it left {pid} alone. If {pid} is this run's old command, stop it yourself (kill -TERM -- -{pid}) and remove {file}; if it is not, the record is wrong: remove {file}. Then run again"
    )]
    CommandUnproven {
        /// The run.
        run: String,
        /// The record, relative to the run folder.
        file: String,
        /// The process it names.
        pid: u32,
        /// Its start time.
        start_time: u64,
        /// What is missing.
        why: String,
    },
    /// The run folder holds more command records than runlease judges (issue #29:
    /// forged records made every judgement cost records × processes). Refused before any
    /// record is read, so the refusal costs one listing of `commands/`; nothing signalled,
    /// nothing written.
    #[error(
        "run {run}: {dir} holds {count} command records, more than the {limit} runlease judges (a run leaves one per command still running when its owner was killed); nothing was signalled or written. Check that no command of the run still runs (runlease doctor names what it can), move the records out of {dir} by hand, then run again"
    )]
    CommandRecordsOverLimit {
        /// The run.
        run: String,
        /// The folder, relative to the run folder (`commands`).
        dir: String,
        /// How many records it holds.
        count: usize,
        /// The limit ([`crate::MAX_COMMAND_RECORDS`]).
        limit: usize,
    },
    /// A process this run proved it started could not be signalled (`EPERM`): it is
    /// alive and not ours to kill any more (it changed its credentials).
    #[error(
        "run {run}: not permitted to signal process {pid} of generation {generation} ({detail}); its record is kept"
    )]
    NotPermitted {
        /// The run.
        run: String,
        /// The process.
        pid: u32,
        /// The generation that started it.
        generation: u64,
        /// The OS error.
        detail: String,
    },
    /// The run is fenced: it lost its lease (or could no longer prove it) and its commands
    /// were killed. Nothing more is written.
    #[error("run {run}: this owner is fenced: {reason}")]
    Fenced {
        /// The run.
        run: String,
        /// Why (the first fence).
        reason: String,
    },
    /// A step did not finish within its deadline.
    #[error("run {run}: step {step} did not finish within {ms} ms")]
    StepTimeout {
        /// The run.
        run: String,
        /// The step.
        step: &'static str,
        /// Its deadline.
        ms: u64,
    },
    /// The run was already released.
    #[error("run {run} was released")]
    Released {
        /// The run.
        run: String,
    },
    /// A command could not be started or recorded.
    #[error("run {run}: {detail}")]
    Spawn {
        /// The run.
        run: String,
        /// What failed.
        detail: String,
    },
    /// A refusal answered by the run's owner over its store socket
    /// ([`crate::store_client`]), with the owner's code and message; or the client's own
    /// refusal to talk to a socket that is not the owner's (`STORE_REQUEST_REFUSED`).
    #[error("{message}")]
    Served {
        /// The run.
        run: String,
        /// The owner's code (`FENCED`, `STORE_REQUEST_REFUSED`, a store code, ...).
        code: Code,
        /// The owner's message (it names the run).
        message: String,
    },
    /// An OS-level failure outside the run folder (clock, /proc, random) that has no
    /// `io::Error` behind it (or whose error is of another type).
    #[error("{0}")]
    Io(String),
    /// A system call outside the run folder failed (`/proc`, the boot id, a cgroup, a
    /// thread, a signal handler, the store socket): `IO_ERROR` as [`RunError::Io`], with the
    /// OS error kept as [`std::error::Error::source`] (its `kind()` and errno), as
    /// lease-fs's `FsError::Io` keeps it.
    #[error("{what}: {source}")]
    Os {
        /// What failed, naming the run or the path where there is one.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A bug in runlease: a task or thread of the run panicked (`INTERNAL`, exit 70 in the
    /// CLI), told apart from an I/O failure (74) so that an operator reports it instead of
    /// retrying. What the panicked work had written is judged as after a crash.
    #[error("{0} (a bug in runlease: please report it)")]
    Internal(String),
}

impl RunError {
    /// The stable error code.
    pub fn code(&self) -> Code {
        match self {
            RunError::Fs(e) => e.code(),
            RunError::Lease(e) => e.code(),
            RunError::Store(e) => e.code(),
            #[cfg(feature = "etcd")]
            RunError::Etcd(e) => e.code(),
            RunError::InvalidArgument(_) => Code::ArgumentInvalid,
            RunError::OwnerLockHeld { .. } => Code::OwnerLockHeld,
            RunError::CommandsSurvive { .. } => Code::RunCommandsSurvive,
            RunError::CommandUnproven { .. } => Code::RunCommandUnproven,
            RunError::NotPermitted { .. } => Code::RunCommandNotPermitted,
            RunError::CommandRecordsOverLimit { .. } => Code::RunCommandRecordsOverLimit,
            RunError::Fenced { .. } => Code::Fenced,
            RunError::StepTimeout { .. } => Code::StepTimeout,
            RunError::Released { .. } => Code::RunReleased,
            RunError::Spawn { .. } => Code::SpawnFailed,
            RunError::Served { code, .. } => *code,
            RunError::Io(_) | RunError::Os { .. } => Code::IoError,
            RunError::Internal(_) => Code::Internal,
        }
    }

    /// A failed system call outside the run folder ([`RunError::Os`]): `what` failed with `e`.
    pub(crate) fn os(what: impl Into<String>, e: std::io::Error) -> RunError {
        RunError::Os {
            what: what.into(),
            source: e,
        }
    }

    /// The error for a task of the run that ended without an answer (`what`: which one):
    /// `INTERNAL` when it panicked, `IO_ERROR` when the runtime stopped it (shutting down).
    pub(crate) fn from_join(what: &str, e: &tokio::task::JoinError) -> RunError {
        if e.is_panic() {
            RunError::Internal(format!("{what} panicked"))
        } else {
            RunError::Io(format!("{what} was stopped by the runtime shutting down"))
        }
    }

    /// Whether this error says the run is fenced (`FENCED`): it lost its lease and nothing
    /// it writes counts any more. One test for every shape a fence arrives in: the run's own
    /// [`RunError::Fenced`], the lease's `Fenced` (directly, or through the run folder or the
    /// store), and the store's refusal of a superseded fencing token.
    ///
    /// ```
    /// use lease_run::RunError;
    /// let e = RunError::Fenced { run: "r".into(), reason: "superseded by generation 3".into() };
    /// assert!(e.is_fenced());
    /// assert!(!RunError::Io("clock".into()).is_fenced());
    /// ```
    pub fn is_fenced(&self) -> bool {
        self.code() == Code::Fenced
    }

    /// The run file of a write whose outcome is unknown (`OUTCOME_UNKNOWN`, an etcd
    /// authority), when the write was about one: an event's file names its sequence.
    pub fn unknown_outcome_file(&self) -> Option<lease_core::FileRef> {
        match self {
            #[cfg(feature = "etcd")]
            RunError::Etcd(e) => e.unknown_outcome_file(),
            _ => None,
        }
    }

    /// The lease-core error inside, if any.
    pub fn lease(&self) -> Option<&LeaseError> {
        match self {
            RunError::Fs(e) => e.lease(),
            RunError::Lease(e) => Some(e),
            RunError::Store(e) => e.lease(),
            #[cfg(feature = "etcd")]
            RunError::Etcd(e) => e.lease(),
            _ => None,
        }
    }
}

/// Every lease-run specific code (the layers below have theirs:
/// `lease_core::ERROR_CODES`, `lease_fs::FS_ERROR_CODES`, `lease_sqlite::STORE_ERROR_CODES`,
/// `lease_etcd::ETCD_ERROR_CODES`; `ARGUMENT_INVALID`, `FENCED` and `IO_ERROR` are shared
/// with them).
pub const RUN_ERROR_CODES: &[Code] = &[
    Code::OwnerLockHeld,
    Code::RunCommandsSurvive,
    Code::RunCommandUnproven,
    Code::RunCommandNotPermitted,
    Code::RunCommandRecordsOverLimit,
    Code::StepTimeout,
    Code::RunReleased,
    Code::SpawnFailed,
    Code::StoreRequestRefused,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_of_a_fence_is_fenced_and_nothing_else_is() {
        let lease = || LeaseError::Fenced {
            run: "r".into(),
            generation: lease_core::Generation::FIRST,
            detail: "superseded by generation 2".into(),
        };
        let fenced = [
            RunError::Fenced {
                run: "r".into(),
                reason: "x".into(),
            },
            RunError::Lease(lease()),
            RunError::Fs(lease_fs::FsError::Lease(lease())),
            RunError::Store(lease_sqlite::StoreError::Fenced {
                run: "r".into(),
                file: "store/run.sqlite".into(),
                token: 1,
                max_token: 2,
            }),
            RunError::Store(lease_sqlite::StoreError::from(lease())),
        ];
        for e in &fenced {
            assert!(e.is_fenced(), "{e:?}");
        }
        let not = [
            RunError::Io("x".into()),
            RunError::Released { run: "r".into() },
            RunError::Lease(LeaseError::TakeoverRace {
                run: "r".into(),
                detail: "d".into(),
            }),
        ];
        for e in &not {
            assert!(!e.is_fenced(), "{e:?}");
        }
    }

    #[test]
    fn codes_table_matches_the_variants() {
        let run = || "r".to_string();
        let own = [
            RunError::OwnerLockHeld { run: run() },
            RunError::CommandsSurvive {
                run: run(),
                pid: 2,
                pgid: 2,
                generation: 1,
            },
            RunError::CommandUnproven {
                run: run(),
                file: "commands/x".into(),
                pid: 2,
                start_time: 1,
                why: "w".into(),
            },
            RunError::NotPermitted {
                run: run(),
                pid: 2,
                generation: 1,
                detail: "d".into(),
            },
            RunError::CommandRecordsOverLimit {
                run: run(),
                dir: "commands".into(),
                count: 1025,
                limit: 1024,
            },
            RunError::StepTimeout {
                run: run(),
                step: "store",
                ms: 1,
            },
            RunError::Released { run: run() },
            RunError::Spawn {
                run: run(),
                detail: "d".into(),
            },
            RunError::Served {
                run: run(),
                code: Code::StoreRequestRefused,
                message: "m".into(),
            },
        ];
        let got: Vec<Code> = own.iter().map(RunError::code).collect();
        assert_eq!(got, RUN_ERROR_CODES);
        // The shared codes are defined by the table of the layer that raises them.
        let shared = [
            RunError::InvalidArgument("x".into()),
            RunError::Fenced {
                run: run(),
                reason: "x".into(),
            },
            RunError::Io("x".into()),
            RunError::os("y", std::io::Error::from_raw_os_error(2)),
        ];
        for e in shared {
            assert!(
                lease_core::ERROR_CODES
                    .iter()
                    .chain(lease_fs::FS_ERROR_CODES)
                    .any(|c| *c == e.code()),
                "{}",
                e.code().as_str()
            );
        }
    }

    /// A failed system call keeps its `io::Error` as the source (issue #34): a caller can
    /// read its kind and errno without parsing the message.
    #[test]
    fn an_os_failure_keeps_its_io_error_as_the_source() {
        use std::error::Error as _;
        let e = RunError::os("run r: boot id", std::io::Error::from_raw_os_error(13));
        assert_eq!(e.code(), Code::IoError);
        let io = e
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the io::Error is the source");
        assert_eq!(io.raw_os_error(), Some(13));
        assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(e.to_string().starts_with("run r: boot id: "), "{e}");
    }
}
