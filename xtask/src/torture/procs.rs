//! Small helpers of the driver and the worker: the clock, randomness, history lines and
//! processes.

use std::collections::BTreeSet;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

// ---------------------------------------------------------------------------------------
// Small helpers: clock, randomness, history lines, processes.

/// CLOCK_MONOTONIC in ns: one clock for every process of the machine, so times written
/// by different workers compare.
pub(crate) fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

/// xorshift64*: enough for choosing faults; seeded, so a run's choices can be replayed
/// (up to the scheduling of the processes).
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform-ish in `lo..hi` (`hi > lo`).
    pub(crate) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Append one line to `path` with a single `write(2)` on an `O_APPEND` descriptor.
pub(crate) fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
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

/// A process as `/proc/<pid>/stat` shows it: parent and state letter.
fn proc_stat(pid: u32) -> Option<(u32, char)> {
    let st = lease_fs::probe::read_stat(pid).ok()??;
    Some((st.ppid, st.state))
}

/// Every process with its parent and state.
pub(super) fn all_procs() -> Vec<(u32, u32, char)> {
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

pub(crate) fn signal_pid(pid: u32, sig: Signal) {
    if let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process(p, sig);
    }
}

pub(super) fn signal_group(pgid: u32, sig: Signal) {
    if let Some(p) = i32::try_from(pgid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::kill_process_group(p, sig);
    }
}

/// Reap `pid` if it is our exited child (no wait if it is not).
pub(super) fn reap(pid: u32) {
    if let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = rustix::process::waitpid(Some(p), rustix::process::WaitOptions::NOHANG);
    }
}

/// SIGKILL then SIGCONT every descendant of this process, and reap those that are our
/// children, until none is left (or 5 s passed). Returns how many were killed.
pub(super) fn kill_all_descendants() -> usize {
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
pub(super) struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        let n = kill_all_descendants();
        if n > 0 {
            eprintln!("torture: cleanup killed {n} leftover process(es)");
        }
    }
}

/// The sequence number `runlease --json append` printed on `stdout` (its first line), if
/// any: what the torture's and the partition harness's appenders record.
pub(crate) fn appended_sequence(stdout: &[u8]) -> Option<u64> {
    let first = stdout.split(|b| *b == b'\n').next().unwrap_or_default();
    serde_json::from_slice::<serde_json::Value>(first)
        .ok()
        .and_then(|v| v.get("sequence").and_then(serde_json::Value::as_u64))
}

/// One `runlease --json --quiet append RUN --type TYPE --payload PAYLOAD` (stdin closed,
/// stderr as given), as the torture's and the partition harness's workers make it: its exit
/// code (-1 when it could not be started), the sequence it printed, and the
/// CLOCK_MONOTONIC ns when it returned.
pub(crate) fn append_event(
    runlease: &Path,
    run: &str,
    event_type: &str,
    payload: &str,
    stderr: Stdio,
) -> (i32, Option<u64>, u64) {
    let out = Command::new(runlease)
        .args(["--json", "--quiet", "append", run, "--type", event_type])
        .args(["--payload", payload])
        .stdin(Stdio::null())
        .stderr(stderr)
        .output();
    let t = mono_ns();
    let (rc, seq) = match out {
        Ok(o) => (code_of(o.status), appended_sequence(&o.stdout)),
        Err(_) => (-1, None),
    };
    (rc, seq, t)
}

/// Exit code of a finished process: its code, or `128 + signal`.
pub(crate) fn code_of(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

/// Run a short `runlease` command to completion: (exit code, stdout, stderr).
pub(super) fn rl3(runlease: &Path, args: &[&str]) -> (i32, String, String) {
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
pub(super) fn rl(runlease: &Path, args: &[&str]) -> (i32, String) {
    let (rc, out, _) = rl3(runlease, args);
    (rc, out)
}
