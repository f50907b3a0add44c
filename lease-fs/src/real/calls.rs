//! [`Fs`] for [`RealFs`](super::RealFs): each call of the seam as `*at` system calls beneath
//! the held root.

use std::io::{self, Read};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::records::Listing;
use super::sys::{
    DIR_MODE, FILE_MODE, dir_flags, errno_msg, id_of, judge_stat, nlink_of, perm_of, read_flags,
    retry, size_of, type_of,
};
use super::{RealFs, check_trusted, euid};
use crate::fs::{EntryKind, Fs, check_rel, join, judge_record};
use crate::listing::Facts;

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
            cur = self.cache_dir(prefix.clone(), fd, &st);
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
        match self.listing(dir, is_record)? {
            Listing::Missing => Ok(()),
            Listing::Read(dfd) => self.list_records_in(&dfd, dir, limit, is_record, each),
            // Judged again from the cached facts, with the cache unlocked.
            Listing::Replay(entries) => {
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
        }
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
        let [(ffd, fleaf), (tfd, tleaf)] = self.both_ends(from, to)?;
        // No AT_SYMLINK_FOLLOW: a symlink would be linked itself, never its target.
        retry(|| rfs::linkat(&*ffd, fleaf, &*tfd, tleaf, AtFlags::empty()))?;
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let [(ffd, fleaf), (tfd, tleaf)] = self.both_ends(from, to)?;
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
            Err(e) => Err(errno_msg(e, format!("run root {root} cannot be checked"))),
        }
    }
}
