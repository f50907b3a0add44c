//! The durable primitives, written once against the [`Fs`] seam.
//!
//! Order of writes, fsyncs, links and renames (docs/PROTOCOL.md §5):
//!
//! - **create_exclusive** (2 fsyncs): write the temp file `dir/.tmp-*` → fsync it →
//!   `link(temp, target)` → fsync `dir` → unlink the temp. A crash before the link leaves
//!   only an orphan temp (ignored by readers); after the link the target is complete
//!   because its data was fsynced first; before the directory fsync the new entry may be
//!   lost, which is as if the create never happened (nobody was told it succeeded).
//!   `EEXIST` from the link is the loser's answer. Any other link error is ambiguous: the
//!   temp's link count (2 = linked) decides.
//! - **replace**, durable (2 fsyncs): write temp → fsync it → `rename(temp, target)` →
//!   fsync `dir`. Not durable (0 fsyncs, heartbeats under the `local` policy): write temp →
//!   rename. After a crash the target is the old or the new content, or (not durable only)
//!   possibly empty/torn, which readers report as invalid.
//! - **remove** (1 fsync, or 0 for files that are never read again): unlink → fsync `dir`.

use crate::fs::{Fs, join, split};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Prefix of temp files (the same as `lease_core::layout::TEMP_PREFIX`).
pub const TEMP_PREFIX: &str = lease_core::layout::TEMP_PREFIX;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temp file name in `dir` that no other writer uses: pid, a process-wide counter and
/// the wall-clock nanoseconds (only for uniqueness, never for ordering).
pub fn temp_path(dir: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    join(
        dir,
        &format!("{TEMP_PREFIX}{}-{n}-{nanos:09}", std::process::id()),
    )
}

/// What a primitive is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PrimKind {
    /// Link-exclusive create.
    CreateExclusive,
    /// Atomic replace.
    Replace,
    /// Remove.
    Remove,
}

/// One durable primitive as a machine that performs exactly one system call per
/// [`PrimOp::step`], so a model checker can interleave other actors and crash between any
/// two calls. The blocking functions below ([`create_exclusive`], [`replace`], [`remove`])
/// are loops over it: there is one implementation of each order of calls.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PrimOp {
    kind: PrimKind,
    path: String,
    tmp: String,
    bytes: Vec<u8>,
    durable: bool,
    st: PrimState,
    /// The answer once finished: `true` = created/done, `false` = already existed.
    outcome: bool,
    /// The error to report after cleaning up the temp file.
    error: Option<(io::ErrorKind, Option<i32>, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum PrimState {
    WriteTemp,
    FsyncTemp,
    Link,
    LinkCount,
    Rename,
    FsyncDir,
    UnlinkTemp,
    Unlink,
    Finished,
}

/// A clonable copy of an `io::Error` (the primitive machine is cloned by the model
/// checker), keeping the OS error code and the simulated-crash marker.
fn freeze(e: &io::Error) -> (io::ErrorKind, Option<i32>, String) {
    let code = if crate::sim::is_simulated_crash(e) {
        Some(-1)
    } else {
        e.raw_os_error()
    };
    (e.kind(), code, e.to_string())
}

fn thaw(e: (io::ErrorKind, Option<i32>, String)) -> io::Error {
    match e.1 {
        Some(-1) => io::Error::other(crate::sim::SimulatedCrash),
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.0, e.2),
    }
}

impl PrimOp {
    /// Create `path` with `bytes` only if it does not exist: temp → fsync → link → fsync dir
    /// → unlink temp. `tmp` is the temp path (same directory).
    pub fn create_exclusive(path: &str, bytes: Vec<u8>, tmp: String) -> PrimOp {
        PrimOp::new(PrimKind::CreateExclusive, path, bytes, true, tmp)
    }

    /// Replace `path` with `bytes`: temp → (fsync) → rename → (fsync dir).
    pub fn replace(path: &str, bytes: Vec<u8>, durable: bool, tmp: String) -> PrimOp {
        PrimOp::new(PrimKind::Replace, path, bytes, durable, tmp)
    }

    /// Remove `path` (missing is fine): unlink → [fsync dir].
    pub fn remove(path: &str, durable: bool) -> PrimOp {
        let mut p = PrimOp::new(PrimKind::Remove, path, Vec::new(), durable, String::new());
        p.st = PrimState::Unlink;
        p
    }

    fn new(kind: PrimKind, path: &str, bytes: Vec<u8>, durable: bool, tmp: String) -> PrimOp {
        PrimOp {
            kind,
            path: path.to_string(),
            tmp,
            bytes,
            durable,
            st: PrimState::WriteTemp,
            outcome: true,
            error: None,
        }
    }

    /// Which primitive this is.
    pub fn kind(&self) -> PrimKind {
        self.kind
    }

    /// Whether the next system call only touches this primitive's private temp file
    /// (writing, syncing, counting links of or removing it). Readers never look at temp
    /// files, so no other actor can observe the difference between doing such a call and
    /// the next one in one go: a model checker may merge them (crashes at every single call
    /// are covered by the crash-point tests).
    pub fn next_is_private(&self) -> bool {
        matches!(
            self.st,
            PrimState::WriteTemp
                | PrimState::FsyncTemp
                | PrimState::LinkCount
                | PrimState::UnlinkTemp
        )
    }

    /// Whether a create has linked its target, i.e. the record is visible under its name
    /// (its folder may not be fsynced yet). A model checker uses it to note the moment an
    /// event became visible, which comes steps before the primitive's answer.
    pub fn linked(&self) -> bool {
        self.kind == PrimKind::CreateExclusive
            && match self.st {
                PrimState::FsyncDir => true,
                PrimState::Finished => self.outcome && self.error.is_none(),
                _ => false,
            }
    }

    /// Whether the last step finished the primitive.
    pub fn is_finished(&self) -> bool {
        self.st == PrimState::Finished
    }

    fn fail(&mut self, e: &io::Error) -> Option<io::Result<bool>> {
        // Best effort: remove our temp (one more call); an orphan would be harmless.
        self.error = Some(freeze(e));
        self.st = PrimState::UnlinkTemp;
        None
    }

    /// Perform exactly one system call on `fs`. `Some(result)` when the primitive is
    /// finished: `Ok(true)` created / done, `Ok(false)` the target already existed.
    pub fn step(&mut self, fs: &dyn Fs) -> Option<io::Result<bool>> {
        let dir = split(&self.path).0.to_string();
        match self.st {
            PrimState::WriteTemp => match fs.write_new(&self.tmp, &self.bytes) {
                Err(e) => {
                    self.st = PrimState::Finished;
                    Some(Err(e))
                }
                Ok(()) => {
                    self.st = if self.durable {
                        PrimState::FsyncTemp
                    } else {
                        PrimState::Rename
                    };
                    None
                }
            },
            PrimState::FsyncTemp => match fs.fsync(&self.tmp) {
                Err(e) => self.fail(&e),
                Ok(()) => {
                    self.st = match self.kind {
                        PrimKind::CreateExclusive => PrimState::Link,
                        _ => PrimState::Rename,
                    };
                    None
                }
            },
            PrimState::Link => match fs.link(&self.tmp, &self.path) {
                Ok(()) => {
                    self.st = PrimState::FsyncDir;
                    None
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    // The loser's answer; nothing to make durable.
                    self.outcome = false;
                    self.st = PrimState::UnlinkTemp;
                    None
                }
                Err(e) => {
                    // Ambiguous (e.g. EIO after the link happened on an NFS server): the
                    // temp's link count says whether the target is ours.
                    self.error = Some(freeze(&e));
                    self.st = PrimState::LinkCount;
                    None
                }
            },
            PrimState::LinkCount => {
                if fs.link_count(&self.tmp).ok().flatten() == Some(2) {
                    self.error = None;
                    self.st = PrimState::FsyncDir;
                } else {
                    self.st = PrimState::UnlinkTemp;
                }
                None
            }
            PrimState::Rename => match fs.rename(&self.tmp, &self.path) {
                Err(e) => self.fail(&e),
                Ok(()) => {
                    if self.durable {
                        self.st = PrimState::FsyncDir;
                        None
                    } else {
                        self.st = PrimState::Finished;
                        Some(Ok(true))
                    }
                }
            },
            PrimState::FsyncDir => match fs.fsync_dir(&dir) {
                Err(e) => match self.kind {
                    PrimKind::CreateExclusive => self.fail(&e),
                    _ => {
                        self.st = PrimState::Finished;
                        Some(Err(e))
                    }
                },
                Ok(()) => match self.kind {
                    PrimKind::CreateExclusive => {
                        self.st = PrimState::UnlinkTemp;
                        None
                    }
                    _ => {
                        self.st = PrimState::Finished;
                        Some(Ok(true))
                    }
                },
            },
            PrimState::UnlinkTemp => {
                // Best effort: an orphan temp never changes what a reader sees.
                let _ = fs.unlink(&self.tmp);
                self.st = PrimState::Finished;
                Some(match self.error.take() {
                    Some(e) => Err(thaw(e)),
                    None => Ok(self.outcome),
                })
            }
            PrimState::Unlink => match fs.unlink(&self.path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.st = PrimState::Finished;
                    Some(Ok(true))
                }
                Err(e) => {
                    self.st = PrimState::Finished;
                    Some(Err(e))
                }
                Ok(()) => {
                    if self.durable {
                        self.st = PrimState::FsyncDir;
                        None
                    } else {
                        self.st = PrimState::Finished;
                        Some(Ok(true))
                    }
                }
            },
            PrimState::Finished => Some(Err(io::Error::other("primitive already finished"))),
        }
    }

    /// Run to completion.
    pub fn run(mut self, fs: &dyn Fs) -> io::Result<bool> {
        loop {
            if let Some(r) = self.step(fs) {
                return r;
            }
        }
    }
}

/// Create `path` with `bytes` only if it does not exist, atomically and durably.
/// `Ok(true)`: created; `Ok(false)`: it already existed (untouched).
pub fn create_exclusive(fs: &dyn Fs, path: &str, bytes: &[u8]) -> io::Result<bool> {
    PrimOp::create_exclusive(path, bytes.to_vec(), temp_path(split(path).0)).run(fs)
}

/// Atomically replace `path` with `bytes`; with `durable`, fsync the file before the rename
/// and the directory after it.
pub fn replace(fs: &dyn Fs, path: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    PrimOp::replace(path, bytes.to_vec(), durable, temp_path(split(path).0))
        .run(fs)
        .map(|_| ())
}

/// Remove `path` (missing is fine); with `durable`, fsync its directory.
pub fn remove(fs: &dyn Fs, path: &str, durable: bool) -> io::Result<()> {
    PrimOp::remove(path, durable).run(fs).map(|_| ())
}

/// Remove temp files in `dir` older than `min_age_secs` (younger ones may belong to a
/// writer that is still working). Temp files are never read, so removing one never changes
/// what a reader sees. Returns how many were removed.
pub fn clean_temp_files(fs: &dyn Fs, dir: &str, min_age_secs: u64) -> io::Result<usize> {
    let mut removed = 0;
    // Only the temp names are collected (a long log's event names are not).
    let mut temps = Vec::new();
    fs.for_each_name(dir, &mut |name| {
        if name.starts_with(TEMP_PREFIX) {
            temps.push(name.to_string());
        }
    })?;
    for name in temps {
        let path = join(dir, &name);
        if fs.age_secs(&path)?.is_some_and(|a| a >= min_age_secs) {
            match fs.unlink(&path) {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    if removed > 0 {
        fs.fsync_dir(dir)?;
    }
    Ok(removed)
}
