//! A simulated, in-memory [`Fs`] that can lose power between any two system calls.
//!
//! [`SimFs`] runs the *same* primitive code as the real disk, and lets a test crash it after
//! any call, drop what was not fsynced, tear the last unsynced write, or fail the N-th call
//! with an errno. It is the executable form of the trust model of `docs/PROTOCOL.md` §1
//! (A1–A4): the crash-safety claims of the primitives and the store are tested against it.
//!
//! # The crash model
//!
//! **State.** A tree of directories and file inodes. The root directory always exists,
//! durably.
//!
//! - Every **directory** has *live* entries (name → inode, what calls see now) and *durable*
//!   entries (what survives a crash).
//! - Every **file inode** has *live* data and *durable* data. Its link count is the number
//!   of live entries that name it.
//!
//! **Calls** (one [`Fs`] call = one step = one crash point; a call is atomic):
//!
//! - `write_new(path, bytes)`: `AlreadyExists` if the name exists, `NotFound` if the parent
//!   directory does not; otherwise a new inode with live data `bytes`, durable data empty,
//!   and a new live entry. Nothing of it is durable yet.
//! - `fsync(path)`: the inode's durable data := its live data (A1).
//! - `fsync_dir(dir)`: the directory's durable entries := its live entries, all of them,
//!   removals and renames included (A2). A durable entry naming a subdirectory makes that
//!   subdirectory reachable after a crash.
//! - `link(from, to)`: `AlreadyExists` if `to` exists (A4); a new live entry for the same
//!   inode. `rename(from, to)`: moves the live entry at once, replacing `to` (A4).
//!   `unlink(path)`: removes the live entry (`NotFound` if absent).
//! - `ensure_dir(dir)`: creates every missing directory and, as the real adapter does,
//!   fsyncs the parent of each one it creates, so created directories are durable (the
//!   parent fsync also makes durable every other pending entry change of that parent, as
//!   A2 says). A file in the way is a `NotADirectory` error.
//! - `read`, `exists`, `list`, `link_count`, `age_secs`, `check_root` see the live state.
//!
//! **Crash** ([`SimFs::crash`], power loss): every directory's entries := its durable
//! entries; only directories reachable from the root through durable entries survive, and
//! inodes no longer named by any surviving entry disappear. Every surviving file's data :=
//! its durable data, so a file whose entry was fsynced but whose data was not comes back
//! **empty**. With `tear = true`, one file is **torn** instead (A3): among the surviving
//! files whose data was never fsynced, the one created by the most recent `write_new` keeps
//! the first `len * num / den` bytes of its live data (`1/2` by default, see
//! [`SimFs::set_tear_fraction`]). After a crash the live and durable states are equal.
//! A process crash (no power loss) is simply stopping: [`SimFs::resume`] without `crash`.
//!
//! **Crash points.** [`SimFs::crash_after`]`(n)`: the next `n` calls run normally; the one
//! after them and every later call return `Err` (kind `Other`, message `simulated crash`,
//! see [`is_simulated_crash`]) **without effect**, until [`SimFs::crash`] +
//! [`SimFs::resume`] (or [`SimFs::recover`], which does both). Every trait call counts as
//! one step, reads included, whether it succeeds or not. [`SimFs::calls`] says how many
//! calls were made, so a test first runs an operation to learn its call count `N`, then
//! reruns it on a fresh `SimFs` with `crash_after(k)` for every `k` in `0..N`.
//!
//! **Faults.** [`SimFs::fail_nth`]`(n, errno)`: the `n`-th call from now (`1` = the next
//! one) fails with `io::Error::from_raw_os_error(errno)` and has no effect; later calls work.
//! Optionally, a `write_new` failing with `ENOSPC` leaves an empty file behind
//! ([`SimFs::set_enospc_leaves_empty_file`]). [`SimFs::fail_nth_after_effect`] models an
//! ambiguous failure instead (the call takes effect, then reports the error, like a
//! retransmitted NFS `link`).
//!
//! **Not modelled.** Symlinks (there are none), permissions and modes, file handles
//! (`write_new` writes and closes in one call), clocks (ages are fixed by
//! [`SimFs::set_age`], `0` by default), renaming or linking directories (refused: the
//! protocol never does it), and crashes *inside* one call (each call is atomic; the real
//! adapter's sub-steps, such as the several `mkdir` + `fsync` of one `ensure_dir`, are one
//! step here). Power loss never loses an fsynced directory entry or fsynced data, and an
//! unsynced write never survives partially except through the one torn file.
//!
//! ```
//! use lease_fs::fs::Fs;
//! use lease_fs::sim::SimFs;
//!
//! let fs = SimFs::new();
//! fs.write_new("a", b"hello")?;
//! fs.fsync_dir("")?; // the entry is durable, the data is not
//! fs.recover(false); // power loss
//! assert_eq!(fs.read("a", 100)?, Some(Vec::new()));
//! # Ok::<(), std::io::Error>(())
//! ```

use crate::fs::{Fs, check_rel, split};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

/// `EIO` (5): a convenient errno for [`SimFs::fail_nth`].
pub const EIO: i32 = 5;
/// `ENOSPC` (28 on Linux and macOS): a convenient errno for [`SimFs::fail_nth`].
pub const ENOSPC: i32 = 28;

const ROOT: u64 = 0;
/// Smallest inode-table size at which garbage is collected.
const GC_MIN: usize = 64;

/// The payload of the error every call returns once a crash point is reached.
#[derive(Debug)]
pub(crate) struct SimulatedCrash;

impl fmt::Display for SimulatedCrash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("simulated crash")
    }
}

impl std::error::Error for SimulatedCrash {}

/// Whether `err` is the error a [`SimFs`] returns after its crash point (see
/// [`SimFs::crash_after`]), as opposed to an injected fault or a real failure.
pub fn is_simulated_crash(err: &io::Error) -> bool {
    err.get_ref()
        .is_some_and(|e| e.downcast_ref::<SimulatedCrash>().is_some())
}

/// Call counters of a [`SimFs`], for asserting the number of system calls and fsyncs of
/// an operation. Every call counts when it is made, whether it succeeds or fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Trait calls made (every method of [`Fs`], reads included).
    pub calls: u64,
    /// `fsync` calls made.
    pub fsync: u64,
    /// `fsync_dir` calls made.
    pub fsync_dir: u64,
    /// Directory fsyncs done inside `ensure_dir` (one per directory it created).
    pub ensure_dir_syncs: u64,
}

impl Counters {
    /// All fsyncs: `fsync` + `fsync_dir` + the ones inside `ensure_dir` (the count
    /// `docs/PROTOCOL.md` §5.2 and §7.13 give per operation).
    pub fn total_fsyncs(&self) -> u64 {
        self.fsync + self.fsync_dir + self.ensure_dir_syncs
    }
}

#[derive(Debug, Default, Clone)]
struct DirNode {
    live: BTreeMap<String, u64>,
    durable: BTreeMap<String, u64>,
}

#[derive(Debug, Clone)]
struct FileNode {
    live: Vec<u8>,
    durable: Vec<u8>,
    /// Whether `durable` holds the full written data (false from `write_new` to `fsync`).
    synced: bool,
    /// Step number of the `write_new` that created it (picks the torn file).
    written: u64,
    /// Fake age in seconds reported by `age_secs`.
    age: u64,
}

#[derive(Debug, Clone)]
enum Node {
    Dir(DirNode),
    File(FileNode),
}

/// What the gate decided for one call.
enum Gate {
    Go,
    Fault(i32),
    FaultAfterEffect(i32),
}

/// Which counter a call bumps besides `calls`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Fsync,
    FsyncDir,
    Other,
}

#[derive(Debug, Clone)]
struct State {
    nodes: BTreeMap<u64, Node>,
    next_id: u64,
    /// Steps made since creation (never reset; crash points and faults refer to it).
    tick: u64,
    counters: Counters,
    /// Step number of the first call that hits the crash point.
    crash_at: Option<u64>,
    /// A crash point was reached: every call fails until `resume`.
    down: bool,
    /// Step number → (errno, whether the call takes effect first).
    faults: BTreeMap<u64, (i32, bool)>,
    enospc_leaves_empty_file: bool,
    tear: (u64, u64),
    root_replaced: bool,
    /// Collect garbage once the inode table grows past this size (amortized GC).
    gc_at: usize,
}

fn err(kind: io::ErrorKind, op: &str, path: &str, what: &str) -> io::Error {
    io::Error::new(kind, format!("simfs {op} {path:?}: {what}"))
}

/// A path naming an entry: well-formed and not the root.
fn check_entry(op: &str, path: &str) -> io::Result<()> {
    check_rel(path)?;
    if path.is_empty() {
        return Err(err(
            io::ErrorKind::InvalidInput,
            op,
            path,
            "empty path names no entry",
        ));
    }
    Ok(())
}

impl State {
    fn new() -> State {
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
            tear: (1, 2),
            root_replaced: false,
            gc_at: GC_MIN,
        }
    }

    /// Count one call and decide whether it runs, crashes or fails.
    fn gate(&mut self, op: Op) -> io::Result<Gate> {
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
    fn call<T>(&mut self, op: Op, f: impl FnOnce(&mut State) -> io::Result<T>) -> io::Result<T> {
        match self.gate(op)? {
            Gate::Go => f(self),
            Gate::Fault(errno) => Err(io::Error::from_raw_os_error(errno)),
            Gate::FaultAfterEffect(errno) => {
                f(self)?;
                Err(io::Error::from_raw_os_error(errno))
            }
        }
    }

    fn node(&self, id: u64) -> &Node {
        match self.nodes.get(&id) {
            Some(n) => n,
            None => panic!("simfs invariant: inode {id} is missing"),
        }
    }

    fn dir(&self, id: u64) -> &DirNode {
        match self.nodes.get(&id) {
            Some(Node::Dir(d)) => d,
            _ => panic!("simfs invariant: inode {id} is not a directory"),
        }
    }

    fn dir_mut(&mut self, id: u64) -> &mut DirNode {
        match self.nodes.get_mut(&id) {
            Some(Node::Dir(d)) => d,
            _ => panic!("simfs invariant: inode {id} is not a directory"),
        }
    }

    fn file_mut(&mut self, id: u64) -> &mut FileNode {
        match self.nodes.get_mut(&id) {
            Some(Node::File(f)) => f,
            _ => panic!("simfs invariant: inode {id} is not a file"),
        }
    }

    fn is_dir(&self, id: u64) -> bool {
        matches!(self.node(id), Node::Dir(_))
    }

    fn add(&mut self, node: Node) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.nodes.insert(id, node);
        id
    }

    /// The live directory `dir`: `None` if a component is missing, `NotADirectory` if one
    /// is a file.
    fn dir_id(&self, op: &str, dir: &str) -> io::Result<Option<u64>> {
        let mut cur = ROOT;
        if dir.is_empty() {
            return Ok(Some(cur));
        }
        for comp in dir.split('/') {
            match self.dir(cur).live.get(comp) {
                None => return Ok(None),
                Some(&id) if self.is_dir(id) => cur = id,
                Some(_) => {
                    return Err(err(
                        io::ErrorKind::NotADirectory,
                        op,
                        dir,
                        "a component is not a directory",
                    ));
                }
            }
        }
        Ok(Some(cur))
    }

    /// The live inode at `path` (`""` is the root), `None` if missing.
    fn lookup(&self, op: &str, path: &str) -> io::Result<Option<u64>> {
        if path.is_empty() {
            return Ok(Some(ROOT));
        }
        let (dir, name) = split(path);
        Ok(self
            .dir_id(op, dir)?
            .and_then(|d| self.dir(d).live.get(name).copied()))
    }

    /// The existing parent directory of `path` and the entry name.
    fn parent<'p>(&self, op: &str, path: &'p str) -> io::Result<(u64, &'p str)> {
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

    fn create_file(&mut self, path: &str, bytes: Vec<u8>) -> io::Result<()> {
        check_entry("write_new", path)?;
        let (d, name) = self.parent("write_new", path)?;
        if self.dir(d).live.contains_key(name) {
            return Err(err(
                io::ErrorKind::AlreadyExists,
                "write_new",
                path,
                "already exists",
            ));
        }
        let id = self.add(Node::File(FileNode {
            live: bytes,
            durable: Vec::new(),
            synced: false,
            written: self.tick,
            age: 0,
        }));
        self.dir_mut(d).live.insert(name.to_string(), id);
        Ok(())
    }

    /// Visit every file reachable from `dir` through live or durable entries.
    fn walk(&self, durable: bool, dir: u64, prefix: &str, out: &mut dyn FnMut(&str, u64)) {
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

    fn snapshot(&self, durable: bool) -> BTreeMap<String, Vec<u8>> {
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
    fn reachable(&self, with_durable: bool) -> BTreeSet<u64> {
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
    fn gc(&mut self) {
        if self.nodes.len() < self.gc_at {
            return;
        }
        let keep = self.reachable(true);
        self.nodes.retain(|id, _| keep.contains(id));
        self.gc_at = GC_MIN.max(2 * self.nodes.len());
    }

    fn live_link_count(&self, target: u64) -> u64 {
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

    fn crash(&mut self, tear: bool) {
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
                    let keep = u128::from(f.live.len() as u64) * u128::from(num) / u128::from(den);
                    f.live.truncate(keep as usize);
                } else {
                    f.live = f.durable.clone();
                }
                f.durable = f.live.clone();
                f.synced = true;
            }
        }
    }

    fn ensure_dir(&mut self, dir: &str) -> io::Result<bool> {
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
                Some(_) => {
                    return Err(err(
                        io::ErrorKind::NotADirectory,
                        "ensure_dir",
                        dir,
                        "a component is not a directory",
                    ));
                }
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

    fn put(&mut self, path: &str, bytes: &[u8]) -> io::Result<()> {
        check_entry("put", path)?;
        let (dir, name) = split(path);
        let mut cur = ROOT;
        if !dir.is_empty() {
            for comp in dir.split('/') {
                let next = match self.dir(cur).live.get(comp) {
                    Some(&id) if self.is_dir(id) => id,
                    Some(_) => {
                        return Err(err(
                            io::ErrorKind::NotADirectory,
                            "put",
                            path,
                            "a component is not a directory",
                        ));
                    }
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
            })),
        };
        let parent = self.dir_mut(cur);
        parent.live.insert(name.to_string(), id);
        parent.durable.insert(name.to_string(), id);
        self.gc();
        Ok(())
    }
}

/// The simulated file system: see the [module documentation](self) for its crash model.
///
/// Cheap to clone: clones share one state, so a test keeps a handle while a store owns
/// another. All methods take `&self`; each call holds an internal lock, so calls from
/// several threads are atomic and totally ordered.
#[derive(Clone, Debug)]
pub struct SimFs {
    inner: Arc<Mutex<State>>,
}

impl Default for SimFs {
    fn default() -> Self {
        SimFs::new()
    }
}

impl SimFs {
    /// An empty file system: only the (durable) root directory.
    pub fn new() -> SimFs {
        SimFs {
            inner: Arc::new(Mutex::new(State::new())),
        }
    }

    /// An independent deep copy of the whole file system (live and durable state, pending
    /// crash points and faults): the model checker explores each successor on a fork.
    pub fn fork(&self) -> SimFs {
        SimFs {
            inner: Arc::new(Mutex::new(self.lock().clone())),
        }
    }

    /// A canonical description of the state that matters for future behaviour: the live
    /// tree and the durable tree by path (inodes numbered by first appearance, so hard
    /// links show), each file's live and durable data, and the order in which unsynced
    /// files were written (which one a torn crash would tear). Two file systems with equal
    /// fingerprints behave the same under every future call and crash.
    pub fn fingerprint(&self) -> String {
        let st = self.lock();
        let mut ids: BTreeMap<u64, usize> = BTreeMap::new();
        let mut out = String::new();
        let mut unsynced: Vec<(u64, String)> = Vec::new();
        for durable in [false, true] {
            out.push_str(if durable { "|durable:" } else { "live:" });
            let mut stack = vec![(ROOT, String::new())];
            while let Some((id, path)) = stack.pop() {
                let Some(Node::Dir(d)) = st.nodes.get(&id) else {
                    continue;
                };
                let entries = if durable { &d.durable } else { &d.live };
                for (name, child) in entries.iter().rev() {
                    let p = if path.is_empty() {
                        name.clone()
                    } else {
                        format!("{path}/{name}")
                    };
                    let n = ids.len();
                    let canon = *ids.entry(*child).or_insert(n);
                    match st.nodes.get(child) {
                        Some(Node::Dir(_)) => {
                            out.push_str(&format!("{p}/=d{canon};"));
                            stack.push((*child, p));
                        }
                        Some(Node::File(f)) => {
                            out.push_str(&format!(
                                "{p}=f{canon}:{}/{}/{};",
                                String::from_utf8_lossy(&f.live),
                                if f.durable == f.live {
                                    std::borrow::Cow::Borrowed("=")
                                } else {
                                    String::from_utf8_lossy(&f.durable)
                                },
                                f.synced
                            ));
                            if !f.synced && !durable {
                                unsynced.push((f.written, p));
                            }
                        }
                        None => out.push_str(&format!("{p}=dangling;")),
                    }
                }
            }
        }
        unsynced.sort();
        out.push_str("|unsynced-order:");
        for (_, p) in unsynced {
            out.push_str(&p);
            out.push(';');
        }
        out
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide the state from the others.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Power loss now: the live state becomes the durable one (see the module docs);
    /// with `tear`, the most recently written surviving unsynced file keeps a prefix of
    /// its data. Does not re-enable calls after a crash point: see [`SimFs::resume`].
    pub fn crash(&self, tear: bool) {
        self.lock().crash(tear);
    }

    /// Bring the file system back up after a crash point: disarm it and let calls run
    /// again. Without a preceding [`SimFs::crash`] this models a process crash, which loses
    /// nothing. Pending faults whose call has already passed are dropped.
    pub fn resume(&self) {
        let mut st = self.lock();
        st.down = false;
        st.crash_at = None;
        let tick = st.tick;
        st.faults.retain(|&at, _| at > tick);
    }

    /// [`SimFs::crash`] then [`SimFs::resume`]: reboot after power loss.
    pub fn recover(&self, tear: bool) {
        self.crash(tear);
        self.resume();
    }

    /// Arm a crash point: the next `n` calls run normally, every call after them fails
    /// with the simulated crash error and has no effect, until [`SimFs::resume`].
    /// `crash_after(0)` stops the very next call.
    pub fn crash_after(&self, n: u64) {
        let mut st = self.lock();
        st.crash_at = Some(st.tick + n + 1);
    }

    /// Whether a crash point was reached (calls fail until [`SimFs::resume`]).
    pub fn is_down(&self) -> bool {
        self.lock().down
    }

    /// Make the `n`-th call from now (`1` = the next one) fail with
    /// `io::Error::from_raw_os_error(errno)`, without effect (except the optional empty
    /// file of an `ENOSPC` `write_new`, see [`SimFs::set_enospc_leaves_empty_file`]).
    /// Later calls work normally. Several faults may be pending.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn fail_nth(&self, n: u64, errno: i32) {
        assert!(n > 0, "fail_nth: calls are numbered from 1");
        let mut st = self.lock();
        let at = st.tick + n;
        st.faults.insert(at, (errno, false));
    }

    /// Like [`SimFs::fail_nth`], but the call takes effect before reporting the error: an
    /// ambiguous failure (e.g. an NFS `link` that succeeded on the server but whose reply
    /// was lost). An error the call itself returns wins over the injected one.
    ///
    /// # Panics
    ///
    /// If `n` is 0.
    pub fn fail_nth_after_effect(&self, n: u64, errno: i32) {
        assert!(n > 0, "fail_nth_after_effect: calls are numbered from 1");
        let mut st = self.lock();
        let at = st.tick + n;
        st.faults.insert(at, (errno, true));
    }

    /// Drop every pending fault of [`SimFs::fail_nth`] and [`SimFs::fail_nth_after_effect`].
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// Whether a `write_new` failed by an injected `ENOSPC` leaves an empty (unsynced) file
    /// behind, as a real disk may. Default: `false` (no effect).
    pub fn set_enospc_leaves_empty_file(&self, on: bool) {
        self.lock().enospc_leaves_empty_file = on;
    }

    /// The torn file of a `crash(true)` keeps `len * num / den` bytes. Default `1/2`.
    ///
    /// # Panics
    ///
    /// If `den` is 0 or `num > den`.
    pub fn set_tear_fraction(&self, num: u64, den: u64) {
        assert!(
            den > 0 && num <= den,
            "set_tear_fraction: need 0 <= num <= den, den > 0"
        );
        self.lock().tear = (num, den);
    }

    /// Make `check_root` fail (the run root was renamed or replaced underneath), or pass
    /// again. Other calls keep working, as they would through the held root descriptor.
    pub fn set_root_replaced(&self, replaced: bool) {
        self.lock().root_replaced = replaced;
    }

    /// Set the age `age_secs` reports for the file at `path` (shared by all its links;
    /// survives crashes). New files have age 0. Not a call: not counted, never crashes.
    pub fn set_age(&self, path: &str, secs: u64) -> io::Result<()> {
        check_entry("set_age", path)?;
        let mut st = self.lock();
        match st.lookup("set_age", path)? {
            None => Err(err(io::ErrorKind::NotFound, "set_age", path, "not found")),
            Some(id) if st.is_dir(id) => Err(err(
                io::ErrorKind::IsADirectory,
                "set_age",
                path,
                "is a directory",
            )),
            Some(id) => {
                st.file_mut(id).age = secs;
                Ok(())
            }
        }
    }

    /// Write `bytes` to `path` durably at once, for tests that hand-edit records: missing
    /// parent directories are created durably, an existing file's inode gets the new
    /// content (live and durable, seen through all its links), and only this entry is made
    /// durable (other pending changes stay pending). Not a call: not counted, never
    /// crashes or fails by injection.
    pub fn put(&self, path: &str, bytes: &[u8]) -> io::Result<()> {
        self.lock().put(path, bytes)
    }

    /// Every file reachable through live entries, by path, with its live data (a file with
    /// several links appears under each name; directories are not listed).
    pub fn snapshot_live(&self) -> BTreeMap<String, Vec<u8>> {
        self.lock().snapshot(false)
    }

    /// What a crash without tear would leave: every file reachable through durable
    /// entries, by path, with its durable data.
    pub fn snapshot_durable(&self) -> BTreeMap<String, Vec<u8>> {
        self.lock().snapshot(true)
    }

    /// Trait calls made since creation or the last [`SimFs::reset_counters`].
    pub fn calls(&self) -> u64 {
        self.lock().counters.calls
    }

    /// `fsync` calls made since creation or the last [`SimFs::reset_counters`].
    pub fn fsync_count(&self) -> u64 {
        self.lock().counters.fsync
    }

    /// `fsync_dir` calls made since creation or the last [`SimFs::reset_counters`]
    /// (not counting the fsyncs inside `ensure_dir`, see [`Counters::ensure_dir_syncs`]).
    pub fn fsync_dir_count(&self) -> u64 {
        self.lock().counters.fsync_dir
    }

    /// All counters at once.
    pub fn counters(&self) -> Counters {
        self.lock().counters
    }

    /// Zero the counters (crash points and pending faults are not affected).
    pub fn reset_counters(&self) {
        self.lock().counters = Counters::default();
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
                Some(id) => match st.node(id) {
                    Node::Dir(_) => Err(err(
                        io::ErrorKind::IsADirectory,
                        "read",
                        path,
                        "is a directory",
                    )),
                    Node::File(f) if f.live.len() > limit => Err(err(
                        io::ErrorKind::InvalidData,
                        "read",
                        path,
                        &format!("{} bytes, more than the limit {limit}", f.live.len()),
                    )),
                    Node::File(f) => Ok(Some(f.live.clone())),
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
            match st.lookup("fsync", path)? {
                None => Err(err(io::ErrorKind::NotFound, "fsync", path, "not found")),
                Some(id) if st.is_dir(id) => Err(err(
                    io::ErrorKind::IsADirectory,
                    "fsync",
                    path,
                    "is a directory (use fsync_dir)",
                )),
                Some(id) => {
                    let f = st.file_mut(id);
                    f.durable = f.live.clone();
                    f.synced = true;
                    Ok(())
                }
            }
        })
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
            if st.dir(d).live.contains_key(name) {
                return Err(err(
                    io::ErrorKind::AlreadyExists,
                    "link",
                    to,
                    "already exists",
                ));
            }
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
            st.gc();
            Ok(())
        })
    }

    fn unlink(&self, path: &str) -> io::Result<()> {
        self.lock().call(Op::Other, |st| {
            check_entry("unlink", path)?;
            let (d, name) = match st.parent("unlink", path) {
                Ok(p) => p,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(err(io::ErrorKind::NotFound, "unlink", path, "not found"));
                }
                Err(e) => return Err(e),
            };
            match st.dir(d).live.get(name) {
                None => Err(err(io::ErrorKind::NotFound, "unlink", path, "not found")),
                Some(&id) if st.is_dir(id) => Err(err(
                    io::ErrorKind::IsADirectory,
                    "unlink",
                    path,
                    "is a directory",
                )),
                Some(_) => {
                    st.dir_mut(d).live.remove(name);
                    st.gc();
                    Ok(())
                }
            }
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
