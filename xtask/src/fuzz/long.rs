//! `cargo xtask fuzz --long [--max-seconds N] [--target T]`: the long fuzzing campaign of
//! issue #17, one target at a time.
//!
//! Per target (all of `cargo fuzz list`, or only `--target T`):
//!
//! 1. replays `fuzz/regressions/<target>/` (`-runs=0`); a failing input is a finding;
//! 2. fuzzes from the committed corpus `fuzz/corpus/<target>/` into a scratch corpus
//!    (`fuzz/target/fuzz-long/corpus/<target>/`) until **10 million executions or one
//!    CPU-hour** of the fuzzer process, whichever comes first; `--max-seconds N` adds a
//!    wall-clock limit, and a run it stops is reported as **partial**. CPU time is read from
//!    `/proc/<pid>/schedstat` of the fuzzer (our own unreaped child, so the pid cannot name
//!    another process) and the fuzzer is stopped with `SIGINT`, on which libFuzzer prints
//!    its final statistics and exits 72;
//! 3. a crash, hang (`-timeout=60`) or out-of-memory is saved by libFuzzer to
//!    `fuzz/artifacts/<target>/` (as cargo-fuzz does), counted as a finding, and fuzzing
//!    restarts with the remaining budget, until the same panic site is found a second time
//!    or [`MAX_FINDINGS`] are found;
//! 4. prints `fuzz-long <target>: <runs> runs in <s> s, <findings> findings (...)`;
//! 5. minimizes: the hand-written seeds (files whose name is not a 40-hex SHA-1) are kept
//!    as they are, and libFuzzer's `-set_cover_merge=1` adds, from the old committed corpus
//!    and the scratch corpus, a small set of inputs (greedy set cover, smaller ones first)
//!    that brings all their new coverage (about a quarter fewer bytes than the `-merge=1` of
//!    `cargo fuzz cmin` on `read_folder`'s corpus, the one near the 2 MiB cap); the
//!    result replaces the SHA-1-named files of `fuzz/corpus/<target>/` (its size is
//!    printed; keep it under 2 MB).
//!
//! Finally every target's corpus and regressions are replayed once in an AddressSanitizer
//! build (own target dir `fuzz/target/asan/`): the campaign itself runs without ASan (see
//! [`super::SANITIZER`]), so every input that reached new coverage still passes through it.
//!
//! Run it on a shared machine under `nice -n 19`. Fails (exit 1) if anything was found.

use super::{ensure_cargo_fuzz, executed_runs, input_count, nightly, panic_site, tail, targets};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Executions after which a target is done.
pub const MAX_RUNS: u64 = 10_000_000;
/// CPU seconds after which a target is done.
pub const MAX_CPU_SECS: u64 = 3600;
/// Findings after which a target stops (each restart costs the fuzzer's warm-up).
pub const MAX_FINDINGS: usize = 8;
/// The exit status libFuzzer uses when interrupted (`-interrupted_exitcode`, default 72).
const INTERRUPTED: i32 = 72;

/// Options of `fuzz --long`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opts {
    /// Wall-clock limit per target, if given (the report then says partial).
    pub max_seconds: Option<u64>,
    /// Only this target.
    pub target: Option<String>,
}

/// Parse `--long [--max-seconds N] [--target T]`.
pub fn parse_args(rest: &[String]) -> Result<Opts, String> {
    let usage = "usage: fuzz --long [--max-seconds N] [--target T]";
    let mut it = rest.iter();
    if it.next().map(String::as_str) != Some("--long") {
        return Err(format!("`fuzz` needs --long ({usage})"));
    }
    let mut opts = Opts {
        max_seconds: None,
        target: None,
    };
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value ({usage})"))?;
        match flag.as_str() {
            "--max-seconds" if opts.max_seconds.is_none() => match value.parse::<u64>() {
                Ok(s) if s > 0 => opts.max_seconds = Some(s),
                _ => {
                    return Err(format!(
                        "--max-seconds needs a positive integer, got {value:?}"
                    ));
                }
            },
            "--target" if opts.target.is_none() => opts.target = Some(value.clone()),
            _ => return Err(format!("unexpected argument {flag:?} to `fuzz` ({usage})")),
        }
    }
    Ok(opts)
}

/// On-CPU time of process `pid` (its main thread: libFuzzer fuzzes on it), from
/// `/proc/<pid>/schedstat`.
fn cpu_time(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    let ns: u64 = text.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Ask our child to stop (libFuzzer prints its statistics on SIGINT). The child is not
/// reaped yet, so its pid still names it.
fn interrupt(child: &Child) {
    if let Some(p) = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::INT);
    }
}

/// Why one fuzzer process ended.
enum End {
    /// Its run or time limit (or our SIGINT at the CPU limit).
    Budget,
    /// A crash, hang or out-of-memory: its output.
    Finding,
}

/// The fuzzer binary `bin` as a command with stdin and stdout closed and its stderr
/// (libFuzzer's whole output) going into `log`, created afresh.
fn fuzzer_command(bin: &Path, log: &Path) -> Result<Command, String> {
    let out =
        std::fs::File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let mut cmd = Command::new(bin);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(out);
    Ok(cmd)
}

/// One libFuzzer process: spawn it, stop it at `cpu_left`, return how it ended, its runs,
/// its CPU time and its output.
fn fuzz_once(
    bin: &Path,
    args: &[String],
    log: &Path,
    cpu_left: Duration,
) -> Result<(End, u64, Duration, String), String> {
    let mut child = fuzzer_command(bin, log)?
        .args(args)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    let pid = child.id();
    let mut cpu = Duration::ZERO;
    let mut stopped = false;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| format!("wait for {}: {e}", bin.display()))?
        {
            break status;
        }
        if let Some(c) = cpu_time(pid) {
            cpu = c;
        }
        if cpu >= cpu_left && !stopped {
            interrupt(&child);
            stopped = true;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let runs = executed_runs(&text).unwrap_or(0);
    let end = if status.success() || status.code() == Some(INTERRUPTED) {
        End::Budget
    } else {
        End::Finding
    };
    Ok((end, runs, cpu, text))
}

/// The fuzzer binary `cargo fuzz build` made for `target`.
fn fuzz_bin(dir: &Path, target_dir: &str, target: &str) -> Result<PathBuf, String> {
    let out = Command::new("rustc")
        .arg("-vV")
        .output()
        .map_err(|e| format!("cannot run `rustc -vV`: {e}"))?;
    let host = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .ok_or("`rustc -vV` names no host")?;
    let bin = dir.join(target_dir).join(host).join("release").join(target);
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "no fuzzer binary at {} after the build",
            bin.display()
        ))
    }
}

/// Whether `name` is a name libFuzzer gives (a SHA-1 in hex), as opposed to a seed's.
pub fn is_generated(name: &str) -> bool {
    name.len() == 40 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

fn files_of(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn fresh_dir(p: &Path) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(p);
    std::fs::create_dir_all(p).map_err(|e| format!("cannot create {}: {e}", p.display()))
}

/// Keep the seeds, merge the rest of `corpus` and `scratch` by coverage, and replace the
/// generated files of `corpus` with the result. Returns (files, bytes) of the new corpus.
///
/// Order: the merged set is built in `fuzz/target/fuzz-long/min/<target>/` first; only
/// when the merge succeeded are the old generated files removed and the new ones copied
/// in, so a failed merge leaves the committed corpus as it was.
fn minimize(dir: &Path, bin: &Path, target: &str, scratch: &Path) -> Result<(usize, u64), String> {
    let corpus = dir.join("corpus").join(target);
    let min = dir.join("target/fuzz-long/min").join(target);
    fresh_dir(&min)?;
    for seed in files_of(&corpus)
        .into_iter()
        .filter(|p| !is_generated(&name_of(p)))
    {
        std::fs::copy(&seed, min.join(name_of(&seed)))
            .map_err(|e| format!("cannot copy {}: {e}", seed.display()))?;
    }
    let log = dir
        .join("target/fuzz-long")
        .join(format!("{target}.merge.log"));
    let status = fuzzer_command(bin, &log)?
        .arg("-set_cover_merge=1")
        .arg("-rss_limit_mb=2048")
        .arg(&min)
        .arg(&corpus)
        .arg(scratch)
        .status()
        .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
    if !status.success() {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        return Err(format!(
            "merging the {target} corpus failed ({status}):\n{}",
            tail(&text, 20)
        ));
    }
    for old in files_of(&corpus)
        .into_iter()
        .filter(|p| is_generated(&name_of(p)))
    {
        std::fs::remove_file(&old).map_err(|e| format!("cannot remove {}: {e}", old.display()))?;
    }
    for new in files_of(&min)
        .into_iter()
        .filter(|p| is_generated(&name_of(p)))
    {
        std::fs::copy(&new, corpus.join(name_of(&new)))
            .map_err(|e| format!("cannot copy {}: {e}", new.display()))?;
    }
    let files = files_of(&corpus);
    let bytes = files
        .iter()
        .filter_map(|p| p.metadata().ok())
        .map(|m| m.len())
        .sum();
    Ok((files.len(), bytes))
}

/// What one target's campaign did.
struct Report {
    runs: u64,
    wall: Duration,
    cpu: Duration,
    findings: Vec<String>,
    why_stopped: String,
    partial: bool,
}

fn campaign(dir: &Path, bin: &Path, target: &str, opts: &Opts) -> Result<Report, String> {
    let mut findings = Vec::new();
    // Panic sites found so far (a site found twice stops the target).
    let mut sites = BTreeSet::new();
    let regressions = dir.join("regressions").join(target);
    let artifacts = dir.join("artifacts").join(target);
    std::fs::create_dir_all(&artifacts)
        .map_err(|e| format!("cannot create {}: {e}", artifacts.display()))?;
    let logs = dir.join("target/fuzz-long");
    std::fs::create_dir_all(&logs).map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
    let prefix = format!("-artifact_prefix={}/", artifacts.display());
    if input_count(&regressions) > 0 {
        let log = logs.join(format!("{target}.regressions.log"));
        let args = vec![
            "-runs=0".to_string(),
            "-rss_limit_mb=2048".into(),
            prefix.clone(),
            regressions.display().to_string(),
        ];
        let (end, _, _, text) = fuzz_once(bin, &args, &log, Duration::MAX)?;
        if let End::Finding = end {
            eprintln!(
                "--- a saved regression of {target} fails:\n{}",
                tail(&text, 30)
            );
            let site = panic_site(&text).unwrap_or_default();
            // Fuzzing will likely find it again: once is enough.
            sites.insert(site.split(": ").next().unwrap_or_default().to_string());
            findings.push(format!("regression fails: {site}"));
        }
    }

    let scratch = logs.join("corpus").join(target);
    fresh_dir(&scratch)?;
    let seeds = dir.join("corpus").join(target);
    let start = Instant::now();
    let (mut runs, mut cpu) = (0u64, Duration::ZERO);
    let cpu_limit = Duration::from_secs(MAX_CPU_SECS);
    let why_stopped;
    let mut partial = false;
    loop {
        let wall_left = opts
            .max_seconds
            .map(|s| s.saturating_sub(start.elapsed().as_secs()));
        if runs >= MAX_RUNS {
            why_stopped = format!("{MAX_RUNS} runs");
            break;
        }
        if cpu >= cpu_limit {
            why_stopped = format!("one CPU-hour ({MAX_CPU_SECS} CPU s)");
            break;
        }
        if wall_left == Some(0) {
            why_stopped = format!("--max-seconds {}", opts.max_seconds.unwrap_or(0));
            partial = true;
            break;
        }
        let mut args = vec![
            format!("-runs={}", MAX_RUNS - runs),
            "-rss_limit_mb=2048".to_string(),
            "-timeout=60".into(),
            "-print_final_stats=1".into(),
            prefix.clone(),
        ];
        if let Some(w) = wall_left {
            args.push(format!("-max_total_time={w}"));
        }
        args.push(scratch.display().to_string());
        args.push(seeds.display().to_string());
        let log = logs.join(format!("{target}.log"));
        let (end, r, c, text) = fuzz_once(bin, &args, &log, cpu_limit - cpu)?;
        runs += r;
        cpu += c;
        if let End::Finding = end {
            let site = panic_site(&text).unwrap_or_else(|| "no panic message".into());
            let saved = super::artifact(&text).unwrap_or_else(|| "(no input saved)".into());
            eprintln!(
                "--- {target}: finding #{}: {site}\n    input: {saved}\n{}",
                findings.len() + 1,
                tail(&text, 30)
            );
            findings.push(format!("{site} ({saved})"));
            // Same place in the code (the message may hold input-dependent values).
            let place = site.split(": ").next().unwrap_or_default().to_string();
            if !sites.insert(place) || findings.len() >= MAX_FINDINGS {
                why_stopped = "findings (the same panic site twice, or too many)".into();
                partial = true;
                break;
            }
        }
    }
    Ok(Report {
        runs,
        wall: start.elapsed(),
        cpu,
        findings,
        why_stopped,
        partial,
    })
}

/// `cargo xtask fuzz --long [--max-seconds N] [--target T]`.
pub fn run(root: &Path, opts: &Opts) -> Result<(), String> {
    let dir = root.join("fuzz");
    let version = ensure_cargo_fuzz(&dir)?;
    let mut list = targets(&dir)?;
    if let Some(t) = &opts.target {
        if !list.contains(t) {
            return Err(format!(
                "no fuzz target {t:?} (targets: {})",
                list.join(", ")
            ));
        }
        list = vec![t.clone()];
    }
    eprintln!(
        "fuzz --long: {version}; {}; per target {MAX_RUNS} runs or {MAX_CPU_SECS} CPU s{}",
        list.join(", "),
        opts.max_seconds
            .map(|s| format!(" or {s} s of wall time (partial)"))
            .unwrap_or_default()
    );
    let mut build = vec!["fuzz", "build"];
    build.extend(super::SANITIZER);
    crate::step("cargo +nightly fuzz build -s none", || {
        crate::run_status(nightly(&dir, &build))
    })?;

    let mut campaigns = Vec::new();
    for target in &list {
        let bin = fuzz_bin(&dir, "target", target)?;
        eprintln!("==> fuzz-long {target}");
        let r = campaign(&dir, &bin, target, opts)?;
        let scratch = dir.join("target/fuzz-long/corpus").join(target);
        let (files, bytes) = minimize(&dir, &bin, target, &scratch)?;
        let line = format!(
            "fuzz-long {target}: {} runs in {} s, {} findings ({:.0} CPU s, {:.0} runs/s; {}: {}; corpus {files} files, {:.1} KiB)",
            r.runs,
            r.wall.as_secs(),
            r.findings.len(),
            r.cpu.as_secs_f64(),
            r.runs as f64 / r.wall.as_secs_f64().max(1e-9),
            if r.partial {
                "partial, stopped by"
            } else {
                "complete, reached"
            },
            r.why_stopped,
            bytes as f64 / 1024.0
        );
        println!("{line}");
        for f in &r.findings {
            println!("    finding: {f}");
        }
        campaigns.push((target.clone(), r));
    }

    // Every corpus input and regression once more, under AddressSanitizer.
    let asan_dir = "target/asan";
    crate::step("cargo +nightly fuzz build (AddressSanitizer)", || {
        let mut b = vec!["fuzz", "build", "--target-dir", asan_dir];
        if let Some(t) = &opts.target {
            b.push(t);
        }
        crate::run_status(nightly(&dir, &b))
    })?;
    let mut asan_failed = Vec::new();
    for target in &list {
        let bin = fuzz_bin(&dir, asan_dir, target)?;
        let mut args = vec!["-runs=0".to_string(), "-rss_limit_mb=2048".into()];
        args.push(format!(
            "-artifact_prefix={}/",
            dir.join("artifacts").join(target).display()
        ));
        args.push(dir.join("corpus").join(target).display().to_string());
        let reg = dir.join("regressions").join(target);
        if input_count(&reg) > 0 {
            args.push(reg.display().to_string());
        }
        let log = dir
            .join("target/fuzz-long")
            .join(format!("{target}.asan.log"));
        let (end, n, _, text) = fuzz_once(&bin, &args, &log, Duration::MAX)?;
        match end {
            End::Budget => println!(
                "fuzz-long {target}: corpus and regressions pass under AddressSanitizer ({n} runs)"
            ),
            End::Finding => {
                eprintln!("--- {target} under AddressSanitizer:\n{}", tail(&text, 40));
                asan_failed.push(target.clone());
            }
        }
    }

    let found: Vec<String> = campaigns
        .iter()
        .filter(|(_, r)| !r.findings.is_empty())
        .map(|(t, r)| format!("{t} ({})", r.findings.len()))
        .chain(
            asan_failed
                .iter()
                .map(|t| format!("{t} (AddressSanitizer replay)")),
        )
        .collect();
    crate::none_failed("findings", &found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_arguments() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse_args(&s(&["--long"])),
            Ok(Opts {
                max_seconds: None,
                target: None
            })
        );
        assert_eq!(
            parse_args(&s(&[
                "--long",
                "--max-seconds",
                "480",
                "--target",
                "transitions"
            ])),
            Ok(Opts {
                max_seconds: Some(480),
                target: Some("transitions".into())
            })
        );
        assert!(parse_args(&s(&[])).is_err());
        assert!(parse_args(&s(&["--long", "--max-seconds", "0"])).is_err());
        assert!(parse_args(&s(&["--long", "--max-seconds"])).is_err());
        assert!(parse_args(&s(&["--long", "--target", "a", "--target", "b"])).is_err());
        assert!(parse_args(&s(&["--short"])).is_err());
    }

    #[test]
    fn generated_names() {
        assert!(is_generated("da39a3ee5e6b4b0d3255bfef95601890afd80709"));
        assert!(!is_generated("long-mixed"));
        assert!(!is_generated("da39a3ee5e6b4b0d3255bfef95601890afd8070"));
        assert!(!is_generated("za39a3ee5e6b4b0d3255bfef95601890afd80709"));
    }
}
