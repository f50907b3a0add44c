//! The store against its seal and floor: rewound or missing stores are refused (65).

use crate::helpers::{
    epoch, fast, helper_cmd, now_ts, read_status, read_until, rt, signal_child,
    take_over_when_stale,
};
use lease_core::LeaseOps;
use lease_fs::RunDir;
use lease_run::{Batch, FinalStatus, OpenOptions, Run};
use rustix::process::Signal;
use std::io::BufRead;
use std::path::Path;

/// Copy the store file (and its WAL, if any) of a run that nobody has open.
fn copy_store(path: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    let s = path.join("store");
    for f in ["run.sqlite", "run.sqlite-wal"] {
        let _ = std::fs::remove_file(to.join(f));
        if s.join(f).exists() {
            std::fs::copy(s.join(f), to.join(f)).unwrap();
        }
    }
}

/// Put a copy back in place of the run's store (a rewind, or a restore).
fn put_store(from: &Path, path: &Path) {
    let s = path.join("store");
    for f in ["run.sqlite", "run.sqlite-wal"] {
        let _ = std::fs::remove_file(s.join(f));
        if from.join(f).exists() {
            std::fs::copy(from.join(f), s.join(f)).unwrap();
        }
    }
}

/// The head a run's lease chain has now (0: none).
fn head_of(path: &Path) -> u64 {
    RunDir::open(path)
        .unwrap()
        .status(now_ts(), false)
        .unwrap()
        .head
        .map_or(0, |h| h.generation().get())
}

/// A rewound store is refused before the claim (issue #28: judged read-only against the
/// seal and floor under the owner lock), writing nothing: no generation used up, run.json
/// as it was, no `-wal` created.
#[test]
fn a_store_rewound_behind_its_seal_is_refused_65_before_the_claim() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-k");
    let (old, good) = (dir.path().join("old"), dir.path().join("good"));
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        run.commit(Batch::new().put("a", "1")).await.unwrap();
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
        copy_store(&path, &old);
        let run = Run::open(&path, fast()).await.unwrap();
        run.commit(Batch::new().put("a", "2")).await.unwrap();
        run.commit(Batch::new().put("a", "3")).await.unwrap();
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
        copy_store(&path, &good);

        put_store(&old, &path);
        let (head, run_json) = (
            head_of(&path),
            std::fs::read(path.join("run.json")).unwrap(),
        );
        let e = Run::open(&path, fast()).await.unwrap_err();
        assert_eq!(e.code().as_str(), "STORE_BEHIND_SEAL", "{e}");
        assert!(e.to_string().contains("run.sqlite"), "names the file: {e}");
        assert_eq!(head_of(&path), head, "a generation was used up");
        assert_eq!(std::fs::read(path.join("run.json")).unwrap(), run_json);
        assert!(
            !path.join("store/run.sqlite-wal").exists(),
            "a -wal was created"
        );
        // Refused again, also from another process (runlease exits 65).
        let out = helper_cmd("open-once", &path).output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            said.contains("REFUSED STORE_BEHIND_SEAL"),
            "{said} / {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The right store opens, with everything acknowledged.
        put_store(&good, &path);
        let run = Run::open(&path, fast()).await.unwrap();
        assert_eq!(run.store().head().unwrap(), 3);
        assert_eq!(run.store().get("a").unwrap().unwrap().value, b"3");
        run.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn a_store_rewound_below_the_floor_recorded_by_a_takeover_is_refused_65() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-l");
    let (old, good) = (dir.path().join("old"), dir.path().join("good"));
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        run.commit(Batch::new().put("a", "1")).await.unwrap();
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
    });
    copy_store(&path, &old);
    // An owner commits 5 more, heartbeats, and then hangs (SIGSTOP): no clean seal.
    let mut owner = helper_cmd("owner-commits", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(owner.stdout.take().unwrap()).lines();
    let acked: Vec<u64> = read_until(&mut lines, "READY")
        .iter()
        .filter_map(|l| l.split("ACK ").nth(1))
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let last = *acked.last().unwrap();
    assert_eq!(last, 6);
    signal_child(owner.id(), Signal::STOP);
    let taken = take_over_when_stale(&path);
    // The takeover recorded the head the owner reported in its last heartbeat.
    assert_eq!(epoch(&path, taken.generation.get()).store_floor, Some(last));
    owner.kill().unwrap();
    owner.wait().unwrap();
    RunDir::open(&path)
        .unwrap()
        .release(lease_core::ops::ReleaseParams {
            lease: taken.clone(),
            now: now_ts(),
            seal: None,
        })
        .unwrap();
    copy_store(&path, &good);

    // The store rewound to before the crash: its head 1 passes the old seal (1) but not
    // the floor (6).
    put_store(&old, &path);
    rt().block_on(async {
        let head = head_of(&path);
        let e = Run::open(&path, fast()).await.unwrap_err();
        assert_eq!(e.code().as_str(), "STORE_BEHIND_SEAL", "{e}");
        assert!(e.to_string().contains("floor"), "{e}");
        assert_eq!(head_of(&path), head, "refused before the claim");
        put_store(&good, &path);
        let run = Run::open(&path, fast()).await.unwrap();
        assert_eq!(
            run.store().head().unwrap(),
            last,
            "every acknowledged commit"
        );
        run.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn a_store_rewound_below_the_floor_recorded_by_a_retirement_is_refused_65() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-p");
    let (old, good) = (dir.path().join("old"), dir.path().join("good"));
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        run.commit(Batch::new().put("a", "1")).await.unwrap();
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
    });
    copy_store(&path, &old);
    // An owner commits 5 more, heartbeats, and is SIGKILLed: no seal, a dead owner.
    let mut owner = helper_cmd("owner-commits", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(owner.stdout.take().unwrap()).lines();
    let acked: Vec<u64> = read_until(&mut lines, "READY")
        .iter()
        .filter_map(|l| l.split("ACK ").nth(1))
        .map(|s| s.trim().parse().unwrap())
        .collect();
    let last = *acked.last().unwrap();
    assert_eq!(last, 6);
    owner.kill().unwrap();
    owner.wait().unwrap();
    copy_store(&path, &good);
    // Rewound to before the crash (head 1, the same store), then opened with retirement
    // of the dead owner: the retirement records its last reported head as the floor.
    put_store(&old, &path);
    let opts = OpenOptions {
        retire_dead: true,
        ..fast()
    };
    rt().block_on(async {
        // Judged before the retirement (the floor is the head the dead owner reported in
        // its last heartbeat): nothing retired, nothing claimed.
        let head = head_of(&path);
        let e = Run::open(&path, opts.clone()).await.unwrap_err();
        assert_eq!(e.code().as_str(), "STORE_BEHIND_SEAL", "{e}");
        assert!(e.to_string().contains("floor"), "{e}");
        assert_eq!(head_of(&path), head, "refused before the retirement");
        assert_eq!(epoch(&path, head).state, lease_core::EpochState::Active);
        put_store(&good, &path);
        let run = Run::open(&path, opts).await.unwrap();
        assert_eq!(
            run.store().head().unwrap(),
            last,
            "every acknowledged commit"
        );
        run.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn a_sealed_store_that_disappeared_is_refused_65_and_never_recreated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-q");
    let store = path.join("store").join("run.sqlite");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        run.commit(Batch::new().put("a", "1")).await.unwrap();
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
        std::fs::remove_file(&store).unwrap();
        let before = read_status(&path);
        let e = Run::open(&path, fast()).await.unwrap_err();
        assert_eq!(e.code().as_str(), "STORE_MISSING", "{e}");
        assert!(!store.exists(), "an expected store is never recreated");
        // Refused by the preflight, before the claim: no generation used, run.json as it
        // was (the chain's seal is what names the store, for doctor and status).
        assert_eq!(read_status(&path), before);
        assert!(!path.join("lease/epochs/00000000000000000003.json").exists());
        let e = Run::open(&path, fast()).await.unwrap_err();
        assert_eq!(e.code().as_str(), "STORE_MISSING");
        assert!(!store.exists());
    });
}

/// The bytes of the store's files (`run.sqlite`, and its `-wal` if one exists).
fn store_bytes(path: &Path) -> (Vec<u8>, Option<Vec<u8>>) {
    let s = path.join("store");
    (
        std::fs::read(s.join("run.sqlite")).unwrap(),
        std::fs::read(s.join("run.sqlite-wal")).ok(),
    )
}

/// Issue #33: after a clean release with a seal, a run that never touches its store does
/// not open it (not one byte of the store changes, no `-wal` appears), its heartbeats
/// report the sealed head as the floor, and its release carries the seal (this store, the
/// same sequence, this generation). The next run that commits opens it on first use and
/// seals the new head. With `lazy_store: false` the same run does change the store (the
/// seal raises its fencing token): what this test measures can tell the two apart.
#[test]
fn a_run_that_never_touches_its_store_leaves_it_unopened_and_carries_the_seal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-lazy");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        run.commit(Batch::new().put("a", "1")).await.unwrap();
        let store_id = run.store().store_id().unwrap();
        run.release(FinalStatus::Done).await.unwrap();
        let before = store_bytes(&path);
        assert!(before.1.is_none(), "a released store keeps no -wal");

        let run = Run::open(&path, fast()).await.unwrap();
        let g = run.generation().get();
        // Wait for a heartbeat after the open (the open's own first beat precedes its
        // store step and reports no store): it reports the sealed head as the floor while
        // the store is unopened.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let floor = loop {
            let view = run.dir().status(now_ts(), false).unwrap();
            if let Some(h) = view.head.and_then(|h| h.beat).and_then(|b| b.store_head) {
                break h;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no heartbeat with a store head"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        assert_eq!(floor, 1, "the floor a deferred store reports");
        run.release(FinalStatus::Done).await.unwrap();
        assert_eq!(store_bytes(&path), before, "the untouched store was opened");
        let rel = epoch(&path, g + 1);
        let seal = rel.seal.expect("the release carries a seal");
        assert_eq!(
            (seal.store_id.as_str(), seal.sequence, seal.generation.get()),
            (store_id.as_str(), 1, g)
        );
        assert_eq!(read_status(&path).sealed_sequence, Some(1));

        // First use opens it (checked against that seal); the release seals the new head.
        let run = Run::open(&path, fast()).await.unwrap();
        let g = run.generation().get();
        assert_eq!(run.store().get("a").unwrap().unwrap().value, b"1");
        assert_eq!(run.commit(Batch::new().put("a", "2")).await.unwrap(), 2);
        run.release(FinalStatus::Done).await.unwrap();
        let seal = epoch(&path, g + 1).seal.expect("sealed");
        assert_eq!((seal.sequence, seal.generation.get()), (2, g));

        // Eager: the same untouched run writes the store (its seal).
        let before = store_bytes(&path);
        let eager = OpenOptions {
            lazy_store: false,
            ..fast()
        };
        let run = Run::open(&path, eager).await.unwrap();
        run.release(FinalStatus::Done).await.unwrap();
        assert_ne!(store_bytes(&path), before, "an eager open seals the store");
    });
}

/// Issue #33: a deferred store that cannot be opened at its first use (here: removed
/// under the owner) is that call's error, named with the store's code and file; the run
/// is not fenced, its release carries the seal the chain required (it committed nothing),
/// and the next open refuses the missing store before its claim, never recreating it.
#[test]
fn a_deferred_store_that_cannot_be_opened_fails_the_call_and_the_seal_is_carried() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-lazy-gone");
    let store = path.join("store").join("run.sqlite");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        run.commit(Batch::new().put("a", "1")).await.unwrap();
        run.release(FinalStatus::Done).await.unwrap();

        let run = Run::open(&path, fast()).await.unwrap();
        let g = run.generation().get();
        std::fs::remove_file(&store).unwrap();
        let e = run.commit(Batch::new().put("a", "2")).await.unwrap_err();
        assert_eq!(e.code().as_str(), "STORE_MISSING", "{e}");
        assert!(e.to_string().contains("run.sqlite"), "names the file: {e}");
        run.check_live().unwrap();
        // Still deferred: the next call tries again, and fails the same way.
        let e = run.store().head().unwrap_err();
        assert_eq!(e.code().as_str(), "STORE_MISSING", "{e}");
        run.release(FinalStatus::Done).await.unwrap();
        let seal = epoch(&path, g + 1).seal.expect("the seal is carried");
        assert_eq!((seal.sequence, seal.generation.get()), (1, g));
        assert!(!store.exists(), "never recreated");
        let e = Run::open(&path, fast()).await.unwrap_err();
        assert_eq!(e.code().as_str(), "STORE_MISSING", "{e}");
        assert!(!store.exists(), "never recreated");
    });
}
