//! The cost of re-claiming a run through lease-fs alone, with no prune (issue #33): claim
//! and release the same run folder over and over, and time the last cycles.
//!
//! Run: `cargo run --release -p lease-fs --example reclaim -- DIR PREPARE MEASURE [--no-compact]`
//!
//! - `DIR`: the run folder (created if missing; kept, so a later invocation goes on from
//!   where this one stopped).
//! - `PREPARE`: claim+release cycles made first, untimed.
//! - `MEASURE`: cycles then timed one by one (median and mean printed). `0` measures
//!   nothing: with `strace -c -f`, the difference between `... DIR 0 1` and `... DIR 0 0`
//!   is the system calls of one cycle.
//! - `--no-compact`: release without the release's own compaction (PROTOCOL §7.3 step 7),
//!   as every release did before issue #33.
//!
//! Prints figures, asserts none: timings on a shared machine are not a test.

use lease_core::ops::{ClaimParams, CompactPolicy, ReleaseParams};
use lease_core::{Identity, LeaseOps, Timestamp, TimingPolicy};
use lease_fs::{RunDir, WallClock, this_holder};
use std::path::Path;
use std::time::{Duration, Instant};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (dir, prepare, measure) = match args.as_slice() {
        [dir, prepare, measure, ..] => (Path::new(dir), prepare.parse()?, measure.parse()?),
        _ => {
            eprintln!("usage: reclaim DIR PREPARE MEASURE [--no-compact]");
            std::process::exit(64);
        }
    };
    let compact = if args.iter().any(|a| a == "--no-compact") {
        None
    } else {
        Some(CompactPolicy::DEFAULT)
    };
    let run = if dir.exists() {
        RunDir::open(dir)?
    } else {
        RunDir::create(dir)?
    };
    let owner = Identity::new("reclaimer")?;
    let holder = this_holder()?;
    let cycle = || -> Result<(), Box<dyn std::error::Error>> {
        let lease = run.claim(ClaimParams {
            run_id: run.run_id().clone(),
            owner_id: owner.clone(),
            holder: holder.clone(),
            policy: TimingPolicy::default(),
            now: Timestamp::now()?,
            store_floor: None,
        })?;
        run.release_compacting(
            ReleaseParams {
                lease,
                now: Timestamp::now()?,
                seal: None,
            },
            compact,
        )?;
        Ok(())
    };
    for _ in 0..prepare {
        cycle()?;
    }
    let mut times: Vec<Duration> = Vec::with_capacity(measure);
    for _ in 0..measure {
        let t = Instant::now();
        cycle()?;
        times.push(t.elapsed());
    }
    let epochs = std::fs::read_dir(dir.join("lease/epochs"))
        .map(|d| d.count())
        .unwrap_or(0);
    let head = run
        .status(Timestamp::now()?, false)?
        .head
        .map_or(0, |h| h.generation().get());
    if times.is_empty() {
        println!("head {head}, {epochs} entries in lease/epochs");
        return Ok(());
    }
    let total: Duration = times.iter().sum();
    let mean = total / times.len() as u32;
    times.sort();
    let median = times[times.len() / 2];
    println!(
        "head {head} ({} cycles), {epochs} entries in lease/epochs, compaction {}: claim+release median {:.3} ms, mean {:.3} ms over {} cycles",
        head / 2,
        if compact.is_some() { "on" } else { "off" },
        median.as_secs_f64() * 1e3,
        mean.as_secs_f64() * 1e3,
        times.len()
    );
    Ok(())
}
