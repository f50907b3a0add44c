//! Exclusive claims: 8 racing clients, the epoch guard, a cut-short claim adopted by a retry.

use crate::cluster::{Cluster, etcd_binary};
use crate::{claim_params, fast_policy, holder, id, lock_serial, now_ts, opts};
use lease_core::LeaseOps;
use lease_core::ops::{AuthorityLease, Expectation, TakeoverTrigger};
use lease_core::{EpochRecord, EpochState, FileRef, Generation, RunId, TimingPolicy};
use lease_etcd::EtcdError;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

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
