//! Helpers of every part: policies, options, claims, the guarded create and the plain put.

use crate::{VALUE, cluster};
use lease_core::ops::{
    ClaimParams, CommitParams, CommitRecord, OwnedLease, ReleaseParams, commit_id,
};
use lease_core::store_log::{Blob, DEFAULT_BUDGET_BYTES, RecordBatch, RecordWrite, StoreTail};
use lease_core::{HeartbeatDurability, Holder, Identity, LeaseOps, RunId, Timestamp, TimingPolicy};
use lease_etcd::{EtcdOptions, EtcdRun};
use lease_run::{Authority, Batch, FinalStatus, OpenOptions, Run};
use std::path::Path;
use std::time::{Duration, Instant};

/// Beat 300 ms, self-fence 900 ms, stale 2 s (as lease-run's etcd tests).
pub(crate) fn fast_policy() -> TimingPolicy {
    TimingPolicy::from_millis(300, 900, 2_000, HeartbeatDurability::Local).expect("policy")
}

pub(crate) fn opts(cluster: &cluster::Cluster, prefix: &str, policy: TimingPolicy) -> OpenOptions {
    OpenOptions {
        policy,
        term_grace: Duration::from_millis(300),
        kill_wait: Duration::from_secs(1),
        step_deadline: Duration::from_secs(10),
        authority: Authority::Etcd(cluster.addr(&[0, 1, 2], prefix)),
        ..OpenOptions::default()
    }
}

pub(crate) fn now_ts() -> Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis();
    Timestamp::from_unix_millis(u64::try_from(ms).expect("ms")).expect("timestamp")
}

pub(crate) fn put(key: String) -> Batch {
    Batch::new().put(key, VALUE.to_vec())
}

/// A lease-etcd handle on run `run` under `prefix` (the bench's own client of the cluster).
pub(crate) fn etcd_run(cluster: &cluster::Cluster, prefix: &str, run: &str) -> EtcdRun {
    cluster
        .authority(&[0, 1, 2], prefix, EtcdOptions::default())
        .run(RunId::new(run).expect("run id"))
}

/// Claim `run` directly through lease-etcd (no run layer), default policy.
pub(crate) fn claim(run: &EtcdRun, owner: &str) -> OwnedLease {
    run.claim(ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: Identity::new(owner).expect("owner id"),
        holder: Holder {
            host: Identity::new("bench-host").expect("host"),
            boot_id: Identity::new("bench-boot").expect("boot"),
            pid: std::process::id(),
            start_time: 1,
        },
        policy: TimingPolicy::default(),
        now: now_ts(),
        store_floor: None,
    })
    .expect("claim through lease-etcd")
}

pub(crate) fn release(run: &EtcdRun, lease: OwnedLease) {
    run.release(ReleaseParams {
        lease,
        now: now_ts(),
        seal: None,
    })
    .expect("release through lease-etcd");
}

fn record_batch(owner: &Identity, n: u64, key: String) -> RecordBatch {
    RecordBatch {
        id: commit_id(owner, n),
        writes: vec![RecordWrite {
            key,
            value: Some(Blob(VALUE.to_vec())),
        }],
        log: Vec::new(),
    }
}

/// The guarded create of one record alone (what `EngineLog::commit_group` asks of etcd),
/// on a lease this bench holds; moves `tail` on.
pub(crate) struct Guarded {
    pub(crate) run: EtcdRun,
    pub(crate) lease: OwnedLease,
    pub(crate) tail: StoreTail,
    pub(crate) n: u64,
}

impl Guarded {
    pub(crate) fn commit(&mut self, batches: usize) -> Duration {
        let group: Vec<RecordBatch> = (0..batches)
            .map(|i| {
                self.n += 1;
                record_batch(&self.lease.owner_id, self.n, format!("g/{i}"))
            })
            .collect();
        let t = Instant::now();
        let op = CommitRecord::new(
            &self.lease,
            CommitParams {
                tail: self.tail.clone(),
                batches: group,
                now: now_ts(),
                budget: DEFAULT_BUDGET_BYTES,
            },
        )
        .expect("record");
        let committed = self.run.drive(&mut op.again()).expect("guarded create");
        let took = t.elapsed();
        self.tail = committed.tail;
        took
    }
}

/// One etcd-client `put` at a time, on a one-worker runtime of its own (as lease-etcd's).
pub(crate) struct PlainPut {
    rt: tokio::runtime::Runtime,
    client: etcd_client::Client,
    n: u64,
}

impl PlainPut {
    pub(crate) fn connect(cluster: &cluster::Cluster) -> PlainPut {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
        let client = rt
            .block_on(etcd_client::Client::connect(eps, None))
            .expect("etcd-client connect");
        PlainPut { rt, client, n: 0 }
    }

    pub(crate) fn put(&mut self) -> Duration {
        self.n += 1;
        let key = format!("/bench-plain/k{}", self.n % 1024);
        let t = Instant::now();
        self.rt
            .block_on(self.client.put(key, VALUE.to_vec(), None))
            .expect("plain put");
        t.elapsed()
    }
}

/// Percentile `p` (0..=100) of `v` in µs (nearest rank).
pub(crate) fn pct_us(v: &[Duration], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort();
    let i = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[i.clamp(1, s.len()) - 1].as_secs_f64() * 1e6
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) fn open_run(rt: &tokio::runtime::Runtime, path: &Path, o: OpenOptions) -> Run {
    rt.block_on(Run::open(path, o))
        .expect("open the run over etcd")
}

pub(crate) fn release_run(rt: &tokio::runtime::Runtime, run: Run) {
    rt.block_on(run.release(FinalStatus::Done))
        .expect("release the run");
}
