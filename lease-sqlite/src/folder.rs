//! The store folder, held open: every system call on the store's files is made relative
//! to this descriptor (`openat`, `fstatat`, `linkat`, `unlinkat`, `fsync` of the fd), and
//! SQLite reaches the files through `/proc/self/fd/N/…` with the [`crate::vfs`] shim.
//! Nothing below the folder is looked up by name from outside it.

use rustix::fd::{AsFd, AsRawFd, OwnedFd};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// The store folder: its descriptor, its path (for messages), and how SQLite reaches it.
pub(crate) struct Folder {
    fd: OwnedFd,
    display: PathBuf,
    /// `/proc/self/fd/N` when that resolves to this very directory and the VFS shim is
    /// registered; otherwise `None` and SQLite is given the folder's path.
    proc_base: Option<String>,
}

fn retry<T>(mut f: impl FnMut() -> rustix::io::Result<T>) -> io::Result<T> {
    loop {
        match f() {
            Err(Errno::INTR) => continue,
            r => return r.map_err(io::Error::from),
        }
    }
}

/// The (device, inode) of a stat result.
pub(crate) fn key(st: &Stat) -> (u64, u64) {
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    (st.st_dev as u64, st.st_ino as u64)
}

/// The file type of a stat result.
pub(crate) fn kind(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

impl Folder {
    /// Open the folder `path` (its last component must not be a symlink).
    pub(crate) fn open(path: &Path) -> io::Result<Folder> {
        let fd = retry(|| {
            rfs::open(
                path,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
        })?;
        Folder::from_fd(fd, path.to_path_buf())
    }

    /// Take a descriptor of the folder (opened by the caller, e.g. beneath a run root).
    pub(crate) fn from_fd(fd: OwnedFd, display: PathBuf) -> io::Result<Folder> {
        let st = rfs::fstat(&fd)?;
        if kind(&st) != FileType::Directory {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", display.display()),
            ));
        }
        let base = format!("{}{}", crate::vfs::PREFIX, fd.as_raw_fd());
        let reachable = matches!(rfs::stat(base.as_str()), Ok(p) if key(&p) == key(&st));
        let proc_base = (reachable && crate::vfs::ensure().is_ok()).then_some(base);
        Ok(Folder {
            fd,
            display,
            proc_base,
        })
    }

    /// `fstat` of the held folder descriptor itself.
    pub(crate) fn stat(&self) -> io::Result<Stat> {
        retry(|| rfs::fstat(&self.fd))
    }

    /// The folder's path, for messages.
    pub(crate) fn display(&self) -> &Path {
        &self.display
    }

    /// The name SQLite should open for `name` in this folder, and the VFS to open it with.
    pub(crate) fn sqlite_target(&self, name: &str) -> (PathBuf, Option<&'static str>) {
        match &self.proc_base {
            Some(base) => (
                PathBuf::from(format!("{base}/{name}")),
                Some(crate::vfs::NAME),
            ),
            None => (self.display.join(name), None),
        }
    }

    /// Whether SQLite reaches the files through the descriptor (false: by path, when
    /// `/proc` is not mounted).
    pub(crate) fn through_fd(&self) -> bool {
        self.proc_base.is_some()
    }

    /// `fstatat(…, AT_SYMLINK_NOFOLLOW)`; `None` if there is no such entry.
    pub(crate) fn lstat(&self, name: &str) -> io::Result<Option<Stat>> {
        match retry(|| rfs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW)) {
            Ok(st) => Ok(Some(st)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Open `name` read-only, never through a symlink (ELOOP) and never blocking on a FIFO.
    pub(crate) fn open_read(&self, name: &str) -> io::Result<File> {
        let fd = retry(|| {
            rfs::openat(
                &self.fd,
                name,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
                Mode::empty(),
            )
        })?;
        Ok(File::from(fd))
    }

    /// Create `name`, which must not exist, with `mode` (umask aside; the caller passes 0600).
    pub(crate) fn create_new(&self, name: &str, mode: u32) -> io::Result<File> {
        let fd = retry(|| {
            rfs::openat(
                &self.fd,
                name,
                OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(mode),
            )
        })?;
        // The umask may have narrowed the mode; never widened. Set it exactly.
        rfs::fchmod(&fd, Mode::from_raw_mode(mode))?;
        Ok(File::from(fd))
    }

    /// `linkat(2)` within the folder (never replaces an existing name).
    pub(crate) fn link(&self, from: &str, to: &str) -> io::Result<()> {
        retry(|| rfs::linkat(&self.fd, from, &self.fd, to, AtFlags::empty()))
    }

    /// `renameat(2)` within the folder (replaces `to` if it exists).
    pub(crate) fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        retry(|| rfs::renameat(&self.fd, from, &self.fd, to))
    }

    /// A second handle on the same folder (a `dup` of the descriptor), for an open that
    /// consumes its folder while the caller goes on using this one.
    pub(crate) fn try_clone(&self) -> io::Result<Folder> {
        Folder::from_fd(self.fd.try_clone()?, self.display.clone())
    }

    /// `unlinkat(2)` of a file in the folder.
    pub(crate) fn unlink(&self, name: &str) -> io::Result<()> {
        retry(|| rfs::unlinkat(&self.fd, name, AtFlags::empty()))
    }

    /// fsync the folder itself (through its descriptor).
    pub(crate) fn fsync(&self) -> io::Result<()> {
        retry(|| rfs::fsync(&self.fd))
    }

    /// The names in the folder (without `.` and `..`).
    pub(crate) fn names(&self) -> io::Result<Vec<OsString>> {
        let mut out = Vec::new();
        // `read_from` reopens the folder (`openat(fd, ".")`), so our descriptor's offset
        // is untouched.
        let dir = rfs::Dir::read_from(self.fd.as_fd())?;
        for entry in dir {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                out.push(OsString::from_vec(name.to_vec()));
            }
        }
        Ok(out)
    }
}
