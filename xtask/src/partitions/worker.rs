//! The worker: the command under `runlease run` on one host. It appends until the trial's
//! workload ends, then waits to be killed: it never exits by itself, because a clean exit
//! releases the run with its store's seal, and until issue #32 the store does not follow
//! the lease to another host (the next owner elsewhere would be refused,
//! `STORE_IDENTITY_MISMATCH`).

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use super::history::{Line, Outcome, put};
use crate::torture::procs::{Rng, appended_sequence, code_of, mono_ns};

/// Options of a worker.
#[derive(Debug)]
pub struct WorkerOpts {
    /// The host it runs on (1-based).
    pub host: usize,
    /// The trial's history file.
    pub history: PathBuf,
    /// The `runlease` binary.
    pub runlease: PathBuf,
    /// CLOCK_MONOTONIC ns after which it stops appending.
    pub until: u64,
    /// Seed of its pauses.
    pub seed: u64,
}

/// Append as the owner until `until` (see the module docs).
pub fn worker(w: &WorkerOpts) -> ExitCode {
    let (Ok(generation), Ok(owner), Ok(run)) = (
        std::env::var("RUNLEASE_GENERATION").map(|g| g.parse::<u64>()),
        std::env::var("RUNLEASE_OWNER"),
        std::env::var("RUNLEASE_RUN"),
    ) else {
        eprintln!("partitions worker: RUNLEASE_GENERATION / OWNER / RUN not set");
        return ExitCode::from(70);
    };
    let Ok(generation) = generation else {
        eprintln!("partitions worker: RUNLEASE_GENERATION is not a number");
        return ExitCode::from(70);
    };
    let record = |line: Line| {
        if let Err(e) = put(&w.history, &line) {
            eprintln!("partitions worker: {}: {e}", w.history.display());
            std::process::exit(74);
        }
    };
    let pid = std::process::id();
    record(Line::Start {
        host: w.host,
        generation,
        owner: owner.clone(),
        t: mono_ns(),
    });
    let mut rng = Rng::new(w.seed ^ u64::from(pid) ^ (generation << 32));
    let mut n = 0u64;
    while mono_ns() < w.until {
        n += 1;
        let id = format!("h{}-g{generation}-p{pid}-n{n}", w.host);
        let payload = serde_json::json!({ "id": id }).to_string();
        record(Line::Invoke {
            id: id.clone(),
            host: w.host,
            generation,
            t: mono_ns(),
        });
        let out = Command::new(&w.runlease)
            .args(["--json", "--quiet", "append", &run, "--type", "partitions"])
            .args(["--payload", &payload])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output();
        let t = mono_ns();
        let (rc, seq) = match out {
            Ok(o) => (code_of(o.status), appended_sequence(&o.stdout)),
            Err(_) => (-1, None),
        };
        let outcome = Outcome::of_append(rc);
        record(Line::Complete {
            id,
            outcome,
            rc,
            seq: seq.filter(|_| rc == 0),
            t,
        });
        if outcome == Outcome::Fail {
            // Fenced: this generation is over; `runlease run` fences itself too.
            return ExitCode::from(75);
        }
        let pause = if rc == 0 { rng.range(20, 80) } else { 200 };
        std::thread::sleep(Duration::from_millis(pause));
    }
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}
