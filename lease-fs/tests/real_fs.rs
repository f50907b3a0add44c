//! `RealFs` on the real disk: exclusivity of link, private modes, symlink refusal, root pinning.

use std::io::ErrorKind;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use lease_fs::fs::Fs;
use lease_fs::real::RealFs;

/// Opens a run root one way or the other.
type Opener = fn(&Path) -> RealFs;

/// Both ways of resolving directories: `openat2`, and the component-by-component walk.
fn both() -> [(&'static str, Opener); 2] {
    fn with_openat2(p: &Path) -> RealFs {
        RealFs::open(p).unwrap()
    }
    fn walk(p: &Path) -> RealFs {
        RealFs::open(p).unwrap().without_openat2()
    }
    [("openat2", with_openat2), ("walk", walk)]
}

fn mode_of(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn ls(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn openat2_is_used_when_the_kernel_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let fs = RealFs::open(dir.path()).unwrap();
    fs.ensure_dir("a/b").unwrap();
    fs.write_new("a/b/f", b"x").unwrap();
    // A fresh RealFs resolves "a/b" through openat2 (or learns here that it is missing).
    let fresh = RealFs::open(dir.path()).unwrap();
    assert_eq!(fresh.read("a/b/f", 10).unwrap().as_deref(), Some(&b"x"[..]));
    eprintln!("openat2 in use: {}", fresh.uses_openat2());
    assert!(
        !RealFs::open(dir.path())
            .unwrap()
            .without_openat2()
            .uses_openat2()
    );
}

#[test]
fn racing_links_have_exactly_one_winner() {
    for (how, open) in both() {
        for round in 0..16 {
            let dir = tempfile::tempdir().unwrap();
            let shared = Arc::new(open(dir.path()));
            shared.ensure_dir("d").unwrap();
            let barrier = Arc::new(Barrier::new(8));
            let threads: Vec<_> = (0..8)
                .map(|i| {
                    let barrier = barrier.clone();
                    // Half the rounds share one RealFs (one cache), half use one each.
                    let fs = if round % 2 == 0 {
                        shared.clone()
                    } else {
                        Arc::new(open(dir.path()))
                    };
                    std::thread::spawn(move || {
                        let tmp = format!("d/tmp.{i}");
                        fs.write_new(&tmp, format!("writer {i} of round {round}").as_bytes())
                            .unwrap();
                        fs.fsync(&tmp).unwrap();
                        barrier.wait();
                        (i, fs.link(&tmp, "d/target"))
                    })
                })
                .collect();
            let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            let winners: Vec<usize> = results
                .iter()
                .filter(|(_, r)| r.is_ok())
                .map(|(i, _)| *i)
                .collect();
            assert_eq!(winners.len(), 1, "{how}: winners {winners:?}");
            for (i, r) in &results {
                if let Err(e) = r {
                    assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{how}: writer {i}: {e}");
                }
            }
            let w = winners[0];
            assert_eq!(
                shared.read("d/target", 1024).unwrap().unwrap(),
                format!("writer {w} of round {round}").as_bytes(),
                "{how}"
            );
            assert_eq!(shared.link_count(&format!("d/tmp.{w}")).unwrap(), Some(2));
            assert_eq!(shared.link_count("d/target").unwrap(), Some(2));
        }
    }
}

#[test]
fn files_are_0600_and_dirs_0700_and_existing_dirs_are_judged_never_chmodded() {
    for (how, open) in both() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let fs = open(root);
        assert!(fs.ensure_dir("a/b/c").unwrap(), "{how}");
        assert!(
            !fs.ensure_dir("a/b/c").unwrap(),
            "{how}: second time creates nothing"
        );
        assert!(!fs.ensure_dir("a/b").unwrap(), "{how}");
        for d in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode_of(&root.join(d)), 0o700, "{how}: {d}");
        }
        fs.write_new("a/b/c/f", b"secret").unwrap();
        assert_eq!(mode_of(&root.join("a/b/c/f")), 0o600, "{how}");

        // An existing world-readable directory is ours and nobody else can write it: used
        // as it is. One below it that the group may write is refused, and neither is
        // chmodded (issue #15: no existing mode is ever changed).
        std::fs::create_dir(root.join("open")).unwrap();
        std::fs::set_permissions(root.join("open"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        assert!(!fs.ensure_dir("open").unwrap(), "{how}");
        std::fs::create_dir(root.join("open/inner")).unwrap();
        std::fs::set_permissions(
            root.join("open/inner"),
            std::fs::Permissions::from_mode(0o775),
        )
        .unwrap();
        for e in [
            fs.ensure_dir("open/inner").unwrap_err(),
            fs.ensure_dir("open/inner/deeper").unwrap_err(),
            fs.list("open/inner").unwrap_err(),
            fs.write_new("open/inner/f", b"x").unwrap_err(),
        ] {
            assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{how}: {e}");
            let n = lease_fs::real::not_owned_in(&e).expect("a NotOwned error");
            assert_eq!((n.path.as_str(), n.mode), ("open/inner", 0o775), "{how}");
            assert!(e.to_string().contains("chmod go-w"), "{how}: {e}");
        }
        assert_eq!(mode_of(&root.join("open")), 0o755, "{how}");
        assert_eq!(mode_of(&root.join("open/inner")), 0o775, "{how}");
        assert_eq!(ls(&root.join("open/inner")), Vec::<String>::new(), "{how}");

        // A file others may write is not read; one others may only read is.
        std::fs::write(root.join("a/g"), b"g").unwrap();
        std::fs::set_permissions(root.join("a/g"), std::fs::Permissions::from_mode(0o664)).unwrap();
        let e = fs.read("a/g", 10).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{how}: {e}");
        assert!(e.to_string().contains("mode 0664"), "{how}: {e}");
        assert!(e.to_string().contains("chmod go-w"), "{how}: {e}");
        assert!(fs.exists("a/g").is_err(), "{how}");
        assert_eq!(mode_of(&root.join("a/g")), 0o664, "{how}");
        std::fs::set_permissions(root.join("a/g"), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(fs.read("a/g", 10).unwrap().as_deref(), Some(&b"g"[..]));
    }
}

#[test]
fn a_root_open_to_others_or_of_another_uid_is_not_opened() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("r");
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = RealFs::open(&root).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("the run folder itself"), "{e}");
    assert!(RealFs::create(&root).is_err());
    assert_eq!(mode_of(&root), 0o777, "never chmodded");
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let fs = RealFs::open(&root).unwrap();
    // Opened up after it was opened: the next check refuses.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o775)).unwrap();
    assert_eq!(
        fs.check_root().unwrap_err().kind(),
        ErrorKind::PermissionDenied
    );
    if rustix::process::geteuid().is_root() {
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&root, Some(65534), None).unwrap();
        let e = RealFs::open(&root).unwrap_err();
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    } else {
        eprintln!("skipped the chown case: needs root");
    }
}

#[test]
fn create_makes_private_parents() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("x/y/run");
    let fs = RealFs::create(&root).unwrap();
    for p in ["x", "x/y", "x/y/run"] {
        assert_eq!(mode_of(&dir.path().join(p)), 0o700, "{p}");
    }
    fs.check_root().unwrap();
    // Creating an existing root just opens it.
    let again = RealFs::create(&root).unwrap();
    again.check_root().unwrap();
}

#[test]
fn a_symlinked_directory_in_a_path_is_refused_and_its_target_untouched() {
    for (how, open) in both() {
        let dir = tempfile::tempdir().unwrap();
        let victim = tempfile::tempdir().unwrap();
        std::fs::write(victim.path().join("f"), b"victim's").unwrap();
        let root = dir.path();
        symlink(victim.path(), root.join("link")).unwrap();
        std::fs::create_dir(root.join("a")).unwrap();
        symlink(victim.path(), root.join("a/inner")).unwrap();
        let fs = open(root);

        let e = fs.ensure_dir("link/sub").unwrap_err();
        assert!(e.to_string().contains("link"), "{how}: {e}");
        assert!(e.to_string().contains("symlink"), "{how}: {e}");
        let e = fs.ensure_dir("link").unwrap_err();
        assert!(e.to_string().contains("symlink"), "{how}: {e}");
        let e = fs.ensure_dir("a/inner/deeper").unwrap_err();
        assert!(e.to_string().contains("a/inner"), "{how}: {e}");

        let e = fs.write_new("link/new", b"x").unwrap_err();
        assert!(e.to_string().contains("link is a symlink"), "{how}: {e}");
        assert!(fs.write_new("a/inner/new", b"x").is_err(), "{how}");
        let e = fs.read("link/f", 100).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{how}: {e}");
        assert!(fs.read("a/inner/f", 100).is_err(), "{how}");
        assert!(fs.list("link").is_err(), "{how}");
        assert!(fs.list("a/inner").is_err(), "{how}");
        assert!(fs.exists("link/f").is_err(), "{how}");
        assert!(fs.fsync("link/f").is_err(), "{how}");
        assert!(fs.fsync_dir("link").is_err(), "{how}");
        assert!(fs.link("link/f", "stolen").is_err(), "{how}");
        assert!(fs.rename("link/f", "stolen").is_err(), "{how}");
        assert!(fs.unlink("link/f").is_err(), "{how}");
        assert!(fs.link_count("link/f").is_err(), "{how}");

        assert_eq!(ls(victim.path()), vec!["f".to_string()], "{how}");
        assert_eq!(std::fs::read(victim.path().join("f")).unwrap(), b"victim's");
        assert!(!root.join("stolen").exists());
    }
}

#[test]
fn a_cached_directory_replaced_by_a_symlink_is_refused() {
    for (how, open) in both() {
        let dir = tempfile::tempdir().unwrap();
        let victim = tempfile::tempdir().unwrap();
        let root = dir.path();
        let fs = open(root);
        fs.ensure_dir("a").unwrap();
        fs.write_new("a/one", b"1").unwrap();
        std::fs::rename(root.join("a"), root.join("a.old")).unwrap();
        symlink(victim.path(), root.join("a")).unwrap();
        assert!(fs.write_new("a/two", b"2").is_err(), "{how}");
        assert!(fs.ensure_dir("a").is_err(), "{how}");
        assert!(ls(victim.path()).is_empty(), "{how}");
        assert_eq!(ls(&root.join("a.old")), vec!["one".to_string()], "{how}");
    }
}

#[test]
fn a_cached_directory_that_was_replaced_is_resolved_again() {
    for (how, open) in both() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let fs = open(root);
        fs.ensure_dir("d").unwrap();
        fs.write_new("d/a", b"a").unwrap();
        std::fs::rename(root.join("d"), root.join("d.old")).unwrap();
        assert_eq!(fs.list("d").unwrap(), Vec::<String>::new(), "{how}");
        assert_eq!(fs.read("d/a", 10).unwrap(), None, "{how}");
        std::fs::create_dir(root.join("d")).unwrap();
        fs.write_new("d/b", b"b").unwrap();
        assert_eq!(ls(&root.join("d")), vec!["b".to_string()], "{how}");
        assert_eq!(ls(&root.join("d.old")), vec!["a".to_string()], "{how}");
    }
}

#[test]
fn a_file_where_a_directory_should_be_is_refused_and_untouched() {
    for (how, open) in both() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("file"), b"content").unwrap();
        std::fs::set_permissions(root.join("file"), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        let fs = open(root);
        let e = fs.ensure_dir("file").unwrap_err();
        assert!(e.to_string().contains("file"), "{how}: {e}");
        let e = fs.ensure_dir("file/sub").unwrap_err();
        assert!(e.to_string().contains("file is a"), "{how}: {e}");
        assert!(e.to_string().contains("not a directory"), "{how}: {e}");
        assert!(fs.write_new("file/x", b"x").is_err(), "{how}");
        assert!(fs.read("file/x", 10).is_err(), "{how}");
        assert!(fs.list("file").is_err(), "{how}");
        assert_eq!(std::fs::read(root.join("file")).unwrap(), b"content");
        assert_eq!(mode_of(&root.join("file")), 0o644, "{how}");
        assert_eq!(ls(root), vec!["file".to_string()], "{how}");
    }
}

#[test]
fn reading_a_symlink_is_refused() {
    for (how, open) in both() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("target"), b"t").unwrap();
        symlink("target", root.join("s")).unwrap();
        symlink("nowhere", root.join("dangling")).unwrap();
        let fs = open(root);
        let e = fs.read("s", 10).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{how}: {e}");
        assert!(e.to_string().contains('s'), "{how}: {e}");
        assert!(fs.read("dangling", 10).is_err(), "{how}");
        assert!(fs.fsync("s").is_err(), "{how}");
        // It exists (as a link), and write_new never writes through it.
        assert!(fs.exists("s").unwrap(), "{how}");
        assert!(fs.exists("dangling").unwrap(), "{how}");
        let e = fs.write_new("dangling", b"x").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{how}");
        assert!(!root.join("nowhere").exists(), "{how}");
        assert_eq!(std::fs::read(root.join("target")).unwrap(), b"t");
    }
}

#[test]
fn reading_anything_but_a_regular_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let fs = RealFs::open(root).unwrap();
    fs.ensure_dir("d").unwrap();
    // The one classification of a non-record (PROTOCOL §5.1): `InvalidData` with a
    // `NotARecord` saying what it is.
    let e = fs.read("d", 10).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidData);
    let n = lease_fs::fs::not_a_record_in(&e).expect("a NotARecord");
    assert_eq!(
        (n.path.as_str(), n.kind),
        ("d", lease_fs::fs::EntryKind::Directory)
    );
    // A FIFO must be refused, not block the reader.
    let made = std::process::Command::new("mkfifo")
        .arg(root.join("fifo"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if made {
        let t = Instant::now();
        let e = fs.read("fifo", 10).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let _ = fs.fsync("fifo"); // whatever it answers, it must not block
        assert!(t.elapsed() < Duration::from_secs(5));
    } else {
        eprintln!("mkfifo unavailable: FIFO case skipped");
    }
}

#[test]
fn read_enforces_the_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let fs = RealFs::open(dir.path()).unwrap();
    fs.write_new("ten", b"0123456789").unwrap();
    assert_eq!(fs.read("ten", 10).unwrap().unwrap(), b"0123456789");
    assert_eq!(
        fs.read("ten", 9).unwrap_err().kind(),
        ErrorKind::InvalidData
    );
    fs.write_new("empty", b"").unwrap();
    assert_eq!(fs.read("empty", 0).unwrap().unwrap(), b"");
    let big: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
    fs.write_new("big", &big).unwrap();
    fs.fsync("big").unwrap();
    assert_eq!(fs.read("big", big.len()).unwrap().unwrap(), big);
}

#[test]
fn list_of_a_missing_directory_is_empty() {
    for (how, open) in both() {
        let dir = tempfile::tempdir().unwrap();
        let fs = open(dir.path());
        assert!(fs.list("missing").unwrap().is_empty(), "{how}");
        assert!(fs.list("missing/deeper/still").unwrap().is_empty(), "{how}");
        fs.ensure_dir("d").unwrap();
        assert!(fs.list("d").unwrap().is_empty(), "{how}");
        for n in ["b", "a", "c"] {
            fs.write_new(&format!("d/{n}"), n.as_bytes()).unwrap();
        }
        let mut names = fs.list("d").unwrap();
        names.sort();
        assert_eq!(names, ["a", "b", "c"], "{how}");
        let mut top = fs.list("").unwrap();
        top.sort();
        assert_eq!(top, ["d"], "{how}");
    }
}

#[test]
fn opening_a_missing_root_fails_fast_with_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-run");
    let t = Instant::now();
    let e = RealFs::open(&missing).unwrap_err();
    let took = t.elapsed();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(took < Duration::from_millis(100), "took {took:?}");
    assert!(e.to_string().contains("no-such-run"), "{e}");
    assert!(!missing.exists());
}

#[test]
fn a_symlinked_or_non_directory_root_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("real")).unwrap();
    symlink(dir.path().join("real"), dir.path().join("alias")).unwrap();
    let e = RealFs::open(&dir.path().join("alias")).unwrap_err();
    assert!(e.to_string().contains("symlink"), "{e}");
    std::fs::write(dir.path().join("plain"), b"").unwrap();
    let e = RealFs::open(&dir.path().join("plain")).unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
    assert!(RealFs::create(&dir.path().join("alias")).is_err());
}

#[test]
fn a_renamed_root_is_detected_and_writes_stay_in_the_opened_directory() {
    for (how, open) in both() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("run");
        std::fs::create_dir(&root).unwrap();
        let fs = open(&root);
        fs.ensure_dir("events").unwrap();
        fs.write_new("events/1", b"before").unwrap();
        fs.check_root().unwrap();

        let moved = dir.path().join("run.moved");
        std::fs::rename(&root, &moved).unwrap();
        let e = fs.check_root().unwrap_err();
        assert!(e.to_string().contains("removed or renamed"), "{how}: {e}");
        assert!(e.to_string().contains("run"), "{how}: {e}");

        // Someone makes a fresh directory at the old path.
        std::fs::create_dir(&root).unwrap();
        let e = fs.check_root().unwrap_err();
        assert!(e.to_string().contains("renamed or replaced"), "{how}: {e}");

        fs.write_new("after", b"after").unwrap();
        fs.ensure_dir("events").unwrap();
        fs.write_new("events/2", b"after").unwrap();
        assert!(
            ls(&root).is_empty(),
            "{how}: nothing may land at the old path"
        );
        assert_eq!(ls(&moved), ["after", "events"], "{how}");
        assert_eq!(ls(&moved.join("events")), ["1", "2"], "{how}");
        assert!(fs.exists("after").unwrap());
    }
}

#[test]
fn a_deleted_root_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    std::fs::create_dir(&root).unwrap();
    let fs = RealFs::open(&root).unwrap();
    std::fs::remove_dir(&root).unwrap();
    let e = fs.check_root().unwrap_err();
    assert!(e.to_string().contains("deleted"), "{e}");
    // Nothing can be created in a deleted directory, and nothing appears at the old path.
    assert!(fs.write_new("x", b"x").is_err());
    assert!(!root.exists());
}

#[test]
fn replacing_the_root_with_a_symlink_to_it_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("run");
    std::fs::create_dir(&root).unwrap();
    let fs = RealFs::open(&root).unwrap();
    let moved = dir.path().join("elsewhere");
    std::fs::rename(&root, &moved).unwrap();
    symlink(&moved, &root).unwrap();
    let e = fs.check_root().unwrap_err();
    assert!(e.to_string().contains("renamed or replaced"), "{e}");
}

#[test]
fn the_plain_operations_behave() {
    for (how, open) in both() {
        let dir = tempfile::tempdir().unwrap();
        let fs = open(dir.path());
        assert!(!fs.exists("f").unwrap());
        assert!(!fs.exists("no/such/dir/f").unwrap());
        assert_eq!(fs.link_count("f").unwrap(), None);
        assert_eq!(fs.age_secs("f").unwrap(), None);
        assert_eq!(fs.read("f", 10).unwrap(), None);
        assert_eq!(fs.read("no/such/f", 10).unwrap(), None);
        assert_eq!(
            fs.write_new("no/such/f", b"x").unwrap_err().kind(),
            ErrorKind::NotFound,
            "{how}"
        );
        assert_eq!(fs.fsync("f").unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(fs.fsync_dir("no").unwrap_err().kind(), ErrorKind::NotFound);

        fs.write_new("f", b"one").unwrap();
        assert_eq!(
            fs.write_new("f", b"two").unwrap_err().kind(),
            ErrorKind::AlreadyExists
        );
        fs.fsync("f").unwrap();
        fs.fsync_dir("").unwrap();
        assert!(fs.exists("f").unwrap());
        assert_eq!(fs.link_count("f").unwrap(), Some(1));
        assert!(fs.age_secs("f").unwrap().unwrap() < 60);

        fs.ensure_dir("d").unwrap();
        fs.link("f", "d/g").unwrap();
        assert_eq!(fs.link_count("f").unwrap(), Some(2));
        assert_eq!(
            fs.link("f", "d/g").unwrap_err().kind(),
            ErrorKind::AlreadyExists
        );
        fs.fsync_dir("d").unwrap();

        fs.write_new("h", b"new").unwrap();
        fs.rename("h", "d/g").unwrap();
        assert_eq!(fs.read("d/g", 10).unwrap().unwrap(), b"new");
        assert_eq!(fs.link_count("f").unwrap(), Some(1));
        fs.unlink("f").unwrap();
        assert_eq!(fs.unlink("f").unwrap_err().kind(), ErrorKind::NotFound);
        assert!(!fs.exists("f").unwrap());
    }
}

#[test]
fn malformed_paths_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fs = RealFs::open(dir.path()).unwrap();
    for bad in ["../x", "/etc/passwd", "a//b", "a/./b", "a/../b", "a/", "."] {
        assert_eq!(
            fs.write_new(bad, b"x").unwrap_err().kind(),
            ErrorKind::InvalidInput,
            "{bad}"
        );
        assert_eq!(
            fs.read(bad, 10).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(
            fs.ensure_dir(bad).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(fs.list(bad).unwrap_err().kind(), ErrorKind::InvalidInput);
    }
    for empty_file in ["", "d/"] {
        assert_eq!(
            fs.write_new(empty_file, b"x").unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }
    assert!(ls(dir.path()).is_empty());
}

/// Issue #19: a heartbeat after the first writes in place into the file it opens, so a name
/// planted at the beat's path is never written through: a symlink is refused (never
/// followed), a hard link to another file of the run is refused (the write would land in
/// that file), and the other file is left byte for byte. The run is not taken over for it.
#[test]
fn an_in_place_heartbeat_never_writes_through_a_planted_name() {
    use lease_core::ops::ClaimParams;
    use lease_core::{Identity, LeaseOps, Timestamp, TimingPolicy};
    for planted in ["symlink", "hard link"] {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("r");
        let run = lease_fs::RunDir::create(&root).unwrap();
        let l = run
            .claim(ClaimParams {
                run_id: run.run_id().clone(),
                owner_id: Identity::new("a").unwrap(),
                holder: lease_fs::this_holder().unwrap(),
                policy: TimingPolicy::default(),
                now: Timestamp::from_unix_millis(1_000).unwrap(),
                store_floor: None,
            })
            .unwrap();
        let t = |ms| Timestamp::from_unix_millis(ms).unwrap();
        run.heartbeat(&l, t(2_000), 1, None).unwrap();
        // Another process (a fresh RunDir: no descriptor kept) writes the next beat.
        let run = lease_fs::RunDir::open(&root).unwrap();
        let beat = root.join(lease_core::FileRef::Beat(l.generation).path());
        let victim = root.join("victim.json");
        std::fs::write(&victim, b"{\"keep\":true}\n").unwrap();
        std::fs::remove_file(&beat).unwrap();
        match planted {
            "symlink" => std::os::unix::fs::symlink(&victim, &beat).unwrap(),
            _ => std::fs::hard_link(&victim, &beat).unwrap(),
        }
        let e = run.heartbeat(&l, t(3_000), 2, None).unwrap_err();
        assert!(
            e.to_string()
                .contains(&lease_core::FileRef::Beat(l.generation).path()),
            "{planted}: {e}"
        );
        assert_eq!(
            std::fs::read(&victim).unwrap(),
            b"{\"keep\":true}\n",
            "{planted}"
        );
    }
}
