//! Issue #28: a next step is an argument vector first, and every command line `runlease`
//! suggests is written from that vector with POSIX shell quoting and `--` before the run
//! folder. So a record field or a path is never shell text: an owner id holding shell
//! metacharacters or a leading `-` is refused when the record is decoded
//! (`RECORD_INVALID` naming the file), and for odd but valid values and odd run folder
//! paths, `sh -c "$next_step"` runs exactly `next_step_argv`, and so does the human `next`
//! line pasted into bash. `--json` escapes C1 controls and bidi overrides.

mod common;

use common::*;
use lease_core::LeaseOps;
use lease_core::ops::ClaimParams;
use lease_core::{Holder, Identity, Timestamp, TimingPolicy};
use lease_fs::RunDir;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Owner ids a hostile writer of the run folder might put into a record.
const HOSTILE_OWNERS: [&str; 7] = [
    "$(touch PWNED)",
    "x; touch PWNED",
    "`touch PWNED`",
    "it's\"quoted\"",
    "-rf",
    "--expect-heartbeat=1",
    "a\u{202e}b",
];

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Lay out the run folder `dir` with `runlease init` (its path given after `--`).
fn init(dir: &Path) {
    let o = runlease(&["init", "--", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

/// Claim `dir` (laid out) as `owner` with `holder`, `ago_ms` in the past, with a short
/// stale_after: an owner that never beat, stale by the wall clock.
fn claim_as(dir: &Path, owner: &str, holder: Holder, ago_ms: u64) {
    let run = RunDir::open(dir).unwrap();
    run.claim(ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: Identity::new(owner).unwrap(),
        holder,
        policy: TimingPolicy::from_millis(100, 300, 1000, lease_core::HeartbeatDurability::Local)
            .unwrap(),
        now: Timestamp::from_unix_millis(now_ms() - ago_ms).unwrap(),
        store_floor: None,
    })
    .unwrap();
}

/// A holder on another host (never provably dead: a takeover is the step).
fn elsewhere(host: &str) -> Holder {
    Holder {
        host: Identity::new(host).unwrap(),
        boot_id: Identity::new("another-boot").unwrap(),
        pid: 4242,
        start_time: 1,
    }
}

/// A holder on this host and boot whose process has exited (provably dead: retire).
fn dead_here() -> Holder {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    Holder {
        pid,
        ..lease_fs::this_holder().unwrap()
    }
}

/// Rewrite field `key` of epoch `g` of `dir` to `value`, keeping the record canonical (a
/// hand edit by whoever can write the folder).
fn forge_epoch(dir: &Path, g: u64, key: &[&str], value: &str) {
    let file = epoch_file(dir, g);
    let mut v: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let mut at = &mut v;
    for k in &key[..key.len() - 1] {
        at = &mut at[*k];
    }
    at[key[key.len() - 1]] = Value::from(value);
    std::fs::write(&file, lease_core::canonical::canonical_value_bytes(&v)).unwrap();
}

/// The words `sh` (or `shell`) makes of `line`, each as it would reach a program: the
/// line's first word replaced by `printf '%s\0'`, so nothing but printing runs.
fn words_of(shell: &str, line: &str, cwd: &Path) -> Vec<String> {
    let rest = line
        .strip_prefix("runlease ")
        .unwrap_or_else(|| panic!("not a runlease command: {line:?}"));
    let o = Command::new(shell)
        .arg("-c")
        .arg(format!("printf '%s\\0' runlease {rest}"))
        .current_dir(cwd)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{shell} -c {line:?}: {}",
        text(&o.stderr)
    );
    let mut out: Vec<String> = String::from_utf8(o.stdout)
        .unwrap()
        .split('\0')
        .map(String::from)
        .collect();
    assert_eq!(out.pop().as_deref(), Some(""), "{line:?}");
    out
}

fn argv_of(s: &Value) -> Option<Vec<String>> {
    s["next_step_argv"]
        .as_array()
        .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
}

/// The command of the human `next` line of `runlease status DIR`.
fn human_next(dir: &Path) -> String {
    let o = runlease(&["status", "--", dir.to_str().unwrap()]);
    let out = text(&o.stdout);
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix("next"))
        .unwrap_or_else(|| panic!("no next line: {out}"))
        .trim_start()
        .to_string()
}

/// No file named PWNED anywhere below `root` (and in the test's own folder): what the
/// injected `touch PWNED` would have made (folders merely named after it are ours).
fn assert_not_pwned(root: &Path) {
    for (k, _) in tree(root) {
        assert!(
            Path::new(&k).file_name() != Some("PWNED".as_ref()),
            "injected command ran: {k}"
        );
    }
    assert!(!Path::new("PWNED").exists(), "injected command ran here");
}

/// A hand-edited head epoch whose owner id holds shell metacharacters, a leading `-` or a
/// bidi override: decoding refuses it (`RECORD_INVALID` naming the file), `status` still
/// prints a state and a next step naming the repair (doctor, which runs as given and
/// names the file), and nothing it suggests runs anything injected. Retire refuses too,
/// naming doctor as a command that works.
#[test]
fn hostile_owner_ids_are_refused_when_decoded_and_never_reach_a_command() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, owner) in HOSTILE_OWNERS.iter().enumerate() {
        for field in [&["owner_id"][..], &["holder", "host"][..]] {
            let dir = tmp.path().join(format!("run-{i}-{}", field.len()));
            let d = dir.to_str().unwrap();
            init(&dir);
            // Stale (claimed a minute ago on another host) before the edit: the step would
            // be a takeover naming the owner id.
            claim_as(&dir, "owner-1", elsewhere("host-a"), 60_000);
            forge_epoch(&dir, 1, field, owner);
            let s = status_json(&dir);
            assert_eq!(s["state"], "invalid", "{owner:?}: {s}");
            assert_eq!(s["error"]["code"], "RECORD_INVALID", "{s}");
            let msg = s["error"]["message"].as_str().unwrap();
            assert!(
                msg.contains("lease/epochs/00000000000000000001.json"),
                "names the file: {msg}"
            );
            let step = s["next_step"].as_str().unwrap();
            assert!(!step.contains(owner), "{step}");
            assert!(step.contains("doctor") || step.contains("repair"), "{step}");
            let argv = argv_of(&s).unwrap_or_else(|| panic!("doctor is a command: {s}"));
            assert_eq!(argv, ["runlease", "doctor", "--", d], "{s}");
            // The sentence's command is the vector, word for word.
            let cmd = step.split("; ").next().unwrap();
            assert_eq!(words_of("sh", cmd, tmp.path()), argv, "{step}");
            // And it runs: doctor reports the record (65) and names the file.
            let o = Command::new("sh")
                .arg("-c")
                .arg(cmd)
                .env("PATH", path_with_binary())
                .current_dir(tmp.path())
                .output()
                .unwrap();
            assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
            let out = text(&o.stdout);
            assert!(
                out.contains("INVALID_RECORD") && out.contains("00000000000000000001.json"),
                "{out}"
            );
            // The human next line is the same command, quoted for pasting.
            let human = human_next(&dir);
            assert!(human.starts_with(cmd), "{human:?} vs {cmd:?}");
            // Retire refuses, with a hint naming doctor as a command that works.
            let o = runlease(&["retire", "--", d]);
            assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
            let err = text(&o.stderr);
            assert!(
                err.contains("RECORD_INVALID") && err.contains(&format!("runlease doctor -- {d}")),
                "{err}"
            );
            assert_not_pwned(tmp.path());
        }
    }
}

/// The parents of run folders with odd but legal paths: spaces, quotes, shell
/// metacharacters, a leading `-`, non-ASCII, a line break, a bidi override, a tab.
const ODD_PARENTS: [&str; 12] = [
    "with space",
    "it's",
    "dq\"x",
    "-lead",
    "$(touch PWNED)",
    "`touch PWNED`",
    "semi;colon&amp|pipe",
    "glob*?[x]{a,b}~",
    "uni-ü中😀",
    "new\nline",
    "bidi\u{202e}x",
    "tab\there",
];

/// Odd but valid owner ids and hosts (words: `Identity::check_word`).
const ODD_OWNERS: [&str; 4] = [
    "a:b@c.d_e-f",
    "0",
    "run-0123456789abcdef0123456789abcdef",
    "x@y",
];

/// For odd but valid owner ids and odd run folder paths, the JSON `next_step` read by
/// `sh -c` is exactly `next_step_argv` (with `--` before the folder), the human `next`
/// line read by bash is too, and the step, run by `sh -c` as printed, succeeds: a
/// takeover for a stale owner elsewhere, a retirement for a dead one here.
#[test]
fn next_steps_read_back_by_a_shell_are_exactly_their_vectors() {
    let tmp = tempfile::tempdir().unwrap();
    let bash = Command::new("bash").arg("-c").arg("true").status().is_ok();
    for (i, parent) in ODD_PARENTS.iter().enumerate() {
        let parent_dir = tmp.path().join(parent);
        std::fs::create_dir(&parent_dir).unwrap();
        let owner = ODD_OWNERS[i % ODD_OWNERS.len()];
        // A relative path where it starts with `-` (the case `--` is for), else absolute.
        let (cwd, dir): (PathBuf, PathBuf) = if parent.starts_with('-') {
            (tmp.path().to_path_buf(), Path::new(parent).join("job"))
        } else {
            (tmp.path().to_path_buf(), parent_dir.join("job"))
        };
        let abs = cwd.join(&dir);
        init(&abs);
        let dead = i % 3 == 2;
        if dead {
            claim_as(&abs, owner, dead_here(), 0);
        } else {
            claim_as(&abs, owner, elsewhere(owner), 60_000);
        }
        let o = cmd(&["status", "--json", "--", dir.to_str().unwrap()])
            .current_dir(&cwd)
            .output()
            .unwrap();
        let s = json_lines(&o).remove(0);
        let argv = argv_of(&s).unwrap_or_else(|| panic!("{parent:?}: no vector: {s}"));
        let d = dir.to_str().unwrap();
        assert_eq!(&argv[argv.len() - 2..], ["--", d], "{s}");
        if dead {
            assert_eq!(argv[1], "retire", "{s}");
        } else {
            assert_eq!(argv[1], "takeover", "{s}");
            assert_eq!(argv[3], owner, "{s}");
        }
        let step = s["next_step"].as_str().unwrap();
        assert_eq!(words_of("sh", step, &cwd), argv, "{parent:?}: {step:?}");
        // The human line: the same command; a word with a control or bidi character is
        // `$'...'` (bash, zsh, ksh), and nothing a terminal acts on is printed.
        let o = cmd(&["status", "--", d])
            .current_dir(&cwd)
            .output()
            .unwrap();
        let human = text(&o.stdout);
        assert!(
            !human.contains('\u{202e}') && !human.contains('\u{1b}'),
            "{human:?}"
        );
        let next = human
            .lines()
            .find_map(|l| l.trim_start().strip_prefix("next"))
            .unwrap()
            .trim_start();
        if bash {
            assert_eq!(words_of("bash", next, &cwd), argv, "{parent:?}: {next:?}");
        }
        // Run the step as printed: it succeeds and frees the run.
        let o = Command::new("sh")
            .arg("-c")
            .arg(step)
            .env("PATH", path_with_binary())
            .env_remove("RUNLEASE_AUTHORITY")
            .current_dir(&cwd)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(0),
            "{parent:?}: {step:?}: {}",
            text(&o.stderr)
        );
        let s = status_json(&abs);
        assert_eq!(s["state"], "free", "{s}");
        assert_not_pwned(tmp.path());
    }
}

/// `--json` writes C1 controls (U+009B, the one-byte CSI), DEL and bidi overrides and
/// isolates (U+202E, U+2066) in strings as `\u` escapes, while the data read back is the
/// same; C0 controls stay escaped as serde_json does.
#[test]
fn json_output_escapes_c1_and_bidi_controls() {
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().join("p\u{9b}\u{202e}q");
    std::fs::create_dir(&parent).unwrap();
    let dir = parent.join("job");
    let d = dir.to_str().unwrap();
    let evil = "\u{9b}31m\u{202e}gnp.exe\u{2066}\u{7f}\u{1b}[2J\n";
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
    for args in [vec!["events", "--json", d], vec!["status", "--json", d]] {
        let o = runlease(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o.stderr));
        let raw = String::from_utf8(o.stdout.clone()).unwrap();
        for bad in ['\u{9b}', '\u{202e}', '\u{2066}', '\u{7f}', '\u{1b}'] {
            assert!(!raw.contains(bad), "{args:?}: {bad:?} raw in {raw:?}");
        }
        assert!(raw.contains("\\u009b") && raw.contains("\\u202e"), "{raw}");
        let lines = json_lines(&o);
        if args[0] == "events" {
            assert!(raw.contains("\\u2066") && raw.contains("\\u007f"), "{raw}");
            assert!(lines.iter().any(|l| l["payload"]["s"] == evil), "{lines:?}");
        } else {
            assert_eq!(lines[0]["run"], d, "the data is unchanged: {raw}");
        }
    }
}
