//! Replacing an owner: takeover of a stopped one, retire of a dead one, `run`'s opt-ins.

use crate::common::*;
use rustix::process::Signal;
use std::time::{Duration, Instant};

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

/// The main gain of `run` on lease-run: after a crash that takes `runlease run` and its
/// guard (`kill -9` of both; the owner alone is killed by its guard at once), its command
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

    crash_with_guard(&mut owner);
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
