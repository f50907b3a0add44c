//! What a diagnosis is given: [`Facts`], gathered by a layer that reads the run.

use crate::Generation;
use crate::code::Code;
use crate::ops::{StatusView, VerifyReport};
use crate::records::EpochRecord;

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
