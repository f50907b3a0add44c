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
    write_out(Path::new(&out), &json);
}

/// Write a bench's JSON file, creating its folder first (a fresh clone has no
/// `target/bench/`).
fn write_out(out: &Path, text: &str) {
    if let Some(d) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
    }
    std::fs::write(out, text).unwrap_or_else(|e| panic!("write {}: {e}", out.display()));
}

/// One run cycled through lease-fs alone: each cycle a claim by a new owner and its
/// release, never a prune.
struct Cycles {
    run: RunDir,
    n: u64,
}

impl Cycles {
    fn create(path: &Path) -> Cycles {
        Cycles {
            run: RunDir::create(path).unwrap(),
            n: 0,
        }
    }

    /// One claim + release, timed.
    fn cycle(&mut self, holder: &lease_core::Holder) -> Duration {
        self.n += 1;
        let now = t(self.n * 10);
        let owner = format!("c{}", self.n);
        let start = Instant::now();
        let l = claim(&self.run, &owner, holder, TimingPolicy::default(), now);
        self.run
            .release(lease_core::ops::ReleaseParams {
                lease: l,
                now,
                seal: None,
            })
            .unwrap();
        start.elapsed()
    }
}

fn files_below(p: &Path) -> u64 {
    std::fs::read_dir(p).map_or(0, |rd| {
        rd.map(|e| e.unwrap())
            .map(|e| {
                if e.file_type().unwrap().is_dir() {
                    files_below(&e.path())
                } else {
                    1
                }
            })
            .sum()
    })
}

/// Re-claim with **no prune at all** (issue #33): a claim + release cycle of one run through
/// lease-fs alone (no lease-run, so no automatic compaction of the run layer), the bench
/// never calling prune: whatever lease-fs does by itself after a release is part of what is
/// measured. Timed at cycle ~10 (cycles 11 to 18 of a run made anew, untimed, every 8
/// cycles) and after `RUNLEASE_BENCH_RECLAIM_HISTORY` cycles (default 100,000), interleaved:
/// each round times one cycle of each, in alternating order, so both see the machine at the
/// same moments; the medians of `RUNLEASE_BENCH_RECLAIM_ROUNDS` rounds (default 100) go to
/// the JSON file `RUNLEASE_BENCH_RECLAIM` names (runs only when it is set: `cargo xtask
/// bench` sets it). The existing re-claim figures (`growth` in lease-run, and
/// `claim_release_warm_run` above) prune; this one is the issue's "library owner that never
/// prunes".
///
/// The history is made by the same cycles (nothing written by hand), on tmpfs (`/dev/shm`,
/// where fsync is free) unless `RUNLEASE_BENCH_DIR` names another folder. When a cycle's
/// cost grows with the history, building it is quadratic (hours for 100,000 cycles), so the
/// build stops after `RUNLEASE_BENCH_RECLAIM_BUDGET` seconds (default 600): the JSON then
/// has the cycles actually made (`history`, below `history_requested`, `cut_short: true`),
/// and the large side is timed there.
fn reclaim_no_prune(_: &mut Criterion) {
    let Some(out) = std::env::var_os("RUNLEASE_BENCH_RECLAIM") else {
        return;
    };
    let env_u64 = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&v| v > 0)
            .unwrap_or(d)
    };
    let requested = env_u64("RUNLEASE_BENCH_RECLAIM_HISTORY", 100_000);
    let budget = Duration::from_secs(env_u64("RUNLEASE_BENCH_RECLAIM_BUDGET", 600));
    let rounds = env_u64("RUNLEASE_BENCH_RECLAIM_ROUNDS", 100);
    let (base, where_) = match std::env::var_os("RUNLEASE_BENCH_DIR") {
        Some(d) => (std::path::PathBuf::from(d), "RUNLEASE_BENCH_DIR"),
        None if Path::new("/dev/shm").is_dir() => ("/dev/shm".into(), "tmpfs (/dev/shm)"),
        None => (std::env::temp_dir(), "the temp folder"),
    };
    let scratch = tempfile::Builder::new()
        .prefix("runlease-reclaim-")
        .tempdir_in(&base)
        .unwrap();
    let holder = this_holder().unwrap();

    let mut large = Cycles::create(&scratch.path().join("large"));
    let start = Instant::now();
    let mut cut_short = false;
    while large.n < requested {
        large.cycle(&holder);
        if start.elapsed() > budget {
            cut_short = true;
            break;
        }
    }
    let built = start.elapsed();
    let history = large.n;
    let lease_files_built = files_below(&scratch.path().join("large/lease"));
    println!(
        "reclaim_no_prune: built {history} cycles of {requested} on {where_} in {:.1} s{}; lease/ holds {lease_files_built} files",
        built.as_secs_f64(),
        if cut_short {
            " (cut short by RUNLEASE_BENCH_RECLAIM_BUDGET)"
        } else {
            ""
        }
    );

    let mut small: Option<Cycles> = None;
    let mut made = 0u64;
    let (mut s_times, mut l_times) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        if small.as_ref().is_none_or(|s| s.n >= 18) {
            made += 1;
            let mut s = Cycles::create(&scratch.path().join(format!("small-{made}")));
            for _ in 0..10 {
                s.cycle(&holder);
            }
            small = Some(s);
        }
        let s = small.as_mut().unwrap();
        if r % 2 == 0 {
            s_times.push(s.cycle(&holder));
            l_times.push(large.cycle(&holder));
        } else {
            l_times.push(large.cycle(&holder));
            s_times.push(s.cycle(&holder));
        }
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e6
    };
    let (small_us, large_us) = (median(s_times), median(l_times));
    let lease_files = files_below(&scratch.path().join("large/lease"));
    println!(
        "reclaim_no_prune: cycle at ~10 cycles {small_us:.1} µs, at {history} cycles {large_us:.1} µs ({:.2}x; {rounds} interleaved rounds, medians); lease/ holds {lease_files} files",
        large_us / small_us
    );
    let json = format!(
        "{{\"rounds\": {rounds}, \"history\": {history}, \"history_requested\": {requested}, \"cut_short\": {cut_short}, \"build_seconds\": {:.2}, \"where\": \"{where_}\", \"lease_files\": {lease_files}, \"cycle_10_us\": {small_us:.2}, \"cycle_history_us\": {large_us:.2}}}\n",
        built.as_secs_f64()
    );
    write_out(Path::new(&out), &json);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    targets = raw, lease, append, interleaved, reclaim_no_prune
}
criterion_main!(benches);
