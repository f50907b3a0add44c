//! `Store::open_read_only` (issue #20's readers on a free run): the reading methods of a
//! store, and not one byte written to its folder, whatever it finds.

mod common;

use common::*;
use lease_core::RunId;
use lease_sqlite::{Batch, Store};

/// A sealed (cleanly closed) store with two commits, in `dir/store/run.sqlite`.
fn sealed(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("store/run.sqlite");
    let mut s = open_store(&path);
    s.commit(g(1), &Batch::new().put("a/1", "one").log("first"))
        .unwrap();
    s.commit(
        g(1),
        &Batch::new().put("a/2", "two").put("b", "x").delete("a/1"),
    )
    .unwrap();
    s.seal(g(1)).unwrap();
    path
}

#[test]
fn a_sealed_store_reads_whole_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let path = sealed(tmp.path());
    let before = snapshot(tmp.path());
    let r = Store::open_read_only(&run(), &path).unwrap();
    assert_eq!(r.head().unwrap(), 2);
    assert_eq!(r.get("a/2").unwrap().unwrap().value, b"two".to_vec());
    assert_eq!(r.get("a/1").unwrap(), None);
    let keys: Vec<String> = r
        .scan_prefix("a/")
        .unwrap()
        .into_iter()
        .map(|d| d.key)
        .collect();
    assert_eq!(keys, ["a/2"]);
    let log = r.commits_since(0).unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].seq, 1);
    drop(r);
    assert_eq!(snapshot(tmp.path()), before, "the read wrote nothing");
    // An owner opens it afterwards as usual.
    let s = open_store(&path);
    assert_eq!(s.head().unwrap(), 2);
}

#[test]
fn a_crashed_owners_wal_is_refused_and_left_as_it_is() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("store/run.sqlite");
    let mut s = open_store(&path);
    s.commit(g(1), &Batch::new().put("k", "v")).unwrap();
    drop(s); // no close: the commit is only in the WAL, as after a crash
    let before = snapshot(tmp.path());
    assert!(
        before.contains_key("store/run.sqlite-wal"),
        "{:?}",
        before.keys()
    );
    let e = Store::open_read_only(&run(), &path).unwrap_err();
    assert_refused(&e, "STORE_BUSY", &path);
    assert!(e.to_string().contains("write-ahead log"), "{e}");
    assert_eq!(snapshot(tmp.path()), before);
    // The next owner's open replays it: nothing was lost.
    let s = open_store(&path);
    assert_eq!(s.get("k").unwrap().unwrap().value, b"v".to_vec());
}

#[test]
fn no_store_is_missing_and_nothing_is_created() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("store")).unwrap();
    let path = tmp.path().join("store/run.sqlite");
    let e = Store::open_read_only(&run(), &path).unwrap_err();
    assert_refused(&e, "STORE_MISSING", &path);
    assert_eq!(snapshot(tmp.path()).len(), 1, "only the empty store folder");
}

#[test]
fn another_runs_store_and_a_store_open_in_this_process_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = sealed(tmp.path());
    let before = snapshot(tmp.path());
    let other = RunId::new("another-run").unwrap();
    let e = Store::open_read_only(&other, &path).unwrap_err();
    assert_eq!(e.code().as_str(), "STORE_IDENTITY_MISMATCH", "{e}");
    assert_eq!(snapshot(tmp.path()), before);
    // While this process's owner connection has it open: refused (a second descriptor's
    // close would drop that connection's locks).
    let owner = open_store(&path);
    let e = Store::open_read_only(&run(), &path).unwrap_err();
    assert_refused(&e, "STORE_BUSY", &path);
    drop(owner);
}

#[test]
fn a_file_that_is_not_a_store_is_refused_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("store")).unwrap();
    let path = tmp.path().join("store/run.sqlite");
    std::fs::write(&path, b"not a database at all, just some bytes").unwrap();
    let before = snapshot(tmp.path());
    let e = Store::open_read_only(&run(), &path).unwrap_err();
    assert_refused(&e, "STORE_CORRUPT", &path);
    assert_eq!(snapshot(tmp.path()), before);
}

#[test]
fn an_empty_wal_holds_nothing_and_is_read_past() {
    // What an owner killed before its first write since its last checkpoint leaves.
    let tmp = tempfile::tempdir().unwrap();
    let path = sealed(tmp.path());
    std::fs::write(tmp.path().join("store/run.sqlite-wal"), b"").unwrap();
    let before = snapshot(tmp.path());
    let r = Store::open_read_only(&run(), &path).unwrap();
    assert_eq!(r.head().unwrap(), 2);
    drop(r);
    assert_eq!(snapshot(tmp.path()), before);
}

#[test]
fn a_leftover_temp_name_of_the_store_is_left_and_nothing_is_written() {
    // A creation that crashed between its link and its unlink leaves the store's temp
    // name: the owner's open removes it (and fsyncs store/); the reader that writes
    // nothing leaves it (issue #28: it removed it and fsynced store/). Another name of
    // the file that is not such a temp name is still refused.
    let tmp = tempfile::tempdir().unwrap();
    let path = sealed(tmp.path());
    let temp = tmp.path().join("store/.tmp-4242-store-00112233aabbccdd");
    std::fs::hard_link(&path, &temp).unwrap();
    let before = snapshot(tmp.path());
    let r = Store::open_read_only(&run(), &path).unwrap();
    assert_eq!(r.head().unwrap(), 2);
    assert_eq!(r.get("a/2").unwrap().unwrap().value, b"two".to_vec());
    drop(r);
    assert_eq!(snapshot(tmp.path()), before, "the read wrote nothing");
    assert!(temp.exists());
    // A second name that is not the store's temp name: refused, unchanged.
    std::fs::hard_link(&path, tmp.path().join("store/copy.sqlite")).unwrap();
    let before = snapshot(tmp.path());
    let e = Store::open_read_only(&run(), &path).unwrap_err();
    assert_refused(&e, "STORE_CORRUPT", &path);
    assert_eq!(snapshot(tmp.path()), before);
    // The owner's open removes the temp name.
    std::fs::remove_file(tmp.path().join("store/copy.sqlite")).unwrap();
    let s = open_store(&path);
    assert_eq!(s.head().unwrap(), 2);
    drop(s);
    assert!(!temp.exists());
}
