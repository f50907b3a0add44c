//! Measure a target's own cost, without libFuzzer: run every input of the given folders
//! (or files) through the target's check, `--rounds N` times, and print runs per CPU second
//! (on-CPU time of this thread from `/proc/thread-self/schedstat`, so other processes on a
//! shared machine do not skew it; wall time where that file does not exist; use enough
//! rounds for a second or more, the CPU clock advances at scheduler ticks), and the median
//! and slowest input (wall time).
//!
//! ```sh
//! cargo run --release --manifest-path fuzz/Cargo.toml --example bench -- \
//!     <target> [--rounds N] <dir-or-file>...
//! ```
//!
//! The numbers in `docs/BENCHMARKS.md` ("fuzz targets") come from this over a fixed set of
//! inputs, so a change to a check can be compared with the same inputs before and after.
//! An input that fails the check is reported and counted, not timed.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn files(arg: &Path, out: &mut Vec<PathBuf>) {
    if arg.is_dir() {
        let mut v: Vec<PathBuf> = std::fs::read_dir(arg)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", arg.display()))
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file())
            .filter(|p| {
                let n = p.file_name().map(|n| n.to_string_lossy().into_owned());
                n.is_some_and(|n| !n.starts_with('.') && !n.ends_with(".md"))
            })
            .collect();
        v.sort();
        out.extend(v);
    } else {
        out.push(arg.to_path_buf());
    }
}

/// Time this thread has spent on a CPU (Linux), else `None`.
fn cpu_time() -> Option<Duration> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = s.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// A clock: on-CPU time if available, else wall time since `start`.
fn now(start: Instant) -> Duration {
    cpu_time().unwrap_or_else(|| start.elapsed())
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut rounds = 1u32;
    if let Some(i) = args.iter().position(|a| a == "--rounds") {
        rounds = args
            .get(i + 1)
            .and_then(|n| n.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| {
                eprintln!("--rounds needs a positive integer");
                std::process::exit(64);
            });
        args.drain(i..i + 2);
    }
    let Some((target, paths)) = args.split_first() else {
        eprintln!("usage: bench <target> [--rounds N] <dir-or-file>...");
        std::process::exit(64);
    };
    let Some((_, check)) = runlease_fuzz::TARGETS.iter().find(|(n, _)| n == target) else {
        eprintln!("unknown target {target}");
        std::process::exit(64);
    };
    let mut list = Vec::new();
    for p in paths {
        files(Path::new(p), &mut list);
    }
    let inputs: Vec<(PathBuf, Vec<u8>)> = list
        .into_iter()
        .map(|p| {
            let b =
                std::fs::read(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
            (p, b)
        })
        .collect();
    if inputs.is_empty() {
        eprintln!("no inputs");
        std::process::exit(66);
    }
    // Quiet panics: a failing input is counted, its message would flood the output.
    std::panic::set_hook(Box::new(|_| {}));
    let mut times: Vec<(Duration, usize)> = Vec::new();
    let mut failed = 0usize;
    let clock = if cpu_time().is_some() { "CPU" } else { "wall" };
    let wall = Instant::now();
    let start = now(wall);
    for _ in 0..rounds {
        for (i, (_, bytes)) in inputs.iter().enumerate() {
            // Per input: wall time (the CPU clock only advances at scheduler ticks).
            let t = Instant::now();
            if catch_unwind(AssertUnwindSafe(|| check(bytes))).is_err() {
                failed += 1;
                continue;
            }
            times.push((t.elapsed(), i));
        }
    }
    let total = now(wall).saturating_sub(start);
    times.sort();
    let runs = times.len() + failed;
    let median = times.get(times.len() / 2).map_or(Duration::ZERO, |t| t.0);
    let (slow, slow_i) = times.last().map_or((Duration::ZERO, 0), |t| (t.0, t.1));
    println!(
        "bench {target}: {runs} runs ({} inputs x {rounds}) in {:.2} {clock} s = {:.0} runs/s; median {:.2} ms, slowest {:.2} ms ({}, {} bytes); {failed} failed",
        inputs.len(),
        total.as_secs_f64(),
        runs as f64 / total.as_secs_f64(),
        median.as_secs_f64() * 1e3,
        slow.as_secs_f64() * 1e3,
        inputs[slow_i].0.display(),
        inputs[slow_i].1.len(),
    );
}
