//! The file-system seam: the few system calls the protocol needs, relative to a run root.
//!
//! Every durable primitive in [`crate::primitives`] is written once against this trait, so
//! the same code runs on the real disk ([`crate::RealFs`]) and on the simulated one
//! (`SimFs`, feature `sim`), which can crash between any two calls, drop what was not fsynced,
//! tear the last unsynced write, or fail the N-th call with `EIO`/`ENOSPC`.
//!
//! Paths are relative to the run root, use `/` separators, and never contain `..`, empty
//! components or a leading `/` (callers build them only from [`lease_core::FileRef`] and
//! [`lease_core::Dir`]). Implementations must refuse to follow symlinks anywhere in a path.
//!
//! Errors are `std::io::Error`s with the usual kinds: `NotFound`, `AlreadyExists` (`EEXIST`),
//! and raw OS errors for the rest; [`crate::FsError`] adds the operation and path.

use std::fmt;
use std::io;

/// The system calls a run needs, relative to its root. One call = one crash point.
pub trait Fs: Send + Sync {
    /// Create directory `dir` (mode 0700) if it is missing, creating missing parents too,
    /// and fsync each parent whose entries changed. Returns whether anything was created.
    /// A symlink or non-directory in the way is an error (`NotADirectory`-like), never
    /// followed.
    fn ensure_dir(&self, dir: &str) -> io::Result<bool>;

    /// Entry names of directory `dir` (not `.`/`..`), in any order. A missing directory is
    /// an empty list.
    fn list(&self, dir: &str) -> io::Result<Vec<String>>;

    /// Call `each` with every entry name of directory `dir` (as [`Fs::list`] would list
    /// them), without collecting them: memory stays flat in the number of entries. The
    /// default lists first; the real file system streams its `getdents`.
    fn for_each_name(&self, dir: &str, each: &mut dyn FnMut(&str)) -> io::Result<()> {
        for n in self.list(dir)? {
            each(&n);
        }
        Ok(())
    }

    /// The whole content of regular file `path`; `None` if it does not exist. A symlink, a
    /// directory, anything but a regular file, or a file larger than `limit` bytes is the
    /// [`NotARecord`] error of [`judge_record`] (kind `InvalidData`). Never blocks on a FIFO.
    fn read(&self, path: &str, limit: usize) -> io::Result<Option<Vec<u8>>>;

    /// Whether `path` exists (without following a symlink).
    fn exists(&self, path: &str) -> io::Result<bool>;

    /// Whether the record file `path` exists: `false` if it (or its directory) is missing;
    /// `true` if it is a regular file of at most `limit` bytes (that the adapter trusts);
    /// anything else named so is refused with the [`NotARecord`] error of [`judge_record`]
    /// (a directory, symlink, FIFO, socket, device, or a file over `limit`), the same error
    /// [`Fs::read`] and [`Fs::list_records`] give for it. One call; nothing is opened.
    fn exists_record(&self, path: &str, limit: usize) -> io::Result<bool>;

    /// Call `each` with every entry name of directory `dir` (as [`Fs::for_each_name`]),
    /// and judge every name for which `is_record` holds (a name the layout gives a record)
    /// as [`Fs::exists_record`] does: a regular file of at most `limit` bytes, else the
    /// [`NotARecord`] error of [`judge_record`] and the listing stops. One call; a name that
    /// vanished between the listing and its judgement is still passed to `each` (a later
    /// read finds it missing, as it would if the listing had been made a moment earlier).
    fn list_records(
        &self,
        dir: &str,
        limit: usize,
        is_record: &dyn Fn(&str) -> bool,
        each: &mut dyn FnMut(&str),
    ) -> io::Result<()>;

    /// Create `path` exclusively (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600), write all of
    /// `bytes`, close. No fsync.
    fn write_new(&self, path: &str, bytes: &[u8]) -> io::Result<()>;

    /// fsync the regular file `path` (its data and size).
    fn fsync(&self, path: &str) -> io::Result<()>;

    /// Overwrite `bytes` at `offset` of the existing regular file `path` in place (one
    /// `pwrite`; never creates, truncates or renames). `NotFound` if it does not exist.
    /// The real adapter keeps the file open between calls for the same path (a heartbeat
    /// file is written every interval), until this adapter renames over or unlinks it.
    fn write_at(&self, path: &str, offset: u64, bytes: &[u8]) -> io::Result<()>;

    /// `fdatasync` the regular file `path` (its data; its size only if it changed).
    fn sync_data(&self, path: &str) -> io::Result<()>;

    /// Whether this file system may lose writes that were never synced while the writer
    /// lives (network and user-space file systems, [`crate::fstype`]): heartbeats are then
    /// always written durably. The simulation and unknown file systems: `false`.
    fn loses_unsynced_writes(&self) -> bool {
        false
    }

    /// fsync directory `dir` (its entries).
    fn fsync_dir(&self, dir: &str) -> io::Result<()>;

    /// `link(2)` `from` to `to` (same directory in practice). `AlreadyExists` if `to` exists.
    fn link(&self, from: &str, to: &str) -> io::Result<()>;

    /// `rename(2)` `from` over `to`.
    fn rename(&self, from: &str, to: &str) -> io::Result<()>;

    /// `unlink(2)` `path`. `NotFound` if it does not exist.
    fn unlink(&self, path: &str) -> io::Result<()>;

    /// Number of hard links of `path`, `None` if it does not exist (resolves an ambiguous
    /// `link(2)` failure: a temp file with 2 links was linked).
    fn link_count(&self, path: &str) -> io::Result<Option<u64>>;

    /// Seconds since the file was last modified, `None` if it does not exist (used only to
    /// leave young temp files of live writers alone during cleanup).
    fn age_secs(&self, path: &str) -> io::Result<Option<u64>>;

    /// Check that the run root is still the directory that was opened (not renamed,
    /// replaced, deleted or unmounted underneath). `Err` describes what changed.
    fn check_root(&self) -> io::Result<()>;

    /// What `lstat` says of `path` (never following a symlink): its kind, whether the
    /// effective uid owns it, and its age; `None` if it does not exist. Used by the temp-file
    /// collection ([`crate::primitives::clean_temp_files`]), which removes only regular
    /// files of ours. The default is `Unsupported`, so a file system that cannot tell never
    /// has anything removed.
    fn entry_info(&self, path: &str) -> io::Result<Option<EntryInfo>> {
        let _ = path;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this file system cannot tell a file's kind and owner",
        ))
    }
}

/// What [`Fs::entry_info`] reports of one directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryInfo {
    /// A regular file (not a symlink, directory, FIFO, socket or device).
    pub regular: bool,
    /// Owned by the effective uid of this process.
    pub ours: bool,
    /// Seconds since it was last modified (0 if its time is in the future).
    pub age_secs: u64,
}

/// Split `path` into its parent directory (`""` for the root) and file name.
pub fn split(path: &str) -> (&str, &str) {
    match path.rsplit_once('/') {
        Some((d, n)) => (d, n),
        None => ("", path),
    }
}

/// Join a directory (possibly `""`) and a name.
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// Check that a relative path is well-formed: non-empty components, no `.`/`..`, no
/// leading or trailing `/`, no NUL. (Directory paths may be `""` for the root.)
pub fn check_rel(path: &str) -> io::Result<()> {
    if path.is_empty() {
        return Ok(());
    }
    let ok = !path.starts_with('/')
        && !path.contains('\0')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != "..");
    if ok {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("refusing path {path:?}: not a plain relative path"),
        ))
    }
}

/// What an entry of a run folder is, as far as the protocol cares (`lstat`, never
/// following a symlink).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (never followed).
    Symlink,
    /// A named pipe.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// Anything else the kernel reports.
    Other,
}

impl EntryKind {
    /// The kind in words, for messages (`directory`, `FIFO`, ...).
    pub fn name(self) -> &'static str {
        match self {
            EntryKind::File => "regular file",
            EntryKind::Directory => "directory",
            EntryKind::Symlink => "symlink",
            EntryKind::Fifo => "FIFO",
            EntryKind::Socket => "socket",
            EntryKind::CharDevice => "character device",
            EntryKind::BlockDevice => "block device",
            EntryKind::Other => "special file",
        }
    }
}

/// A path named like a record that is not a record file: not a regular file (a directory,
/// a symlink, a FIFO, a socket, a device), or a regular file over the record limit
/// (PROTOCOL §5.1, "Bad files named like records"). Carried as the payload of an
/// `io::Error` (kind `InvalidData`) by every primitive that meets one ([`Fs::read`],
/// [`Fs::exists_record`], [`Fs::list_records`]); `FsError::io` turns it into
/// `RUN_LAYOUT_INVALID` (65), whichever primitive and whichever command met it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotARecord {
    /// The path relative to the run root.
    pub path: String,
    /// What it is.
    pub kind: EntryKind,
    /// Its size in bytes (a regular file over the limit; 0 for the other kinds).
    pub size: u64,
    /// The record limit it was judged against.
    pub limit: u64,
}

impl NotARecord {
    /// What is wrong and the fix, without the path.
    pub fn describe(&self) -> String {
        let what = if self.kind == EntryKind::File {
            format!(
                "a regular file of {} bytes, over the record limit of {} bytes",
                self.size, self.limit
            )
        } else {
            format!("a {}, not a regular file", self.kind.name())
        };
        format!(
            "named like a record but it is {what}; it was neither followed nor read, and nothing was written (bad input on disk: move it out of the run by hand)"
        )
    }
}

impl fmt::Display for NotARecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.describe())
    }
}

impl std::error::Error for NotARecord {}

/// The one classification of an entry named like a record (PROTOCOL §5.1): `Ok` for a
/// regular file of at most `limit` bytes, else the [`NotARecord`] error (kind
/// `InvalidData`). Every adapter primitive that meets such an entry calls this, so a
/// directory, symlink, FIFO, socket, device or oversize file gets the same error whether a
/// listing, an existence probe or a read met it.
pub fn judge_record(path: &str, kind: EntryKind, size: u64, limit: usize) -> io::Result<()> {
    let limit64 = u64::try_from(limit).unwrap_or(u64::MAX);
    if kind == EntryKind::File && size <= limit64 {
        return Ok(());
    }
    Err(not_a_record(path, kind, size, limit))
}

/// The [`NotARecord`] error (kind `InvalidData`) for `path`, which [`judge_record`] refused.
pub fn not_a_record(path: &str, kind: EntryKind, size: u64, limit: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        NotARecord {
            path: path.to_string(),
            kind,
            size: if kind == EntryKind::File { size } else { 0 },
            limit: u64::try_from(limit).unwrap_or(u64::MAX),
        },
    )
}

/// The [`NotARecord`] inside `e` (its payload, or anywhere in its chain of sources).
pub fn not_a_record_in(e: &io::Error) -> Option<&NotARecord> {
    error_in(e)
}

/// The error of type `T` inside `e`: its payload, or anywhere in its chain of sources,
/// looking into nested `io::Error`s too.
pub fn error_in<T: std::error::Error + 'static>(e: &io::Error) -> Option<&T> {
    let mut cur = e.get_ref().map(|e| e as &(dyn std::error::Error + 'static));
    while let Some(x) = cur {
        if let Some(n) = x.downcast_ref::<T>() {
            return Some(n);
        }
        if let Some(n) = x.downcast_ref::<io::Error>().and_then(error_in::<T>) {
            return Some(n);
        }
        cur = x.source();
    }
    None
}
