//! The one error type of the protocol core, with stable codes, and the constructors of ids
//! that refuse with it (`ids.rs` stays a leaf of values that this error names).

use crate::Code;
use crate::ids::{Generation, Identity, RunId, Sequence, run_id_refusal};
use crate::time::Timestamp;

/// Which kind of record a decoding error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// `runlease/epoch/1`
    Epoch,
    /// `runlease/heartbeat/1`
    Heartbeat,
    /// `runlease/retirement/1`
    Retirement,
    /// `runlease/takeover-intent/1`
    TakeoverIntent,
    /// `runlease/checkpoint/1`
    Checkpoint,
    /// `runlease/run-status/1`
    RunStatus,
    /// `runlease/command/1`
    Command,
    /// `runlease/event/1`
    Event,
    /// `runlease/store-record/1` (PROTOCOL.md §18)
    StoreRecord,
    /// `runlease/store-snapshot/1` (§18)
    StoreSnapshot,
    /// `runlease/verified-mark/1` (§13.1, issue #33)
    VerifiedMark,
}

impl RecordKind {
    /// Short lowercase name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            RecordKind::Epoch => "epoch",
            RecordKind::Heartbeat => "heartbeat",
            RecordKind::Retirement => "retirement",
            RecordKind::TakeoverIntent => "takeover intent",
            RecordKind::Checkpoint => "checkpoint",
            RecordKind::RunStatus => "run status",
            RecordKind::Command => "command",
            RecordKind::Event => "event",
            RecordKind::StoreRecord => "store record",
            RecordKind::StoreSnapshot => "store snapshot",
            RecordKind::VerifiedMark => "verified mark",
        }
    }
}

impl std::fmt::Display for RecordKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Who holds a run, as reported to a refused caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBy {
    /// The current generation (fencing token).
    pub generation: Generation,
    /// The owner id.
    pub owner_id: String,
    /// Host name of the owner.
    pub host: String,
    /// Process id of the owner.
    pub pid: u32,
    /// When that owner claimed the run.
    pub since: Timestamp,
    /// Its last heartbeat.
    pub heartbeat_at: Timestamp,
    /// Its heartbeat counter.
    pub heartbeat_count: u64,
}

impl std::fmt::Display for HeldBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "owner {} (host {}, pid {}, since {}, generation {}, last heartbeat {} #{})",
            self.owner_id,
            self.host,
            self.pid,
            self.since,
            self.generation,
            self.heartbeat_at,
            self.heartbeat_count
        )
    }
}

/// Every failure the protocol core can report.
///
/// Each variant has a stable [`code`](LeaseError::code) (for scripts and `--json`; the CLI
/// maps codes to exit codes). Messages name the run and, when an
/// adapter attached one with [`LeaseError::in_file`], the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LeaseError {
    /// A run id does not match `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`.
    #[error("{}", run_id_refusal(.value, .reason))]
    RunIdInvalid {
        /// The rejected value (escaped in the message).
        value: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A caller-supplied argument (identity, timestamp, event type...) is not valid.
    #[error("{what}: {reason}")]
    ArgumentInvalid {
        /// Which argument.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A timing policy violates the safety rules (see [`crate::TimingPolicy`]).
    #[error("{reason}")]
    PolicyInvalid {
        /// Which rule failed, with the values.
        reason: String,
    },
    /// A record read from disk (or given by a caller) is not a valid canonical record.
    #[error("{kind} record{} of run {run} is invalid: {detail}", file_suffix(.file))]
    RecordInvalid {
        /// The run the record belongs to (or `?` when not yet known).
        run: String,
        /// The kind of record.
        kind: RecordKind,
        /// The file it was read from, relative to the run root, when known.
        file: Option<String>,
        /// What is wrong with it.
        detail: String,
    },
    /// A record carries a version of its schema that this build does not know.
    #[error("{kind} record{} of run {run} has version {version:?}; this build reads {supported:?}", file_suffix(.file))]
    SchemaUnsupported {
        /// The run.
        run: String,
        /// The kind of record.
        kind: RecordKind,
        /// The file, when known.
        file: Option<String>,
        /// The version found.
        version: String,
        /// The version this build supports.
        supported: &'static str,
    },
    /// A hash chain (epochs or events) is broken: history was truncated, edited or reordered.
    #[error("run {run}: {chain} chain broken at {at}: {detail}")]
    ChainBroken {
        /// The run.
        run: String,
        /// `epoch` or `event`.
        chain: &'static str,
        /// The record (generation or sequence) whose link does not match.
        at: u64,
        /// What does not match.
        detail: String,
    },
    /// The event log has a hole: sequence `missing` is absent but a later one exists. Both
    /// files are named, so the repair (restore the missing one, or move the later strays
    /// out) can be done from the message.
    #[error("run {run}: event {missing} (events/{missing:020}.json) is missing but {}", later_event(*.later))]
    EventLogGap {
        /// The run.
        run: String,
        /// The first missing sequence.
        missing: u64,
        /// A sequence seen to exist above it (the highest the reader counted), 0 if the
        /// missing event itself was seen a moment before (removed under the reader).
        later: u64,
    },
    /// The next generation or sequence would overflow `u64`.
    #[error("run {run}: {what} cannot be incremented past {value}")]
    Overflow {
        /// The run.
        run: String,
        /// `generation` or `sequence`.
        what: &'static str,
        /// The value that cannot grow.
        value: u64,
    },
    /// A live owner holds the run.
    #[error("run {run} is held by {held}")]
    RunAlreadyActive {
        /// The run.
        run: String,
        /// Who holds it.
        held: Box<HeldBy>,
    },
    /// The owner stopped heartbeating; only an explicit takeover may replace it.
    #[error(
        "run {run} is held by a stale {held}; heartbeat age {age_ms} ms > stale_after {stale_after_ms} ms; use an exact takeover"
    )]
    RunStaleRequiresTakeover {
        /// The run.
        run: String,
        /// The stale owner.
        held: Box<HeldBy>,
        /// Heartbeat age on the observer's wall clock.
        age_ms: i64,
        /// The owner's stale_after.
        stale_after_ms: u64,
    },
    /// The owner is definitely dead; retire it (no waiting needed).
    #[error("run {run} is held by a dead {held}; retire it")]
    RunDeadRequiresRetirement {
        /// The run.
        run: String,
        /// The dead owner.
        held: Box<HeldBy>,
    },
    /// A takeover was refused because the taker has not watched the owner's record unchanged
    /// for longer than the owner's `stale_after` on its own monotonic clock.
    #[error(
        "run {run}: {held} is not proven stale: its record was watched unchanged for {watched_ms} ms on this host's clock, and a takeover needs more than stale_after {stale_after_ms} ms (wall age of the heartbeat {age_ms} ms, informative only)"
    )]
    TakeoverActiveRefused {
        /// The run.
        run: String,
        /// The owner.
        held: Box<HeldBy>,
        /// Heartbeat age on the observer's wall clock (reported, never judged).
        age_ms: i64,
        /// The owner's stale_after.
        stale_after_ms: u64,
        /// How long the observer watched the record unchanged.
        watched_ms: u64,
    },
    /// What the taker expected is not what is on disk (anything changed, or another taker won).
    #[error("run {run}: {detail}")]
    TakeoverRace {
        /// The run.
        run: String,
        /// What differed.
        detail: String,
    },
    /// Dead-owner retirement was refused: the owner is not proven dead.
    #[error("run {run}: {held} is not proven dead: {reason}")]
    RetireRefusedNotDead {
        /// The run.
        run: String,
        /// The owner.
        held: Box<HeldBy>,
        /// Which piece of evidence is missing.
        reason: String,
    },
    /// The caller's generation has been superseded (or it self-fenced): it must stop writing.
    #[error("run {run}: generation {generation} is fenced: {detail}")]
    Fenced {
        /// The run.
        run: String,
        /// The fenced generation.
        generation: Generation,
        /// Why (superseded by which generation, or self-fence deadline).
        detail: String,
    },
    /// Too many appenders raced for the next sequence.
    #[error("run {run}: gave up after {attempts} sequence collisions")]
    EventContention {
        /// The run.
        run: String,
        /// How many collisions.
        attempts: u32,
    },
    /// The store's head is below what was sealed or recorded as its floor.
    #[error(
        "run {run}: store {store_id} head {head} is below the {what} {required} (generation {generation})"
    )]
    StoreBehindSeal {
        /// The run.
        run: String,
        /// Store identity.
        store_id: String,
        /// The store's head.
        head: u64,
        /// `seal` or `floor`.
        what: &'static str,
        /// The sequence it must reach.
        required: u64,
        /// The generation that recorded it.
        generation: Generation,
    },
    /// The store is not the one the seal was written for.
    #[error("run {run}: store id {found} is not the sealed store {sealed}")]
    StoreIdentityMismatch {
        /// The run.
        run: String,
        /// The sealed store id.
        sealed: String,
        /// The store id found.
        found: String,
    },
    /// The chain or the log changed under a maintenance or read operation (a concurrent
    /// prune, or a run changing owner faster than it can be observed); retry.
    #[error("run {run}: {detail}; retry")]
    ConcurrentChange {
        /// The run.
        run: String,
        /// What changed.
        detail: String,
    },
    /// The driver fed an operation a response that does not answer its request.
    #[error("{detail}")]
    ProtocolViolation {
        /// What went wrong.
        detail: String,
    },
    /// The engine-committed store's record log breaks its rules (PROTOCOL.md §18.4): a
    /// record missing below a later one, a broken hash link, a generation going down, a
    /// snapshot's chunk that does not match its manifest. Reported, never repaired.
    #[error("run {run}: the store's record log is invalid at {file}: {detail}")]
    StoreLogInvalid {
        /// The run.
        run: String,
        /// The record, manifest or chunk (its path, relative to the run's prefix).
        file: String,
        /// What is wrong.
        detail: String,
    },
    /// One commit does not fit one engine request (§18.6): nothing was written.
    #[error(
        "run {run}: a commit of {bytes} bytes (encoded) does not fit one store record of at most {limit} bytes; nothing was written: split it into smaller commits"
    )]
    CommitTooLarge {
        /// The run.
        run: String,
        /// The commit's encoded size.
        bytes: u64,
        /// The largest record.
        limit: u64,
    },
    /// The run's store would outgrow its byte budget (§18.6): nothing was written.
    #[error(
        "run {run}: the store holds {used} bytes in the engine and this commit adds {adding}, above the run's budget of {budget} bytes; nothing was written: delete documents, or raise the budget"
    )]
    BudgetExceeded {
        /// The run.
        run: String,
        /// Bytes the run's store holds in the engine now (newest snapshot and the log after it).
        used: u64,
        /// The commit's encoded size.
        adding: u64,
        /// The budget.
        budget: u64,
    },
    /// A path of the lease's layout is not what the layout says (a folder, FIFO or symlink
    /// named like a record, a misplaced file): the transport's refusal
    /// (`RUN_LAYOUT_INVALID`), carried as the judgement of a status read so observers
    /// report a state (`invalid`) and the repair instead of only the error.
    #[error("run {run}: {path}: {detail}")]
    LayoutInvalid {
        /// The run.
        run: String,
        /// The path, relative to the run root.
        path: String,
        /// What is wrong and the fix.
        detail: String,
    },
}

fn file_suffix(file: &Option<String>) -> String {
    match file {
        Some(f) => format!(" in file {f}"),
        None => String::new(),
    }
}

fn later_event(later: u64) -> String {
    if later == 0 {
        "it existed a moment ago (removed while being read)".into()
    } else {
        format!("event {later} (events/{later:020}.json) exists")
    }
}

impl LeaseError {
    /// Whether this is a fence (`FENCED`): the caller's generation was superseded or its
    /// self-fence deadline passed, so nothing it writes counts any more.
    ///
    /// ```
    /// use lease_core::{Generation, LeaseError};
    /// let e = LeaseError::Fenced {
    ///     run: "r".into(),
    ///     generation: Generation::new(2).unwrap(),
    ///     detail: "superseded by generation 3".into(),
    /// };
    /// assert!(e.is_fenced());
    /// ```
    pub fn is_fenced(&self) -> bool {
        self.code() == Code::Fenced
    }

    /// The stable, machine-readable code of this error.
    pub fn code(&self) -> Code {
        match self {
            LeaseError::RunIdInvalid { .. } => Code::RunIdInvalid,
            LeaseError::ArgumentInvalid { .. } => Code::ArgumentInvalid,
            LeaseError::PolicyInvalid { .. } => Code::PolicyInvalid,
            LeaseError::RecordInvalid { .. } => Code::RecordInvalid,
            LeaseError::SchemaUnsupported { .. } => Code::SchemaUnsupported,
            LeaseError::ChainBroken { .. } => Code::ChainBroken,
            LeaseError::EventLogGap { .. } => Code::EventLogGap,
            LeaseError::Overflow { .. } => Code::GenerationOverflow,
            LeaseError::RunAlreadyActive { .. } => Code::RunAlreadyActive,
            LeaseError::RunStaleRequiresTakeover { .. } => Code::RunStaleRequiresTakeover,
            LeaseError::RunDeadRequiresRetirement { .. } => Code::RunDeadRequiresRetirement,
            LeaseError::TakeoverActiveRefused { .. } => Code::TakeoverActiveRefused,
            LeaseError::TakeoverRace { .. } => Code::TakeoverRace,
            LeaseError::RetireRefusedNotDead { .. } => Code::RetireRefusedNotDead,
            LeaseError::Fenced { .. } => Code::Fenced,
            LeaseError::EventContention { .. } => Code::EventContention,
            LeaseError::StoreBehindSeal { .. } => Code::StoreBehindSeal,
            LeaseError::StoreIdentityMismatch { .. } => Code::StoreIdentityMismatch,
            LeaseError::ProtocolViolation { .. } => Code::ProtocolViolation,
            LeaseError::ConcurrentChange { .. } => Code::ConcurrentChange,
            LeaseError::LayoutInvalid { .. } => Code::RunLayoutInvalid,
            LeaseError::StoreLogInvalid { .. } => Code::StoreLogInvalid,
            LeaseError::CommitTooLarge { .. } => Code::StoreCommitTooLarge,
            LeaseError::BudgetExceeded { .. } => Code::StoreBudgetExceeded,
        }
    }

    /// Attach the file (relative to the run root) a record error is about.
    pub fn in_file(mut self, path: impl Into<String>) -> Self {
        match &mut self {
            LeaseError::RecordInvalid { file, .. } | LeaseError::SchemaUnsupported { file, .. } => {
                *file = Some(path.into());
            }
            _ => {}
        }
        self
    }

    /// Attach the run id to a record error decoded before the run was known.
    pub fn in_run(mut self, run_id: &RunId) -> Self {
        match &mut self {
            LeaseError::RecordInvalid { run, .. } | LeaseError::SchemaUnsupported { run, .. } => {
                *run = run_id.to_string();
            }
            _ => {}
        }
        self
    }
}

/// Every stable code of the protocol core (the CLI maps each to an exit code; docs
/// tables are checked against this list).
pub const ERROR_CODES: &[Code] = &[
    Code::RunIdInvalid,
    Code::ArgumentInvalid,
    Code::PolicyInvalid,
    Code::RecordInvalid,
    Code::ChainBroken,
    Code::EventLogGap,
    Code::GenerationOverflow,
    Code::StoreBehindSeal,
    Code::StoreIdentityMismatch,
    Code::SchemaUnsupported,
    Code::ProtocolViolation,
    Code::TakeoverRace,
    Code::Fenced,
    Code::EventContention,
    Code::ConcurrentChange,
    Code::RunAlreadyActive,
    Code::RunStaleRequiresTakeover,
    Code::RunDeadRequiresRetirement,
    Code::TakeoverActiveRefused,
    Code::RetireRefusedNotDead,
    Code::RunLayoutInvalid,
    Code::StoreLogInvalid,
    Code::StoreCommitTooLarge,
    Code::StoreBudgetExceeded,
];

impl RunId {
    /// Validate and wrap a run id: `RUN_ID_INVALID` if it does not match the pattern.
    pub fn new(value: impl Into<String>) -> Result<RunId, LeaseError> {
        RunId::validate(value.into())
            .map_err(|(value, reason)| LeaseError::RunIdInvalid { value, reason })
    }
}

impl Identity {
    /// Validate, reporting a typed argument error naming `what`.
    pub fn arg(what: &'static str, value: impl Into<String>) -> Result<Identity, LeaseError> {
        Identity::new(value).map_err(|e| LeaseError::ArgumentInvalid {
            what,
            reason: e.reason().to_owned(),
        })
    }
}

/// `GENERATION_OVERFLOW`: the `what` of `run` cannot grow past `value`.
fn overflow(run: &RunId, what: &'static str, value: u64) -> LeaseError {
    LeaseError::Overflow {
        run: run.to_string(),
        what,
        value,
    }
}

impl Generation {
    /// The next value, or an overflow error naming the run.
    pub fn next(self, run: &RunId) -> Result<Generation, LeaseError> {
        self.checked_next()
            .ok_or_else(|| overflow(run, "generation", self.get()))
    }
}

impl Sequence {
    /// The next value, or an overflow error naming the run.
    pub fn next(self, run: &RunId) -> Result<Sequence, LeaseError> {
        self.checked_next()
            .ok_or_else(|| overflow(run, "sequence", self.get()))
    }
}
