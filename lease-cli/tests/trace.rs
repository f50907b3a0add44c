//! Issue #15: no system call of `runlease` names a path below the run root. Everything
//! inside the run is reached beneath the held root descriptor (`openat`, `openat2` with
//! `RESOLVE_BENEATH`, …), and the SQLite store beneath the held `store/` descriptor
//! (`/proc/self/fd/N/run.sqlite`). Only the root itself is named by path, when it is first
//! opened.
//!
//! Each subcommand, and `runlease run` with `append` and `release` inside it, runs under
//! `strace -f -e trace=%file` (every system call that takes a file name, in every thread and
//! child). The test fails on any traced path that starts with `<run root>/`.
//!
//! Needs `strace` (Debian: `apt-get install strace`; `.ci/run` installs it). Without it the
//! test prints why it is skipped, unless `RUNLEASE_REQUIRE_STRACE=1` (set by `.ci/run`)
//! makes that a failure.

mod common;

use common::{BIN, FAST, cmd, read_pid, scratch, signal, text, wait_for_state};
use rustix::process::Signal;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn strace_available() -> bool {
    Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The quoted strings of one strace line (strace escapes `"` inside them as `\"`).
fn quoted(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut s = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    if let Some(n) = chars.next() {
                        s.push('\\');
                        s.push(n);
                    }
                }
                '"' => break,
                c => s.push(c),
            }
        }
        out.push(s);
    }
    out
}

/// Whether an strace line is a `readlink`/`readlinkat` call (after strace's pid column).
fn is_readlink(line: &str) -> bool {
    line.split_whitespace()
        .find(|w| !w.chars().all(|c| c.is_ascii_digit()))
        .is_some_and(|w| w.starts_with("readlink(") || w.starts_with("readlinkat("))
}

/// Run `runlease args` under strace; returns its output and every traced line that names
/// a path below `root`.
fn traced(root: &Path, args: &[&str]) -> (Output, Vec<String>) {
    traced_via(root, &[], args)
}

/// [`traced`], with runlease started through `wrapper` (e.g. `timeout -s INT 1.5`).
fn traced_via(root: &Path, wrapper: &[&str], args: &[&str]) -> (Output, Vec<String>) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut strace = Command::new("strace");
    strace
        .args(["-f", "-qq", "-s", "4096", "-e", "trace=%file", "-o"])
        .arg(log.path())
        .arg("--")
        .args(wrapper)
        .arg(BIN)
        .args(args);
    // The same environment as `cmd` (no inherited owner token, the binary on PATH).
    for (k, v) in cmd(args).get_envs() {
        match v {
            Some(v) => strace.env(k, v),
            None => strace.env_remove(k),
        };
    }
    strace.stdin(std::process::Stdio::null());
    let out = strace.output().expect("run strace");
    let below = format!("{}/", root.display());
    let trace = std::fs::read_to_string(log.path()).unwrap();
    let bad = trace
        .lines()
        .filter(|l| {
            let q = quoted(l);
            // readlink's second string is what the link says, not a path the call
            // resolves: the mark check (PROTOCOL §11.1) reads `/proc/<pid>/fd/*` links,
            // some of which name files of the run.
            let named = if is_readlink(l) {
                &q[..q.len().min(1)]
            } else {
                &q[..]
            };
            named.iter().any(|s| s.starts_with(&below))
        })
        .map(str::to_string)
        .collect();
    (out, bad)
}

fn check(root: &Path, args: &[&str], want: &[i32], violations: &mut Vec<String>) -> Output {
    let (o, bad) = traced(root, args);
    let code = o.status.code().unwrap_or(-1);
    assert!(
        want.contains(&code),
        "runlease {args:?} exited {code}, wanted one of {want:?}: {}",
        text(&o.stderr)
    );
    for l in bad {
        violations.push(format!("runlease {}: {l}", args.join(" ")));
    }
    o
}

#[test]
fn no_system_call_names_a_path_below_the_run_root() {
    if !strace_available() {
        assert!(
            std::env::var_os("RUNLEASE_REQUIRE_STRACE").is_none(),
            "RUNLEASE_REQUIRE_STRACE is set but strace is not installed"
        );
        println!("trace: skipped: strace is not installed (apt-get install strace)");
        return;
    }
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let parent = tmp.path().to_str().unwrap();
    let mut v = Vec::new();

    // A run with events, then a clean release from inside it.
    let inner = r#"runlease append "$RUNLEASE_RUN" --type step --payload '{"n":1}' && runlease append "$RUNLEASE_RUN" --type step && runlease release "$RUNLEASE_RUN""#;
    check(&dir, &["run", d, "--", "sh", "-c", inner], &[0], &mut v);
    check(&dir, &["run", d, "--json", "--", "true"], &[0], &mut v);
    check(&dir, &["init", d], &[0], &mut v);
    for args in [
        vec!["status", d],
        vec!["status", "--json", d],
        vec!["events", d],
        vec!["events", "--json", d],
        vec!["verify", d],
        vec!["verify", "--json", d],
        vec!["doctor", d],
        vec!["doctor", "--json", d],
        vec!["list", parent],
        vec!["list", "--json", parent],
    ] {
        check(&dir, &args, &[0], &mut v);
    }
    // `events --follow`: its polling, stopped by SIGINT after 1.5 s (exit 130 or 0).
    let (o, bad) = traced_via(
        &dir,
        &["timeout", "-s", "INT", "1.5"],
        &["events", "--follow", d],
    );
    let bad: Vec<String> = bad
        .into_iter()
        .map(|l| format!("runlease events --follow: {l}"))
        .collect();
    assert!(
        text(&o.stdout).contains("step"),
        "events --follow printed the events: {}",
        text(&o.stdout)
    );
    v.extend(bad);

    // A live owner: refused takeover and retire (read paths of the refusals).
    let pidfile = tmp.path().join("child.pid");
    let script = format!("echo $$ > '{}'; exec sleep 600", pidfile.display());
    let mut owner = common::spawn(&[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat());
    let child = read_pid(&pidfile);
    let s = wait_for_state(&dir, "active", Duration::from_secs(10));
    let (eo, eh) = (
        s["expect_owner"].as_str().unwrap().to_string(),
        s["expect_heartbeat"].as_str().unwrap().to_string(),
    );
    check(
        &dir,
        &[
            "takeover",
            d,
            "--expect-owner",
            &eo,
            "--expect-heartbeat",
            &eh,
        ],
        // 75 when the 100 ms heartbeat moved on since the observation.
        &[75, 76],
        &mut v,
    );
    // 75 when the 100 ms heartbeat moved on between retire's observation and its check.
    check(&dir, &["retire", d], &[75, 76], &mut v);
    check(&dir, &["run", d, "--", "true"], &[76], &mut v);
    check(&dir, &["status", d], &[0], &mut v);

    // The owner is killed: `retire` of the dead owner, then another dead owner whose
    // command is reaped by `run --retire-dead`.
    signal(owner.id(), Signal::KILL);
    owner.wait().unwrap();
    signal(child, Signal::KILL);
    wait_for_state(&dir, "dead", Duration::from_secs(10));
    check(&dir, &["doctor", d], &[0, 1, 65, 76], &mut v);
    check(&dir, &["retire", d], &[0], &mut v);
    std::fs::remove_file(&pidfile).unwrap();
    let mut owner = common::spawn(&[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat());
    let child = read_pid(&pidfile);
    wait_for_state(&dir, "active", Duration::from_secs(10));
    signal(owner.id(), Signal::KILL);
    owner.wait().unwrap();
    wait_for_state(&dir, "dead", Duration::from_secs(10));
    check(
        &dir,
        &["run", d, "--retire-dead", "--", "true"],
        &[0],
        &mut v,
    );
    assert!(
        !common::alive(child),
        "run --retire-dead reaps the dead owner's command"
    );
    check(&dir, &["prune", d, "--keep", "2"], &[0], &mut v);
    check(&dir, &["verify", d], &[0], &mut v);

    assert!(
        v.is_empty(),
        "system calls named paths below the run root {d}:\n{}",
        v.join("\n")
    );
    println!("trace: subcommands traced, paths below the run root: 0");
}
