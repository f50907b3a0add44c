//! Unit tests of the `/proc` readers, the mark and the tracking.

use super::stat::{RESERVED_PIDS, forks_now, probe};
use super::*;
use std::collections::BTreeSet;
use std::time::Duration;

#[test]
fn stat_lines_parse_after_the_last_paren() {
    let line = "42 (a) b) (c) S 1 42 7 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 12345 0 0";
    let p = parse_stat(42, line).unwrap();
    assert_eq!((p.ppid, p.pgrp, p.session, p.start_time), (1, 42, 7, 12345));
    assert!(!p.zombie);
    assert!(boottime_ns() > 0);
}

#[test]
fn another_runs_exited_leader_is_never_adopted() {
    // An exited child of this process, started after this run's first command, in
    // a group of its own: adoptable (reaped) unless it is some run's command leader.
    let me = std::process::id();
    let t = Tracked {
        adopt_children: true,
        since: Some(100),
        ..Tracked::default()
    };
    let z = ProcInfo {
        pid: 4_000_001,
        ppid: me,
        pgrp: 4_000_001,
        session: 1,
        start_time: 200,
        zombie: true,
    };
    assert!(t.adoptable(&z, me, Some(1)));
    register_leader(z.pid, z.start_time);
    assert!(!t.adoptable(&z, me, Some(1)));
    // The same number with another start time is another process.
    let other = ProcInfo {
        start_time: 300,
        ..z
    };
    assert!(t.adoptable(&other, me, Some(1)));
}

#[test]
fn a_pid_window_runs_after_its_base_around_the_wrap() {
    let w = PidWindow {
        after: 100,
        through: 200,
        pid_max: 32_768,
        tasks: 0,
    };
    assert!(!w.contains(100) && w.contains(101) && w.contains(200) && !w.contains(201));
    assert!(!w.contains(1) && !w.contains(99));
    // The counter wrapped: from past the base to pid_max, then from the bottom.
    let w = PidWindow {
        after: 32_000,
        through: 400,
        pid_max: 32_768,
        tasks: 0,
    };
    assert!(w.contains(32_001) && w.contains(32_767) && w.contains(300));
    assert!(w.contains(400) && !w.contains(401) && !w.contains(32_000));
    // Nothing allocated since.
    let w = PidWindow {
        after: 7,
        through: 7,
        pid_max: 32_768,
        tasks: 0,
    };
    assert!(!w.contains(7) && !w.contains(8) && !w.contains(6));
    assert_eq!((w.len(), w.pids().count()), (0, 0));
    // What a probe looks up is exactly what the window holds.
    for (after, through) in [(100, 200), (32_000, 400), (32_766, 3), (5, 32_767)] {
        let w = PidWindow {
            after,
            through,
            pid_max: 32_768,
            tasks: 0,
        };
        let pids: Vec<u32> = w.pids().collect();
        assert_eq!(pids.len() as u64, w.len(), "{w:?}");
        assert!(pids.iter().all(|p| w.contains(*p) && *p > 0 && *p < 32_768));
        let held: BTreeSet<u32> = pids.iter().copied().collect();
        assert!(
            (1..32_768).all(|p| w.contains(p) == held.contains(&p)),
            "{w:?}"
        );
    }
}

/// A probe by number finds processes (a zombie too) and never a thread that does not
/// lead its group, though `/proc/<tid>/stat` exists for it.
#[test]
fn a_probe_finds_processes_and_not_threads() {
    let me = std::process::id();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let thread = std::thread::spawn(move || {
        let _ = stop_rx.recv();
    });
    let tid: u32 = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .find(|t| *t != me)
        .expect("a thread besides the main one");
    assert!(proc_info(tid).is_some(), "/proc/<tid>/stat exists");
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let zombie = child.id();
    while state_of(zombie) != Some('Z') {
        std::thread::sleep(Duration::from_millis(1));
    }
    let found: Vec<u32> = probe([me, tid, zombie, 0, u32::MAX].into_iter())
        .expect("pidfds")
        .iter()
        .map(|p| p.pid)
        .collect();
    assert_eq!(found, vec![me, zombie]);
    stop_tx.send(()).unwrap();
    thread.join().unwrap();
    child.wait().unwrap();
}

#[test]
fn no_window_once_enough_forks_could_have_lapped_the_counter() {
    let now = PidCounter::read().expect("/proc/loadavg and /proc/stat");
    if now.window_now().is_none() {
        // Only with more tasks than a sixth of pid_max (then every scan is full).
        assert!(3 * now.tasks + 5_000 >= u64::from(now.pid_max - RESERVED_PIDS));
    }
    // Every fork since boot counted against the base: more than a lap's worth on any
    // machine that ran a test suite.
    let long_ago = PidCounter { forks: 0, ..now };
    let forks = forks_now().unwrap();
    if 5 * forks + 3 * now.tasks >= u64::from(now.pid_max - RESERVED_PIDS) {
        assert_eq!(long_ago.window_now(), None);
    }
    // As many tasks as the pid space holds could make a single allocation a lap.
    let crowded = PidCounter {
        tasks: u64::from(now.pid_max),
        ..now
    };
    assert_eq!(crowded.window_now(), None);
    // pid_max changed since the base.
    let other_max = PidCounter {
        pid_max: now.pid_max - 1,
        ..now
    };
    assert_eq!(other_max.window_now(), None);
}

/// With a cgroup and a base, a snapshot reads what was started since the base (and
/// what is tracked), not the processes that were there before.
#[test]
fn a_snapshot_reads_the_processes_started_since_the_first_command() {
    /// A `sleep` child, killed and reaped on drop.
    struct Sleep(std::process::Child);
    impl Drop for Sleep {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let sleep = || {
        let mut c = std::process::Command::new("sleep");
        c.arg("30");
        Sleep(c.spawn().unwrap())
    };
    let older = sleep();
    let cg = tempfile::tempdir().unwrap();
    std::fs::write(cg.path().join("cgroup.procs"), "").unwrap();
    let mut t = Tracked {
        cgroup: Some(cg.path().to_path_buf()),
        ..Tracked::default()
    };
    assert!(t.snapshot().is_empty(), "nothing started: nothing read");
    t.note_spawn();
    let PidBase::At(base) = t.pid_base else {
        panic!("no pid counter: {:?}", t.pid_base);
    };
    let newer = sleep();
    // Read once: a later spawn keeps the base.
    t.note_spawn();
    assert_eq!(t.pid_base, PidBase::At(base));
    let Some(window) = base.window_now() else {
        eprintln!("SKIPPED: too many tasks for a pid window here: {base:?}");
        return;
    };
    assert!(window.contains(newer.0.id()));
    let snap = t.snapshot();
    let pids: BTreeSet<u32> = snap.iter().map(|p| p.pid).collect();
    assert!(pids.contains(&newer.0.id()), "started since the base");
    assert!(pids.contains(&std::process::id()), "the owner itself");
    if !window.contains(older.0.id()) {
        assert!(!pids.contains(&older.0.id()), "started before the base");
    }
    // Without a cgroup every process is read.
    let full = Tracked {
        cgroup: None,
        ..t.clone()
    }
    .snapshot();
    assert!(full.iter().any(|p| p.pid == older.0.id()));
}

#[test]
fn a_stat_line_is_read_whole_whatever_the_name() {
    let me = proc_info(std::process::id()).unwrap();
    assert_eq!(me.pid, std::process::id());
    assert_eq!(
        Some(me.start_time),
        lease_fs::probe::process_start_time(me.pid).unwrap()
    );
    assert_eq!(proc_info(0), None);
}
