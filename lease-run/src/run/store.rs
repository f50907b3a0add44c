//! The store handle: the run's store behind the fence, commits stamped with the generation.

use super::{Run, Shared};
use crate::error::RunError;
use crate::fence::{Access, FenceCore};
use crate::sync::lock_std;
use lease_sqlite::{Batch, Commit, Document, Store, StoreError};
use std::sync::Arc;

/// A handle on the run's store (`store/run.sqlite`), from [`Run::store`]. Cloneable and
/// `Send + Sync`: the one `lease_sqlite::Store` (`Send`, not `Sync`) sits behind a mutex,
/// so calls from several threads run one at a time.
///
/// Every call is **blocking** (a commit fsyncs the WAL): from async code call it inside
/// `tokio::task::spawn_blocking`, or use [`Run::commit`].
///
/// Every commit is stamped with the run's generation as its fencing token, and before it
/// starts it applies the self-fence rule ([`Run::check_live`], as the store's commit gate):
/// no commit begins once the run is fenced or its last successful heartbeat started more
/// than `self_fence_after` ago. Once the run is fenced every call answers `FENCED` and the
/// store is closed; after [`Run::release`] every call answers `RUN_RELEASED`.
#[derive(Clone)]
pub struct RunStore {
    pub(super) shared: Arc<Shared>,
}

impl std::fmt::Debug for RunStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunStore")
            .field("run", &self.shared.run)
            .field("generation", &self.shared.generation)
            .finish_non_exhaustive()
    }
}

impl RunStore {
    fn with<T, E>(
        &self,
        f: impl FnOnce(&FenceCore<Store>, &mut Store) -> Result<T, E>,
    ) -> Result<T, RunError>
    where
        RunError: From<E>,
    {
        let sh = &self.shared;
        let open = || match sh.deferred.get() {
            Some(d) => super::open::open_deferred(sh, d),
            None => Err(RunError::Io(format!(
                "run {}: the store was deferred without what opens it",
                sh.run
            ))),
        };
        match sh
            .core
            .with_store(open, |c, s| f(c, s).map_err(RunError::from))
        {
            Ok(x) => Ok(x),
            Err(Access::Failed(e) | Access::OpenFailed(e)) => Err(e),
            Err(Access::Fenced) => {
                self.shared.check_live()?;
                // Unreachable in practice (check_live above reports the first reason).
                Err(self.shared.fenced_error("its store was dropped".into()))
            }
            Err(Access::Closed) => {
                self.shared.check_live()?;
                Err(RunError::Released {
                    run: self.shared.run.clone(),
                })
            }
        }
    }

    /// Commit `batch` as this run's generation; returns its sequence (durable when this
    /// returns). `FENCED` (75) if the run is fenced or past its self-fence deadline, or if
    /// the store has accepted a higher generation.
    pub fn commit(&self, batch: &Batch) -> Result<u64, RunError> {
        let seqs = self.commit_group(std::slice::from_ref(batch))?;
        Ok(seqs.first().copied().unwrap_or(0))
    }

    /// Group commit: commit each of `batches` as this run's generation in one store
    /// transaction (one fsync), each with its own sequence; returns them in order (see
    /// `lease_sqlite::Store::commit_group`). All or none, with the errors of
    /// [`RunStore::commit`].
    ///
    /// With the store committed in the engine (issue #32, docs/PROTOCOL.md §18.3) each
    /// group that fits is one record the engine creates under its guard, then applied to
    /// the local view; the self-fence rule is applied before the engine is asked. A commit
    /// whose answer was lost (`OUTCOME_UNKNOWN`) is resolved before the next one.
    pub fn commit_group(&self, batches: &[Batch]) -> Result<Vec<u64>, RunError> {
        if let Some(engine) = self.shared.engine.get() {
            return self.engine_commit(engine, batches);
        }
        let g = self.shared.generation;
        self.with(|core, s| {
            let seqs = s.commit_group(g, batches)?;
            if let Some(last) = seqs.last() {
                core.acknowledge(*last);
            }
            Ok::<_, StoreError>(seqs)
        })
    }

    fn engine_commit(
        &self,
        engine: &super::EngineSlot,
        batches: &[Batch],
    ) -> Result<Vec<u64>, RunError> {
        let sh = &self.shared;
        let r = self.with(|core, view| {
            // The self-fence rule before the engine is asked (the view's own gate runs
            // again when the record is applied).
            sh.check_live()?;
            let now = crate::clock::wall_now()?;
            let mut log = lock_std(&engine.log);
            let mut nonce = || {
                getrandom::u64().unwrap_or_else(|_| {
                    // No randomness from the OS (never expected): the boot-time clock,
                    // so two ids of one owner still differ.
                    crate::clock::boottime_ns()
                })
            };
            let seqs = log.commit_group(&*engine.auth, view, batches, now, &mut nonce)?;
            if let Some(last) = seqs.last() {
                core.acknowledge(*last);
            }
            Ok::<_, RunError>(seqs)
        });
        if let Err(e) = &r {
            if e.code() == lease_core::Code::Fenced && !sh.is_fenced() {
                // The engine refused this generation's record: it is deposed.
                sh.fence(e.to_string());
            }
        }
        r
    }

    /// The commits after sequence `after`, at most `max` of them, in order.
    pub fn commits_page(&self, after: u64, max: usize) -> Result<Vec<Commit>, RunError> {
        self.with(|_, s| s.commits_page(after, max))
    }

    /// One page of the documents under `prefix` after `after`, at most `limit_rows`
    /// documents and about `limit_bytes` of keys and values (at least one document when
    /// any remains), and the key to continue after when more follow (see
    /// `lease_sqlite::Store::scan_prefix_page`).
    pub fn scan_prefix_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit_rows: usize,
        limit_bytes: usize,
    ) -> Result<(Vec<Document>, Option<String>), RunError> {
        self.with(|_, s| s.scan_prefix_page(prefix, after, limit_rows, limit_bytes))
    }

    /// At most `max` commits after `after` and about `max_bytes` of their writes and log
    /// entries (at least one when any remains; see `lease_sqlite::Store::commits_page_bytes`).
    pub fn commits_page_bytes(
        &self,
        after: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Commit>, RunError> {
        self.with(|_, s| s.commits_page_bytes(after, max, max_bytes))
    }

    /// The document at `key`, if any.
    pub fn get(&self, key: &str) -> Result<Option<Document>, RunError> {
        self.with(|_, s| s.get(key))
    }

    /// Every document whose key starts with `prefix`, in key order.
    pub fn scan_prefix(&self, prefix: &str) -> Result<Vec<Document>, RunError> {
        self.with(|_, s| s.scan_prefix(prefix))
    }

    /// The commits after sequence `after`, in order, with their writes and log entries.
    pub fn commits_since(&self, after: u64) -> Result<Vec<Commit>, RunError> {
        self.with(|_, s| s.commits_since(after))
    }

    /// The last committed sequence (0 for an empty store).
    pub fn head(&self) -> Result<u64, RunError> {
        self.with(|_, s| s.head())
    }

    /// The store's identity (created with it).
    pub fn store_id(&self) -> Result<String, RunError> {
        self.with(|_, s| s.identity().map(|i| i.store_id))
    }
}

impl Run {
    /// A handle on the run's store (see [`RunStore`]): commits carry this generation and
    /// none starts after the self-fence deadline.
    pub fn store(&self) -> RunStore {
        RunStore {
            shared: self.shared.clone(),
        }
    }

    /// [`Run::commit`], then a durable heartbeat carrying the new head, before returning:
    /// the commit is then in the floor any replacer records, so a copy of the store rewound
    /// below it is refused (`STORE_BEHIND_SEAL`) after a crash or power loss too, not only
    /// after a clean release. Costs one more fsync (the store socket's commits do this for
    /// a whole group at once). If the beat fails the commit is in the store but this
    /// returns the beat's error (a `FENCED` beat fences the run).
    ///
    /// With the store committed in the engine (issue #32) there is no floor to cover: the
    /// engine's log is the store, and the commit is acknowledged once the engine took it.
    pub async fn commit_covered(&self, batch: Batch) -> Result<u64, RunError> {
        let seq = self.commit(batch).await?;
        if self.shared.engine.get().is_some() {
            return Ok(seq);
        }
        super::heartbeat::beat(&self.auth, &self.shared, &self.lease, true).await?;
        Ok(seq)
    }

    /// Commit `batch` to the store off the async runtime (`spawn_blocking`); see
    /// [`RunStore::commit`]. Acknowledged commits are in the floor from the next heartbeat
    /// on (see [`Run::commit_covered`] for at once).
    pub async fn commit(&self, batch: Batch) -> Result<u64, RunError> {
        let store = self.store();
        tokio::task::spawn_blocking(move || store.commit(&batch))
            .await
            .map_err(|e| RunError::Io(format!("commit task failed: {e}")))?
    }
}
