//! Issue #17, "never half-acts", end to end with the binary: `run` of a program that
//! cannot start creates nothing; `run` and `append` refuse whatever `verify` rejects, with
//! verify's code, and write nothing; a name above the head is refused before the claim (no
//! generation used); `takeover` and `retire` leave `run.json` following the chain, and
//! `status`, `doctor` and the next `run` agree with it.

mod common;

use common::*;
use rustix::process::Signal;
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

fn code_of(o: &std::process::Output) -> (Option<i32>, String) {
    let code = json_lines(o)
        .into_iter()
        .find(|v| v["schema"] == "runlease/cli/error/1")
        .map(|v| v["code"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default();
    (o.status.code(), code)
}

fn epochs(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("lease/epochs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_program_that_cannot_start_creates_nothing() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    // Not found in PATH (127), no such file (127), not executable (126), a folder (126):
    // the run folder is not even created.
    let not_exec = tmp.path().join("not-executable");
    std::fs::write(&not_exec, b"#!/bin/sh\n").unwrap();
    let folder = tmp.path().join("a-folder");
    std::fs::create_dir(&folder).unwrap();
    for (prog, exit) in [
        ("runlease-no-such-program", 127),
        ("/nonexistent/program", 127),
        (not_exec.to_str().unwrap(), 126),
        (folder.to_str().unwrap(), 126),
    ] {
        let o = runlease(&["run", "--json", d, "--", prog]);
        assert_eq!(
            code_of(&o),
            (Some(exit), "COMMAND_NOT_STARTED".into()),
            "{prog}"
        );
        assert!(!dir.exists(), "{prog}: the run folder was created");
    }
    // An empty PATH searches the current folder only, as /bin/sh does: `true` is not found.
    let o = cmd(&["run", d, "--", "true"])
        .env("PATH", "")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(127), "{}", text(&o.stderr));
    assert!(!dir.exists());
    // An unset PATH is /bin/sh's default path: `true` is found and runs.
    let o = cmd(&["run", d, "--", "true"])
        .env_remove("PATH")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // On an existing run: nothing changes, no generation is used.
    let before = tree(&dir);
    let o = runlease(&["run", d, "--", "runlease-no-such-program"]);
    assert_eq!(o.status.code(), Some(127));
    assert_eq!(tree(&dir), before);
}

/// One rule for the log: `append` (inside a run, as the owner) and `run` refuse what
/// `verify` rejects, with its code and exit, and append nothing past it.
#[test]
fn append_and_run_refuse_what_verify_rejects_with_its_code() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let script = r#"runlease append "$RUNLEASE_RUN" --type a >/dev/null || exit 9
mkdir "$RUNLEASE_RUN/events/00000000000000000005.json"
runlease append "$RUNLEASE_RUN" --type b
echo "append=$?""#;
    let o = runlease(&["run", d, "--", "sh", "-c", script]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("append=65"), "{}", text(&o.stdout));
    // A directory named like an event: the code verify gives (one rule for bad files).
    assert!(
        text(&o.stderr).contains("RUN_LAYOUT_INVALID"),
        "{}",
        text(&o.stderr)
    );
    let names: Vec<_> = std::fs::read_dir(dir.join("events"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "event 1 and the stray only: {names:?}");

    let ev = |s: u64| dir.join("events").join(format!("{s:020}.json"));
    let e1 = std::fs::read(ev(1)).unwrap();
    type Fix<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&str, Fix, Fix)> = vec![
        (
            "a directory named like event 5",
            Box::new(|| {}),
            Box::new(|| std::fs::remove_dir(ev(5)).unwrap()),
        ),
        (
            "a directory named like the next event",
            Box::new(|| std::fs::create_dir(ev(2)).unwrap()),
            Box::new(|| std::fs::remove_dir(ev(2)).unwrap()),
        ),
        (
            "an extra event leaving a gap",
            Box::new(|| std::fs::write(ev(4), &e1).unwrap()),
            Box::new(|| std::fs::remove_file(ev(4)).unwrap()),
        ),
        (
            "an event that is not canonical JSON",
            Box::new(|| std::fs::write(ev(1), b"{}").unwrap()),
            Box::new(|| std::fs::write(ev(1), &e1).unwrap()),
        ),
    ];
    for (what, damage, repair) in &cases {
        damage();
        let verify = code_of(&runlease(&["verify", "--json", d]));
        assert_eq!(verify.0, Some(65), "{what}: {verify:?}");
        let before = tree(&dir);
        let run = code_of(&runlease(&["run", "--json", d, "--", "true"]));
        assert_eq!(run, verify, "{what}: run");
        // An append with a token (the check comes first, whoever asks).
        let append = code_of(&runlease(&[
            "append",
            "--json",
            d,
            "--type",
            "x",
            "--generation",
            "1",
            "--owner",
            "someone",
        ]));
        assert_eq!(append, verify, "{what}: append");
        assert_eq!(tree(&dir), before, "{what}: a refusal changed the run");
        let st = status_json(&dir);
        assert_eq!(
            (&st["state"], &st["generation"]),
            (&Value::from("free"), &Value::from(2))
        );
        repair();
    }
    let o = runlease(&["verify", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(epochs(&dir).len(), 4, "only the last run used generations");
}

/// A stray named like the next heartbeat: `run` refuses before claiming (65), `status`
/// still says free at the same generation, and once it is moved out `run` proceeds.
#[test]
fn a_stray_named_like_the_next_heartbeat_is_refused_before_the_claim() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(0));
    let beat = dir.join("lease/beats").join(format!("{:020}.json", 3));
    std::fs::create_dir_all(&beat).unwrap();
    let before = tree(&dir);
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(code_of(&o), (Some(65), "RUN_LAYOUT_INVALID".into()));
    let msg = json_lines(&o)[0]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("lease/beats/00000000000000000003.json"),
        "{msg}"
    );
    assert_eq!(tree(&dir), before);
    let st = status_json(&dir);
    assert_eq!(
        (&st["state"], &st["generation"]),
        (&Value::from("free"), &Value::from(2))
    );
    std::fs::remove_dir(&beat).unwrap();
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(json_lines(&o)[0]["generation"], 3);
}

/// Wait until the run's command is recorded, so an owner stopped or killed next is one
/// whose command record names its cgroup: stopped or killed before, it leaves the run's
/// cgroup with no record naming it, which doctor reports (`CGROUP_NOT_PROVEN`, issue #29).
fn wait_recorded(dir: &std::path::Path, active: &serde_json::Value) {
    let g = active["generation"].as_u64().unwrap();
    let prefix = format!("{g:020}-");
    let recorded = || {
        std::fs::read_dir(dir.join("commands")).is_ok_and(|r| {
            r.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        })
    };
    let t = std::time::Instant::now();
    while !recorded() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the command was never recorded"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `takeover` of a stopped owner and `retire` of a killed one: afterwards run.json says
/// `failed` as the replacing generation (never `running` for the old one); status shows it
/// with state free, doctor finds nothing to repair, and the next `run` proceeds.
#[test]
fn takeover_and_retire_leave_run_json_following_the_chain() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut args = vec!["run", d];
    args.extend(FAST);
    args.extend(["--", "sleep", "30"]);

    // Takeover of a stopped owner.
    let mut owner = spawn(&args);
    let active = wait_for_state(&dir, "active", Duration::from_secs(10));
    wait_recorded(&dir, &active);
    signal(owner.id(), Signal::STOP);
    wait_for_state(&dir, "stale", Duration::from_secs(10));
    let o = runlease(&["takeover", "--json", "--yes", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let t = json_lines(&o).remove(0);
    let st = status_json(&dir);
    assert_eq!(st["state"], "free");
    assert_eq!(st["generation"], t["released_as"]);
    assert_eq!(st["run_status"]["status"], "failed");
    assert_eq!(st["run_status"]["generation"], t["generation"]);
    assert!(
        st["run_status"]["detail"]
            .as_str()
            .unwrap()
            .contains("taken over"),
        "{st}"
    );
    let doctor = runlease(&["doctor", "--json", d]);
    assert_eq!(doctor.status.code(), Some(0));
    // OK, or the stopped owner's in-flight heartbeat temp file (a warning, never counted).
    for f in json_lines(&doctor) {
        assert!(
            f["code"] == "OK" || f["code"] == "ORPHAN_TEMP_FILES",
            "{}",
            text(&doctor.stdout)
        );
    }
    // The old owner resumes, finds itself fenced and exits 75, writing nothing.
    signal(owner.id(), Signal::CONT);
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(10)).code(),
        Some(75)
    );
    assert_eq!(status_json(&dir)["run_status"], st["run_status"]);

    // Retirement of a killed owner.
    let mut owner = spawn(&args);
    let active = wait_for_state(&dir, "active", Duration::from_secs(10));
    wait_recorded(&dir, &active);
    signal(owner.id(), Signal::KILL);
    wait_exit(&mut owner, Duration::from_secs(10));
    wait_for_state(&dir, "dead", Duration::from_secs(10));
    let o = runlease(&["retire", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let r = json_lines(&o).remove(0);
    let st = status_json(&dir);
    assert_eq!(st["state"], "free");
    assert_eq!(st["run_status"]["status"], "failed");
    assert_eq!(st["run_status"]["generation"], r["generation"]);
    assert!(
        st["next_step"].as_str().unwrap().starts_with("claim it"),
        "{st}"
    );
    let doctor = runlease(&["doctor", "--json", d]);
    assert_eq!(doctor.status.code(), Some(0));
    assert_eq!(json_lines(&doctor)[0]["code"], "OK");
    // The next run proceeds (and reaps the killed owner's `sleep`, proved by its secret).
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(status_json(&dir)["run_status"]["status"], "done");
}

/// A crash between a retirement's chain change and its run.json rewrite (reproduced by
/// putting the old run.json back): `status` says the run is free and that run.json's
/// `running` is out of date, doctor finds nothing to repair, and the next `run` proceeds
/// and rewrites it.
#[test]
fn a_crash_before_run_json_was_rewritten_is_explained_and_the_next_run_proceeds() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut args = vec!["run", d];
    args.extend(FAST);
    args.extend(["--", "sleep", "30"]);
    let mut owner = spawn(&args);
    let active = wait_for_state(&dir, "active", Duration::from_secs(10));
    wait_recorded(&dir, &active);
    signal(owner.id(), Signal::KILL);
    wait_exit(&mut owner, Duration::from_secs(10));
    wait_for_state(&dir, "dead", Duration::from_secs(10));
    let saved = tmp.path().join("run.json.before");
    std::fs::copy(dir.join("run.json"), &saved).unwrap();
    assert_eq!(runlease(&["retire", d]).status.code(), Some(0));
    std::fs::copy(&saved, dir.join("run.json")).unwrap();

    let o = runlease(&["status", d]);
    let human = text(&o.stdout);
    assert!(
        human.contains(
            "running (generation 1) (out of date: the lease chain moved on to generation 2"
        ),
        "{human}"
    );
    let st = status_json(&dir);
    assert_eq!(st["state"], "free");
    assert_eq!(st["run_status"]["status"], "running");
    assert!(
        st["next_step"].as_str().unwrap().starts_with("claim it"),
        "{st}"
    );
    let doctor = runlease(&["doctor", "--json", d]);
    assert_eq!(doctor.status.code(), Some(0));
    // Nothing to repair. (A SIGKILL that lands inside a heartbeat's replace leaves its temp
    // file: an orphan-temp warning, collected by the next release, is all doctor may add.)
    let findings: Vec<String> = json_lines(&doctor)
        .iter()
        .map(|l| l["code"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(
        findings
            .iter()
            .all(|c| c == "OK" || c == "ORPHAN_TEMP_FILES"),
        "{findings:?}"
    );
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let st = status_json(&dir);
    assert_eq!(st["run_status"]["status"], "done");
    assert_eq!(st["run_status"]["generation"], 3);
}

/// A folder in place of the store: judged before the claim (issue #28: the store is read
/// without writing, under the owner lock, before the lease is taken), so nothing is
/// written (no generation used up, run.json as it was); `status` says free with doctor as
/// its next step, doctor names the store, and once the store is back the next `run`
/// proceeds with it. (A failure only an owner's open can see, after the claim, is handed
/// back: lease-run/tests/handback.rs injects one at every step.)
#[test]
fn a_folder_in_place_of_the_store_is_refused_before_the_claim_and_status_says_free() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(0));
    let store = dir.join("store/run.sqlite");
    let saved = tmp.path().join("run.sqlite");
    std::fs::rename(&store, &saved).unwrap();
    std::fs::create_dir(&store).unwrap();
    let before = tree(&dir);
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(code_of(&o), (Some(65), "STORE_CORRUPT".into()));
    assert_eq!(tree(&dir), before, "a refusal before the claim wrote");
    let st = status_json(&dir);
    assert_eq!(st["state"], "free");
    assert_eq!(st["epoch_state"], "released");
    assert_eq!(st["generation"], 2, "a generation was used up");
    assert_eq!(st["run_status"]["status"], "done");
    assert!(
        st["next_step"]
            .as_str()
            .unwrap()
            .starts_with("runlease doctor"),
        "{st}"
    );
    let doctor = runlease(&["doctor", "--json", d]);
    assert_eq!(doctor.status.code(), Some(65));
    assert!(
        json_lines(&doctor)
            .iter()
            .any(|f| f["code"] == "STORE_CORRUPT"),
        "{}",
        text(&doctor.stdout)
    );
    std::fs::remove_dir(&store).unwrap();
    std::fs::rename(&saved, &store).unwrap();
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        json_lines(&o)[0]["generation"],
        3,
        "the refusal used up none"
    );
}
