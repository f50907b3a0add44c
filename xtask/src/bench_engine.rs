//! `cargo xtask bench-engine [--quick]`: issue #32's figures for the store committed in
//! etcd, measured by `lease-run/benches/engine_store/` on a real 3-member etcd cluster it
//! starts (Debian's `etcd` on PATH; `protoc` for the `etcd` feature's build). The bench
//! prints one line per figure (the figure, its baseline measured in the same run, the
//! ratio, the target and met/MISSED) and writes them to `target/bench/engine_store.json`,
//! one object per figure as `cargo xtask bench` writes its summary. Apart from `cargo xtask
//! bench` because it needs the `etcd` feature and an etcd binary, and takes minutes.
//! `--quick`: fewer samples, rounds, failovers and catch-ups (about 50 s with a warm
//! build; the full run measures for about 80 s). A missed target or a figure that could not
//! be measured is reported, not a failure of the command (as `cargo xtask bench`).

use std::path::Path;

/// Where the bench writes its figures.
const OUT: &str = "target/bench/engine_store.json";

/// Run the bench and check it wrote its figures.
pub fn run(root: &Path, quick: bool) -> Result<(), String> {
    let out = root.join(OUT);
    // A stale file from an earlier run must not pass for this one's.
    let _ = std::fs::remove_file(&out);
    let mut cmd = crate::cargo(&[
        "bench",
        "-p",
        "lease-run",
        "--features",
        "etcd",
        "--bench",
        "engine_store",
    ]);
    cmd.env("RUNLEASE_BENCH_ENGINE_STORE", &out);
    if quick {
        cmd.env("RUNLEASE_BENCH_QUICK", "1");
    }
    crate::run_status(cmd)?;
    let text = std::fs::read_to_string(&out).map_err(|e| {
        format!(
            "{}: {e} (was etcd found? the bench skips without it)",
            out.display()
        )
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", out.display()))?;
    let failed: Vec<&String> = v
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(_, f)| f.get("failed").is_some())
                .map(|(k, _)| k)
                .collect()
        })
        .unwrap_or_default();
    if !failed.is_empty() {
        println!("bench-engine: figures that could not be measured (FAILED): {failed:?}");
    }
    let missed: Vec<&String> = v
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(_, f)| {
                    let r = f["ratio"].as_f64().unwrap_or(f64::NAN);
                    f["target_ratio"].as_f64().is_some_and(|t| r > t)
                        || f["target_ratio_min"].as_f64().is_some_and(|t| r < t)
                })
                .map(|(k, _)| k)
                .collect()
        })
        .unwrap_or_default();
    // A missed target is a figure to report, not a failed command (as `cargo xtask bench`).
    if missed.is_empty() {
        println!("bench-engine: every target met");
    } else {
        println!("bench-engine: targets MISSED: {missed:?}");
    }
    Ok(())
}
