//! Containment of a run's commands: what runlease signals and removes, and what it leaves
//! alone (issue #29).

#[path = "../common/mod.rs"]
mod common;

mod cgroups;
mod no_cgroup;
mod records;

use common::*;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// Whether this test may create and chown cgroups (root, a cgroup2 mount below which this
/// process's own cgroup is writable): `Some(own cgroup dir)`, or `None` after printing why
/// it is skipped (a failure when `RUNLEASE_REQUIRE_CONTAINMENT=1`).
pub(crate) fn cgroup_test_parent(test: &str) -> Option<std::path::PathBuf> {
    let why = if !rustix::process::geteuid().is_root() {
        Some("not root".to_string())
    } else {
        match lease_run::cgroup::own_dir() {
            None => Some("no cgroup2 mount (or no cgroup v2 path)".to_string()),
            Some(p) => {
                // One name per call: the tests of this file run in parallel in one process.
                static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let probe = p.join(format!("runlease-probe-{}-{n}", std::process::id()));
                match std::fs::create_dir(&probe) {
                    Ok(()) => {
                        let _ = std::fs::remove_dir(&probe);
                        return Some(p);
                    }
                    Err(e) => Some(format!("cannot create a cgroup below {}: {e}", p.display())),
                }
            }
        }
    };
    let why = why.unwrap_or_default();
    assert!(
        std::env::var("RUNLEASE_REQUIRE_CONTAINMENT").as_deref() != Ok("1"),
        "{test}: RUNLEASE_REQUIRE_CONTAINMENT=1 but {why}"
    );
    eprintln!("SKIPPED {test}: {why}");
    None
}

/// `runlease ARGS` to completion, retried when the binary is missing for a moment (another
/// build replacing it).
pub(crate) fn cgroup_runlease(wrapper: &[&str], args: &[&str]) -> Output {
    for _ in 0..50 {
        match cmd_under(wrapper, args).output() {
            Ok(o) => return o,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(e) => panic!("spawn runlease: {e}"),
        }
    }
    panic!("runlease stayed missing");
}

/// Write a command record of generation `g` for the dead pid `pid` (0600, this uid's)
/// naming `cgroup`.
pub(crate) fn records_forge(
    dir: &Path,
    g: u64,
    pid: u32,
    cgroup: Option<lease_core::CommandCgroup>,
) {
    let g = lease_core::Generation::new(g).unwrap();
    let rec = lease_core::CommandRecord {
        run_id: lease_core::RunId::new(dir.file_name().unwrap().to_str().unwrap()).unwrap(),
        generation: g,
        pid,
        pgid: pid,
        start_time: 1,
        boot_id: lease_core::Identity::new(lease_fs::probe::boot_id().unwrap()).unwrap(),
        argv: vec!["sleep".into(), "300".into()],
        started_at: lease_core::Timestamp::from_unix_millis(1_796_169_600_000).unwrap(),
        incarnation: None,
        cgroup,
        mark: None,
    };
    plant_command_record(dir, &rec);
}
