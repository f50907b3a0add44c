//! One test per exit code the CLI can return (README.md "Exit codes", `runlease --help`,
//! README). 69 (the etcd cluster of `--authority` did not answer) is tested in
//! tests/etcd.rs (feature `etcd`); without the feature `--authority` exits 64 (below).

mod common;

use common::*;
use rustix::process::Signal;
use std::process::Stdio;
use std::time::Duration;

/// Assert the exit code, and that stderr's last line is `runlease: CODE: ...`.
fn expect(o: &std::process::Output, code: i32, err_code: &str) {
    assert_eq!(o.status.code(), Some(code), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with(&format!("runlease: {err_code}: ")),
        "expected {err_code}: {err}"
    );
}

/// A run folder with one released generation.
fn used_run() -> (tempfile::TempDir, std::path::PathBuf) {
    let (tmp, dir) = scratch();
    assert_eq!(
        runlease(&["run", dir.to_str().unwrap(), "--", "true"])
            .status
            .code(),
        Some(0)
    );
    (tmp, dir)
}

#[test]
fn exit_0_ok_and_the_commands_own_code() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    assert_eq!(runlease(&["run", d, "--", "true"]).status.code(), Some(0));
    assert_eq!(runlease(&["status", d]).status.code(), Some(0));
    assert_eq!(
        runlease(&["run", d, "--", "sh", "-c", "exit 42"])
            .status
            .code(),
        Some(42)
    );
}

#[test]
fn exit_1_takeover_not_confirmed_at_the_prompt() {
    // `script` gives runlease a terminal (stdin and stderr), so takeover asks; "n" refuses.
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sleep", "30"]].concat());
    wait_for_state(&dir, "active", Duration::from_secs(10));
    signal(owner.id(), Signal::STOP);
    wait_for_state(&dir, "stale", Duration::from_secs(10));
    let before = tree(&dir);
    let ask = |answer: &str| {
        let mut c = std::process::Command::new("script")
            .args(["-qec", &format!("{BIN} takeover {d}"), "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("`script` (util-linux) runs a command on a terminal");
        use std::io::Write;
        c.stdin
            .take()
            .unwrap()
            .write_all(answer.as_bytes())
            .unwrap();
        c.wait_with_output().unwrap()
    };
    let o = ask("n\n");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stdout));
    let shown = text(&o.stdout); // the terminal's output, stderr included
    assert!(shown.contains("observed"), "{shown}");
    assert!(shown.contains("[y/N]"), "{shown}");
    assert!(shown.contains("ABORTED"), "{shown}");
    assert_eq!(tree(&dir), before, "a refused takeover changed the run");
    // "y" takes over; the resumed owner is fenced.
    let o = ask("y\n");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
    signal(owner.id(), Signal::CONT);
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(10)).code(),
        Some(75)
    );
}

#[test]
fn exit_64_usage() {
    let o = runlease(&["status", "/nonexistent/runlease-run"]);
    expect(&o, 64, "RUN_NOT_FOUND");
    let o = runlease(&["run", "/..", "--", "true"]);
    expect(&o, 64, "RUN_ID_INVALID");
    assert_eq!(runlease(&["takeover"]).status.code(), Some(64));
}

#[test]
fn exit_65_data_error() {
    let (_tmp, dir) = used_run();
    let f = epoch_file(&dir, 2);
    let mut bytes = std::fs::read(&f).unwrap();
    bytes.push(b'\n');
    std::fs::write(&f, bytes).unwrap();
    let o = runlease(&["run", dir.to_str().unwrap(), "--", "true"]);
    expect(&o, 65, "RECORD_INVALID");
    assert!(text(&o.stderr).contains("lease/epochs/00000000000000000002.json"));
}

#[test]
fn exit_70_a_record_schema_this_build_does_not_read() {
    let (_tmp, dir) = used_run();
    let f = epoch_file(&dir, 2);
    let s = std::fs::read_to_string(&f).unwrap();
    assert!(s.contains("runlease/epoch/1"));
    std::fs::write(&f, s.replace("runlease/epoch/1", "runlease/epoch/9")).unwrap();
    let o = runlease(&["run", dir.to_str().unwrap(), "--", "true"]);
    expect(&o, 70, "SCHEMA_UNSUPPORTED");
}

#[test]
fn exit_74_io_error() {
    // sysfs refuses mkdir (EPERM) even to root: an I/O error, and nothing is created.
    let path = format!("/sys/runlease-test-{}", std::process::id());
    let o = runlease(&["run", &path, "--", "true"]);
    expect(&o, 74, "IO_ERROR");
    assert!(!std::path::Path::new(&path).exists());
}

#[test]
fn exit_75_fenced() {
    let (_tmp, dir) = used_run();
    let ev = runlease(&["status", "--json", dir.to_str().unwrap()]);
    let owner = json_lines(&ev)[0]["owner_id"].as_str().unwrap().to_string();
    let o = runlease(&[
        "append",
        dir.to_str().unwrap(),
        "--type",
        "late",
        "--generation",
        "1",
        "--owner",
        &owner,
    ]);
    expect(&o, 75, "FENCED");
}

#[test]
fn exit_76_held() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut owner = spawn(&["run", d, "--", "sleep", "30"]);
    wait_for_state(&dir, "active", Duration::from_secs(10));
    let o = runlease(&["run", d, "--", "true"]);
    expect(&o, 76, "RUN_ALREADY_ACTIVE");
    // A fresh owner is never taken over, even with --yes.
    let o = runlease(&["takeover", d, "--yes"]);
    expect(&o, 76, "TAKEOVER_ACTIVE_REFUSED");
    signal(owner.id(), Signal::TERM);
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(10)).code(),
        Some(128 + 15)
    );
}

#[test]
fn exit_77_not_owned() {
    // A run folder others may write (the portable case; tests/folders.rs also chowns).
    let (_tmp, dir) = used_run();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    for args in [
        vec!["run", dir.to_str().unwrap(), "--", "true"],
        vec!["status", dir.to_str().unwrap()],
    ] {
        let o = runlease(&args);
        expect(&o, 77, "RUN_NOT_OWNED");
    }
}

#[test]
fn exit_126_127_and_128_plus_n_from_run() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let not_exec = tmp.path().join("not-executable");
    std::fs::write(&not_exec, b"#!/bin/sh\n").unwrap();
    let o = runlease(&["run", d, "--", not_exec.to_str().unwrap()]);
    expect(&o, 126, "COMMAND_NOT_STARTED");
    let o = runlease(&["run", d, "--", "/nonexistent/command"]);
    expect(&o, 127, "COMMAND_NOT_STARTED");
    let o = runlease(&["run", d, "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(o.status.code(), Some(128 + 9));
    assert_eq!(status_json(&dir)["state"], "free");
}

#[test]
fn help_lists_every_exit_code() {
    let h = text(&runlease(&["--help"]).stdout);
    for code in [
        "0", "1", "64", "65", "69", "70", "71", "74", "75", "76", "77", "126", "127", "128+N",
    ] {
        assert!(
            h.contains(&format!("\n  {code} ")),
            "--help lacks exit code {code}:\n{h}"
        );
    }
    assert!(
        h.contains("69    the etcd cluster of --authority did not answer"),
        "69 must say what it means"
    );
    let readme = include_str!("../../README.md");
    for code in [
        "64", "65", "69", "70", "71", "74", "75", "76", "77", "126", "127", "128+N",
    ] {
        assert!(
            readme.contains(&format!("| {code} |")),
            "README lacks exit code {code}"
        );
    }
}

/// A build without the `etcd` feature refuses `--authority` (and RUNLEASE_AUTHORITY)
/// before anything is touched: AUTHORITY_UNSUPPORTED, 64.
#[cfg(not(feature = "etcd"))]
#[test]
fn exit_64_for_an_authority_this_build_cannot_use() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let o = runlease(&[
        "--authority",
        "etcd://127.0.0.1:2379/p",
        "run",
        d,
        "--",
        "true",
    ]);
    expect(&o, 64, "AUTHORITY_UNSUPPORTED");
    assert!(text(&o.stderr).contains("--features etcd"));
    let o = cmd(&["status", d])
        .env("RUNLEASE_AUTHORITY", "etcd://127.0.0.1:2379/p")
        .output()
        .unwrap();
    expect(&o, 64, "AUTHORITY_UNSUPPORTED");
    assert!(!dir.exists(), "nothing may be touched");
}
