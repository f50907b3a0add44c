//! What an opened store whose seal is not checked yet can do besides reporting its facts
//! (`read.rs`), and the seal check.

use super::{OpenedStore, Store};
use crate::error::StoreError;
use lease_core::{Generation, RunId, Seal};

// Its facts (`run`, `path`, `reached_through_fd`, `identity`, `head`) are those of every
// handle, in `read.rs`.
impl OpenedStore {
    /// Check the store against what the lease chain requires of it
    /// ([`lease_core::seal::Requirements`]: from the chain, or explicitly
    /// `Requirements::no_chain()` for a store used without one) and return the [`Store`]
    /// that can commit: [`OpenedStore::check_seal`] with the requirements as one value.
    ///
    /// # Errors
    /// As [`OpenedStore::check_seal`].
    pub fn check(self, req: &lease_core::seal::Requirements) -> Result<Store, StoreError> {
        self.check_seal(req.seal(), req.floor())
    }

    /// Check the store against the run's newest seal and store floor (from the epoch the
    /// claim replaced, `lease_core::seal::seal_of`) with [`lease_core::seal::check_seal`],
    /// and return the [`Store`] that can commit. The low-level form of
    /// [`OpenedStore::check`]: `(None, None)` here means "the chain names no seal and no
    /// floor", which only the chain can say; prefer `check` with
    /// [`lease_core::seal::Requirements`].
    ///
    /// # Errors
    /// `STORE_IDENTITY_MISMATCH` (65): the seal names another store (a restored or
    /// foreign copy never passes, whatever its head). (A store of another run is refused
    /// earlier, by [`Store::open`], with the same code.) Accepted, a store created before
    /// stores were bound to their run is bound to this one (its `application_id`). `STORE_BEHIND_SEAL` (65): the head is
    /// below the seal's sequence or below the floor. The store is closed untouched.
    pub fn check_seal(
        self,
        seal: Option<&Seal>,
        floor: Option<(u64, Generation)>,
    ) -> Result<Store, StoreError> {
        let state = self.inner.identity()?;
        let run = RunId::new(self.inner.run.clone())?;
        lease_core::seal::check_seal(&run, seal, floor, &state).map_err(|error| {
            StoreError::Lease {
                file: Some(self.inner.file.clone()),
                error,
            }
        })?;
        let mut inner = self.inner;
        if !inner.bound {
            // A store created before stores were bound to their run: bind it now that the
            // chain has accepted it (one header write, in its own transaction, WAL-synced).
            inner
                .conn()
                .execute_batch(&super::validate::bind_to_run_sql(&inner.run))
                .map_err(|e| {
                    super::sqlite::sqlite_err(
                        &crate::header::Ctx {
                            run: &inner.run,
                            file: &inner.file,
                        },
                        "bind to the run (application_id)",
                        e,
                    )
                })?;
            inner.bound = true;
        }
        Ok(Store { inner })
    }

    /// Close without using the store (nothing is written, no checkpoint).
    pub fn close(self) {
        drop(self);
    }
}
