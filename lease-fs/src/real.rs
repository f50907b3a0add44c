//! [`RealFs`]: the [`Fs`](crate::fs::Fs) seam on the real disk.
//!
//! Every call is relative to a descriptor of the run root that is opened once (with
//! `O_NOFOLLOW|O_DIRECTORY`) and held for the life of the value, so a run root that is
//! renamed, replaced or deleted underneath is *detected* by [`Fs::check_root`](crate::fs::Fs::check_root) instead of
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

mod calls;
mod records;
mod resolve;
mod sys;
mod write;

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::listing::{EpochsCache, ListingCache, ListingCacheStats};
use sys::{DIR_MODE, OPENAT2_UNAVAILABLE, dir_flags, errno_msg, id_of, retry, with_msg};
pub(crate) use sys::{perm_of, type_of};

pub(crate) use crate::trust::check_trusted;
pub use crate::trust::{NotOwned, euid, not_owned_in, shell_quote};

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
    /// The file [`Fs::write_at`](crate::fs::Fs::write_at) writes in place (the heartbeat file), kept open between
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

/// An open of the run root `root` that failed with `errno` (reported as `failed`). One the
/// kernel refused (`EACCES`) is judged like an open that succeeded: if `root` is a
/// directory of another uid (or open to others) the refusal is that it is not trusted, the
/// same [`NotOwned`] error as when the descriptor is judged (a second user's run folder is
/// `0700`, so its open is what fails). Anything else is `failed` as it is (a parent folder
/// that cannot be searched, say). The `lstat` only words the refusal: nothing is read or
/// written through what it finds, and a folder swapped meanwhile can only change which
/// refusal is reported.
pub(crate) fn root_open_failed(root: &Path, errno: Errno, failed: io::Error) -> io::Error {
    if errno != Errno::ACCESS {
        return failed;
    }
    match rfs::lstat(root) {
        Ok(st) if type_of(&st) == FileType::Directory => {
            check_trusted(root, &st, "").err().unwrap_or(failed)
        }
        _ => failed,
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
                let failed = errno_msg(e, format!("cannot open run root {}", path.display()));
                return Err(root_open_failed(&path, e, failed));
            }
        };
        RealFs::from_root_fd(fd, path)
    }

    /// A `RealFs` over `fd`, a directory descriptor the caller just opened at `path`
    /// (absolute, for messages and [`Fs::check_root`](crate::fs::Fs::check_root)): judged on the descriptor itself,
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

    /// The file system the run root is on (`fstatfs` of the held root at open).
    pub fn file_system(&self) -> crate::fstype::FileSystem {
        self.file_system
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
            return Err(errno_msg(
                e,
                format!("cannot create run root {}", path.display()),
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
            return Err(errno_msg(
                e,
                format!("cannot create directory {}", path.display()),
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
