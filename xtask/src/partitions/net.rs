//! The hosts: one network namespace per host, a bridge in a namespace of its own, and
//! the faults the nemesis injects into them (nftables drops, netem delay).
//!
//! Every address (`10.231.0.<k>/24`) and every device lives inside namespaces this
//! harness creates and deletes; nothing is added to the machine's own namespace (the veth
//! pairs are created directly in their namespaces).

use std::process::{Command, Output, Stdio};

/// The subnet every host is on (inside the harness's namespaces only).
pub const SUBNET: &str = "10.231.0";

/// `n` hosts, as namespaces named `<tag>-h<k>` (k from 1) around a bridge in `<tag>-br`.
pub struct Net {
    tag: String,
    /// Number of hosts.
    pub hosts: usize,
    made: Vec<String>,
}

/// Run a command to completion; an error names it and its stderr.
pub fn sh(args: &[&str]) -> Result<Output, String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "`{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Net {
    /// Namespace of host `k` (1-based).
    pub fn ns(&self, k: usize) -> String {
        format!("{}-h{k}", self.tag)
    }

    /// Address of host `k`.
    pub fn ip(k: usize) -> String {
        format!("{SUBNET}.{k}")
    }

    /// Create the namespaces, the bridge and one veth pair per host. On failure whatever
    /// was made is deleted again (by `Drop`).
    pub fn up(tag: &str, hosts: usize) -> Result<Net, String> {
        let mut net = Net {
            tag: tag.to_string(),
            hosts,
            made: Vec::new(),
        };
        let br = format!("{tag}-br");
        sh(&["ip", "netns", "add", &br])?;
        net.made.push(br.clone());
        sh(&["ip", "-n", &br, "link", "add", "br0", "type", "bridge"])?;
        sh(&["ip", "-n", &br, "link", "set", "br0", "up"])?;
        for k in 1..=hosts {
            let ns = net.ns(k);
            sh(&["ip", "netns", "add", &ns])?;
            net.made.push(ns.clone());
            let peer = format!("p{k}");
            sh(&[
                "ip", "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &peer,
                "netns", &br,
            ])?;
            let cidr = format!("{}/24", Net::ip(k));
            sh(&["ip", "-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
            sh(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
            sh(&["ip", "-n", &br, "link", "set", &peer, "master", "br0"])?;
            sh(&["ip", "-n", &br, "link", "set", &peer, "up"])?;
            // One filter table per host: the nemesis's drops go into its two chains.
            let rules = "table inet rlp {\n\
                 chain input { type filter hook input priority 0; policy accept; }\n\
                 chain output { type filter hook output priority 0; policy accept; }\n\
                 }\n";
            nft(&ns, rules)?;
        }
        Ok(net)
    }

    /// Host `a` stops hearing host `b` (packets from `b` are dropped at `a`); `a`'s own
    /// packets still reach `b`. Silent drops, as a real cut: TCP waits, nothing is refused.
    pub fn cut_one_way(&self, a: usize, b: usize) -> Result<(), String> {
        nft(
            &self.ns(a),
            &format!("add rule inet rlp input ip saddr {} drop\n", Net::ip(b)),
        )
    }

    /// `a` and `b` cannot reach each other at all.
    pub fn cut(&self, a: usize, b: usize) -> Result<(), String> {
        self.cut_one_way(a, b)?;
        self.cut_one_way(b, a)
    }

    /// Host `a` cut from every other host.
    pub fn isolate(&self, a: usize) -> Result<(), String> {
        for b in 1..=self.hosts {
            if b != a {
                self.cut(a, b)?;
            }
        }
        Ok(())
    }

    /// Slow host `k`'s outgoing packets: `ms` ± `jitter` ms of delay with netem where the
    /// kernel has it; where it does not (this project's CI kernel has no `sch_netem`), a
    /// slow link instead (tbf at 256 kbit/s, queueing up to 300 ms) with 10 % of the packets
    /// dropped (nftables `numgen random`), so TCP retransmits. Returns what it did.
    pub fn delay(&self, k: usize, ms: u64, jitter: u64) -> Result<String, String> {
        let ns = self.ns(k);
        let (d, j) = (format!("{ms}ms"), format!("{jitter}ms"));
        let netem = sh(&[
            "ip", "netns", "exec", &ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "netem",
            "delay", &d, &j,
        ]);
        if netem.is_ok() {
            return Ok(format!("delay h{k} {ms}±{jitter} ms (netem)"));
        }
        sh(&[
            "ip", "netns", "exec", &ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf",
            "rate", "256kbit", "burst", "4kb", "latency", "300ms",
        ])?;
        nft(
            &ns,
            "add rule inet rlp output numgen random mod 100 < 10 drop\n",
        )?;
        Ok(format!(
            "slow link h{k}: 256 kbit/s, 300 ms queue, 10 % loss (no netem in this kernel)"
        ))
    }

    /// Remove every drop and delay: the network is whole again.
    pub fn heal(&self) -> Result<(), String> {
        for k in 1..=self.hosts {
            nft(
                &self.ns(k),
                "flush chain inet rlp input\nflush chain inet rlp output\n",
            )?;
            // No qdisc to delete is not an error worth reporting.
            let _ = sh(&[
                "ip",
                "netns",
                "exec",
                &self.ns(k),
                "tc",
                "qdisc",
                "del",
                "dev",
                "eth0",
                "root",
            ]);
        }
        Ok(())
    }

    /// The pids of every process in host `k`'s namespace.
    pub fn pids(&self, k: usize) -> Vec<u32> {
        sh(&["ip", "netns", "pids", &self.ns(k)])
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Net {
    /// Kill every process left in the namespaces, then delete them (the veth pairs and
    /// the bridge go with them).
    fn drop(&mut self) {
        for _ in 0..50 {
            let mut left = 0;
            for ns in &self.made {
                if let Ok(o) = sh(&["ip", "netns", "pids", ns]) {
                    for p in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                        if let Ok(pid) = p.parse::<u32>() {
                            left += 1;
                            crate::torture::procs::signal_pid(pid, rustix::process::Signal::KILL);
                            crate::torture::procs::signal_pid(pid, rustix::process::Signal::CONT);
                        }
                    }
                }
            }
            if left == 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        for ns in self.made.iter().rev() {
            if let Err(e) = sh(&["ip", "netns", "del", ns]) {
                eprintln!("partitions: cleanup: {e}");
            }
        }
    }
}

/// Load an nftables script into namespace `ns`.
fn nft(ns: &str, script: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(script.as_bytes())
            .map_err(|e| format!("nft in {ns}: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft in {ns} failed: {} (script: {script:?})",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Why this machine cannot run the harness, if it cannot: namespaces not permitted, or a
/// tool missing. Probed by making (and deleting) one namespace.
pub fn unavailable_reason(tag: &str) -> Option<String> {
    for tool in ["ip", "nft", "tc", "etcd", "curl"] {
        let found = std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|p| p.join(tool).is_file()));
        if !found {
            return Some(format!(
                "`{tool}` not found on PATH (Debian: iproute2, nftables, etcd-server, curl)"
            ));
        }
    }
    let probe = format!("{tag}-probe");
    match sh(&["ip", "netns", "add", &probe]) {
        Ok(_) => {
            let _ = sh(&["ip", "netns", "del", &probe]);
            None
        }
        Err(e) => Some(format!("network namespaces are not permitted here: {e}")),
    }
}
