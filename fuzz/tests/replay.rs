//! Replay every committed input through its target's check, on the stable toolchain:
//! `fuzz/corpus/<target>/*` (the seeds, and the minimized corpus `cargo xtask fuzz --long`
//! merged in) and `fuzz/regressions/<target>/*` (inputs that
//! once found a bug; each must pass once the bug is fixed).
//!
//! `cargo test --manifest-path fuzz/Cargo.toml`. A regression that still fails names its
//! file; `RUNLEASE_FUZZ_SKIP_REGRESSIONS=1` replays the corpus only.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

fn inputs(kind: &str, target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(kind)
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_file())
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter(|e| !e.file_name().to_string_lossy().ends_with(".md"))
        .map(|e| {
            let bytes = std::fs::read(e.path()).expect("readable input");
            (e.path().display().to_string(), bytes)
        })
        .collect();
    out.sort();
    out
}

fn replay(kind: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for (target, check) in runlease_fuzz::TARGETS {
        for (path, bytes) in inputs(kind, target) {
            if catch_unwind(AssertUnwindSafe(|| check(&bytes))).is_err() {
                failures.push(path);
            }
        }
    }
    failures
}

/// Whether a corpus file was named by libFuzzer (a SHA-1 in hex) rather than written by
/// `examples/gen_corpus.rs` (a seed with a descriptive name).
fn is_generated(path: &str) -> bool {
    let name = Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.len() == 40 && name.bytes().all(|b| b.is_ascii_hexdigit())
}

#[test]
fn seed_corpus_passes_every_check() {
    for (target, _) in runlease_fuzz::TARGETS {
        let all = inputs("corpus", target);
        let seeds = all.iter().filter(|(p, _)| !is_generated(p)).count();
        assert!(
            (3..=10).contains(&seeds),
            "fuzz/corpus/{target} holds {seeds} seeds, expected 3-10"
        );
        // The minimized corpus `cargo xtask fuzz --long` merges in stays small enough to
        // commit.
        let bytes: usize = all.iter().map(|(_, b)| b.len()).sum();
        assert!(
            bytes < 2 << 20,
            "fuzz/corpus/{target} holds {bytes} bytes, more than 2 MiB"
        );
    }
    let failures = replay("corpus");
    assert!(failures.is_empty(), "seed inputs fail: {failures:#?}");
}

#[test]
fn regressions_pass_once_fixed() {
    if std::env::var_os("RUNLEASE_FUZZ_SKIP_REGRESSIONS").is_some_and(|v| !v.is_empty()) {
        return;
    }
    let failures = replay("regressions");
    assert!(
        failures.is_empty(),
        "saved fuzz regressions still fail (see fuzz/regressions/README.md): {failures:#?}"
    );
}
