//! Whole-process timings, measured here rather than by criterion: `runlease run`, `append`
//! and `status` beside a link-exclusive create timed at the same moments, on long and short
//! logs, with idle processes added, and their peak memory.

use super::{PeakRss, Plan, Processes};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// One link-exclusive create (`lease_fs::primitives::create_exclusive`: temp, write, fsync,
/// link, fsync dir, unlink temp) of a 300-byte file, timed.
fn timed_create(fs: &lease_fs::RealFs, n: usize) -> Result<Duration, String> {
    let t = Instant::now();
    let made = lease_fs::primitives::create_exclusive(fs, &format!("d/c{n}"), &[b'x'; 300])
        .map_err(|e| format!("baseline create: {e}"))?;
    if !made {
        return Err(format!("baseline create: d/c{n} exists"));
    }
    Ok(t.elapsed())
}

fn median_us(v: Vec<Duration>) -> f64 {
    median(v).as_secs_f64() * 1e6
}

/// The median of `v` (the upper one of an even count); `v` must not be empty.
fn median<T: Ord + Copy>(mut v: Vec<T>) -> T {
    v.sort();
    v[v.len() / 2]
}

/// A `runlease` command (release build) on `run`, its output discarded: `args`, the run,
/// then `tail`.
fn runlease(bin: &Path, args: &[&str], run: &Path, tail: &[&str]) -> Command {
    let mut c = Command::new(bin);
    c.args(args)
        .arg(run)
        .args(tail)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// Run `c` to its end, timed; an error unless it exits 0.
fn timed(mut c: Command) -> Result<Duration, String> {
    let t = Instant::now();
    let st = c.status().map_err(|e| format!("{c:?}: {e}"))?;
    let took = t.elapsed();
    if st.success() {
        Ok(took)
    } else {
        Err(format!("{c:?} exited with {st}"))
    }
}

/// `runlease run -q R -- true`.
fn run_true(bin: &Path, run: &Path) -> Command {
    runlease(bin, &["run", "-q"], run, &["--", "true"])
}

/// `n` interleaved pairs: each round times `a` once and `b` once, in alternating order, so
/// both see the machine at the same moments. The medians (µs) of each are the figures; a
/// first process after a change of the run (a prefilled log) may pay a one-time cost,
/// which the median leaves out.
fn pairs(
    n: usize,
    a: impl FnMut() -> Result<Duration, String>,
    b: impl FnMut() -> Result<Duration, String>,
) -> Result<(f64, f64), String> {
    let (ma, mb) = interleaved(n, a, b)?;
    Ok((ma.as_secs_f64() * 1e6, mb.as_secs_f64() * 1e6))
}

/// [`pairs`] of any measure (`pairs`: times; [`peak_rss`]: KiB): the medians of `n` rounds
/// of `a` once and `b` once, in alternating order.
fn interleaved<T: Ord + Copy>(
    n: usize,
    mut a: impl FnMut() -> Result<T, String>,
    mut b: impl FnMut() -> Result<T, String>,
) -> Result<(T, T), String> {
    let (mut va, mut vb) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        if i % 2 == 0 {
            va.push(a()?);
            vb.push(b()?);
        } else {
            vb.push(b()?);
            va.push(a()?);
        }
    }
    Ok((median(va), median(vb)))
}

/// An owner that sleeps: `runlease run -q R -- sleep 600`, with its generation, owner id
/// and run id (from `status --json` once it is active). Stopped when dropped: SIGTERM goes
/// on to `sleep`, which exits, and the owner releases the run.
struct Owner {
    child: Child,
    generation: String,
    owner_id: String,
    run_id: String,
}

impl Owner {
    fn start(bin: &Path, run: &Path) -> Result<Owner, String> {
        let child = runlease(bin, &["run", "-q"], run, &["--", "sleep", "600"])
            .spawn()
            .map_err(|e| format!("start the owner of {}: {e}", run.display()))?;
        let mut owner = Owner {
            child,
            generation: String::new(),
            owner_id: String::new(),
            run_id: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = runlease(bin, &["status", "--json"], run, &[])
                .stdout(Stdio::piped())
                .output()
                .map_err(|e| format!("status: {e}"))?;
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            if v["state"] == "active" && v["pid"].as_u64() == Some(u64::from(owner.child.id())) {
                owner.generation = v["generation"].as_u64().unwrap_or(0).to_string();
                owner.owner_id = v["owner_id"].as_str().unwrap_or("").to_string();
                owner.run_id = v["run_id"].as_str().unwrap_or("").to_string();
                return Ok(owner);
            }
            if let Ok(Some(st)) = owner.child.try_wait() {
                return Err(format!(
                    "the owner of {} exited with {st} before it became active",
                    run.display()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("the owner never became active: {v}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `runlease append -q` of one small event as this owner.
    fn append(&self, bin: &Path, run: &Path, i: usize) -> Command {
        let payload = format!("{{\"n\":{i}}}");
        runlease(
            bin,
            &[
                "append",
                "-q",
                "--type",
                "bench",
                "--payload",
                &payload,
                "--generation",
                &self.generation,
                "--owner",
                &self.owner_id,
            ],
            run,
            &[],
        )
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        crate::torture::procs::signal_pid(self.child.id(), rustix::process::Signal::TERM);
        let _ = self.child.wait();
    }
}

/// Fill `run`'s log with `n` events as a job that logs its steps leaves it: an owner holds
/// the run while `n` valid events of its generation and owner id (canonical records, the
/// hash chain linked, about 200 payload bytes each, as `cargo xtask rss` writes them; no
/// fsync: setup only) are written straight into `events/`, then the owner is stopped, so
/// its release's cutoff covers them all (every one counts).
fn fill_log(bin: &Path, run: &Path, n: u64) -> Result<(), String> {
    use lease_core::{Digest, Event, FileRef, Generation, Identity, RunId, Sequence, Timestamp};
    let owner = Owner::start(bin, run)?;
    let generation = owner
        .generation
        .parse()
        .ok()
        .and_then(Generation::new)
        .ok_or("the owner's generation")?;
    let owner_id = Identity::new(owner.owner_id.clone()).map_err(|e| e.to_string())?;
    let run_id = RunId::new(owner.run_id.clone()).map_err(|e| e.to_string())?;
    let ty = Identity::new("bench.prefill").map_err(|e| e.to_string())?;
    let mut prev: Option<Digest> = None;
    for s in 1..=n {
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_err(|e| e.to_string())?
            .as_millis();
        let ev = Event {
            run_id: run_id.clone(),
            sequence: Sequence::new(s).ok_or("sequence")?,
            generation,
            owner_id: owner_id.clone(),
            event_type: ty.clone(),
            payload: serde_json::json!({ "step": s, "note": "x".repeat(160) }),
            timestamp: u64::try_from(now_ms)
                .ok()
                .and_then(Timestamp::from_unix_millis)
                .ok_or("time")?,
            prev_hash: prev.take(),
        };
        let bytes = lease_core::encode(&ev).map_err(|e| e.to_string())?;
        prev = Some(Digest::of(&bytes));
        let path = run.join(FileRef::Event(ev.sequence).path());
        std::fs::write(&path, &bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    drop(owner);
    Ok(())
}

/// Idle processes (`sleep 600`, children of this process) added to the machine; killed
/// and reaped when dropped.
struct Idle(Vec<Child>);

impl Idle {
    /// Add or remove processes until there are `n`.
    fn resize(&mut self, n: usize) -> Result<(), String> {
        while self.0.len() > n {
            let mut c = self.0.pop().expect("len > n");
            let _ = c.kill();
            let _ = c.wait();
        }
        while self.0.len() < n {
            let c = Command::new("sleep")
                .arg("600")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("start idle process {}: {e}", self.0.len() + 1))?;
            self.0.push(c);
        }
        Ok(())
    }
}

impl Drop for Idle {
    fn drop(&mut self) {
        let _ = self.resize(0);
    }
}

/// Processes on this machine now (the entries of `/proc` that are pids).
fn process_count() -> usize {
    std::fs::read_dir("/proc").map_or(0, |rd| {
        rd.filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
            .count()
    })
}

/// The whole-process timings, each a fresh process of the release build.
pub(super) fn processes(target: &Path, plan: &Plan) -> Result<Processes, String> {
    let n = plan.n;
    let bin = target.join("release/runlease");
    let tmp = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let run = tmp.path().join("bench-run");
    let fs = lease_fs::RealFs::create(&tmp.path().join("baseline"))
        .map_err(|e| format!("baseline folder: {e}"))?;
    lease_fs::fs::Fs::ensure_dir(&fs, "d").map_err(|e| format!("baseline folder: {e}"))?;

    // `runlease run R -- true` on one run, `n` times (after one unmeasured first run that
    // creates it).
    let mut made = 0;
    timed(run_true(&bin, &run))?;
    let (mut times, mut creates) = (Vec::with_capacity(n), Vec::with_capacity(2 * n));
    for _ in 0..n {
        made += 1;
        creates.push(timed_create(&fs, made)?);
        times.push(timed(run_true(&bin, &run))?);
    }
    let run_true_median = median_us(times);
    let run_true_create = median_us(std::mem::take(&mut creates));

    // `runlease append R` `n` times inside a run held by `runlease run R -- sleep`.
    let owner = Owner::start(&bin, &run)?;
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        made += 1;
        creates.push(timed_create(&fs, made)?);
        times.push(timed(owner.append(&bin, &run, i))?);
    }
    drop(owner);
    let append = median_us(times);
    let append_create = median_us(creates);

    // Issue #33: the same processes on a long log and on a short one (and, for peak
    // memory, on one a tenth as long). Each log is filled before the owner whose appends
    // are timed starts.
    let (empty, short, tenth, long) = (
        tmp.path().join("log-empty"),
        tmp.path().join("log-10"),
        tmp.path().join("log-tenth"),
        tmp.path().join("log-long"),
    );
    for r in [&empty, &short, &tenth, &long] {
        timed(run_true(&bin, r))?;
    }
    let t = Instant::now();
    let sizes = (plan.log_events, plan.log_events / 10);
    fill_log(&bin, &short, 10)?;
    fill_log(&bin, &tenth, sizes.1)?;
    fill_log(&bin, &long, sizes.0)?;
    println!(
        "processes: logs of 10, {} and {} events filled in {:.1} s",
        sizes.1,
        sizes.0,
        t.elapsed().as_secs_f64()
    );
    let t = Instant::now();
    let rss = peak_rss(&bin, plan.rss_probes, (&long, &tenth), sizes)?;
    println!(
        "processes: peak RSS probed in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let (run_true_long, run_true_empty) = pairs(
        n,
        || timed(run_true(&bin, &long)),
        || timed(run_true(&bin, &empty)),
    )?;
    let (status_long, status_empty) = pairs(
        n,
        || timed(runlease(&bin, &["status"], &long, &[])),
        || timed(runlease(&bin, &["status"], &empty, &[])),
    )?;
    let (owner_long, owner_short) = (Owner::start(&bin, &long)?, Owner::start(&bin, &short)?);
    let mut i = 0;
    let (append_long, append_short) = pairs(
        n,
        || {
            i += 1;
            timed(owner_long.append(&bin, &long, i))
        },
        || timed(owner_short.append(&bin, &short, 0)),
    )?;
    drop((owner_long, owner_short));

    // Issue #33: `runlease run R -- true` with many idle processes on the machine and with
    // few, in blocks (low, high, low, high: starting and killing them takes seconds), on
    // the run with an empty log.
    let (high, low) = plan.procs;
    let mut idle = Idle(Vec::with_capacity(high));
    let (mut at_high, mut at_low) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let base = process_count();
    let per_block = n.div_ceil(2);
    for block in 0..4 {
        let (count, into) = if block % 2 == 0 {
            (low, &mut at_low)
        } else {
            (high, &mut at_high)
        };
        idle.resize(count)?;
        for _ in 0..per_block {
            into.push(timed(run_true(&bin, &empty))?);
        }
    }
    drop(idle);
    println!(
        "processes: {base} processes on the machine before the {low} / {high} idle ones were added"
    );

    Ok(Processes {
        run_true: run_true_median,
        run_true_create,
        append,
        append_create,
        log_events: plan.log_events,
        append_long,
        append_short,
        run_true_long,
        run_true_empty,
        status_long,
        status_empty,
        rss,
        procs: plan.procs,
        run_true_procs_high: median_us(at_high),
        run_true_procs_low: median_us(at_low),
    })
}

/// Issue #33: the [`PeakRss`] figures of the runs `long` and `short`, whose logs have
/// `events` events: `run R -- true`, `status R`, then `append R` inside each run held by an
/// [`Owner`], each measured in `probes` interleaved pairs.
fn peak_rss(
    bin: &Path,
    probes: usize,
    (long, short): (&Path, &Path),
    events: (u64, u64),
) -> Result<PeakRss, String> {
    let kib = |c: Command| crate::rss::peak_kib(&c);
    let run = interleaved(
        probes,
        || kib(run_true(bin, long)),
        || kib(run_true(bin, short)),
    )?;
    let status = interleaved(
        probes,
        || kib(runlease(bin, &["status"], long, &[])),
        || kib(runlease(bin, &["status"], short, &[])),
    )?;
    let (owner_long, owner_short) = (Owner::start(bin, long)?, Owner::start(bin, short)?);
    let append = interleaved(
        probes,
        || kib(owner_long.append(bin, long, 0)),
        || kib(owner_short.append(bin, short, 0)),
    )?;
    drop((owner_long, owner_short));
    Ok(PeakRss {
        events,
        run_true: run,
        append,
        status,
    })
}
