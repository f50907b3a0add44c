//! The worker: the command under `runlease run` on one host. Until the trial's workload
//! ends it writes as the owner, each operation one of (at random, half and half):
//! - an append (`runlease append`), its unique id in the payload;
//! - a store commit through the owner (`runlease store put RUN KEY VALUE`, which goes over
//!   the owner's store socket; with the etcd authority the owner makes it a guarded record
//!   in the engine, issue #32), with a key unique to the write.
//!
//! Each is recorded before (`invoke` / `store_invoke`) and after (`complete` /
//! `store_complete`, with ok / fail / info). A `FENCED` answer ends the worker (exit 75:
//! this generation is over). After a random number of operations (5-59) it ends by itself
//! (exit 0; not with `--no-release`, which the heal probe's workers get): `runlease run`
//! then releases the run, and the next owner, on any host, takes
//! the run over with its store caught up from the engine, so the run moves between hosts
//! through releases as well as through takeovers. Once the workload ends it waits to be
//! killed, holding the run, so the closing recovery finds an owner to retire.

use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use super::history::{Line, Outcome, put, store_written};
use crate::torture::procs::{Rng, append_event, code_of, mono_ns};

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
    /// Whether it ends by itself after a random number of operations (not with
    /// `--no-release`: the heal probe takes any owner change for a fencing).
    pub releases: bool,
}

/// Append and commit as the owner until `until`, or until its quota of operations (see
/// the module docs).
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
    // Operations after which this owner ends by itself (exit 0: a release).
    let quota = rng.range(5, 60);
    let mut n = 0u64;
    while mono_ns() < w.until {
        if w.releases && n >= quota {
            return ExitCode::SUCCESS;
        }
        n += 1;
        let id = format!("h{}-g{generation}-p{pid}-n{n}", w.host);
        let (rc, outcome) = if rng.chance(50) {
            let value = format!("v-{id}-t{}", mono_ns());
            record(Line::StoreInvoke {
                key: id.clone(),
                value: value.clone(),
                host: w.host,
                generation,
                t: mono_ns(),
            });
            let out = Command::new(&w.runlease)
                .args(["--json", "--quiet", "store", "put", &run, &id, &value])
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output();
            let t = mono_ns();
            let (rc, (seq, code)) = match out {
                Ok(o) => (code_of(o.status), store_written(&o.stdout)),
                Err(_) => (-1, (None, None)),
            };
            let outcome = Outcome::of_store(rc);
            record(Line::StoreComplete {
                key: id,
                outcome,
                rc,
                code,
                seq: seq.filter(|_| rc == 0),
                t,
            });
            (rc, outcome)
        } else {
            let payload = serde_json::json!({ "id": id }).to_string();
            record(Line::Invoke {
                id: id.clone(),
                host: w.host,
                generation,
                t: mono_ns(),
            });
            let (rc, seq, t) =
                append_event(&w.runlease, &run, "partitions", &payload, Stdio::null());
            let outcome = Outcome::of_append(rc);
            record(Line::Complete {
                id,
                outcome,
                rc,
                seq: seq.filter(|_| rc == 0),
                t,
            });
            (rc, outcome)
        };
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
