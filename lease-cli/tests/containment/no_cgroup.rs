//! Without a cgroup: every process a run started dies with it, escaped ones too.

use crate::cgroup_test_parent;
use crate::common::*;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

// An unprivileged owner (uid 65534 through `setpriv`, no cgroup: it may create none) runs
// a command that double-forks a grandchild out of its group and session (`setsid`), also
// with `env -i` (no `RUNLEASE_INCARNATION`) and under `nohup`. The grandchild must be dead
// after a normal exit, after a fence (the owner SIGSTOPped past `--self-fence-after`), and
// after a crash (SIGKILL of the owner) once the next `runlease run` of the folder opened
// it. Each grandchild is found by a unique argv (`sleep 6661.<n>`), and killed at the end
// of the test whatever happened.

/// A folder of uid 65534 holding its own copy of the binary (target/ may be rebuilt by a
/// concurrent build meanwhile, and its path may not be reachable by uid 65534) and a run
/// folder path; `None` after printing why the unprivileged setup is impossible here (a
/// failure when `RUNLEASE_REQUIRE_CONTAINMENT=1`).
struct NcNobody {
    _tmp: tempfile::TempDir,
    home: std::path::PathBuf,
    bin: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl NcNobody {
    fn new(test: &str) -> Option<NcNobody> {
        let tmp = tempfile::tempdir().unwrap();
        let (home, bin) = nobody_home(test, tmp.path())?;
        let nb = NcNobody {
            dir: home.join("run"),
            _tmp: tmp,
            home,
            bin,
        };
        let v = nb.cmd(&["--version"]).output().unwrap();
        if !v.status.success() {
            skip_unless_required(
                test,
                &format!("uid 65534 cannot run the binary: {}", text(&v.stderr)),
            );
            return None;
        }
        Some(nb)
    }

    /// `runlease ARGS` as uid 65534 (setpriv execs it: the child's pid is the owner's).
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&self.bin)
            .args(args);
        scrub_owner_env(&mut c)
            .env("HOME", &self.home)
            .env("PATH", format!("{}:/usr/bin:/bin", self.home.display()))
            .current_dir(&self.home)
            .stdin(std::process::Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// Started in the background, its stderr to `owner.err` (never a pipe: a grandchild
    /// that survives would hold it open, and reading it to its end would hang the test).
    fn spawn(&self, args: &[&str]) -> std::process::Child {
        let err = std::fs::File::create(self.home.join("owner.err")).unwrap();
        self.cmd(args)
            .stdout(std::process::Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap()
    }

    /// What the last [`NcNobody::spawn`]ed owner wrote to stderr.
    fn spawned_err(&self) -> String {
        std::fs::read_to_string(self.home.join("owner.err")).unwrap_or_default()
    }

    fn d(&self) -> &str {
        self.dir.to_str().unwrap()
    }
}

/// How the command leaves its grandchild behind.
#[derive(Clone, Copy, Debug)]
enum NcEscape {
    /// `( setsid sleep T & )`: out of the group and the session, parent gone.
    Setsid,
    /// The same with `env -i`: no `RUNLEASE_INCARNATION` either.
    EnvI,
    /// `( nohup setsid sleep T & )`: SIGHUP ignored too.
    Nohup,
}

/// A unique `sleep` argument (and the grandchild's argv): killed (SIGKILL, whoever owns it)
/// when dropped.
struct NcTag(String);

impl NcTag {
    fn new() -> NcTag {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        NcTag(format!(
            "6661.{}{:03}{:06}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst),
            nanos / 1000
        ))
    }

    /// The live (not exited) processes whose argv is exactly `[.../]sleep <tag>`.
    fn live(&self) -> Vec<u32> {
        let want = format!("sleep\0{}\0", self.0);
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    c.ends_with(want.as_bytes())
                        && (c.len() == want.len() || c[..c.len() - want.len()].ends_with(b"/"))
                })
            })
            .filter(|pid| alive(*pid))
            .collect()
    }

    /// The shell script: leave the grandchild behind, then `then`.
    fn script(&self, how: NcEscape, then: &str) -> String {
        let t = &self.0;
        match how {
            NcEscape::Setsid => format!("( setsid sleep {t} & ); {then}"),
            NcEscape::EnvI => format!("( env -i /usr/bin/setsid /bin/sleep {t} & ); {then}"),
            NcEscape::Nohup => {
                format!("( nohup setsid sleep {t} >/dev/null 2>&1 & ); {then}")
            }
        }
    }

    /// Wait until the grandchild runs and has been reparented away from the command's
    /// tree (to the owner, a subreaper: its parent is `owner`); its pid.
    fn wait_orphaned(&self, owner: u32) -> u32 {
        let t = Instant::now();
        loop {
            if let Some(pid) = self.live().first() {
                let ppid = lease_run::procs::proc_info(*pid).map(|p| p.ppid);
                if ppid == Some(owner) {
                    return *pid;
                }
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the grandchild sleep {} never ran as an orphan of {owner}",
                self.0
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Every grandchild is gone (a zombie counts as gone), within a short wait.
    fn assert_dead(&self, what: &str) {
        let t = Instant::now();
        while !self.live().is_empty() {
            assert!(
                t.elapsed() < Duration::from_millis(500),
                "{what}: the grandchild sleep {} still runs: {:?}",
                self.0,
                self.live()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for NcTag {
    fn drop(&mut self) {
        for pid in self.live() {
            if let Some(h) = lease_run::procs::HeldProcess::current(pid) {
                let _ = h.signal(rustix::process::Signal::KILL);
            }
        }
    }
}

/// No cgroup holds the command: its `/proc/self/cgroup` (written by the command to
/// `file`) names no runlease directory.
fn nc_assert_no_cgroup(file: &Path) {
    let cg = std::fs::read_to_string(file).unwrap_or_default();
    assert!(!cg.is_empty(), "the command wrote no {}", file.display());
    assert!(
        !cg.contains("runlease-"),
        "the command ran in a run cgroup: {cg}"
    );
}

/// (a) normal exit, (b) fence, (c) crash then the next run, for one way of escaping.
fn nc_all_three(test: &str, how: NcEscape) {
    let Some(nb) = NcNobody::new(test) else {
        return;
    };
    let d = nb.d();
    let cgfile = nb.home.join("cgroup.txt");
    let cgcat = format!("cat /proc/self/cgroup > '{}'", cgfile.display());

    // (a) The command exits 0 a second after leaving the grandchild behind (seen running,
    // reparented to the owner, before that).
    let tag = NcTag::new();
    let script = tag.script(how, &format!("{cgcat}; sleep 1"));
    let mut owner = nb.spawn(&[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat());
    tag.wait_orphaned(owner.id());
    let st = wait_exit(&mut owner, Duration::from_secs(15));
    assert_eq!(st.code(), Some(0), "{test} (a): {}", nb.spawned_err());
    nc_assert_no_cgroup(&cgfile);
    tag.assert_dead(&format!("{test} (a) after a normal exit"));
    drop(tag);

    // (b) The owner is stopped past its self-fence deadline: on resume it fences, kills
    // and exits 75 once nothing of the run is left.
    let tag = NcTag::new();
    let script = tag.script(how, "sleep 30");
    let mut owner = nb.spawn(&[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat());
    tag.wait_orphaned(owner.id());
    signal(owner.id(), rustix::process::Signal::STOP);
    std::thread::sleep(Duration::from_millis(900));
    signal(owner.id(), rustix::process::Signal::CONT);
    let st = wait_exit(&mut owner, Duration::from_secs(15));
    assert_eq!(st.code(), Some(75), "{test} (b): {}", nb.spawned_err());
    tag.assert_dead(&format!("{test} (b) after the fence"));
    drop(tag);

    // (c) The owner is SIGKILLed: its command and the grandchild outlive it (reparented
    // to init); the next `run` of the folder proves and kills them before its command.
    // (The fenced owner of (b) left the run to a dead owner: retire it.)
    let tag = NcTag::new();
    let script = tag.script(how, "sleep 30");
    let mut owner = nb.spawn(
        &[
            &["run", d, "--retire-dead"][..],
            &FAST,
            &["--", "sh", "-c", &script],
        ]
        .concat(),
    );
    let grandchild = tag.wait_orphaned(owner.id());
    owner.kill().unwrap();
    owner.wait().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        alive(grandchild),
        "{test} (c): the crash itself killed the grandchild"
    );
    let o = nb.run(&[&["run", d, "--retire-dead"][..], &FAST, &["--", "true"]].concat());
    assert_eq!(o.status.code(), Some(0), "{test} (c): {}", text(&o.stderr));
    tag.assert_dead(&format!("{test} (c) after a crash and the next run"));
}

#[test]
fn no_cgroup_setsid_grandchild_dies_at_exit_on_fence_and_after_a_crash() {
    nc_all_three(
        "no_cgroup_setsid_grandchild_dies_at_exit_on_fence_and_after_a_crash",
        NcEscape::Setsid,
    );
}

#[test]
fn no_cgroup_env_i_grandchild_dies_at_exit_on_fence_and_after_a_crash() {
    nc_all_three(
        "no_cgroup_env_i_grandchild_dies_at_exit_on_fence_and_after_a_crash",
        NcEscape::EnvI,
    );
}

#[test]
fn no_cgroup_nohup_grandchild_dies_at_exit_on_fence_and_after_a_crash() {
    nc_all_three(
        "no_cgroup_nohup_grandchild_dies_at_exit_on_fence_and_after_a_crash",
        NcEscape::Nohup,
    );
}

/// An unrelated process of the owner's uid (uid 65534, started by the test, not by any
/// run) named by a forged command record with a digest and a mark it does not hold, and
/// then merely started after a forged record's command: never signalled. The first open
/// is refused `RUN_COMMAND_UNPROVEN` (76); the second proceeds.
#[test]
fn no_cgroup_a_forged_record_never_gets_an_unrelated_process_signalled() {
    let test = "no_cgroup_a_forged_record_never_gets_an_unrelated_process_signalled";
    use std::os::unix::process::CommandExt as _;
    let Some(nb) = NcNobody::new(test) else {
        return;
    };
    let d = nb.d();
    let o = nb.run(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let tag = NcTag::new();
    let mut victim = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "sleep",
            &tag.0,
        ])
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = victim.id();
    let t = Instant::now();
    while lease_run::procs::uids_of(pid) != Some((NOBODY, NOBODY)) || tag.live().is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the victim never ran as 65534"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let start = lease_fs::probe::process_start_time(pid).unwrap().unwrap();
    let forge = |leader: u32, start_time: u64| {
        let g = lease_core::Generation::new(1).unwrap();
        let digest = lease_core::Digest::of(tag.0.as_bytes());
        let rec = lease_core::CommandRecord {
            run_id: lease_core::RunId::new("run").unwrap(),
            generation: g,
            pid: leader,
            pgid: leader,
            start_time,
            boot_id: lease_core::Identity::new(lease_fs::probe::boot_id().unwrap()).unwrap(),
            argv: vec!["sleep".into(), tag.0.clone()],
            started_at: lease_core::Timestamp::from_unix_millis(1_796_169_600_000).unwrap(),
            incarnation: Some(digest.clone()),
            cgroup: None,
            mark: Some(lease_core::CommandMark {
                name: lease_core::CommandMark::name_for(&digest),
                dev: 1,
                ino: 1,
            }),
        };
        let f = plant_command_record(&nb.dir, &rec);
        std::os::unix::fs::chown(&f, Some(NOBODY), Some(NOBODY)).unwrap();
        f
    };
    std::fs::create_dir_all(nb.dir.join("commands")).unwrap();
    std::os::unix::fs::chown(nb.dir.join("commands"), Some(NOBODY), Some(NOBODY)).unwrap();
    // 1. The record names the victim itself.
    let f = forge(pid, start);
    let o = nb.run(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("RUN_COMMAND_UNPROVEN"),
        "{}",
        text(&o.stderr)
    );
    assert!(
        alive(pid),
        "the victim named by a forged record was signalled"
    );
    std::fs::remove_file(&f).unwrap();
    // 2. The record names a gone leader that started before the victim.
    let mut gone = Command::new("true").spawn().unwrap();
    let gone_pid = gone.id();
    gone.wait().unwrap();
    forge(gone_pid, start.saturating_sub(1));
    let o = nb.run(&["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        alive(pid),
        "an unrelated process started after a forged record's command was signalled"
    );
    let _ = victim.kill();
    let _ = victim.wait();
}

/// As root with a cgroup v2 subtree (when this machine has one): the `setsid` grandchild
/// is in the run's cgroup and dies at the normal exit all the same.
#[test]
fn no_cgroup_needed_but_with_cgroup2_the_setsid_grandchild_dies_too() {
    let test = "no_cgroup_needed_but_with_cgroup2_the_setsid_grandchild_dies_too";
    if cgroup_test_parent(test).is_none() {
        return;
    }
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let tag = NcTag::new();
    let script = tag.script(NcEscape::Setsid, "sleep 0.5");
    // stderr to a file, never a pipe a surviving grandchild would hold open.
    let err = _tmp.path().join("owner.err");
    let st = cmd_under(
        &[],
        &[&["run", d][..], &FAST, &["--", "sh", "-c", &script]].concat(),
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::fs::File::create(&err).unwrap())
    .status()
    .unwrap();
    let err = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!(st.code(), Some(0), "{err}");
    tag.assert_dead("with a cgroup, after a normal exit");
}
