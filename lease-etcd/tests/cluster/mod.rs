//! A real 3-member etcd cluster for tests: Debian's `etcd` binary on free loopback ports,
//! data in a temporary folder, every member killed and the folder removed on drop.

use lease_core::LeaseOps;
use lease_core::ops::{Request, Response};
use lease_core::{Dir, RunId};
use lease_etcd::{AuthorityAddr, EtcdAuthority, EtcdOptions};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Tests that start a cluster run one at a time (they stop and kill members; parallel
/// clusters would also compete for the two cores and blur the timing bounds).
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The `etcd` binary, or `None` (with a message) when it is absent outside CI. In CI
/// (env `CI` set) a missing binary fails the test: `.ci/run` installs it.
pub fn etcd_binary() -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("etcd"))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => Some(p),
        None if std::env::var_os("CI").is_some() => {
            panic!("etcd binary not found on PATH; CI must install Debian's etcd-server (.ci/run)")
        }
        None => {
            eprintln!(
                "SKIPPED: etcd binary not found on PATH (apt-get install etcd-server); this test fails instead when CI is set"
            );
            None
        }
    }
}

/// `n` distinct free loopback ports. Every listener stays bound until all `n` are chosen:
/// binding and dropping one at a time let the kernel hand the same port out twice (CI saw
/// `m0` and `m1` given one peer port, "initial cluster ... has duplicate url").
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free loopback port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("bound address").port())
        .collect()
}

/// One member of the cluster.
pub struct Member {
    /// Its name (`m0`..`m2`).
    pub name: String,
    /// Client port on 127.0.0.1.
    pub client_port: u16,
    child: Option<Child>,
    stopped: bool,
}

impl Member {
    /// `etcd://`-style endpoint `127.0.0.1:port`.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    fn pid(&self) -> Option<rustix::process::Pid> {
        self.child
            .as_ref()
            .and_then(|c| rustix::process::Pid::from_raw(c.id() as i32))
    }
}

/// A running 3-member cluster.
pub struct Cluster {
    /// The members.
    pub members: Vec<Member>,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Start 3 members with fast elections (50 ms heartbeat, 500 ms election timeout, pre-vote) and
    /// wait until a leader answers linearizable reads. The ports are free when chosen but
    /// another process may bind one before etcd does; a start whose member could not bind
    /// is retried on new ports (at most 3 attempts), any other failure panics at once.
    pub fn start(bin: &PathBuf) -> Cluster {
        Cluster::start_with(bin, &[])
    }

    /// [`Cluster::start`] with extra flags for every member (`--quota-backend-bytes`, say).
    pub fn start_with(bin: &PathBuf, extra: &[&str]) -> Cluster {
        let mut attempt = 1;
        loop {
            let mut cluster = Cluster::spawn(bin, extra);
            match cluster.wait_ready(Duration::from_secs(30)) {
                Ok(()) => return cluster,
                Err(why) if attempt < 3 && cluster.logs().contains("address already in use") => {
                    eprintln!("etcd cluster attempt {attempt} lost a port race, retrying: {why}");
                    attempt += 1;
                }
                Err(why) => panic!("{why}\n{}", cluster.logs()),
            }
        }
    }

    fn spawn(bin: &PathBuf, extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let ports = free_ports(7);
        let peers: Vec<(u16, u16)> = (0..3).map(|i| (ports[2 * i], ports[2 * i + 1])).collect();
        let initial: Vec<String> = peers
            .iter()
            .enumerate()
            .map(|(i, (_, p))| format!("m{i}=http://127.0.0.1:{p}"))
            .collect();
        let initial = initial.join(",");
        let token = format!("lease-etcd-test-{}-{}", std::process::id(), ports[6]);
        let mut members = Vec::new();
        for (i, (c, p)) in peers.iter().enumerate() {
            let name = format!("m{i}");
            let log = std::fs::File::create(dir.path().join(format!("{name}.log"))).unwrap();
            let child = Command::new(bin)
                .args(["--name", &name])
                .arg("--data-dir")
                .arg(dir.path().join(&name))
                .args(["--listen-client-urls", &format!("http://127.0.0.1:{c}")])
                .args(["--advertise-client-urls", &format!("http://127.0.0.1:{c}")])
                .args(["--listen-peer-urls", &format!("http://127.0.0.1:{p}")])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{p}"),
                ])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-token", &token])
                .args(["--initial-cluster-state", "new"])
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                // Pre-vote (issue #31): a member cut off and back does not force an election,
                // so a healed partition does not leave the cluster leaderless.
                .arg("--pre-vote")
                .args(["--logger", "zap", "--log-level", "warn"])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("start etcd");
            members.push(Member {
                name,
                client_port: *c,
                child: Some(child),
                stopped: false,
            });
        }
        Cluster { members, dir }
    }

    /// Fill the cluster (started with a small `--quota-backend-bytes`) from a run of its
    /// own under `prefix`, 512 KiB at a time, until it refuses a write; that refusal.
    pub fn fill(&self, prefix: &str) -> lease_etcd::EtcdError {
        use lease_core::transport::Transport;
        use lease_core::{FileRef, Sequence};
        let auth = self.authority(&[0, 1, 2], prefix, EtcdOptions::default());
        let filler = auth.run(RunId::new("filler").unwrap());
        for n in 1..=200u64 {
            let req = Request::CreateExclusive(
                FileRef::Event(Sequence::new(n).unwrap()),
                vec![b'x'; 512 * 1024],
            );
            match filler.execute(req, filler.default_bound()) {
                Ok(Response::Created) => {}
                Ok(other) => panic!("fill {n}: {other:?}"),
                Err(e) => return e,
            }
        }
        panic!("the cluster took 100 MiB without refusing a write: is its quota small?")
    }

    /// `etcd://` address of the given members under `prefix`.
    pub fn addr(&self, which: &[usize], prefix: &str) -> AuthorityAddr {
        let eps: Vec<String> = which.iter().map(|&i| self.members[i].endpoint()).collect();
        AuthorityAddr::parse(&format!("etcd://{}/{prefix}", eps.join(","))).unwrap()
    }

    /// An authority connected to the given members.
    pub fn authority(&self, which: &[usize], prefix: &str, opts: EtcdOptions) -> EtcdAuthority {
        EtcdAuthority::connect(&self.addr(which, prefix), opts).expect("connect")
    }

    /// Wait until the cluster answers; a member that exited (it could not bind, say) ends
    /// the wait at once.
    fn wait_ready(&mut self, within: Duration) -> Result<(), String> {
        let start = Instant::now();
        let auth = self.authority(&[0, 1, 2], "ready", EtcdOptions::default());
        let run = auth.run(RunId::new("probe").unwrap());
        loop {
            for m in &mut self.members {
                if let Some(Ok(Some(status))) = m.child.as_mut().map(|c| c.try_wait()) {
                    return Err(format!("etcd member {} exited at start: {status}", m.name));
                }
            }
            match run.perform(Request::List(Dir::Epochs)) {
                Ok(Response::Listing(_)) => return Ok(()),
                other if start.elapsed() > within => {
                    return Err(format!(
                        "etcd cluster not ready after {within:?}: {other:?}"
                    ));
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The members' logs (for failure messages).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for m in &self.members {
            let p = self.dir.path().join(format!("{}.log", m.name));
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            out += &format!("--- {} (last lines) ---\n", m.name);
            for l in tail.into_iter().rev() {
                out += l;
                out += "\n";
            }
        }
        out
    }

    /// SIGSTOP member `i` (it keeps its sockets but answers nothing).
    pub fn stop(&mut self, i: usize) {
        let pid = self.members[i].pid().expect("member running");
        rustix::process::kill_process(pid, rustix::process::Signal::STOP).expect("SIGSTOP");
        self.members[i].stopped = true;
    }

    /// SIGCONT member `i`.
    pub fn resume(&mut self, i: usize) {
        let pid = self.members[i].pid().expect("member running");
        rustix::process::kill_process(pid, rustix::process::Signal::CONT).expect("SIGCONT");
        self.members[i].stopped = false;
    }

    /// SIGKILL member `i` (a crash) and reap it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The index of the current leader, asked of member `ask` through etcd's JSON gateway
    /// (`POST /v3/maintenance/status`): its `leader` against each member's `member_id`.
    pub fn leader(&self) -> Option<usize> {
        let ids: Vec<Option<u64>> = (0..self.members.len())
            .map(|i| self.status(i).map(|(me, _)| me))
            .collect();
        let leader = (0..self.members.len()).find_map(|i| self.status(i).map(|(_, l)| l))?;
        ids.iter().position(|id| *id == Some(leader))
    }

    fn status(&self, i: usize) -> Option<(u64, u64)> {
        let m = &self.members[i];
        if m.child.is_none() || m.stopped {
            return None;
        }
        let mut s = TcpStream::connect(("127.0.0.1", m.client_port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let body = "{}";
        write!(
            s,
            "POST /v3/maintenance/status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .ok()?;
        let mut resp = String::new();
        s.read_to_string(&mut resp).ok()?;
        let json = &resp[resp.find("\r\n\r\n")? + 4..];
        let v: serde_json::Value = serde_json::from_str(json.trim()).ok()?;
        // uint64 fields are strings in the gateway's JSON.
        let num = |x: &serde_json::Value| x.as_str().and_then(|s| s.parse::<u64>().ok());
        Some((num(&v["header"]["member_id"])?, num(&v["leader"])?))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut c) = m.child.take() {
                // SIGKILL also ends a stopped process.
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
