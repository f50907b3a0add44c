//! A run another owner holds: refused with the holder named, or waited for.

use crate::common::*;
use rustix::process::Signal;
use std::time::Duration;

#[test]
fn a_held_run_is_refused_with_the_holder_named_or_waited_for() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    // A 200 ms heartbeat: the takeover below watches the record and sees it change soon.
    let mut first = spawn(&["run", d, "--heartbeat", "200ms", "--", "sleep", "4"]);
    wait_for_state(&dir, "active", Duration::from_secs(5));
    let o = runlease(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    let err = text(&o.stderr);
    assert!(err.starts_with("runlease: RUN_ALREADY_ACTIVE: "), "{err}");
    assert!(err.contains(&format!("pid {}", first.id())), "{err}");
    // JSON error object names the holder too.
    let o = runlease(&["run", "--json", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(76));
    let e = json_lines(&o).remove(0);
    assert_eq!(e["code"], "RUN_ALREADY_ACTIVE");
    assert_eq!(e["holder"]["pid"], first.id());
    // A fresh owner is neither taken over (76: its record changes under the watch) nor
    // retired (76, evidence named); a takeover whose expectation differs from the record
    // in any field is a race (75, observe again), nothing written (issue #28).
    let s = status_json(&dir);
    let (owner, hb) = (
        s["expect_owner"].as_str().unwrap().to_string(),
        s["expect_heartbeat"].as_str().unwrap().to_string(),
    );
    let o = runlease(&["takeover", d, "--yes"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("TAKEOVER_ACTIVE_REFUSED"));
    assert!(text(&o.stderr).contains("alive"), "{}", text(&o.stderr));
    // Everything of the lease but the live owner's own beat.
    let lease_files = || {
        let mut t = tree(&dir.join("lease"));
        t.retain(|k, _| !k.starts_with("beats/"));
        t
    };
    let before = lease_files();
    // A heartbeat older than the record's: the owner has beaten since that look, so it is
    // alive (76), not a race to retry (an owner whose wall clock makes it look stale would
    // send status's own advice round in a loop of 75s).
    let o = runlease(&[
        "takeover",
        d,
        "--expect-owner",
        &owner,
        "--expect-heartbeat",
        "2020-01-01T00:00:00.000Z",
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(76), "{err}");
    assert!(err.contains("TAKEOVER_ACTIVE_REFUSED"), "{err}");
    for (who, when) in [
        // One the owner never wrote (a date ahead of the record).
        (owner.as_str(), "2030-01-01T00:00:00.000Z"),
        ("someone-else", hb.as_str()),
    ] {
        let o = runlease(&[
            "takeover",
            d,
            "--expect-owner",
            who,
            "--expect-heartbeat",
            when,
        ]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(75), "{who} {when}: {err}");
        assert!(err.contains("TAKEOVER_RACE"), "{err}");
        assert!(
            err.contains("status --json"),
            "names the observation: {err}"
        );
        assert!(!err.contains("watched unchanged"), "{err}");
    }
    assert_eq!(lease_files(), before, "a refused takeover wrote");
    let o = runlease(&["retire", d]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("RETIRE_REFUSED_NOT_DEAD"));
    assert!(text(&o.stderr).contains("is alive"), "{}", text(&o.stderr));
    // --wait gets it once the holder exits.
    let o = runlease(&["run", d, "--wait", "10s", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(first.wait().unwrap().success());
}

#[test]
fn wait_2s_gets_the_run_once_the_holder_exits_and_gives_up_otherwise() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut holder = spawn(&["run", d, "--", "sleep", "1"]);
    wait_for_state(&dir, "active", Duration::from_secs(10));
    let o = runlease(&["run", d, "--wait", "2s", "--", "true"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        holder.try_wait().unwrap().is_some(),
        "got the run before the holder exited"
    );
    // Not a terminal: no progress line, only the final one.
    assert!(!err.contains('\r') && !err.contains("\x1b["), "{err:?}");
    assert!(err.contains("runlease: waited "), "{err}");
    assert!(holder.wait().unwrap().success());

    let mut holder = spawn(&["run", d, "--", "sleep", "30"]);
    wait_for_state(&dir, "active", Duration::from_secs(10));
    let o = runlease(&["run", d, "--wait", "300ms", "--", "true"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(76), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("gave up after waiting"), "{err}");
    // On a terminal (`script` provides one), a progress line is shown while waiting.
    let o = std::process::Command::new("script")
        .args([
            "-qec",
            &format!("{BIN} run {d} --wait 1s -- true"),
            "/dev/null",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("`script` (util-linux) runs a command on a terminal");
    let shown = text(&o.stdout);
    assert_eq!(o.status.code(), Some(76), "{shown}");
    assert!(
        shown.contains("\rrunlease: waiting ") || shown.contains("\r\x1b[Krunlease: waiting "),
        "{shown:?}"
    );
    signal(holder.id(), Signal::TERM);
    assert_eq!(
        wait_exit(&mut holder, Duration::from_secs(10)).code(),
        Some(128 + 15)
    );
    // `--wait` with no value waits forever; on a free run it just runs.
    let o = runlease(&["run", d, "--wait", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}
