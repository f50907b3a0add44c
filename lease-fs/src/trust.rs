//! Whom runlease trusts on disk: the effective uid, and files and folders owned by it and
//! not writable by group or others ([`check_trusted`]); anything else is a [`NotOwned`]
//! error (`RUN_NOT_OWNED`, 77) before anything is read or written through it. The rule and
//! its wording are lease-core's (`lease_core::trust`, shared with lease-sqlite's store
//! checks); this is the `stat` side. Split out of `real.rs` (which re-exports these).

use std::io;
use std::path::Path;

use rustix::fs::{FileType, Stat};

use crate::real::{perm_of, type_of};

pub use lease_core::trust::{NotOwned, shell_quote};

/// The effective uid of this process.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// `Ok` if `st` (of `rel` below the run root `root`; `""` = the root) is owned by the
/// effective uid and not open to others: no group/other write bit. Else a [`NotOwned`] error. Symlinks are not
/// judged here (they are refused as such wherever they matter).
pub(crate) fn check_trusted(root: &Path, st: &Stat, rel: &str) -> io::Result<()> {
    let ft = type_of(st);
    if ft == FileType::Symlink {
        return Ok(());
    }
    let is_dir = ft == FileType::Directory;
    let (uid, mode, me) = (st.st_uid, perm_of(st), euid());
    if lease_core::trust::trusted(uid, mode, me) {
        return Ok(());
    }
    let abs = if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    };
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        NotOwned {
            path: rel.to_string(),
            abs,
            uid,
            mode,
            euid: me,
            is_dir,
        },
    ))
}

/// The [`NotOwned`] inside `e` (its payload, or anywhere in its chain of sources).
pub fn not_owned_in(e: &io::Error) -> Option<&NotOwned> {
    crate::fs::error_in(e)
}
