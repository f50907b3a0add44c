//! The [`Fs`] calls of a [`SimFs`], each one step of the crash model.

use super::{ENOSPC, Fs, Gate, Node, Op, SimFs, State, check_entry, err};
use crate::fs::{EntryKind, check_rel, join, judge_record, not_a_record};
use std::io;

/// The kind and size of node `id` (the simulated FS has only files and directories).
fn kind_and_size(st: &State, id: u64) -> (EntryKind, u64) {
    match st.node(id) {
        Node::Dir(_) => (EntryKind::Directory, 0),
        Node::File(f) => (EntryKind::File, f.live.len() as u64),
    }
}

impl Fs for SimFs {
    fn ensure_dir(&self, dir: &str) -> io::Result<bool> {
        self.lock().call(Op::Other, |st| st.ensure_dir(dir))
    }

    fn list(&self, dir: &str) -> io::Result<Vec<String>> {
        self.lock().call(Op::Other, |st| {
            check_rel(dir)?;
            Ok(match st.dir_id("list", dir)? {
                None => Vec::new(),
                Some(d) => st.dir(d).live.keys().cloned().collect(),
            })
        })
    }

    fn read(&self, path: &str, limit: usize) -> io::Result<Option<Vec<u8>>> {
        self.lock().call(Op::Other, |st| {
            check_rel(path)?;
            match st.lookup("read", path)? {
                None => Ok(None),
                // The one classification (a directory, or a file over the limit).
                Some(id) => match st.node(id) {
                    Node::File(f) => {
                        judge_record(path, EntryKind::File, f.live.len() as u64, limit)?;
                        Ok(Some(f.live.clone()))
                    }
                    Node::Dir(_) => Err(not_a_record(path, EntryKind::Directory, 0, limit)),
                },
            }
        })
    }

    fn exists(&self, path: &str) -> io::Result<bool> {
        self.lock().call(Op::Other, |st| {
            check_rel(path)?;
            Ok(st.lookup("exists", path)?.is_some())
        })
    }

    fn exists_record(&self, path: &str, limit: usize) -> io::Result<bool> {
        self.lock().call(Op::Other, |st| {
            check_rel(path)?;
            match st.lookup("exists", path)? {
                None => Ok(false),
                Some(id) => {
                    let (kind, size) = kind_and_size(st, id);
                    judge_record(path, kind, size, limit)?;
                    Ok(true)
                }
            }
        })
    }

    fn list_records(
        &self,
        dir: &str,
        limit: usize,
        is_record: &dyn Fn(&str) -> bool,
        each: &mut dyn FnMut(&str),
    ) -> io::Result<()> {
        // One call (one crash point), judged on the live state it lists.
        let names = self.lock().call(Op::Other, |st| {
            check_rel(dir)?;
            let Some(d) = st.dir_id("list", dir)? else {
                return Ok(Vec::new());
            };
            let mut names = Vec::new();
            for (name, &id) in &st.dir(d).live {
                if is_record(name) {
                    let (kind, size) = kind_and_size(st, id);
                    judge_record(&join(dir, name), kind, size, limit)?;
                }
                names.push(name.clone());
            }
            Ok(names)
        })?;
        for n in &names {
            each(n);
        }
        Ok(())
    }

    fn write_new(&self, path: &str, bytes: &[u8]) -> io::Result<()> {
        let mut st = self.lock();
        match st.gate(Op::Other)? {
            Gate::Go => st.create_file(path, bytes.to_vec()),
            Gate::Fault(errno) => {
                if errno == ENOSPC && st.enospc_leaves_empty_file {
                    // Whatever would have refused the create refuses the empty file too.
                    let _ = st.create_file(path, Vec::new());
                }
                Err(io::Error::from_raw_os_error(errno))
            }
            Gate::FaultAfterEffect(errno) => {
                st.create_file(path, bytes.to_vec())?;
                Err(io::Error::from_raw_os_error(errno))
            }
        }
    }

    fn fsync(&self, path: &str) -> io::Result<()> {
        self.lock().call(Op::Fsync, |st| {
            check_entry("fsync", path)?;
            let id = st.file_id("fsync", path, "is a directory (use fsync_dir)")?;
            let f = st.file_mut(id);
            f.durable = f.live.clone();
            f.synced = true;
            f.in_place = None;
            Ok(())
        })
    }

    fn write_at(&self, path: &str, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.lock().call(Op::Other, |st| {
            check_entry("write_at", path)?;
            let tick = st.tick;
            let id = st.file_id("write_at", path, "is a directory")?;
            let at = usize::try_from(offset)
                .map_err(|_| err(io::ErrorKind::InvalidInput, "write_at", path, "offset"))?;
            let f = st.file_mut(id);
            if f.live.len() < at + bytes.len() {
                f.live.resize(at + bytes.len(), 0);
            }
            f.live[at..at + bytes.len()].copy_from_slice(bytes);
            f.synced = false;
            f.written = tick;
            f.in_place = Some((at, bytes.len()));
            Ok(())
        })
    }

    fn sync_data(&self, path: &str) -> io::Result<()> {
        self.fsync(path)
    }

    fn loses_unsynced_writes(&self) -> bool {
        self.lock().loses_unsynced_writes
    }

    fn fsync_dir(&self, dir: &str) -> io::Result<()> {
        self.lock().call(Op::FsyncDir, |st| {
            check_rel(dir)?;
            match st.lookup("fsync_dir", dir)? {
                None => Err(err(io::ErrorKind::NotFound, "fsync_dir", dir, "not found")),
                Some(id) if !st.is_dir(id) => Err(err(
                    io::ErrorKind::NotADirectory,
                    "fsync_dir",
                    dir,
                    "not a directory",
                )),
                Some(id) => {
                    let d = st.dir_mut(id);
                    d.durable = d.live.clone();
                    st.gc();
                    Ok(())
                }
            }
        })
    }

    fn link(&self, from: &str, to: &str) -> io::Result<()> {
        self.lock().call(Op::Other, |st| {
            check_entry("link", from)?;
            check_entry("link", to)?;
            let id = match st.lookup("link", from)? {
                None => return Err(err(io::ErrorKind::NotFound, "link", from, "not found")),
                // As link(2): EPERM, not EISDIR.
                Some(id) if st.is_dir(id) => {
                    return Err(err(
                        io::ErrorKind::PermissionDenied,
                        "link",
                        from,
                        "cannot link a directory",
                    ));
                }
                Some(id) => id,
            };
            let (d, name) = st.parent("link", to)?;
            st.check_free("link", to, d, name)?;
            st.dir_mut(d).live.insert(name.to_string(), id);
            Ok(())
        })
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        self.lock().call(Op::Other, |st| {
            check_entry("rename", from)?;
            check_entry("rename", to)?;
            let (fd, fname) = st.parent("rename", from)?;
            let id = match st.dir(fd).live.get(fname) {
                None => return Err(err(io::ErrorKind::NotFound, "rename", from, "not found")),
                Some(&id) if st.is_dir(id) => {
                    return Err(err(
                        io::ErrorKind::Unsupported,
                        "rename",
                        from,
                        "the simulated FS does not rename directories",
                    ));
                }
                Some(&id) => id,
            };
            let (td, tname) = st.parent("rename", to)?;
            match st.dir(td).live.get(tname) {
                Some(&old) if st.is_dir(old) => {
                    return Err(err(
                        io::ErrorKind::IsADirectory,
                        "rename",
                        to,
                        "is a directory",
                    ));
                }
                // POSIX: two links of the same file: do nothing, succeed.
                Some(&old) if old == id => return Ok(()),
                _ => {}
            }
            st.dir_mut(fd).live.remove(fname);
            st.dir_mut(td).live.insert(tname.to_string(), id);
            if st.renames_outrun_data {
                st.dir_mut(fd).durable.remove(fname);
                st.dir_mut(td).durable.insert(tname.to_string(), id);
            }
            st.gc();
            Ok(())
        })
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        self.lock().call(Op::Other, |st| {
            check_entry("unlink", path)?;
            st.file_id("unlink", path, "is a directory")?;
            let (d, name) = st.parent("unlink", path)?;
            st.dir_mut(d).live.remove(name);
            st.gc();
            Ok(())
        })
    }

    fn link_count(&self, path: &str) -> io::Result<Option<u64>> {
        self.lock().call(Op::Other, |st| {
            check_rel(path)?;
            Ok(st.lookup("link_count", path)?.map(|id| match st.node(id) {
                // POSIX: `.`, the entry in the parent, and each subdirectory's `..`.
                Node::Dir(d) => 2 + d.live.values().filter(|&&c| st.is_dir(c)).count() as u64,
                Node::File(_) => st.live_link_count(id),
            }))
        })
    }

    fn entry_info(&self, path: &str) -> io::Result<Option<crate::fs::EntryInfo>> {
        // The simulated disk has only directories and regular files, all of this process.
        self.lock().call(Op::Other, |st| {
            check_rel(path)?;
            Ok(st.lookup("entry_info", path)?.map(|id| match st.node(id) {
                Node::Dir(_) => crate::fs::EntryInfo {
                    regular: false,
                    ours: true,
                    age_secs: 0,
                },
                Node::File(f) => crate::fs::EntryInfo {
                    regular: true,
                    ours: true,
                    age_secs: f.age,
                },
            }))
        })
    }

    fn age_secs(&self, path: &str) -> io::Result<Option<u64>> {
        self.lock().call(Op::Other, |st| {
            check_rel(path)?;
            Ok(st.lookup("age_secs", path)?.map(|id| match st.node(id) {
                Node::Dir(_) => 0,
                Node::File(f) => f.age,
            }))
        })
    }

    fn check_root(&self) -> io::Result<()> {
        self.lock().call(Op::Other, |st| {
            if st.root_replaced {
                Err(io::Error::other(
                    "simfs: the run root was replaced (set_root_replaced)",
                ))
            } else {
                Ok(())
            }
        })
    }
}
