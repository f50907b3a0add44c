//! The self-fence and the watchdog: commands die before a fence is reported, while the
//! runtime is blocked, and when a takeover fences a paused owner.

use crate::helpers::{
    alive, cgroup_removed_after_fence, fast, helper_cmd, now_ts, read_status, read_until, rt,
    signal_child, take_over_when_stale,
};
use lease_core::LeaseOps;
use lease_fs::RunDir;
use lease_run::{FinalStatus, Run};
use rustix::process::Signal;
use std::io::BufRead;
use std::time::{Duration, Instant};

#[test]
fn fence_kills_the_commands_before_it_is_reported_and_release_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-d");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let argv: Vec<String> = ["sh", "-c", "sleep 30 & sleep 30"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let cmd = run.spawn(&argv, &[]).await.unwrap();
        let pid = cmd.pid();
        tokio::time::sleep(Duration::from_millis(150)).await;
        let stuck = Instant::now();
        run.suspend_heartbeats();
        let e = tokio::time::timeout(Duration::from_secs(3), run.fenced())
            .await
            .expect("fenced in time");
        println!(
            "fence-to-kill ms (suspended heartbeat): {}",
            stuck.elapsed().as_millis()
        );
        assert_eq!(e.code().as_str(), "FENCED", "{e}");
        assert!(!alive(pid));
        let members: Vec<_> = lease_run::procs::scan()
            .into_iter()
            .filter(|p| p.pgrp == pid && !p.zombie)
            .collect();
        assert!(members.is_empty(), "{members:?}");
        assert_eq!(run.check_live().unwrap_err().code().as_str(), "FENCED");
        // Another owner takes over once the record is stale: the fenced run never wrote.
        // (It watches the record unchanged for stale_after on this process's own clock.)
        crate::helpers::take_over_when_stale(&path);
        let before = std::fs::read(path.join("run.json")).unwrap();
        let cg = run.cgroup();
        let e = run.release(FinalStatus::Done).await.unwrap_err();
        assert_eq!(e.code().as_str(), "FENCED");
        assert_eq!(std::fs::read(path.join("run.json")).unwrap(), before);
        cgroup_removed_after_fence(cg);
    });
}

#[test]
fn watchdog_kills_commands_while_the_runtime_is_blocked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-e");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let argv: Vec<String> = ["sleep", "30"].iter().map(|s| s.to_string()).collect();
        let cmd = run.spawn(&argv, &[]).await.unwrap();
        let pid = cmd.pid();
        assert!(alive(pid));
        // Block the only runtime thread: no heartbeat, no timer task can run.
        let deadline = run.time_to_self_fence();
        let blocked = Instant::now();
        let mut killed_at = None;
        while blocked.elapsed() < Duration::from_millis(1500) {
            std::thread::sleep(Duration::from_millis(5));
            if killed_at.is_none() && !alive(pid) {
                killed_at = Some(blocked.elapsed());
            }
        }
        let k = killed_at.expect("the watchdog killed the command while the runtime was blocked");
        let past = k.saturating_sub(deadline);
        println!(
            "fence-to-kill ms: {} (runtime blocked: from the self-fence deadline to the command gone; {} ms after the block began, deadline was {} ms away)",
            past.as_millis(),
            k.as_millis(),
            deadline.as_millis()
        );
        assert!(k >= deadline, "killed before the deadline: {k:?} < {deadline:?}");
        assert!(past <= Duration::from_millis(100), "{past:?} past the deadline");
        let cg = run.cgroup();
        let e = run.release(FinalStatus::Done).await.unwrap_err();
        assert_eq!(e.code().as_str(), "FENCED");
        cgroup_removed_after_fence(cg);
    });
}

fn pids_of(lines: &[String]) -> Vec<u32> {
    lines
        .iter()
        .filter_map(|l| l.split("PID ").nth(1))
        .map(|p| p.trim().parse().unwrap())
        .collect()
}

/// Every live process in one of `groups` (a command and what it started).
fn members(groups: &[u32]) -> Vec<u32> {
    lease_run::procs::scan()
        .into_iter()
        .filter(|p| groups.contains(&p.pgrp) && !p.zombie)
        .map(|p| p.pid)
        .collect()
}

#[test]
fn a_takeover_fences_the_first_owner_whose_commands_die_in_time_and_it_exits_75() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-g");
    let mut owner = helper_cmd("owner-exit-on-fence", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(owner.stdout.take().unwrap()).lines();
    let groups = pids_of(&read_until(&mut lines, "READY"));
    assert_eq!(groups.len(), 2);
    let watched = members(&groups);
    assert!(
        watched.len() >= 3,
        "two commands and a background child: {watched:?}"
    );

    // Pause the owner (a zombie-to-be), take the run over once it is stale, resume it.
    signal_child(owner.id(), Signal::STOP);
    let taken = take_over_when_stale(&path);
    let resumed = Instant::now();
    signal_child(owner.id(), Signal::CONT);
    let mut gone_at = None;
    while resumed.elapsed() < Duration::from_secs(5) {
        if watched.iter().all(|p| !alive(*p)) {
            gone_at = Some(resumed.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let k = gone_at.expect("the fenced owner killed its commands");
    println!(
        "fence-to-kill ms: {} (takeover of a paused owner: from its resumption to its last command gone)",
        k.as_millis()
    );
    let code = owner.wait().unwrap().code();
    assert_eq!(code, Some(75), "the fenced owner exits 75");
    let limit = fast().policy.self_fence_after() + Duration::from_millis(100);
    assert!(k <= limit, "{k:?} > {limit:?}");
    // The taker holds the next generation; the fenced owner changed nothing after it.
    let view = RunDir::open(&path)
        .unwrap()
        .status(now_ts(), false)
        .unwrap();
    let head = view.head.unwrap();
    assert_eq!(head.generation(), taken.generation);
    assert_eq!(head.epoch.owner_id.as_str(), "taker");
    assert_eq!(
        read_status(&path).generation.get(),
        taken.generation.get() - 1
    );
}

/// A fence's error names the run once and carries its cause alone: no second code prefix,
/// no pseudo-code (issue #18).
#[test]
fn a_lapse_fence_says_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-once");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        run.suspend_heartbeats();
        let e = tokio::time::timeout(Duration::from_secs(3), run.fenced())
            .await
            .expect("fenced in time");
        assert!(e.is_fenced());
        let text = e.to_string();
        let run = format!("run {}", path.display());
        assert!(
            text.starts_with(&format!(
                "{run}: this owner is fenced: the lease lapsed: no successful heartbeat for"
            )),
            "{text}"
        );
        assert_eq!(text.matches(&run).count(), 1, "{text}");
        assert!(
            !text.contains("FENCED") && !text.contains("LEASE_LAPSED"),
            "{text}"
        );
    });
}
