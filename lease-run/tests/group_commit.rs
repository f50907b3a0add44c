//! The store socket's group commit (issue #33): commits from several commands that arrive
//! together are gathered into one store transaction and one durable heartbeat. Every one
//! is acknowledged, each with its own sequence, and is in the store a later owner opens;
//! and a group gathered once the owner was taken over acknowledges nothing.

use lease_core::ops::{Expectation, TakeoverParams, TakeoverTrigger};
use lease_core::{HeartbeatDurability, Identity, LeaseOps, TimingPolicy};
use lease_run::store_socket::{SOCKET_VAR, StoreClient};
use lease_run::{FinalStatus, INCARNATION_VAR, Run, RunError};
use lease_sqlite::Batch;
use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::time::Duration;

mod support;
use support::{command_env, fast, now_ts, rt};

/// Commands committing at once.
const CLIENTS: usize = 8;

/// `CLIENTS` connections, made before any of them commits.
fn clients(env: &BTreeMap<String, String>, generation: u64) -> Vec<StoreClient> {
    (0..CLIENTS)
        .map(|_| {
            StoreClient::connect(
                &env[SOCKET_VAR],
                &env["RUNLEASE_RUN"],
                generation,
                &env[INCARNATION_VAR],
            )
            .unwrap()
        })
        .collect()
}

/// Each client on its own thread commits `n` batches (key `{prefix}/{client}/{j}`, value
/// `v{j}`), all starting together; a client stops at its first refusal. Returns the
/// clients and each one's results, in order.
#[allow(clippy::type_complexity)]
fn commit_together(
    clients: Vec<StoreClient>,
    prefix: &str,
    n: usize,
) -> Vec<(StoreClient, Vec<Result<u64, RunError>>)> {
    let start = Arc::new(Barrier::new(clients.len()));
    let threads: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            let (start, prefix) = (start.clone(), prefix.to_string());
            std::thread::spawn(move || {
                start.wait();
                let mut results = Vec::new();
                for j in 0..n {
                    let r =
                        c.commit(&Batch::new().put(format!("{prefix}/{i}/{j}"), format!("v{j}")));
                    let refused = r.is_err();
                    results.push(r);
                    if refused {
                        break;
                    }
                }
                (c, results)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// Eight commands commit 25 times each, all at once: every commit is acknowledged with a
/// sequence of its own (1..=200, no gap), the floor covers the last one, and after a
/// release every one is in the store the next owner opens.
#[test]
fn concurrent_commits_are_all_acknowledged_and_present_after_reopen() {
    const EACH: usize = 25;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let env = command_env(&run).await;
        let g = run.generation().get();
        let done =
            tokio::task::spawn_blocking(move || commit_together(clients(&env, g), "c", EACH))
                .await
                .unwrap();
        let mut seqs: Vec<u64> = done
            .iter()
            .flat_map(|(_, rs)| rs.iter().map(|r| *r.as_ref().unwrap()))
            .collect();
        for (_, rs) in &done {
            let mine: Vec<u64> = rs.iter().map(|r| *r.as_ref().unwrap()).collect();
            assert!(mine.is_sorted(), "one client's commits in order: {mine:?}");
        }
        seqs.sort_unstable();
        let all = (CLIENTS * EACH) as u64;
        assert_eq!(seqs, (1..=all).collect::<Vec<u64>>());
        // The last acknowledgement came after a durable beat carrying its sequence.
        let view = run.dir().status(now_ts(), false).unwrap();
        let floor = view.head.unwrap().beat.unwrap().store_head;
        assert_eq!(floor, Some(all), "the floor lags an acknowledged commit");
        drop(done);
        run.release(FinalStatus::Done).await.unwrap();

        let again = Run::open(&path, fast()).await.unwrap();
        assert!(again.generation().get() > g);
        let store = again.store();
        assert_eq!(store.head().unwrap(), all);
        for i in 0..CLIENTS {
            for j in 0..EACH {
                let doc = store.get(&format!("c/{i}/{j}")).unwrap();
                let doc = doc.unwrap_or_else(|| panic!("c/{i}/{j} is missing after reopen"));
                assert_eq!(doc.value, format!("v{j}").into_bytes());
            }
        }
        again.release(FinalStatus::Done).await.unwrap();
    });
}

/// The owner is taken over while its commands are idle (it does not know yet: its
/// periodic heartbeat is 20 s away). Then eight commands commit at once: the groups the
/// committer gathers are refused, every one of them (the durable beat that would cover
/// them finds the newer owner, or the run is already fenced), and the commits acknowledged
/// before the takeover are all under the floor the taker recorded and in the store a later
/// owner opens.
#[test]
fn a_group_gathered_after_a_takeover_acknowledges_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let mut o = fast();
        o.policy =
            TimingPolicy::from_millis(20_000, 60_000, 120_000, HeartbeatDurability::Local).unwrap();
        let run = Run::open(&path, o).await.unwrap();
        let env = command_env(&run).await;
        let g = run.generation().get();
        let done = tokio::task::spawn_blocking(move || commit_together(clients(&env, g), "a", 10))
            .await
            .unwrap();
        let acked = (CLIENTS * 10) as u64;
        assert!(
            done.iter().all(|(_, rs)| rs.iter().all(Result::is_ok)),
            "before the takeover every commit is acknowledged"
        );

        // Another owner takes over, as `runlease takeover` would from another process.
        let folder = lease_fs::RunDir::open(&path).unwrap();
        let head = folder.status(now_ts(), false).unwrap().head.unwrap();
        assert_eq!(head.beat.as_ref().unwrap().store_head, Some(acked));
        let taker = folder
            .takeover(TakeoverParams {
                run_id: folder.run_id().clone(),
                owner_id: Identity::new("taker").unwrap(),
                holder: lease_fs::this_holder().unwrap(),
                policy: fast().policy,
                now: now_ts(),
                expect: Expectation::of(&head),
                // The record has not changed since the last commit's beat: the owner's
                // periodic beats are 20 s apart. The watch is the operator's word.
                trigger: TakeoverTrigger::Operator {
                    watched_unchanged_ms: 120_001,
                },
            })
            .unwrap();
        assert!(run.check_live().is_ok(), "the owner does not know yet");

        let clients: Vec<StoreClient> = done.into_iter().map(|(c, _)| c).collect();
        let after: Vec<Vec<Result<u64, RunError>>> = tokio::task::spawn_blocking(move || {
            commit_together(clients, "b", 5)
                .into_iter()
                .map(|(_, rs)| rs)
                .collect()
        })
        .await
        .unwrap();
        let mut fenced = 0;
        for rs in &after {
            if let Some(seq) = rs.iter().find_map(|r| r.as_ref().ok()) {
                panic!("commit {seq} acknowledged after the takeover: {rs:?}");
            }
            assert_eq!(rs.len(), 1, "a client stops at its first refusal: {rs:?}");
            match &rs[0] {
                Ok(seq) => panic!("commit {seq} acknowledged after the takeover"),
                Err(e) if e.is_fenced() => fenced += 1,
                // The fence stops the socket's threads: a request caught by it is cut off
                // unanswered, and says the commit may or may not have been made.
                Err(e) => assert!(
                    e.to_string().contains("may or may not have been made")
                        || e.to_string().contains("no longer serves"),
                    "{e}"
                ),
            }
        }
        assert!(fenced > 0, "no request was answered FENCED: {after:?}");
        let e = tokio::time::timeout(Duration::from_secs(5), run.fenced())
            .await
            .expect("the owner fences");
        assert!(e.is_fenced(), "{e}");
        let e = run.release(FinalStatus::Done).await.unwrap_err();
        assert!(e.is_fenced(), "{e}");
        drop(after);

        // The taker hands the run back; the next owner finds every acknowledged commit.
        folder
            .release(lease_core::ops::ReleaseParams {
                lease: taker,
                now: now_ts(),
                seal: None,
            })
            .unwrap();
        drop(folder);
        let again = Run::open(&path, fast()).await.unwrap();
        let store = again.store();
        assert!(store.head().unwrap() >= acked);
        for i in 0..CLIENTS {
            for j in 0..10 {
                let doc = store.get(&format!("a/{i}/{j}")).unwrap();
                assert_eq!(
                    doc.map(|d| d.value),
                    Some(format!("v{j}").into_bytes()),
                    "a/{i}/{j}"
                );
            }
        }
        again.release(FinalStatus::Done).await.unwrap();
    });
}
