//! System-call helpers of [`RealFs`](super::RealFs): open flags and modes, the fields of a
//! `stat`, `EINTR` retries and errors that name the path.

use std::fmt;
use std::io;
use std::sync::atomic::AtomicBool;

use rustix::fs::{FileType, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

use crate::fs::{EntryKind, judge_record};

/// Set once `openat2` turned out to be unavailable (ENOSYS, or EPERM from a seccomp filter
/// that does not know it): every [`RealFs`] then walks paths component by component.
pub(super) static OPENAT2_UNAVAILABLE: AtomicBool = AtomicBool::new(false);

/// Flags for opening a directory: never follow a trailing symlink, fail on a non-directory.
pub(super) fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Flags for opening an existing file to read or fsync it. `O_NONBLOCK` so that a FIFO
/// planted in the run folder cannot hang the open (it is refused after `fstat`).
pub(super) fn read_flags() -> OFlags {
    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY
}

pub(super) fn resolve_flags() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

pub(super) const DIR_MODE: u32 = 0o700;
pub(super) const FILE_MODE: u32 = 0o600;

/// `st_nlink` widened to `u64` (it is `u32` on some architectures).
#[allow(clippy::unnecessary_cast)]
pub(super) fn nlink_of(st: &Stat) -> u64 {
    st.st_nlink as u64
}

/// `(st_dev, st_ino)` as `u64`s.
#[allow(clippy::unnecessary_cast)]
pub(super) fn id_of(st: &Stat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}

/// The permission bits of `st_mode`.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn perm_of(st: &Stat) -> u32 {
    (st.st_mode as u32) & 0o7777
}

pub(crate) fn type_of(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// The protocol's kind of a file type (`None`: the kernel did not say, `DT_UNKNOWN`).
pub(super) fn kind_of(ft: FileType) -> Option<EntryKind> {
    Some(match ft {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Directory,
        FileType::Symlink => EntryKind::Symlink,
        FileType::Fifo => EntryKind::Fifo,
        FileType::Socket => EntryKind::Socket,
        FileType::CharacterDevice => EntryKind::CharDevice,
        FileType::BlockDevice => EntryKind::BlockDevice,
        FileType::Unknown => return None,
    })
}

/// The protocol's kind of what `st` describes.
pub(super) fn kind_of_stat(st: &Stat) -> EntryKind {
    kind_of(type_of(st)).unwrap_or(EntryKind::Other)
}

/// `st_size` as `u64` (negative sizes do not exist; 0 if one is reported).
pub(super) fn size_of(st: &Stat) -> u64 {
    u64::try_from(st.st_size).unwrap_or(0)
}

/// Judge the entry `st` describes as a record file of at most `limit` bytes
/// ([`judge_record`]: the one classification every primitive uses).
pub(super) fn judge_stat(path: &str, st: &Stat, limit: usize) -> io::Result<()> {
    judge_record(path, kind_of_stat(st), size_of(st), limit)
}

/// A file type in words, for messages.
pub(super) fn type_name(ft: FileType) -> &'static str {
    kind_of(ft).map_or("special file", EntryKind::name)
}

/// Run `f` again while it fails with `EINTR`.
pub(super) fn retry<T>(mut f: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    loop {
        match f() {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

/// An error with a message naming the path, keeping the original error as its source and
/// its [`io::ErrorKind`].
#[derive(Debug)]
struct PathError {
    msg: String,
    source: io::Error,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for PathError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// An `io::Error` of the kind of `errno` whose message is `what`, a colon and the system
/// error's own words.
pub(super) fn errno_msg(errno: Errno, what: String) -> io::Error {
    with_msg(errno.into(), format!("{what}: {}", io::Error::from(errno)))
}

/// An `io::Error` of the same kind as `source`, whose message is `msg`.
pub(super) fn with_msg(source: io::Error, msg: String) -> io::Error {
    io::Error::new(source.kind(), PathError { msg, source })
}
