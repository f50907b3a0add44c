//! Tests written for the mutants the one-off `cargo mutants` run of issue #30 found
//! missed in `src/store/commit.rs`: each pins a behaviour no other test checked.

mod common;

use common::*;
use lease_sqlite::Batch;

/// `Store::commit`'s contract: a failure of SQLite inside the commit (here the one a test
/// can provoke: a head at `i64::MAX`, so the next commit has no sequence) leaves the
/// handle refusing every call (`STORE_IO`, naming the first failure), reads included.
#[test]
fn a_commit_that_fails_inside_its_transaction_breaks_the_handle() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store/run.sqlite");
    let mut s = open_store(&path);
    s.commit(g(1), &Batch::new().put("a", "1")).unwrap();
    s.close().unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute(
        "INSERT INTO commits (seq, token, committed_at, write_count, log_entries, writes) \
         SELECT 9223372036854775807, token, committed_at, write_count, log_entries, writes \
         FROM commits WHERE seq = 1",
        [],
    )
    .unwrap();
    raw.close().unwrap();

    let mut s = open_store(&path);
    assert_eq!(s.head().unwrap(), i64::MAX as u64);
    let e = s.commit(g(1), &Batch::new().put("b", "2")).unwrap_err();
    assert_eq!(e.code().as_str(), "STORE_INTERNAL", "{e}");
    assert!(e.to_string().contains("next sequence"), "{e}");
    let again = s.head().unwrap_err();
    assert_eq!(again.code().as_str(), "STORE_IO", "{again}");
    assert!(again.to_string().contains("next sequence"), "{again}");
}
