//! The next step `status --json` and `doctor --json` name is an argument vector a script
//! can run as it is, and it works when run (issue #17's rule, on lease-core's diagnosis).

mod common;

use common::*;
use rustix::process::Signal;
use serde_json::Value;
use std::time::Duration;

/// Run a `next_step_argv` (its `runlease` is this build's binary) and return its output.
fn run_argv(argv: &Value) -> std::process::Output {
    let argv: Vec<&str> = argv
        .as_array()
        .unwrap_or_else(|| panic!("no argument vector: {argv}"))
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(argv[0], "runlease", "{argv:?}");
    runlease(&argv[1..])
}

#[test]
fn the_next_step_of_a_dead_owner_is_a_retire_that_succeeds_then_a_claim() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sleep", "30"]].concat());
    wait_for_state(&dir, "active", Duration::from_secs(10));
    // SIGKILL: the owner is dead on this boot and its lock is free. (Its `sleep` is left to
    // the next `run`, which reaps it; the retirement here only frees the lease.)
    signal(owner.id(), Signal::KILL);
    let _ = owner.wait();
    let s = wait_for_state(&dir, "dead", Duration::from_secs(10));
    assert_eq!(
        s["next_step_argv"],
        serde_json::json!(["runlease", "retire", "--", d])
    );
    let o = run_argv(&s["next_step_argv"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // Free now: claiming needs a command of the caller's own, so there is no vector.
    let s = status_json(&dir);
    assert_eq!(s["state"], "free");
    assert!(s["next_step_argv"].is_null(), "{s}");
    assert!(
        s["next_step"].as_str().unwrap().contains("runlease run"),
        "{s}"
    );
    // The reaping `run` the sentence names works too.
    let o = runlease(&["run", "--retire-dead", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

#[test]
fn the_next_step_of_a_stale_owner_is_the_exact_takeover_and_it_succeeds() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let started = _tmp.path().join("started");
    let script = format!("touch '{}'; exec sleep 30", started.display());
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat());
    wait_for_state(&dir, "active", Duration::from_secs(10));
    // Stop it only once its command runs: `active` shows from the claim on, and a command
    // record exists before the spawn gate opens, so an owner stopped at either is fenced
    // before its command started (and says so), not after (was flaky, 1 in 3).
    wait_for_file(
        &started,
        Duration::from_secs(10),
        "the command never started",
    );
    signal(owner.id(), Signal::STOP);
    let s = wait_for_state(&dir, "stale", Duration::from_secs(10));
    let argv = &s["next_step_argv"];
    assert_eq!(argv[1], "takeover", "{s}");
    // Options first, then `--` and the run folder (issue #28).
    assert_eq!(argv[2], "--expect-owner", "{s}");
    assert_eq!(argv[3], s["expect_owner"], "{s}");
    assert_eq!(argv[5], s["expect_heartbeat"], "{s}");
    assert_eq!(argv[6], "--", "{s}");
    assert_eq!(argv[7], d, "{s}");
    let o = run_argv(argv);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(status_json(&dir)["state"], "free");
    // The replaced owner fences itself when it resumes, and says what happened: how long
    // it had no successful heartbeat, who took over (generation, host, time), and that
    // runlease killed its command.
    signal(owner.id(), Signal::CONT);
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(10)).code(),
        Some(75)
    );
    let mut err = String::new();
    std::io::Read::read_to_string(owner.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("FENCED"), "{err}");
    // One prefix per message, and no pseudo-code outside the code list (issue #18).
    let fenced_line = err.lines().find(|l| l.contains("FENCED")).unwrap();
    assert_eq!(fenced_line.matches("FENCED").count(), 1, "{fenced_line}");
    assert!(!err.contains("LEASE_LAPSED"), "{err}");
    assert!(err.contains("no successful heartbeat for"), "{err}");
    assert!(err.contains("taken over by generation 2"), "{err}");
    // The taker's judgement, read from the epoch that replaced it (issue #19).
    assert!(err.contains("unchanged for"), "{err}");
    assert!(err.contains("runlease killed the command"), "{err}");
}

#[test]
fn doctor_gives_a_vector_only_for_a_runlease_step() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // A healthy run: nothing to do, no vector.
    let o = runlease(&["doctor", "--json", d]);
    let f = json_lines(&o).remove(0);
    assert_eq!(f["code"], "OK");
    assert!(f["next_step_argv"].is_null(), "{f}");
    // A garbled head epoch: repair by hand, no vector (and no made-up BROKEN_CHAIN).
    std::fs::write(epoch_file(&dir, 2), b"{\"generation\":2").unwrap();
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    let codes: Vec<Value> = json_lines(&o).iter().map(|f| f["code"].clone()).collect();
    assert_eq!(codes, ["INVALID_RECORD"], "{}", text(&o.stdout));
    assert!(json_lines(&o)[0]["next_step_argv"].is_null());
    // status of the same run names doctor, as a vector that runs (and exits 65 with the
    // finding, which is what it is for).
    let s = status_json(&dir);
    assert_eq!(
        s["next_step_argv"],
        serde_json::json!(["runlease", "doctor", "--", d])
    );
    let o = run_argv(&s["next_step_argv"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
}

#[test]
fn retire_or_takeover_of_a_free_run_says_so_without_asking_for_a_retry() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let before = tree(&dir);
    for args in [
        vec!["retire", d],
        vec![
            "takeover",
            d,
            "--expect-owner",
            "x",
            "--expect-heartbeat",
            "2026-01-01T00:00:00.000Z",
        ],
    ] {
        let o = runlease(&args);
        // 64, not TAKEOVER_RACE's 75 ("observe again, then retry"): nothing will change.
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", text(&o.stderr));
        let err = text(&o.stderr);
        assert!(
            err.contains("RUN_NOT_HELD") && err.contains("is free"),
            "{err}"
        );
        assert!(err.contains("runlease run"), "{err}");
    }
    assert_eq!(tree(&dir), before, "a refusal wrote something");
}

/// A folder that is not a run and not empty: `run` refuses it (RUN_FOLDER_FOREIGN), so the
/// next step `status` and `doctor` name is `runlease init`, which works, and after it
/// `run` does; nothing of what was there is touched, and `status` itself writes nothing.
#[test]
fn the_next_step_of_a_folder_that_is_not_a_run_is_init_and_it_works() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("notes");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), b"mine\n").unwrap();
    let d = dir.to_str().unwrap();
    let s = status_json(&dir);
    // Not `free`: it is no run (issue #28), and says why.
    assert_eq!(s["state"], "not_a_run", "{s}");
    assert_eq!(s["error"]["code"], "RUN_FOLDER_FOREIGN", "{s}");
    assert_eq!(
        s["next_step_argv"],
        serde_json::json!(["runlease", "init", "--", d]),
        "{s}"
    );
    let o = runlease(&["status", d]);
    let human = text(&o.stdout);
    assert!(human.starts_with(&format!("{d}: not a run\n")), "{human}");
    assert!(human.contains("RUN_FOLDER_FOREIGN"), "{human}");
    let names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        vec![std::ffi::OsString::from("notes.txt")],
        "status wrote nothing"
    );
    let o = runlease(&["doctor", "--json", d]);
    let found = json_lines(&o)
        .into_iter()
        .find(|f| f["code"] == "RUN_FOLDER_FOREIGN")
        .unwrap_or_else(|| panic!("{}", text(&o.stdout)));
    assert_eq!(found["next_step_argv"], s["next_step_argv"], "{found}");
    // The claim the old advice named is refused, as the new advice says.
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(64));
    let o = run_argv(&s["next_step_argv"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(std::fs::read(dir.join("notes.txt")).unwrap(), b"mine\n");
    let s = status_json(&dir);
    assert_eq!(s["state"], "free", "{s}");
    assert!(
        s["next_step"].as_str().unwrap().contains("runlease run"),
        "{s}"
    );
}

/// A folder that is not a run and that `init` would refuse too (a file where a layout
/// folder goes): `status` says so and names what `init` would refuse, instead of an
/// `init` that fails; an empty folder stays `free` (`run` makes it a run).
#[test]
fn a_folder_init_would_refuse_is_named_with_the_refusal_not_init() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("notes");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("events"), b"my events\n").unwrap();
    let d = dir.to_str().unwrap();
    let s = status_json(&dir);
    assert_eq!(s["state"], "not_a_run", "{s}");
    assert_eq!(s["next_step_argv"], serde_json::Value::Null, "{s}");
    let step = s["next_step"].as_str().unwrap();
    assert!(
        step.contains("`runlease init` would refuse") && step.contains("events"),
        "{s}"
    );
    // It would: the step is not `init`, because init fails, writing nothing.
    let o = runlease(&["init", "--", d]);
    assert_ne!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(!dir.join("lease").exists());
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert_eq!(status_json(&empty)["state"], "free");
}
