//! Forged command records: refused over the limit at a bounded cost, removed under it.

use crate::common::*;
use crate::{cgroup_runlease, records_forge};
use std::process::Command;
use std::time::{Duration, Instant};

/// 5,000 forged command records: `run` is refused before its claim with
/// `RUN_COMMAND_RECORDS_OVER_LIMIT` (65), the folder as it was; `status` reports it and
/// stays about as fast as with three records; `doctor` names it with a next step that
/// works (then `run` succeeds).
#[test]
fn records_five_thousand_forged_are_refused_fast() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    // One run first: the records are of generation 1, below the head (2).
    let o = cgroup_runlease(&[], &["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let time_status = || {
        let t = Instant::now();
        let o = cgroup_runlease(&[], &["status", "--json", d]);
        (t.elapsed(), o)
    };
    for i in 0..3 {
        records_forge(&dir, 1, 4_000_000 + i, None);
    }
    // The baseline: the fastest of three reads with three records.
    let base = (0..3).map(|_| time_status().0).min().unwrap();
    for i in 3..5_000 {
        records_forge(&dir, 1, 4_000_000 + i, None);
    }
    let before = tree_sig(&dir);
    let (took, o) = time_status();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let s = text(&o.stdout);
    assert!(s.contains("RUN_COMMAND_RECORDS_OVER_LIMIT"), "{s}");
    assert!(
        took < base * 5 + Duration::from_secs(1),
        "status took {took:?} with 5,000 records, {base:?} with 3"
    );
    let o = cgroup_runlease(&[], &["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("RUN_COMMAND_RECORDS_OVER_LIMIT"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        tree_sig(&dir),
        before,
        "a refusal leaves the folder as it was"
    );
    let doctor = cgroup_runlease(&[], &["doctor", "--json", "--", d]);
    let finding = json_lines(&doctor)
        .into_iter()
        .find(|f| f["code"] == "RUN_COMMAND_RECORDS_OVER_LIMIT")
        .unwrap_or_else(|| panic!("{}", text(&doctor.stdout)));
    let next = finding["next_step"].as_str().unwrap();
    let mv = next
        .split("(mv -- ")
        .nth(1)
        .and_then(|r| r.split(");").next())
        .unwrap_or_else(|| panic!("no mv in {next}"));
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("mv -- {mv}"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{mv}: {}", text(&o.stderr));
    let o = cgroup_runlease(&[], &["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

/// 1,000 forged records (under the limit), each naming a dead pid of this boot: `status`
/// and `run` judge them against one process table, so both finish, and the open removes
/// them.
#[test]
fn records_under_the_limit_are_judged_and_removed() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    // One run first: the records are of generation 1, below the head (2).
    let o = cgroup_runlease(&[], &["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    for i in 0..1_000 {
        records_forge(&dir, 1, 4_100_000 + i, None);
    }
    let o = cgroup_runlease(&[], &["status", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        !text(&o.stdout).contains("OVER_LIMIT"),
        "{}",
        text(&o.stdout)
    );
    let o = cgroup_runlease(&[], &["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let left = std::fs::read_dir(dir.join("commands")).map_or(0, |r| r.count());
    assert_eq!(left, 0, "the open removed the records of gone processes");
}
