//! Issue #31: a stopped `runlease run` (SIGSTOP, a frozen VM) stops its watchdog thread
//! with it; its guard process (lease-run's `guard`, `runlease __guard`) kills the command
//! by the self-fence deadline anyway (and a killed owner's command at once), with a cgroup
//! (`cgroup.kill`) and without one (the leader and its group, by a pidfd). A healthy run is
//! left alone, and the guard is gone after a clean exit.

mod common;

use common::*;
use rustix::process::Signal;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Heartbeat 100 ms, self-fence 400 ms (the stale margin lease-run requires, and the
/// smallest stale_after the CLI accepts).
const POLICY: [&str; 6] = [
    "--heartbeat",
    "100",
    "--self-fence-after",
    "400",
    "--stale-after",
    "1000",
];

/// Heartbeat 1 s, self-fence 20 s: a deadline far beyond [`MARGIN`], for a kill that must
/// not wait for it.
const LONG_POLICY: [&str; 6] = [
    "--heartbeat",
    "1000",
    "--self-fence-after",
    "20000",
    "--stale-after",
    "30000",
];

/// The self-fence deadline's distance and how much later the command must be gone.
const SELF_FENCE: Duration = Duration::from_millis(400);
const MARGIN: Duration = Duration::from_secs(3);

/// The state letter of `pid` (`T`: stopped), `None` once gone.
fn state(pid: u32) -> Option<char> {
    lease_fs::probe::read_stat(pid)
        .ok()
        .flatten()
        .map(|s| s.state)
}

/// Kills what it holds when dropped (a failed assertion leaves no `sleep 60` behind and
/// no stopped owner).
struct Reaper {
    owner: Option<Child>,
    command: Option<u32>,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Some(pid) = self.command {
            if let Some(h) = lease_run::procs::HeldProcess::current(pid) {
                let _ = h.signal(Signal::KILL);
            }
        }
        if let Some(mut o) = self.owner.take() {
            let _ = o.kill();
            let _ = o.wait();
        }
    }
}

/// Start `cmd` (a `runlease run` of a `sh` that writes its pid to `pidfile` and execs
/// `sleep 60`), stop the owner once the command runs, and check: the command is gone
/// within the self-fence deadline + [`MARGIN`] while the owner is still stopped; resumed,
/// the owner exits 75. Returns the command's `/proc/<pid>/cgroup` as read while it ran.
fn stopped_owner_loses_its_command(
    test: &str,
    mut cmd: Command,
    pidfile: &Path,
    err: &Path,
) -> String {
    let owner = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(err).unwrap())
        .spawn()
        .unwrap();
    let mut r = Reaper {
        owner: Some(owner),
        command: None,
    };
    let owner_pid = r.owner.as_ref().unwrap().id();
    let sleep = read_pid(pidfile);
    r.command = Some(sleep);
    // The pid file is written before the exec: wait for `sleep` itself.
    let t = Instant::now();
    while !std::fs::read(format!("/proc/{sleep}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep\0"))
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{test}: the command never ran sleep"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let cgroup = std::fs::read_to_string(format!("/proc/{sleep}/cgroup")).unwrap_or_default();
    assert!(
        guard_of(owner_pid).is_some(),
        "{test}: the owner started no guard beside its command"
    );
    assert!(
        alive(sleep),
        "{test}: the command died before the owner was stopped"
    );

    signal(owner_pid, Signal::STOP);
    let stopped = Instant::now();
    while alive(sleep) {
        assert!(
            stopped.elapsed() < SELF_FENCE + MARGIN,
            "{test}: the command still runs {} ms after its owner was stopped (self-fence after {} ms): {}",
            stopped.elapsed().as_millis(),
            SELF_FENCE.as_millis(),
            std::fs::read_to_string(err).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let gone_after = stopped.elapsed();
    assert_eq!(
        state(owner_pid),
        Some('T'),
        "{test}: the owner was not stopped when its command died"
    );
    assert!(
        gone_after >= SELF_FENCE.saturating_sub(Duration::from_millis(150)),
        "{test}: the command died {} ms after the stop, before the self-fence deadline could pass",
        gone_after.as_millis()
    );

    signal(owner_pid, Signal::CONT);
    let mut owner = r.owner.take().unwrap();
    let st = wait_exit(&mut owner, Duration::from_secs(15));
    let stderr = std::fs::read_to_string(err).unwrap_or_default();
    assert_eq!(st.code(), Some(75), "{test}: resumed owner: {stderr}");
    assert!(stderr.contains("FENCED"), "{test}: {stderr}");
    cgroup
}

#[test]
fn a_stopped_owners_command_is_killed_by_the_self_fence_deadline() {
    let test = "a_stopped_owners_command_is_killed_by_the_self_fence_deadline";
    let (tmp, dir) = scratch();
    let pidfile = tmp.path().join("cmd.pid");
    let script = format!("echo $$ > '{}'; exec sleep 60", pidfile.display());
    let c = cmd(&[
        &["run", dir.to_str().unwrap()][..],
        &POLICY,
        &["--", "sh", "-c", &script],
    ]
    .concat());
    let cgroup = stopped_owner_loses_its_command(test, c, &pidfile, &tmp.path().join("owner.err"));
    if !cgroup.contains("runlease-") {
        eprintln!("{test}: note: no cgroup here, the leader's group was killed: {cgroup}");
    }
}

#[test]
fn a_healthy_run_keeps_its_command_and_its_guard_is_gone_after_a_clean_exit() {
    let (tmp, dir) = scratch();
    let done = tmp.path().join("done");
    // Ten self-fence deadlines' worth of a healthy run.
    let script = format!("sleep 4; echo ok > '{}'", done.display());
    let mut c = cmd(&[
        &["run", dir.to_str().unwrap()][..],
        &POLICY,
        &["--", "sh", "-c", &script],
    ]
    .concat());
    let err = tmp.path().join("owner.err");
    let mut owner = c
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let guard = guard_of(owner.id()).expect("no guard was started");
    let st = wait_exit(&mut owner, Duration::from_secs(20));
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!(st.code(), Some(0), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&done).unwrap_or_default(),
        "ok\n",
        "the command did not finish: {stderr}"
    );
    assert!(
        !stderr.contains("guard:"),
        "the guard killed a healthy run: {stderr}"
    );
    wait_gone(
        guard,
        Duration::from_secs(2),
        "the guard outlived its owner's clean exit",
    );
}

// ---- Without a cgroup: an unprivileged owner (uid 65534, no cgroup it may create) ----

#[test]
fn without_a_cgroup_a_stopped_owners_command_leader_is_killed_by_the_deadline() {
    let test = "without_a_cgroup_a_stopped_owners_command_leader_is_killed_by_the_deadline";
    let tmp = tempfile::tempdir().unwrap();
    let Some((home, bin)) = nobody_home(test, tmp.path()) else {
        return;
    };
    let pidfile = home.join("cmd.pid");
    let script = format!("echo $$ > '{}'; exec sleep 60", pidfile.display());
    let dir = home.join("run");
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .args(
            [
                &["run", dir.to_str().unwrap()][..],
                &POLICY,
                &["--", "sh", "-c", &script],
            ]
            .concat(),
        );
    scrub_owner_env(&mut c)
        .env("HOME", &home)
        .env("PATH", format!("{}:/usr/bin:/bin", home.display()))
        .current_dir(&home)
        .stdin(Stdio::null());
    let err = tmp.path().join("owner.err");
    let cgroup = stopped_owner_loses_its_command(test, c, &pidfile, &err);
    assert!(
        !cgroup.contains("runlease-"),
        "{test}: the command ran in a run cgroup, not the path without one: {cgroup}"
    );
}

/// The owner dies without telling its guard it is done (SIGKILL; its watchdog died with
/// it): the guard kills the command at once, long before a self-fence deadline 20 s away
/// (no heartbeat can extend it any more), and its caller's pipes close with it.
#[test]
fn a_killed_owners_command_is_killed_by_its_guard_at_once() {
    let (tmp, dir) = scratch();
    let pidfile = tmp.path().join("cmd.pid");
    let script = format!("echo $$ > '{}'; exec sleep 60", pidfile.display());
    let mut c = cmd(&[
        &["run", dir.to_str().unwrap()][..],
        &LONG_POLICY,
        &["--", "sh", "-c", &script],
    ]
    .concat());
    // The guard inherits the owner's stderr: its kill line lands in this file.
    let err = tmp.path().join("owner.err");
    let owner = c
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let owner_pid = owner.id();
    let mut r = Reaper {
        owner: Some(owner),
        command: None,
    };
    let sleep = read_pid(&pidfile);
    r.command = Some(sleep);
    let guard = guard_of(owner_pid).expect("no guard was started");
    let mut owner = r.owner.take().unwrap();
    signal(owner.id(), Signal::KILL);
    let _ = owner.wait();
    wait_gone(
        sleep,
        MARGIN,
        "the command outlived its killed owner by 3 s (the guard waits for the deadline?)",
    );
    wait_gone(guard, Duration::from_secs(2), "the guard outlived its kill");
    // It says so, naming the dead owner (not the reaper it was reparented to).
    let said = std::fs::read_to_string(&err).unwrap();
    assert!(
        said.contains(&format!(
            "runlease: guard: owner pid {owner_pid} ended without stopping its commands: killed them"
        )),
        "{said}"
    );
}
