//! The worker: the command under `runlease run`, making one tenure's appends.

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use super::procs::{Rng, append_event, append_line, mono_ns};
use super::{MAX_APPENDS, WorkerOpts};

// ---------------------------------------------------------------------------------------
// The worker: the command under `runlease run`.

/// Run one tenure's appends (see the module docs); exits 0, or the first failing append's
/// exit code (75 when fenced).
pub fn worker(w: &WorkerOpts) -> ExitCode {
    let gen_s = std::env::var("RUNLEASE_GENERATION").unwrap_or_default();
    let owner = std::env::var("RUNLEASE_OWNER").unwrap_or_default();
    let run = std::env::var("RUNLEASE_RUN").unwrap_or_default();
    let Ok(generation) = gen_s.parse::<u64>() else {
        eprintln!("torture worker: RUNLEASE_GENERATION is not set or not a number");
        return ExitCode::from(70);
    };
    if owner.is_empty() || run.is_empty() {
        eprintln!("torture worker: RUNLEASE_OWNER / RUNLEASE_RUN not set");
        return ExitCode::from(70);
    }
    let (slot, round) = (w.slot, w.round);
    let pid = std::process::id();
    let mut rng = Rng::new(w.seed ^ (u64::from(slot) << 48) ^ round);
    let put = |line: String| {
        if let Err(e) = append_line(&w.history, &line) {
            eprintln!("torture worker: cannot write {}: {e}", w.history.display());
            std::process::exit(74);
        }
    };
    put(format!(
        "start slot={slot} round={round} gen={generation} owner={owner} pid={pid} t={}",
        mono_ns()
    ));
    let count = rng.range(5, MAX_APPENDS + 1);
    for n in 1..=count {
        let payload = serde_json::json!({
            "slot": slot, "round": round, "n": n, "gen": generation, "owner": owner,
        })
        .to_string();
        let t0 = mono_ns();
        let (rc, seq, t1) = append_event(&w.runlease, &run, "torture", &payload, Stdio::inherit());
        let seq_s = seq.map_or_else(|| "-".to_string(), |s| s.to_string());
        put(format!(
            "append slot={slot} round={round} n={n} gen={generation} owner={owner} rc={rc} \
             seq={seq_s} t0={t0} t1={t1}"
        ));
        if rc != 0 {
            return ExitCode::from(u8::try_from(rc).unwrap_or(1));
        }
        std::thread::sleep(Duration::from_millis(rng.range(0, 20)));
    }
    ExitCode::SUCCESS
}
