//! Cgroups: a run signals and removes only the cgroups its records prove are its own.

use crate::common::*;
use crate::{cgroup_runlease, cgroup_test_parent, records_forge};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A cgroup directory this test made, with one `sleep` moved into it: on drop (also when
/// the test fails) the sleep is killed and reaped and the directory removed.
struct CgroupFixture {
    path: std::path::PathBuf,
    sleep: Option<std::process::Child>,
}

impl CgroupFixture {
    /// `dir`, created and chowned to `uid`, holding `sleep 300` running as `uid`.
    fn cgroup_new(dir: std::path::PathBuf, uid: u32) -> CgroupFixture {
        std::fs::create_dir(&dir).unwrap();
        let mut fx = CgroupFixture {
            path: dir,
            sleep: None,
        };
        let s = uid.to_string();
        let chown = Command::new("chown")
            .arg("-R")
            .arg(format!("{s}:{s}"))
            .arg(&fx.path)
            .status()
            .unwrap();
        assert!(chown.success());
        let child = Command::new("setpriv")
            .args([
                &format!("--reuid={s}"),
                &format!("--regid={s}"),
                "--clear-groups",
                "sleep",
                "300",
            ])
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        fx.sleep = Some(child);
        std::fs::write(fx.path.join("cgroup.procs"), pid.to_string()).unwrap();
        // setpriv has exec'd sleep as uid once its uid shows.
        let t = Instant::now();
        while lease_run::procs::uids_of(pid) != Some((uid, uid)) {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "sleep never ran as {uid}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        fx
    }

    fn pid(&self) -> u32 {
        self.sleep.as_ref().unwrap().id()
    }

    /// Its identity (inode, uid).
    fn identity(&self) -> lease_core::CommandCgroup {
        lease_run::cgroup::identity(&self.path).unwrap()
    }

    /// The sleep is alive, still in this cgroup, and the directory is there.
    fn cgroup_assert_untouched(&self, what: &str) {
        assert!(
            alive(self.pid()),
            "{what}: the sleep {} was killed",
            self.pid()
        );
        assert!(
            self.path.is_dir(),
            "{what}: {} was removed",
            self.path.display()
        );
        let procs = std::fs::read_to_string(self.path.join("cgroup.procs")).unwrap();
        assert!(
            procs.lines().any(|l| l.trim() == self.pid().to_string()),
            "{what}: the sleep left {}: {procs}",
            self.path.display()
        );
    }
}

impl Drop for CgroupFixture {
    fn drop(&mut self) {
        if let Some(mut c) = self.sleep.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let t = Instant::now();
        while std::fs::remove_dir(&self.path).is_err()
            && self.path.exists()
            && t.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The name `runlease-<key>-` of the run at `dir`'s cgroups, learned from a command's own
/// `/proc/self/cgroup` (the run's first generation, which `run` claims and releases).
fn cgroup_prefix_of(dir: &Path) -> String {
    let o = cgroup_runlease(
        &[],
        &[
            "run",
            dir.to_str().unwrap(),
            "--",
            "grep",
            "^0::",
            "/proc/self/cgroup",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let line = text(&o.stdout);
    let name = line.trim().rsplit('/').next().unwrap().to_string();
    assert!(
        name.starts_with("runlease-"),
        "the command ran outside a run cgroup: {line}"
    );
    name[..name.rfind('-').unwrap() + 1].to_string()
}

/// The head generation of the run at `dir`.
fn records_head(dir: &Path) -> u64 {
    status_json(dir)["generation"].as_u64().unwrap_or(0)
}

/// A root owner facing another user's cgroup named like its run's (in its own cgroup,
/// holding a process of that user, even named by a record with that exact identity), and a
/// same-name cgroup of its own uid whose identity no record names: it signals and removes
/// neither, is not refused, and `doctor` names both with a next step that works.
#[test]
fn cgroup_root_owner_leaves_cgroups_it_cannot_prove_alone() {
    let Some(parent) = cgroup_test_parent("cgroup_root_owner_leaves_cgroups_it_cannot_prove_alone")
    else {
        return;
    };
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let prefix = cgroup_prefix_of(&dir);
    let head = records_head(&dir);
    // Another user's, named for generation 1, holding that user's process; a record of
    // generation 1 names its exact id and owner (anyone who can write the run folder can
    // write that).
    let foreign = CgroupFixture::cgroup_new(parent.join(format!("{prefix}1")), 65534);
    records_forge(&dir, 1, 999_999_001, Some(foreign.identity()));
    // Our own uid's, named for the head generation, holding our process; the record of that
    // generation names another id.
    let own = CgroupFixture::cgroup_new(parent.join(format!("{prefix}{head}")), 0);
    let other_id = lease_core::CommandCgroup {
        id: own.identity().id + 1_000_000,
        uid: 0,
    };
    records_forge(&dir, head, 999_999_002, Some(other_id));

    let doctor = cgroup_runlease(&[], &["doctor", "--json", "--", d]);
    let report = text(&doctor.stdout);
    for (fx, why) in [
        (&foreign, "belongs to uid 65534".to_string()),
        (
            &own,
            format!("is not the one generation {head}'s command records name"),
        ),
    ] {
        let p = fx.path.display().to_string();
        let finding = json_lines(&doctor)
            .into_iter()
            .find(|f| {
                f["code"] == "CGROUP_NOT_PROVEN" && f["detail"].as_str().unwrap_or("").contains(&p)
            })
            .unwrap_or_else(|| panic!("doctor does not name {p}: {report}"));
        assert!(
            finding["detail"].as_str().unwrap().contains(&why),
            "{finding}"
        );
        assert_eq!(finding["severity"], "warning", "{finding}");
        let next = finding["next_step"].as_str().unwrap_or_default();
        assert!(
            next.contains(&format!("rmdir -- {p}")) || next.contains(&format!("rmdir -- '{p}'")),
            "{finding}"
        );
    }
    foreign.cgroup_assert_untouched("doctor");
    own.cgroup_assert_untouched("doctor");

    // Two runs: neither refused, neither touches them.
    for i in 0..2 {
        let o = cgroup_runlease(&[], &["run", d, "--", "true"]);
        assert_eq!(o.status.code(), Some(0), "run {i}: {}", text(&o.stderr));
        foreign.cgroup_assert_untouched("run");
        own.cgroup_assert_untouched("run");
    }
    assert_eq!(
        records_head(&dir),
        head + 4,
        "two runs, two generations each"
    );
    // The next step works: once the processes are stopped, its rmdir removes the folder.
    drop(own);
    drop(foreign);
}

/// A non-root owner (uid 65534, no cgroup of its own to create) facing a cgroup named like
/// its run's that root owns, with a root process in it: every `run` succeeds (no
/// `RUN_COMMANDS_SURVIVE` burning generations), nothing is signalled or removed, and
/// `doctor` names it with a next step whose `rmdir` works once its process is stopped.
#[test]
fn cgroup_non_root_owner_is_not_refused_over_a_foreign_cgroup() {
    let Some(parent) =
        cgroup_test_parent("cgroup_non_root_owner_is_not_refused_over_a_foreign_cgroup")
    else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // A folder of uid 65534 it can reach, and its own copy of the binary (target/ may be
    // rebuilt meanwhile).
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = home.join("runlease");
    let t = Instant::now();
    while std::fs::copy(BIN, &bin).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10), "cannot copy {BIN}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let chown = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(&home)
        .status()
        .unwrap();
    assert!(chown.success());
    let dir = home.join("nobody-run");
    let d = dir.to_str().unwrap();
    let as_nobody = |args: &[&str]| -> Output {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&bin)
            .args(args)
            .env_remove("RUNLEASE_RUN")
            .env_remove("RUNLEASE_INCARNATION")
            .env("HOME", &home)
            .current_dir(&home)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let o = as_nobody(&["init", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let key = lease_run::cgroup::run_key(&dir, "nobody-run");
    let foreign = CgroupFixture::cgroup_new(parent.join(format!("runlease-{key}-1")), 0);
    for i in 0..3 {
        let o = as_nobody(&["run", d, "--", "true"]);
        assert_eq!(o.status.code(), Some(0), "run {i}: {}", text(&o.stderr));
        foreign.cgroup_assert_untouched("run");
    }
    let st = as_nobody(&["status", "--json", d]);
    let gen_ = json_lines(&st).remove(0)["generation"].as_u64().unwrap();
    assert_eq!(gen_, 6, "three runs, two generations each (claim, release)");
    let doctor = as_nobody(&["doctor", "--json", "--", d]);
    let p = foreign.path.display().to_string();
    let finding = json_lines(&doctor)
        .into_iter()
        .find(|f| f["code"] == "CGROUP_NOT_PROVEN")
        .unwrap_or_else(|| panic!("doctor does not name {p}: {}", text(&doctor.stdout)));
    assert!(
        finding["detail"].as_str().unwrap().contains(&p),
        "{finding}"
    );
    assert!(
        finding["detail"].as_str().unwrap().contains("uid 0"),
        "{finding}"
    );
    let next = finding["next_step"].as_str().unwrap().to_string();
    assert!(!next.contains("nothing to do"), "{next}");
    // The step as printed: its rmdir (quoted for sh) removes it once its process is gone.
    let rmdir = next
        .split("(rmdir -- ")
        .nth(1)
        .and_then(|r| r.split(", which").next())
        .unwrap_or_else(|| panic!("no rmdir in {next}"));
    foreign.cgroup_assert_untouched("doctor");
    let mut foreign = foreign;
    if let Some(mut c) = foreign.sleep.take() {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    let t = Instant::now();
    loop {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!("rmdir -- {rmdir}"))
            .output()
            .unwrap();
        if o.status.success() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{rmdir}: {}",
            text(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!foreign.path.exists());
}

/// A killed owner's command left a daemon that dropped every proof a record can check (no
/// environment, no inherited descriptor, its own session): the next owner finds the old
/// cgroup by the identity the record holds (id and uid, below its own cgroup) and kills it
/// there, and removes the directory; the record names exactly that directory.
#[test]
fn cgroup_recorded_identity_lets_the_next_owner_kill_an_unprovable_daemon() {
    let Some(parent) = cgroup_test_parent(
        "cgroup_recorded_identity_lets_the_next_owner_kill_an_unprovable_daemon",
    ) else {
        return;
    };
    let (tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let pidfile = tmp.path().join("daemon.pid");
    // Close every descriptor above 2 (the incarnation's mark among them), clear the
    // environment, leave the session: only the cgroup still says whose it is.
    let script = format!(
        "for i in $(seq 3 4095); do eval \"exec $i>&-\" 2>/dev/null; done; \
         env -i /usr/bin/setsid /bin/sh -c 'echo $$ > {pf}; exec /bin/sleep 300' </dev/null >/dev/null 2>&1 & \
         sleep 300",
        pf = pidfile.display()
    );
    let mut owner = None;
    for _ in 0..50 {
        match cmd(&["run", d, "--", "bash", "-c", &script])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            Ok(c) => {
                owner = Some(c);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(e) => panic!("spawn runlease: {e}"),
        }
    }
    let mut owner = owner.expect("runlease stayed missing");
    let daemon = read_pid(&pidfile);
    // Whatever happens below, the daemon does not outlive the test.
    struct KillOnDrop(u32);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            if alive(self.0) {
                signal(self.0, rustix::process::Signal::KILL);
            }
        }
    }
    let _guard = KillOnDrop(daemon);
    let cg_line = std::fs::read_to_string(format!("/proc/{daemon}/cgroup")).unwrap();
    let rel = cg_line
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap()
        .trim_start_matches('/')
        .to_string();
    let mount = lease_run::cgroup::mount_point().unwrap();
    let cg = mount.join(&rel);
    assert_eq!(
        cg.parent().unwrap(),
        parent,
        "the run's cgroup is below ours: {rel}"
    );
    let ident = lease_run::cgroup::identity(&cg).unwrap();
    // The record names exactly that directory.
    let recs: Vec<lease_core::CommandRecord> = std::fs::read_dir(dir.join("commands"))
        .unwrap()
        .map(|e| lease_core::decode(&std::fs::read(e.unwrap().path()).unwrap()).unwrap())
        .collect();
    assert!(!recs.is_empty());
    for r in &recs {
        assert_eq!(r.cgroup, Some(ident), "{r:?}");
    }
    // The owner is killed with its guard (which would kill the cgroup at once); its
    // command and the daemon live on.
    crash_with_guard(&mut owner);
    std::thread::sleep(Duration::from_millis(100));
    assert!(alive(daemon), "the daemon outlives its owner");
    assert_eq!(
        lease_run::procs::env_var(daemon, "RUNLEASE_INCARNATION"),
        lease_run::procs::EnvVar::Unset
    );
    let o = cgroup_runlease(&[], &["run", d, "--retire-dead", "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    wait_gone(
        daemon,
        Duration::from_secs(5),
        "the daemon was not killed through its cgroup",
    );
    assert!(!cg.exists(), "{} was not removed", cg.display());
}
