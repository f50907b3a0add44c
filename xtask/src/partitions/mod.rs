//! `cargo xtask partitions [--trials N] [--seed S] [--seconds T] [--scenario mixed|heal]
//! [--no-pre-vote] [--keep]`: owners of one run on three hosts that fail like real hosts
//! (issue #31), appending events and committing to the run's store (issue #32), and a
//! checker that judges what they were told against what the log and the store hold.
//!
//! # The hosts
//!
//! Each trial makes `hosts` (3) network namespaces `rlp<pid>t<i>-h<k>` around a bridge
//! in a namespace of its own (`…-br`): one veth pair per host, addresses `10.231.0.<k>`
//! that exist only inside those namespaces, one nftables table per host for the cuts, and
//! `tc` for delay (netem, or where the kernel lacks it a slow lossy link: [`net`]). Each
//! host runs its own etcd member (Debian's 3.4.23, default timing, `--pre-vote` unless
//! `--no-pre-vote`; [`cluster`]), its own run folder
//! `h<k>/job` (no shared disk: the run id is the folder's name, so the three folders are
//! one run) and its own `runlease` processes. Everything is deleted at the trial's end.
//!
//! # The clients
//!
//! Each host loops `runlease --authority etcd://… run h<k>/job --wait 60s --retire-dead
//! --heartbeat 300 --self-fence-after 1500 --stale-after 2000 -- <xtask> partitions
//! --worker …` (preloaded with libfaketime reading the host's wall-clock offset from a file,
//! monotonic clocks untouched). The worker ([`mod@worker`]) writes as the owner, each
//! operation at random one of:
//! - an append (`runlease append`), a unique id in its payload, recorded `invoke` before
//!   and `complete` after (ok = exit 0, fail = exit 75 `FENCED`, info = anything else);
//! - a store commit through the owner (`runlease store put RUN KEY VALUE`, over the owner's
//!   store socket; with the etcd authority the owner commits it as a record the engine
//!   creates under its guard, issue #32), a key unique to the write, recorded
//!   `store_invoke` before and `store_complete` after (ok = exit 0; fail = exit 75
//!   `FENCED` or 77 refused: nothing written; info = anything else, `OUTCOME_UNKNOWN` (71)
//!   or the socket failing mid-request (74) among them: it may or may not be committed).
//!
//! A worker killed in between leaves an invoke without completion (info). A `FENCED`
//! answer ends the worker (75); after 5-59 operations it also ends by itself (exit 0), so
//! `runlease run` releases the run and the next owner, on whichever host wins its wait,
//! takes the run over, its store caught up from the engine into its host's view: the run
//! moves between hosts through releases as well as through takeovers and retirements.
//! Once the workload ends, a worker holds the run until it is killed. A reader reads the
//! whole log (`runlease events --json`) from a random host every 0.3-0.8 s. Every line
//! goes to one history ([`history`]).
//!
//! # The nemesis
//!
//! `mixed` (default): every 0.5-1.5 s one fault, chosen by the seed, held 1-3 s, then
//! healed: isolate a host (minority | majority), isolate the leader, a one-way cut, a
//! bridge (two hosts cut, the third sees both), SIGKILL a member (restarted at the heal),
//! SIGSTOP a member, SIGKILL the owner's `runlease run` (its guard kills the command by
//! the self-fence deadline; until then it appends on, orphaned),
//! SIGSTOP the owner's `runlease run`, delay or slow a host's packets, step the owner
//! host's wall clock by ±120 s, or a deposed generation's late write (`runlease append
//! --generation g --owner o` as an older owner of the trial, from its host: it must be
//! FENCED and never count; also after half of the heals). Then 3 quiet seconds on a whole
//! network, and two more late writes of deposed generations.
//!
//! `heal`: the fast-heal probe instead: with an owner running, isolate the member of a
//! host that is neither the owner's nor the leader's for 2.5 s, heal, watch 4 s. Its
//! workers never end by themselves (`--no-release`), so an owner change is a fencing. A probe
//! fenced the healthy owner when that owner's `runlease run` exited or a newer generation
//! started, counted apart while the follower was cut and after the heal. Printed as
//! `heal: pre_vote=on|off probes=N fenced_while_cut=C fenced_after_heal=H`.
//!
//! # The checker ([`check`])
//!
//! After the trial every runlease process is killed, the last owner retired once its etcd
//! lease expired (`runlease retire`, which finalizes its cutoff), and the log read. Then the
//! store is read back from every host in turn (a random one first), each time as a new owner
//! of the free run: `runlease run --wait 30s --retire-dead … -- runlease --json store list`,
//! whose open catches that host's view up from the engine; each read is a `store_read` line
//! of the history, so the history alone replays the check. Then, for the appends:
//! - **lost**: an acknowledged append that does not count in the recovered log at the
//!   sequence and generation it was acknowledged with;
//! - **deposed_counted**: an event that counts (in the log, or in any read) although its
//!   append was answered `FENCED`, or was invoked after a newer generation's command had
//!   started (that owner's claim had finalized the older generation's cutoff);
//! - **double_owner**: a generation started twice, or an append acknowledged although
//!   invoked after an append of a newer generation was acknowledged;
//! - **stale_reads**: a read that misses an append acknowledged before the read was
//!   invoked, or no longer sees counting what a read completed before it saw counting
//!   (reads are linearizable over acknowledged appends: the append-only-log model, as
//!   Porcupine's or Knossos's register model would judge a log);
//! - a counting event no operation wrote is a problem.
//!
//! and for the store commits ([`check::check_store`]), against every final read that
//! exited 0:
//! - **store_lost**: an acknowledged `store put` whose key does not hold its value in a
//!   final read (one finding per write, naming the hosts);
//! - **store_deposed_counted**: a key present whose write was answered `FENCED` (or 77), or
//!   was invoked after a newer generation's command had started (its claim's epoch
//!   already existed, so the engine's guard refuses every later record of the older
//!   generation, PROTOCOL §18.2);
//! - a write of unknown outcome may be present or not;
//! - a key no write of the trial put, a value other than its write's, a final read that
//!   failed (a free run refused: `run` exited non-zero) or no final read at all are
//!   problems.
//!
//! Figures: `ops` = appends invoked, `acked` = acknowledged; `failover` = for each owner
//! change (a takeover, a retirement or a release), from the last acknowledged write
//! (append or store commit) of an older generation to the newer generation's command
//! start (ms; p50 and p99 over every trial); `unavailable` = the share of the workload's
//! time (first command start to the end of the quiet period) lying more than 1 s after the
//! last acknowledged write (append or store commit: with half the operations store
//! commits, gaps between appends alone would count time the run was writable). Added at
//! the end of the figure line (so the fields before them keep their
//! place): `store_ops` = store writes invoked, `store_acked` = acknowledged, `store_lost`,
//! `store_deposed_counted`, `store_fenced` = answered `FENCED` (what the deposed check
//! had to judge), `store_unknown` = outcome unknown, `store_reads` = final reads judged.
//! `run_exits` counts why each owner's `runlease run` ended: 0 its worker ended by
//! itself (a release), 75 fenced, 76 held (its wait ran out), 137 killed at a trial's end;
//! anything else refused a run nothing was wrong with.
//!
//! `--mutant NAME` (a test aid, not in the usage text) builds `runlease` with the planted
//! protocol mutants of `cargo xtask mutants` and switches `NAME` on in every runlease
//! process (`RUNLEASE_MUTANT`), to show the checker catching a real protocol bug end to end
//! (`cutoff_one_too_high`, say).
//!
//! A failed trial's folder (history with its final store reads, events, etcd and runlease
//! logs) is kept under `target/partitions/` and named; `--keep` keeps every trial's. A
//! machine where network
//! namespaces cannot be made (not root, a container without the right), or without `ip`,
//! `nft`, `tc`, `etcd` or `curl`, gets a `SKIPPED:` line and exit 0, unless
//! `RUNLEASE_REQUIRE_PARTITIONS` is set.

mod check;
mod cluster;
mod history;
mod net;
#[cfg(test)]
mod tests;
mod trial;
mod worker;

pub(crate) use history::event_line;
pub use worker::{WorkerOpts, worker};

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The faults a trial injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Every kind of fault (module docs).
    Mixed,
    /// The fast-heal probe only.
    Heal,
}

/// What `cargo xtask partitions ...` asks for.
#[derive(Debug)]
pub struct Opts {
    /// Number of trials.
    pub trials: u64,
    /// Seed of the first trial (trial `i` uses a seed derived from it and `i`).
    pub seed: u64,
    /// Seconds of faults per trial.
    pub seconds: u64,
    /// Hosts per trial.
    pub hosts: usize,
    /// Which faults.
    pub scenario: Scenario,
    /// etcd's `--pre-vote`.
    pub pre_vote: bool,
    /// Keep every trial's folder.
    pub keep: bool,
    /// Test aid: build `runlease` with the planted protocol mutants and switch this one on
    /// in every runlease process of the trials (`RUNLEASE_MUTANT`), to show the checker
    /// catches a real protocol bug end to end.
    pub mutant: Option<String>,
}

/// Driver or worker.
#[derive(Debug)]
pub enum Mode {
    /// Run trials.
    Drive(Opts),
    /// The command under `runlease run`.
    Worker(WorkerOpts),
}

/// Parse the arguments after `partitions`.
pub fn parse_args(rest: &[String]) -> Result<Mode, String> {
    let mut opts = Opts {
        trials: 20,
        seed: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
        seconds: 10,
        hosts: 3,
        scenario: Scenario::Mixed,
        pre_vote: true,
        keep: false,
        mutant: None,
    };
    let (mut worker, mut host, mut history, mut runlease, mut until) =
        (false, None, None, None, None);
    let mut releases = true;
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("`partitions {a}` needs a value"))
        };
        let num = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("`partitions {a}`: not a number: {v:?}"))
        };
        match a.as_str() {
            "--trials" => {
                opts.trials = num(val()?)?;
                if opts.trials == 0 {
                    return Err("`partitions --trials` must be at least 1".into());
                }
            }
            "--seed" => opts.seed = num(val()?)?,
            "--seconds" => {
                opts.seconds = num(val()?)?;
                if !(2..=3600).contains(&opts.seconds) {
                    return Err("`partitions --seconds` must be 2..=3600".into());
                }
            }
            "--scenario" => {
                opts.scenario = match val()?.as_str() {
                    "mixed" => Scenario::Mixed,
                    "heal" => Scenario::Heal,
                    other => {
                        return Err(format!(
                            "`partitions --scenario` is `mixed` or `heal`, not {other:?}"
                        ));
                    }
                }
            }
            "--no-pre-vote" => opts.pre_vote = false,
            "--keep" => opts.keep = true,
            "--mutant" => opts.mutant = Some(val()?),
            "--worker" => worker = true,
            "--host" => host = Some(num(val()?)? as usize),
            "--history" => history = Some(PathBuf::from(val()?)),
            "--runlease" => runlease = Some(PathBuf::from(val()?)),
            "--until" => until = Some(num(val()?)?),
            "--no-release" => releases = false,
            other => return Err(format!("unexpected argument to `partitions`: {other:?}")),
        }
    }
    if !worker {
        return Ok(Mode::Drive(opts));
    }
    match (host, history, runlease, until) {
        (Some(host), Some(history), Some(runlease), Some(until)) => Ok(Mode::Worker(WorkerOpts {
            host,
            history,
            runlease,
            until,
            seed: opts.seed,
            releases,
        })),
        _ => Err("`partitions --worker` needs --host, --history, --runlease, --until".into()),
    }
}

/// The figures of every trial together.
#[derive(Debug, Default)]
struct Totals {
    trials: u64,
    ops: u64,
    acked: u64,
    reads: u64,
    undecided: u64,
    lost: u64,
    deposed: u64,
    double: u64,
    stale: u64,
    problems: u64,
    failed: u64,
    faults: u64,
    probes: u64,
    fenced_while_cut: u64,
    fenced_after_heal: u64,
    failovers: Vec<u64>,
    run_exits: std::collections::BTreeMap<i32, u64>,
    unavailable_ns: u64,
    window_ns: u64,
    store_ops: u64,
    store_acked: u64,
    store_fenced: u64,
    store_unknown: u64,
    store_reads: u64,
    store_lost: u64,
    store_deposed: u64,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `cargo xtask partitions`: build, run the trials, print the figure line; fails on any
/// finding.
pub fn run(root: &Path, opts: &Opts) -> Result<(), String> {
    let tag = format!("rlp{}", std::process::id() % 100_000);
    if let Some(why) = net::unavailable_reason(&tag) {
        if std::env::var_os("RUNLEASE_REQUIRE_PARTITIONS").is_some() {
            return Err(format!(
                "partitions: {why} (RUNLEASE_REQUIRE_PARTITIONS is set)"
            ));
        }
        println!("partitions: SKIPPED: {why}");
        return Ok(());
    }
    let features = if opts.mutant.is_some() {
        "etcd,lease-run/mutants"
    } else {
        "etcd"
    };
    let built = crate::build_runlease_with(root, &["--features", features])?;
    let work = root.join("target").join("partitions").join(format!(
        "{}-{}",
        std::process::id(),
        opts.seed
    ));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    // Copies, so a rebuild while the trials run changes nothing under them.
    let runlease = work.join("runlease");
    let exe = work.join("xtask");
    let me = std::env::current_exe().map_err(|e| format!("current exe: {e}"))?;
    for (from, to) in [(&built, &runlease), (&me, &exe)] {
        std::fs::copy(from, to)
            .map_err(|e| format!("{} -> {}: {e}", from.display(), to.display()))?;
    }
    let mut tot = Totals::default();
    println!(
        "partitions: seed={} trials={} seconds={} scenario={:?} pre_vote={}{}",
        opts.seed,
        opts.trials,
        opts.seconds,
        opts.scenario,
        opts.pre_vote,
        opts.mutant
            .as_deref()
            .map_or(String::new(), |m| format!(" MUTANT={m}"))
    );
    for i in 0..opts.trials {
        let dir = work.join(format!("trial-{i}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let out = match trial::run(opts, i, &dir, &runlease, &exe) {
            Ok(o) => o,
            Err(e) => {
                tot.trials += 1;
                tot.problems += 1;
                tot.failed += 1;
                println!("trial {i}: PROBLEM: {e} (kept: {})", dir.display());
                continue;
            }
        };
        let v = &out.verdict;
        tot.trials += 1;
        tot.ops += v.ops;
        tot.acked += v.acked;
        tot.reads += v.reads;
        tot.undecided += v.undecided_reads;
        tot.lost += v.lost.len() as u64;
        tot.deposed += v.deposed_counted.len() as u64;
        tot.double += v.double_owner.len() as u64;
        tot.stale += v.stale_reads.len() as u64;
        tot.problems += v.problems.len() as u64;
        tot.faults += out.faults;
        tot.probes += out.probes;
        tot.fenced_while_cut += out.fenced_while_cut;
        tot.fenced_after_heal += out.fenced_after_heal;
        tot.failovers.extend(&v.failovers_ms);
        for (rc, n) in &v.run_exits {
            *tot.run_exits.entry(*rc).or_default() += n;
        }
        tot.unavailable_ns += v.unavailable_ns;
        tot.window_ns += v.window_ns;
        tot.store_ops += v.store_ops;
        tot.store_acked += v.store_acked;
        tot.store_fenced += v.store_fenced;
        tot.store_unknown += v.store_unknown;
        tot.store_reads += v.store_reads;
        tot.store_lost += v.store_lost.len() as u64;
        tot.store_deposed += v.store_deposed_counted.len() as u64;
        println!(
            "trial {i}: ops={} acked={} reads={} owners={} store_ops={} store_acked={} unavailable={:.1}%{}",
            v.ops,
            v.acked,
            v.reads,
            v.failovers_ms.len() + 1,
            v.store_ops,
            v.store_acked,
            100.0 * v.unavailable_ns as f64 / v.window_ns.max(1) as f64,
            if v.passed() { "" } else { " FAILED" }
        );
        if v.passed() {
            if !opts.keep {
                let _ = std::fs::remove_dir_all(&dir);
            }
        } else {
            tot.failed += 1;
            for f in v
                .lost
                .iter()
                .map(|f| ("lost", f))
                .chain(v.deposed_counted.iter().map(|f| ("deposed_counted", f)))
                .chain(v.double_owner.iter().map(|f| ("double_owner", f)))
                .chain(v.stale_reads.iter().map(|f| ("stale_read", f)))
                .chain(v.store_lost.iter().map(|f| ("store_lost", f)))
                .chain(
                    v.store_deposed_counted
                        .iter()
                        .map(|f| ("store_deposed_counted", f)),
                )
                .chain(v.problems.iter().map(|f| ("problem", f)))
                .take(20)
            {
                println!("  {}: {}", f.0, f.1);
            }
            println!("  history kept for replay: {}", dir.display());
        }
    }
    tot.failovers.sort_unstable();
    println!(
        "partitions: hosts={} trials={} ops={} acked={} lost={} deposed_counted={} double_owner={} failover_p50={}ms failover_p99={}ms unavailable={:.1}% reads={} undecided_reads={} stale_reads={} faults={} store_ops={} store_acked={} store_lost={} store_deposed_counted={} store_fenced={} store_unknown={} store_reads={}",
        opts.hosts,
        tot.trials,
        tot.ops,
        tot.acked,
        tot.lost,
        tot.deposed,
        tot.double,
        percentile(&tot.failovers, 0.5),
        percentile(&tot.failovers, 0.99),
        100.0 * tot.unavailable_ns as f64 / tot.window_ns.max(1) as f64,
        tot.reads,
        tot.undecided,
        tot.stale,
        tot.faults,
        tot.store_ops,
        tot.store_acked,
        tot.store_lost,
        tot.store_deposed,
        tot.store_fenced,
        tot.store_unknown,
        tot.store_reads,
    );
    // Why each `runlease run` ended: 0 its worker ended by itself (a release), 75 fenced,
    // 76 held (its wait ran out), 137 killed at a trial's end; anything else (65, 70, 74)
    // refused a run that nothing was wrong with.
    let exits: Vec<String> = tot
        .run_exits
        .iter()
        .map(|(rc, n)| format!("{rc}:{n}"))
        .collect();
    println!("partitions: run_exits={}", exits.join(","));
    if opts.scenario == Scenario::Heal {
        println!(
            "heal: pre_vote={} probes={} fenced_while_cut={} fenced_after_heal={}",
            if opts.pre_vote { "on" } else { "off" },
            tot.probes,
            tot.fenced_while_cut,
            tot.fenced_after_heal
        );
    }
    if tot.failed == 0 && !opts.keep {
        let _ = std::fs::remove_dir_all(&work);
    }
    if tot.failed > 0 {
        return Err(format!(
            "{} of {} trials failed (folders kept under {})",
            tot.failed,
            tot.trials,
            work.display()
        ));
    }
    Ok(())
}
