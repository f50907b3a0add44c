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

mod catch_up;
mod failover;
mod figures;
mod latency;
mod support;
mod throughput;

use crate::catch_up::catch_up;
use crate::failover::failover;
use crate::figures::report;
use crate::latency::latency;
use crate::throughput::throughput;
use std::time::{Duration, Instant};

/// The value of every latency and throughput put: about 100 bytes.
pub(crate) const VALUE: [u8; 100] = [b'v'; 100];
/// Client counts of the throughput rounds.
pub(crate) const CLIENTS: [usize; 3] = [1, 8, 32];
/// The state of the catch-up figure: 10 MiB of 1 KiB values.
pub(crate) const STATE_BYTES: usize = 10 << 20;
pub(crate) const DOC_BYTES: usize = 1024;

pub(crate) struct Cfg {
    quick: bool,
}

impl Cfg {
    pub(crate) fn latency_samples(&self) -> usize {
        if self.quick { 150 } else { 600 }
    }
    pub(crate) fn rounds(&self) -> usize {
        if self.quick { 3 } else { 5 }
    }
    pub(crate) fn round_target(&self) -> Duration {
        Duration::from_millis(if self.quick { 600 } else { 1500 })
    }
    pub(crate) fn failovers(&self) -> usize {
        if self.quick { 2 } else { 5 }
    }
    pub(crate) fn catch_ups(&self) -> usize {
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
