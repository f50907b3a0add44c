//! Shared setup of the lifecycle tests: fast timing, runtimes, record readers, and the
//! plumbing that starts this test binary again as a helper process (`helper_cmd`).

use lease_core::LeaseOps;
use lease_core::ops::{Expectation, OwnedLease, TakeoverTrigger};
use lease_core::{
    EpochRecord, FileRef, Generation, HeartbeatDurability, Identity, RunStatus, Timestamp,
    TimingPolicy, decode,
};
use lease_fs::RunDir;
use lease_run::OpenOptions;
use rustix::process::Signal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub(crate) const HELPER: &str = "LEASE_RUN_TEST_HELPER";

pub(crate) fn fast() -> OpenOptions {
    OpenOptions {
        policy: TimingPolicy::from_millis(100, 300, 1000, HeartbeatDurability::Local).unwrap(),
        term_grace: Duration::from_millis(300),
        kill_wait: Duration::from_secs(1),
        ..OpenOptions::default()
    }
}

pub(crate) fn now_ts() -> Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    Timestamp::from_unix_millis(u64::try_from(ms).unwrap()).unwrap()
}

pub(crate) fn epoch(path: &Path, g: u64) -> EpochRecord {
    let f = FileRef::Epoch(Generation::new(g).unwrap());
    decode(&std::fs::read(path.join(f.path())).unwrap()).unwrap()
}

pub(crate) fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Watch the run's head until its record stayed unchanged for more than its `stale_after`
/// on this process's monotonic clock, then take it over exactly as an operator would from
/// another process (lease-fs, without the owner lock, which the paused owner still holds).
/// Returns the taker's lease.
pub(crate) fn take_over_when_stale(path: &Path) -> OwnedLease {
    let dir = RunDir::open(path).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    let mut watch = lease_core::watch::StaleWatch::new();
    loop {
        let view = dir.status(now_ts(), false).unwrap();
        let head = view.head.clone().filter(|h| h.is_active());
        if let Some(head) = head {
            let verdict = watch.observe(&head, lease_run::procs::boottime_ns());
            if let lease_core::watch::Verdict::TakeOver { watched } = verdict {
                return dir
                    .takeover(lease_core::ops::TakeoverParams {
                        run_id: dir.run_id().clone(),
                        owner_id: Identity::new("taker").unwrap(),
                        holder: lease_fs::this_holder().unwrap(),
                        policy: fast().policy,
                        now: now_ts(),
                        expect: Expectation::of(&head),
                        trigger: TakeoverTrigger::Operator {
                            watched_unchanged_ms: watched.as_millis() as u64,
                        },
                    })
                    .unwrap();
            }
        }
        assert!(Instant::now() < end, "never stale: {:?}", view.status);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Lines of a helper's stdout until one starts with `until`; returns the lines before it.
/// (libtest prints `test helper_process ... ` without a newline first, so the helper's
/// first line shares it: parse with `split`, not `strip_prefix`.)
pub(crate) fn read_until(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    until: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let l = lines.next().expect("helper output ended").unwrap();
        if l.starts_with(until) {
            return out;
        }
        out.push(l);
    }
}

/// After a confirmed fence the watchdog removes the run's cgroup (if it had one): wait for
/// it, so a test process that exits right after leaves nothing behind.
pub(crate) fn cgroup_removed_after_fence(cg: Option<PathBuf>) {
    if let Some(cg) = cg {
        let end = Instant::now() + Duration::from_secs(3);
        while cg.exists() {
            assert!(
                Instant::now() < end,
                "{} not removed after the fence",
                cg.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

pub(crate) fn read_status(path: &Path) -> RunStatus {
    decode(&std::fs::read(path.join("run.json")).unwrap()).unwrap()
}

pub(crate) fn alive(pid: u32) -> bool {
    matches!(lease_run::procs::state_of(pid), Some(c) if c != 'Z' && c != 'X')
}

pub(crate) fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// This test binary started again as a helper process running only `helper_process`.
/// `--exact` takes the full test path: `helper_process` must stay at the crate root
/// (main.rs), or this filter must name its module.
pub(crate) fn helper_cmd(mode: &str, path: &Path) -> std::process::Command {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "helper_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(HELPER, mode)
    .env("LEASE_RUN_TEST_PATH", path);
    c
}

/// Signal a child of this test (its pid cannot be reused while it is unreaped).
pub(crate) fn signal_child(pid: u32, sig: Signal) {
    let p = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    rustix::process::kill_process(p, sig).unwrap();
}

/// A command that double-forks a daemon into a new session and process group, writes its
/// pid to `pidfile`, and exits at once: it escapes process-group and session tracking.
pub(crate) fn daemon_argv(pidfile: &Path) -> Vec<String> {
    let script = format!(
        "(setsid sh -c 'echo $$ > {p}.tmp && mv {p}.tmp {p}; exec sleep 30' &) ; exit 0",
        p = pidfile.display()
    );
    args(&["sh", "-c", &script])
}

pub(crate) fn wait_for_pid(pidfile: &Path) -> u32 {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(t) = std::fs::read_to_string(pidfile) {
            if let Ok(p) = t.trim().parse() {
                return p;
            }
        }
        assert!(Instant::now() < end, "the daemon never wrote its pid");
        std::thread::sleep(Duration::from_millis(5));
    }
}
