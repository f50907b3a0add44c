//! Latency (p50/p99): the engine commit against the guarded create and a plain put.

use crate::figures::{Figure, Unit, push};
use crate::support::{
    Guarded, PlainPut, claim, etcd_run, open_run, opts, pct_us, put, release, release_run,
};
use crate::{Cfg, cluster};
use lease_core::TimingPolicy;
use lease_core::store_log::StoreTail;
use lease_run::{Batch, OpenOptions};
use std::path::Path;
use std::time::{Duration, Instant};

pub(crate) fn latency(
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
