//! A read-only look at the database header before SQLite touches the file.
//!
//! SQLite, given a file, may write to it before it reports anything (a rollback-journal
//! database with a hot journal is rolled back on first read; switching to WAL rewrites the
//! header). So the first 100 bytes are read here with plain `read(2)`: a file that is not
//! SQLite, is too short, is visibly truncated, or carries another schema version is refused
//! without SQLite ever opening it, and is therefore left exactly as it was.

use crate::error::StoreError;
use crate::folder::{self, Folder};
use crate::schema::{Kind, SCHEMA_VERSION};
use rustix::fs::{FileType, Stat};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

const MAGIC: &[u8; 16] = b"SQLite format 3\0";
const HEADER_LEN: usize = 100;

/// Who is asking, for error messages.
pub(crate) struct Ctx<'a> {
    pub run: &'a str,
    pub file: &'a str,
}

impl Ctx<'_> {
    /// Call `f` with the context of run `run`'s store file `file` (what its errors name).
    pub(crate) fn with<T>(
        run: &lease_core::RunId,
        file: &Path,
        f: impl FnOnce(&Ctx<'_>) -> T,
    ) -> T {
        let (run, file) = (run.to_string(), file.display().to_string());
        f(&Ctx {
            run: &run,
            file: &file,
        })
    }

    pub(crate) fn corrupt(&self, detail: impl Into<String>) -> StoreError {
        StoreError::Corrupt {
            run: self.run.to_string(),
            file: self.file.to_string(),
            detail: detail.into(),
        }
    }

    pub(crate) fn io(&self, op: &'static str, e: impl std::fmt::Display) -> StoreError {
        StoreError::Io {
            run: self.run.to_string(),
            file: self.file.to_string(),
            op,
            detail: e.to_string(),
        }
    }

    pub(crate) fn unsupported(&self, found: impl Into<String>) -> StoreError {
        StoreError::SchemaUnsupported {
            run: self.run.to_string(),
            file: self.file.to_string(),
            found: found.into(),
            supported: SCHEMA_VERSION,
        }
    }

    /// [`Ctx::unsupported`] for a file that must be of `kind` (its version is the one
    /// supported).
    pub(crate) fn unsupported_as(&self, kind: Kind, found: impl Into<String>) -> StoreError {
        StoreError::SchemaUnsupported {
            run: self.run.to_string(),
            file: self.file.to_string(),
            found: found.into(),
            supported: kind.version(),
        }
    }
}

/// Refuse anything in the store's place that is not a regular file (checked on `lstat`
/// metadata, so a symlink is seen as a symlink and never followed).
pub(crate) fn check_kind(ctx: &Ctx<'_>, meta: &Stat) -> Result<(), StoreError> {
    let what = match folder::kind(meta) {
        FileType::RegularFile => return Ok(()),
        FileType::Symlink => "a symbolic link (store files are never reached through a symlink)",
        FileType::Directory => "a directory",
        _ => "not a regular file",
    };
    Err(ctx.corrupt(format!("it is {what}")))
}

/// Trust `what` (a store file, its WAL or journal, its folder) only if the effective uid
/// owns it and neither group nor others may write it (issue #29: a 0666 store owned by
/// another user was accepted): the rule and wording of every run file
/// (`lease_core::trust`, as lease-fs judges them), code `RUN_NOT_OWNED` (77). `uid` and
/// `mode` come from an `fstat` of the descriptor that is then used (or, for an early look
/// before anything is written, an `lstat` that the `fstat` repeats); once trusted, only its
/// owner (us) or root can change either.
pub(crate) fn check_trusted(
    ctx: &Ctx<'_>,
    what: &str,
    abs: &Path,
    uid: u32,
    mode: u32,
    is_dir: bool,
) -> Result<(), StoreError> {
    let euid = rustix::process::geteuid().as_raw();
    let perm = mode & 0o7777;
    if lease_core::trust::trusted(uid, perm, euid) {
        return Ok(());
    }
    Err(StoreError::NotOwned {
        run: ctx.run.to_string(),
        file: ctx.file.to_string(),
        detail: lease_core::trust::NotOwned {
            path: what.to_string(),
            abs: abs.to_path_buf(),
            uid,
            mode: perm,
            euid,
            is_dir,
        }
        .describe(),
    })
}

/// [`check_trusted`] on `lstat`/`fstat` metadata.
pub(crate) fn check_trusted_stat(
    ctx: &Ctx<'_>,
    what: &str,
    abs: &Path,
    st: &Stat,
) -> Result<(), StoreError> {
    let is_dir = folder::kind(st) == FileType::Directory;
    #[allow(clippy::unnecessary_cast)]
    check_trusted(ctx, what, abs, st.st_uid as u32, st.st_mode as u32, is_dir)
}

/// A side file of the store (`side`: its `-wal` or `-journal`, which SQLite opens by name
/// beside it and reads into the database), when there is one: a regular file
/// ([`check_wal_kind`]'s rule) that this process owns and nobody else may write, judged
/// on an `fstat` of the descriptor opened here (`O_NOFOLLOW|O_NONBLOCK`, closed again
/// before SQLite opens anything: SQLite keeps no lock on these files that closing could
/// drop). Returns its `lstat`, `None` when there is none.
pub(crate) fn check_side(
    ctx: &Ctx<'_>,
    dir: &Folder,
    side: &str,
) -> Result<Option<Stat>, StoreError> {
    let Some(st) = dir.lstat(side).map_err(|e| ctx.io("stat", e))? else {
        return Ok(None);
    };
    check_wal_kind(ctx, side, &st)?;
    let abs = Path::new(ctx.file).with_file_name(side);
    check_trusted_stat(ctx, side, &abs, &st)?;
    let f = match dir.open_read(side) {
        Ok(f) => f,
        // Gone since the lstat (an owner's close removed it): nothing to judge.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ctx.io("open (side file check)", e)),
    };
    let m = f.metadata().map_err(|e| ctx.io("fstat", e))?;
    if !m.file_type().is_file() || (m.dev(), m.ino()) != folder::key(&st) {
        return Err(ctx.corrupt(format!(
            "its side file {side} was replaced while it was being opened"
        )));
    }
    check_trusted(ctx, side, &abs, m.uid(), m.mode(), false)?;
    Ok(Some(st))
}

/// A write-ahead log beside the store (`wal`, its name, `meta` its `lstat`) must be a
/// regular file: SQLite would open a FIFO, a directory or a device there and fail with an
/// I/O error at the first write or at the seal (issue #28: a FIFO at `run.sqlite-wal` made
/// `runlease run` claim, run the command and fail its release with `STORE_IO`, leaving the
/// run dead). Refused as `STORE_CORRUPT` (65) before anything is written.
pub(crate) fn check_wal_kind(ctx: &Ctx<'_>, wal: &str, meta: &Stat) -> Result<(), StoreError> {
    let what = match folder::kind(meta) {
        FileType::RegularFile => return Ok(()),
        FileType::Symlink => "a symbolic link",
        FileType::Directory => "a directory",
        FileType::Fifo => "a FIFO",
        _ => "not a regular file",
    };
    Err(ctx.corrupt(format!(
        "its write-ahead log or journal {wal} is {what}; move it out of the run by hand (keep a copy)"
    )))
}

/// Read and check the header of the file `meta` describes (its `lstat` result), which must
/// be of `kind` (its schema version: a local store's or a view's). The
/// descriptor opened here is closed again before SQLite opens the file; the caller holds
/// the process registry entry, so no SQLite lock of this process can be dropped by it.
pub(crate) fn check(
    ctx: &Ctx<'_>,
    dir: &Folder,
    name: &str,
    meta: &Stat,
    wal_is_empty: bool,
    kind: Kind,
) -> Result<(), StoreError> {
    // openat beneath the held folder, O_NOFOLLOW: a symlink swapped in after the lstat is
    // refused (ELOOP), never followed; O_NONBLOCK: a FIFO or device swapped in does not
    // block the open (a FIFO hung the store step for its whole deadline); the fstat below
    // then refuses anything but the regular file the lstat saw.
    let mut f = dir.open_read(name).map_err(|e| {
        if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
            ctx.corrupt("it was replaced by a symbolic link while it was being opened")
        } else {
            ctx.io("open (header check)", e)
        }
    })?;
    let fmeta = f.metadata().map_err(|e| ctx.io("fstat", e))?;
    if !fmeta.file_type().is_file() || (fmeta.dev(), fmeta.ino()) != folder::key(meta) {
        return Err(ctx.corrupt(
            "the file was replaced while it was being opened (a symlink or another file took its place)",
        ));
    }
    // Owner and mode on the descriptor itself (issue #29); SQLite then opens the same
    // inode (the caller re-checks the name's (dev, ino) after SQLite's open).
    let abs = Path::new(ctx.file);
    check_trusted(ctx, name, abs, fmeta.uid(), fmeta.mode(), false)?;
    let len = fmeta.len();
    if len == 0 {
        return Err(ctx.corrupt(
            "the file is empty (0 bytes); stores are created whole and then linked into place, so an empty file was never one",
        ));
    }
    let mut head = Vec::with_capacity(HEADER_LEN);
    (&mut f)
        .take(HEADER_LEN as u64)
        .read_to_end(&mut head)
        .map_err(|e| ctx.io("read (header check)", e))?;
    drop(f);
    if head.len() < MAGIC.len() || &head[..MAGIC.len()] != MAGIC {
        return Err(ctx.corrupt("it is not an SQLite database (no SQLite header)"));
    }
    if head.len() < HEADER_LEN {
        return Err(ctx.corrupt(format!(
            "it is truncated: {len} bytes, shorter than the 100-byte SQLite header"
        )));
    }
    let be16 = |at: usize| u16::from_be_bytes([head[at], head[at + 1]]);
    let be32 = |at: usize| u32::from_be_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
    let page_size: u64 = match be16(16) {
        1 => 65_536,
        n if n >= 512 && n.is_power_of_two() => u64::from(n),
        n => return Err(ctx.corrupt(format!("its header has an invalid page size {n}"))),
    };
    if !matches!(head[18], 1 | 2) || !matches!(head[19], 1 | 2) {
        return Err(ctx.corrupt(format!(
            "its header has unknown file format versions {}/{}",
            head[18], head[19]
        )));
    }
    if head[21..24] != [64, 32, 32] {
        return Err(ctx.corrupt("its header has invalid payload fractions"));
    }
    let user_version = be32(60);
    if user_version != kind.version() {
        return Err(ctx.unsupported_as(kind, kind.describe_other(user_version)));
    }
    // Without a WAL holding newer pages, the main file alone must be whole: a length that is
    // a multiple of the page size and, when the header's page count is valid (its change
    // counter equals "version valid for"), exactly that many pages. With a non-empty WAL the
    // file may legitimately differ until the WAL is replayed; SQLite's quick_check decides.
    if wal_is_empty {
        if len % page_size != 0 {
            return Err(ctx.corrupt(format!(
                "it is truncated or damaged: {len} bytes is not a whole number of {page_size}-byte pages"
            )));
        }
        let pages = u64::from(be32(28));
        if be32(24) == be32(92) && pages != 0 && pages * page_size != len {
            return Err(ctx.corrupt(format!(
                "it is truncated or damaged: its header says {pages} pages of {page_size} bytes ({} bytes), the file has {len} bytes",
                pages * page_size
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #15: a FIFO (or a symlink) swapped in between the `lstat` and the header
    /// check's open is refused at once; the open never blocks on it.
    #[test]
    fn a_fifo_or_symlink_swapped_in_after_the_lstat_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.sqlite");
        std::fs::write(&path, b"x").unwrap();
        let folder = Folder::open(dir.path()).unwrap();
        let meta = folder.lstat("run.sqlite").unwrap().unwrap();
        let ctx = Ctx {
            run: "r",
            file: "store/run.sqlite",
        };
        std::fs::remove_file(&path).unwrap();
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .unwrap();
        assert!(made.success());
        let started = std::time::Instant::now();
        let e = check(&ctx, &folder, "run.sqlite", &meta, true, Kind::Store).unwrap_err();
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        assert_eq!(e.code(), "STORE_CORRUPT", "{e}");

        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &path).unwrap();
        let e = check(&ctx, &folder, "run.sqlite", &meta, true, Kind::Store).unwrap_err();
        assert_eq!(e.code(), "STORE_CORRUPT", "{e}");
    }
}
