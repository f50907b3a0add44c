//! `cargo xtask bench [--quick]`: run the criterion benchmarks of lease-fs, lease-sqlite,
//! lease-run's bounded growth and lease-run's store socket, time whole `runlease`
//! processes, then print each figure beside the raw baselines measured in the same run,
//! with the ratios the issues target, and write them to `target/bench/summary.json` (issue
//! #19): one object per operation, keyed by name, with `median_us`, `baseline` (the
//! baseline's name), `baseline_median_us`, `ratio` (median / baseline median),
//! `target_ratio` (an upper bound on the ratio, or null) and `target_ratio_min` (a lower
//! bound, or null). A throughput line (`group_commit_32_vs_1`, issue #20) has
//! `median_per_s` and `baseline_median_per_s` (commits per second) instead of the two
//! `_us` keys; its target is a lower bound (`target_ratio_min`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Run everything and report. `quick`: short criterion measurements and a 10,000-cycle
/// history (the full run keeps criterion's defaults and 100,000 cycles).
pub fn run(root: &Path, quick: bool) -> Result<(), String> {
    let history = if quick { "10000" } else { "100000" };
    let crit: &[&str] = if quick {
        &[
            "--",
            "--warm-up-time",
            "0.5",
            "--measurement-time",
            "2",
            "--sample-size",
            "10",
        ]
    } else {
        &[]
    };
    for (pkg, bench) in [
        ("lease-fs", "lease"),
        ("lease-sqlite", "store"),
        ("lease-run", "growth"),
        ("lease-run", "store_socket"),
    ] {
        let mut args = vec!["bench", "-p", pkg, "--bench", bench];
        args.extend_from_slice(crit);
        let mut cmd = crate::cargo(&args);
        cmd.env("RUNLEASE_BENCH_HISTORY", history);
        if bench == "lease" {
            cmd.env("RUNLEASE_BENCH_INTERLEAVED", root.join(INTERLEAVED))
                .env("RUNLEASE_BENCH_ROUNDS", if quick { "40" } else { "150" });
        }
        if bench == "store_socket" {
            cmd.env("RUNLEASE_BENCH_STORE_SOCKET", root.join(STORE_SOCKET))
                .env("RUNLEASE_BENCH_ROUNDS", if quick { "3" } else { "7" });
        }
        if quick {
            cmd.env("RUNLEASE_BENCH_QUICK", "1");
        }
        crate::run_status(cmd)?;
    }
    crate::run_status(crate::cargo(&["build", "--release", "-p", "lease-cli"]))?;
    let processes = processes(root, if quick { 15 } else { 40 })?;
    report(root, &processes)
}

/// Where the lease bench writes its interleaved figures (see `interleaved` in
/// `lease-fs/benches/lease.rs`).
const INTERLEAVED: &str = "target/bench/interleaved.json";

/// Where the store socket bench writes its throughput figures (commits/s with 1, 8 and 32
/// clients and direct, medians of interleaved rounds: see `lease-run/benches/store_socket.rs`).
const STORE_SOCKET: &str = "target/bench/store_socket.json";

/// Medians (µs) of whole-process timings, measured here (not by criterion), each beside the
/// median of a link-exclusive create timed right before each run of the process (the same
/// primitive as criterion's `raw/link_exclusive_create`, on the same disk), so each ratio
/// compares figures taken at the same moments.
struct Processes {
    run_true: f64,
    run_true_create: f64,
    append: f64,
    append_create: f64,
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

fn median_us(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e6
}

/// `runlease run R -- true` on one run, `n` times (after one unmeasured first run that
/// creates it), and `runlease append R` `n` times inside a run held by `runlease run R --
/// sleep`: each a fresh process of the release build.
fn processes(root: &Path, n: usize) -> Result<Processes, String> {
    let bin = root.join("target/release/runlease");
    let tmp = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let run = tmp.path().join("bench-run");
    let runlease = |args: &[&str]| {
        let mut c = Command::new(&bin);
        c.args(args)
            .arg(&run)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    let ok = |mut c: Command| -> Result<Duration, String> {
        let t = Instant::now();
        let st = c.status().map_err(|e| format!("{c:?}: {e}"))?;
        let took = t.elapsed();
        if st.success() {
            Ok(took)
        } else {
            Err(format!("{c:?} exited with {st}"))
        }
    };
    let run_true_cmd = || {
        let mut c = Command::new(&bin);
        c.args(["run", "-q"])
            .arg(&run)
            .args(["--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    };
    let fs = lease_fs::RealFs::create(&tmp.path().join("baseline"))
        .map_err(|e| format!("baseline folder: {e}"))?;
    lease_fs::fs::Fs::ensure_dir(&fs, "d").map_err(|e| format!("baseline folder: {e}"))?;
    let mut made = 0;
    ok(run_true_cmd())?;
    let (mut times, mut creates) = (Vec::with_capacity(n), Vec::with_capacity(2 * n));
    for _ in 0..n {
        made += 1;
        creates.push(timed_create(&fs, made)?);
        times.push(ok(run_true_cmd())?);
    }
    let run_true = median_us(times);
    let run_true_create = median_us(std::mem::take(&mut creates));

    // An owner that sleeps; its generation and owner id come from `status --json`.
    let mut owner = Command::new(&bin)
        .args(["run", "-q"])
        .arg(&run)
        .args(["--", "sleep", "600"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start the owner: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let (generation, owner_id) = loop {
        let out = runlease(&["status", "--json"])
            .stdout(Stdio::piped())
            .output()
            .map_err(|e| format!("status: {e}"))?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if v["state"] == "active" && v["pid"].as_u64() == Some(u64::from(owner.id())) {
            break (
                v["generation"].as_u64().unwrap_or(0).to_string(),
                v["owner_id"].as_str().unwrap_or("").to_string(),
            );
        }
        if Instant::now() > deadline {
            let _ = owner.kill();
            return Err(format!("the owner never became active: {v}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut times = Vec::with_capacity(n);
    let mut result = Ok(());
    for i in 0..n {
        let payload = format!("{{\"n\":{i}}}");
        let c = runlease(&[
            "append",
            "-q",
            "--type",
            "bench",
            "--payload",
            &payload,
            "--generation",
            &generation,
            "--owner",
            &owner_id,
        ]);
        match timed_create(&fs, made + 1 + i).and_then(|b| {
            creates.push(b);
            ok(c)
        }) {
            Ok(t) => times.push(t),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    // SIGTERM goes on to `sleep`, which exits; the owner releases the run.
    let _ = Command::new("kill")
        .args(["-TERM", &owner.id().to_string()])
        .status();
    let _ = owner.wait();
    result?;
    Ok(Processes {
        run_true,
        run_true_create,
        append: median_us(times),
        append_create: median_us(creates),
    })
}

/// Median of one criterion benchmark in nanoseconds, from
/// `target/criterion/.../new/estimates.json`.
fn median_ns(root: &Path, id: &str) -> Option<f64> {
    let path = root
        .join("target/criterion")
        .join(id)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"].as_f64()
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.1} µs", ns / 1e3)
    }
}

/// One line of the summary: an operation, its baseline and the target ratio.
/// `median` and `baseline_median` are in the line's `unit` (µs, or commits/s for a
/// throughput line); the ratio is always median / baseline median.
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
}

#[derive(Clone, Copy)]
enum Unit {
    /// A time per operation in µs.
    Us,
    /// A throughput in operations per second.
    PerS,
}

/// Print the report and write `target/bench/summary.json`; `Err` if a figure is missing.
fn report(root: &Path, p: &Processes) -> Result<(), String> {
    let get = |id: &str| {
        median_ns(root, id)
            .map(|ns| ns / 1e3)
            .ok_or_else(|| format!("no criterion result for {id}"))
    };
    let history: u64 = std::fs::read_to_string(root.join("target/criterion/growth/history.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["history"].as_u64())
        .ok_or("no growth/history.json")?;
    let pwrite = get("raw/pwrite")?;
    let pwrite_sync = get("raw/pwrite_fdatasync")?;
    let create = get("raw/link_exclusive_create")?;
    let read = get("raw/read_file")?;
    let raw_insert = get("store/raw_insert_one_row")?;
    let reclaim_10 = get("growth/claim/10")?;
    let il: serde_json::Value = std::fs::read_to_string(root.join(INTERLEAVED))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| format!("no {INTERLEAVED}"))?;
    let il_get = |k: &str| {
        il[k]
            .as_f64()
            .ok_or_else(|| format!("{INTERLEAVED}: no {k}"))
    };
    let il_create = il_get("link_exclusive_create_us")?;
    let ss: serde_json::Value = std::fs::read_to_string(root.join(STORE_SOCKET))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .ok_or_else(|| format!("no {STORE_SOCKET}"))?;
    let ss_get = |k: &str| {
        ss[k]
            .as_f64()
            .ok_or_else(|| format!("{STORE_SOCKET}: no {k}"))
    };
    let line = |key, median_us, baseline, baseline_median_us, target| Line {
        key,
        median: median_us,
        baseline,
        baseline_median: baseline_median_us,
        target,
        target_min: None,
        unit: Unit::Us,
    };
    let reclaim_key: &'static str = match history {
        10_000 => "reclaim_10000",
        100_000 => "reclaim_100000",
        _ => "reclaim_history",
    };
    let lines = vec![
        line(
            "heartbeat_local",
            get("lease/heartbeat_local")?,
            "pwrite",
            pwrite,
            Some(4.0),
        ),
        line(
            "heartbeat_durable",
            get("lease/heartbeat_durable")?,
            "pwrite_fdatasync",
            pwrite_sync,
            Some(1.3),
        ),
        // The targets are judged on the interleaved figures (one warm run, the baseline
        // create timed in the same rounds); criterion's fresh-folder and warm-run figures
        // follow, each against criterion's own create baseline.
        line(
            "claim_release",
            il_get("claim_release_warm_us")?,
            "link_exclusive_create_interleaved",
            il_create,
            Some(2.5),
        ),
        // A takeover of an owner that had claimed (the usual case: 2 creates, 4 fsyncs),
        // and one of an owner that had itself taken over (GATE's sync of the cutoff that
        // takeover made: 5 fsyncs, PROTOCOL §7.13).
        line(
            "takeover",
            il_get("takeover_us")?,
            "link_exclusive_create_interleaved",
            il_create,
            Some(2.5),
        ),
        line(
            "takeover_chain",
            il_get("takeover_chain_us")?,
            "link_exclusive_create_interleaved",
            il_create,
            Some(2.5),
        ),
        line(
            "claim_release_fresh",
            get("lease/claim_release_fresh_run")?,
            "link_exclusive_create",
            create,
            None,
        ),
        line(
            "claim_release_warm",
            get("lease/claim_release_warm_run")?,
            "link_exclusive_create",
            create,
            None,
        ),
        line(
            "takeover_fresh",
            get("lease/takeover")?,
            "link_exclusive_create",
            create,
            None,
        ),
        line(
            "takeover_warm",
            get("lease/takeover_warm_run")?,
            "link_exclusive_create",
            create,
            None,
        ),
        line(
            "append_10",
            get("append/events/10")?,
            "link_exclusive_create",
            create,
            None,
        ),
        line(
            "append_10000",
            get("append/events/10000")?,
            "append_10",
            get("append/events/10")?,
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
            get(&format!("growth/claim/{history}"))?,
            "reclaim_10",
            reclaim_10,
            Some(1.1),
        ),
        line("status", get("lease/status_read")?, "read_file", read, None),
        line(
            "store_commit",
            get("store/commit_one_doc")?,
            "raw_insert_one_row",
            raw_insert,
            Some(1.15),
        ),
        // Issue #20: one commit through the store socket (request, group commit of one
        // batch, its durable heartbeat, answer) against the direct library commit.
        line(
            "store_commit_socket",
            get("store_socket/socket_commit")?,
            "store_commit_direct",
            get("store_socket/direct_commit")?,
            None,
        ),
        // Issue #20's group commit: 32 concurrent clients at least 5x the commits/s of one,
        // both medians of the same interleaved rounds.
        Line {
            key: "group_commit_32_vs_1",
            median: ss_get("socket_32_commits_per_s")?,
            baseline: "socket_1_commits_per_s",
            baseline_median: ss_get("socket_1_commits_per_s")?,
            target: None,
            target_min: Some(5.0),
            unit: Unit::PerS,
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
    ];
    println!("summary (medians of this run; ratio = median / baseline median):");
    let mut json = serde_json::Map::new();
    for l in &lines {
        let ratio = l.median / l.baseline_median;
        let verdict = match (l.target, l.target_min) {
            (Some(t), _) if ratio <= t => format!("target <= {t}x: met"),
            (Some(t), _) => format!("target <= {t}x: MISSED"),
            (None, Some(t)) if ratio >= t => format!("target >= {t}x: met"),
            (None, Some(t)) => format!("target >= {t}x: MISSED"),
            (None, None) => String::new(),
        };
        let fmt = |x: f64| match l.unit {
            Unit::Us => fmt_us(x),
            Unit::PerS => format!("{x:.0}/s"),
        };
        println!(
            "  {:<20} {:>11}  baseline {:<22} {:>11}  {:>7.2}x  {verdict}",
            l.key,
            fmt(l.median),
            l.baseline,
            fmt(l.baseline_median),
            ratio
        );
        let (median_key, baseline_key) = match l.unit {
            Unit::Us => ("median_us", "baseline_median_us"),
            Unit::PerS => ("median_per_s", "baseline_median_per_s"),
        };
        let mut obj = serde_json::Map::new();
        obj.insert(median_key.into(), round2(l.median).into());
        obj.insert("baseline".into(), l.baseline.into());
        obj.insert(baseline_key.into(), round2(l.baseline_median).into());
        obj.insert("ratio".into(), round2(ratio).into());
        obj.insert("target_ratio".into(), l.target.into());
        obj.insert("target_ratio_min".into(), l.target_min.into());
        json.insert(l.key.to_string(), serde_json::Value::Object(obj));
    }
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let out = dir.join("summary.json");
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(json))
        .map_err(|e| e.to_string())?;
    std::fs::write(&out, text + "\n").map_err(|e| format!("{}: {e}", out.display()))?;
    println!("wrote {}", out.display());
    println!(
        "store socket throughput (lease-run, {} interleaved rounds, medians): direct {:.0}/s; socket 1 / 8 / 32 clients {:.0} / {:.0} / {:.0} commits/s",
        ss["rounds"],
        ss_get("direct_commits_per_s")?,
        ss_get("socket_1_commits_per_s")?,
        ss_get("socket_8_commits_per_s")?,
        ss_get("socket_32_commits_per_s")?
    );
    growth(root, history)
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
/// `--quick`) vs 10, same run.
fn growth(root: &Path, history: u64) -> Result<(), String> {
    let get = |id: &str| median_ns(root, id).ok_or_else(|| format!("no criterion result for {id}"));
    let claim10 = get("growth/claim/10")?;
    let claim100k = get(&format!("growth/claim/{history}"))?;
    let cycle10 = get("growth/cycle/10")?;
    let cycle100k = get(&format!("growth/cycle/{history}"))?;
    println!("bounded growth (lease-run, same run):");
    if let Some(h) = std::fs::read_to_string(root.join("target/criterion/growth/history.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
    {
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
    if let Some(raw) = median_ns(root, "growth/claim_uncompacted/10000") {
        println!(
            "  claim, 10,000 uncompacted cycles {}  = {:.1}x the claim at 10 (baseline: no compaction)",
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
    Ok(())
}
