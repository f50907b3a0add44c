//! `cargo xtask containment`: issue #29's checks in one place, with their figures.
//!
//! - process containment: an unprivileged owner with no cgroup (`setpriv` to uid 65534)
//!   and a root owner with a cgroup v2 subtree; double-forked `setsid`, `env -i` and `nohup`
//!   grandchildren after a normal exit, a fence and a crash; another user's cgroup and
//!   processes with the run's name never touched; forged command records at a bounded cost
//!   (`lease-cli/tests/containment/`);
//! - the stop signals (`lease-cli/tests/escalation.rs`);
//! - the store socket: mutual authentication, an impostor server, hostile clients, and
//!   the flood figures `socket-flood: conns=N owner_fenced=0 rss_ratio=R latency_ratio=L`
//!   (`lease-cli/tests/socket_{auth,flood}.rs`, `lease-run/tests/{store_socket,socket_cap}.rs`);
//! - hostile store files (`lease-sqlite/tests/hostile_store.rs`).
//!
//! What the machine can do decides what is required: as root with `setpriv` every case
//! must run (`RUNLEASE_REQUIRE_CONTAINMENT=1`, so a skipped case fails); elsewhere the
//! cases that need them print why they skip.

use crate::{cargo, run_status};
use std::process::Command;

/// Whether this machine can run every containment case: root (to create cgroups and
/// switch users) with `setpriv` on `PATH`.
pub(crate) fn capable() -> Result<(), String> {
    let root = proc_euid() == Some(0);
    let setpriv = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    match (root, setpriv) {
        (true, true) => Ok(()),
        (false, _) => Err("not root: the other-user and cgroup cases skip".into()),
        (true, false) => Err("no setpriv (util-linux): the unprivileged cases skip".into()),
    }
}

/// The effective uid, read from `/proc/self/status` (xtask has no libc dependency).
fn proc_euid() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The test targets, by package.
const TARGETS: &[(&str, &[&str])] = &[
    (
        "lease-cli",
        &["containment", "escalation", "socket_auth", "socket_flood"],
    ),
    ("lease-run", &["store_socket", "socket_cap"]),
    ("lease-sqlite", &["hostile_store"]),
];

/// Run every target with its output shown (the figure lines), requiring every case where
/// the machine can run it.
pub(crate) fn run() -> Result<(), String> {
    let require = match capable() {
        Ok(()) => true,
        Err(why) => {
            eprintln!("containment: note: {why}");
            false
        }
    };
    for (package, tests) in TARGETS {
        let mut args = vec!["test", "-p", package, "--all-features"];
        for t in *tests {
            args.extend(["--test", t]);
        }
        args.extend(["--", "--nocapture", "--test-threads", "2"]);
        let mut cmd = cargo(&args);
        if require {
            cmd.env("RUNLEASE_REQUIRE_CONTAINMENT", "1");
        }
        run_status(cmd)?;
    }
    Ok(())
}
