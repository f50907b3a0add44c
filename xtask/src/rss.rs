//! `cargo xtask rss`: peak resident memory of `runlease verify`, `events` and `doctor` on
//! runs of 10,000 and 100,000 events (issue #15: readers stream the log, so memory stays
//! flat as it grows). Each command runs under a fresh probe process (`xtask rss-probe`),
//! whose only child is the command, so `getrusage(RUSAGE_CHILDREN)` is that command's own
//! peak. Prints one line per command and exits non-zero when the 100k/10k ratio of any of
//! them is above `--max-ratio` (default 1.5).

use lease_core::{Digest, Event, FileRef, Generation, Identity, RunId, Sequence, Timestamp};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

/// The sizes measured.
const SIZES: [u64; 2] = [10_000, 100_000];

/// Parse `[--max-ratio R]`.
pub fn parse_args(rest: &[String]) -> Result<f64, String> {
    match rest {
        [] => Ok(1.5),
        [flag, v] if flag == "--max-ratio" => v
            .parse()
            .map_err(|_| format!("--max-ratio takes a number, got {v:?}")),
        _ => Err(format!("unexpected arguments to `rss`: {rest:?}")),
    }
}

/// `xtask rss-probe CMD ARGS...`: run the command (stdout to /dev/null), then print its
/// peak RSS in KiB on stdout; exit with its code.
pub fn probe(cmd: &[String]) -> ExitCode {
    let Some((prog, args)) = cmd.split_first() else {
        eprintln!("rss-probe: no command");
        return ExitCode::FAILURE;
    };
    let status = match Command::new(prog).args(args).stdout(Stdio::null()).status() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rss-probe: cannot start {prog}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let usage = match nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("rss-probe: getrusage: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Linux reports ru_maxrss in KiB.
    println!("{}", usage.max_rss());
    match status.code() {
        Some(0) => ExitCode::SUCCESS,
        _ => {
            eprintln!("rss-probe: {prog} {args:?} exited with {status}");
            ExitCode::FAILURE
        }
    }
}

/// Write `n` valid events of generation 1 by `owner` (0600, no fsync: setup only).
fn prefill(root: &Path, run: &RunId, owner: &Identity, n: u64) -> Result<(), String> {
    let mut prev: Option<Digest> = None;
    let g1 = Generation::new(1).ok_or("generation 1")?;
    let ty = Identity::new("rss.prefill").map_err(|e| e.to_string())?;
    for s in 1..=n {
        let ev = Event {
            run_id: run.clone(),
            sequence: Sequence::new(s).ok_or("sequence")?,
            generation: g1,
            owner_id: owner.clone(),
            event_type: ty.clone(),
            // About 200 bytes of payload per event, like a small step record.
            payload: serde_json::json!({ "step": s, "note": "x".repeat(160) }),
            timestamp: Timestamp::from_unix_millis(1_796_169_600_000 + s).ok_or("time")?,
            prev_hash: prev.take(),
        };
        let bytes = lease_core::encode(&ev).map_err(|e| e.to_string())?;
        prev = Some(Digest::of(&bytes));
        let path = root.join(FileRef::Event(ev.sequence).path());
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        f.write_all(&bytes)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// Peak RSS in KiB of `cmd` run to its end under a fresh `xtask rss-probe` (this xtask
/// binary): only its program and arguments are passed on (not its stdio, environment or
/// folder), and it must exit 0. Used by `cargo xtask rss` and by `cargo xtask bench`'s
/// peak-RSS lines.
pub(crate) fn peak_kib(cmd: &Command) -> Result<u64, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this xtask: {e}"))?;
    let out = Command::new(exe)
        .arg("rss-probe")
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .output()
        .map_err(|e| format!("cannot start the probe: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .map_err(|e| format!("probe output: {e}"))
}

/// `cargo xtask rss`.
pub fn run(root: &Path, max_ratio: f64) -> Result<(), String> {
    let runlease = crate::build_runlease(root)?;
    let target = crate::target_dir(root);
    let work = target.join("rss").join(std::process::id().to_string());
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;

    let commands: [&[&str]; 3] = [&["verify"], &["events", "--json"], &["doctor", "--json"]];
    let mut table: Vec<Vec<u64>> = vec![Vec::new(); commands.len()];
    for n in SIZES {
        let dir = work.join(format!("run-{n}"));
        let dir_s = dir.display().to_string();
        // A real run (generation 1 claimed and released), then its log filled directly.
        let made = Command::new(&runlease)
            .args(["--quiet", "run", &dir_s, "--", "true"])
            .status()
            .map_err(|e| format!("runlease run: {e}"))?;
        if !made.success() {
            return Err(format!("runlease run {dir_s} -- true exited with {made}"));
        }
        let epoch: lease_core::EpochRecord = lease_core::decode(
            &std::fs::read(dir.join(FileRef::Epoch(Generation::FIRST).path()))
                .map_err(|e| format!("epoch 1: {e}"))?,
        )
        .map_err(|e| e.to_string())?;
        let run_id = RunId::new(format!("run-{n}")).map_err(|e| e.to_string())?;
        prefill(&dir, &run_id, &epoch.owner_id, n)?;
        for (k, c) in commands.iter().enumerate() {
            table[k].push(peak_kib(Command::new(&runlease).args(*c).arg(&dir))?);
        }
    }
    let mut worst: f64 = 0.0;
    for (k, c) in commands.iter().enumerate() {
        let ratio = table[k][1] as f64 / table[k][0] as f64;
        worst = worst.max(ratio);
        println!(
            "rss: runlease {:<14} peak {:>7} KiB at {} events, {:>7} KiB at {} events: ratio {ratio:.2}",
            c.join(" "),
            table[k][0],
            SIZES[0],
            table[k][1],
            SIZES[1]
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    if worst > max_ratio {
        return Err(format!(
            "peak memory grows with the log: worst ratio {worst:.2} > {max_ratio}"
        ));
    }
    Ok(())
}
