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
//! - `read`, `exists`, `list`, `link_count`, `age_secs`, `entry_info`, `check_root` see the live state.
//!
//! - `write_at(path, offset, bytes)`: overwrites the live data of the existing file in
//!   place (extending it with zeros if needed); `NotFound` if it does not exist. Not
//!   durable until `sync_data`/`fsync`. It makes the file the most recently written one.
//! - `sync_data(path)`: as `fsync`.
//!
//! **Crash** ([`SimFs::crash`], power loss): every directory's entries := its durable
//! entries; only directories reachable from the root through durable entries survive, and
//! inodes no longer named by any surviving entry disappear. Every surviving file's data :=
//! its durable data, so a file whose entry was fsynced but whose data was not comes back
//! **empty**. With `tear = true`, one file is **torn** instead (A3): among the surviving
//! files whose data was never fsynced, the one created by the most recent `write_new` keeps
//! the first `len * num / den` bytes of its live data; if its most recent write was an
//! in-place `write_at` instead, it keeps its durable data with the first `len * num / den`
//! bytes of that write's range applied over it (`1/2` by default, see
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
//! **Renames that outrun their data.** With [`SimFs::set_renames_outrun_data`], a `rename`
//! is durable at once (its new entry and the removal of the old one), as on a journaling
//! file system that commits the rename with its metadata before the file's data (XFS,
//! ext4 without `auto_da_alloc`, some FUSE file systems): a power loss then leaves the
//! renamed file with its durable data, **empty** if it was never fsynced, or torn. This is
//! how a `local` heartbeat, written without an fsync, comes back empty (PROTOCOL OQ-6).
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

mod calls;
mod control;
mod state;

// `Fs` is used by `calls` (through `super::Fs`) and by the links of the docs here.
use crate::fs::{Fs, check_rel};
use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

/// `EIO` (5): a convenient errno for [`SimFs::fail_nth`].
pub const EIO: i32 = 5;
/// `ENOSPC` (28 on Linux and macOS): a convenient errno for [`SimFs::fail_nth`].
pub const ENOSPC: i32 = 28;

const ROOT: u64 = 0;
/// Smallest inode-table size at which garbage is collected.
const GC_MIN: usize = 64;

pub(crate) use crate::crash::SimulatedCrash;
pub use crate::crash::is_simulated_crash;

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
    /// The byte range of the last in-place write (`write_at`) since the last sync: a torn
    /// crash keeps a prefix of that range over the durable data, and the rest of the file
    /// as it was durably (an in-place write never tears bytes it did not write).
    in_place: Option<(usize, usize)>,
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
    /// A rename is durable at once, its file's data only once fsynced
    /// ([`SimFs::set_renames_outrun_data`]).
    renames_outrun_data: bool,
    tear: (u64, u64),
    root_replaced: bool,
    /// Collect garbage once the inode table grows past this size (amortized GC).
    gc_at: usize,
    /// What `Fs::loses_unsynced_writes` answers.
    loses_unsynced_writes: bool,
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
