//! The lease and the event log on a real disk: the named tests of issue #3.

mod fencing;
mod hostile;
mod lifecycle;
mod races;

use lease_core::LeaseOps;
use lease_core::ops::{Expectation, TakeoverTrigger};
use lease_core::*;
use lease_fs::{FsError, RunDir, this_holder};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_796_169_600_000 + ms).unwrap()
}

fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

fn new_run(dir: &Path, name: &str) -> (PathBuf, RunDir) {
    let p = dir.join(name);
    let r = RunDir::create(&p).unwrap();
    (p, r)
}

/// A holder that is this process but with a distinct pid-like identity is not possible, so
/// tests that need several "owners" in one process use distinct owner ids and this holder.
fn me() -> Holder {
    this_holder().unwrap()
}

fn claim(run: &RunDir, owner: &str, now: u64) -> Result<lease_core::ops::OwnedLease, FsError> {
    run.claim(lease_core::ops::ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: id(owner),
        holder: me(),
        policy: TimingPolicy::default(),
        now: t(now),
        store_floor: None,
    })
}

fn takeover(run: &RunDir, owner: &str, now: u64) -> Result<lease_core::ops::OwnedLease, FsError> {
    let head = run.status(t(now), false).unwrap().head.unwrap();
    run.takeover(lease_core::ops::TakeoverParams {
        run_id: run.run_id().clone(),
        owner_id: id(owner),
        holder: me(),
        policy: TimingPolicy::default(),
        now: t(now),
        expect: Expectation::of(&head),
        trigger: TakeoverTrigger::Operator {
            watched_unchanged_ms: lease_core::ghost::simulated_watch(
                &Expectation::of(&head),
                t(now),
            ),
        },
    })
}

fn counted(run: &RunDir, now: u64) -> Vec<u64> {
    run.read_events(Some((id("reader"), t(now))))
        .unwrap()
        .events
        .iter()
        .filter(|e| e.standing.counts())
        .map(|e| e.event.sequence.get())
        .collect()
}

// At the crate root, not in a module: `spawn_child` runs it by its exact name.
/// Child-process entry point, inert unless the parent set `RUNLEASE_TEST_CHILD`.
#[test]
fn child_process_entry() {
    let Ok(mode) = std::env::var("RUNLEASE_TEST_CHILD") else {
        return;
    };
    let path = PathBuf::from(std::env::var("RUNLEASE_TEST_RUN").unwrap());
    let run = RunDir::open(&path).unwrap();
    match mode.as_str() {
        "claim" => {
            // Wait for the start signal (a file) so all children race together.
            let go = path.with_extension("go");
            while !go.exists() {
                std::thread::sleep(Duration::from_millis(1));
            }
            match run.claim(lease_core::ops::ClaimParams {
                run_id: run.run_id().clone(),
                owner_id: id(&format!("p{}", std::process::id())),
                holder: me(),
                policy: TimingPolicy::default(),
                now: t(0),
                store_floor: None,
            }) {
                Ok(l) => println!("RESULT won {}", l.generation),
                Err(e) => println!("RESULT {}", e.code().as_str()),
            }
        }
        "hold" => {
            let lock = lease_fs::lock::OwnerLock::try_acquire(&path)
                .unwrap()
                .unwrap();
            let l = run
                .claim(lease_core::ops::ClaimParams {
                    run_id: run.run_id().clone(),
                    owner_id: id(&format!("p{}", std::process::id())),
                    holder: me(),
                    policy: TimingPolicy::default(),
                    now: t(0),
                    store_floor: None,
                })
                .unwrap();
            println!("RESULT held {}", l.generation);
            std::thread::sleep(Duration::from_secs(60));
            drop(lock);
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn spawn_child(mode: &str, run: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RUNLEASE_TEST_CHILD", mode)
        .env("RUNLEASE_TEST_RUN", run)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn child_result(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .find_map(|l| l.split_once("RESULT ").map(|(_, r)| r.trim().to_string()))
        .unwrap_or_else(|| format!("no result in {:?}", String::from_utf8_lossy(out)))
}
