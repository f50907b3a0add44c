//! `cargo xtask bench [--quick | --smoke]`: run the criterion benchmarks of lease-fs,
//! lease-sqlite, lease-run's bounded growth and lease-run's store socket, time whole
//! `runlease` processes, then print each figure beside the raw baselines measured in the same
//! run, with the ratios the issues target, and write them to `target/bench/summary.json`
//! (issue #19): one object per operation, keyed by name, with `median_us`, `baseline` (the
//! baseline's name), `baseline_median_us`, `ratio` (median / baseline median),
//! `target_ratio` (an upper bound on the ratio, or null), `target_ratio_min` (a lower bound,
//! or null) and `verdict` (issue #33: `"met"`, `"missed"`, or null when the line has no
//! target). A throughput line (`group_commit_32_vs_1`, issue #20) has `median_per_s` and
//! `baseline_median_per_s` (commits per second) instead of the two `_us` keys; its target
//! is a lower bound (`target_ratio_min`). A line that compares one cost at two sizes (issue
//! #33's costs that must not grow) also has `n_high` and `n_low`: the sizes of the figure
//! and of its baseline (events in the log, idle processes on the machine, cycles of
//! history), which the `--quick` and `--smoke` runs make smaller than the line's name says.
//! A peak-memory line (`peak_rss_*_100k_vs_10k`, issue #33) has `median_kib` and
//! `baseline_median_kib` (peak resident set, KiB) instead of the two `_us` keys.
//!
//! Every figure is read from a file this run wrote: a result older than the run's start
//! (a criterion estimate or a JSON file left by an earlier run) counts as missing, and a
//! missing line fails the command after the table and the summary are written.
//!
//! `--smoke` (CI, issue #33): every benchmark function once with minimal work (criterion's
//! shortest settings, which still write the estimates the summary reads; criterion's
//! `--test` mode writes none), small histories and logs, two whole-process timings per
//! figure; it fails if a bench panics or a line of the summary is missing. Its figures
//! mean nothing; the full set of lines is the point.

mod procs;
mod report;

use procs::processes;
use report::report;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// How much to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Criterion's defaults, 100,000 cycles or events of history.
    Full,
    /// `--quick`: short measurements, 10,000 cycles or events (at most about 5 minutes of
    /// measuring, more while a history grows quadratically: see `reclaim_no_prune`).
    Quick,
    /// `--smoke`: every bench once, minimal work (CI).
    Smoke,
}

/// Parse `[--quick | --smoke]`.
pub fn parse_args(rest: &[String]) -> Result<Mode, String> {
    match rest {
        [] => Ok(Mode::Full),
        [flag] if flag == "--quick" => Ok(Mode::Quick),
        [flag] if flag == "--smoke" => Ok(Mode::Smoke),
        _ => Err(format!(
            "unexpected arguments to `bench` (one of --quick, --smoke, or none): {rest:?}"
        )),
    }
}

/// What each mode measures.
struct Plan {
    /// Cycles of history of lease-run's growth bench (`RUNLEASE_BENCH_HISTORY`).
    history: u64,
    /// Criterion's command line.
    criterion: &'static [&'static str],
    /// Rounds of lease-fs's interleaved figures and of the store socket's throughput.
    lease_rounds: u64,
    socket_rounds: u64,
    /// Whole-process timings per figure.
    n: usize,
    /// Events in the long log of the `*_at_100k_*` lines (their baseline: 10 events, or none)
    /// and of the `peak_rss_*_100k_vs_10k` lines (their baseline: a tenth of it).
    log_events: u64,
    /// Peak-RSS probes per size of each `peak_rss_*` line (the median is the figure).
    rss_probes: usize,
    /// Idle processes added to the machine for `run_true_2000_procs_vs_100`: (high, low).
    procs: (usize, usize),
    /// Cycles of history of `reclaim_no_prune` (lease-fs, no prune), the seconds its build
    /// may take, and its interleaved rounds.
    reclaim_history: u64,
    reclaim_budget_s: u64,
    reclaim_rounds: u64,
    /// Cycles of growth's uncompacted baseline (`None`: the bench's default, or none when
    /// quick).
    uncompacted: Option<u64>,
}

impl Plan {
    fn of(mode: Mode) -> Plan {
        match mode {
            Mode::Full => Plan {
                history: 100_000,
                criterion: &[],
                lease_rounds: 150,
                socket_rounds: 7,
                n: 40,
                log_events: 100_000,
                rss_probes: 5,
                procs: (2_000, 100),
                reclaim_history: 100_000,
                reclaim_budget_s: 600,
                reclaim_rounds: 100,
                uncompacted: None,
            },
            Mode::Quick => Plan {
                history: 10_000,
                criterion: &[
                    "--",
                    "--warm-up-time",
                    "0.5",
                    "--measurement-time",
                    "2",
                    "--sample-size",
                    "10",
                ],
                lease_rounds: 40,
                socket_rounds: 3,
                n: 15,
                log_events: 10_000,
                reclaim_history: 10_000,
                reclaim_budget_s: 120,
                reclaim_rounds: 40,
                // The same RSS probes, machine load and growth baseline as the full run.
                ..Plan::of(Mode::Full)
            },
            // Criterion's smallest sample (10) at 55 iterations, 50 ms of measuring per
            // function; 1,000 bootstrap resamples instead of 100,000 (analysis time); one
            // output line per function.
            Mode::Smoke => Plan {
                history: 200,
                criterion: &[
                    "--",
                    "--warm-up-time",
                    "0.01",
                    "--measurement-time",
                    "0.05",
                    "--sample-size",
                    "10",
                    "--nresamples",
                    "1000",
                    "--output-format",
                    "bencher",
                ],
                lease_rounds: 2,
                socket_rounds: 1,
                n: 2,
                log_events: 1_000,
                rss_probes: 3,
                procs: (500, 100),
                reclaim_history: 500,
                reclaim_budget_s: 30,
                reclaim_rounds: 4,
                uncompacted: Some(200),
            },
        }
    }
}

/// Run everything and report.
pub fn run(root: &Path, mode: Mode) -> Result<(), String> {
    let plan = Plan::of(mode);
    // Cargo's target folder (`CARGO_TARGET_DIR` too), absolute: the benches get paths in
    // it and run in their own packages' folders.
    let target = crate::target_dir(root);
    let target = if target.is_relative() {
        std::env::current_dir()
            .map_err(|e| format!("current folder: {e}"))?
            .join(target)
    } else {
        target
    };
    let target = target.as_path();
    // Results older than this are an earlier run's: not read (see the module docs).
    let since = SystemTime::now() - Duration::from_secs(1);
    let out_dir = target.join(BENCH_DIR);
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    // One `cargo bench` for the four benches: one feature resolution, so one build of the
    // crates they share (a `cargo bench -p` per bench resolves features anew and rebuilds).
    let mut args = vec![
        "bench",
        "-p",
        "lease-fs",
        "-p",
        "lease-sqlite",
        "-p",
        "lease-run",
        "--bench",
        "lease",
        "--bench",
        "store",
        "--bench",
        "growth",
        "--bench",
        "store_socket",
    ];
    args.extend_from_slice(plan.criterion);
    let mut cmd = crate::cargo(&args);
    cmd.env("RUNLEASE_BENCH_HISTORY", plan.history.to_string())
        // lease-fs's lease bench: the interleaved rounds and the re-claim without prune.
        .env("RUNLEASE_BENCH_INTERLEAVED", target.join(INTERLEAVED))
        .env("RUNLEASE_BENCH_ROUNDS", plan.lease_rounds.to_string())
        .env("RUNLEASE_BENCH_RECLAIM", target.join(RECLAIM))
        .env(
            "RUNLEASE_BENCH_RECLAIM_HISTORY",
            plan.reclaim_history.to_string(),
        )
        .env(
            "RUNLEASE_BENCH_RECLAIM_BUDGET",
            plan.reclaim_budget_s.to_string(),
        )
        .env(
            "RUNLEASE_BENCH_RECLAIM_ROUNDS",
            plan.reclaim_rounds.to_string(),
        )
        // lease-run's store socket bench.
        .env("RUNLEASE_BENCH_STORE_SOCKET", target.join(STORE_SOCKET))
        .env(
            "RUNLEASE_BENCH_SOCKET_ROUNDS",
            plan.socket_rounds.to_string(),
        )
        // lease-run's growth bench: its history's figures, beside criterion's results.
        .env("RUNLEASE_BENCH_GROWTH_HISTORY", target.join(GROWTH_HISTORY));
    if let Some(u) = plan.uncompacted {
        cmd.env("RUNLEASE_BENCH_UNCOMPACTED", u.to_string());
    }
    if mode != Mode::Full {
        cmd.env("RUNLEASE_BENCH_QUICK", "1");
    }
    if mode == Mode::Smoke {
        cmd.env("RUNLEASE_BENCH_SMOKE", "1");
    }
    let t = Instant::now();
    crate::run_status(cmd)?;
    eprintln!(
        "bench: criterion benches built and run in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    crate::run_status(crate::cargo(&["build", "--release", "-p", "lease-cli"]))?;
    let t = Instant::now();
    let processes = processes(target, &plan)?;
    eprintln!(
        "bench: whole-process timings in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    report(target, &plan, since, &processes)
}

// Paths in cargo's target folder (`target/` unless `CARGO_TARGET_DIR` says otherwise).

/// Where the figures go (created by `run` before anything is measured; each bench that
/// writes a file there creates it too, so it runs alone on a fresh clone).
const BENCH_DIR: &str = "bench";

/// Where the lease bench writes its interleaved figures (see `interleaved` in
/// `lease-fs/benches/lease.rs`).
const INTERLEAVED: &str = "bench/interleaved.json";

/// Where the lease bench writes the re-claim without prune (see `reclaim_no_prune` in
/// `lease-fs/benches/lease.rs`).
const RECLAIM: &str = "bench/reclaim_no_prune.json";

/// Where the store socket bench writes its throughput figures (commits/s with 1, 8 and 32
/// clients and direct, medians of interleaved rounds: see `lease-run/benches/store_socket.rs`).
const STORE_SOCKET: &str = "bench/store_socket.json";

/// Where lease-run's growth bench writes how its history was built.
const GROWTH_HISTORY: &str = "criterion/growth/history.json";

/// Where criterion writes its results.
const CRITERION: &str = "criterion";

/// Medians (µs) of whole-process timings, measured here (not by criterion).
struct Processes {
    /// `runlease run R -- true` and `runlease append`, each beside the median of a
    /// link-exclusive create timed right before each run of the process (the same
    /// primitive as criterion's `raw/link_exclusive_create`, on the same disk), so each
    /// ratio compares figures taken at the same moments.
    run_true: f64,
    run_true_create: f64,
    append: f64,
    append_create: f64,
    /// Issue #33: the same processes on a long log (`log_events` events) and on a short
    /// one (`append`: 10 events; `run` and `status`: none), timed in interleaved pairs.
    log_events: u64,
    append_long: f64,
    append_short: f64,
    run_true_long: f64,
    run_true_empty: f64,
    status_long: f64,
    status_empty: f64,
    /// Issue #33: peak memory of the same processes on a long log and on one a tenth as long.
    rss: PeakRss,
    /// Issue #33: `runlease run R -- true` with `procs.0` and with `procs.1` idle processes
    /// added to the machine.
    procs: (usize, usize),
    run_true_procs_high: f64,
    run_true_procs_low: f64,
}

/// Issue #33: peak resident set (KiB, each the median of `Plan::rss_probes` probes by
/// [`crate::rss::peak_kib`]) of whole `runlease` processes on a run whose log has
/// `events.0` events and on one with `events.1` (a tenth as many), as (long, short).
struct PeakRss {
    events: (u64, u64),
    /// `runlease run R -- true`.
    run_true: (u64, u64),
    /// `runlease append R`, inside the run held by an `Owner` (each probe adds an event).
    append: (u64, u64),
    /// `runlease status R`.
    status: (u64, u64),
}
