//! `cargo xtask bench`: run the criterion benchmarks of lease-fs, lease-sqlite and
//! lease-run's bounded growth, then print each figure beside the raw baselines measured in
//! the same run, with the ratios the issues target.

use std::path::Path;

/// Mean of one criterion benchmark in nanoseconds, from `target/criterion/.../new/estimates.json`.
fn mean_ns(root: &Path, id: &str) -> Option<f64> {
    let path = root
        .join("target/criterion")
        .join(id)
        .join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["mean"]["point_estimate"].as_f64()
}

fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.1} µs", ns / 1e3)
    }
}

/// Print the report; `Err` if a figure is missing.
pub fn report(root: &Path) -> Result<(), String> {
    let get = |id: &str| mean_ns(root, id).ok_or_else(|| format!("no criterion result for {id}"));
    let plain = get("raw/plain_write")?;
    let replace = get("raw/atomic_replace_fsync")?;
    let create = get("raw/link_exclusive_create")?;
    let two_creates = get("raw/two_link_exclusive_creates")?;
    println!("baselines (same run):");
    println!("  plain write (no fsync)           {}", fmt_ns(plain));
    println!("  atomic replace with fsyncs       {}", fmt_ns(replace));
    println!("  link-exclusive create            {}", fmt_ns(create));
    println!("  two link-exclusive creates       {}", fmt_ns(two_creates));
    println!("operations:");
    let claim = get("lease/claim_release_fresh_run")?;
    println!(
        "  claim+release fresh run          {}  = {:.2}x two link-exclusive creates (target <= 1.5x)",
        fmt_ns(claim),
        claim / two_creates
    );
    let hb_local = get("lease/heartbeat_local")?;
    println!(
        "  heartbeat (local)                {}  = {:.2}x plain write (target < 50 µs)",
        fmt_ns(hb_local),
        hb_local / plain
    );
    let hb_durable = get("lease/heartbeat_durable")?;
    println!(
        "  heartbeat (durable)              {}  = {:.2}x atomic replace with fsyncs",
        fmt_ns(hb_durable),
        hb_durable / replace
    );
    let status = get("lease/status_read")?;
    println!(
        "  status read                      {}  = {:.2}x plain write (target < 30 µs)",
        fmt_ns(status),
        status / plain
    );
    let takeover = get("lease/takeover")?;
    println!(
        "  takeover                         {}  = {:.2}x link-exclusive create (target < 2 ms)",
        fmt_ns(takeover),
        takeover / create
    );
    let a10 = get("append/events/10")?;
    let a1k = get("append/events/1000")?;
    let a10k = get("append/events/10000")?;
    println!(
        "  append at 10 / 1,000 / 10,000    {} / {} / {}  = {:.2}x at 10,000 vs 10 (target <= 1.2x); {:.2}x link-exclusive create",
        fmt_ns(a10),
        fmt_ns(a1k),
        fmt_ns(a10k),
        a10k / a10,
        a10 / create
    );
    if let (Some(raw), Some(one), Some(batch)) = (
        mean_ns(root, "store/raw_insert_one_row"),
        mean_ns(root, "store/commit_one_doc"),
        mean_ns(root, "store/commit_batch_100"),
    ) {
        println!("lease-sqlite (same run):");
        println!("  raw rusqlite one-row insert      {}", fmt_ns(raw));
        println!(
            "  one-document commit              {}  = {:.2}x raw insert (target <= 1.15x)",
            fmt_ns(one),
            one / raw
        );
        println!(
            "  100-document batch commit        {}  = {:.0} commits/s, {:.0} documents/s",
            fmt_ns(batch),
            1e9 / batch,
            1e11 / batch
        );
    }
    growth(root)
}

/// Issue #17: claim and whole-cycle cost at 100,000 cycles of history vs 10, same run.
fn growth(root: &Path) -> Result<(), String> {
    let get = |id: &str| mean_ns(root, id).ok_or_else(|| format!("no criterion result for {id}"));
    let claim10 = get("growth/claim/10")?;
    let claim100k = get("growth/claim/100000")?;
    let cycle10 = get("growth/cycle/10")?;
    let cycle100k = get("growth/cycle/100000")?;
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
        "  claim at 10 / 100,000 cycles     {} / {}  = {:.3}x (target <= 1.10x: {})",
        fmt_ns(claim10),
        fmt_ns(claim100k),
        claim100k / claim10,
        verdict(claim100k / claim10)
    );
    if let Some(raw) = mean_ns(root, "growth/claim_uncompacted/10000") {
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
