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
//!   mode ([`worker`]).
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
//!   read and [`check`] judges.
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
//! can fail. The checker's logic is also unit-tested on synthetic histories below.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::process::{Pid, Signal};
use serde_json::Value;

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

// ---------------------------------------------------------------------------------------
// Small helpers: clock, randomness, history lines, processes.

/// CLOCK_MONOTONIC in ns: one clock for every process of the machine, so times written
/// by different workers compare.
fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

/// xorshift64*: enough for choosing faults; seeded, so a run's choices can be replayed
/// (up to the scheduling of the processes).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform-ish in `lo..hi` (`hi > lo`).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Append one line to `path` with a single `write(2)` on an `O_APPEND` descriptor.
fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    let mut f = OpenOptions::new().append(true).create(true).open(path)?;
    let buf = format!("{line}\n");
    let n = f.write(buf.as_bytes())?;
    if n != buf.len() {
        return Err(std::io::Error::other(format!(
            "short write to {} ({n} of {} bytes)",
            path.display(),
            buf.len()
        )));
    }
    Ok(())
}

/// `key=value` fields of a history line (the first word is its kind).
fn fields(line: &str) -> (String, HashMap<String, String>) {
    let mut words = line.split_whitespace();
    let kind = words.next().unwrap_or_default().to_string();
    let map = words
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (kind, map)
}

/// A process as `/proc/<pid>/stat` shows it: parent and state letter.
fn proc_stat(pid: u32) -> Option<(u32, char)> {
    let st = lease_fs::probe::read_stat(pid).ok()??;
    Some((st.ppid, st.state))
}

/// Every process with its parent and state.
fn all_procs() -> Vec<(u32, u32, char)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let (ppid, state) = proc_stat(pid)?;
        Some((pid, ppid, state))
    })
    .collect()
}

/// Every descendant of `root` (transitively), with its state.
fn descendants(root: u32) -> Vec<(u32, u32, char)> {
    let procs = all_procs();
    let mut found: BTreeSet<u32> = BTreeSet::from([root]);
    let mut out = Vec::new();
    loop {
        let before = found.len();
        for &(pid, ppid, state) in &procs {
            if found.contains(&ppid) && found.insert(pid) {
                out.push((pid, ppid, state));
            }
        }
        if found.len() == before {
            return out;
        }
    }
}

fn signal_pid(pid: u32, sig: Signal) {
    if let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

fn signal_group(pgid: u32, sig: Signal) {
    if let Some(p) = i32::try_from(pgid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process_group(p, sig);
    }
}

/// Reap `pid` if it is our exited child (no wait if it is not).
fn reap(pid: u32) {
    if let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG);
    }
}

/// SIGKILL then SIGCONT every descendant of this process, and reap those that are our
/// children, until none is left (or 5 s passed). Returns how many were killed.
fn kill_all_descendants() -> usize {
    let me = std::process::id();
    let mut killed = BTreeSet::new();
    let start = Instant::now();
    loop {
        let found = descendants(me);
        if found.is_empty() || start.elapsed() > Duration::from_secs(5) {
            return killed.len();
        }
        for &(pid, _, state) in &found {
            if state != 'Z' {
                signal_pid(pid, Signal::KILL);
                signal_pid(pid, Signal::CONT);
                killed.insert(pid);
            }
        }
        for &(pid, ppid, _) in &found {
            if ppid == me {
                reap(pid);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills every descendant when dropped (normal return or panic unwinding).
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        let n = kill_all_descendants();
        if n > 0 {
            eprintln!("torture: cleanup killed {n} leftover process(es)");
        }
    }
}

/// Exit code of a finished process: its code, or `128 + signal`.
fn code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

/// Run a short `runlease` command to completion: (exit code, stdout, stderr).
fn rl3(runlease: &Path, args: &[&str]) -> (i32, String, String) {
    match Command::new(runlease)
        .args(args)
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => (
            code_of(out.status),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .replace('\n', " | "),
        ),
        Err(e) => (-1, String::new(), e.to_string()),
    }
}

/// [`rl3`] without stderr.
fn rl(runlease: &Path, args: &[&str]) -> (i32, String) {
    let (rc, out, _) = rl3(runlease, args);
    (rc, out)
}

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
        let out = Command::new(&w.runlease)
            .args(["--json", "--quiet", "append", &run, "--type", "torture"])
            .args(["--payload", &payload])
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output();
        let t1 = mono_ns();
        let (rc, seq) = match out {
            Ok(o) => {
                let seq = serde_json::from_slice::<Value>(&o.stdout)
                    .ok()
                    .and_then(|v| v.get("sequence").and_then(Value::as_u64));
                (code_of(o.status), seq)
            }
            Err(_) => (-1, None),
        };
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

// ---------------------------------------------------------------------------------------
// The checker (pure).

/// A `start` line: a tenure's command began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    slot: u64,
    round: u64,
    generation: u64,
    owner: String,
    t: u64,
}

/// An `append` line: one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    slot: u64,
    round: u64,
    n: u64,
    generation: u64,
    owner: String,
    rc: i32,
    seq: Option<u64>,
    t0: u64,
    t1: u64,
}

impl Attempt {
    fn key(&self) -> (u64, u64, u64) {
        (self.slot, self.round, self.n)
    }
}

/// One event of `runlease events --json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEvent {
    sequence: u64,
    generation: u64,
    owner: String,
    counts: bool,
    authority: String,
    /// `(slot, round, n)` from the payload, if it has one.
    key: Option<(u64, u64, u64)>,
}

/// The parsed history file.
#[derive(Debug, Default)]
pub struct History {
    starts: Vec<Start>,
    attempts: Vec<Attempt>,
}

/// Parse the history file; malformed lines are errors.
fn parse_history(text: &str) -> Result<History, String> {
    let mut h = History::default();
    for (i, line) in text.lines().enumerate() {
        let bad = || format!("history line {}: malformed: {line:?}", i + 1);
        let (kind, f) = fields(line);
        let num = |k: &str| f.get(k).and_then(|v| v.parse::<u64>().ok()).ok_or_else(bad);
        let owner = f.get("owner").cloned().ok_or_else(bad)?;
        match kind.as_str() {
            "start" => h.starts.push(Start {
                slot: num("slot")?,
                round: num("round")?,
                generation: num("gen")?,
                owner,
                t: num("t")?,
            }),
            "append" => h.attempts.push(Attempt {
                slot: num("slot")?,
                round: num("round")?,
                n: num("n")?,
                generation: num("gen")?,
                owner,
                rc: f.get("rc").and_then(|v| v.parse().ok()).ok_or_else(bad)?,
                seq: f.get("seq").and_then(|v| v.parse().ok()),
                t0: num("t0")?,
                t1: num("t1")?,
            }),
            _ => return Err(bad()),
        }
    }
    Ok(h)
}

/// Parse `runlease events --json` output.
fn parse_events(text: &str) -> Result<Vec<LogEvent>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).map_err(|e| format!("events: bad JSON {l:?}: {e}"))?;
            let u = |k: &str| {
                v.get(k)
                    .and_then(Value::as_u64)
                    .ok_or_else(|| format!("events: no {k} in {l}"))
            };
            let p = v.get("payload");
            let pu = |k: &str| p.and_then(|p| p.get(k)).and_then(Value::as_u64);
            let key = match (pu("slot"), pu("round"), pu("n")) {
                (Some(s), Some(r), Some(n)) => Some((s, r, n)),
                _ => None,
            };
            Ok(LogEvent {
                sequence: u("sequence")?,
                generation: u("generation")?,
                owner: v
                    .get("owner_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                counts: v
                    .get("authoritative")
                    .and_then(Value::as_bool)
                    .ok_or_else(|| format!("events: no authoritative in {l}"))?,
                authority: v
                    .get("authority")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                key,
            })
        })
        .collect()
}

/// What the checker found: each entry names the offending records.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Acknowledged attempts not faithfully in the log (see the module docs).
    lost: Vec<String>,
    /// Violations of single ownership (see the module docs).
    overlaps: Vec<String>,
    /// Anything else that makes the run fail (unknown events).
    problems: Vec<String>,
}

/// Judge a history against the recovered event log (definitions in the module docs).
pub fn check(h: &History, events: &[LogEvent]) -> Verdict {
    let mut v = Verdict::default();
    let mut by_key: BTreeMap<(u64, u64, u64), Vec<&LogEvent>> = BTreeMap::new();
    for e in events {
        match e.key {
            Some(k) => by_key.entry(k).or_default().push(e),
            None => v
                .problems
                .push(format!("log event without a torture key: {e:?}")),
        }
    }
    // An event whose key has no history line is fine: its worker was killed between the
    // append and the line (or the answer was lost); it is never acknowledged.
    let acked: Vec<&Attempt> = h.attempts.iter().filter(|a| a.rc == 0).collect();

    // lost
    for a in &acked {
        let es = by_key.get(&a.key()).map(Vec::as_slice).unwrap_or_default();
        match es {
            [] => v
                .lost
                .push(format!("acknowledged but absent from the log: {a:?}")),
            [e] if e.counts
                && e.generation == a.generation
                && e.owner == a.owner
                && Some(e.sequence) == a.seq => {}
            [e] => v.lost.push(format!(
                "acknowledged but not counted as acknowledged: {a:?} vs log {e:?}"
            )),
            many => v.lost.push(format!(
                "acknowledged, but {} log events carry its key: {a:?} vs {many:?}",
                many.len()
            )),
        }
    }

    // 1. monotone log
    let mut prev: Option<&LogEvent> = None;
    let mut sorted: Vec<&LogEvent> = events.iter().collect();
    sorted.sort_by_key(|e| e.sequence);
    for e in sorted.iter().filter(|e| e.counts) {
        if let Some(p) = prev
            && e.generation < p.generation
        {
            v.overlaps.push(format!(
                "counting events not generation-monotone: {p:?} then {e:?}"
            ));
        }
        prev = Some(e);
    }

    // 2. one owner per generation
    let mut start_of: BTreeMap<u64, &Start> = BTreeMap::new();
    for s in &h.starts {
        if let Some(other) = start_of.insert(s.generation, s) {
            v.overlaps.push(format!(
                "two tenures started at one generation: {other:?} and {s:?}"
            ));
        }
    }
    let mut owner_of: BTreeMap<u64, &str> = BTreeMap::new();
    for e in events.iter().filter(|e| e.counts) {
        if let Some(o) = owner_of.insert(e.generation, &e.owner)
            && o != e.owner
        {
            v.overlaps.push(format!(
                "generation {} counts events of two owners ({o} and {}): {e:?}",
                e.generation, e.owner
            ));
        }
    }

    // 3. tenure: earliest start of any generation above g
    let min_above = |times: &BTreeMap<u64, u64>, g: u64| {
        times
            .range(g + 1..)
            .map(|(_, &t)| t)
            .min()
            .map(|t| (t, times.iter().find(|(_, tt)| **tt == t).map(|(g, _)| *g)))
    };
    let start_t: BTreeMap<u64, u64> = start_of.iter().map(|(&g, s)| (g, s.t)).collect();
    let mut ack_end: BTreeMap<u64, u64> = BTreeMap::new();
    for a in &acked {
        let t = ack_end.entry(a.generation).or_insert(a.t1);
        *t = (*t).min(a.t1);
    }
    for a in &acked {
        if let Some((t, g)) = min_above(&start_t, a.generation)
            && a.t0 > t
        {
            v.overlaps.push(format!(
                "acknowledged append started {} ms after the tenure of generation {g:?} began: {a:?}",
                (a.t0 - t) / 1_000_000
            ));
        }
        // 4. acknowledged order
        if let Some((t, g)) = min_above(&ack_end, a.generation)
            && a.t0 > t
        {
            v.overlaps.push(format!(
                "acknowledged append started {} ms after an acknowledged append of generation {g:?} ended: {a:?}",
                (a.t0 - t) / 1_000_000
            ));
        }
    }

    // 5. fenced never counts
    for a in h.attempts.iter().filter(|a| a.rc == FENCED) {
        for e in by_key.get(&a.key()).into_iter().flatten() {
            if e.counts {
                v.overlaps
                    .push(format!("fenced append counts in the log: {a:?} vs {e:?}"));
            }
        }
    }
    v
}

// ---------------------------------------------------------------------------------------
// The driver.

/// Counters and the registry of live `runlease run` children, shared by the threads.
struct Shared {
    stop: AtomicBool,
    /// slot → pid of its current `runlease run` (registered under the lock at spawn).
    running: Mutex<BTreeMap<u32, u32>>,
    kills: AtomicU64,
    stops: AtomicU64,
    takeovers: AtomicU64,
    retires: AtomicU64,
    runs: AtomicU64,
}

/// The figures of one torture run.
#[derive(Debug)]
struct Figures {
    kills: u64,
    stops: u64,
}

/// `cargo xtask torture`: build `runlease`, torture, recover, check, print the figure line.
pub fn run(root: &Path, opts: &Opts) -> Result<(), String> {
    eprintln!(
        "torture: building runlease (debug profile), procs={} seconds={} seed={}",
        opts.procs, opts.seconds, opts.seed
    );
    let runlease = crate::build_runlease(root)?;
    let target = crate::target_dir(root);
    let work = target
        .join("torture")
        .join(format!("{}-{}", std::process::id(), opts.seed));
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let work = work
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", work.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this xtask: {e}"))?;

    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| format!("cannot become a child subreaper: {e}"))?;
    let guard = Cleanup;
    let hard_deadline = Instant::now() + Duration::from_secs(opts.seconds) + WATCHDOG_GRACE;
    std::thread::spawn(move || {
        while Instant::now() < hard_deadline {
            std::thread::sleep(Duration::from_millis(500));
        }
        eprintln!(
            "torture: FAILED: watchdog: still running {WATCHDOG_GRACE:?} after the deadline; killing everything"
        );
        kill_all_descendants();
        std::process::exit(1);
    });

    let figures = torture(opts, &work, &runlease, &exe)?;
    let outcome = judge(opts, &work, &runlease, &figures);
    drop(guard);
    match outcome {
        Ok(()) if opts.keep => {
            eprintln!("torture: work folder kept (--keep): {}", work.display());
            Ok(())
        }
        Ok(()) => {
            let _ = std::fs::remove_dir_all(&work);
            Ok(())
        }
        Err(e) => {
            eprintln!(
                "torture: work folder kept for inspection: {}",
                work.display()
            );
            Err(e)
        }
    }
}

/// Run the slots and the fault driver until the deadline; stop and clean up.
fn torture(opts: &Opts, work: &Path, runlease: &Path, exe: &Path) -> Result<Figures, String> {
    let run_dir = work.join("run");
    let history = work.join("history.log");
    let driver_log = work.join("driver.log");
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        running: Mutex::new(BTreeMap::new()),
        kills: AtomicU64::new(0),
        stops: AtomicU64::new(0),
        takeovers: AtomicU64::new(0),
        retires: AtomicU64::new(0),
        runs: AtomicU64::new(0),
    });
    let deadline = Instant::now() + Duration::from_secs(opts.seconds);
    let mut slots = Vec::new();
    for slot in 0..opts.procs {
        let (shared, run_dir, history, driver_log) = (
            shared.clone(),
            run_dir.clone(),
            history.clone(),
            driver_log.clone(),
        );
        let (runlease, exe, seed) = (runlease.to_path_buf(), exe.to_path_buf(), opts.seed);
        let slot_log = work.join(format!("slot-{slot}.log"));
        slots.push(std::thread::spawn(move || -> Result<(), String> {
            let mut rng = Rng::new(seed ^ u64::from(slot).wrapping_mul(7919));
            let mut round = 0u64;
            while !shared.stop.load(Ordering::SeqCst) {
                round += 1;
                let log = File::options()
                    .append(true)
                    .create(true)
                    .open(&slot_log)
                    .map_err(|e| format!("cannot open {}: {e}", slot_log.display()))?;
                let log2 = log.try_clone().map_err(|e| e.to_string())?;
                let mut cmd = Command::new(&runlease);
                cmd.arg("run")
                    .arg(&run_dir)
                    .args([
                        &format!("--heartbeat={HEARTBEAT_MS}"),
                        &format!("--self-fence-after={SELF_FENCE_MS}"),
                        &format!("--stale-after={STALE_MS}"),
                        "--wait=2s",
                        "--takeover-stale",
                        "--retire-dead",
                        "--",
                    ])
                    .arg(&exe)
                    .args(["torture", "--worker", "--slot", &slot.to_string()])
                    .args(["--round", &round.to_string()])
                    .args(["--seed", &rng.next().to_string()])
                    .arg("--history")
                    .arg(&history)
                    .arg("--runlease")
                    .arg(&runlease)
                    .stdin(Stdio::null())
                    .stdout(log)
                    .stderr(log2)
                    .process_group(0);
                let mut child = {
                    let mut running = shared.running.lock().expect("registry lock");
                    let child = cmd
                        .spawn()
                        .map_err(|e| format!("cannot start {}: {e}", runlease.display()))?;
                    running.insert(slot, child.id());
                    child
                };
                shared.runs.fetch_add(1, Ordering::SeqCst);
                let rc = child.wait().map(code_of).unwrap_or(-1);
                shared.running.lock().expect("registry lock").remove(&slot);
                let _ = append_line(
                    &driver_log,
                    &format!("run slot={slot} round={round} pid={} rc={rc}", child.id()),
                );
                if Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(rng.range(0, 50)));
            }
            Ok(())
        }));
    }

    drive(opts, &shared, deadline, &run_dir, runlease, &driver_log);
    shared.stop.store(true, Ordering::SeqCst);
    // The slots end their round by themselves: a worker makes at most MAX_APPENDS appends
    // and a `runlease run` waits at most 2 s.
    let mut errors = Vec::new();
    for s in slots {
        match s.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("a slot thread panicked".into()),
        }
    }
    let leftovers = kill_all_descendants();
    let _ = append_line(&driver_log, &format!("end leftovers_killed={leftovers}"));
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    eprintln!(
        "torture: runs={} takeovers(driver)={} retires(driver)={}",
        shared.runs.load(Ordering::SeqCst),
        shared.takeovers.load(Ordering::SeqCst),
        shared.retires.load(Ordering::SeqCst)
    );
    Ok(Figures {
        kills: shared.kills.load(Ordering::SeqCst),
        stops: shared.stops.load(Ordering::SeqCst),
    })
}

/// A process the driver stopped, and when it resumes it.
struct Stopped {
    pid: u32,
    group: Option<u32>,
    resume_at: Instant,
    takeover_first: bool,
}

/// The fault injector: until the deadline, SIGKILL / SIGSTOP the current holder.
fn drive(
    opts: &Opts,
    shared: &Shared,
    deadline: Instant,
    run_dir: &Path,
    runlease: &Path,
    log: &Path,
) {
    let run = run_dir.to_string_lossy().into_owned();
    let mut rng = Rng::new(opts.seed ^ 0xD1B5_4A32_D192_ED03);
    let mut stopped: Vec<Stopped> = Vec::new();
    let note = |line: String| {
        let _ = append_line(log, &line);
    };
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(rng.range(100, 500)));
        // Resume the stopped ones that are due (after an exact takeover, sometimes).
        let now = Instant::now();
        let (due, keep): (Vec<_>, Vec<_>) = stopped.into_iter().partition(|s| s.resume_at <= now);
        stopped = keep;
        for s in due {
            if s.takeover_first {
                takeover(runlease, &run, shared, &note);
            }
            if let Some(g) = s.group {
                signal_group(g, Signal::CONT);
            }
            signal_pid(s.pid, Signal::CONT);
            note(format!("cont pid={} group={:?}", s.pid, s.group));
        }
        reap_orphans(shared);

        let (rc, out) = rl(runlease, &["--json", "status", &run]);
        let Some(st) = (rc == 0)
            .then(|| serde_json::from_str::<Value>(&out).ok())
            .flatten()
        else {
            continue;
        };
        let state = st.get("state").and_then(Value::as_str).unwrap_or_default();
        let Some(pid) = st.get("pid").and_then(Value::as_u64).map(|p| p as u32) else {
            continue;
        };
        let ours = shared
            .running
            .lock()
            .expect("registry lock")
            .values()
            .any(|&p| p == pid);
        if !ours || !(state == "active" || state == "stale") {
            continue;
        }
        if stopped.iter().any(|s| s.pid == pid) {
            continue;
        }
        // The command's process group: the child of `runlease run` (its pid = its pgid).
        let group = all_procs()
            .into_iter()
            .find(|&(_, ppid, _)| ppid == pid)
            .map(|(p, _, _)| p)
            .filter(|_| rng.chance(50));
        match rng.range(0, 100) {
            0..45 => {
                if let Some(g) = group {
                    signal_group(g, Signal::KILL);
                }
                signal_pid(pid, Signal::KILL);
                shared.kills.fetch_add(1, Ordering::SeqCst);
                note(format!("kill pid={pid} group={group:?}"));
                if rng.chance(50) {
                    std::thread::sleep(Duration::from_millis(rng.range(0, 300)));
                    let (rc, _, err) = rl3(runlease, &["retire", &run]);
                    if rc == 0 {
                        shared.retires.fetch_add(1, Ordering::SeqCst);
                    }
                    note(format!("retire rc={rc} {err}"));
                }
            }
            45..90 => {
                if let Some(g) = group {
                    signal_group(g, Signal::STOP);
                }
                signal_pid(pid, Signal::STOP);
                shared.stops.fetch_add(1, Ordering::SeqCst);
                let pause = rng.range(300, 4000);
                let takeover_first = pause > STALE_MS + 200 && rng.chance(60);
                note(format!(
                    "stop pid={pid} group={group:?} for_ms={pause} takeover_first={takeover_first}"
                ));
                stopped.push(Stopped {
                    pid,
                    group,
                    resume_at: Instant::now() + Duration::from_millis(pause),
                    takeover_first,
                });
            }
            _ => {}
        }
    }
    for s in stopped {
        if let Some(g) = s.group {
            signal_group(g, Signal::CONT);
        }
        signal_pid(s.pid, Signal::CONT);
        note(format!("cont pid={} group={:?} (deadline)", s.pid, s.group));
    }
}

/// An exact takeover with the expectations `status --json` prints, if the run is stale.
fn takeover(runlease: &Path, run: &str, shared: &Shared, note: &dyn Fn(String)) {
    let (rc, out) = rl(runlease, &["--json", "status", run]);
    let Some(st) = (rc == 0)
        .then(|| serde_json::from_str::<Value>(&out).ok())
        .flatten()
    else {
        return;
    };
    if st.get("state").and_then(Value::as_str) != Some("stale") {
        return;
    }
    let get = |k: &str| match st.get(k) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let (Some(owner), Some(beat)) = (get("expect_owner"), get("expect_heartbeat")) else {
        return;
    };
    let mut args = vec![
        "--json".to_string(),
        "takeover".into(),
        run.into(),
        "--expect-owner".into(),
        owner,
        "--expect-heartbeat".into(),
        beat,
    ];
    if let Some(g) = get("expect_generation") {
        args.extend(["--expect-generation".into(), g]);
    }
    if let Some(c) = get("expect_count") {
        args.extend(["--expect-count".into(), c]);
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (rc, _, err) = rl3(runlease, &refs);
    if rc == 0 {
        shared.takeovers.fetch_add(1, Ordering::SeqCst);
    }
    note(format!("takeover rc={rc} {err}"));
}

/// Reap commands orphaned by a killed `runlease run` (re-parented to us, the subreaper)
/// once they exited; never a registered `runlease run` child (its slot thread waits).
fn reap_orphans(shared: &Shared) {
    let me = std::process::id();
    let running = shared.running.lock().expect("registry lock");
    for (pid, ppid, state) in all_procs() {
        if ppid == me && state == 'Z' && !running.values().any(|&p| p == pid) {
            reap(pid);
        }
    }
}

/// Recover the run, read the log, check, print the figure line.
fn judge(opts: &Opts, work: &Path, runlease: &Path, f: &Figures) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn start(g: u64, owner: &str, t: u64) -> Start {
        Start {
            slot: g,
            round: 1,
            generation: g,
            owner: owner.into(),
            t,
        }
    }

    fn att(g: u64, owner: &str, n: u64, rc: i32, seq: Option<u64>, t0: u64) -> Attempt {
        Attempt {
            slot: g,
            round: 1,
            n,
            generation: g,
            owner: owner.into(),
            rc,
            seq,
            t0,
            t1: t0 + 5,
        }
    }

    fn ev(a: &Attempt, sequence: u64, counts: bool) -> LogEvent {
        LogEvent {
            sequence,
            generation: a.generation,
            owner: a.owner.clone(),
            counts,
            authority: if counts { "counts" } else { "past_cutoff" }.into(),
            key: Some(a.key()),
        }
    }

    /// Two tenures: generation 1 appends twice (acked), a fenced third attempt whose
    /// event stays on disk past the cutoff, then generation 3 appends once.
    fn clean() -> (History, Vec<LogEvent>) {
        let a1 = att(1, "A", 1, 0, Some(1), 100);
        let a2 = att(1, "A", 2, 0, Some(2), 200);
        let a3 = att(1, "A", 3, FENCED, None, 250);
        let b1 = att(3, "B", 1, 0, Some(4), 400);
        let events = vec![
            ev(&a1, 1, true),
            ev(&a2, 2, true),
            ev(&a3, 3, false),
            ev(&b1, 4, true),
        ];
        let h = History {
            starts: vec![start(1, "A", 50), start(3, "B", 300)],
            attempts: vec![a1, a2, a3, b1],
        };
        (h, events)
    }

    #[test]
    fn clean_history_passes() {
        let (h, e) = clean();
        let v = check(&h, &e);
        assert!(
            v.lost.is_empty() && v.overlaps.is_empty() && v.problems.is_empty(),
            "{v:?}"
        );
    }

    #[test]
    fn missing_or_uncounted_acknowledged_event_is_lost() {
        let (h, mut e) = clean();
        e.remove(1);
        assert_eq!(check(&h, &e).lost.len(), 1);
        let (h, mut e) = clean();
        e[0].counts = false;
        assert_eq!(check(&h, &e).lost.len(), 1);
        let (h, mut e) = clean();
        e[3].sequence = 9;
        assert_eq!(
            check(&h, &e).lost.len(),
            1,
            "acknowledged with another sequence"
        );
    }

    #[test]
    fn fenced_event_that_counts_is_an_overlap() {
        let (h, mut e) = clean();
        e[2].counts = true;
        let v = check(&h, &e);
        assert!(
            v.overlaps
                .iter()
                .any(|o| o.contains("fenced append counts")),
            "{v:?}"
        );
    }

    #[test]
    fn acknowledged_write_after_a_newer_tenure_began_is_an_overlap() {
        let (mut h, mut e) = clean();
        // A zombie write of generation 1, acknowledged, after generation 3 started (t=300)
        // and after its acknowledged append ended (t=405).
        let z = att(1, "A", 4, 0, Some(5), 500);
        e.push(ev(&z, 5, true));
        h.attempts.push(z);
        let v = check(&h, &e);
        assert!(
            v.overlaps
                .iter()
                .any(|o| o.contains("tenure of generation Some(3)")),
            "{v:?}"
        );
        assert!(
            v.overlaps
                .iter()
                .any(|o| o.contains("acknowledged append of generation")),
            "{v:?}"
        );
        assert!(
            v.overlaps.iter().any(|o| o.contains("generation-monotone")),
            "{v:?}"
        );
    }

    #[test]
    fn two_owners_of_one_generation_is_an_overlap() {
        let (mut h, mut e) = clean();
        h.starts.push(start(3, "C", 350));
        let c = Attempt {
            owner: "C".into(),
            n: 7,
            ..att(3, "C", 7, 0, Some(5), 360)
        };
        e.push(ev(&c, 5, true));
        h.attempts.push(c);
        let v = check(&h, &e);
        assert!(
            v.overlaps.iter().any(|o| o.contains("two tenures")),
            "{v:?}"
        );
        assert!(v.overlaps.iter().any(|o| o.contains("two owners")), "{v:?}");
    }

    #[test]
    fn history_lines_parse_and_malformed_lines_are_refused() {
        let text = "start slot=0 round=1 gen=1 owner=A pid=9 t=5\n\
                    append slot=0 round=1 n=1 gen=1 owner=A rc=0 seq=1 t0=6 t1=7\n\
                    append slot=0 round=1 n=2 gen=1 owner=A rc=75 seq=- t0=8 t1=9\n";
        let h = parse_history(text).expect("parses");
        assert_eq!(h.starts.len(), 1);
        assert_eq!(h.attempts[0].seq, Some(1));
        assert_eq!(h.attempts[1].seq, None);
        assert_eq!(h.attempts[1].rc, FENCED);
        assert!(parse_history("append slot=0 round=1\n").is_err());
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_parse_and_bad_ones_are_refused() {
        match parse_args(&args(&["--procs", "8", "--seconds", "600", "--seed", "7"])) {
            Ok(Mode::Drive(o)) => {
                assert_eq!(
                    (o.procs, o.seconds, o.seed, o.inject_lost),
                    (8, 600, 7, false)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(parse_args(&args(&["--procs", "0"])).is_err());
        assert!(parse_args(&args(&["--seconds", "x"])).is_err());
        assert!(parse_args(&args(&["--procs"])).is_err());
        assert!(parse_args(&args(&["--bogus"])).is_err());
        assert!(
            parse_args(&args(&["--worker", "--slot", "1"])).is_err(),
            "worker needs all"
        );
        let w = args(&[
            "--worker",
            "--slot",
            "1",
            "--round",
            "2",
            "--history",
            "h",
            "--runlease",
            "r",
        ]);
        assert!(matches!(parse_args(&w), Ok(Mode::Worker(_))));
    }

    #[test]
    fn events_json_parses() {
        let line = r#"{"authoritative":false,"authority":"past_cutoff","cutoff":3,"generation":1,"owner_id":"A","payload":{"slot":2,"round":4,"n":5},"sequence":7}"#;
        let e = parse_events(line).expect("parses");
        assert_eq!(e[0].key, Some((2, 4, 5)));
        assert!(!e[0].counts);
        assert_eq!(e[0].sequence, 7);
    }
}
