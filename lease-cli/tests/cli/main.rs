//! End-to-end tests of the `runlease` binary: real processes, real run folders.

#[path = "../common/mod.rs"]
mod common;

use common::*;
use rustix::process::Signal;
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
    // A 200 ms heartbeat: the takeover below watches the record and sees it change soon.
    let mut first = spawn(&["run", d, "--heartbeat", "200ms", "--", "sleep", "4"]);
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
    // A fresh owner is neither taken over (76: its record changes under the watch) nor
    // retired (76, evidence named); a takeover whose expectation differs from the record
    // in any field is a race (75, observe again), nothing written (issue #28).
    let s = status_json(&dir);
    let (owner, hb) = (
        s["expect_owner"].as_str().unwrap().to_string(),
        s["expect_heartbeat"].as_str().unwrap().to_string(),
    );
    let o = runlease(&["takeover", d, "--yes"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("TAKEOVER_ACTIVE_REFUSED"));
    assert!(text(&o.stderr).contains("alive"), "{}", text(&o.stderr));
    // Everything of the lease but the live owner's own beat.
    let lease_files = || {
        let mut t = tree(&dir.join("lease"));
        t.retain(|k, _| !k.starts_with("beats/"));
        t
    };
    let before = lease_files();
    // A heartbeat older than the record's: the owner has beaten since that look, so it is
    // alive (76), not a race to retry (an owner whose wall clock makes it look stale would
    // send status's own advice round in a loop of 75s).
    let o = runlease(&[
        "takeover",
        d,
        "--expect-owner",
        &owner,
        "--expect-heartbeat",
        "2020-01-01T00:00:00.000Z",
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(76), "{err}");
    assert!(err.contains("TAKEOVER_ACTIVE_REFUSED"), "{err}");
    for (who, when) in [
        // One the owner never wrote (a date ahead of the record).
        (owner.as_str(), "2030-01-01T00:00:00.000Z"),
        ("someone-else", hb.as_str()),
    ] {
        let o = runlease(&[
            "takeover",
            d,
            "--expect-owner",
            who,
            "--expect-heartbeat",
            when,
        ]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(75), "{who} {when}: {err}");
        assert!(err.contains("TAKEOVER_RACE"), "{err}");
        assert!(
            err.contains("status --json"),
            "names the observation: {err}"
        );
        assert!(!err.contains("watched unchanged"), "{err}");
    }
    assert_eq!(lease_files(), before, "a refused takeover wrote");
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
    // The command appends `old` events in a loop, ignoring refusals: it is in its own
    // process group, so it keeps running (and trying) while its owner is stopped.
    let script = format!(
        r#"echo $$ > '{}'; while :; do runlease append "$RUNLEASE_RUN" --type old >/dev/null 2>&1; sleep 0.05; done"#,
        pidfile.display()
    );
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat());
    wait_for_state(&dir, "active", Duration::from_secs(10));
    let child_pid = read_pid(&pidfile);
    std::thread::sleep(Duration::from_millis(300));

    signal(owner.id(), Signal::STOP);
    let s = wait_for_state(&dir, "stale", Duration::from_secs(10));
    let expect_owner = s["expect_owner"].as_str().unwrap().to_string();
    let expect_hb = s["expect_heartbeat"].as_str().unwrap().to_string();
    assert!(
        s["next_step"]
            .as_str()
            .unwrap()
            .contains(&format!("--expect-owner {expect_owner}")),
        "{s}"
    );
    let f = json_lines(&runlease(&["doctor", "--json", d]));
    assert!(
        f.iter().any(|f| f["code"] == "STALE_OWNER"
            && f["next_step"]
                .as_str()
                .unwrap()
                .starts_with("runlease takeover")),
        "{f:?}"
    );
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
    assert_eq!(r["taken_over"]["owner_id"], expect_owner.as_str());
    let cutoff = r["cutoff"].as_u64().expect("a cutoff");

    // The stopped owner still holds the kernel owner lock and the store: no new owner on
    // this host until it resumes or ends (lease-run takes the lock first: never two live
    // owners of one run on a host, and never a claim that would then fail at the store).
    // Nothing is claimed by the refusal.
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.starts_with("runlease: OWNER_LOCK_HELD: "), "{err}");
    assert_eq!(status_json(&dir)["generation"], 3);

    // Resumed, the old owner finds itself fenced: its command is killed, it exits 75.
    let resumed = Instant::now();
    signal(owner.id(), Signal::CONT);
    let status = wait_exit(&mut owner, Duration::from_secs(15));
    assert_eq!(status.code(), Some(75));
    let mut err = String::new();
    std::io::Read::read_to_string(owner.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("runlease: FENCED: "), "{err}");
    assert!(resumed.elapsed() < Duration::from_secs(15));
    assert!(
        !alive(child_pid),
        "the fenced owner's command is still alive"
    );

    // A new owner writes its events.
    let o = runlease(&[
        "run",
        "--json",
        d,
        "--",
        "sh",
        "-c",
        r#"for i in 1 2 3; do runlease append "$RUNLEASE_RUN" --type new --payload "$i" >/dev/null || exit 9; done"#,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let new_gen = json_lines(&o)[0]["generation"].as_u64().unwrap();
    assert_eq!(new_gen, 4);

    // The new owner's events are intact and count; no `old` event past the cutoff counts.
    let ev = json_lines(&runlease(&["events", "--json", d]));
    let new: Vec<_> = ev.iter().filter(|e| e["type"] == "new").collect();
    assert_eq!(new.len(), 3, "{ev:?}");
    for (i, e) in new.iter().enumerate() {
        assert_eq!(e["authoritative"], true, "{e}");
        assert_eq!(e["generation"], new_gen);
        assert_eq!(e["payload"], i as u64 + 1);
    }
    assert!(
        ev.iter().any(|e| e["type"] == "old"),
        "the old command never appended"
    );
    for e in ev.iter().filter(|e| e["type"] == "old") {
        assert_eq!(e["generation"], 1, "{e}");
        let counts = e["authoritative"] == true;
        assert_eq!(counts, e["sequence"].as_u64().unwrap() <= cutoff, "{e}");
    }
    assert_eq!(runlease(&["verify", d]).status.code(), Some(0));
    // The fenced owner wrote nothing after resuming: free at generation 5.
    let s = status_json(&dir);
    assert_eq!(s["state"], "free");
    assert_eq!(s["generation"], 5);
}

/// The README's 60-second tour, step by step.
#[test]
fn tour_kill9_status_dead_retire_run_again() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    // `runlease run ./demo-run -- sleep 600 &` (its pid noted, to clean up the orphan).
    let pidfile = tmp.path().join("child.pid");
    let script = format!("echo $$ > '{}'; exec sleep 600", pidfile.display());
    let mut owner = spawn(&["run", d, "--", "sh", "-c", &script]);
    wait_for_state(&dir, "active", Duration::from_secs(10));
    let child = read_pid(&pidfile);
    // `runlease run ./demo-run -- true`: 76, naming the holder.
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    for part in [
        format!("pid {}", owner.id()),
        "host ".into(),
        "since ".into(),
        "generation 1".into(),
    ] {
        assert!(err.contains(&part), "lacks {part}: {err}");
    }
    // `kill -9 %1`.
    signal(owner.id(), Signal::KILL);
    owner.wait().unwrap();
    // `runlease status ./demo-run`: dead, and the next step is retire.
    let t = Instant::now();
    let human = loop {
        let o = runlease(&["status", d]);
        let h = text(&o.stdout);
        if h.contains(": dead") {
            break h;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "never dead: {h}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(human.contains("definitely dead"), "{human}");
    assert!(
        human.contains(&format!("runlease retire -- {d}")),
        "{human}"
    );
    let f = json_lines(&runlease(&["doctor", "--json", d]));
    assert!(
        f.iter().any(|f| f["code"] == "DEAD_OWNER"
            && f["next_step"] == format!("runlease retire -- {d}").as_str()),
        "{f:?}"
    );
    // `runlease retire ./demo-run`.
    let o = runlease(&["retire", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("the run is free"));
    // `runlease run ./demo-run -- sh -c 'runlease append "$RUNLEASE_RUN" --type step.done'`.
    let o = runlease(&[
        "run",
        d,
        "--",
        "sh",
        "-c",
        r#"runlease append "$RUNLEASE_RUN" --type step.done"#,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // `runlease events ./demo-run`: the event, counting.
    let o = runlease(&["events", d]);
    let ev = text(&o.stdout);
    assert!(ev.contains("step.done") && ev.contains("[counts]"), "{ev}");
    // `runlease verify ./demo-run && runlease doctor ./demo-run`.
    assert_eq!(runlease(&["verify", d]).status.code(), Some(0));
    let o = runlease(&["doctor", d]);
    assert_eq!(o.status.code(), Some(0));
    assert!(text(&o.stdout).starts_with("OK"), "{}", text(&o.stdout));
    // The dead owner's command outlived it only until the next run: that run found its
    // command record (same boot) and killed it before starting its own command.
    wait_gone(
        child,
        Duration::from_secs(5),
        "the dead owner's command survived the next run",
    );
}

#[test]
fn wait_2s_gets_the_run_once_the_holder_exits_and_gives_up_otherwise() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut holder = spawn(&["run", d, "--", "sleep", "1"]);
    wait_for_state(&dir, "active", Duration::from_secs(10));
    let o = runlease(&["run", d, "--wait", "2s", "--", "true"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        holder.try_wait().unwrap().is_some(),
        "got the run before the holder exited"
    );
    // Not a terminal: no progress line, only the final one.
    assert!(!err.contains('\r') && !err.contains("\x1b["), "{err:?}");
    assert!(err.contains("runlease: waited "), "{err}");
    assert!(holder.wait().unwrap().success());

    let mut holder = spawn(&["run", d, "--", "sleep", "30"]);
    wait_for_state(&dir, "active", Duration::from_secs(10));
    let o = runlease(&["run", d, "--wait", "300ms", "--", "true"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(76), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("gave up after waiting"), "{err}");
    // On a terminal (`script` provides one), a progress line is shown while waiting.
    let o = std::process::Command::new("script")
        .args([
            "-qec",
            &format!("{BIN} run {d} --wait 1s -- true"),
            "/dev/null",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("`script` (util-linux) runs a command on a terminal");
    let shown = text(&o.stdout);
    assert_eq!(o.status.code(), Some(76), "{shown}");
    assert!(
        shown.contains("\rrunlease: waiting ") || shown.contains("\r\x1b[Krunlease: waiting "),
        "{shown:?}"
    );
    signal(holder.id(), Signal::TERM);
    assert_eq!(
        wait_exit(&mut holder, Duration::from_secs(10)).code(),
        Some(128 + 15)
    );
    // `--wait` with no value waits forever; on a free run it just runs.
    let o = runlease(&["run", d, "--wait", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
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

#[test]
fn usage_errors_exit_64_and_help_lists_exit_codes() {
    assert_eq!(runlease(&["frobnicate"]).status.code(), Some(64));
    assert_eq!(runlease(&[]).status.code(), Some(64));
    assert_eq!(runlease(&["status"]).status.code(), Some(64));
    assert_eq!(runlease(&["run", "x"]).status.code(), Some(64));
    // A timing policy whose stale_after - self_fence_after margin is too small for the
    // watchdog to confirm the kill in time: usage, and nothing is created.
    let tmp = tempfile::tempdir().unwrap();
    let unsafe_dir = tmp.path().join("never-created");
    let o = runlease(&[
        "run",
        unsafe_dir.to_str().unwrap(),
        "--heartbeat",
        "100",
        "--self-fence-after",
        "850",
        "--stale-after",
        "1000",
        "--",
        "true",
    ]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("unsafe timing"),
        "{}",
        text(&o.stderr)
    );
    assert!(!unsafe_dir.exists());
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
    for code in ["0 ", "1 ", "64", "65", "69", "70", "74", "75", "76", "77"] {
        assert!(
            h.contains(&format!("\n  {code}")),
            "help lacks exit code {code}"
        );
    }
    assert!(h.contains("runlease run ./demo-run --"));
    for sub in [
        "run", "init", "status", "takeover", "retire", "release", "append", "events", "verify",
        "doctor", "prune", "list",
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

#[test]
fn run_opts_in_to_retire_a_dead_owner_or_take_over_a_stale_one() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    // Dead (SIGKILLed, its command killed too): --retire-dead retires it and owns the run.
    let pidfile = tmp.path().join("child.pid");
    let script = format!("echo $$ > '{}'; exec sleep 30", pidfile.display());
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat());
    let child = read_pid(&pidfile);
    signal(owner.id(), Signal::KILL);
    owner.wait().unwrap();
    signal(child, Signal::KILL);
    wait_for_state(&dir, "dead", Duration::from_secs(10));
    let o = runlease(&["run", d, "--retire-dead", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("retired dead owner"),
        "{}",
        text(&o.stderr)
    );

    // Stale (SIGSTOPped): without the flag 76, with --takeover-stale it watches the record
    // unchanged for the owner's stale_after, takes over and runs; the old owner is fenced.
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sleep", "30"]].concat());
    wait_for_state(&dir, "active", Duration::from_secs(10));
    signal(owner.id(), Signal::STOP);
    wait_for_state(&dir, "stale", Duration::from_secs(10));
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("--takeover-stale"),
        "{}",
        text(&o.stderr)
    );
    // A stopped owner on this host still holds the kernel owner lock (and the store):
    // --takeover-stale alone is refused (76) and says how to unwedge it.
    let o = runlease(&["run", d, "--takeover-stale", "--", "true"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains(&format!("kill -CONT {}", owner.id())),
        "{}",
        text(&o.stderr)
    );
    // With --wait it takes over as soon as the stopped owner is resumed (it fences itself,
    // kills its command and exits 75, writing nothing): the head it left is unchanged,
    // watched for the owner's stale_after, then taken over automatically.
    let taker = spawn(&[
        "run",
        "--json",
        d,
        "--takeover-stale",
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        "echo in=$RUNLEASE_GENERATION",
    ]);
    std::thread::sleep(Duration::from_millis(500));
    signal(owner.id(), Signal::CONT);
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(15)).code(),
        Some(75)
    );
    let o = taker.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let owned = &json_lines(&o)[0];
    assert!(
        owned["how"]
            .as_str()
            .unwrap()
            .starts_with("took over from stale owner"),
        "{owned}"
    );
    assert!(text(&o.stdout).contains(&format!("in={}", owned["generation"])));
    assert_eq!(status_json(&dir)["state"], "free");
}

/// The main gain of `run` on lease-run: after `kill -9` of `runlease run`, its command
/// runs on only until the next `runlease run --retire-dead` on this boot, which kills it
/// (through its durable command record) before starting its own; `run.json` says how
/// each run ended, and `status` and `doctor` show it.
#[test]
fn retire_dead_after_kill9_reaps_the_old_command_and_run_json_says_how_runs_ended() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let pidfile = tmp.path().join("child.pid");
    let script = format!("echo $$ > '{}'; exec sleep 600", pidfile.display());
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat());
    wait_for_state(&dir, "active", Duration::from_secs(10));
    let child = read_pid(&pidfile);
    let s = status_json(&dir);
    assert_eq!(s["run_status"]["status"], "running", "{s}");
    assert_eq!(s["run_status"]["generation"], s["generation"], "{s}");
    // Its record is in commands/ while it runs.
    let records = std::fs::read_dir(dir.join("commands")).unwrap().count();
    assert_eq!(records, 1);

    signal(owner.id(), Signal::KILL);
    owner.wait().unwrap();
    wait_for_state(&dir, "dead", Duration::from_secs(10));
    assert!(alive(child), "the command died with its owner");
    // After the crash run.json still says running: the last record written.
    assert_eq!(status_json(&dir)["run_status"]["status"], "running");

    let o = runlease(&["run", d, "--retire-dead", "--", "sh", "-c", "exit 7"]);
    assert_eq!(o.status.code(), Some(7), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("retired dead owner"),
        "{}",
        text(&o.stderr)
    );
    wait_gone(
        child,
        Duration::from_secs(5),
        "the killed run's command survived the next run",
    );
    assert_eq!(std::fs::read_dir(dir.join("commands")).unwrap().count(), 0);
    let s = status_json(&dir);
    assert_eq!(s["state"], "free");
    assert_eq!(s["run_status"]["status"], "failed", "{s}");
    assert_eq!(
        s["run_status"]["detail"], "the command exited with code 7",
        "{s}"
    );
    assert_eq!(s["run_status"]["sealed_sequence"], 0, "{s}");
    let o = runlease(&["run", d, "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(o.status.code(), Some(128 + 9));
    let s = status_json(&dir);
    assert_eq!(
        s["run_status"]["detail"], "the command was killed by signal 9",
        "{s}"
    );
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(0));
    let s = status_json(&dir);
    assert_eq!(s["run_status"]["status"], "done", "{s}");
    assert!(s["run_status"]["detail"].is_null(), "{s}");
    let human = text(&runlease(&["status", d]).stdout);
    assert!(human.contains("run.json   done (generation"), "{human}");

    // A run.json edited by hand: reported by status and doctor (65), refused by run (65),
    // never rewritten.
    std::fs::write(dir.join("run.json"), b"{not json").unwrap();
    let s = status_json(&dir);
    assert_eq!(s["run_status"]["status"], "invalid", "{s}");
    assert!(
        s["run_status"]["detail"]
            .as_str()
            .unwrap()
            .contains("run.json"),
        "{s}"
    );
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(65));
    assert!(
        json_lines(&o)
            .iter()
            .any(|f| f["code"] == "INVALID_RECORD"
                && f["detail"].as_str().unwrap().contains("run.json")),
        "{}",
        text(&o.stdout)
    );
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("run.json"), "{}", text(&o.stderr));
    assert_eq!(std::fs::read(dir.join("run.json")).unwrap(), b"{not json");
}

/// A signal that arrives while `run` opens the run (here: while it reaps a killed run's
/// command that ignores SIGTERM, which takes the 2 s grace) starts nothing: the run is
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
    signal(owner.id(), Signal::KILL);
    owner.wait().unwrap();
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

/// A log that ends before the finalized cutoff of a killed owner (its tail deleted, as a
/// power loss can do to an unacknowledged event) is a verify `short_tail` and a doctor
/// `EVENT_LOG_SHORT` warning, not an error; nothing is changed on disk.
#[test]
fn verify_and_doctor_report_a_log_shorter_than_a_finalized_cutoff() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let pidfile = tmp.path().join("child.pid");
    let script = format!(
        r#"runlease append "$RUNLEASE_RUN" --type a && runlease append "$RUNLEASE_RUN" --type b && echo $$ > '{}' && exec sleep 600"#,
        pidfile.display()
    );
    let mut owner = spawn(&["run", d, "--", "sh", "-c", &script]);
    let child = read_pid(&pidfile);
    signal(owner.id(), Signal::KILL);
    owner.wait().unwrap();
    signal(child, Signal::KILL);
    wait_for_state(&dir, "dead", Duration::from_secs(10));
    let o = runlease(&["retire", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v = json_lines(&runlease(&["verify", "--json", d]));
    assert_eq!(v[0]["short_tail"], serde_json::Value::Null, "{v:?}");

    // Delete the log's tail (event 2); the cutoff of generation 1 still says "through 2".
    let tail = lease_core::FileRef::Event(lease_core::Sequence::new(2).unwrap()).path();
    std::fs::remove_file(dir.join(&tail)).unwrap();
    let before = tree(&dir);
    let o = runlease(&["verify", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v = json_lines(&o);
    assert_eq!(
        v[0]["short_tail"],
        serde_json::json!({"named": 2, "by_cutoff_of": 1, "tail": 1}),
        "{v:?}"
    );
    let human = text(&runlease(&["verify", d]).stdout);
    assert!(
        human.contains("the event log ends at sequence 1 but the finalized cutoff of generation 1 names events through 2"),
        "{human}"
    );
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "a short tail is a warning");
    let f = json_lines(&o);
    assert!(
        f.iter()
            .any(|f| f["code"] == "EVENT_LOG_SHORT" && f["severity"] == "warning"),
        "{f:?}"
    );
    assert_eq!(tree(&dir), before, "verify and doctor changed the run");
}

/// Doctor reports the store writing nothing: a sealed store that is gone (`STORE_MISSING`,
/// from the chain), and a foreign store copied in, judged read-only against the seal as
/// `run` judges it before claiming. Each is an error (65) and changes nothing.
#[test]
fn doctor_reports_a_missing_or_foreign_store_writing_nothing() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let store = dir.join(lease_core::layout::STORE_FILE);
    std::fs::remove_file(&store).unwrap();

    // Gone: found from the chain's seal, before any run tried.
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stdout));
    let f = json_lines(&o);
    let missing: Vec<_> = f.iter().filter(|f| f["code"] == "STORE_MISSING").collect();
    assert_eq!(missing.len(), 1, "{f:?}");
    let detail = missing[0]["detail"].as_str().unwrap();
    assert!(
        detail.contains("store/run.sqlite is missing") && detail.contains("sealed at sequence"),
        "{detail}"
    );
    // `run` refuses it with the same code; doctor still says it once.
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    assert_eq!(json_lines(&o)[0]["code"], "STORE_MISSING");
    let f = json_lines(&runlease(&["doctor", "--json", d]));
    assert_eq!(
        f.iter().filter(|f| f["code"] == "STORE_MISSING").count(),
        1,
        "{f:?}"
    );
    // status: free, but its next step is doctor, not "claim it".
    let st = status_json(&dir);
    assert_eq!(st["state"], "free");
    assert!(
        st["next_step"]
            .as_str()
            .unwrap()
            .starts_with(&format!("runlease doctor -- {d}")),
        "{st}"
    );

    // Another run's store copied in: `run` refuses it before claiming (issue #28: read
    // without writing, against the seal), and doctor, judging it the same way, reports it.
    let (_tmp2, other) = scratch();
    let od = other.to_str().unwrap();
    assert_eq!(runlease(&["run", od, "--", "true"]).status.code(), Some(0));
    std::fs::copy(other.join(lease_core::layout::STORE_FILE), &store).unwrap();
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    let code = json_lines(&o)[0]["code"].as_str().unwrap().to_string();
    assert!(
        ["STORE_IDENTITY_MISMATCH", "STORE_CORRUPT"].contains(&code.as_str()),
        "{code}"
    );
    let before = tree(&dir);
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(65));
    let f = json_lines(&o);
    let found: Vec<_> = f.iter().filter(|f| f["code"] == code.as_str()).collect();
    assert_eq!(found.len(), 1, "{f:?}");
    assert_eq!(found[0]["severity"], "error");
    assert!(
        found[0]["detail"].as_str().unwrap().contains("run.sqlite"),
        "{found:?}"
    );
    assert_eq!(tree(&dir), before, "doctor changed the run");
}

/// A hand-broken run.json: status names it and sends the operator to doctor (not "claim
/// it"), `run` refuses (65) naming the file, doctor reports it, and nothing is repaired.
#[test]
fn a_hand_broken_run_json_is_reported_by_status_run_and_doctor_and_kept() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(0));
    std::fs::write(dir.join("run.json"), b"{bad").unwrap();
    let before = tree(&dir);
    let st = status_json(&dir);
    assert_eq!(st["run_status"]["status"], "invalid", "{st}");
    assert!(
        st["next_step"]
            .as_str()
            .unwrap()
            .starts_with(&format!("runlease doctor -- {d}")),
        "{st}"
    );
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("run.json") && err.contains("RECORD_INVALID"),
        "{err}"
    );
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(65));
    assert!(
        json_lines(&o)
            .iter()
            .any(|f| f["code"] == "INVALID_RECORD"
                && f["detail"].as_str().unwrap().contains("run.json")),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(
        tree(&dir),
        before,
        "run.json was repaired or the run changed"
    );
}
