//! The store served to the run's commands over its socket (issue #20): commits and reads
//! through `StoreClient`, the refusals made before the store is touched (a wrong secret, a
//! stale generation, a released owner), the floor covering every acknowledged commit, group
//! commit under concurrent clients, and a release requested over the socket.

use lease_core::LeaseOps;
use lease_run::store_socket::{SOCKET_VAR, StoreClient};
use lease_run::{FinalStatus, INCARNATION_VAR, Run};
use lease_sqlite::Batch;
use std::collections::BTreeMap;

mod support;
use support::{fast, now_ts, rt};

/// The variables a command of `run` is given, read from a real command.
async fn command_env(run: &Run) -> BTreeMap<String, String> {
    let out = run.command("env").output().await.unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn client(env: &BTreeMap<String, String>, secret: &str, generation: u64) -> StoreClient {
    StoreClient::connect(&env[SOCKET_VAR], &env["RUNLEASE_RUN"], generation, secret).unwrap()
}

#[test]
fn a_command_commits_and_reads_through_the_socket_and_strangers_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let env = command_env(&run).await;
        let g = run.generation().get();
        assert_eq!(env.get(SOCKET_VAR).map(String::as_str), run.store_socket());
        assert!(env[SOCKET_VAR].starts_with("@runlease-store-"));
        let secret = env[INCARNATION_VAR].clone();

        let (answers, refusals) = tokio::task::spawn_blocking(move || {
            let mut c = client(&env, &secret, g);
            let s1 = c
                .commit(
                    &Batch::new()
                        .put("doc/a", vec![0u8, 159, 146, 150])
                        .log("one"),
                )
                .unwrap();
            let s2 = c
                .commit(&Batch::new().put("doc/b", "2").delete("doc/a"))
                .unwrap();
            let got = (
                s1,
                s2,
                c.get("doc/a").unwrap(),
                c.get("doc/b").unwrap().unwrap(),
                c.scan_prefix("doc/").unwrap().len(),
                c.commits_since(0, None).unwrap(),
                c.head().unwrap(),
            );
            // A wrong secret: refused before the store, whatever the request.
            let mut stranger = client(&env, "0000000000000000000000000000dead", g);
            let e1 = stranger
                .commit(&Batch::new().put("doc/x", "x"))
                .unwrap_err();
            let e2 = stranger.get("doc/b").unwrap_err();
            // No secret at all (an empty one): the same refusal.
            let e0 = client(&env, "", g).head().unwrap_err();
            assert_eq!(e0.code().as_str(), "STORE_REQUEST_REFUSED", "{e0}");
            // The right secret but another generation's stamp: FENCED.
            let mut stale = client(&env, &secret, g - 1);
            let e3 = stale.commit(&Batch::new().put("doc/x", "x")).unwrap_err();
            (got, (e1, e2, e3))
        })
        .await
        .unwrap();
        let (s1, s2, a, b, listed, log, head) = answers;
        assert_eq!((s1, s2, head), (1, 2, 2));
        assert_eq!(a, None, "deleted by the second commit");
        assert_eq!((b.value.as_slice(), b.updated_seq), (&b"2"[..], 2));
        assert_eq!(listed, 1);
        assert_eq!(log.len(), 2);
        assert_eq!(log[0].log, vec![b"one".to_vec()]);
        assert!(log.iter().all(|c| c.token == g));
        let (e1, e2, e3) = refusals;
        for e in [&e1, &e2] {
            assert_eq!(e.code().as_str(), "STORE_REQUEST_REFUSED", "{e}");
            assert!(e.to_string().contains("secret"), "{e}");
        }
        assert!(e3.is_fenced(), "{e3}");
        assert!(
            e3.to_string().contains(&format!("generation {}", g - 1)),
            "{e3}"
        );
        assert_eq!(
            run.store().get("doc/x").unwrap(),
            None,
            "nothing refused was written"
        );
        assert_eq!(run.store().head().unwrap(), 2);
        run.release(FinalStatus::Done).await.unwrap();
    });
}

/// Every acknowledged commit is in the floor: right after the answer, the heartbeat a
/// replacer would read already carries its sequence (the default policy's beats are
/// `local`; the one that acknowledges commits is fsynced).
#[test]
fn an_acknowledged_commit_is_already_in_the_heartbeat_a_replacer_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let mut o = fast();
        // Heartbeats far apart: only the commit's own beat can carry the head in time.
        o.policy = lease_core::TimingPolicy::from_millis(
            20_000,
            60_000,
            120_000,
            lease_core::HeartbeatDurability::Local,
        )
        .unwrap();
        let run = Run::open(&path, o).await.unwrap();
        let env = command_env(&run).await;
        let g = run.generation().get();
        let secret = env[INCARNATION_VAR].clone();
        let folder = lease_fs::RunDir::open(&path).unwrap();
        for want in 1..=3u64 {
            let (env2, s2) = (env.clone(), secret.clone());
            let seq = tokio::task::spawn_blocking(move || {
                client(&env2, &s2, g).commit(&Batch::new().put("k", want.to_string()))
            })
            .await
            .unwrap()
            .unwrap();
            assert_eq!(seq, want);
            let view = folder.status(now_ts(), false).unwrap();
            let beat = view.head.unwrap().beat.unwrap();
            assert_eq!(beat.store_head, Some(want), "the floor lags the answer");
        }
        run.release(FinalStatus::Done).await.unwrap();
    });
}

/// 32 clients commit at once: every commit is acknowledged, sequences are 1..=N without
/// gaps or repeats, and each client's value is there.
#[test]
fn concurrent_clients_are_all_acknowledged_without_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let env = command_env(&run).await;
        let g = run.generation().get();
        let secret = env[INCARNATION_VAR].clone();
        let seqs = tokio::task::spawn_blocking(move || {
            let threads: Vec<_> = (0..32)
                .map(|i| {
                    let (env, secret) = (env.clone(), secret.clone());
                    std::thread::spawn(move || {
                        let mut c = client(&env, &secret, g);
                        (0..4)
                            .map(|j| {
                                c.commit(&Batch::new().put(format!("c/{i}/{j}"), "v"))
                                    .unwrap()
                            })
                            .collect::<Vec<u64>>()
                    })
                })
                .collect();
            threads
                .into_iter()
                .flat_map(|t| t.join().unwrap())
                .collect::<Vec<u64>>()
        })
        .await
        .unwrap();
        let mut sorted = seqs.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (1..=128).collect::<Vec<u64>>());
        assert_eq!(run.store().scan_prefix("c/").unwrap().len(), 128);
        run.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn a_release_is_requested_over_the_socket_and_a_released_owner_answers_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let env = command_env(&run).await;
        let g = run.generation().get();
        let secret = env[INCARNATION_VAR].clone();
        let (e2, s2) = (env.clone(), secret.clone());
        tokio::task::spawn_blocking(move || client(&e2, &s2, g).request_release().unwrap())
            .await
            .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), run.release_requested())
            .await
            .expect("the request reaches the owner");
        run.release(FinalStatus::Done).await.unwrap();
        let e =
            StoreClient::connect(&env[SOCKET_VAR], &env["RUNLEASE_RUN"], g, &secret).unwrap_err();
        assert!(e.is_fenced(), "{e}");
        assert!(e.to_string().contains("no longer serves"), "{e}");
    });
}

/// The library's own path to the same guarantee: `Run::commit_covered` returns once the
/// heartbeat carries the commit; a plain `Run::commit` waits for the next heartbeat.
#[test]
fn commit_covered_puts_the_commit_in_the_floor_before_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let mut o = fast();
        o.policy = lease_core::TimingPolicy::from_millis(
            20_000,
            60_000,
            120_000,
            lease_core::HeartbeatDurability::Local,
        )
        .unwrap();
        let run = Run::open(&path, o).await.unwrap();
        let folder = lease_fs::RunDir::open(&path).unwrap();
        let floor = || {
            folder
                .status(now_ts(), false)
                .unwrap()
                .head
                .unwrap()
                .beat
                .unwrap()
                .store_head
        };
        // Wait for the first beat (at open) to be written.
        for _ in 0..100 {
            if folder
                .status(now_ts(), false)
                .unwrap()
                .head
                .unwrap()
                .beat
                .is_some()
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(run.commit(Batch::new().put("a", "1")).await.unwrap(), 1);
        // The beat at open was written before the store was opened (no head yet).
        assert!(floor() < Some(1), "a plain commit waits for the next beat");
        assert_eq!(
            run.commit_covered(Batch::new().put("b", "2"))
                .await
                .unwrap(),
            2
        );
        assert_eq!(floor(), Some(2), "covered at once");
        run.release(FinalStatus::Done).await.unwrap();
    });
}

/// Raw frames, as a hostile or broken client would send them: not JSON, no secret field, an
/// unknown operation, a wrong version, and a length over the limit (refused, then the
/// connection is closed without reading the body). Nothing reaches the store.
#[test]
fn malformed_frames_are_refused_before_the_store_and_an_oversized_one_closes_the_connection() {
    use lease_run::store_socket::{MAX_FRAME, read_frame, write_frame};
    use std::os::linux::net::SocketAddrExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let env = command_env(&run).await;
        let (socket, secret) = (env[SOCKET_VAR].clone(), env[INCARNATION_VAR].clone());
        let g = run.generation().get();
        let answers = tokio::task::spawn_blocking(move || {
            let name = socket.strip_prefix('@').unwrap();
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            let mut s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
            let mut ask = |body: &[u8]| -> serde_json::Value {
                write_frame(&mut s, body).unwrap();
                serde_json::from_slice(&read_frame(&mut s).unwrap().unwrap()).unwrap()
            };
            let mut answers = vec![
                ask(b"not json"),
                ask(format!(r#"{{"v":1,"generation":{g},"op":"head"}}"#).as_bytes()),
                ask(format!(r#"{{"v":1,"secret":"{secret}","generation":{g},"op":"drop_table"}}"#).as_bytes()),
                ask(format!(r#"{{"v":2,"secret":"{secret}","generation":{g},"op":"head"}}"#).as_bytes()),
                ask(format!(r#"{{"v":1,"secret":"{secret}","generation":{g},"op":"commit","writes":[{{"put":"k","value":"zz"}}]}}"#).as_bytes()),
                ask(format!(r#"{{"v":1,"secret":"{secret}","generation":{g},"op":"head"}}"#).as_bytes()),
            ];
            // A length over the limit: one refusal, then the owner closes the connection.
            let len = u32::try_from(MAX_FRAME + 1).unwrap().to_be_bytes();
            std::io::Write::write_all(&mut s, &len).unwrap();
            answers.push(serde_json::from_slice(&read_frame(&mut s).unwrap().unwrap()).unwrap());
            assert!(read_frame(&mut s).unwrap().is_none(), "closed after the refusal");
            answers
        })
        .await
        .unwrap();
        let codes: Vec<&str> = answers.iter().map(|a| a["code"].as_str().unwrap_or("ok")).collect();
        assert_eq!(
            codes,
            [
                "ARGUMENT_INVALID",
                "STORE_REQUEST_REFUSED",
                "ARGUMENT_INVALID",
                "ARGUMENT_INVALID",
                "ARGUMENT_INVALID",
                "ok",
                "ARGUMENT_INVALID"
            ],
            "{answers:?}"
        );
        assert_eq!(answers[5]["head"], 0, "nothing was committed");
        assert_eq!(run.store().head().unwrap(), 0);
        run.release(FinalStatus::Done).await.unwrap();
    });
}
