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
//! - **replace_whole** (1 fsync, issue #33: `run.json`): write temp → fsync it → `rename`,
//!   no directory fsync. After a crash or a power loss the target is the old content or the
//!   new, each whole (the new one's data was fsynced before the rename): for a record where
//!   either is a valid state and nothing rests on the new one surviving a power loss.
//! - **remove** (1 fsync, or 0 for files that are never read again): unlink → fsync `dir`.
//! - **write_beat** (heartbeats, the two-slot format of `lease_core::beat`): beat 1, or a
//!   missing file, is a replace of the whole fresh file (as above, durable or not); every
//!   later beat is one `pwrite` of its slot in place → (`durable`: `fdatasync` the file).
//!   The write touches only the slot of beat `seq − 2`, so after a crash anywhere the other
//!   slot still holds beat `seq − 1` whole, and a reader takes the newest valid slot.

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
    /// Heartbeat write: in place, or a fresh file by replace.
    WriteBeat,
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
    /// A heartbeat's slot: its beat number and bytes (written in place).
    slot: Option<(u64, Vec<u8>)>,
    durable: bool,
    /// With `durable`: whether the directory is fsynced after the rename or link (false
    /// only for [`PrimOp::replace_whole`]).
    sync_dir: bool,
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
    WriteInPlace,
    SyncData,
    Finished,
}

/// A clonable copy of an `io::Error` (the primitive machine is cloned by the model
/// checker), keeping the OS error code and the simulated-crash marker.
fn freeze(e: &io::Error) -> (io::ErrorKind, Option<i32>, String) {
    let code = if crate::crash::is_simulated_crash(e) {
        Some(-1)
    } else {
        e.raw_os_error()
    };
    (e.kind(), code, e.to_string())
}

fn thaw(e: (io::ErrorKind, Option<i32>, String)) -> io::Error {
    match e.1 {
        Some(-1) => io::Error::other(crate::crash::SimulatedCrash),
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

    /// Replace `path` with `bytes` whole but without the directory fsync: temp → fsync →
    /// rename (see the module docs, **replace_whole**).
    pub fn replace_whole(path: &str, bytes: Vec<u8>, tmp: String) -> PrimOp {
        let mut p = PrimOp::new(PrimKind::Replace, path, bytes, true, tmp);
        p.sync_dir = false;
        p
    }

    /// Remove `path` (missing is fine): unlink → [fsync dir].
    pub fn remove(path: &str, durable: bool) -> PrimOp {
        let mut p = PrimOp::new(PrimKind::Remove, path, Vec::new(), durable, String::new());
        p.st = PrimState::Unlink;
        p
    }

    /// Write heartbeat `seq` ([`lease_core::ops::Request::WriteBeat`]): `seq == 1` replaces
    /// the file whole with `lease_core::beat::fresh_file`; a later beat writes its slot in
    /// place → (durable: `fdatasync`), falling back to the fresh file when the file is missing.
    pub fn write_beat(
        path: &str,
        seq: u64,
        record: &[u8],
        durable: bool,
        tmp: String,
    ) -> Result<PrimOp, lease_core::beat::SlotError> {
        if seq == 1 {
            let fresh = lease_core::beat::fresh_file(seq, record)?;
            return Ok(PrimOp::new(PrimKind::WriteBeat, path, fresh, durable, tmp));
        }
        // Beats after the first: the slot alone. The fresh file (for a missing file) is
        // made from the slot only if that happens (`beat::fresh_file_of_slot`).
        let slot = lease_core::beat::slot_bytes(seq, record)?;
        let mut p = PrimOp::new(PrimKind::WriteBeat, path, Vec::new(), durable, tmp);
        p.slot = Some((seq, slot));
        p.st = PrimState::WriteInPlace;
        Ok(p)
    }

    fn new(kind: PrimKind, path: &str, bytes: Vec<u8>, durable: bool, tmp: String) -> PrimOp {
        PrimOp {
            kind,
            path: path.to_string(),
            tmp,
            bytes,
            slot: None,
            durable,
            sync_dir: true,
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
                    // mutant create_skips_dir_fsync: `Created` before the folder fsync (§5.2, §9).
                    self.st = if lease_core::mutant::mutant("create_skips_dir_fsync") {
                        PrimState::UnlinkTemp
                    } else {
                        PrimState::FsyncDir
                    };
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
                    if self.durable && self.sync_dir {
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
            PrimState::WriteInPlace => {
                let Some((seq, slot)) = &self.slot else {
                    self.st = PrimState::Finished;
                    return Some(Err(io::Error::other("heartbeat write without a slot")));
                };
                match fs.write_at(&self.path, lease_core::beat::slot_offset(*seq), slot) {
                    // No file (removed, or never written by this owner): a fresh one, the
                    // slot at its place and the other slot zero.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        self.bytes = lease_core::beat::fresh_file_of_slot(*seq, slot);
                        self.st = PrimState::WriteTemp;
                        None
                    }
                    Err(e) => {
                        self.st = PrimState::Finished;
                        Some(Err(e))
                    }
                    Ok(()) if self.durable => {
                        self.st = PrimState::SyncData;
                        None
                    }
                    Ok(()) => {
                        self.st = PrimState::Finished;
                        Some(Ok(true))
                    }
                }
            }
            PrimState::SyncData => {
                self.st = PrimState::Finished;
                Some(fs.sync_data(&self.path).map(|()| true))
            }
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

/// Replace `path` with `bytes`, the new content fsynced before the rename and the
/// directory not fsynced (1 fsync): after a power loss `path` holds the old content or the
/// new, each whole (see the module docs).
pub fn replace_whole(fs: &dyn Fs, path: &str, bytes: &[u8]) -> io::Result<()> {
    PrimOp::replace_whole(path, bytes.to_vec(), temp_path(split(path).0))
        .run(fs)
        .map(|_| ())
}

/// Remove `path` (missing is fine); with `durable`, fsync its directory.
pub fn remove(fs: &dyn Fs, path: &str, durable: bool) -> io::Result<()> {
    PrimOp::remove(path, durable).run(fs).map(|_| ())
}

/// Whether `name` is one of runlease's own temp names (PROTOCOL §2, Temp files): lease-fs's
/// `.tmp-<pid>-<counter>-<nanos:09>` ([`temp_path`]), or lease-sqlite's store build
/// `.tmp-<pid>-store-<16 hex>` and its SQLite side files (`-wal`, `-journal`). Anything
/// else under the `.tmp-` prefix (e.g. `.tmp-notes`) is not ours and is never removed.
pub fn is_temp_name(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = name.strip_prefix(TEMP_PREFIX) else {
        return false;
    };
    let Some((pid, rest)) = rest.split_once('-') else {
        return false;
    };
    if !digits(pid) {
        return false;
    }
    if let Some(store) = rest.strip_prefix("store-") {
        let hex = store
            .strip_suffix("-wal")
            .or_else(|| store.strip_suffix("-journal"))
            .unwrap_or(store);
        return hex.len() == 16 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    }
    match rest.split_once('-') {
        Some((counter, nanos)) => digits(counter) && nanos.len() == 9 && digits(nanos),
        None => false,
    }
}

/// Remove orphaned temp files in `dir` older than `min_age_secs` (younger ones may belong
/// to a writer that is still working). Only entries whose name is ours ([`is_temp_name`])
/// and that are **regular files owned by the effective uid** ([`Fs::entry_info`], an
/// `lstat`: a symlink is never followed, and neither it nor a directory, FIFO, socket or
/// device named like a temp is touched, nor another user's file). Temp files are never
/// read, so removing one never changes what a reader sees; a writer paused past the age
/// whose temp vanished gets `ENOENT` and aborts its write (nothing it was told succeeded).
/// Returns how many were removed.
///
/// Order: for each temp, `lstat` → `unlinkat` (by name beneath the held directory); then one
/// fsync of `dir` if anything was removed. A crash anywhere leaves some temps removed and
/// the others still there: either way nothing that is read changed. Between the `lstat`
/// and the `unlinkat` another writer of the folder could put something else under that
/// name; such a writer can remove the entry itself anyway (the trust model), and only the
/// name is unlinked, never what a symlink points to.
pub fn clean_temp_files(fs: &dyn Fs, dir: &str, min_age_secs: u64) -> io::Result<usize> {
    let mut removed = 0;
    // Only the temp names are collected (a long log's event names are not).
    let mut temps = Vec::new();
    fs.for_each_name(dir, &mut |name| {
        if is_temp_name(name) {
            temps.push(name.to_string());
        }
    })?;
    for name in temps {
        let path = join(dir, &name);
        let collectable = fs
            .entry_info(&path)?
            .is_some_and(|e| e.regular && e.ours && e.age_secs >= min_age_secs);
        if collectable {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_own_temp_names_are_temp_names() {
        let made = temp_path("lease/epochs");
        assert!(is_temp_name(split(&made).1), "{made}");
        for ours in [
            ".tmp-1-0-000000000",
            ".tmp-4242-17-123456789",
            ".tmp-12345-store-00112233aabbccdd",
            ".tmp-12345-store-00112233aabbccdd-wal",
            ".tmp-12345-store-00112233aabbccdd-journal",
        ] {
            assert!(is_temp_name(ours), "{ours}");
        }
        for not_ours in [
            ".tmp-",
            ".tmp-notes",
            ".tmp-1-2",
            ".tmp-1-2-3",
            ".tmp-x-1-000000000",
            ".tmp-1-x-000000000",
            ".tmp-1-1-00000000a",
            ".tmp-1-1-0000000000",
            ".tmp--1-000000000",
            ".tmp-1-store-00112233AABBCCDD",
            ".tmp-1-store-0011",
            ".tmp-1-store-00112233aabbccdd-shm",
            ".tmp-1-0-000000000/x",
            "tmp-1-0-000000000",
            "00000000000000000001.json",
            ".tmp-123456789012345678901-0-000000000",
        ] {
            assert!(!is_temp_name(not_ours), "{not_ours}");
        }
    }
}
