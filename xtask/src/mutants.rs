//! `cargo xtask mutants`: the curated protocol mutants of issue #30, and the run that
//! proves each one is killed by the checks listed for it.
//!
//! Every mutant is planted once in the source as a one-line guard,
//! `if lease_core::mutant::mutant("name") { ... }`, compiled only with the `mutants` cargo
//! feature of the crate it is planted in (lease-core, lease-fs, lease-sqlite, lease-run) and
//! switched on at run time by `RUNLEASE_MUTANT=name`. So the step costs one build per test
//! binary, not one per mutant:
//!
//! 1. build every listed check's test binaries (`cargo test --no-run --features mutants`);
//! 2. baseline: every listed check must pass with no mutant (`RUNLEASE_MUTANT` unset), else
//!    the list is wrong ("check fails without a mutant");
//! 3. per mutant, run its checks in order with `RUNLEASE_MUTANT=name`; the first failing one
//!    kills it (a check that outlives its time limit counts as failing: a hang is caught by
//!    CI's time limit too). A mutant no check kills survived, and the step fails.
//!
//! A mutant marked `expected_survivor_until` is run and reported, but neither counted as
//! killed nor failing the step while it survives: it names the check that is still missing.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// A test binary of one package, in the debug or release profile.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Target {
    /// The package's unit tests (`--lib`).
    Lib,
    /// An integration test (`--test NAME`).
    Test(&'static str),
}

/// One `cargo test` invocation: a test binary, an optional name filter, its environment.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) struct Check {
    pub(crate) package: &'static str,
    /// `--release`: only where the test needs it (the model checker).
    pub(crate) release: bool,
    pub(crate) target: Target,
    /// A libtest name filter (substring), `None` for the whole binary.
    pub(crate) filter: Option<&'static str>,
    /// Extra environment (e.g. `RUNLEASE_MODEL=ci`).
    pub(crate) env: &'static [(&'static str, &'static str)],
}

/// One planted mutant.
pub(crate) struct Mutant {
    /// The `RUNLEASE_MUTANT` value, also the name in the guard's comment.
    pub(crate) name: &'static str,
    /// The PROTOCOL rule or invariant it breaks.
    pub(crate) breaks: &'static str,
    /// Where the guard is.
    pub(crate) planted: &'static str,
    /// The checks that must kill it, most specific and fastest first.
    pub(crate) checks: &'static [Check],
    /// Set while no check is expected to kill it yet: the check that will.
    pub(crate) expected_survivor_until: Option<&'static str>,
}

/// A whole integration test binary of `package` (debug profile, no filter).
const fn whole_test(package: &'static str, name: &'static str) -> Check {
    Check {
        package,
        release: false,
        target: Target::Test(name),
        filter: None,
        env: &[],
    }
}

/// The tests of an integration test binary of `package` whose names contain `filter`.
const fn test(package: &'static str, name: &'static str, filter: &'static str) -> Check {
    Check {
        filter: Some(filter),
        ..whole_test(package, name)
    }
}

/// An integration test of `package` in the release profile (the model checkers), with an
/// optional name filter and extra environment.
const fn release_test(
    package: &'static str,
    name: &'static str,
    filter: Option<&'static str>,
    env: &'static [(&'static str, &'static str)],
) -> Check {
    Check {
        release: true,
        filter,
        env,
        ..whole_test(package, name)
    }
}

/// The unit tests (`--lib`) of `package` whose names contain `filter`.
const fn lib(package: &'static str, filter: &'static str) -> Check {
    Check {
        package,
        release: false,
        target: Target::Lib,
        filter: Some(filter),
        env: &[],
    }
}

/// The bounded BFS model checker at CI depth (release build, as `cargo xtask model`).
const MODEL_CI: Check = release_test("lease-fs", "model_check", None, &[("RUNLEASE_MODEL", "ci")]);

/// The engine model checker of the store log (issue #32) at CI depth (release build).
const ENGINE_MODEL_CI: Check = release_test(
    "lease-core",
    "engine_model",
    Some("engine_model_check"),
    &[("RUNLEASE_MODEL", "ci")],
);

/// The engine model at the plain `cargo test` bound (seconds): its snapshot configuration
/// truncates under a reader without a lease.
const ENGINE_MODEL_DEFAULT: Check = release_test(
    "lease-core",
    "engine_model",
    Some("engine_model_check"),
    &[],
);

/// The model checker's one configuration of an owner beating in place against a taker
/// (every interleaving, seconds): an owner's beat between the taker's look and its commit.
const MODEL_BEAT_VS_TAKER: Check = release_test(
    "lease-fs",
    "model_check",
    Some("model_check_the_protocol"),
    &[
        ("RUNLEASE_MODEL", "ci"),
        ("RUNLEASE_MODEL_ONLY", "owner beating in place vs a taker"),
    ],
);

/// The model checker's configuration of an owner beating durably (fdatasync in place)
/// against a taker, with a power loss tearing the write in flight (issue #30; seconds).
const MODEL_DURABLE_BEATS: Check = release_test(
    "lease-fs",
    "model_check",
    Some("model_check_the_protocol"),
    &[
        ("RUNLEASE_MODEL", "ci"),
        ("RUNLEASE_MODEL_ONLY", "owner beating durably in place"),
    ],
);

/// The checks of the heartbeat-slot mutants: the slot format's unit tests, the crash
/// tests of heartbeats, and the durable-heartbeat model configuration.
const BEAT_CHECKS: &[Check] = &[
    lib("lease-core", "beat"),
    test("lease-fs", "crash", "heartbeat"),
    MODEL_DURABLE_BEATS,
];

/// lease-fs's model checker's replayed schedules only (release, seconds).
const MODEL_SCHEDULES: Check = release_test("lease-fs", "model_check", Some("model_schedule"), &[]);

/// lease-core's model-based proptest (three owners, every §8 invariant at each step).
const CORE_MODEL: Check = whole_test("lease-core", "model");

/// lease-core's protocol scenarios over the in-memory file system.
const CORE_PROTOCOL: Check = whole_test("lease-core", "protocol");

/// The curated list. Keep each `planted` in step with the guard's comment in the source.
pub(crate) const MUTANTS: &[Mutant] = &[
    Mutant {
        name: "recheck_ignores_higher",
        breaks: "R4 / I1, I8 (RECHECK, PROTOCOL §7.0)",
        planted: "lease-core/src/ops/common/recheck.rs",
        checks: &[CORE_PROTOCOL, MODEL_CI],
        expected_survivor_until: None,
    },
    Mutant {
        name: "claim_already_exists_wins",
        breaks: "§7.1 step 5 / I1 (claim's AlreadyExists)",
        planted: "lease-core/src/ops/lease/claim.rs",
        checks: &[CORE_MODEL, MODEL_CI],
        expected_survivor_until: None,
    },
    Mutant {
        name: "cutoff_one_too_high",
        breaks: "I4, I13 (FINALIZE F2's events_through, §7.0)",
        planted: "lease-core/src/ops/common/finalize.rs",
        checks: &[CORE_PROTOCOL, MODEL_CI],
        expected_survivor_until: None,
    },
    Mutant {
        name: "expectation_ignored",
        breaks: "I6 (takeover/retire JUDGE: the exact expectation, §7.4 step 3)",
        planted: "lease-core/src/ops/lease/takeover.rs (Expectation::mismatch)",
        checks: &[CORE_PROTOCOL, MODEL_CI],
        expected_survivor_until: None,
    },
    Mutant {
        name: "watch_ignored",
        breaks: "I6 (takeover JUDGE: watched_unchanged_ms > stale_after, §7.4 step 3)",
        planted: "lease-core/src/ops/lease/takeover.rs (Takeover::judge)",
        checks: &[CORE_PROTOCOL, MODEL_CI],
        expected_survivor_until: None,
    },
    Mutant {
        name: "takeover_skip_reread_judge",
        breaks: "I6 (takeover step 6: JUDGE on the re-read beat, §7.4)",
        planted: "lease-core/src/ops/lease/takeover.rs (TakeoverState::Reread)",
        // Killed today by the model checker's check that a takeover's commit matches the beat
        // it judged (a beat written after the look); the ghost expectation check (issue #30)
        // will be a second killer.
        checks: &[MODEL_BEAT_VS_TAKER, MODEL_CI],
        expected_survivor_until: None,
    },
    Mutant {
        name: "takeover_clock_bound_skipped",
        breaks: "I6 limit OQ-5 (takeover step 7: look-to-commit within heartbeat/2, §7.4)",
        planted: "lease-core/src/ops/lease/takeover.rs (TakeoverState::ClockAfter)",
        checks: &[
            test(
                "lease-core",
                "protocol",
                "a_takeover_paused_between_its_last_look",
            ),
            MODEL_SCHEDULES,
            MODEL_CI,
        ],
        expected_survivor_until: None,
    },
    Mutant {
        name: "append_unfenced",
        breaks: "I9 (an append is acknowledged only if it counts: PreCheck and the post-check's judgement, §7.6)",
        planted: "lease-core/src/ops/log/append.rs (PreCheck, judge_append), lease-cli/src/ops/log.rs (the CLI's head check)",
        // Also caught end to end by `cargo xtask partitions --mutant append_unfenced`: the
        // late writes of deposed generations are acknowledged and do not count.
        checks: &[CORE_PROTOCOL, MODEL_CI],
        expected_survivor_until: None,
    },
    Mutant {
        name: "prune_floor_one_too_high",
        breaks: "I2 (prune's floor F = H - keep + 1 <= H - 1, §7.10)",
        planted: "lease-core/src/ops/prune.rs",
        checks: &[CORE_PROTOCOL, test("lease-fs", "crash", "prune"), MODEL_CI],
        expected_survivor_until: None,
    },
    Mutant {
        name: "prune_skips_unjudged",
        breaks: "I9 / §7.10 step 7 (prune reads from the old checkpoint's unjudged_from)",
        planted: "lease-core/src/ops/prune.rs (PruneState::Tail)",
        checks: &[test(
            "lease-core",
            "model",
            "a_prune_judges_the_events_an_earlier_checkpoint_left_unjudged",
        )],
        expected_survivor_until: None,
    },
    Mutant {
        name: "beat_one_slot",
        breaks: "§4 heartbeat slots / §9 heartbeat crash table (the other slot whole)",
        planted: "lease-core/src/beat.rs (slot_offset)",
        checks: BEAT_CHECKS,
        expected_survivor_until: None,
    },
    Mutant {
        name: "beat_checksum_ignored",
        breaks: "§4 heartbeat checksum / §9 heartbeat crash table (a torn slot is ignored)",
        planted: "lease-core/src/beat.rs (decode_slot)",
        checks: BEAT_CHECKS,
        expected_survivor_until: None,
    },
    Mutant {
        name: "self_fence_late",
        breaks: "§7.11 self-fence deadline (age > self_fence_after)",
        planted: "lease-core/src/policy.rs (must_self_fence)",
        checks: &[lib("lease-core", "self_fence")],
        expected_survivor_until: None,
    },
    Mutant {
        name: "seal_identity_ignored",
        breaks: "§7.12 seal check (store identity)",
        planted: "lease-core/src/seal.rs (check_seal)",
        checks: &[lib("lease-core", "seal")],
        expected_survivor_until: None,
    },
    Mutant {
        name: "seal_sequence_ignored",
        breaks: "§7.12 seal check (head >= seal.sequence)",
        planted: "lease-core/src/seal.rs (check_seal)",
        checks: &[lib("lease-core", "seal")],
        expected_survivor_until: None,
    },
    Mutant {
        name: "floor_check_skipped",
        breaks: "§7.12 floor check (head >= store_floor)",
        planted: "lease-core/src/seal.rs (check_seal)",
        checks: &[lib("lease-core", "seal")],
        expected_survivor_until: None,
    },
    Mutant {
        name: "rollback_evidence_ignored",
        breaks: "§7.14 step 2 rollback evidence / I2, I4",
        planted: "lease-core/src/rollback.rs (rollback_evidence)",
        checks: &[lib("lease-core", "rollback")],
        expected_survivor_until: None,
    },
    Mutant {
        name: "create_skips_dir_fsync",
        breaks: "§5.2 create_exclusive's folder fsync / §9 (\"after link, before dir fsync\")",
        planted: "lease-fs/src/primitives.rs (PrimState::Link)",
        checks: &[
            test(
                "lease-fs",
                "crash",
                "each_operation_uses_the_minimum_number_of_fsyncs",
            ),
            MODEL_CI,
        ],
        expected_survivor_until: None,
    },
    Mutant {
        name: "store_fencing_token_ignored",
        breaks: "I3 (the store refuses tokens below its highest)",
        planted: "lease-sqlite/src/store/commit.rs (commit_group)",
        checks: &[test("lease-sqlite", "fencing", "")],
        expected_survivor_until: None,
    },
    Mutant {
        name: "store_seal_fencing_ignored",
        breaks: "I3 / §7.3 (a fenced generation cannot seal)",
        planted: "lease-sqlite/src/store/commit.rs (seal)",
        checks: &[test("lease-sqlite", "fencing", "seal")],
        expected_survivor_until: None,
    },
    Mutant {
        name: "store_record_unguarded",
        breaks: "S2 / §18.2 (a store record is created without the engine's guard)",
        planted: "lease-core/src/ops/store/commit.rs (CommitRecord)",
        checks: &[test("lease-core", "store_log", "deposed"), ENGINE_MODEL_CI],
        expected_survivor_until: None,
    },
    Mutant {
        name: "mark_before_events_durable",
        breaks: "§13.1 (a verified-prefix mark is written only after `events/` is durable: a power loss never leaves a mark above the log's durable end)",
        planted: "lease-core/src/ops/log/mark.rs (WriteMark)",
        checks: &[test(
            "lease-core",
            "marks",
            "a_power_loss_never_leaves_a_mark_above_the_durable_log",
        )],
        expected_survivor_until: None,
    },
    Mutant {
        name: "store_read_end_unchecked",
        breaks: "S1 / §18.4 (a read that met a truncation of the whole rest of the log answers a shorter log)",
        planted: "lease-core/src/ops/store/read.rs (ReadStoreLog)",
        checks: &[
            test("lease-core", "store_log", "a_truncation_of_the_whole_log"),
            ENGINE_MODEL_DEFAULT,
        ],
        expected_survivor_until: None,
    },
    Mutant {
        name: "socket_generation_stamp_ignored",
        breaks: "I3 / §11.2 (the store socket refuses another generation's command: FENCED)",
        planted: "lease-run/src/run/serve.rs (handshake welcome)",
        checks: &[test(
            "lease-run",
            "store_socket",
            "a_command_commits_and_reads_through_the_socket_and_strangers_are_refused",
        )],
        expected_survivor_until: None,
    },
    Mutant {
        name: "watchdog_never_lapses",
        breaks: "§7.11 / §10 self-fence deadline (lease-run's watchdog)",
        planted: "lease-run/src/run/mod.rs (Shared::lapsed)",
        checks: &[
            test(
                "lease-run",
                "lifecycle",
                "a_lapse_fence_says_its_cause_once",
            ),
            test("lease-run", "lifecycle", "watchdog_kills_commands"),
        ],
        expected_survivor_until: None,
    },
];

impl Check {
    /// The `cargo test` arguments (without the environment).
    fn args(&self, no_run: bool) -> Vec<&'static str> {
        let mut a = vec!["test", "-q", "-p", self.package, "--features", "mutants"];
        if self.release {
            a.push("--release");
        }
        if no_run {
            a.push("--no-run");
        }
        match self.target {
            Target::Lib => a.push("--lib"),
            Target::Test(t) => a.extend(["--test", t]),
        }
        if let Some(f) = self.filter.filter(|f| !f.is_empty()) {
            a.extend(["--", f]);
        }
        a
    }

    /// How the check is named in the report.
    fn label(&self) -> String {
        let mut s = String::from("cargo test -p ");
        s.push_str(self.package);
        if self.release {
            s.push_str(" --release");
        }
        match self.target {
            Target::Lib => s.push_str(" --lib"),
            Target::Test(t) => {
                s.push_str(" --test ");
                s.push_str(t);
            }
        }
        if let Some(f) = self.filter.filter(|f| !f.is_empty()) {
            s.push(' ');
            s.push_str(f);
        }
        for (k, v) in self.env {
            s = format!("{k}={v} {s}");
        }
        s
    }
}

/// What one run of a check gave.
enum Outcome {
    /// Passed; how many tests ran (the sum of libtest's `running N tests`).
    Passed(usize),
    Failed(String),
    TimedOut,
}

/// Run `check` with `mutant` (or none), bounded by `limit`; output captured.
fn run_check(check: &Check, mutant: Option<&str>, limit: Duration) -> Result<Outcome, String> {
    let mut cmd = crate::cargo(&check.args(false));
    cmd.env_remove("RUNLEASE_MUTANT");
    // A proptest a mutant fails must not record its seed in the tracked
    // `*.proptest-regressions` files.
    cmd.env("PROPTEST_DISABLE_FAILURE_PERSISTENCE", "1");
    if let Some(m) = mutant {
        cmd.env("RUNLEASE_MUTANT", m);
    }
    for (k, v) in check.env {
        cmd.env(k, v);
    }
    let dir = crate::target_dir(&crate::workspace_root()).join("mutants");
    std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let log = dir.join("check.log");
    let out = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    // Its own process group, so a check over its limit is stopped with every process it
    // started (cargo, the test binary, the runs the test spawned).
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("could not start {}: {e}", check.label()))?;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if status.success() {
                return Ok(Outcome::Passed(tests_run(&text)));
            }
            let tail: Vec<&str> = text.lines().rev().take(25).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Ok(Outcome::Failed(tail.join("\n")));
        }
        if start.elapsed() > limit {
            if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
            }
            let _ = child.wait();
            return Ok(Outcome::TimedOut);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How many tests libtest said it ran, over every binary of the output.
fn tests_run(text: &str) -> usize {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("running "))
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<usize>().ok())
        .sum()
}

/// `--only NAME` (repeatable): run just those mutants (the baseline of their checks only).
pub(crate) fn parse_args(rest: &[String]) -> Result<Vec<String>, String> {
    let mut only = Vec::new();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--only" => only.push(it.next().ok_or("--only needs a mutant name")?.to_string()),
            other => return Err(format!("unexpected argument to `mutants`: {other}")),
        }
    }
    for name in &only {
        if !MUTANTS.iter().any(|m| m.name == *name) {
            return Err(format!("no mutant named {name} (see xtask/src/mutants.rs)"));
        }
    }
    Ok(only)
}

/// `cargo xtask mutants [--only NAME]...`.
pub(crate) fn run(only: &[String]) -> Result<(), String> {
    let start = Instant::now();
    let chosen: Vec<&Mutant> = MUTANTS
        .iter()
        .filter(|m| only.is_empty() || only.iter().any(|o| o == m.name))
        .collect();
    let mut checks: Vec<Check> = chosen
        .iter()
        .flat_map(|m| m.checks.iter().copied())
        .collect();
    checks.sort();
    checks.dedup();

    // 1. One build: every test binary a check runs, per package and profile.
    let mut builds: BTreeMap<(&str, bool), Vec<Target>> = BTreeMap::new();
    for c in &checks {
        let targets = builds.entry((c.package, c.release)).or_default();
        if !targets.contains(&c.target) {
            targets.push(c.target);
        }
    }
    let built = Instant::now();
    for ((package, release), targets) in &builds {
        let mut args = vec!["test", "--no-run", "-p", package, "--features", "mutants"];
        if *release {
            args.push("--release");
        }
        for t in targets {
            match t {
                Target::Lib => args.push("--lib"),
                Target::Test(name) => args.extend(["--test", name]),
            }
        }
        crate::run_status(crate::cargo(&args))?;
    }
    eprintln!(
        "mutants: built {} test binaries in {:.1}s",
        builds.values().map(Vec::len).sum::<usize>(),
        built.elapsed().as_secs_f64()
    );

    // 2. Baseline: each check passes unmutated; its time sets its limit under a mutant.
    let mut limits: BTreeMap<Check, Duration> = BTreeMap::new();
    for c in &checks {
        let t = Instant::now();
        match run_check(c, None, Duration::from_secs(600))? {
            // A filter that matches no test passes whatever the mutant: a check that can
            // never kill.
            Outcome::Passed(0) => {
                return Err(format!("check runs no test: {}", c.label()));
            }
            Outcome::Passed(_) => {}
            Outcome::Failed(tail) => {
                return Err(format!(
                    "check fails without a mutant: {}\n{tail}",
                    c.label()
                ));
            }
            Outcome::TimedOut => {
                return Err(format!(
                    "check fails without a mutant: {} (over 600 s)",
                    c.label()
                ));
            }
        }
        let took = t.elapsed();
        eprintln!(
            "baseline: {} passed in {:.1}s",
            c.label(),
            took.as_secs_f64()
        );
        limits.insert(*c, (took * 4).max(Duration::from_secs(60)));
    }

    // 3. Each mutant against its checks, first failure kills.
    let (mut killed, mut survived, mut expected) = (0usize, Vec::new(), Vec::new());
    for m in &chosen {
        let t = Instant::now();
        let mut by = None;
        for c in m.checks {
            match run_check(c, Some(m.name), limits[c])? {
                Outcome::Passed(_) => {}
                Outcome::Failed(_) => {
                    by = Some(c.label());
                    break;
                }
                Outcome::TimedOut => {
                    by = Some(format!("{} (timed out)", c.label()));
                    break;
                }
            }
        }
        let secs = t.elapsed().as_secs_f64();
        match (by, m.expected_survivor_until) {
            (Some(check), until) => {
                println!("mutant {}: killed by {check} in {secs:.1}s", m.name);
                if let Some(until) = until {
                    println!("  (listed as expected to survive until: {until}; remove the mark)");
                }
                killed += 1;
            }
            (None, Some(until)) => {
                println!(
                    "mutant {}: survived ({secs:.1}s; expected until {until}, not counted)",
                    m.name
                );
                println!("  breaks {}; planted in {}", m.breaks, m.planted);
                expected.push(m.name);
            }
            (None, None) => {
                println!("mutant {}: survived ({secs:.1}s)", m.name);
                println!("  breaks {}; planted in {}", m.breaks, m.planted);
                survived.push(m.name);
            }
        }
    }
    let n = chosen.len() - expected.len();
    println!("mutants: {n} killed={killed} survived={}", survived.len());
    eprintln!(
        "mutants: total {:.1}s; expected survivors not counted: {expected:?}",
        start.elapsed().as_secs_f64()
    );
    if survived.is_empty() {
        Ok(())
    } else {
        Err(format!("mutants survived: {survived:?}"))
    }
}
