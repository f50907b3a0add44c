//! Reading a run's store without owning the run (issue #20: `runlease store get`, `list`
//! and `log` on a free run), writing nothing at all.
//!
//! [`StoreReader::open`] takes the run's kernel owner lock without creating `owner.lock`
//! (so no owner can open the store while it is read: SQLite's `immutable` read takes no
//! lock of its own), judges the lease (a run held by a live or unproven owner is refused
//! with the holder named), then opens `store/run.sqlite` beneath the held root with
//! [`lease_sqlite::Store::open_read_only_in`] (no `-shm`, no WAL replay; a WAL a crashed
//! owner left is refused, `STORE_BUSY` 75). Dropping the reader lets the lock go.
//!
//! ```no_run
//! use lease_run::store_read::StoreReader;
//!
//! let reader = StoreReader::open(std::path::Path::new("/srv/runs/job"))?;
//! for doc in reader.store().scan_prefix("step/")? {
//!     println!("{} = {}", doc.key, String::from_utf8_lossy(&doc.value));
//! }
//! # Ok::<(), lease_run::RunError>(())
//! ```

use crate::error::RunError;
use lease_core::LeaseError;
use lease_core::LeaseOps;
use lease_core::ops::Status;
use lease_fs::lock::OwnerLock;
use lease_fs::{FsError, ProcLiveness, RealFs, RunDir, run_id_of};
use lease_sqlite::{ReadOnlyStore, Store, StoreError};
use std::path::Path;
use std::sync::Arc;

/// A run's store opened to read, with the run's owner lock held until it is dropped.
#[derive(Debug)]
pub struct StoreReader {
    // Field order: the store closes before the lock goes.
    store: ReadOnlyStore,
    owner_dead: bool,
    _lock: OwnerLock,
}

impl StoreReader {
    /// Open the store of the run at `path` to read (see the module docs). Writes nothing:
    /// not `owner.lock`, not the store's folder, not the lease.
    ///
    /// # Errors
    /// `RUN_NOT_FOUND` (66) without such a folder; `OWNER_LOCK_HELD` (76) while a process
    /// on this host holds the run (its owner, even a stopped one);
    /// `RUN_ALREADY_ACTIVE` / `RUN_STALE_REQUIRES_TAKEOVER` (76) while the lease names an
    /// owner not proved dead (on another host, say); `STORE_MISSING` (65) when no owner
    /// created a store; `STORE_BUSY` (75) when a crashed owner's WAL must be replayed by
    /// the next owner first; an invalid lease record as `status` reports it; the store's
    /// own refusals as [`Store::open_read_only`]; a store the lease chain does not vouch
    /// for (65, judged as the admission rule judges it: `STORE_BEHIND_SEAL`,
    /// `STORE_IDENTITY_MISMATCH`, `CHAIN_BROKEN`), so nothing it holds is shown as the
    /// run's state.
    pub fn open(path: &Path) -> Result<StoreReader, RunError> {
        let run_id = run_id_of(path)?;
        let name = path.display().to_string();
        let io = |op: &'static str, e: std::io::Error| {
            RunError::Fs(FsError::io(run_id.as_str(), op, &name, e))
        };
        let fs = Arc::new(RealFs::open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                RunError::Fs(FsError::RunNotFound { path: name.clone() })
            } else {
                io("open run folder", e)
            }
        })?);
        let store_missing = |detail: &str| {
            RunError::Store(StoreError::Missing {
                run: run_id.to_string(),
                file: path
                    .join(lease_core::layout::STORE_DIR)
                    .join(lease_core::layout::STORE_FILE_NAME)
                    .display()
                    .to_string(),
                detail: detail.to_string(),
            })
        };
        let lock = match OwnerLock::try_acquire_existing_in(&fs) {
            Ok(Some(lock)) => lock,
            Ok(None) => return Err(RunError::OwnerLockHeld { run: name }),
            // No owner ever took the lock, so none ever opened (or created) a store.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(store_missing("no owner has run here yet (no owner.lock)"));
            }
            Err(e) => return Err(io("lock", e)),
        };
        // The lease: with the lock held here, only an owner elsewhere (another host on a
        // shared disk) or a dead one can hold it; read only when it is free or proved dead.
        let dir = RunDir::with_fs(
            fs.clone(),
            run_id.clone(),
            path,
            Arc::new(ProcLiveness::new(path).holding_lock()),
        );
        let view = dir.status(crate::clock::wall_now()?, true)?;
        match (&view.status, &view.head) {
            (Status::Invalid(e), _) => return Err(RunError::Lease(e.clone())),
            (Status::Free | Status::Dead, _) | (_, None) => {}
            (Status::Active | Status::Stale, Some(head)) => {
                return Err(RunError::Lease(LeaseError::RunAlreadyActive {
                    run: run_id.to_string(),
                    held: Box::new(head.held_by()),
                }));
            }
        }
        let store_dir = path.join(lease_core::layout::STORE_DIR);
        let folder = match fs.open_dir(lease_core::layout::STORE_DIR) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(store_missing("no owner has created it yet"));
            }
            Err(e) => return Err(io("open store folder", e)),
        };
        let store = Store::open_read_only_in(
            &run_id,
            folder,
            &store_dir,
            lease_core::layout::STORE_FILE_NAME,
        )?;
        judge_against_chain(&run_id, &store, &store_dir, &view)?;
        Ok(StoreReader {
            store,
            owner_dead: view.status == Status::Dead,
            _lock: lock,
        })
    }

    /// Whether the lease names an owner proved dead (it must be retired before the run is
    /// claimed again: `runlease run --retire-dead`); `false` for a free run.
    pub fn owner_dead(&self) -> bool {
        self.owner_dead
    }

    /// The store, to read.
    pub fn store(&self) -> &ReadOnlyStore {
        &self.store
    }
}

/// Judge the store opened read-only against what the lease chain requires of it, as the
/// next owner's open would (and as `status`/`doctor` do through the admission rule, whose
/// finding has the same code): issue #28, `runlease store get/list/log` printed a rewound
/// store's values with exit 0 while every writer refused the run over it.
///
/// - the seal and store floor after the head ([`lease_core::seal::seal_of`]), and for a
///   dead owner's active head the store head its last heartbeat reported (the next owner
///   records it as its floor): below either → `STORE_BEHIND_SEAL`; a sealed store of
///   another identity → `STORE_IDENTITY_MISMATCH` (65, doctor's finding of that code);
/// - a commit fenced by a generation above the head → `CHAIN_BROKEN` (65: the lease chain
///   was rolled back or cut; doctor reports `BROKEN_CHAIN`).
///
/// Read only (the store is already open `immutable`).
fn judge_against_chain(
    run: &lease_core::RunId,
    store: &ReadOnlyStore,
    store_dir: &Path,
    view: &lease_core::ops::StatusView,
) -> Result<(), RunError> {
    let file = store_dir
        .join(lease_core::layout::STORE_FILE_NAME)
        .display()
        .to_string();
    let head = view.head.as_ref().map_or(0, |h| h.generation().get());
    let token = store.max_token()?;
    if let Some(ev) = lease_core::rollback::rollback_evidence(head, None, None, Some(token)) {
        return Err(RunError::Lease(LeaseError::ChainBroken {
            run: run.to_string(),
            chain: "epoch",
            at: ev.generation(),
            detail: format!(
                "{ev} (the store: {file}): its values are not the run's authoritative state; `runlease doctor` reports BROKEN_CHAIN"
            ),
        }));
    }
    crate::admission::store_against_chain(run, store, &file, view)
}
