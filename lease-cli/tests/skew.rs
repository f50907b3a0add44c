//! Skew-immune staleness (issue #17, PROTOCOL §7.4 JUDGE, §10): an owner whose wall clock
//! runs 60 s slow or fast, made with libfaketime (Debian's package `faketime`, preloaded; `.ci/run`
//! installs it, and `RUNLEASE_REQUIRE_FAKETIME=1` there makes its absence a failure). The
//! owner's monotonic clocks are left alone (`FAKETIME_DONT_FAKE_MONOTONIC`): only its wall
//! clock is wrong, as on a host whose time synchronization failed.

mod common;

use common::*;
use rustix::process::Signal;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// libfaketime's preload library if installed (else the test is skipped, unless CI
/// requires it). Preloaded directly, not through the `faketime` wrapper, so the pid we
/// signal is `runlease` itself.
fn libfaketime() -> Option<std::path::PathBuf> {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|d| d.path().join("faketime/libfaketime.so.1"))
        .chain([std::path::PathBuf::from(
            "/usr/lib/faketime/libfaketime.so.1",
        )])
        .find(|p| p.is_file());
    if found.is_none() && std::env::var_os("RUNLEASE_REQUIRE_FAKETIME").is_some() {
        panic!("libfaketime is required here (RUNLEASE_REQUIRE_FAKETIME) but not installed");
    }
    found
}

/// `runlease run DIR FAST -- sleep 60` with the owner's wall clock shifted by `offset`
/// (libfaketime syntax, e.g. `-60s`); its monotonic clocks are left alone.
fn skewed_owner(lib: &std::path::Path, dir: &std::path::Path, offset: &str) -> Child {
    let d = dir.to_str().unwrap();
    let args: Vec<&str> = [&["run", d][..], &FAST, &["--", "sleep", "60"]].concat();
    cmd(&args)
        .env("LD_PRELOAD", lib)
        .env("FAKETIME", offset)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runlease under libfaketime")
}

/// `status --json`'s `next_step_argv`, which must be there.
fn next_argv(s: &serde_json::Value) -> Vec<String> {
    s["next_step_argv"]
        .as_array()
        .unwrap_or_else(|| panic!("no step: {s}"))
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The names of the files under `lease/` (epochs, intents, cutoffs), beats left out (the
/// live owner replaces its own).
fn lease_files(dir: &std::path::Path) -> Vec<String> {
    tree(&dir.join("lease"))
        .into_keys()
        .filter(|k| !k.starts_with("beats/"))
        .collect()
}

#[test]
fn an_owner_whose_clock_runs_slow_is_not_taken_over_while_it_beats() {
    let Some(lib) = libfaketime() else { return };
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut owner = skewed_owner(&lib, &dir, "-60s");
    // Its beats are dated a minute ago: `status` (wall clock, advice only) calls it stale.
    let s = wait_for_state(&dir, "stale", Duration::from_secs(10));
    let before = lease_files(&dir);
    // The advised exact takeover watches the record on this host's clock, sees it change
    // (the owner beats every 100 ms), and refuses: 76, nothing written.
    let argv = next_argv(&s);
    assert_eq!(argv[1], "takeover", "{s}");
    let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
    let t = Instant::now();
    let o = runlease(&args);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("alive"), "{}", text(&o.stderr));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // `run --takeover-stale` without --wait refuses too (held, 76): the owner's kernel lock
    // on this host answers first.
    let o = runlease(&["run", "--takeover-stale", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert_eq!(lease_files(&dir), before, "a refusal wrote nothing");
    assert!(owner.try_wait().unwrap().is_none(), "the owner runs on");
    signal(owner.id(), Signal::TERM);
    let _ = wait_exit(&mut owner, Duration::from_secs(10));
}

#[test]
fn an_owner_whose_clock_runs_fast_is_taken_over_stale_after_after_it_stopped() {
    let Some(lib) = libfaketime() else { return };
    let (_tmp, dir) = scratch();
    let mut owner = skewed_owner(&lib, &dir, "+60s");
    // Its beats are dated a minute ahead: `status` says active.
    let s = wait_for_state(&dir, "active", Duration::from_secs(10));
    assert!(s["heartbeat_at"].is_string(), "{s}");
    signal(owner.id(), Signal::STOP);
    // (A beat already under way when it stopped lands first; then the record is frozen.)
    std::thread::sleep(Duration::from_millis(300));
    // `status` cannot judge a beat dated in the future by the wall clock: its next step is
    // the exact takeover, which watches for the owner's stale_after (1 s here) on this
    // host's clock, whatever the heartbeat's date says.
    let s = status_json(&dir);
    assert_eq!(s["state"], "active", "{s}");
    let argv = next_argv(&s);
    assert_eq!(argv[1], "takeover", "{s}");
    let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
    let t = Instant::now();
    let o = runlease(&args);
    let took = t.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("watching generation 1"),
        "{}",
        text(&o.stderr)
    );
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(6),
        "{took:?}"
    );
    assert_eq!(status_json(&dir)["state"], "free");
    signal(owner.id(), Signal::CONT);
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(10)).code(),
        Some(75)
    );
}
