//! The lease over a real 3-member etcd cluster: exclusive claims among 8 clients, an owner
//! cut off from the cluster (self-fence, then a takeover only after its etcd lease
//! expired, and its late store commit refused by token), a member crash during
//! heartbeats, and an unreachable cluster reported as `UNAVAILABLE` within the deadline.

// The cluster helpers live beside this folder, shared with tests/store_log.rs.
#[path = "../cluster/mod.rs"]
mod cluster;

mod claims;
mod fencing;
mod lost_answers;
mod unavailable;

use cluster::SERIAL;
use lease_core::LeaseOps;
use lease_core::{HeartbeatDurability, Holder, Identity, Timestamp, TimingPolicy, must_self_fence};
use lease_etcd::{EtcdOptions, EtcdRun};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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
