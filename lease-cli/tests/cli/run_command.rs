//! The command `run` starts: its output and exit code, the signals forwarded to it.

use crate::common::*;
use rustix::process::Signal;
use std::time::{Duration, Instant};

#[test]
fn readme_main_job_prints_and_leaves_the_run_free() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let o = runlease(&[
        "run",
        d,
        "--",
        "sh",
        "-c",
        r#"echo "I own $RUNLEASE_RUN at generation $RUNLEASE_GENERATION""#,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let abs = std::fs::canonicalize(&dir).unwrap();
    assert_eq!(
        text(&o.stdout),
        format!("I own {} at generation 1\n", abs.display())
    );
    let s = status_json(&dir);
    assert_eq!(s["state"], "free", "{s}");
    assert_eq!(s["epoch_state"], "released");
    assert_eq!(s["schema"], "runlease/cli/status/1");
    let human = runlease(&["status", d]);
    assert!(
        text(&human.stdout).contains(": free"),
        "{}",
        text(&human.stdout)
    );
}

#[test]
fn run_propagates_the_exit_code_and_signals() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    assert_eq!(
        runlease(&["run", d, "--", "sh", "-c", "exit 7"])
            .status
            .code(),
        Some(7)
    );
    // Killed by a signal: 128 + N.
    assert_eq!(
        runlease(&["run", d, "--", "sh", "-c", "kill -TERM $$"])
            .status
            .code(),
        Some(128 + 15)
    );
    // A command that does not exist: 127, and the run is free again.
    let o = runlease(&["run", d, "--", "/nonexistent/command"]);
    assert_eq!(o.status.code(), Some(127), "{}", text(&o.stderr));
    assert_eq!(status_json(&dir)["state"], "free");
}

#[test]
fn run_forwards_sigint_and_sigterm_to_the_command() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    for (sig, code) in [(Signal::INT, 9), (Signal::TERM, 10)] {
        let ready = tmp.path().join(format!("ready-{code}"));
        let script = format!(
            "trap 'exit 9' INT; trap 'exit 10' TERM; touch '{}'; while :; do sleep 0.05; done",
            ready.display()
        );
        let mut owner = spawn(&["run", d, "--", "sh", "-c", &script]);
        wait_for_file(&ready, Duration::from_secs(10), "command never started");
        signal(owner.id(), sig);
        // The command's trap decides the exit code; runlease exits with it and releases.
        assert_eq!(
            wait_exit(&mut owner, Duration::from_secs(10)).code(),
            Some(code)
        );
        assert_eq!(status_json(&dir)["state"], "free");
    }
}

/// Forwarding goes through lease-run's command signaller: it reaches every process the
/// run tracks, including a descendant that left the command's process group (`setsid`),
/// which a signal to the group alone would miss.
#[test]
fn run_forwards_a_signal_to_a_descendant_outside_the_commands_group() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let (ready, inner_ready, got) = (
        tmp.path().join("ready"),
        tmp.path().join("inner-ready"),
        tmp.path().join("inner-got-hup"),
    );
    // SIGHUP: an asynchronous list of a non-interactive shell ignores SIGINT (POSIX), and
    // the release itself sends SIGTERM, so neither would tell forwarding apart.
    let inner = format!(
        "trap 'touch {}; exit 0' HUP; touch {}; while :; do sleep 0.05; done",
        got.display(),
        inner_ready.display()
    );
    // The outer command exits 9 only once the descendant has recorded the signal (8 if it
    // has not within 5 s): exiting at once would let the release's SIGTERM reach the
    // descendant before its own trap ran (the shell runs traps between commands).
    let script = format!(
        "setsid sh -c \"{inner}\" & trap 'i=0; while [ ! -e {got} ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; [ -e {got} ] && exit 9; exit 8' HUP; touch '{ready}'; while :; do sleep 0.05; done",
        got = got.display(),
        ready = ready.display()
    );
    let mut owner = spawn(&["run", d, "--", "sh", "-c", &script]);
    wait_for_file(&ready, Duration::from_secs(10), "command never started");
    wait_for_file(&inner_ready, Duration::from_secs(10), "inner never started");
    // Let the watchdog's /proc scan (every 100 ms) learn the descendant.
    std::thread::sleep(Duration::from_millis(400));
    signal(owner.id(), Signal::HUP);
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(10)).code(),
        Some(9)
    );
    assert!(
        got.exists(),
        "the descendant outside the group did not get SIGHUP"
    );
    assert_eq!(status_json(&dir)["state"], "free");
}

/// A signal that arrives while `run` opens the run (here: while it reaps the command of a
/// run killed with its guard, which ignores SIGTERM, so the reap takes the 2 s grace)
/// starts nothing: the run is
/// released with `run.json` failed and runlease exits 128+N.
#[test]
fn sigint_while_opening_releases_the_run_and_starts_nothing() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let pidfile = tmp.path().join("child.pid");
    let marker = tmp.path().join("ran");
    let script = format!(
        "trap '' TERM; echo $$ > '{}'; while :; do sleep 0.05; done",
        pidfile.display()
    );
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat());
    let child = read_pid(&pidfile);
    crash_with_guard(&mut owner);
    wait_for_state(&dir, "dead", Duration::from_secs(10));

    let touch = format!("touch '{}'", marker.display());
    let mut next = spawn(
        &[
            &["run", d, "--retire-dead"][..],
            &FAST,
            &["--", "sh", "-c", &touch],
        ]
        .concat(),
    );
    // Claimed (generation 3: retired as 2, claimed as 3), now reaping the old command.
    let t = Instant::now();
    loop {
        let s = status_json(&dir);
        if s["state"] == "active" && s["generation"] == 3 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "never claimed: {s}");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(next.id(), Signal::INT);
    let code = wait_exit(&mut next, Duration::from_secs(15)).code();
    let o = next.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(code, Some(128 + 2), "{err}");
    assert!(err.contains("runlease: INTERRUPTED: "), "{err}");
    assert!(err.contains("the run was released"), "{err}");
    assert!(!marker.exists(), "the command ran");
    assert!(!alive(child), "the old command survived the reaping");
    let s = status_json(&dir);
    assert_eq!(s["state"], "free", "{s}");
    assert_eq!(s["run_status"]["status"], "failed", "{s}");
    assert_eq!(
        s["run_status"]["detail"],
        "interrupted by signal 2 before the command started"
    );
}
