//! `cargo xtask fuzz-smoke [--seconds N]`: run every cargo-fuzz target of `fuzz/` for a
//! short, fixed time (issue #4, item 2).
//!
//! 1. Makes sure `cargo +nightly fuzz` works, installing `cargo-fuzz` with
//!    `cargo install cargo-fuzz --locked` if it is missing (it says so first).
//! 2. Builds every target once (`cargo +nightly fuzz build -s none`, see [`SANITIZER`]).
//! 3. Per target, in `fuzz/`:
//!    - replays `fuzz/regressions/<target>/` if it holds inputs (`-runs=0`: each input once;
//!      inputs that once found a bug must keep passing);
//!    - fuzzes for N seconds from the committed seed corpus `fuzz/corpus/<target>/`, writing
//!      the inputs it discovers to a scratch corpus under `fuzz/target/fuzz-smoke/` (so the
//!      committed corpus never grows by accident);
//!    - prints `fuzz <target>: ok (<runs> runs in <N> s)`, or the tail of libFuzzer's output
//!      and the saved crash input (`fuzz/artifacts/<target>/`) when it fails.
//! 4. Fails (exit 1) if any target crashed, hung or failed a regression.
//!
//! Targets are built without AddressSanitizer ([`SANITIZER`]); `cargo xtask fuzz --long`
//! ([`long`]) is the long campaign, which also replays everything it keeps under ASan.

pub mod long;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Default seconds per target.
pub const DEFAULT_SECONDS: u64 = 30;

/// Parse `[--seconds N]`.
pub fn parse_args(rest: &[String]) -> Result<u64, String> {
    match rest {
        [] => Ok(DEFAULT_SECONDS),
        [flag, n] if flag == "--seconds" => match n.parse::<u64>() {
            Ok(s) if s > 0 => Ok(s),
            _ => Err(format!("--seconds needs a positive integer, got {n:?}")),
        },
        _ => Err(format!(
            "unexpected arguments to `fuzz-smoke`: {rest:?} (usage: fuzz-smoke [--seconds N])"
        )),
    }
}

/// The `cargo fuzz build` / `run` arguments choosing the sanitizer: none.
///
/// The code under test (lease-core, lease-fs's `SimFs`, the checks) has no `unsafe`, so
/// AddressSanitizer can only catch bugs in the standard library or serde_json, while it
/// made `read_folder` and `transitions` about 8 times slower (its allocator records a stack
/// trace per allocation, and these targets allocate a lot). Fuzzing without it finds more
/// per CPU-second; `fuzz --long` still replays every corpus input under ASan. Debug
/// assertions and overflow checks stay on (cargo-fuzz's default).
pub const SANITIZER: [&str; 2] = ["-s", "none"];

/// A `cargo +nightly ...` command run from `dir`.
///
/// Uses the rustup proxy `cargo` from `PATH` (not `$CARGO`, which names the stable toolchain's
/// own binary and does not understand `+nightly`), and drops the variables the outer cargo set
/// for this process so they do not pin the nested build to the stable toolchain.
fn nightly(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.arg("+nightly").args(args).current_dir(dir);
    without_outer_toolchain(&mut cmd);
    cmd
}

/// Variables the outer `cargo xtask` set that would pin a nested cargo to its toolchain.
const OUTER_TOOLCHAIN_VARS: [&str; 5] = [
    "CARGO",
    "RUSTUP_TOOLCHAIN",
    "RUSTC",
    "RUSTDOC",
    "RUSTC_WRAPPER",
];

fn without_outer_toolchain(cmd: &mut Command) {
    for var in OUTER_TOOLCHAIN_VARS {
        cmd.env_remove(var);
    }
}

/// The arguments of `cargo fuzz run` for `target` with the sanitizer, over the corpus
/// folders `corpora` (the first is where new inputs go), then libFuzzer's `flags`.
fn fuzz_run_args(target: &str, corpora: &[&Path], flags: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "fuzz".into(),
        "run".into(),
        SANITIZER[0].into(),
        SANITIZER[1].into(),
        target.to_string(),
    ];
    args.extend(corpora.iter().map(|p| p.display().to_string()));
    args.push("--".into());
    args.extend(flags.iter().map(|f| f.to_string()));
    args
}

/// `cargo +nightly <args>` in `dir`, stdin closed: its stdout when it succeeds, else
/// `Ok(Err(stderr))`; `Err` if it cannot be run at all.
fn nightly_output(dir: &Path, args: &[&str]) -> Result<Result<String, String>, String> {
    let out = nightly(dir, args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `cargo +nightly {}`: {e}", args.join(" ")))?;
    Ok(if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    })
}

fn cargo_fuzz_version(dir: &Path) -> Option<String> {
    let out = nightly_output(dir, &["fuzz", "--version"]).ok()?.ok()?;
    Some(out.trim().to_string())
}

/// `cargo +nightly fuzz` works, or install cargo-fuzz.
fn ensure_cargo_fuzz(dir: &Path) -> Result<String, String> {
    if let Err(stderr) = nightly_output(dir, &["--version"])? {
        return Err(format!(
            "the nightly toolchain is not usable (`cargo +nightly --version` failed: {stderr}); install it with `rustup toolchain install nightly`"
        ));
    }
    if let Some(v) = cargo_fuzz_version(dir) {
        return Ok(v);
    }
    eprintln!(
        "fuzz-smoke: `cargo +nightly fuzz` is not available; installing it from crates.io with \
         `cargo install cargo-fuzz --locked` (this compiles cargo-fuzz and takes a few minutes)"
    );
    let mut install = Command::new("cargo");
    install.args(["install", "cargo-fuzz", "--locked"]);
    without_outer_toolchain(&mut install);
    crate::run_status(install)?;
    cargo_fuzz_version(dir)
        .ok_or_else(|| "cargo-fuzz was installed but `cargo +nightly fuzz --version` still fails (is ~/.cargo/bin on PATH?)".to_string())
}

/// The targets cargo-fuzz knows (`cargo fuzz list`), in order.
fn targets(dir: &Path) -> Result<Vec<String>, String> {
    let out = nightly_output(dir, &["fuzz", "list"])?
        .map_err(|stderr| format!("`cargo +nightly fuzz list` failed: {stderr}"))?;
    let list: Vec<String> = out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    if list.is_empty() {
        return Err("`cargo +nightly fuzz list` lists no target".into());
    }
    Ok(list)
}

/// Executions reported by libFuzzer: `stat::number_of_executed_units: N` (with
/// `-print_final_stats=1`), else the last `Done N runs` or `#N` status line.
fn executed_runs(stderr: &str) -> Option<u64> {
    let stat = stderr.lines().find_map(|l| {
        l.trim()
            .strip_prefix("stat::number_of_executed_units:")
            .and_then(|n| n.trim().parse().ok())
    });
    stat.or_else(|| {
        stderr.lines().rev().find_map(|l| {
            let l = l.trim();
            if let Some(rest) = l.strip_prefix("Done ") {
                return rest.split_whitespace().next()?.parse().ok();
            }
            let n = l.strip_prefix('#')?.split_whitespace().next()?;
            n.parse().ok()
        })
    })
}

/// Where a finding happened: the Rust panic (`<file:line:col>: <first line of message>`),
/// else libFuzzer's own error line (timeout, out-of-memory, sanitizer report).
fn panic_site(output: &str) -> Option<String> {
    let mut lines = output.lines();
    while let Some(l) = lines.next() {
        if let Some((_, at)) = l.split_once("panicked at ") {
            let at = at.trim_end_matches(':').trim();
            let msg = lines.next().unwrap_or_default().trim();
            return Some(format!("{at}: {msg}"));
        }
    }
    output
        .lines()
        .find_map(|l| {
            l.split_once("ERROR: libFuzzer: ")
                .map(|(_, e)| format!("libFuzzer: {}", e.trim()))
        })
        .or_else(|| {
            output.lines().find_map(|l| {
                l.split_once("ERROR: AddressSanitizer: ")
                    .map(|(_, e)| format!("AddressSanitizer: {}", e.trim()))
            })
        })
}

/// The crash input libFuzzer saved, if it says so.
fn artifact(stderr: &str) -> Option<String> {
    stderr.lines().find_map(|l| {
        l.split_once("Test unit written to ")
            .map(|(_, p)| p.trim().to_string())
    })
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Non-hidden files of `dir` (none if it does not exist).
fn input_count(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.filter_map(Result::ok)
            .filter(|e| e.path().is_file())
            .filter(|e| {
                let name = e.file_name();
                let name = name.to_string_lossy();
                !name.starts_with('.') && !name.ends_with(".md")
            })
            .count()
    })
}

/// Run one libFuzzer invocation, capturing its output. `Ok(stderr)` on exit 0.
fn run_fuzzer(dir: &Path, args: &[String]) -> Result<String, (String, String)> {
    let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut cmd = nightly(dir, &arg_refs);
    let shown = format!("cargo +nightly {}", args.join(" "));
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| (format!("could not start {shown}: {e}"), String::new()))?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stderr)
    } else {
        Err((
            format!("{shown} exited with {}", out.status),
            format!("{stdout}{stderr}"),
        ))
    }
}

fn report_failure(target: &str, what: &str, why: &str, output: &str) {
    println!("fuzz {target}: FAILED ({what})");
    eprintln!("--- {why}; last lines of its output:\n{}", tail(output, 40));
    if let Some(a) = artifact(output) {
        eprintln!(
            "--- crash input saved to {a}\n    reproduce: cd fuzz && cargo +nightly fuzz run {target} {a}\n    \
             triage:    cargo run --manifest-path fuzz/Cargo.toml --example show -- {target} {a}"
        );
    }
}

/// `cargo xtask fuzz-smoke [--seconds N]`.
pub fn smoke(root: &Path, seconds: u64) -> Result<(), String> {
    let dir: PathBuf = root.join("fuzz");
    let version = ensure_cargo_fuzz(&dir)?;
    let targets = targets(&dir)?;
    eprintln!(
        "fuzz-smoke: {version}; {} targets ({}), {seconds} s each",
        targets.len(),
        targets.join(", ")
    );
    crate::step("cargo +nightly fuzz build -s none", || {
        let mut build = vec!["fuzz", "build"];
        build.extend(SANITIZER);
        crate::run_status(nightly(&dir, &build))
    })?;

    let start = Instant::now();
    let mut failed = Vec::new();
    for target in &targets {
        // Inputs that once found a bug: each must pass.
        let regressions = dir.join("regressions").join(target);
        let n = input_count(&regressions);
        if n > 0 {
            let args = fuzz_run_args(target, &[&regressions], &["-runs=0", "-rss_limit_mb=2048"]);
            match run_fuzzer(&dir, &args) {
                Ok(_) => println!("fuzz {target}: {n} regression inputs pass"),
                Err((why, output)) => {
                    report_failure(target, "a saved regression input fails", &why, &output);
                    failed.push(format!("{target} (regressions)"));
                }
            }
        }

        // Fuzz from the seed corpus; new inputs go to a scratch corpus, emptied first.
        let scratch = dir.join("target/fuzz-smoke/corpus").join(target);
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch)
            .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
        let seeds = dir.join("corpus").join(target);
        if input_count(&seeds) == 0 {
            return Err(format!("no seed corpus in {}", seeds.display()));
        }
        let max_time = format!("-max_total_time={seconds}");
        let args = fuzz_run_args(
            target,
            &[&scratch, &seeds],
            &[
                &max_time,
                "-rss_limit_mb=2048",
                // One input taking this long is a hang: report it as a failure.
                "-timeout=60",
                "-print_final_stats=1",
            ],
        );
        eprintln!("==> fuzz {target} ({seconds} s)");
        let t = Instant::now();
        match run_fuzzer(&dir, &args) {
            Ok(stderr) => {
                let secs = t.elapsed().as_secs();
                match executed_runs(&stderr) {
                    Some(runs) => println!("fuzz {target}: ok ({runs} runs in {secs} s)"),
                    None => println!("fuzz {target}: ok (in {secs} s)"),
                }
            }
            Err((why, output)) => {
                report_failure(target, "crash, hang or invariant violation", &why, &output);
                failed.push(target.clone());
            }
        }
    }
    eprintln!(
        "fuzz-smoke: {} targets in {:.0} s",
        targets.len(),
        start.elapsed().as_secs_f64()
    );
    crate::none_failed("fuzz targets failed", &failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_runs_from_libfuzzer_output() {
        let stats = "#1024\tpulse  cov: 10\nDone 5000 runs in 3 second(s)\nstat::number_of_executed_units: 5001\n";
        assert_eq!(executed_runs(stats), Some(5001));
        assert_eq!(
            executed_runs("#77\tNEW cov: 3\nDone 90 runs in 1 second(s)\n"),
            Some(90)
        );
        assert_eq!(executed_runs("#12\tINITED cov: 3\n"), Some(12));
        assert_eq!(executed_runs("nothing"), None);
        assert_eq!(
            artifact("==1== ERROR\nTest unit written to fuzz/artifacts/x/crash-ab\n"),
            Some("fuzz/artifacts/x/crash-ab".to_string())
        );
    }

    #[test]
    fn names_the_panic_site() {
        let out = "INFO: seed\nthread '<unnamed>' panicked at src/folder.rs:612:9:\na claim succeeded over an invalid record\nnote: run with\n==1== ERROR: libFuzzer: deadly signal\n";
        assert_eq!(
            panic_site(out).as_deref(),
            Some("src/folder.rs:612:9: a claim succeeded over an invalid record")
        );
        assert_eq!(
            panic_site("==7== ERROR: libFuzzer: timeout after 61 seconds\n").as_deref(),
            Some("libFuzzer: timeout after 61 seconds")
        );
        assert_eq!(panic_site("Done 5 runs"), None);
    }

    #[test]
    fn seconds_argument() {
        assert_eq!(parse_args(&[]), Ok(DEFAULT_SECONDS));
        assert_eq!(parse_args(&["--seconds".into(), "20".into()]), Ok(20));
        assert!(parse_args(&["--seconds".into(), "0".into()]).is_err());
        assert!(parse_args(&["--seconds".into()]).is_err());
        assert!(parse_args(&["-s".into(), "3".into()]).is_err());
    }
}
