//! A run folder on a FUSE file system (issue #19): `RUNLEASE_FUSE_DIR` names a writable
//! folder on a FUSE mount (`.ci/run` mounts one with bindfs where `/dev/fuse` works, and
//! then requires this test with `RUNLEASE_REQUIRE_FUSE=1`). Without it the test says so
//! and passes (nothing to test on).
//!
//! What it checks: the folder is recognised as a file system that can lose unsynced writes,
//! so `runlease run` records durable heartbeats and says so in one line; the first run of a
//! new folder works (FUSE's cached link count of the new store, seen right after its temp
//! name was removed, once made it refuse with STORE_CORRUPT); a second run right after
//! works too; and the beats are valid slots that `status` reads.

mod common;

use common::*;
use std::path::PathBuf;

fn fuse_dir() -> Option<PathBuf> {
    match std::env::var_os("RUNLEASE_FUSE_DIR") {
        Some(d) => Some(PathBuf::from(d)),
        None => {
            assert!(
                std::env::var_os("RUNLEASE_REQUIRE_FUSE").is_none(),
                "RUNLEASE_REQUIRE_FUSE is set but RUNLEASE_FUSE_DIR is not"
            );
            eprintln!("RUNLEASE_FUSE_DIR is not set: no FUSE folder to test on");
            None
        }
    }
}

#[test]
fn runs_on_fuse_record_durable_heartbeats_and_work_from_the_first_run() {
    let Some(base) = fuse_dir() else { return };
    let scratch = tempfile::tempdir_in(&base).expect("a folder on the FUSE mount");
    let dir = scratch.path().join("run");
    let d = dir.to_str().unwrap();
    for round in 0..2 {
        let o = runlease(&["run", d, "--", "true"]);
        assert_eq!(
            o.status.code(),
            Some(0),
            "round {round}: {}",
            text(&o.stderr)
        );
        let err = text(&o.stderr);
        assert!(
            err.contains("network or user-space file system") && err.contains("durable"),
            "round {round}: no notice: {err}"
        );
    }
    // Held by a command: the epoch says durable, the beat file holds valid slots.
    let o = runlease(
        &[
            &["run", d][..],
            &FAST,
            &[
                "--",
                "sh",
                "-c",
                "sleep 0.5; runlease status --json \"$RUNLEASE_RUN\"",
            ],
        ]
        .concat(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let line = text(&o.stdout);
    let v: serde_json::Value = serde_json::from_str(line.lines().next().unwrap()).unwrap();
    assert_eq!(v["state"], "active", "{v}");
    assert_eq!(v["policy"]["heartbeat_durability"], "durable", "{v}");
    assert!(v["heartbeat_count"].as_u64().unwrap() >= 2, "{v}");
    assert_eq!(v["heartbeat_torn"], false, "{v}");
    assert_eq!(status_json(&dir)["state"], "free");
}
