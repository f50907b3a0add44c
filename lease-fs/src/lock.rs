//! The kernel owner lock of a run: `flock(LOCK_EX)` on `<root>/owner.lock`.
//!
//! `flock` locks belong to the *open file description*, not to the process: closing some
//! other descriptor of the same file (a `std::fs::File::open` + drop anywhere in the process)
//! does not drop the lock, which is the classic pitfall of POSIX `fcntl` record locks. The
//! kernel releases the lock when the last descriptor of the description is closed, so also
//! when the owner process dies (even by `SIGKILL`). The descriptor is opened `O_CLOEXEC`, so
//! child commands never inherit it: a surviving child cannot keep a dead owner's lock held.
//!
//! Two acquirers in the same process that open the file separately conflict like two
//! processes do. The lock is host-local evidence: on NFS, Linux emulates `flock` with POSIX
//! locks, so the pitfall above comes back there; runlease treats the lock only as
//! same-host liveness evidence.
//!
//! Never delete `owner.lock` while a run may be live: a new file at the same name would be a
//! different lock. [`OwnerLock::try_acquire`] re-checks after locking that the file it locked
//! is still the one named `owner.lock`, and retries otherwise.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{self as rfs, AtFlags, FileType, FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use crate::real::RealFs;

/// Name of the lock file inside the run root.
pub const LOCK_FILE: &str = "owner.lock";

/// How often [`OwnerLock::acquire_timeout`] retries.
const POLL: Duration = Duration::from_millis(10);

/// The held owner lock of a run. Dropping it unlocks (closes the descriptor); the kernel
/// also releases it when the process dies.
pub struct OwnerLock {
    fd: OwnedFd,
    path: PathBuf,
    /// This acquisition created `owner.lock` (it did not exist).
    created: bool,
}

impl fmt::Debug for OwnerLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnerLock")
            .field("path", &self.path)
            .finish()
    }
}

fn retry<T>(mut f: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    loop {
        match f() {
            Err(Errno::INTR) => continue,
            other => return other,
        }
    }
}

#[allow(clippy::unnecessary_cast)]
fn id_of(st: &rfs::Stat) -> (u64, u64) {
    (st.st_dev as u64, st.st_ino as u64)
}

fn ctx(e: Errno, msg: String) -> io::Error {
    let source = io::Error::from(e);
    io::Error::new(source.kind(), Ctx { msg, source })
}

/// `msg: errno text`, keeping the errno as the source so callers can classify it
/// (`FsError::io` makes a symlinked owner lock `RUN_LAYOUT_INVALID`, not an I/O error).
#[derive(Debug)]
struct Ctx {
    msg: String,
    source: io::Error,
}

impl std::fmt::Display for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.msg, self.source)
    }
}

impl std::error::Error for Ctx {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Open the run root directory itself, refusing a symlinked root and one we do not trust
/// (not ours, or writable by group or others: `RUN_NOT_OWNED`).
fn open_root(root: &Path) -> io::Result<OwnedFd> {
    let fd = retry(|| {
        rfs::open(
            root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
    })
    .map_err(|e| {
        let failed = ctx(e, format!("cannot open run root {}", root.display()));
        crate::real::root_open_failed(root, e, failed)
    })?;
    crate::real::check_trusted(root, &rfs::fstat(&fd)?, "")?;
    Ok(fd)
}

/// Open `owner.lock` in `root_fd` (creating it 0600, whatever the umask, if `create`);
/// `None` if it is missing and not created. Refuses a symlink, anything but a regular
/// file, and an existing one we do not trust (`RUN_NOT_OWNED`).
fn open_lock_file(
    root_fd: BorrowedFd<'_>,
    root: &Path,
    create: bool,
) -> io::Result<Option<(OwnedFd, bool)>> {
    let path = root.join(LOCK_FILE);
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
    let open = |flags: OFlags| -> io::Result<Option<OwnedFd>> {
        match retry(|| rfs::openat(root_fd, LOCK_FILE, flags, Mode::from_raw_mode(0o600))) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::NOENT) => Ok(None),
            Err(Errno::EXIST) if flags.contains(OFlags::EXCL) => Ok(None),
            Err(Errno::LOOP) => Err(ctx(
                Errno::LOOP,
                format!("refusing owner lock {}: it is a symlink", path.display()),
            )),
            Err(e) => Err(ctx(e, format!("cannot open owner lock {}", path.display()))),
        }
    };
    // Create it exclusively first, so we know whether the file is ours to set 0600 on.
    let mut made = false;
    let mut fd = None;
    if create {
        fd = open(flags | OFlags::CREATE | OFlags::EXCL)?;
        made = fd.is_some();
    }
    let fd = match fd {
        Some(fd) => fd,
        // Missing (and not created), or removed between the two opens: the caller tries
        // again.
        None => match open(flags)? {
            Some(fd) => fd,
            None => return Ok(None),
        },
    };
    let st = rfs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("refusing owner lock {}: not a regular file", path.display()),
        ));
    }
    if made {
        #[allow(clippy::unnecessary_cast)]
        if (st.st_mode as u32) & 0o7777 != 0o600 {
            rfs::fchmod(&fd, Mode::from_raw_mode(0o600))?;
        }
    } else {
        crate::real::check_trusted(root, &st, LOCK_FILE)?;
    }
    Ok(Some((fd, made)))
}

/// Try `flock(LOCK_EX|LOCK_NB)` on `fd`: `true` if locked, `false` if held elsewhere.
fn try_flock(fd: BorrowedFd<'_>, path: &Path) -> io::Result<bool> {
    match retry(|| rfs::flock(fd, FlockOperation::NonBlockingLockExclusive)) {
        Ok(()) => Ok(true),
        Err(Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(ctx(e, format!("cannot lock owner lock {}", path.display()))),
    }
}

/// Whether `fd` is still the file named `owner.lock` in `root_fd`.
fn still_named(root_fd: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> io::Result<bool> {
    let held = rfs::fstat(fd)?;
    match rfs::statat(root_fd, LOCK_FILE, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(id_of(&st) == id_of(&held)),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

impl OwnerLock {
    /// Try to take the owner lock of the run at `root` without waiting. `Ok(None)` means
    /// someone else holds it (another process, or another acquirer in this process).
    /// Creates `owner.lock` (0600) if it is missing.
    pub fn try_acquire(root: &Path) -> io::Result<Option<OwnerLock>> {
        let root_fd = open_root(root)?;
        Self::try_acquire_at(root_fd.as_fd(), root)
    }

    /// [`try_acquire`](OwnerLock::try_acquire) relative to the held root descriptor of `fs`
    /// (so a renamed root is followed to the directory that was opened).
    pub fn try_acquire_in(fs: &RealFs) -> io::Result<Option<OwnerLock>> {
        Self::try_acquire_at(fs.root_fd(), fs.root_path())
    }

    /// [`try_acquire_in`](OwnerLock::try_acquire_in) for a reader that must write nothing:
    /// `owner.lock` is never created; a missing one is `ErrorKind::NotFound` (no owner ever
    /// took this run's lock).
    pub fn try_acquire_existing_in(fs: &RealFs) -> io::Result<Option<OwnerLock>> {
        Self::try_lock_at(fs.root_fd(), fs.root_path(), false)
    }

    fn try_acquire_at(root_fd: BorrowedFd<'_>, root: &Path) -> io::Result<Option<OwnerLock>> {
        Self::try_lock_at(root_fd, root, true)
    }

    fn try_lock_at(
        root_fd: BorrowedFd<'_>,
        root: &Path,
        create: bool,
    ) -> io::Result<Option<OwnerLock>> {
        let path = root.join(LOCK_FILE);
        // Bounded: the file is replaced only if someone deletes it while we lock it.
        for _ in 0..8 {
            let Some((fd, created)) = open_lock_file(root_fd, root, create)? else {
                if !create {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{} does not exist", path.display()),
                    ));
                }
                continue;
            };
            if !try_flock(fd.as_fd(), &path)? {
                return Ok(None);
            }
            if still_named(root_fd, fd.as_fd())? {
                return Ok(Some(OwnerLock { fd, path, created }));
            }
            // We locked a file that was unlinked or replaced meanwhile: drop it, retry.
        }
        Err(io::Error::other(format!(
            "owner lock {} keeps being replaced while it is locked",
            path.display()
        )))
    }

    /// Take the owner lock of the run at `root`, retrying every 10 ms for up to `timeout`.
    /// `Ok(None)` if it was still held by someone else when the time ran out.
    pub fn acquire_timeout(root: &Path, timeout: Duration) -> io::Result<Option<OwnerLock>> {
        Self::retry_for(timeout, || Self::try_acquire(root))
    }

    /// [`acquire_timeout`](OwnerLock::acquire_timeout) relative to the held root
    /// descriptor of `fs`: `owner.lock` is opened with `openat` in the folder that was
    /// opened, never by looking the run folder's path up again.
    pub fn acquire_timeout_in(fs: &RealFs, timeout: Duration) -> io::Result<Option<OwnerLock>> {
        Self::retry_for(timeout, || Self::try_acquire_in(fs))
    }

    /// Call `attempt` every [`POLL`] until it takes the lock or `timeout` has passed
    /// (`Ok(None)`: still held by someone else at the end).
    fn retry_for(
        timeout: Duration,
        mut attempt: impl FnMut() -> io::Result<Option<OwnerLock>>,
    ) -> io::Result<Option<OwnerLock>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(lock) = attempt()? {
                return Ok(Some(lock));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            std::thread::sleep(POLL.min(deadline - now));
        }
    }

    /// The path of the lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this acquisition created `owner.lock` (it did not exist before).
    pub fn created(&self) -> bool {
        self.created
    }

    /// Let the lock go, first removing `owner.lock` if this acquisition created it, so a
    /// refusal leaves the run folder as it found it (issue #28: a refused `runlease run`
    /// left an `owner.lock` behind). `fs` is the held root the lock was taken in.
    ///
    /// Order: while the lock is still held, and only if `owner.lock` still names the locked
    /// file, `unlinkat(owner.lock)`; then the descriptor is closed (unlocking). No fsync:
    /// a crash that brings the empty file back leaves what an owner's open would have made
    /// anyway. Safe for other acquirers: one that opened the old file and locks it after
    /// the close finds it no longer named `owner.lock` (`still_named`) and tries again,
    /// creating a new one, so two holders never coexist.
    pub fn release_removing_created(self, fs: &RealFs) -> io::Result<()> {
        if self.created && still_named(fs.root_fd(), self.fd.as_fd())? {
            match rfs::unlinkat(fs.root_fd(), LOCK_FILE, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(ctx(e, format!("cannot remove {}", self.path.display()))),
            }
        }
        drop(self);
        Ok(())
    }
}

impl AsFd for OwnerLock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Whether the owner lock of the run at `root` is free right now: take it without waiting
/// and release it at once. A missing `owner.lock` is free (nobody can hold it); the probe
/// never creates the file.
///
/// The answer is momentary evidence: an owner that tries to lock in the instant the probe
/// holds it sees it held (owners should use [`OwnerLock::acquire_timeout`]). Note that a
/// holder that never took the lock also reads as free.
pub fn probe_owner_lock(root: &Path) -> io::Result<bool> {
    let root_fd = open_root(root)?;
    probe_owner_lock_at(root_fd.as_fd(), root)
}

/// [`probe_owner_lock`] relative to the held root descriptor of `fs` (no second lookup of
/// the run folder's path).
pub fn probe_owner_lock_in(fs: &RealFs) -> io::Result<bool> {
    probe_owner_lock_at(fs.root_fd(), fs.root_path())
}

/// [`probe_owner_lock`] in the root descriptor `root_fd` (`root`: its path, for messages).
pub(crate) fn probe_owner_lock_at(root_fd: BorrowedFd<'_>, root: &Path) -> io::Result<bool> {
    let path = root.join(LOCK_FILE);
    let Some((fd, _)) = open_lock_file(root_fd, root, false)? else {
        return Ok(true);
    };
    let free = try_flock(fd.as_fd(), &path)?;
    // Closing the descriptor (its only one) releases the lock if we took it.
    drop(fd);
    Ok(free)
}
