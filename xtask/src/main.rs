//! `cargo xtask` — the runlease task runner (alias defined in `.cargo/config.toml`).
//!
//! Subcommands: `ci`, `purity`, `test [--deep]`, `bench [--quick | --smoke]`, `bench-engine [--quick]`, `model [--deep]`, `dist`,
//! `fuzz-smoke [--seconds N]`, `fuzz --long [--max-seconds N] [--target T]`, `loom`, `torture [--procs N --seconds S]`, `rss`, `containment`, `mutants [--only NAME]` (see `USAGE`).

mod bench;
mod bench_engine;
mod containment;
mod dist;
mod fuzz;
mod mutants;
mod partitions;
mod purity;
mod rss;
mod torture;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

/// sysexits `EX_USAGE`, for an unknown or missing subcommand / option.
const EX_USAGE: u8 = 64;
const USAGE: &str = "\
Usage: cargo xtask <COMMAND>

Commands:
  ci            fmt --check, clippy -D warnings, doc -D warnings, purity, `cargo test --workspace --all-features`,
                model, bench --smoke, containment, mutants, rss, loom, torture (all of .ci/run but fuzz-smoke)
  purity        prove lease-core stays sans-IO (dependency closure, clippy, source grep)
  test [--deep] `cargo test --workspace --all-features` (the etcd feature's tests included);
                --deep sets RUNLEASE_DEEP=1 (100x proptest cases)
  bench [--quick | --smoke]
                criterion benchmarks of lease-fs, lease-sqlite, lease-run's bounded growth and store socket,
                whole-process timings of `runlease run R -- true`, `status` and `append` (also on a
                100,000-event log and with 2,000 idle processes on the machine) and their peak RSS
                at 100,000 vs 10,000 events (`xtask rss-probe`, KiB), then figures and
                ratios vs baselines of the same run, each with its target and verdict (met/missed),
                written to target/bench/summary.json (--quick: short measurements, 10,000 cycles
                or events instead of 100,000; about 5 minutes, more while a re-claim without prune
                grows; --smoke: every bench once with minimal work, fails if a bench panics or a
                summary line is missing; CI runs it)
  bench-engine [--quick]
                issue #32's figures of the store committed in etcd (lease-run's engine_store
                bench, feature `etcd`, a 3-member etcd cluster on this machine): commit latency
                p50/p99 against a plain and a guarded put, commits/s with 1/8/32 store-socket
                clients, failover, catch-up at 10 MB; target/bench/engine_store.json
                (--quick: about 50 s with a warm build)
  model [--deep] exhaustive bounded BFS model check of the protocol as implemented (release build)
  dist          shell completions (bash, zsh, fish) and man pages of runlease in target/dist/
  fuzz-smoke [--seconds N]
                run each cargo-fuzz target in fuzz/ N s (default 30; nightly; installs cargo-fuzz)
  fuzz --long [--max-seconds N] [--target T]
                per target, one at a time: replay fuzz/regressions, fuzz until 10 million runs or
                one CPU-hour (or N s of wall time: partial), save crashes to fuzz/artifacts,
                merge the corpus into fuzz/corpus (seeds kept), replay it under ASan
  loom          loom models of lease-run's fence core (RUSTFLAGS=--cfg loom, release,
                LOOM_MAX_PREEMPTIONS=3 unless set; own target dir target/loom)
  torture [--procs N] [--seconds S] [--seed X]
                N `runlease run` loops on one run under random SIGKILL/SIGSTOP, then a
                checker: no acknowledged event lost, no two owners overlapping (default 4, 30)
  partitions [--trials N] [--seed S] [--seconds T] [--scenario mixed|heal] [--no-pre-vote] [--keep]
                owners of one run on 3 hosts (network namespaces, an etcd member each) under
                partitions, kills, stops, delay and clock steps; a checker judges the history
                (issue #31); as root only, else it says SKIPPED
  rss [--max-ratio R]
                peak RSS of `runlease verify`, `events --json`, `doctor --json` at 10,000 and
                100,000 events; fails when a 100k/10k ratio is above R (default 1.5)
  containment   issue #29's checks with their figures: processes of a run die with it (with and
                without a cgroup, as another user too), the stop signals, the store socket under
                hostile clients (socket-flood line), hostile store files; as root with setpriv
                every case is required (RUNLEASE_REQUIRE_CONTAINMENT=1)
  mutants [--only NAME]...
                issue #30's curated protocol mutants (xtask/src/mutants.rs), each planted once behind
                the `mutants` feature and switched on by RUNLEASE_MUTANT=NAME: one build, a baseline
                (every listed check passes unmutated), then per mutant its checks in order until one
                fails (killed); prints `mutants: N killed=K survived=S`, fails if any survived
  help          print this text
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let cmd = args.first().map(String::as_str);
    let rest = args.get(1..).unwrap_or_default();
    let result = match cmd {
        Some("help" | "--help" | "-h") => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some("ci") if rest.is_empty() => ci(),
        Some("purity") if rest.is_empty() => purity::run(&workspace_root()),
        Some("test") => match rest {
            [] => test(false),
            [flag] if flag == "--deep" => test(true),
            _ => return usage(&format!("unexpected arguments to `test`: {rest:?}")),
        },
        Some("dist") if rest.is_empty() => dist::run(&workspace_root()),
        Some(name @ ("ci" | "purity" | "dist")) => {
            return usage(&format!("`{name}` takes no arguments, got {rest:?}"));
        }
        Some("bench") => match bench::parse_args(rest) {
            Ok(mode) => bench::run(&workspace_root(), mode),
            Err(reason) => return usage(&reason),
        },
        Some("bench-engine") => match rest {
            [] => bench_engine::run(&workspace_root(), false),
            [flag] if flag == "--quick" => bench_engine::run(&workspace_root(), true),
            _ => return usage(&format!("unexpected arguments to `bench-engine`: {rest:?}")),
        },
        Some("fuzz-smoke") => match fuzz::parse_args(rest) {
            Ok(seconds) => fuzz::smoke(&workspace_root(), seconds),
            Err(reason) => return usage(&reason),
        },
        Some("fuzz") => match fuzz::long::parse_args(rest) {
            Ok(opts) => fuzz::long::run(&workspace_root(), &opts),
            Err(reason) => return usage(&reason),
        },
        Some("model") => match rest {
            [] => model(false),
            [flag] if flag == "--deep" => model(true),
            _ => return usage(&format!("unexpected arguments to `model`: {rest:?}")),
        },
        Some("torture") => match torture::parse_args(rest) {
            Ok(torture::Mode::Drive(opts)) => torture::run(&workspace_root(), &opts),
            Ok(torture::Mode::Worker(w)) => return torture::worker(&w),
            Err(reason) => return usage(&reason),
        },
        Some("partitions") => match partitions::parse_args(rest) {
            Ok(partitions::Mode::Drive(opts)) => partitions::run(&workspace_root(), &opts),
            Ok(partitions::Mode::Worker(w)) => return partitions::worker(&w),
            Err(reason) => return usage(&reason),
        },
        Some("rss") => match rss::parse_args(rest) {
            Ok(max_ratio) => rss::run(&workspace_root(), max_ratio),
            Err(reason) => return usage(&reason),
        },
        Some("rss-probe") => return rss::probe(rest),
        Some("loom") if rest.is_empty() => loom(),
        Some("containment") if rest.is_empty() => containment::run(),
        Some("mutants") => match mutants::parse_args(rest) {
            Ok(only) => mutants::run(&only),
            Err(reason) => return usage(&reason),
        },
        Some("loom") => return usage(&format!("unexpected arguments to `loom`: {rest:?}")),
        Some(other) => return usage(&format!("unknown command `{other}`")),
        None => return usage("no command given"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("xtask: FAILED: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn usage(reason: &str) -> ExitCode {
    eprintln!("xtask: error: {reason}\n");
    eprint!("{USAGE}");
    ExitCode::from(EX_USAGE)
}

/// `cargo xtask model [--deep]`: the BFS model checker of lease-fs/tests/model_check/ in
/// a release build (`RUNLEASE_MODEL=ci`, or `deep`).
fn model(deep: bool) -> Result<(), String> {
    let mut cmd = cargo(&[
        "test",
        "-p",
        "lease-fs",
        "--release",
        "--test",
        "model_check",
        "--",
        "--nocapture",
    ]);
    cmd.env("RUNLEASE_MODEL", if deep { "deep" } else { "ci" });
    run_status(cmd)?;
    // The engine-committed store's model (issue #32): lease-core's machines over an
    // etcd-like engine with lost answers and held requests.
    let mut cmd = cargo(&[
        "test",
        "-p",
        "lease-core",
        "--release",
        "--test",
        "engine_model",
        "--",
        "--nocapture",
    ]);
    cmd.env("RUNLEASE_MODEL", if deep { "deep" } else { "ci" });
    run_status(cmd)
}

/// `cargo xtask loom`: the loom models in lease-run/src/fence.rs, built with `--cfg loom`
/// (the `sync` shim swaps in loom's primitives) in release mode, in `target/loom` so the
/// normal build is not invalidated. Bounded by `LOOM_MAX_PREEMPTIONS` (default 3 here).
fn loom() -> Result<(), String> {
    let mut cmd = cargo(&[
        "test",
        "-p",
        "lease-run",
        "--release",
        "--lib",
        "fence::loom_models",
        "--",
        "--nocapture",
    ]);
    let mut flags = std::env::var("RUSTFLAGS").unwrap_or_default();
    if !flags.split_whitespace().any(|f| f == "loom") {
        flags.push_str(" --cfg loom");
    }
    cmd.env("RUSTFLAGS", flags.trim()).env(
        "CARGO_TARGET_DIR",
        workspace_root().join("target").join("loom"),
    );
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        cmd.env("LOOM_MAX_PREEMPTIONS", "3");
    }
    run_status(cmd)
}

/// The workspace root: the parent of this crate's manifest directory.
/// Build the debug `runlease` binary (quietly) and return its path: what torture and rss
/// drive (the shipped CLI, CI's build reused).
pub(crate) fn build_runlease(root: &Path) -> Result<PathBuf, String> {
    build_runlease_with(root, &[])
}

/// [`build_runlease`] with extra cargo arguments (`--features etcd`).
pub(crate) fn build_runlease_with(root: &Path, extra: &[&str]) -> Result<PathBuf, String> {
    let status = Command::new(cargo_bin())
        .args(["build", "-q", "-p", "lease-cli", "--bin", "runlease"])
        .args(extra)
        .current_dir(root)
        .status()
        .map_err(|e| format!("could not start cargo build: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build -p lease-cli exited with {status}"));
    }
    Ok(target_dir(root).join("debug").join("runlease"))
}

/// Cargo's target folder (`CARGO_TARGET_DIR`, else `target/` of the workspace).
pub(crate) fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// The cargo that invoked us (same toolchain), falling back to `cargo` on PATH.
fn cargo_bin() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// A `cargo` command with the given arguments, run from the workspace root.
fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(cargo_bin());
    cmd.args(args).current_dir(workspace_root());
    cmd
}

/// Run a command to completion with inherited stdio; error unless it exits 0.
fn run_status(mut cmd: Command) -> Result<(), String> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("could not start {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} exited with {status}"))
    }
}

/// Run one named step, printing its name, outcome and duration.
fn step(name: &str, f: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    eprintln!("==> {name}");
    let start = Instant::now();
    let result = f();
    let secs = start.elapsed().as_secs_f64();
    match &result {
        Ok(()) => eprintln!("<== {name}: ok ({secs:.2}s)"),
        Err(_) => eprintln!("<== {name}: FAILED ({secs:.2}s)"),
    }
    result.map_err(|e| format!("step `{name}`: {e}"))
}

/// `Ok` when nothing is in `failed`, else the error `"{what}: a, b, ..."` naming each.
pub(crate) fn none_failed<S: std::borrow::Borrow<str>>(
    what: &str,
    failed: &[S],
) -> Result<(), String> {
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{what}: {}", failed.join(", ")))
    }
}

/// `cargo xtask ci`: the same gate as `.ci/run`, stopping at the first failure.
fn ci() -> Result<(), String> {
    let start = Instant::now();
    step("fmt", || run_status(cargo(&["fmt", "--all", "--check"])))?;
    step("clippy", || {
        run_status(cargo(&[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]))
    })?;
    step("doc", || {
        let mut cmd = cargo(&["doc", "--workspace", "--no-deps", "--all-features"]);
        cmd.env("RUSTDOCFLAGS", "-D warnings");
        run_status(cmd)
    })?;
    step("purity", || purity::run(&workspace_root()))?;
    step("test", || test(false))?;
    step("model", || model(false))?;
    // Issue #33: every benchmark once, as `.ci/run` does after the model step.
    step("bench --smoke", || {
        bench::run(&workspace_root(), bench::Mode::Smoke)
    })?;
    step("containment", containment::run)?;
    step("mutants", || mutants::run(&[]))?;
    step("rss", || rss::run(&workspace_root(), 1.5))?;
    step("loom", loom)?;
    step("torture", || {
        let short = ["--procs", "3", "--seconds", "20"].map(String::from);
        match torture::parse_args(&short)? {
            torture::Mode::Drive(opts) => torture::run(&workspace_root(), &opts),
            torture::Mode::Worker(_) => Err("torture: unexpected worker mode".into()),
        }
    })?;
    eprintln!(
        "ci: all steps passed ({:.2}s)",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `cargo xtask test [--deep]`: `cargo test --workspace --all-features` (so the `etcd`
/// feature's tests of lease-run and lease-cli run too), optionally with
/// `RUNLEASE_DEEP=1` (lease-core's proptests then run 100x their case counts).
fn test(deep: bool) -> Result<(), String> {
    let mut cmd = cargo(&["test", "--workspace", "--all-features"]);
    if deep {
        cmd.env("RUNLEASE_DEEP", "1");
    }
    run_status(cmd)
}
