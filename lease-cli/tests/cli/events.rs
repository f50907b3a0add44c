//! The event log: `append` in a run, `events`, `verify` and `doctor` on a broken log.

use crate::common::*;
use rustix::process::Signal;
use std::process::Command;
use std::time::Duration;

#[test]
fn append_inside_run_counts_and_verify_catches_a_broken_log() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let o = Command::new(BIN)
        .args([
            "run",
            d,
            "--",
            "sh",
            "-c",
            r#"runlease append "$RUNLEASE_RUN" --type step && runlease append "$RUNLEASE_RUN" --type step --payload '{"n":2}'"#,
        ])
        .env("PATH", path_with_binary())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "1\n2\n");

    let ev = runlease(&["events", "--json", d]);
    assert_eq!(ev.status.code(), Some(0), "{}", text(&ev.stderr));
    let events = json_lines(&ev);
    assert_eq!(events.len(), 2);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence"], i as u64 + 1);
        assert_eq!(e["type"], "step");
        assert_eq!(e["authoritative"], true, "{e}");
        assert_eq!(e["authority"], "counts");
        assert_eq!(e["generation"], 1);
    }
    assert_eq!(events[1]["payload"]["n"], 2);

    // Outside a run, with the (now released) token: fenced, nothing appended.
    let o = runlease(&[
        "append",
        d,
        "--type",
        "late",
        "--generation",
        "1",
        "--owner",
        events[0]["owner_id"].as_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("FENCED"));
    assert_eq!(json_lines(&runlease(&["events", "--json", d])).len(), 2);

    let v = runlease(&["verify", "--json", d]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v.stderr));
    let r = json_lines(&v).remove(0);
    assert_eq!(r["events"], 2);
    assert_eq!(r["epochs"], 2);

    // Overwrite event 2 with event 1's bytes: the log no longer verifies.
    let e1 = dir.join("events").join(format!("{:020}.json", 1));
    let e2 = dir.join("events").join(format!("{:020}.json", 2));
    std::fs::write(&e2, std::fs::read(&e1).unwrap()).unwrap();
    let v = runlease(&["verify", d]);
    assert_eq!(v.status.code(), Some(65), "{}", text(&v.stderr));
    assert!(text(&v.stderr).starts_with("runlease: "));
    let doc = runlease(&["doctor", "--json", d]);
    assert_eq!(doc.status.code(), Some(65));
    let codes: Vec<String> = json_lines(&doc)
        .iter()
        .map(|f| f["code"].as_str().unwrap().to_string())
        .collect();
    assert!(
        codes
            .iter()
            .any(|c| c == "INVALID_RECORD" || c == "BROKEN_CHAIN"),
        "{codes:?}"
    );
}

/// A log that ends before the finalized cutoff of a killed owner (its tail deleted, as a
/// power loss can do to an unacknowledged event) is a verify `short_tail` and a doctor
/// `EVENT_LOG_SHORT` warning, not an error; nothing is changed on disk.
#[test]
fn verify_and_doctor_report_a_log_shorter_than_a_finalized_cutoff() {
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let pidfile = tmp.path().join("child.pid");
    let script = format!(
        r#"runlease append "$RUNLEASE_RUN" --type a && runlease append "$RUNLEASE_RUN" --type b && echo $$ > '{}' && exec sleep 600"#,
        pidfile.display()
    );
    let mut owner = spawn(&["run", d, "--", "sh", "-c", &script]);
    let child = read_pid(&pidfile);
    signal(owner.id(), Signal::KILL);
    owner.wait().unwrap();
    signal(child, Signal::KILL);
    wait_for_state(&dir, "dead", Duration::from_secs(10));
    let o = runlease(&["retire", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v = json_lines(&runlease(&["verify", "--json", d]));
    assert_eq!(v[0]["short_tail"], serde_json::Value::Null, "{v:?}");

    // Delete the log's tail (event 2); the cutoff of generation 1 still says "through 2".
    let tail = lease_core::FileRef::Event(lease_core::Sequence::new(2).unwrap()).path();
    std::fs::remove_file(dir.join(&tail)).unwrap();
    let before = tree(&dir);
    let o = runlease(&["verify", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v = json_lines(&o);
    assert_eq!(
        v[0]["short_tail"],
        serde_json::json!({"named": 2, "by_cutoff_of": 1, "tail": 1}),
        "{v:?}"
    );
    let human = text(&runlease(&["verify", d]).stdout);
    assert!(
        human.contains("the event log ends at sequence 1 but the finalized cutoff of generation 1 names events through 2"),
        "{human}"
    );
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "a short tail is a warning");
    let f = json_lines(&o);
    assert!(
        f.iter()
            .any(|f| f["code"] == "EVENT_LOG_SHORT" && f["severity"] == "warning"),
        "{f:?}"
    );
    assert_eq!(tree(&dir), before, "verify and doctor changed the run");
}
