//! End-to-end tests of the run lifecycle with real child processes.

use lease_core::ops::Status;
use lease_core::{HeartbeatDurability, RunState, RunStatus, Timestamp, TimingPolicy, decode};
use lease_fs::RunDir;
use lease_run::{FinalStatus, OpenOptions, Run, StepName};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const HELPER: &str = "LEASE_RUN_TEST_HELPER";

fn fast() -> OpenOptions {
    OpenOptions {
        policy: TimingPolicy::from_millis(100, 300, 1000, HeartbeatDurability::Local).unwrap(),
        term_grace: Duration::from_millis(300),
        kill_wait: Duration::from_secs(1),
        ..OpenOptions::default()
    }
}

fn read_status(path: &Path) -> RunStatus {
    decode(&std::fs::read(path.join("run.json")).unwrap()).unwrap()
}

fn alive(pid: u32) -> bool {
    matches!(lease_run::procs::state_of(pid), Some(c) if c != 'Z' && c != 'X')
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn helper_cmd(mode: &str, path: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "helper_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(HELPER, mode)
    .env("LEASE_RUN_TEST_PATH", path);
    c
}

/// Not a test by itself: the body of helper processes started by the other tests.
#[test]
fn helper_process() {
    let Ok(mode) = std::env::var(HELPER) else {
        return;
    };
    let path = PathBuf::from(std::env::var("LEASE_RUN_TEST_PATH").unwrap());
    rt().block_on(async move {
        match mode.as_str() {
            "open-once" => match Run::open(&path, fast()).await {
                Ok(_) => std::process::exit(0),
                Err(e) => {
                    eprintln!("helper: {e}");
                    std::process::exit(e.exit_code())
                }
            },
            "owner-with-command" => {
                let run = Run::open(&path, fast()).await.unwrap();
                let argv: Vec<String> = ["sh", "-c", "trap '' TERM; sleep 30"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                let cmd = run.spawn(&argv, &[]).await.unwrap();
                println!("PID {}", cmd.pid());
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            _ => panic!("unknown helper mode"),
        }
    });
}

#[test]
fn open_writes_running_steps_in_order_and_release_writes_done() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-a");
    let steps = Arc::new(Mutex::new(Vec::new()));
    let s2 = steps.clone();
    let mut opts = fast();
    opts.on_step = Some(Arc::new(move |s: StepName, _d: Duration| {
        s2.lock().unwrap().push(s)
    }));
    rt().block_on(async {
        let run = Run::open(&path, opts.clone()).await.unwrap();
        let st = read_status(&path);
        assert_eq!(st.status, RunState::Running);
        assert_eq!(st.generation, run.generation());
        assert!(st.holder.is_some());
        for d in ["store", "work", "tmp"] {
            assert!(path.join(d).is_dir());
        }
        let g1 = run.generation().get();
        run.release(FinalStatus::Done).await.unwrap();
        assert_eq!(read_status(&path).status, RunState::Done);
        let view = RunDir::open(&path)
            .unwrap()
            .status(Timestamp::from_unix_millis(1).unwrap(), false)
            .unwrap();
        assert_eq!(view.status, Status::Free);
        let run = Run::open(&path, opts).await.unwrap();
        assert!(run.generation().get() > g1);
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
        assert_eq!(read_status(&path).status, RunState::Paused);
    });
    let names: Vec<&str> = steps.lock().unwrap().iter().map(|s| s.as_str()).collect();
    assert_eq!(
        &names[..17],
        [
            "owner-lock",
            "read-status",
            "claim",
            "run.json",
            "heartbeat",
            "layout",
            "commands",
            "store",
            "seal",
            "live",
            "stop-commands",
            "barrier",
            "seal-store",
            "final-status",
            "stop-heartbeat",
            "release-lease",
            "unlock"
        ]
    );
}

#[test]
fn invalid_run_json_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-bad");
    std::fs::create_dir_all(&path).unwrap();
    std::fs::write(path.join("run.json"), b"{not json").unwrap();
    let e = rt().block_on(Run::open(&path, fast())).unwrap_err();
    assert_eq!(e.code(), "RECORD_INVALID");
    assert_eq!(std::fs::read(path.join("run.json")).unwrap(), b"{not json");
    let rel = rt()
        .block_on(Run::open(Path::new("relative/run"), fast()))
        .unwrap_err();
    assert_eq!(rel.exit_code(), 64);
}

#[test]
fn second_open_from_another_process_is_refused_76() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-b");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let out = helper_cmd("open-once", &path).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(76),
            "{}",
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
    });
}

#[test]
fn spawn_records_the_command_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-c");
    let marker = dir.path().join("marker");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let script = r#"f="$RUNDIR/commands/$(printf %020d "$RUNLEASE_GENERATION")-$$.json"; if [ -s "$f" ]; then echo recorded > "$MARKER"; else echo missing > "$MARKER"; fi"#;
        let argv: Vec<String> = ["sh", "-c", script].iter().map(|s| s.to_string()).collect();
        let env = vec![
            ("RUNDIR".to_string(), path.display().to_string()),
            ("MARKER".to_string(), marker.display().to_string()),
        ];
        let mut cmd = run.spawn(&argv, &env).await.unwrap();
        assert!(cmd.wait().await.unwrap().success());
        assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "recorded");
        run.release(FinalStatus::Done).await.unwrap();
        // Records of this generation are removed once its commands are gone.
        assert_eq!(std::fs::read_dir(path.join("commands")).unwrap().count(), 0);
    });
}

#[test]
fn fence_kills_the_commands_before_it_is_reported_and_release_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-d");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let argv: Vec<String> = ["sh", "-c", "sleep 30 & sleep 30"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let cmd = run.spawn(&argv, &[]).await.unwrap();
        let pid = cmd.pid();
        tokio::time::sleep(Duration::from_millis(150)).await;
        let stuck = Instant::now();
        run.suspend_heartbeats();
        let e = tokio::time::timeout(Duration::from_secs(3), run.fenced())
            .await
            .expect("fenced in time");
        println!(
            "fence-to-kill ms (suspended heartbeat): {}",
            stuck.elapsed().as_millis()
        );
        assert_eq!(e.exit_code(), 75);
        assert!(!alive(pid));
        let members: Vec<_> = lease_run::procs::scan()
            .into_iter()
            .filter(|p| p.pgrp == pid && !p.zombie)
            .collect();
        assert!(members.is_empty(), "{members:?}");
        assert_eq!(run.check_live().unwrap_err().code(), "FENCED");
        // Another owner takes over once the record is stale: the fenced run never wrote.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        let other = RunDir::open(&path).unwrap();
        let now = Timestamp::from_unix_millis(
            u64::try_from(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis(),
            )
            .unwrap(),
        )
        .unwrap();
        let view = other.status(now, false).unwrap();
        let head = view.head.clone().unwrap();
        other
            .takeover(
                lease_core::Identity::new("taker").unwrap(),
                lease_fs::this_holder().unwrap(),
                fast().policy,
                now,
                lease_core::ops::Expectation::of(&head),
                lease_core::ops::TakeoverTrigger::Operator,
                7,
            )
            .unwrap();
        let before = std::fs::read(path.join("run.json")).unwrap();
        let e = run.release(FinalStatus::Done).await.unwrap_err();
        assert_eq!(e.code(), "FENCED");
        assert_eq!(std::fs::read(path.join("run.json")).unwrap(), before);
    });
}

#[test]
fn watchdog_kills_commands_while_the_runtime_is_blocked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-e");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let argv: Vec<String> = ["sleep", "30"].iter().map(|s| s.to_string()).collect();
        let cmd = run.spawn(&argv, &[]).await.unwrap();
        let pid = cmd.pid();
        assert!(alive(pid));
        // Block the only runtime thread: no heartbeat, no timer task can run.
        let blocked = Instant::now();
        let deadline = Duration::from_millis(300);
        let mut killed_at = None;
        while blocked.elapsed() < Duration::from_millis(1500) {
            std::thread::sleep(Duration::from_millis(5));
            if killed_at.is_none() && !alive(pid) {
                killed_at = Some(blocked.elapsed());
            }
        }
        let k = killed_at.expect("the watchdog killed the command while the runtime was blocked");
        println!(
            "fence-to-kill ms (blocked runtime): {} after the block began; deadline {} ms",
            k.as_millis(),
            deadline.as_millis()
        );
        // The last beat started at most one heartbeat before the block; tick 100 ms.
        assert!(k <= deadline + Duration::from_millis(250), "{k:?}");
        let e = run.release(FinalStatus::Done).await.unwrap_err();
        assert_eq!(e.code(), "FENCED");
    });
}

#[test]
fn reap_kills_a_killed_incarnations_command_on_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-f");
    let mut owner = helper_cmd("owner-with-command", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(owner.stdout.take().unwrap()).lines();
    let pid: u32 = loop {
        let l = lines.next().expect("helper output").unwrap();
        if let Some(p) = l.split("PID ").nth(1) {
            break p.trim().parse().unwrap();
        }
    };
    owner.kill().unwrap();
    owner.wait().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(alive(pid), "the command outlives its owner");
    assert_eq!(std::fs::read_dir(path.join("commands")).unwrap().count(), 1);
    let mut opts = fast();
    opts.retire_dead = true;
    rt().block_on(async {
        let run = Run::open(&path, opts).await.unwrap();
        assert!(
            !alive(pid),
            "reaped (it ignores SIGTERM: killed after the grace)"
        );
        assert_eq!(std::fs::read_dir(path.join("commands")).unwrap().count(), 0);
        run.release(FinalStatus::Done).await.unwrap();
    });
}
