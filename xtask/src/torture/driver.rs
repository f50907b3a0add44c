//! The driver: builds `runlease`, runs the slots and the fault injector until the
//! deadline, then has the run recovered and judged.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::process::Signal;
use serde_json::Value;

use super::procs::{
    Cleanup, Rng, all_procs, append_line, code_of, kill_all_descendants, reap, rl, rl3,
    signal_group, signal_pid,
};
use super::report::{Figures, judge};
use super::{HEARTBEAT_MS, Opts, SELF_FENCE_MS, STALE_MS, WATCHDOG_GRACE};

// ---------------------------------------------------------------------------------------
// The driver.

/// Counters and the registry of live `runlease run` children, shared by the threads.
struct Shared {
    stop: AtomicBool,
    /// slot → pid of its current `runlease run` (registered under the lock at spawn).
    running: Mutex<BTreeMap<u32, u32>>,
    kills: AtomicU64,
    stops: AtomicU64,
    takeovers: AtomicU64,
    retires: AtomicU64,
    runs: AtomicU64,
}

/// `cargo xtask torture`: build `runlease`, torture, recover, check, print the figure line.
pub fn run(root: &Path, opts: &Opts) -> Result<(), String> {
    eprintln!(
        "torture: building runlease (debug profile), procs={} seconds={} seed={}",
        opts.procs, opts.seconds, opts.seed
    );
    let runlease = crate::build_runlease(root)?;
    let target = crate::target_dir(root);
    let work = target
        .join("torture")
        .join(format!("{}-{}", std::process::id(), opts.seed));
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let work = work
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", work.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this xtask: {e}"))?;

    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(|e| format!("cannot become a child subreaper: {e}"))?;
    let guard = Cleanup;
    let hard_deadline = Instant::now() + Duration::from_secs(opts.seconds) + WATCHDOG_GRACE;
    std::thread::spawn(move || {
        while Instant::now() < hard_deadline {
            std::thread::sleep(Duration::from_millis(500));
        }
        eprintln!(
            "torture: FAILED: watchdog: still running {WATCHDOG_GRACE:?} after the deadline; killing everything"
        );
        kill_all_descendants();
        std::process::exit(1);
    });

    let figures = torture(opts, &work, &runlease, &exe)?;
    let outcome = judge(opts, &work, &runlease, &figures);
    drop(guard);
    match outcome {
        Ok(()) if opts.keep => {
            eprintln!("torture: work folder kept (--keep): {}", work.display());
            Ok(())
        }
        Ok(()) => {
            let _ = std::fs::remove_dir_all(&work);
            Ok(())
        }
        Err(e) => {
            eprintln!(
                "torture: work folder kept for inspection: {}",
                work.display()
            );
            Err(e)
        }
    }
}

/// Run the slots and the fault driver until the deadline; stop and clean up.
fn torture(opts: &Opts, work: &Path, runlease: &Path, exe: &Path) -> Result<Figures, String> {
    let run_dir = work.join("run");
    let history = work.join("history.log");
    let driver_log = work.join("driver.log");
    let shared = Arc::new(Shared {
        stop: AtomicBool::new(false),
        running: Mutex::new(BTreeMap::new()),
        kills: AtomicU64::new(0),
        stops: AtomicU64::new(0),
        takeovers: AtomicU64::new(0),
        retires: AtomicU64::new(0),
        runs: AtomicU64::new(0),
    });
    let deadline = Instant::now() + Duration::from_secs(opts.seconds);
    let mut slots = Vec::new();
    for slot in 0..opts.procs {
        let (shared, run_dir, history, driver_log) = (
            shared.clone(),
            run_dir.clone(),
            history.clone(),
            driver_log.clone(),
        );
        let (runlease, exe, seed) = (runlease.to_path_buf(), exe.to_path_buf(), opts.seed);
        let slot_log = work.join(format!("slot-{slot}.log"));
        slots.push(std::thread::spawn(move || -> Result<(), String> {
            let mut rng = Rng::new(seed ^ u64::from(slot).wrapping_mul(7919));
            let mut round = 0u64;
            while !shared.stop.load(Ordering::SeqCst) {
                round += 1;
                let log = File::options()
                    .append(true)
                    .create(true)
                    .open(&slot_log)
                    .map_err(|e| format!("cannot open {}: {e}", slot_log.display()))?;
                let log2 = log.try_clone().map_err(|e| e.to_string())?;
                let mut cmd = Command::new(&runlease);
                cmd.arg("run")
                    .arg(&run_dir)
                    .args([
                        &format!("--heartbeat={HEARTBEAT_MS}"),
                        &format!("--self-fence-after={SELF_FENCE_MS}"),
                        &format!("--stale-after={STALE_MS}"),
                        "--wait=2s",
                        "--takeover-stale",
                        "--retire-dead",
                        "--",
                    ])
                    .arg(&exe)
                    .args(["torture", "--worker", "--slot", &slot.to_string()])
                    .args(["--round", &round.to_string()])
                    .args(["--seed", &rng.next().to_string()])
                    .arg("--history")
                    .arg(&history)
                    .arg("--runlease")
                    .arg(&runlease)
                    .stdin(Stdio::null())
                    .stdout(log)
                    .stderr(log2)
                    .process_group(0);
                let mut child = {
                    let mut running = shared.running.lock().expect("registry lock");
                    let child = cmd
                        .spawn()
                        .map_err(|e| format!("cannot start {}: {e}", runlease.display()))?;
                    running.insert(slot, child.id());
                    child
                };
                shared.runs.fetch_add(1, Ordering::SeqCst);
                let rc = child.wait().map(code_of).unwrap_or(-1);
                shared.running.lock().expect("registry lock").remove(&slot);
                let _ = append_line(
                    &driver_log,
                    &format!("run slot={slot} round={round} pid={} rc={rc}", child.id()),
                );
                if Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(rng.range(0, 50)));
            }
            Ok(())
        }));
    }

    drive(opts, &shared, deadline, &run_dir, runlease, &driver_log);
    shared.stop.store(true, Ordering::SeqCst);
    // The slots end their round by themselves: a worker makes at most MAX_APPENDS appends
    // and a `runlease run` waits at most 2 s.
    let mut errors = Vec::new();
    for s in slots {
        match s.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => errors.push(e),
            Err(_) => errors.push("a slot thread panicked".into()),
        }
    }
    let leftovers = kill_all_descendants();
    let _ = append_line(&driver_log, &format!("end leftovers_killed={leftovers}"));
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    eprintln!(
        "torture: runs={} takeovers(driver)={} retires(driver)={}",
        shared.runs.load(Ordering::SeqCst),
        shared.takeovers.load(Ordering::SeqCst),
        shared.retires.load(Ordering::SeqCst)
    );
    Ok(Figures {
        kills: shared.kills.load(Ordering::SeqCst),
        stops: shared.stops.load(Ordering::SeqCst),
    })
}

/// A process the driver stopped, and when it resumes it.
struct Stopped {
    pid: u32,
    group: Option<u32>,
    resume_at: Instant,
    takeover_first: bool,
}

/// The fault injector: until the deadline, SIGKILL / SIGSTOP the current holder.
fn drive(
    opts: &Opts,
    shared: &Shared,
    deadline: Instant,
    run_dir: &Path,
    runlease: &Path,
    log: &Path,
) {
    let run = run_dir.to_string_lossy().into_owned();
    let mut rng = Rng::new(opts.seed ^ 0xD1B5_4A32_D192_ED03);
    let mut stopped: Vec<Stopped> = Vec::new();
    let note = |line: String| {
        let _ = append_line(log, &line);
    };
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(rng.range(100, 500)));
        // Resume the stopped ones that are due (after an exact takeover, sometimes).
        let now = Instant::now();
        let (due, keep): (Vec<_>, Vec<_>) = stopped.into_iter().partition(|s| s.resume_at <= now);
        stopped = keep;
        for s in due {
            if s.takeover_first {
                takeover(runlease, &run, shared, &note);
            }
            if let Some(g) = s.group {
                signal_group(g, Signal::CONT);
            }
            signal_pid(s.pid, Signal::CONT);
            note(format!("cont pid={} group={:?}", s.pid, s.group));
        }
        reap_orphans(shared);

        let (rc, out) = rl(runlease, &["--json", "status", &run]);
        let Some(st) = (rc == 0)
            .then(|| serde_json::from_str::<Value>(&out).ok())
            .flatten()
        else {
            continue;
        };
        let state = st.get("state").and_then(Value::as_str).unwrap_or_default();
        let Some(pid) = st.get("pid").and_then(Value::as_u64).map(|p| p as u32) else {
            continue;
        };
        let ours = shared
            .running
            .lock()
            .expect("registry lock")
            .values()
            .any(|&p| p == pid);
        if !ours || !(state == "active" || state == "stale") {
            continue;
        }
        if stopped.iter().any(|s| s.pid == pid) {
            continue;
        }
        // The command's process group: the child of `runlease run` (its pid = its pgid).
        let group = all_procs()
            .into_iter()
            .find(|&(_, ppid, _)| ppid == pid)
            .map(|(p, _, _)| p)
            .filter(|_| rng.chance(50));
        match rng.range(0, 100) {
            0..45 => {
                if let Some(g) = group {
                    signal_group(g, Signal::KILL);
                }
                signal_pid(pid, Signal::KILL);
                shared.kills.fetch_add(1, Ordering::SeqCst);
                note(format!("kill pid={pid} group={group:?}"));
                if rng.chance(50) {
                    std::thread::sleep(Duration::from_millis(rng.range(0, 300)));
                    let (rc, _, err) = rl3(runlease, &["retire", &run]);
                    if rc == 0 {
                        shared.retires.fetch_add(1, Ordering::SeqCst);
                    }
                    note(format!("retire rc={rc} {err}"));
                }
            }
            45..90 => {
                if let Some(g) = group {
                    signal_group(g, Signal::STOP);
                }
                signal_pid(pid, Signal::STOP);
                shared.stops.fetch_add(1, Ordering::SeqCst);
                let pause = rng.range(300, 4000);
                let takeover_first = pause > STALE_MS + 200 && rng.chance(60);
                note(format!(
                    "stop pid={pid} group={group:?} for_ms={pause} takeover_first={takeover_first}"
                ));
                stopped.push(Stopped {
                    pid,
                    group,
                    resume_at: Instant::now() + Duration::from_millis(pause),
                    takeover_first,
                });
            }
            _ => {}
        }
    }
    for s in stopped {
        if let Some(g) = s.group {
            signal_group(g, Signal::CONT);
        }
        signal_pid(s.pid, Signal::CONT);
        note(format!("cont pid={} group={:?} (deadline)", s.pid, s.group));
    }
}

/// An exact takeover with the expectations `status --json` prints, if the run is stale.
fn takeover(runlease: &Path, run: &str, shared: &Shared, note: &dyn Fn(String)) {
    let (rc, out) = rl(runlease, &["--json", "status", run]);
    let Some(st) = (rc == 0)
        .then(|| serde_json::from_str::<Value>(&out).ok())
        .flatten()
    else {
        return;
    };
    if st.get("state").and_then(Value::as_str) != Some("stale") {
        return;
    }
    let get = |k: &str| match st.get(k) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let (Some(owner), Some(beat)) = (get("expect_owner"), get("expect_heartbeat")) else {
        return;
    };
    let mut args = vec![
        "--json".to_string(),
        "takeover".into(),
        run.into(),
        "--expect-owner".into(),
        owner,
        "--expect-heartbeat".into(),
        beat,
    ];
    if let Some(g) = get("expect_generation") {
        args.extend(["--expect-generation".into(), g]);
    }
    if let Some(c) = get("expect_count") {
        args.extend(["--expect-count".into(), c]);
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (rc, _, err) = rl3(runlease, &refs);
    if rc == 0 {
        shared.takeovers.fetch_add(1, Ordering::SeqCst);
    }
    note(format!("takeover rc={rc} {err}"));
}

/// Reap commands orphaned by a killed `runlease run` (re-parented to us, the subreaper)
/// once they exited; never a registered `runlease run` child (its slot thread waits).
fn reap_orphans(shared: &Shared) {
    let me = std::process::id();
    let running = shared.running.lock().expect("registry lock");
    for (pid, ppid, state) in all_procs() {
        if ppid == me && state == 'Z' && !running.values().any(|&p| p == pid) {
            reap(pid);
        }
    }
}
