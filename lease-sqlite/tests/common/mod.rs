//! Helpers shared by the integration tests.
#![allow(dead_code)]

use lease_core::{Generation, RunId};
use lease_sqlite::{Store, StoreError, StoreOptions};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

pub fn run() -> RunId {
    RunId::new("test-run").unwrap()
}

pub fn g(n: u64) -> Generation {
    Generation::new(n).unwrap()
}

pub fn create() -> StoreOptions {
    StoreOptions {
        create: true,
        expect: None,
    }
}

/// Open (creating if needed) and pass an empty seal check.
pub fn open_store(path: &Path) -> Store {
    Store::open(&run(), path, create())
        .unwrap()
        .check_seal(None, None)
        .unwrap()
}

/// Every entry under `dir` with its content (files), link target (symlinks) or `<dir>`.
pub fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let p = entry.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let ft = entry.file_type().unwrap();
            if ft.is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(rel, format!("symlink -> {}", t.display()).into_bytes());
            } else if ft.is_dir() {
                out.insert(rel, b"<dir>".to_vec());
                walk(root, &p, out);
            } else {
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    walk(dir, dir, &mut out);
    out
}

/// Assert `err` has `code`, and that its message names `path`.
pub fn assert_refused(err: &StoreError, code: &str, path: &Path) {
    assert_eq!(err.code().as_str(), code, "unexpected error: {err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "message does not name the file {}: {msg}",
        path.display()
    );
    assert!(
        msg.contains("test-run"),
        "message does not name the run: {msg}"
    );
}

/// This test binary, re-executed to run only `test` (in which `env` selects the child role).
pub fn child_command(test: &str, env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([test, "--exact", "--nocapture", "--test-threads=1", "-q"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// A small deterministic PRNG (xorshift64*) for seeded delays and bytes.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}
