//! lease-run with its lease in a real 3-member etcd cluster (`Authority::Etcd`): open,
//! commit, release and reopen (the store is committed in etcd, issue #32; run.json and the
//! store's view stay in the folder); a second owner refused while the first holds the
//! lease; the run's state following its lease to another host's empty folder (after a
//! release, in a race of eight hosts, and after the owner died: 1000 values); the owner
//! fenced, its command killed, when the whole cluster is stopped; a takeover only after
//! the owner's etcd lease expired.
#![cfg(feature = "etcd")]

// Each test crate uses a part of the harness.
#[allow(dead_code)]
#[path = "../../lease-etcd/tests/cluster/mod.rs"]
mod cluster;

use cluster::{Cluster, SERIAL, etcd_binary};
use lease_core::LeaseOps;
use lease_core::ops::{Expectation, Status};
use lease_core::{HeartbeatDurability, RunId, RunState, RunStatus, TimingPolicy};
use lease_run::authority::EtcdLease;
use lease_run::{Authority, Batch, FinalStatus, OpenOptions, Run};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

mod support;
use support::{now_ts, rt};

/// Beat 300 ms, self-fence after 900 ms, stale after 2 s (the etcd lease's time to live).
fn policy() -> TimingPolicy {
    TimingPolicy::from_millis(300, 900, 2_000, HeartbeatDurability::Local).unwrap()
}

fn opts(cluster: &Cluster, prefix: &str) -> OpenOptions {
    OpenOptions {
        policy: policy(),
        term_grace: Duration::from_millis(300),
        kill_wait: Duration::from_secs(1),
        step_deadline: Duration::from_secs(4),
        authority: Authority::Etcd(cluster.addr(&[0, 1, 2], prefix)),
        ..OpenOptions::default()
    }
}

/// An observer of the run's lease in etcd (callable from async code).
fn observer(cluster: &Cluster, prefix: &str, run: &str) -> EtcdLease {
    EtcdLease::connect(
        &cluster.addr(&[0, 1, 2], prefix),
        RunId::new(run).unwrap(),
        EtcdLease::options(Duration::from_secs(4), Duration::from_secs(4)),
    )
    .unwrap()
}

fn run_json(path: &Path) -> RunStatus {
    lease_core::decode(&std::fs::read(path.join("run.json")).unwrap()).unwrap()
}

/// `run.json` as the engine holds it (issue #32).
fn run_json_in_etcd(obs: &EtcdLease) -> RunStatus {
    match obs
        .perform(lease_core::ops::Request::Read(
            lease_core::FileRef::RunStatus,
        ))
        .unwrap()
    {
        lease_core::ops::Response::Content(Some(b)) => lease_core::decode(&b).unwrap(),
        other => panic!("run.json in etcd: {other:?}"),
    }
}

/// Every file below `dir` (recursively).
fn files_below(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files_below(&p));
            } else {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

fn setup() -> Option<(std::sync::MutexGuard<'static, ()>, Cluster)> {
    setup_with(&[])
}

/// [`setup`] with extra flags for every member.
fn setup_with(extra: &[&str]) -> Option<(std::sync::MutexGuard<'static, ()>, Cluster)> {
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let bin = etcd_binary()?;
    Some((guard, Cluster::start_with(&bin, extra)))
}

#[test]
fn open_commit_release_and_reopen_over_etcd() {
    let Some((_g, cluster)) = setup() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("job");
    let out = tmp.path().join("env.txt");
    let o = opts(&cluster, "t-open");
    let url = o.authority.url().unwrap();
    let obs = observer(&cluster, "t-open", "job");
    rt().block_on(async {
        let run = Run::open(&path, o.clone()).await.unwrap();
        assert_eq!(run.generation().get(), 1);
        // The command learns where the lease lives.
        let mut cmd = run
            .spawn(
                &[
                    "sh".into(),
                    "-c".into(),
                    r#"printf %s "$RUNLEASE_AUTHORITY" > "$0""#.into(),
                    out.display().to_string(),
                ],
                &[],
            )
            .await
            .unwrap();
        assert!(cmd.wait().await.unwrap().success());
        assert_eq!(std::fs::read_to_string(&out).unwrap(), url);
        let seq = run.commit(Batch::new().put("k", "v")).await.unwrap();
        assert_eq!(seq, 1);
        // Held in etcd.
        let view = obs.status(now_ts(), true).unwrap();
        assert_eq!(view.status, Status::Active);
        run.release(FinalStatus::Done).await.unwrap();
    });
    // The lease and the store are in etcd: no lease file in the folder, no local store,
    // only the store's view (issue #32); run.json is here.
    assert!(
        files_below(&path.join("lease")).is_empty() && files_below(&path.join("events")).is_empty(),
        "{:?}",
        files_below(&path)
    );
    assert!(!path.join("store").join("run.sqlite").exists());
    assert!(path.join("store").join("view.sqlite").exists());
    let st = run_json(&path);
    assert_eq!((st.status, st.sealed_sequence), (RunState::Done, None));
    // The commit is a record in etcd; the release epoch carries no seal (nothing local to
    // bind).
    let log = obs.read_store_log(None, 0).unwrap();
    assert_eq!(log.records.len(), 1);
    assert_eq!(log.records[0].record.batches[0].writes[0].key, "k");
    let view = obs.status(now_ts(), false).unwrap();
    assert_eq!(view.status, Status::Free);
    let head = view.head.unwrap();
    assert_eq!(head.generation().get(), 2);
    assert!(head.epoch.seal.is_none());
    // run.json is in etcd too, as this host's folder has it.
    assert_eq!(run_json_in_etcd(&obs), st);
    // Reopen: the view is at the engine's tail.
    rt().block_on(async {
        let run = Run::open(&path, o.clone()).await.unwrap();
        assert_eq!(run.generation().get(), 3);
        assert_eq!(run.store().head().unwrap(), 1);
        assert_eq!(run.store().get("k").unwrap().unwrap().value, b"v");
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
    });
}

#[test]
fn a_second_owner_is_refused_while_the_first_holds_the_etcd_lease() {
    let Some((_g, cluster)) = setup() else { return };
    let tmp = tempfile::tempdir().unwrap();
    // Two folders of the same run id: two hosts' folders of one run.
    let a = tmp.path().join("host-a").join("job");
    let b = tmp.path().join("host-b").join("job");
    let o = opts(&cluster, "t-held");
    rt().block_on(async {
        let run = Run::open(&a, o.clone()).await.unwrap();
        let err = Run::open(&b, o.clone()).await.unwrap_err();
        assert_eq!(err.code().as_str(), "RUN_ALREADY_ACTIVE", "{err}");
        // Nothing was written for the refused open: no run.json in its folder.
        assert!(!b.join("run.json").exists());
        // The same folder: its kernel owner lock refuses first, as without etcd.
        let err = Run::open(&a, o.clone()).await.unwrap_err();
        assert_eq!(err.code().as_str(), "OWNER_LOCK_HELD");
        run.commit(Batch::new().put("k", "1")).await.unwrap();
        run.release(FinalStatus::Done).await.unwrap();
        // Free now: host-b's empty folder opens the run with its state (issue #32: the
        // store follows the lease), and commits.
        let run = Run::open(&b, o.clone()).await.unwrap();
        assert_eq!(run.store().head().unwrap(), 1);
        assert_eq!(run.store().get("k").unwrap().unwrap().value, b"1");
        run.commit(Batch::new().put("k", "2")).await.unwrap();
        run.release(FinalStatus::Done).await.unwrap();
        // host-a's view is behind by one record: caught up at its open.
        let run = Run::open(&a, o.clone()).await.unwrap();
        assert_eq!(run.store().head().unwrap(), 2);
        assert_eq!(run.store().get("k").unwrap().unwrap().value, b"2");
        run.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn a_stopped_cluster_fences_the_owner_and_kills_its_command() {
    let Some((_g, mut cluster)) = setup() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("job");
    let o = opts(&cluster, "t-stop");
    let rt = rt();
    let (run, mut cmd) = rt.block_on(async {
        let run = Run::open(&path, o.clone()).await.unwrap();
        let cmd = run
            .spawn(&["sleep".into(), "60".into()], &[])
            .await
            .unwrap();
        // A few good heartbeats first.
        tokio::time::sleep(Duration::from_millis(700)).await;
        run.check_live().unwrap();
        (run, cmd)
    });
    let stopped = Instant::now();
    for i in 0..3 {
        cluster.stop(i);
    }
    let (fenced, status) = rt.block_on(async {
        let e = tokio::time::timeout(Duration::from_secs(5), run.fenced())
            .await
            .expect("fenced within 5 s of stopping the cluster");
        let fenced = stopped.elapsed();
        assert_eq!(e.code().as_str(), "FENCED");
        // The wait reports the fence; the raw status is the kill's.
        let e = tokio::time::timeout(Duration::from_secs(2), cmd.wait())
            .await
            .expect("the command was killed")
            .unwrap_err();
        assert!(e.is_fenced(), "{e}");
        let status = cmd.wait_raw().await.unwrap();
        (fenced, status)
    });
    eprintln!(
        "fence time over etcd (cluster SIGSTOPped -> command killed and confirmed): {} ms (self_fence_after {} ms)",
        fenced.as_millis(),
        policy().self_fence_after_ms()
    );
    assert_eq!(status.signal(), Some(9), "{status:?}");
    // The last good heartbeat started at most one beat (plus one call) before the stop,
    // and the kill is confirmed within two watchdog ticks of the deadline.
    assert!(
        fenced <= policy().self_fence_after() + Duration::from_millis(300),
        "{fenced:?}"
    );
    for i in 0..3 {
        cluster.resume(i);
    }
    // A fenced run writes nothing: its release reports the fence.
    let err = rt.block_on(run.release(FinalStatus::Done)).unwrap_err();
    assert_eq!(err.code().as_str(), "FENCED");
    assert_eq!(run_json(&path).status, RunState::Running);
}

#[test]
fn a_takeover_succeeds_only_after_the_owner_etcd_lease_expired() {
    let Some((_g, cluster)) = setup() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("host-a").join("job");
    let b = tmp.path().join("host-b").join("job");
    let o = opts(&cluster, "t-take");
    let obs = observer(&cluster, "t-take", "job");
    rt().block_on(async {
        let run = Run::open(&a, o.clone()).await.unwrap();
        let mut cmd = run.spawn(&["sleep".into(), "60".into()], &[]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
        // A stuck heartbeat: no more keep-alives from here on.
        run.suspend_heartbeats();
        let stuck = Instant::now();
        let mut refused = 0;
        let taken = loop {
            let view = obs.status(now_ts(), false).unwrap();
            let head = view.head.clone().unwrap();
            let taker = OpenOptions {
                takeover: Some(Expectation::of(&head)),
                // The record has not changed since the heartbeats stopped (the watch a
                // real taker makes on its own clock; lease-run's acquire does that).
                takeover_watched: Some(stuck.elapsed()),
                ..o.clone()
            };
            match Run::open(&b, taker).await {
                Ok(r) => break r,
                Err(e) => {
                    assert!(
                        matches!(
                            e.code().as_str(),
                            "TAKEOVER_ACTIVE_REFUSED" | "TAKEOVER_RACE" | "RUN_ALREADY_ACTIVE"
                        ),
                        "{e}"
                    );
                    refused += 1;
                }
            }
            assert!(stuck.elapsed() < Duration::from_secs(10), "never taken over");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let after = stuck.elapsed();
        eprintln!(
            "takeover over etcd succeeded {} ms after the owner's heartbeats stopped ({refused} refusals before)",
            after.as_millis()
        );
        assert!(refused > 0);
        // The last keep-alive was at most one beat before the heartbeats stopped, and the
        // etcd lease lives its whole time to live (2 s) after it.
        assert!(
            after >= Duration::from_millis(2_000 - 300),
            "taken over while the etcd lease may have lived: {after:?}"
        );
        // The old owner fenced itself and its command was killed before that.
        let e = tokio::time::timeout(Duration::from_secs(1), cmd.wait())
            .await
            .expect("the old owner's command was killed")
            .unwrap_err();
        assert!(e.is_fenced(), "{e}");
        assert_eq!(cmd.wait_raw().await.unwrap().signal(), Some(9));
        assert!(run.check_live().is_err());
        assert_eq!(taken.generation().get(), 2);
        taken.release(FinalStatus::Done).await.unwrap();
        assert_eq!(
            run.release(FinalStatus::Done).await.unwrap_err().code().as_str(),
            "FENCED"
        );
    });
}

#[test]
fn an_unreachable_cluster_fails_the_open_with_unavailable() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("job");
    let o = OpenOptions {
        policy: policy(),
        step_deadline: Duration::from_secs(2),
        authority: Authority::Etcd(
            lease_etcd::AuthorityAddr::parse(&format!("etcd://127.0.0.1:{port}/p")).unwrap(),
        ),
        ..OpenOptions::default()
    };
    let started = Instant::now();
    let err = rt().block_on(Run::open(&path, o)).unwrap_err();
    assert_eq!(err.code().as_str(), "UNAVAILABLE", "{err}");
    // An operation ends by half the step deadline.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(!path.join("run.json").exists());
}

/// Issue #17: eight hosts race for a free run whose chain names a store only one of them
/// has. The hosts lacking it refuse before they claim (`STORE_MISSING`, or the run is held
/// by then), so the one with the store wins and no generation is used up by the others.
/// (Before the preflight checked the store, a host lacking it claimed first, found out,
/// and released: the rightful host lost the race and nobody won.)
#[test]
fn in_a_race_of_eight_hosts_each_owner_sees_every_commit_before_it() {
    let Some((_g, cluster)) = setup() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(&cluster, "t-race8");
    let host = |i: usize| tmp.path().join(format!("host-{i}")).join("job");
    rt().block_on(async {
        let run = Run::open(&host(0), o.clone()).await.unwrap();
        run.commit(Batch::new().put("first", "v")).await.unwrap();
        run.release(FinalStatus::Done).await.unwrap();
    });
    // Eight hosts (host-0 with a view, seven with empty folders) open at once: whoever
    // owns the run sees every commit made before it, and adds its own.
    let results: Vec<(usize, Result<u64, String>)> = rt().block_on(async {
        let mut tasks = Vec::new();
        for i in (0..8).rev() {
            let (p, o) = (host(i), o.clone());
            tasks.push(tokio::spawn(async move {
                let r = match Run::open(&p, o).await {
                    Ok(run) => {
                        let head = run.store().head().unwrap();
                        assert!(head >= 1, "host-{i} owns the run with an empty store");
                        assert!(run.store().get("first").unwrap().is_some());
                        run.commit(Batch::new().put(format!("host-{i}"), "was here"))
                            .await
                            .unwrap();
                        run.release(FinalStatus::Done).await.unwrap();
                        Ok(head)
                    }
                    Err(e) => Err(e.code().as_str().to_string()),
                };
                (i, r)
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    });
    let owners: Vec<usize> = results
        .iter()
        .filter_map(|(i, r)| match r {
            Ok(_) => Some(*i),
            Err(code) if code == "RUN_ALREADY_ACTIVE" || code == "TAKEOVER_RACE" => None,
            Err(code) => panic!("host-{i}: {code}"),
        })
        .collect();
    assert!(!owners.is_empty());
    // Every owner's commit is there, seen from a host that owned none of them.
    rt().block_on(async {
        let run = Run::open(&tmp.path().join("host-9").join("job"), o.clone())
            .await
            .unwrap();
        assert_eq!(run.store().head().unwrap(), 1 + owners.len() as u64);
        for i in &owners {
            assert!(
                run.store().get(&format!("host-{i}")).unwrap().is_some(),
                "host-{i}"
            );
        }
        run.release(FinalStatus::Done).await.unwrap();
    });
}

/// Issue #32's failover: host A commits k=1..=1000 and dies (its process gone: its
/// heartbeats stop); host B, with its own empty folder, takes the run over once A's etcd
/// lease expired, sees every acknowledged value, and goes on committing.
#[test]
fn the_state_follows_the_lease_to_a_host_with_an_empty_folder() {
    let Some((_g, cluster)) = setup() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let a = tmp.path().join("host-a").join("job");
    let b = tmp.path().join("host-b").join("job");
    let o = opts(&cluster, "t-follow");
    let obs = observer(&cluster, "t-follow", "job");
    // Host A on a runtime of its own, which "dies" with it.
    let rt_a = tokio::runtime::Runtime::new().unwrap();
    let run_a = rt_a.block_on(async {
        let run = Run::open(&a, o.clone()).await.unwrap();
        for g in 0..100u64 {
            let batches: Vec<Batch> = (1..=10)
                .map(|i| {
                    let k = g * 10 + i;
                    Batch::new().put(format!("k{k}"), format!("v{k}"))
                })
                .collect();
            let store = run.store();
            let seqs = tokio::task::spawn_blocking(move || store.commit_group(&batches))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(seqs.last(), Some(&(g * 10 + 10)));
        }
        run
    });
    let died = Instant::now();
    run_a.suspend_heartbeats();
    std::mem::forget(run_a);
    rt_a.shutdown_background();
    let taken = rt().block_on(async {
        loop {
            let head = obs.status(now_ts(), false).unwrap().head.unwrap();
            let taker = OpenOptions {
                takeover: Some(Expectation::of(&head)),
                takeover_watched: Some(died.elapsed()),
                ..o.clone()
            };
            match Run::open(&b, taker).await {
                Ok(r) => break r,
                Err(e) => assert!(
                    matches!(
                        e.code().as_str(),
                        "TAKEOVER_ACTIVE_REFUSED" | "TAKEOVER_RACE" | "RUN_ALREADY_ACTIVE"
                    ),
                    "{e}"
                ),
            }
            assert!(died.elapsed() < Duration::from_secs(15), "never taken over");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let failover = died.elapsed();
    rt().block_on(async {
        let store = taken.store();
        assert_eq!(store.head().unwrap(), 1000);
        for k in 1..=1000 {
            assert_eq!(
                store.get(&format!("k{k}")).unwrap().unwrap().value,
                format!("v{k}").into_bytes(),
                "k{k}"
            );
        }
        assert_eq!(
            taken.commit(Batch::new().put("k1", "b")).await.unwrap(),
            1001
        );
        // The run's status followed it too: etcd's run.json is host B's generation.
        let rs = run_json_in_etcd(&obs);
        assert_eq!(rs.generation, taken.generation());
        assert_eq!(rs.status, RunState::Running);
        eprintln!(
            "failover: host B took over {} ms after host A died and saw all 1000 values",
            failover.as_millis()
        );
        taken.release(FinalStatus::Done).await.unwrap();
    });
}

/// Issue #31: when the cluster fills up (its NOSPACE alarm), every heartbeat is refused
/// until an operator acts, so the owner fences at once with that reason (naming the alarm)
/// instead of running on unheard until its self-fence deadline; its command is killed.
#[test]
fn a_full_cluster_fences_the_owner_at_once_naming_the_alarm() {
    let Some((_g, cluster)) = setup_with(&["--quota-backend-bytes", "4194304"]) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("job");
    let rt = rt();
    let (run, mut cmd) = rt.block_on(async {
        let run = Run::open(&path, opts(&cluster, "t-full")).await.unwrap();
        let cmd = run
            .spawn(&["sleep".into(), "60".into()], &[])
            .await
            .unwrap();
        (run, cmd)
    });
    // Another run of the cluster fills it.
    let refused = cluster.fill("t-filler");
    assert_eq!(refused.code().as_str(), "ETCD_NOSPACE", "{refused}");
    rt.block_on(async {
        let e = tokio::time::timeout(Duration::from_secs(5), run.fenced())
            .await
            .expect("fenced once the cluster is full");
        assert_eq!(e.code().as_str(), "FENCED");
        let text = e.to_string();
        assert!(
            text.contains("NOSPACE"),
            "the fence names the alarm: {text}"
        );
        // Fenced by the refusal itself, not by the lapse of its self-fence deadline (which
        // would also quote the last failure).
        assert!(
            !text.contains("the last heartbeat failed with"),
            "fenced at once, not at the deadline: {text}"
        );
        let killed = tokio::time::timeout(Duration::from_secs(2), cmd.wait()).await;
        assert!(killed.is_ok(), "the command was killed");
    });
}

/// Issue #31: a waiting acquire keeps waiting through a leaderless cluster (two of three
/// members stopped for 5 s: every attempt is UNAVAILABLE) and owns the run once a leader
/// is back, within its deadline.
#[test]
fn a_waiting_acquire_waits_through_a_leaderless_window_and_owns_the_run() {
    use lease_run::{Acquire, Wait};
    let Some((_g, mut cluster)) = setup() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("job");
    std::fs::create_dir_all(&path).unwrap();
    cluster.stop(1);
    cluster.stop(2);
    let stopped = Instant::now();
    let rt = rt();
    let o = opts(&cluster, "t-leaderless");
    let acquired = std::thread::scope(|s| {
        let resumer = s.spawn(|| {
            std::thread::sleep(Duration::from_secs(5));
            cluster.resume(1);
            cluster.resume(2);
        });
        let r = rt.block_on(Run::acquire(
            &path,
            Acquire::Claim,
            Wait::Until(Instant::now() + Duration::from_secs(30)),
            o,
            &mut (),
        ));
        resumer.join().unwrap();
        r
    });
    let (run, _) = acquired.expect("owned once a leader was back");
    assert!(
        stopped.elapsed() >= Duration::from_secs(5),
        "owned only after the window"
    );
    rt.block_on(run.release(FinalStatus::Done)).unwrap();
}

/// A folder whose local store (`store/run.sqlite`, here from the run folder as authority)
/// the engine has no record of is refused before anything is written, never set aside: the
/// engine's store would start empty beside that data. Moved out of the folder, the run
/// starts with an empty store in etcd.
#[test]
fn a_local_store_the_engine_never_saw_is_refused_not_set_aside() {
    let Some((_g, cluster)) = setup() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("job");
    rt().block_on(async {
        let local = Run::open(
            &path,
            OpenOptions {
                policy: policy(),
                ..OpenOptions::default()
            },
        )
        .await
        .unwrap();
        local.commit(Batch::new().put("k", "local")).await.unwrap();
        local.release(FinalStatus::Done).await.unwrap();
    });
    // What a run that kept its store in this folder over etcd before issue #32 leaves: a
    // store, and no local lease. (With the folder's own run.json and lease/ left, the
    // switch to etcd is refused earlier: run.json names a generation etcd's chain lacks,
    // CHAIN_BROKEN.)
    std::fs::remove_file(path.join("run.json")).unwrap();
    std::fs::remove_dir_all(path.join("lease")).unwrap();
    let o = opts(&cluster, "t-unseen");
    let obs = observer(&cluster, "t-unseen", "job");
    let err = rt().block_on(Run::open(&path, o.clone())).unwrap_err();
    assert_eq!(err.code().as_str(), "STORE_MISSING", "{err}");
    assert!(err.to_string().contains("store/run.sqlite"), "{err}");
    assert!(
        obs.status(now_ts(), false).unwrap().head.is_none(),
        "nothing was claimed in etcd"
    );
    std::fs::rename(
        path.join("store").join("run.sqlite"),
        tmp.path().join("run.sqlite.aside"),
    )
    .unwrap();
    rt().block_on(async {
        let run = Run::open(&path, o.clone()).await.unwrap();
        assert_eq!(run.store().head().unwrap(), 0);
        run.release(FinalStatus::Done).await.unwrap();
    });
}
