//! Issue #33: with the run's cgroup, the owner's scans read only the processes allocated
//! since its first command (`procs::Tracked::snapshot`). What the kill reaches outside the
//! cgroup must not change: a descendant that moved itself out of the cgroup, and a process
//! of this uid outside both the cgroup and the commands' tree that carries the
//! incarnation's secret, are still found and killed at release (PROTOCOL §11.1).
//!
//! Both need a cgroup v2 subtree (root, or `systemd-run --user --scope -p Delegate=yes`):
//! without one every scan is full, as before, and the tests say SKIPPED.

use lease_run::{FinalStatus, Run};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod support;
use support::{fast_patient as fast, rt};

fn alive(pid: u32) -> bool {
    matches!(lease_run::procs::state_of(pid), Some(c) if c != 'Z' && c != 'X')
}

/// The first line of `file` once a command wrote it.
fn wait_for_line(file: &Path) -> String {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(t) = std::fs::read_to_string(file) {
            if t.ends_with('\n') {
                return t.trim().to_string();
            }
        }
        assert!(Instant::now() < end, "{} never written", file.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The run's cgroup, or `None` (SKIPPED) when none can be created here.
fn cgroup_of(run: &Run) -> Option<PathBuf> {
    let cg = run.cgroup();
    if cg.is_none() {
        eprintln!("SKIPPED: no cgroup v2 subtree can be created here; every scan is full");
    }
    cg
}

fn cgroup_line(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default()
}

/// A daemon (new session and group, its parent exited) that moves itself out of the run's
/// cgroup into the owner's: `cgroup.kill` no longer reaches it, the scans still must.
#[test]
fn a_daemon_that_left_the_runs_cgroup_is_still_killed_at_release() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-w1");
    let pidfile = dir.path().join("daemon.pid");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let Some(cg) = cgroup_of(&run) else {
            run.release(FinalStatus::Done).await.unwrap();
            return;
        };
        let parent = cg.parent().unwrap().join("cgroup.procs");
        let script = format!(
            "(setsid sh -c 'echo $$ > {up}; echo $$ > {p}.tmp && mv {p}.tmp {p}; exec sleep 30' &) ; exit 0",
            up = parent.display(),
            p = pidfile.display()
        );
        let argv: Vec<String> = ["sh", "-c", &script].iter().map(|s| s.to_string()).collect();
        let mut cmd = run.spawn(&argv, &[]).await.unwrap();
        assert!(cmd.wait().await.unwrap().success());
        let daemon: u32 = wait_for_line(&pidfile).parse().unwrap();
        let name = cg.file_name().unwrap().to_str().unwrap().to_string();
        let its = cgroup_line(daemon);
        if its.contains(&name) {
            // The owner's cgroup takes no processes here (controllers enabled in it).
            eprintln!("SKIPPED: the daemon could not leave the run's cgroup: {its}");
        }
        assert!(alive(daemon));
        run.release(FinalStatus::Done).await.unwrap();
        assert!(!alive(daemon), "the daemon that left the cgroup died with the run");
    });
}

/// A process this test (the owner process) starts itself, in its own process group, after
/// the run's first command, carrying the incarnation's secret: not in the cgroup, not in a
/// command's group or tree, not adoptable (the owner's group). Only the sweep counts it.
#[test]
fn a_process_outside_the_cgroup_carrying_the_secret_is_killed_at_release() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-w2");
    let secret_file = dir.path().join("secret");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let Some(cg) = cgroup_of(&run) else {
            run.release(FinalStatus::Done).await.unwrap();
            return;
        };
        let script = format!(
            "echo \"$RUNLEASE_INCARNATION\" > {f}.tmp && mv {f}.tmp {f}; exec sleep 30",
            f = secret_file.display()
        );
        let argv: Vec<String> = ["sh", "-c", &script]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let _cmd = run.spawn(&argv, &[]).await.unwrap();
        let secret = wait_for_line(&secret_file);
        assert!(!secret.is_empty());
        let mut outsider = std::process::Command::new("sleep")
            .arg("30")
            .env("RUNLEASE_INCARNATION", &secret)
            .spawn()
            .unwrap();
        let pid = outsider.id();
        let name = cg.file_name().unwrap().to_str().unwrap().to_string();
        assert!(!cgroup_line(pid).contains(&name), "not in the run's cgroup");
        run.release(FinalStatus::Done).await.unwrap();
        assert!(!alive(pid), "the secret's carrier died with the run");
        // Reaped here, or already by the owner's watchdog (an adopted zombie).
        let _ = outsider.wait();
    });
}

/// The same outsider without the secret is not the run's: left alone.
#[test]
fn a_process_outside_the_cgroup_without_proof_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-w3");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        if cgroup_of(&run).is_none() {
            run.release(FinalStatus::Done).await.unwrap();
            return;
        }
        let argv: Vec<String> = ["sh", "-c", "exec sleep 30"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let _cmd = run.spawn(&argv, &[]).await.unwrap();
        let mut outsider = std::process::Command::new("sleep")
            .arg("30")
            .env_remove("RUNLEASE_INCARNATION")
            .spawn()
            .unwrap();
        run.release(FinalStatus::Done).await.unwrap();
        assert!(
            alive(outsider.id()),
            "not proved the run's: never signalled"
        );
        outsider.kill().unwrap();
        outsider.wait().unwrap();
    });
}
