//! What the owner (`runlease run`) says about its own run (issue #28): a failed heartbeat
//! is named each time, with its code and file, and the fence of a lapse names the last
//! failure; `run.json` tells a command that exited 143 from one killed by signal 15; a
//! host whose name no record may hold is refused before anything is written.

mod common;

use common::*;
use std::time::Duration;

/// A folder named like the next epoch makes every heartbeat fail (`RUN_LAYOUT_INVALID`):
/// the owner warns of each failure with the code and the file, then fences itself after
/// `self_fence_after` (exit 75) and the fence names the same cause.
#[test]
fn a_lapse_names_the_heartbeat_failure_that_caused_it() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sleep", "30"]].concat());
    let s = wait_for_state(&dir, "active", Duration::from_secs(10));
    let g = s["generation"].as_u64().expect("generation");
    let stray = epoch_file(&dir, g + 1);
    std::fs::create_dir(&stray).unwrap();
    let st = wait_exit(&mut owner, Duration::from_secs(10));
    let out = owner.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(st.code(), Some(75), "{err}");
    let file = format!("lease/epochs/{:020}.json", g + 1);
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("runlease: warning: heartbeat failed"))
        .collect();
    assert!(!warnings.is_empty(), "no heartbeat warning: {err}");
    for w in &warnings {
        assert!(
            w.contains("RUN_LAYOUT_INVALID") && w.contains(&file),
            "a warning without the code and file: {w}"
        );
    }
    // Said once, in runlease's words: lease-run's own warnings of the same failures and
    // of the fence are not printed beside them (lease-cli/src/log.rs, `said_by_the_cli`).
    assert!(
        !err.contains("lease_run::run"),
        "a warning runlease says itself is said twice: {err}"
    );
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("runlease: FENCED: "), "{err}");
    assert!(
        last.contains("no successful heartbeat for")
            && last.contains("RUN_LAYOUT_INVALID")
            && last.contains(&file),
        "the fence does not name its cause: {last}"
    );
}

/// `run.json` of a failed run: an exit code is an exit code, a signal a signal, even
/// where runlease's own exit code (128+N) is the same.
#[test]
fn run_json_tells_exit_143_from_signal_15() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let detail = |script: &str| {
        let o = runlease(&["run", d, "--", "sh", "-c", script]);
        assert_eq!(o.status.code(), Some(143), "{}", text(&o.stderr));
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
        assert_eq!(v["status"], "failed", "{v}");
        v["detail"].as_str().unwrap_or_default().to_string()
    };
    assert_eq!(detail("exit 143"), "the command exited with code 143");
    assert_eq!(
        detail("kill -TERM $$"),
        "the command was killed by signal 15"
    );
}

/// On a host whose name is no word (the rule every record's holder host follows), `run`,
/// `retire` and `takeover` refuse up front with ARGUMENT_INVALID naming the host name,
/// and nothing is created: the claim used to fail while encoding its epoch (65
/// RECORD_INVALID) after laying the folder out. Needs a UTS namespace (`unshare -u`, as
/// root); skipped, saying so, where there is none.
#[test]
fn a_host_name_no_record_may_hold_is_refused_before_anything_is_written() {
    let probe = std::process::Command::new("unshare")
        .args(["-u", "true"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("skipped: no `unshare -u` here (needs root)");
        return;
    }
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let wrapper = [
        "unshare",
        "-u",
        "sh",
        "-c",
        "printf 'bad host' > /proc/sys/kernel/hostname && exec \"$0\" \"$@\"",
    ];
    for args in [
        vec!["run", d, "--", "true"],
        vec!["retire", d],
        vec!["takeover", "--yes", d],
    ] {
        let o = cmd_under(&wrapper, &args).output().unwrap();
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {err}");
        assert!(
            err.starts_with("runlease: ARGUMENT_INVALID: host name: ")
                && err.contains("\"bad host\""),
            "{args:?}: {err}"
        );
        assert!(!dir.exists(), "{args:?} created the run folder");
    }
}
