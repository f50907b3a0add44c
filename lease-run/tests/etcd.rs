//! lease-run with its lease in a real 3-member etcd cluster (`Authority::Etcd`): open,
//! commit, release and reopen (the seal lives in the lease chain in etcd; run.json and the
//! store stay in the folder); a second owner refused while the first holds the lease; a
//! folder lacking the store the chain names (`STORE_MISSING`, before any claim, also in a
//! race of eight hosts); the owner fenced, its command killed, when the whole cluster is
//! stopped; a takeover only after the owner's etcd lease expired.
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
    // Only the lease moved: no lease file in the folder; run.json and the store are here.
    assert!(
        files_below(&path.join("lease")).is_empty() && files_below(&path.join("events")).is_empty(),
        "{:?}",
        files_below(&path)
    );
    assert!(path.join("store").join("run.sqlite").exists());
    let st = run_json(&path);
    assert_eq!((st.status, st.sealed_sequence), (RunState::Done, Some(1)));
    // The release epoch in etcd carries the seal.
    let view = obs.status(now_ts(), false).unwrap();
    assert_eq!(view.status, Status::Free);
    let head = view.head.unwrap();
    assert_eq!(head.generation().get(), 2);
    let seal = head.epoch.seal.clone().expect("sealed release");
    assert_eq!(seal.sequence, 1);
    // Reopen: the seal is read from the chain in etcd and checked against the store.
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
        // Free now, but the chain names a store host-b's folder lacks: refused by the
        // preflight, before the claim (issue #17), so the lease in etcd is untouched.
        let obs = observer(&cluster, "t-held", "job");
        let head = |o: &EtcdLease| o.status(now_ts(), false).unwrap().head.unwrap();
        let before = head(&obs).generation();
        let err = Run::open(&b, o.clone()).await.unwrap_err();
        assert_eq!(err.code().as_str(), "STORE_MISSING", "{err}");
        assert_eq!(head(&obs).generation(), before, "nothing was claimed");
        // host-a's folder still opens with its store.
        let run = Run::open(&a, o.clone()).await.unwrap();
        assert_eq!(run.store().head().unwrap(), 1);
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
fn in_a_race_of_eight_hosts_only_the_one_with_the_store_claims() {
    let Some((_g, cluster)) = setup() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let o = opts(&cluster, "t-race8");
    let host = |i: usize| tmp.path().join(format!("host-{i}")).join("job");
    let obs = observer(&cluster, "t-race8", "job");
    rt().block_on(async {
        let run = Run::open(&host(0), o.clone()).await.unwrap();
        run.commit(Batch::new().put("k", "v")).await.unwrap();
        run.release(FinalStatus::Done).await.unwrap();
    });
    let released = obs
        .status(now_ts(), false)
        .unwrap()
        .head
        .unwrap()
        .generation();
    let results: Vec<(usize, Result<u64, String>)> = rt().block_on(async {
        let mut tasks = Vec::new();
        for i in (0..8).rev() {
            let (p, o) = (host(i), o.clone());
            tasks.push(tokio::spawn(async move {
                let r = match Run::open(&p, o).await {
                    Ok(run) => {
                        let g = run.generation().get();
                        assert_eq!(run.store().head().unwrap(), 1);
                        run.release(FinalStatus::Done).await.unwrap();
                        Ok(g)
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
    for (i, r) in &results {
        match (i, r) {
            (0, r) => assert_eq!(r, &Ok(released.get() + 1), "host-0: {r:?}"),
            // Refused before claiming: the store is missing, or (once host-0 holds the
            // run) it is held; never a claim.
            (_, Err(code)) if code == "STORE_MISSING" || code == "RUN_ALREADY_ACTIVE" => {}
            (_, r) => panic!("host-{i}: {r:?}"),
        }
    }
    // Only host-0's claim and release moved the chain.
    let head = obs.status(now_ts(), false).unwrap().head.unwrap();
    assert_eq!(head.generation().get(), released.get() + 2);
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
