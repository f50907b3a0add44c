//! The typed error of lease-etcd: protocol errors from lease-core plus the failures of
//! talking to an etcd cluster, each naming the run and the key.

use lease_core::Code;
use lease_core::{FileRef, HeldBy, LeaseError};

/// Every failure of the etcd authority.
///
/// Codes shared with the file-system authority keep their meaning
/// (`TAKEOVER_ACTIVE_REFUSED` 76, every [`LeaseError`] code); the etcd-specific ones are in
/// [`ETCD_ERROR_CODES`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// A protocol outcome (held, fenced, invalid record, ...), see [`LeaseError`].
    #[error(transparent)]
    Lease(#[from] LeaseError),
    /// The cluster could not be reached, or did not answer before the deadline (no
    /// leader, member stopped, network cut), and no record was written: the call was a
    /// read (or a keep-alive or lease grant), or no attempt of a write ever reached a
    /// member. Retrying is safe.
    #[error("run {run}: etcd {op} {key}: {detail}")]
    Unavailable {
        /// The run.
        run: String,
        /// The etcd call (`range`, `txn`, `put`, `delete`, `lease grant`, `keep-alive`...).
        op: &'static str,
        /// The key (or key prefix) it was about.
        key: String,
        /// What failed, with the deadline when it expired.
        detail: String,
    },
    /// A write (an exclusive create, a heartbeat, a delete) was sent and the cluster did not
    /// answer it before the operation's deadline, so whether it took effect is unknown: an
    /// attempt may have been committed after the client stopped waiting. Look before
    /// retrying: a blind retry of an append appends a second event. (A retry that can tell
    /// its own earlier attempt is made within the deadline already: an exclusive create that
    /// finds exactly its own bytes answers `Created`, module docs of [`crate::run`].)
    #[error(
        "run {run}: etcd {op} {key}: the outcome of this write is unknown: it was sent and the cluster did not answer before the operation's deadline ({detail}); it may or may not have taken effect: read {key} before writing again"
    )]
    OutcomeUnknown {
        /// The run.
        run: String,
        /// The etcd call (`txn`, `delete`).
        op: &'static str,
        /// The key written.
        key: String,
        /// The run file the key holds, where the request named one.
        file: Option<FileRef>,
        /// What the last attempt got.
        detail: String,
    },
    /// etcd refused a request for a reason that retrying will not fix (permission
    /// denied, request too large, invalid argument).
    #[error("run {run}: etcd {op} {key}: {detail}")]
    Refused {
        /// The run.
        run: String,
        /// The etcd call.
        op: &'static str,
        /// The key.
        key: String,
        /// etcd's answer.
        detail: String,
    },
    /// The cluster's storage is full: its NOSPACE alarm is raised (the backend reached
    /// `--quota-backend-bytes`) and it refuses every write, every owner's heartbeat
    /// included, until an operator frees space and disarms the alarm. Never retried: each
    /// retry is one more refused write.
    #[error(
        "run {run}: etcd {op} {key}: the cluster is out of space (its NOSPACE alarm is raised: {detail}); it refuses every write until an operator compacts and defragments it and disarms the alarm: `etcdctl compact <revision>`, `etcdctl defrag`, `etcdctl alarm disarm` (or raise --quota-backend-bytes)"
    )]
    NoSpace {
        /// The run.
        run: String,
        /// The etcd call.
        op: &'static str,
        /// The key.
        key: String,
        /// etcd's answer.
        detail: String,
    },
    /// An `etcd://host:port[,host:port...]/prefix` authority address is not valid.
    #[error("{value:?}: {reason}")]
    AuthorityInvalid {
        /// The address as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A liveness key of the run does not hold a holder record: reported, never treated
    /// as "dead".
    #[error("run {run}: key {key}: {detail}")]
    LivenessInvalid {
        /// The run.
        run: String,
        /// The key.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// A takeover was refused because the owner's etcd lease is still alive: it may still
    /// be heartbeating through another member, or it has not yet been silent for its
    /// `stale_after` (the lease's time to live). Same code as the file-system
    /// refusal of a fresh owner.
    #[error(
        "run {run}: {held}: its etcd lease is still alive ({ttl_s} s left of the lease that expires {stale_after_ms} ms after its last keep-alive); retry after it expires"
    )]
    OwnerLeaseAlive {
        /// The run.
        run: String,
        /// The owner.
        held: Box<HeldBy>,
        /// Seconds left of its etcd lease, as etcd reports them.
        ttl_s: i64,
        /// The owner's stale_after (the lease's time to live).
        stale_after_ms: u64,
    },
}

impl EtcdError {
    /// Stable machine-readable code.
    pub fn code(&self) -> Code {
        match self {
            EtcdError::Lease(e) => e.code(),
            EtcdError::Unavailable { .. } => Code::Unavailable,
            EtcdError::OutcomeUnknown { .. } => Code::OutcomeUnknown,
            EtcdError::Refused { .. } => Code::EtcdRefused,
            EtcdError::NoSpace { .. } => Code::EtcdNoSpace,
            EtcdError::AuthorityInvalid { .. } => Code::AuthorityInvalid,
            EtcdError::LivenessInvalid { .. } => Code::LivenessInvalid,
            EtcdError::OwnerLeaseAlive { .. } => Code::TakeoverActiveRefused,
        }
    }

    /// The protocol error inside, if this is one.
    pub fn lease(&self) -> Option<&LeaseError> {
        match self {
            EtcdError::Lease(e) => Some(e),
            _ => None,
        }
    }

    /// Whether this is the cluster being unreachable (the owner's cue to count towards its
    /// self-fence deadline, and a caller's cue to retry).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, EtcdError::Unavailable { .. })
    }

    /// The run file of a write whose outcome is unknown (`OUTCOME_UNKNOWN`): an event's
    /// file names its sequence, so a caller can say which event to look for.
    pub fn unknown_outcome_file(&self) -> Option<FileRef> {
        match self {
            EtcdError::OutcomeUnknown { file, .. } => *file,
            _ => None,
        }
    }

    /// This error, with `f` as the file of an `OUTCOME_UNKNOWN` (others unchanged).
    pub(crate) fn about(self, f: FileRef) -> EtcdError {
        match self {
            EtcdError::OutcomeUnknown {
                run,
                op,
                key,
                detail,
                ..
            } => EtcdError::OutcomeUnknown {
                run,
                op,
                key,
                file: Some(f),
                detail,
            },
            e => e,
        }
    }
}

/// Every lease-etcd specific code (protocol codes are in
/// [`lease_core::ERROR_CODES`]; `TAKEOVER_ACTIVE_REFUSED` 76 is shared with them). The table
/// lives in lease-core ([`lease_core::ETCD_ERROR_CODES`]), so a build without this crate
/// names the same codes; the test below checks this crate's variants against it.
pub use lease_core::ETCD_ERROR_CODES;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_table_matches_the_variants() {
        let e = |err: EtcdError| err.code();
        let cases = [
            e(EtcdError::Unavailable {
                run: "r".into(),
                op: "range",
                key: "k".into(),
                detail: "d".into(),
            }),
            e(EtcdError::OutcomeUnknown {
                run: "r".into(),
                op: "txn",
                key: "k".into(),
                file: None,
                detail: "d".into(),
            }),
            e(EtcdError::Refused {
                run: "r".into(),
                op: "put",
                key: "k".into(),
                detail: "d".into(),
            }),
            e(EtcdError::NoSpace {
                run: "r".into(),
                op: "txn",
                key: "k".into(),
                detail: "d".into(),
            }),
            e(EtcdError::AuthorityInvalid {
                value: "v".into(),
                reason: "r".into(),
            }),
            e(EtcdError::LivenessInvalid {
                run: "r".into(),
                key: "k".into(),
                detail: "d".into(),
            }),
        ];
        assert_eq!(cases.as_slice(), ETCD_ERROR_CODES);
        // No etcd-specific code collides with a protocol code.
        for code in ETCD_ERROR_CODES {
            assert!(!lease_core::ERROR_CODES.contains(code), "{code}");
        }
    }
}
