//! Opens that are refused: invalid run.json and options, a second open from another
//! process, two opens at once, and a watched takeover.

use crate::helpers::{fast, helper_cmd, now_ts, read_status, rt};
use lease_core::LeaseOps;
use lease_core::ops::{Expectation, Status};
use lease_core::{HeartbeatDurability, Identity, RunState, TimingPolicy};
use lease_fs::RunDir;
use lease_run::{FinalStatus, OpenOptions, Run};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[test]
fn invalid_run_json_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-bad");
    std::fs::create_dir_all(&path).unwrap();
    std::fs::write(path.join("run.json"), b"{not json").unwrap();
    let e = rt().block_on(Run::open(&path, fast())).unwrap_err();
    assert_eq!(e.code().as_str(), "RECORD_INVALID");
    assert_eq!(std::fs::read(path.join("run.json")).unwrap(), b"{not json");
    let rel = rt()
        .block_on(Run::open(Path::new("relative/run"), fast()))
        .unwrap_err();
    assert_eq!(rel.code().as_str(), "ARGUMENT_INVALID", "{rel}");
}

#[test]
fn second_open_from_another_process_is_refused_76() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-b");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let out = helper_cmd("open-once", &path).output().unwrap();
        // Held (runlease exits 76): this process holds the kernel owner lock.
        // (stdout also carries the test harness's own lines.)
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.code() == Some(1) && said.contains("REFUSED OWNER_LOCK_HELD"),
            "{said} / {}",
            String::from_utf8_lossy(&out.stderr)
        );
        run.release(FinalStatus::Done).await.unwrap();
        let out = helper_cmd("open-once", &path).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The helper exited without releasing: its owner is dead. Retire it and release,
        // which also removes the (empty) cgroup it left.
        let opts = OpenOptions {
            retire_dead: true,
            ..fast()
        };
        let run = Run::open(&path, opts).await.unwrap();
        run.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn two_opens_at_once_exactly_one_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..3 {
        let path = dir.path().join(format!("run-h{round}"));
        let spawn = || {
            helper_cmd("open-hold", &path)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (mut a, mut b) = (spawn(), spawn());
        // The refused one ends by itself; then the holder is let go (its stdin closed).
        let end = Instant::now() + Duration::from_secs(30);
        while a.try_wait().unwrap().is_none() && b.try_wait().unwrap().is_none() {
            assert!(Instant::now() < end, "round {round}: neither open ended");
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(a.stdin.take());
        drop(b.stdin.take());
        let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
        let ok = outs.iter().filter(|o| o.status.code() == Some(0)).count();
        assert_eq!(ok, 1, "round {round}: exactly one open succeeds");
        let loser = outs.iter().find(|o| o.status.code() != Some(0)).unwrap();
        let said = String::from_utf8_lossy(&loser.stdout);
        assert_eq!(loser.status.code(), Some(1), "round {round}: {said}");
        assert!(
            said.contains("REFUSED OWNER_LOCK_HELD") || said.contains("REFUSED RUN_ALREADY_ACTIVE"),
            "round {round}: {said}"
        );
        assert_eq!(read_status(&path).status, RunState::Done);
    }
    // The same inside one process: two opens racing on one runtime.
    let path = dir.path().join("run-h-inproc");
    rt().block_on(async {
        let (a, b) = tokio::join!(Run::open(&path, fast()), Run::open(&path, fast()));
        let (won, lost) = match (a, b) {
            (Ok(r), Err(e)) | (Err(e), Ok(r)) => (r, e),
            (a, b) => panic!("exactly one must win: {a:?} / {b:?}"),
        };
        assert!(
            matches!(
                lost.code().as_str(),
                "OWNER_LOCK_HELD" | "RUN_ALREADY_ACTIVE"
            ),
            "{lost}"
        );
        won.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn invalid_options_are_refused_before_anything_is_touched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-j");
    let unsafe_timing = OpenOptions {
        // Valid for the lease protocol, but 150 ms between self-fence and staleness is
        // too little for the watchdog to confirm the kill.
        policy: TimingPolicy::from_millis(100, 850, 1000, HeartbeatDurability::Local).unwrap(),
        ..fast()
    };
    let both = OpenOptions {
        retire_dead: true,
        takeover: Some(Expectation {
            generation: None,
            owner_id: Identity::new("x").unwrap(),
            heartbeat_at: now_ts(),
            heartbeat_count: None,
        }),
        ..fast()
    };
    let zero = OpenOptions {
        kill_wait: Duration::ZERO,
        ..fast()
    };
    rt().block_on(async {
        for (what, p, o) in [
            ("relative path", PathBuf::from("relative/run"), fast()),
            ("unsafe timing", path.clone(), unsafe_timing),
            ("retire_dead and takeover", path.clone(), both),
            ("zero kill_wait", path.clone(), zero),
        ] {
            let e = Run::open(&p, o).await.unwrap_err();
            assert_eq!(e.code().as_str(), "ARGUMENT_INVALID", "{what}: {e}");
            assert!(!path.exists(), "{what}: nothing may be created");
            assert!(!Path::new("relative").exists());
        }
        let e = Run::open(&path, unsafe_timing_again()).await.unwrap_err();
        assert!(e.to_string().contains("unsafe timing"), "{e}");
    });
}

fn unsafe_timing_again() -> OpenOptions {
    OpenOptions {
        policy: TimingPolicy::from_millis(100, 850, 1000, HeartbeatDurability::Local).unwrap(),
        ..fast()
    }
}

#[test]
fn a_watched_takeover_is_recorded_as_automatic_and_refused_when_watched_too_briefly() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-auto");
    // A stale owner from another "host": claim with lease-fs and never beat again.
    let d = RunDir::create(&path).unwrap();
    let lease = d
        .claim(lease_core::ops::ClaimParams {
            run_id: d.run_id().clone(),
            owner_id: Identity::new("gone-owner").unwrap(),
            holder: lease_fs::this_holder().unwrap(),
            policy: fast().policy,
            now: now_ts(),
            store_floor: None,
        })
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let head = loop {
        let v = d.status(now_ts(), false).unwrap();
        if v.status == Status::Stale {
            break v.head.unwrap();
        }
        assert!(Instant::now() < end);
        std::thread::sleep(Duration::from_millis(20));
    };
    rt().block_on(async {
        // Watched for less than the owner's stale_after: refused (76), nothing claimed.
        let brief = OpenOptions {
            takeover: Some(Expectation::of(&head)),
            takeover_watched: Some(Duration::from_millis(10)),
            ..fast()
        };
        let e = Run::open(&path, brief).await.unwrap_err();
        assert_eq!(e.code().as_str(), "TAKEOVER_ACTIVE_REFUSED", "{e}");
        let watched = OpenOptions {
            takeover: Some(Expectation::of(&head)),
            takeover_watched: Some(Duration::from_millis(1500)),
            ..fast()
        };
        let run = Run::open(&path, watched).await.unwrap();
        let g = run.generation().get();
        assert_eq!(g, lease.generation.get() + 1);
        run.release(FinalStatus::Done).await.unwrap();
    });
}
