//! SQLite plumbing shared by the store's jobs: connections, error classification, the
//! durability settings, clock and random text, integer conversions.

use crate::error::StoreError;
use crate::folder::Folder;
use crate::header::Ctx;
use lease_core::Timestamp;
use rusqlite::{Connection, ErrorCode, OpenFlags};

/// `PRAGMA wal_autocheckpoint`: SQLite's default (pages), set explicitly and read back.
pub const WAL_AUTOCHECKPOINT_PAGES: i64 = 1000;

pub(super) fn now_text() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    Timestamp::from_unix_millis(ms)
        .unwrap_or(Timestamp::EPOCH)
        .to_string()
}

pub(super) fn random_hex(bytes: usize) -> Result<String, getrandom::Error> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

pub(super) fn wal_name(name: &str) -> String {
    format!("{name}-wal")
}

/// Open a connection to `name` in `dir`: beneath the held folder descriptor through the
/// [`crate::vfs`] shim (`/proc/self/fd/N/name`), or by path when `/proc` is unavailable.
pub(super) fn connect(dir: &Folder, name: &str) -> Result<Connection, rusqlite::Error> {
    match dir.sqlite_target(name) {
        (target, Some(vfs)) => Connection::open_with_flags_and_vfs(target, open_flags(), vfs),
        (target, None) => Connection::open_with_flags(target, open_flags()),
    }
}

/// Classify an SQLite error.
pub(super) fn sqlite_err(ctx: &Ctx<'_>, op: &'static str, e: rusqlite::Error) -> StoreError {
    let code = match &e {
        rusqlite::Error::SqliteFailure(f, _) => Some(f.code),
        _ => None,
    };
    match code {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Busy {
            run: ctx.run.to_string(),
            file: ctx.file.to_string(),
            detail: format!(
                "another process holds SQLite's exclusive lock on it ({e}); only one process may have a store open"
            ),
        },
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            ctx.corrupt(format!("{op}: {e}"))
        }
        Some(
            ErrorCode::SystemIoFailure
            | ErrorCode::DiskFull
            | ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied
            | ErrorCode::ReadOnly
            | ErrorCode::FileLockingProtocolFailed
            | ErrorCode::NoLargeFileSupport,
        ) => ctx.io(op, e),
        _ => StoreError::Internal {
            run: ctx.run.to_string(),
            file: ctx.file.to_string(),
            op,
            detail: e.to_string(),
        },
    }
}

pub(super) fn to_i64(what: &'static str, v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::ArgumentInvalid {
        what,
        reason: format!("{v} is above the store's limit {}", i64::MAX),
    })
}

pub(super) fn from_i64(v: i64) -> u64 {
    // Columns are CHECKed non-negative; a negative value (a hand-edited file) reads as 0.
    u64::try_from(v).unwrap_or(0)
}

fn open_flags() -> OpenFlags {
    // No SQLITE_OPEN_CREATE: the file exists (created whole and linked into place, or it
    // was already there); NOFOLLOW: never through a symlink; NO_MUTEX: a handle is used by
    // one thread at a time (`&mut self` for writes, `Store: Send + !Sync`).
    OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NOFOLLOW
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_EXRESCODE
}

/// Set a pragma and read back what SQLite reports it as; a mismatch is recorded.
fn set_pragma(
    conn: &Connection,
    name: &str,
    value: &str,
    want: &str,
    mismatches: &mut Vec<String>,
) -> Result<(), rusqlite::Error> {
    conn.execute_batch(&format!("PRAGMA {name} = {value}"))?;
    let got: String = conn.query_row(&format!("PRAGMA {name}"), [], |r| {
        let v: rusqlite::types::Value = r.get(0)?;
        Ok(match v {
            rusqlite::types::Value::Integer(i) => i.to_string(),
            rusqlite::types::Value::Text(t) => t.to_lowercase(),
            other => format!("{other:?}"),
        })
    })?;
    if got != want {
        mismatches.push(format!("{name}: wanted {want}, got {got}"));
    }
    Ok(())
}

/// The durability settings (see the crate docs), each read back.
pub(super) fn apply_durability(conn: &Connection) -> Result<Vec<String>, rusqlite::Error> {
    let mut m = Vec::new();
    // locking_mode first: set before the WAL is first used, the WAL index lives in heap
    // memory (no `-shm` file) and the connection holds an exclusive lock on the file.
    set_pragma(conn, "locking_mode", "EXCLUSIVE", "exclusive", &mut m)?;
    set_pragma(conn, "journal_mode", "WAL", "wal", &mut m)?;
    set_pragma(conn, "synchronous", "FULL", "2", &mut m)?;
    set_pragma(conn, "mmap_size", "0", "0", &mut m)?;
    let ckpt = WAL_AUTOCHECKPOINT_PAGES.to_string();
    set_pragma(conn, "wal_autocheckpoint", &ckpt, &ckpt, &mut m)?;
    Ok(m)
}
