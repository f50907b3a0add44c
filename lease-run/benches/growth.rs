//! Bounded growth (issue #17): the cost of a claim, and of a whole cycle (claim + release +
//! the automatic compaction, `lease_run::compact::release`), on a run with 10 cycles of
//! history and on one with 100,000, measured in the same run (`cargo xtask bench` prints
//! the ratios; the target is within 10%).
//!
//! **How the history is made.** Honestly, through the real operations: every cycle of
//! history is a claim and a `compact::release` on a real run folder (`RealFs`, the same
//! code as `runlease run`'s lease steps; automatic compaction included, so the history is
//! what 100,000 real runs leave). Nothing is written by hand. To make 100,000 cycles fast
//! the folders live on tmpfs (`/dev/shm`, where fsync costs nothing) unless
//! `RUNLEASE_BENCH_DIR` names another folder; `RUNLEASE_BENCH_HISTORY` overrides 100,000.
//! The time to build it is printed and written to
//! `target/criterion/growth/history.json` (with the files left in `lease/`;
//! `RUNLEASE_BENCH_GROWTH_HISTORY` names another file).
//!
//! **Same phase for both.** A compaction runs every `COMPACT_EVERY` generations (every 8
//! cycles), so what a claim lists depends on where in that period it falls. Every
//! iteration does one cycle on each run; the 10-cycle runs are made anew (untimed) every 8
//! iterations, so both sides average over the whole period and both include exactly one
//! compaction per 8 cycles. The large run grows by the measured iterations (printed).
//!
//! **Same moments for both.** The two sides run interleaved (as lease-sqlite's bench):
//! each iteration of either does one cycle on the small run and one on the large one, in
//! alternating order, and times only its own, so both see the shared machine at the same
//! moments.
//!
//! **Baseline.** `growth/claim_uncompacted/10000`: the same claim on a run of 10,000
//! cycles released without compaction (what every run looked like before issue #17);
//! `RUNLEASE_BENCH_UNCOMPACTED` changes the count (`cargo xtask bench --smoke`: 200).
//!
//! `RUNLEASE_BENCH_SMOKE` (`cargo xtask bench --smoke`): the group keeps the command line's
//! criterion settings (the short ones of the smoke pass) instead of its own.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use lease_core::ops::{ClaimParams, OwnedLease, ReleaseParams};
use lease_core::{Holder, Identity, LeaseOps, Timestamp, TimingPolicy};
use lease_fs::RunDir;
use lease_run::FolderAuthority;
use lease_run::compact::{self, COMPACT_EVERY, Compaction};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SMALL: u64 = 10;
const LARGE: u64 = 100_000;
/// History of the uncompacted baseline (its claims list every epoch, so it is kept short;
/// `RUNLEASE_BENCH_UNCOMPACTED` overrides it).
const UNCOMPACTED: u64 = 10_000;

/// One cycle: the claim (timed in `claim`), the release with its compaction.
struct Cycler {
    auth: FolderAuthority,
    holder: Holder,
    policy: TimingPolicy,
    n: u64,
    compactions: u64,
    /// `false` for the baseline: a plain release, never compacted (the "before").
    compacting: bool,
}

impl Cycler {
    fn create(path: &Path) -> Cycler {
        let dir = RunDir::create(path).expect("create the run folder");
        Cycler {
            auth: FolderAuthority(Arc::new(dir)),
            holder: lease_fs::this_holder().expect("this holder"),
            policy: TimingPolicy::default(),
            n: 0,
            compactions: 0,
            compacting: true,
        }
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_unix_millis(1_700_000_000_000 + self.n * 10).expect("time")
    }

    fn claim(&mut self) -> OwnedLease {
        self.n += 1;
        self.auth
            .claim(ClaimParams {
                run_id: self.auth.0.run_id().clone(),
                owner_id: Identity::new(format!("bench-{}", self.n)).expect("id"),
                holder: self.holder.clone(),
                policy: self.policy,
                now: self.now(),
                store_floor: None,
            })
            .expect("claim")
    }

    fn release(&mut self, lease: OwnedLease) {
        if !self.compacting {
            self.auth
                .release(ReleaseParams {
                    lease,
                    now: self.now(),
                    seal: None,
                })
                .expect("release");
            return;
        }
        let r = compact::release(
            &self.auth,
            Some(&self.auth.0),
            ReleaseParams {
                lease,
                now: self.now(),
                seal: None,
            },
        )
        .expect("release");
        match r.compaction {
            Compaction::NotDue { .. } => {}
            Compaction::Ran {
                prune: Ok(_),
                temps: Some(Ok(_)),
            } => self.compactions += 1,
            other => panic!("compaction failed: {other:?}"),
        }
    }

    fn cycle(&mut self) {
        let l = self.claim();
        self.release(l);
    }

    /// Time one claim, then release (untimed) unless `whole`, which times the cycle.
    fn timed(&mut self, whole: bool) -> Duration {
        let t = Instant::now();
        let l = self.claim();
        let claim = t.elapsed();
        self.release(l);
        if whole { t.elapsed() } else { claim }
    }
}

/// Runs with 10 cycles of history: a new one every 8 cycles (one compaction period).
struct SmallRuns {
    base: PathBuf,
    current: Option<Cycler>,
    made: u64,
}

impl SmallRuns {
    fn next(&mut self) -> &mut Cycler {
        let stale = self
            .current
            .as_ref()
            .is_none_or(|s| s.n >= SMALL + COMPACT_EVERY / 2);
        if stale {
            self.made += 1;
            let mut s = Cycler::create(&self.base.join(format!("small-{}", self.made)));
            for _ in 0..SMALL {
                s.cycle();
            }
            self.current = Some(s);
        }
        self.current.as_mut().expect("made above")
    }
}

fn files_below(p: &Path) -> u64 {
    std::fs::read_dir(p).map_or(0, |rd| {
        rd.map(|e| e.expect("entry"))
            .map(|e| {
                if e.file_type().expect("type").is_dir() {
                    files_below(&e.path())
                } else {
                    1
                }
            })
            .sum()
    })
}

fn scratch_base() -> (PathBuf, &'static str) {
    if let Some(d) = std::env::var_os("RUNLEASE_BENCH_DIR") {
        return (PathBuf::from(d), "RUNLEASE_BENCH_DIR");
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        (shm.to_path_buf(), "tmpfs (/dev/shm)")
    } else {
        (std::env::temp_dir(), "the temp folder")
    }
}

fn growth(c: &mut Criterion) {
    let (base, where_) = scratch_base();
    let scratch = tempfile::Builder::new()
        .prefix("runlease-growth-")
        .tempdir_in(&base)
        .expect("scratch folder");
    let large_n = std::env::var("RUNLEASE_BENCH_HISTORY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(LARGE);

    // The large history, built through the real operations and timed.
    let mut large = Cycler::create(&scratch.path().join("large"));
    let t = Instant::now();
    for _ in 0..large_n {
        large.cycle();
    }
    let built = t.elapsed();
    let large_root = scratch.path().join("large");
    let files = files_below(&large_root.join("lease"));
    let events = files_below(&large_root.join("events"));
    println!(
        "growth: built {large_n} cycles ({} generations, {} compactions) on {where_} in {:.1} s ({:.1} µs per cycle); lease/ holds {files} files",
        large_n * 2,
        large.compactions,
        built.as_secs_f64(),
        built.as_secs_f64() * 1e6 / large_n as f64
    );
    let report = serde_json::json!({
        "history": large_n,
        "generations": large_n * 2,
        "compactions": large.compactions,
        "build_seconds": built.as_secs_f64(),
        "lease_files": files,
        "event_files": events,
        "where": where_,
    });
    // `cargo xtask bench` reads it (and names it in `RUNLEASE_BENCH_GROWTH_HISTORY`): its
    // folder is created first (a fresh clone has none before criterion's first result),
    // and a failure to write it fails the bench.
    let out = std::env::var_os("RUNLEASE_BENCH_GROWTH_HISTORY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/criterion/growth/history.json")
        });
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("create {}: {e}", d.display()));
    }
    std::fs::write(&out, report.to_string())
        .unwrap_or_else(|e| panic!("write {}: {e}", out.display()));

    let mut g = c.benchmark_group("growth");
    if std::env::var_os("RUNLEASE_BENCH_SMOKE").is_none() {
        g.sample_size(30)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3));
    }
    let mut small = SmallRuns {
        base: scratch.path().to_path_buf(),
        current: None,
        made: 0,
    };
    for (name, whole) in [("claim", false), ("cycle", true)] {
        let before = large.n;
        // Interleaved, as lease-sqlite's bench: every iteration of either side does one
        // cycle on each run (in alternating order) and times only its own, so both see the
        // machine at the same moments and the ratio compares the work.
        for (n, measure_large) in [(SMALL, false), (large_n, true)] {
            g.bench_function(BenchmarkId::new(name, n), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for i in 0..iters {
                        let (s, l) = if i % 2 == 0 {
                            let s = small.next().timed(whole);
                            (s, large.timed(whole))
                        } else {
                            let l = large.timed(whole);
                            (small.next().timed(whole), l)
                        };
                        total += if measure_large { l } else { s };
                    }
                    total
                })
            });
        }
        println!(
            "growth/{name}: the large run went from {before} to {} cycles while measured",
            large.n
        );
    }
    // Baseline, the "before": the same claim on a run whose 10,000 cycles were never
    // compacted (claim lists every epoch). Building it is quadratic (minutes), so
    // `cargo xtask bench --quick` (RUNLEASE_BENCH_QUICK) leaves it out unless
    // RUNLEASE_BENCH_UNCOMPACTED names a count (the smoke pass: a short one).
    let uncompacted = std::env::var("RUNLEASE_BENCH_UNCOMPACTED")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    if uncompacted.is_some() || std::env::var_os("RUNLEASE_BENCH_QUICK").is_none() {
        let uncompacted = uncompacted.unwrap_or(UNCOMPACTED);
        let mut raw = Cycler::create(&scratch.path().join("uncompacted"));
        raw.compacting = false;
        for _ in 0..uncompacted {
            raw.cycle();
        }
        g.bench_function(BenchmarkId::new("claim_uncompacted", uncompacted), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| raw.timed(false)).sum())
        });
        println!(
            "growth/claim_uncompacted: that run went from {uncompacted} to {} cycles while measured",
            raw.n
        );
    }
    g.finish();
    let files = files_below(&large_root.join("lease"));
    println!("growth: lease/ of the large run holds {files} files at the end");
}

criterion_group!(benches, growth);
criterion_main!(benches);
