//! Skew-immune staleness (issue #17, PROTOCOL §7.4 JUDGE, §10): an owner whose wall clock
//! runs 60 s slow or fast, made with libfaketime (Debian's package `faketime`, preloaded; `.ci/run`
//! installs it, and `RUNLEASE_REQUIRE_FAKETIME=1` there makes its absence a failure). The
//! owner's monotonic clocks are left alone (`FAKETIME_DONT_FAKE_MONOTONIC`): only its wall
//! clock is wrong, as on a host whose time synchronization failed.
//!
//! Each case runs twice: with the owner on the observers' own `CLOCK_BOOTTIME` (same boot,
//! same time namespace: its beats are aged on that clock, the same-clock rule) and with the
//! owner on another clock, as on another host: started by `unshare --time --boottime`, a
//! time namespace of its own whose `CLOCK_BOOTTIME` runs 100,000 s ahead (then the wall
//! clock advises and the takeover watches). The second needs the right to create a time
//! namespace (root, Linux ≥ 5.6); `RUNLEASE_REQUIRE_TIMENS=1` (set by `.ci/run`) makes its
//! absence a failure, otherwise those cases are skipped with a line on stderr.

mod common;

use common::*;
use rustix::process::Signal;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// libfaketime's preload library if installed (else the test is skipped, unless CI
/// requires it). Preloaded directly, not through the `faketime` wrapper, so the pid we
/// signal is `runlease` itself.
fn libfaketime() -> Option<std::path::PathBuf> {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|d| d.path().join("faketime/libfaketime.so.1"))
        .chain([std::path::PathBuf::from(
            "/usr/lib/faketime/libfaketime.so.1",
        )])
        .find(|p| p.is_file());
    if found.is_none() && std::env::var_os("RUNLEASE_REQUIRE_FAKETIME").is_some() {
        panic!("libfaketime is required here (RUNLEASE_REQUIRE_FAKETIME) but not installed");
    }
    found
}

/// Whether this process may start a program in a time namespace of its own
/// (`unshare --time`); panics where `RUNLEASE_REQUIRE_TIMENS` says it must.
fn time_namespaces() -> bool {
    let ok = std::process::Command::new("unshare")
        .args(["--time", "--boottime", "100000", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("RUNLEASE_REQUIRE_TIMENS").is_none(),
            "unshare --time is required here (RUNLEASE_REQUIRE_TIMENS) but failed"
        );
        eprintln!("skew: skipped the other-clock case (unshare --time is not permitted here)");
    }
    ok
}

/// Which clock the owner's `CLOCK_BOOTTIME` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnerClock {
    /// The observers' own: same boot, same time namespace.
    Same,
    /// Another: a time namespace of its own, 100,000 s ahead (like another host's).
    Other,
}

/// `runlease run DIR FAST -- sleep 60` with the owner's wall clock shifted by `offset`
/// (libfaketime syntax, e.g. `-60s`); its monotonic clocks are left alone, and with
/// [`OwnerClock::Other`] its `CLOCK_BOOTTIME` is another clock (`unshare` execs, so the
/// child's pid is `runlease`'s).
fn skewed_owner(
    lib: &std::path::Path,
    dir: &std::path::Path,
    offset: &str,
    clock: OwnerClock,
) -> Child {
    let d = dir.to_str().unwrap();
    let args: Vec<&str> = [&["run", d][..], &FAST, &["--", "sleep", "60"]].concat();
    let wrapper: &[&str] = match clock {
        OwnerClock::Same => &[],
        OwnerClock::Other => &["unshare", "--time", "--boottime", "100000"],
    };
    let mut c = cmd_under(wrapper, &args);
    c.env("LD_PRELOAD", lib)
        .env("FAKETIME", offset)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn runlease under libfaketime")
}

/// Wait until the run's owner is active with a beat aged on this host's own clock
/// (stamped on it); returns that `status --json`.
fn wait_for_stamped_beat(dir: &std::path::Path) -> serde_json::Value {
    let mut s = wait_for_state(dir, "active", Duration::from_secs(10));
    let t = Instant::now();
    while s["heartbeat_age_clock"] != "monotonic" {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "never aged on this clock: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
        s = status_json(dir);
    }
    s
}

/// `status --json`'s `next_step_argv`, which must be there.
fn next_argv(s: &serde_json::Value) -> Vec<String> {
    s["next_step_argv"]
        .as_array()
        .unwrap_or_else(|| panic!("no step: {s}"))
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

/// The names of the files under `lease/` (epochs, intents, cutoffs), beats left out (the
/// live owner replaces its own).
fn lease_files(dir: &std::path::Path) -> Vec<String> {
    tree(&dir.join("lease"))
        .into_keys()
        .filter(|k| !k.starts_with("beats/"))
        .collect()
}

/// An owner whose wall clock runs 60 s slow, beating every 100 ms, is never taken over.
/// On another clock `status` (wall clock, advice only) calls it stale and the advised
/// takeover watches, sees the record change and refuses; on the observers' own clock its
/// beats are aged on that clock, so `status` calls it active and advises waiting.
fn slow_owner(clock: OwnerClock) {
    let Some(lib) = libfaketime() else { return };
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut owner = skewed_owner(&lib, &dir, "-60s", clock);
    if clock == OwnerClock::Same {
        // Its first beat follows the claim at once; until it lands the age is the claim's
        // wall age (a minute), judged "stale" by the wall clock. Wait for a stamped beat.
        let s = wait_for_stamped_beat(&dir);
        assert_eq!(s["state"], "active", "{s}");
        assert!(s["heartbeat_age_ms"].as_i64().unwrap() < 1000, "{s}");
        assert!(
            s["next_step_argv"].is_null(),
            "waiting needs no command: {s}"
        );
        // Its beats stay fresh on this clock: 2 s of reads, never stale.
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(2) {
            let s = status_json(&dir);
            assert_eq!(s["state"], "active", "{s}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let s = if clock == OwnerClock::Other {
        // Its beats are dated a minute ago: `status` calls it stale.
        let s = wait_for_state(&dir, "stale", Duration::from_secs(10));
        assert_eq!(s["heartbeat_age_clock"], "wall", "{s}");
        s
    } else {
        status_json(&dir)
    };
    let before = lease_files(&dir);
    // A takeover (the advised one on another clock; asked for with --yes on this one)
    // watches the record on this host's clock, sees it change (the owner beats every
    // 100 ms), and refuses: 76, nothing written.
    let argv = if clock == OwnerClock::Other {
        next_argv(&s)
    } else {
        vec![
            "runlease".into(),
            "takeover".into(),
            "--yes".into(),
            d.into(),
        ]
    };
    assert_eq!(argv[1], "takeover", "{s}");
    let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
    let t = Instant::now();
    let o = runlease(&args);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("alive"), "{}", text(&o.stderr));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // `run --takeover-stale` without --wait refuses too (held, 76): the owner's kernel lock
    // on this host answers first.
    let o = runlease(&["run", "--takeover-stale", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert_eq!(lease_files(&dir), before, "a refusal wrote nothing");
    assert!(owner.try_wait().unwrap().is_none(), "the owner runs on");
    signal(owner.id(), Signal::TERM);
    let _ = wait_exit(&mut owner, Duration::from_secs(10));
}

#[test]
fn an_owner_whose_clock_runs_slow_is_not_taken_over_while_it_beats() {
    slow_owner(OwnerClock::Same);
}

#[test]
fn an_owner_on_another_clock_whose_wall_clock_runs_slow_is_not_taken_over_while_it_beats() {
    if time_namespaces() {
        slow_owner(OwnerClock::Other);
    }
}

/// An owner whose wall clock runs 60 s fast is stopped (SIGSTOP). On another clock its
/// beats, dated in the future, say nothing to the wall clock: `status` says active, advises
/// the exact takeover, and that takeover watches for the owner's `stale_after` (1 s) before
/// it succeeds. On the observers' own clock the stopped owner's last beat ages on that
/// clock: `status` calls it stale once it is older than 1 s, and the takeover succeeds at
/// once, without watching.
fn fast_owner(clock: OwnerClock) {
    let Some(lib) = libfaketime() else { return };
    let (_tmp, dir) = scratch();
    let mut owner = skewed_owner(&lib, &dir, "+60s", clock);
    // Its beats are dated a minute ahead: `status` says active.
    let s = wait_for_state(&dir, "active", Duration::from_secs(10));
    assert!(s["heartbeat_at"].is_string(), "{s}");
    // Let it beat once at least (a stamped beat on the same clock).
    std::thread::sleep(Duration::from_millis(300));
    signal(owner.id(), Signal::STOP);
    // (A beat already under way when it stopped lands first; then the record is frozen.)
    std::thread::sleep(Duration::from_millis(300));
    let s = if clock == OwnerClock::Other {
        // `status` cannot judge a beat dated in the future by the wall clock: its next step
        // is the exact takeover, which watches for the owner's stale_after (1 s here) on
        // this host's clock, whatever the heartbeat's date says.
        let s = status_json(&dir);
        assert_eq!(s["state"], "active", "{s}");
        assert_eq!(s["heartbeat_age_clock"], "wall", "{s}");
        s
    } else {
        // Aged on this host's clock, whatever its date: stale once older than 1 s.
        let s = wait_for_state(&dir, "stale", Duration::from_secs(5));
        assert_eq!(s["heartbeat_age_clock"], "monotonic", "{s}");
        assert!(s["heartbeat_age_ms"].as_i64().unwrap() > 1000, "{s}");
        s
    };
    let argv = next_argv(&s);
    assert_eq!(argv[1], "takeover", "{s}");
    let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
    let t = Instant::now();
    let o = runlease(&args);
    let took = t.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    if clock == OwnerClock::Other {
        assert!(
            text(&o.stderr).contains("watching generation 1"),
            "{}",
            text(&o.stderr)
        );
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(6),
            "{took:?}"
        );
    } else {
        // No watch: the beat was already older than stale_after on this clock.
        assert!(
            text(&o.stderr).contains("on this host's clock (same boot)"),
            "{}",
            text(&o.stderr)
        );
        assert!(took < Duration::from_millis(900), "{took:?}");
    }
    assert_eq!(status_json(&dir)["state"], "free");
    signal(owner.id(), Signal::CONT);
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(10)).code(),
        Some(75)
    );
}

#[test]
fn an_owner_whose_clock_runs_fast_is_taken_over_at_once_once_stale_on_this_clock() {
    fast_owner(OwnerClock::Same);
}

#[test]
fn an_owner_on_another_clock_whose_clock_runs_fast_is_taken_over_stale_after_after_it_stopped() {
    if time_namespaces() {
        fast_owner(OwnerClock::Other);
    }
}

/// A beat whose monotonic stamp names this host's clock but is ahead of it cannot have been
/// written by any process on that clock (it was edited): it is ignored, never waited for
/// (the wall clock advises, the takeover watches the owner's stale_after from now), and
/// `doctor` reports it (`HEARTBEAT_STAMP_AHEAD`, a warning: exit 0).
#[test]
fn a_stamp_ahead_of_this_clock_is_reported_and_ignored() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let mut owner = spawn(&[&["run", d][..], &FAST, &["--", "sleep", "60"]].concat());
    let s = wait_for_stamped_beat(&dir);
    signal(owner.id(), Signal::STOP);
    std::thread::sleep(Duration::from_millis(300));
    let g = s["generation"].as_u64().unwrap();
    let beat = dir.join(format!("lease/beats/{g:020}.json"));
    let file = std::fs::read(&beat).unwrap();
    let mut rec: serde_json::Value =
        serde_json::from_slice(lease_core::beat::newest_record(&file).unwrap()).unwrap();
    let ns = rec["mono"]["ns"].as_u64().unwrap();
    // An hour ahead of this clock.
    rec["mono"]["ns"] = serde_json::json!(ns + 3_600_000_000_000);
    let mut bytes = serde_json::to_vec(&rec).unwrap();
    bytes.push(b'\n');
    std::fs::write(&beat, lease_core::beat::fresh_file(1, &bytes).unwrap()).unwrap();
    let s = status_json(&dir);
    assert_eq!(s["heartbeat_age_clock"], "wall", "{s}");
    let o = runlease(&["doctor", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stdout));
    let found = json_lines(&o)
        .into_iter()
        .find(|f| f["code"] == "HEARTBEAT_STAMP_AHEAD")
        .unwrap_or_else(|| panic!("{}", text(&o.stdout)));
    assert_eq!(found["severity"], "warning", "{found}");
    assert!(
        found["detail"].as_str().unwrap().contains("was edited"),
        "{found}"
    );
    // Never waited for: the takeover watches the owner's stale_after (1 s) from now.
    let t = Instant::now();
    let o = runlease(&["takeover", "--yes", d]);
    let took = t.elapsed();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(6),
        "{took:?}"
    );
    signal(owner.id(), Signal::CONT);
    assert_eq!(
        wait_exit(&mut owner, Duration::from_secs(10)).code(),
        Some(75)
    );
}
