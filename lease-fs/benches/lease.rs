//! Benchmarks of the lease and the event log on the real disk, each beside a raw baseline
//! measured in the same run (`cargo xtask bench` prints the ratios).
//!
//! Baselines: `raw/plain_write` (create + write, no fsync), `raw/pwrite` and
//! `raw/pwrite_fdatasync` (a heartbeat slot written in place into an open file),
//! `raw/read_file` (read a small file whole), `raw/atomic_replace_fsync`
//! (temp, write, fsync, rename, fsync dir), `raw/link_exclusive_create` (temp, write, fsync,
//! link, fsync dir, unlink temp), and `raw/two_link_exclusive_creates`.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use lease_core::LeaseOps;
use lease_core::ops::{Expectation, TakeoverTrigger};
use lease_core::{
    Digest, Event, FileRef, Generation, Identity, RunId, Sequence, Timestamp, TimingPolicy, encode,
};
use lease_fs::fs::Fs;
use lease_fs::{RealFs, RunDir, primitives, this_holder};
use std::path::Path;
use std::time::{Duration, Instant};

fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_796_169_600_000 + ms).unwrap()
}

fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

fn durable() -> TimingPolicy {
    TimingPolicy::default().with_durability(lease_core::HeartbeatDurability::Durable)
}

/// Claim `run` as owner `owner` under `policy` at `now`.
fn claim(
    run: &RunDir,
    owner: &str,
    holder: &lease_core::Holder,
    policy: TimingPolicy,
    now: Timestamp,
) -> lease_core::ops::OwnedLease {
    run.claim(lease_core::ops::ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: id(owner),
        holder: holder.clone(),
        policy,
        now,
        store_floor: None,
    })
    .unwrap()
}

/// The head of `run` at `now`, then an operator takeover of exactly it by `owner`: the
/// takeover alone is timed.
fn timed_takeover(
    run: &RunDir,
    owner: &str,
    holder: &lease_core::Holder,
    now: Timestamp,
) -> (Duration, lease_core::ops::OwnedLease) {
    let head = run.status(now, false).unwrap().head.unwrap();
    let expect = Expectation::of(&head);
    let start = Instant::now();
    let l = run
        .takeover(lease_core::ops::TakeoverParams {
            run_id: run.run_id().clone(),
            owner_id: id(owner),
            holder: holder.clone(),
            policy: TimingPolicy::default(),
            now,
            trigger: TakeoverTrigger::Operator {
                watched_unchanged_ms: lease_core::ghost::simulated_watch(&expect, now),
            },
            expect,
        })
        .unwrap();
    (start.elapsed(), l)
}

/// Compact `run` down to 2 generations (untimed upkeep of the warm-run benchmarks, as
/// lease-run's automatic compaction does).
fn prune(run: &RunDir, now: Timestamp) {
    run.prune(lease_core::ops::PruneParams {
        run_id: run.run_id().clone(),
        keep: 2,
        by: id("bench"),
        now,
    })
    .unwrap();
}

fn raw(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let fs = RealFs::create(&dir.path().join("raw")).unwrap();
    fs.ensure_dir("d").unwrap();
    let bytes = vec![b'x'; 300];
    let mut g = c.benchmark_group("raw");
    let mut n = 0u64;
    g.bench_function("plain_write", |b| {
        b.iter(|| {
            n += 1;
            fs.write_new(&format!("d/p{n}"), &bytes).unwrap();
        })
    });
    // The floors of an in-place heartbeat (issue #19): one positioned write of a slot's
    // bytes into an open file, with and without `fdatasync`, and a plain whole-file read
    // (the floor of a status read, which reads an epoch and a beat).
    let slot = lease_core::beat::slot_bytes(1, &bytes).unwrap();
    let floor = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.path().join("pwrite-floor"))
        .unwrap();
    g.bench_function("pwrite", |b| {
        b.iter(|| std::os::unix::fs::FileExt::write_all_at(&floor, &slot, 2048).unwrap())
    });
    g.bench_function("pwrite_fdatasync", |b| {
        b.iter(|| {
            std::os::unix::fs::FileExt::write_all_at(&floor, &slot, 2048).unwrap();
            floor.sync_data().unwrap();
        })
    });
    std::fs::write(dir.path().join("read-floor"), &bytes).unwrap();
    g.bench_function("read_file", |b| {
        b.iter(|| std::fs::read(dir.path().join("read-floor")).unwrap())
    });
    g.bench_function("atomic_replace_fsync", |b| {
        b.iter(|| primitives::replace(&fs, "d/replaced", &bytes, true).unwrap())
    });
    g.bench_function("link_exclusive_create", |b| {
        b.iter(|| {
            n += 1;
            assert!(primitives::create_exclusive(&fs, &format!("d/c{n}"), &bytes).unwrap());
        })
    });
    g.bench_function("two_link_exclusive_creates", |b| {
        b.iter(|| {
            n += 1;
            assert!(primitives::create_exclusive(&fs, &format!("d/a{n}"), &bytes).unwrap());
            assert!(primitives::create_exclusive(&fs, &format!("d/b{n}"), &bytes).unwrap());
        })
    });
    g.finish();
}

fn lease(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let holder = this_holder().unwrap();
    let mut g = c.benchmark_group("lease");
    let mut runs = 0u64;
    g.bench_function("claim_release_fresh_run", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                runs += 1;
                let run = RunDir::create(&dir.path().join(format!("r{runs}"))).unwrap();
                // Create the folders outside the timed part: a fresh run's first claim also
                // creates `lease/epochs`, measured separately below.
                run.fs().ensure_dir("lease/epochs").unwrap();
                run.fs().ensure_dir("lease/cutoffs").unwrap();
                let start = Instant::now();
                let l = claim(&run, "bench", &holder, TimingPolicy::default(), t(0));
                run.release(lease_core::ops::ReleaseParams {
                    lease: l.clone(),
                    now: t(1),
                    seal: None,
                })
                .unwrap();
                total += start.elapsed();
            }
            total
        })
    });
    // The same cycle on one warm run (issue #19): no fresh folder per iteration, whose
    // untimed creation the timed fsyncs would also commit to the journal. A prune every 8
    // cycles (untimed) keeps `lease/` small, as lease-run's automatic compaction does.
    {
        let run = RunDir::create(&dir.path().join("warm")).unwrap();
        let mut cycles = 0u64;
        g.bench_function("claim_release_warm_run", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    cycles += 1;
                    let start = Instant::now();
                    let l = claim(&run, "bench", &holder, TimingPolicy::default(), t(cycles));
                    run.release(lease_core::ops::ReleaseParams {
                        lease: l,
                        now: t(cycles),
                        seal: None,
                    })
                    .unwrap();
                    total += start.elapsed();
                    if cycles % 8 == 0 {
                        prune(&run, t(cycles));
                    }
                }
                total
            })
        });
    }
    for (name, policy) in [
        ("heartbeat_local", TimingPolicy::default()),
        ("heartbeat_durable", durable()),
    ] {
        let run = RunDir::create(&dir.path().join(name)).unwrap();
        let l = claim(&run, "bench", &holder, policy, t(0));
        let mut count = 0;
        g.bench_function(name, |b| {
            b.iter(|| {
                count += 1;
                run.heartbeat(&l, t(count), count, None).unwrap();
            })
        });
    }
    {
        let run = RunDir::create(&dir.path().join("status")).unwrap();
        let l = claim(&run, "bench", &holder, TimingPolicy::default(), t(0));
        run.heartbeat(&l, t(1), 1, None).unwrap();
        g.bench_function("status_read", |b| {
            b.iter(|| run.status(t(2), false).unwrap())
        });
    }
    g.bench_function("takeover", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                runs += 1;
                let run = RunDir::create(&dir.path().join(format!("tk{runs}"))).unwrap();
                let old = claim(&run, "old", &holder, TimingPolicy::default(), t(0));
                run.fs().ensure_dir("lease/cutoffs").unwrap();
                let (took, new) = timed_takeover(&run, "new", &holder, t(60_000));
                total += took;
                assert!(new.generation > old.generation);
            }
            total
        })
    });
    // The same takeover on one warm run: each replaces the previous taker, so the timed
    // fsyncs commit only the takeover's own writes (a fresh folder per iteration makes them
    // commit its untimed creation too, as for claim+release). A prune every 8 takeovers
    // (untimed) keeps `lease/` small.
    {
        let run = RunDir::create(&dir.path().join("tk-warm")).unwrap();
        claim(&run, "old", &holder, TimingPolicy::default(), t(0));
        run.fs().ensure_dir("lease/cutoffs").unwrap();
        let mut n = 0u64;
        g.bench_function("takeover_warm_run", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    n += 1;
                    let now = t(60_000 * (n + 1));
                    total += timed_takeover(&run, &format!("taker-{n}"), &holder, now).0;
                    if n % 8 == 0 {
                        prune(&run, now);
                    }
                }
                total
            })
        });
    }
    g.finish();
}

/// Write `n` valid events directly (no fsync: setup only).
fn prefill(root: &Path, run: &RunId, generation: Generation, owner: &Identity, n: u64) {
    let dir = root.join("events");
    std::fs::create_dir_all(&dir).unwrap();
    let mut prev: Option<Digest> = None;
    for s in 1..=n {
        let ev = Event {
            run_id: run.clone(),
            sequence: Sequence::new(s).unwrap(),
            generation,
            owner_id: owner.clone(),
            event_type: id("prefill"),
            payload: serde_json::json!({ "s": s }),
            timestamp: t(s),
            prev_hash: prev.take(),
        };
        let bytes = encode(&ev).unwrap();
        prev = Some(Digest::of(&bytes));
        std::fs::write(root.join(FileRef::Event(ev.sequence).path()), &bytes).unwrap();
    }
}

fn append(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let holder = this_holder().unwrap();
    let mut g = c.benchmark_group("append");
    for n in [10u64, 1_000, 10_000] {
        let root = dir.path().join(format!("log{n}"));
        let run = RunDir::create(&root).unwrap();
        let l = claim(&run, "bench", &holder, TimingPolicy::default(), t(0));
        prefill(&root, run.run_id(), l.generation, &l.owner_id, n);
        g.bench_with_input(BenchmarkId::new("events", n), &n, |b, &n| {
            b.iter_custom(|iters| {
                // A fresh handle per batch: the first append finds the tail by the Exists
                // gallop, later ones use the cached hint.
                let run = RunDir::open(&root).unwrap();
                let start = Instant::now();
                for i in 0..iters {
                    run.append(
                        &l,
                        lease_core::ops::AppendParams {
                            event_type: id("bench"),
                            payload: serde_json::json!(i),
                            now: t(i),
                            tail_hint: None,
                        },
                    )
                    .unwrap();
                }
                let took = start.elapsed();
                // Untimed: remove what was appended so every batch starts at n events.
                for s in n + 1..=n + iters {
                    std::fs::remove_file(
                        root.join(FileRef::Event(Sequence::new(s).unwrap()).path()),
                    )
                    .unwrap();
                }
                took
            })
        });
    }
    g.finish();
}

/// The fsync-bound operations measured **interleaved with their baseline** (issue #19): each
/// round times one link-exclusive create, one claim+release, one takeover of an owner that
/// had claimed (untimed: the claim before, the taker's release after) and one takeover of an
/// owner that had itself taken over (a chain of takeovers: GATE then reads and syncs the
/// previous cutoff, §7.13), each on a warm run of its own, so every ratio compares figures
/// taken at the same moments. This disk's fsync latency moves by 2x within minutes, so
/// criterion's per-function medians, taken one function after another, give ratios that
/// move as much. Runs only when `RUNLEASE_BENCH_INTERLEAVED` names the JSON file to write
/// (`cargo xtask bench` sets it); `RUNLEASE_BENCH_ROUNDS` rounds (default 60).
fn interleaved(_: &mut Criterion) {
    let Some(out) = std::env::var_os("RUNLEASE_BENCH_INTERLEAVED") else {
        return;
    };
    let rounds: usize = std::env::var("RUNLEASE_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(60);
    let dir = tempfile::tempdir().unwrap();
    let holder = this_holder().unwrap();
    let fs = RealFs::create(&dir.path().join("raw")).unwrap();
    fs.ensure_dir("d").unwrap();
    let bytes = vec![b'x'; 300];
    let cr = RunDir::create(&dir.path().join("claim-release")).unwrap();
    let tk = RunDir::create(&dir.path().join("takeover")).unwrap();
    let chain = RunDir::create(&dir.path().join("takeover-chain")).unwrap();
    claim(&chain, "first", &holder, TimingPolicy::default(), t(0));
    for run in [&tk, &chain] {
        run.fs().ensure_dir("lease/cutoffs").unwrap();
    }
    let take = |run: &RunDir, n: u64, now| timed_takeover(run, &format!("taker-{n}"), &holder, now);
    let mut samples: [Vec<Duration>; 4] = Default::default();
    // One unmeasured round first (folders, caches).
    for r in 0..=rounds {
        let n = r as u64 + 1;
        let now = t(60_000 * n);
        let start = Instant::now();
        assert!(primitives::create_exclusive(&fs, &format!("d/c{n}"), &bytes).unwrap());
        let create = start.elapsed();

        let start = Instant::now();
        let l = claim(&cr, "bench", &holder, TimingPolicy::default(), now);
        cr.release(lease_core::ops::ReleaseParams {
            lease: l,
            now,
            seal: None,
        })
        .unwrap();
        let cycle = start.elapsed();

        claim(&tk, "owner", &holder, TimingPolicy::default(), now);
        let (took, l) = take(&tk, n, t(60_000 * n + 30_000));
        tk.release(lease_core::ops::ReleaseParams {
            lease: l,
            now: t(60_000 * n + 30_000),
            seal: None,
        })
        .unwrap();

        let (took_chain, _) = take(&chain, n, now);
        if n % 8 == 0 {
            for run in [&cr, &tk, &chain] {
                prune(run, t(60_000 * n + 40_000));
            }
        }
        if r > 0 {
            for (v, d) in samples.iter_mut().zip([create, cycle, took, took_chain]) {
                v.push(d);
            }
        }
    }
    let [create, cycle, took, took_chain] = samples.map(|mut v| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e6
    });
    let json = format!(
        "{{\"rounds\": {rounds}, \"link_exclusive_create_us\": {create:.2}, \"claim_release_warm_us\": {cycle:.2}, \"takeover_us\": {took:.2}, \"takeover_chain_us\": {took_chain:.2}}}\n"
    );
    std::fs::write(&out, json).unwrap();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    targets = raw, lease, append, interleaved
}
criterion_main!(benches);
