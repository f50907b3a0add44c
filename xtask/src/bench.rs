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

use std::cell::RefCell;
use std::path::Path;
use std::process::{Child, Command, Stdio};
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
                rss_probes: 5,
                procs: (2_000, 100),
                reclaim_history: 10_000,
                reclaim_budget_s: 120,
                reclaim_rounds: 40,
                uncompacted: None,
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
    /// `runlease append R`, inside the run held by an [`Owner`] (each probe adds an event).
    append: (u64, u64),
    /// `runlease status R`.
    status: (u64, u64),
}

/// One link-exclusive create (`lease_fs::primitives::create_exclusive`: temp, write, fsync,
/// link, fsync dir, unlink temp) of a 300-byte file, timed.
fn timed_create(fs: &lease_fs::RealFs, n: usize) -> Result<Duration, String> {
    let t = Instant::now();
    let made = lease_fs::primitives::create_exclusive(fs, &format!("d/c{n}"), &[b'x'; 300])
        .map_err(|e| format!("baseline create: {e}"))?;
    if !made {
        return Err(format!("baseline create: d/c{n} exists"));
    }
    Ok(t.elapsed())
}

fn median_us(v: Vec<Duration>) -> f64 {
    median(v).as_secs_f64() * 1e6
}

/// The median of `v` (the upper one of an even count); `v` must not be empty.
fn median<T: Ord + Copy>(mut v: Vec<T>) -> T {
    v.sort();
    v[v.len() / 2]
}

/// A `runlease` command (release build) on `run`, its output discarded: `args`, the run,
/// then `tail`.
fn runlease(bin: &Path, args: &[&str], run: &Path, tail: &[&str]) -> Command {
    let mut c = Command::new(bin);
    c.args(args)
        .arg(run)
        .args(tail)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// Run `c` to its end, timed; an error unless it exits 0.
fn timed(mut c: Command) -> Result<Duration, String> {
    let t = Instant::now();
    let st = c.status().map_err(|e| format!("{c:?}: {e}"))?;
    let took = t.elapsed();
    if st.success() {
        Ok(took)
    } else {
        Err(format!("{c:?} exited with {st}"))
    }
}

/// `runlease run -q R -- true`.
fn run_true(bin: &Path, run: &Path) -> Command {
    runlease(bin, &["run", "-q"], run, &["--", "true"])
}

/// `n` interleaved pairs: each round times `a` once and `b` once, in alternating order, so
/// both see the machine at the same moments. The medians (µs) of each are the figures; a
/// first process after a change of the run (a prefilled log) may pay a one-time cost,
/// which the median leaves out.
fn pairs(
    n: usize,
    a: impl FnMut() -> Result<Duration, String>,
    b: impl FnMut() -> Result<Duration, String>,
) -> Result<(f64, f64), String> {
    let (ma, mb) = interleaved(n, a, b)?;
    Ok((ma.as_secs_f64() * 1e6, mb.as_secs_f64() * 1e6))
}

/// [`pairs`] of any measure (`pairs`: times; [`peak_rss`]: KiB): the medians of `n` rounds
/// of `a` once and `b` once, in alternating order.
fn interleaved<T: Ord + Copy>(
    n: usize,
    mut a: impl FnMut() -> Result<T, String>,
    mut b: impl FnMut() -> Result<T, String>,
) -> Result<(T, T), String> {
    let (mut va, mut vb) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        if i % 2 == 0 {
            va.push(a()?);
            vb.push(b()?);
        } else {
            vb.push(b()?);
            va.push(a()?);
        }
    }
    Ok((median(va), median(vb)))
}

/// An owner that sleeps: `runlease run -q R -- sleep 600`, with its generation, owner id
/// and run id (from `status --json` once it is active). Stopped when dropped: SIGTERM goes
/// on to `sleep`, which exits, and the owner releases the run.
struct Owner {
    child: Child,
    generation: String,
    owner_id: String,
    run_id: String,
}

impl Owner {
    fn start(bin: &Path, run: &Path) -> Result<Owner, String> {
        let child = runlease(bin, &["run", "-q"], run, &["--", "sleep", "600"])
            .spawn()
            .map_err(|e| format!("start the owner of {}: {e}", run.display()))?;
        let mut owner = Owner {
            child,
            generation: String::new(),
            owner_id: String::new(),
            run_id: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = runlease(bin, &["status", "--json"], run, &[])
                .stdout(Stdio::piped())
                .output()
                .map_err(|e| format!("status: {e}"))?;
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            if v["state"] == "active" && v["pid"].as_u64() == Some(u64::from(owner.child.id())) {
                owner.generation = v["generation"].as_u64().unwrap_or(0).to_string();
                owner.owner_id = v["owner_id"].as_str().unwrap_or("").to_string();
                owner.run_id = v["run_id"].as_str().unwrap_or("").to_string();
                return Ok(owner);
            }
            if let Ok(Some(st)) = owner.child.try_wait() {
                return Err(format!(
                    "the owner of {} exited with {st} before it became active",
                    run.display()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("the owner never became active: {v}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `runlease append -q` of one small event as this owner.
    fn append(&self, bin: &Path, run: &Path, i: usize) -> Command {
        let payload = format!("{{\"n\":{i}}}");
        runlease(
            bin,
            &[
                "append",
                "-q",
                "--type",
                "bench",
                "--payload",
                &payload,
                "--generation",
                &self.generation,
                "--owner",
                &self.owner_id,
            ],
            run,
            &[],
        )
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        crate::torture::procs::signal_pid(self.child.id(), rustix::process::Signal::TERM);
        let _ = self.child.wait();
    }
}

/// Fill `run`'s log with `n` events as a job that logs its steps leaves it: an owner holds
/// the run while `n` valid events of its generation and owner id (canonical records, the
/// hash chain linked, about 200 payload bytes each, as `cargo xtask rss` writes them; no
/// fsync: setup only) are written straight into `events/`, then the owner is stopped, so
/// its release's cutoff covers them all (every one counts).
fn fill_log(bin: &Path, run: &Path, n: u64) -> Result<(), String> {
    use lease_core::{Digest, Event, FileRef, Generation, Identity, RunId, Sequence, Timestamp};
    let owner = Owner::start(bin, run)?;
    let generation = owner
        .generation
        .parse()
        .ok()
        .and_then(Generation::new)
        .ok_or("the owner's generation")?;
    let owner_id = Identity::new(owner.owner_id.clone()).map_err(|e| e.to_string())?;
    let run_id = RunId::new(owner.run_id.clone()).map_err(|e| e.to_string())?;
    let ty = Identity::new("bench.prefill").map_err(|e| e.to_string())?;
    let mut prev: Option<Digest> = None;
    for s in 1..=n {
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_err(|e| e.to_string())?
            .as_millis();
        let ev = Event {
            run_id: run_id.clone(),
            sequence: Sequence::new(s).ok_or("sequence")?,
            generation,
            owner_id: owner_id.clone(),
            event_type: ty.clone(),
            payload: serde_json::json!({ "step": s, "note": "x".repeat(160) }),
            timestamp: u64::try_from(now_ms)
                .ok()
                .and_then(Timestamp::from_unix_millis)
                .ok_or("time")?,
            prev_hash: prev.take(),
        };
        let bytes = lease_core::encode(&ev).map_err(|e| e.to_string())?;
        prev = Some(Digest::of(&bytes));
        let path = run.join(FileRef::Event(ev.sequence).path());
        std::fs::write(&path, &bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    drop(owner);
    Ok(())
}

/// Idle processes (`sleep 600`, children of this process) added to the machine; killed
/// and reaped when dropped.
struct Idle(Vec<Child>);

impl Idle {
    /// Add or remove processes until there are `n`.
    fn resize(&mut self, n: usize) -> Result<(), String> {
        while self.0.len() > n {
            let mut c = self.0.pop().expect("len > n");
            let _ = c.kill();
            let _ = c.wait();
        }
        while self.0.len() < n {
            let c = Command::new("sleep")
                .arg("600")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("start idle process {}: {e}", self.0.len() + 1))?;
            self.0.push(c);
        }
        Ok(())
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        let _ = self.resize(0);
    }
}

/// Processes on this machine now (the entries of `/proc` that are pids).
fn process_count() -> usize {
    std::fs::read_dir("/proc").map_or(0, |rd| {
        rd.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
            .count()
    })
}

/// The whole-process timings, each a fresh process of the release build.
fn processes(target: &Path, plan: &Plan) -> Result<Processes, String> {
    let n = plan.n;
    let bin = target.join("release/runlease");
    let tmp = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let run = tmp.path().join("bench-run");
    let fs = lease_fs::RealFs::create(&tmp.path().join("baseline"))
        .map_err(|e| format!("baseline folder: {e}"))?;
    lease_fs::fs::Fs::ensure_dir(&fs, "d").map_err(|e| format!("baseline folder: {e}"))?;

    // `runlease run R -- true` on one run, `n` times (after one unmeasured first run that
    // creates it).
    let mut made = 0;
    timed(run_true(&bin, &run))?;
    let (mut times, mut creates) = (Vec::with_capacity(n), Vec::with_capacity(2 * n));
    for _ in 0..n {
        made += 1;
        creates.push(timed_create(&fs, made)?);
        times.push(timed(run_true(&bin, &run))?);
    }
    let run_true_median = median_us(times);
    let run_true_create = median_us(std::mem::take(&mut creates));

    // `runlease append R` `n` times inside a run held by `runlease run R -- sleep`.
    let owner = Owner::start(&bin, &run)?;
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        made += 1;
        creates.push(timed_create(&fs, made)?);
        times.push(timed(owner.append(&bin, &run, i))?);
    }
    drop(owner);
    let append = median_us(times);
    let append_create = median_us(creates);

    // Issue #33: the same processes on a long log and on a short one (and, for peak
    // memory, on one a tenth as long). Each log is filled before the owner whose appends
    // are timed starts.
    let (empty, short, tenth, long) = (
        tmp.path().join("log-empty"),
        tmp.path().join("log-10"),
        tmp.path().join("log-tenth"),
        tmp.path().join("log-long"),
    );
    for r in [&empty, &short, &tenth, &long] {
        timed(run_true(&bin, r))?;
    }
    let t = Instant::now();
    let sizes = (plan.log_events, plan.log_events / 10);
    fill_log(&bin, &short, 10)?;
    fill_log(&bin, &tenth, sizes.1)?;
    fill_log(&bin, &long, sizes.0)?;
    println!(
        "processes: logs of 10, {} and {} events filled in {:.1} s",
        sizes.1,
        sizes.0,
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let rss = peak_rss(&bin, plan.rss_probes, (&long, &tenth), sizes)?;
    println!(
        "processes: peak RSS probed in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let (run_true_long, run_true_empty) = pairs(
        n,
        || timed(run_true(&bin, &long)),
        || timed(run_true(&bin, &empty)),
    )?;
    let (status_long, status_empty) = pairs(
        n,
        || timed(runlease(&bin, &["status"], &long, &[])),
        || timed(runlease(&bin, &["status"], &empty, &[])),
    )?;
    let (owner_long, owner_short) = (Owner::start(&bin, &long)?, Owner::start(&bin, &short)?);
    let mut i = 0;
    let (append_long, append_short) = pairs(
        n,
        || {
            i += 1;
            timed(owner_long.append(&bin, &long, i))
        },
        || timed(owner_short.append(&bin, &short, 0)),
    )?;
    drop((owner_long, owner_short));

    // Issue #33: `runlease run R -- true` with many idle processes on the machine and with
    // few, in blocks (low, high, low, high: starting and killing them takes seconds), on
    // the run with an empty log.
    let (high, low) = plan.procs;
    let mut idle = Idle(Vec::with_capacity(high));
    let (mut at_high, mut at_low) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let base = process_count();
    let per_block = n.div_ceil(2);
    for block in 0..4 {
        let (count, into) = if block % 2 == 0 {
            (low, &mut at_low)
        } else {
            (high, &mut at_high)
        };
        idle.resize(count)?;
        for _ in 0..per_block {
            into.push(timed(run_true(&bin, &empty))?);
        }
    }
    drop(idle);
    println!(
        "processes: {base} processes on the machine before the {low} / {high} idle ones were added"
    );

    Ok(Processes {
        run_true: run_true_median,
        run_true_create,
        append,
        append_create,
        log_events: plan.log_events,
        append_long,
        append_short,
        run_true_long,
        run_true_empty,
        status_long,
        status_empty,
        rss,
        procs: plan.procs,
        run_true_procs_high: median_us(at_high),
        run_true_procs_low: median_us(at_low),
    })
}

/// Issue #33: the [`PeakRss`] figures of the runs `long` and `short`, whose logs have
/// `events` events: `run R -- true`, `status R`, then `append R` inside each run held by an
/// [`Owner`], each measured in `probes` interleaved pairs.
fn peak_rss(
    bin: &Path,
    probes: usize,
    (long, short): (&Path, &Path),
    events: (u64, u64),
) -> Result<PeakRss, String> {
    let kib = |c: Command| crate::rss::peak_kib(&c);
    let run = interleaved(
        probes,
        || kib(run_true(bin, long)),
        || kib(run_true(bin, short)),
    )?;
    let status = interleaved(
        probes,
        || kib(runlease(bin, &["status"], long, &[])),
        || kib(runlease(bin, &["status"], short, &[])),
    )?;
    let (owner_long, owner_short) = (Owner::start(bin, long)?, Owner::start(bin, short)?);
    let append = interleaved(
        probes,
        || kib(owner_long.append(bin, long, 0)),
        || kib(owner_short.append(bin, short, 0)),
    )?;
    drop((owner_long, owner_short));
    Ok(PeakRss {
        events,
        run_true: run,
        append,
        status,
    })
}

/// `path`, if this run wrote it (modified at or after `since`).
fn fresh(path: &Path, since: SystemTime) -> Option<String> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    if modified < since {
        return None;
    }
    std::fs::read_to_string(path).ok()
}

/// A JSON file this run wrote.
fn fresh_json(path: &Path, since: SystemTime) -> Option<serde_json::Value> {
    serde_json::from_str(&fresh(path, since)?).ok()
}

/// Median of one criterion benchmark in nanoseconds, from
/// `target/criterion/.../new/estimates.json`, if this run measured it.
fn median_ns(target: &Path, id: &str, since: SystemTime) -> Option<f64> {
    let path = target.join(CRITERION).join(id).join("new/estimates.json");
    fresh_json(&path, since)?["median"]["point_estimate"].as_f64()
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.1} µs", ns / 1e3)
    }
}

/// One line of the summary: an operation, its baseline and the target ratio.
/// `median` and `baseline_median` are in the line's `unit` (µs, commits/s for a throughput
/// line, KiB for a peak-memory line); the ratio is always median / baseline median.
struct Line {
    key: &'static str,
    median: f64,
    baseline: &'static str,
    baseline_median: f64,
    /// An upper bound on the ratio (a time: lower is better).
    target: Option<f64>,
    /// A lower bound on the ratio (a throughput: higher is better).
    target_min: Option<f64>,
    unit: Unit,
    /// The sizes compared (issue #33): of the figure and of its baseline.
    n: Option<(u64, u64)>,
    /// `false`: a ratio within the target proves nothing (the figure was measured at a
    /// smaller size than asked), so the verdict is null unless the target is missed.
    judged: bool,
}

impl Line {
    fn ratio(&self) -> f64 {
        self.median / self.baseline_median
    }

    /// `"met"`, `"missed"`, or `None` (no target, or nothing to judge).
    fn verdict(&self) -> Option<&'static str> {
        let ratio = self.ratio();
        if ratio.is_nan() {
            return None;
        }
        let met = match (self.target, self.target_min) {
            (Some(t), _) => ratio <= t,
            (None, Some(t)) => ratio >= t,
            (None, None) => return None,
        };
        match (met, self.judged) {
            (true, true) => Some("met"),
            (true, false) => None,
            (false, _) => Some("missed"),
        }
    }
}

#[derive(Clone, Copy)]
enum Unit {
    /// A time per operation in µs.
    Us,
    /// A throughput in operations per second.
    PerS,
    /// A peak resident set size in KiB (lower is better).
    KiB,
}

/// Print the report and write `target/bench/summary.json`; `Err` if a figure is missing.
fn report(target: &Path, plan: &Plan, since: SystemTime, p: &Processes) -> Result<(), String> {
    // Every figure this run should have written and did not: reported together at the end.
    let missing = RefCell::new(Vec::<String>::new());
    let lack = |what: String| {
        missing.borrow_mut().push(what);
        f64::NAN
    };
    let get = |id: &str| {
        median_ns(target, id, since)
            .map(|ns| ns / 1e3)
            .unwrap_or_else(|| lack(format!("criterion result {id}")))
    };
    let growth_history = fresh_json(&target.join(GROWTH_HISTORY), since);
    let history = growth_history
        .as_ref()
        .and_then(|v| v["history"].as_u64())
        .unwrap_or_else(|| {
            lack(GROWTH_HISTORY.into());
            plan.history
        });
    // A JSON file a bench wrote (`Null` when missing: its fields are then not reported
    // one by one).
    let json_file = |rel: &'static str| {
        fresh_json(&target.join(rel), since).unwrap_or_else(|| {
            lack(rel.to_string());
            serde_json::Value::Null
        })
    };
    let il = json_file(INTERLEAVED);
    let ss = json_file(STORE_SOCKET);
    let rc = json_file(RECLAIM);
    let field = |v: &serde_json::Value, file: &str, k: &str| match v {
        serde_json::Value::Null => f64::NAN,
        v => v[k]
            .as_f64()
            .unwrap_or_else(|| lack(format!("{file}: {k}"))),
    };
    let il_get = |k: &str| field(&il, INTERLEAVED, k);
    let ss_get = |k: &str| field(&ss, STORE_SOCKET, k);
    let rc_get = |k: &str| field(&rc, RECLAIM, k);

    let pwrite = get("raw/pwrite");
    let pwrite_sync = get("raw/pwrite_fdatasync");
    let create = get("raw/link_exclusive_create");
    let read = get("raw/read_file");
    let raw_insert = get("store/raw_insert_one_row");
    let reclaim_10 = get("growth/claim/10");
    let il_create = il_get("link_exclusive_create_us");
    let line = |key, median, baseline, baseline_median, target| Line {
        key,
        median,
        baseline,
        baseline_median,
        target,
        target_min: None,
        unit: Unit::Us,
        n: None,
        judged: true,
    };
    // The same cost at two sizes (issue #33).
    let sized = |key, median, baseline, baseline_median, target, n: (u64, u64)| Line {
        n: Some(n),
        ..line(key, median, baseline, baseline_median, target)
    };
    // Issue #33: peak memory (KiB) of a whole process on a long log against one a tenth as
    // long, `(long, short)`.
    let rss_line = |key, (long, short): (u64, u64), baseline| Line {
        unit: Unit::KiB,
        ..sized(
            key,
            long as f64,
            baseline,
            short as f64,
            Some(1.1),
            p.rss.events,
        )
    };
    let reclaim_key: &'static str = match history {
        10_000 => "reclaim_10000",
        100_000 => "reclaim_100000",
        _ => "reclaim_history",
    };
    let reclaim_history = rc["history"].as_u64().unwrap_or(0);
    let reclaim_cut_short = rc["cut_short"].as_bool().unwrap_or(false);
    let lines = vec![
        line(
            "heartbeat_local",
            get("lease/heartbeat_local"),
            "pwrite",
            pwrite,
            Some(4.0),
        ),
        line(
            "heartbeat_durable",
            get("lease/heartbeat_durable"),
            "pwrite_fdatasync",
            pwrite_sync,
            Some(1.3),
        ),
        // The targets are judged on the interleaved figures (one warm run, the baseline
        // create timed in the same rounds); criterion's fresh-folder and warm-run figures
        // follow, each against criterion's own create baseline.
        line(
            "claim_release",
            il_get("claim_release_warm_us"),
            "link_exclusive_create_interleaved",
            il_create,
            Some(2.5),
        ),
        // A takeover of an owner that had claimed (the usual case: 2 creates, 4 fsyncs),
        // and one of an owner that had itself taken over (GATE's sync of the cutoff that
        // takeover made: 5 fsyncs, PROTOCOL §7.13).
        line(
            "takeover",
            il_get("takeover_us"),
            "link_exclusive_create_interleaved",
            il_create,
            Some(2.5),
        ),
        line(
            "takeover_chain",
            il_get("takeover_chain_us"),
            "link_exclusive_create_interleaved",
            il_create,
            Some(2.5),
        ),
        line(
            "claim_release_fresh",
            get("lease/claim_release_fresh_run"),
            "link_exclusive_create",
            create,
            None,
        ),
        line(
            "claim_release_warm",
            get("lease/claim_release_warm_run"),
            "link_exclusive_create",
            create,
            None,
        ),
        line(
            "takeover_fresh",
            get("lease/takeover"),
            "link_exclusive_create",
            create,
            None,
        ),
        line(
            "takeover_warm",
            get("lease/takeover_warm_run"),
            "link_exclusive_create",
            create,
            None,
        ),
        line(
            "append_10",
            get("append/events/10"),
            "link_exclusive_create",
            create,
            None,
        ),
        line(
            "append_10000",
            get("append/events/10000"),
            "append_10",
            get("append/events/10"),
            Some(1.2),
        ),
        line(
            "reclaim_10",
            reclaim_10,
            "link_exclusive_create",
            create,
            None,
        ),
        line(
            reclaim_key,
            get(&format!("growth/claim/{history}")),
            "reclaim_10",
            reclaim_10,
            Some(1.1),
        ),
        // Issue #33: a claim + release of one run through lease-fs alone, never pruned by
        // the bench, at ~10 cycles and after the history (tmpfs, interleaved). A history
        // whose build ran out of time (`cut_short`) is judged only when it already misses.
        Line {
            judged: !reclaim_cut_short,
            ..sized(
                "reclaim_no_prune_100k_vs_10",
                rc_get("cycle_history_us"),
                "reclaim_no_prune_10",
                rc_get("cycle_10_us"),
                Some(1.1),
                (reclaim_history, 10),
            )
        },
        line("status", get("lease/status_read"), "read_file", read, None),
        line(
            "store_commit",
            get("store/commit_one_doc"),
            "raw_insert_one_row",
            raw_insert,
            Some(1.15),
        ),
        // Issue #20: one commit through the store socket (request, group commit of one
        // batch, its durable heartbeat, answer) against the direct library commit.
        line(
            "store_commit_socket",
            get("store_socket/socket_commit"),
            "store_commit_direct",
            get("store_socket/direct_commit"),
            None,
        ),
        // Issue #20's group commit: 32 concurrent clients at least 5x the commits/s of one,
        // both medians of the same interleaved rounds.
        Line {
            key: "group_commit_32_vs_1",
            median: ss_get("socket_32_commits_per_s"),
            baseline: "socket_1_commits_per_s",
            baseline_median: ss_get("socket_1_commits_per_s"),
            target: None,
            target_min: Some(5.0),
            unit: Unit::PerS,
            n: None,
            judged: true,
        },
        line(
            "run_true_process",
            p.run_true,
            "link_exclusive_create_interleaved",
            p.run_true_create,
            Some(15.0),
        ),
        line(
            "append_process",
            p.append,
            "link_exclusive_create_interleaved",
            p.append_create,
            Some(4.0),
        ),
        // Issue #33: whole processes on a long log against a short one (interleaved pairs,
        // medians: the first process after the log was filled may pay a one-time cost).
        sized(
            "append_process_at_100k_vs_10",
            p.append_long,
            "append_process_at_10",
            p.append_short,
            Some(1.2),
            (p.log_events, 10),
        ),
        sized(
            "run_true_at_100k_vs_empty",
            p.run_true_long,
            "run_true_empty_log",
            p.run_true_empty,
            Some(1.2),
            (p.log_events, 0),
        ),
        sized(
            "status_at_100k_vs_empty",
            p.status_long,
            "status_empty_log",
            p.status_empty,
            Some(1.2),
            (p.log_events, 0),
        ),
        // Issue #33: `runlease run R -- true` with idle processes added to the machine.
        sized(
            "run_true_2000_procs_vs_100",
            p.run_true_procs_high,
            "run_true_100_procs",
            p.run_true_procs_low,
            Some(1.2),
            (p.procs.0 as u64, p.procs.1 as u64),
        ),
        // Issue #33: peak RSS at 100,000 events <= 1.1x at 10,000 (each the median of a few
        // probes; the append lines' runs held by an owner).
        rss_line(
            "peak_rss_run_true_100k_vs_10k",
            p.rss.run_true,
            "peak_rss_run_true_10k",
        ),
        rss_line(
            "peak_rss_append_100k_vs_10k",
            p.rss.append,
            "peak_rss_append_10k",
        ),
        rss_line(
            "peak_rss_status_100k_vs_10k",
            p.rss.status,
            "peak_rss_status_10k",
        ),
    ];
    println!("summary (medians of this run; ratio = median / baseline median):");
    let mut json = serde_json::Map::new();
    for l in &lines {
        let ratio = l.ratio();
        let verdict = l.verdict();
        let target = match (l.target, l.target_min) {
            (Some(t), _) => format!("<= {t}x"),
            (None, Some(t)) => format!(">= {t}x"),
            (None, None) => String::new(),
        };
        let shown = match (verdict, target.is_empty()) {
            (Some("missed"), _) => "MISSED".to_string(),
            (Some(v), _) => v.to_string(),
            (None, false) => "not judged".to_string(),
            (None, true) => String::new(),
        };
        let fmt = |x: f64| match l.unit {
            Unit::Us => fmt_us(x),
            Unit::PerS => format!("{x:.0}/s"),
            Unit::KiB => format!("{x:.0} KiB"),
        };
        let sizes =
            l.n.map(|(hi, lo)| format!("  (n {hi} vs {lo})"))
                .unwrap_or_default();
        println!(
            "  {:<29} {:>11}  baseline {:<33} {:>11}  {:>7.2}x  {:<8} {shown}{sizes}",
            l.key,
            fmt(l.median),
            l.baseline,
            fmt(l.baseline_median),
            ratio,
            target
        );
        let (median_key, baseline_key) = match l.unit {
            Unit::Us => ("median_us", "baseline_median_us"),
            Unit::PerS => ("median_per_s", "baseline_median_per_s"),
            Unit::KiB => ("median_kib", "baseline_median_kib"),
        };
        let num = |x: f64| {
            if x.is_finite() {
                round2(x).into()
            } else {
                serde_json::Value::Null
            }
        };
        let mut obj = serde_json::Map::new();
        obj.insert(median_key.into(), num(l.median));
        obj.insert("baseline".into(), l.baseline.into());
        obj.insert(baseline_key.into(), num(l.baseline_median));
        obj.insert("ratio".into(), num(ratio));
        obj.insert("target_ratio".into(), l.target.into());
        obj.insert("target_ratio_min".into(), l.target_min.into());
        obj.insert("verdict".into(), verdict.into());
        if let Some((hi, lo)) = l.n {
            obj.insert("n_high".into(), hi.into());
            obj.insert("n_low".into(), lo.into());
        }
        json.insert(l.key.to_string(), serde_json::Value::Object(obj));
    }
    let dir = target.join(BENCH_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let out = dir.join("summary.json");
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(json))
        .map_err(|e| e.to_string())?;
    std::fs::write(&out, text + "\n").map_err(|e| format!("{}: {e}", out.display()))?;
    println!("wrote {}", out.display());
    let (met, missed) = lines.iter().fold((0, 0), |(m, x), l| match l.verdict() {
        Some("met") => (m + 1, x),
        Some(_) => (m, x + 1),
        None => (m, x),
    });
    println!(
        "targets: {met} met, {missed} missed, {} lines without a verdict",
        lines.len() - met - missed
    );
    println!(
        "store socket throughput (lease-run, {} interleaved rounds, medians): direct {:.0}/s; socket 1 / 8 / 32 clients {:.0} / {:.0} / {:.0} commits/s",
        ss["rounds"],
        ss_get("direct_commits_per_s"),
        ss_get("socket_1_commits_per_s"),
        ss_get("socket_8_commits_per_s"),
        ss_get("socket_32_commits_per_s")
    );
    println!(
        "re-claim without prune (lease-fs, {} interleaved rounds on {}): history {} of {} cycles built in {:.1} s{}; lease/ holds {} files after it",
        rc["rounds"],
        rc["where"].as_str().unwrap_or("?"),
        reclaim_history,
        rc["history_requested"],
        rc["build_seconds"].as_f64().unwrap_or(f64::NAN),
        if reclaim_cut_short {
            " (cut short: its cycles grow with it)"
        } else {
            ""
        },
        rc["lease_files"]
    );
    growth(
        target,
        since,
        history,
        growth_history.as_ref(),
        plan.uncompacted,
        &get,
    );
    let missing = missing.into_inner();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} figure(s) missing (not written by this run): {}",
            missing.len(),
            missing.join(", ")
        ))
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn fmt_us(us: f64) -> String {
    if us >= 1e3 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.1} µs")
    }
}

/// Issue #17: claim and whole-cycle cost at `history` cycles (100,000; 10,000 with
/// `--quick`) vs 10, same run. `get` reads a criterion median in µs (a missing one is
/// recorded by the caller); `h` is growth's `history.json`.
fn growth(
    target: &Path,
    since: SystemTime,
    history: u64,
    h: Option<&serde_json::Value>,
    uncompacted: Option<u64>,
    get: &dyn Fn(&str) -> f64,
) {
    let claim10 = get("growth/claim/10") * 1e3;
    let claim100k = get(&format!("growth/claim/{history}")) * 1e3;
    let cycle10 = get("growth/cycle/10") * 1e3;
    let cycle100k = get(&format!("growth/cycle/{history}")) * 1e3;
    println!("bounded growth (lease-run, same run):");
    if let Some(h) = h {
        println!(
            "  history: {} cycles built through claim + release in {:.1} s on {} ({} compactions); lease/ holds {} files",
            h["history"],
            h["build_seconds"].as_f64().unwrap_or(f64::NAN),
            h["where"].as_str().unwrap_or("?"),
            h["compactions"],
            h["lease_files"]
        );
    }
    let verdict = |r: f64| if r <= 1.10 { "met" } else { "MISSED" };
    println!(
        "  claim at 10 / {history} cycles     {} / {}  = {:.3}x (target <= 1.10x: {})",
        fmt_ns(claim10),
        fmt_ns(claim100k),
        claim100k / claim10,
        verdict(claim100k / claim10)
    );
    // The uncompacted baseline: measured in the full run (10,000 cycles) and the smoke
    // pass (`RUNLEASE_BENCH_UNCOMPACTED`), not in the quick one.
    let u = uncompacted.unwrap_or(10_000);
    if let Some(raw) = median_ns(target, &format!("growth/claim_uncompacted/{u}"), since) {
        println!(
            "  claim, {u} uncompacted cycles {}  = {:.1}x the claim at 10 (baseline: no compaction)",
            fmt_ns(raw),
            raw / claim10
        );
    }
    println!(
        "  claim+release+compaction         {} / {}  = {:.3}x (target <= 1.10x: {})",
        fmt_ns(cycle10),
        fmt_ns(cycle100k),
        cycle100k / cycle10,
        verdict(cycle100k / cycle10)
    );
}
