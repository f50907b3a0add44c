//! `Run::release_on_signals` (issue #18): a signal to the owner is sent on to its commands;
//! the work gets `term_grace` to finish (its status is released), else the run is released
//! `failed`; work that finishes first releases with its own status. A test binary of its own: it signals its own process.

mod support;

use lease_core::{RunState, RunStatus};
use lease_run::{FinalStatus, Run, Served};
use rustix::process::{Signal, getpid, kill_process};
use std::time::Duration;
use support::{fast, rt};
use tokio::signal::unix::SignalKind;

fn run_json(path: &std::path::Path) -> RunStatus {
    lease_core::decode(&std::fs::read(path.join("run.json")).unwrap()).unwrap()
}

#[test]
fn a_signal_is_sent_on_to_the_commands_and_releases_the_run_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("signalled");
    let marker = tmp.path().join("command-got-term");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let script = format!(
            "trap 'echo term > {}; exit 0' TERM; sleep 30 & wait",
            marker.display()
        );
        let served = run
            .release_on_signals(
                &[SignalKind::terminate(), SignalKind::interrupt()],
                async |run| {
                    let mut cmd = run
                        .command("sh")
                        .args(["-c", &script])
                        .spawn()
                        .await
                        .unwrap();
                    // The owner is signalled once the command runs.
                    tokio::spawn(async {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        kill_process(getpid(), Signal::TERM).unwrap();
                    });
                    // The command traps TERM and exits 0: the work says so.
                    match cmd.wait().await {
                        Ok(st) if st.success() => Ok(FinalStatus::Failed {
                            detail: "the command stopped on TERM".into(),
                        }),
                        other => panic!("{other:?}"),
                    }
                },
            )
            .await
            .unwrap();
        assert_eq!(served, Served::Signalled(15));
    });
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "term\n",
        "the command got the owner's SIGTERM"
    );
    let rs = run_json(&path);
    assert_eq!(rs.status, RunState::Failed, "{rs:?}");
    // The work finished within the grace: its own status.
    assert_eq!(rs.detail.as_deref(), Some("the command stopped on TERM"));
    // Released: the run opens again at once.
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        run.release(FinalStatus::Done).await.unwrap();
    });
}

/// A command that ignores the signal: past `term_grace` the work is dropped, the release
/// kills the command and writes `failed`.
#[test]
fn a_command_that_ignores_the_signal_is_killed_and_the_run_released_failed() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("stubborn");
    let pid = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let p = pid.clone();
        let served = run
            .release_on_signals(&[SignalKind::user_defined2()], async |run| {
                let mut cmd = run
                    .command("sh")
                    .args(["-c", "trap '' USR2; sleep 30"])
                    .spawn()
                    .await
                    .unwrap();
                p.store(cmd.pid(), std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    kill_process(getpid(), Signal::USR2).unwrap();
                });
                let _ = cmd.wait().await;
                Ok(FinalStatus::Done)
            })
            .await
            .unwrap();
        assert_eq!(
            served,
            Served::Signalled(rustix::process::Signal::USR2.as_raw())
        );
    });
    let rs = run_json(&path);
    assert_eq!(rs.status, RunState::Failed, "{rs:?}");
    assert!(rs.detail.unwrap().starts_with("interrupted by signal"));
    let pid = pid.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .unwrap()
                .contains(") Z"),
        "the command was stopped by the release"
    );
}

#[test]
fn work_that_finishes_first_releases_with_its_own_status() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("finished");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let served = run
            .release_on_signals(&[SignalKind::interrupt()], async |run| {
                let out = run.command("true").output().await.unwrap();
                assert!(out.status.success());
                Ok(FinalStatus::Paused { wake_at: None })
            })
            .await
            .unwrap();
        assert_eq!(served, Served::Finished);
    });
    assert_eq!(run_json(&path).status, RunState::Paused);
}

/// Work that fails with `?` (issue #34: the closure returns a `Result`): the run is
/// released `failed` with the error's code and message, and the error is returned.
#[test]
fn work_that_fails_releases_failed_and_returns_its_error() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("fails");
    let err = rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        run.release_on_signals(&[SignalKind::interrupt()], async |run| {
            // `?` on the library's calls; the program cannot be run, so the shell's
            // status is 127 and the work reports it as an error of its own.
            let st = run
                .command("/nonexistent/runlease-test-program")
                .spawn()
                .await?
                .wait()
                .await?;
            assert!(!st.success());
            Err(lease_run::RunError::Io(format!(
                "/nonexistent/runlease-test-program: {st}"
            )))
        })
        .await
        .unwrap_err()
    });
    let rs = run_json(&path);
    assert_eq!(rs.status, RunState::Failed, "{rs:?}");
    let detail = rs.detail.unwrap();
    assert!(
        detail.starts_with(err.code().as_str()) && detail.contains("runlease-test-program"),
        "{detail} / {err}"
    );
    // Released: the run opens again at once.
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        run.release(FinalStatus::Done).await.unwrap();
    });
}
