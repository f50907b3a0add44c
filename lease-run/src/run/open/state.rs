//! What an open carries from step to step: what it has done so far (for the undo), what
//! every step reads, and why it stopped.

use crate::authority::LeaseAuthority;
use crate::error::RunError;
use crate::run::{OpenOptions, Shared, StepName};
use lease_core::ops::OwnedLease;
use lease_core::{RunStatus, Seal};
use lease_fs::lock::OwnerLock;
use lease_fs::{RealFs, RunDir};
use lease_sqlite::{OpenedStore, Store};
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::task::JoinHandle;

/// Why the steps of an open stopped early.
pub(super) enum Halt {
    /// A step failed.
    Failed(RunError),
    /// The caller stopped waiting; seen after this step.
    Cancelled(StepName),
}

impl From<RunError> for Halt {
    fn from(e: RunError) -> Halt {
        Halt::Failed(e)
    }
}

/// The `failed` detail of a run whose open finished after its caller stopped waiting.
pub(super) const CANCELLED_AFTER_OPEN: &str =
    "the open was cancelled (its caller stopped waiting) after it finished; the run was released";

/// What open has done so far, for the undo.
pub(super) struct Opening {
    pub(super) dir: Arc<RunDir>,
    /// The held run root (the store folder is opened beneath it).
    pub(super) root: Arc<RealFs>,
    pub(super) auth: Arc<dyn LeaseAuthority>,
    pub(super) lock: Option<OwnerLock>,
    pub(super) lease: Option<OwnedLease>,
    pub(super) shared: Option<Arc<Shared>>,
    pub(super) tasks: Vec<JoinHandle<()>>,
    pub(super) current: Option<RunStatus>,
    /// The seal the chain requires of this owner (the replaced epoch's), known from the
    /// claim on (and read again at the `store` step): re-issued by the undo of an open
    /// that fails before the store is live, so the next opener still checks the store's
    /// identity.
    pub(super) carry_seal: Arc<Mutex<Option<Seal>>>,
    /// The preflight verified the log and both chains (so a replacement in the claim step
    /// need not walk them again).
    pub(super) verified: bool,
    /// The verified-prefix mark the preflight's tail check made due, left by the claim
    /// step once the claim succeeded (never on a refusal).
    pub(super) mark_due: Option<(lease_core::Sequence, lease_core::Digest)>,
    /// The takeover of the claim step may have replaced a live owner (OQ-5): commands
    /// wait until `CLOCK_BOOTTIME` reaches this (ns).
    pub(super) commands_after: Option<(lease_core::ops::Preempted, u64)>,
}

/// What every open step reads: the run folder's path, its name (as messages show it) and
/// the options.
pub(super) struct Ctx<'a> {
    pub(super) path: &'a Path,
    pub(super) name: String,
    pub(super) opts: &'a OpenOptions,
}

/// The seal and store floor the chain requires of an owner
/// ([`lease_core::seal::requirements`]).
pub(super) use lease_core::seal::Requirements;

/// The store as the `store` step opened it: a local store with the seal and floor the
/// `seal` step checks it against, or (the store in the engine, issue #32) the view the
/// catch-up brought to the engine's tail, with the log's state.
pub(super) enum Unchecked {
    Local(OpenedStore, Requirements),
    Engine(Store, Box<crate::engine_store::EngineLog>),
    /// Not opened (issue #33): the chain's seal is the store's, the preflight checked the
    /// store against it, and the first access opens it ([`open_deferred`](super::store::open_deferred)).
    Deferred(crate::run::DeferredStore),
}
