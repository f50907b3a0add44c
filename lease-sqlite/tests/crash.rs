//! Crash durability with real processes: a child commits in a loop and acknowledges each
//! commit on stdout; it is SIGKILLed at seeded random moments; every acknowledged commit
//! must be there when the store is reopened.

mod common;

use common::{Rng, child_command, g, run};
use lease_sqlite::{Batch, Store, StoreOptions, Write};
use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD_PATH: &str = "LEASE_SQLITE_CRASH_CHILD_STORE";
const CHILD_TOKEN: &str = "LEASE_SQLITE_CRASH_CHILD_TOKEN";
const TRIALS: u64 = 20;

fn value(token: u64, i: u64) -> Vec<u8> {
    format!("generation {token} commit {i} ")
        .repeat(8)
        .into_bytes()
}

/// The child: open the store as generation `token`, commit forever, print `ACK <seq> <i>`
/// and flush after each acknowledged commit. Stops by itself after 20 s in case the parent
/// is gone.
fn child(path: &Path, token: u64) {
    let mut store = Store::open(
        &run(),
        path,
        StoreOptions {
            create: true,
            expect: None,
        },
    )
    .unwrap()
    .check_seal(None, None)
    .unwrap();
    let mut out = std::io::stdout().lock();
    let started = Instant::now();
    let mut i = 0u64;
    while started.elapsed() < Duration::from_secs(20) {
        let mut b = Batch::new().put(format!("t{token}/{i}"), value(token, i));
        if i % 3 == 0 {
            b = b.log(format!("log {token}/{i}"));
        }
        let seq = store.commit(g(token), &b).unwrap();
        writeln!(out, "ACK {seq} {i}").unwrap();
        out.flush().unwrap();
        i += 1;
    }
}

#[test]
fn crash_durability_with_real_processes() {
    if let Ok(path) = std::env::var(CHILD_PATH) {
        let token = std::env::var(CHILD_TOKEN).unwrap().parse().unwrap();
        child(Path::new(&path), token);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store/run.sqlite");
    let mut rng = Rng::new(0x5eed_cafe);
    let mut lost = std::collections::BTreeSet::new();
    let mut total_acked = 0usize;
    // (seq, token, i) of every acknowledged commit of every trial so far.
    let mut acked_all: Vec<(u64, u64, u64)> = Vec::new();
    for trial in 1..=TRIALS {
        // Each trial is a new owner: generation = trial, over the store the last one left.
        let mut proc = child_command(
            "crash_durability_with_real_processes",
            &[
                (CHILD_PATH, path.display().to_string()),
                (CHILD_TOKEN, trial.to_string()),
            ],
        )
        .spawn()
        .unwrap();
        let stdout = proc.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel::<(u64, u64)>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut parts = line.split_whitespace();
                if parts.next() == Some("ACK") {
                    let seq = parts.next().unwrap().parse().unwrap();
                    let i = parts.next().unwrap().parse().unwrap();
                    if tx.send((seq, i)).is_err() {
                        break;
                    }
                }
            }
        });
        // Wait for the first acknowledgement, then kill after a seeded delay.
        let first = rx.recv_timeout(Duration::from_secs(15));
        assert!(
            first.is_ok(),
            "trial {trial}: the child acknowledged nothing"
        );
        let delay = Duration::from_micros(rng.below(120_000));
        std::thread::sleep(delay);
        proc.kill().unwrap(); // SIGKILL
        let status = proc.wait().unwrap();
        assert!(!status.success(), "trial {trial}: the child was not killed");
        reader.join().unwrap();
        let acks: Vec<(u64, u64)> = first.into_iter().chain(rx.try_iter()).collect();
        total_acked += acks.len();
        acked_all.extend(acks.iter().map(|&(seq, i)| (seq, trial, i)));
        let last_acked = acks.last().unwrap().0;

        // Reopen: head >= last acknowledged (as a floor), and every acknowledged commit of
        // every trial is present with its token and writes.
        let store = Store::open(&run(), &path, StoreOptions::default())
            .unwrap()
            .check_seal(None, Some((last_acked, g(trial))))
            .unwrap();
        let head = store.head().unwrap();
        assert!(
            head >= last_acked,
            "trial {trial}: head {head} < acked {last_acked}"
        );
        let commits = store.commits_since(0).unwrap();
        assert_eq!(commits.len() as u64, head);
        for (n, c) in commits.iter().enumerate() {
            assert_eq!(c.seq, n as u64 + 1, "sequences are contiguous");
        }
        lost.extend(missing(&commits, &acked_all));
        // Alternate: a clean close (checkpoint) or a plain drop (the WAL stays for the
        // next child to replay).
        if trial % 2 == 0 {
            store.close().unwrap();
        } else {
            drop(store);
        }
        println!(
            "trial {trial}: killed after {} ms, {} acknowledged (last {last_acked}), head {head}",
            delay.as_millis(),
            acks.len()
        );
    }
    // Once more at the end, over the whole history.
    let store = Store::open(&run(), &path, StoreOptions::default())
        .unwrap()
        .check_seal(None, None)
        .unwrap();
    lost.extend(missing(&store.commits_since(0).unwrap(), &acked_all));
    store.close().unwrap();
    println!("acknowledged commits checked: {total_acked}");
    // Straight to stdout (not `println!`, which the test harness captures), so the
    // figure shows in every `cargo test` log.
    writeln!(
        std::io::stdout(),
        "kill trials: {TRIALS}, acknowledged lost: {}",
        lost.len()
    )
    .unwrap();
    assert!(total_acked > TRIALS as usize);
    assert_eq!(lost.len(), 0, "lost acknowledged commits: {lost:?}");
}

/// The acknowledged commits (seq, token, i) that are not in `commits` as acknowledged.
fn missing(commits: &[lease_sqlite::Commit], acked: &[(u64, u64, u64)]) -> Vec<u64> {
    acked
        .iter()
        .filter(|&&(seq, token, i)| {
            let want = [Write::Put {
                key: format!("t{token}/{i}"),
                value: value(token, i),
            }];
            !matches!(commits.get(seq as usize - 1),
                Some(c) if c.seq == seq && c.token == token && c.writes == want)
        })
        .map(|&(seq, _, _)| seq)
        .collect()
}
