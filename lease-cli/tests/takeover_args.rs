//! `takeover`'s arguments are judged before any I/O (issue #28): a malformed or incomplete
//! expectation is 64 `ARGUMENT_INVALID`, said before anything is opened or observed (no
//! "observed …" line, and a missing run folder is not what is reported), and the owner id
//! must be a word, the form every record's owner id has.

mod common;

use common::*;
use std::time::Duration;

/// Assert a 64 `ARGUMENT_INVALID` naming `what`, with nothing observed.
fn refused_up_front(o: &std::process::Output, what: &str) {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(
        err.starts_with("runlease: ARGUMENT_INVALID: "),
        "not an argument error: {err}"
    );
    assert!(err.contains(what), "does not name {what}: {err}");
    assert!(!err.contains("observed"), "judged after observing: {err}");
}

const HB: &str = "2026-01-01T00:00:00.000Z";

#[test]
fn malformed_expectations_are_64_before_the_run_folder_is_even_opened() {
    let tmp = tempfile::tempdir().unwrap();
    // No such folder: an argument judged first is reported, not RUN_NOT_FOUND.
    let missing = tmp.path().join("missing");
    let m = missing.to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (
            &["--expect-owner", "run-1", "--expect-heartbeat", "yesterday"],
            "--expect-heartbeat",
        ),
        (
            &["--expect-owner=-rf", "--expect-heartbeat", HB],
            "--expect-owner",
        ),
        (
            &["--expect-owner", "a;touch PWNED", "--expect-heartbeat", HB],
            "--expect-owner",
        ),
        (
            &[
                "--expect-owner",
                "run-1",
                "--expect-heartbeat",
                HB,
                "--expect-generation",
                "0",
            ],
            "--expect-generation",
        ),
        (&["--yes", "--expect-count", "3"], "--expect-count"),
        (
            &["--yes", "--expect-generation", "2"],
            "--expect-generation",
        ),
    ];
    for (args, what) in cases {
        let o = runlease(&[&["takeover", m][..], args].concat());
        refused_up_front(&o, what);
    }
    assert!(!missing.exists());
}

#[test]
fn malformed_expectations_of_a_live_run_are_64_and_nothing_is_observed() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sleep", "30"]].concat());
    wait_for_state(&dir, "active", Duration::from_secs(10));
    let o = runlease(&[
        "takeover",
        d,
        "--expect-owner",
        "run-1",
        "--expect-heartbeat",
        "2026-13-01T00:00:00.000Z",
    ]);
    refused_up_front(&o, "--expect-heartbeat");
    let o = runlease(&[
        "takeover",
        d,
        "--expect-owner",
        "$(touch PWNED)",
        "--expect-heartbeat",
        HB,
    ]);
    refused_up_front(&o, "--expect-owner");
    owner.kill().unwrap();
    owner.wait().unwrap();
}
