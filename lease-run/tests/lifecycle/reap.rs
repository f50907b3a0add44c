//! Command records and reaping: a command is recorded before it runs, a killed
//! incarnation's commands are reaped by the next open, an unkillable one refuses it, and a
//! detached release hands its command over.

use crate::helpers::{alive, args, fast, helper_cmd, now_ts, read_status, rt};
use lease_core::{FileRef, Generation, Identity, RunState};
use lease_run::{FinalStatus, OpenOptions, Run};
use rustix::process::Signal;
use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[test]
fn spawn_records_the_command_before_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-c");
    let marker = dir.path().join("marker");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let script = r#"f="$RUNDIR/commands/$(printf %020d "$RUNLEASE_GENERATION")-$$.json"; if [ -s "$f" ]; then echo recorded > "$MARKER"; else echo missing > "$MARKER"; fi"#;
        let argv: Vec<String> = ["sh", "-c", script].iter().map(|s| s.to_string()).collect();
        let env = vec![
            ("RUNDIR".to_string(), path.display().to_string()),
            ("MARKER".to_string(), marker.display().to_string()),
        ];
        let mut cmd = run.spawn(&argv, &env).await.unwrap();
        assert!(cmd.wait().await.unwrap().success());
        assert_eq!(std::fs::read_to_string(&marker).unwrap().trim(), "recorded");
        run.release(FinalStatus::Done).await.unwrap();
        // Records of this generation are removed once its commands are gone.
        assert_eq!(std::fs::read_dir(path.join("commands")).unwrap().count(), 0);
    });
}

#[test]
fn reap_kills_a_killed_incarnations_command_on_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-f");
    let mut owner = helper_cmd("owner-with-command", &path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(owner.stdout.take().unwrap()).lines();
    let pid: u32 = loop {
        let l = lines.next().expect("helper output").unwrap();
        if let Some(p) = l.split("PID ").nth(1) {
            break p.trim().parse().unwrap();
        }
    };
    owner.kill().unwrap();
    owner.wait().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(alive(pid), "the command outlives its owner");
    assert_eq!(std::fs::read_dir(path.join("commands")).unwrap().count(), 1);
    let mut opts = fast();
    opts.retire_dead = true;
    rt().block_on(async {
        let run = Run::open(&path, opts).await.unwrap();
        assert!(
            !alive(pid),
            "reaped (it ignores SIGTERM: killed after the grace)"
        );
        assert_eq!(std::fs::read_dir(path.join("commands")).unwrap().count(), 0);
        run.release(FinalStatus::Done).await.unwrap();
    });
}

/// Write a file 0600, as runlease writes its records.
fn write_private(p: &Path, bytes: &[u8]) {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)
        .unwrap();
    f.write_all(bytes).unwrap();
}

/// The incarnation secret the frozen process carries.
const FROZEN_SECRET: &str = "frozen-test-secret";

/// A process SIGKILL cannot end while its cgroup v1 freezer keeps it frozen: the test owns
/// it and refuses to let it die until the end.
struct Frozen {
    cg: PathBuf,
    child: std::process::Child,
}

impl Frozen {
    fn start() -> Option<Frozen> {
        let root = Path::new("/sys/fs/cgroup/freezer");
        if !root.join("freezer.state").exists() && !root.join("cgroup.procs").exists() {
            return None;
        }
        let cg = root.join(format!("lease-run-test-{}", std::process::id()));
        std::fs::create_dir(&cg).ok()?;
        let mut cmd = std::process::Command::new("sleep");
        // The proof a reaper asks for (PROTOCOL §11.1): the test records the digest of
        // this secret in the command record it forges for generation 1.
        cmd.arg("60")
            .process_group(0)
            .env("RUNLEASE_INCARNATION", FROZEN_SECRET);
        let child = cmd.spawn().ok()?;
        let f = Frozen { cg, child };
        std::fs::write(f.cg.join("cgroup.procs"), f.child.id().to_string()).ok()?;
        std::fs::write(f.cg.join("freezer.state"), "FROZEN").ok()?;
        let end = Instant::now() + Duration::from_secs(2);
        while std::fs::read_to_string(f.cg.join("freezer.state"))
            .ok()?
            .trim()
            != "FROZEN"
        {
            if Instant::now() > end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(f)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = std::fs::write(self.cg.join("freezer.state"), "THAWED");
        let _ = self.child.wait();
        let _ = std::fs::remove_dir(&self.cg);
    }
}

#[test]
fn a_recorded_command_that_cannot_be_killed_refuses_the_open_76_and_its_record_is_kept() {
    let Some(frozen) = Frozen::start() else {
        eprintln!(
            "SKIPPED: no writable cgroup v1 freezer here (needs root); cannot make an unkillable process"
        );
        return;
    };
    let pid = frozen.child.id();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-m");
    let opts = OpenOptions {
        kill_wait: Duration::from_millis(300),
        ..fast()
    };
    rt().block_on(async {
        // Generation 1 recorded the frozen process as its command and crashed.
        let run = Run::open(&path, opts.clone()).await.unwrap();
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
        let rec = lease_core::CommandRecord {
            run_id: lease_core::RunId::new("run-m").unwrap(),
            generation: Generation::new(1).unwrap(),
            pid,
            pgid: pid,
            start_time: lease_fs::probe::process_start_time(pid).unwrap().unwrap(),
            boot_id: Identity::new(lease_fs::probe::boot_id().unwrap()).unwrap(),
            argv: args(&["sleep", "60"]),
            started_at: now_ts(),
            incarnation: Some(lease_core::CommandRecord::incarnation_digest(
                &lease_core::RunId::new("run-m").unwrap(),
                Generation::new(1).unwrap(),
                FROZEN_SECRET,
            )),
            cgroup: None,
            mark: None,
        };
        let f = FileRef::Command {
            generation: Generation::new(1).unwrap(),
            pid,
        };
        std::fs::create_dir_all(path.join("commands")).unwrap();
        write_private(&path.join(f.path()), &lease_core::encode(&rec).unwrap());

        let e = Run::open(&path, opts.clone()).await.unwrap_err();
        assert_eq!(e.code().as_str(), "RUN_COMMANDS_SURVIVE", "{e}");
        assert!(alive(pid), "frozen: SIGKILL is pending, it cannot die");
        assert!(
            path.join(f.path()).exists(),
            "the record is kept for the next try"
        );
        let st = read_status(&path);
        assert_eq!(st.status, RunState::Failed);
        assert!(st.detail.unwrap().starts_with("RUN_COMMANDS_SURVIVE"));
        drop(frozen); // thawed: the pending SIGKILL ends it
        let run = Run::open(&path, opts).await.unwrap();
        assert!(!path.join(f.path()).exists(), "reaped and removed");
        run.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn release_detached_hands_over_while_the_command_runs_on_and_the_next_open_spares_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-detach");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let g = run.generation().get();
        let mut cmd = run.spawn(&args(&["sleep", "30"]), &[]).await.unwrap();
        let pid = cmd.pid();
        let cg = run.cgroup();
        run.release_detached(FinalStatus::Done).await.unwrap();
        if let Some(cg) = cg {
            // Moved up into the owner's cgroup; the incarnation's directory is gone.
            assert!(!cg.exists(), "{}", cg.display());
            let its = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
            assert!(!its.contains("runlease-"), "{its}");
        } else {
            eprintln!("no cgroup v2 subtree here: only the group/session path is checked");
        }
        // Handed over: released, its record gone, the command untouched.
        let s = read_status(&path);
        assert_eq!(s.status, RunState::Done);
        assert_eq!(std::fs::read_dir(path.join("commands")).unwrap().count(), 0);
        assert!(alive(pid), "a detached command was stopped");
        // The next owner claims and does not reap it; past the old generation's self-fence
        // deadline nothing kills it either (the watchdog no longer tracks it).
        let next = Run::open(&path, fast()).await.unwrap();
        assert!(next.generation().get() > g);
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(
            alive(pid),
            "the next open or the old watchdog killed a detached command: {:?} {:?}",
            lease_run::procs::state_of(pid),
            cmd.wait().await
        );
        next.release(FinalStatus::Done).await.unwrap();
        procs_kill(pid);
        let _ = cmd.wait().await;
    });
}

fn procs_kill(pid: u32) {
    lease_run::procs::kill_group(pid, Signal::KILL);
}
