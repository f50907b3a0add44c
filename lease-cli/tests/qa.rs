//! Bugs found by trying `runlease` as a demanding new user would (one test per bug, each
//! written before its fix): hand-placed symlinks for files inside the run, a closed stderr,
//! a `runlease run` nested in a command of the same run.

mod common;

use common::*;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A run with one released generation (epochs 1 and 2) and one event.
fn used_run(dir: &std::path::Path) {
    let o = runlease(&[
        "run",
        dir.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        r#"runlease append "$RUNLEASE_RUN" --type step >/dev/null"#,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

/// A record file replaced by a symlink is bad input on disk like a symlinked folder: 65
/// `RUN_LAYOUT_INVALID` naming the file, not 74 `IO_ERROR` (which says "retry"), and
/// nothing changes.
#[test]
fn a_record_file_replaced_by_a_symlink_is_a_layout_error_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    used_run(&run);
    let d = run.to_str().unwrap();
    let head = epoch_file(&run, 2);
    let moved = tmp.path().join("moved-epoch");
    std::fs::rename(&head, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &head).unwrap();
    let before = tree(tmp.path());
    // status reports it as a state (issue #28): invalid, with the same code and file, and
    // doctor as the next step.
    let st = status_json(&run);
    assert_eq!(st["state"], "invalid", "{st}");
    assert_eq!(st["error"]["code"], "RUN_LAYOUT_INVALID", "{st}");
    let msg = st["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("lease/epochs/00000000000000000002.json") && msg.contains("symlink"),
        "{st}"
    );
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(65));
    assert!(
        json_lines(&o).iter().any(|f| f["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("RUN_LAYOUT_INVALID")),
        "{}",
        text(&o.stdout)
    );
    for args in [
        vec!["verify", d],
        vec!["events", d],
        vec!["retire", d],
        vec!["run", d, "--retire-dead", "--takeover-stale", "--", "true"],
    ] {
        let o = runlease(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{args:?}: {err}");
        assert!(
            err.starts_with("runlease: RUN_LAYOUT_INVALID: ")
                && err.contains("lease/epochs/00000000000000000002.json")
                && err.contains("symlink"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(tree(tmp.path()), before, "something changed on disk");

    // The same for run.json and the owner lock (read by `run` before it claims).
    std::fs::rename(&moved, &head).unwrap();
    for name in ["run.json", "owner.lock"] {
        let file = run.join(name);
        let moved = tmp.path().join(format!("moved-{name}"));
        std::fs::rename(&file, &moved).unwrap();
        std::os::unix::fs::symlink(&moved, &file).unwrap();
        let before = tree(tmp.path());
        let o = runlease(&["run", d, "--", "true"]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{name}: {err}");
        assert!(
            err.starts_with("runlease: RUN_LAYOUT_INVALID: ")
                && err.contains(name)
                && err.contains("symlink"),
            "{name}: {err}"
        );
        assert_eq!(
            tree(tmp.path()),
            before,
            "{name}: something changed on disk"
        );
        std::fs::remove_file(&file).unwrap();
        std::fs::rename(&moved, &file).unwrap();
    }
}

/// `runlease` must not panic (exit 101) when its stderr is a closed pipe (a log reader that
/// went away): that left the run claimed by a dead process. It still runs the command,
/// releases the run and exits with the command's code.
#[test]
fn a_closed_stderr_does_not_crash_run_or_leave_the_run_claimed() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let (r, w) = std::io::pipe().unwrap();
    drop(r); // every write to stderr now fails with EPIPE
    let mut child = cmd(&["run", d, "--", "sh", "-c", "exit 3"])
        .stdout(Stdio::null())
        .stderr(Stdio::from(w))
        .spawn()
        .unwrap();
    let st = wait_exit(&mut child, Duration::from_secs(20));
    assert_eq!(
        st.code(),
        Some(3),
        "runlease did not exit with the command's code"
    );
    let s = status_json(&dir);
    assert_eq!(s["state"], "free", "{s}");
    assert_eq!(s["run_status"]["status"], "failed", "{s}");
}

/// `runlease run A -- runlease run A --wait -- ...` waited for itself forever: the inner
/// one must be refused at once (76) with a message that says it runs under that owner.
#[test]
fn run_nested_in_a_command_of_the_same_run_is_refused_at_once_even_with_wait() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let t = Instant::now();
    let mut child = cmd(&[
        "run",
        d,
        "--",
        "sh",
        "-c",
        r#"runlease run "$RUNLEASE_RUN" --wait -- true; echo "inner=$?""#,
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(50));
    }
    if child.try_wait().unwrap().is_none() {
        // SIGTERM is forwarded, so the waiting inner runlease ends too.
        signal(child.id(), rustix::process::Signal::TERM);
        let _ = child.wait();
        panic!("the nested run waited for its own parent");
    }
    let o = child.wait_with_output().unwrap();
    let out = text(&o.stdout);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.contains("inner=76"), "{out} {err}");
    assert!(
        err.contains("RUN_ALREADY_ACTIVE") && err.contains("RUNLEASE_OWNER"),
        "{err}"
    );
    // No next step that would hang or fail.
    assert!(!err.contains("(--wait)"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10));
    assert_eq!(status_json(&dir)["state"], "free");
}

/// With `--json`, a usage error found by the argument parser (unknown subcommand, missing
/// argument, bad flag) also prints the `runlease/cli/error/1` object on stdout, like every
/// other failure (docs/cli-json.md): it printed nothing there.
#[test]
fn usage_errors_with_json_print_one_error_object() {
    for args in [
        vec!["--json", "bogus"],
        vec!["status", "--json"],
        vec!["run", "--json", "--heartbeat", "x", "r", "--", "true"],
        vec!["events", "r", "--json", "--bogus"],
    ] {
        let o = runlease(&args);
        assert_eq!(o.status.code(), Some(64), "{args:?}");
        let out = text(&o.stdout);
        assert_eq!(out.lines().count(), 1, "{args:?}: {out}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["schema"], "runlease/cli/error/1", "{args:?}: {v}");
        assert_eq!(v["ok"], false);
        assert_eq!(v["code"], "ARGUMENT_INVALID");
        assert_eq!(v["exit_code"], 64);
        let msg = v["message"].as_str().unwrap();
        assert!(!msg.is_empty() && !msg.contains('\n'), "{args:?}: {v}");
    }
    // `--json` given to the command under `run` (after `--`) is not runlease's.
    let o = runlease(&["run", "--", "--json"]);
    assert_eq!(o.status.code(), Some(64));
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
}

/// A run folder renamed by hand: its records name another run. The message names both
/// run ids as the user typed them, not as Rust debug output (`RunId("...")`).
#[test]
fn a_renamed_run_folder_names_both_run_ids_plainly() {
    let tmp = tempfile::tempdir().unwrap();
    let orig = tmp.path().join("orig");
    used_run(&orig);
    let moved = tmp.path().join("moved");
    std::fs::rename(&orig, &moved).unwrap();
    let o = runlease(&["verify", moved.to_str().unwrap()]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(65), "{err}");
    assert!(
        err.contains(r#"it belongs to run "orig", not "moved""#) && !err.contains("RunId("),
        "{err}"
    );
}

/// A dead owner in a run with a record broken below the head (an event, an older epoch):
/// `doctor` says "do not take over", and `retire`, `run --retire-dead` and `takeover`
/// must agree. They retired the owner and finalized its cutoff over the broken log
/// (the protocol's OBSERVE reads only the head). Nothing on disk changes.
#[test]
fn a_broken_record_below_the_head_refuses_retire_and_takeover() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    used_run(&run);
    let d = run.to_str().unwrap();
    // A dead owner (runlease killed) at generation 3; its command noted for cleanup.
    let guard = dead_owner_with_its_command(tmp.path(), &run);
    let child = guard.0;

    let event = run.join("events/00000000000000000001.json");
    let epoch = epoch_file(&run, 1);
    let good_event = std::fs::read(&event).unwrap();
    let good_epoch = std::fs::read(&epoch).unwrap();
    let torn = good_event[..10].to_vec();
    let mut edited = String::from_utf8(good_epoch.clone()).unwrap();
    edited = edited.replacen("\"claimed_at\":\"2", "\"claimed_at\":\"1", 1);
    for (file, bytes, name) in [
        (&event, torn, "events/00000000000000000001.json"),
        (&epoch, edited.into_bytes(), "00000000000000000001"),
    ] {
        std::fs::write(&event, &good_event).unwrap();
        std::fs::write(&epoch, &good_epoch).unwrap();
        std::fs::write(file, bytes).unwrap();
        let before = tree(tmp.path());
        for args in [
            vec!["retire", d],
            vec!["run", d, "--retire-dead", "--", "true"],
            vec!["takeover", d, "--yes"],
        ] {
            let o = runlease(&args);
            let err = text(&o.stderr);
            assert_eq!(o.status.code(), Some(65), "{args:?}: {err}");
            assert!(err.contains(name), "{args:?}: does not name {name}: {err}");
            assert_eq!(
                tree(tmp.path()),
                before,
                "{args:?}: something changed on disk"
            );
        }
        assert_eq!(status_json(&run)["state"], "dead");
        // doctor: the error, and DEAD_OWNER's next step says to repair it first.
        let f = json_lines(&runlease(&["doctor", "--json", d]));
        let dead = f
            .iter()
            .find(|f| f["code"] == "DEAD_OWNER")
            .expect("DEAD_OWNER");
        assert!(
            dead["next_step"]
                .as_str()
                .unwrap()
                .starts_with("repair the error finding(s) first"),
            "{dead}"
        );
        assert!(f.iter().any(|f| f["severity"] == "error"), "{f:?}");
    }
    // Restored by hand: retire works again.
    std::fs::write(&event, &good_event).unwrap();
    std::fs::write(&epoch, &good_epoch).unwrap();
    let o = runlease(&["run", d, "--retire-dead", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        !alive(child),
        "the dead owner's command survived the next run"
    );
}

/// A dead owner of `run`: `runlease run -- sleep 600` SIGKILLed once active, its command
/// (pid noted in `tmp`) left running; the guard kills that command when the test ends.
fn dead_owner_with_its_command(tmp: &std::path::Path, run: &std::path::Path) -> KillOnDrop {
    let pidfile = tmp.join("child.pid");
    let script = format!("echo $$ > '{}'; exec sleep 600", pidfile.display());
    let mut owner = spawn(&["run", run.to_str().unwrap(), "--", "sh", "-c", &script]);
    wait_for_state(run, "active", Duration::from_secs(10));
    let cleanup = KillOnDrop(read_pid(&pidfile));
    signal(owner.id(), rustix::process::Signal::KILL);
    owner.wait().unwrap();
    wait_for_state(run, "dead", Duration::from_secs(10));
    cleanup
}

/// Kills a leftover command when a test ends (also when it fails).
struct KillOnDrop(u32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if alive(self.0) {
            signal(self.0, rustix::process::Signal::KILL);
        }
    }
}

/// The newest epochs deleted by hand (or `lease/` restored from an older copy): `run.json`
/// was written by a generation the lease chain no longer has. `run` claimed the old
/// generation numbers again, ran the command and then failed at the store (FENCED, 75),
/// leaving a dead owner; a second try retired it and reused a generation the store had
/// already accepted. It must be refused before anything is written (65, naming run.json
/// and the chain), and doctor must report it.
#[test]
fn a_lease_chain_behind_run_json_is_refused_not_claimed_again() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    used_run(&run); // generation 1, released as 2
    used_run(&run); // generation 3, released as 4; run.json says 3
    let d = run.to_str().unwrap();
    for g in [3, 4] {
        std::fs::remove_file(epoch_file(&run, g)).unwrap();
    }
    let _ = std::fs::remove_file(run.join("lease/cutoffs/00000000000000000003.json"));
    let marker = tmp.path().join("ran");
    let script = format!("touch '{}'", marker.display());
    for deleted_all in [false, true] {
        if deleted_all {
            std::fs::remove_dir_all(run.join("lease")).unwrap();
        }
        let before = tree(tmp.path());
        for args in [
            vec!["run", d, "--", "sh", "-c", &script],
            vec![
                "run",
                d,
                "--retire-dead",
                "--takeover-stale",
                "--",
                "sh",
                "-c",
                &script,
            ],
        ] {
            let o = runlease(&args);
            let err = text(&o.stderr);
            assert_eq!(o.status.code(), Some(65), "{args:?}: {err}");
            assert!(
                err.starts_with("runlease: CHAIN_BROKEN: ")
                    && err.contains("run.json")
                    && err.contains("generation 3"),
                "{args:?}: {err}"
            );
            assert!(!marker.exists(), "the command ran");
            assert_eq!(
                tree(tmp.path()),
                before,
                "{args:?}: something changed on disk"
            );
        }
        let s = status_json(&run);
        assert!(
            s["next_step"]
                .as_str()
                .unwrap()
                .starts_with("runlease doctor"),
            "a next step that claims: {s}"
        );
        let o = runlease(&["doctor", "--json", d]);
        assert_eq!(o.status.code(), Some(65), "{}", text(&o.stdout));
        let f = json_lines(&o);
        assert!(
            f.iter().any(|f| f["code"] == "BROKEN_CHAIN"
                && f["detail"].as_str().unwrap().contains("run.json")),
            "{f:?}"
        );
    }
}

/// The owner's own epoch garbled by hand while its command runs: the release cannot
/// confirm the lease, so the run fences itself (75, nothing released) — but the message
/// said "the lease head is no longer generation 1 of this owner" (as if taken over) and
/// "the command's processes were killed" although the command had exited by itself. It
/// must name the unreadable file and say how the command ended; the file stays as it is.
#[test]
fn a_head_epoch_garbled_during_the_run_is_named_when_the_release_fences() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let d = run.to_str().unwrap();
    let go = tmp.path().join("go");
    let started = tmp.path().join("started");
    let script = format!(
        "touch '{}'; while [ ! -e '{}' ]; do sleep 0.05; done; exit 0",
        started.display(),
        go.display()
    );
    let child = spawn(&["run", d, "--", "sh", "-c", &script]);
    // Garble only once the command runs: `active` is visible right after the claim, and
    // the open reads the epoch again later (the store step), where a garbled epoch fails
    // the open itself (65, the command never starts), a different scenario.
    let t = std::time::Instant::now();
    while !started.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let head = epoch_file(&run, 1);
    std::fs::write(&head, b"{\"generation\":1").unwrap();
    std::fs::write(&go, b"").unwrap();
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(75), "{err}");
    assert!(
        err.contains("FENCED")
            && err.contains("RECORD_INVALID")
            && err.contains("lease/epochs/00000000000000000001.json"),
        "{err}"
    );
    assert!(
        !err.contains("runlease killed the command") && err.contains("exited with 0"),
        "{err}"
    );
    assert_eq!(std::fs::read(&head).unwrap(), b"{\"generation\":1");
    assert_eq!(status_json(&run)["state"], "invalid");
}

/// `list` of a file is a usage error (64) like a missing folder, not an I/O error (74).
#[test]
fn list_of_a_file_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let f = file.to_str().unwrap();
    let o = runlease(&["list", f]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains(f) && err.contains("not a folder"), "{err}");
}

/// A command record broken by hand: `run` refuses the run (65, naming it), so doctor must
/// report it too (it said only DEAD_OWNER, next step retire, exit 0), without touching it.
#[test]
fn doctor_reports_a_broken_command_record_that_run_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let d = run.to_str().unwrap();
    let guard = dead_owner_with_its_command(tmp.path(), &run);
    let child = guard.0;
    let name = format!("commands/{:020}-{child}.json", 1);
    let record = run.join(&name);
    let good = std::fs::read(&record).unwrap();
    for bad in [&good[..good.len() / 2], b"garbage\n".as_slice()] {
        std::fs::write(&record, bad).unwrap();
        let before = tree(tmp.path());
        let o = runlease(&["run", d, "--retire-dead", "--", "true"]);
        assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
        assert!(text(&o.stderr).contains(&name), "{}", text(&o.stderr));
        let o = runlease(&["doctor", "--json", d]);
        assert_eq!(o.status.code(), Some(65), "{}", text(&o.stdout));
        let f = json_lines(&o);
        assert!(
            f.iter()
                .any(|f| f["code"] == "INVALID_RECORD"
                    && f["detail"].as_str().unwrap().contains(&name)),
            "{f:?}"
        );
        assert_eq!(tree(tmp.path()), before, "something changed on disk");
    }
    std::fs::write(&record, &good).unwrap();
    let o = runlease(&["doctor", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
}
