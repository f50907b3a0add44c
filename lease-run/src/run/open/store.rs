//! The store and seal steps: the run's store opened (local, deferred, or the engine's
//! view caught up) and checked against the seal and floor the chain requires.

use super::state::*;
use crate::authority::LeaseAuthority;
use crate::error::RunError;
use crate::run::step::{blocking, timed};
use crate::run::{Shared, StepName};
use crate::sync::lock_std;
use lease_core::ops::OwnedLease;
use lease_core::{Generation, LeaseError, LeaseOps, RunId};
use lease_fs::{FsError, RealFs};
use lease_sqlite::{OpenedStore, Store, StoreError};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// (8) store: the seal and floor from the lease chain (our epoch and the one our
/// claim replaced), then open `store/run.sqlite`. A new store is created only when
/// the chain names none (no seal, floor 0 or none); an expected store that is
/// missing is STORE_MISSING, never recreated.
pub(super) async fn store(
    st: &Opening,
    cx: &Ctx<'_>,
    lease: &OwnedLease,
) -> Result<Unchecked, RunError> {
    let (path, name, cb, deadline) = (cx.path, &cx.name, &cx.opts.on_step, cx.opts.step_deadline);
    let dir = st.auth.clone();
    let (rid, g, carry) = (
        lease.run_id.clone(),
        lease.generation,
        st.carry_seal.clone(),
    );
    let root = st.root.clone();
    let store_dir = path.join(lease_core::layout::STORE_DIR);
    if dir.commits_in_engine() {
        let l = lease.clone();
        return timed(
            cb,
            StepName::Store,
            blocking(name, StepName::Store, deadline, move || {
                engine_store(&*dir, &root, &store_dir, &l)
            }),
        )
        .await;
    }
    let lazy = cx.opts.lazy_store;
    timed(
        cb,
        StepName::Store,
        blocking(name, StepName::Store, deadline, move || {
            let req = dir.store_requirements(g)?;
            *lock_std(&carry) = req.seal().cloned();
            if lazy && deferrable(&req) && !leftover_log(&root) {
                return Ok(Unchecked::Deferred(crate::run::DeferredStore {
                    run_id: rid,
                    root,
                    store_dir,
                    req,
                }));
            }
            Ok(Unchecked::Local(
                open_local(&rid, &root, &store_dir, &req)?,
                req,
            ))
        }),
    )
    .await
}

/// Whether the store may be opened lazily (issue #33, PROTOCOL §9): the chain names a
/// seal (the claimed-over head was a clean release, which closed the store at that
/// sequence) and no floor above it (no change of owner recorded a higher head since).
/// Then, until a commit needs it, the sealed store is exactly what the next owner must
/// find, and the release may carry that seal forward. The preflight has already checked
/// the store against the seal and floor (read-only). A store that must be created, or
/// one only a floor vouches for (after a takeover or retirement), is opened eagerly.
pub(super) fn deferrable(req: &Requirements) -> bool {
    req.seal()
        .is_some_and(|seal| req.floor().is_none_or(|(f, _)| f <= seal.sequence))
}

/// Open `store/run.sqlite` for the owner whose chain requires `req`: the store folder
/// beneath the held root (no symlink followed, trust-checked; the store's files only ever
/// beneath it), a new store created only when the chain names none, the sealed identity
/// expected. The eager `store` step and a deferred store's first access both open it here.
pub(super) fn open_local(
    rid: &RunId,
    root: &RealFs,
    store_dir: &Path,
    req: &Requirements,
) -> Result<OpenedStore, RunError> {
    let folder = root
        .open_dir(lease_core::layout::STORE_DIR)
        .map_err(|e| FsError::io(rid.as_str(), "open", lease_core::layout::STORE_DIR, e))?;
    Ok(Store::open_in(
        rid,
        folder,
        store_dir,
        lease_core::layout::STORE_FILE_NAME,
        lease_sqlite::StoreOptions::for_chain(req),
    )?)
}

/// Whether `store/` holds a write-ahead log or rollback journal beside the store (a crash
/// left commits to replay, or something unexplained is there), or cannot be looked at: then
/// the store is opened eagerly, so the replay happens (and anything wrong is refused)
/// before the command starts, and the step `store get`'s `STORE_BUSY` names ("run it
/// once") does what it says. A clean close removes the `-wal`, so after a clean release
/// there is none. One `fstatat` each, beneath the held root, no symlink followed.
pub(super) fn leftover_log(root: &RealFs) -> bool {
    let Ok(folder) = root.open_dir(lease_core::layout::STORE_DIR) else {
        return true;
    };
    [
        format!("{}-wal", lease_core::layout::STORE_FILE_NAME),
        format!("{}-journal", lease_core::layout::STORE_FILE_NAME),
    ]
    .iter()
    .any(|name| {
        !matches!(
            rustix::fs::statat(
                &folder,
                name.as_str(),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW
            ),
            Err(rustix::io::Errno::NOENT)
        )
    })
}

/// Open a deferred store at its first access (called by the fence core under its store
/// slot, after the fence check): [`open_local`] (never created: the chain names a seal),
/// checked against the seal and floor, and the commit gate installed, exactly as the eager
/// `store` and `seal` steps do. Returns the store with its head.
pub(in crate::run) fn open_deferred(
    shared: &Arc<Shared>,
    d: &crate::run::DeferredStore,
) -> Result<(Store, u64), RunError> {
    let mut store = open_local(&d.run_id, &d.root, &d.store_dir, &d.req)?.check(&d.req)?;
    let head = store.head()?;
    store.set_commit_gate(commit_gate(shared, shared.run.clone(), shared.generation));
    Ok((store, head))
}

/// The store's commit gate: the self-fence rule of `shared` (while it exists), as the
/// store error the commit returns.
pub(super) fn commit_gate(
    shared: &Arc<Shared>,
    run_s: String,
    g: Generation,
) -> lease_sqlite::CommitGate {
    let weak = Arc::downgrade(shared);
    Box::new(move || match weak.upgrade() {
        Some(sh) => sh.check_live().map_err(|e| {
            // The fence's own reason, not its message: one prefix per message.
            let reason = match e {
                RunError::Fenced { reason, .. } => reason,
                other => other.to_string(),
            };
            StoreError::from(sh.fenced_lease_error(reason))
        }),
        None => Err(StoreError::from(LeaseError::Fenced {
            run: run_s.clone(),
            generation: g,
            detail: "the run is gone".into(),
        })),
    })
}

/// (8), the store in the engine (docs/PROTOCOL.md §18.4): the view `store/view.sqlite`
/// caught up to the engine's log, or rebuilt from it, before anything is served. A run
/// whose chain names a local store (a seal or a floor from before the store followed the
/// lease) while the engine holds no record of it is refused: its data is in that
/// `store/run.sqlite`, and starting from an empty store would lose it.
pub(super) fn engine_store(
    auth: &dyn LeaseAuthority,
    root: &lease_fs::RealFs,
    store_dir: &Path,
    lease: &OwnedLease,
) -> Result<Unchecked, RunError> {
    let rid = lease.run_id.clone();
    // Opened beneath the held root (the layout step made it), never through a symlink.
    let open = || root.open_dir(lease_core::layout::STORE_DIR);
    let dir = crate::engine_store::StoreDir {
        open: &open,
        path: store_dir.to_path_buf(),
    };
    let (log, view) = crate::engine_store::EngineLog::catch_up(auth, lease, &dir)?;
    if log.tail().last.is_none() {
        let req = auth.store_requirements(lease.generation)?;
        if !req.names_no_store() {
            return Err(RunError::Store(lease_sqlite::StoreError::Missing {
                run: rid.to_string(),
                file: store_dir
                    .join(lease_core::layout::STORE_FILE_NAME)
                    .display()
                    .to_string(),
                detail: "the lease chain names this local store (from before the store was committed in the engine), and the engine holds no record of it; this version cannot import it yet, and will not start this run with an empty store".into(),
            }));
        }
    }
    Ok(Unchecked::Engine(view, Box::new(log)))
}

/// (9) seal: the store must be the sealed one, at or past the seal and the floor.
/// Then the commit gate (the self-fence rule) is installed and the store handed to
/// `RunStore` handles.
pub(super) async fn seal(
    cx: &Ctx<'_>,
    lease: &OwnedLease,
    shared: &Arc<Shared>,
    auth: Arc<dyn LeaseAuthority>,
    opened: Unchecked,
) -> Result<(), RunError> {
    let (name, cb, deadline) = (&cx.name, &cx.opts.on_step, cx.opts.step_deadline);
    let sh = shared.clone();
    let (run_s, g) = (name.clone(), lease.generation);
    timed(
        cb,
        StepName::Seal,
        blocking(name, StepName::Seal, deadline, move || {
            let (mut store, engine) = match opened {
                Unchecked::Local(opened, req) => (opened.check(&req)?, None),
                Unchecked::Engine(view, log) => (view, Some(log)),
                Unchecked::Deferred(d) => {
                    // Nothing opened, nothing written: heartbeats report the seal's
                    // sequence (the head the chain vouches for) until a commit opens it.
                    let head = d.req.seal().map_or(0, |s| s.sequence);
                    let _ = sh.deferred.set(d);
                    sh.core.defer_store(head);
                    return Ok(());
                }
            };
            let head = store.head()?;
            store.set_commit_gate(commit_gate(&sh, run_s, g));
            if let Some(log) = engine {
                let _ = sh.engine.set(crate::run::EngineSlot {
                    auth: auth.clone(),
                    log: Mutex::new(*log),
                });
            }
            sh.core.install_store(store, head);
            Ok(())
        }),
    )
    .await?;
    shared.check_live()?;
    Ok(())
}
