//! Every refusal with its code: seal (behind the seal, another store, below the floor),
//! schema, corrupt or misplaced files, a second open in this process and in another
//! process, a missing store. Each refused file is left byte for byte as it was.

mod common;

use common::{Rng, assert_refused, child_command, create, g, open_store, run, snapshot};
use lease_core::Identity;
use lease_sqlite::{Batch, Expected, Store, StoreError, StoreOptions};
use std::io::Read;
use std::path::{Path, PathBuf};

fn scratch() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store/run.sqlite");
    (dir, path)
}

/// Open `path` (with `create` set, to prove nothing is recreated) and expect a refusal
/// with `code` naming the file, with the whole folder unchanged afterwards.
fn refused_unchanged(dir: &Path, path: &Path, code: &str) -> StoreError {
    let before = snapshot(dir);
    let err = Store::open(&run(), path, create()).unwrap_err();
    assert_refused(&err, code, path);
    assert_eq!(
        snapshot(dir),
        before,
        "a refused open changed the folder ({code})"
    );
    err
}

/// A store with `n` commits, closed (checkpointed: no WAL left).
fn store_with(path: &Path, n: u64) {
    let mut s = open_store(path);
    for i in 0..n {
        s.commit(
            g(1),
            &Batch::new()
                .put(format!("doc/{i}"), vec![b'v'; 300])
                .log("x"),
        )
        .unwrap();
    }
    s.close().unwrap();
}

// ---------------------------------------------------------------- seal

#[test]
fn seal_refusal_store_behind_its_seal() {
    let (dir, path) = scratch();
    store_with(&path, 2);
    let backup = dir.path().join("backup.sqlite");
    std::fs::copy(&path, &backup).unwrap();
    let mut s = open_store(&path);
    s.commit(g(1), &Batch::new().put("more", "1")).unwrap();
    let seal = s.seal(g(1)).unwrap();
    assert_eq!(seal.sequence, 3);
    // Restore the older copy of the same store (same id, head 2) over it.
    std::fs::rename(&backup, &path).unwrap();
    let opened = Store::open(&run(), &path, StoreOptions::default()).unwrap();
    assert_eq!(opened.identity().unwrap().head, 2);
    let err = opened.check_seal(Some(&seal), None).unwrap_err();
    assert_refused(&err, "STORE_BEHIND_SEAL", &path);
    assert!(
        err.to_string().contains("head 2 is below the seal 3"),
        "{err}"
    );
    // The handle is gone: the store opens again (and stays refused).
    let opened = Store::open(&run(), &path, StoreOptions::default()).unwrap();
    assert!(opened.check_seal(Some(&seal), None).is_err());
}

#[test]
fn seal_refusal_different_store_id_even_with_a_higher_head() {
    let (dir, path) = scratch();
    store_with(&path, 1);
    let seal = open_store(&path).seal(g(2)).unwrap();
    // Another store, further ahead, in its place.
    let other = dir.path().join("other/run.sqlite");
    store_with(&other, 5);
    std::fs::rename(&other, &path).unwrap();
    let opened = Store::open(&run(), &path, StoreOptions::default()).unwrap();
    assert_eq!(opened.identity().unwrap().head, 5);
    let err = opened.check_seal(Some(&seal), None).unwrap_err();
    assert_refused(&err, "STORE_IDENTITY_MISMATCH", &path);
    // The same refusal at open, when the expected store id is given.
    let expect = Expected {
        store_id: seal.store_id.clone(),
    };
    let err = Store::open(
        &run(),
        &path,
        StoreOptions {
            create: false,
            expect: Some(expect),
        },
    )
    .unwrap_err();
    assert_refused(&err, "STORE_IDENTITY_MISMATCH", &path);
}

#[test]
fn seal_refusal_below_the_floor() {
    let (_dir, path) = scratch();
    store_with(&path, 3);
    let opened = Store::open(&run(), &path, StoreOptions::default()).unwrap();
    let err = opened.check_seal(None, Some((4, g(7)))).unwrap_err();
    assert_refused(&err, "STORE_BEHIND_SEAL", &path);
    assert!(err.to_string().contains("below the floor 4"), "{err}");
    let opened = Store::open(&run(), &path, StoreOptions::default()).unwrap();
    assert!(opened.check_seal(None, Some((3, g(7)))).is_ok());
}

#[test]
fn an_expected_store_is_never_created_when_missing() {
    let (dir, path) = scratch();
    let expect = Expected {
        store_id: Identity::new("0123456789abcdef0123456789abcdef").unwrap(),
    };
    let err = Store::open(
        &run(),
        &path,
        StoreOptions {
            create: true,
            expect: Some(expect),
        },
    )
    .unwrap_err();
    assert_refused(&err, "STORE_MISSING", &path);
    let err = Store::open(&run(), &path, StoreOptions::default()).unwrap_err();
    assert_refused(&err, "STORE_MISSING", &path);
    assert!(snapshot(dir.path()).is_empty(), "something was created");
}

// ---------------------------------------------------------------- schema

/// A raw SQLite database (not through this crate) with `setup` applied.
fn raw_db(path: &Path, wal: bool, setup: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let c = rusqlite::Connection::open(path).unwrap();
    if wal {
        let m: String = c
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .unwrap();
        assert_eq!(m, "wal");
    }
    c.execute_batch(setup).unwrap();
    c.close().unwrap();
}

#[test]
fn schema_refusal_newer_user_version() {
    let (dir, path) = scratch();
    raw_db(
        &path,
        false,
        "CREATE TABLE t (x); INSERT INTO t VALUES (1); PRAGMA user_version = 99;",
    );
    let err = refused_unchanged(dir.path(), &path, "SCHEMA_UNSUPPORTED");
    assert!(err.to_string().contains("version 99"), "{err}");
}

#[test]
fn schema_refusal_our_store_with_a_newer_version() {
    // A real store whose version a newer build raised (header and store_meta).
    let (dir, path) = scratch();
    store_with(&path, 2);
    raw_db(
        &path,
        true,
        "PRAGMA user_version = 2; UPDATE store_meta SET schema_version = 2;",
    );
    refused_unchanged(dir.path(), &path, "SCHEMA_UNSUPPORTED");
    // Only store_meta says 2 (the header still says 1): refused by the SQLite-level check,
    // and still nothing changes, WAL mode included.
    let (dir, path) = scratch();
    store_with(&path, 2);
    raw_db(&path, true, "UPDATE store_meta SET schema_version = 2;");
    let err = refused_unchanged(dir.path(), &path, "SCHEMA_UNSUPPORTED");
    assert!(err.to_string().contains("store_meta"), "{err}");
}

#[test]
fn schema_refusal_sqlite_file_without_our_tables() {
    for wal in [false, true] {
        let (dir, path) = scratch();
        raw_db(
            &path,
            wal,
            "CREATE TABLE other (x); PRAGMA user_version = 1;",
        );
        let err = refused_unchanged(dir.path(), &path, "SCHEMA_UNSUPPORTED");
        assert!(err.to_string().contains("without the tables"), "{err}");
        let (dir, path) = scratch();
        raw_db(&path, wal, "CREATE TABLE other (x);");
        let err = refused_unchanged(dir.path(), &path, "SCHEMA_UNSUPPORTED");
        assert!(err.to_string().contains("not a runlease store"), "{err}");
    }
}

// ---------------------------------------------------------------- corrupt

#[test]
fn corrupt_refusal_random_bytes() {
    let (dir, path) = scratch();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, Rng::new(7).bytes(8192)).unwrap();
    let err = refused_unchanged(dir.path(), &path, "STORE_CORRUPT");
    assert!(err.to_string().contains("not an SQLite database"), "{err}");
}

#[test]
fn corrupt_refusal_text_file() {
    let (dir, path) = scratch();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "this is a note, not a database\n").unwrap();
    refused_unchanged(dir.path(), &path, "STORE_CORRUPT");
}

#[test]
fn corrupt_refusal_zero_length_file() {
    let (dir, path) = scratch();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "").unwrap();
    let err = refused_unchanged(dir.path(), &path, "STORE_CORRUPT");
    assert!(err.to_string().contains("empty"), "{err}");
}

#[test]
fn corrupt_refusal_truncated_store() {
    let (dir, path) = scratch();
    store_with(&path, 60);
    let full = std::fs::read(&path).unwrap();
    assert!(full.len() > 8 * 4096, "store too small: {}", full.len());
    // Cut on a page boundary, in the middle of a page, and inside the header.
    for cut in [full.len() / 2 / 4096 * 4096, full.len() / 2 + 123, 60] {
        std::fs::write(&path, &full[..cut]).unwrap();
        let err = refused_unchanged(dir.path(), &path, "STORE_CORRUPT");
        assert!(err.to_string().contains("truncated"), "{err}");
    }
}

#[test]
fn corrupt_refusal_damaged_pages() {
    let (dir, path) = scratch();
    store_with(&path, 60);
    let mut bytes = std::fs::read(&path).unwrap();
    // Scribble over the middle of pages 2..; the header (page 1) stays valid.
    let mut rng = Rng::new(11);
    for page in 1..bytes.len() / 4096 {
        let at = page * 4096 + 100;
        let junk = rng.bytes(200);
        bytes[at..at + 200].copy_from_slice(&junk);
    }
    std::fs::write(&path, &bytes).unwrap();
    refused_unchanged(dir.path(), &path, "STORE_CORRUPT");
}

#[test]
fn corrupt_refusal_directory_or_symlink_in_place_of_the_file() {
    let (dir, path) = scratch();
    std::fs::create_dir_all(&path).unwrap();
    let err = refused_unchanged(dir.path(), &path, "STORE_CORRUPT");
    assert!(err.to_string().contains("directory"), "{err}");

    let (dir, path) = scratch();
    let real = dir.path().join("elsewhere.sqlite");
    store_with(&real, 1);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&real, &path).unwrap();
    let err = refused_unchanged(dir.path(), &path, "STORE_CORRUPT");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    // A dangling symlink is not "missing" either: nothing is created through it.
    std::fs::remove_file(&real).unwrap();
    refused_unchanged(dir.path(), &path, "STORE_CORRUPT");
}

// ---------------------------------------------------------------- one connection per file

#[test]
fn second_open_in_the_same_process_is_refused() {
    let (dir, path) = scratch();
    let mut first = open_store(&path);
    first.commit(g(1), &Batch::new().put("a", "1")).unwrap();
    let link = dir.path().join("hardlink.sqlite");
    std::fs::hard_link(&path, &link).unwrap();
    let dotted = dir.path().join("store/../store/run.sqlite");
    for other in [&path, &link, &dotted] {
        let err = Store::open(&run(), other, StoreOptions::default()).unwrap_err();
        assert_refused(&err, "STORE_BUSY", other);
        assert!(err.to_string().contains("this process already has it open"));
    }
    // The refused opens dropped nothing: the first handle still works and still holds
    // SQLite's exclusive lock (a raw connection cannot read).
    first.commit(g(1), &Batch::new().put("b", "2")).unwrap();
    let raw = rusqlite::Connection::open_with_flags(
        &path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .unwrap();
    raw.busy_timeout(std::time::Duration::ZERO).unwrap();
    let read: Result<i64, _> = raw.query_row("SELECT count(*) FROM docs", [], |r| r.get(0));
    assert!(read.is_err(), "a second connection could read");
    drop(raw);
    drop(first);
    // Closed, but the file has a second name: refused (its WAL is found by name).
    for other in [&path, &link] {
        let err = Store::open(&run(), other, StoreOptions::default()).unwrap_err();
        assert_refused(&err, "STORE_CORRUPT", other);
        assert!(err.to_string().contains("2 hard links"), "{err}");
    }
    std::fs::remove_file(&link).unwrap();
    // Once the first handle is gone, the file opens again; an unchecked handle holds the
    // registration too.
    let opened = Store::open(&run(), &dotted, StoreOptions::default()).unwrap();
    assert_eq!(
        Store::open(&run(), &path, StoreOptions::default())
            .unwrap_err()
            .code()
            .as_str(),
        "STORE_BUSY"
    );
    let store = opened.check_seal(None, None).unwrap();
    assert_eq!(store.head().unwrap(), 2);
    store.close().unwrap();
    assert!(Store::open(&run(), &path, StoreOptions::default()).is_ok());
}

#[test]
fn a_temp_name_left_by_a_crashed_creator_is_cleaned_up() {
    let (_dir, path) = scratch();
    store_with(&path, 1);
    let leftover = path.with_file_name(".tmp-12345-store-00112233aabbccdd");
    std::fs::hard_link(&path, &leftover).unwrap();
    // An unrelated temp file (another inode) is left alone.
    let unrelated = path.with_file_name(".tmp-777-1-000000001");
    std::fs::write(&unrelated, "x").unwrap();
    let store = Store::open(&run(), &path, StoreOptions::default()).unwrap();
    assert_eq!(store.identity().unwrap().head, 1);
    assert!(!leftover.exists());
    assert!(unrelated.exists());
}

const SECOND_PROCESS: &str = "LEASE_SQLITE_SECOND_PROCESS_STORE";

/// Child role: try to open the store and report `RESULT <code> <message>` (or `RESULT ok`).
#[test]
fn second_process_open_is_refused() {
    if let Ok(path) = std::env::var(SECOND_PROCESS) {
        let line = match Store::open(&run(), Path::new(&path), StoreOptions::default()) {
            Ok(opened) => {
                let head = opened.identity().unwrap().head;
                format!("RESULT ok {head}")
            }
            Err(e) => format!("RESULT {} {}", e.code().as_str(), e),
        };
        println!("{line}");
        return;
    }
    let (_dir, path) = scratch();
    let ask_child = || -> String {
        let mut child = child_command(
            "second_process_open_is_refused",
            &[(SECOND_PROCESS, path.display().to_string())],
        )
        .spawn()
        .unwrap();
        let mut out = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert!(child.wait().unwrap().success());
        out.lines()
            .find_map(|l| l.strip_prefix("RESULT "))
            .unwrap_or_else(|| panic!("no RESULT line in {out:?}"))
            .to_string()
    };
    // Held by an unchecked handle, and by a committing one.
    let opened = Store::open(&run(), &path, create()).unwrap();
    let answer = ask_child();
    assert!(answer.starts_with("STORE_BUSY "), "{answer}");
    assert!(answer.contains("database is locked"), "{answer}");
    let mut store = opened.check_seal(None, None).unwrap();
    store.commit(g(1), &Batch::new().put("a", "1")).unwrap();
    let answer = ask_child();
    assert!(answer.starts_with("STORE_BUSY "), "{answer}");
    // The refused child changed nothing for the owner.
    store.commit(g(1), &Batch::new().put("b", "2")).unwrap();
    // Dropped without close (WAL left behind): the child now opens it and sees head 2.
    drop(store);
    assert_eq!(ask_child(), "ok 2");
}

const OTHER_USER: &str = "LEASE_SQLITE_OTHER_USER_STORE";

/// A store whose folder belongs to another uid and is `0700` (as runlease makes them):
/// the kernel refuses the folder before its owner can be judged, and that refusal is
/// `RUN_NOT_OWNED` naming the folder, its owner and mode, as for a folder that opens,
/// not an I/O error. Run as root; the child role runs as uid 65534 (`setpriv`).
#[test]
fn another_users_store_folder_is_not_owned() {
    if let Ok(path) = std::env::var(OTHER_USER) {
        for read_only in [false, true] {
            let got = if read_only {
                Store::open_read_only(&run(), Path::new(&path)).map(|_| ())
            } else {
                Store::open(&run(), Path::new(&path), StoreOptions::default()).map(|_| ())
            };
            match got {
                Ok(()) => println!("RESULT ok"),
                Err(e) => println!("RESULT {} {}", e.code().as_str(), e),
            }
        }
        return;
    }
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root to run a child as uid 65534");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store/run.sqlite");
    store_with(&path, 1);
    let folder = path.parent().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    if dir
        .path()
        .ancestors()
        .skip(1)
        .any(|p| std::fs::metadata(p).map_or(0, |m| m.permissions().mode()) & 0o001 == 0)
    {
        eprintln!("skipped: the temp folder is not searchable by uid 65534");
        return;
    }
    // This test binary, where uid 65534 can run it.
    let bin = dir.path().join("refusals");
    std::fs::copy(std::env::current_exe().unwrap(), &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let before = snapshot(folder);
    let out = match std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args([
            "another_users_store_folder_is_not_owned",
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env(OTHER_USER, &path)
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: no setpriv ({e})");
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "child failed: {text}");
    let answers: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .collect();
    assert_eq!(answers.len(), 2, "{text}");
    for a in answers {
        assert!(a.starts_with("RUN_NOT_OWNED "), "{a}");
        assert!(
            a.contains(&folder.display().to_string())
                && a.contains("owner uid 0, mode 0700")
                && a.contains("not by uid 65534"),
            "{a}"
        );
    }
    assert_eq!(
        snapshot(folder),
        before,
        "a refused open changed the folder"
    );
}

// ---------------------------------------------------------------- durability settings

#[test]
fn durability_settings_no_shm_file_and_wal_checkpointed_on_close() {
    let (_dir, path) = scratch();
    let shm = PathBuf::from(format!("{}-shm", path.display()));
    let wal = PathBuf::from(format!("{}-wal", path.display()));
    let mut store = open_store(&path);
    store.commit(g(1), &Batch::new().put("a", "1")).unwrap();
    assert!(wal.exists(), "WAL mode: the commit is in the -wal file");
    assert!(!shm.exists(), "exclusive locking: no -shm file");
    let mode = std::fs::metadata(&path).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    store.close().unwrap();
    assert!(
        !wal.exists() && !shm.exists(),
        "close checkpoints and removes the WAL"
    );
    // The file alone holds the commit, and is in WAL mode.
    let raw = rusqlite::Connection::open(&path).unwrap();
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let n: i64 = raw
        .query_row("SELECT count(*) FROM commits", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    drop(raw);
    // No temp files are left beside the store.
    let names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["run.sqlite"]);
}

#[test]
fn a_store_is_created_once_and_keeps_its_identity() {
    let (_dir, path) = scratch();
    let a = Store::open(&run(), &path, create()).unwrap();
    let id = a.identity().unwrap();
    assert_eq!((id.store_id.len(), id.head), (32, 0));
    assert!(id.store_id.bytes().all(|b| b.is_ascii_hexdigit()));
    drop(a);
    let b = Store::open(&run(), &path, create()).unwrap();
    assert_eq!(
        b.identity().unwrap(),
        id,
        "reopening with create keeps the store"
    );
    let (_dir2, other) = scratch();
    let c = Store::open(&run(), &other, create()).unwrap();
    assert_ne!(c.identity().unwrap().store_id, id.store_id);
}

#[test]
fn concurrent_openers_and_creators_in_one_process_get_one_handle() {
    use std::sync::{Arc, Barrier};
    let (_dir, path) = scratch();
    for round in 0..2 {
        // Round 0: nobody has created the store yet (all race to create it); round 1: it
        // exists.
        let barrier = Arc::new(Barrier::new(6));
        let handles: Vec<Result<String, &str>> = (0..6)
            .map(|_| {
                let path = path.clone();
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    let r = Store::open(&run(), &path, create());
                    let out = match &r {
                        Ok(o) => Ok(o.identity().unwrap().store_id),
                        Err(e) => Err(e.code().as_str()),
                    };
                    barrier.wait(); // everyone holds its result until all have tried
                    out
                })
            })
            .collect::<Vec<_>>() // spawn them all before joining any
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        let _ = round;
        let ok: Vec<&String> = handles.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(ok.len(), 1, "{handles:?}");
        assert!(
            handles
                .iter()
                .all(|r| matches!(r, Ok(_) | Err("STORE_BUSY"))),
            "{handles:?}"
        );
    }
    // One store (and the WAL a dropped handle leaves), no temp files.
    let mut names: Vec<String> = std::fs::read_dir(path.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["run.sqlite", "run.sqlite-wal"]);
}

/// Issue #15: once the store folder is held, swapping it for a symlink to another run's
/// store folder changes nothing. The store is created, opened and written in the held
/// folder (SQLite reaches it as `/proc/self/fd/N/…`), and nothing appears in the other
/// folder.
#[test]
fn a_store_folder_swapped_for_a_symlink_after_it_is_held_is_not_followed() {
    let root = tempfile::tempdir().unwrap();
    let (held, other) = (root.path().join("store"), root.path().join("other-store"));
    std::fs::create_dir(&held).unwrap();
    std::fs::create_dir(&other).unwrap();
    let fd: std::os::fd::OwnedFd = std::fs::File::open(&held).unwrap().into();
    let moved = root.path().join("store.moved");
    std::fs::rename(&held, &moved).unwrap();
    std::os::unix::fs::symlink(&other, &held).unwrap();

    let opened = Store::open_in(&run(), fd, &held, "run.sqlite", create()).unwrap();
    assert!(
        opened.reached_through_fd(),
        "/proc is mounted here, so SQLite must be reached through the held descriptor"
    );
    let mut store = opened.check_seal(None, None).unwrap();
    store.commit(g(1), &Batch::new().put("doc/a", "x")).unwrap();
    store.close().unwrap();

    assert!(
        moved.join("run.sqlite").is_file(),
        "the store is in the held folder"
    );
    let in_other: Vec<_> = std::fs::read_dir(&other).unwrap().collect();
    assert!(
        in_other.is_empty(),
        "nothing may be written in the symlink's target: {in_other:?}"
    );
    // And the store reopens from the held folder with the commit in it.
    let s = open_store(&moved.join("run.sqlite"));
    assert_eq!(s.head().unwrap(), 1);
}

/// A store folder that is itself a symlink is refused by `Store::open` (never followed),
/// and the symlink's target is left as it was.
#[test]
fn a_symlinked_store_folder_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let other = root.path().join("elsewhere");
    std::fs::create_dir(&other).unwrap();
    std::os::unix::fs::symlink(&other, root.path().join("store")).unwrap();
    let path = root.path().join("store/run.sqlite");
    let err = Store::open(&run(), &path, create()).unwrap_err();
    assert_refused(&err, "STORE_CORRUPT", &path);
    assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
}

/// `open_in` takes a plain file name only.
#[test]
fn open_in_refuses_a_name_with_a_slash() {
    let root = tempfile::tempdir().unwrap();
    let fd: std::os::fd::OwnedFd = std::fs::File::open(root.path()).unwrap().into();
    let err = Store::open_in(&run(), fd, root.path(), "../run.sqlite", create()).unwrap_err();
    assert_eq!(err.code().as_str(), "ARGUMENT_INVALID", "{err}");
}

/// A store is bound to its run (issue #18): opened for another run id it is refused with
/// `STORE_IDENTITY_MISMATCH` and left as it was, whatever the seal says; a store created
/// before the binding (application id 0) is accepted and bound at its seal check.
#[test]
fn a_store_of_another_run_is_refused_and_an_unbound_one_is_bound() {
    let (dir, path) = scratch();
    store_with(&path, 2);
    let other = lease_core::RunId::new("another-run").unwrap();
    let before = snapshot(dir.path());
    let err = Store::open(&other, &path, create()).unwrap_err();
    assert_eq!(err.code().as_str(), "STORE_IDENTITY_MISMATCH", "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("run another-run")
            && msg.contains(&path.display().to_string())
            && msg.contains("belongs to another run"),
        "{msg}"
    );
    assert_eq!(
        snapshot(dir.path()),
        before,
        "the refusal changed the folder"
    );

    // Unbind it as a store of the previous version would be, then open it as its run.
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch("PRAGMA application_id = 0").unwrap();
    }
    let app_id = |p: &Path| -> i32 {
        let c = rusqlite::Connection::open(p).unwrap();
        c.query_row("PRAGMA application_id", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(app_id(&path), 0);
    // Unbound: another run's open is not refused by the binding (nothing to compare).
    Store::open(&other, &path, StoreOptions::default())
        .unwrap()
        .close();
    let s = open_store(&path);
    s.close().unwrap();
    assert_ne!(app_id(&path), 0, "bound at the accepted seal check");
    let err = Store::open(&other, &path, StoreOptions::default()).unwrap_err();
    assert_eq!(err.code().as_str(), "STORE_IDENTITY_MISMATCH");
}
