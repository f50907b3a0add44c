//! Helpers shared by the end-to-end tests of the `runlease` binary (real processes, real
//! run folders in private temp folders).
#![allow(dead_code)] // each test file uses a different subset

use rustix::process::{Pid, Signal};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod figure;
#[allow(unused_imports)] // each test file uses a different subset
pub use figure::figure;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_runlease");

/// A short but safe timing policy for tests (heartbeat 100 ms).
pub const FAST: [&str; 6] = [
    "--heartbeat",
    "100",
    "--self-fence-after",
    "500",
    "--stale-after",
    "1000",
];

/// A `runlease` command with no owner token, authority or RUST_LOG inherited and no terminal
/// stdin.
pub fn cmd(args: &[&str]) -> Command {
    cmd_under(&[], args)
}

/// [`cmd`] started through `wrapper` (a program and its arguments that exec what follows,
/// e.g. `unshare --time`), or directly when `wrapper` is empty.
pub fn cmd_under(wrapper: &[&str], args: &[&str]) -> Command {
    let mut c = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    scrub_owner_env(c.args(args))
        .env("PATH", path_with_binary())
        // The default log filter (warnings), whatever RUST_LOG the test run has.
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

/// Remove every variable an owner gives its commands (token, socket, secret, mark), so a
/// test run under `runlease run` does not act as that owner's command.
pub fn scrub_owner_env(c: &mut Command) -> &mut Command {
    for var in [
        "RUNLEASE_RUN",
        "RUNLEASE_GENERATION",
        "RUNLEASE_OWNER",
        "RUNLEASE_AUTHORITY",
        "RUNLEASE_STORE_SOCKET",
        "RUNLEASE_INCARNATION",
        "RUNLEASE_INCARNATION_FD",
    ] {
        c.env_remove(var);
    }
    c
}

/// Write `rec` as its command record in the run folder `dir` (`commands/` made if
/// missing), exclusively and 0600 as runlease writes one; returns its path.
pub fn plant_command_record(dir: &Path, rec: &lease_core::CommandRecord) -> PathBuf {
    use std::os::unix::fs::OpenOptionsExt as _;
    let f = dir.join(
        lease_core::FileRef::Command {
            generation: rec.generation,
            pid: rec.pid,
        }
        .path(),
    );
    std::fs::create_dir_all(dir.join("commands")).unwrap();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&f)
        .unwrap();
    std::io::Write::write_all(&mut file, &lease_core::encode(rec).unwrap()).unwrap();
    f
}

/// Run `runlease` to completion.
pub fn runlease(args: &[&str]) -> Output {
    cmd(args).output().expect("spawn runlease")
}

/// Start `runlease` in the background, stdout and stderr piped.
pub fn spawn(args: &[&str]) -> Child {
    cmd(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runlease")
}

/// Bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every stdout line that is a JSON object with a `schema` (the command's own output, for
/// `run`, is skipped).
pub fn json_lines(o: &Output) -> Vec<Value> {
    text(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("schema").is_some())
        .collect()
}

/// `status --json` of one run (must succeed).
pub fn status_json(dir: &Path) -> Value {
    let o = runlease(&["status", "--json", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    json_lines(&o).remove(0)
}

/// Poll `status` until the run is in `state` (or panic after `within`).
pub fn wait_for_state(dir: &Path, state: &str, within: Duration) -> Value {
    let t = Instant::now();
    loop {
        // The folder may not exist yet while a spawned `run` starts.
        let o = runlease(&["status", "--json", dir.to_str().unwrap()]);
        let s = json_lines(&o).pop().unwrap_or_default();
        if o.status.code() == Some(0) && s["state"] == state {
            return s;
        }
        assert!(t.elapsed() < within, "run never became {state}: {s}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait for a child to exit (or panic after `within`).
pub fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        assert!(t.elapsed() < within, "process {} did not exit", child.id());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Send a signal to a process.
pub fn signal(pid: u32, sig: Signal) {
    let pid = Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
    rustix::process::kill_process(pid, sig).expect("signal");
}

/// Whether a process exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    lease_fs::probe::read_stat(pid)
        .ok()
        .flatten()
        .is_some_and(|st| !st.exited())
}

/// The guard process of `runlease run` process `owner` (issue #31): its child whose
/// argv[0] is `runlease-guard`, waited for up to 10 s (it starts with the command).
pub fn guard_of(owner: u32) -> Option<u32> {
    let t = Instant::now();
    loop {
        let found = std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                lease_run::procs::proc_info(*pid).is_some_and(|p| p.ppid == owner)
                    && std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| c.starts_with(b"runlease-guard\0"))
            });
        if found.is_some() || t.elapsed() > Duration::from_secs(10) {
            return found;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGKILL `runlease run` process `owner` **and its guard** (a crash that takes both, such
/// as the OOM killer's or a `kill -9` by name): its command outlives it, for a test of what
/// the next owner does with a crashed owner's command. SIGKILL of the owner alone is not
/// that crash any more: its guard kills the command at once (issue #31).
pub fn crash_with_guard(owner: &mut Child) {
    kill_guard(owner.id());
    signal(owner.id(), Signal::KILL);
    let _ = owner.wait();
}

/// SIGKILL the guard of `runlease run` process `owner` (which runs on unaffected, with its
/// watchdog thread as the only kill): for a test whose scenario needs a stopped or crashed
/// owner's command to run on, as it did before issue #31 and still does once its guard died.
pub fn kill_guard(owner: u32) {
    let guard = guard_of(owner).expect("the owner's guard");
    signal(guard, Signal::KILL);
    wait_gone(guard, Duration::from_secs(5), "the guard survived SIGKILL");
}

/// PATH with the binary's folder first (so commands under `run` find `runlease`).
pub fn path_with_binary() -> String {
    let bin_dir = Path::new(BIN).parent().unwrap().display().to_string();
    format!("{bin_dir}:{}", std::env::var("PATH").unwrap_or_default())
}

/// The unprivileged user and group the other-user cases switch to (`setpriv`).
pub const NOBODY: u32 = 65534;

/// Say why `test` cannot run its other-user case here and return; a failure instead
/// where every case is required (`RUNLEASE_REQUIRE_CONTAINMENT=1`, CI as root).
pub fn skip_unless_required(test: &str, why: &str) {
    assert!(
        std::env::var("RUNLEASE_REQUIRE_CONTAINMENT").as_deref() != Ok("1"),
        "{test}: RUNLEASE_REQUIRE_CONTAINMENT=1 but {why}"
    );
    eprintln!("SKIPPED {test}: {why}");
}

/// A home of uid [`NOBODY`] in `tmp` with its own copy of the binary (target/ may be
/// rebuilt by a concurrent build meanwhile, and its path may not be reachable by that
/// user): `(home, bin)`. `tmp` is made `0755`. `None` after [`skip_unless_required`] where
/// that is impossible (not root, no setpriv, a temp folder uid 65534 cannot reach).
pub fn nobody_home(test: &str, tmp: &Path) -> Option<(PathBuf, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    let skip = |why: &str| {
        skip_unless_required(test, why);
        None
    };
    if !rustix::process::geteuid().is_root() {
        return skip("not root: cannot switch to uid 65534 with setpriv");
    }
    if Command::new("setpriv").arg("--version").output().is_err() {
        return skip("no setpriv (util-linux)");
    }
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    for p in tmp.ancestors().skip(1) {
        let mode = std::fs::metadata(p).map_or(0, |m| m.permissions().mode());
        if mode & 0o001 == 0 {
            return skip(&format!(
                "{} is not searchable by uid 65534 (mode {mode:o})",
                p.display()
            ));
        }
    }
    let home = tmp.join("home");
    std::fs::create_dir(&home).unwrap();
    let bin = home.join("runlease");
    let t = Instant::now();
    while std::fs::copy(BIN, &bin).is_err() {
        if t.elapsed() > Duration::from_secs(10) {
            return skip(&format!("cannot copy {BIN} for uid 65534"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).unwrap();
    Some((home, bin))
}

/// A private temp folder and a run folder path inside it (not created).
pub fn scratch() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo-run");
    (tmp, dir)
}

/// Wait until `path` exists (a command under `run` touched it), or panic with `what` after
/// `within`.
pub fn wait_for_file(path: &Path, within: Duration, what: &str) {
    let t = Instant::now();
    while !path.exists() {
        assert!(t.elapsed() < within, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until process `pid` is gone (see `alive`), or panic with `what` after `within`.
pub fn wait_gone(pid: u32, within: Duration, what: &str) {
    let t = Instant::now();
    while alive(pid) {
        assert!(t.elapsed() < within, "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait until `file` holds a pid (written by a command under `run`).
pub fn read_pid(file: &Path) -> u32 {
    let t = Instant::now();
    loop {
        if let Some(p) = std::fs::read_to_string(file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return p;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "child never started");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Everything below `root`: relative path -> file bytes, `dir`, or `symlink -> target`.
/// Symlinks are recorded, never followed.
pub fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(rel, format!("symlink -> {}", t.display()).into_bytes());
            } else if m.is_dir() {
                out.insert(rel, b"dir".to_vec());
                walk(root, &p, out);
            } else {
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// The path of epoch record `g` of a run.
pub fn epoch_file(dir: &Path, g: u64) -> PathBuf {
    dir.join("lease/epochs").join(format!("{g:020}.json"))
}

/// Everything below `root`, never following a symlink nor opening a FIFO: path →
/// (kind, mode, uid, bytes). What a refusal must leave unchanged: unlike [`tree`], modes
/// and owners count, and a FIFO is recorded, never opened (a read would block).
pub fn tree_sig(root: &Path) -> BTreeMap<String, (char, u32, u32, Vec<u8>)> {
    use std::os::unix::fs::MetadataExt;
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (char, u32, u32, Vec<u8>)>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let t = m.file_type();
            let (kind, bytes) = if t.is_symlink() {
                (
                    'l',
                    std::fs::read_link(&p)
                        .unwrap()
                        .display()
                        .to_string()
                        .into_bytes(),
                )
            } else if t.is_dir() {
                ('d', Vec::new())
            } else if t.is_file() {
                ('f', std::fs::read(&p).unwrap_or_default())
            } else {
                ('o', Vec::new())
            };
            out.insert(rel, (kind, m.mode(), m.uid(), bytes));
            if t.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// Make a FIFO at `p` (0600).
pub fn mkfifo(p: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
}

/// `cp -a from to` (`to` must not exist): the test's own copy of a folder, modes, owners
/// and names kept.
pub fn copy_tree(from: &Path, to: &Path) {
    let o = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .unwrap();
    assert!(o.status.success(), "cp: {}", text(&o.stderr));
}
