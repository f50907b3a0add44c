//! `runlease`'s tracing subscriber (issue #34, lease-cli/src/log.rs): what the layers log
//! reaches stderr, filtered by `RUST_LOG` (default: warnings only), never stdout.
//! A warning cannot be had cheaply and deterministically from a CLI invocation, so the
//! layers' debug events (every step of lease-run's open logs one) stand in for it: they
//! pass `RUST_LOG=debug` and not the default. `tests/owner_reports.rs` checks that a
//! warning `runlease` says itself (a failed heartbeat) is not said twice.

mod common;

use common::*;

fn debug_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("DEBUG") && l.contains("lease_run"))
        .collect()
}

#[test]
fn rust_log_debug_shows_the_layers_debug_events_on_stderr_and_the_default_does_not() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();

    // Default (RUST_LOG unset; `cmd` never inherits it): no debug event, and `--quiet`
    // leaves stderr empty for a run with nothing to warn about.
    let o = cmd(&["run", d, "--quiet", "--", "true"]).output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(
        err, "",
        "a quiet run with nothing to warn about says nothing"
    );

    // RUST_LOG=debug: lease-run's debug events on stderr, one line each, no colours;
    // stdout is still only `--json` objects.
    let o = cmd(&["run", d, "--json", "--", "true"])
        .env("RUST_LOG", "debug")
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!debug_lines(&err).is_empty(), "no debug line: {err}");
    assert!(!err.contains('\u{1b}'), "colours on a pipe: {err}");
    let out = text(&o.stdout);
    assert!(!out.is_empty());
    for l in out.lines() {
        assert!(
            serde_json::from_str::<serde_json::Value>(l).is_ok(),
            "not a JSON line on stdout: {l}"
        );
    }

    // A filter that is not one is said once and ignored (warnings only).
    let o = cmd(&["run", d, "--quiet", "--", "true"])
        .env("RUST_LOG", "lease_run=loud")
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.starts_with("runlease: warning: RUST_LOG=\"lease_run=loud\" ignored"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}
