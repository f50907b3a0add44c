//! The store served to the run's commands over its socket (issue #20): commits and reads
//! through `StoreClient`, the refusals made before the store is touched (a wrong secret, a
//! stale generation, a released owner), the floor covering every acknowledged commit, group
//! commit under concurrent clients, and a release requested over the socket.

use lease_core::LeaseOps;
use lease_run::store_socket::{
    Challenge, HANDSHAKE_DEADLINE, Hello, MAX_ANSWER, MAX_FRAME, MAX_HELLO, MAX_WELCOME, Proof,
    SOCKET_VAR, Side, StoreClient, UNAUTHENTICATED_SLOTS, VERSION, nonce, nonce_of, prove,
    read_frame_limited, transcript, verify, write_frame,
};
use lease_run::{FinalStatus, INCARNATION_VAR, Run};
use lease_sqlite::Batch;
use std::collections::BTreeMap;
use std::time::Duration;

mod support;
use support::{command_env, fast, now_ts, rt};

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
            // A wrong secret: the owner's proof does not check out against it, so the
            // client refuses the socket before it proves (or asks) anything.
            let connect = |secret: &str, g: u64| {
                StoreClient::connect(&env[SOCKET_VAR], &env["RUNLEASE_RUN"], g, secret)
            };
            let e1 = connect("0000000000000000000000000000dead", g).unwrap_err();
            // No secret at all (an empty one): the same refusal.
            let e2 = connect("", g).unwrap_err();
            // The right secret but another generation's stamp: FENCED, in the welcome.
            let e3 = connect(&secret, g - 1).unwrap_err();
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
            assert!(e.to_string().contains("incarnation secret"), "{e}");
            assert!(e.to_string().contains("nothing secret was sent"), "{e}");
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

/// A raw connection to the socket announced as `socket`.
fn raw(socket: &str) -> std::os::unix::net::UnixStream {
    use std::os::linux::net::SocketAddrExt;
    let name = socket.strip_prefix('@').unwrap();
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s
}

/// Whether the owner closed `s` (an end of stream, or a reset: it closes a connection with
/// unread garbage in it).
fn closed(s: &mut std::os::unix::net::UnixStream) -> bool {
    match read_frame_limited(s, MAX_HELLO) {
        Ok(None) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(Some(_)) => false,
    }
}

fn frame(s: &mut std::os::unix::net::UnixStream, limit: usize) -> Option<serde_json::Value> {
    read_frame_limited(s, limit)
        .unwrap()
        .map(|f| serde_json::from_slice(&f).unwrap())
}

/// The handshake done by hand (the module docs' four frames); returns the welcome.
fn handshake(
    s: &mut std::os::unix::net::UnixStream,
    socket: &str,
    secret: &str,
    g: u64,
) -> serde_json::Value {
    let name = socket.strip_prefix('@').unwrap();
    let cn = nonce().unwrap();
    let hello = Hello {
        v: VERSION,
        nonce: hex::encode(cn),
        generation: g,
    };
    write_frame(s, &serde_json::to_vec(&hello).unwrap()).unwrap();
    let ch: Challenge = serde_json::from_value(frame(s, MAX_HELLO).unwrap()).unwrap();
    let sn = nonce_of(&ch.nonce).unwrap();
    let t = transcript(Side::Server, name, &cn, &sn, g);
    assert!(
        verify(secret, &t, &hex::decode(&ch.proof).unwrap()),
        "the owner proves the secret"
    );
    let mine = prove(secret, &transcript(Side::Client, name, &cn, &sn, g));
    let proof = Proof {
        proof: hex::encode(mine),
    };
    write_frame(s, &serde_json::to_vec(&proof).unwrap()).unwrap();
    frame(s, MAX_WELCOME).unwrap()
}

/// Raw frames after the handshake, as a broken command would send them: not JSON, an
/// unknown operation, a value that is not hex, and a length over the limit (refused, then
/// the connection is closed without reading the body). Nothing reaches the store.
#[test]
fn malformed_requests_are_refused_before_the_store_and_an_oversized_one_closes_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let env = command_env(&run).await;
        let (socket, secret) = (env[SOCKET_VAR].clone(), env[INCARNATION_VAR].clone());
        let g = run.generation().get();
        let answers = tokio::task::spawn_blocking(move || {
            let mut s = raw(&socket);
            let welcome = handshake(&mut s, &socket, &secret, g);
            assert_eq!(welcome["ok"], true, "{welcome}");
            let mut ask = |body: &[u8]| -> serde_json::Value {
                write_frame(&mut s, body).unwrap();
                frame(&mut s, MAX_ANSWER).unwrap()
            };
            let mut answers = vec![
                ask(b"not json"),
                ask(br#"{"op":"drop_table"}"#),
                ask(br#"{"op":"commit","writes":[{"put":"k","value":"zz"}]}"#),
                ask(br#"{"op":"head"}"#),
            ];
            // A length over the limit: one refusal, then the owner closes the connection.
            let len = u32::try_from(MAX_FRAME + 1).unwrap().to_be_bytes();
            std::io::Write::write_all(&mut s, &len).unwrap();
            answers.push(frame(&mut s, MAX_ANSWER).unwrap());
            assert!(
                frame(&mut s, MAX_ANSWER).is_none(),
                "closed after the refusal"
            );
            answers
        })
        .await
        .unwrap();
        let codes: Vec<&str> = answers
            .iter()
            .map(|a| a["code"].as_str().unwrap_or("ok"))
            .collect();
        assert_eq!(
            codes,
            [
                "ARGUMENT_INVALID",
                "ARGUMENT_INVALID",
                "ARGUMENT_INVALID",
                "ok",
                "ARGUMENT_INVALID"
            ],
            "{answers:?}"
        );
        assert_eq!(answers[3]["head"], 0, "nothing was committed");
        assert_eq!(run.store().head().unwrap(), 0);
        run.release(FinalStatus::Done).await.unwrap();
    });
}

/// Before the handshake is done the owner reads at most 512 bytes a frame and says nothing
/// about itself: a frame announced as 16 MiB is refused at once (its body is never sent,
/// the answer comes anyway), as are a frame that is not a hello, an old protocol's request
/// (which carried the secret), and a wrong proof; no refusal names the folder, the run, a
/// user or the socket. A proof made for another socket's name is worth nothing.
#[test]
fn before_authentication_frames_are_tiny_and_refusals_name_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secretly-named-job");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let env = command_env(&run).await;
        let (socket, secret) = (env[SOCKET_VAR].clone(), env[INCARNATION_VAR].clone());
        let g = run.generation().get();
        let sock = socket.clone();
        let answers = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            // 1. a 16 MiB frame: only its length is sent, after a pause (so the connection
            //    task reads it, not the check at accept that 2. meets).
            let mut s = raw(&sock);
            std::thread::sleep(Duration::from_millis(200));
            std::io::Write::write_all(&mut s, &u32::try_from(MAX_FRAME).unwrap().to_be_bytes())
                .unwrap();
            out.push(frame(&mut s, MAX_HELLO).unwrap());
            assert!(closed(&mut s), "closed");
            // 2. 513 bytes: one over the limit.
            let mut s = raw(&sock);
            write_frame(&mut s, &[b' '; MAX_HELLO + 1]).unwrap();
            out.push(frame(&mut s, MAX_HELLO).unwrap());
            // 3. not a hello.
            let mut s = raw(&sock);
            write_frame(&mut s, b"GET / HTTP/1.0").unwrap();
            out.push(frame(&mut s, MAX_HELLO).unwrap());
            // 4. protocol 1's request, secret and all.
            let mut s = raw(&sock);
            let v1 = format!(r#"{{"v":1,"secret":"{secret}","generation":{g},"op":"head"}}"#);
            write_frame(&mut s, v1.as_bytes()).unwrap();
            out.push(frame(&mut s, MAX_HELLO).unwrap());
            // 5. a hello, then a wrong proof.
            let mut s = raw(&sock);
            let cn = nonce().unwrap();
            let hello = Hello {
                v: VERSION,
                nonce: hex::encode(cn),
                generation: g,
            };
            write_frame(&mut s, &serde_json::to_vec(&hello).unwrap()).unwrap();
            let ch = frame(&mut s, MAX_HELLO).unwrap();
            assert_eq!(ch["v"], VERSION, "{ch}");
            write_frame(
                &mut s,
                format!(r#"{{"proof":"{}"}}"#, "ab".repeat(32)).as_bytes(),
            )
            .unwrap();
            out.push(frame(&mut s, MAX_HELLO).unwrap());
            assert!(closed(&mut s), "closed");
            // 6. the right key, but a proof made for another socket's name.
            let mut s = raw(&sock);
            write_frame(&mut s, &serde_json::to_vec(&hello).unwrap()).unwrap();
            let ch: Challenge = serde_json::from_value(frame(&mut s, MAX_HELLO).unwrap()).unwrap();
            let sn = nonce_of(&ch.nonce).unwrap();
            let p = prove(
                &secret,
                &transcript(Side::Client, "runlease-store-0", &cn, &sn, g),
            );
            write_frame(
                &mut s,
                &serde_json::to_vec(&Proof {
                    proof: hex::encode(p),
                })
                .unwrap(),
            )
            .unwrap();
            out.push(frame(&mut s, MAX_HELLO).unwrap());
            out
        })
        .await
        .unwrap();
        let texts: Vec<String> = answers.iter().map(|a| a.to_string()).collect();
        for (a, t) in answers.iter().zip(&texts) {
            assert_eq!(a["code"], "STORE_REQUEST_REFUSED", "{t}");
            assert!(
                a["message"].as_str().unwrap().starts_with("refused: "),
                "{t}"
            );
            let uid = rustix::process::geteuid().as_raw().to_string();
            for leak in [
                "secretly-named-job",
                path.to_str().unwrap(),
                socket.as_str(),
                &socket[1..],
                "uid",
                "run ",
            ] {
                assert!(!t.contains(leak), "{t} names {leak}");
            }
            assert!(
                !t.contains(&format!(" {uid} ")) && !t.contains(&format!("({uid})")),
                "{t}"
            );
        }
        assert!(
            texts[0].contains(&format!(
                "a frame of {MAX_FRAME} bytes before authentication"
            )),
            "{}",
            texts[0]
        );
        assert!(texts[1].contains("at most 512"), "{}", texts[1]);
        assert!(texts[2].contains("not a store hello"), "{}", texts[2]);
        assert!(texts[3].contains("version 1 is not spoken"), "{}", texts[3]);
        assert!(texts[4].contains("not authenticated"), "{}", texts[4]);
        assert!(texts[5].contains("not authenticated"), "{}", texts[5]);
        assert_eq!(run.store().head().unwrap(), 0);
        run.release(FinalStatus::Done).await.unwrap();
    });
}

/// A connection that says nothing is closed once the handshake deadline passes.
#[test]
fn a_silent_connection_is_closed_at_the_handshake_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let socket = run.store_socket().unwrap().to_string();
        let (took, last) = tokio::task::spawn_blocking(move || {
            let mut s = raw(&socket);
            let t = std::time::Instant::now();
            let mut last = None;
            while let Some(f) = frame(&mut s, MAX_HELLO) {
                last = Some(f);
            }
            (t.elapsed(), last)
        })
        .await
        .unwrap();
        assert!(
            took >= HANDSHAKE_DEADLINE - Duration::from_millis(100)
                && took < HANDSHAKE_DEADLINE + Duration::from_secs(3),
            "closed after {took:?}"
        );
        let last = last.expect("a refusal before the close").to_string();
        assert!(last.contains("did not finish within 2000 ms"), "{last}");
        run.release(FinalStatus::Done).await.unwrap();
    });
}

/// 64 silent connections from this user (four times the unauthenticated slots): the
/// oldest are evicted as new ones arrive, and a command connecting after them all still
/// gets in and commits at once.
#[test]
fn silent_connections_are_evicted_so_a_command_still_gets_in() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let env = command_env(&run).await;
        let g = run.generation().get();
        let secret = env[INCARNATION_VAR].clone();
        let (closed, took) = tokio::task::spawn_blocking(move || {
            let silent: Vec<_> = (0..64).map(|_| raw(&env[SOCKET_VAR])).collect();
            std::thread::sleep(Duration::from_millis(300));
            let t = std::time::Instant::now();
            let mut c = client(&env, &secret, g);
            c.commit(&Batch::new().put("k", "v")).unwrap();
            let took = t.elapsed();
            // Within the handshake deadline, the silent ones over the slots are closed.
            let closed = silent
                .into_iter()
                .filter(|s| {
                    s.set_nonblocking(true).unwrap();
                    let mut b = [0u8; 1];
                    matches!(std::io::Read::read(&mut &*s, &mut b), Ok(0))
                })
                .count();
            (closed, took)
        })
        .await
        .unwrap();
        assert!(
            closed >= 64 - UNAUTHENTICATED_SLOTS,
            "only {closed} of 64 evicted"
        );
        assert!(took < HANDSHAKE_DEADLINE, "the command waited {took:?}");
        assert_eq!(run.store().head().unwrap(), 1);
        run.release(FinalStatus::Done).await.unwrap();
    });
}

/// What an impostor of this user receives: it holds a socket name (as after the owner
/// died) but not the secret. It answers the hello as it likes (a challenge with a made-up
/// proof; an old protocol's "ok"; a huge frame); the client refuses it every time, and all
/// it ever received is the hello: no secret, no proof, no key, no value.
#[test]
fn an_impostor_holding_the_name_is_refused_and_is_sent_nothing_secret() {
    use std::os::linux::net::SocketAddrExt;
    let secret = "5ec2e75ec2e75ec2e75ec2e75ec2e700";
    for answer in [
        format!(
            r#"{{"v":2,"nonce":"{}","proof":"{}"}}"#,
            "11".repeat(32),
            "22".repeat(32)
        ),
        r#"{"ok":true,"seq":424242,"generation":1}"#.to_string(),
        "huge".to_string(),
    ] {
        let name = format!("runlease-store-impostor{:016x}", rand_u64());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
        let a = answer.clone();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            // Read the hello, answer, then keep everything else that arrives.
            let n = std::io::Read::read(&mut s, &mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
            if a == "huge" {
                std::io::Write::write_all(&mut s, &u32::MAX.to_be_bytes()).unwrap();
            } else {
                write_frame(&mut s, a.as_bytes()).unwrap();
            }
            while let Ok(n) = std::io::Read::read(&mut s, &mut buf) {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            got
        });
        let e = StoreClient::connect(&format!("@{name}"), "/runs/job", 1, secret)
            .and_then(|mut c| {
                c.commit(&Batch::new().put("the-key", "the-value"))
                    .map(|_| ())
            })
            .unwrap_err();
        assert_eq!(e.code().as_str(), "STORE_REQUEST_REFUSED", "{answer}: {e}");
        assert!(e.to_string().contains("nothing secret was sent"), "{e}");
        assert!(e.to_string().contains("run /runs/job"), "{e}");
        let got = fake.join().unwrap();
        let text = String::from_utf8_lossy(&got);
        let hello: serde_json::Value = serde_json::from_slice(&got[4..])
            .unwrap_or_else(|_| panic!("{answer}: received {text}"));
        assert_eq!(
            hello.as_object().unwrap().len(),
            3,
            "only the hello: {text}"
        );
        assert_eq!(
            usize::try_from(u32::from_be_bytes(got[..4].try_into().unwrap())).unwrap(),
            got.len() - 4,
            "one frame: {text}"
        );
        for secretish in [
            secret,
            "the-key",
            "the-value",
            &hex::encode(b"the-value"),
            "proof",
        ] {
            assert!(
                !text.contains(secretish),
                "{answer}: the impostor received {secretish}: {text}"
            );
        }
    }
}

fn rand_u64() -> u64 {
    u64::from_be_bytes(nonce().unwrap()[..8].try_into().unwrap())
}

/// `list` and `log` over more than one frame's worth (9 MiB of values, 18 MiB as hex: more
/// than the 16 MiB a frame holds): answered a page at a time, every document and commit read back, in order.
#[test]
fn list_and_log_beyond_one_frame_are_read_a_page_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let env = command_env(&run).await;
        let g = run.generation().get();
        let secret = env[INCARNATION_VAR].clone();
        tokio::task::spawn_blocking(move || {
            let mut c = client(&env, &secret, g);
            let value = |i: u8| vec![i; 3 << 19];
            for i in 0..6u8 {
                c.commit(
                    &Batch::new()
                        .put(format!("big/{i}"), value(i))
                        .log(format!("#{i}")),
                )
                .unwrap();
            }
            c.commit(&Batch::new().put("small", "s")).unwrap();
            // One page holds at most 16 MiB: the first holds some, says there is more.
            let (first, more) = c.scan_prefix_page("big/", None, None).unwrap();
            assert!(
                more && first.len() < 6 && !first.is_empty(),
                "{}",
                first.len()
            );
            let all = c.scan_prefix("big/").unwrap();
            let keys: Vec<String> = all.iter().map(|d| d.key.clone()).collect();
            assert_eq!(keys, (0..6).map(|i| format!("big/{i}")).collect::<Vec<_>>());
            assert!(
                all.iter()
                    .enumerate()
                    .all(|(i, d)| d.value == value(u8::try_from(i).unwrap()))
            );
            let (page, more) = c.commits_page(0, None).unwrap();
            assert!(more && page.len() < 7, "{}", page.len());
            let log = c.commits_since(0, None).unwrap();
            assert_eq!(
                log.iter().map(|c| c.seq).collect::<Vec<_>>(),
                (1..=7).collect::<Vec<_>>()
            );
            assert_eq!(log[5].log, vec![b"#5".to_vec()]);
            let one = c.commits_since(5, Some(1)).unwrap();
            assert_eq!(one.iter().map(|c| c.seq).collect::<Vec<_>>(), [6]);
            // A page bounded by count too.
            let (two, more) = c.scan_prefix_page("", Some("big/3"), Some(2)).unwrap();
            assert_eq!(
                (two.iter().map(|d| d.key.as_str()).collect::<Vec<_>>(), more),
                (vec!["big/4", "big/5"], true)
            );
        })
        .await
        .unwrap();
        run.release(FinalStatus::Done).await.unwrap();
    });
}

/// The welcome names the run the owner serves; a client asked to use it for another
/// folder refuses (ARGUMENT_INVALID), naming both.
#[test]
fn the_owner_says_which_run_it_serves_and_another_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let env = command_env(&run).await;
        let g = run.generation().get();
        let secret = env[INCARNATION_VAR].clone();
        let (p, o) = (path.clone(), other.clone());
        tokio::task::spawn_blocking(move || {
            let c = client(&env, &secret, g);
            assert_eq!(c.served().generation, g);
            c.check_serves(&p).unwrap();
            let e = c.check_serves(&o).unwrap_err();
            assert_eq!(e.code().as_str(), "ARGUMENT_INVALID", "{e}");
            assert!(e.to_string().contains(&c.served().run), "{e}");
        })
        .await
        .unwrap();
        run.release(FinalStatus::Done).await.unwrap();
    });
}
