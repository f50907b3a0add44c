//! The crash model's state machine: counting and gating calls, the tree's lookups, the
//! effects shared by several calls, snapshots, garbage collection and the crash itself.

use super::{
    Counters, DirNode, FileNode, GC_MIN, Gate, Node, Op, ROOT, SimulatedCrash, State, check_entry,
    err,
};
use crate::fs::{check_rel, split};
use std::collections::{BTreeMap, BTreeSet};
use std::io;

impl State {
    pub(super) fn new() -> State {
        let mut nodes = BTreeMap::new();
        nodes.insert(ROOT, Node::Dir(DirNode::default()));
        State {
            nodes,
            next_id: ROOT + 1,
            tick: 0,
            counters: Counters::default(),
            crash_at: None,
            down: false,
            faults: BTreeMap::new(),
            enospc_leaves_empty_file: false,
            renames_outrun_data: false,
            tear: (1, 2),
            root_replaced: false,
            gc_at: GC_MIN,
            loses_unsynced_writes: false,
        }
    }

    /// Count one call and decide whether it runs, crashes or fails.
    pub(super) fn gate(&mut self, op: Op) -> io::Result<Gate> {
        self.tick += 1;
        self.counters.calls += 1;
        match op {
            Op::Fsync => self.counters.fsync += 1,
            Op::FsyncDir => self.counters.fsync_dir += 1,
            Op::Other => {}
        }
        if self.down || self.crash_at.is_some_and(|at| self.tick >= at) {
            self.down = true;
            return Err(io::Error::other(SimulatedCrash));
        }
        Ok(match self.faults.remove(&self.tick) {
            None => Gate::Go,
            Some((errno, false)) => Gate::Fault(errno),
            Some((errno, true)) => Gate::FaultAfterEffect(errno),
        })
    }

    /// Run one call: gate it, apply `f` unless a fault prevents it.
    pub(super) fn call<T>(
        &mut self,
        op: Op,
        f: impl FnOnce(&mut State) -> io::Result<T>,
    ) -> io::Result<T> {
        match self.gate(op)? {
            Gate::Go => f(self),
            Gate::Fault(errno) => Err(io::Error::from_raw_os_error(errno)),
            Gate::FaultAfterEffect(errno) => {
                f(self)?;
                Err(io::Error::from_raw_os_error(errno))
            }
        }
    }

    pub(super) fn node(&self, id: u64) -> &Node {
        match self.nodes.get(&id) {
            Some(n) => n,
            None => panic!("simfs invariant: inode {id} is missing"),
        }
    }

    pub(super) fn dir(&self, id: u64) -> &DirNode {
        match self.nodes.get(&id) {
            Some(Node::Dir(d)) => d,
            _ => panic!("simfs invariant: inode {id} is not a directory"),
        }
    }

    pub(super) fn dir_mut(&mut self, id: u64) -> &mut DirNode {
        match self.nodes.get_mut(&id) {
            Some(Node::Dir(d)) => d,
            _ => panic!("simfs invariant: inode {id} is not a directory"),
        }
    }

    pub(super) fn file_mut(&mut self, id: u64) -> &mut FileNode {
        match self.nodes.get_mut(&id) {
            Some(Node::File(f)) => f,
            _ => panic!("simfs invariant: inode {id} is not a file"),
        }
    }

    pub(super) fn is_dir(&self, id: u64) -> bool {
        matches!(self.node(id), Node::Dir(_))
    }

    pub(super) fn add(&mut self, node: Node) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.nodes.insert(id, node);
        id
    }

    /// The live directory `dir`: `None` if a component is missing, `NotADirectory` if one
    /// is a file.
    pub(super) fn dir_id(&self, op: &str, dir: &str) -> io::Result<Option<u64>> {
        let mut cur = ROOT;
        if dir.is_empty() {
            return Ok(Some(cur));
        }
        for comp in dir.split('/') {
            match self.dir(cur).live.get(comp) {
                None => return Ok(None),
                Some(&id) if self.is_dir(id) => cur = id,
                Some(_) => return Err(not_a_dir_component(op, dir)),
            }
        }
        Ok(Some(cur))
    }

    /// The live inode at `path` (`""` is the root), `None` if missing.
    pub(super) fn lookup(&self, op: &str, path: &str) -> io::Result<Option<u64>> {
        if path.is_empty() {
            return Ok(Some(ROOT));
        }
        let (dir, name) = split(path);
        Ok(self
            .dir_id(op, dir)?
            .and_then(|d| self.dir(d).live.get(name).copied()))
    }

    /// The existing parent directory of `path` and the entry name.
    pub(super) fn parent<'p>(&self, op: &str, path: &'p str) -> io::Result<(u64, &'p str)> {
        let (dir, name) = split(path);
        match self.dir_id(op, dir)? {
            Some(d) => Ok((d, name)),
            None => Err(err(
                io::ErrorKind::NotFound,
                op,
                path,
                "parent directory does not exist",
            )),
        }
    }

    /// The live inode of the file at `path`: `NotFound` if missing, `IsADirectory` with
    /// `dir_detail` if it is a directory.
    pub(super) fn file_id(&self, op: &str, path: &str, dir_detail: &str) -> io::Result<u64> {
        match self.lookup(op, path)? {
            None => Err(err(io::ErrorKind::NotFound, op, path, "not found")),
            Some(id) if self.is_dir(id) => {
                Err(err(io::ErrorKind::IsADirectory, op, path, dir_detail))
            }
            Some(id) => Ok(id),
        }
    }

    /// `AlreadyExists` (naming `path`) if directory `d` has a live entry `name`.
    pub(super) fn check_free(&self, op: &str, path: &str, d: u64, name: &str) -> io::Result<()> {
        if self.dir(d).live.contains_key(name) {
            return Err(err(
                io::ErrorKind::AlreadyExists,
                op,
                path,
                "already exists",
            ));
        }
        Ok(())
    }

    pub(super) fn create_file(&mut self, path: &str, bytes: Vec<u8>) -> io::Result<()> {
        check_entry("write_new", path)?;
        let (d, name) = self.parent("write_new", path)?;
        self.check_free("write_new", path, d, name)?;
        let id = self.add(Node::File(FileNode {
            live: bytes,
            durable: Vec::new(),
            synced: false,
            written: self.tick,
            age: 0,
            in_place: None,
        }));
        self.dir_mut(d).live.insert(name.to_string(), id);
        Ok(())
    }

    /// Visit every file reachable from `dir` through live or durable entries.
    pub(super) fn walk(
        &self,
        durable: bool,
        dir: u64,
        prefix: &str,
        out: &mut dyn FnMut(&str, u64),
    ) {
        let d = self.dir(dir);
        let entries = if durable { &d.durable } else { &d.live };
        for (name, &id) in entries {
            let path = crate::fs::join(prefix, name);
            if self.is_dir(id) {
                self.walk(durable, id, &path, out);
            } else {
                out(&path, id);
            }
        }
    }

    pub(super) fn snapshot(&self, durable: bool) -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        self.walk(durable, ROOT, "", &mut |path, id| {
            if let Node::File(f) = self.node(id) {
                let data = if durable { &f.durable } else { &f.live };
                out.insert(path.to_string(), data.clone());
            }
        });
        out
    }

    /// Inodes reachable from the root through live entries, and through durable ones too
    /// when `with_durable`.
    pub(super) fn reachable(&self, with_durable: bool) -> BTreeSet<u64> {
        let mut seen = BTreeSet::from([ROOT]);
        let mut todo = vec![ROOT];
        while let Some(id) = todo.pop() {
            let d = self.dir(id);
            let durable = d.durable.values().filter(|_| with_durable);
            for &child in d.live.values().chain(durable) {
                if seen.insert(child) && self.is_dir(child) {
                    todo.push(child);
                }
            }
        }
        seen
    }

    /// Forget inodes that neither the live nor the durable state names any more. Such
    /// inodes are unobservable (every lookup goes through entries, and a crash collects
    /// before it picks the torn file), so collecting is amortized: only once the table has
    /// doubled since the last collection.
    pub(super) fn gc(&mut self) {
        if self.nodes.len() < self.gc_at {
            return;
        }
        let keep = self.reachable(true);
        self.nodes.retain(|id, _| keep.contains(id));
        self.gc_at = GC_MIN.max(2 * self.nodes.len());
    }

    pub(super) fn live_link_count(&self, target: u64) -> u64 {
        let mut count = 0;
        let mut todo = vec![ROOT];
        while let Some(id) = todo.pop() {
            for &child in self.dir(id).live.values() {
                if child == target {
                    count += 1;
                }
                if self.is_dir(child) {
                    todo.push(child);
                }
            }
        }
        count
    }

    pub(super) fn crash(&mut self, tear: bool) {
        for node in self.nodes.values_mut() {
            if let Node::Dir(d) = node {
                d.live = d.durable.clone();
            }
        }
        let keep = self.reachable(false);
        self.nodes.retain(|id, _| keep.contains(id));
        let torn = if tear {
            self.nodes
                .iter()
                .filter_map(|(&id, n)| match n {
                    Node::File(f) if !f.synced => Some((f.written, id)),
                    _ => None,
                })
                .max()
                .map(|(_, id)| id)
        } else {
            None
        };
        let (num, den) = self.tear;
        for (&id, node) in &mut self.nodes {
            if let Node::File(f) = node {
                if torn == Some(id) {
                    match f.in_place {
                        None => {
                            let keep =
                                u128::from(f.live.len() as u64) * u128::from(num) / u128::from(den);
                            f.live.truncate(keep as usize);
                        }
                        Some((at, len)) => {
                            // An in-place write torn: its first part reached the disk
                            // over the durable bytes, nothing else did.
                            let keep = (u128::from(len as u64) * u128::from(num) / u128::from(den))
                                as usize;
                            let mut out = f.durable.clone();
                            if out.len() < at + keep {
                                out.resize(at + keep, 0);
                            }
                            out[at..at + keep].copy_from_slice(&f.live[at..at + keep]);
                            f.live = out;
                        }
                    }
                } else {
                    f.live = f.durable.clone();
                }
                f.durable = f.live.clone();
                f.synced = true;
                f.in_place = None;
            }
        }
    }

    pub(super) fn ensure_dir(&mut self, dir: &str) -> io::Result<bool> {
        check_rel(dir)?;
        if dir.is_empty() {
            return Ok(false);
        }
        // Check the whole path first, so a file in the way leaves nothing behind.
        let comps: Vec<&str> = dir.split('/').collect();
        let mut cur = ROOT;
        let mut existing = 0;
        for comp in &comps {
            match self.dir(cur).live.get(*comp) {
                None => break,
                Some(&id) if self.is_dir(id) => {
                    cur = id;
                    existing += 1;
                }
                Some(_) => return Err(not_a_dir_component("ensure_dir", dir)),
            }
        }
        for comp in &comps[existing..] {
            let id = self.add(Node::Dir(DirNode::default()));
            let parent = self.dir_mut(cur);
            parent.live.insert((*comp).to_string(), id);
            parent.durable = parent.live.clone();
            self.counters.ensure_dir_syncs += 1;
            cur = id;
        }
        Ok(existing < comps.len())
    }

    pub(super) fn put(&mut self, path: &str, bytes: &[u8]) -> io::Result<()> {
        check_entry("put", path)?;
        let (dir, name) = split(path);
        let mut cur = ROOT;
        if !dir.is_empty() {
            for comp in dir.split('/') {
                let next = match self.dir(cur).live.get(comp) {
                    Some(&id) if self.is_dir(id) => id,
                    Some(_) => return Err(not_a_dir_component("put", path)),
                    None => self.add(Node::Dir(DirNode::default())),
                };
                let parent = self.dir_mut(cur);
                parent.live.insert(comp.to_string(), next);
                parent.durable.insert(comp.to_string(), next);
                cur = next;
            }
        }
        let id = match self.dir(cur).live.get(name) {
            Some(&id) if self.is_dir(id) => {
                return Err(err(
                    io::ErrorKind::IsADirectory,
                    "put",
                    path,
                    "is a directory",
                ));
            }
            Some(&id) => {
                let f = self.file_mut(id);
                f.live = bytes.to_vec();
                f.durable = bytes.to_vec();
                f.synced = true;
                id
            }
            None => self.add(Node::File(FileNode {
                live: bytes.to_vec(),
                durable: bytes.to_vec(),
                synced: true,
                written: 0,
                age: 0,
                in_place: None,
            })),
        };
        let parent = self.dir_mut(cur);
        parent.live.insert(name.to_string(), id);
        parent.durable.insert(name.to_string(), id);
        self.gc();
        Ok(())
    }
}

/// The `NotADirectory` error of a path (`path`) one of whose components is a file.
fn not_a_dir_component(op: &str, path: &str) -> io::Error {
    err(
        io::ErrorKind::NotADirectory,
        op,
        path,
        "a component is not a directory",
    )
}
