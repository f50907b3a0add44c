//! One diagnosis of a run, without I/O: what is wrong, how bad it is, and the next step.
//!
//! The layers that read a run (lease-run's preflight, `runlease status` and
//! `runlease doctor`) gather [`Facts`] (a status view, what `run.json` says, the outcome of
//! a verify, the command records' audit, the store file's presence, temp files and stray
//! names) and hand them to [`diagnose`] or [`next_step`]. The decision of what each fact
//! means lives here once; the callers only gather facts and render the typed [`Finding`]s
//! and [`Next`] steps (a CLI as commands, a library as it likes).
//!
//! ```
//! use lease_core::diagnose::{diagnose, next_step, Facts, FindingCode, Next};
//! use lease_core::ops::{Status, StatusView};
//!
//! let free = StatusView {
//!     status: Status::Free,
//!     head: None,
//!     age_ms: None,
//!     mono_age_ms: None,
//!     mono_ahead_ms: None,
//!     liveness: None,
//!     authority_lease: None,
//! };
//! let facts = Facts::of_view(free);
//! assert_eq!(next_step(&facts), Next::Claim);
//! let findings = diagnose(&facts);
//! assert_eq!(findings.len(), 1);
//! assert_eq!(findings[0].code, FindingCode::Ok);
//! ```

use crate::Generation;
use crate::code::Code;
use crate::ops::{Head, ShortTail, Status, StatusView, VerifyReport};
use crate::records::EpochRecord;
use crate::seal::seal_of;

/// What `run.json` says, as far as a diagnosis needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunJsonFacts {
    /// There is none.
    Absent,
    /// It exists but cannot be read or decoded (the message names the file).
    Invalid {
        /// The error with its code (`CODE: message`), naming the file.
        message: String,
    },
    /// A valid record.
    Written {
        /// Its status is `failed`.
        failed: bool,
        /// The generation that wrote it.
        generation: u64,
        /// Its `detail`, if any (a refused open writes the code first).
        detail: Option<String>,
    },
}

/// The outcome of verifying both hash chains, as far as a diagnosis needs it.
#[derive(Debug, Clone)]
pub enum VerifyFacts {
    /// Not verified (e.g. `status`, which reads only the head).
    NotChecked,
    /// Both chains hold.
    Held(VerifyReport),
    /// A verify error with a data code (`CHAIN_BROKEN`, `EVENT_LOG_GAP`, `RECORD_INVALID`,
    /// `SCHEMA_UNSUPPORTED`); any other error is the caller's to report, not a finding.
    Failed {
        /// Its code.
        code: Code,
        /// Its message with its code (`CODE: message`, [`Code::prefixed`]), naming the
        /// file.
        message: String,
    },
}

/// The command records' audit (PROTOCOL §11.1), as far as a diagnosis needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandFacts {
    /// Not audited.
    NotChecked,
    /// Every record reads and names nothing the next open would refuse over.
    Clean,
    /// A record names a live process that cannot be proved ours (`RUN_COMMAND_UNPROVEN`).
    Unproven {
        /// The refusal's code and message (`CODE: message`), naming the record and pid.
        message: String,
    },
    /// A record cannot be read or decoded, or does not match its name.
    Invalid {
        /// The error's code and message, naming the file.
        message: String,
    },
    /// More records than runlease judges (`RUN_COMMAND_RECORDS_OVER_LIMIT`, issue #29):
    /// none was read.
    OverLimit {
        /// The refusal's code and message (`CODE: message`), naming the folder.
        message: String,
    },
}

/// A directory named like one of the run's cgroups (`runlease-<key>-<generation>`, below
/// the observer's own cgroup) that runlease does not prove it created (issue #29: another
/// uid's, or an identity no command record names), so never signals or removes: gathered
/// by lease-run (`audit_cgroups`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLeftAlone {
    /// Its path (absolute).
    pub path: String,
    /// The generation its name says.
    pub generation: u64,
    /// The uid that owns it.
    pub uid: u32,
    /// Its member pids when looked at.
    pub members: Vec<u32>,
    /// Why it is not proved the run's.
    pub why: String,
}

/// Everything a diagnosis looks at. Build it with [`Facts::of_view`] and set what was
/// gathered; a field left at its default says "not checked", never "fine".
#[derive(Debug, Clone)]
pub struct Facts {
    /// The status view (liveness probed, for `dead`).
    pub view: StatusView,
    /// What `run.json` says.
    pub run_json: RunJsonFacts,
    /// The verify outcome.
    pub verify: VerifyFacts,
    /// The command records' audit.
    pub commands: CommandFacts,
    /// Directories named like the run's cgroups that runlease leaves alone (empty: none,
    /// or not looked at).
    pub cgroups_left_alone: Vec<CgroupLeftAlone>,
    /// Whether the store file exists (`None`: not looked at).
    pub store_present: Option<bool>,
    /// Our temp files (`.tmp-*`, regular files of ours) in the run's folders: total, and
    /// how many of them are older than the grace, so a temp-file clean-up removes them
    /// (a temp name that is not such a file is never removed: the gatherer reports it
    /// among [`Facts::stray_names`]).
    pub temp_files: (usize, usize),
    /// Names in the run folder that no reader uses.
    pub stray_names: Vec<String>,
    /// What the next claim (or replacement) would refuse before writing, beyond the
    /// lease's state (lease-run's `claim_refusal`: the open's preflight, the whole log and
    /// both chains as `verify` checks them, records named above the head): its code and
    /// `CODE: message` naming the file. `None`: nothing, or not looked at.
    pub claim_refusal: Option<(Code, String)>,
    /// What `runlease run` would refuse of the folder itself, read without writing: it
    /// exists, is not a run and is not empty (or is the current folder or holds it), so
    /// `run` refuses `RUN_FOLDER_FOREIGN` and only an explicit `runlease init` adopts it.
    /// The refusal's message. `None`: `run` would use it, or not looked at.
    pub adoption_refusal: Option<String>,
    /// The head's cutoff that is due but missing ([`OpenCutoff`]); `None`: none, or not
    /// looked at.
    pub open_cutoff: Option<OpenCutoff>,
}

impl Facts {
    /// Facts with only the status view gathered.
    pub fn of_view(view: StatusView) -> Facts {
        Facts {
            view,
            run_json: RunJsonFacts::Absent,
            verify: VerifyFacts::NotChecked,
            commands: CommandFacts::NotChecked,
            cgroups_left_alone: Vec::new(),
            store_present: None,
            temp_files: (0, 0),
            stray_names: Vec::new(),
            claim_refusal: None,
            adoption_refusal: None,
            open_cutoff: None,
        }
    }
}

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
    /// An open cutoff ([`Facts::open_cutoff`]).
    OpenCutoff(OpenCutoff),
    /// A cgroup named like the run's that runlease leaves alone.
    CgroupLeftAlone(CgroupLeftAlone),
}

/// A cutoff that is due but was never written: the head epoch `by` superseded generation
/// `retired` (its `retired` field), and `lease/cutoffs/<retired>` does not exist. Only the
/// head's can be open (a later epoch's GATE finalizes it first; one missing below an older
/// epoch was removed, `CHAIN_BROKEN`). Until it is finalized, `retired`'s events read
/// `pending`: neither counted nor refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenCutoff {
    /// The superseded generation whose cutoff is missing.
    pub retired: Generation,
    /// The head epoch that superseded it.
    pub by: Generation,
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

/// The head's cutoff that is due but missing, from the head epoch and whether
/// `lease/cutoffs/<retired>` exists (`cutoff_exists`, asked by the caller for the
/// generation this names): the pure half of [`Facts::open_cutoff`].
pub fn open_cutoff_of(
    head: &EpochRecord,
    cutoff_exists: impl FnOnce(Generation) -> bool,
) -> Option<OpenCutoff> {
    let r = head.retired.as_ref()?;
    (!cutoff_exists(r.generation)).then_some(OpenCutoff {
        retired: r.generation,
        by: head.generation,
    })
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

/// The store codes a refused open leaves first in `run.json`'s detail that need an
/// operator (data errors, not a transient `STORE_BUSY`).
pub const STORE_REFUSALS: [Code; 4] = [
    Code::StoreBehindSeal,
    Code::StoreIdentityMismatch,
    Code::StoreMissing,
    Code::StoreCorrupt,
];

/// The store code of the last refused open: `run.json` is `failed` with a detail that is
/// one of [`STORE_REFUSALS`] or starts with `CODE:`.
pub fn store_refusal(run_json: &RunJsonFacts) -> Option<Code> {
    let RunJsonFacts::Written {
        failed: true,
        detail: Some(detail),
        ..
    } = run_json
    else {
        return None;
    };
    STORE_REFUSALS.into_iter().find(|c| {
        detail
            .strip_prefix(c.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
    })
}

/// When `run.json` was written by generation `written_by` and the lease chain's head is
/// `head` (0: no epoch): what is wrong, naming both, if the chain does not reach it (its
/// newest epochs deleted, or `lease/` restored from an older copy). An owner writes
/// `run.json` only after its epoch is durable, so no crash produces this; claiming would
/// hand out fencing tokens already given out.
pub fn chain_behind(written_by: u64, head: u64) -> Option<String> {
    (written_by > head).then(|| {
        let chain = if head == 0 {
            "the lease chain (lease/epochs/) has no epoch".to_string()
        } else {
            format!("the lease chain (lease/epochs/) ends at generation {head}")
        };
        format!(
            "run.json was written by generation {written_by}, but {chain}: epochs were deleted or restored from an older copy, and claiming would reuse fencing tokens already given out"
        )
    })
}

fn head_generation(view: &StatusView) -> u64 {
    view.head.as_ref().map_or(0, |h| h.epoch.generation.get())
}

fn run_json_ahead(facts: &Facts) -> Option<String> {
    // An unreadable head says nothing about where the chain ends (its INVALID_RECORD is
    // the finding): "the chain has no epoch" would send the operator to restore lease/.
    if matches!(facts.view.status, Status::Invalid(_)) {
        return None;
    }
    match &facts.run_json {
        RunJsonFacts::Written { generation, .. } => {
            chain_behind(*generation, head_generation(&facts.view))
        }
        _ => None,
    }
}

/// How far ahead of this host's clock a heartbeat may be dated before it counts as "in
/// the future" (`FUTURE_HEARTBEAT`, and a takeover as the next step), in ms.
const FUTURE_MS: i64 = 1000;

/// The one next step for the run as observed (what `status` prints): by its state, except
/// that a free run the next claim would refuse (an unreadable `run.json`, the last run's
/// store refusal, a store the head names that the folder lacks, `run.json` ahead of the
/// chain) needs doctor first.
pub fn next_step(facts: &Facts) -> Next {
    if matches!(facts.view.status, Status::Free) && facts.adoption_refusal.is_some() {
        return Next::Init;
    }
    let blocked = matches!(facts.run_json, RunJsonFacts::Invalid { .. })
        || store_refusal(&facts.run_json).is_some()
        || named_store_missing(facts)
        || run_json_ahead(facts).is_some()
        || facts.claim_refusal.is_some();
    if matches!(facts.view.status, Status::Free) && blocked {
        return Next::DoctorBeforeRun;
    }
    // A takeover or retirement asks the same admission rule as the claim (lease-run's
    // `admission::judge`): rollback evidence (run.json ahead of the chain) and everything
    // else it refuses refuse it too. Name the repair instead of a step that would be
    // refused (issue #28: a retirement on a rolled-back chain issued generations again).
    if matches!(facts.view.status, Status::Stale | Status::Dead) && blocked {
        return Next::DoctorDoNotTakeOver;
    }
    next_for_view(&facts.view)
}

/// The store `epoch` names for whoever owns the run after it ([`seal_of`]): its seal, or
/// a store floor above 0; `None` when it names none (a new store may then be created).
/// The one judgement of "the chain names a store" for doctor's `STORE_MISSING`, status's
/// next step and lease-run's preflight (which refuses a claim that would find it missing).
pub fn named_store(epoch: &EpochRecord) -> Option<NamedStore> {
    match seal_of(epoch) {
        (Some(s), _) => Some(NamedStore::Sealed {
            sequence: s.sequence,
            generation: s.generation,
            store_id: s.store_id.to_string(),
        }),
        (None, Some((floor, generation))) if floor > 0 => {
            Some(NamedStore::Floor { floor, generation })
        }
        _ => None,
    }
}

/// Whether the head names a store ([`named_store`]) that the folder was seen to lack.
fn named_store_missing(facts: &Facts) -> bool {
    facts.store_present == Some(false)
        && facts
            .view
            .head
            .as_ref()
            .is_some_and(|h| named_store(&h.epoch).is_some())
}

/// The next step by the view's state alone.
pub fn next_for_view(view: &StatusView) -> Next {
    // A beat in the future says nothing of liveness only when its age is a wall-clock age;
    // one stamped on this host's own clock was aged on it (PROTOCOL §10).
    let future = view.mono_age_ms.is_none() && view.age_ms.is_some_and(|a| a < -FUTURE_MS);
    match (&view.status, &view.head) {
        (Status::Free, _) => Next::Claim,
        // The authority holds the owner's lease alive: no wall clock decides, and a
        // takeover is refused until that lease expires (PROTOCOL §7.8, §11). Said apart
        // from a plain wait when a wall clock would have suggested a takeover.
        (Status::Active, Some(_)) if view.lease_alive() && (view.is_stale() || future) => {
            Next::WaitForLease
        }
        // A heartbeat dated more than a second ahead of this host's clock: the wall clock
        // cannot tell whether its owner still beats, and a takeover does not use it (it
        // watches the record on this host's clock, and refuses if the owner writes).
        (Status::Active, Some(h)) if future => Next::Takeover {
            owner_id: h.epoch.owner_id.to_string(),
            heartbeat_at: h.heartbeat_at().to_string(),
        },
        (Status::Active, _) => Next::Wait,
        (Status::Stale, Some(h)) => Next::Takeover {
            owner_id: h.epoch.owner_id.to_string(),
            heartbeat_at: h.heartbeat_at().to_string(),
        },
        (Status::Stale, None) => Next::ObserveAgain,
        (Status::Dead, _) => Next::Retire,
        (Status::Invalid(_), _) => Next::DoctorDoNotTakeOver,
    }
}

/// Every finding, in a fixed order; `[OK]` when there is none. A stale or dead owner's
/// next step is prefixed by "repair first" while an error finding stands, because a
/// replacement verifies the run and refuses until then.
pub fn diagnose(facts: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut push = |code, severity, subject, next| {
        out.push(Finding {
            code,
            severity,
            subject,
            next,
        })
    };
    let (temps, old) = facts.temp_files;
    if temps > 0 {
        // A next step makes progress (issue #28): the clean-up removes only temp files
        // older than the grace, so with none it would remove nothing and this finding and
        // step would come back unchanged. Name it only when it removes something.
        push(
            FindingCode::OrphanTempFiles,
            Severity::Warning,
            Subject::TempFiles { total: temps, old },
            if old > 0 {
                Next::CleanTemp
            } else {
                Next::WaitTempFiles
            },
        );
    }
    let view = &facts.view;
    let mut invalid_message = None;
    match &view.status {
        Status::Invalid(e) => {
            let message = e.code().prefixed(e);
            invalid_message = Some(message.clone());
            push(
                FindingCode::InvalidRecord,
                Severity::Error,
                Subject::Message(message),
                Next::RepairRecord,
            );
        }
        Status::Stale => push(
            FindingCode::StaleOwner,
            Severity::Warning,
            Subject::Owner,
            next_for_view(view),
        ),
        Status::Dead => push(
            FindingCode::DeadOwner,
            Severity::Warning,
            Subject::Owner,
            Next::Retire,
        ),
        Status::Free | Status::Active => {}
    }
    if let Some(msg) = run_json_ahead(facts) {
        push(
            FindingCode::BrokenChain,
            Severity::Error,
            Subject::Message(msg),
            Next::RestoreLease,
        );
    }
    if let Some(h) = view.head.as_ref().filter(|h| h.torn_beat.is_some()) {
        // Liveness only: the head reads as if it never beat; the owner's next heartbeat
        // replaces the file, and a replacement still needs the watch (status names it).
        push(
            FindingCode::TornHeartbeat,
            Severity::Warning,
            Subject::TornHeartbeat {
                head: Box::new(h.clone()),
            },
            Next::Nothing,
        );
    }
    if let (Some(h), Some(ahead_ms)) = (&view.head, view.mono_ahead_ms) {
        push(
            FindingCode::StampAhead,
            Severity::Warning,
            Subject::StampAhead {
                head: Box::new(h.clone()),
                ahead_ms,
            },
            Next::Nothing,
        );
    }
    if let (Some(h), Some(age)) = (&view.head, view.age_ms) {
        if h.is_active() && age < -FUTURE_MS {
            push(
                FindingCode::FutureHeartbeat,
                Severity::Warning,
                Subject::FutureHeartbeat {
                    head: Box::new(h.clone()),
                    ahead_ms: -age,
                },
                Next::CheckClocks,
            );
        }
    }
    match &facts.verify {
        VerifyFacts::NotChecked => {}
        VerifyFacts::Held(r) => {
            if let Some(t) = &r.short_tail {
                push(
                    FindingCode::EventLogShort,
                    Severity::Warning,
                    Subject::ShortTail(t.clone()),
                    Next::PowerLossOrRestoreEvents,
                );
            }
            if !r.strays.is_empty() {
                push(
                    FindingCode::StrayEpochs,
                    Severity::Warning,
                    Subject::StrayEpochs(r.strays.clone()),
                    Next::Prune,
                );
            }
        }
        VerifyFacts::Failed { code, message } => {
            if matches!(code, Code::ChainBroken | Code::EventLogGap) {
                push(
                    FindingCode::BrokenChain,
                    Severity::Error,
                    Subject::Message(message.clone()),
                    Next::VerifyAndRestore,
                );
            } else if invalid_message.as_deref() != Some(message.as_str()) {
                push(
                    FindingCode::InvalidRecord,
                    Severity::Error,
                    Subject::Message(message.clone()),
                    Next::RepairRecord,
                );
            }
        }
    }
    if let RunJsonFacts::Invalid { message } = &facts.run_json {
        push(
            FindingCode::InvalidRecord,
            Severity::Error,
            Subject::Message(message.clone()),
            Next::RepairRunJson,
        );
    }
    match &facts.commands {
        CommandFacts::NotChecked | CommandFacts::Clean => {}
        CommandFacts::Unproven { message } => push(
            FindingCode::CommandUnproven,
            Severity::Error,
            Subject::Message(message.clone()),
            Next::StopOrRemoveRecord,
        ),
        CommandFacts::Invalid { message } => push(
            FindingCode::InvalidRecord,
            Severity::Error,
            Subject::Message(message.clone()),
            Next::RepairCommandRecord,
        ),
        CommandFacts::OverLimit { message } => push(
            FindingCode::CommandRecordsOverLimit,
            Severity::Error,
            Subject::Message(message.clone()),
            Next::MoveCommandRecordsAside,
        ),
    }
    for cg in &facts.cgroups_left_alone {
        push(
            FindingCode::CgroupNotProven,
            Severity::Warning,
            Subject::CgroupLeftAlone(cg.clone()),
            Next::InspectCgroup {
                path: cg.path.clone(),
            },
        );
    }
    if let (Some(h), Some(false)) = (&view.head, facts.store_present) {
        if let Some(named) = named_store(&h.epoch) {
            push(
                FindingCode::StoreMissing,
                Severity::Error,
                Subject::StoreMissing {
                    generation: h.generation(),
                    named,
                },
                Next::RestoreStore,
            );
        }
    }
    let refused = store_refusal(&facts.run_json);
    if let (
        Some(code),
        RunJsonFacts::Written {
            generation, detail, ..
        },
    ) = (refused, &facts.run_json)
    {
        let dup =
            code == Code::StoreMissing && out.iter().any(|f| f.code == FindingCode::StoreMissing);
        if !dup {
            out.push(Finding {
                code: FindingCode::StoreRefused(code),
                severity: Severity::Error,
                subject: Subject::StoreRefused {
                    generation: *generation,
                    detail: detail.clone().unwrap_or_default(),
                },
                // A store of another run where the chain names none: nothing to restore;
                // moving it aside lets the next open create this run's own.
                next: if code == Code::StoreIdentityMismatch
                    && view
                        .head
                        .as_ref()
                        .is_none_or(|h| named_store(&h.epoch).is_none())
                {
                    Next::MoveStoreAside
                } else {
                    Next::RestoreStore
                },
            });
        }
    }
    // What the next claim refuses that no finding above reports (a bad file named like a
    // record in a folder verify does not read, a record named above the head): an error,
    // with its own repair.
    if let Some((code, message)) = &facts.claim_refusal {
        let reported = out.iter().any(|f| match &f.subject {
            Subject::Message(m) => m == message,
            _ => false,
        });
        // run.json ahead of the chain is reported above in its own words; the admission
        // rule's refusal says the same.
        let ahead = *code == Code::ChainBroken && run_json_ahead(facts).is_some();
        let store_reported = out.iter().any(|f| {
            matches!(
                f.code,
                FindingCode::StoreMissing | FindingCode::StoreRefused(_)
            )
        });
        if !reported && !ahead && *code != Code::RunCommandUnproven {
            let (code, next) = match *code {
                Code::ChainBroken | Code::EventLogGap => {
                    (FindingCode::BrokenChain, Next::RestoreLease)
                }
                // A store of another run where the chain names none: nothing to restore;
                // moving it aside lets the next open create this run's own.
                Code::StoreIdentityMismatch
                    if view
                        .head
                        .as_ref()
                        .is_none_or(|h| named_store(&h.epoch).is_none()) =>
                {
                    (
                        FindingCode::StoreRefused(Code::StoreIdentityMismatch),
                        Next::MoveStoreAside,
                    )
                }
                c @ (Code::StoreBehindSeal
                | Code::StoreIdentityMismatch
                | Code::StoreMissing
                | Code::StoreCorrupt) => (FindingCode::StoreRefused(c), Next::RestoreStore),
                Code::RunNotOwned => (FindingCode::NotOwned, Next::RepairRecord),
                Code::RunCommandRecordsOverLimit => (
                    FindingCode::CommandRecordsOverLimit,
                    Next::MoveCommandRecordsAside,
                ),
                _ => (FindingCode::InvalidRecord, Next::RepairRecord),
            };
            let dup = matches!(code, FindingCode::StoreRefused(_)) && store_reported;
            if !dup {
                out.push(Finding {
                    code,
                    severity: Severity::Error,
                    subject: Subject::Message(message.clone()),
                    next,
                });
            }
        }
    }
    if let Some(open) = &facts.open_cutoff {
        // The step that closes it is the next change of owner, which finalizes the cutoff
        // before it extends the chain (PROTOCOL §7.0 GATE): the step `status` names for
        // the run (a claim of a free run, a retirement, a takeover), or, while an error
        // finding stands (every writer refuses), that step after the repair; with a live
        // owner (it took over and its cutoff write was lost), its release does.
        let next = match next_step(facts) {
            Next::DoctorBeforeRun | Next::DoctorDoNotTakeOver => {
                Next::RepairFirst(Box::new(next_for_view(view)))
            }
            n => n,
        };
        out.push(Finding {
            code: FindingCode::OpenCutoff,
            severity: Severity::Warning,
            subject: Subject::OpenCutoff(open.clone()),
            next,
        });
    }
    if !facts.stray_names.is_empty() {
        out.push(Finding {
            code: FindingCode::StrayNames,
            severity: Severity::Warning,
            subject: Subject::StrayNames(facts.stray_names.clone()),
            next: Next::MoveStrays,
        });
    }
    if out.iter().any(|f| f.severity == Severity::Error) {
        for f in out
            .iter_mut()
            .filter(|f| matches!(f.code, FindingCode::StaleOwner | FindingCode::DeadOwner))
        {
            f.next = Next::RepairFirst(Box::new(f.next.clone()));
        }
    }
    if let Some(message) = &facts.adoption_refusal {
        out.push(Finding {
            code: FindingCode::FolderForeign,
            severity: Severity::Warning,
            subject: Subject::Message(message.clone()),
            next: Next::Init,
        });
    }
    if out.is_empty() {
        out.push(Finding {
            code: FindingCode::Ok,
            severity: Severity::Ok,
            subject: Subject::Run,
            next: Next::Nothing,
        });
    }
    out
}
