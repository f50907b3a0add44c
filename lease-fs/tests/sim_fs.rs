//! The crash model of the simulated file system (`lease_fs::sim`), one test per rule.

use lease_fs::fs::Fs;
use lease_fs::sim::{EIO, ENOSPC, SimFs, is_simulated_crash};
use std::collections::BTreeMap;
use std::io::ErrorKind;

const LIMIT: usize = 1 << 20;

fn files(pairs: &[(&str, &[u8])]) -> BTreeMap<String, Vec<u8>> {
    pairs
        .iter()
        .map(|(p, b)| ((*p).to_string(), b.to_vec()))
        .collect()
}

#[test]
fn unsynced_data_is_lost_on_crash_and_the_synced_entry_stays_empty() {
    let fs = SimFs::new();
    fs.ensure_dir("d").unwrap();
    fs.write_new("d/a", b"payload").unwrap();
    fs.fsync_dir("d").unwrap(); // entry durable, data not
    assert_eq!(fs.read("d/a", LIMIT).unwrap(), Some(b"payload".to_vec()));
    fs.recover(false);
    assert_eq!(fs.read("d/a", LIMIT).unwrap(), Some(Vec::new()));
}

#[test]
fn fsynced_data_and_entry_survive_a_crash() {
    let fs = SimFs::new();
    fs.write_new("a", b"payload").unwrap();
    fs.fsync("a").unwrap();
    fs.fsync_dir("").unwrap();
    fs.recover(true);
    assert_eq!(fs.snapshot_live(), files(&[("a", b"payload")]));
}

#[test]
fn an_unsynced_entry_disappears_on_crash() {
    let fs = SimFs::new();
    fs.write_new("a", b"x").unwrap();
    fs.fsync("a").unwrap(); // data durable, entry not
    assert!(fs.exists("a").unwrap());
    assert!(fs.snapshot_durable().is_empty());
    fs.recover(false);
    assert!(!fs.exists("a").unwrap());
    assert!(fs.snapshot_live().is_empty());
}

#[test]
fn an_unsynced_unlink_is_undone_by_a_crash() {
    let fs = SimFs::new();
    fs.put("a", b"old").unwrap();
    fs.unlink("a").unwrap();
    assert!(!fs.exists("a").unwrap());
    fs.recover(false);
    assert_eq!(fs.read("a", LIMIT).unwrap(), Some(b"old".to_vec()));
    fs.unlink("a").unwrap();
    fs.fsync_dir("").unwrap();
    fs.recover(false);
    assert!(!fs.exists("a").unwrap());
}

#[test]
fn rename_is_atomic_and_durable_only_after_fsync_dir() {
    let fs = SimFs::new();
    fs.put("d/target", b"old").unwrap();
    fs.write_new("d/tmp", b"new").unwrap();
    fs.fsync("d/tmp").unwrap();
    fs.rename("d/tmp", "d/target").unwrap();
    // Live: the new content at once, the temp name gone.
    assert_eq!(fs.snapshot_live(), files(&[("d/target", b"new")]));
    // Not durable yet: a crash brings back the old content (and no temp).
    assert_eq!(fs.snapshot_durable(), files(&[("d/target", b"old")]));
    fs.recover(true);
    assert_eq!(fs.snapshot_live(), files(&[("d/target", b"old")]));

    fs.write_new("d/tmp", b"new").unwrap();
    fs.fsync("d/tmp").unwrap();
    fs.rename("d/tmp", "d/target").unwrap();
    fs.fsync_dir("d").unwrap();
    fs.recover(true);
    assert_eq!(fs.snapshot_live(), files(&[("d/target", b"new")]));
}

#[test]
fn rename_over_the_target_without_any_fsync_leaves_old_or_empty_never_mixed() {
    // Replace under the `local` policy: the dir fsync of a later operation persists the
    // entry without the data.
    let fs = SimFs::new();
    fs.put("beat", b"old-beat").unwrap();
    fs.write_new("tmp", b"new-beat").unwrap();
    fs.rename("tmp", "beat").unwrap();
    fs.fsync_dir("").unwrap();
    fs.recover(false);
    assert_eq!(fs.read("beat", LIMIT).unwrap(), Some(Vec::new()));
}

#[test]
fn torn_write_keeps_a_prefix_of_the_last_unsynced_write() {
    let fs = SimFs::new();
    fs.write_new("first", b"0123456789").unwrap();
    fs.write_new("last", b"abcdefgh").unwrap();
    fs.fsync_dir("").unwrap();
    fs.recover(true);
    // Only the most recent unsynced write is torn (half by default); the other is empty.
    assert_eq!(
        fs.snapshot_live(),
        files(&[("first", b""), ("last", b"abcd")])
    );
    // After the crash the torn prefix is what is on disk: a second crash keeps it.
    fs.recover(true);
    assert_eq!(fs.read("last", LIMIT).unwrap(), Some(b"abcd".to_vec()));
}

#[test]
fn tear_fraction_is_settable_and_synced_files_are_never_torn() {
    let fs = SimFs::new();
    fs.set_tear_fraction(3, 4);
    fs.write_new("torn", b"12345678").unwrap();
    fs.write_new("synced", b"complete").unwrap();
    fs.fsync("synced").unwrap();
    fs.fsync_dir("").unwrap();
    fs.recover(true);
    assert_eq!(
        fs.snapshot_live(),
        files(&[("synced", b"complete"), ("torn", b"123456")])
    );
}

#[test]
fn crash_after_k_stops_effects_at_exactly_call_k_plus_1() {
    let fs = SimFs::new();
    fs.ensure_dir("d").unwrap();
    let before = fs.calls();
    fs.crash_after(2);
    let results: Vec<_> = (0..5)
        .map(|i| fs.write_new(&format!("d/f{i}"), b"x"))
        .collect();
    assert!(results[0].is_ok() && results[1].is_ok());
    for r in &results[2..] {
        let e = r.as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Other);
        assert_eq!(e.to_string(), "simulated crash");
        assert!(is_simulated_crash(e));
    }
    assert!(fs.is_down());
    // Every call is counted, reads too, and every call fails while down.
    assert_eq!(fs.calls() - before, 5);
    assert!(is_simulated_crash(&fs.exists("d").unwrap_err()));
    assert!(is_simulated_crash(&fs.list("d").unwrap_err()));
    // Live state: exactly the first two calls took effect.
    assert_eq!(fs.snapshot_live(), files(&[("d/f0", b"x"), ("d/f1", b"x")]));
    // Down until crash + resume.
    fs.crash(false);
    assert!(fs.is_down());
    fs.resume();
    assert!(!fs.is_down());
    assert_eq!(fs.list("d").unwrap(), Vec::<String>::new());
}

#[test]
fn resume_without_crash_is_a_process_crash_that_loses_nothing() {
    let fs = SimFs::new();
    fs.crash_after(1);
    fs.write_new("a", b"kept").unwrap();
    assert!(fs.write_new("b", b"lost").is_err());
    fs.resume();
    assert_eq!(fs.snapshot_live(), files(&[("a", b"kept")]));
}

#[test]
fn fail_nth_with_eio_has_no_effect_and_later_calls_work() {
    let fs = SimFs::new();
    fs.put("d/old", b"o").unwrap();
    type Op = dyn Fn(&SimFs) -> std::io::Result<()>;
    let ops: [&Op; 6] = [
        &|fs| fs.write_new("d/new", b"n"),
        &|fs| fs.link("d/old", "d/other"),
        &|fs| fs.rename("d/old", "d/moved"),
        &|fs| fs.unlink("d/old"),
        &|fs| fs.ensure_dir("e/f").map(|_| ()),
        &|fs| fs.fsync_dir("d"),
    ];
    for op in ops {
        let live = fs.snapshot_live();
        let durable = fs.snapshot_durable();
        fs.fail_nth(1, EIO);
        let e = op(&fs).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(EIO));
        assert!(!is_simulated_crash(&e));
        assert_eq!(fs.snapshot_live(), live);
        assert_eq!(fs.snapshot_durable(), durable);
    }
    assert!(!fs.exists("e").unwrap());
    fs.write_new("d/new", b"n").unwrap();
    assert!(fs.exists("d/new").unwrap());
}

#[test]
fn fail_nth_counts_calls_from_now() {
    let fs = SimFs::new();
    fs.fail_nth(3, EIO);
    assert!(fs.exists("a").is_ok());
    assert!(fs.list("").is_ok());
    assert_eq!(fs.read("a", LIMIT).unwrap_err().raw_os_error(), Some(EIO));
    assert!(fs.read("a", LIMIT).is_ok());
}

#[test]
fn enospc_on_write_new_may_leave_an_empty_file_when_enabled() {
    let fs = SimFs::new();
    fs.fail_nth(1, ENOSPC);
    assert_eq!(
        fs.write_new("a", b"data").unwrap_err().raw_os_error(),
        Some(ENOSPC)
    );
    assert!(!fs.exists("a").unwrap());

    fs.set_enospc_leaves_empty_file(true);
    fs.fail_nth(1, ENOSPC);
    assert_eq!(
        fs.write_new("a", b"data").unwrap_err().raw_os_error(),
        Some(ENOSPC)
    );
    assert_eq!(fs.read("a", LIMIT).unwrap(), Some(Vec::new()));
}

#[test]
fn fail_nth_after_effect_applies_the_call_then_reports_the_error() {
    let fs = SimFs::new();
    fs.put("tmp", b"x").unwrap();
    fs.fail_nth_after_effect(1, EIO);
    assert_eq!(
        fs.link("tmp", "target").unwrap_err().raw_os_error(),
        Some(EIO)
    );
    assert_eq!(fs.link_count("tmp").unwrap(), Some(2));
}

#[test]
fn link_makes_already_exists_for_an_existing_target() {
    let fs = SimFs::new();
    fs.put("a", b"a").unwrap();
    fs.put("b", b"b").unwrap();
    let e = fs.link("a", "b").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyExists);
    assert_eq!(fs.read("b", LIMIT).unwrap(), Some(b"b".to_vec()));
    assert_eq!(fs.link_count("a").unwrap(), Some(1));

    fs.link("a", "c").unwrap();
    assert_eq!(fs.link_count("a").unwrap(), Some(2));
    assert_eq!(fs.link_count("c").unwrap(), Some(2));
    fs.unlink("a").unwrap();
    assert_eq!(fs.link_count("c").unwrap(), Some(1));
    assert_eq!(fs.link_count("a").unwrap(), None);
    assert_eq!(
        fs.link("missing", "x").unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[test]
fn write_new_is_exclusive_and_needs_its_parent() {
    let fs = SimFs::new();
    fs.put("a", b"a").unwrap();
    assert_eq!(
        fs.write_new("a", b"b").unwrap_err().kind(),
        ErrorKind::AlreadyExists
    );
    assert_eq!(
        fs.write_new("nodir/a", b"b").unwrap_err().kind(),
        ErrorKind::NotFound
    );
    assert_eq!(
        fs.write_new("a/b", b"b").unwrap_err().kind(),
        ErrorKind::NotADirectory
    );
}

#[test]
fn list_and_reads_show_the_live_state() {
    let fs = SimFs::new();
    fs.ensure_dir("d/sub").unwrap();
    fs.write_new("d/b", b"bb").unwrap();
    fs.write_new("d/a", b"a").unwrap();
    let mut names = fs.list("d").unwrap();
    names.sort();
    assert_eq!(names, ["a", "b", "sub"]);
    assert_eq!(fs.list("missing").unwrap(), Vec::<String>::new());
    assert_eq!(fs.list("d/a").unwrap_err().kind(), ErrorKind::NotADirectory);
    assert_eq!(fs.read("d/missing", LIMIT).unwrap(), None);
    assert_eq!(fs.read("nodir/x", LIMIT).unwrap(), None);
    // A directory is not a record (PROTOCOL §5.1), as on the real disk.
    let e = fs.read("d/sub", LIMIT).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidData);
    assert!(lease_fs::fs::not_a_record_in(&e).is_some(), "{e}");
    assert!(fs.exists("d/sub").unwrap());
    assert!(!fs.exists("d/c").unwrap());
    assert_eq!(fs.age_secs("d/a").unwrap(), Some(0));
    assert_eq!(fs.age_secs("d/c").unwrap(), None);
    fs.set_age("d/a", 7200).unwrap();
    assert_eq!(fs.age_secs("d/a").unwrap(), Some(7200));
    fs.unlink("d/b").unwrap();
    let mut names = fs.list("d").unwrap();
    names.sort();
    assert_eq!(names, ["a", "sub"]);
}

#[test]
fn read_enforces_its_limit() {
    let fs = SimFs::new();
    fs.put("a", b"12345").unwrap();
    assert_eq!(fs.read("a", 5).unwrap(), Some(b"12345".to_vec()));
    assert_eq!(fs.read("a", 4).unwrap_err().kind(), ErrorKind::InvalidData);
}

#[test]
fn paths_outside_check_rel_are_invalid_input() {
    let fs = SimFs::new();
    for bad in ["/abs", "a/../b", "a//b", "./a", "a/", "a\0b"] {
        assert_eq!(
            fs.read(bad, LIMIT).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            fs.write_new(bad, b"").unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            fs.ensure_dir(bad).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }
    // The root is a directory, never a file name.
    assert_eq!(
        fs.write_new("", b"").unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    assert_eq!(fs.unlink("").unwrap_err().kind(), ErrorKind::InvalidInput);
    assert!(fs.put("../x", b"").is_err());
}

#[test]
fn ensure_dir_creates_durable_directories_and_refuses_a_file_in_the_way() {
    let fs = SimFs::new();
    assert!(fs.ensure_dir("a/b/c").unwrap());
    assert!(!fs.ensure_dir("a/b/c").unwrap());
    assert!(!fs.ensure_dir("").unwrap());
    let c = fs.counters();
    assert_eq!((c.ensure_dir_syncs, c.fsync_dir), (3, 0));
    fs.recover(false);
    assert!(fs.exists("a/b/c").unwrap());

    fs.put("f", b"").unwrap();
    assert_eq!(
        fs.ensure_dir("f/x").unwrap_err().kind(),
        ErrorKind::NotADirectory
    );
    assert_eq!(
        fs.ensure_dir("f").unwrap_err().kind(),
        ErrorKind::NotADirectory
    );
}

#[test]
fn only_directories_reachable_through_durable_entries_survive() {
    let fs = SimFs::new();
    fs.ensure_dir("d").unwrap();
    fs.write_new("d/x", b"x").unwrap();
    fs.fsync("d/x").unwrap();
    fs.fsync_dir("d").unwrap();
    // d's entry in the root is durable (ensure_dir synced it), so d/x survives.
    fs.recover(false);
    assert_eq!(fs.snapshot_live(), files(&[("d/x", b"x")]));
}

#[test]
fn put_is_durable_at_once_and_edits_the_inode_in_place() {
    let fs = SimFs::new();
    fs.put("a/b/rec", b"v1").unwrap();
    fs.write_new("a/b/pending", b"p").unwrap();
    fs.put("a/b/rec", b"v2").unwrap();
    // put made only its own entry durable, not the pending one.
    assert_eq!(fs.snapshot_durable(), files(&[("a/b/rec", b"v2")]));
    fs.recover(false);
    assert_eq!(fs.snapshot_live(), files(&[("a/b/rec", b"v2")]));
    assert_eq!(fs.calls(), 1); // only the write_new was a call
}

#[test]
fn counters_count_fsyncs_and_calls_and_reset() {
    let fs = SimFs::new();
    fs.write_new("a", b"x").unwrap();
    fs.fsync("a").unwrap();
    fs.fsync_dir("").unwrap();
    fs.fail_nth(1, EIO);
    assert!(fs.fsync("a").is_err()); // attempts count, failed or not
    let _ = fs.read("a", LIMIT).unwrap();
    assert_eq!(fs.calls(), 5);
    assert_eq!(fs.fsync_count(), 2);
    assert_eq!(fs.fsync_dir_count(), 1);
    assert_eq!(fs.counters().total_fsyncs(), 3);
    fs.reset_counters();
    assert_eq!(fs.counters(), Default::default());
}

#[test]
fn check_root_fails_only_when_the_root_was_replaced() {
    let fs = SimFs::new();
    fs.check_root().unwrap();
    fs.set_root_replaced(true);
    assert!(fs.check_root().is_err());
    fs.set_root_replaced(false);
    fs.check_root().unwrap();
}

#[test]
fn clones_share_state_and_the_fs_is_send_sync() {
    fn assert_send_sync<T: Send + Sync + Clone + 'static>() {}
    assert_send_sync::<SimFs>();
    let fs = SimFs::new();
    let store: Box<dyn Fs> = Box::new(fs.clone());
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let fs = fs.clone();
            std::thread::spawn(move || fs.write_new(&format!("f{i}"), b"x").unwrap())
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(store.list("").unwrap().len(), 4);
    assert_eq!(fs.calls(), 5);
}

/// The "create exclusive" sequence of docs/PROTOCOL.md §5.2, step by step; stops at the
/// first error like a crashed caller.
fn create_exclusive(fs: &SimFs, bytes: &[u8]) -> std::io::Result<()> {
    fs.write_new("d/.tmp-1", bytes)?;
    fs.fsync("d/.tmp-1")?;
    fs.link("d/.tmp-1", "d/target")?;
    fs.fsync_dir("d")?;
    fs.unlink("d/.tmp-1")?;
    Ok(())
}

fn fresh() -> SimFs {
    let fs = SimFs::new();
    fs.ensure_dir("d").unwrap();
    fs.reset_counters();
    fs
}

#[test]
fn create_exclusive_crashed_after_each_call_leaves_no_target_or_the_complete_target() {
    let bytes: &[u8] = b"epoch record, complete";
    let full = fresh();
    create_exclusive(&full, bytes).unwrap();
    let n = full.calls();
    assert_eq!(n, 5);
    assert_eq!((full.fsync_count(), full.fsync_dir_count()), (1, 1));

    for k in 0..=n {
        for tear in [false, true] {
            for power_loss in [false, true] {
                let fs = fresh();
                fs.crash_after(k);
                let result = create_exclusive(&fs, bytes);
                assert_eq!(result.is_ok(), k == n, "k={k}");
                if power_loss {
                    fs.crash(tear);
                }
                fs.resume();
                let target = fs.read("d/target", 1 << 10).unwrap();
                assert!(
                    target.is_none() || target.as_deref() == Some(bytes),
                    "k={k} tear={tear} power_loss={power_loss}: partial target {target:?}"
                );
                // Once the directory fsync returned, the target is durable.
                if k >= 4 {
                    assert_eq!(target.as_deref(), Some(bytes), "k={k}");
                }
                // Without power loss, a returned link is visible.
                if !power_loss && k >= 3 {
                    assert_eq!(target.as_deref(), Some(bytes), "k={k}");
                }
            }
        }
    }
}

#[test]
fn create_exclusive_with_a_fault_at_each_call_never_leaves_a_partial_target() {
    let bytes: &[u8] = b"complete";
    for k in 1..=5 {
        for errno in [EIO, ENOSPC] {
            let fs = fresh();
            fs.set_enospc_leaves_empty_file(true);
            fs.fail_nth(k, errno);
            let result = create_exclusive(&fs, bytes);
            assert_eq!(result.unwrap_err().raw_os_error(), Some(errno));
            for tear in [false, true] {
                let target = fs.read("d/target", 1 << 10).unwrap();
                assert!(target.is_none() || target.as_deref() == Some(bytes));
                fs.recover(tear);
            }
        }
    }
}

#[test]
fn unlinked_files_still_named_durably_come_back_after_a_crash_despite_collection() {
    let fs = SimFs::new();
    for i in 0..200 {
        fs.put(&format!("d/keep{i}"), b"k").unwrap();
        fs.write_new(&format!("d/tmp{i}"), b"t").unwrap();
    }
    for i in 0..200 {
        fs.unlink(&format!("d/keep{i}")).unwrap(); // live only: still durable
        fs.unlink(&format!("d/tmp{i}")).unwrap(); // never durable: garbage
    }
    assert!(fs.snapshot_live().is_empty());
    fs.recover(true);
    let after = fs.snapshot_live();
    assert_eq!(after.len(), 200);
    assert!(
        after
            .iter()
            .all(|(p, b)| p.starts_with("d/keep") && b == b"k")
    );
}

// PROTOCOL §9 (run.json, issue #33): `replace_whole` (temp → fsync → rename, no directory
// fsync). A crash after any call, with or without a power loss and a torn last write,
// leaves the old content or the new, each whole, never a mix, an empty file or nothing.
#[test]
fn replace_whole_crashed_after_each_call_leaves_the_old_or_the_new_content_whole() {
    let (old, new): (&[u8], &[u8]) = (
        b"run.json, generation 1, done",
        b"run.json, generation 3, running",
    );
    let prepared = || {
        let fs = fresh();
        lease_fs::primitives::create_exclusive(&fs, "d/run.json", old).unwrap();
        fs.reset_counters();
        fs
    };
    let full = prepared();
    lease_fs::primitives::replace_whole(&full, "d/run.json", new).unwrap();
    let n = full.calls();
    assert_eq!(
        (full.fsync_count(), full.fsync_dir_count()),
        (1, 0),
        "one fsync"
    );
    for k in 0..=n {
        for tear in [false, true] {
            for power_loss in [false, true] {
                let fs = prepared();
                fs.crash_after(k);
                let result = lease_fs::primitives::replace_whole(&fs, "d/run.json", new);
                assert_eq!(result.is_ok(), k >= n, "k={k}");
                if power_loss {
                    fs.crash(tear);
                }
                fs.resume();
                let got = fs.read("d/run.json", 1 << 10).unwrap();
                assert!(
                    got.as_deref() == Some(old) || got.as_deref() == Some(new),
                    "k={k} tear={tear} power_loss={power_loss}: {got:?}"
                );
                // Without a power loss, a returned rename is visible.
                if !power_loss && k >= n {
                    assert_eq!(got.as_deref(), Some(new), "k={k}");
                }
            }
        }
    }
}
