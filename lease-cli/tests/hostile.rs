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
        cgroup: None,
        mark: None,
    };
    let f = lease_core::FileRef::Command {
        generation: g1,
        pid,
    }
    .path();
    plant_command_record(&dir, &rec);
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
    // `status` reports it too (human and JSON), and leaves it alone.
    let s = status_json(&dir);
    assert_eq!(s["unproven_commands"][0]["file"], f.as_str(), "{s}");
    assert_eq!(s["unproven_commands"][0]["pid"], pid, "{s}");
    let o = runlease(&["status", d]);
    let human = text(&o.stdout) + &text(&o.stderr);
    assert!(
        human.contains("unproven:") && human.contains(&f) && human.contains("remove the record"),
        "{human}"
    );
    assert_eq!(tree(&dir), before, "status wrote something");
    assert!(alive(pid), "the bystander was signalled");
    bystander.kill().unwrap();
    bystander.wait().unwrap();
    // Once the process is gone the record is stale: the next run removes it and proceeds.
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(0));
    assert!(!dir.join(&f).exists());
}

/// The shell script of [`a_reused_pid_in_a_private_pid_namespace_is_never_signalled`], run
/// as pid 1 of a private pid namespace (`$1` runlease, `$2` run folder, `$3` scratch).
const PID_REUSE_SCRIPT: &str = r#"
set -u
BIN=$1; R=$2; T=$3
"$BIN" run "$R" --heartbeat 100 --self-fence-after 500 --stale-after 1000 -- \
    sh -c 'echo $$ > "$0/child.pid"; exec sleep 600' "$T" >"$T/owner.out" 2>&1 &
OWNER=$!
i=0
while [ ! -s "$T/child.pid" ]; do
    sleep 0.05; i=$((i+1)); [ $i -lt 200 ] || { echo "NO_CHILD"; exit 90; }
done
P=$(cat "$T/child.pid")
# The crash: owner and command killed; both reaped (pid 1 of the namespace reaps orphans).
kill -9 "$OWNER" "$P"
wait
while [ -e "/proc/$P" ]; do wait; sleep 0.01; done
# The reuse: the kernel hands out P again, to an unrelated process group leader whose
# child is in its group (setsid does not fork: a background job is not a group leader).
echo $((P - 1)) > /proc/sys/kernel/ns_last_pid || { echo "NO_NS_LAST_PID"; exit 91; }
setsid sh -c 'sleep 600 & echo $! > "$0/grandchild.pid"; exec sleep 600' "$T" &
B=$!
[ "$B" = "$P" ] || { echo "NOT_REUSED $B $P"; exit 92; }
i=0
while [ ! -s "$T/grandchild.pid" ]; do sleep 0.01; i=$((i+1)); [ $i -lt 500 ] || exit 93; done
G=$(cat "$T/grandchild.pid")
PGID=$(cut -d' ' -f5 "/proc/$P/stat")
echo "REUSED pid=$P pgid=$PGID grandchild=$G"
"$BIN" run "$R" --retire-dead -- true >"$T/retire.out" 2>&1
echo "RETIRE_EXIT=$?"
sleep 0.3
kill -0 "$P" 2>/dev/null && echo "LEADER_ALIVE" || echo "LEADER_KILLED"
kill -0 "$G" 2>/dev/null && echo "GRANDCHILD_ALIVE" || echo "GRANDCHILD_KILLED"
kill -9 "$P" "$G" 2>/dev/null
exit 0
"#;

/// Issue #15, attack 2, with a real pid reuse: in a private pid namespace (`unshare -r -p
/// -f --mount-proc`; `ns_last_pid` makes the kernel hand out the very pid), an owner and its
/// command are `kill -9`ed, an unrelated process group takes the command's pid with a child
/// in its group, and `runlease run --retire-dead` must signal neither. Skipped, with the
/// reason printed, where unprivileged user and pid namespaces are not available.
#[test]
fn a_reused_pid_in_a_private_pid_namespace_is_never_signalled() {
    let probe = std::process::Command::new("unshare")
        .args(["-r", "-p", "-f", "--mount-proc", "sh", "-c"])
        .arg("echo $$ > /dev/null && echo 1 > /proc/sys/kernel/ns_last_pid")
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        let why = match &probe {
            Ok(o) => text(&o.stderr),
            Err(e) => e.to_string(),
        };
        println!("hostile: pid-reuse scenario SKIPPED (no private pid namespace: {why})");
        return;
    }
    let (tmp, dir) = scratch();
    let o = std::process::Command::new("unshare")
        .args([
            "-r",
            "-p",
            "-f",
            "--mount-proc",
            "sh",
            "-c",
            PID_REUSE_SCRIPT,
            "sh",
        ])
        .arg(BIN)
        .arg(&dir)
        .arg(tmp.path())
        .env("PATH", path_with_binary())
        .env_remove("RUNLEASE_RUN")
        .env_remove("RUNLEASE_GENERATION")
        .env_remove("RUNLEASE_OWNER")
        .env_remove("RUNLEASE_AUTHORITY")
        .output()
        .unwrap();
    let out = text(&o.stdout);
    let retire = std::fs::read_to_string(tmp.path().join("retire.out")).unwrap_or_default();
    assert!(
        o.status.success() && out.contains("REUSED pid="),
        "the scenario did not reach the reuse: {out}{}\nowner: {}",
        text(&o.stderr),
        std::fs::read_to_string(tmp.path().join("owner.out")).unwrap_or_default()
    );
    let reused = out.lines().find(|l| l.starts_with("REUSED")).unwrap();
    let killed =
        usize::from(out.contains("LEADER_KILLED")) + usize::from(out.contains("GRANDCHILD_KILLED"));
    println!(
        "hostile: pid-reuse in a private pid namespace ({reused}): bystanders killed={killed}"
    );
    println!("runlease run --retire-dead said: {retire}");
    assert!(
        out.contains("LEADER_ALIVE") && out.contains("GRANDCHILD_ALIVE"),
        "a bystander that reused the command's pid was signalled: {out}\n{retire}"
    );
    // The record cannot be proved to be that process: either it is known dead (the pid's
    // start time is not the recorded one) and the run proceeds, or it is refused (76) with
    // the record named. Never a kill.
    assert!(
        out.contains("RETIRE_EXIT=0") || out.contains("RETIRE_EXIT=76"),
        "{out}\n{retire}"
    );
    if out.contains("RETIRE_EXIT=76") {
        assert!(
            retire.contains("commands/"),
            "the refusal names the record: {retire}"
        );
    }
}

/// Another run's store copied into a new run (issue #18: a store is bound to its run):
/// `run` refuses it (65, the file untouched), `doctor` says to move it aside (the chain
/// names no store, so there is nothing to restore), and doing so lets the next `run` go.
#[test]
fn another_runs_store_is_refused_and_the_advice_to_move_it_aside_works() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, c) = (tmp.path().join("run-a"), tmp.path().join("run-c"));
    used_run(&a);
    assert_eq!(
        runlease(&["init", c.to_str().unwrap()]).status.code(),
        Some(0)
    );
    let store = c.join("store/run.sqlite");
    std::fs::copy(a.join("store/run.sqlite"), &store).unwrap();
    let before = std::fs::read(&store).unwrap();
    let o = runlease(&["run", c.to_str().unwrap(), "--", "true"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(
        err.contains("STORE_IDENTITY_MISMATCH") && err.contains("belongs to another run"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(&store).unwrap(),
        before,
        "the refused store was changed"
    );
    let d = runlease(&["doctor", "--json", c.to_str().unwrap()]);
    let lines = json_lines(&d);
    let finding = lines
        .iter()
        .find(|l| l["code"] == "STORE_IDENTITY_MISMATCH")
        .unwrap_or_else(|| panic!("{lines:?}"));
    let next = finding["next_step"].as_str().unwrap();
    assert!(
        next.starts_with("move ") && next.contains("store/run.sqlite"),
        "{next}"
    );
    // Follow it.
    std::fs::rename(&store, tmp.path().join("kept.sqlite")).unwrap();
    let o = runlease(&["run", c.to_str().unwrap(), "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}
