//! Replay every committed input through its target's check, on the stable toolchain:
//! `fuzz/corpus/<target>/*` (the seed corpus) and `fuzz/regressions/<target>/*` (inputs that
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

#[test]
fn seed_corpus_passes_every_check() {
    for (target, _) in runlease_fuzz::TARGETS {
        let n = inputs("corpus", target).len();
        assert!(
            (3..=10).contains(&n),
            "fuzz/corpus/{target} holds {n} seeds, expected 3-10"
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
