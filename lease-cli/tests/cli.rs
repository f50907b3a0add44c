//! End-to-end tests of the `runlease` binary: real processes, real run folders.

mod common;

use common::*;
use rustix::process::Signal;
use std::path::Path;
use std::process::Command;
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
fn a_held_run_is_refused_with_the_holder_named_or_waited_for() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut first = spawn(&["run", d, "--", "sleep", "2"]);
    wait_for_state(&dir, "active", Duration::from_secs(5));
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.starts_with("runlease: RUN_ALREADY_ACTIVE: "), "{err}");
    assert!(err.contains(&format!("pid {}", first.id())), "{err}");
    // JSON error object names the holder too.
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(76));
    let e = json_lines(&o).remove(0);
    assert_eq!(e["code"], "RUN_ALREADY_ACTIVE");
    assert_eq!(e["holder"]["pid"], first.id());
    // A fresh owner is neither taken over (76) nor retired (76, evidence named); a
    // takeover with a stale observation is a race (75).
    let s = status_json(&dir);
    let (owner, hb) = (
        s["expect_owner"].as_str().unwrap().to_string(),
        s["expect_heartbeat"].as_str().unwrap().to_string(),
    );
    let o = runlease(&[
        "takeover",
        d,
        "--expect-owner",
        &owner,
        "--expect-heartbeat",
        &hb,
    ]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("TAKEOVER_ACTIVE_REFUSED"));
    let o = runlease(&[
        "takeover",
        d,
        "--expect-owner",
        "someone-else",
        "--expect-heartbeat",
        &hb,
    ]);
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("TAKEOVER_RACE"));
    let o = runlease(&["retire", d]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("RETIRE_REFUSED_NOT_DEAD"));
    assert!(text(&o.stderr).contains("is alive"), "{}", text(&o.stderr));
    // --wait gets it once the holder exits.
    let o = runlease(&["run", d, "--wait", "10s", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(first.wait().unwrap().success());
}

#[test]
fn append_inside_run_counts_and_verify_catches_a_broken_log() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let o = Command::new(BIN)
        .args([
            "run",
            d,
            "--",
            "sh",
            "-c",
            r#"runlease append "$RUNLEASE_RUN" --type step && runlease append "$RUNLEASE_RUN" --type step --payload '{"n":2}'"#,
        ])
        .env("PATH", path_with_binary())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "1\n2\n");

    let ev = runlease(&["events", "--json", d]);
    assert_eq!(ev.status.code(), Some(0), "{}", text(&ev.stderr));
    let events = json_lines(&ev);
    assert_eq!(events.len(), 2);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence"], i as u64 + 1);
        assert_eq!(e["type"], "step");
        assert_eq!(e["authoritative"], true, "{e}");
        assert_eq!(e["authority"], "counts");
        assert_eq!(e["generation"], 1);
    }
    assert_eq!(events[1]["payload"]["n"], 2);

    // Outside a run, with the (now released) token: fenced, nothing appended.
    let o = runlease(&[
        "append",
        d,
        "--type",
        "late",
        "--generation",
        "1",
        "--owner",
        events[0]["owner_id"].as_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("FENCED"));
    assert_eq!(json_lines(&runlease(&["events", "--json", d])).len(), 2);

    let v = runlease(&["verify", "--json", d]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v.stderr));
    let r = json_lines(&v).remove(0);
    assert_eq!(r["events"], 2);
    assert_eq!(r["epochs"], 2);

    // Overwrite event 2 with event 1's bytes: the log no longer verifies.
    let e1 = dir.join("events").join(format!("{:020}.json", 1));
    let e2 = dir.join("events").join(format!("{:020}.json", 2));
    std::fs::write(&e2, std::fs::read(&e1).unwrap()).unwrap();
    let v = runlease(&["verify", d]);
    assert_eq!(v.status.code(), Some(65), "{}", text(&v.stderr));
    assert!(text(&v.stderr).starts_with("runlease: "));
    let doc = runlease(&["doctor", "--json", d]);
    assert_eq!(doc.status.code(), Some(65));
    let codes: Vec<String> = json_lines(&doc)
        .iter()
        .map(|f| f["code"].as_str().unwrap().to_string())
        .collect();
    assert!(
        codes
            .iter()
            .any(|c| c == "INVALID_RECORD" || c == "BROKEN_CHAIN"),
        "{codes:?}"
    );
}

#[test]
fn status_of_a_missing_run_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let o = runlease(&["status", "--json", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(64));
    let e = json_lines(&o).remove(0);
    assert_eq!(e["code"], "RUN_NOT_FOUND");
    assert_eq!(e["exit_code"], 64);
    assert!(text(&o.stderr).starts_with("runlease: RUN_NOT_FOUND: "));
    assert!(!missing.exists(), "status must not create the folder");
}

#[test]
fn a_stopped_owner_taken_over_is_fenced_on_resume_and_its_command_dies() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let pidfile = tmp.path().join("child.pid");
    let script = format!("echo $$ > '{}'; exec sleep 30", pidfile.display());
    let mut owner = spawn(&[
        "run",
        d,
        "--heartbeat",
        "200",
        "--self-fence-after",
        "600",
        "--stale-after",
        "1000",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    wait_for_state(&dir, "active", Duration::from_secs(5));
    let t = Instant::now();
    let child_pid: u32 = loop {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break p;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "child never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    std::thread::sleep(Duration::from_millis(300));

    signal(owner.id(), Signal::STOP);
    std::thread::sleep(Duration::from_millis(1200));
    let s = wait_for_state(&dir, "stale", Duration::from_secs(5));
    let expect_owner = s["expect_owner"].as_str().unwrap().to_string();
    let expect_hb = s["expect_heartbeat"].as_str().unwrap().to_string();
    // Without expectations and without a terminal: refused as a usage error.
    assert_eq!(runlease(&["takeover", d]).status.code(), Some(64));
    let o = runlease(&[
        "takeover",
        "--json",
        d,
        "--expect-owner",
        &expect_owner,
        "--expect-heartbeat",
        &expect_hb,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let r = json_lines(&o).remove(0);
    assert_eq!(r["state"], "free");
    assert_eq!(r["generation"], 2);
    assert_eq!(r["released_as"], 3);

    let resumed = Instant::now();
    signal(owner.id(), Signal::CONT);
    let status = loop {
        if let Some(st) = owner.try_wait().unwrap() {
            break st;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(3),
            "the fenced owner did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(75));
    assert!(resumed.elapsed() < Duration::from_millis(2500));
    let mut err = String::new();
    std::io::Read::read_to_string(owner.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("runlease: FENCED: "), "{err}");
    assert!(
        !Path::new(&format!("/proc/{child_pid}")).exists(),
        "the fenced owner's command is still alive"
    );
    // The fenced owner wrote nothing: the run stays free at generation 3.
    let s = status_json(&dir);
    assert_eq!(s["state"], "free");
    assert_eq!(s["generation"], 3);
}

#[test]
fn tour_kill9_status_dead_retire_run_again() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let pidfile = tmp.path().join("child.pid");
    let script = format!("echo $$ > '{}'; exec sleep 30", pidfile.display());
    let mut owner = spawn(&["run", d, "--", "sh", "-c", &script]);
    wait_for_state(&dir, "active", Duration::from_secs(5));
    let t = Instant::now();
    while !pidfile.exists() {
        assert!(t.elapsed() < Duration::from_secs(5), "child never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(50));
    signal(owner.id(), Signal::KILL);
    owner.wait().unwrap();
    // The command survives its killed owner (no command records or reaping yet: lease-run);
    // this test cleans it up itself.
    let child: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    signal(child, Signal::KILL);
    let s = wait_for_state(&dir, "dead", Duration::from_secs(5));
    assert!(s["next_step"].as_str().unwrap().contains("runlease retire"));
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("--retire-dead"));
    let o = runlease(&["retire", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(json_lines(&o)[0]["retired_generation"], 1);
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(status_json(&dir)["state"], "free");
}

#[test]
fn usage_errors_exit_64_and_help_lists_exit_codes() {
    assert_eq!(runlease(&["frobnicate"]).status.code(), Some(64));
    assert_eq!(runlease(&[]).status.code(), Some(64));
    assert_eq!(runlease(&["status"]).status.code(), Some(64));
    assert_eq!(runlease(&["run", "x"]).status.code(), Some(64));
    assert_eq!(
        runlease(&["run", "x", "--wait", "soon", "--", "true"])
            .status
            .code(),
        Some(64)
    );
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("r");
    // An unsafe timing policy is a usage error, and nothing is created.
    let o = runlease(&[
        "run",
        d.to_str().unwrap(),
        "--heartbeat",
        "10",
        "--",
        "true",
    ]);
    assert_eq!(o.status.code(), Some(64));
    assert!(text(&o.stderr).contains("POLICY_INVALID"));
    let help = runlease(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    let h = text(&help.stdout);
    for code in ["0 ", "1 ", "64", "65", "69", "70", "74", "75", "76"] {
        assert!(
            h.contains(&format!("\n  {code}")),
            "help lacks exit code {code}"
        );
    }
    assert!(h.contains("runlease run ./demo-run --"));
    for sub in [
        "run", "status", "takeover", "retire", "release", "append", "events", "verify", "doctor",
        "prune", "list",
    ] {
        let o = runlease(&[sub, "--help"]);
        assert_eq!(o.status.code(), Some(0));
        assert!(
            text(&o.stdout).contains(&format!("runlease {sub} ")),
            "`{sub} --help` lacks an example"
        );
    }
    assert_eq!(runlease(&["--version"]).status.code(), Some(0));
}

#[test]
fn doctor_list_and_prune_on_healthy_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("a");
    let b = tmp.path().join("b");
    std::fs::create_dir(tmp.path().join("not-a-run")).unwrap();
    for _ in 0..3 {
        assert_eq!(
            runlease(&["run", a.to_str().unwrap(), "--", "true"])
                .status
                .code(),
            Some(0)
        );
    }
    assert_eq!(
        runlease(&["run", b.to_str().unwrap(), "--", "true"])
            .status
            .code(),
        Some(0)
    );
    // An orphan temp file and a stray name.
    std::fs::write(a.join("lease/epochs/.tmp-1-1-000000001"), b"x").unwrap();
    std::fs::write(a.join("lease/epochs/notes.txt"), b"x").unwrap();
    let o = runlease(&["doctor", "--json", a.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let codes: Vec<String> = json_lines(&o)
        .iter()
        .map(|f| f["code"].as_str().unwrap().to_string())
        .collect();
    assert!(
        codes.contains(&"ORPHAN_TEMP_FILES".to_string()),
        "{codes:?}"
    );
    assert!(codes.contains(&"STRAY_NAMES".to_string()), "{codes:?}");
    let o = runlease(&["doctor", "--json", b.to_str().unwrap()]);
    assert_eq!(json_lines(&o)[0]["code"], "OK");

    let o = runlease(&["list", "--json", tmp.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0));
    let rows = json_lines(&o);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows.iter().all(|r| r["state"] == "free"));

    let o = runlease(&["prune", "--json", a.to_str().unwrap(), "--keep", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(json_lines(&o)[0]["floor"], 5);
    assert_eq!(
        runlease(&["verify", a.to_str().unwrap()]).status.code(),
        Some(0)
    );
    assert_eq!(
        runlease(&["run", a.to_str().unwrap(), "--", "true"])
            .status
            .code(),
        Some(0)
    );
}
