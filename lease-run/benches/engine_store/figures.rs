//! The figures: each printed as it is measured, then reported to stdout and the JSON file.

use crate::Cfg;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Unit {
    Us,
    PerS,
}

/// One figure: `median` against `baseline_median` (same unit), with the target if any.
pub(crate) struct Figure {
    pub(crate) key: &'static str,
    pub(crate) what: String,
    pub(crate) median: f64,
    pub(crate) baseline: &'static str,
    pub(crate) baseline_median: f64,
    pub(crate) unit: Unit,
    /// Upper bound on the ratio (times).
    pub(crate) target: Option<f64>,
    /// Lower bound on the ratio (throughputs).
    pub(crate) target_min: Option<f64>,
}

impl Figure {
    fn ratio(&self) -> f64 {
        self.median / self.baseline_median
    }
    fn verdict(&self) -> String {
        let r = self.ratio();
        match (self.target, self.target_min) {
            (Some(t), _) if r <= t => format!("target <= {t}x: met"),
            (Some(t), _) => format!("target <= {t}x: MISSED"),
            (None, Some(t)) if r >= t => format!("target >= {t}x: met"),
            (None, Some(t)) => format!("target >= {t}x: MISSED"),
            (None, None) => "no target".into(),
        }
    }
}

fn fmt(x: f64, unit: Unit) -> String {
    match unit {
        Unit::PerS => format!("{x:.0}/s"),
        Unit::Us if x >= 1e6 => format!("{:.2} s", x / 1e6),
        Unit::Us if x >= 1e3 => format!("{:.2} ms", x / 1e3),
        Unit::Us => format!("{x:.1} µs"),
    }
}

/// Push a figure; also print it at once (stderr) so a later failure keeps what was seen.
pub(crate) fn push(figures: &mut Vec<Figure>, f: Figure) {
    eprintln!(
        "engine_store: {} {} vs {} {} = {:.2}x ({})",
        f.key,
        fmt(f.median, f.unit),
        f.baseline,
        fmt(f.baseline_median, f.unit),
        f.ratio(),
        f.verdict()
    );
    figures.push(f);
}

pub(crate) fn report(figures: &[Figure], failures: &[(&str, String)], cfg: &Cfg, took: Duration) {
    println!(
        "engine store over etcd (issue #32; 3 etcd members on this machine; ratio = figure / baseline of the same run):"
    );
    let mut json = serde_json::Map::new();
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    for f in figures {
        println!(
            "  {:<28} {:>10}  baseline {:<26} {:>10}  {:>6.2}x  {}",
            f.key,
            fmt(f.median, f.unit),
            f.baseline,
            fmt(f.baseline_median, f.unit),
            f.ratio(),
            f.verdict()
        );
        let (m, b) = match f.unit {
            Unit::Us => ("median_us", "baseline_median_us"),
            Unit::PerS => ("median_per_s", "baseline_median_per_s"),
        };
        let mut o = serde_json::Map::new();
        o.insert("what".into(), f.what.clone().into());
        o.insert(m.into(), r2(f.median).into());
        o.insert("baseline".into(), f.baseline.into());
        o.insert(b.into(), r2(f.baseline_median).into());
        o.insert("ratio".into(), r2(f.ratio()).into());
        o.insert("target_ratio".into(), f.target.into());
        o.insert("target_ratio_min".into(), f.target_min.into());
        json.insert(f.key.to_string(), serde_json::Value::Object(o));
    }
    for (key, e) in failures {
        println!("  {key:<28} FAILED: {e}");
        json.insert(
            key.to_string(),
            serde_json::json!({ "failed": e, "median_us": null, "ratio": null }),
        );
    }
    json.insert("quick".into(), cfg.quick.into());
    json.insert("seconds".into(), r2(took.as_secs_f64()).into());
    let out = std::env::var_os("RUNLEASE_BENCH_ENGINE_STORE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
            crate_dir
                .parent()
                .unwrap_or(crate_dir)
                .join("target/bench/engine_store.json")
        });
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d).expect("create the JSON's folder");
    }
    let text =
        serde_json::to_string_pretty(&serde_json::Value::Object(json)).expect("encode the JSON");
    std::fs::write(&out, text + "\n").expect("write the JSON");
    println!(
        "wrote {} ({:.0} s, {})",
        out.display(),
        took.as_secs_f64(),
        if cfg.quick { "quick" } else { "full" }
    );
}
