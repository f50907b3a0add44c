//! The cached listing of `lease/epochs` (issue #33, `lease_fs::listing`): a replayed answer
//! is the answer a listing would give at once, whoever changed the folder and however.
//!
//! Every test first proves the cache warm (the listing just before the change was a replay),
//! so a change that the cache failed to notice would be answered with the old listing.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use lease_core::canonical::MAX_RECORD_BYTES;
use lease_core::ops::{Expectation, OwnedLease, TakeoverTrigger};
use lease_core::{Dir, Identity, LeaseOps, Timestamp, TimingPolicy};
use lease_fs::fs::{Fs, NotARecord, not_a_record_in};
use lease_fs::fstype::FileSystem;
use lease_fs::listing::{ListingCache, ListingCacheStats};
use lease_fs::{FsError, RealFs, RunDir, run_id_held, this_holder};

const EPOCHS: &str = "lease/epochs";

/// A scratch folder on a file system the cache is allowed on (the temp folder, else
/// `/dev/shm`); `None` (the test is skipped, said on stderr) if there is none here.
fn watchable_dir() -> Option<tempfile::TempDir> {
    let on_allowlist = |d: &tempfile::TempDir| {
        let f = std::fs::File::open(d.path()).unwrap();
        FileSystem::of(&f).unwrap().changes_are_local_events()
    };
    if let Ok(d) = tempfile::tempdir()
        && on_allowlist(&d)
    {
        return Some(d);
    }
    if let Ok(d) = tempfile::tempdir_in("/dev/shm")
        && on_allowlist(&d)
    {
        return Some(d);
    }
    eprintln!(
        "no temp folder on ext4/xfs/btrfs/tmpfs/f2fs here: the cached listing is off, skipped"
    );
    None
}

/// The file name of epoch `g`.
fn epoch(g: u64) -> String {
    format!("{g:020}.json")
}

/// A run root at `dir/name` with `lease/epochs/` holding epochs `gens` (their bytes do not
/// matter to a listing).
fn root_with(dir: &Path, name: &str, gens: &[u64]) -> PathBuf {
    let root = dir.join(name);
    let fs = RealFs::create(&root).unwrap();
    fs.ensure_dir(EPOCHS).unwrap();
    for g in gens {
        fs.write_new(&format!("{EPOCHS}/{}", epoch(*g)), b"{}\n")
            .unwrap();
    }
    root
}

/// The generations RECHECK's listing answers (the `List` request of `lease/epochs`), or
/// the error it gives.
fn try_list(fs: &RealFs) -> std::io::Result<Vec<u64>> {
    let mut gens = Vec::new();
    fs.list_records(
        EPOCHS,
        MAX_RECORD_BYTES,
        &|n| Dir::Epochs.parse_name(n).is_some(),
        &mut |n| {
            if let Some(lease_core::FileRef::Epoch(g)) = Dir::Epochs.parse_name(n) {
                gens.push(g.get());
            }
        },
    )?;
    gens.sort();
    Ok(gens)
}

fn list(fs: &RealFs) -> Vec<u64> {
    try_list(fs).unwrap()
}

/// List until a listing is replayed (at most three: a fresh adapter reads the directory
/// once unwatched, then once to arm the watch), answering `want` each time: the cache is
/// warm.
fn warm(fs: &RealFs, want: &[u64]) {
    for _ in 0..3 {
        let before = fs.listing_cache_stats();
        assert_eq!(list(fs), want);
        let after = fs.listing_cache_stats();
        if after.replays == before.replays + 1 {
            assert_eq!(after.listings, before.listings);
            assert!(after.watching, "{after:?}");
            return;
        }
    }
    panic!("never replayed: {:?}", fs.listing_cache_stats());
}

/// List once and check that the directory was read (not replayed), answering `want`.
fn relisted(fs: &RealFs, want: &[u64]) {
    let before = fs.listing_cache_stats();
    assert_eq!(list(fs), want);
    let after = fs.listing_cache_stats();
    assert_eq!(
        after.listings,
        before.listings + 1,
        "{before:?} → {after:?}"
    );
}

/// The [`NotARecord`] a listing refused with.
fn refused(fs: &RealFs) -> NotARecord {
    let e = try_list(fs).expect_err("the listing should refuse a bad file");
    not_a_record_in(&e)
        .cloned()
        .unwrap_or_else(|| panic!("{e}"))
}

/// Make a file as runlease would (0600) with `bytes` at `path`.
fn put(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn the_watch_is_made_from_the_second_listing_on() {
    let Some(dir) = watchable_dir() else { return };
    let root = root_with(dir.path(), "r", &[1]);
    let fs = RealFs::open(&root).unwrap();
    assert_eq!(list(&fs), [1]);
    // A process that lists once never makes an inotify instance.
    assert_eq!(
        fs.listing_cache_stats(),
        ListingCacheStats {
            listings: 1,
            replays: 0,
            watching: false
        }
    );
    assert_eq!(list(&fs), [1]);
    assert_eq!(
        fs.listing_cache_stats(),
        ListingCacheStats {
            listings: 2,
            replays: 0,
            watching: true
        }
    );
    assert_eq!(list(&fs), [1]);
    assert_eq!(fs.listing_cache_stats().replays, 1);
    // A clone has caches of its own.
    let clone = fs.try_clone().unwrap();
    assert_eq!(clone.listing_cache_stats(), ListingCacheStats::default());
    // A missing folder lists empty, with nothing watched.
    std::fs::rename(root.join(EPOCHS), root.join("lease/gone")).unwrap();
    assert_eq!(list(&fs), Vec::<u64>::new());
    assert!(!fs.listing_cache_stats().watching);
}

// PROTOCOL §7.0 RECHECK (R4): a new epoch is seen by the very next listing, whoever made
// it and however.
#[test]
fn a_cached_listing_sees_a_new_epoch_made_by_anyone_at_once() {
    let Some(dir) = watchable_dir() else { return };
    let root = root_with(dir.path(), "r", &[1]);
    let epochs = root.join(EPOCHS);
    let fs = RealFs::open(&root).unwrap();
    warm(&fs, &[1]);

    // Another adapter (another root descriptor, its own directory descriptors).
    let other = RealFs::open(&root).unwrap();
    assert!(
        lease_fs::primitives::create_exclusive(&other, &format!("{EPOCHS}/{}", epoch(2)), b"{}\n")
            .unwrap()
    );
    relisted(&fs, &[1, 2]);
    warm(&fs, &[1, 2]);

    // A raw link of a temp file in the folder (as CreateExclusive does, by hand).
    put(&epochs.join("x.tmp"), b"{}\n");
    std::fs::hard_link(epochs.join("x.tmp"), epochs.join(epoch(3))).unwrap();
    assert_eq!(list(&fs), [1, 2, 3]);
    std::fs::remove_file(epochs.join("x.tmp")).unwrap();
    warm(&fs, &[1, 2, 3]);

    // A rename into the folder from outside it.
    put(&root.join("outside"), b"{}\n");
    std::fs::rename(root.join("outside"), epochs.join(epoch(4))).unwrap();
    relisted(&fs, &[1, 2, 3, 4]);
    warm(&fs, &[1, 2, 3, 4]);

    // Another process (`ln`), a hard link from a file outside the folder.
    put(&root.join("elsewhere"), b"{}\n");
    let linked = Command::new("ln")
        .arg(root.join("elsewhere"))
        .arg(epochs.join(epoch(9)))
        .status()
        .unwrap();
    assert!(linked.success());
    relisted(&fs, &[1, 2, 3, 4, 9]);
    warm(&fs, &[1, 2, 3, 4, 9]);
    // Nothing queued meanwhile: still replayed.
    warm(&fs, &[1, 2, 3, 4, 9]);
}

#[test]
fn removing_renaming_or_growing_an_entry_drops_the_cached_answer() {
    let Some(dir) = watchable_dir() else { return };
    let root = root_with(dir.path(), "r", &[1, 2, 3]);
    let epochs = root.join(EPOCHS);
    let fs = RealFs::open(&root).unwrap();
    warm(&fs, &[1, 2, 3]);

    // Removed.
    std::fs::remove_file(epochs.join(epoch(3))).unwrap();
    relisted(&fs, &[1, 2]);
    warm(&fs, &[1, 2]);

    // Renamed within the folder, and out of it.
    std::fs::rename(epochs.join(epoch(2)), epochs.join(epoch(7))).unwrap();
    relisted(&fs, &[1, 7]);
    warm(&fs, &[1, 7]);
    std::fs::rename(epochs.join(epoch(7)), root.join("away")).unwrap();
    relisted(&fs, &[1]);
    warm(&fs, &[1]);

    // Grown past the record limit through its name in the folder: §5.1's size rule.
    let big = vec![b' '; MAX_RECORD_BYTES + 1];
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(epochs.join(epoch(1)))
        .unwrap();
    f.write_all(&big).unwrap();
    drop(f);
    let bad = refused(&fs);
    assert_eq!(bad.size, MAX_RECORD_BYTES as u64 + 4, "{bad}");
    // Judged again on every listing while it is there.
    assert_eq!(refused(&fs).size, bad.size);
    std::fs::OpenOptions::new()
        .write(true)
        .open(epochs.join(epoch(1)))
        .unwrap()
        .set_len(3)
        .unwrap();
    relisted(&fs, &[1]);
    warm(&fs, &[1]);

    // Grown through a hard link outside the folder: the directory watch hears nothing of
    // it (its event goes to the link's own folder), the file's own watch does.
    std::fs::hard_link(epochs.join(epoch(1)), root.join("second-name")).unwrap();
    // (The link count changed: one relisting.)
    assert_eq!(list(&fs), [1]);
    warm(&fs, &[1]);
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(root.join("second-name"))
        .unwrap();
    f.write_all(&big).unwrap();
    drop(f);
    assert!(refused(&fs).size > MAX_RECORD_BYTES as u64);
    std::fs::remove_file(root.join("second-name")).unwrap();
    std::fs::remove_file(epochs.join(epoch(1))).unwrap();
    relisted(&fs, &[]);
    warm(&fs, &[]);

    // Replaced by a directory of the same name: judged by its kind.
    put(&epochs.join(epoch(5)), b"{}\n");
    assert_eq!(list(&fs), [5]);
    warm(&fs, &[5]);
    std::fs::remove_file(epochs.join(epoch(5))).unwrap();
    std::fs::create_dir(epochs.join(epoch(5))).unwrap();
    assert_eq!(refused(&fs).kind, lease_fs::fs::EntryKind::Directory);
    std::fs::remove_dir(epochs.join(epoch(5))).unwrap();
    relisted(&fs, &[]);
}

#[test]
fn a_replay_judges_only_what_its_listing_judged() {
    let Some(dir) = watchable_dir() else { return };
    let root = root_with(dir.path(), "r", &[1]);
    let fs = RealFs::open(&root).unwrap();
    // An oversize file named like an epoch, listed by a caller that takes no name for a
    // record (so nothing was measured), then by RECHECK, which does: measured and refused.
    put(
        &root.join(EPOCHS).join(epoch(2)),
        &vec![b' '; MAX_RECORD_BYTES + 1],
    );
    let no_records = |fs: &RealFs| {
        let mut n = 0;
        fs.list_records(EPOCHS, MAX_RECORD_BYTES, &|_| false, &mut |_| n += 1)
            .unwrap();
        n
    };
    assert_eq!(no_records(&fs), 2);
    assert_eq!(no_records(&fs), 2);
    assert_eq!(no_records(&fs), 2);
    assert!(fs.listing_cache_stats().replays >= 1);
    assert_eq!(refused(&fs).size, MAX_RECORD_BYTES as u64 + 1);
    // The same refusal under a larger limit is no refusal: facts are judged per call.
    let mut n = 0;
    fs.list_records(
        EPOCHS,
        2 * MAX_RECORD_BYTES,
        &|n| Dir::Epochs.parse_name(n).is_some(),
        &mut |_| n += 1,
    )
    .unwrap();
    assert_eq!(n, 2);
    assert!(refused(&fs).size > MAX_RECORD_BYTES as u64);
}

// PROTOCOL §7.0 RECHECK, §7.2 step 2, I3, I8: the fencing of a superseded owner's beat, as
// `store/fencing.rs::a_paused_owner_is_fenced_on_heartbeat_append_and_release_and_nothing_it_writes_counts`,
// with RECHECK's listing warm in the cache, and the same without the cache.
#[test]
fn a_beat_after_a_newer_epoch_is_fenced_as_without_the_cache() {
    let Some(dir) = watchable_dir() else { return };
    let mut outcomes = Vec::new();
    for (mode, name) in [(ListingCache::Auto, "auto"), (ListingCache::Off, "off")] {
        // The taker: the same run handle (as the test in store/fencing.rs), another handle on
        // the same folder, or a newer epoch put in by hand above a gap (R4: a listing, never a
        // point lookup of `mine+1`).
        for taker in ["same", "other", "gap"] {
            let root = dir.path().join(format!("{name}-{taker}"));
            RunDir::create(&root).unwrap();
            let run = run_with(&root, mode);
            let old = claim(&run, "old");
            for count in 1..=4 {
                run.heartbeat(&old, t(count), count, None).unwrap();
            }
            let stats = cache_of(&run).listing_cache_stats();
            match mode {
                ListingCache::Auto => assert!(stats.replays >= 2, "not warm: {stats:?}"),
                _ => assert_eq!(stats.replays, 0, "{stats:?}"),
            }
            let newer = match taker {
                "same" => takeover(&run, "new").generation.get(),
                "other" => takeover(&RunDir::open(&root).unwrap(), "new")
                    .generation
                    .get(),
                _ => {
                    let g = old.generation.get() + 5;
                    let epochs = root.join(EPOCHS);
                    std::fs::copy(epochs.join(epoch(old.generation.get())), root.join("newer"))
                        .unwrap();
                    std::fs::rename(root.join("newer"), epochs.join(epoch(g))).unwrap();
                    g
                }
            };
            assert!(newer > old.generation.get());
            let e = run.heartbeat(&old, t(60_001), 5, None).unwrap_err();
            let again = run.heartbeat(&old, t(60_002), 6, None).unwrap_err();
            outcomes.push((
                name,
                taker,
                e.code().as_str().to_string(),
                again.code().as_str().to_string(),
            ));
        }
    }
    for (name, taker, first, again) in &outcomes {
        assert_eq!(
            (first.as_str(), again.as_str()),
            ("FENCED", "FENCED"),
            "{name} {taker}"
        );
    }
    assert_eq!(outcomes.len(), 6);
}

/// A heartbeat of a run whose cache is warm keeps beating while nothing changes (and its
/// beats stay replays: the beat file is in another folder).
#[test]
fn an_owner_beats_on_its_replayed_listing() {
    let Some(dir) = watchable_dir() else { return };
    let root = dir.path().join("r");
    RunDir::create(&root).unwrap();
    let run = run_with(&root, ListingCache::Auto);
    let l = claim(&run, "owner");
    for count in 1..=3 {
        run.heartbeat(&l, t(count), count, None).unwrap();
    }
    let before = cache_of(&run).listing_cache_stats();
    for count in 4..=20 {
        run.heartbeat(&l, t(count), count, None).unwrap();
    }
    let after = cache_of(&run).listing_cache_stats();
    assert_eq!(after.listings, before.listings, "{before:?} → {after:?}");
    assert_eq!(after.replays, before.replays + 17);
}

// PROTOCOL §5.1: a watch on a directory the path no longer names never replays.
#[test]
fn a_watch_on_a_replaced_directory_never_replays() {
    let Some(dir) = watchable_dir() else { return };
    let root = root_with(dir.path(), "r", &[1, 2]);
    let epochs = root.join(EPOCHS);
    let fs = RealFs::open(&root).unwrap();
    warm(&fs, &[1, 2]);

    // Moved away, another folder put in its place.
    std::fs::rename(&epochs, root.join("lease/epochs.old")).unwrap();
    std::fs::create_dir(&epochs).unwrap();
    std::fs::set_permissions(&epochs, std::fs::Permissions::from_mode(0o700)).unwrap();
    put(&epochs.join(epoch(9)), b"{}\n");
    relisted(&fs, &[9]);
    // The old folder changes no more, the new one does: its changes are seen, so the watch
    // follows the directory the path names.
    warm(&fs, &[9]);
    put(&epochs.join(epoch(10)), b"{}\n");
    relisted(&fs, &[9, 10]);
    warm(&fs, &[9, 10]);
    // And the old folder's changes no longer matter.
    put(&root.join("lease/epochs.old").join(epoch(11)), b"{}\n");
    assert_eq!(list(&fs), [9, 10]);

    // Swapped back, by another process and by this one (no entry of either folder changes).
    Command::new("mv")
        .arg(&epochs)
        .arg(root.join("lease/epochs.new"))
        .status()
        .unwrap();
    std::fs::rename(root.join("lease/epochs.old"), &epochs).unwrap();
    relisted(&fs, &[1, 2, 11]);
    warm(&fs, &[1, 2, 11]);
    put(&root.join("lease/epochs.new").join(epoch(12)), b"{}\n");
    assert_eq!(list(&fs), [1, 2, 11]);
    put(&epochs.join(epoch(13)), b"{}\n");
    relisted(&fs, &[1, 2, 11, 13]);
}

#[test]
fn off_the_allowlist_every_listing_reads_the_directory() {
    // The classification itself: only local disk file systems are allowlisted.
    for (magic, what) in [
        (0x6969u64, "nfs"),
        (0xFF53_4D42, "cifs"),
        (0xFE53_4D42, "smb2"),
        (0x6573_5546, "fuse"),
        (0x794C_7630, "overlayfs"),
        (0x0102_1997, "9p"),
        (0x1234_5678, "unknown"),
    ] {
        assert!(
            !FileSystem::from_magic(magic).changes_are_local_events(),
            "{what}"
        );
    }
    for (magic, what) in [
        (0xEF53u64, "ext4"),
        (0x5846_5342, "xfs"),
        (0x9123_683E, "btrfs"),
        (0x0102_1994, "tmpfs"),
        (0xF2F5_2010, "f2fs"),
    ] {
        assert!(
            FileSystem::from_magic(magic).changes_are_local_events(),
            "{what}"
        );
    }

    // The adapter: a file system the (narrowed) allowlist refuses, and the cache off.
    let Some(dir) = watchable_dir() else { return };
    let root = root_with(dir.path(), "r", &[1]);
    fn refuse(_: &FileSystem) -> bool {
        false
    }
    fn accept(_: &FileSystem) -> bool {
        true
    }
    for (mode, replays) in [
        (ListingCache::Only(refuse), false),
        (ListingCache::Off, false),
        (ListingCache::Only(accept), true),
    ] {
        let fs = RealFs::open(&root).unwrap().with_listing_cache(mode);
        let mut want = vec![1];
        for g in 20..30 {
            assert_eq!(list(&fs), want);
            assert_eq!(list(&fs), want);
            put(&root.join(EPOCHS).join(epoch(g)), b"{}\n");
            want.push(g);
            assert_eq!(list(&fs), want);
        }
        let s = fs.listing_cache_stats();
        assert_eq!(
            (s.replays > 0, s.watching),
            (replays, replays),
            "{mode:?}: {s:?}"
        );
        if !replays {
            assert_eq!(s.listings, 30, "{mode:?}");
        }
        for g in 20..30 {
            std::fs::remove_file(root.join(EPOCHS).join(epoch(g))).unwrap();
        }
    }
}

fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_796_169_600_000 + ms).unwrap()
}

fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

/// A run handle over its own `RealFs` with the cached listing in `mode`.
fn run_with(root: &Path, mode: ListingCache) -> RunDir {
    let fs = RealFs::open(root).unwrap().with_listing_cache(mode);
    let run_id = run_id_held(root, &fs).unwrap();
    RunDir::in_real(Arc::new(fs), run_id)
}

fn cache_of(run: &RunDir) -> &RealFs {
    run.real_fs().unwrap()
}

fn claim(run: &RunDir, owner: &str) -> OwnedLease {
    run.claim(lease_core::ops::ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: id(owner),
        holder: this_holder().unwrap(),
        policy: TimingPolicy::default(),
        now: t(0),
        store_floor: None,
    })
    .unwrap()
}

/// An operator takeover of the head at 60 s (the old owner stale by then).
fn takeover(run: &RunDir, owner: &str) -> OwnedLease {
    let now = t(60_000);
    let head = run.status(now, false).unwrap().head.unwrap();
    let expect = Expectation::of(&head);
    run.takeover(lease_core::ops::TakeoverParams {
        run_id: run.run_id().clone(),
        owner_id: id(owner),
        holder: this_holder().unwrap(),
        policy: TimingPolicy::default(),
        now,
        trigger: TakeoverTrigger::Operator {
            watched_unchanged_ms: lease_core::ghost::simulated_watch(&expect, now),
        },
        expect,
    })
    .map_err(|e: FsError| e.to_string())
    .unwrap()
}
