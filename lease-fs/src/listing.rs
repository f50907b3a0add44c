//! The cached listing of `lease/epochs` (issue #33, "the heartbeat's floor").
//!
//! Every heartbeat ends with RECHECK (PROTOCOL §7.0, rule R4): a listing of `lease/epochs`
//! for any generation above the owner's. Read from the disk, that listing is an `openat`,
//! an `fcntl`, two `getdents64`, one `fstatat` per epoch (§5.1's size rule) and a `close`:
//! most of a local beat. [`RealFs`](crate::RealFs) replays the previous answer instead, but
//! only while an inotify watch on that directory, added **before** the listing it guards,
//! has queued nothing since: one non-blocking `read` of the inotify descriptor that fails
//! with `EAGAIN`. Everything else a request does each time stays: the root check, the
//! re-validation of the `lease/` and `lease/epochs/` descriptors against their paths and
//! their trust checks (§5.1); the cache replaces only the directory read and the per-name
//! `fstatat`s. Only [`Fs::list_records`](crate::fs::Fs::list_records) of `lease/epochs` is
//! cached (the `List` request of that folder).
//!
//! # What is cached, and what guards it
//!
//! The answer of one listing: each name, and for each name the listing judged as a record,
//! what it was judged by (the kind from `getdents`' `d_type` or the `fstatat`, and the size
//! from the `fstatat`). A replay judges those facts again against the caller's limit and
//! hands the names on in the same order, so it gives exactly the answer (and the
//! [`NotARecord`](crate::fs::NotARecord) error) that listing gave.
//!
//! The guard is one inotify instance (`IN_NONBLOCK | IN_CLOEXEC`) holding:
//!
//! - a watch on the directory's inode, added through `/proc/self/fd/N` of the very
//!   descriptor the listing reads (so it is that inode, whatever its path names by then;
//!   checked by a `stat` of that name against the descriptor's `(st_dev, st_ino)`), with
//!   `IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO` (the set of names),
//!   `IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE` (an entry written through the folder, or the
//!   folder itself changed), `IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT`;
//! - a watch on each listed record file, added before the `fstatat` that measures it, with
//!   `IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF`: a directory
//!   watch hears of a file's writes only through a name in that directory, the file's own
//!   watch through any name (a hard link elsewhere, a handle). At most
//!   [`MAX_FILE_WATCHES`] files; a folder with more is listed every time.
//!
//! Before each listing it guards, the queue is drained (read until `EAGAIN`), so an event
//! that arrives during the listing is seen by the next request. Any event at all (also
//! `IN_Q_OVERFLOW` and `IN_IGNORED`) or any read error other than `EAGAIN` drops the
//! answer and the directory is listed again; the watch stays (an `IN_IGNORED` of the
//! directory's own watch makes the next listing add it again). A directory the path no
//! longer names (the descriptor re-validation resolved another one) has its watches removed
//! and its answer dropped: a watch on a replaced directory never replays.
//!
//! # Why a replay is as sound as a listing
//!
//! fsnotify queues an event inside the system call that makes the change (`linkat`,
//! `renameat`, `unlinkat`, `mkdirat`, `openat(O_CREAT)`, `write`, `truncate`, …), under
//! the inotify group's lock, before that call returns; the `read` takes the same lock. So
//! an epoch whose creation returned before our `read` began is in the queue when we read,
//! and we list again. A creation that races the `read` (its call not yet returned) is
//! concurrent with this RECHECK either way: a listing races it just the same in its
//! `getdents`. Only the listing's linearization point moves, from the `getdents` to the
//! `read`; every PROTOCOL argument that uses a listing (I1, I3, I8, R4: "a listing that
//! begins after the link returned sees it") holds of the `read`. The watch was added before
//! the listing whose answer it guards, so no change falls between that listing and the
//! watch; a file's own watch is added before its `fstatat`, so no growth falls between its
//! measure and its watch.
//!
//! That holds only where every change is a system call of this kernel: the allowlist
//! [`FileSystem::changes_are_local_events`] (ext2/3/4, xfs, btrfs, tmpfs, f2fs), judged by
//! `fstatfs` of the `lease/epochs` descriptor itself (a mount below the root counts). NFS,
//! SMB/CIFS, FUSE, overlayfs, 9p and every unknown file system change without a local
//! event: there every listing reads the directory, as before.
//!
//! # What is given up
//!
//! Nothing, on the allowlisted file systems: the answer is the one a listing at the `read`
//! would give. Elsewhere nothing changes. If inotify cannot be had (`inotify_init1` or
//! `inotify_add_watch` fails: `EMFILE` for `fs.inotify.max_user_instances`, `ENOSPC` for
//! `max_user_watches`, no `/proc`), that `RealFs` lists every time, never an error. The
//! watch is made lazily, from the second listing of `lease/epochs` on the same `RealFs`, so
//! a one-shot command that lists once pays no `inotify_init1`; a long-lived one holds one
//! inotify instance per `RealFs` (counted against the user's `max_user_instances`).

use std::collections::HashSet;
use std::ffi::{CStr, OsStr};
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use rustix::fd::OwnedFd;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;

use crate::fs::EntryKind;
use crate::fstype::FileSystem;

/// The folder whose listing is cached: `lease/epochs` (RECHECK's listing, R4).
pub(crate) const CACHED_DIR: &str = "lease/epochs";

/// At most this many record files are watched; a folder listing more is listed every time.
pub const MAX_FILE_WATCHES: usize = 64;

/// Which listings of `lease/epochs` a [`RealFs`](crate::RealFs) may replay
/// ([`RealFs::with_listing_cache`](crate::RealFs::with_listing_cache)).
#[derive(Debug, Clone, Copy)]
pub enum ListingCache {
    /// Replay on the allowlisted file systems
    /// ([`FileSystem::changes_are_local_events`]); the default.
    Auto,
    /// Never replay: every listing reads the directory.
    Off,
    /// Replay only where the allowlist **and** this function accept the file system of
    /// `lease/epochs`: it can narrow the allowlist (tests of the fallback), never widen it.
    Only(fn(&FileSystem) -> bool),
}

/// What the cached listing of one [`RealFs`](crate::RealFs) has done so far
/// ([`RealFs::listing_cache_stats`](crate::RealFs::listing_cache_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListingCacheStats {
    /// Listings of `lease/epochs` that read the directory.
    pub listings: u64,
    /// Listings of `lease/epochs` answered by replaying the previous answer.
    pub replays: u64,
    /// Whether a watch on `lease/epochs` is in place now.
    pub watching: bool,
}

/// What one listing learnt of one entry.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    /// The name as listed (lossy UTF-8, as [`crate::fs::Fs::list_records`] passes it).
    pub(crate) name: String,
    /// What it was judged by.
    pub(crate) facts: Facts,
}

/// What a listing knows of an entry's kind and size.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Facts {
    /// Its kind (from `d_type`, or from the `fstatat`) and its size (from the `fstatat`;
    /// 0 for a non-file that `d_type` named, which is judged on its kind alone).
    Known(EntryKind, u64),
    /// Gone between the `getdents` and its `fstatat`: listed, unjudged.
    Vanished,
    /// Not judged (the listing's caller did not take it for a record): a replay for a
    /// caller that does lists again.
    Unjudged,
}

/// What a listing of the cached folder does.
pub(crate) enum Plan {
    /// Replay this answer (the queue was just found empty).
    Replay(Arc<[Entry]>),
    /// Read the directory, collecting its facts; `keep`: the watch is armed and the queue
    /// was drained just now, so the answer may be kept (unless a file's watch fails).
    Relist {
        /// Whether the answer may be kept.
        keep: bool,
    },
    /// Read the directory as without a cache (mode off, not allowlisted, no inotify, or
    /// the first listing of this adapter).
    Stream,
}

/// How a drain of the queue ended.
#[derive(PartialEq, Eq)]
enum Drained {
    /// Nothing was queued.
    Quiet,
    /// Something was (now read and dropped).
    Changed,
    /// A read failed other than with `EAGAIN`: the queue may still hold something.
    Failed,
}

/// The directory watch: its watch descriptor and the `(st_dev, st_ino)` of the directory.
#[derive(Clone, Copy)]
struct DirWatch {
    wd: i32,
    id: (u64, u64),
}

/// The cache state of one [`RealFs`](crate::RealFs) (under its mutex).
pub(crate) struct EpochsCache {
    mode: ListingCache,
    stats: ListingCacheStats,
    /// Created at the first arming; one per adapter at most.
    inotify: Option<OwnedFd>,
    /// `inotify_init1`/`inotify_add_watch` failed: list every time from now on.
    broken: bool,
    /// The watched directory, if armed.
    dir: Option<DirWatch>,
    /// The file system verdict, for the directory of this identity.
    verdict: Option<((u64, u64), bool)>,
    /// Watches on record files.
    files: HashSet<i32>,
    /// The answer of the last listing made while armed, if nothing was queued since.
    answer: Option<Arc<[Entry]>>,
}

/// The directory watch's mask (see the module docs). `IN_UNMOUNT` is reported whether
/// asked for or not; named for the reader.
fn dir_mask() -> WatchFlags {
    WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::from_bits_retain(ReadFlags::UNMOUNT.bits())
        | WatchFlags::ONLYDIR
}

/// A record file's watch mask: its size, kind or names changed. Never follows a symlink.
fn file_mask() -> WatchFlags {
    WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::DONT_FOLLOW
}

/// `/proc/self/fd/N` of `fd`, plus `/name` if given: the inode the descriptor names
/// (or its entry `name`), whatever paths name by now.
fn proc_path(fd: &OwnedFd, name: Option<&CStr>) -> std::ffi::OsString {
    let mut p = format!("/proc/self/fd/{}", fd.as_raw_fd()).into_bytes();
    if let Some(n) = name {
        p.push(b'/');
        p.extend_from_slice(n.to_bytes());
    }
    OsStr::from_bytes(&p).to_os_string()
}

impl EpochsCache {
    /// A cache in `mode`, nothing watched yet.
    pub(crate) fn new(mode: ListingCache) -> EpochsCache {
        EpochsCache {
            mode,
            stats: ListingCacheStats::default(),
            inotify: None,
            broken: false,
            dir: None,
            verdict: None,
            files: HashSet::new(),
            answer: None,
        }
    }

    /// The mode this cache was made in.
    pub(crate) fn mode(&self) -> ListingCache {
        self.mode
    }

    /// Its counters.
    pub(crate) fn stats(&self) -> ListingCacheStats {
        ListingCacheStats {
            watching: self.dir.is_some(),
            ..self.stats
        }
    }

    /// What to do for a listing of the directory `dfd` names, whose identity the caller has
    /// just re-validated against its path (`id`).
    pub(crate) fn plan(&mut self, dfd: &OwnedFd, id: (u64, u64)) -> Plan {
        if matches!(self.mode, ListingCache::Off) {
            self.stats.listings += 1;
            return Plan::Stream;
        }
        // A watch on another directory than the path names now: never replayed.
        if self.dir.is_some_and(|d| d.id != id) {
            self.unwatch();
        }
        if self.dir.is_some() {
            match self.drain() {
                Drained::Quiet => {
                    if let Some(a) = &self.answer {
                        return Plan::Replay(a.clone());
                    }
                }
                Drained::Changed => self.answer = None,
                Drained::Failed => {
                    self.answer = None;
                    self.stats.listings += 1;
                    return Plan::Relist { keep: false };
                }
            }
        }
        // Not armed (or its watch was removed, `IN_IGNORED`): arm it, from the second
        // listing on; the arming drains the queue.
        if self.dir.is_none() && !self.arm(dfd, id) {
            self.stats.listings += 1;
            return Plan::Stream;
        }
        self.stats.listings += 1;
        Plan::Relist { keep: true }
    }

    /// The replayed answer did not cover the caller (it takes a name for a record that
    /// the listing did not judge): list again (the queue was just drained, the watch stays).
    pub(crate) fn miss(&mut self) -> Plan {
        self.answer = None;
        self.stats.listings += 1;
        Plan::Relist { keep: true }
    }

    /// A replay was handed out.
    pub(crate) fn replayed(&mut self) {
        self.stats.replays += 1;
    }

    /// The directory `lease/epochs` is missing: nothing to watch, nothing to replay.
    pub(crate) fn missing(&mut self) {
        self.unwatch();
    }

    /// Watch the record file `name` of the directory `dfd` (before its `fstatat`).
    /// `false`: no watch (too many, or it failed): the listing must not be kept.
    pub(crate) fn watch_file(&mut self, dfd: &OwnedFd, name: &CStr) -> bool {
        let Some(fd) = &self.inotify else {
            return false;
        };
        if self.files.len() >= MAX_FILE_WATCHES {
            return false;
        }
        match inotify::add_watch(fd, proc_path(dfd, Some(name)), file_mask()) {
            Ok(wd) => {
                self.files.insert(wd);
                true
            }
            Err(_) => false,
        }
    }

    /// The answer of a listing just made under [`Plan::Relist`]: kept for replays when
    /// `keep` (the watch was armed before it and the queue drained, and every record file
    /// it measured is watched).
    pub(crate) fn listed(&mut self, entries: Vec<Entry>, keep: bool) -> Arc<[Entry]> {
        let entries: Arc<[Entry]> = entries.into();
        self.answer = (keep && self.dir.is_some()).then(|| entries.clone());
        entries
    }

    /// Whether this adapter may watch the directory `dfd` (identity `id`): from the second
    /// listing on, on an allowlisted file system, with inotify available. Adds the
    /// directory's watch and drains the queue; `false` leaves nothing armed.
    fn arm(&mut self, dfd: &OwnedFd, id: (u64, u64)) -> bool {
        // Lazily: a process that lists once never pays `inotify_init1`.
        if self.broken || self.stats.listings == 0 {
            return false;
        }
        let allowed = match self.verdict {
            Some((vid, v)) if vid == id => v,
            _ => {
                let v = FileSystem::of(dfd).is_ok_and(|f| {
                    f.changes_are_local_events()
                        && match self.mode {
                            ListingCache::Auto => true,
                            ListingCache::Off => false,
                            ListingCache::Only(accepts) => accepts(&f),
                        }
                });
                self.verdict = Some((id, v));
                v
            }
        };
        if !allowed {
            return false;
        }
        if self.inotify.is_none() {
            match inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC) {
                Ok(fd) => self.inotify = Some(fd),
                Err(_) => {
                    self.broken = true;
                    return false;
                }
            }
        }
        let Some(fd) = &self.inotify else {
            return false;
        };
        let proc = proc_path(dfd, None);
        let wd = match inotify::add_watch(fd, &proc, dir_mask()) {
            Ok(wd) => wd,
            Err(_) => {
                self.broken = true;
                return false;
            }
        };
        // The watch is on the inode `/proc/self/fd/N` names; it must be the descriptor's
        // directory (a `/proc` that is not procfs would name something else).
        #[allow(clippy::unnecessary_cast)]
        let same =
            rustix::fs::stat(&proc).is_ok_and(|st| (st.st_dev as u64, st.st_ino as u64) == id);
        if !same {
            let _ = inotify::remove_watch(fd, wd);
            self.broken = true;
            return false;
        }
        self.dir = Some(DirWatch { wd, id });
        self.answer = None;
        // Whatever was queued before the listing that follows is in that listing.
        if self.drain() == Drained::Failed {
            self.unwatch();
            return false;
        }
        // `IN_IGNORED` of this very watch in that drain (the directory went at once).
        self.dir.is_some()
    }

    /// Read the queue until `EAGAIN`, dropping what it held; removed watches
    /// (`IN_IGNORED`) are forgotten.
    fn drain(&mut self) -> Drained {
        let Some(fd) = &self.inotify else {
            return Drained::Quiet;
        };
        // Room for a few events with names (an event is 16 bytes plus its padded name).
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = inotify::Reader::new(fd, &mut buf);
        let mut changed = false;
        let mut ignored = Vec::new();
        let end = loop {
            match reader.next() {
                Ok(ev) => {
                    changed = true;
                    if ev.events().contains(ReadFlags::IGNORED) {
                        ignored.push(ev.wd());
                    }
                }
                Err(Errno::AGAIN) => {
                    break if changed {
                        Drained::Changed
                    } else {
                        Drained::Quiet
                    };
                }
                Err(Errno::INTR) => {}
                Err(_) => break Drained::Failed,
            }
        };
        for wd in ignored {
            if self.dir.is_some_and(|d| d.wd == wd) {
                self.dir = None;
            } else {
                self.files.remove(&wd);
            }
        }
        end
    }

    /// Remove every watch and the answer (the inotify descriptor stays for the next
    /// arming).
    fn unwatch(&mut self) {
        self.answer = None;
        if let Some(fd) = &self.inotify {
            for wd in self
                .dir
                .take()
                .map(|d| d.wd)
                .into_iter()
                .chain(self.files.drain())
            {
                // Already gone (the kernel removed it with its inode): nothing to do.
                let _ = inotify::remove_watch(fd, wd);
            }
        }
        self.dir = None;
        self.files.clear();
        // Events of the removed watches (their `IN_IGNORED`s) are drained at the next
        // arming, before its listing.
    }
}
