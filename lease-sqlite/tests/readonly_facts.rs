//! What SQLite (the bundled version) does when a store is opened read-only: the facts the
//! read-only reader of issue #20 (`runlease store get/list/log` on a free run, which must
//! never create, migrate or write anything) is designed on. If an upgrade of SQLite changes
//! one of them, this test says which, before the reader silently starts writing or
//! reading stale data.
//!
//! The store is in WAL mode with `locking_mode=EXCLUSIVE` (no `-shm`). Findings:
//! - a read-only open in the default (shared) locking mode **creates** `-shm` (and `-wal`
//!   on a cleanly closed store): it writes into the store's folder;
//! - a read-only open in exclusive locking mode fails (`SQLITE_IOERR_LOCK`);
//! - `immutable=1` reads without writing anything, correctly when no `-wal` exists (a clean
//!   release checkpoints and removes it), but **silently misses** the commits of a `-wal`
//!   a crashed owner left.
//!
//! So the reader opens with `immutable=1` only when no `-wal` exists, while holding the
//! run's owner lock (so no owner can open the store under it: `immutable` takes no SQLite
//! lock), and refuses otherwise.

use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};

/// Every file of `dir` with its bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).unwrap())
        })
        .collect();
    v.sort();
    v
}

fn names(dir: &Path) -> Vec<String> {
    files(dir).into_iter().map(|(n, _)| n).collect()
}

/// A store-like database `dir/s.sqlite` with three committed rows. `crashed`: the files
/// as a crashed owner leaves them (copied while the writer still has them open: the last
/// two commits only in the `-wal`); else as a clean close leaves them (checkpointed, the
/// WAL removed). Written in a folder of its own, so no lock of the writer is on the copy.
fn make(dir: &Path, crashed: bool) -> PathBuf {
    let src = tempfile::tempdir().unwrap();
    let sp = src.path().join("s.sqlite");
    let c = Connection::open(&sp).unwrap();
    c.pragma_update(None, "locking_mode", "EXCLUSIVE").unwrap();
    c.pragma_update(None, "journal_mode", "WAL").unwrap();
    c.pragma_update(None, "synchronous", "FULL").unwrap();
    c.pragma_update(None, "wal_autocheckpoint", 0).unwrap();
    c.execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        .unwrap();
    c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);").unwrap();
    c.execute_batch("INSERT INTO t VALUES (2); INSERT INTO t VALUES (3);")
        .unwrap();
    if !crashed {
        c.close().unwrap(); // the last connection checkpoints and removes the WAL
    }
    for (name, bytes) in files(src.path()) {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    dir.join("s.sqlite")
}

fn count(c: &Connection) -> rusqlite::Result<i64> {
    c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
}

fn read_only(p: &Path, exclusive: bool) -> rusqlite::Result<i64> {
    let c = Connection::open_with_flags(
        p,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    if exclusive {
        c.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    }
    count(&c)
}

fn immutable(p: &Path) -> rusqlite::Result<i64> {
    let uri = format!("file:{}?immutable=1", p.display());
    let c = Connection::open_with_flags(
        uri,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI,
    )?;
    count(&c)
}

#[test]
fn a_shared_read_only_open_writes_into_the_folder() {
    for crashed in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let p = make(d.path(), crashed);
        assert_eq!(read_only(&p, false).unwrap(), 3);
        assert!(
            names(d.path()).contains(&"s.sqlite-shm".to_string()),
            "crashed={crashed}: {:?}",
            names(d.path())
        );
    }
}

#[test]
fn an_exclusive_read_only_open_fails_and_writes_nothing() {
    for crashed in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let p = make(d.path(), crashed);
        let before = files(d.path());
        let e = read_only(&p, true).unwrap_err();
        assert_eq!(
            e.sqlite_error_code(),
            Some(rusqlite::ErrorCode::SystemIoFailure),
            "{e}"
        );
        assert_eq!(files(d.path()), before, "crashed={crashed}");
    }
}

#[test]
fn immutable_reads_a_clean_store_whole_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let p = make(d.path(), false);
    assert_eq!(names(d.path()), ["s.sqlite"]);
    let before = files(d.path());
    assert_eq!(immutable(&p).unwrap(), 3);
    assert_eq!(files(d.path()), before);
}

#[test]
fn immutable_misses_what_a_crashed_owners_wal_holds() {
    let d = tempfile::tempdir().unwrap();
    let p = make(d.path(), true);
    assert_eq!(names(d.path()), ["s.sqlite", "s.sqlite-wal"]);
    let before = files(d.path());
    assert_eq!(immutable(&p).unwrap(), 1, "only the checkpointed commit");
    assert_eq!(files(d.path()), before);
}
