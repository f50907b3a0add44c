//! Hostile records and folders: typed errors naming the file, nothing changed or escaped.

use crate::{claim, id, me, new_run, t};
use lease_core::LeaseOps;
use lease_core::ops::{Expectation, Standing, Status, TakeoverTrigger};
use lease_core::*;
use lease_fs::RunDir;
use std::path::Path;
use std::time::{Duration, Instant};

// PROTOCOL §3, §7.8, I7
#[test]
fn hostile_records_give_typed_errors_naming_the_file_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "hostile");
    let l = claim(&run, "a", 0).unwrap();
    let epoch_path = path.join(FileRef::Epoch(l.generation).path());
    let good = std::fs::read(&epoch_path).unwrap();
    let good_str = String::from_utf8(good.clone()).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() / 2].to_vec()),
        (
            "extra field",
            good_str.replacen("{", "{\"aaa\":1,", 1).into_bytes(),
        ),
        (
            "bad timestamp",
            good_str.replace(".000Z\"", "Z\"").into_bytes(),
        ),
        (
            "generation overflow",
            good_str
                .replace("\"generation\":1,", "\"generation\":18446744073709551616,")
                .into_bytes(),
        ),
        (
            "path escape in run id",
            good_str
                .replace("\"run_id\":\"hostile\"", "\"run_id\":\"../x\"")
                .into_bytes(),
        ),
    ];
    for (name, bytes) in cases {
        assert_ne!(bytes, good, "{name}: mutation did nothing");
        std::fs::write(&epoch_path, &bytes).unwrap();
        let before = snapshot(&path);
        let s = run.status(t(100_000), false).unwrap();
        match &s.status {
            Status::Invalid(e) => assert!(
                e.to_string()
                    .contains("lease/epochs/00000000000000000001.json"),
                "{name}: {e}"
            ),
            other => panic!("{name}: {other:?}"),
        }
        assert!(claim(&run, "b", 100_000).is_err(), "{name}");
        let e = run
            .takeover(lease_core::ops::TakeoverParams {
                run_id: run.run_id().clone(),
                owner_id: id("b"),
                holder: me(),
                policy: TimingPolicy::default(),
                now: t(100_000),
                expect: Expectation {
                    generation: None,
                    owner_id: id("a"),
                    heartbeat_at: t(0),
                    heartbeat_count: None,
                },
                trigger: TakeoverTrigger::Operator {
                    watched_unchanged_ms: 100_000,
                },
            })
            .unwrap_err();
        assert!(
            matches!(e.code().as_str(), "RECORD_INVALID" | "RUN_LAYOUT_INVALID"),
            "{name}: {e}"
        );
        assert_eq!(snapshot(&path), before, "{name}: something changed on disk");
    }
    std::fs::write(&epoch_path, &good).unwrap();
}

fn snapshot(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.display().to_string(),
                    std::fs::read(&p).unwrap_or_default(),
                ));
            }
        }
    }
    out.sort();
    out
}

// PROTOCOL §5.1
#[test]
fn a_symlinked_folder_or_a_folder_in_place_of_a_file_is_refused_and_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "links");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::create_dir(path.join("lease")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, path.join("lease/epochs")).unwrap();
    let e = claim(&run, "a", 0).unwrap_err();
    assert_eq!(e.code().as_str(), "RUN_LAYOUT_INVALID", "{e}");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    std::fs::remove_file(path.join("lease/epochs")).unwrap();
    // A folder where the epoch file should be.
    std::fs::create_dir_all(path.join("lease/epochs/00000000000000000001.json")).unwrap();
    match run.status(t(0), false) {
        Ok(s) => assert!(matches!(s.status, Status::Invalid(_)), "{:?}", s.status),
        Err(e) => {
            assert_eq!(e.code().as_str(), "RUN_LAYOUT_INVALID", "{e}");
            assert!(
                e.to_string()
                    .contains("lease/epochs/00000000000000000001.json")
            );
        }
    }
    let e = claim(&run, "a", 0).unwrap_err();
    assert!(
        matches!(
            e.code().as_str(),
            "RUN_LAYOUT_INVALID" | "IO_ERROR" | "RECORD_INVALID"
        ),
        "{e}"
    );
    assert!(path.join("lease/epochs/00000000000000000001.json").is_dir());
}

// PROTOCOL §2
#[test]
fn a_claim_on_a_missing_run_folder_fails_within_100ms() {
    let dir = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let e = RunDir::open(&dir.path().join("missing")).unwrap_err();
    assert!(start.elapsed() < Duration::from_millis(100));
    assert_eq!(e.code().as_str(), "RUN_NOT_FOUND");
    assert!(e.to_string().contains("missing"));
}

// PROTOCOL §5.1
#[test]
fn a_run_root_renamed_underneath_is_reported_and_not_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "moved");
    let l = claim(&run, "a", 0).unwrap();
    std::fs::rename(&path, dir.path().join("moved-away")).unwrap();
    std::fs::create_dir(&path).unwrap();
    let e = run.heartbeat(&l, t(1), 1, None).unwrap_err();
    assert_eq!(e.code().as_str(), "RUN_ROOT_CHANGED", "{e}");
    assert_eq!(
        std::fs::read_dir(&path).unwrap().count(),
        0,
        "nothing written to the new folder"
    );
}

// PROTOCOL §2 (temp files)
#[test]
fn orphan_temp_files_change_nothing_a_reader_sees_and_are_cleaned() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "orphans");
    let l = claim(&run, "a", 0).unwrap();
    run.append(
        &l,
        lease_core::ops::AppendParams {
            event_type: id("e"),
            payload: serde_json::json!(1),
            now: t(1),
            tail_hint: None,
        },
    )
    .unwrap();
    let before_status = format!("{:?}", run.status(t(2), false).unwrap().head);
    let before_events = run.read_events(None).unwrap();
    for d in ["lease/epochs", "events", "lease/cutoffs"] {
        std::fs::create_dir_all(path.join(d)).unwrap();
        std::fs::write(path.join(d).join(".tmp-999-1-000000001"), b"garbage").unwrap();
    }
    assert_eq!(
        format!("{:?}", run.status(t(2), false).unwrap().head),
        before_status
    );
    assert_eq!(run.read_events(None).unwrap(), before_events);
    assert_eq!(run.clean_temp_files(0).unwrap(), 3);
    assert_eq!(run.read_events(None).unwrap(), before_events);
    assert!(matches!(
        before_events.events[0].standing,
        Standing::Authoritative
    ));
}

#[test]
fn the_run_id_of_a_path_ending_in_dot_or_dotdot_is_its_real_folder_name() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("myrun");
    std::fs::create_dir_all(run.join("sub")).unwrap();
    assert_eq!(
        lease_fs::run_id_of(&run.join("sub/..")).unwrap().as_str(),
        "myrun"
    );
    assert_eq!(
        lease_fs::run_id_of(&run.join(".")).unwrap().as_str(),
        "myrun"
    );
    // Not existing yet (runlease run creates it): resolved lexically.
    let missing = dir.path().join("newrun/x/..");
    assert_eq!(lease_fs::run_id_of(&missing).unwrap().as_str(), "newrun");
}
