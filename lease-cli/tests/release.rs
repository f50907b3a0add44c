//! `runlease release`: a clean hand-over, from a command under `runlease run` (its owner
//! releases on request) or directly with the token; never of another generation.

mod common;

use common::*;
use std::time::{Duration, Instant};

#[test]
fn release_from_a_command_under_run_hands_over_while_it_runs_on() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let ready = tmp.path().join("released");
    let go = tmp.path().join("go");
    let script = format!(
        r#"runlease append "$RUNLEASE_RUN" --type a >/dev/null || exit 50
runlease release || exit 51
runlease append "$RUNLEASE_RUN" --type late; echo "late=$?"
touch '{ready}'
while [ ! -e '{go}' ]; do sleep 0.02; done
exit 3"#,
        ready = ready.display(),
        go = go.display()
    );
    let first = spawn(&[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat());
    let t = Instant::now();
    while !ready.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the command never released"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Handed over: while the first command still runs, the run is free for the next owner.
    let s = status_json(&dir);
    assert_eq!(s["state"], "free", "{s}");
    assert_eq!(s["generation"], 2);
    // Handed over, not finished: run.json says paused; the command's record is gone, so
    // the next owner does not reap it.
    assert_eq!(s["run_status"]["status"], "paused", "{s}");
    assert_eq!(std::fs::read_dir(dir.join("commands")).unwrap().count(), 0);
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    std::fs::write(&go, b"").unwrap();
    let o = first.wait_with_output().unwrap();
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(
        out.contains("late=75"),
        "a late append after the release must be fenced: {out}"
    );
    assert!(out.contains("as generation 2"), "{out}");
    assert!(err.contains("on request"), "{err}");
    assert!(err.contains("runlease: FENCED: "), "{err}");
    // Only the event written while owning counts; the late one was never written.
    let ev = json_lines(&runlease(&["events", "--json", d]));
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["type"], "a");
    assert_eq!(ev[0]["authoritative"], true);
    assert_eq!(runlease(&["verify", d]).status.code(), Some(0));
}

#[test]
fn release_never_touches_another_generation() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let o = runlease(&["run", "--json", d, "--", "true"]);
    let first = json_lines(&o)[0].clone();
    let old_owner = first["owner_id"].as_str().unwrap().to_string();
    let before = tree(&dir);
    // A released generation: fenced, nothing written.
    let o = runlease(&["release", d, "--generation", "1", "--owner", &old_owner]);
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    assert!(text(&o.stderr).starts_with("runlease: FENCED: "));
    // A generation that does not exist, no token at all: usage.
    let o = runlease(&["release", d, "--generation", "9", "--owner", &old_owner]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
    assert_eq!(runlease(&["release", d]).status.code(), Some(64));
    assert_eq!(tree(&dir), before, "a refused release changed the run");

    // A live owner's generation with another owner id: fenced, and the owner keeps it.
    let mut holder = spawn(&[&["run", d][..], &FAST, &["--", "sleep", "30"]].concat());
    let s = wait_for_state(&dir, "active", Duration::from_secs(10));
    let g = s["generation"].to_string();
    let o = runlease(&["release", d, "--generation", &g, "--owner", &old_owner]);
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    std::thread::sleep(Duration::from_millis(300));
    let after = status_json(&dir);
    assert_eq!(after["state"], "active");
    assert_eq!(after["generation"], s["generation"]);
    assert_eq!(after["owner_id"], s["owner_id"]);
    assert!(holder.try_wait().unwrap().is_none(), "the owner stopped");
    signal(holder.id(), rustix::process::Signal::TERM);
    assert_eq!(
        wait_exit(&mut holder, Duration::from_secs(10)).code(),
        Some(128 + 15)
    );
}

#[test]
fn a_direct_release_with_the_token_fences_a_running_owner() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let pidfile = tmp.path().join("child.pid");
    let script = format!("echo $$ > '{}'; exec sleep 30", pidfile.display());
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat());
    let s = wait_for_state(&dir, "active", Duration::from_secs(10));
    let child = read_pid(&pidfile);
    let o = runlease(&[
        "release",
        "--json",
        d,
        "--generation",
        &s["generation"].to_string(),
        "--owner",
        s["owner_id"].as_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let r = json_lines(&o).remove(0);
    assert_eq!(r["how"], "direct");
    assert_eq!(r["released_as"], 2);
    // The owner learns at its next heartbeat (100 ms): it kills its command, exits 75.
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(10)).code(),
        Some(75)
    );
    let t = Instant::now();
    while alive(child) {
        assert!(t.elapsed() < Duration::from_secs(5), "the command survived");
        std::thread::sleep(Duration::from_millis(20));
    }
    let s = status_json(&dir);
    assert_eq!(
        (s["state"].as_str(), s["generation"].as_u64()),
        (Some("free"), Some(2))
    );
}

#[test]
fn a_release_request_to_a_stopped_owner_times_out_with_75() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let go = tmp.path().join("go");
    let result = tmp.path().join("result");
    let started = tmp.path().join("started");
    let script = format!(
        "touch '{started}'; while [ ! -e '{go}' ]; do sleep 0.02; done; runlease release --timeout 500ms; echo \"rel=$?\" > '{result}'",
        started = started.display(),
        go = go.display(),
        result = result.display()
    );
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat());
    wait_for_state(&dir, "active", Duration::from_secs(10));
    // `active` is the claim; the command starts a few open steps later (run.json, store,
    // seal): stop the owner only once its command runs.
    let t = Instant::now();
    while !started.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The owner cannot answer while stopped; its command (own process group) runs on
    // once its guard is gone (a live guard kills it by the self-fence deadline, issue #31,
    // before the request's timeout could pass).
    kill_guard(owner.id());
    signal(owner.id(), rustix::process::Signal::STOP);
    std::fs::write(&go, b"").unwrap();
    let t = Instant::now();
    let r = loop {
        if let Ok(r) = std::fs::read_to_string(&result) {
            if r.ends_with('\n') {
                break r;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "release never returned"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(r.trim(), "rel=75");
    // Resumed past its self-fence deadline, the owner releases nothing: it is fenced.
    signal(owner.id(), rustix::process::Signal::CONT);
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(15)).code(),
        Some(75)
    );
    let o = owner.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert!(err.contains("runlease: RELEASE_TIMEOUT: "), "{err}");
    assert!(err.contains("runlease: FENCED: "), "{err}");
    let s = status_json(&dir);
    assert_eq!(
        (s["generation"].as_u64(), s["epoch_state"].as_str()),
        (Some(1), Some("active"))
    );
}
