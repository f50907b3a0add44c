//! The view of the engine's store log (issue #32): `store/view.sqlite`, schema version 2,
//! changed only by applying the log's records in order, imaged and rebuilt whole.

mod common;

use common::{g, open_store, run, snapshot};
use lease_core::store_log::{Blob, RecordBatch, RecordWrite};
use lease_core::{Digest, Identity, RunId};
use lease_sqlite::{
    Batch, Document, Store, StoreError, StoreOptions, VIEW_FILE_NAME, ViewPosition, Write,
};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// A private `store/` folder (0700) under `root`.
fn store_dir(root: &Path, name: &str) -> PathBuf {
    let d = root.join(name);
    std::fs::DirBuilder::new().mode(0o700).create(&d).unwrap();
    d
}

/// The position after record `record_seq`, whose last commit is `commits`.
fn at(record_seq: u64, commits: u64) -> ViewPosition {
    ViewPosition {
        record_seq,
        record_hash: (record_seq > 0)
            .then(|| Digest::of(format!("record {record_seq}").as_bytes())),
        commits,
    }
}

fn open_view(dir: &Path) -> Store {
    Store::open_view(&run(), dir, true).unwrap()
}

/// A view in `dir` with `records` records of one commit each, putting `tag/<n>`.
fn view_with(dir: &Path, tag: &str, records: u64) -> Store {
    let mut v = open_view(dir);
    for n in 1..=records {
        let b = Batch::new()
            .put(format!("{tag}/{n}"), format!("{tag} {n}"))
            .log(format!("{tag} log {n}"));
        v.apply_record(g(1), n, &[b], &at(n, n)).unwrap();
    }
    v
}

/// Position, documents, commits (seq, token, writes, log), highest token, head.
type Contents = (
    ViewPosition,
    Vec<Document>,
    Vec<(u64, u64, Vec<Write>, Vec<Vec<u8>>)>,
    u64,
    u64,
);

/// Everything a view holds that a reader sees.
fn contents(v: &Store) -> Contents {
    (
        v.view_position().unwrap(),
        v.scan_prefix("").unwrap(),
        v.commits_since(0)
            .unwrap()
            .into_iter()
            .map(|c| (c.seq, c.token, c.writes, c.log))
            .collect::<Vec<_>>(),
        v.max_token().unwrap(),
        v.head().unwrap(),
    )
}

fn code(e: &StoreError) -> &'static str {
    e.code().as_str()
}

#[test]
fn records_applied_in_order_are_read_back() {
    let root = tempfile::tempdir().unwrap();
    let dir = store_dir(root.path(), "store");
    let mut v = open_view(&dir);
    assert!(v.is_view());
    assert_eq!(v.view_position().unwrap(), ViewPosition::EMPTY);
    assert_eq!(v.head().unwrap(), 0);

    // Record 1: two batches (commits 1 and 2), converted from the engine's record form.
    let record_batches = [
        RecordBatch {
            id: Identity::new("c-1").unwrap(),
            writes: vec![
                RecordWrite {
                    key: "doc/a".into(),
                    value: Some(Blob(b"A".to_vec())),
                },
                RecordWrite {
                    key: "doc/b".into(),
                    value: Some(Blob(b"B".to_vec())),
                },
            ],
            log: vec![Blob(b"step 1".to_vec())],
        },
        RecordBatch {
            id: Identity::new("c-2").unwrap(),
            writes: vec![RecordWrite {
                key: "doc/a".into(),
                value: None,
            }],
            log: vec![],
        },
    ];
    let batches: Vec<Batch> = record_batches.iter().map(Batch::from).collect();
    assert_eq!(
        batches[1].writes,
        [Write::Delete {
            key: "doc/a".into()
        }]
    );
    assert_eq!(
        v.apply_record(g(2), 1, &batches, &at(1, 2)).unwrap(),
        [1, 2]
    );
    assert_eq!(v.view_position().unwrap(), at(1, 2));
    // Record 2: one batch (commit 3). Record 3: no batch, only the position moves.
    let b3 = Batch::new().put("doc/c", "C").log("step 3");
    assert_eq!(v.apply_record(g(2), 3, &[b3], &at(2, 3)).unwrap(), [3]);
    assert_eq!(
        v.apply_record(g(3), 4, &[], &at(3, 3)).unwrap(),
        Vec::<u64>::new()
    );
    assert_eq!(v.view_position().unwrap(), at(3, 3));

    let check = |v: &Store| {
        assert_eq!(v.view_position().unwrap(), at(3, 3));
        assert_eq!(v.head().unwrap(), 3);
        assert!(v.get("doc/a").unwrap().is_none());
        assert_eq!(v.get("doc/b").unwrap().unwrap().value, b"B");
        assert_eq!(v.get("doc/c").unwrap().unwrap().updated_seq, 3);
        let commits = v.commits_since(0).unwrap();
        assert_eq!(
            commits.iter().map(|c| (c.seq, c.token)).collect::<Vec<_>>(),
            [(1, 2), (2, 2), (3, 2)]
        );
        assert_eq!(commits[0].log, [b"step 1".to_vec()]);
        assert_eq!(commits[2].log, [b"step 3".to_vec()]);
        // The record without batches still raised the highest token (its generation).
        assert_eq!(v.max_token().unwrap(), 3);
    };
    check(&v);
    v.close().unwrap();
    let v = Store::open_view(&run(), &dir, false).unwrap();
    check(&v);
    drop(v);
    // Killed (dropped without a close): the WAL is replayed at the next open.
    let v = Store::open_view(&run(), &dir, false).unwrap();
    check(&v);
    // The read-only open (no owner) of a closed view reads the same.
    v.close().unwrap();
    let ro = Store::open_view_read_only_in(&run(), std::fs::File::open(&dir).unwrap().into(), &dir)
        .unwrap();
    assert_eq!(ro.view_position().unwrap(), at(3, 3));
    assert_eq!(ro.head().unwrap(), 3);
}

/// A record that does not follow the view's position is refused with nothing written:
/// ahead of it (a gap), the same record again, a wrong first commit; and a `to` that is
/// not the position after the record is an argument error.
#[test]
fn a_record_out_of_order_is_refused_and_nothing_is_written() {
    let root = tempfile::tempdir().unwrap();
    let dir = store_dir(root.path(), "store");
    let mut v = view_with(&dir, "x", 1);
    let before = contents(&v);
    let b = || Batch::new().put("late", "no");

    // Record 3 on a view at record 1 (a gap).
    let e = v.apply_record(g(1), 2, &[b()], &at(3, 2)).unwrap_err();
    assert_eq!(code(&e), "CONCURRENT_CHANGE", "{e}");
    assert!(
        matches!(
            e,
            StoreError::ViewNotAt {
                at_record: 1,
                at_commits: 1,
                record: 3,
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("view.sqlite") && msg.contains("test-run"),
        "{msg}"
    );
    // Record 1 again (already applied).
    let e = v.apply_record(g(1), 1, &[b()], &at(1, 1)).unwrap_err();
    assert_eq!(code(&e), "CONCURRENT_CHANGE", "{e}");
    // Record 2, but starting at commit 5 (the view's last commit is 1).
    let e = v.apply_record(g(1), 5, &[b()], &at(2, 5)).unwrap_err();
    assert_eq!(code(&e), "CONCURRENT_CHANGE", "{e}");
    // Record 2 starting at commit 1 (would overwrite commit 1).
    let e = v.apply_record(g(1), 1, &[b()], &at(2, 1)).unwrap_err();
    assert_eq!(code(&e), "CONCURRENT_CHANGE", "{e}");
    // `to` is not the position after the record.
    for (first, to) in [(2, at(2, 3)), (2, at(0, 2)), (0, at(2, 0))] {
        let e = v.apply_record(g(1), first, &[b()], &to).unwrap_err();
        assert_eq!(code(&e), "ARGUMENT_INVALID", "{to:?}: {e}");
    }
    let no_hash = ViewPosition {
        record_hash: None,
        ..at(2, 2)
    };
    let e = v.apply_record(g(1), 2, &[b()], &no_hash).unwrap_err();
    assert_eq!(code(&e), "ARGUMENT_INVALID", "{e}");
    assert_eq!(contents(&v), before);
    // The handle is still usable, and the right record applies.
    assert_eq!(v.apply_record(g(1), 2, &[b()], &at(2, 2)).unwrap(), [2]);
    v.close().unwrap();
    let v = Store::open_view(&run(), &dir, false).unwrap();
    assert_eq!(v.view_position().unwrap(), at(2, 2));
}

#[test]
fn a_record_with_a_lower_token_is_fenced() {
    let root = tempfile::tempdir().unwrap();
    let dir = store_dir(root.path(), "store");
    let mut v = open_view(&dir);
    v.apply_record(g(3), 1, &[Batch::new().put("k", "3")], &at(1, 1))
        .unwrap();
    let before = contents(&v);
    let e = v
        .apply_record(g(2), 2, &[Batch::new().put("k", "2")], &at(2, 2))
        .unwrap_err();
    assert_eq!(code(&e), "FENCED", "{e}");
    assert!(
        matches!(
            e,
            StoreError::Fenced {
                token: 2,
                max_token: 3,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(contents(&v), before);
    v.apply_record(g(3), 2, &[Batch::new().put("k", "3b")], &at(2, 2))
        .unwrap();
    assert_eq!(v.get("k").unwrap().unwrap().value, b"3b");
}

/// A view changes only by its records; a local store has no position; neither file opens
/// as the other (no migration), and each is left as it was.
#[test]
fn a_view_and_a_local_store_never_stand_in_for_each_other() {
    let root = tempfile::tempdir().unwrap();
    let dir = store_dir(root.path(), "store");
    let mut v = view_with(&dir, "x", 1);
    let e = v.commit(g(5), &Batch::new().put("k", "v")).unwrap_err();
    assert_eq!(code(&e), "ARGUMENT_INVALID", "{e}");
    let e = v.commit_group(g(5), &[]).unwrap_err();
    assert_eq!(code(&e), "ARGUMENT_INVALID", "{e}");
    assert_eq!(
        v.max_token().unwrap(),
        1,
        "the refused commit raised nothing"
    );
    let e = v.seal(g(5)).unwrap_err();
    assert_eq!(code(&e), "ARGUMENT_INVALID", "{e}");

    let local_path = dir.join("run.sqlite");
    let mut local = open_store(&local_path);
    let e = local.view_position().unwrap_err();
    assert_eq!(code(&e), "ARGUMENT_INVALID", "{e}");
    let e = local
        .apply_record(g(1), 1, &[Batch::new()], &at(1, 1))
        .unwrap_err();
    assert_eq!(code(&e), "ARGUMENT_INVALID", "{e}");
    local.commit(g(1), &Batch::new().put("k", "v")).unwrap();
    local.close().unwrap();

    // A local store under the view's name, and a view under the store's name.
    let other = store_dir(root.path(), "swapped");
    std::fs::copy(&local_path, other.join(VIEW_FILE_NAME)).unwrap();
    std::fs::copy(dir.join(VIEW_FILE_NAME), other.join("run.sqlite")).unwrap();
    let before = snapshot(&other);
    let e = Store::open_view(&run(), &other, true).unwrap_err();
    assert_eq!(code(&e), "SCHEMA_UNSUPPORTED", "{e}");
    assert!(e.to_string().contains("local store"), "{e}");
    let e = Store::open(&run(), other.join("run.sqlite"), StoreOptions::default()).unwrap_err();
    assert_eq!(code(&e), "SCHEMA_UNSUPPORTED", "{e}");
    assert!(e.to_string().contains("view"), "{e}");
    let e = Store::open_read_only(&run(), other.join("run.sqlite")).unwrap_err();
    assert_eq!(code(&e), "SCHEMA_UNSUPPORTED", "{e}");
    let e =
        Store::open_view_read_only_in(&run(), std::fs::File::open(&other).unwrap().into(), &other)
            .unwrap_err();
    assert_eq!(code(&e), "SCHEMA_UNSUPPORTED", "{e}");
    assert_eq!(
        snapshot(&other),
        before,
        "refused files are left as they were"
    );
}

/// image → build → the same documents, commits, token and position; over an existing
/// view too, whose owner was killed (its WAL left beside it), in place.
#[test]
fn an_image_rebuilds_the_same_view() {
    let root = tempfile::tempdir().unwrap();
    let src = store_dir(root.path(), "source");
    let mut v = view_with(&src, "x", 3);
    v.apply_record(
        g(4),
        4,
        &[Batch::new().delete("x/1"), Batch::new().log("only a log")],
        &at(4, 5),
    )
    .unwrap();
    // The image includes what is only in the WAL (no checkpoint yet).
    assert!(
        std::fs::metadata(src.join("view.sqlite-wal"))
            .unwrap()
            .len()
            > 0
    );
    let image = v.image().unwrap();
    let want = contents(&v);
    let pos = v.view_position().unwrap();

    // Into a folder without a view.
    let fresh = store_dir(root.path(), "fresh");
    Store::build_view(&run(), &fresh, Some(&image), &pos).unwrap();
    let built = Store::open_view(&run(), &fresh, false).unwrap();
    assert_eq!(contents(&built), want);
    // A rebuilt view goes on from its position.
    let mut built = built;
    built
        .apply_record(g(4), 6, &[Batch::new().put("x/6", "6")], &at(5, 6))
        .unwrap();
    built.close().unwrap();

    // Over an existing, different view whose owner was killed (its WAL holds commits).
    let old_dir = store_dir(root.path(), "old");
    let old = view_with(&old_dir, "old", 7);
    drop(old);
    assert!(
        std::fs::metadata(old_dir.join("view.sqlite-wal"))
            .unwrap()
            .len()
            > 0
    );
    Store::build_view_in(
        &run(),
        std::fs::File::open(&old_dir).unwrap().into(),
        &old_dir,
        Some(&image),
        &pos,
    )
    .unwrap();
    let mut names: Vec<_> = std::fs::read_dir(&old_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["view.sqlite"], "no WAL, temp or old view left");
    let rebuilt = Store::open_view(&run(), &old_dir, false).unwrap();
    assert_eq!(contents(&rebuilt), want);
    // The source, still open, is not affected.
    assert_eq!(contents(&v), want);

    // While this process has the view open, it is not rebuilt.
    let e = Store::build_view(&run(), &old_dir, Some(&image), &pos).unwrap_err();
    assert_eq!(code(&e), "STORE_BUSY", "{e}");
    drop(rebuilt);
    // An empty view (no image) replaces it too.
    Store::build_view(&run(), &old_dir, None, &ViewPosition::EMPTY).unwrap();
    let empty = Store::open_view(&run(), &old_dir, false).unwrap();
    assert_eq!(empty.view_position().unwrap(), ViewPosition::EMPTY);
    assert_eq!(empty.head().unwrap(), 0);
    let e = Store::build_view(&run(), &fresh, None, &pos).unwrap_err();
    assert_eq!(code(&e), "ARGUMENT_INVALID", "{e}");
}

/// Forged or wrong images are refused with a typed error, and the view in place (and the
/// folder) is left exactly as it was: no temp file stays behind.
#[test]
fn a_forged_image_is_refused_and_the_view_left_untouched() {
    let root = tempfile::tempdir().unwrap();
    let src = store_dir(root.path(), "source");
    let source = view_with(&src, "x", 2);
    let good = source.image().unwrap();
    let pos = source.view_position().unwrap();
    source.close().unwrap();

    // Edit an image with a plain SQLite connection (no hardening: what a forger has).
    let scratch = store_dir(root.path(), "scratch");
    let edited = |sql: &str| -> Vec<u8> {
        let p = scratch.join("edit.sqlite");
        std::fs::write(&p, &good).unwrap();
        let c = rusqlite::Connection::open(&p).unwrap();
        c.execute_batch(sql).unwrap();
        c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)").unwrap();
        drop(c);
        let bytes = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        bytes
    };
    let trigger = edited(
        "CREATE TRIGGER keep_fence_low AFTER UPDATE ON fence BEGIN UPDATE fence SET max_token = 0; END",
    );
    let index = edited("CREATE INDEX docs_by_seq ON docs(updated_seq)");
    let head_mismatch = edited("UPDATE engine_view SET commits = 1");
    let bad_hash = edited("UPDATE engine_view SET record_hash = 'nothex'");
    // A local store's image (schema version 1), of this run.
    let local = store_dir(root.path(), "local");
    let mut store = open_store(&local.join("run.sqlite"));
    store.commit(g(1), &Batch::new().put("x/1", "x 1")).unwrap();
    let v1_image = store.image().unwrap();
    store.close().unwrap();
    // Another run's view.
    let other_run = store_dir(root.path(), "other");
    let mut o = Store::open_view(&RunId::new("other-run").unwrap(), &other_run, true).unwrap();
    o.apply_record(g(1), 1, &[Batch::new()], &at(1, 1)).unwrap();
    o.apply_record(g(1), 2, &[Batch::new()], &at(2, 2)).unwrap();
    let other_image = o.image().unwrap();
    o.close().unwrap();
    let mut truncated = good.clone();
    truncated.truncate(good.len() - 100);

    let dir = store_dir(root.path(), "store");
    let v = view_with(&dir, "mine", 1);
    let mine = contents(&v);
    v.close().unwrap();
    let before = snapshot(&dir);
    let cases: Vec<(&str, Vec<u8>, ViewPosition, &str)> = vec![
        ("an extra trigger", trigger, pos.clone(), "STORE_CORRUPT"),
        ("an extra index", index, pos.clone(), "STORE_CORRUPT"),
        (
            "engine_view not at the last commit",
            head_mismatch,
            pos.clone(),
            "STORE_CORRUPT",
        ),
        (
            "a record hash that is not one",
            bad_hash,
            pos.clone(),
            "STORE_CORRUPT",
        ),
        (
            "a local store's image",
            v1_image,
            at(0, 0),
            "SCHEMA_UNSUPPORTED",
        ),
        (
            "another run's view",
            other_image,
            pos.clone(),
            "STORE_IDENTITY_MISMATCH",
        ),
        (
            "a good image, another position",
            good.clone(),
            at(2, 3),
            "STORE_CORRUPT",
        ),
        (
            "a good image, another hash",
            good.clone(),
            ViewPosition {
                record_hash: Some(Digest::of(b"other")),
                ..pos.clone()
            },
            "STORE_CORRUPT",
        ),
        (
            "not SQLite",
            b"not a database at all".repeat(300),
            pos.clone(),
            "STORE_CORRUPT",
        ),
        ("truncated", truncated, pos.clone(), "STORE_CORRUPT"),
        ("empty", Vec::new(), pos.clone(), "STORE_CORRUPT"),
    ];
    for (what, image, expect, want) in cases {
        let e = Store::build_view(&run(), &dir, Some(&image), &expect).unwrap_err();
        assert_eq!(code(&e), want, "{what}: {e}");
        assert_eq!(snapshot(&dir), before, "{what}: the folder is as it was");
    }
    let v = Store::open_view(&run(), &dir, false).unwrap();
    assert_eq!(contents(&v), mine);
    drop(v);
    // And the good image at its position is accepted.
    Store::build_view(&run(), &dir, Some(&good), &pos).unwrap();
}

/// Why the build removes the old WAL before the new view takes the name: SQLite replays
/// a WAL found beside a database whatever database it was written for. Here the killed
/// old view's WAL, put back beside a rebuilt view (the order the build never makes),
/// changes what the rebuilt view reads; the build itself never lets it.
#[test]
fn a_stale_wal_is_never_applied_to_a_rebuilt_view() {
    let root = tempfile::tempdir().unwrap();
    let src = store_dir(root.path(), "source");
    let source = view_with(&src, "new", 2);
    let image = source.image().unwrap();
    let pos = source.view_position().unwrap();
    let want = contents(&source);
    source.close().unwrap();

    let dir = store_dir(root.path(), "store");
    let old = view_with(&dir, "old", 6);
    drop(old); // killed: its last commits are only in the WAL
    let wal = dir.join("view.sqlite-wal");
    let stale = std::fs::read(&wal).unwrap();
    assert!(!stale.is_empty());

    Store::build_view(&run(), &dir, Some(&image), &pos).unwrap();
    assert!(!wal.exists(), "the old WAL is gone");
    let v = Store::open_view(&run(), &dir, false).unwrap();
    assert_eq!(
        contents(&v),
        want,
        "nothing of the old view's WAL was applied"
    );
    v.close().unwrap();

    // The hazard itself: the stale WAL beside the rebuilt view is replayed onto it (with
    // the bundled SQLite the rebuilt view then silently reads as the old view at record 6:
    // the WAL's frames carry whole pages, and nothing in a WAL names its database).
    let kept = std::fs::read(dir.join(VIEW_FILE_NAME)).unwrap();
    std::fs::write(&wal, &stale).unwrap();
    match Store::open_view(&run(), &dir, false) {
        Ok(v) => assert_ne!(contents(&v), want, "SQLite replayed the foreign WAL"),
        Err(e) => assert_eq!(code(&e), "STORE_CORRUPT", "{e}"),
    }
    // Put the rebuilt view back for the crash states below.
    std::fs::remove_file(&wal).unwrap();
    std::fs::write(dir.join(VIEW_FILE_NAME), &kept).unwrap();

    // A crash after the old view was set aside and before the new one took the name
    // leaves no view, perhaps the old WAL, and the build's leftovers. The next open says
    // STORE_MISSING; creating an empty view, or building from the image, never applies
    // the WAL and removes the leftovers.
    for next in ["create", "build"] {
        std::fs::rename(dir.join(VIEW_FILE_NAME), dir.join(".tmp-1-view-old-abcd")).unwrap();
        std::fs::write(&wal, &stale).unwrap();
        std::fs::write(dir.join(".tmp-1-view-abcd"), &image).unwrap();
        std::fs::write(dir.join(".tmp-1-view-abcd-wal"), &stale).unwrap();
        let e = Store::open_view(&run(), &dir, false).unwrap_err();
        assert_eq!(code(&e), "STORE_MISSING", "{e}");
        let v = if next == "create" {
            let v = Store::open_view(&run(), &dir, true).unwrap();
            assert_eq!(v.view_position().unwrap(), ViewPosition::EMPTY, "{next}");
            assert!(v.scan_prefix("").unwrap().is_empty(), "{next}");
            v
        } else {
            Store::build_view(&run(), &dir, Some(&image), &pos).unwrap();
            let v = Store::open_view(&run(), &dir, false).unwrap();
            assert_eq!(contents(&v), want, "{next}");
            v
        };
        v.close().unwrap();
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            names,
            ["view.sqlite"],
            "{next}: no WAL, temp or old view left"
        );
    }

    // A crash with a temp file left beside a whole view: the view opens as it is.
    std::fs::write(dir.join(".tmp-1-view-ef01"), &image).unwrap();
    let v = Store::open_view(&run(), &dir, false).unwrap();
    assert_eq!(v.view_position().unwrap(), pos);
}

/// A local store (schema 1) is created, committed, sealed and reopened as before, beside
/// a view in the same folder.
#[test]
fn a_local_store_beside_a_view_works_as_before() {
    let root = tempfile::tempdir().unwrap();
    let dir = store_dir(root.path(), "store");
    let v = view_with(&dir, "v", 2);
    let path = dir.join("run.sqlite");
    let mut s = open_store(&path);
    assert!(!s.is_view());
    assert_eq!(s.commit(g(1), &Batch::new().put("k", "v")).unwrap(), 1);
    let seal = s.seal(g(1)).unwrap();
    let mut s = Store::open(&run(), &path, StoreOptions::default())
        .unwrap()
        .check_seal(Some(&seal), None)
        .unwrap();
    assert_eq!(s.commit(g(2), &Batch::new().delete("k")).unwrap(), 2);
    let e = s.commit(g(1), &Batch::new()).unwrap_err();
    assert_eq!(code(&e), "FENCED");
    s.close().unwrap();
    // The view was not touched by any of it.
    assert_eq!(v.view_position().unwrap(), at(2, 2));
    // A local store's file still has schema version 1 in its header.
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[60..64], &1u32.to_be_bytes());
    let bytes = std::fs::read(dir.join(VIEW_FILE_NAME)).unwrap();
    assert_eq!(&bytes[60..64], &2u32.to_be_bytes());
}

/// A view commits with `synchronous = NORMAL`, so a power loss may take it back to an
/// earlier commit. Its position moves in the same transaction as its contents, so the
/// rewound view says where it stands, and applying the lost record again from the engine
/// gives what an unbroken view holds. Simulated here by putting back the files of a view
/// closed after two records, as the disk would have kept them, after a third was applied.
#[test]
fn a_view_rewound_by_a_power_loss_resumes_from_its_own_position() {
    let root = tempfile::tempdir().unwrap();
    let dir = store_dir(root.path(), "store");
    view_with(&dir, "r", 2).close().unwrap();
    let kept = root.path().join("kept");
    std::fs::create_dir(&kept).unwrap();
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(names.iter().any(|n| n == VIEW_FILE_NAME));
    for n in &names {
        std::fs::copy(dir.join(n), kept.join(n)).unwrap();
    }
    let mut v = Store::open_view(&run(), &dir, false).unwrap();
    let b3 = Batch::new().put("r/3", "r 3").log("r log 3");
    v.apply_record(g(1), 3, std::slice::from_ref(&b3), &at(3, 3))
        .unwrap();
    drop(v);
    // The power loss: the third record's commit is gone, files as they were kept.
    for e in std::fs::read_dir(&dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    for n in &names {
        std::fs::copy(kept.join(n), dir.join(n)).unwrap();
    }
    let mut v = Store::open_view(&run(), &dir, false).unwrap();
    assert_eq!(v.view_position().unwrap(), at(2, 2));
    assert!(v.get("r/3").unwrap().is_none());
    v.apply_record(g(1), 3, &[b3], &at(3, 3)).unwrap();
    let whole_dir = store_dir(root.path(), "whole");
    let mut whole = view_with(&whole_dir, "r", 2);
    let b3 = Batch::new().put("r/3", "r 3").log("r log 3");
    whole.apply_record(g(1), 3, &[b3], &at(3, 3)).unwrap();
    assert_eq!(contents(&v), contents(&whole));
}
