//! Resolving paths beneath the held root: directory descriptors (cached, re-validated on
//! every use), refusals that name the offending component, and judged opens of files.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use super::sys::{
    OPENAT2_UNAVAILABLE, dir_flags, id_of, judge_stat, read_flags, resolve_flags, retry, type_name,
    type_of, with_msg,
};
use super::{CachedDir, RealFs, check_trusted};
use crate::fs::{check_rel, join, split};

impl RealFs {
    /// Error for a refused path: says which component is a symlink or not a directory.
    pub(super) fn refusal(&self, errno: Errno, path: &str) -> io::Error {
        let mut prefix = String::new();
        let mut why = None;
        for comp in path.split('/') {
            prefix = join(&prefix, comp);
            match rfs::statat(&*self.root, prefix.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if type_of(&st) == FileType::Symlink => {
                    why = Some(format!(
                        "{prefix} is a symlink (symlinks are never followed)"
                    ));
                    break;
                }
                Ok(st) if type_of(&st) != FileType::Directory => {
                    why = Some(format!(
                        "{prefix} is a {}, not a directory",
                        type_name(type_of(&st))
                    ));
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let why = why.unwrap_or_else(|| {
            format!(
                "a symlink or a non-directory is in the way ({})",
                io::Error::from(errno)
            )
        });
        with_msg(
            errno.into(),
            format!(
                "run root {}: refusing {path}: {why}",
                self.root_path.display()
            ),
        )
    }

    /// Map an errno from resolving or opening `path`: refusals get a message naming it.
    pub(super) fn path_err(&self, errno: Errno, path: &str) -> io::Error {
        match errno {
            Errno::LOOP | Errno::NOTDIR | Errno::XDEV => self.refusal(errno, path),
            e => e.into(),
        }
    }

    /// Open directory `dir` (non-empty) below the root without following any symlink.
    pub(super) fn open_dir_uncached(&self, dir: &str) -> Result<OwnedFd, Errno> {
        if self.uses_openat2() {
            let mut again = 0;
            loop {
                match rfs::openat2(
                    &*self.root,
                    dir,
                    dir_flags(),
                    Mode::empty(),
                    resolve_flags(),
                ) {
                    Ok(fd) => return Ok(fd),
                    Err(Errno::NOSYS) | Err(Errno::PERM) => {
                        OPENAT2_UNAVAILABLE.store(true, Ordering::Relaxed);
                        break;
                    }
                    Err(Errno::INTR) => {}
                    // A concurrent rename made the kernel unsure; retry, then walk.
                    Err(Errno::AGAIN) if again < 8 => again += 1,
                    Err(Errno::AGAIN) => break,
                    Err(e) => return Err(e),
                }
            }
        }
        let mut cur: Option<OwnedFd> = None;
        for comp in dir.split('/') {
            let next = {
                let base = match &cur {
                    Some(fd) => fd.as_fd(),
                    None => self.root.as_fd(),
                };
                retry(|| rfs::openat(base, comp, dir_flags(), Mode::empty()))?
            };
            cur = Some(next);
        }
        cur.ok_or(Errno::INVAL)
    }

    /// The descriptor of directory `dir` (`""` = the root), from the cache if it still names
    /// the same directory. `path` (`dir` or a path below it) is named in refusals.
    pub(super) fn dir_fd(&self, dir: &str, path: &str) -> io::Result<Arc<OwnedFd>> {
        Ok(self.dir_fd_id(dir, path)?.0)
    }

    /// [`dir_fd`](Self::dir_fd), with the `(st_dev, st_ino)` the descriptor was just
    /// re-validated against (or found to have when opened).
    pub(super) fn dir_fd_id(
        &self,
        dir: &str,
        path: &str,
    ) -> io::Result<(Arc<OwnedFd>, (u64, u64))> {
        check_rel(dir)?;
        if dir.is_empty() {
            return Ok((self.root.clone(), self.root_id));
        }
        // Every component is judged, not only the last: `lease/` as well as `lease/epochs/`.
        if let Some((parent, _)) = dir.rsplit_once('/') {
            self.dir_fd(parent, path)?;
        }
        let cached = self.lock_dirs().get(dir).cloned();
        if let Some(c) = cached {
            match rfs::statat(&*self.root, dir, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if id_of(&st) == c.id => {
                    // The stat made anyway: a folder chowned or opened up since is refused.
                    check_trusted(&self.root_path, &st, dir)?;
                    return Ok((c.fd, c.id));
                }
                _ => {
                    self.lock_dirs().remove(dir);
                }
            }
        }
        let fd = self
            .open_dir_uncached(dir)
            .map_err(|e| self.path_err(e, path))?;
        let st = rfs::fstat(&fd)?;
        check_trusted(&self.root_path, &st, dir)?;
        Ok((self.cache_dir(dir.to_string(), fd, &st), id_of(&st)))
    }

    /// Keep `fd`, the directory `dir` just opened (and judged) whose `fstat` is `st`, for
    /// the next lookup of `dir`; the shared descriptor.
    pub(super) fn cache_dir(&self, dir: String, fd: OwnedFd, st: &Stat) -> Arc<OwnedFd> {
        let fd = Arc::new(fd);
        self.lock_dirs().insert(
            dir,
            CachedDir {
                fd: fd.clone(),
                id: id_of(st),
            },
        );
        fd
    }

    /// Like [`dir_fd`](Self::dir_fd), but a missing directory is `None`.
    pub(super) fn dir_fd_opt(&self, dir: &str, path: &str) -> io::Result<Option<Arc<OwnedFd>>> {
        match self.dir_fd(dir, path) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Check a file path and split it into its directory and (non-empty) leaf name.
    pub(super) fn file_parts<'a>(&self, path: &'a str) -> io::Result<(&'a str, &'a str)> {
        check_rel(path)?;
        if path.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "refusing an empty file path",
            ));
        }
        Ok(split(path))
    }

    /// The directory descriptor and leaf name of each of `from` and `to`, for a call that
    /// takes two paths (`linkat`, `renameat`): both paths checked, then both directories
    /// resolved.
    pub(super) fn both_ends<'a>(
        &self,
        from: &'a str,
        to: &'a str,
    ) -> io::Result<[(Arc<OwnedFd>, &'a str); 2]> {
        let (fdir, fleaf) = self.file_parts(from)?;
        let (tdir, tleaf) = self.file_parts(to)?;
        let ffd = self.dir_fd(fdir, from)?;
        let tfd = self.dir_fd(tdir, to)?;
        Ok([(ffd, fleaf), (tfd, tleaf)])
    }

    /// `fstatat(path, AT_SYMLINK_NOFOLLOW)`; `None` if it (or its directory) is missing.
    pub(super) fn lstat(&self, path: &str) -> io::Result<Option<Stat>> {
        let (dir, leaf) = self.file_parts(path)?;
        let Some(dfd) = self.dir_fd_opt(dir, path)? else {
            return Ok(None);
        };
        match retry(|| rfs::statat(&*dfd, leaf, AtFlags::SYMLINK_NOFOLLOW)) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(self.path_err(e, path)),
        }
    }

    /// Open the record `leaf` of the directory `dfd` with `flags` (which carry
    /// `O_NOFOLLOW|O_NONBLOCK`: a FIFO opens at once, a symlink fails with ELOOP, a socket
    /// with ENXIO), then judge it (§5.1 bad files, at most `limit` bytes) and trust it
    /// (§2 Trust) before a byte is read or written. A failed open is classified by an
    /// `lstat` of the name, so each kind of bad file gets the one error of `judge_record`,
    /// as from `exists_record` and `list_records`. A missing file is `NotFound`.
    pub(super) fn open_judged(
        &self,
        dfd: &OwnedFd,
        leaf: &str,
        path: &str,
        flags: OFlags,
        limit: usize,
    ) -> io::Result<(OwnedFd, Stat)> {
        let fd = match retry(|| rfs::openat(dfd, leaf, flags, Mode::empty())) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Err(Errno::NOENT.into()),
            Err(e) => {
                if let Ok(st) = rfs::statat(dfd, leaf, AtFlags::SYMLINK_NOFOLLOW) {
                    judge_stat(path, &st, limit)?;
                }
                return Err(self.path_err(e, path));
            }
        };
        let st = rfs::fstat(&fd)?;
        judge_stat(path, &st, limit)?;
        check_trusted(&self.root_path, &st, path)?;
        Ok((fd, st))
    }

    /// Open existing file `path` (in an existing directory) to fsync it, without following
    /// a symlink and without blocking on a FIFO.
    pub(super) fn open_existing(&self, path: &str) -> io::Result<OwnedFd> {
        let (dir, leaf) = self.file_parts(path)?;
        let dfd = self.dir_fd(dir, path)?;
        match retry(|| rfs::openat(&*dfd, leaf, read_flags(), Mode::empty())) {
            Ok(fd) => Ok(fd),
            Err(Errno::LOOP) => Err(with_msg(
                Errno::LOOP.into(),
                format!(
                    "run root {}: refusing {path}: it is a symlink (symlinks are never followed)",
                    self.root_path.display()
                ),
            )),
            Err(e) => Err(self.path_err(e, path)),
        }
    }
}
