//! [`RealFs`]: the [`Fs`] seam on the real disk.
//!
//! Every call is relative to a descriptor of the run root that is opened once (with
//! `O_NOFOLLOW|O_DIRECTORY`) and held for the life of the value, so a run root that is
//! renamed, replaced or deleted underneath is *detected* by [`Fs::check_root`] instead of
//! silently followed: writes keep landing in the directory that was opened, never in a new
//! directory created at the old path.
//!
//! Directories below the root are resolved with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` (or, where the kernel lacks `openat2`, a
//! component-by-component `openat(O_NOFOLLOW|O_DIRECTORY)` walk) and cached; leaf operations
//! are `*at` calls on the directory descriptor that never follow a symlink. A cached
//! directory descriptor is re-validated (one `fstatat` of its path) on every use, so a
//! directory that was renamed away or replaced is resolved again rather than written into.
//!
//! Directories are created 0700 (and existing ones with group or other permission bits are
//! tightened to 0700); files are created 0600. A symlink, or a non-directory where a
//! directory should be, is refused with an error that names the offending path.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self as rfs, AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

use crate::fs::{Fs, check_rel, join, split};

/// Set once `openat2` turned out to be unavailable (ENOSYS, or EPERM from a seccomp filter
/// that does not know it): every [`RealFs`] then walks paths component by component.
static OPENAT2_UNAVAILABLE: AtomicBool = AtomicBool::new(false);

/// Flags for opening a directory: never follow a trailing symlink, fail on a non-directory.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// Flags for opening an existing file to read or fsync it. `O_NONBLOCK` so that a FIFO
/// planted in the run folder cannot hang the open (it is refused after `fstat`).
fn read_flags() -> OFlags {
    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY
}

fn resolve_flags() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

const DIR_MODE: u32 = 0o700;
const FILE_MODE: u32 = 0o600;

/// `st_nlink` widened to `u64` (it is `u32` on some architectures).
#[allow(clippy::unnecessary_cast)]
fn nlink_of(st: &Stat) -> u64 {
    st.st_nlink as u64
}

/// `(st_dev, st_ino)` as `u64`s.
#[allow(clippy::unnecessary_cast)]
fn id_of(st: &Stat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}

/// The permission bits of `st_mode`.
#[allow(clippy::unnecessary_cast)]
fn perm_of(st: &Stat) -> u32 {
    (st.st_mode as u32) & 0o7777
}

fn type_of(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// A file type in words, for messages.
fn type_name(ft: FileType) -> &'static str {
    match ft {
        FileType::RegularFile => "regular file",
        FileType::Directory => "directory",
        FileType::Symlink => "symlink",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice => "character device",
        FileType::BlockDevice => "block device",
        _ => "special file",
    }
}

/// Run `f` again while it fails with `EINTR`.
fn retry<T>(mut f: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
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

/// An `io::Error` of the same kind as `source`, whose message is `msg`.
fn with_msg(source: io::Error, msg: String) -> io::Error {
    io::Error::new(source.kind(), PathError { msg, source })
}

/// A cached directory descriptor and the identity it had when it was opened.
#[derive(Clone)]
struct CachedDir {
    fd: Arc<OwnedFd>,
    id: (u64, u64),
}

/// The real file system, every operation relative to a held descriptor of the run root.
///
/// Cheap to share (`Send + Sync`); directory descriptors are cached inside.
pub struct RealFs {
    root: Arc<OwnedFd>,
    root_path: PathBuf,
    root_id: (u64, u64),
    dirs: Mutex<HashMap<String, CachedDir>>,
    use_openat2: bool,
}

impl fmt::Debug for RealFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RealFs")
            .field("root", &self.root_path)
            .field("dev_ino", &self.root_id)
            .finish()
    }
}

impl RealFs {
    /// Open the existing run root `root`.
    ///
    /// The root itself must be a real directory, not a symlink (symlinks in its parent path
    /// are allowed: the root is pinned once opened). A missing root fails at once with
    /// [`io::ErrorKind::NotFound`]; nothing is retried or created.
    pub fn open(root: &Path) -> io::Result<RealFs> {
        let path = std::path::absolute(root)?;
        let fd = match retry(|| rfs::open(&path, dir_flags(), Mode::empty())) {
            Ok(fd) => fd,
            // `O_NOFOLLOW|O_DIRECTORY` on a symlink fails with ENOTDIR (or ELOOP).
            Err(e @ (Errno::LOOP | Errno::NOTDIR)) => {
                let is_link = matches!(
                    rfs::lstat(&path),
                    Ok(st) if type_of(&st) == FileType::Symlink
                );
                let msg = if is_link {
                    format!(
                        "run root {} is a symlink; refusing to follow it (open its target instead)",
                        path.display()
                    )
                } else {
                    format!("run root {} is not a directory", path.display())
                };
                return Err(with_msg(e.into(), msg));
            }
            Err(e) => {
                return Err(with_msg(
                    e.into(),
                    format!(
                        "cannot open run root {}: {}",
                        path.display(),
                        io::Error::from(e)
                    ),
                ));
            }
        };
        let st = rfs::fstat(&fd)?;
        Ok(RealFs {
            root: Arc::new(fd),
            root_path: path,
            root_id: id_of(&st),
            dirs: Mutex::new(HashMap::new()),
            use_openat2: true,
        })
    }

    /// Create the run root `root` (and any missing parents, each mode 0700, fsyncing the
    /// parent whose entries changed) if it does not exist, then [`open`](RealFs::open) it.
    pub fn create(root: &Path) -> io::Result<RealFs> {
        let path = std::path::absolute(root)?;
        create_dir_all_private(&path)?;
        RealFs::open(&path)
    }

    /// Resolve paths with a component-by-component `openat(O_NOFOLLOW|O_DIRECTORY)` walk
    /// instead of `openat2`, as on kernels without `openat2` (for tests of that path).
    pub fn without_openat2(mut self) -> RealFs {
        self.use_openat2 = false;
        self.lock_dirs().clear();
        self
    }

    /// Whether `openat2` is used to resolve directories (false if the kernel refused it, or
    /// after [`without_openat2`](RealFs::without_openat2)).
    pub fn uses_openat2(&self) -> bool {
        self.use_openat2 && !OPENAT2_UNAVAILABLE.load(Ordering::Relaxed)
    }

    /// The absolute path the run root was opened at.
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// The held descriptor of the run root.
    pub fn root_fd(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    fn lock_dirs(&self) -> MutexGuard<'_, HashMap<String, CachedDir>> {
        self.dirs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Error for a refused path: says which component is a symlink or not a directory.
    fn refusal(&self, errno: Errno, path: &str) -> io::Error {
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
    fn path_err(&self, errno: Errno, path: &str) -> io::Error {
        match errno {
            Errno::LOOP | Errno::NOTDIR | Errno::XDEV => self.refusal(errno, path),
            e => e.into(),
        }
    }

    /// Open directory `dir` (non-empty) below the root without following any symlink.
    fn open_dir_uncached(&self, dir: &str) -> Result<OwnedFd, Errno> {
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
    fn dir_fd(&self, dir: &str, path: &str) -> io::Result<Arc<OwnedFd>> {
        check_rel(dir)?;
        if dir.is_empty() {
            return Ok(self.root.clone());
        }
        let cached = self.lock_dirs().get(dir).cloned();
        if let Some(c) = cached {
            match rfs::statat(&*self.root, dir, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if id_of(&st) == c.id => return Ok(c.fd),
                _ => {
                    self.lock_dirs().remove(dir);
                }
            }
        }
        let fd = self
            .open_dir_uncached(dir)
            .map_err(|e| self.path_err(e, path))?;
        let st = rfs::fstat(&fd)?;
        let fd = Arc::new(fd);
        self.lock_dirs().insert(
            dir.to_string(),
            CachedDir {
                fd: fd.clone(),
                id: id_of(&st),
            },
        );
        Ok(fd)
    }

    /// Like [`dir_fd`](Self::dir_fd), but a missing directory is `None`.
    fn dir_fd_opt(&self, dir: &str, path: &str) -> io::Result<Option<Arc<OwnedFd>>> {
        match self.dir_fd(dir, path) {
            Ok(fd) => Ok(Some(fd)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Check a file path and split it into its directory and (non-empty) leaf name.
    fn file_parts<'a>(&self, path: &'a str) -> io::Result<(&'a str, &'a str)> {
        check_rel(path)?;
        if path.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "refusing an empty file path",
            ));
        }
        Ok(split(path))
    }

    /// `fstatat(path, AT_SYMLINK_NOFOLLOW)`; `None` if it (or its directory) is missing.
    fn lstat(&self, path: &str) -> io::Result<Option<Stat>> {
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

    /// Open existing regular-file candidate `path` for reading; `None` if missing.
    fn open_existing(&self, path: &str, dir_must_exist: bool) -> io::Result<Option<OwnedFd>> {
        let (dir, leaf) = self.file_parts(path)?;
        let dfd = if dir_must_exist {
            self.dir_fd(dir, path)?
        } else {
            match self.dir_fd_opt(dir, path)? {
                Some(fd) => fd,
                None => return Ok(None),
            }
        };
        match retry(|| rfs::openat(&*dfd, leaf, read_flags(), Mode::empty())) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::NOENT) if !dir_must_exist => Ok(None),
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

    /// Error unless `st` (of `path`) is a regular file.
    fn require_regular(&self, st: &Stat, path: &str) -> io::Result<()> {
        let ft = type_of(st);
        if ft == FileType::RegularFile {
            return Ok(());
        }
        let kind = if ft == FileType::Directory {
            io::ErrorKind::IsADirectory
        } else {
            io::ErrorKind::InvalidData
        };
        Err(io::Error::new(
            kind,
            format!(
                "run root {}: refusing {path}: not a regular file (a {})",
                self.root_path.display(),
                type_name(ft)
            ),
        ))
    }
}

/// `mkdir -p` with mode 0700 for every created component, fsyncing each parent whose
/// entries changed. Existing components are left as they are.
fn create_dir_all_private(path: &Path) -> io::Result<()> {
    match rfs::lstat(path) {
        Ok(_) => return Ok(()),
        Err(Errno::NOENT) => {}
        Err(e) => {
            return Err(with_msg(
                e.into(),
                format!(
                    "cannot create run root {}: {}",
                    path.display(),
                    io::Error::from(e)
                ),
            ));
        }
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(parent) = parent {
        create_dir_all_private(parent)?;
    }
    match rfs::mkdir(path, Mode::from_raw_mode(DIR_MODE)) {
        Ok(()) => {}
        // Created concurrently: whoever created it synced its parent.
        Err(Errno::EXIST) => return Ok(()),
        Err(e) => {
            return Err(with_msg(
                e.into(),
                format!(
                    "cannot create directory {}: {}",
                    path.display(),
                    io::Error::from(e)
                ),
            ));
        }
    }
    let parent = parent.unwrap_or(Path::new("/"));
    let pfd = retry(|| {
        rfs::open(
            parent,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
    })?;
    rfs::fsync(&pfd)?;
    Ok(())
}

impl Fs for RealFs {
    fn ensure_dir(&self, dir: &str) -> io::Result<bool> {
        check_rel(dir)?;
        if dir.is_empty() {
            return Ok(false);
        }
        // Fast path: a cached, still valid descriptor was already checked (and tightened).
        let cached = self.lock_dirs().contains_key(dir);
        if cached && self.dir_fd(dir, dir).is_ok() {
            return Ok(false);
        }
        let mut created = false;
        let mut cur = self.root.clone();
        let mut prefix = String::new();
        for comp in dir.split('/') {
            prefix = join(&prefix, comp);
            let mut made_here = false;
            let fd = loop {
                match retry(|| rfs::openat(&*cur, comp, dir_flags(), Mode::empty())) {
                    Ok(fd) => break fd,
                    Err(Errno::NOENT) => {
                        match rfs::mkdirat(&*cur, comp, Mode::from_raw_mode(DIR_MODE)) {
                            Ok(()) => {
                                rfs::fsync(&*cur)?;
                                created = true;
                                made_here = true;
                            }
                            // Created concurrently: open what is there (and check it).
                            Err(Errno::EXIST) => {}
                            Err(e) => return Err(self.path_err(e, dir)),
                        }
                    }
                    Err(e) => return Err(self.path_err(e, dir)),
                }
            };
            let st = rfs::fstat(&fd)?;
            let perm = perm_of(&st);
            // Private folders: no group/other bits; a fresh one exactly 0700 (umask aside).
            if perm & 0o077 != 0 || (made_here && perm != DIR_MODE) {
                rfs::fchmod(&fd, Mode::from_raw_mode(DIR_MODE))?;
            }
            let fd = Arc::new(fd);
            self.lock_dirs().insert(
                prefix.clone(),
                CachedDir {
                    fd: fd.clone(),
                    id: id_of(&st),
                },
            );
            cur = fd;
        }
        Ok(created)
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        let Some(dfd) = self.dir_fd_opt(dir, dir)? else {
            return Ok(Vec::new());
        };
        // A fresh open file description (`openat(dir, ".")`), so concurrent listings do not
        // share a directory offset with each other or with the cached descriptor.
        let entries = Dir::read_from(&*dfd)?;
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            // Names this crate writes are ASCII; a stray non-UTF-8 name is listed lossily
            // (callers ignore names they do not parse).
            names.push(String::from_utf8_lossy(name).into_owned());
        }
        Ok(names)
    }

    fn read(&self, path: &str, limit: usize) -> io::Result<Option<Vec<u8>>> {
        let Some(fd) = self.open_existing(path, false)? else {
            return Ok(None);
        };
        let st = rfs::fstat(&fd)?;
        self.require_regular(&st, path)?;
        let too_big = |size: u64| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "run root {}: {path} is {size} bytes, over the limit of {limit} bytes",
                    self.root_path.display()
                ),
            )
        };
        let size = u64::try_from(st.st_size).unwrap_or(0);
        let limit64 = u64::try_from(limit).unwrap_or(u64::MAX);
        if size > limit64 {
            return Err(too_big(size));
        }
        let mut buf = Vec::with_capacity(usize::try_from(size).unwrap_or(limit).min(limit));
        // The file may have grown since fstat: read at most one byte past the limit.
        std::fs::File::from(fd)
            .take(limit64.saturating_add(1))
            .read_to_end(&mut buf)?;
        if buf.len() > limit {
            return Err(too_big(buf.len() as u64));
        }
        Ok(Some(buf))
    }

    fn exists(&self, path: &str) -> io::Result<bool> {
        Ok(self.lstat(path)?.is_some())
    }

    fn write_new(&self, path: &str, bytes: &[u8]) -> io::Result<()> {
        let (dir, leaf) = self.file_parts(path)?;
        let dfd = self.dir_fd(dir, path)?;
        let flags = OFlags::CREATE
            | OFlags::EXCL
            | OFlags::NOFOLLOW
            | OFlags::WRONLY
            | OFlags::CLOEXEC
            | OFlags::NOCTTY;
        let fd = retry(|| rfs::openat(&*dfd, leaf, flags, Mode::from_raw_mode(FILE_MODE)))
            .map_err(|e| self.path_err(e, path))?;
        let mut rest = bytes;
        while !rest.is_empty() {
            match rustix::io::write(&fd, rest) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!(
                            "run root {}: writing {path} wrote nothing",
                            self.root_path.display()
                        ),
                    ));
                }
                Ok(n) => rest = &rest[n..],
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn fsync(&self, path: &str) -> io::Result<()> {
        let fd = self
            .open_existing(path, true)?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        retry(|| rfs::fsync(&fd))?;
        Ok(())
    }

    fn fsync_dir(&self, dir: &str) -> io::Result<()> {
        let dfd = self.dir_fd(dir, dir)?;
        retry(|| rfs::fsync(&*dfd))?;
        Ok(())
    }

    fn link(&self, from: &str, to: &str) -> io::Result<()> {
        let (fdir, fleaf) = self.file_parts(from)?;
        let (tdir, tleaf) = self.file_parts(to)?;
        let ffd = self.dir_fd(fdir, from)?;
        let tfd = self.dir_fd(tdir, to)?;
        // No AT_SYMLINK_FOLLOW: a symlink would be linked itself, never its target.
        retry(|| rfs::linkat(&*ffd, fleaf, &*tfd, tleaf, AtFlags::empty()))?;
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let (fdir, fleaf) = self.file_parts(from)?;
        let (tdir, tleaf) = self.file_parts(to)?;
        let ffd = self.dir_fd(fdir, from)?;
        let tfd = self.dir_fd(tdir, to)?;
        retry(|| rfs::renameat(&*ffd, fleaf, &*tfd, tleaf))?;
        Ok(())
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        let (dir, leaf) = self.file_parts(path)?;
        let dfd = self.dir_fd(dir, path)?;
        retry(|| rfs::unlinkat(&*dfd, leaf, AtFlags::empty()))?;
        Ok(())
    }

    fn link_count(&self, path: &str) -> io::Result<Option<u64>> {
        Ok(self.lstat(path)?.map(|st| nlink_of(&st)))
    }

    fn age_secs(&self, path: &str) -> io::Result<Option<u64>> {
        let Some(st) = self.lstat(path)? else {
            return Ok(None);
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mtime = u64::try_from(st.st_mtime).unwrap_or(0);
        Ok(Some(now.saturating_sub(mtime)))
    }

    fn check_root(&self) -> io::Result<()> {
        let root = self.root_path.display();
        let held = rfs::fstat(&*self.root)?;
        if nlink_of(&held) == 0 {
            return Err(io::Error::other(format!(
                "run root {root} was deleted (the opened directory no longer exists)"
            )));
        }
        match rfs::lstat(&self.root_path) {
            Ok(st) if id_of(&st) == self.root_id && id_of(&held) == self.root_id => Ok(()),
            Ok(_) => Err(io::Error::other(format!(
                "run root {root} was renamed or replaced (the path now names another file)"
            ))),
            Err(Errno::NOENT) => Err(io::Error::other(format!(
                "run root {root} was removed or renamed (the path no longer exists)"
            ))),
            Err(e) => Err(with_msg(
                e.into(),
                format!("run root {root} cannot be checked: {}", io::Error::from(e)),
            )),
        }
    }
}
