//! A connection flood against the store socket (issue #29): an owner under `runlease run`
//! whose command commits in a loop (`runlease store put`, a new connection and handshake
//! each time), while unauthenticated connections are opened and held (half silent, half
//! sending garbage; reopened as soon as the owner closes them) by a process of the same
//! user and by one of another user (uid 65534 through `setpriv`; the abstract socket needs
//! no file permission). A CPU burner runs in both phases, so the unloaded and the flooded
//! latencies are measured at the same CPU load.
//!
//! Printed, once: `socket-flood: conns=N owner_fenced=0 rss_ratio=R latency_ratio=L`, with
//! N the connections held open at once, R the owner's peak VmRSS under the flood over its
//! peak before it, L the median commit latency under the flood over the median before it.
//! Asserted: the owner was never fenced (exit 0 and the run `free` after its release),
//! R ≤ 2, L ≤ 2. Skipped (with a message) when not root or without
//! `setpriv`. Rerun: `cargo test -p lease-cli --test socket_flood -- --nocapture`.

mod common;

use common::*;
use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Connections each flooder holds open.
const PER_FLOODER: usize = 64;
/// Commits measured in each phase (idle, flooded), over all rounds.
const COMMITS: usize = 80;
/// Idle and flooded rounds, alternating.
const ROUNDS: usize = 4;

/// The flooder, when this test binary is started as one (`FLOOD_SOCKET` set): holds
/// `PER_FLOODER` connections to the socket, half silent, half having sent garbage,
/// reopening each one the owner closes, until killed. Otherwise a no-op.
#[test]
fn flood_helper_process() {
    let Ok(socket) = std::env::var("FLOOD_SOCKET") else {
        return;
    };
    let name = socket.trim_start_matches('@').to_string();
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let open = |i: usize| -> Option<UnixStream> {
        let mut s = UnixStream::connect_addr(&addr).ok()?;
        if i % 2 == 1 {
            // Garbage: an HTTP request line (its first four bytes read as a huge length).
            let _ = std::io::Write::write_all(&mut s, b"GET / HTTP/1.0\r\n\r\n");
        }
        s.set_nonblocking(true).ok()?;
        Some(s)
    };
    let mut conns: Vec<Option<UnixStream>> = (0..PER_FLOODER).map(open).collect();
    let mut buf = [0u8; 1024];
    loop {
        for (i, c) in conns.iter_mut().enumerate() {
            let alive = match c {
                Some(s) => match s.read(&mut buf) {
                    Ok(0) => false,
                    // A refusal: the close follows; reopen now.
                    Ok(_) => false,
                    Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
                },
                None => false,
            };
            if !alive {
                *c = open(i);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A flooder: this test binary, run as `setpriv` args say (or as this user).
fn flooder(exe: &Path, socket: &str, as_nobody: bool) -> Child {
    let mut c = if as_nobody {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(exe);
        c
    } else {
        Command::new(exe)
    };
    c.args([
        "--exact",
        "flood_helper_process",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("FLOOD_SOCKET", socket)
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap()
}

/// Children killed and reaped when dropped, also when an assertion fails.
struct Reaped(Vec<Child>);

impl Drop for Reaped {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn vm_rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Runs its closure when dropped.
struct Defer<F: FnMut()>(F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

fn median(mut v: Vec<u64>) -> f64 {
    v.sort_unstable();
    v[v.len() / 2] as f64
}

/// The latencies (ns) the command recorded in `phase`.
fn latencies(file: &Path, phase: &str) -> Vec<u64> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter(|(p, _)| *p == phase)
        .filter_map(|(_, n)| n.parse().ok())
        .collect()
}

/// Wait until `phase` has `n` latencies, sampling the owner's RSS; returns its peak.
fn collect(file: &Path, phase: &str, n: usize, owner: u32) -> u64 {
    let start = Instant::now();
    let mut peak = 0;
    while latencies(file, phase).len() < n {
        peak = peak.max(vm_rss_kib(owner));
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "phase {phase}: only {} commits in 20 s",
            latencies(file, phase).len()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    peak.max(vm_rss_kib(owner))
}

#[test]
fn a_connection_flood_neither_fences_the_owner_nor_slows_its_commits() {
    let required = std::env::var("RUNLEASE_REQUIRE_CONTAINMENT").as_deref() == Ok("1");
    let why = if !rustix::process::geteuid().is_root() {
        Some("not root (the other user's flood needs setpriv as root)")
    } else if Command::new("setpriv").arg("--version").output().is_err() {
        Some("setpriv is missing")
    } else {
        None
    };
    if let Some(why) = why {
        assert!(!required, "RUNLEASE_REQUIRE_CONTAINMENT=1 but {why}");
        figure(&format!("socket-flood: skipped: {why}"));
        return;
    }
    let (tmp, dir) = scratch();
    // The flooder binary where uid 65534 can run it.
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let exe = bin.join("flooder");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for p in [tmp.path(), bin.as_path(), exe.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let run = dir.join("flooded");
    let d = run.to_str().unwrap();
    let (phase, lat, stop, sock) = (
        tmp.path().join("phase"),
        tmp.path().join("lat"),
        tmp.path().join("stop"),
        tmp.path().join("socket"),
    );
    std::fs::write(&phase, "warmup").unwrap();
    let script = format!(
        r#"echo "$RUNLEASE_STORE_SOCKET" > '{sock}.tmp' && mv '{sock}.tmp' '{sock}'
i=0
while [ ! -e '{stop}' ]; do
  p=$(cat '{phase}'); s=$(date +%s%N)
  runlease store put "$RUNLEASE_RUN" "k/$i" v > /dev/null || exit 9
  e=$(date +%s%N); echo "$p $((e - s))" >> '{lat}'; i=$((i + 1))
done"#,
        sock = sock.display(),
        stop = stop.display(),
        phase = phase.display(),
        lat = lat.display()
    );
    // The same CPU load in both phases: one busy loop (of two cores).
    let mut children = Reaped(vec![
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    ]);
    let mut owner = spawn(&["run", "-q", d, "--", "sh", "-c", &script]);
    let owner_pid = owner.id();
    // Stopped first if the test fails: it ends its command.
    let stop_file = stop.clone();
    let _stop = Defer(move || {
        let _ = std::fs::write(&stop_file, "");
    });
    wait_for_file(&sock, Duration::from_secs(10), "the store socket's name");
    let socket = std::fs::read_to_string(&sock).unwrap().trim().to_string();
    collect(&lat, "warmup", 5, owner_pid);

    // Idle and flooded rounds alternate, so a change of the machine's other load (a
    // build next door) weighs on both phases alike.
    let (mut rss_idle, mut rss_flood) = (0, 0);
    for round in 1..=ROUNDS {
        std::fs::write(&phase, "idle").unwrap();
        rss_idle = rss_idle.max(collect(&lat, "idle", round * COMMITS / ROUNDS, owner_pid));
        let mut floods = Reaped(vec![
            flooder(&exe, &socket, false),
            flooder(&exe, &socket, true),
        ]);
        std::thread::sleep(Duration::from_millis(300));
        std::fs::write(&phase, "flood").unwrap();
        rss_flood = rss_flood.max(collect(&lat, "flood", round * COMMITS / ROUNDS, owner_pid));
        // The flood was there all along (its processes still running).
        for f in &mut floods.0 {
            assert!(f.try_wait().unwrap().is_none(), "a flooder ended early");
        }
        drop(floods);
    }
    for c in &mut children.0 {
        assert!(c.try_wait().unwrap().is_none(), "the burner ended early");
    }

    std::fs::write(&stop, "").unwrap();
    let status = wait_exit(&mut owner, Duration::from_secs(20));
    drop(children);
    let state = status_json(&run)["state"]
        .as_str()
        .unwrap_or("?")
        .to_string();
    let owner_fenced = u8::from(status.code() != Some(0) || state != "free");
    let rss_ratio = rss_flood as f64 / rss_idle.max(1) as f64;
    let (idle, flood) = (latencies(&lat, "idle"), latencies(&lat, "flood"));
    let latency_ratio = median(flood.clone()) / median(idle.clone());
    figure(&format!(
        "socket-flood: conns={} owner_fenced={owner_fenced} rss_ratio={rss_ratio:.2} latency_ratio={latency_ratio:.2}",
        2 * PER_FLOODER
    ));
    assert_eq!(
        owner_fenced,
        0,
        "owner exit {:?}, run state {state}",
        status.code()
    );
    assert!(
        rss_ratio <= 2.0,
        "RSS {rss_idle} KiB idle, {rss_flood} KiB under the flood"
    );
    assert!(
        latency_ratio <= 2.0,
        "median commit {:.1} ms idle, {:.1} ms under the flood",
        median(idle) / 1e6,
        median(flood) / 1e6
    );
}
