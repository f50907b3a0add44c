//! The cancellation suite (issue #18): `Run::open` and `Run::release` are dropped at every
//! point a caller can drop them, and a `Run` is dropped unreleased; afterwards the run must
//! be recoverable by its own process without an operator:
//!
//! - no heartbeat goes on (the beat files do not change over three heartbeat intervals
//!   once [`Run::settle`] returned): `leaked_heartbeats`;
//! - no thread of the run (watchdog, background release) is left;
//! - the lease is free, `run.json` is not `running`, and a plain `Run::open` of the same
//!   path in the same process succeeds (and releases): else `unrecoverable`.
//!
//! The points: (a) the open future polled 1, 2, 3, … times and then dropped, until it
//! finishes within the budget; (b) the open dropped right after each of its ten steps (the
//! step hook signals, and holds the open's task for a moment, so the drop lands before the
//! next step); (c) and (d) the same for the release and its eight steps; (e) a `Run`
//! dropped with a command running. Run with `--nocapture` to see the figure line
//! `cancellation: points=N leaked_heartbeats=0 unrecoverable=0`; the test fails unless
//! both counts are 0.

#[path = "../../lease-cli/tests/common/figure.rs"]
mod figure;
mod support;

use lease_core::ops::Status;
use lease_core::{LeaseOps, RunState, RunStatus};
use lease_fs::RunDir;
use lease_run::{FinalStatus, OpenOptions, Run, StepName};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use support::{fast, now_ts, rt};

/// Poll `inner` at most `budget` times (each poll after the first is one of its await
/// points resumed by a wake-up); then drop it (`None`).
struct Budget<F> {
    inner: Option<Pin<Box<F>>>,
    left: usize,
}

impl<F: Future> Future for Budget<F> {
    type Output = Option<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.left == 0 {
            self.inner = None;
            return Poll::Ready(None);
        }
        self.left -= 1;
        let Some(f) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match f.as_mut().poll(cx) {
            Poll::Ready(v) => Poll::Ready(Some(v)),
            // Each further poll comes from a wake-up of `inner`: one await point resumed.
            Poll::Pending => Poll::Pending,
        }
    }
}

fn budget<F: Future>(f: F, n: usize) -> Budget<F> {
    Budget {
        inner: Some(Box::pin(f)),
        left: n,
    }
}

/// The figures of the suite.
#[derive(Default, Debug)]
struct Tally {
    points: usize,
    leaked_heartbeats: usize,
    unrecoverable: Vec<String>,
}

/// The beat files' names and contents.
fn beats(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(path.join("lease/beats"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        std::fs::read(e.path()).unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// This process's threads named by lease-run (the watchdog, a background release); the
/// kernel keeps 15 bytes of a thread's name.
fn run_threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| c.starts_with("lease-run-"))
        .collect()
}

/// This process's children that are stopped (state `T`): a spawn gate left waiting.
fn stopped_children() -> Vec<u32> {
    let me = std::process::id();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the command name's closing parenthesis: state, ppid.
        let Some(tail) = stat.rsplit_once(')').map(|(_, t)| t.trim().to_string()) else {
            continue;
        };
        let mut f = tail.split_whitespace();
        let (state, ppid) = (f.next(), f.next().and_then(|p| p.parse::<u32>().ok()));
        if ppid == Some(me) && state == Some("T") {
            out.push(pid);
        }
    }
    out
}

fn run_json(path: &Path) -> Option<RunStatus> {
    std::fs::read(path.join("run.json"))
        .ok()
        .map(|b| lease_core::decode(&b).unwrap())
}

/// After a cancellation at `point`: settle, then check the run as its own process sees it.
async fn check(path: &Path, point: &str, tally: &mut Tally) {
    tally.points += 1;
    tokio::time::timeout(Duration::from_secs(20), Run::settle(path))
        .await
        .unwrap_or_else(|_| panic!("{point}: the background hand-back never ended"));
    let before = beats(path);
    tokio::time::sleep(Duration::from_millis(350)).await;
    if beats(path) != before {
        tally.leaked_heartbeats += 1;
        eprintln!("{point}: a heartbeat goes on after the cancellation");
    }
    // No thread of the run outlives it either: its watchdog ends within a tick of the
    // release (or of the confirmed kill), a background release's thread when it is done.
    let threads = run_threads();
    if !threads.is_empty() {
        tally
            .unrecoverable
            .push(format!("{point}: threads of the run live on: {threads:?}"));
    }
    if path.join("lease").exists() {
        let view = RunDir::open(path).unwrap().status(now_ts(), false).unwrap();
        if view.status != Status::Free {
            tally
                .unrecoverable
                .push(format!("{point}: lease {:?}, not free", view.status));
        }
    }
    if let Some(rs) = run_json(path) {
        if rs.status == RunState::Running {
            tally
                .unrecoverable
                .push(format!("{point}: run.json still says running"));
        }
    }
    match Run::open(path, fast()).await {
        Ok(run) => {
            if let Err(e) = run.release(FinalStatus::Done).await {
                tally
                    .unrecoverable
                    .push(format!("{point}: the reopened run did not release: {e}"));
            }
        }
        Err(e) => tally
            .unrecoverable
            .push(format!("{point}: the same process cannot reopen: {e}")),
    }
}

/// Options whose step hook, after `step`, signals `hit` and holds the task 100 ms (so the
/// caller's drop lands before the next step).
fn hook_after(step: StepName, hit: Arc<tokio::sync::Notify>) -> OpenOptions {
    OpenOptions {
        on_step: Some(Arc::new(move |s, _| {
            if s == step {
                hit.notify_one();
                std::thread::sleep(Duration::from_millis(100));
            }
        })),
        ..fast()
    }
}

const OPEN_STEPS: [StepName; 9] = [
    StepName::OwnerLock,
    StepName::ReadStatus,
    StepName::Claim,
    StepName::RunJson,
    StepName::Heartbeat,
    StepName::Layout,
    StepName::Commands,
    StepName::Store,
    StepName::Seal,
];

const RELEASE_STEPS: [StepName; 8] = [
    StepName::StopCommands,
    StepName::Barrier,
    StepName::SealStore,
    StepName::FinalStatus,
    StepName::StopHeartbeat,
    StepName::ReleaseLease,
    StepName::Unlock,
    StepName::Compact,
];

fn fresh(root: &Path, name: &str) -> PathBuf {
    root.join(name)
}

#[test]
fn cancelled_opens_and_releases_and_dropped_runs_leave_a_recoverable_run() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = rt();
    let tally = Arc::new(Mutex::new(Tally::default()));
    rt.block_on(async {
        let mut t = Tally::default();

        // (a) The open polled n times, then dropped.
        let mut finished = false;
        for n in 1..200 {
            let path = fresh(tmp.path(), &format!("poll-open-{n}"));
            match budget(Run::open(&path, fast()), n).await {
                None => check(&path, &format!("open dropped after {n} polls"), &mut t).await,
                Some(r) => {
                    r.unwrap().release(FinalStatus::Done).await.unwrap();
                    finished = true;
                    break;
                }
            }
        }
        assert!(finished, "the open never finished within 200 polls");

        // (b) The open dropped right after each step.
        for step in OPEN_STEPS {
            let path = fresh(tmp.path(), &format!("step-open-{}", step.as_str()));
            // A used run (an earlier generation, a store with a commit), so every step
            // has something to do.
            let run = Run::open(&path, fast()).await.unwrap();
            run.commit(lease_run::Batch::new().put("k", "v")).await.unwrap();
            run.release(FinalStatus::Paused { wake_at: None }).await.unwrap();
            let hit = Arc::new(tokio::sync::Notify::new());
            let opts = hook_after(step, hit.clone());
            tokio::select! {
                r = Run::open(&path, opts) => {
                    panic!("{}: the open returned ({:?}) before its step hook fired", step.as_str(), r.map(|_| ()));
                }
                () = hit.notified() => {}
            }
            check(&path, &format!("open dropped after {}", step.as_str()), &mut t).await;
            // The store kept its commit through the undo.
            let run = Run::open(&path, fast()).await.unwrap();
            assert_eq!(run.store().head().unwrap(), 1, "{}", step.as_str());
            run.release(FinalStatus::Done).await.unwrap();
        }

        // (c) The release polled n times, then dropped.
        let mut finished = false;
        for n in 1..200 {
            let path = fresh(tmp.path(), &format!("poll-release-{n}"));
            let run = Run::open(&path, fast()).await.unwrap();
            match budget(run.release(FinalStatus::Done), n).await {
                None => {
                    check(&path, &format!("release dropped after {n} polls"), &mut t).await;
                    assert_ne!(run_json(&path).unwrap().status, RunState::Failed);
                }
                Some(r) => {
                    r.unwrap();
                    finished = true;
                    break;
                }
            }
        }
        assert!(finished, "the release never finished within 200 polls");

        // (d) The release dropped right after each step: it finishes all the same, with
        // the status it was asked for.
        for step in RELEASE_STEPS {
            let path = fresh(tmp.path(), &format!("step-release-{}", step.as_str()));
            let hit = Arc::new(tokio::sync::Notify::new());
            let run = Run::open(&path, hook_after(step, hit.clone())).await.unwrap();
            tokio::select! {
                r = run.release(FinalStatus::Paused { wake_at: None }) => {
                    panic!("{}: the release returned ({r:?}) before its step hook fired", step.as_str());
                }
                () = hit.notified() => {}
            }
            Run::settle(&path).await;
            let rs = run_json(&path).unwrap();
            assert_eq!(rs.status, RunState::Paused, "{}: {rs:?}", step.as_str());
            check(&path, &format!("release dropped after {}", step.as_str()), &mut t).await;
        }

        // (e) A run dropped unreleased, with a command running: stopped, released failed.
        let path = fresh(tmp.path(), "dropped");
        let run = Run::open(&path, fast()).await.unwrap();
        let mut cmd = run.spawn(&["sleep".into(), "30".into()], &[]).await.unwrap();
        drop(run);
        let exited = tokio::time::timeout(Duration::from_secs(10), cmd.wait())
            .await
            .expect("the dropped run's command was stopped")
            .unwrap();
        assert!(!exited.success());
        Run::settle(&path).await;
        let rs = run_json(&path).unwrap();
        assert_eq!(rs.status, RunState::Failed, "{rs:?}");
        assert!(
            rs.detail.as_deref().unwrap_or("").contains("dropped"),
            "{rs:?}"
        );
        check(&path, "run dropped unreleased", &mut t).await;

        // (f) A spawn polled n times, then dropped: no stopped gate is left behind (its
        // program never ran), and the run releases as usual.
        let path = fresh(tmp.path(), "spawn");
        let run = Run::open(&path, fast()).await.unwrap();
        let marker = tmp.path().join("spawned-program-ran");
        let argv = vec![
            "touch".to_string(),
            marker.display().to_string(),
        ];
        let mut finished = false;
        for n in 1..200 {
            match budget(run.spawn(&argv, &[]), n).await {
                None => {
                    t.points += 1;
                    // A killed gate leaves at most a zombie until tokio reaps it.
                    let deadline = std::time::Instant::now() + Duration::from_secs(5);
                    while !stopped_children().is_empty() {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "spawn dropped after {n} polls left a stopped gate: {:?}",
                            stopped_children()
                        );
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    if marker.exists() {
                        // Dropped after the gate was continued: the program ran; fine, but
                        // then the spawn had all but finished.
                        std::fs::remove_file(&marker).unwrap();
                    }
                }
                Some(r) => {
                    assert!(r.unwrap().wait().await.unwrap().success());
                    finished = true;
                    break;
                }
            }
        }
        assert!(finished, "the spawn never finished within 200 polls");
        run.release(FinalStatus::Done).await.unwrap();
        check(&path, "after dropped spawns", &mut t).await;

        *tally.lock().unwrap() = t;
    });
    let t = tally.lock().unwrap();
    figure::figure(&format!(
        "cancellation: points={} leaked_heartbeats={} unrecoverable={}",
        t.points,
        t.leaked_heartbeats,
        t.unrecoverable.len()
    ));
    for u in &t.unrecoverable {
        eprintln!("unrecoverable: {u}");
    }
    assert_eq!(t.leaked_heartbeats, 0);
    assert!(t.unrecoverable.is_empty(), "{:#?}", t.unrecoverable);
    assert!(t.points >= OPEN_STEPS.len() + RELEASE_STEPS.len() + 3);
}

/// A `Run` that outlives the runtime it was opened on (the runtime shut down first, then the
/// handle dropped) is still released: the background release brings its own runtime.
#[test]
fn a_run_dropped_after_its_runtime_shut_down_is_released() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("orphaned");
    let first = rt();
    let run = first.block_on(Run::open(&path, fast())).unwrap();
    drop(first);
    drop(run);
    let second = rt();
    second.block_on(async {
        tokio::time::timeout(Duration::from_secs(20), Run::settle(&path))
            .await
            .expect("the background release ended");
        let rs = run_json(&path).unwrap();
        assert_eq!(rs.status, RunState::Failed, "{rs:?}");
        let view = RunDir::open(&path)
            .unwrap()
            .status(now_ts(), false)
            .unwrap();
        assert_eq!(view.status, Status::Free);
        Run::open(&path, fast())
            .await
            .unwrap()
            .release(FinalStatus::Done)
            .await
            .unwrap();
    });
}
