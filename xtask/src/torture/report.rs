//! The report: recover the run, read the log, check, print the figure line.

use std::path::Path;

use super::check::{check, parse_events, parse_history};
use super::procs::rl;
use super::{FENCED, HEARTBEAT_MS, Opts, SELF_FENCE_MS, STALE_MS};

/// The figures of one torture run.
#[derive(Debug)]
pub(super) struct Figures {
    pub(super) kills: u64,
    pub(super) stops: u64,
}

/// Recover the run, read the log, check, print the figure line.
pub(super) fn judge(opts: &Opts, work: &Path, runlease: &Path, f: &Figures) -> Result<(), String> {
    let run = work.join("run").to_string_lossy().into_owned();
    let mut problems = Vec::new();
    // Recovery: take over / retire the last owner and release, finalizing pending cutoffs.
    let (rc, _) = rl(
        runlease,
        &[
            "run",
            &run,
            &format!("--heartbeat={HEARTBEAT_MS}"),
            &format!("--self-fence-after={SELF_FENCE_MS}"),
            &format!("--stale-after={STALE_MS}"),
            "--wait=30s",
            "--takeover-stale",
            "--retire-dead",
            "--",
            "true",
        ],
    );
    if rc != 0 {
        problems.push(format!(
            "closing `runlease run {run} ... -- true` exited {rc}"
        ));
    }
    let text = std::fs::read_to_string(work.join("history.log")).unwrap_or_default();
    let history = parse_history(&text)?;
    if opts.inject_lost {
        let victim = history
            .attempts
            .iter()
            .filter(|a| a.rc == 0)
            .filter_map(|a| a.seq)
            .max()
            .ok_or("--inject-lost: no acknowledged append to delete")?;
        let file = Path::new(&run)
            .join("events")
            .join(format!("{victim:020}.json"));
        std::fs::remove_file(&file)
            .map_err(|e| format!("--inject-lost: cannot remove {}: {e}", file.display()))?;
        eprintln!("torture: --inject-lost: deleted {}", file.display());
    }
    let (rc, out) = rl(runlease, &["--json", "verify", &run]);
    if rc != 0 {
        problems.push(format!(
            "`runlease verify {run}` exited {rc}: {}",
            out.trim()
        ));
    }
    let (rc, out) = rl(runlease, &["--json", "events", &run]);
    let events = if rc == 0 {
        parse_events(&out)?
    } else {
        problems.push(format!(
            "`runlease events {run}` exited {rc}: {}",
            out.trim()
        ));
        Vec::new()
    };
    let verdict = check(&history, &events);
    problems.extend(verdict.problems.iter().cloned());
    let acked = history.attempts.iter().filter(|a| a.rc == 0).count();
    let fenced = history.attempts.iter().filter(|a| a.rc == FENCED).count();
    eprintln!(
        "torture: attempts={} acknowledged={acked} fenced={fenced} log_events={} counting={}",
        history.attempts.len(),
        events.len(),
        events.iter().filter(|e| e.counts).count()
    );
    let pending = events.iter().filter(|e| e.authority == "pending").count();
    if pending > 0 {
        problems.push(format!("{pending} events still pending after recovery"));
    }
    for l in &verdict.lost {
        println!("lost: {l}");
    }
    for o in &verdict.overlaps {
        println!("overlap: {o}");
    }
    for p in &problems {
        println!("problem: {p}");
    }
    println!(
        "torture: procs={} rounds={} kills={} stops={} overlaps={} lost={}",
        opts.procs,
        history.starts.len(),
        f.kills,
        f.stops,
        verdict.overlaps.len(),
        verdict.lost.len()
    );
    if verdict.lost.is_empty() && verdict.overlaps.is_empty() && problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "torture: {} lost, {} overlaps, {} other problems",
            verdict.lost.len(),
            verdict.overlaps.len(),
            problems.len()
        ))
    }
}
