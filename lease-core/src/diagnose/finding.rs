//! What a diagnosis answers: [`Finding`]s (code, severity, subject) and [`Next`] steps.

use super::{CgroupLeftAlone, OpenCutoff};
use crate::Generation;
use crate::code::Code;
use crate::ops::{Head, ShortTail};

/// A finding's stable code (what `runlease doctor` prints).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FindingCode {
    /// Nothing to repair.
    Ok,
    /// Temp files remain.
    OrphanTempFiles,
    /// A record cannot be read or decoded.
    InvalidRecord,
    /// The owner is stale.
    StaleOwner,
    /// The owner is definitely dead.
    DeadOwner,
    /// A hash chain is broken, or `run.json` is ahead of the lease chain.
    BrokenChain,
    /// The head's heartbeat is ahead of this host's clock.
    FutureHeartbeat,
    /// The head's `local` heartbeat file is torn (OQ-6): judged as no heartbeat.
    TornHeartbeat,
    /// The head's heartbeat carries a monotonic stamp on this host's own clock that is
    /// ahead of that clock: no process wrote it, the file was edited (ignored: judged on
    /// the wall clock, and a takeover watches).
    StampAhead,
    /// A cutoff or the checkpoint names events past the log's tail.
    EventLogShort,
    /// Epoch files below the checkpoint floor remain.
    StrayEpochs,
    /// A command record names a live process that cannot be proved ours.
    CommandUnproven,
    /// The store file is missing but the lease chain names a store.
    StoreMissing,
    /// The last open refused the store with this data code (`STORE_BEHIND_SEAL`,
    /// `STORE_IDENTITY_MISMATCH`, `STORE_MISSING`, `STORE_CORRUPT`).
    StoreRefused(Code),
    /// Names in the run folder that no reader uses.
    StrayNames,
    /// The folder is not a run and `runlease run` would not adopt it
    /// (`RUN_FOLDER_FOREIGN`).
    FolderForeign,
    /// The head superseded a generation whose cutoff was never written (a crash between
    /// the superseding epoch and its cutoff): that owner's events read `pending` until the
    /// next change of owner finalizes it (PROTOCOL §7.0 GATE).
    OpenCutoff,
    /// A file or folder in the run is not owned by the user runlease runs as, or is open
    /// to others (`RUN_NOT_OWNED`): every writer refuses the run (77) until it is fixed.
    NotOwned,
    /// A cgroup named like the run's is not proved its own (another uid's, or an identity
    /// no command record names): runlease never signals or removes it, and no open is
    /// refused over it (issue #29).
    CgroupNotProven,
    /// More command records than runlease judges (`RUN_COMMAND_RECORDS_OVER_LIMIT`).
    CommandRecordsOverLimit,
}

impl FindingCode {
    /// The stable text (`INVALID_RECORD`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            FindingCode::Ok => "OK",
            FindingCode::OrphanTempFiles => "ORPHAN_TEMP_FILES",
            FindingCode::InvalidRecord => "INVALID_RECORD",
            FindingCode::StaleOwner => "STALE_OWNER",
            FindingCode::DeadOwner => "DEAD_OWNER",
            FindingCode::BrokenChain => "BROKEN_CHAIN",
            FindingCode::FutureHeartbeat => "FUTURE_HEARTBEAT",
            FindingCode::TornHeartbeat => "TORN_HEARTBEAT",
            FindingCode::StampAhead => "HEARTBEAT_STAMP_AHEAD",
            FindingCode::EventLogShort => "EVENT_LOG_SHORT",
            FindingCode::StrayEpochs => "STRAY_EPOCHS",
            FindingCode::CommandUnproven => "COMMAND_UNPROVEN",
            FindingCode::StoreMissing => "STORE_MISSING",
            FindingCode::StoreRefused(c) => c.as_str(),
            FindingCode::StrayNames => "STRAY_NAMES",
            FindingCode::FolderForeign => "RUN_FOLDER_FOREIGN",
            FindingCode::OpenCutoff => "OPEN_CUTOFF",
            FindingCode::NotOwned => "RUN_NOT_OWNED",
            FindingCode::CgroupNotProven => "CGROUP_NOT_PROVEN",
            FindingCode::CommandRecordsOverLimit => "RUN_COMMAND_RECORDS_OVER_LIMIT",
        }
    }
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Nothing wrong.
    Ok,
    /// Worth a look; nothing refuses the run over it.
    Warning,
    /// Bad data: the next open (or a replacement) refuses the run until it is repaired.
    Error,
}

impl Severity {
    /// `ok`, `warning`, `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

/// What a finding is about (the data its detail is rendered from).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Subject {
    /// The run as a whole (the `OK` finding).
    Run,
    /// Temp files: total, and older than the grace.
    TempFiles {
        /// All of them.
        total: usize,
        /// Older than the grace.
        old: usize,
    },
    /// An error message that names its file (or link).
    Message(String),
    /// The stale or dead owner of the view.
    Owner,
    /// The head's heartbeat is `ahead_ms` ahead of this host's clock.
    FutureHeartbeat {
        /// The head.
        head: Box<Head>,
        /// How far ahead, ms.
        ahead_ms: i64,
    },
    /// The head's heartbeat stamp is `ahead_ms` ahead of this host's clock it names.
    StampAhead {
        /// The head.
        head: Box<Head>,
        /// How far ahead, ms.
        ahead_ms: u64,
    },
    /// The head's heartbeat file is torn (PROTOCOL §4, OQ-6).
    TornHeartbeat {
        /// The head (its `torn_beat` is set).
        head: Box<Head>,
    },
    /// The log is shorter than a cutoff or the checkpoint names.
    ShortTail(ShortTail),
    /// Stray epoch files.
    StrayEpochs(Vec<Generation>),
    /// The store is missing though epoch `generation` names one.
    StoreMissing {
        /// The epoch that names it.
        generation: Generation,
        /// What it names.
        named: NamedStore,
    },
    /// The last open refused the store.
    StoreRefused {
        /// The generation that wrote `run.json`.
        generation: u64,
        /// `run.json`'s detail.
        detail: String,
    },
    /// Stray names.
    StrayNames(Vec<String>),
    /// An open cutoff ([`super::Facts::open_cutoff`]).
    OpenCutoff(OpenCutoff),
    /// A cgroup named like the run's that runlease leaves alone.
    CgroupLeftAlone(CgroupLeftAlone),
}

/// What an epoch says of the store it expects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamedStore {
    /// Sealed at `sequence` by `generation`, store id `store_id`.
    Sealed {
        /// The sealed sequence.
        sequence: u64,
        /// The sealing generation.
        generation: Generation,
        /// The store id.
        store_id: String,
    },
    /// A store floor of `floor` recorded by `generation`.
    Floor {
        /// The floor.
        floor: u64,
        /// The generation that recorded it.
        generation: Generation,
    },
}

/// The next step, as an action (rendered by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Next {
    /// Claim the run.
    Claim,
    /// The folder is not a run and `runlease run` refuses it (`RUN_FOLDER_FOREIGN`): lay
    /// the run out beside what is there explicitly (`runlease init`), or use a new folder.
    Init,
    /// Wait, or ask the owner to release.
    Wait,
    /// Wait: the owner's heartbeat is older than its `stale_after` by this host's wall
    /// clock (or dated ahead of it), but the authority holds its lease alive (etcd: its
    /// etcd lease has not expired), so a takeover would be refused
    /// (`TAKEOVER_ACTIVE_REFUSED`) until that lease expires; or ask the owner to release.
    WaitForLease,
    /// Exact takeover of the stale owner seen.
    Takeover {
        /// Its owner id.
        owner_id: String,
        /// Its last heartbeat.
        heartbeat_at: String,
    },
    /// Observe again (stale, but the head could not be read).
    ObserveAgain,
    /// Retire the dead owner.
    Retire,
    /// Run doctor: a record is invalid; do not take over.
    DoctorDoNotTakeOver,
    /// Run doctor: the next claim would refuse this run (doctor names why: run.json, the chain or a record).
    DoctorBeforeRun,
    /// Repair or restore the named lease record by hand; do not take over.
    RepairRecord,
    /// Repair or restore `run.json` by hand; the next open refuses until then.
    RepairRunJson,
    /// Repair or restore the named command record (its command may still run).
    RepairCommandRecord,
    /// Restore `lease/` from a backup; the next open refuses until then.
    RestoreLease,
    /// Find the first broken link with verify, then restore or archive.
    VerifyAndRestore,
    /// Restore the store file the lease chain names.
    RestoreStore,
    /// Move the store file out of the run: it is not this run's (created for another run)
    /// and the chain names no store, so the next open creates a new one.
    MoveStoreAside,
    /// Remove old temp files.
    CleanTemp,
    /// Nothing now: every temp file is younger than the grace (a writer may still be using
    /// it, and a clean-up would remove none); one still there after the grace is old, and
    /// [`Next::CleanTemp`] then removes it.
    WaitTempFiles,
    /// Prune the run.
    Prune,
    /// Check time synchronization (PROTOCOL §10).
    CheckClocks,
    /// Expected after a power loss; otherwise restore `events/` from a backup.
    PowerLossOrRestoreEvents,
    /// Stop the named process yourself if it is the run's old command, or remove the
    /// record if it is not.
    StopOrRemoveRecord,
    /// A cgroup runlease leaves alone (`path`): if it is the run's leftover, stop its
    /// processes and remove it by hand; otherwise leave it. Nothing refuses the run.
    InspectCgroup {
        /// The cgroup's directory.
        path: String,
    },
    /// Check that no command of the run still runs, then move `commands/` out of the run.
    MoveCommandRecordsAside,
    /// Move the stray names out by hand.
    MoveStrays,
    /// Repair the error findings first (replacements refuse until then), then this.
    RepairFirst(Box<Next>),
    /// Nothing to do.
    Nothing,
}

/// One finding: code, severity, what it is about, and its one next step.
#[derive(Debug, Clone)]
pub struct Finding {
    /// The stable code.
    pub code: FindingCode,
    /// How bad it is.
    pub severity: Severity,
    /// What it is about.
    pub subject: Subject,
    /// The next step.
    pub next: Next,
}
