//! Issue #29, "small rules": a command that ignores SIGINT/SIGTERM can still be stopped
//! without `kill -9` of runlease (a second signal, or `--kill-after`), the run is then
//! released cleanly; and SIGUSR1, which any process of this user can send, releases
//! nothing.

mod common;

use common::*;
use rustix::process::Signal;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A command that ignores SIGINT and SIGTERM, with a `setsid` grandchild that ignores them
/// too; `ready` is touched once both run, `pidfile` holds the grandchild's pid.
fn stubborn(ready: &Path, pidfile: &Path) -> String {
    format!(
        "trap '' INT TERM; setsid sh -c 'trap \"\" INT TERM; echo $$ > {pid}; while :; do sleep 0.05; done' & \
         while [ ! -s {pid} ]; do sleep 0.01; done; touch {ready}; while :; do sleep 0.05; done",
        pid = pidfile.display(),
        ready = ready.display()
    )
}

fn run_json(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap()
}

#[test]
fn a_second_stop_signal_kills_the_commands_tree_and_the_run_is_released() {
    for (first, second) in [(Signal::TERM, Signal::TERM), (Signal::INT, Signal::TERM)] {
        let (tmp, dir) = scratch();
        let d = dir.to_str().unwrap();
        let (ready, pidfile) = (tmp.path().join("ready"), tmp.path().join("grandchild"));
        let mut owner = spawn(&["run", d, "--", "sh", "-c", &stubborn(&ready, &pidfile)]);
        wait_for_file(&ready, Duration::from_secs(10), "command never started");
        let grandchild = read_pid(&pidfile);
        // Let the watchdog's scan learn the grandchild (it left the command's group).
        std::thread::sleep(Duration::from_millis(300));
        signal(owner.id(), first);
        // The command ignores it: runlease keeps waiting for it.
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            owner.try_wait().unwrap().is_none(),
            "runlease exited on the first signal although the command ignores it"
        );
        signal(owner.id(), second);
        let st = wait_exit(&mut owner, Duration::from_secs(10));
        assert_eq!(st.code(), Some(137), "128 + SIGKILL");
        wait_gone(
            grandchild,
            Duration::from_secs(5),
            "the setsid grandchild outlived the escalation",
        );
        assert_eq!(status_json(&dir)["state"], "free");
        assert_eq!(run_json(&dir)["status"], "failed");
    }
}

#[test]
fn kill_after_escalates_once_the_duration_passes() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let (ready, pidfile) = (tmp.path().join("ready"), tmp.path().join("grandchild"));
    let mut owner = spawn(&[
        "run",
        d,
        "--kill-after",
        "700ms",
        "--",
        "sh",
        "-c",
        &stubborn(&ready, &pidfile),
    ]);
    wait_for_file(&ready, Duration::from_secs(10), "command never started");
    let grandchild = read_pid(&pidfile);
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    signal(owner.id(), Signal::INT);
    let st = wait_exit(&mut owner, Duration::from_secs(10));
    assert_eq!(st.code(), Some(137));
    assert!(
        t.elapsed() >= Duration::from_millis(600),
        "killed before --kill-after passed: {:?}",
        t.elapsed()
    );
    wait_gone(
        grandchild,
        Duration::from_secs(5),
        "the grandchild survived",
    );
    assert_eq!(status_json(&dir)["state"], "free");
}

#[test]
fn kill_after_does_not_fire_when_the_command_stops_in_time() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let ready = tmp.path().join("ready");
    let script = format!(
        "trap 'sleep 0.2; exit 7' TERM; touch {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let mut owner = spawn(&["run", d, "--kill-after", "5s", "--", "sh", "-c", &script]);
    wait_for_file(&ready, Duration::from_secs(10), "command never started");
    signal(owner.id(), Signal::TERM);
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(10)).code(),
        Some(7)
    );
    assert_eq!(status_json(&dir)["state"], "free");
}

#[test]
fn sigusr1_releases_nothing_and_does_not_end_the_owner() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let (ready, go) = (tmp.path().join("ready"), tmp.path().join("go"));
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done; exit 3",
        ready.display(),
        go.display()
    );
    let mut owner = spawn(&["run", d, "--", "sh", "-c", &script]);
    wait_for_file(&ready, Duration::from_secs(10), "command never started");
    let before = status_json(&dir);
    assert_eq!(before["state"], "active");
    signal(owner.id(), Signal::USR1);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        owner.try_wait().unwrap().is_none(),
        "SIGUSR1 ended the owner"
    );
    let after = status_json(&dir);
    assert_eq!(after["state"], "active", "SIGUSR1 released the run");
    assert_eq!(after["generation"], before["generation"]);
    std::fs::write(&go, b"").unwrap();
    let o = owner.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(3));
    assert!(
        text(&o.stderr).contains("SIGUSR1 ignored"),
        "{}",
        text(&o.stderr)
    );
}

/// `runlease release` in a command whose environment lost the store socket: its owner is
/// an ancestor, so a direct release would fence it and kill this very command. Refused
/// (76), nothing written, and the owner goes on.
#[test]
fn release_without_the_socket_under_its_own_owner_writes_nothing() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let (out, st) = (
        tmp.path().join("release-exit"),
        tmp.path().join("status.json"),
    );
    let script = format!(
        "env -u RUNLEASE_STORE_SOCKET {bin} release; echo $? > {out}; {bin} --json status \"$RUNLEASE_RUN\" > {st}",
        bin = BIN,
        out = out.display(),
        st = st.display()
    );
    let o = Command::new(BIN)
        .args(["run", d, "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "76");
    assert!(
        text(&o.stderr).contains("RELEASE_NOT_DELIVERED")
            && text(&o.stderr).contains("nothing was written"),
        "{}",
        text(&o.stderr)
    );
    // After the refusal the owner still held the run at its own generation.
    let seen: serde_json::Value = serde_json::from_slice(&std::fs::read(&st).unwrap()).unwrap();
    assert_eq!(seen["state"], "active", "{seen}");
    assert_eq!(seen["generation"], 1, "{seen}");
    assert_eq!(run_json(&dir)["status"], "done");
}
