//! Hostile input: a run folder that is a symlink, records edited by hand, run ids that try
//! to climb out (`..`). Every subcommand that would act exits 65 (data) or 64 (usage) with
//! ONE line on stderr naming the file, and nothing on disk changes (a snapshot of the
//! whole temp folder, symlinks recorded and never followed, is compared before/after).

mod common;

use common::*;
use std::path::Path;

/// A run with one released generation (epochs 1 and 2) and one event.
fn used_run(dir: &Path) -> (String, String) {
    let o = runlease(&[
        "run",
        "--json",
        dir.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        r#"runlease append "$RUNLEASE_RUN" --type step --payload '{"n":1}' >/dev/null"#,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let owned = &json_lines(&o)[0];
    (
        owned["generation"].to_string(),
        owned["owner_id"].as_str().unwrap().to_string(),
    )
}

/// Run `args`; assert the exit code and one stderr line `runlease: CODE: ...` that
/// mentions every string in `names`.
fn refused(args: &[&str], exit: i32, code: &str, names: &[&str]) {
    let o = runlease(args);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(exit), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
    assert!(
        err.starts_with(&format!("runlease: {code}: ")),
        "{args:?}: {err}"
    );
    for n in names {
        assert!(err.contains(n), "{args:?}: does not name {n}: {err}");
    }
}

/// Every subcommand that takes one RUN_DIR, as argument lists (the token ones with `tok`).
fn every_subcommand<'a>(d: &'a str, g: &'a str, owner: &'a str) -> Vec<Vec<&'a str>> {
    vec![
        vec!["run", d, "--", "true"],
        vec!["run", d, "--retire-dead", "--takeover-stale", "--", "true"],
        vec!["takeover", d, "--yes"],
        vec!["retire", d],
        vec![
            "append",
            d,
            "--type",
            "x",
            "--generation",
            g,
            "--owner",
            owner,
        ],
        vec!["release", d, "--generation", g, "--owner", owner],
        vec!["verify", d],
        vec!["events", d],
        vec!["prune", d, "--keep", "2"],
    ]
}

#[test]
fn a_symlinked_run_folder_is_refused_by_every_subcommand_and_nothing_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("real");
    let (g, owner) = used_run(&real);
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let l = link.to_str().unwrap();
    let before = tree(tmp.path());
    let mut cmds = every_subcommand(l, &g, &owner);
    cmds.push(vec!["status", l]);
    cmds.push(vec!["doctor", l]);
    for args in cmds {
        refused(&args, 65, "RUN_LAYOUT_INVALID", &[l, "symlink"]);
    }
    assert_eq!(tree(tmp.path()), before, "something changed on disk");
}

#[test]
fn a_symlink_inside_the_run_is_refused_and_nothing_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    used_run(&run);
    // Replace events/ by a symlink to a copy elsewhere.
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::rename(run.join("events"), &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, run.join("events")).unwrap();
    let d = run.to_str().unwrap();
    let before = tree(tmp.path());
    for args in [
        vec!["verify", d],
        vec!["events", d],
        vec!["run", d, "--", "true"],
    ] {
        refused(&args, 65, "RUN_LAYOUT_INVALID", &["events"]);
    }
    assert_eq!(tree(tmp.path()), before, "something changed on disk");
}

#[test]
fn a_record_edited_by_hand_is_refused_naming_the_file_and_nothing_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let (g, owner) = used_run(&run);
    let d = run.to_str().unwrap();
    // An editor's trailing newline on the head epoch: no longer the canonical form.
    let head = epoch_file(&run, 2);
    let mut bytes = std::fs::read(&head).unwrap();
    bytes.push(b'\n');
    std::fs::write(&head, bytes).unwrap();
    let file = "lease/epochs/00000000000000000002.json";
    let before = tree(tmp.path());
    for args in every_subcommand(d, &g, &owner) {
        if args[0] == "events" {
            continue; // reads the event log only (the head epoch is not needed)
        }
        refused(&args, 65, "RECORD_INVALID", &[file]);
    }
    // status reports it as a state (exit 0), naming the file and the next step.
    let s = status_json(&run);
    assert_eq!(s["state"], "invalid");
    assert!(
        s["error"]["message"].as_str().unwrap().contains(file),
        "{s}"
    );
    assert!(s["next_step"].as_str().unwrap().contains("doctor"), "{s}");
    // doctor: exit 65 with an INVALID_RECORD finding naming the file.
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(65));
    let f = json_lines(&o);
    assert!(
        f.iter()
            .any(|f| f["code"] == "INVALID_RECORD" && f["detail"].as_str().unwrap().contains(file)),
        "{f:?}"
    );
    assert_eq!(tree(tmp.path()), before, "something changed on disk");

    // An event edited by hand (its payload changed): verify and events name it.
    let ev = run.join("events").join(format!("{:020}.json", 1));
    let s = std::fs::read_to_string(&ev).unwrap();
    assert!(s.contains(r#""n":1"#), "{s}");
    std::fs::write(&ev, s.replace(r#""n":1"#, r#""n":2"#)).unwrap();
    let before = tree(tmp.path());
    let o = runlease(&["verify", d]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    assert_eq!(text(&o.stderr).lines().count(), 1);
    assert!(
        text(&o.stderr).contains("events/00000000000000000001.json")
            || text(&o.stderr).contains("lease/epochs/"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(tree(tmp.path()), before, "something changed on disk");
}

#[test]
fn run_ids_that_climb_out_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let (g, owner) = used_run(&run);
    let d = run.to_str().unwrap();

    // A record whose run id was edited to climb out of the folder.
    let head = epoch_file(&run, 2);
    let s = std::fs::read_to_string(&head).unwrap();
    assert!(s.contains(r#""run_id":"run""#), "{s}");
    std::fs::write(
        &head,
        s.replace(r#""run_id":"run""#, r#""run_id":"../evil""#),
    )
    .unwrap();
    let before = tree(tmp.path());
    for args in every_subcommand(d, &g, &owner) {
        if args[0] == "events" {
            continue;
        }
        refused(
            &args,
            65,
            "RECORD_INVALID",
            &["lease/epochs/00000000000000000002.json"],
        );
    }
    assert_eq!(tree(tmp.path()), before, "something changed on disk");
    assert!(!tmp.path().join("evil").exists());

    // A run folder argument whose name is no run id: `..` resolving to `/`, a hidden name.
    refused(
        &["run", "/..", "--", "true"],
        64,
        "RUN_ID_INVALID",
        &["/.."],
    );
    refused(&["status", "/.."], 64, "RUN_ID_INVALID", &["/.."]);
    let hidden = tmp.path().join(".hidden");
    let h = hidden.to_str().unwrap();
    refused(&["run", h, "--", "true"], 64, "RUN_ID_INVALID", &[h]);
    assert!(
        !hidden.exists(),
        "a run folder with an invalid name was created"
    );
    assert_eq!(tree(tmp.path()), before, "something changed on disk");
}

/// Issue #15: text from records reaches a terminal. An event payload carrying an ANSI
/// escape, a bidirectional override (U+202E) and a line break is shown escaped by
/// `events`, never interpreted; `--json` keeps the data exactly.
#[test]
fn terminal_controls_in_records_are_shown_escaped_never_interpreted() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let evil = "\u{1b}[2J\u{202e}gnp.exe\u{9b}31m\rok";
    let o = cmd(&[
        "run",
        d,
        "--",
        "sh",
        "-c",
        r#"runlease append "$RUNLEASE_RUN" --type step --payload "$P" >/dev/null"#,
    ])
    .env("P", serde_json::json!({ "s": evil }).to_string())
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = runlease(&["events", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let shown = String::from_utf8(o.stdout.clone()).unwrap();
    for bad in ['\u{1b}', '\u{202e}', '\u{9b}', '\r'] {
        assert!(
            !shown.contains(bad),
            "{bad:?} reached the terminal: {shown:?}"
        );
    }
    assert!(shown.contains("\\u{202e}"), "{shown}");
    let o = runlease(&["events", "--json", d]);
    let lines = json_lines(&o);
    assert!(
        lines.iter().any(|l| l["payload"]["s"] == evil),
        "--json keeps the data: {lines:?}"
    );
}

/// Issue #15: `--payload` with a repeated key or an integer past 64 bits is a usage error
/// (64) and appends nothing, instead of being merged or rounded into the durable event.
#[test]
fn payloads_with_duplicate_keys_or_inexact_numbers_are_refused_and_append_nothing() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let script = r#"for p in '{"a":1,"a":2}' '{"n":18446744073709551616}' '{"n":1e300}'; do
        runlease append "$RUNLEASE_RUN" --type step --payload "$p" 2>>"$RUNLEASE_RUN/../err"
        echo "exit $?" >> "$RUNLEASE_RUN/../codes"
    done"#;
    let o = runlease(&["run", d, "--", "sh", "-c", script]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let codes = std::fs::read_to_string(dir.parent().unwrap().join("codes")).unwrap();
    assert_eq!(codes, "exit 64\nexit 64\nexit 64\n");
    let err = std::fs::read_to_string(dir.parent().unwrap().join("err")).unwrap();
    assert!(
        err.contains("appears twice") && err.contains("cannot be kept exactly"),
        "{err}"
    );
    let o = runlease(&["events", "--json", d]);
    assert!(
        json_lines(&o).is_empty(),
        "nothing appended: {}",
        text(&o.stdout)
    );
}

/// Issue #15: a command record forged to name a live bystander (its real pid, start time
/// and group) makes `runlease run` refuse before claiming (76, nothing written), names the
/// record and the process, never signals it; `doctor` reports it as COMMAND_UNPROVEN.
#[test]
fn a_forged_command_record_naming_a_bystander_is_refused_before_claiming_and_never_signalled() {
    use std::os::unix::fs::OpenOptionsExt as _;
    use std::os::unix::process::CommandExt as _;
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(0));
    let mut bystander = std::process::Command::new("sleep")
        .arg("60")
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = bystander.id();
    let start = lease_fs::probe::process_start_time(pid).unwrap().unwrap();
    let g1 = lease_core::Generation::new(1).unwrap();
    let rec = lease_core::CommandRecord {
        run_id: lease_core::RunId::new(dir.file_name().unwrap().to_str().unwrap()).unwrap(),
        generation: g1,
        pid,
        pgid: pid,
        start_time: start,
        boot_id: lease_core::Identity::new(lease_fs::probe::boot_id().unwrap()).unwrap(),
        argv: vec!["sleep".into(), "60".into()],
        started_at: lease_core::Timestamp::from_unix_millis(1_796_169_600_000).unwrap(),
        incarnation: None,
    };
    let f = lease_core::FileRef::Command {
        generation: g1,
        pid,
    }
    .path();
    std::fs::create_dir_all(dir.join("commands")).unwrap();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join(&f))
        .unwrap();
    std::io::Write::write_all(&mut file, &lease_core::encode(&rec).unwrap()).unwrap();
    let before = tree(&dir);
    for args in [
        vec!["run", d, "--", "true"],
        vec!["run", d, "--retire-dead", "--", "true"],
    ] {
        let o = runlease(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(76), "{args:?}: {err}");
        assert!(err.contains("RUN_COMMAND_UNPROVEN"), "{err}");
        assert!(err.contains(&f) && err.contains(&pid.to_string()), "{err}");
        assert_eq!(tree(&dir), before, "{args:?}: the refusal wrote something");
        assert!(alive(pid), "the bystander was signalled");
    }
    let o = runlease(&["doctor", "--json", d]);
    let report = text(&o.stdout);
    assert!(report.contains("COMMAND_UNPROVEN"), "{report}");
    bystander.kill().unwrap();
    bystander.wait().unwrap();
    // Once the process is gone the record is stale: the next run removes it and proceeds.
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(0));
    assert!(!dir.join(&f).exists());
}
