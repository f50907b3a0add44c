//! `cargo xtask torture [--procs N] [--seconds S] [--seed X]`: many real `runlease` owners
//! fighting over one run while a driver kills and pauses them, then a checker that proves
//! from the history and the event log that the guarantees held (issue #8, parts 2 and 3).
//!
//! # What runs
//!
//! * The `runlease` binary is built once in the **debug** profile (`cargo build -p
//!   lease-cli`, default features: the run-folder authority it tortures). CI's `cargo test
//!   --workspace --all-features` built it with the `etcd` feature, so CI recompiles
//!   lease-run and lease-cli once here; the timings below are generous enough for a debug
//!   build.
//! * N *slots* (threads of this process) each loop on
//!   `runlease run RUN --heartbeat 200 --self-fence-after 800 --stale-after 1200 --wait=2s
//!   --takeover-stale --retire-dead -- <this xtask> torture --worker ...` until the deadline.
//!   Each `runlease run` is one process of its own; its command is this same binary in worker
//!   mode ([`worker`](fn@worker)).
//! * The worker (the command under the lease) reads `RUNLEASE_GENERATION` and
//!   `RUNLEASE_OWNER`, writes a `start` line to the history, then makes 5–30 attempts
//!   `runlease --json append RUN --type torture --payload {slot, round, n, gen, owner}`, each
//!   bracketed by CLOCK_MONOTONIC readings `t0` (before it starts the append) and `t1` (after
//!   it exited), and writes one `append` line per attempt with its exit code (`rc`) and, when
//!   `rc = 0`, the sequence number the append printed. It stops at the first non-zero exit
//!   (75 = fenced). The history file is opened `O_APPEND` and every line is one `write(2)`, so
//!   lines of concurrent writers never interleave and a killed writer leaves whole lines.
//! * The driver (the main thread), every 0.1–0.5 s, picks the current holder from `runlease
//!   status --json` (only if its pid is one of our `runlease run` children) and either
//!   SIGKILLs it (alone, or with its command's process group) and sometimes `runlease
//!   retire`s it, or SIGSTOPs it (alone, or with its command's process group) for 0.3–4 s,
//!   sometimes runs an exact `runlease takeover --expect-owner --expect-heartbeat
//!   --expect-generation --expect-count` with what `status --json` printed, then SIGCONTs it.
//!   The waiting slots also take over stale owners and retire dead ones themselves.
//! * At the deadline the driver stops, resumes everything it stopped, lets the slots finish
//!   their round (a worker makes at most 30 appends), then kills whatever is left. A closing
//!   `runlease run RUN --takeover-stale --retire-dead -- true` recovers the run (finalizing
//!   every pending cutoff), then `runlease verify --json` and `runlease events --json` are
//!   read and [`check::check`] judges.
//!
//! # What the checker proves (the definitions)
//!
//! An *attempt* is one `append` line of the history. It is *acknowledged* iff `rc = 0`
//! (`runlease append` exits 0 only if the event counts, PROTOCOL §7.6 / I9), *fenced* iff
//! `rc = 75`; any other outcome (killed, I/O error) is *unknown* and is not judged. Its key
//! is `(slot, round, n)`, unique by construction and carried in the event's payload.
//! A *log event* is one line of `runlease events --json` after the closing recovery; it
//! *counts* iff `authoritative` is true.
//!
//! * **lost** = the acknowledged attempts `a` for which the log does not hold exactly one
//!   event with `a`'s key that counts, with `a`'s generation and owner and the sequence
//!   number `a` was acknowledged with. (PROTOCOL I5: every acknowledged append stays
//!   authoritative after any crash.)
//! * **overlaps** = the violations of any of:
//!   1. *monotone log*: in sequence order, the generations of the events that count never
//!      decrease (PROTOCOL I13);
//!   2. *one owner per generation*: no two `start` lines, and no two counting events, name
//!      the same generation with different owners (or two starts the same generation);
//!   3. *tenure*: no acknowledged attempt of generation `g` started (`t0`) after the command
//!      of a generation `h > g` started (its `start` line's time): a newer owner's command
//!      only starts after its claim finalized `g`'s cutoff, so a later write of `g` must be
//!      fenced;
//!   4. *acknowledged order*: no acknowledged attempt of generation `g` started after an
//!      acknowledged attempt of a generation `h > g` ended (`t0 > t1'`), the same property
//!      seen from the appends alone;
//!   5. *fenced never counts*: no event whose attempt was fenced (`rc = 75`) counts.
//! * Besides these, the torture fails if `runlease verify` does not exit 0, if `runlease
//!   events` cannot be read, or if a log event carries no torture key (an event nobody
//!   attempted): these are printed as `problem:` lines.
//!
//! The figure line is `torture: procs=N rounds=R kills=K stops=S overlaps=O lost=L`, with
//! `rounds` = the number of tenures whose command started (`start` lines), `kills` and
//! `stops` = the SIGKILL / SIGSTOP injections the driver made. Any overlap, loss or problem
//! prints the offending records and exits 1; the work folder (under
//! `target/torture/`) is then kept and its path printed; on success it is removed.
//!
//! `--keep` keeps the work folder on success too. `--inject-lost` (test-only, not in the usage text) deletes the event file of the
//! acknowledged attempt with the highest sequence before the check, to show the checker
//! can fail. The checker's logic is also unit-tested on synthetic histories (`tests.rs`).
//!
//! # Cleanup
//!
//! This process makes itself a child subreaper, so a command orphaned by a killed
//! `runlease` is re-parented to it. A guard (run on return and on panic unwinding) and a
//! watchdog (at the deadline + 120 s) SIGKILL and then SIGCONT every descendant (a stopped
//! process dies once continued) and reap them. Partial: if this process itself is
//! SIGKILLed, its descendants are not killed (that needs `PR_SET_PDEATHSIG` in the child,
//! i.e. `pre_exec`, which `unsafe_code = "forbid"` rules out); they stop by themselves
//! (a worker makes at most 30 appends, a `runlease run` waits at most 2 s).

mod check;
mod driver;
pub(crate) mod procs;
mod report;
#[cfg(test)]
mod tests;
mod worker;

pub use driver::run;
pub use worker::worker;

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Heartbeat interval given to every `runlease run`, in ms.
const HEARTBEAT_MS: u64 = 200;
/// Self-fence deadline given to every `runlease run`, in ms.
const SELF_FENCE_MS: u64 = 800;
/// Staleness given to every `runlease run`, in ms.
const STALE_MS: u64 = 1200;
/// The most appends one worker (one tenure) attempts.
const MAX_APPENDS: u64 = 30;
/// Extra time after the deadline before the watchdog kills everything and fails.
const WATCHDOG_GRACE: Duration = Duration::from_secs(120);
/// Exit code of a fenced `runlease append` (sysexits `EX_TEMPFAIL`).
const FENCED: i32 = 75;

/// What `cargo xtask torture ...` asks for.
#[derive(Debug)]
pub enum Mode {
    /// The driver: build, torture, check.
    Drive(Opts),
    /// One worker, run as the command under `runlease run`.
    Worker(WorkerOpts),
}

/// Options of the driver.
#[derive(Debug)]
pub struct Opts {
    /// Number of slots (concurrent `runlease run` loops).
    pub procs: u32,
    /// How long the driver injects faults.
    pub seconds: u64,
    /// Seed of the pseudo-random choices (printed, to replay the same choices).
    pub seed: u64,
    /// Test-only: delete an acknowledged event before checking.
    pub inject_lost: bool,
    /// Keep the work folder even when the check passes.
    pub keep: bool,
}

/// Options of a worker (the command under the lease).
#[derive(Debug)]
pub struct WorkerOpts {
    slot: u32,
    round: u64,
    seed: u64,
    history: PathBuf,
    runlease: PathBuf,
}

/// Parse the arguments after `torture`.
pub fn parse_args(rest: &[String]) -> Result<Mode, String> {
    let mut it = rest.iter();
    let mut opts = Opts {
        procs: 4,
        seconds: 30,
        seed: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        inject_lost: false,
        keep: false,
    };
    let mut worker = false;
    let (mut slot, mut round, mut history, mut runlease) = (None, None, None, None);
    while let Some(a) = it.next() {
        let mut val = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("`torture {name}` needs a value"))
        };
        let num = |name: &str, v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("`torture {name}`: not a number: {v:?}"))
        };
        match a.as_str() {
            "--procs" => {
                let n = num(a, val(a)?)?;
                opts.procs = u32::try_from(n)
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or("`torture --procs` must be 1..=64")?;
            }
            "--seconds" => {
                opts.seconds = num(a, val(a)?)?;
                if opts.seconds == 0 || opts.seconds > 24 * 3600 {
                    return Err("`torture --seconds` must be 1..=86400".into());
                }
            }
            "--seed" => opts.seed = num(a, val(a)?)?,
            "--inject-lost" => opts.inject_lost = true,
            "--keep" => opts.keep = true,
            "--worker" => worker = true,
            "--slot" => slot = Some(num(a, val(a)?)?),
            "--round" => round = Some(num(a, val(a)?)?),
            "--history" => history = Some(PathBuf::from(val(a)?)),
            "--runlease" => runlease = Some(PathBuf::from(val(a)?)),
            other => return Err(format!("unexpected argument to `torture`: {other:?}")),
        }
    }
    if worker {
        match (slot, round, history, runlease) {
            (Some(slot), Some(round), Some(history), Some(runlease)) => {
                Ok(Mode::Worker(WorkerOpts {
                    slot: u32::try_from(slot).map_err(|_| "bad --slot")?,
                    round,
                    seed: opts.seed,
                    history,
                    runlease,
                }))
            }
            _ => Err("`torture --worker` needs --slot, --round, --history, --runlease".into()),
        }
    } else {
        Ok(Mode::Drive(opts))
    }
}
