//! One trial: hosts up, a cluster, an owner loop per host, a reader, the nemesis, the
//! closing recovery, the check.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::process::Signal;

use super::check::{self, Verdict};
use super::cluster::{self, Cluster};
use super::history::{self, Line};
use super::net::Net;
use super::{Opts, Scenario};
use crate::torture::procs::{Rng, appended_sequence, code_of, mono_ns, signal_pid};

/// Heartbeat interval, self-fence deadline and staleness of every owner, ms. The etcd
/// lease's time to live is `ceil(stale_after)` = 2 s, a little above etcd's minimum (1.5 s
/// with its default 100 ms heartbeat and 1 s election timeout).
const POLICY: [&str; 6] = [
    "--heartbeat",
    "300",
    "--self-fence-after",
    "1500",
    "--stale-after",
    "2000",
];

/// libfaketime's preload library (Debian's `faketime`), if installed.
fn libfaketime() -> Option<PathBuf> {
    [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

/// What a trial hands back.
pub struct Outcome {
    /// The check's verdict.
    pub verdict: Verdict,
    /// Fast-heal probes (scenario `heal`).
    pub probes: u64,
    /// Probes whose owner was fenced while the follower was cut off.
    pub fenced_while_cut: u64,
    /// Probes whose owner was fenced after the heal.
    pub fenced_after_heal: u64,
    /// Faults injected.
    pub faults: u64,
}

/// The shared state of one trial's threads.
struct Trial {
    net: Net,
    dir: PathBuf,
    history: PathBuf,
    url: String,
    runlease: PathBuf,
    exe: PathBuf,
    faketime: Option<PathBuf>,
    /// `RUNLEASE_MUTANT` for every runlease process (`--mutant`).
    mutant: Option<String>,
    /// Which faults (the heal probe's workers do not release).
    scenario: Scenario,
    /// The pid of each host's current `runlease run` (index 0 unused).
    current: Mutex<Vec<Option<u32>>>,
    stop: AtomicBool,
}

impl Trial {
    fn note(&self, op: String) {
        let _ = history::put(&self.history, &Line::Nemesis { t: mono_ns(), op });
    }

    fn job(&self, k: usize) -> PathBuf {
        self.dir.join(format!("h{k}")).join("job")
    }

    /// `runlease` inside host `k`, with the authority, to completion: (rc, stdout).
    fn rl(&self, k: usize, args: &[&str]) -> (i32, String) {
        let out = self
            .runlease_in(k)
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output();
        match out {
            Ok(o) => (
                code_of(o.status),
                String::from_utf8_lossy(&o.stdout).into_owned(),
            ),
            Err(_) => (-1, String::new()),
        }
    }

    /// `runlease --authority <the cluster>` inside host `k` (with `RUNLEASE_MUTANT` under
    /// `--mutant`), arguments to follow.
    fn runlease_in(&self, k: usize) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.net.ns(k)])
            .arg(&self.runlease)
            .args(["--authority", &self.url]);
        if let Some(m) = &self.mutant {
            cmd.env("RUNLEASE_MUTANT", m);
        }
        cmd
    }

    /// Host `k`'s owner loop: `runlease run --wait 60s --retire-dead` until the trial stops.
    fn owner_loop(&self, k: usize, until: u64, seed: u64) {
        let log = self.dir.join(format!("h{k}")).join("run.log");
        let clock = self.dir.join(format!("h{k}")).join("faketime");
        while !self.stop.load(Ordering::SeqCst) {
            let mut cmd = self.runlease_in(k);
            cmd.arg("run")
                .arg(self.job(k))
                .args(["--wait", "60s", "--retire-dead"])
                .args(POLICY)
                .arg("--")
                .arg(&self.exe)
                .args(["partitions", "--worker", "--host", &k.to_string()])
                .arg("--history")
                .arg(&self.history)
                .arg("--runlease")
                .arg(&self.runlease)
                .args(["--until", &until.to_string(), "--seed", &seed.to_string()]);
            if self.scenario == Scenario::Heal {
                // The probe takes any owner change for a fencing: no releases.
                cmd.arg("--no-release");
            }
            if let Some(lib) = &self.faketime {
                // The host's wall clock, stepped by the nemesis through this file; the
                // monotonic clocks stay real (histories and lease timing use them).
                cmd.env("LD_PRELOAD", lib)
                    .env("FAKETIME_TIMESTAMP_FILE", &clock)
                    .env("FAKETIME_NO_CACHE", "1")
                    .env("DONT_FAKE_MONOTONIC", "1");
            }
            let logf = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log);
            let Ok(logf) = logf else { return };
            let err = logf.try_clone().ok();
            cmd.stdin(Stdio::null()).stdout(logf);
            if let Some(e) = err {
                cmd.stderr(e);
            }
            let Ok(mut child) = cmd.spawn() else { return };
            if let Ok(mut c) = self.current.lock() {
                c[k] = Some(child.id());
            }
            let rc = child.wait().map(code_of).unwrap_or(-1);
            if let Ok(mut c) = self.current.lock() {
                c[k] = None;
            }
            let _ = history::put(
                &self.history,
                &Line::Exit {
                    host: k,
                    rc,
                    t: mono_ns(),
                },
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Read the whole log from a random host every 0.3-0.8 s until the trial stops.
    fn reader(&self, seed: u64) {
        let mut rng = Rng::new(seed ^ 0x5eed);
        while !self.stop.load(Ordering::SeqCst) {
            let k = rng.range(1, self.net.hosts as u64 + 1) as usize;
            let job = self.job(k);
            let t0 = mono_ns();
            let (rc, out) = self.rl(k, &["--json", "events", &job.to_string_lossy()]);
            let t1 = mono_ns();
            let events = if rc == 0 {
                history::parse_events(&out).unwrap_or_default()
            } else {
                Vec::new()
            };
            let _ = history::put(
                &self.history,
                &Line::Read {
                    host: k,
                    t0,
                    t1,
                    rc,
                    events,
                },
            );
            std::thread::sleep(Duration::from_millis(rng.range(300, 800)));
        }
    }

    /// The host whose command started last (the owner as far as the history knows).
    fn owner_host(&self) -> Option<usize> {
        let text = std::fs::read_to_string(&self.history).ok()?;
        text.lines()
            .rev()
            .find_map(|l| match serde_json::from_str::<Line>(l).ok()? {
                Line::Start { host, .. } => Some(host),
                _ => None,
            })
    }

    fn owner_pid(&self, k: usize) -> Option<u32> {
        self.current.lock().ok()?.get(k).copied().flatten()
    }

    fn set_clock(&self, k: usize, offset: &str) {
        let _ = std::fs::write(self.dir.join(format!("h{k}")).join("faketime"), offset);
    }
}

/// Run trial `i` in `dir` (see the module docs of [`super`]).
pub fn run(
    opts: &Opts,
    i: u64,
    dir: &Path,
    runlease: &Path,
    exe: &Path,
) -> Result<Outcome, String> {
    let seed = opts.seed.wrapping_add(i.wrapping_mul(0x9E37_79B9));
    let mut rng = Rng::new(seed);
    let hosts = opts.hosts;
    let tag = format!("rlp{}t{i}", std::process::id() % 100_000);
    let net = Net::up(&tag, hosts)?;
    let history = dir.join("history.jsonl");
    for k in 1..=hosts {
        let h = dir.join(format!("h{k}"));
        std::fs::create_dir_all(h.join("job")).map_err(|e| format!("{}: {e}", h.display()))?;
        std::fs::write(h.join("faketime"), "+0").map_err(|e| e.to_string())?;
    }
    let mut cluster = Cluster::start(&net, dir, opts.pre_vote)?;
    let trial = Arc::new(Trial {
        net,
        dir: dir.to_path_buf(),
        history: history.clone(),
        url: cluster::url(hosts, &format!("t{i}")),
        runlease: runlease.to_path_buf(),
        exe: exe.to_path_buf(),
        faketime: libfaketime(),
        mutant: opts.mutant.clone(),
        scenario: opts.scenario,
        current: Mutex::new(vec![None; hosts + 1]),
        stop: AtomicBool::new(false),
    });
    let begin = mono_ns();
    let nemesis_end = Instant::now() + Duration::from_secs(opts.seconds);
    let quiet = Duration::from_secs(3);
    let until = begin + (opts.seconds * 1_000_000_000) + quiet.as_nanos() as u64;
    let mut threads = Vec::new();
    for k in 1..=hosts {
        let t = Arc::clone(&trial);
        threads.push(std::thread::spawn(move || t.owner_loop(k, until, seed)));
    }
    {
        let t = Arc::clone(&trial);
        threads.push(std::thread::spawn(move || t.reader(seed)));
    }
    let mut out = Outcome {
        verdict: Verdict::default(),
        probes: 0,
        fenced_while_cut: 0,
        fenced_after_heal: 0,
        faults: 0,
    };
    // Let a first owner start.
    std::thread::sleep(Duration::from_millis(1500));
    let mut nemesis = || -> Result<(), String> {
        while Instant::now() < nemesis_end {
            match opts.scenario {
                Scenario::Mixed => fault(&trial, &mut cluster, &mut rng)?,
                Scenario::Heal => {
                    if let Some((cut, healed)) = heal_probe(&trial, &mut cluster, &mut rng)? {
                        out.probes += 1;
                        out.fenced_while_cut += u64::from(cut);
                        out.fenced_after_heal += u64::from(healed);
                    }
                }
            }
            out.faults += 1;
            std::thread::sleep(Duration::from_millis(rng.range(500, 1500)));
        }
        heal_all(&trial, &mut cluster)?;
        // The workload goes on for the quiet period, on a whole network; then two late
        // writes of deposed generations (if any owner was replaced).
        std::thread::sleep(quiet);
        for _ in 0..2 {
            let late = zombie_append(&trial, &mut rng);
            trial.note(late);
        }
        Ok(())
    };
    // Whatever the nemesis met, the clients are stopped and their threads joined, so the
    // hosts (owned by `trial`) are deleted when this returns.
    let nemesis = nemesis();
    let end = mono_ns();
    trial.stop.store(true, Ordering::SeqCst);
    // Kill every runlease and worker (everything in the hosts but the etcd members).
    for _ in 0..3 {
        for k in 1..=hosts {
            for pid in trial.net.pids(k) {
                if Some(pid) != cluster.pid(k) {
                    signal_pid(pid, Signal::KILL);
                    signal_pid(pid, Signal::CONT);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for t in threads {
        let _ = t.join();
    }
    nemesis?;
    let log = recover(&trial)?;
    std::fs::write(
        dir.join("events.json"),
        serde_json::to_string(&log).unwrap_or_default(),
    )
    .map_err(|e| e.to_string())?;
    // Then the store, read back as a new owner on every host in turn (from a random
    // first one): each catches its view up from the engine before its command lists it.
    let first = rng.range(0, hosts as u64) as usize;
    for j in 0..hosts {
        let k = (first + j) % hosts + 1;
        let line = read_store(&trial, k);
        history::put(&history, &line).map_err(|e| format!("history: {e}"))?;
    }
    let text = std::fs::read_to_string(&history).map_err(|e| format!("history: {e}"))?;
    let lines = history::parse(&text)?;
    out.verdict = check::check(&lines, &log, (begin, end));
    check::check_store(&lines, &mut out.verdict);
    Ok(out)
}

/// A final read of the store from host `k`: `runlease run --wait 30s --retire-dead` (the
/// run is free after the closing recovery) whose command lists the store through the new
/// owner (`runlease --json store list`), as a `store_read` line.
fn read_store(t: &Trial, k: usize) -> Line {
    let job = t.job(k);
    let job = job.to_string_lossy();
    let t0 = mono_ns();
    let out = t
        .runlease_in(k)
        .args(["--quiet", "run", &job, "--wait", "30s", "--retire-dead"])
        .args(POLICY)
        .arg("--")
        .arg(&t.runlease)
        .args(["--json", "--quiet", "store", "list", &job])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    let (rc, docs) = match out {
        Ok(o) => {
            let rc = code_of(o.status);
            match history::parse_store_docs(&String::from_utf8_lossy(&o.stdout)) {
                Ok(docs) => (rc, docs),
                // Output that does not parse is no read to judge (-2).
                Err(_) if rc == 0 => (-2, Default::default()),
                Err(_) => (rc, Default::default()),
            }
        }
        Err(_) => (-1, Default::default()),
    };
    Line::StoreRead {
        host: k,
        t0,
        t1: mono_ns(),
        rc,
        docs,
    }
}

/// The closing recovery: once the last owner's etcd lease expired, retire it (which
/// finalizes its cutoff), then read the log. Retried for up to 20 s.
fn recover(t: &Trial) -> Result<Vec<history::Seen>, String> {
    let job = t.job(1);
    let job = job.to_string_lossy();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    while Instant::now() < deadline {
        let (rc, out) = t.rl(1, &["--json", "status", &job]);
        let state = serde_json::from_str::<serde_json::Value>(out.lines().next().unwrap_or(""))
            .ok()
            .and_then(|v| v.get("state").and_then(|s| s.as_str()).map(str::to_string));
        match state.as_deref() {
            Some("free") => {
                let (rc, out) = t.rl(1, &["--json", "events", &job]);
                if rc == 0 {
                    return history::parse_events(&out);
                }
                last = format!("events exited {rc}");
            }
            Some("dead") => {
                let (rc, _) = t.rl(1, &["--json", "retire", &job]);
                last = format!("retire exited {rc}");
            }
            other => last = format!("status exited {rc}, state {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Err(format!(
        "closing recovery did not free the run within 20 s: {last}"
    ))
}

/// Undo every fault: network whole, members running, owners continued, clocks right.
fn heal_all(t: &Trial, cluster: &mut Cluster) -> Result<(), String> {
    t.net.heal()?;
    cluster.restore(&t.net)?;
    for k in 1..=t.net.hosts {
        if let Some(pid) = t.owner_pid(k) {
            signal_pid(pid, Signal::CONT);
        }
        t.set_clock(k, "+0");
    }
    t.note("heal".into());
    Ok(())
}

/// One fault of the mixed scenario, held 1-3 s, then healed.
fn fault(t: &Trial, cluster: &mut Cluster, rng: &mut Rng) -> Result<(), String> {
    let n = t.net.hosts;
    let pick = |rng: &mut Rng| rng.range(1, n as u64 + 1) as usize;
    let a = pick(rng);
    let b = (a % n) + 1;
    let c = (b % n) + 1;
    let hold = Duration::from_millis(rng.range(1000, 3000));
    let owner = t.owner_host();
    let what = match rng.range(0, 11) {
        0 => {
            t.net.isolate(a)?;
            format!("isolate h{a} (minority | majority)")
        }
        1 => match cluster.leader(&t.net) {
            Some(l) => {
                t.net.isolate(l)?;
                format!("isolate the leader h{l}")
            }
            None => "isolate the leader: none found".into(),
        },
        2 => {
            t.net.cut_one_way(a, b)?;
            format!("one-way: h{a} stops hearing h{b}")
        }
        3 => {
            t.net.cut(a, b)?;
            format!("bridge: h{a} and h{b} cut, h{c} sees both")
        }
        4 => {
            cluster.kill(a);
            format!("kill member h{a}")
        }
        5 => {
            cluster.pause(a, true);
            format!("stop member h{a}")
        }
        6 => match owner.and_then(|o| t.owner_pid(o).map(|p| (o, p))) {
            Some((o, pid)) => {
                signal_pid(pid, Signal::KILL);
                format!("kill the owner's runlease on h{o}")
            }
            None => "kill the owner: none".into(),
        },
        7 => match owner.and_then(|o| t.owner_pid(o).map(|p| (o, p))) {
            Some((o, pid)) => {
                signal_pid(pid, Signal::STOP);
                format!("stop the owner's runlease on h{o}")
            }
            None => "stop the owner: none".into(),
        },
        9 => zombie_append(t, rng),
        8 => {
            let ms = rng.range(50, 300);
            t.net.delay(a, ms, ms / 2)?
        }
        _ => {
            let o = owner.unwrap_or(a);
            let step = if rng.chance(50) { "+120" } else { "-120" };
            t.set_clock(o, step);
            format!("step h{o}'s wall clock {step} s")
        }
    };
    t.note(what);
    std::thread::sleep(hold);
    heal_all(t, cluster)?;
    // Half the time, once the network is whole, a deposed generation also writes late
    // (a no-op note until some owner has been replaced).
    if rng.chance(50) {
        let late = zombie_append(t, rng);
        t.note(late);
    }
    Ok(())
}

/// A deposed owner's late write: `runlease append --generation g --owner o` as an older
/// generation that started in this trial, from its own host (what a command that escaped
/// its owner, or a copy of its token, would do). Recorded like a worker's append; it must
/// be answered FENCED and never count.
fn zombie_append(t: &Trial, rng: &mut Rng) -> String {
    let text = std::fs::read_to_string(&t.history).unwrap_or_default();
    let starts: Vec<(usize, u64, String)> = text
        .lines()
        .filter_map(|l| match serde_json::from_str::<Line>(l).ok()? {
            Line::Start {
                host,
                generation,
                owner,
                ..
            } => Some((host, generation, owner)),
            _ => None,
        })
        .collect();
    let newest = starts.iter().map(|s| s.1).max().unwrap_or(0);
    let deposed: Vec<&(usize, u64, String)> = starts.iter().filter(|s| s.1 < newest).collect();
    if deposed.is_empty() {
        return "late append as a deposed generation: none yet".into();
    }
    let (host, generation, owner) = deposed[rng.range(0, deposed.len() as u64) as usize];
    let id = format!("z{host}-g{generation}-t{}", mono_ns());
    let payload = serde_json::json!({ "id": id }).to_string();
    let job = t.job(*host).to_string_lossy().into_owned();
    let _ = history::put(
        &t.history,
        &Line::Invoke {
            id: id.clone(),
            host: *host,
            generation: *generation,
            t: mono_ns(),
        },
    );
    let gen_s = generation.to_string();
    let (rc, out) = t.rl(
        *host,
        &[
            "--json",
            "--quiet",
            "append",
            &job,
            "--type",
            "partitions",
            "--payload",
            &payload,
            "--generation",
            &gen_s,
            "--owner",
            owner,
        ],
    );
    let seq = appended_sequence(out.as_bytes());
    let _ = history::put(
        &t.history,
        &Line::Complete {
            id,
            outcome: history::Outcome::of_append(rc),
            rc,
            seq: seq.filter(|_| rc == 0),
            t: mono_ns(),
        },
    );
    format!("late append as deposed generation {generation} from h{host}: exit {rc}")
}

/// The fast-heal probe: with an owner running on host `o`, cut off the member of a host
/// that is neither `o` nor the leader's for 2.5 s (long enough for it to campaign without
/// pre-vote: 1 s election timeout), heal, and watch the owner for 4 s. A cut follower
/// alone leaves a leader with a quorum, so the owner should not notice; what the issue
/// saw is the heal: without pre-vote the returning member's higher term deposes the
/// leader. `(fenced while cut, fenced after the heal)`; `None`: no owner to probe.
fn heal_probe(
    t: &Trial,
    cluster: &mut Cluster,
    rng: &mut Rng,
) -> Result<Option<(bool, bool)>, String> {
    let Some(o) = t.owner_host() else {
        return Ok(None);
    };
    let Some(pid) = t.owner_pid(o) else {
        return Ok(None);
    };
    let leader = cluster.leader(&t.net);
    let others: Vec<usize> = (1..=t.net.hosts)
        .filter(|k| *k != o && Some(*k) != leader)
        .collect();
    if others.is_empty() {
        return Ok(None);
    }
    let v = others[rng.range(0, others.len() as u64) as usize];
    let fenced_since = |mark: u64| {
        let text = std::fs::read_to_string(&t.history).unwrap_or_default();
        let after = text.get(mark as usize..).unwrap_or("");
        t.owner_pid(o) != Some(pid)
            || after
                .lines()
                .any(|l| match serde_json::from_str::<Line>(l) {
                    Ok(Line::Start { .. }) => true,
                    Ok(Line::Exit { host, .. }) => host == o,
                    _ => false,
                })
    };
    let mark = std::fs::metadata(&t.history).map(|m| m.len()).unwrap_or(0);
    t.net.isolate(v)?;
    t.note(format!(
        "heal probe: owner on h{o}, leader h{}, isolate follower h{v}",
        leader.map_or("?".into(), |l| l.to_string())
    ));
    std::thread::sleep(Duration::from_millis(2500));
    let while_cut = fenced_since(mark);
    let mark = std::fs::metadata(&t.history).map(|m| m.len()).unwrap_or(0);
    t.net.heal()?;
    t.note("heal".into());
    std::thread::sleep(Duration::from_secs(4));
    let after_heal = !while_cut && fenced_since(mark);
    t.note(format!(
        "heal probe: owner on h{o} {}",
        match (while_cut, after_heal) {
            (true, _) => "FENCED while the follower was cut",
            (_, true) => "FENCED after the heal",
            _ => "kept",
        }
    ));
    Ok(Some((while_cut, after_heal)))
}
