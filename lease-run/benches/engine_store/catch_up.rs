//! Catch-up at 10 MB: through the run layer and through `EngineStore` alone.

use crate::figures::{Figure, Unit, push};
use crate::support::{claim, etcd_run, median, now_ts, open_run, opts, release, release_run};
use crate::{Cfg, DOC_BYTES, STATE_BYTES, cluster};
use lease_core::{LeaseOps, TimingPolicy};
use lease_etcd::EtcdRun;
use lease_run::engine_store::{CatchUp, EngineStore};
use lease_run::{Batch, Run};
use std::path::Path;
use std::time::Instant;

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

pub(crate) fn catch_up(
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
