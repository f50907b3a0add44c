//! The lease over a real 3-member etcd cluster: exclusive claims among 8 clients, an owner
//! cut off from the cluster (self-fence, then a takeover only after its etcd lease
//! expired, and its late store commit refused by token), a member crash during
//! heartbeats, and an unreachable cluster reported as `UNAVAILABLE` within the deadline.

// The cluster helpers live beside this folder, shared with tests/store_log.rs.
#[path = "../cluster/mod.rs"]
mod cluster;

use cluster::{Cluster, SERIAL, etcd_binary};
use lease_core::LeaseOps;
use lease_core::ops::{AuthorityLease, Expectation, TakeoverTrigger};
use lease_core::{
    EpochRecord, EpochState, FileRef, Generation, HeartbeatDurability, Holder, Identity, RunId,
    Timestamp, TimingPolicy, must_self_fence,
};
use lease_etcd::{AuthorityAddr, EtcdAuthority, EtcdError, EtcdOptions, EtcdRun};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ts() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    Timestamp::from_unix_millis(ms).unwrap()
}

fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

fn holder(n: u32) -> Holder {
    Holder {
        host: id(&format!("host-{n}")),
        boot_id: id(&format!("boot-{n}")),
        pid: 1000 + n,
        start_time: 77,
    }
}

/// Short timings so the cut-off scenario takes seconds: beat 300 ms, self-fence after
/// 900 ms, stale after 2 s (the etcd lease's time to live).
fn fast_policy() -> TimingPolicy {
    TimingPolicy::from_millis(300, 900, 2_000, HeartbeatDurability::Local).unwrap()
}

fn opts() -> EtcdOptions {
    EtcdOptions {
        call_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_millis(500),
    }
}

/// Claim parameters for `run` as owner `owner` with holder `n`, now.
fn claim_params(
    run: &EtcdRun,
    owner: &str,
    n: u32,
    policy: TimingPolicy,
) -> lease_core::ops::ClaimParams {
    lease_core::ops::ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: id(owner),
        holder: holder(n),
        policy,
        now: now_ts(),
        store_floor: None,
    }
}

/// Retirement parameters for `run` by `janitor` with holder `n`, now.
fn retire_params(
    run: &EtcdRun,
    janitor: &str,
    n: u32,
    policy: TimingPolicy,
) -> lease_core::ops::RetireParams {
    lease_core::ops::RetireParams {
        run_id: run.run_id().clone(),
        owner_id: id(janitor),
        holder: holder(n),
        policy,
        now: now_ts(),
        expect: None,
    }
}

/// Retire `run`'s owner as "janitor" (holder 3) as soon as its etcd lease expired: every
/// earlier attempt must be `RETIRE_REFUSED_NOT_DEAD`, and it must succeed within 10 s of
/// `since`.
fn retire_once_dead(
    run: &EtcdRun,
    policy: TimingPolicy,
    since: Instant,
) -> lease_core::ops::Retired {
    loop {
        assert!(since.elapsed() < Duration::from_secs(10), "never retired");
        match run.retire(retire_params(run, "janitor", 3, policy)) {
            Ok(r) => return r,
            Err(e) => assert_eq!(e.code().as_str(), "RETIRE_REFUSED_NOT_DEAD", "{e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn lock_serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// An owner's heartbeat loop, as lease-run runs it: read the monotonic clock, heartbeat
/// with the self-fence instant as deadline, on success move the reference; fence when
/// `must_self_fence` says so or when the authority says FENCED.
struct Beater {
    fenced_at: Arc<Mutex<Option<(Instant, String)>>>,
    last_ok: Arc<Mutex<Instant>>,
    ok_after_mark: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
    mark: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Beater {
    fn start(run: Arc<EtcdRun>, lease: lease_core::ops::OwnedLease) -> Beater {
        let base = Instant::now();
        let fenced_at = Arc::new(Mutex::new(None));
        let last_ok = Arc::new(Mutex::new(base));
        let ok_after_mark = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(AtomicU64::new(0));
        let mark = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (f, l, o, fl, m, s) = (
            fenced_at.clone(),
            last_ok.clone(),
            ok_after_mark.clone(),
            failures.clone(),
            mark.clone(),
            stop.clone(),
        );
        let handle = std::thread::spawn(move || {
            let policy = lease.policy;
            let mut count = 0;
            while !s.load(Ordering::SeqCst) {
                let started = Instant::now();
                let last = *l.lock().unwrap();
                if must_self_fence(&policy, last - base, started - base) {
                    *f.lock().unwrap() = Some((Instant::now(), "self-fence deadline".into()));
                    return;
                }
                count += 1;
                let deadline = lease_etcd::self_fence_deadline(&policy, last);
                match run.heartbeat_within(&lease, now_ts(), count, None, deadline) {
                    Ok(()) => {
                        *l.lock().unwrap() = started;
                        if m.load(Ordering::SeqCst) {
                            o.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Err(e) if e.code() == "FENCED" => {
                        *f.lock().unwrap() = Some((Instant::now(), e.to_string()));
                        return;
                    }
                    Err(e) => {
                        assert_eq!(
                            e.code().as_str(),
                            "UNAVAILABLE",
                            "unexpected heartbeat error: {e}"
                        );
                        fl.fetch_add(1, Ordering::SeqCst);
                    }
                }
                // Sleep to the next beat, waking at the self-fence instant at the latest.
                let next = started + policy.heartbeat();
                let fence_at = lease_etcd::self_fence_deadline(&policy, *l.lock().unwrap())
                    + Duration::from_millis(1);
                std::thread::sleep(next.min(fence_at).saturating_duration_since(Instant::now()));
            }
        });
        Beater {
            fenced_at,
            last_ok,
            ok_after_mark,
            failures,
            mark,
            stop,
            handle: Some(handle),
        }
    }

    fn join(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            h.join().expect("beater thread");
        }
    }
}

impl Drop for Beater {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

#[test]
fn exclusive_claim_among_8_clients() {
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    const CLIENTS: usize = 8;
    const CLAIMS: u64 = 40;
    let run_id = RunId::new("race").unwrap();
    let holders = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let claims = Arc::new(AtomicU64::new(0));
    let won: Arc<Mutex<Vec<(Generation, usize)>>> = Arc::new(Mutex::new(Vec::new()));
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let threads: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let auth = cluster.authority(&[0, 1, 2], "t", opts());
            let run = auth.run(run_id.clone());
            let (holders, overlaps, claims, won, barrier) = (
                holders.clone(),
                overlaps.clone(),
                claims.clone(),
                won.clone(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut lost = 0u64;
                while claims.load(Ordering::SeqCst) < CLAIMS {
                    assert!(Instant::now() < deadline, "claims did not finish in 60 s");
                    let owner = id(&format!("client-{c}"));
                    match run.claim(lease_core::ops::ClaimParams { run_id: run.run_id().clone(), owner_id: owner, holder: holder(c as u32), policy: TimingPolicy::default(), now: now_ts(), store_floor: None }) {
                        Ok(lease) => {
                            if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            won.lock().unwrap().push((lease.generation, c));
                            claims.fetch_add(1, Ordering::SeqCst);
                            run.append(&lease, lease_core::ops::AppendParams { event_type: id("work.done"), payload: serde_json::json!({ "client": c, "generation": lease.generation.get() }), now: now_ts(), tail_hint: None })
                            .expect("the owner's append counts");
                            std::thread::sleep(Duration::from_millis(2));
                            holders.fetch_sub(1, Ordering::SeqCst);
                            run.release(lease_core::ops::ReleaseParams { lease: lease.clone(), now: now_ts(), seal: None }).expect("release");
                        }
                        Err(e) => {
                            assert!(
                                matches!(e.code().as_str(), "RUN_ALREADY_ACTIVE" | "TAKEOVER_RACE"),
                                "client {c}: unexpected {e}"
                            );
                            lost += 1;
                            std::thread::sleep(Duration::from_millis(1 + (c as u64 % 3)));
                        }
                    }
                }
                (run, auth, lost)
            })
        })
        .collect();
    let mut lost_total = 0;
    let mut keep = Vec::new();
    for t in threads {
        let (run, auth, lost) = t.join().expect("client thread");
        lost_total += lost;
        keep.push((run, auth));
    }
    let won = won.lock().unwrap().clone();
    let n = won.len() as u64;
    let overlaps = overlaps.load(Ordering::SeqCst);
    println!("etcd: members=3 claims={n} overlaps={overlaps}");
    assert!(n >= CLAIMS, "{n} claims");
    assert_eq!(overlaps, 0, "two clients held the run at once");
    assert!(
        lost_total > 0,
        "8 racing clients never lost a claim: no race was exercised"
    );
    // Exactly one winner per generation, and the chain agrees with who won.
    let gens: BTreeSet<Generation> = won.iter().map(|(g, _)| *g).collect();
    assert_eq!(gens.len(), won.len(), "a generation was won twice: {won:?}");
    let (run, _auth) = &keep[0];
    // Every release compacts when due (PROTOCOL §7.3 step 7, issue #33): 40 claims and
    // their releases made a checkpoint, racing the next claims; the won epochs from its
    // floor on are still there.
    let report = run.verify().expect("both chains verify");
    let floor = report.floor.expect("the releases compacted");
    for (g, c) in won.iter().filter(|(g, _)| *g >= floor) {
        let bytes = match run.perform(lease_core::ops::Request::Read(FileRef::Epoch(*g))) {
            Ok(lease_core::ops::Response::Content(Some(b))) => b,
            other => panic!("epoch {g}: {other:?}"),
        };
        let rec: EpochRecord = lease_core::decode_for(&run_id, &bytes).unwrap();
        assert_eq!(rec.state, EpochState::Active);
        assert_eq!(rec.owner_id.as_str(), format!("client-{c}"));
    }
    let events = run.read_events(None).expect("events");
    let counted = events
        .events
        .iter()
        .filter(|e| e.standing == lease_core::ops::Standing::Authoritative)
        .count() as u64;
    assert_eq!(
        counted, n,
        "every owner's acknowledged event counts: {report:?}"
    );
    // The run is free again and can be claimed once more.
    assert!(!run.is_active(now_ts()).unwrap());
}

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

#[test]
fn the_epoch_guard_holds_while_the_owner_lease_lives_whatever_the_clocks_say() {
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let policy = fast_policy();
    let run_id = RunId::new("guard").unwrap();
    let owner = cluster.authority(&[0], "t", opts()).run(run_id.clone());
    let lease = owner
        .claim(claim_params(&owner, "owner-a", 1, policy))
        .unwrap();
    owner.heartbeat(&lease, now_ts(), 1, None).unwrap();

    // A taker whose wall clock runs 60 s ahead (and whose watch claims 60 s): lease-core
    // judges the owner stale, but the
    // owner's etcd lease is alive. The high-level takeover refuses up front (76) ...
    let taker = cluster.authority(&[1, 2], "t", opts()).run(run_id.clone());
    let skewed = now_ts().plus_millis(60_000);
    let head = taker.status(skewed, false).unwrap().head.unwrap();
    let e = taker
        .takeover(lease_core::ops::TakeoverParams {
            run_id: taker.run_id().clone(),
            owner_id: id("owner-b"),
            holder: holder(2),
            policy,
            now: skewed,
            expect: Expectation::of(&head),
            trigger: TakeoverTrigger::Operator {
                watched_unchanged_ms: 60_000,
            },
        })
        .unwrap_err();
    assert!(matches!(e, EtcdError::OwnerLeaseAlive { .. }), "{e}");
    assert_eq!(e.code().as_str(), "TAKEOVER_ACTIVE_REFUSED");
    // ... and the bare step machine, past that check, is stopped by the epoch guard in the
    // creating transaction: no generation 2.
    let raced = taker
        .drive(&mut lease_core::ops::Takeover::new(
            lease_core::ops::TakeoverParams {
                run_id: run_id.clone(),
                owner_id: id("owner-b"),
                holder: holder(2),
                policy,
                now: skewed,
                expect: Expectation::of(&head),
                trigger: TakeoverTrigger::Operator {
                    watched_unchanged_ms: 60_000,
                },
            },
        ))
        .unwrap_err();
    assert_eq!(raced.code().as_str(), "TAKEOVER_RACE", "{raced}");
    assert!(raced.to_string().contains("etcd lease"), "{raced}");
    // The status this taker reads says so too: by its clock the heartbeat is a minute
    // old, but the liveness probe answers with the etcd lease, which is alive: `active`,
    // never `stale` (issue #17: no wall clock decides for another host).
    let view = taker.status(skewed, true).unwrap();
    assert_eq!(view.authority_lease, Some(AuthorityLease::Alive));
    assert_eq!(view.status.name(), "active", "{view:?}");
    assert_eq!(
        owner
            .status(now_ts(), false)
            .unwrap()
            .head
            .unwrap()
            .generation(),
        lease.generation
    );
    owner
        .heartbeat(&lease, now_ts(), 2, None)
        .expect("the owner is untouched");

    // An owner that stopped heartbeating past its lease is fenced by the cluster: its
    // heartbeat is refused, and the run shows `dead` (liveness is the etcd lease).
    std::thread::sleep(policy.stale_after() + Duration::from_millis(1_200));
    // The leader removes an expired lease's keys in its expiry sweep, which a loaded
    // machine can delay past the TTL (CI saw `Some(0)` here): until then the TTL left
    // reads 0, never more, and the key goes within a bounded time.
    let swept_by = Instant::now() + Duration::from_secs(20);
    loop {
        match owner.owner_lease_ttl(lease.generation).unwrap() {
            None => break,
            Some(ttl) => {
                assert_eq!(ttl, 0, "the lease outlived its TTL by more than the sweep");
                assert!(
                    Instant::now() < swept_by,
                    "the expired lease was never swept"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    let hb = owner.heartbeat(&lease, now_ts(), 3, None).unwrap_err();
    assert_eq!(hb.code().as_str(), "FENCED", "{hb}");
    assert!(hb.to_string().contains("etcd lease expired"), "{hb}");
    let view = taker.status(now_ts(), true).unwrap();
    assert_eq!(view.authority_lease, Some(AuthorityLease::Expired));
    assert_eq!(view.head.unwrap().generation(), lease.generation);
    assert_eq!(
        view.status.name(),
        "dead",
        "lease gone = dead for the etcd authority"
    );
    // As on the file system, a stale owner nobody replaced may still release (with its
    // seal); nobody else can hold its generation's liveness key.
    let g = owner
        .release(lease_core::ops::ReleaseParams {
            lease: lease.clone(),
            now: now_ts(),
            seal: None,
        })
        .expect("release");
    assert_eq!(g.get(), 2);
    let next = taker
        .claim(claim_params(&taker, "owner-b", 2, policy))
        .unwrap();
    assert_eq!(next.generation.get(), 3);
}

/// A claim whose process died right after the creating transaction (every later request
/// of the operation undone) is recovered by a retry of the same owner and process on a new
/// handle: lease-core adopts the epoch, the handle adopts its etcd lease from the liveness
/// key, and the lease heartbeats and releases as usual. Each etcd request is one atomic
/// write, so "crash between requests" is the only crash there is.
#[test]
fn a_claim_cut_short_after_its_transaction_is_adopted_by_a_retry() {
    use lease_core::ops::{Claim, ClaimParams, Operation, Request, Step};
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let policy = fast_policy();
    let run_id = RunId::new("adopt").unwrap();
    // A first, released generation so that the claim has a cutoff to finalize after its
    // creation: the crash then skips real work.
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    {
        let first = auth.run(run_id.clone());
        let l = first
            .claim(claim_params(&first, "owner-0", 9, policy))
            .unwrap();
        first
            .release(lease_core::ops::ReleaseParams {
                lease: l.clone(),
                now: now_ts(),
                seal: None,
            })
            .unwrap();
    }
    {
        let dying = auth.run(run_id.clone());
        let mut op = Claim::new(ClaimParams {
            run_id: run_id.clone(),
            owner_id: id("owner-a"),
            holder: holder(1),
            policy,
            now: now_ts(),
            store_floor: None,
        });
        let mut input = None;
        loop {
            match op.next(input.take()) {
                Step::Io(req) => {
                    let is_epoch = matches!(req, Request::CreateExclusive(FileRef::Epoch(_), _));
                    let resp = dying.perform(req).unwrap();
                    if is_epoch {
                        assert_eq!(resp, lease_core::ops::Response::Created);
                        break; // the process dies here
                    }
                    input = Some(resp);
                }
                Step::Done(r) => panic!("the claim finished before its epoch: {r:?}"),
            }
        }
    }
    let retry = auth.run(run_id.clone());
    let lease = retry
        .claim(claim_params(&retry, "owner-a", 1, policy))
        .expect("the retry adopts its own epoch");
    assert_eq!(lease.generation.get(), 3);
    retry
        .heartbeat(&lease, now_ts(), 1, None)
        .expect("and keeps its etcd lease alive");
    // Another owner is still refused while it lives.
    let other = auth.run(run_id.clone());
    let e = other
        .claim(claim_params(&other, "owner-b", 2, policy))
        .unwrap_err();
    assert_eq!(e.code().as_str(), "RUN_ALREADY_ACTIVE", "{e}");
    assert_eq!(
        retry
            .release(lease_core::ops::ReleaseParams {
                lease: lease.clone(),
                now: now_ts(),
                seal: None
            })
            .unwrap()
            .get(),
        4
    );
    assert_eq!(retry.owner_lease_ttl(lease.generation).unwrap(), None);
    retry.verify().expect("chains verify");
}

#[test]
fn unreachable_cluster_is_unavailable_within_the_deadline() {
    // Serialized with the cluster tests: the port below is free only once released, and a
    // cluster starting meanwhile could take it and answer.
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Nothing listens on this port (bound and released): every call fails fast or times
    // out, and the operation ends by its deadline with UNAVAILABLE (69), never a hang.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = AuthorityAddr::parse(&format!("etcd://127.0.0.1:{port}/t")).unwrap();
    let o = EtcdOptions {
        call_timeout: Duration::from_millis(200),
        op_timeout: Duration::from_millis(1_000),
        connect_timeout: Duration::from_millis(200),
    };
    let start = Instant::now();
    let err = match EtcdAuthority::connect(&addr, o) {
        Err(e) => e,
        Ok(auth) => {
            let run = auth.run(RunId::new("nowhere").unwrap());
            run.claim(lease_core::ops::ClaimParams {
                run_id: run.run_id().clone(),
                owner_id: id("owner-a"),
                holder: holder(1),
                policy: fast_policy(),
                now: now_ts(),
                store_floor: None,
            })
            .unwrap_err()
        }
    };
    let took = start.elapsed();
    assert_eq!(err.code().as_str(), "UNAVAILABLE", "{err}");
    assert!(err.to_string().contains("nowhere") || err.to_string().contains("connect"));
    assert!(
        took < Duration::from_secs(3),
        "took {took:?} with a 1 s deadline"
    );
}

/// lease-run calls the authority from `tokio::task::spawn_blocking` (as it calls
/// `RunDir`); the private runtime of `EtcdAuthority` must work there, and be dropped there.
#[test]
fn the_blocking_api_works_inside_spawn_blocking_of_another_runtime() {
    // Serialized with the cluster tests: the port below is free only once released, and a
    // cluster starting meanwhile could take it and answer.
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let code = rt.block_on(async move {
        tokio::task::spawn_blocking(move || {
            let addr = AuthorityAddr::parse(&format!("etcd://127.0.0.1:{port}/t")).unwrap();
            let o = EtcdOptions {
                call_timeout: Duration::from_millis(100),
                op_timeout: Duration::from_millis(300),
                connect_timeout: Duration::from_millis(100),
            };
            match EtcdAuthority::connect(&addr, o) {
                Err(e) => e.code().as_str(),
                Ok(auth) => {
                    let run = auth.run(RunId::new("inside").unwrap());
                    run.status(now_ts(), false).unwrap_err().code().as_str()
                }
            }
        })
        .await
        .expect("no panic inside spawn_blocking")
    });
    assert_eq!(code, "UNAVAILABLE");
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

/// Issue #31: a full cluster (its NOSPACE alarm raised by `--quota-backend-bytes`) is
/// `ETCD_NOSPACE`, with a message that names the alarm and the fix, not `UNAVAILABLE` (a
/// retry only adds refused writes). The owner's heartbeat gets that code too.
#[test]
fn a_full_cluster_is_etcd_nospace_naming_the_alarm_and_the_fix() {
    use lease_core::Code;
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    // 4 MiB: a few hundred-KiB writes fill it.
    let cluster = Cluster::start_with(&bin, &["--quota-backend-bytes", "4194304"]);
    let policy = fast_policy();
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let owner = auth.run(RunId::new("full").unwrap());
    let lease = owner
        .claim(claim_params(&owner, "owner-a", 1, policy))
        .unwrap();
    owner.heartbeat(&lease, now_ts(), 1, None).unwrap();
    // Another run fills the cluster until it refuses.
    let e = cluster.fill("t-filler");
    assert_eq!(e.code(), Code::EtcdNoSpace, "{e}");
    let text = e.to_string();
    for part in [
        "NOSPACE",
        "out of space",
        "etcdctl alarm disarm",
        "etcdctl defrag",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    let beat = owner.heartbeat(&lease, now_ts(), 2, None).unwrap_err();
    assert_eq!(beat.code(), Code::EtcdNoSpace, "{beat}");
}

/// Append parameters: an event of type `t` with payload `{"n": n}`, now.
fn append_params(t: &str, n: u64) -> lease_core::ops::AppendParams {
    lease_core::ops::AppendParams {
        event_type: id(t),
        payload: serde_json::json!({ "n": n }),
        now: now_ts(),
        tail_hint: None,
    }
}

/// The sequences of the events of type `t` in `run`'s log.
fn events_of_type(run: &EtcdRun, t: &str) -> Vec<u64> {
    run.read_events(None)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.event.event_type.as_str() == t)
        .map(|e| e.event.sequence.get())
        .collect()
}

/// PROTOCOL §17 (issue #31): an exclusive create whose first attempt landed and whose
/// answer was lost (the test hook drops it; the client times out and retries) is adopted
/// by its retry, which reads exactly its own bytes: an append then appends one event, not
/// two; a claim keeps the etcd lease its epoch's liveness key is attached to (not revoked)
/// and heartbeats with it.
#[test]
fn a_create_whose_answer_was_lost_is_adopted_by_its_retry() {
    use lease_core::Sequence;
    use lease_core::ops::{Request, Response};
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let policy = fast_policy();
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let run = auth.run(RunId::new("lost-answer").unwrap());
    // A claim whose epoch transaction (with its liveness key) lands unanswered.
    run.lose_write_answers(1);
    let lease = run
        .claim(claim_params(&run, "owner-a", 1, policy))
        .expect("the retry adopts the epoch its first attempt created");
    assert_eq!(lease.generation.get(), 1);
    run.heartbeat(&lease, now_ts(), 1, None)
        .expect("its etcd lease was kept: the liveness key is attached to it");
    assert!(run.owner_lease_ttl(lease.generation).unwrap().is_some());
    // An append whose event create lands unanswered: one event, not a second one.
    run.lose_write_answers(1);
    let a = run.append(&lease, append_params("once", 1)).unwrap();
    assert_eq!(events_of_type(&run, "once"), vec![a.sequence.get()]);
    // The bare request: Created, and the key holds the bytes once.
    let f = FileRef::Event(Sequence::new(a.sequence.get() + 10).unwrap());
    run.lose_write_answers(1);
    assert_eq!(
        run.perform(Request::CreateExclusive(f, b"ours".to_vec()))
            .unwrap(),
        Response::Created
    );
    assert_eq!(
        run.perform(Request::Read(f)).unwrap(),
        Response::Content(Some(b"ours".to_vec()))
    );
    // A heartbeat and a delete whose answers are lost are retried (idempotent) and done.
    run.lose_write_answers(1);
    run.heartbeat(&lease, now_ts(), 2, None).unwrap();
    run.lose_write_answers(1);
    assert_eq!(
        run.perform(Request::Remove(f, lease_core::ops::Durability::Fsync))
            .unwrap(),
        Response::Done
    );
    assert_eq!(
        run.perform(Request::Read(f)).unwrap(),
        Response::Content(None)
    );
}

/// PROTOCOL §17: only the request's own bytes are adopted, and only after an attempt of
/// its own went unanswered. Other bytes in the slot are `AlreadyExists` even on a retry;
/// the very same bytes put there by somebody else (no attempt of ours unanswered) are
/// `AlreadyExists` too, as on the run folder.
#[test]
fn a_create_finding_another_record_is_already_exists_even_on_a_retry() {
    use lease_core::Sequence;
    use lease_core::ops::{Request, Response};
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let other = auth.run(RunId::new("slots").unwrap());
    let run = auth.run(RunId::new("slots").unwrap());
    let f = |n| FileRef::Event(Sequence::new(n).unwrap());
    let create = |r: &EtcdRun, n, b: &[u8]| r.perform(Request::CreateExclusive(f(n), b.to_vec()));
    assert_eq!(create(&other, 1, b"theirs").unwrap(), Response::Created);
    assert_eq!(create(&other, 2, b"same").unwrap(), Response::Created);
    // Other bytes, with the first answer lost (the retry reads "theirs").
    run.lose_write_answers(1);
    assert_eq!(create(&run, 1, b"ours").unwrap(), Response::AlreadyExists);
    // The same bytes, nothing of ours unanswered: somebody else's identical record.
    assert_eq!(create(&run, 2, b"same").unwrap(), Response::AlreadyExists);
    assert_eq!(
        run.perform(Request::Read(f(1))).unwrap(),
        Response::Content(Some(b"theirs".to_vec()))
    );
}

/// Issue #31: a write that was sent and never answered until the operation's deadline is
/// `OUTCOME_UNKNOWN` (71), naming the run and the key, never `UNAVAILABLE` (69, "nothing
/// was written, retry"): here each attempt lands and every answer is lost, so the create,
/// the heartbeat and the delete all took effect, and a reader can see they did.
#[test]
fn a_write_unanswered_until_its_deadline_is_outcome_unknown() {
    use lease_core::Code;
    use lease_core::Sequence;
    use lease_core::ops::{Request, Response};
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let o = EtcdOptions {
        call_timeout: Duration::from_millis(300),
        op_timeout: Duration::from_millis(1_500),
        connect_timeout: Duration::from_millis(500),
    };
    let auth = cluster.authority(&[0, 1, 2], "t", o);
    let run = auth.run(RunId::new("unknown").unwrap());
    let lease = run
        .claim(claim_params(&run, "owner-a", 1, fast_policy()))
        .unwrap();
    let f = FileRef::Event(Sequence::new(5).unwrap());
    let key = run.key(f);
    run.lose_write_answers(u32::MAX);
    let start = Instant::now();
    let e = run
        .perform(Request::CreateExclusive(f, b"maybe".to_vec()))
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(4), "{e}");
    assert_eq!(e.code(), Code::OutcomeUnknown, "{e}");
    assert_eq!(e.unknown_outcome_file(), Some(f));
    let text = e.to_string();
    for part in ["unknown", &key, "outcome"] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    assert!(text.contains(run.run_id().as_str()), "{text}");
    let beat = run.heartbeat(&lease, now_ts(), 1, None).unwrap_err();
    assert_eq!(beat.code(), Code::OutcomeUnknown, "{beat}");
    let del = run
        .perform(Request::Remove(f, lease_core::ops::Durability::Fsync))
        .unwrap_err();
    assert_eq!(del.code(), Code::OutcomeUnknown, "{del}");
    // Reads stay UNAVAILABLE-free and answer: the writes did land.
    run.lose_write_answers(0);
    assert_eq!(
        run.perform(Request::Read(f)).unwrap(),
        Response::Content(None),
        "the delete landed"
    );
}

/// Issue #31, a real lost quorum: the event's create is sent while two of three members
/// are stopped (SIGSTOP) and they are resumed within the operation's deadline. The append
/// ends `Created`, by a retry landing or adopting the first attempt, or `OUTCOME_UNKNOWN`,
/// never `UNAVAILABLE` (the write was sent); and the log holds the event at most once.
#[test]
fn an_append_sent_while_the_cluster_lost_quorum_is_created_or_outcome_unknown() {
    use lease_core::Code;
    use lease_core::ops::{Append, Operation, Request, Response, Step};
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let mut cluster = Cluster::start(&bin);
    let o = EtcdOptions {
        call_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(8),
        connect_timeout: Duration::from_millis(500),
    };
    // Every call goes to member 0, the one left running.
    let auth = cluster.authority(&[0], "t", o);
    let run = auth.run(RunId::new("quorum").unwrap());
    let lease = run
        .claim(claim_params(&run, "owner-a", 1, fast_policy()))
        .unwrap();
    run.append(&lease, append_params("before", 0)).unwrap();
    let mut op = Append::new(&lease, append_params("in-flight", 1));
    let mut input = None;
    let outcome = loop {
        match op.next(input.take()) {
            Step::Io(req @ Request::CreateExclusive(FileRef::Event(_), _)) => {
                cluster.stop(1);
                cluster.stop(2);
                let resumed = Instant::now() + Duration::from_millis(2_000);
                let sender = &run;
                let sent = std::thread::scope(|s| {
                    let r = s.spawn(move || sender.perform(req));
                    std::thread::sleep(resumed.saturating_duration_since(Instant::now()));
                    cluster.resume(1);
                    cluster.resume(2);
                    r.join().unwrap()
                });
                match sent {
                    Ok(resp) => {
                        assert_eq!(resp, Response::Created, "our own event");
                        input = Some(resp);
                    }
                    Err(e) => break Err(e),
                }
            }
            Step::Io(req) => input = Some(run.perform(req).unwrap()),
            Step::Done(r) => break r.map_err(EtcdError::from),
        }
    };
    let found = events_of_type(&run, "in-flight");
    eprintln!("append in flight over a lost quorum: {outcome:?}, events {found:?}");
    match outcome {
        Ok(a) => assert_eq!(found, vec![a.sequence.get()], "the event, once"),
        Err(e) => {
            assert_eq!(e.code(), Code::OutcomeUnknown, "never UNAVAILABLE: {e}");
            assert!(found.len() <= 1, "{found:?}");
        }
    }
}
