//! A one-function SQLite VFS shim so the store is opened beneath a held folder descriptor.
//!
//! SQLite's own `unix` VFS opens files by name, and before it does, its `xFullPathname`
//! resolves every symlink in the name (`/proc/self/fd/N/run.sqlite` would become the
//! folder's path again, re-walked component by component, raceable by whoever can rename
//! folders above it). This VFS, registered once as `runlease-fd`, is an exact copy of the
//! `unix` VFS (same I/O methods, same locking, same `pAppData`) except for `xFullPathname`:
//! a name that starts with `/proc/self/fd/` is passed through unchanged. SQLite then opens
//! `/proc/self/fd/N/run.sqlite` (and `…-wal`, `…-journal`, and the folder itself for its
//! directory fsync) with `open(2)`, and the kernel resolves `/proc/self/fd/N` to the held
//! descriptor's directory, not to a path: nothing below the run root is looked up by name
//! from outside. The last component is still opened `O_NOFOLLOW` by the `unix` VFS.
//!
//! This module is the crate's only `unsafe` code (the workspace's other is lease-run's
//! `clone_into`): reading SQLite's VFS table and registering a copy of it. It is kept to
//! those two calls and one `extern "C"` function that copies a string.

#![allow(unsafe_code)]

use rusqlite::ffi;
use std::ffi::{CStr, c_char, c_int};
use std::sync::OnceLock;

/// The name the shim is registered under.
pub(crate) const NAME: &str = "runlease-fd";
const NAME_C: &CStr = c"runlease-fd";
/// Names passed through unchanged.
pub(crate) const PREFIX: &str = "/proc/self/fd/";

type FullPathname =
    unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *const c_char, c_int, *mut c_char) -> c_int;

/// The `unix` VFS's own `xFullPathname`, for any other name.
static UNIX_FULL_PATHNAME: OnceLock<FullPathname> = OnceLock::new();
static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();

/// `xFullPathname` of the shim.
///
/// # Safety
/// Called by SQLite with a NUL-terminated `z_path` and an output buffer of `n_out` bytes.
unsafe extern "C" fn full_pathname(
    vfs: *mut ffi::sqlite3_vfs,
    z_path: *const c_char,
    n_out: c_int,
    z_out: *mut c_char,
) -> c_int {
    // SAFETY: SQLite passes a valid NUL-terminated string.
    let name = unsafe { CStr::from_ptr(z_path) }.to_bytes_with_nul();
    if name.starts_with(PREFIX.as_bytes()) {
        if usize::try_from(n_out).map_or(true, |n| name.len() > n) {
            return ffi::SQLITE_CANTOPEN;
        }
        // SAFETY: `z_out` has room for `n_out >= name.len()` bytes; the two do not overlap
        // (SQLite's output buffer is its own allocation).
        unsafe { std::ptr::copy_nonoverlapping(name.as_ptr().cast::<c_char>(), z_out, name.len()) };
        return ffi::SQLITE_OK;
    }
    match UNIX_FULL_PATHNAME.get() {
        // SAFETY: the `unix` VFS's function, called with the arguments SQLite gave us (it
        // does not use its VFS argument).
        Some(f) => unsafe { f(vfs, z_path, n_out, z_out) },
        None => ffi::SQLITE_ERROR,
    }
}

/// Register the shim (once per process). `Err` says why it could not be, and the caller
/// then opens by path.
pub(crate) fn ensure() -> Result<(), String> {
    REGISTERED
        .get_or_init(|| {
            // SAFETY: `sqlite3_vfs_find` initialises SQLite if needed and returns a pointer
            // to a VFS that lives as long as the process, or null.
            let base = unsafe { ffi::sqlite3_vfs_find(c"unix".as_ptr()) };
            if base.is_null() {
                return Err("SQLite has no \"unix\" VFS".into());
            }
            // SAFETY: non-null, points to SQLite's static `unix` VFS; read by value.
            let mut copy: ffi::sqlite3_vfs = unsafe { *base };
            let Some(unix_full) = copy.xFullPathname else {
                return Err("SQLite's \"unix\" VFS has no xFullPathname".into());
            };
            let _ = UNIX_FULL_PATHNAME.set(unix_full);
            copy.zName = NAME_C.as_ptr();
            copy.pNext = std::ptr::null_mut();
            copy.xFullPathname = Some(full_pathname);
            // SQLite keeps the pointer for the life of the process: leak it on purpose.
            let leaked: &'static mut ffi::sqlite3_vfs = Box::leak(Box::new(copy));
            // SAFETY: a complete VFS struct that outlives every connection; not the default.
            let rc = unsafe { ffi::sqlite3_vfs_register(leaked, 0) };
            if rc == ffi::SQLITE_OK {
                Ok(())
            } else {
                Err(format!("sqlite3_vfs_register returned {rc}"))
            }
        })
        .clone()
}
