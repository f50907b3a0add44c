//! Usage errors (exit 64) and `--help`.

use crate::common::*;

#[test]
fn status_of_a_missing_run_is_a_usage_error() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope");
    let o = runlease(&["status", "--json", missing.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(64));
    let e = json_lines(&o).remove(0);
    assert_eq!(e["code"], "RUN_NOT_FOUND");
    assert_eq!(e["exit_code"], 64);
    assert!(text(&o.stderr).starts_with("runlease: RUN_NOT_FOUND: "));
    assert!(!missing.exists(), "status must not create the folder");
}

#[test]
fn usage_errors_exit_64_and_help_lists_exit_codes() {
    assert_eq!(runlease(&["frobnicate"]).status.code(), Some(64));
    assert_eq!(runlease(&[]).status.code(), Some(64));
    assert_eq!(runlease(&["status"]).status.code(), Some(64));
    assert_eq!(runlease(&["run", "x"]).status.code(), Some(64));
    // A timing policy whose stale_after - self_fence_after margin is too small for the
    // watchdog to confirm the kill in time: usage, and nothing is created.
    let tmp = tempfile::tempdir().unwrap();
    let unsafe_dir = tmp.path().join("never-created");
    let o = runlease(&[
        "run",
        unsafe_dir.to_str().unwrap(),
        "--heartbeat",
        "100",
        "--self-fence-after",
        "850",
        "--stale-after",
        "1000",
        "--",
        "true",
    ]);
    assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("unsafe timing"),
        "{}",
        text(&o.stderr)
    );
    assert!(!unsafe_dir.exists());
    assert_eq!(
        runlease(&["run", "x", "--wait", "soon", "--", "true"])
            .status
            .code(),
        Some(64)
    );
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("r");
    // An unsafe timing policy is a usage error, and nothing is created.
    let o = runlease(&[
        "run",
        d.to_str().unwrap(),
        "--heartbeat",
        "10",
        "--",
        "true",
    ]);
    assert_eq!(o.status.code(), Some(64));
    assert!(text(&o.stderr).contains("POLICY_INVALID"));
    let help = runlease(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    let h = text(&help.stdout);
    for code in ["0 ", "1 ", "64", "65", "69", "70", "74", "75", "76", "77"] {
        assert!(
            h.contains(&format!("\n  {code}")),
            "help lacks exit code {code}"
        );
    }
    assert!(h.contains("runlease run ./demo-run --"));
    for sub in [
        "run", "init", "status", "takeover", "retire", "release", "append", "events", "verify",
        "doctor", "prune", "list",
    ] {
        let o = runlease(&[sub, "--help"]);
        assert_eq!(o.status.code(), Some(0));
        assert!(
            text(&o.stdout).contains(&format!("runlease {sub} ")),
            "`{sub} --help` lacks an example"
        );
    }
    assert_eq!(runlease(&["--version"]).status.code(), Some(0));
}
