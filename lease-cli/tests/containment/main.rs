//! Containment of a run's commands: what runlease signals and removes, and what it leaves
//! alone (issue #29).

#[path = "../common/mod.rs"]
mod common;

use common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

// ---- Issue #29: signal only what is proven (cgroups), bounded cost for forged records ----

/// Whether this test may create and chown cgroups (root, a cgroup2 mount below which this
/// process's own cgroup is writable): `Some(own cgroup dir)`, or `None` after printing why
/// it is skipped (a failure when `RUNLEASE_REQUIRE_CONTAINMENT=1`).
fn cgroup_test_parent(test: &str) -> Option<std::path::PathBuf> {
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

/// `runlease ARGS` to completion, retried when the binary is missing for a moment (another
/// build replacing it).
fn cgroup_runlease(wrapper: &[&str], args: &[&str]) -> Output {
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
fn records_forge(dir: &Path, g: u64, pid: u32, cgroup: Option<lease_core::CommandCgroup>) {
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

/// 5,000 forged command records: `run` is refused before its claim with
/// `RUN_COMMAND_RECORDS_OVER_LIMIT` (65), the folder as it was; `status` reports it and
/// stays about as fast as with three records; `doctor` names it with a next step that
/// works (then `run` succeeds).
#[test]
fn records_five_thousand_forged_are_refused_fast() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    // One run first: the records are of generation 1, below the head (2).
    let o = cgroup_runlease(&[], &["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let time_status = || {
        let t = Instant::now();
        let o = cgroup_runlease(&[], &["status", "--json", d]);
        (t.elapsed(), o)
    };
    for i in 0..3 {
        records_forge(&dir, 1, 4_000_000 + i, None);
    }
    // The baseline: the fastest of three reads with three records.
    let base = (0..3).map(|_| time_status().0).min().unwrap();
    for i in 3..5_000 {
        records_forge(&dir, 1, 4_000_000 + i, None);
    }
    let before = tree_sig(&dir);
    let (took, o) = time_status();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let s = text(&o.stdout);
    assert!(s.contains("RUN_COMMAND_RECORDS_OVER_LIMIT"), "{s}");
    assert!(
        took < base * 5 + Duration::from_secs(1),
        "status took {took:?} with 5,000 records, {base:?} with 3"
    );
    let o = cgroup_runlease(&[], &["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("RUN_COMMAND_RECORDS_OVER_LIMIT"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(
        tree_sig(&dir),
        before,
        "a refusal leaves the folder as it was"
    );
    let doctor = cgroup_runlease(&[], &["doctor", "--json", "--", d]);
    let finding = json_lines(&doctor)
        .into_iter()
        .find(|f| f["code"] == "RUN_COMMAND_RECORDS_OVER_LIMIT")
        .unwrap_or_else(|| panic!("{}", text(&doctor.stdout)));
    let next = finding["next_step"].as_str().unwrap();
    let mv = next
        .split("(mv -- ")
        .nth(1)
        .and_then(|r| r.split(");").next())
        .unwrap_or_else(|| panic!("no mv in {next}"));
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!("mv -- {mv}"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{mv}: {}", text(&o.stderr));
    let o = cgroup_runlease(&[], &["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
}

/// 1,000 forged records (under the limit), each naming a dead pid of this boot: `status`
/// and `run` judge them against one process table, so both finish, and the open removes
/// them.
#[test]
fn records_under_the_limit_are_judged_and_removed() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    // One run first: the records are of generation 1, below the head (2).
    let o = cgroup_runlease(&[], &["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    for i in 0..1_000 {
        records_forge(&dir, 1, 4_100_000 + i, None);
    }
    let o = cgroup_runlease(&[], &["status", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        !text(&o.stdout).contains("OVER_LIMIT"),
        "{}",
        text(&o.stdout)
    );
    let o = cgroup_runlease(&[], &["run", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let left = std::fs::read_dir(dir.join("commands")).map_or(0, |r| r.count());
    assert_eq!(left, 0, "the open removed the records of gone processes");
}

// ---- Issue #29: everything a run started dies with it, without a cgroup too ----
//
// An unprivileged owner (uid 65534 through `setpriv`, no cgroup: it may create none) runs
// a command that double-forks a grandchild out of its group and session (`setsid`), also
// with `env -i` (no `RUNLEASE_INCARNATION`) and under `nohup`. The grandchild must be dead
// after a normal exit, after a fence (the owner SIGSTOPped past `--self-fence-after`), and
// after a crash (SIGKILL of the owner) once the next `runlease run` of the folder opened
// it. Each grandchild is found by a unique argv (`sleep 6661.<n>`), and killed at the end
// of the test whatever happened.

/// The unprivileged user and group.
const NC_NOBODY: u32 = 65534;

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

fn nc_skip(test: &str, why: &str) {
    assert!(
        std::env::var("RUNLEASE_REQUIRE_CONTAINMENT").as_deref() != Ok("1"),
        "{test}: RUNLEASE_REQUIRE_CONTAINMENT=1 but {why}"
    );
    eprintln!("SKIPPED {test}: {why}");
}

impl NcNobody {
    fn new(test: &str) -> Option<NcNobody> {
        if !rustix::process::geteuid().is_root() {
            nc_skip(test, "not root: cannot switch to uid 65534 with setpriv");
            return None;
        }
        if Command::new("setpriv").arg("--version").output().is_err() {
            nc_skip(test, "no setpriv (util-linux)");
            return None;
        }
        let tmp = tempfile::tempdir().unwrap();
        // The temp folder's ancestors must let uid 65534 through.
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut a = tmp.path().parent();
        while let Some(p) = a {
            let mode = std::fs::metadata(p)
                .map(|m| m.permissions().mode())
                .unwrap_or(0);
            if mode & 0o001 == 0 {
                nc_skip(
                    test,
                    &format!(
                        "{} is not searchable by uid 65534 (mode {mode:o})",
                        p.display()
                    ),
                );
                return None;
            }
            a = p.parent();
        }
        let home = tmp.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let bin = home.join("runlease");
        let t = Instant::now();
        while std::fs::copy(BIN, &bin).is_err() {
            if t.elapsed() > Duration::from_secs(10) {
                nc_skip(test, &format!("cannot copy {BIN} for uid 65534"));
                return None;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&home, Some(NC_NOBODY), Some(NC_NOBODY)).unwrap();
        let nb = NcNobody {
            dir: home.join("run"),
            _tmp: tmp,
            home,
            bin,
        };
        let v = nb.cmd(&["--version"]).output().unwrap();
        if !v.status.success() {
            nc_skip(
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
    while lease_run::procs::uids_of(pid) != Some((NC_NOBODY, NC_NOBODY)) || tag.live().is_empty() {
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
        std::os::unix::fs::chown(&f, Some(NC_NOBODY), Some(NC_NOBODY)).unwrap();
        f
    };
    std::fs::create_dir_all(nb.dir.join("commands")).unwrap();
    std::os::unix::fs::chown(nb.dir.join("commands"), Some(NC_NOBODY), Some(NC_NOBODY)).unwrap();
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
    // The owner is killed; its command and the daemon live on.
    owner.kill().unwrap();
    owner.wait().unwrap();
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
