//! Listing a directory's records: read from the directory, or for `lease/epochs` replayed
//! from the inotify-guarded cache ([`crate::listing`]).

use std::ffi::CStr;
use std::io;

use rustix::fd::OwnedFd;
use rustix::fs::{self as rfs, AtFlags, Dir};
use rustix::io::Errno;

use super::RealFs;
use super::sys::{judge_stat, kind_of, kind_of_stat, retry, size_of};
use crate::fs::{EntryKind, join, judge_record};
use crate::listing::{CACHED_DIR, Entry, Facts, Plan};
use std::sync::Arc;

impl RealFs {
    /// Call `f` with the folder's descriptor, each entry of directory `dir` (`.` and `..`
    /// left out) and its name; a missing folder has none ([`each_entry_in`]).
    pub(super) fn each_entry(
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
    pub(super) fn list_records_in(
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
    pub(super) fn collect_records_in(
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

    /// How [`Fs::list_records`](crate::fs::Fs::list_records) of `dir` is answered: read
    /// from the directory, or for `lease/epochs` replayed from the cache while its watch has
    /// queued nothing, else read (and kept when the watch allows) ([`crate::listing`]).
    /// The descriptors are re-validated against their paths and trusted first, every time.
    pub(super) fn listing(
        &self,
        dir: &str,
        is_record: &dyn Fn(&str) -> bool,
    ) -> io::Result<Listing> {
        if dir != CACHED_DIR {
            return Ok(match self.dir_fd_opt(dir, dir)? {
                Some(dfd) => Listing::Read(dfd),
                None => Listing::Missing,
            });
        }
        let (dfd, id) = match self.dir_fd_id(dir, dir) {
            Ok(found) => found,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.lock_epochs().missing();
                return Ok(Listing::Missing);
            }
            Err(e) => return Err(e),
        };
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
        Ok(match plan {
            Plan::Replay(entries) => Listing::Replay(entries),
            Plan::Relist { keep } => {
                // Held across the listing: an event drained by a concurrent listing
                // after this one began must not be lost under this one's answer.
                let mut watched = keep;
                let entries = self.collect_records_in(&dfd, dir, is_record, &mut |name| {
                    watched = watched && cache.watch_file(&dfd, name);
                })?;
                Listing::Replay(cache.listed(entries, watched))
            }
            // Read with the cache unlocked (it is released on return).
            Plan::Stream => Listing::Read(dfd),
        })
    }
}

/// How a listing of records is answered ([`RealFs::listing`]).
pub(super) enum Listing {
    /// The folder is missing: no entries.
    Missing,
    /// Read from the folder, this descriptor ([`RealFs::list_records_in`]).
    Read(Arc<OwnedFd>),
    /// The entries and their facts, from the cache (replayed, or just read into it).
    Replay(Arc<[Entry]>),
}

/// Call `f` with `dfd`, each entry of the directory `dfd` names (`.` and `..` left out)
/// and its name, read through a fresh open file description (`openat(dfd, ".")`), so
/// concurrent listings do not share a directory offset with each other or with `dfd`.
/// Names this crate writes are ASCII; a stray non-UTF-8 name is passed lossily (callers
/// ignore names they do not parse).
pub(super) fn each_entry_in(
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
