//! One etcd member per host, started inside the host's namespace, and what the nemesis
//! does to members: kill and restart, stop and continue, find the leader.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::Signal;

use super::net::{Net, sh};
use crate::torture::procs::signal_pid;

/// The members of one trial's cluster.
pub struct Cluster {
    members: Vec<Option<Child>>,
    dir: PathBuf,
    hosts: usize,
    pre_vote: bool,
}

/// The `etcd://` authority URL of the cluster, under `prefix`.
pub fn url(hosts: usize, prefix: &str) -> String {
    let eps: Vec<String> = (1..=hosts)
        .map(|k| format!("{}:2379", Net::ip(k)))
        .collect();
    format!("etcd://{}/{prefix}", eps.join(","))
}

impl Cluster {
    /// Start one member per host (data under `dir/h<k>/etcd`, log `dir/h<k>/etcd.log`)
    /// with etcd's default timing (100 ms heartbeat, 1 s election timeout) and, unless
    /// `pre_vote` is false, `--pre-vote`; wait until one member reports a leader.
    pub fn start(net: &Net, dir: &Path, pre_vote: bool) -> Result<Cluster, String> {
        let mut c = Cluster {
            members: Vec::new(),
            dir: dir.to_path_buf(),
            hosts: net.hosts,
            pre_vote,
        };
        for k in 1..=net.hosts {
            let child = c.spawn(net, k, true)?;
            c.members.push(Some(child));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if c.leader(net).is_some() {
                return Ok(c);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!(
            "the etcd cluster elected no leader within 20 s (logs in {})",
            dir.display()
        ))
    }

    fn spawn(&self, net: &Net, k: usize, new: bool) -> Result<Child, String> {
        let initial: Vec<String> = (1..=self.hosts)
            .map(|i| format!("h{i}=http://{}:2380", Net::ip(i)))
            .collect();
        let hdir = self.dir.join(format!("h{k}"));
        std::fs::create_dir_all(&hdir).map_err(|e| format!("{}: {e}", hdir.display()))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(hdir.join("etcd.log"))
            .map_err(|e| format!("etcd log: {e}"))?;
        let (client, peer) = (
            format!("http://{}:2379", Net::ip(k)),
            format!("http://{}:2380", Net::ip(k)),
        );
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &net.ns(k),
            "etcd",
            "--name",
            &format!("h{k}"),
        ])
        .arg("--data-dir")
        .arg(hdir.join("etcd"))
        .args(["--listen-client-urls", &client])
        .args(["--advertise-client-urls", &client])
        .args(["--listen-peer-urls", &peer])
        .args(["--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster", &initial.join(",")])
        .args(["--initial-cluster-token", "runlease-partitions"])
        .args([
            "--initial-cluster-state",
            if new { "new" } else { "existing" },
        ])
        .args(["--logger", "zap", "--log-level", "warn"]);
        if self.pre_vote {
            cmd.arg("--pre-vote");
        }
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start etcd on h{k}: {e}"))
    }

    /// The pid of host `k`'s member (`ip netns exec` execs etcd itself), if it runs.
    pub fn pid(&self, k: usize) -> Option<u32> {
        self.members.get(k - 1)?.as_ref().map(Child::id)
    }

    /// SIGKILL host `k`'s member.
    pub fn kill(&mut self, k: usize) {
        if let Some(mut c) = self.members.get_mut(k - 1).and_then(Option::take) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Restart host `k`'s member (after [`Cluster::kill`]) from its data folder.
    pub fn restart(&mut self, net: &Net, k: usize) -> Result<(), String> {
        if self.members[k - 1].is_none() {
            let child = self.spawn(net, k, false)?;
            self.members[k - 1] = Some(child);
        }
        Ok(())
    }

    /// SIGSTOP (`stop`) or SIGCONT host `k`'s member.
    pub fn pause(&self, k: usize, stop: bool) {
        if let Some(pid) = self.pid(k) {
            signal_pid(pid, if stop { Signal::STOP } else { Signal::CONT });
        }
    }

    /// The host whose member is the leader, as the members that answer within 500 ms
    /// see it (`/v3/maintenance/status` over HTTP from inside each host).
    pub fn leader(&self, net: &Net) -> Option<usize> {
        let mut ids: Vec<(usize, String, String)> = Vec::new();
        for k in 1..=self.hosts {
            let url = format!("http://{}:2379/v3/maintenance/status", Net::ip(k));
            let Ok(out) = sh(&[
                "ip",
                "netns",
                "exec",
                &net.ns(k),
                "curl",
                "-s",
                "-m",
                "0.5",
                "-X",
                "POST",
                &url,
                "-d",
                "{}",
            ]) else {
                continue;
            };
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
                continue;
            };
            let me = v["header"]["member_id"].as_str().unwrap_or("").to_string();
            let leader = v["leader"].as_str().unwrap_or("").to_string();
            ids.push((k, me, leader));
        }
        let leader = ids
            .iter()
            .find(|(_, _, l)| !l.is_empty() && l != "0")?
            .2
            .clone();
        ids.iter()
            .find(|(_, me, _)| *me == leader)
            .map(|(k, _, _)| *k)
    }

    /// Continue every stopped member and restart every killed one.
    pub fn restore(&mut self, net: &Net) -> Result<(), String> {
        for k in 1..=self.hosts {
            self.pause(k, false);
            self.restart(net, k)?;
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for k in 1..=self.hosts {
            self.pause(k, false);
            self.kill(k);
        }
    }
}
