//! `runlease store get/list/log` (issue #20, first piece): a free run's store read through
//! the CLI, with nothing written, and the refusals (a held run with its holder named, a
//! crashed owner's WAL, no store).

mod common;

use common::*;
use lease_run::{Batch, FinalStatus, OpenOptions, Run};
use std::path::Path;
use std::time::Duration;

/// Commit two batches into `dir`'s store through lease-run, then release the run.
fn committed_run(dir: &Path) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let run = Run::open(dir, OpenOptions::default()).await.unwrap();
        run.commit(Batch::new().put("step/1", "done").log("first step"))
            .await
            .unwrap();
        run.commit(
            Batch::new()
                .put("step/2", vec![0xff, 0x00, 0x7f])
                .put("other", "x")
                .delete("step/1"),
        )
        .await
        .unwrap();
        run.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn a_free_runs_store_reads_through_the_cli_and_nothing_is_written() {
    let (_tmp, dir) = scratch();
    let run = dir.join("job");
    committed_run(&run);
    let d = run.to_str().unwrap();
    let before = tree(&dir);

    let o = runlease(&["store", "get", d, "other"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(o.stdout, b"x", "the value as it is, no newline");
    let o = runlease(&["store", "get", d, "step/1"]);
    assert_eq!(o.status.code(), Some(1), "a deleted key: exit 1");
    assert!(o.stdout.is_empty());
    let o = runlease(&["store", "get", d, "step/1", "--json"]);
    assert_eq!(json_lines(&o)[0]["found"], false);

    let o = runlease(&["store", "list", d, "step/", "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let docs = json_lines(&o);
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0]["schema"], "runlease/cli/store-doc/1");
    assert_eq!(docs[0]["key"], "step/2");
    assert_eq!(docs[0]["value_hex"], "ff007f", "not UTF-8: hex");
    assert_eq!(docs[0]["updated_seq"], 2);
    let o = runlease(&["store", "list", d]);
    let human = text(&o.stdout);
    let lines: Vec<&str> = human.lines().collect();
    assert_eq!(lines.len(), 2, "{human}");
    assert_eq!(lines[0], "other\tx");
    assert!(lines[1].starts_with("step/2\t"), "{human}");

    let o = runlease(&["store", "log", d, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let commits = json_lines(&o);
    assert_eq!(commits.len(), 2);
    assert_eq!(commits[0]["seq"], 1);
    assert_eq!(commits[0]["writes"][0]["op"], "put");
    assert_eq!(commits[0]["log"][0]["value"], "first step");
    assert_eq!(
        commits[1]["writes"][2],
        serde_json::json!({"op": "delete", "key": "step/1"})
    );
    assert_eq!(commits[0]["generation"], commits[1]["generation"]);
    let o = runlease(&["store", "log", d, "--since", "1", "--json"]);
    assert_eq!(json_lines(&o).len(), 1);

    assert_eq!(tree(&dir), before, "the reads wrote nothing at all");
    // The next owner opens the store as before.
    let o = runlease(&["run", "-q", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

#[test]
fn a_held_run_is_refused_with_its_holder_named_and_nothing_is_written() {
    let (_tmp, dir) = scratch();
    let run = dir.join("held");
    committed_run(&run);
    let d = run.to_str().unwrap();
    let mut owner = spawn(&["run", "-q", d, "--", "sleep", "30"]);
    let st = wait_for_state(&run, "active", Duration::from_secs(10));
    let before = tree(&run.join("store"));
    let o = runlease(&["store", "list", d, "--json"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    let err = &json_lines(&o)[0];
    assert_eq!(err["code"], "OWNER_LOCK_HELD");
    assert_eq!(err["holder"]["pid"], owner.id());
    assert_eq!(err["holder"]["generation"], st["generation"]);
    assert!(
        text(&o.stderr).contains(&format!("pid {}", owner.id())),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(tree(&run.join("store")), before);
    signal(owner.id(), rustix::process::Signal::TERM);
    wait_exit(&mut owner, Duration::from_secs(10));
}

#[test]
fn a_crashed_owners_wal_is_refused_until_the_next_run_replays_it() {
    let (_tmp, dir) = scratch();
    let run = dir.join("crashed");
    committed_run(&run);
    // An owner that committed and died without closing its store: the commit is only in
    // the write-ahead log.
    {
        let mut s = lease_sqlite::Store::open(
            &lease_core::RunId::new("crashed").unwrap(),
            run.join("store/run.sqlite"),
            lease_sqlite::OpenOptions {
                create: false,
                expect: None,
            },
        )
        .unwrap()
        .check_seal(None, None)
        .unwrap();
        s.commit(
            lease_core::Generation::new(1).unwrap(),
            &Batch::new().put("late", "y"),
        )
        .unwrap();
    }
    assert!(run.join("store/run.sqlite-wal").exists());
    let d = run.to_str().unwrap();
    let before = tree(&dir);
    let o = runlease(&["store", "get", d, "late"]);
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("STORE_BUSY"),
        "{}",
        text(&o.stderr)
    );
    assert!(
        text(&o.stderr).contains("write-ahead log"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(tree(&dir), before, "the refusal wrote nothing");
    // The step it names works: the next run replays the log, then the read succeeds.
    let hint = format!("next: runlease run --retire-dead {d} -- true");
    assert!(text(&o.stderr).contains(&hint), "{}", text(&o.stderr));
    let o = runlease(&["run", "-q", "--retire-dead", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = runlease(&["store", "get", d, "late"]);
    assert_eq!((o.status.code(), o.stdout.as_slice()), (Some(0), &b"y"[..]));
}

#[test]
fn no_store_yet_is_missing_and_nothing_is_created() {
    let (_tmp, dir) = scratch();
    let run = dir.join("fresh");
    std::fs::create_dir_all(&run).unwrap();
    let before = tree(&dir);
    let o = runlease(&["store", "list", run.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("STORE_MISSING"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(tree(&dir), before, "not even owner.lock");
}
