//! # lease-fs — the POSIX adapter for runlease (NOT IMPLEMENTED YET)
//!
//! **Status: skeleton.** This crate contains no working code yet. Nothing in it
//! touches the file system, takes a lock or stores a lease today. Do not depend on
//! it for anything but its [`STATUS`] constant.
//!
//! What this crate **will** hold, once its issue lands (see `ARCHITECTURE.md`,
//! section 2):
//!
//! - **Durable primitives:** atomic replace (temp file, write, fsync, rename,
//!   fsync the directory), link-exclusive create (temp file, fsync, `link(2)`,
//!   fsync the directory; `EEXIST` is the loser's answer), directory fsync.
//! - **Private directories:** 0700 directories and 0600 files, `O_NOFOLLOW`,
//!   symlinks refused.
//! - **Directory-fd relative operations** (openat-style), so a renamed or
//!   remounted run root is detected instead of silently followed.
//! - **The kernel owner lock** for a run.
//! - **On-disk stores built from those primitives:** the lease store, the event
//!   log and command records, all using the sans-IO records and decisions of
//!   `lease-core`.
//! - **A file-system seam (an `Fs` trait or equivalent) and a simulated FS** that
//!   can inject faults and crash between any two syscalls, dropping whatever was
//!   not fsynced, for the crash-point tests.
//!
//! # Example
//!
//! The only thing this skeleton offers is an honest status string:
//!
//! ```
//! assert!(lease_fs::STATUS.contains("not implemented yet"));
//! ```

/// Implementation status of this crate: it is a placeholder with no functionality.
pub const STATUS: &str = "lease-fs skeleton: not implemented yet";
