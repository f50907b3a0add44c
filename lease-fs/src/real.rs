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
//! Directories are created 0700 and files 0600, whatever the umask (the mode is set with
//! `fchmod` on the new descriptor). Nothing that exists is ever chmodded: the run root, every
//! directory resolved below it and every record read must be owned by the effective uid and
//! not writable by group or others (records: no group or other permission bits at all), else
//! the call fails with a [`NotOwned`] error (`RUN_NOT_OWNED`, 77) before anything is read or
//! written through it. The checks use `fstat` of the descriptors already held (or the stat
//! the call makes anyway), never a second path lookup. A symlink, or a non-directory where a
//! directory should be, is refused with an error that names the offending path.
//!
//! The listing of `lease/epochs` (RECHECK's, on every heartbeat) is replayed while an
//! inotify watch on that directory has queued nothing since it was made, on local disk file
//! systems only: [`crate::listing`] (its soundness argument and what it costs).

use std::collections::HashMap;
use std::ffi::CStr;
use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self as rfs, AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

use crate::fs::{EntryKind, Fs, check_rel, join, judge_record, split};
use crate::listing::{
    CACHED_DIR, Entry, EpochsCache, Facts, ListingCache, ListingCacheStats, Plan,
};

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

pub(crate) use crate::trust::check_trusted;
pub use crate::trust::{NotOwned, euid, not_owned_in, shell_quote};

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
pub(crate) fn perm_of(st: &Stat) -> u32 {
    (st.st_mode as u32) & 0o7777
}

pub(crate) fn type_of(st: &Stat) -> FileType {
    FileType::from_raw_mode(st.st_mode)
}

/// The protocol's kind of a file type (`None`: the kernel did not say, `DT_UNKNOWN`).
fn kind_of(ft: FileType) -> Option<EntryKind> {
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
fn kind_of_stat(st: &Stat) -> EntryKind {
    kind_of(type_of(st)).unwrap_or(EntryKind::Other)
}

/// `st_size` as `u64` (negative sizes do not exist; 0 if one is reported).
fn size_of(st: &Stat) -> u64 {
    u64::try_from(st.st_size).unwrap_or(0)
}

/// Judge the entry `st` describes as a record file of at most `limit` bytes
/// ([`judge_record`]: the one classification every primitive uses).
fn judge_stat(path: &str, st: &Stat, limit: usize) -> io::Result<()> {
    judge_record(path, kind_of_stat(st), size_of(st), limit)
}

/// A file type in words, for messages.
fn type_name(ft: FileType) -> &'static str {
    kind_of(ft).map_or("special file", EntryKind::name)
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
    /// The file [`Fs::write_at`] writes in place (the heartbeat file), kept open between
    /// beats; dropped when this adapter renames over or unlinks that path.
    in_place: Mutex<Option<(String, Arc<OwnedFd>)>>,
    /// The file system of the root, from `fstatfs` at open.
    file_system: crate::fstype::FileSystem,
    /// The cached listing of `lease/epochs` and the inotify watch that guards it
    /// ([`crate::listing`]).
    epochs: Mutex<EpochsCache>,
}

impl fmt::Debug for RealFs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RealFs")
            .field("root", &self.root_path)
            .field("dev_ino", &self.root_id)
            .finish()
    }
}

/// Whether `path` is a run folder: a directory (not a symlink) holding `lease/epochs/`,
/// looked up beneath the folder's descriptor without following symlinks. Judges only the
/// type, not the owner (`runlease list` shows a foreign run and lets `status` refuse it).
pub fn is_run_folder(path: &Path) -> io::Result<bool> {
    let fd = match retry(|| rfs::open(path, dir_flags(), Mode::empty())) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    has_run_marker_in(&fd)
}

/// Whether `lease/epochs/` is a directory beneath the folder `root`, resolved without
/// following symlinks (type only, not owner).
fn has_run_marker_in(root: &OwnedFd) -> io::Result<bool> {
    let lease = match retry(|| rfs::openat(root, "lease", dir_flags(), Mode::empty())) {
        Ok(fd) => fd,
        Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Ok(false),
        Err(e) => return Err(e.into()),
    };
    match retry(|| rfs::statat(&lease, "epochs", AtFlags::SYMLINK_NOFOLLOW)) {
        Ok(st) => Ok(type_of(&st) == FileType::Directory),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
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
        RealFs::from_root_fd(fd, path)
    }

    /// A `RealFs` over `fd`, a directory descriptor the caller just opened at `path`
    /// (absolute, for messages and [`Fs::check_root`]): judged on the descriptor itself,
    /// no path is looked up.
    fn from_root_fd(fd: OwnedFd, path: PathBuf) -> io::Result<RealFs> {
        let st = rfs::fstat(&fd)?;
        if type_of(&st) != FileType::Directory {
            return Err(io::Error::other(format!(
                "run root {} is not a directory",
                path.display()
            )));
        }
        // Trust only a root we own that nobody else can write (checked on the descriptor
        // just opened, so it is the directory every later call is relative to).
        check_trusted(&path, &st, "")?;
        let file_system = crate::fstype::FileSystem::of(&fd)?;
        Ok(RealFs {
            root: Arc::new(fd),
            root_path: path,
            root_id: id_of(&st),
            dirs: Mutex::new(HashMap::new()),
            use_openat2: true,
            in_place: Mutex::new(None),
            file_system,
            epochs: Mutex::new(EpochsCache::new(ListingCache::Auto)),
        })
    }

    /// Another `RealFs` over the same held root: a duplicate of its descriptor (no path
    /// lookup: it is the very directory this one opened, wherever it has been moved),
    /// with caches of its own. How one opened run folder is handed to each step that
    /// needs a run folder of its own (an owner's open, an observer).
    pub fn try_clone(&self) -> io::Result<RealFs> {
        let fd = rustix::io::fcntl_dupfd_cloexec(&*self.root, 0)?;
        Ok(RealFs {
            root: Arc::new(fd),
            root_path: self.root_path.clone(),
            root_id: self.root_id,
            dirs: Mutex::new(HashMap::new()),
            use_openat2: self.use_openat2,
            in_place: Mutex::new(None),
            file_system: self.file_system,
            epochs: Mutex::new(EpochsCache::new(self.lock_epochs().mode())),
        })
    }

    /// `(st_dev, st_ino)` of the held root, as it was when opened.
    pub fn root_id(&self) -> (u64, u64) {
        self.root_id
    }

    /// The name the kernel has for the held root right now (`/proc/self/fd/N`), for
    /// display and for naming a run given as `.` or `…/..`; never used to open anything.
    /// `None` if `/proc` cannot say (or the folder was deleted).
    pub fn held_name(&self) -> Option<PathBuf> {
        use std::os::fd::AsRawFd;
        let link = format!("/proc/self/fd/{}", self.root.as_raw_fd());
        let name = std::fs::read_link(link).ok()?;
        // A deleted directory reads as "<path> (deleted)".
        let deleted = name.as_os_str().to_string_lossy().ends_with(" (deleted)");
        (name.is_absolute() && !deleted).then_some(name)
    }

    /// Whether the held root is the current folder, one of its parents or `/`: judged by
    /// identity, walking up from the current folder by descriptor (`openat(..)`), never by
    /// looking up the run folder's path again.
    pub fn is_cwd_or_ancestor(&self) -> bool {
        let Ok(mut fd) = retry(|| rfs::open(".", dir_flags(), Mode::empty())) else {
            return false;
        };
        // Bounded: a path has at most PATH_MAX/2 components.
        for _ in 0..2048 {
            let Ok(st) = rfs::fstat(&fd) else {
                return false;
            };
            if id_of(&st) == self.root_id {
                return true;
            }
            let Ok(parent) = retry(|| rfs::openat(&fd, "..", dir_flags(), Mode::empty())) else {
                return false;
            };
            let Ok(pst) = rfs::fstat(&parent) else {
                return false;
            };
            if id_of(&pst) == id_of(&st) {
                // `/` is its own parent.
                return false;
            }
            fd = parent;
        }
        false
    }

    /// Create the run root `root` (and any missing parents, each mode 0700 whatever the
    /// umask, fsyncing the parent whose entries changed) if it does not exist, then
    /// [`open`](RealFs::open) it.
    pub fn create(root: &Path) -> io::Result<RealFs> {
        Ok(RealFs::create_reporting(root)?.0)
    }

    /// [`create`](RealFs::create), also saying whether the root itself was created.
    pub fn create_reporting(root: &Path) -> io::Result<(RealFs, bool)> {
        let path = std::path::absolute(root)?;
        // A root this call created is used through the descriptor that created it
        // (opened `O_NOFOLLOW` right after the `mkdir`), not looked up again; an existing
        // one is opened once, by `open`.
        match create_dir_all_private(&path)? {
            Some(fd) => Ok((RealFs::from_root_fd(fd, path)?, true)),
            None => Ok((RealFs::open(&path)?, false)),
        }
    }

    /// Whether `lease/epochs/` is a directory below the root (the mark of a run, see
    /// `RunDir::init`), resolved without following symlinks. Checks only the type, not
    /// the owner (a foreign folder is classified before it is judged).
    pub fn has_run_marker(&self) -> io::Result<bool> {
        has_run_marker_in(&self.root)
    }

    /// Error unless directory `dir` (non-empty, below the root) is absent or trusted: a
    /// symlink or non-directory in the way is refused, and every existing component must
    /// be owned by us and not group/other writable. `Ok(true)` if it exists. Creates
    /// nothing.
    pub fn check_dir(&self, dir: &str) -> io::Result<bool> {
        Ok(self.dir_fd_opt(dir, dir)?.is_some())
    }

    /// Resolve paths with a component-by-component `openat(O_NOFOLLOW|O_DIRECTORY)` walk
    /// instead of `openat2`, as on kernels without `openat2` (for tests of that path).
    pub fn without_openat2(mut self) -> RealFs {
        self.use_openat2 = false;
        self.lock_dirs().clear();
        self
    }

    /// This adapter with the cached listing of `lease/epochs` in `mode` ([`crate::listing`];
    /// [`ListingCache::Auto`] unless set), forgetting what was cached.
    pub fn with_listing_cache(self, mode: ListingCache) -> RealFs {
        *self.lock_epochs() = EpochsCache::new(mode);
        self
    }

    /// What the cached listing of `lease/epochs` has done so far on this adapter.
    pub fn listing_cache_stats(&self) -> ListingCacheStats {
        self.lock_epochs().stats()
    }

    fn lock_epochs(&self) -> MutexGuard<'_, EpochsCache> {
        self.epochs.lock().unwrap_or_else(|p| p.into_inner())
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

    /// The held descriptor of the run root, shared (for a liveness probe of this root).
    pub(crate) fn root_shared(&self) -> Arc<OwnedFd> {
        self.root.clone()
    }

    /// A descriptor of directory `dir` below the root (`""` = the root), resolved beneath
    /// the held root without following symlinks and judged like every directory runlease
    /// uses (ours, not group/other writable). A new descriptor (close-on-exec) the caller
    /// owns, e.g. for the store folder that lease-sqlite opens its files beneath.
    pub fn open_dir(&self, dir: &str) -> io::Result<OwnedFd> {
        let fd = self.dir_fd(dir, dir)?;
        Ok(rustix::io::fcntl_dupfd_cloexec(&*fd, 0)?)
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
        Ok(self.dir_fd_id(dir, path)?.0)
    }

    /// [`dir_fd`](Self::dir_fd), with the `(st_dev, st_ino)` the descriptor was just
    /// re-validated against (or found to have when opened).
    fn dir_fd_id(&self, dir: &str, path: &str) -> io::Result<(Arc<OwnedFd>, (u64, u64))> {
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
        let fd = Arc::new(fd);
        self.lock_dirs().insert(
            dir.to_string(),
            CachedDir {
                fd: fd.clone(),
                id: id_of(&st),
            },
        );
        Ok((fd, id_of(&st)))
    }

    /// Call `f` with the folder's descriptor, each entry of directory `dir` (`.` and `..`
    /// left out) and its name; a missing folder has none ([`each_entry_in`]).
    fn each_entry(
        &self,
        dir: &str,
        f: &mut dyn FnMut(&OwnedFd, &rustix::fs::DirEntry, &str) -> io::Result<()>,
    ) -> io::Result<()> {
        let Some(dfd) = self.dir_fd_opt(dir, dir)? else {
            return Ok(());
        };
        each_entry_in(&dfd, f)
    }

    /// [`Fs::list_records`] of `dir` in the folder `dfd` (resolved and judged by the
    /// caller), read from the directory.
    fn list_records_in(
        &self,
        dfd: &OwnedFd,
        dir: &str,
        limit: usize,
        is_record: &dyn Fn(&str) -> bool,
        each: &mut dyn FnMut(&str),
    ) -> io::Result<()> {
        each_entry_in(dfd, &mut |dfd, entry, name| {
            if is_record(name) {
                let path = join(dir, name);
                match kind_of(entry.file_type()) {
                    // `getdents` said what it is: no further call for a non-file.
                    Some(k) if k != EntryKind::File => judge_record(&path, k, 0, limit)?,
                    // A regular file (its size is needed) or `DT_UNKNOWN`: one `fstatat`.
                    _ => match retry(|| {
                        rfs::statat(dfd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                    }) {
                        Ok(st) => judge_stat(&path, &st, limit)?,
                        // Removed since the listing (a concurrent prune): listed anyway.
                        Err(Errno::NOENT) => {}
                        Err(e) => return Err(self.path_err(e, &path)),
                    },
                }
            }
            each(name);
            Ok(())
        })
    }

    /// The facts [`list_records_in`](Self::list_records_in) judges by, collected from the
    /// directory `dfd` for the cache: the same calls in the same order, and before each
    /// `fstatat` of a record file, `watch` (which adds that file's inotify watch).
    fn collect_records_in(
        &self,
        dfd: &OwnedFd,
        dir: &str,
        is_record: &dyn Fn(&str) -> bool,
        watch: &mut dyn FnMut(&CStr),
    ) -> io::Result<Vec<Entry>> {
        let mut entries = Vec::new();
        each_entry_in(dfd, &mut |dfd, entry, name| {
            let facts = if !is_record(name) {
                Facts::Unjudged
            } else {
                match kind_of(entry.file_type()) {
                    Some(k) if k != EntryKind::File => Facts::Known(k, 0),
                    _ => {
                        watch(entry.file_name());
                        match retry(|| {
                            rfs::statat(dfd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
                        }) {
                            Ok(st) => Facts::Known(kind_of_stat(&st), size_of(&st)),
                            Err(Errno::NOENT) => Facts::Vanished,
                            Err(e) => return Err(self.path_err(e, &join(dir, name))),
                        }
                    }
                }
            };
            entries.push(Entry {
                name: name.to_string(),
                facts,
            });
            Ok(())
        })?;
        Ok(entries)
    }

    /// [`Fs::list_records`] of `lease/epochs`: replayed from the cache while its watch has
    /// queued nothing, else read (and kept when the watch allows) ([`crate::listing`]).
    /// The descriptors are re-validated against their paths and trusted first, every time.
    fn list_records_cached(
        &self,
        dir: &str,
        limit: usize,
        is_record: &dyn Fn(&str) -> bool,
        each: &mut dyn FnMut(&str),
    ) -> io::Result<()> {
        let (dfd, id) = match self.dir_fd_id(dir, dir) {
            Ok(found) => found,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.lock_epochs().missing();
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let entries = {
            let mut cache = self.lock_epochs();
            let mut plan = cache.plan(&dfd, id);
            if let Plan::Replay(entries) = &plan {
                let covered = entries
                    .iter()
                    .all(|e| !matches!(e.facts, Facts::Unjudged) || !is_record(&e.name));
                plan = if covered {
                    cache.replayed();
                    plan
                } else {
                    cache.miss()
                };
            }
            match plan {
                Plan::Replay(entries) => entries,
                Plan::Relist { keep } => {
                    // Held across the listing: an event drained by a concurrent listing
                    // after this one began must not be lost under this one's answer.
                    let mut watched = keep;
                    let entries = self.collect_records_in(&dfd, dir, is_record, &mut |name| {
                        watched = watched && cache.watch_file(&dfd, name);
                    })?;
                    cache.listed(entries, watched)
                }
                Plan::Stream => {
                    drop(cache);
                    return self.list_records_in(&dfd, dir, limit, is_record, each);
                }
            }
        };
        for e in entries.iter() {
            if is_record(&e.name) {
                if let Facts::Known(kind, size) = e.facts {
                    judge_record(&join(dir, &e.name), kind, size, limit)?;
                }
            }
            each(&e.name);
        }
        Ok(())
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

    /// Open the record `leaf` of the directory `dfd` with `flags` (which carry
    /// `O_NOFOLLOW|O_NONBLOCK`: a FIFO opens at once, a symlink fails with ELOOP, a socket
    /// with ENXIO), then judge it (§5.1 bad files, at most `limit` bytes) and trust it
    /// (§2 Trust) before a byte is read or written. A failed open is classified by an
    /// `lstat` of the name, so each kind of bad file gets the one error of `judge_record`,
    /// as from `exists_record` and `list_records`. A missing file is `NotFound`.
    fn open_judged(
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

    /// Write all of `bytes` to `fd`: at its file offset (`at: None`), or from offset `at`
    /// (`pwrite`). A write of nothing is `WriteZero`, naming `path`.
    fn write_all(
        &self,
        fd: &OwnedFd,
        mut at: Option<u64>,
        bytes: &[u8],
        path: &str,
    ) -> io::Result<()> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let written = match at {
                Some(offset) => rustix::io::pwrite(fd, rest, offset),
                None => rustix::io::write(fd, rest),
            };
            match written {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!(
                            "run root {}: writing {path} wrote nothing",
                            self.root_path.display()
                        ),
                    ));
                }
                Ok(n) => {
                    rest = &rest[n..];
                    at = at.map(|a| a + n as u64);
                }
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The cached in-place file of `path`, or `None`.
    fn cached_in_place(&self, path: &str) -> Option<Arc<OwnedFd>> {
        let slot = self.in_place.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref()
            .filter(|(p, _)| p == path)
            .map(|(_, fd)| fd.clone())
    }

    /// The file system the run root is on (`fstatfs` of the held root at open).
    pub fn file_system(&self) -> crate::fstype::FileSystem {
        self.file_system
    }

    /// Forget the in-place file if it is `path` (this adapter renamed over or removed it).
    fn forget_in_place(&self, path: &str) {
        let mut slot = self.in_place.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|(p, _)| p == path) {
            *slot = None;
        }
    }

    /// Open `path` for in-place writes (never creating it), judged and trusted like a
    /// read (§5.1), and keep it for the next call.
    fn in_place_fd(&self, path: &str) -> io::Result<Arc<OwnedFd>> {
        if let Some(fd) = self.cached_in_place(path) {
            return Ok(fd);
        }
        let (dir, leaf) = self.file_parts(path)?;
        let dfd = self.dir_fd(dir, path)?;
        let flags =
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
        let (fd, st) = self.open_judged(
            &dfd,
            leaf,
            path,
            flags,
            lease_core::canonical::MAX_RECORD_BYTES,
        )?;
        // A second name would make the write land in whatever file that is (a hard link
        // planted at the beat's name to, say, `run.json`): refuse, write nothing.
        if nlink_of(&st) != 1 {
            return Err(io::Error::other(format!(
                "run root {}: refusing to write {path} in place: the file has {} names (a heartbeat file has exactly one); move the extra name away by hand",
                self.root_path.display(),
                nlink_of(&st)
            )));
        }
        let fd = Arc::new(fd);
        *self.in_place.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((path.to_string(), fd.clone()));
        Ok(fd)
    }

    /// Open existing file `path` (in an existing directory) to fsync it, without following
    /// a symlink and without blocking on a FIFO.
    fn open_existing(&self, path: &str) -> io::Result<OwnedFd> {
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

/// `mkdir -p` with mode 0700 (whatever the umask) for every created component, fsyncing
/// each parent whose entries changed. Existing components are left as they are. Returns
/// the descriptor of `path` itself (opened `O_NOFOLLOW|O_DIRECTORY` right after its
/// `mkdir`) if this call created it, `None` if it existed.
///
/// Order of writes per created component: `mkdir` (0700), `fchmod` 0700 on the new
/// descriptor if the umask took bits away, then `fsync` of its parent. A crash before
/// the parent's fsync may lose the folder (it is created again next time); after it, it
/// stays.
fn create_dir_all_private(path: &Path) -> io::Result<Option<OwnedFd>> {
    match rfs::lstat(path) {
        Ok(_) => return Ok(None),
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
        Err(Errno::EXIST) => return Ok(None),
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
    // The umask may have taken bits away (0277 leaves 0500, which even we cannot write):
    // set 0700 on the directory just made, through a descriptor that does not follow a
    // symlink put there meanwhile.
    let fd = retry(|| rfs::open(path, dir_flags(), Mode::empty()))?;
    if perm_of(&rfs::fstat(&fd)?) != DIR_MODE {
        rfs::fchmod(&fd, Mode::from_raw_mode(DIR_MODE))?;
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
    Ok(Some(fd))
}

/// Call `f` with `dfd`, each entry of the directory `dfd` names (`.` and `..` left out)
/// and its name, read through a fresh open file description (`openat(dfd, ".")`), so
/// concurrent listings do not share a directory offset with each other or with `dfd`.
/// Names this crate writes are ASCII; a stray non-UTF-8 name is passed lossily (callers
/// ignore names they do not parse).
fn each_entry_in(
    dfd: &OwnedFd,
    f: &mut dyn FnMut(&OwnedFd, &rustix::fs::DirEntry, &str) -> io::Result<()>,
) -> io::Result<()> {
    for entry in Dir::read_from(dfd)? {
        let entry = entry?;
        let raw = entry.file_name().to_bytes();
        if raw == b"." || raw == b".." {
            continue;
        }
        let name = String::from_utf8_lossy(raw);
        f(dfd, &entry, &name)?;
    }
    Ok(())
}

impl Fs for RealFs {
    fn ensure_dir(&self, dir: &str) -> io::Result<bool> {
        check_rel(dir)?;
        if dir.is_empty() {
            return Ok(false);
        }
        // Fast path: a cached, still valid descriptor (judged again by `dir_fd`).
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
            if made_here {
                // Ours, just made: exactly 0700 whatever the umask.
                if perm_of(&st) != DIR_MODE {
                    rfs::fchmod(&fd, Mode::from_raw_mode(DIR_MODE))?;
                }
            } else {
                // Existing folders are judged, never chmodded (PROTOCOL §5.1).
                check_trusted(&self.root_path, &st, &prefix)?;
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
        let mut names = Vec::new();
        self.for_each_name(dir, &mut |n| names.push(n.to_string()))?;
        Ok(names)
    }

    fn for_each_name(&self, dir: &str, each: &mut dyn FnMut(&str)) -> io::Result<()> {
        self.each_entry(dir, &mut |_, _, name| {
            each(name);
            Ok(())
        })
    }

    fn read(&self, path: &str, limit: usize) -> io::Result<Option<Vec<u8>>> {
        let (dir, leaf) = self.file_parts(path)?;
        let Some(dfd) = self.dir_fd_opt(dir, path)? else {
            return Ok(None);
        };
        let (fd, st) = match self.open_judged(&dfd, leaf, path, read_flags(), limit) {
            Ok(opened) => opened,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let size = size_of(&st);
        let limit64 = u64::try_from(limit).unwrap_or(u64::MAX);
        let mut buf = Vec::with_capacity(usize::try_from(size).unwrap_or(limit).min(limit));
        // The file may have grown since fstat: read at most one byte past the limit.
        std::fs::File::from(fd)
            .take(limit64.saturating_add(1))
            .read_to_end(&mut buf)?;
        judge_record(path, EntryKind::File, buf.len() as u64, limit)?;
        Ok(Some(buf))
    }

    fn exists_record(&self, path: &str, limit: usize) -> io::Result<bool> {
        match self.lstat(path)? {
            Some(st) => {
                // What it is first (the same order as `read`), then whether we trust it.
                judge_stat(path, &st, limit)?;
                check_trusted(&self.root_path, &st, path)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn list_records(
        &self,
        dir: &str,
        limit: usize,
        is_record: &dyn Fn(&str) -> bool,
        each: &mut dyn FnMut(&str),
    ) -> io::Result<()> {
        if dir == CACHED_DIR {
            return self.list_records_cached(dir, limit, is_record, each);
        }
        let Some(dfd) = self.dir_fd_opt(dir, dir)? else {
            return Ok(());
        };
        self.list_records_in(&dfd, dir, limit, is_record, each)
    }

    fn exists(&self, path: &str) -> io::Result<bool> {
        match self.lstat(path)? {
            Some(st) => {
                check_trusted(&self.root_path, &st, path)?;
                Ok(true)
            }
            None => Ok(false),
        }
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
        // Ours (O_EXCL): exactly 0600 whatever the umask (0277 would leave 0400).
        retry(|| rfs::fchmod(&fd, Mode::from_raw_mode(FILE_MODE)))?;
        self.write_all(&fd, None, bytes, path)
    }

    fn fsync(&self, path: &str) -> io::Result<()> {
        let fd = self.open_existing(path)?;
        retry(|| rfs::fsync(&fd))?;
        Ok(())
    }

    fn loses_unsynced_writes(&self) -> bool {
        self.file_system.loses_unsynced_writes
    }

    fn write_at(&self, path: &str, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let fd = self.in_place_fd(path)?;
        self.write_all(&fd, Some(offset), bytes, path)
    }

    fn sync_data(&self, path: &str) -> io::Result<()> {
        match self.cached_in_place(path) {
            Some(fd) => retry(|| rfs::fdatasync(&*fd))?,
            None => {
                let fd = self.open_existing(path)?;
                retry(|| rfs::fdatasync(&fd))?;
            }
        }
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
        self.forget_in_place(to);
        retry(|| rfs::renameat(&*ffd, fleaf, &*tfd, tleaf))?;
        Ok(())
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        let (dir, leaf) = self.file_parts(path)?;
        let dfd = self.dir_fd(dir, path)?;
        self.forget_in_place(path);
        retry(|| rfs::unlinkat(&*dfd, leaf, AtFlags::empty()))?;
        Ok(())
    }

    fn link_count(&self, path: &str) -> io::Result<Option<u64>> {
        Ok(self.lstat(path)?.map(|st| nlink_of(&st)))
    }

    fn age_secs(&self, path: &str) -> io::Result<Option<u64>> {
        Ok(self.entry_info(path)?.map(|i| i.age_secs))
    }

    fn entry_info(&self, path: &str) -> io::Result<Option<crate::fs::EntryInfo>> {
        let Some(st) = self.lstat(path)? else {
            return Ok(None);
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mtime = u64::try_from(st.st_mtime).unwrap_or(0);
        Ok(Some(crate::fs::EntryInfo {
            regular: type_of(&st) == FileType::RegularFile,
            ours: st.st_uid == euid(),
            age_secs: now.saturating_sub(mtime),
        }))
    }

    fn check_root(&self) -> io::Result<()> {
        let root = self.root_path.display();
        let held = rfs::fstat(&*self.root)?;
        check_trusted(&self.root_path, &held, "")?;
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
