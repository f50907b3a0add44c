//! End-to-end checks that the placeholder `runlease` binary is honest about its status:
//! `--help`/`--version` succeed, every subcommand exits 70 (EX_SOFTWARE).

use std::process::Command;

fn runlease(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_runlease"))
        .args(args)
        .output()
        .expect("spawn runlease")
}

#[test]
fn help_exits_zero_and_says_not_implemented() {
    let out = runlease(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("NOT implemented yet"), "{text}");
    assert!(text.contains("issue #7"), "{text}");
}

#[test]
fn version_exits_zero() {
    let out = runlease(&["--version"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("runlease "));
}

#[test]
fn any_subcommand_exits_70() {
    for sub in ["run", "status", "takeover"] {
        let out = runlease(&[sub]);
        assert_eq!(out.status.code(), Some(70), "subcommand {sub}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("not implemented yet"));
    }
}

#[test]
fn no_subcommand_is_a_usage_error() {
    assert_eq!(runlease(&[]).status.code(), Some(64));
}
