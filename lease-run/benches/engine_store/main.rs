//! Issue #32's figures: the run's store committed in etcd (`lease_run::engine_store`),
//! measured against raw etcd calls timed in the same run, on a real 3-member cluster of
//! Debian's `etcd` started by this bench on loopback (every member on this machine).
//! `cargo xtask bench-engine [--quick]` runs it; by hand:
//! `cargo bench -p lease-run --features etcd --bench engine_store` (with
//! `RUNLEASE_BENCH_QUICK=1` for the short mode). Not a criterion harness: the latency
//! figures need percentiles of interleaved samples, and failover and catch-up take seconds
//! each. Under `cargo test --benches` (no `--bench` argument) it only says it skipped.
//!
//! **Latency (p50/p99).** One owner (`Run::open` over etcd, default policy) and, in the
//! same loop, rotating the order each iteration:
//! - `engine_commit`: `run.store().commit` of one 100-byte put (the product path: the
//!   store's mutex, the self-fence rule, one guarded create in etcd, the SQLite view's
//!   apply);
//! - `guarded_txn`: the same record's guarded create alone (`CommitRecord` driven on a
//!   lease-etcd run this bench claimed: compare `create_revision(key) == 0` and the range
//!   compare over the epoch keys, put), no view, no run layer;
//! - `plain_put`: one etcd-client `put` of a 100-byte value (no compare, no record
//!   encoding);
//! - `engine_group32` / `guarded_txn32`: the same two with a group of 32 puts in one record.
//!
//! **Throughput.** Clients are connections to the run's real store socket (the owner's
//! committer gathers whatever is queued, up to `MAX_GROUP`, into one `commit_group`, so one
//! etcd record): K = 1, 8 and 32 clients, each its own thread, plus `direct` (sequential
//! `run.store().commit` from one thread), rotated over interleaved rounds; medians.
//!
//! **Failover.** Host A (its own runtime, fast policy: beat 300 ms, self-fence 900 ms,
//! stale 2 s, so an etcd lease of 2 s) commits, then dies (heartbeats stop, runtime shut
//! down). Host B, a standby with its own empty folder already waiting in
//! `Run::acquire(TakeoverWhenStale)`, takes over and commits; the figure is A's death to
//! B's first acknowledged commit, beside `stale_after` (the floor: B may not take over
//! before the record stayed unchanged that long).
//!
//! **Catch-up at 10 MB.** 10 MiB of 1 KiB documents. (1) Through the run layer: host A
//! commits and releases (its owner snapshots and truncates by itself every 1024 records),
//! then `Run::open` on an empty folder (claim + the store step's rebuild), beside the raw
//! fetch of what it fetches (the checked log read, and the snapshot's image if the log
//! starts from one; no apply). Two shapes: small records (8 documents each, 1280 records,
//! so an automatic snapshot and 256 records after it) and large ones (256 documents each,
//! 40 records, no snapshot). (2) `EngineStore` alone, on a lease this bench claims,
//! automatic snapshots off: from 1280 records only, and from an explicit
//! `EngineStore::snapshot` of the same state.
//!
//! Results go to the JSON file `RUNLEASE_BENCH_ENGINE_STORE` names (default
//! `target/bench/engine_store.json` in the workspace), one object per figure as
//! `cargo xtask bench`'s summary writes them, and one line per figure to stdout.

#[allow(dead_code)]
#[path = "../../../lease-etcd/tests/cluster/mod.rs"]
mod cluster;

use lease_core::ops::{
    ClaimParams, CommitParams, CommitRecord, OwnedLease, ReleaseParams, commit_id,
};
use lease_core::store_log::{Blob, DEFAULT_BUDGET_BYTES, RecordBatch, RecordWrite, StoreTail};
use lease_core::{HeartbeatDurability, Holder, Identity, LeaseOps, RunId, Timestamp, TimingPolicy};
use lease_etcd::{EtcdOptions, EtcdRun};
use lease_run::engine_store::{CatchUp, EngineStore};
use lease_run::store_socket::{SOCKET_VAR, StoreClient};
use lease_run::{Acquire, Authority, Batch, FinalStatus, INCARNATION_VAR, OpenOptions, Run, Wait};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The value of every latency and throughput put: about 100 bytes.
const VALUE: [u8; 100] = [b'v'; 100];
/// Client counts of the throughput rounds.
const CLIENTS: [usize; 3] = [1, 8, 32];
/// The state of the catch-up figure: 10 MiB of 1 KiB values.
const STATE_BYTES: usize = 10 << 20;
const DOC_BYTES: usize = 1024;

struct Cfg {
    quick: bool,
}

impl Cfg {
    fn latency_samples(&self) -> usize {
        if self.quick { 150 } else { 600 }
    }
    fn rounds(&self) -> usize {
        if self.quick { 3 } else { 5 }
    }
    fn round_target(&self) -> Duration {
        Duration::from_millis(if self.quick { 600 } else { 1500 })
    }
    fn failovers(&self) -> usize {
        if self.quick { 2 } else { 5 }
    }
    fn catch_ups(&self) -> usize {
        if self.quick { 1 } else { 3 }
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "engine_store: skipped outside `cargo bench` (it starts a 3-member etcd cluster and runs for minutes)"
        );
        return;
    }
    let Some(bin) = cluster::etcd_binary() else {
        return;
    };
    let cfg = Cfg {
        quick: std::env::var_os("RUNLEASE_BENCH_QUICK").is_some(),
    };
    let started = Instant::now();
    let cluster = cluster::Cluster::start(&bin);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let tmp = tempfile::Builder::new()
        .prefix("runlease-engine-bench-")
        .tempdir_in(std::env::temp_dir())
        .expect("scratch folder");
    let mut figures = Vec::new();
    let mut failures = Vec::new();
    // `RUNLEASE_BENCH_ONLY=latency,throughput,failover,catch_up` runs only those parts.
    let only = std::env::var("RUNLEASE_BENCH_ONLY").ok();
    let part = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|p| p == name))
    };
    if part("latency") {
        latency(&cluster, &rt, tmp.path(), &cfg, &mut figures);
    }
    if part("throughput") {
        throughput(&cluster, &rt, tmp.path(), &cfg, &mut figures);
    }
    if part("failover") {
        failover(&cluster, &rt, tmp.path(), &cfg, &mut figures);
    }
    if part("catch_up") {
        catch_up(&cluster, &rt, tmp.path(), &cfg, &mut figures, &mut failures);
    }
    report(&figures, &failures, &cfg, started.elapsed());
    drop(rt);
    drop(cluster);
}

// ---------------------------------------------------------------------------------------
// Helpers

/// Beat 300 ms, self-fence 900 ms, stale 2 s (as lease-run's etcd tests).
fn fast_policy() -> TimingPolicy {
    TimingPolicy::from_millis(300, 900, 2_000, HeartbeatDurability::Local).expect("policy")
}

fn opts(cluster: &cluster::Cluster, prefix: &str, policy: TimingPolicy) -> OpenOptions {
    OpenOptions {
        policy,
        term_grace: Duration::from_millis(300),
        kill_wait: Duration::from_secs(1),
        step_deadline: Duration::from_secs(10),
        authority: Authority::Etcd(cluster.addr(&[0, 1, 2], prefix)),
        ..OpenOptions::default()
    }
}

fn now_ts() -> Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis();
    Timestamp::from_unix_millis(u64::try_from(ms).expect("ms")).expect("timestamp")
}

fn put(key: String) -> Batch {
    Batch::new().put(key, VALUE.to_vec())
}

/// A lease-etcd handle on run `run` under `prefix` (the bench's own client of the cluster).
fn etcd_run(cluster: &cluster::Cluster, prefix: &str, run: &str) -> EtcdRun {
    cluster
        .authority(&[0, 1, 2], prefix, EtcdOptions::default())
        .run(RunId::new(run).expect("run id"))
}

/// Claim `run` directly through lease-etcd (no run layer), default policy.
fn claim(run: &EtcdRun, owner: &str) -> OwnedLease {
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

fn release(run: &EtcdRun, lease: OwnedLease) {
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
struct Guarded {
    run: EtcdRun,
    lease: OwnedLease,
    tail: StoreTail,
    n: u64,
}

impl Guarded {
    fn commit(&mut self, batches: usize) -> Duration {
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
struct PlainPut {
    rt: tokio::runtime::Runtime,
    client: etcd_client::Client,
    n: u64,
}

impl PlainPut {
    fn connect(cluster: &cluster::Cluster) -> PlainPut {
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

    fn put(&mut self) -> Duration {
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
fn pct_us(v: &[Duration], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort();
    let i = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[i.clamp(1, s.len()) - 1].as_secs_f64() * 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn open_run(rt: &tokio::runtime::Runtime, path: &Path, o: OpenOptions) -> Run {
    rt.block_on(Run::open(path, o))
        .expect("open the run over etcd")
}

fn release_run(rt: &tokio::runtime::Runtime, run: Run) {
    rt.block_on(run.release(FinalStatus::Done))
        .expect("release the run");
}

// ---------------------------------------------------------------------------------------
// Figures

#[derive(Clone, Copy, PartialEq)]
enum Unit {
    Us,
    PerS,
}

/// One figure: `median` against `baseline_median` (same unit), with the target if any.
struct Figure {
    key: &'static str,
    what: String,
    median: f64,
    baseline: &'static str,
    baseline_median: f64,
    unit: Unit,
    /// Upper bound on the ratio (times).
    target: Option<f64>,
    /// Lower bound on the ratio (throughputs).
    target_min: Option<f64>,
}

impl Figure {
    fn ratio(&self) -> f64 {
        self.median / self.baseline_median
    }
    fn verdict(&self) -> String {
        let r = self.ratio();
        match (self.target, self.target_min) {
            (Some(t), _) if r <= t => format!("target <= {t}x: met"),
            (Some(t), _) => format!("target <= {t}x: MISSED"),
            (None, Some(t)) if r >= t => format!("target >= {t}x: met"),
            (None, Some(t)) => format!("target >= {t}x: MISSED"),
            (None, None) => "no target".into(),
        }
    }
}

fn fmt(x: f64, unit: Unit) -> String {
    match unit {
        Unit::PerS => format!("{x:.0}/s"),
        Unit::Us if x >= 1e6 => format!("{:.2} s", x / 1e6),
        Unit::Us if x >= 1e3 => format!("{:.2} ms", x / 1e3),
        Unit::Us => format!("{x:.1} µs"),
    }
}

/// Push a figure; also print it at once (stderr) so a later failure keeps what was seen.
fn push(figures: &mut Vec<Figure>, f: Figure) {
    eprintln!(
        "engine_store: {} {} vs {} {} = {:.2}x ({})",
        f.key,
        fmt(f.median, f.unit),
        f.baseline,
        fmt(f.baseline_median, f.unit),
        f.ratio(),
        f.verdict()
    );
    figures.push(f);
}

// ---------------------------------------------------------------------------------------
// Latency

fn latency(
    cluster: &cluster::Cluster,
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    cfg: &Cfg,
    figures: &mut Vec<Figure>,
) {
    let run = open_run(
        rt,
        &dir.join("lat").join("job"),
        opts(cluster, "b-lat", TimingPolicy::default()),
    );
    let store = run.store();
    let raw_run = etcd_run(cluster, "b-lat-raw", "raw");
    let lease = claim(&raw_run, "bench-raw-owner");
    let mut guarded = Guarded {
        run: raw_run,
        lease,
        tail: StoreTail::default(),
        n: 0,
    };
    let mut plain = PlainPut::connect(cluster);
    // For attribution only: the same commit on a run whose store is local (folder
    // authority: one SQLite transaction and its WAL fsync on this disk, no etcd).
    let local_run = open_run(
        rt,
        &dir.join("lat-local").join("job"),
        OpenOptions::default(),
    );
    let local = local_run.store();
    let one = put("lat/one".into());
    let group: Vec<Batch> = (0..32).map(|i| put(format!("lat/g{i}"))).collect();
    let engine = |s: &lease_run::RunStore| {
        let t = Instant::now();
        s.commit(&one).expect("engine commit");
        t.elapsed()
    };
    let engine32 = |s: &lease_run::RunStore| {
        let t = Instant::now();
        s.commit_group(&group).expect("engine group commit");
        t.elapsed()
    };
    // Warm every connection and path up.
    for _ in 0..10 {
        engine(&store);
        guarded.commit(1);
        plain.put();
    }
    let n = cfg.latency_samples();
    let mut s: [Vec<Duration>; 6] = Default::default();
    for i in 0..n {
        for j in 0..6 {
            let which = (i + j) % 6;
            let d = match which {
                0 => engine(&store),
                1 => guarded.commit(1),
                2 => plain.put(),
                3 => engine32(&store),
                4 => guarded.commit(32),
                _ => engine(&local),
            };
            s[which].push(d);
        }
    }
    let [eng, grd, pln, eng32, grd32, loc] = s;
    eprintln!(
        "engine_store latency ({n} interleaved samples each): engine commit p50 {:.0} µs p99 {:.0} µs; guarded txn p50 {:.0} p99 {:.0}; plain put p50 {:.0} p99 {:.0}; group of 32: engine p50 {:.0} p99 {:.0}, guarded txn p50 {:.0} p99 {:.0}",
        pct_us(&eng, 50.0),
        pct_us(&eng, 99.0),
        pct_us(&grd, 50.0),
        pct_us(&grd, 99.0),
        pct_us(&pln, 50.0),
        pct_us(&pln, 99.0),
        pct_us(&eng32, 50.0),
        pct_us(&eng32, 99.0),
        pct_us(&grd32, 50.0),
        pct_us(&grd32, 99.0),
    );
    eprintln!(
        "engine_store latency, for attribution: the same commit to a local store (folder authority, SQLite + WAL fsync) p50 {:.0} µs p99 {:.0} µs",
        pct_us(&loc, 50.0),
        pct_us(&loc, 99.0),
    );
    let us = |key, what: &str, a: &[Duration], b: &[Duration], bname, p, target| Figure {
        key,
        what: what.to_string(),
        median: pct_us(a, p),
        baseline: bname,
        baseline_median: pct_us(b, p),
        unit: Unit::Us,
        target,
        target_min: None,
    };
    let f = [
        us(
            "engine_commit_p50",
            "one engine commit (1 put), p50",
            &eng,
            &grd,
            "guarded_txn_p50",
            50.0,
            Some(1.5),
        ),
        us(
            "engine_commit_p99",
            "one engine commit (1 put), p99",
            &eng,
            &grd,
            "guarded_txn_p99",
            99.0,
            Some(1.5),
        ),
        us(
            "engine_commit_vs_put_p50",
            "one engine commit (1 put), p50, against a plain put",
            &eng,
            &pln,
            "plain_put_p50",
            50.0,
            Some(1.5),
        ),
        us(
            "engine_commit_vs_put_p99",
            "one engine commit (1 put), p99, against a plain put",
            &eng,
            &pln,
            "plain_put_p99",
            99.0,
            None,
        ),
        us(
            "guarded_txn_vs_put_p50",
            "the guarded create alone against a plain put, p50",
            &grd,
            &pln,
            "plain_put_p50",
            50.0,
            None,
        ),
        us(
            "local_commit_p50",
            "for attribution: the same commit to a local store (no etcd), p50",
            &loc,
            &grd,
            "guarded_txn_p50",
            50.0,
            None,
        ),
        us(
            "engine_group32_p50",
            "one engine group commit of 32 puts (one record), p50",
            &eng32,
            &grd32,
            "guarded_txn32_p50",
            50.0,
            Some(1.5),
        ),
        us(
            "engine_group32_p99",
            "one engine group commit of 32 puts (one record), p99",
            &eng32,
            &grd32,
            "guarded_txn32_p99",
            99.0,
            None,
        ),
    ];
    for x in f {
        push(figures, x);
    }
    let Guarded {
        run: raw_run,
        lease,
        ..
    } = guarded;
    release(&raw_run, lease);
    release_run(rt, run);
    release_run(rt, local_run);
}

// ---------------------------------------------------------------------------------------
// Throughput through the store socket

struct Socket {
    socket: String,
    run_name: String,
    generation: u64,
    secret: String,
}

impl Socket {
    fn of(rt: &tokio::runtime::Runtime, run: &Run) -> Socket {
        let env: BTreeMap<String, String> = rt.block_on(async {
            let out = run.command("env").output().await.expect("run `env`");
            assert!(out.status.success(), "`env` failed: {:?}", out.status);
            String::from_utf8(out.stdout)
                .expect("UTF-8 environment")
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        });
        let var = |k: &str| {
            env.get(k)
                .cloned()
                .unwrap_or_else(|| panic!("the command's environment lacks {k}"))
        };
        Socket {
            socket: var(SOCKET_VAR),
            run_name: var("RUNLEASE_RUN"),
            generation: var("RUNLEASE_GENERATION").parse().expect("generation"),
            secret: var(INCARNATION_VAR),
        }
    }

    fn client(&self) -> StoreClient {
        StoreClient::connect(&self.socket, &self.run_name, self.generation, &self.secret)
            .expect("connect to the store socket")
    }

    /// `k` clients, `n / k` commits each, all at once; commits/s.
    fn round(&self, k: usize, n: usize) -> f64 {
        let each = n / k;
        let start = Arc::new(Barrier::new(k + 1));
        let threads: Vec<_> = (0..k)
            .map(|i| {
                let mut c = self.client();
                let start = start.clone();
                let batch = put(format!("socket/{i}"));
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..each {
                        c.commit(&batch).expect("socket commit");
                    }
                })
            })
            .collect();
        start.wait();
        let t = Instant::now();
        for th in threads {
            th.join().expect("client thread");
        }
        (each * k) as f64 / t.elapsed().as_secs_f64()
    }
}

fn throughput(
    cluster: &cluster::Cluster,
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    cfg: &Cfg,
    figures: &mut Vec<Figure>,
) {
    let run = open_run(
        rt,
        &dir.join("tput").join("job"),
        opts(cluster, "b-tput", TimingPolicy::default()),
    );
    let sock = Socket::of(rt, &run);
    let store = run.store();
    let direct = |n: usize| {
        let b = put("direct".into());
        let t = Instant::now();
        for _ in 0..n {
            store.commit(&b).expect("direct commit");
        }
        n as f64 / t.elapsed().as_secs_f64()
    };
    sock.round(1, 16);
    let per_s = sock.round(1, 64);
    let n = ((per_s * cfg.round_target().as_secs_f64()) as usize).clamp(64, 20_000) / 32 * 32;
    let rounds = cfg.rounds();
    let mut samples: [Vec<f64>; 4] = Default::default();
    for r in 0..rounds {
        for j in 0..4 {
            let which = (r + j) % 4;
            samples[which].push(match which {
                0 => direct(n),
                w => sock.round(CLIENTS[w - 1], n),
            });
        }
    }
    let [d, s1, s8, s32] = samples.map(median);
    eprintln!(
        "engine_store throughput ({rounds} rounds of {n} commits, medians): direct {d:.0}/s; socket 1 / 8 / 32 clients {s1:.0} / {s8:.0} / {s32:.0} commits/s"
    );
    let tp = |key, what: &str, m, bname, b, target_min| Figure {
        key,
        what: what.to_string(),
        median: m,
        baseline: bname,
        baseline_median: b,
        unit: Unit::PerS,
        target: None,
        target_min,
    };
    push(
        figures,
        tp(
            "socket_1_commits_per_s",
            "1 client through the store socket (no concurrency to group)",
            s1,
            "direct_commits_per_s",
            d,
            None,
        ),
    );
    push(
        figures,
        tp(
            "socket_8_commits_per_s",
            "8 concurrent clients through the store socket",
            s8,
            "socket_1_commits_per_s",
            s1,
            None,
        ),
    );
    push(
        figures,
        tp(
            "group_commit_32_vs_1",
            "32 concurrent clients through the store socket (group commits)",
            s32,
            "socket_1_commits_per_s",
            s1,
            Some(5.0),
        ),
    );
    release_run(rt, run);
}

// ---------------------------------------------------------------------------------------
// Failover

/// The standby's acquire progress, timestamped (to tell where a failover's time goes).
#[derive(Clone, Default)]
struct Trace(Arc<std::sync::Mutex<Vec<(Instant, String)>>>);

impl lease_run::AcquireObserver for Trace {
    fn progress(&mut self, p: lease_run::Progress<'_>) {
        let what = match p {
            lease_run::Progress::Waiting { held, .. } => format!("held ({})", held.code),
            lease_run::Progress::Unavailable { error, .. } => {
                format!("unavailable ({})", error.code())
            }
            lease_run::Progress::Watching { watched, .. } => {
                format!("watching {} ms", watched.as_millis())
            }
            _ => "other".into(),
        };
        if let Ok(mut v) = self.0.lock() {
            v.push((Instant::now(), what));
        }
    }
}

fn failover(
    cluster: &cluster::Cluster,
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    cfg: &Cfg,
    figures: &mut Vec<Figure>,
) {
    let policy = fast_policy();
    let (mut total, mut owned) = (Vec::new(), Vec::new());
    for r in 0..cfg.failovers() {
        let prefix = format!("b-fail-{r}");
        let o = opts(cluster, &prefix, policy);
        let a = dir.join(format!("fail-{r}-a")).join("job");
        let b = dir.join(format!("fail-{r}-b")).join("job");
        // Host A on a runtime of its own, which dies with it.
        let rt_a = tokio::runtime::Runtime::new().expect("runtime of host A");
        let run_a = open_run(&rt_a, &a, o.clone());
        let batches: Vec<Batch> = (0..100).map(|i| put(format!("k{i}"))).collect();
        run_a
            .store()
            .commit_group(&batches)
            .expect("host A commits");
        // Host B: a standby already waiting to take over when A goes stale.
        std::fs::create_dir_all(&b).expect("host B's folder");
        let trace = Trace::default();
        let standby = rt.spawn({
            let (b, o, mut trace) = (b.clone(), o.clone(), trace.clone());
            async move {
                let (run, _) = Run::acquire(
                    &b,
                    Acquire::TakeoverWhenStale,
                    Wait::Until(Instant::now() + Duration::from_secs(60)),
                    o,
                    &mut trace,
                )
                .await
                .expect("host B takes over");
                let at = Instant::now();
                run.commit(put("after".into()))
                    .await
                    .expect("host B's first commit");
                (run, at, Instant::now())
            }
        });
        // Let B see A alive first (a standby watching a fresh owner).
        std::thread::sleep(Duration::from_millis(800));
        let died = Instant::now();
        run_a.suspend_heartbeats();
        std::mem::forget(run_a);
        rt_a.shutdown_background();
        let (run_b, at, committed) = rt.block_on(standby).expect("standby task");
        if let Ok(events) = trace.0.lock() {
            // What the standby reported after A's death.
            let shown: Vec<String> = events
                .iter()
                .filter(|(t, _)| *t >= died)
                .map(|(t, what)| format!("{} ms {what}", t.duration_since(died).as_millis()))
                .collect();
            eprintln!(
                "engine_store failover {r}: standby after A's death: {}",
                shown.join(", ")
            );
        }
        let head = run_b.store().head().expect("head");
        assert_eq!(head, 101, "host B sees A's 100 commits and its own");
        total.push(committed.duration_since(died).as_secs_f64() * 1e6);
        owned.push(at.duration_since(died).as_secs_f64() * 1e6);
        release_run(rt, run_b);
    }
    eprintln!(
        "engine_store failover ({} rounds): death -> first commit on B {:?} ms; death -> B owns {:?} ms",
        total.len(),
        total.iter().map(|x| (x / 1e3).round()).collect::<Vec<_>>(),
        owned.iter().map(|x| (x / 1e3).round()).collect::<Vec<_>>()
    );
    let stale = policy.stale_after().as_secs_f64() * 1e6;
    push(
        figures,
        Figure {
            key: "failover",
            what: "owner's death to the first commit on the new host (median)".into(),
            median: median(total),
            baseline: "stale_after",
            baseline_median: stale,
            unit: Unit::Us,
            target: None,
            target_min: None,
        },
    );
    push(
        figures,
        Figure {
            key: "failover_owned",
            what: "owner's death to the new host's acquire returning (median)".into(),
            median: median(owned),
            baseline: "stale_after",
            baseline_median: stale,
            unit: Unit::Us,
            target: None,
            target_min: None,
        },
    );
}

// ---------------------------------------------------------------------------------------
// Catch-up at 10 MB

/// 10 MiB of 1 KiB documents, as groups of `per_group` batches of one put (each group one
/// `commit_group`, so one record when it fits one).
fn state_groups(per_group: usize) -> Vec<Vec<Batch>> {
    let docs = STATE_BYTES / DOC_BYTES;
    (0..docs)
        .collect::<Vec<_>>()
        .chunks(per_group)
        .map(|c| {
            c.iter()
                .map(|i| Batch::new().put(format!("doc/{i:06}"), vec![b'd'; DOC_BYTES]))
                .collect()
        })
        .collect()
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let t = Instant::now();
    let x = f();
    (x, t.elapsed().as_secs_f64() * 1e6)
}

/// A figure that could not be measured: printed, and kept in the JSON with its error.
fn failed(failures: &mut Vec<(&'static str, String)>, key: &'static str, e: String) {
    eprintln!("engine_store: {key} FAILED: {e}");
    failures.push((key, e));
}

/// The raw fetch of what a catch-up fetches, timed: the checked log read and, when the log
/// starts from a snapshot, the snapshot's image (no view, no apply). The number of records.
fn raw_fetch(run: &EtcdRun) -> Result<(usize, bool, f64), String> {
    let t = Instant::now();
    let log = run.read_store_log(None, 0).map_err(|e| e.to_string())?;
    if let Some((file, m)) = &log.snapshot {
        run.read_snapshot(*file, m.clone())
            .map_err(|e| e.to_string())?;
    }
    Ok((
        log.records.len(),
        log.snapshot.is_some(),
        t.elapsed().as_secs_f64() * 1e6,
    ))
}

/// Write `groups` through an `EngineStore` on a lease this bench claims (snapshots only
/// when `snapshot` says, never automatically), release; the last commit's sequence.
fn write_engine_store(run: &EtcdRun, dir: &Path, groups: &[Vec<Batch>], snapshot: bool) -> u64 {
    let lease = claim(run, "bench-writer");
    let mut store = EngineStore::open_at(run, &lease, dir).expect("EngineStore open");
    store.set_snapshot_every(u64::MAX);
    let mut nonce = 0u64;
    for g in groups {
        store
            .commit_group(run, g, now_ts(), &mut || {
                nonce += 1;
                nonce
            })
            .expect("state commit");
    }
    if snapshot {
        store.snapshot(run, nonce + 1, now_ts()).expect("snapshot");
    }
    let head = store.view().head().expect("head");
    drop(store);
    release(run, lease);
    head
}

/// Time an `EngineStore::open` on the empty folder `dir` (claim, open, release).
fn engine_store_open(run: &EtcdRun, dir: &Path, docs: u64) -> Result<f64, String> {
    let lease = claim(run, "bench-reader");
    let (store, took) = timed(|| EngineStore::open_at(run, &lease, dir));
    let r = store.map_err(|e| e.to_string()).map(|store| {
        assert!(matches!(store.caught_up(), CatchUp::Rebuilt(_)));
        assert_eq!(store.view().head().expect("head"), docs);
        took
    });
    release(run, lease);
    r
}

fn catch_up(
    cluster: &cluster::Cluster,
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    cfg: &Cfg,
    figures: &mut Vec<Figure>,
    failures: &mut Vec<(&'static str, String)>,
) {
    let small = state_groups(8);
    let large = state_groups(256);
    // 1. The run layer, as a new host meets it: host A commits 10 MiB and releases (the
    //    owner snapshots and truncates by itself every 1024 records); host B opens with an
    //    empty folder. Two shapes of the same state: small records (8 documents, about
    //    11 KiB encoded, 1280 records: an automatic snapshot at 1024) and large ones (256
    //    documents, about 380 KiB, 40 records: what the socket's committer writes under
    //    load; no snapshot).
    for (groups, prefix, key) in [
        (&small, "b-catch-small", "catch_up_10mb_run_open"),
        (
            &large,
            "b-catch-large",
            "catch_up_10mb_large_records_run_open",
        ),
    ] {
        let o = opts(cluster, prefix, TimingPolicy::default());
        let run = open_run(rt, &dir.join(format!("{prefix}-a")).join("job"), o.clone());
        let (_, wrote) = timed(|| {
            for g in groups {
                run.store().commit_group(g).expect("state commit");
            }
        });
        let docs = run.store().head().expect("head");
        release_run(rt, run);
        eprintln!(
            "engine_store catch-up ({prefix}): wrote {docs} documents ({} MiB of values) in groups of {} in {:.1} s",
            STATE_BYTES >> 20,
            groups[0].len(),
            wrote / 1e6
        );
        let observer = etcd_run(cluster, prefix, "job");
        let (mut opens, mut fetches) = (Vec::new(), Vec::new());
        for r in 0..cfg.catch_ups() {
            let (records, snap, fetch) = match raw_fetch(&observer) {
                Ok(x) => x,
                Err(e) => {
                    // The new host's open, all the same: does it fail too?
                    let empty = dir.join(format!("{prefix}-b{r}")).join("job");
                    let open = match rt.block_on(Run::open(&empty, o.clone())) {
                        Ok(run) => {
                            release_run(rt, run);
                            "Run::open succeeded".to_string()
                        }
                        Err(e) => format!("Run::open failed too: {e}"),
                    };
                    failed(
                        failures,
                        key,
                        format!("the raw read of the log failed: {e}; {open}"),
                    );
                    break;
                }
            };
            fetches.push(fetch);
            let empty = dir.join(format!("{prefix}-b{r}")).join("job");
            let (run, open) = timed(|| rt.block_on(Run::open(&empty, o.clone())));
            let run = match run {
                Ok(run) => run,
                Err(e) => {
                    failed(failures, key, format!("Run::open: {e}"));
                    break;
                }
            };
            assert_eq!(run.store().head().expect("head"), docs);
            assert!(run.store().get("doc/010239").expect("get").is_some());
            opens.push(open);
            release_run(rt, run);
            eprintln!(
                "engine_store catch-up {r} ({prefix}): raw fetch of {}{records} records {:.0} ms; Run::open on an empty folder {:.0} ms",
                if snap { "a snapshot and " } else { "" },
                fetch / 1e3,
                open / 1e3
            );
        }
        if !opens.is_empty() {
            push(
                figures,
                Figure {
                    key,
                    what: format!(
                        "Run::open of a new host (empty folder) at 10 MiB of state ({} documents a record)",
                        groups[0].len()
                    ),
                    median: median(opens),
                    baseline: "raw_fetch_10mb",
                    baseline_median: median(fetches),
                    unit: Unit::Us,
                    target: None,
                    target_min: None,
                },
            );
        }
    }

    // 2. The EngineStore alone: 10 MiB from records only (small records, no snapshot at
    //    all), and the same state in large records after `EngineStore::snapshot`.
    let records_run = etcd_run(cluster, "b-es-records", "job");
    let docs = write_engine_store(&records_run, &dir.join("es-records-a"), &small, false);
    let fetch = raw_fetch(&records_run);
    let open = engine_store_open(&records_run, &dir.join("es-records-b"), docs);
    let records_only = match (fetch, open) {
        (Ok((records, _, fetch)), Ok(open)) => {
            eprintln!(
                "engine_store catch-up (EngineStore, records only): raw fetch of {records} records {:.0} ms; open {:.0} ms",
                fetch / 1e3,
                open / 1e3
            );
            push(
                figures,
                Figure {
                    key: "catch_up_10mb_records_only",
                    what:
                        "EngineStore::open on an empty folder at 10 MiB, 1280 records, no snapshot"
                            .into(),
                    median: open,
                    baseline: "raw_fetch_10mb",
                    baseline_median: fetch,
                    unit: Unit::Us,
                    target: None,
                    target_min: None,
                },
            );
            Some(open)
        }
        (Err(e), _) | (_, Err(e)) => {
            failed(failures, "catch_up_10mb_records_only", e);
            None
        }
    };
    let snap_run = etcd_run(cluster, "b-es-snap", "job");
    let (docs, snapped) =
        timed(|| write_engine_store(&snap_run, &dir.join("es-snap-a"), &large, true));
    match engine_store_open(&snap_run, &dir.join("es-snap-b"), docs) {
        Ok(open) => {
            eprintln!(
                "engine_store catch-up (EngineStore, after a snapshot; written with it in {:.1} s): open {:.0} ms",
                snapped / 1e6,
                open / 1e3
            );
            if let Some(b) = records_only {
                push(
                    figures,
                    Figure {
                        key: "catch_up_10mb_snapshot",
                        what: "EngineStore::open on an empty folder at 10 MiB, after a snapshot"
                            .into(),
                        median: open,
                        baseline: "catch_up_10mb_records_only",
                        baseline_median: b,
                        unit: Unit::Us,
                        target: None,
                        target_min: None,
                    },
                );
            }
        }
        Err(e) => failed(failures, "catch_up_10mb_snapshot", e),
    }
}

// ---------------------------------------------------------------------------------------
// Report

fn report(figures: &[Figure], failures: &[(&str, String)], cfg: &Cfg, took: Duration) {
    println!(
        "engine store over etcd (issue #32; 3 etcd members on this machine; ratio = figure / baseline of the same run):"
    );
    let mut json = serde_json::Map::new();
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    for f in figures {
        println!(
            "  {:<28} {:>10}  baseline {:<26} {:>10}  {:>6.2}x  {}",
            f.key,
            fmt(f.median, f.unit),
            f.baseline,
            fmt(f.baseline_median, f.unit),
            f.ratio(),
            f.verdict()
        );
        let (m, b) = match f.unit {
            Unit::Us => ("median_us", "baseline_median_us"),
            Unit::PerS => ("median_per_s", "baseline_median_per_s"),
        };
        let mut o = serde_json::Map::new();
        o.insert("what".into(), f.what.clone().into());
        o.insert(m.into(), r2(f.median).into());
        o.insert("baseline".into(), f.baseline.into());
        o.insert(b.into(), r2(f.baseline_median).into());
        o.insert("ratio".into(), r2(f.ratio()).into());
        o.insert("target_ratio".into(), f.target.into());
        o.insert("target_ratio_min".into(), f.target_min.into());
        json.insert(f.key.to_string(), serde_json::Value::Object(o));
    }
    for (key, e) in failures {
        println!("  {key:<28} FAILED: {e}");
        json.insert(
            key.to_string(),
            serde_json::json!({ "failed": e, "median_us": null, "ratio": null }),
        );
    }
    json.insert("quick".into(), cfg.quick.into());
    json.insert("seconds".into(), r2(took.as_secs_f64()).into());
    let out = std::env::var_os("RUNLEASE_BENCH_ENGINE_STORE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
            crate_dir
                .parent()
                .unwrap_or(crate_dir)
                .join("target/bench/engine_store.json")
        });
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d).expect("create the JSON's folder");
    }
    let text =
        serde_json::to_string_pretty(&serde_json::Value::Object(json)).expect("encode the JSON");
    std::fs::write(&out, text + "\n").expect("write the JSON");
    println!(
        "wrote {} ({:.0} s, {})",
        out.display(),
        took.as_secs_f64(),
        if cfg.quick { "quick" } else { "full" }
    );
}
