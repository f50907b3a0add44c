//! Owners cut off, crashed or deposed: self-fence, and nobody in before the etcd lease expired.

use crate::cluster::{Cluster, etcd_binary};
use crate::{
    Beater, claim_params, fast_policy, holder, id, lock_serial, now_ts, opts, retire_once_dead,
    retire_params,
};
use lease_core::LeaseOps;
use lease_core::ops::{Expectation, TakeoverTrigger};
use lease_core::{FileRef, HeartbeatDurability, RunId, TimingPolicy};
use lease_etcd::EtcdError;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[test]
fn cut_off_owner_self_fences_and_taker_waits_for_lease_expiry() {
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let mut cluster = Cluster::start(&bin);
    let policy = fast_policy();
    let run_id = RunId::new("cutoff").unwrap();
    let store_dir = tempfile::tempdir().unwrap();
    let store_path = store_dir.path().join("store/run.sqlite");

    // The owner talks to member 0 only; the taker to members 1 and 2.
    let owner_auth = cluster.authority(&[0], "t", opts());
    let owner = Arc::new(owner_auth.run(run_id.clone()));
    let lease = owner
        .claim(claim_params(&owner, "owner-a", 1, policy))
        .expect("claim");
    assert_eq!(lease.generation.get(), 1);
    {
        let mut store = lease_sqlite::Store::open(
            &run_id,
            &store_path,
            lease_sqlite::StoreOptions {
                create: true,
                expect: None,
            },
        )
        .unwrap()
        .check_seal(None, None)
        .unwrap();
        store
            .commit(lease.generation, &lease_sqlite::Batch::new().put("k", "a"))
            .expect("owner commits with its token");
        store.close().unwrap();
    }
    let mut beater = Beater::start(owner.clone(), lease.clone());
    std::thread::sleep(Duration::from_millis(1_000));
    assert!(
        beater.fenced_at.lock().unwrap().is_none(),
        "fenced while healthy"
    );
    assert!(owner.owner_lease_ttl(lease.generation).unwrap().is_some());

    cluster.stop(0);
    let stopped_at = Instant::now();

    let taker_auth = cluster.authority(&[1, 2], "t", opts());
    let taker = taker_auth.run(run_id.clone());
    let mut lease_alive_refusals = 0;
    let mut other_refusals = Vec::new();
    let (new_lease, took_at) = loop {
        assert!(
            stopped_at.elapsed() < Duration::from_secs(20),
            "no takeover 20 s after the owner was cut off ({lease_alive_refusals} refusals, {other_refusals:?})\n{}",
            cluster.logs()
        );
        let view = match taker.status(now_ts(), false) {
            Ok(v) => v,
            Err(e) if e.is_unavailable() => continue, // the election after member 0 left
            Err(e) => panic!("status: {e}"),
        };
        let head = view.head.expect("a head exists");
        match taker.takeover(lease_core::ops::TakeoverParams {
            run_id: taker.run_id().clone(),
            owner_id: id("owner-b"),
            holder: holder(2),
            policy,
            now: now_ts(),
            expect: Expectation::of(&head),
            trigger: TakeoverTrigger::Operator {
                watched_unchanged_ms: stopped_at.elapsed().as_millis() as u64,
            },
        }) {
            Ok(l) => break (l, Instant::now()),
            Err(EtcdError::OwnerLeaseAlive { .. }) => lease_alive_refusals += 1,
            Err(e) => {
                assert!(
                    matches!(
                        e.code().as_str(),
                        "TAKEOVER_ACTIVE_REFUSED" | "TAKEOVER_RACE" | "UNAVAILABLE"
                    ),
                    "{e}"
                );
                other_refusals.push(e.code().as_str());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let last_ok = *beater.last_ok.lock().unwrap();
    let (fenced_at, why) = beater
        .fenced_at
        .lock()
        .unwrap()
        .clone()
        .expect("the cut-off owner fenced itself before the taker got in (no double owner)");
    beater.join();
    // Self-fence within self_fence_after of the start of the last good heartbeat (plus
    // scheduling slack), before the taker became owner; the taker waited for the etcd
    // lease, which runs stale_after from a keep-alive received after that start.
    assert!(why.contains("self-fence"), "{why}");
    let fence_delay = fenced_at - last_ok;
    assert!(
        fence_delay <= policy.self_fence_after() + Duration::from_millis(400),
        "self-fenced {fence_delay:?} after the last good heartbeat started"
    );
    assert!(
        fenced_at < took_at,
        "double owner: the taker got in before the owner fenced"
    );
    assert!(
        took_at - last_ok >= policy.stale_after(),
        "takeover {:?} after the last good heartbeat: before the etcd lease could expire",
        took_at - last_ok
    );
    assert!(
        lease_alive_refusals > 0,
        "the taker was never held back by the etcd lease"
    );
    assert_eq!(new_lease.generation.get(), 2);
    eprintln!(
        "cut-off owner fenced {fence_delay:?} after its last good heartbeat; taker in after {:?} ({lease_alive_refusals} etcd-lease refusals)",
        took_at - last_ok
    );

    // The new owner commits with its token.
    {
        let mut store = lease_sqlite::Store::open(&run_id, &store_path, Default::default())
            .unwrap()
            .check_seal(None, None)
            .unwrap();
        store
            .commit(
                new_lease.generation,
                &lease_sqlite::Batch::new().put("k", "b"),
            )
            .expect("new owner commits");
        store.close().unwrap();
    }

    // The cut-off owner comes back: everything it tries is fenced.
    cluster.resume(0);
    let hb = owner.heartbeat(&lease, now_ts(), 99, None).unwrap_err();
    assert_eq!(hb.code().as_str(), "FENCED", "{hb}");
    let ap = owner
        .append(
            &lease,
            lease_core::ops::AppendParams {
                event_type: id("late.write"),
                payload: serde_json::json!({}),
                now: now_ts(),
                tail_hint: None,
            },
        )
        .unwrap_err();
    assert_eq!(ap.code().as_str(), "FENCED", "{ap}");
    let rel = owner
        .release(lease_core::ops::ReleaseParams {
            lease: lease.clone(),
            now: now_ts(),
            seal: None,
        })
        .unwrap_err();
    assert_eq!(rel.code().as_str(), "FENCED", "{rel}");
    let mut store = lease_sqlite::Store::open(&run_id, &store_path, Default::default())
        .unwrap()
        .check_seal(None, None)
        .unwrap();
    let refused = store
        .commit(
            lease.generation,
            &lease_sqlite::Batch::new().put("k", "late"),
        )
        .unwrap_err();
    assert_eq!(refused.code().as_str(), "FENCED");
    assert_eq!(store.get("k").unwrap().unwrap().value, b"b");
    store.close().unwrap();
    // The new owner is the only one: it heartbeats and releases.
    taker
        .heartbeat(&new_lease, now_ts(), 1, None)
        .expect("new owner heartbeats");
    taker
        .release(lease_core::ops::ReleaseParams {
            lease: new_lease.clone(),
            now: now_ts(),
            seal: None,
        })
        .expect("new owner releases");
}
#[test]
fn member_crash_during_heartbeats_keeps_the_lease() {
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let mut cluster = Cluster::start(&bin);
    // A leader crash makes writes wait for an election (up to 2 x the 500 ms election
    // timeout, plus a call timeout for the request that went to the dead leader): the
    // self-fence deadline must exceed that, or a member crash fences the owner.
    let policy = TimingPolicy::from_millis(400, 2_400, 3_200, HeartbeatDurability::Local).unwrap();
    let run_id = RunId::new("crash").unwrap();
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let run = Arc::new(auth.run(run_id.clone()));
    let lease = run
        .claim(claim_params(&run, "owner-a", 1, policy))
        .expect("claim");
    let mut beater = Beater::start(run.clone(), lease.clone());
    std::thread::sleep(Duration::from_millis(800));
    // Crash the leader: the hardest member to lose (an election must follow).
    let leader = cluster.leader();
    let victim = leader.unwrap_or(0);
    cluster.kill(victim);
    beater.mark.store(true, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(3_000));
    let ok_after = beater.ok_after_mark.load(Ordering::SeqCst);
    let failures = beater.failures.load(Ordering::SeqCst);
    let fenced = beater.fenced_at.lock().unwrap().clone();
    beater.join();
    assert!(
        fenced.is_none(),
        "the owner fenced after member {victim} crashed: {fenced:?}"
    );
    assert!(
        ok_after >= 3,
        "only {ok_after} heartbeats succeeded in 3 s after the crash ({failures} failed)"
    );
    eprintln!(
        "killed member m{victim} ({}): {ok_after} heartbeats ok after it, {failures} unavailable",
        if leader.is_some() {
            "the leader"
        } else {
            "leader unknown"
        }
    );
    // Still the owner: its etcd lease is alive, status active, appends and release work.
    assert!(run.owner_lease_ttl(lease.generation).unwrap().is_some());
    assert!(run.is_active(now_ts()).unwrap());
    run.append(
        &lease,
        lease_core::ops::AppendParams {
            event_type: id("after.crash"),
            payload: serde_json::json!({}),
            now: now_ts(),
            tail_hint: None,
        },
    )
    .expect("append after a member crash");
    let g = run
        .release(lease_core::ops::ReleaseParams {
            lease: lease.clone(),
            now: now_ts(),
            seal: None,
        })
        .expect("release");
    assert_eq!(g.get(), 2);
    assert_eq!(run.owner_lease_ttl(lease.generation).unwrap(), None);
}
#[test]
fn dead_owner_is_retired_only_after_its_etcd_lease_expired() {
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let policy = fast_policy();
    let run_id = RunId::new("retire").unwrap();
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let (lease, crashed_at) = {
        let owner = auth.run(run_id.clone());
        let l = owner
            .claim(claim_params(&owner, "owner-a", 1, policy))
            .unwrap();
        owner.heartbeat(&l, now_ts(), 1, None).unwrap();
        (l, Instant::now())
        // The handle is dropped without release: a crash.
    };
    let other = auth.run(run_id.clone());
    let refused = other
        .retire(retire_params(&other, "janitor", 3, policy))
        .unwrap_err();
    assert_eq!(
        refused.code().as_str(),
        "RETIRE_REFUSED_NOT_DEAD",
        "{refused}"
    );
    let retired = retire_once_dead(&other, policy, crashed_at);
    assert!(crashed_at.elapsed() >= policy.stale_after() - Duration::from_millis(100));
    assert_eq!(retired.generation.get(), lease.generation.get() + 1);
    let next = other
        .claim(claim_params(&other, "owner-c", 4, policy))
        .unwrap();
    assert_eq!(next.generation.get(), lease.generation.get() + 2);
}
/// Issue #31: etcd itself refuses a deposed owner's heartbeat. The owner's keep-alive is
/// one request before its beat; an owner paused between the two (its etcd lease expiring,
/// a janitor retiring it) must not land the beat: the guarded transaction answers FENCED
/// and writes nothing. Before it was deposed, the same request wrote the beat.
#[test]
fn a_deposed_owners_heartbeat_is_refused_by_etcd() {
    use lease_core::ops::{Durability, Request, Response};
    use lease_core::transport::Transport;
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let policy = fast_policy();
    let run_id = RunId::new("guarded-beat").unwrap();
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let owner = auth.run(run_id.clone());
    let lease = owner
        .claim(claim_params(&owner, "owner-a", 1, policy))
        .unwrap();
    let at = now_ts();
    let record = |n: u64| {
        lease_core::encode(&lease_core::HeartbeatRecord {
            run_id: run_id.clone(),
            generation: lease.generation,
            owner_id: id("owner-a"),
            heartbeat_at: at,
            count: n,
            store_head: None,
            mono: None,
        })
        .unwrap()
    };
    let beat = |n: u64| Request::WriteBeat {
        file: FileRef::Beat(lease.generation),
        seq: n,
        record: record(n),
        durability: Durability::Fsync,
    };
    let other = auth.run(run_id.clone());
    let read_beat = || match other.execute(
        Request::Read(FileRef::Beat(lease.generation)),
        other.default_bound(),
    ) {
        Ok(Response::Content(c)) => c,
        r => panic!("read of the beat: {r:?}"),
    };
    // While it owns the run, the guarded put lands.
    let r = owner.execute(beat(1), owner.default_bound());
    assert!(matches!(r, Ok(Response::Done)), "{r:?}");
    assert_eq!(read_beat(), Some(record(1)));
    // Paused past its etcd lease: a janitor retires it (generation 2 exists).
    let retired = retire_once_dead(&other, policy, Instant::now());
    assert_eq!(retired.generation.get(), lease.generation.get() + 1);
    // It resumes and writes its next beat without the keep-alive in front: refused.
    let refused = owner.execute(beat(2), owner.default_bound()).unwrap_err();
    assert_eq!(refused.code().as_str(), "FENCED", "{refused}");
    assert!(
        refused.to_string().contains("etcd refused its heartbeat"),
        "{refused}"
    );
    assert_eq!(
        read_beat(),
        Some(record(1)),
        "the deposed beat did not land"
    );
}
