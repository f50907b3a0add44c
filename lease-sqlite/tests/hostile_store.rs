//! Issue #29, "a store file is data, not code": a store file someone else crafted or can
//! change is refused with a typed error before anything in it runs or is read into memory,
//! by the owner's open and by the read-only open alike, and the disk is left as it was.
//!
//! - the schema pin: a trigger (one that kept `fence.max_token` at 0 turned the fencing
//!   check off), an extra table, view or index, an altered `CREATE` text, and a
//!   "decompression bomb" (24 KB on disk, a generated column of 1 GB per row on every
//!   read: what made `store list` use 2.6 GB over 70 s) are `STORE_CORRUPT` naming the
//!   object;
//! - owner and mode: a store file, WAL, journal or folder owned by another uid, or
//!   writable by group or others, is `RUN_NOT_OWNED` (77), lease-fs's rule;
//! - each read-only refusal is measured in a child process (this test binary re-executed
//!   as `child_reader`): peak RSS (`VmHWM`) at most 64 MiB and at most 5 s.

mod common;

use common::*;
use lease_sqlite::{Batch, Store, StoreError};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a child reader may use at most.
const MAX_RSS_KIB: u64 = 64 * 1024;
const MAX_TIME: Duration = Duration::from_secs(5);

/// A real store (created, two commits, closed) at `dir/store/run.sqlite`, then changed
/// with a plain SQLite connection running `sql` (default limits, schema writable), and
/// closed again (checkpointed: no WAL left). Mode 0600 as created.
fn crafted(dir: &Path, sql: &str) -> PathBuf {
    let path = dir.join("store/run.sqlite");
    let mut s = open_store(&path);
    s.commit(g(1), &Batch::new().put("doc/a", "one").log("first"))
        .unwrap();
    s.commit(g(2), &Batch::new().put("doc/b", "two")).unwrap();
    s.close().unwrap();
    if !sql.is_empty() {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(sql).unwrap();
        c.close().unwrap();
    }
    assert!(!dir.join("store/run.sqlite-wal").exists());
    path
}

/// Every entry under `dir` with its kind, size, mode, owner and mtime (directories
/// included, so a created or removed entry changes its folder's mtime too).
fn listing(dir: &Path, dirs_mtime: bool) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(root: &Path, dir: &Path, dirs_mtime: bool, out: &mut Vec<String>) {
        let m = std::fs::symlink_metadata(dir).unwrap();
        let mtime = if dirs_mtime {
            m.mtime_nsec() + m.mtime() * 1_000_000_000
        } else {
            0
        };
        out.push(format!(
            "{} dir {:o} {} {mtime}",
            dir.strip_prefix(root).unwrap().display(),
            m.mode(),
            m.uid()
        ));
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                walk(root, &p, dirs_mtime, out);
            } else {
                out.push(format!(
                    "{} {} {:o} {} {}.{}",
                    p.strip_prefix(root).unwrap().display(),
                    m.len(),
                    m.mode(),
                    m.uid(),
                    m.mtime(),
                    m.mtime_nsec()
                ));
            }
        }
    }
    walk(dir, dir, dirs_mtime, &mut out);
    out
}

/// Both opens refuse `path` with `code`, naming the run, the file and `needle`; the
/// read-only open changes nothing at all (listing with every mtime), the owner's open no
/// file (contents, sizes, modes, owners, mtimes of files).
fn refused_by_both(dir: &Path, path: &Path, code: &str, needle: &str) -> StoreError {
    let strict = listing(dir, true);
    let err = Store::open_read_only(&run(), path).unwrap_err();
    assert_refused(&err, code, path);
    assert!(
        err.to_string().contains(needle),
        "{needle:?} not named: {err}"
    );
    assert_eq!(
        listing(dir, true),
        strict,
        "the read-only open changed the disk"
    );

    let files = (listing(dir, false), snapshot(dir));
    let err = Store::open(&run(), path, create()).unwrap_err();
    assert_refused(&err, code, path);
    assert!(
        err.to_string().contains(needle),
        "{needle:?} not named: {err}"
    );
    assert_eq!(
        (listing(dir, false), snapshot(dir)),
        files,
        "the owner's open changed a file"
    );
    eprintln!("refused: {err}");
    err
}

/// One page of a prefix scan, as the child reads it.
type PageFn<'a> =
    dyn Fn(Option<&str>) -> Result<(Vec<lease_sqlite::Document>, Option<String>), StoreError> + 'a;

/// The child's side: open `HOSTILE_STORE` (read-only, or as owner with
/// `HOSTILE_OWNER=1`) and read it whole in pages, as `runlease store list` and `log` do;
/// print the outcome, the time taken and the peak RSS.
#[test]
fn child_reader() {
    let Ok(path) = std::env::var("HOSTILE_STORE") else {
        return;
    };
    let started = Instant::now();
    let outcome = (|| -> Result<usize, StoreError> {
        let mut n = 0;
        let read = |n: &mut usize, page: &PageFn<'_>| -> Result<(), StoreError> {
            let mut after: Option<String> = None;
            loop {
                let (docs, next) = page(after.as_deref())?;
                *n += docs.len();
                match next {
                    Some(k) => after = Some(k),
                    None => return Ok(()),
                }
            }
        };
        if std::env::var("HOSTILE_OWNER").is_ok() {
            let s = Store::open(&run(), &path, create())?.check_seal(None, None)?;
            read(&mut n, &|a| s.scan_prefix_page("", a, 100, 1 << 20))?;
            n += s.commits_page_bytes(0, 100, 1 << 20)?.len();
        } else {
            let s = Store::open_read_only(&run(), &path)?;
            read(&mut n, &|a| s.scan_prefix_page("", a, 100, 1 << 20))?;
            n += s.commits_page_bytes(0, 100, 1 << 20)?.len();
        }
        Ok(n)
    })();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let hwm = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap();
    let code = match &outcome {
        Ok(n) => format!("OK:{n}"),
        Err(e) => e.code().as_str().to_string(),
    };
    println!(
        "HOSTILE code={code} hwm_kib={hwm} ms={}",
        started.elapsed().as_millis()
    );
}

/// Run [`child_reader`] on `path`; its outcome code, peak RSS (KiB) and time, each
/// asserted within the bounds (the child is killed after 30 s).
fn measured(path: &Path, owner: bool) -> (String, u64, Duration) {
    let mut env = vec![("HOSTILE_STORE", path.display().to_string())];
    if owner {
        env.push(("HOSTILE_OWNER", "1".to_string()));
    }
    let started = Instant::now();
    let mut child = child_command("child_reader", &env).spawn().unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("the reader of {} ran for more than 30 s", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("HOSTILE "))
        .unwrap_or_else(|| panic!("no outcome from the child ({}): {text}", out.status));
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(k))
            .unwrap()
            .to_string()
    };
    let (code, hwm, ms) = (
        field("code="),
        field("hwm_kib=").parse::<u64>().unwrap(),
        field("ms=").parse::<u64>().unwrap(),
    );
    let took = Duration::from_millis(ms);
    eprintln!(
        "hostile store {} ({}): {code}, peak RSS {} KiB, {} ms in the child",
        path.display(),
        if owner { "owner" } else { "read-only" },
        hwm,
        ms
    );
    assert!(
        hwm <= MAX_RSS_KIB,
        "peak RSS {hwm} KiB above {MAX_RSS_KIB} KiB ({code})"
    );
    assert!(took <= MAX_TIME, "{took:?} above {MAX_TIME:?} ({code})");
    (code, hwm, took)
}

/// A schema shape: refused by both opens with `STORE_CORRUPT` naming `needle`, and each
/// reader bounded.
fn schema_shape(sql: &str, needle: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let path = crafted(tmp.path(), sql);
    refused_by_both(tmp.path(), &path, "STORE_CORRUPT", needle);
    for owner in [false, true] {
        assert_eq!(measured(&path, owner).0, "STORE_CORRUPT");
    }
}

#[test]
fn the_baseline_store_reads_in_the_child_within_the_bounds() {
    let tmp = tempfile::tempdir().unwrap();
    let path = crafted(tmp.path(), "");
    // Two documents and two commits.
    assert_eq!(measured(&path, false).0, "OK:4");
    assert_eq!(measured(&path, true).0, "OK:4");
}

#[test]
fn a_trigger_that_keeps_the_fence_at_zero_is_refused() {
    // What the issue saw: every later owner's token was accepted over a higher one.
    schema_shape(
        "CREATE TRIGGER keep_zero AFTER UPDATE ON fence \
         BEGIN UPDATE fence SET max_token = 0 WHERE singleton = 1; END;",
        "trigger \"keep_zero\"",
    );
}

#[test]
fn an_extra_table_is_refused() {
    schema_shape(
        "CREATE TABLE extra (x); INSERT INTO extra VALUES (1);",
        "table \"extra\"",
    );
}

#[test]
fn an_extra_view_with_a_recursive_query_is_refused() {
    schema_shape(
        "CREATE VIEW boom AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) \
         SELECT x, zeroblob(1000000) FROM c;",
        "view \"boom\"",
    );
}

#[test]
fn an_extra_index_on_an_expression_is_refused() {
    schema_shape(
        "CREATE INDEX by_len ON docs (length(value) + 1);",
        "index \"by_len\"",
    );
}

#[test]
fn an_altered_table_definition_is_refused() {
    // The fence's CHECK loosened by editing the stored CREATE text.
    schema_shape(
        "PRAGMA writable_schema = ON; \
         UPDATE sqlite_master SET sql = replace(sql, 'CHECK (max_token >= 0)', 'CHECK (max_token >= -1)') \
         WHERE name = 'fence'; \
         PRAGMA writable_schema = OFF;",
        "table \"fence\"",
    );
}

/// A decompression bomb: about 24 KB on disk, and with SQLite's default limits each
/// document's `value` reads as 1 GB (a virtual generated column of `zeroblob`): the shape
/// that made `store list` use 2.6 GB. Refused by the pin; the reader stays under 64 MiB.
#[test]
fn a_decompression_bomb_is_refused_small_and_fast() {
    let tmp = tempfile::tempdir().unwrap();
    let path = crafted(
        tmp.path(),
        "PRAGMA writable_schema = ON; \
         UPDATE sqlite_master SET sql = 'CREATE TABLE docs (key TEXT PRIMARY KEY, \
         value BLOB GENERATED ALWAYS AS (zeroblob(1000000000)) VIRTUAL, \
         updated_seq INTEGER NOT NULL) WITHOUT ROWID' WHERE name = 'docs'; \
         PRAGMA writable_schema = OFF;",
    );
    let on_disk = std::fs::metadata(&path).unwrap().len();
    assert!(on_disk <= 32 * 1024, "{on_disk} bytes");
    // What it is to a reader without the pin (lengths only, nothing built).
    let c =
        rusqlite::Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let total: i64 = c
        .query_row("SELECT sum(length(value)) FROM docs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(total, 2_000_000_000);
    drop(c);
    refused_by_both(tmp.path(), &path, "STORE_CORRUPT", "table \"docs\"");
    for owner in [false, true] {
        assert_eq!(measured(&path, owner).0, "STORE_CORRUPT");
    }
}

// ---------------------------------------------------------------- owner and mode

/// `chown` (we are root in CI; skipped with a note otherwise).
fn chown(path: &Path, uid: u32) -> bool {
    if rustix::process::geteuid().as_raw() != 0 {
        assert!(
            std::env::var("RUNLEASE_REQUIRE_CONTAINMENT").as_deref() != Ok("1"),
            "RUNLEASE_REQUIRE_CONTAINMENT=1 but not root: the foreign-owner case cannot run"
        );
        eprintln!("not root: the foreign-owner case is skipped");
        return false;
    }
    std::os::unix::fs::lchown(path, Some(uid), None).unwrap();
    true
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_store_owned_by_another_user_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = crafted(tmp.path(), "");
    if !chown(&path, 65534) {
        return;
    }
    let err = refused_by_both(tmp.path(), &path, "RUN_NOT_OWNED", "owned by uid 65534");
    assert!(err.to_string().contains("file run.sqlite ("), "{err}");
    assert!(err.to_string().contains("was not read"), "{err}");
    for owner in [false, true] {
        assert_eq!(measured(&path, owner).0, "RUN_NOT_OWNED");
    }
}

#[test]
fn a_store_writable_by_others_is_refused() {
    for mode in [0o666, 0o620] {
        let tmp = tempfile::tempdir().unwrap();
        let path = crafted(tmp.path(), "");
        chmod(&path, mode);
        let err = refused_by_both(
            tmp.path(),
            &path,
            "RUN_NOT_OWNED",
            "group or others may write it",
        );
        assert!(
            err.to_string().contains(&format!("mode {mode:04o}")),
            "{err}"
        );
        assert_eq!(measured(&path, false).0, "RUN_NOT_OWNED");
    }
    // Read bits are no threat (a copy restored with umask 022 is still ours).
    let tmp = tempfile::tempdir().unwrap();
    let path = crafted(tmp.path(), "");
    chmod(&path, 0o644);
    Store::open_read_only(&run(), &path).unwrap();
}

#[test]
fn a_foreign_or_open_wal_or_journal_or_folder_is_refused() {
    for side in ["run.sqlite-wal", "run.sqlite-journal"] {
        for foreign in [false, true] {
            let tmp = tempfile::tempdir().unwrap();
            let path = crafted(tmp.path(), "");
            let side_path = tmp.path().join("store").join(side);
            std::fs::write(&side_path, b"").unwrap();
            chmod(&side_path, 0o600);
            if foreign {
                if !chown(&side_path, 65534) {
                    continue;
                }
            } else {
                chmod(&side_path, 0o666);
            }
            let err = refused_by_both(tmp.path(), &path, "RUN_NOT_OWNED", side);
            assert!(err.to_string().contains("not trusted"), "{err}");
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = crafted(tmp.path(), "");
    chmod(&tmp.path().join("store"), 0o777);
    refused_by_both(tmp.path(), &path, "RUN_NOT_OWNED", "folder store (");
}

/// A damaged overflow chain: a document's value spread over overflow pages whose last
/// page points back at the first (a cycle a reader following it would never leave).
/// `quick_check` walks every chain with a page map, so the open refuses it, bounded.
#[test]
fn a_cyclic_overflow_chain_is_refused_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("store/run.sqlite");
    let mut s = open_store(&path);
    s.commit(g(1), &Batch::new().put("doc/big", vec![b'Z'; 4 * 4096]))
        .unwrap();
    s.close().unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    let page = 4096;
    // Overflow pages: a 4-byte next pointer, then the value's bytes.
    let overflow: Vec<usize> = (0..bytes.len() / page)
        .filter(|i| {
            bytes[i * page + 4..i * page + 68]
                .iter()
                .all(|b| *b == b'Z')
        })
        .collect();
    assert!(overflow.len() >= 3, "{overflow:?}");
    let next = |bytes: &[u8], i: usize| {
        u32::from_be_bytes(bytes[i * page..i * page + 4].try_into().unwrap())
    };
    let last = *overflow.iter().find(|i| next(&bytes, **i) == 0).unwrap();
    let first = *overflow
        .iter()
        .find(|i| {
            !overflow
                .iter()
                .any(|j| next(&bytes, *j) as usize == **i + 1)
        })
        .unwrap();
    bytes[last * page..last * page + 4].copy_from_slice(&(first as u32 + 1).to_be_bytes());
    std::fs::write(&path, &bytes).unwrap();
    refused_by_both(tmp.path(), &path, "STORE_CORRUPT", "integrity check failed");
    for owner in [false, true] {
        assert_eq!(measured(&path, owner).0, "STORE_CORRUPT");
    }
}
