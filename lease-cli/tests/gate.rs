//! Issue #28: one admission rule for every writer, and `status`/`doctor` naming only a next
//! step that rule accepts.

mod common;

use common::*;
use rustix::process::Signal;
use std::time::Duration;

/// The rolled-back chain of issue #28, as it was reported: an owner's late append was
/// answered 75 (`FENCED`, "event 2 does not count"); a later owner ran and appended
/// nothing; then `lease/` was restored from a copy taken while the first owner was active,
/// keeping `events/` and `run.json`. `retire` re-issued generation 2 with a cutoff through
/// event 2, and `takeover --yes` did the same: the event its writer was told does not count
/// counted for good (I4). Every writer must refuse it (65, `CHAIN_BROKEN`, nothing written)
/// and `status` must not name a replacement.
// PROTOCOL §8, I4 and I7.
#[test]
fn a_replacement_on_a_rolled_back_chain_is_refused_by_every_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let d = run.to_str().unwrap();
    let (ready, go, rc) = (
        tmp.path().join("ready"),
        tmp.path().join("go"),
        tmp.path().join("rc"),
    );
    let script = format!(
        r#"runlease append "$RUNLEASE_RUN" --type first >/dev/null || exit 9
touch '{ready}'
while [ ! -e '{go}' ]; do sleep 0.05; done
runlease append "$RUNLEASE_RUN" --type late >/dev/null 2>&1
echo $? > '{rc}.tmp' && mv '{rc}.tmp' '{rc}'"#,
        ready = ready.display(),
        go = go.display(),
        rc = rc.display()
    );
    let mut args = vec!["run", d];
    args.extend(FAST);
    args.extend(["--", "sh", "-c", &script]);
    let mut owner = spawn(&args);
    wait_for_file(&ready, Duration::from_secs(20), "the first append");
    // The copy of lease/ taken while generation 1 is active.
    let snapshot = tmp.path().join("lease-copy");
    copy_tree(&run.join("lease"), &snapshot);
    // Generation 1's owner stops; an operator takes it over (generation 2) and releases (3).
    // Its guard is killed first (else it kills the command by the self-fence deadline,
    // issue #31): the scenario is the stopped owner's command running on to append late.
    kill_guard(owner.id());
    signal(owner.id(), Signal::STOP);
    let o = runlease(&["takeover", d, "--yes"]);
    assert_eq!(o.status.code(), Some(0), "takeover: {}", text(&o.stderr));
    signal(owner.id(), Signal::KILL);
    let _ = owner.wait();
    // The fenced command's late append: answered FENCED (75), it does not count.
    std::fs::write(&go, b"").unwrap();
    wait_for_file(&rc, Duration::from_secs(20), "the late append");
    assert_eq!(std::fs::read_to_string(&rc).unwrap().trim(), "75");
    // A later owner runs and appends nothing (generation 4, released as 5).
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "later run: {}", text(&o.stderr));
    // lease/ restored from the copy; events/ and run.json kept.
    std::fs::remove_dir_all(run.join("lease")).unwrap();
    copy_tree(&snapshot, &run.join("lease"));

    let before = tree(tmp.path());
    // status names the repair, never a replacement.
    let s = status_json(&run);
    let argv: Vec<&str> = s["next_step_argv"]
        .as_array()
        .map(|a| a.iter().map(|v| v.as_str().unwrap()).collect())
        .unwrap_or_default();
    assert!(
        !argv.contains(&"retire") && !argv.contains(&"takeover") && !argv.contains(&"run"),
        "status names a replacement on a rolled-back chain: {s}"
    );
    assert!(
        s["next_step"].as_str().unwrap().contains("doctor"),
        "status does not send to doctor: {s}"
    );
    // Every writer refuses with one code, and nothing is written.
    for args in [
        vec!["retire", d],
        vec!["takeover", d, "--yes"],
        vec!["run", d, "--retire-dead", "--", "true"],
        vec!["run", d, "--takeover-stale", "--", "true"],
        vec!["run", d, "--", "true"],
        // prune changes no owner, but would fold the rolled-back chain's cutoffs into a
        // checkpoint and remove what shows what happened; events would show the FENCED
        // event as `counts`, and verify would call the run ok.
        vec!["prune", d],
        vec!["events", d],
        vec!["verify", d],
    ] {
        let o = runlease(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{args:?}: {err}");
        assert!(
            err.contains("CHAIN_BROKEN") && err.contains("run.json"),
            "{args:?}: {err}"
        );
        assert_eq!(tree(tmp.path()), before, "{args:?} wrote to the run");
    }
    // doctor reports it as an error (65) with the repair.
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stdout));
    let f = json_lines(&o);
    assert!(
        f.iter().any(|f| f["code"] == "BROKEN_CHAIN"),
        "doctor: {f:?}"
    );
    assert_eq!(
        tree(tmp.path()),
        before,
        "status or doctor wrote to the run"
    );
}

/// The newest event written by a generation above the chain's head is rollback evidence
/// too, when `run.json` and the store say nothing (both gone): the chain cannot have
/// handed that generation out. Every writer refuses (65), `status` sends to doctor.
// PROTOCOL §8, I2 and I4.
#[test]
fn an_event_above_the_head_refuses_every_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let d = run.to_str().unwrap();
    let o = runlease(&["run", d, "--", "true"]); // generation 1, released as 2
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let snapshot = tmp.path().join("lease-copy");
    copy_tree(&run.join("lease"), &snapshot);
    let o = runlease(&[
        "run",
        d,
        "--",
        "sh",
        "-c",
        r#"runlease append "$RUNLEASE_RUN" --type step >/dev/null"#,
    ]); // generation 3 appends event 1, released as 4
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    std::fs::remove_dir_all(run.join("lease")).unwrap();
    copy_tree(&snapshot, &run.join("lease"));
    std::fs::remove_file(run.join("run.json")).unwrap();
    // The store is moved out too, so only the event can tell (the store's commits of
    // generation 3 are evidence of their own).
    std::fs::remove_dir_all(run.join("store")).unwrap();
    let before = tree(tmp.path());
    let s = status_json(&run);
    assert!(
        s["next_step"].as_str().unwrap().contains("doctor"),
        "status: {s}"
    );
    for args in [
        vec!["run", d, "--", "true"],
        vec!["run", d, "--retire-dead", "--", "true"],
    ] {
        let o = runlease(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{args:?}: {err}");
        assert!(err.contains("CHAIN_BROKEN"), "{args:?}: {err}");
        assert_eq!(tree(tmp.path()), before, "{args:?} wrote to the run");
    }
}

/// What `run` refuses in the run layer's own entries (a symlinked `store/`, `work/`,
/// `tmp/` or `owner.lock`; a FIFO at `owner.lock`; an event file of another user),
/// `status` and `doctor` report, and `status` names no claim (issue #28: they said "free,
/// claim it" and OK). One code per condition, whichever subcommand meets it; nothing is
/// written by any of them.
#[test]
fn status_and_doctor_report_what_run_refuses_in_the_run_layers_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("file"), b"").unwrap();
    let mut cases: Vec<(&str, u8)> = vec![
        ("store", 65),
        ("work", 65),
        ("tmp", 65),
        ("owner.lock", 65),
        ("fifo owner.lock", 65),
    ];
    // An event of another user: only root can make one.
    let root = rustix::process::geteuid().is_root();
    if root {
        cases.push(("foreign event", 77));
    }
    for (case, want) in cases {
        let run = tmp.path().join(format!("run-{}", case.replace(' ', "-")));
        let d = run.to_str().unwrap();
        let o = runlease(&[
            "run",
            d,
            "--",
            "sh",
            "-c",
            r#"runlease append "$RUNLEASE_RUN" --type step >/dev/null"#,
        ]);
        assert_eq!(o.status.code(), Some(0), "{case}: {}", text(&o.stderr));
        match case {
            "fifo owner.lock" => {
                std::fs::remove_file(run.join("owner.lock")).unwrap();
                mkfifo(&run.join("owner.lock"));
            }
            "foreign event" => {
                let ev = run.join("events").join(format!("{:020}.json", 1));
                std::os::unix::fs::chown(&ev, Some(12345), Some(12345)).unwrap();
            }
            name => {
                let p = run.join(name);
                let target = if name == "owner.lock" {
                    outside.join("file")
                } else {
                    outside.clone()
                };
                if p.is_dir() {
                    std::fs::remove_dir_all(&p).unwrap();
                } else {
                    let _ = std::fs::remove_file(&p);
                }
                std::os::unix::fs::symlink(&target, &p).unwrap();
            }
        }
        let before = tree_sig(tmp.path());
        let o = runlease(&["run", d, "--", "true"]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(i32::from(want)), "{case}: run: {err}");
        let code = err
            .strip_prefix("runlease: ")
            .and_then(|e| e.split(':').next())
            .unwrap_or_default()
            .to_string();
        let s = status_json(&run);
        assert!(
            s["next_step"]
                .as_str()
                .unwrap_or_default()
                .contains("doctor"),
            "{case}: status names no repair for what run refuses ({code}): {s}"
        );
        let o = runlease(&["doctor", "--json", d]);
        let f = json_lines(&o);
        assert_eq!(o.status.code(), Some(65), "{case}: doctor: {f:?}");
        assert!(
            f.iter().any(|f| f["severity"] == "error"
                && f["detail"].as_str().unwrap_or_default().contains(&code)),
            "{case}: doctor does not report {code}: {f:?}"
        );
        // retire has nothing to replace (the run is free): it says so, whatever else.
        assert_eq!(
            tree_sig(tmp.path()),
            before,
            "{case}: something was written"
        );
    }
}

/// `verify` refuses what every writer refuses in the folder's layout (issue #28: it said ok
/// for a folder in `lease/intents/`, a FIFO named like a command record, `lease/intents` a
/// file), with the writers' code, and writes nothing.
#[test]
fn verify_refuses_the_layout_every_writer_refuses() {
    let tmp = tempfile::tempdir().unwrap();
    for case in ["folder in intents", "fifo in commands", "intents a file"] {
        let run = tmp.path().join(case.replace(' ', "-"));
        let d = run.to_str().unwrap();
        let o = runlease(&["run", d, "--", "true"]);
        assert_eq!(o.status.code(), Some(0), "{case}: {}", text(&o.stderr));
        match case {
            "folder in intents" => std::fs::create_dir(
                run.join("lease/intents/00000000000000000003-00000000000000aa.json"),
            )
            .unwrap(),
            "fifo in commands" => mkfifo(&run.join("commands/00000000000000000001-4242.json")),
            _ => {
                std::fs::remove_dir(run.join("lease/intents")).unwrap();
                std::fs::write(run.join("lease/intents"), b"").unwrap();
            }
        }
        let before = tree_sig(tmp.path());
        let o = runlease(&["run", d, "--", "true"]);
        let run_err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{case}: run: {run_err}");
        let o = runlease(&["verify", d]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{case}: verify: {err}");
        let code = |e: &str| e.split(':').nth(1).unwrap_or_default().trim().to_string();
        assert_eq!(code(&err), code(&run_err), "{case}: {err} / {run_err}");
        assert_eq!(
            tree_sig(tmp.path()),
            before,
            "{case}: something was written"
        );
    }
}

/// A stray carrying a record's name in `lease/epochs/` (a folder, FIFO or symlink): `status`
/// and `doctor` printed only an error object (issue #28). Now `status` says `invalid` with
/// the refusal's code, names doctor and no replacement; doctor reports it as a finding with
/// its repair; `run` refuses with the same code; nothing is written.
#[test]
fn a_stray_named_like_an_epoch_is_a_state_a_finding_and_one_code() {
    let tmp = tempfile::tempdir().unwrap();
    for kind in ["folder", "fifo", "symlink"] {
        let run = tmp.path().join(kind);
        let d = run.to_str().unwrap();
        let o = runlease(&["run", d, "--", "true"]);
        assert_eq!(o.status.code(), Some(0), "{kind}: {}", text(&o.stderr));
        let stray = epoch_file(&run, 3);
        match kind {
            "folder" => std::fs::create_dir(&stray).unwrap(),
            "fifo" => mkfifo(&stray),
            _ => std::os::unix::fs::symlink(epoch_file(&run, 2), &stray).unwrap(),
        }
        let before = tree_sig(tmp.path());
        let o = runlease(&["status", "--json", d]);
        assert_eq!(o.status.code(), Some(0), "{kind}: {}", text(&o.stdout));
        let s = &json_lines(&o)[0];
        assert_eq!(s["state"], "invalid", "{kind}: {s}");
        assert_eq!(s["error"]["code"], "RUN_LAYOUT_INVALID", "{kind}: {s}");
        assert_eq!(s["next_step_argv"][1], "doctor", "{kind}: {s}");
        let o = runlease(&["doctor", "--json", d]);
        assert_eq!(o.status.code(), Some(65), "{kind}");
        let f = json_lines(&o);
        assert!(
            f.iter().any(|f| f["severity"] == "error"
                && f["detail"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("RUN_LAYOUT_INVALID")),
            "{kind}: {f:?}"
        );
        let o = runlease(&["run", d, "--", "true"]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(65), "{kind}: {err}");
        assert!(err.contains("RUN_LAYOUT_INVALID"), "{kind}: {err}");
        assert_eq!(
            tree_sig(tmp.path()),
            before,
            "{kind}: something was written"
        );
    }
}

/// A FIFO at `store/run.sqlite-wal`: `run` claimed, ran the command and failed its release
/// with `STORE_IO` (74), leaving the run dead (issue #28). The store's files are judged
/// before the claim now: `STORE_CORRUPT` (65) naming the log, nothing written, and `status`
/// and `doctor` say the same.
#[test]
fn a_fifo_write_ahead_log_is_refused_before_the_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let d = run.to_str().unwrap();
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    mkfifo(&run.join("store/run.sqlite-wal"));
    let before = tree_sig(tmp.path());
    let marker = tmp.path().join("ran");
    let script = format!("touch '{}'", marker.display());
    let o = runlease(&["run", d, "--", "sh", "-c", &script]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(65), "{err}");
    assert!(
        err.contains("STORE_CORRUPT") && err.contains("run.sqlite-wal"),
        "{err}"
    );
    assert!(!marker.exists(), "the command ran");
    let s = status_json(&run);
    assert_eq!(s["state"], "free", "{s}");
    assert_eq!(s["next_step_argv"][1], "doctor", "{s}");
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(65));
    assert!(
        json_lines(&o).iter().any(|f| f["code"] == "STORE_CORRUPT"),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(tree_sig(tmp.path()), before, "something was written");
}

/// The same on a run that never opened a store (laid out by `init`): no store file, so the
/// store itself cannot be read, but the log's name is judged before the claim all the same
/// (the gate test found the owner's open refusing it only after the claim).
#[test]
fn a_fifo_write_ahead_log_without_a_store_is_refused_before_the_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let d = run.to_str().unwrap();
    let o = runlease(&["init", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    mkfifo(&run.join("store/run.sqlite-wal"));
    let before = tree_sig(tmp.path());
    let o = runlease(&["run", d, "--", "true"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(65), "{err}");
    assert!(
        err.contains("STORE_CORRUPT") && err.contains("run.sqlite-wal"),
        "{err}"
    );
    assert_eq!(status_json(&run)["next_step_argv"][1], "doctor");
    assert_eq!(tree_sig(tmp.path()), before, "something was written");
}

/// A refusal creates no file at all, not even `owner.lock` (issue #28): a `run` refused
/// before its claim removes the lock file its lock step created (while still holding it),
/// and a `retire` of a run with nothing to retire does not create one.
#[test]
fn a_refusal_leaves_no_owner_lock_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let d = run.to_str().unwrap();
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    std::fs::remove_file(run.join("owner.lock")).unwrap();
    let before = tree_sig(tmp.path());
    let o = runlease(&["retire", d]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
    assert_eq!(tree_sig(tmp.path()), before, "retire of a free run wrote");
    std::fs::create_dir(epoch_file(&run, 5)).unwrap();
    let before = tree_sig(tmp.path());
    for args in [
        vec!["run", d, "--", "true"],
        vec!["run", d, "--retire-dead", "--", "true"],
        vec!["retire", d],
        vec!["takeover", d, "--yes"],
    ] {
        let o = runlease(&args);
        assert_ne!(o.status.code(), Some(0), "{args:?}");
        assert!(!run.join("owner.lock").exists(), "{args:?} left owner.lock");
        assert_eq!(tree_sig(tmp.path()), before, "{args:?} wrote");
    }
    // The lock still works: once the stray is gone the run claims and the file is made.
    std::fs::remove_dir(epoch_file(&run, 5)).unwrap();
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(run.join("owner.lock").is_file());
}
