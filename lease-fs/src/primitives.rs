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

/// Create `path` with `bytes` only if it does not exist, atomically and durably.
/// `Ok(true)`: created; `Ok(false)`: it already existed (untouched).
pub fn create_exclusive(fs: &dyn Fs, path: &str, bytes: &[u8]) -> io::Result<bool> {
    let (dir, _) = split(path);
    let tmp = temp_path(dir);
    fs.write_new(&tmp, bytes)?;
    let result = (|| {
        fs.fsync(&tmp)?;
        match fs.link(&tmp, path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => {
                // Ambiguous (e.g. EIO after the link happened on an NFS server): the temp's
                // link count says whether the target is ours.
                if fs.link_count(&tmp).ok().flatten() != Some(2) {
                    return Err(e);
                }
            }
        }
        fs.fsync_dir(dir)?;
        Ok(true)
    })();
    // Best effort: an orphan temp never changes what a reader sees and is cleaned later.
    let _ = fs.unlink(&tmp);
    result
}

/// Atomically replace `path` with `bytes`; with `durable`, fsync the file before the rename
/// and the directory after it.
pub fn replace(fs: &dyn Fs, path: &str, bytes: &[u8], durable: bool) -> io::Result<()> {
    let (dir, _) = split(path);
    let tmp = temp_path(dir);
    fs.write_new(&tmp, bytes)?;
    let result = (|| {
        if durable {
            fs.fsync(&tmp)?;
        }
        fs.rename(&tmp, path)?;
        if durable {
            fs.fsync_dir(dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs.unlink(&tmp);
    }
    result
}

/// Remove `path` (missing is fine); with `durable`, fsync its directory.
pub fn remove(fs: &dyn Fs, path: &str, durable: bool) -> io::Result<()> {
    match fs.unlink(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    if durable {
        fs.fsync_dir(split(path).0)?;
    }
    Ok(())
}

/// Remove temp files in `dir` older than `min_age_secs` (younger ones may belong to a
/// writer that is still working). Temp files are never read, so removing one never changes
/// what a reader sees. Returns how many were removed.
pub fn clean_temp_files(fs: &dyn Fs, dir: &str, min_age_secs: u64) -> io::Result<usize> {
    let mut removed = 0;
    for name in fs.list(dir)? {
        if !name.starts_with(TEMP_PREFIX) {
            continue;
        }
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
