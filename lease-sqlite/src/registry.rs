//! The process-wide registry of open store files: one connection per file per process.
//!
//! POSIX advisory (`fcntl`) locks, which SQLite's unix VFS uses, belong to the process and
//! the file, not to a descriptor: closing *any* descriptor of the file drops *all* of the
//! process's locks on it. A second open of the same database file in this process (even a
//! read-only one, even through another path or a hard link) would therefore silently drop
//! the exclusive lock of the first connection when it closes, and another process could
//! then open the store beside the owner. So this crate keeps every store file it has open
//! in a registry keyed by the file's identity (device and inode), and refuses a second open
//! with `STORE_BUSY` until the first handle is gone.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};

/// Identity of a file: (device, inode).
pub(crate) type FileKey = (u64, u64);

static OPEN: Mutex<BTreeSet<FileKey>> = Mutex::new(BTreeSet::new());

fn open_set() -> MutexGuard<'static, BTreeSet<FileKey>> {
    // A panic while holding this lock cannot leave the set half-updated (single insert or
    // remove), so a poisoned lock is still consistent.
    OPEN.lock().unwrap_or_else(|e| e.into_inner())
}

/// Proof that this handle is the process's only one on a file; unregisters on drop.
#[derive(Debug)]
pub(crate) struct Registration {
    key: FileKey,
}

impl Registration {
    /// Register `key`; `None` if this process already has that file open.
    pub(crate) fn take(key: FileKey) -> Option<Registration> {
        // The guard is released before a `Registration` exists (its drop locks the set).
        let inserted = open_set().insert(key);
        // `then`, not `then_some`: a refused key must not build (and drop) a registration,
        // which would unregister the handle that holds it.
        inserted.then(|| Registration { key })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        open_set().remove(&self.key);
    }
}
