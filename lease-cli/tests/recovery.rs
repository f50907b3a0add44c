//! The recovery suite (issue #17): for each damaged or crashed run it builds, it asks
//! `runlease status --json` what to do, executes the step it names (`next_step_argv`), and
//! repeats until the run is free; where the step is a repair by hand (`doctor` names the
//! file and what to do), it does exactly that repair, restoring only the file the finding
//! names from the copy taken before the damage (an operator's backup). A state passes when
//! every step it was told to run succeeded and a plain `runlease run DIR -- true` and
//! `runlease verify DIR` succeed at the end. Crashed states (a `runlease run` killed before
//! each of its durable system calls) must recover by the named steps alone, with no repair.
//!
//! Each test prints `recovery: <family> states=N next-step-failed=M` and fails unless M is 0.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A run with history: two runs that each appended two events (generations 1–4, events
/// 1–4), then an owner taken over while stopped, which left a cutoff
/// (generations 5–7), and a third run (8–9) with one event.
fn base_run(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    let d = dir.to_str().unwrap();
    for _ in 0..2 {
        let o = cmd(&[
            "run",
            d,
            "--",
            "sh",
            "-c",
            r#"runlease append "$RUNLEASE_RUN" --type step >/dev/null && runlease append "$RUNLEASE_RUN" --type step --payload '{"n":2}' >/dev/null"#,
        ])
        .output()
        .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    }
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sleep", "30"]].concat());
    wait_for_state(&dir, "active", std::time::Duration::from_secs(10));
    signal(owner.id(), rustix::process::Signal::STOP);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let o = runlease(&["takeover", "--yes", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    signal(owner.id(), rustix::process::Signal::KILL);
    let _ = owner.wait();
    let o = cmd(&[
        "run",
        "--retire-dead",
        d,
        "--",
        "sh",
        "-c",
        r#"runlease append "$RUNLEASE_RUN" --type last >/dev/null"#,
    ])
    .output()
    .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(status_json(&dir)["state"], "free");
    dir
}

/// Copy a folder tree (files and folders only; the runs here hold nothing else).
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let t = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &t);
        } else {
            std::fs::copy(e.path(), &t).unwrap();
        }
    }
}

/// The record files of a run, relative (`lease/epochs/…`, `events/…`, `run.json`, …),
/// the owner lock and the store left out.
fn record_files(dir: &Path) -> Vec<String> {
    tree(dir)
        .into_iter()
        .filter(|(k, v)| {
            v != b"dir" && k.ends_with(".json") && !k.starts_with("store/") && !k.contains(".tmp")
        })
        .map(|(k, _)| k)
        .collect()
}

/// Files named in a finding's detail (relative to the run).
fn named_files(detail: &str) -> Vec<String> {
    let mut out = Vec::new();
    for w in detail.split(|c: char| c.is_whitespace() || "(),;:'\"`".contains(c)) {
        let w = w.trim_end_matches('.');
        let known = ["lease/", "events/", "commands/"]
            .iter()
            .any(|p| w.starts_with(p));
        // Files only: a finding may also name a folder (`lease/epochs/`) in its prose.
        if (known && w.ends_with(".json")) || w == "run.json" {
            out.push(w.to_string());
        }
    }
    out
}

/// What happened while recovering one state.
struct Recovery {
    steps: Vec<String>,
    failure: Option<String>,
}

/// Follow `status`'s next steps until the run is free, repairing by hand (from `backup`)
/// only what `doctor` names, then claim and verify. `allow_repair: false` makes any repair
/// by hand a failure (crashes must recover by the named steps alone).
fn recover(dir: &Path, backup: Option<&Path>) -> Recovery {
    let d = dir.to_str().unwrap();
    let mut r = Recovery {
        steps: Vec::new(),
        failure: None,
    };
    let mut repaired = BTreeSet::new();
    for _ in 0..8 {
        let o = runlease(&["status", "--json", d]);
        let Some(s) = json_lines(&o).pop() else {
            r.failure = Some(format!("status printed no JSON: {}", text(&o.stderr)));
            return r;
        };
        if o.status.code() != Some(0) {
            r.failure = Some(format!("status exited {:?}: {s}", o.status.code()));
            return r;
        }
        let state = s["state"].as_str().unwrap_or("?").to_string();
        let argv: Option<Vec<String>> = s["next_step_argv"]
            .as_array()
            .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect());
        let doctor = match &argv {
            Some(a) if a[1] == "doctor" => true,
            Some(a) => {
                r.steps.push(a[1..].join(" "));
                let args: Vec<&str> = a[1..].iter().map(String::as_str).collect();
                let o = runlease(&args);
                if o.status.code() != Some(0) {
                    r.failure = Some(format!(
                        "the next step `{}` (state {state}) exited {:?}: {}",
                        a.join(" "),
                        o.status.code(),
                        text(&o.stderr)
                    ));
                    return r;
                }
                continue;
            }
            // No single command: free ("claim it"), or a repair by hand doctor names.
            None => state != "free",
        };
        // Free, or told to see doctor: doctor's error findings are repaired by hand.
        let o = runlease(&["doctor", "--json", d]);
        let findings = json_lines(&o);
        let errors: Vec<&Value> = findings
            .iter()
            .filter(|f| f["severity"] == "error")
            .collect();
        if errors.is_empty() {
            if doctor {
                r.failure = Some(format!(
                    "status named doctor (state {state}) but doctor found no error: {}",
                    text(&o.stdout)
                ));
                return r;
            }
            if state == "free" {
                break;
            }
            r.failure = Some(format!("state {state} with no step and no finding: {s}"));
            return r;
        }
        if !doctor && state == "free" {
            // Status said "claim it", yet the claim would meet a repair first.
            r.failure = Some(format!(
                "status said free ({}) but doctor reports errors: {}",
                s["next_step"],
                text(&o.stdout)
            ));
            return r;
        }
        let Some(backup) = backup else {
            r.failure = Some(format!(
                "a crash needed a repair by hand: {}",
                text(&o.stdout)
            ));
            return r;
        };
        let mut did = false;
        for f in errors {
            let files = named_files(f["detail"].as_str().unwrap_or(""));
            if files.is_empty() {
                r.failure = Some(format!("a finding names no file to repair: {f}"));
                return r;
            }
            for file in files {
                if !repaired.insert(file.clone()) {
                    continue;
                }
                restore(dir, backup, &file);
                r.steps.push(format!("repair {file} ({})", f["code"]));
                did = true;
            }
        }
        if !did {
            r.failure = Some(format!(
                "the named repair was done and the finding stands: {}",
                text(&o.stdout)
            ));
            return r;
        }
    }
    let o = runlease(&["run", d, "--", "true"]);
    if o.status.code() != Some(0) {
        r.failure = Some(format!(
            "after the steps {:?}, `run` exited {:?}: {}",
            r.steps,
            o.status.code(),
            text(&o.stderr)
        ));
        return r;
    }
    let o = runlease(&["verify", d]);
    if o.status.code() != Some(0) {
        r.failure = Some(format!(
            "after the steps {:?}, `verify` exited {:?}: {}",
            r.steps,
            o.status.code(),
            text(&o.stderr)
        ));
    }
    r
}

/// Restore one named file (or folder entry) from the backup: copied back if the backup
/// has it, moved out of the run (into a sibling folder) if it does not (a stray).
fn restore(dir: &Path, backup: &Path, rel: &str) {
    let target = dir.join(rel);
    let from = backup.join(rel);
    let aside = dir.parent().unwrap().join("moved-aside");
    std::fs::create_dir_all(&aside).unwrap();
    if let Ok(m) = std::fs::symlink_metadata(&target) {
        let dest = aside.join(rel.replace('/', "_"));
        let _ = std::fs::remove_dir_all(&dest);
        let _ = std::fs::remove_file(&dest);
        std::fs::rename(&target, &dest).unwrap_or_else(|e| panic!("move {rel} aside: {e}"));
        let _ = m;
    }
    if from.is_file() {
        std::fs::copy(&from, &target)
            .unwrap_or_else(|e| panic!("restore {rel} into {}: {e}", dir.display()));
    }
}

/// One damage: a name and what it does to a run folder.
type Damage = (String, Box<dyn Fn(&Path)>);

fn damages(sample: &Path) -> Vec<Damage> {
    let mut out: Vec<Damage> = Vec::new();
    for rel in record_files(sample) {
        let r = rel.clone();
        out.push((
            format!("empty {rel}"),
            Box::new(move |d: &Path| std::fs::write(d.join(&r), b"").unwrap()),
        ));
        let r = rel.clone();
        out.push((
            format!("torn {rel}"),
            Box::new(move |d: &Path| {
                let p = d.join(&r);
                let b = std::fs::read(&p).unwrap();
                std::fs::write(&p, &b[..b.len() / 2]).unwrap();
            }),
        ));
        let r = rel.clone();
        out.push((
            format!("edited {rel}"),
            Box::new(move |d: &Path| {
                // A hand edit that keeps the JSON valid: one digit changed.
                let p = d.join(&r);
                let mut b = std::fs::read(&p).unwrap();
                if let Some(i) = b.iter().rposition(u8::is_ascii_digit) {
                    b[i] = if b[i] == b'7' { b'8' } else { b'7' };
                }
                std::fs::write(&p, &b).unwrap();
            }),
        ));
        if rel.starts_with("lease/cutoffs/") || rel.starts_with("events/") {
            let r = rel.clone();
            out.push((
                format!("deleted {rel}"),
                Box::new(move |d: &Path| std::fs::remove_file(d.join(&r)).unwrap()),
            ));
        }
    }
    let epochs: Vec<String> = record_files(sample)
        .into_iter()
        .filter(|r| r.starts_with("lease/epochs/"))
        .collect();
    let newest = epochs.last().unwrap().clone();
    out.push((
        format!("deleted newest epoch {newest}"),
        Box::new(move |d: &Path| std::fs::remove_file(d.join(&newest)).unwrap()),
    ));
    // A rollback of the chain by two generations (issue #17): the records they left (a
    // cutoff naming a missing successor, events of a missing generation) give it away.
    let two: Vec<String> = epochs.iter().rev().take(2).cloned().collect();
    out.push((
        format!("deleted the two newest epochs {}", two.join(", ")),
        Box::new(move |d: &Path| {
            for e in &two {
                std::fs::remove_file(d.join(e)).unwrap()
            }
        }),
    ));
    let events: Vec<String> = record_files(sample)
        .into_iter()
        .filter(|r| r.starts_with("events/"))
        .collect();
    let last: u64 = events.len() as u64;
    let next_event = format!("events/{:020}.json", last + 1);
    let gap_event = format!("events/{:020}.json", last + 2);
    let next_epoch = format!("lease/epochs/{:020}.json", epochs.len() as u64 + 1);
    let next_beat = format!("lease/beats/{:020}.json", epochs.len() as u64 + 1);
    let (n, g) = (next_event.clone(), gap_event.clone());
    let last_event = events.last().unwrap().clone();
    out.push((
        format!("stray directory {n}"),
        Box::new(move |d: &Path| std::fs::create_dir(d.join(&n)).unwrap()),
    ));
    out.push((
        format!("stray copy of the last event as {g} (a gap)"),
        Box::new(move |d: &Path| {
            std::fs::copy(d.join(&last_event), d.join(&g)).unwrap();
        }),
    ));
    let n = next_event.clone();
    out.push((
        format!("stray FIFO {n}"),
        Box::new(move |d: &Path| {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                d.join(&n),
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o600),
                0,
            )
            .unwrap()
        }),
    ));
    let e = next_epoch.clone();
    out.push((
        format!("stray garbage {e}"),
        Box::new(move |d: &Path| std::fs::write(d.join(&e), b"{\"garbage\":1}").unwrap()),
    ));
    let b = next_beat.clone();
    out.push((
        format!("stray directory {b}"),
        Box::new(move |d: &Path| std::fs::create_dir(d.join(&b)).unwrap()),
    ));
    out
}

#[test]
fn every_damaged_record_recovers_by_the_named_steps_and_repairs() {
    let tmp = tempfile::tempdir().unwrap();
    let base = base_run(&tmp.path().join("base"), "job");
    let list = damages(&base);
    let (mut states, mut failed) = (0, Vec::new());
    for (i, (name, damage)) in list.iter().enumerate() {
        let case = tmp.path().join(format!("case-{i}"));
        let dir = case.join("job");
        copy_tree(&base, &dir);
        damage(&dir);
        states += 1;
        let r = recover(&dir, Some(&base));
        if let Some(f) = r.failure {
            failed.push(format!("{name}: {f}"));
        }
        let _ = std::fs::remove_dir_all(&case);
    }
    figure(&format!(
        "recovery: damaged states={states} next-step-failed={}",
        failed.len()
    ));
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// The durable system calls of `runlease run`: a crash just before each one (a SIGKILL
/// strace injects at its entry) is a crash between two steps.
const DURABLE: [&str; 7] = [
    "openat", "write", "fsync", "linkat", "renameat", "unlinkat", "mkdirat",
];

/// Crash points per system call (the n-th call of each thread): a `run -- true` makes
/// fewer of the rarer ones; `openat` and `write` are capped.
const MAX_PER_CALL: u32 = 120;

/// Stopped command gates (`sh -c 'kill -STOP $$ && exec …' lease-run-gate …`, the
/// command before lease-run lets it exec) whose environment names the run at `dir`: a
/// `runlease run` killed between its fork and its command record leaves one, stopped
/// forever (it never runs the command, and no later owner can prove it is the run's to
/// signal). Killed here, as test hygiene; returns how many.
fn kill_stopped_gates(dir: &Path) -> usize {
    let want = format!(
        "RUNLEASE_RUN={}",
        dir.file_name().unwrap().to_string_lossy()
    );
    let mut n = 0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if !cmdline.windows(14).any(|w| w == b"lease-run-gate") {
            continue;
        }
        let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let stopped = std::fs::read_to_string(e.path().join("stat"))
            .ok()
            .and_then(|st| st.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
            .unwrap_or(false);
        if stopped && environ.split(|b| *b == 0).any(|v| v == want.as_bytes()) {
            signal(pid, rustix::process::Signal::KILL);
            n += 1;
        }
    }
    n
}

fn strace() -> bool {
    let found = Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !found && std::env::var_os("RUNLEASE_REQUIRE_STRACE").is_some() {
        panic!("strace is required here (RUNLEASE_REQUIRE_STRACE) but not installed");
    }
    found
}

#[test]
fn a_run_killed_before_any_durable_call_recovers_by_the_named_steps_alone() {
    if !strace() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // Its own run name: the gates it cleans up are found by RUNLEASE_RUN.
    let base = base_run(&tmp.path().join("base"), "crash-job");
    let (mut states, mut failed, mut leaked_gates) = (0, Vec::new(), 0);
    for call in DURABLE {
        for n in 1.. {
            let case = tmp.path().join(format!("crash-{call}-{n}"));
            let dir = case.join("crash-job");
            copy_tree(&base, &dir);
            let d = dir.to_str().unwrap();
            let mut child = Command::new("strace")
                .args([
                    // Follow the threads (the blocking I/O runs on tokio's pool), but let
                    // go of a child at its execve: the gated command stays stopped when
                    // its parent is killed first, and strace would wait for it forever.
                    "-f",
                    "-b",
                    "execve",
                    "-o",
                    "/dev/null",
                    "-e",
                    &format!("inject={call}:signal=KILL:when={n}"),
                    BIN,
                    "run",
                    d,
                    "--",
                    "true",
                ])
                .env_remove("RUNLEASE_RUN")
                .env_remove("RUNLEASE_OWNER")
                .env_remove("RUNLEASE_GENERATION")
                .env("PATH", path_with_binary())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let status = wait_exit(&mut child, std::time::Duration::from_secs(60));
            leaked_gates += kill_stopped_gates(&dir);
            let killed = status.code() != Some(0);
            if !killed {
                // The run got through its n-th `call` without it being its last: done.
                let _ = std::fs::remove_dir_all(&case);
                break;
            }
            states += 1;
            let r = recover(&dir, None);
            if let Some(f) = r.failure {
                failed.push(format!("killed before {call} #{n}: {f}"));
            }
            leaked_gates += kill_stopped_gates(&dir);
            let _ = std::fs::remove_dir_all(&case);
            if n >= MAX_PER_CALL {
                break;
            }
        }
    }
    figure(&format!(
        "recovery: crashed states={states} next-step-failed={} (stopped command gates left by a kill before the command record: {leaked_gates})",
        failed.len()
    ));
    assert!(states > 20, "too few crash points: {states}");
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

/// OQ-6 (issue #17): what a power loss leaves of a `local` heartbeat (the beat file empty,
/// or cut short) no longer wedges the run. `status` says `stale` (not `invalid`) with the
/// file named, `doctor` warns (exit 0), and the takeover `status --json` names succeeds when
/// executed as given; a complete but undecodable beat stays `invalid` (a hand edit).
#[test]
fn a_torn_local_heartbeat_is_recovered_by_the_named_takeover() {
    let (_tmp, root) = scratch();
    // Killed (same boot: provably dead, so retire) or stopped (alive but silent: a
    // takeover after watching the torn file unchanged), with an empty and a cut-short beat.
    let cases = [
        (&b""[..], rustix::process::Signal::KILL, "retire"),
        (
            b"{\"count\":3,\"genera",
            rustix::process::Signal::KILL,
            "retire",
        ),
        (&b""[..], rustix::process::Signal::STOP, "takeover"),
        (
            b"{\"count\":3,\"genera",
            rustix::process::Signal::STOP,
            "takeover",
        ),
    ];
    for (i, (torn, sig, step)) in cases.into_iter().enumerate() {
        let dir = root.join(format!("torn-{i}"));
        let d = dir.to_str().unwrap();
        // Silence the owner once it beat, then tear its beat.
        let (mut owner, beat) = owner_that_beat(&dir);
        signal(owner.id(), sig);
        if sig == rustix::process::Signal::KILL {
            let _ = owner.wait();
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        std::fs::write(&beat, torn).unwrap();
        let s = status_json(&dir);
        assert_ne!(s["state"], "invalid", "{s}");
        assert_eq!(s["heartbeat_torn"], true, "{s}");
        assert_eq!(s["heartbeat_count"], 0, "{s}");
        let o = runlease(&["status", d]);
        assert!(text(&o.stdout).contains("is torn"), "{}", text(&o.stdout));
        let o = runlease(&["doctor", "--json", d]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
        assert!(
            json_lines(&o)
                .iter()
                .any(|f| f["code"] == "TORN_HEARTBEAT" && f["severity"] == "warning"),
            "{}",
            text(&o.stdout)
        );
        if sig == rustix::process::Signal::KILL {
            // Follow status's steps to a free run, then run and verify.
            let r = recover(&dir, None);
            assert!(
                r.failure.is_none(),
                "case {i}: {:?}: {:?}",
                r.steps,
                r.failure
            );
            assert!(
                r.steps.iter().any(|s| s.starts_with(step)),
                "case {i}: {:?}",
                r.steps
            );
            continue;
        }
        // Stopped: once stale by its claim time, status names the takeover; executed as
        // given it watches the torn file unchanged and succeeds.
        let s = wait_for_state(&dir, "stale", std::time::Duration::from_secs(10));
        let argv: Vec<String> = s["next_step_argv"]
            .as_array()
            .unwrap_or_else(|| panic!("case {i}: no argv: {s}"))
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect();
        assert_eq!(argv[1], step, "case {i}: {s}");
        let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
        let o = runlease(&args);
        assert_eq!(o.status.code(), Some(0), "case {i}: {}", text(&o.stderr));
        // The stopped owner, resumed, finds itself fenced; then the run is usable.
        signal(owner.id(), rustix::process::Signal::CONT);
        let st = wait_exit(&mut owner, std::time::Duration::from_secs(10));
        assert_eq!(st.code(), Some(75), "case {i}: the replaced owner exits 75");
        let o = runlease(&["run", d, "--", "true"]);
        assert_eq!(o.status.code(), Some(0), "case {i}: {}", text(&o.stderr));
        assert_eq!(runlease(&["verify", d]).status.code(), Some(0));
    }
    // A complete record that does not decode: invalid, and no takeover is offered.
    let dir = root.join("edited");
    let (mut owner, beat) = owner_that_beat(&dir);
    signal(owner.id(), rustix::process::Signal::KILL);
    let _ = owner.wait();
    std::fs::write(&beat, b"{\"garbage\":1}\n").unwrap();
    let s = status_json(&dir);
    assert_eq!(s["state"], "invalid", "{s}");
    assert_ne!(s["next_step_argv"][1], "takeover", "{s}");
}

/// A `runlease run` owner (fast timing, `sleep 30`) of `dir` that has written its first
/// heartbeat file: the child and that file's path.
fn owner_that_beat(dir: &Path) -> (std::process::Child, PathBuf) {
    let d = dir.to_str().unwrap();
    let owner = spawn(&[&["run", d][..], &FAST, &["--", "sleep", "30"]].concat());
    let active = wait_for_state(dir, "active", std::time::Duration::from_secs(10));
    let g = active["generation"].as_u64().unwrap();
    let beat = dir.join(format!("lease/beats/{g:020}.json"));
    wait_for_file(&beat, std::time::Duration::from_secs(10), "a heartbeat");
    (owner, beat)
}
