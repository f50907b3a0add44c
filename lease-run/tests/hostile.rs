//! Hostile command records (issue #15): whoever can write a run folder can write
//! `commands/`, and pids are reused. `Run::open` reaps a killed incarnation's commands, so
//! each scenario here puts a real bystander process beside a forged or stale record and
//! asserts that the open never signals it, refuses or proceeds as PROTOCOL §11.1 says, and
//! names the record. The last line printed is `hostile: scenarios=N bystanders killed=K`.
//!
//! The pid-reuse scenario is modelled by the data a reaper sees after a reuse (the recorded
//! pid now belongs to a process with a later start time, with children in its group); a
//! private pid namespace would make the kernel hand out the very number, but the reaper's
//! decision depends only on (pid, start time, environment), which is what is reproduced.

use lease_core::{CommandRecord, FileRef, Generation, Identity, RunId};
use lease_run::{FinalStatus, Run};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

mod support;
use support::{fast, now_ts, rt};

fn alive(pid: u32) -> bool {
    matches!(lease_run::procs::state_of(pid), Some(c) if c != 'Z' && c != 'X')
}

fn start_time(pid: u32) -> u64 {
    lease_fs::probe::process_start_time(pid).unwrap().unwrap()
}

/// A bystander: `sh -c CMD` leading its own process group, a child of this test (so its
/// pid stays pinned until the test reaps it).
fn bystander(cmd: &str, env: &[(&str, &str)]) -> Child {
    let mut c = Command::new("sh");
    c.args(["-c", cmd]).process_group(0);
    for (k, v) in env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

/// Every process in process group `pgid`.
fn group_members(pgid: u32) -> Vec<u32> {
    lease_run::procs::scan()
        .into_iter()
        .filter(|p| p.pgrp == pgid && !p.zombie)
        .map(|p| p.pid)
        .collect()
}

/// A run with generation 1 released, so the next open (generation 2) reaps generation 1's
/// command records.
fn run_with_one_generation(path: &Path) {
    rt().block_on(async {
        let run = Run::open(path, fast()).await.unwrap();
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
    });
}

/// Write a command record of generation 1 for `pid` (0600, as runlease writes them);
/// returns its path relative to the run.
fn forge(path: &Path, pid: u32, pgid: u32, start: u64, incarnation: Option<&str>) -> String {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let run_id = RunId::new(path.file_name().unwrap().to_str().unwrap()).unwrap();
    let g1 = Generation::new(1).unwrap();
    let rec = CommandRecord {
        run_id: run_id.clone(),
        generation: g1,
        pid,
        pgid,
        start_time: start,
        boot_id: Identity::new(lease_fs::probe::boot_id().unwrap()).unwrap(),
        argv: vec!["sleep".into(), "60".into()],
        started_at: now_ts(),
        incarnation: incarnation.map(|s| CommandRecord::incarnation_digest(&run_id, g1, s)),
        cgroup: None,
        mark: None,
    };
    let f = FileRef::Command {
        generation: g1,
        pid,
    }
    .path();
    std::fs::create_dir_all(path.join("commands")).unwrap();
    // The encoder refuses what the decoder would (e.g. pgid ≠ pid): write such a record
    // by hand from a valid one.
    let mut bytes = lease_core::encode(&CommandRecord { pgid: pid, ..rec }).unwrap();
    if pgid != pid {
        let text = String::from_utf8(bytes).unwrap().replacen(
            &format!("\"pgid\":{pid}"),
            &format!("\"pgid\":{pgid}"),
            1,
        );
        bytes = text.into_bytes();
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path.join(&f))
        .unwrap();
    file.write_all(&bytes).unwrap();
    f
}

/// Open the run and return the result's code (or "ok", released at once).
fn open_code(path: &Path) -> (String, String) {
    rt().block_on(async {
        match Run::open(path, fast()).await {
            Ok(run) => {
                run.release(FinalStatus::Done).await.unwrap();
                ("ok".to_string(), String::new())
            }
            Err(e) => (e.code().to_string(), e.to_string()),
        }
    })
}

struct Tally {
    scenarios: u32,
    killed: u32,
}

impl Tally {
    /// Count the bystanders of a scenario that did not survive it.
    fn survivors(&mut self, name: &str, pids: &[u32]) {
        self.scenarios += 1;
        for p in pids {
            if !alive(*p) {
                self.killed += 1;
                eprintln!("{name}: bystander {p} was killed");
            }
        }
    }
}

fn end(children: Vec<Child>) {
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Every scenario in one test, so the summary line counts them all.
#[test]
fn hostile_records_never_kill_a_bystander() {
    let mut tally = Tally {
        scenarios: 0,
        killed: 0,
    };
    let dir = tempfile::tempdir().unwrap();

    // 1. A forged record naming a live bystander exactly (pid, start time, pgid = pid), with
    //    no incarnation digest (as an older runlease wrote them): refused, left alone.
    {
        let path = dir.path().join("forged-plain");
        run_with_one_generation(&path);
        let b = bystander("exec sleep 60", &[]);
        let pid = b.id();
        let f = forge(&path, pid, pid, start_time(pid), None);
        let (code, msg) = open_code(&path);
        assert_eq!(code, "RUN_COMMAND_UNPROVEN", "{msg}");
        assert!(msg.contains(&f) && msg.contains(&pid.to_string()), "{msg}");
        assert!(path.join(&f).exists(), "the record is kept");
        // doctor's view (read-only) says the same.
        let audit = lease_run::audit_commands(&lease_fs::RunDir::open(&path).unwrap()).unwrap();
        assert!(
            matches!(&audit[..], [a] if a.file == f && matches!(a.state, lease_run::CommandState::Unproven { .. })),
            "{audit:?}"
        );
        tally.survivors("forged-plain", &[pid]);
        end(vec![b]);
    }

    // 2. The same with a digest of a secret the bystander does not carry.
    {
        let path = dir.path().join("forged-digest");
        run_with_one_generation(&path);
        let b = bystander("exec sleep 60", &[]);
        let pid = b.id();
        let f = forge(&path, pid, pid, start_time(pid), Some("guessed"));
        let (code, msg) = open_code(&path);
        assert_eq!(code, "RUN_COMMAND_UNPROVEN", "{msg}");
        assert!(msg.contains(&f), "{msg}");
        tally.survivors("forged-digest", &[pid]);
        end(vec![b]);
    }

    // 3. A record whose pgid names another group (a shell's whole job, a session): the
    //    record is invalid, nothing is signalled.
    {
        let path = dir.path().join("forged-group");
        run_with_one_generation(&path);
        let victim_group = bystander("sleep 60 & sleep 60 & wait", &[]);
        let g = victim_group.id();
        std::thread::sleep(Duration::from_millis(100));
        let members = group_members(g);
        assert!(members.len() >= 3, "{members:?}");
        let leader = bystander("exec sleep 60", &[]);
        let pid = leader.id();
        let f = forge(&path, pid, g, start_time(pid), Some("guessed"));
        let (code, msg) = open_code(&path);
        assert_eq!(code, "RECORD_INVALID", "{msg}");
        assert!(msg.contains(&f), "{msg}");
        let mut all = members.clone();
        all.push(pid);
        tally.survivors("forged-group", &all);
        end(vec![victim_group, leader]);
    }

    // 4. Pid reuse after a crash: the recorded command is gone; an unrelated process (later
    //    start time) took its pid, left children in that process group and exited. Nothing
    //    is signalled, the stale record is removed and the open goes on. (The old reaper
    //    killed these children: no process had the pid, so "reused" was never seen.)
    {
        let path = dir.path().join("pid-reuse");
        run_with_one_generation(&path);
        let mut b = bystander("sleep 60 & sleep 60 &", &[]);
        let pid = b.id();
        let started = start_time(pid);
        b.wait().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let members = group_members(pid);
        assert_eq!(members.len(), 2, "{members:?}");
        let f = forge(&path, pid, pid, started - 1, Some("old-secret"));
        let (code, msg) = open_code(&path);
        assert_eq!(code, "ok", "{msg}");
        assert!(!path.join(&f).exists(), "the stale record is removed");
        tally.survivors("pid-reuse", &members);
        for m in members {
            if let Some(p) = rustix::process::Pid::from_raw(i32::try_from(m).unwrap()) {
                let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            }
        }
    }

    // 5. A process that carries the right secret but runs as another uid (as root only):
    //    never ours to signal.
    let setpriv = Path::new("/usr/bin/setpriv").exists();
    if lease_run::procs::euid() == 0 && setpriv {
        let path = dir.path().join("other-uid");
        run_with_one_generation(&path);
        let b = bystander(
            "exec setpriv --reuid 65534 --regid 65534 --clear-groups sleep 60",
            &[("RUNLEASE_INCARNATION", "s5")],
        );
        let pid = b.id();
        // Until the exec into sleep as uid 65534 has happened.
        let end_at = std::time::Instant::now() + Duration::from_secs(5);
        while lease_run::procs::uids_of(pid).map(|u| u.0) != Some(65534) {
            assert!(
                std::time::Instant::now() < end_at,
                "setpriv did not switch uid"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let f = forge(&path, pid, pid, start_time(pid), Some("s5"));
        let (code, msg) = open_code(&path);
        assert_eq!(code, "RUN_COMMAND_UNPROVEN", "{msg}");
        assert!(msg.contains("uid 65534") && msg.contains(&f), "{msg}");
        tally.survivors("other-uid", &[pid]);
        end(vec![b]);
    } else {
        println!("hostile: other-uid scenario SKIPPED (needs root and /usr/bin/setpriv)");
    }

    // Control: a process that does carry generation 1's secret (what runlease gives its
    // commands), with a child that left the group: both are proved ours and reaped, so the
    // scenarios above are refusals of the proof, not a reaper that never kills.
    {
        let path = dir.path().join("control");
        run_with_one_generation(&path);
        let pidfile = dir.path().join("control-daemon.pid");
        let script = format!(
            "(setsid sh -c 'echo $$ > {p}; exec sleep 60' &); exec sleep 60",
            p = pidfile.display()
        );
        let mut b = bystander(&script, &[("RUNLEASE_INCARNATION", "real-secret")]);
        let pid = b.id();
        let end_at = std::time::Instant::now() + Duration::from_secs(5);
        let daemon: u32 = loop {
            if let Some(p) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|t| t.trim().parse().ok())
            {
                break p;
            }
            assert!(std::time::Instant::now() < end_at, "no daemon pid");
            std::thread::sleep(Duration::from_millis(10));
        };
        let f = forge(&path, pid, pid, start_time(pid), Some("real-secret"));
        let audit = lease_run::audit_commands(&lease_fs::RunDir::open(&path).unwrap()).unwrap();
        match &audit[..] {
            [a] => match &a.state {
                lease_run::CommandState::Proved(pids) => {
                    assert!(pids.contains(&pid) && pids.contains(&daemon), "{pids:?}");
                }
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
        let (code, msg) = open_code(&path);
        assert_eq!(code, "ok", "{msg}");
        let _ = b.wait();
        let end_at = std::time::Instant::now() + Duration::from_secs(2);
        while alive(daemon) && std::time::Instant::now() < end_at {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            !alive(daemon),
            "the daemon that left the group carries the secret: reaped"
        );
        assert!(!path.join(&f).exists());
    }

    println!(
        "hostile: scenarios={} bystanders killed={}",
        tally.scenarios, tally.killed
    );
    assert_eq!(tally.killed, 0);
}
