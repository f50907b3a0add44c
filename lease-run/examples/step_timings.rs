//! lease-run: where the time of one run cycle goes. Opens a run, runs `true` through the
//! spawn gate, waits and releases, N times, and prints the median of each named step
//! ([`lease_run::StepName`], reported through `OpenOptions::on_step`) and of the four
//! phases (open, spawn, wait, release). The figures behind docs/BENCHMARKS.md's breakdown of
//! `runlease run R -- true` (issue #19).
//!
//! Run: `cargo run --release -p lease-run --example step_timings -- [FOLDER] [N]`
//! (default: a fresh temporary folder, 30 cycles).

use lease_run::{FinalStatus, OpenOptions, Run};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Samples = Arc<Mutex<BTreeMap<String, Vec<Duration>>>>;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let tmp = tempfile::tempdir()?;
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| tmp.path().join("timed"));
    let n: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(30);
    let samples: Samples = Arc::default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        for _ in 0..n {
            let s = samples.clone();
            let opts = OpenOptions {
                on_step: Some(Arc::new(move |step, took| {
                    let mut m = s.lock().unwrap();
                    m.entry(format!("step {}", step.as_str()))
                        .or_default()
                        .push(took);
                })),
                ..OpenOptions::default()
            };
            let t0 = Instant::now();
            let run = Run::open(&path, opts).await?;
            let t1 = Instant::now();
            let mut cmd = run.command("true").spawn().await?;
            let t2 = Instant::now();
            cmd.wait().await?;
            let t3 = Instant::now();
            run.release(FinalStatus::Done).await?;
            let t4 = Instant::now();
            let mut m = samples.lock().unwrap();
            for (k, d) in [
                ("phase 1 open", t1 - t0),
                ("phase 2 spawn", t2 - t1),
                ("phase 3 wait", t3 - t2),
                ("phase 4 release", t4 - t3),
                ("phase total", t4 - t0),
            ] {
                m.entry(k.into()).or_default().push(d);
            }
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    })?;
    println!(
        "{n} cycles of open, spawn `true`, wait, release on {}:",
        path.display()
    );
    for (name, mut v) in samples.lock().unwrap().clone() {
        v.sort();
        println!(
            "  {name:<22} median {:>8.0} µs",
            v[v.len() / 2].as_secs_f64() * 1e6
        );
    }
    Ok(())
}
