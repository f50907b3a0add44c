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
    Ok(hex::encode(buf))
}

pub(super) fn wal_name(name: &str) -> String {
    format!("{name}-wal")
}

/// The rollback journal SQLite would look for beside `name` (a store is in WAL mode and
/// never makes one; one found there is judged like the WAL).
pub(super) fn journal_name(name: &str) -> String {
    format!("{name}-journal")
}

/// Open a connection to `name` in `dir`: beneath the held folder descriptor through the
/// [`crate::vfs`] shim (`/proc/self/fd/N/name`), or by path when `/proc` is unavailable.
pub(super) fn connect(dir: &Folder, name: &str) -> Result<Connection, rusqlite::Error> {
    let conn = match dir.sqlite_target(name) {
        (target, Some(vfs)) => Connection::open_with_flags_and_vfs(target, open_flags(), vfs),
        (target, None) => Connection::open_with_flags(target, open_flags()),
    }?;
    harden(&conn)?;
    Ok(conn)
}

/// `sqlite3_limit`s of every store connection (issue #29: a store file is data, not
/// code). The schema pin (`validate`) already refuses every object a store is not created
/// with; these bound what SQLite will do for a file that gets past it anyway (a bug, or a
/// damaged page): no string or BLOB above [`crate::MAX_COMMIT_BYTES`] (plus a record's
/// framing) is ever built, read or bound, and statements stay as small as ours are.
const LIMITS: &[(rusqlite::limits::Limit, i32)] = {
    use rusqlite::limits::Limit::*;
    &[
        // A commit's encoded writes, a value, a log entry: at most MAX_COMMIT_BYTES; a
        // docs row adds its key framing and `updated_seq` (well under 4 KiB).
        (SQLITE_LIMIT_LENGTH, (crate::MAX_COMMIT_BYTES + 4096) as i32),
        // Our statements are under 1 KiB; the schema's under 1 KiB each.
        (SQLITE_LIMIT_SQL_LENGTH, 64 * 1024),
        (SQLITE_LIMIT_COLUMN, 64),
        (SQLITE_LIMIT_EXPR_DEPTH, 64),
        (SQLITE_LIMIT_COMPOUND_SELECT, 4),
        (SQLITE_LIMIT_VDBE_OP, 10_000),
        (SQLITE_LIMIT_FUNCTION_ARG, 8),
        (SQLITE_LIMIT_ATTACHED, 0),
        (SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 1024),
        (SQLITE_LIMIT_VARIABLE_NUMBER, 64),
        (SQLITE_LIMIT_TRIGGER_DEPTH, 1),
        (SQLITE_LIMIT_WORKER_THREADS, 0),
    ]
};

/// Defence in depth for a store file that is data, not code (issue #29), set on every
/// connection before its first read: the [`LIMITS`]; `SQLITE_DBCONFIG_DEFENSIVE` (no
/// `writable_schema`, no direct schema edits); `trusted_schema` off (functions with side
/// effects are not run from the schema); triggers and views off (a trigger is never fired
/// and a view never expanded, even one the pin missed); `cell_size_check` on (a damaged
/// b-tree cell is reported as corrupt before it is used). Touches no file.
pub(super) fn harden(conn: &Connection) -> Result<(), rusqlite::Error> {
    use rusqlite::config::DbConfig;
    for (limit, value) in LIMITS {
        conn.set_limit(*limit, *value)?;
    }
    for (config, on) in [
        (DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true),
        (DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false),
        (DbConfig::SQLITE_DBCONFIG_ENABLE_TRIGGER, false),
        (DbConfig::SQLITE_DBCONFIG_ENABLE_VIEW, false),
    ] {
        if conn.set_db_config(config, on)? != on {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_MISUSE),
                Some(format!("{config:?} did not take (wanted {on})")),
            ));
        }
    }
    conn.execute_batch("PRAGMA cell_size_check = ON")
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
        // TooBig: a stored string or BLOB above the connection's SQLITE_LIMIT_LENGTH (a
        // commit never writes one: `MAX_COMMIT_BYTES`).
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt | ErrorCode::TooBig) => {
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

/// The durability settings (see the crate docs), each read back. A view of an engine's
/// store (`kind` [`Kind::View`]) commits with `synchronous = NORMAL`: in WAL mode a
/// transaction is still atomic and a process crash loses nothing, and a power loss can
/// only take the view back to an earlier commit together with its recorded position (the
/// `engine_view` row moves in the same transaction), which the next owner's catch-up
/// applies again from the engine. The engine, not the view, is what an acknowledgement
/// rests on (docs/PROTOCOL.md §18.3), so the view's fsync per commit bought nothing.
pub(super) fn apply_durability(
    conn: &Connection,
    kind: crate::schema::Kind,
) -> Result<Vec<String>, rusqlite::Error> {
    let mut m = Vec::new();
    // locking_mode first: set before the WAL is first used, the WAL index lives in heap
    // memory (no `-shm` file) and the connection holds an exclusive lock on the file.
    set_pragma(conn, "locking_mode", "EXCLUSIVE", "exclusive", &mut m)?;
    set_pragma(conn, "journal_mode", "WAL", "wal", &mut m)?;
    match kind {
        crate::schema::Kind::View => set_pragma(conn, "synchronous", "NORMAL", "1", &mut m)?,
        _ => set_pragma(conn, "synchronous", "FULL", "2", &mut m)?,
    }
    set_pragma(conn, "mmap_size", "0", "0", &mut m)?;
    let ckpt = WAL_AUTOCHECKPOINT_PAGES.to_string();
    set_pragma(conn, "wal_autocheckpoint", &ckpt, &ckpt, &mut m)?;
    Ok(m)
}
