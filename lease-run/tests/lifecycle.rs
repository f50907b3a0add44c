//! End-to-end tests of the run lifecycle with real child processes.

use lease_core::LeaseOps;
use lease_core::ops::{Expectation, OwnedLease, Status, TakeoverTrigger};
use lease_core::{
    EpochRecord, FileRef, Generation, HeartbeatDurability, Identity, RunState, RunStatus,
    Timestamp, TimingPolicy, decode,
};
use lease_fs::RunDir;
use lease_run::{Batch, FinalStatus, OpenOptions, Run, StepName};
use rustix::process::Signal;
use std::io::BufRead;
use std::os::unix::process::CommandExt;
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

fn now_ts() -> Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    Timestamp::from_unix_millis(u64::try_from(ms).unwrap()).unwrap()
}

fn epoch(path: &Path, g: u64) -> EpochRecord {
    let f = FileRef::Epoch(Generation::new(g).unwrap());
    decode(&std::fs::read(path.join(f.path())).unwrap()).unwrap()
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Wait (polling) until the run's head is stale, then take it over exactly as an
/// operator would from another process (lease-fs, without the owner lock, which the
/// paused owner still holds). Returns the taker's lease.
fn take_over_when_stale(path: &Path) -> OwnedLease {
    let dir = RunDir::open(path).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let view = dir.status(now_ts(), false).unwrap();
        if view.status == Status::Stale {
            let head = view.head.unwrap();
            return dir
                .takeover(lease_core::ops::TakeoverParams {
                    run_id: dir.run_id().clone(),
                    owner_id: Identity::new("taker").unwrap(),
                    holder: lease_fs::this_holder().unwrap(),
                    policy: fast().policy,
                    now: now_ts(),
                    expect: Expectation::of(&head),
                    trigger: TakeoverTrigger::Operator,
                    nonce: 0x7a6b,
                })
                .unwrap();
        }
        assert!(Instant::now() < end, "never stale: {:?}", view.status);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lines of a helper's stdout until one starts with `until`; returns the lines before it.
/// (libtest prints `test helper_process ... ` without a newline first, so the helper's
/// first line shares it: parse with `split`, not `strip_prefix`.)
fn read_until(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    until: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let l = lines.next().expect("helper output ended").unwrap();
        if l.starts_with(until) {
            return out;
        }
        out.push(l);
    }
}

/// After a confirmed fence the watchdog removes the run's cgroup (if it had one): wait for
/// it, so a test process that exits right after leaves nothing behind.
fn cgroup_removed_after_fence(cg: Option<PathBuf>) {
    if let Some(cg) = cg {
        let end = Instant::now() + Duration::from_secs(3);
        while cg.exists() {
            assert!(
                Instant::now() < end,
                "{} not removed after the fence",
                cg.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
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
            "open-hold" => match Run::open(&path, fast()).await {
                Ok(run) => {
                    println!("OPENED {}", run.generation());
                    // Hold until the test closes stdin (after the other open has ended),
                    // so a slow start of the other process cannot find the run released.
                    tokio::task::spawn_blocking(|| {
                        let mut sink = Vec::new();
                        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
                    })
                    .await
                    .unwrap();
                    run.release(FinalStatus::Done).await.unwrap();
                    std::process::exit(0)
                }
                Err(e) => {
                    eprintln!("helper: {e}");
                    println!("REFUSED {}", e.code().as_str());
                    std::process::exit(e.exit_code())
                }
            },
            "owner-exit-on-fence" => {
                let mut opts = fast();
                opts.exit_on_fence = true;
                let run = Run::open(&path, opts).await.unwrap();
                for argv in [
                    args(&["sleep", "30"]),
                    args(&["sh", "-c", "sleep 30 & sleep 30"]),
                ] {
                    let cmd = run.spawn(&argv, &[]).await.unwrap();
                    println!("PID {}", cmd.pid());
                }
                // Let the watchdog see the children's descendants (100 ms scans).
                tokio::time::sleep(Duration::from_millis(300)).await;
                println!("READY");
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            "owner-commits" => {
                let run = Run::open(&path, fast()).await.unwrap();
                for i in 0..5 {
                    let seq = run
                        .commit(Batch::new().put(format!("doc/{i}"), "v"))
                        .await
                        .unwrap();
                    println!("ACK {seq}");
                }
                // Several heartbeats (100 ms) carry the head after the last commit.
                tokio::time::sleep(Duration::from_millis(400)).await;
                println!("READY");
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            "owner-with-daemon" => {
                let run = Run::open(&path, fast()).await.unwrap();
                let pidfile = path.parent().unwrap().join("daemon.pid");
                let mut cmd = run.spawn(&daemon_argv(&pidfile), &[]).await.unwrap();
                assert!(cmd.wait().await.unwrap().success());
                println!("DAEMON {}", wait_for_pid(&pidfile));
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
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
    assert_eq!(e.code().as_str(), "RECORD_INVALID");
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
        assert_eq!(run.check_live().unwrap_err().code().as_str(), "FENCED");
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
            .takeover(lease_core::ops::TakeoverParams {
                run_id: other.run_id().clone(),
                owner_id: lease_core::Identity::new("taker").unwrap(),
                holder: lease_fs::this_holder().unwrap(),
                policy: fast().policy,
                now,
                expect: lease_core::ops::Expectation::of(&head),
                trigger: lease_core::ops::TakeoverTrigger::Operator,
                nonce: 7,
            })
            .unwrap();
        let before = std::fs::read(path.join("run.json")).unwrap();
        let cg = run.cgroup();
        let e = run.release(FinalStatus::Done).await.unwrap_err();
        assert_eq!(e.code().as_str(), "FENCED");
        assert_eq!(std::fs::read(path.join("run.json")).unwrap(), before);
        cgroup_removed_after_fence(cg);
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
        let deadline = run.time_to_self_fence();
        let blocked = Instant::now();
        let mut killed_at = None;
        while blocked.elapsed() < Duration::from_millis(1500) {
            std::thread::sleep(Duration::from_millis(5));
            if killed_at.is_none() && !alive(pid) {
                killed_at = Some(blocked.elapsed());
            }
        }
        let k = killed_at.expect("the watchdog killed the command while the runtime was blocked");
        let past = k.saturating_sub(deadline);
        println!(
            "fence-to-kill ms: {} (runtime blocked: from the self-fence deadline to the command gone; {} ms after the block began, deadline was {} ms away)",
            past.as_millis(),
            k.as_millis(),
            deadline.as_millis()
        );
        assert!(k >= deadline, "killed before the deadline: {k:?} < {deadline:?}");
        assert!(past <= Duration::from_millis(100), "{past:?} past the deadline");
        let cg = run.cgroup();
        let e = run.release(FinalStatus::Done).await.unwrap_err();
        assert_eq!(e.code().as_str(), "FENCED");
        cgroup_removed_after_fence(cg);
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

fn pids_of(lines: &[String]) -> Vec<u32> {
    lines
        .iter()
        .filter_map(|l| l.split("PID ").nth(1))
        .map(|p| p.trim().parse().unwrap())
        .collect()
}

/// Every live process in one of `groups` (a command and what it started).
fn members(groups: &[u32]) -> Vec<u32> {
    lease_run::procs::scan()
        .into_iter()
        .filter(|p| groups.contains(&p.pgrp) && !p.zombie)
        .map(|p| p.pid)
        .collect()
}

#[test]
fn a_takeover_fences_the_first_owner_whose_commands_die_in_time_and_it_exits_75() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-g");
    let mut owner = helper_cmd("owner-exit-on-fence", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(owner.stdout.take().unwrap()).lines();
    let groups = pids_of(&read_until(&mut lines, "READY"));
    assert_eq!(groups.len(), 2);
    let watched = members(&groups);
    assert!(
        watched.len() >= 3,
        "two commands and a background child: {watched:?}"
    );

    // Pause the owner (a zombie-to-be), take the run over once it is stale, resume it.
    signal_child(owner.id(), Signal::STOP);
    let taken = take_over_when_stale(&path);
    let resumed = Instant::now();
    signal_child(owner.id(), Signal::CONT);
    let mut gone_at = None;
    while resumed.elapsed() < Duration::from_secs(5) {
        if watched.iter().all(|p| !alive(*p)) {
            gone_at = Some(resumed.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let k = gone_at.expect("the fenced owner killed its commands");
    println!(
        "fence-to-kill ms: {} (takeover of a paused owner: from its resumption to its last command gone)",
        k.as_millis()
    );
    let code = owner.wait().unwrap().code();
    assert_eq!(code, Some(75), "the fenced owner exits 75");
    let limit = fast().policy.self_fence_after() + Duration::from_millis(100);
    assert!(k <= limit, "{k:?} > {limit:?}");
    // The taker holds the next generation; the fenced owner changed nothing after it.
    let view = RunDir::open(&path)
        .unwrap()
        .status(now_ts(), false)
        .unwrap();
    let head = view.head.unwrap();
    assert_eq!(head.generation(), taken.generation);
    assert_eq!(head.epoch.owner_id.as_str(), "taker");
    assert_eq!(
        read_status(&path).generation.get(),
        taken.generation.get() - 1
    );
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
        assert_eq!(loser.status.code(), Some(76), "round {round}: {said}");
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
        assert_eq!(lost.exit_code(), 76, "{lost}");
        won.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn status_transitions_across_open_release_and_reopen_and_the_generation_grows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-i");
    rt().block_on(async {
        let mut gens = Vec::new();
        let wake = Timestamp::from_unix_millis(4_000_000_000_000).unwrap();
        let finals = [
            (
                FinalStatus::Paused {
                    wake_at: Some(wake),
                },
                RunState::Paused,
            ),
            (FinalStatus::Done, RunState::Done),
            (
                FinalStatus::Failed {
                    detail: "step 3 failed".into(),
                },
                RunState::Failed,
            ),
            (FinalStatus::Paused { wake_at: None }, RunState::Paused),
        ];
        let mut head = 0;
        for (i, (fin, state)) in finals.into_iter().enumerate() {
            let run = Run::open(&path, fast()).await.unwrap();
            let st = read_status(&path);
            assert_eq!(st.status, RunState::Running);
            assert_eq!(st.generation, run.generation());
            assert_eq!(st.sealed_sequence, None, "cleared while live");
            assert_eq!(st.detail, None);
            assert_eq!(run.store().head().unwrap(), head, "the store carries over");
            gens.push(run.generation().get());
            for _ in 0..=i {
                head = run
                    .commit(Batch::new().put("k", format!("{i}")))
                    .await
                    .unwrap();
            }
            if i == 1 {
                run.set_status(RunState::Running, Some("halfway".into()), None)
                    .await
                    .unwrap();
                assert_eq!(read_status(&path).detail.as_deref(), Some("halfway"));
            }
            run.release(fin.clone()).await.unwrap();
            let st = read_status(&path);
            assert_eq!(st.status, state);
            assert_eq!(st.sealed_sequence, Some(head));
            match fin {
                FinalStatus::Paused { wake_at } => assert_eq!(st.wake_at, wake_at),
                FinalStatus::Failed { detail } => assert_eq!(st.detail, Some(detail)),
                FinalStatus::Done => assert_eq!((st.wake_at, st.detail), (None, None)),
            }
            // The release epoch carries the seal: this store, its head, this generation.
            let rel = epoch(&path, run_gen(&gens) + 1);
            let seal = rel.seal.expect("sealed");
            assert_eq!(
                (seal.sequence, seal.generation.get()),
                (head, run_gen(&gens))
            );
        }
        assert!(gens.windows(2).all(|w| w[1] > w[0]), "{gens:?}");
        assert_eq!(gens, [1, 3, 5, 7]);
    });
}

fn run_gen(gens: &[u64]) -> u64 {
    *gens.last().unwrap()
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
            assert_eq!(
                (e.code().as_str(), e.exit_code()),
                ("ARGUMENT_INVALID", 64),
                "{what}: {e}"
            );
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

#[test]
fn a_store_rewound_behind_its_seal_is_refused_65_and_run_json_says_failed() {
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
        let e = Run::open(&path, fast()).await.unwrap_err();
        assert_eq!(
            (e.code().as_str(), e.exit_code()),
            ("STORE_BEHIND_SEAL", 65),
            "{e}"
        );
        let st = read_status(&path);
        assert_eq!(st.status, RunState::Failed);
        let detail = st.detail.unwrap();
        assert!(detail.starts_with("STORE_BEHIND_SEAL"), "{detail}");
        assert!(detail.contains("run.sqlite"), "names the file: {detail}");
        // The failed open re-issued the seal: the rewound store is refused again, also
        // from another process (exit 65).
        let out = helper_cmd("open-once", &path).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(65),
            "{}",
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
        let e = Run::open(&path, fast()).await.unwrap_err();
        assert_eq!(
            (e.code().as_str(), e.exit_code()),
            ("STORE_BEHIND_SEAL", 65),
            "{e}"
        );
        assert!(e.to_string().contains("floor"), "{e}");
        let st = read_status(&path);
        assert_eq!(st.status, RunState::Failed);
        assert!(st.detail.unwrap().contains("STORE_BEHIND_SEAL"));
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

/// Write a file 0600, as runlease writes its records.
fn write_private(p: &Path, bytes: &[u8]) {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)
        .unwrap();
    f.write_all(bytes).unwrap();
}

/// Signal a child of this test (its pid cannot be reused while it is unreaped).
fn signal_child(pid: u32, sig: Signal) {
    let p = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    rustix::process::kill_process(p, sig).unwrap();
}

/// The incarnation secret the frozen process carries.
const FROZEN_SECRET: &str = "frozen-test-secret";

/// A process SIGKILL cannot end while its cgroup v1 freezer keeps it frozen: the test owns
/// it and refuses to let it die until the end.
struct Frozen {
    cg: PathBuf,
    child: std::process::Child,
}

impl Frozen {
    fn start() -> Option<Frozen> {
        let root = Path::new("/sys/fs/cgroup/freezer");
        if !root.join("freezer.state").exists() && !root.join("cgroup.procs").exists() {
            return None;
        }
        let cg = root.join(format!("lease-run-test-{}", std::process::id()));
        std::fs::create_dir(&cg).ok()?;
        let mut cmd = std::process::Command::new("sleep");
        // The proof a reaper asks for (PROTOCOL §11.1): the test records the digest of
        // this secret in the command record it forges for generation 1.
        cmd.arg("60")
            .process_group(0)
            .env("RUNLEASE_INCARNATION", FROZEN_SECRET);
        let child = cmd.spawn().ok()?;
        let f = Frozen { cg, child };
        std::fs::write(f.cg.join("cgroup.procs"), f.child.id().to_string()).ok()?;
        std::fs::write(f.cg.join("freezer.state"), "FROZEN").ok()?;
        let end = Instant::now() + Duration::from_secs(2);
        while std::fs::read_to_string(f.cg.join("freezer.state"))
            .ok()?
            .trim()
            != "FROZEN"
        {
            if Instant::now() > end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(f)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = std::fs::write(self.cg.join("freezer.state"), "THAWED");
        let _ = self.child.wait();
        let _ = std::fs::remove_dir(&self.cg);
    }
}

#[test]
fn a_recorded_command_that_cannot_be_killed_refuses_the_open_76_and_its_record_is_kept() {
    let Some(frozen) = Frozen::start() else {
        eprintln!(
            "SKIPPED: no writable cgroup v1 freezer here (needs root); cannot make an unkillable process"
        );
        return;
    };
    let pid = frozen.child.id();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-m");
    let opts = OpenOptions {
        kill_wait: Duration::from_millis(300),
        ..fast()
    };
    rt().block_on(async {
        // Generation 1 recorded the frozen process as its command and crashed.
        let run = Run::open(&path, opts.clone()).await.unwrap();
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
        let rec = lease_core::CommandRecord {
            run_id: lease_core::RunId::new("run-m").unwrap(),
            generation: Generation::new(1).unwrap(),
            pid,
            pgid: pid,
            start_time: lease_fs::probe::process_start_time(pid).unwrap().unwrap(),
            boot_id: Identity::new(lease_fs::probe::boot_id().unwrap()).unwrap(),
            argv: args(&["sleep", "60"]),
            started_at: now_ts(),
            incarnation: Some(lease_core::CommandRecord::incarnation_digest(
                &lease_core::RunId::new("run-m").unwrap(),
                Generation::new(1).unwrap(),
                FROZEN_SECRET,
            )),
        };
        let f = FileRef::Command {
            generation: Generation::new(1).unwrap(),
            pid,
        };
        std::fs::create_dir_all(path.join("commands")).unwrap();
        write_private(&path.join(f.path()), &lease_core::encode(&rec).unwrap());

        let e = Run::open(&path, opts.clone()).await.unwrap_err();
        assert_eq!(
            (e.code().as_str(), e.exit_code()),
            ("RUN_COMMANDS_SURVIVE", 76),
            "{e}"
        );
        assert!(alive(pid), "frozen: SIGKILL is pending, it cannot die");
        assert!(
            path.join(f.path()).exists(),
            "the record is kept for the next try"
        );
        let st = read_status(&path);
        assert_eq!(st.status, RunState::Failed);
        assert!(st.detail.unwrap().starts_with("RUN_COMMANDS_SURVIVE"));
        drop(frozen); // thawed: the pending SIGKILL ends it
        let run = Run::open(&path, opts).await.unwrap();
        assert!(!path.join(f.path()).exists(), "reaped and removed");
        run.release(FinalStatus::Done).await.unwrap();
    });
}

/// A command that double-forks a daemon into a new session and process group, writes its
/// pid to `pidfile`, and exits at once: it escapes process-group and session tracking.
fn daemon_argv(pidfile: &Path) -> Vec<String> {
    let script = format!(
        "(setsid sh -c 'echo $$ > {p}.tmp && mv {p}.tmp {p}; exec sleep 30' &) ; exit 0",
        p = pidfile.display()
    );
    args(&["sh", "-c", &script])
}

fn wait_for_pid(pidfile: &Path) -> u32 {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(t) = std::fs::read_to_string(pidfile) {
            if let Ok(p) = t.trim().parse() {
                return p;
            }
        }
        assert!(Instant::now() < end, "the daemon never wrote its pid");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn cgroup_available(path: &Path) -> bool {
    let probe = rt().block_on(async {
        let run = Run::open(path, fast()).await.unwrap();
        let cg = run.cgroup();
        run.release(FinalStatus::Done).await.unwrap();
        cg
    });
    if probe.is_none() {
        eprintln!(
            "SKIPPED: no cgroup v2 subtree can be created here; commands fall back to group/session tracking"
        );
    }
    probe.is_some()
}

#[test]
fn a_double_forked_daemon_stays_in_the_runs_cgroup_and_dies_at_release() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-n");
    if !cgroup_available(&path) {
        return;
    }
    let pidfile = dir.path().join("daemon.pid");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let cg = run.cgroup().unwrap();
        let mut cmd = run.spawn(&daemon_argv(&pidfile), &[]).await.unwrap();
        assert!(cmd.wait().await.unwrap().success());
        let daemon = wait_for_pid(&pidfile);
        let info = lease_run::procs::proc_info(daemon).unwrap();
        assert_ne!(info.pgrp, cmd.pid(), "left the command's group");
        assert_ne!(info.session, cmd.pid(), "and its session");
        let its = std::fs::read_to_string(format!("/proc/{daemon}/cgroup")).unwrap();
        let name = cg.file_name().unwrap().to_str().unwrap();
        assert!(its.contains(name), "born inside the run's cgroup: {its}");
        run.release(FinalStatus::Done).await.unwrap();
        assert!(!alive(daemon), "the daemon died with the run");
        assert!(!cg.exists(), "the emptied cgroup is removed");
    });
}

#[test]
fn a_killed_owners_escaped_daemon_is_reaped_through_its_cgroup_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-o");
    if !cgroup_available(&path) {
        return;
    }
    let mut owner = helper_cmd("owner-with-daemon", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(owner.stdout.take().unwrap()).lines();
    let daemon: u32 = loop {
        let l = lines.next().expect("helper output").unwrap();
        if let Some(p) = l.split("DAEMON ").nth(1) {
            break p.trim().parse().unwrap();
        }
    };
    owner.kill().unwrap();
    owner.wait().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(alive(daemon), "the daemon outlives its owner");
    // Its command exited, so the record names a group and session it is not in.
    let mut opts = fast();
    opts.retire_dead = true;
    rt().block_on(async {
        let run = Run::open(&path, opts).await.unwrap();
        assert!(
            !alive(daemon),
            "reaped through the old incarnation's cgroup"
        );
        run.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn release_detached_hands_over_while_the_command_runs_on_and_the_next_open_spares_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-detach");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let g = run.generation().get();
        let mut cmd = run.spawn(&args(&["sleep", "30"]), &[]).await.unwrap();
        let pid = cmd.pid();
        let cg = run.cgroup();
        run.release_detached(FinalStatus::Done).await.unwrap();
        if let Some(cg) = cg {
            // Moved up into the owner's cgroup; the incarnation's directory is gone.
            assert!(!cg.exists(), "{}", cg.display());
            let its = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
            assert!(!its.contains("runlease-"), "{its}");
        } else {
            eprintln!("no cgroup v2 subtree here: only the group/session path is checked");
        }
        // Handed over: released, its record gone, the command untouched.
        let s = read_status(&path);
        assert_eq!(s.status, RunState::Done);
        assert_eq!(std::fs::read_dir(path.join("commands")).unwrap().count(), 0);
        assert!(alive(pid), "a detached command was stopped");
        // The next owner claims and does not reap it; past the old generation's self-fence
        // deadline nothing kills it either (the watchdog no longer tracks it).
        let next = Run::open(&path, fast()).await.unwrap();
        assert!(next.generation().get() > g);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(
            alive(pid),
            "the next open or the old watchdog killed a detached command: {:?} {:?}",
            lease_run::procs::state_of(pid),
            cmd.wait().await
        );
        next.release(FinalStatus::Done).await.unwrap();
        procs_kill(pid);
        let _ = cmd.wait().await;
    });
}

fn procs_kill(pid: u32) {
    lease_run::procs::kill_group(pid, Signal::KILL);
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
        assert_eq!(e.exit_code(), 76, "{e}");
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
        let e = Run::open(&path, opts.clone()).await.unwrap_err();
        assert_eq!(
            (e.code().as_str(), e.exit_code()),
            ("STORE_BEHIND_SEAL", 65),
            "{e}"
        );
        assert!(e.to_string().contains("floor"), "{e}");
        let head = RunDir::open(&path)
            .unwrap()
            .status(now_ts(), false)
            .unwrap()
            .head
            .unwrap()
            .generation()
            .get();
        // retired (g+1) → claimed (g+2) → released by the undo (g+3): every one keeps 6.
        for g in head - 2..=head {
            assert_eq!(epoch(&path, g).store_floor, Some(last), "epoch {g}");
        }
        assert_eq!(
            epoch(&path, head - 2).state,
            lease_core::EpochState::Retired
        );
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
        let e = Run::open(&path, fast()).await.unwrap_err();
        assert_eq!(
            (e.code().as_str(), e.exit_code()),
            ("STORE_MISSING", 65),
            "{e}"
        );
        assert!(!store.exists(), "an expected store is never recreated");
        let st = read_status(&path);
        assert_eq!(st.status, RunState::Failed);
        assert!(st.detail.unwrap().starts_with("STORE_MISSING"));
        // The failed open re-issued the seal: still refused, still not recreated.
        let e = Run::open(&path, fast()).await.unwrap_err();
        assert_eq!(e.code().as_str(), "STORE_MISSING");
        assert!(!store.exists());
    });
}
