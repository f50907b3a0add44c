//! One resolution of the run folder (issue #28): `RUN_DIR` is opened once (a symlink as
//! its last component refused) and everything after goes through that descriptor, so a
//! folder swapped for a symlink while `run`, `retire` and `takeover` work never moves the
//! run elsewhere.
//!
//! The swap-loop test: a thread exchanges the run folder and a symlink to another run of
//! the same name (`renameat2(RENAME_EXCHANGE)`: atomic, so the name is always either the
//! folder or the symlink) in a tight loop while workers call the real `runlease` binary.
//! Every call must have worked on the real folder or been refused with a typed code, and
//! the decoy's whole tree (and its parent's) must be byte-identical before and after.
//! `RUNLEASE_SWAP_CALLS` sets the number of calls (default 1,000: about 15 s in debug on
//! two cores); CI may run a bounded sample with a smaller figure.

mod common;

use common::*;
use rustix::fs::{CWD, RenameFlags, renameat_with};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `runlease: CODE: …`: the typed code of a refusal's stderr line, if any.
fn typed_code(stderr: &str) -> Option<String> {
    stderr.lines().find_map(|l| {
        let rest = l.strip_prefix("runlease: ")?;
        let (code, _) = rest.split_once(": ")?;
        (!code.is_empty() && code.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            .then(|| code.to_string())
    })
}

/// Swap the run folder and the symlink (one atomic exchange of the two names).
fn exchange(a: &Path, b: &Path) {
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).expect("renameat2(RENAME_EXCHANGE)");
}

/// What one call did.
#[derive(Debug, Default)]
struct Tally {
    worked: BTreeMap<&'static str, u64>,
    refused: BTreeMap<String, u64>,
    /// `run` calls whose owner the command killed on purpose (a dead owner to retire).
    killed: u64,
    /// Generations `run` reported owning (each must be unique: two owners of one
    /// generation would mean one landed in another chain).
    generations: Vec<u64>,
    untyped: Vec<String>,
}

#[test]
fn a_run_folder_swapped_for_a_symlink_in_a_tight_loop_never_moves_a_call_elsewhere() {
    let calls: usize = std::env::var("RUNLEASE_SWAP_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path();
    let run = base.join("job");
    let link = base.join("job.link");
    let other = base.join("other");
    let decoy = other.join("job");
    // The decoy is a real run of the same name (so the run-id check alone would not tell
    // them apart): anything that followed the symlink would find a run to work on.
    for d in [&run, &decoy] {
        let o = runlease(&["run", d.to_str().unwrap(), "--", "true"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    }
    std::os::unix::fs::symlink(&decoy, &link).unwrap();
    let decoy_before = tree(&other);
    let top_before: BTreeSet<_> = std::fs::read_dir(base)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps, run, link) = (stop.clone(), swaps.clone(), run.clone(), link.clone());
        std::thread::spawn(move || {
            let mut swapped = false;
            while !stop.load(Ordering::Relaxed) {
                exchange(&run, &link);
                swapped = !swapped;
                swaps.fetch_add(1, Ordering::Relaxed);
                // The symlink stays briefly; the folder a little longer, so calls also
                // get through (a call that meets the symlink is refused, one that meets
                // the folder works on it).
                if swapped {
                    std::thread::sleep(Duration::from_micros(200));
                } else {
                    std::thread::sleep(Duration::from_micros(800));
                }
            }
            if swapped {
                exchange(&run, &link);
            }
        })
    };

    let next = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let began = Instant::now();
    let workers: Vec<_> = (0..3)
        .map(|_| {
            let (next, tally, run) = (next.clone(), tally.clone(), run.clone());
            std::thread::spawn(move || {
                let d = run.to_str().unwrap();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= calls {
                        break;
                    }
                    let (what, args): (&'static str, Vec<&str>) = match i % 10 {
                        // An owner that dies at once (its command kills it): a dead owner
                        // for the retirements to replace.
                        0 => (
                            "run (owner killed)",
                            vec!["run", "--json", d, "--", "sh", "-c", "kill -9 $PPID"],
                        ),
                        1 | 4 | 7 => ("run", vec!["run", "--json", d, "--", "true"]),
                        2 => (
                            "run --retire-dead",
                            vec!["run", "--json", "--retire-dead", d, "--", "true"],
                        ),
                        3 | 6 | 9 => ("retire", vec!["retire", d]),
                        _ => ("takeover", vec!["takeover", d, "--yes"]),
                    };
                    let o = runlease(&args);
                    let mut t = tally.lock().unwrap();
                    if args[0] == "run" {
                        for j in json_lines(&o) {
                            if j["event"] == "owned" {
                                t.generations.push(j["generation"].as_u64().unwrap());
                            }
                        }
                    }
                    match o.status.code() {
                        Some(0) => *t.worked.entry(what).or_default() += 1,
                        None if what == "run (owner killed)" => t.killed += 1,
                        code => {
                            let err = text(&o.stderr);
                            match typed_code(&err) {
                                Some(c) => *t.refused.entry(c).or_default() += 1,
                                None => t.untyped.push(format!("{args:?}: {code:?}: {err}")),
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let elapsed = began.elapsed();
    let t = tally.lock().unwrap();

    // The decoy (a run of the same name) and its parent: not a byte changed, no file
    // added (no lock file, no temp file, no record).
    let decoy_after = tree(&other);
    let landed_elsewhere = decoy_before
        .iter()
        .filter(|(k, v)| decoy_after.get(*k) != Some(*v))
        .count()
        + decoy_after
            .keys()
            .filter(|k| !decoy_before.contains_key(*k))
            .count();
    let top_after: BTreeSet<_> = std::fs::read_dir(base)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut gens = t.generations.clone();
    gens.sort_unstable();
    let unique = gens.windows(2).all(|w| w[0] != w[1]);
    let worked: u64 = t.worked.values().sum();
    let refused: u64 = t.refused.values().sum();
    println!(
        "swap-loop: calls={calls} swaps={} worked={worked} {:?} refused={refused} {:?} owners-killed={} claims={} landed-elsewhere={landed_elsewhere} untyped={} in {:.1}s",
        swaps.load(Ordering::Relaxed),
        t.worked,
        t.refused,
        t.killed,
        gens.len(),
        t.untyped.len(),
        elapsed.as_secs_f64()
    );
    assert_eq!(landed_elsewhere, 0, "the decoy changed");
    assert_eq!(decoy_before, decoy_after);
    assert_eq!(
        top_before, top_after,
        "a name appeared or vanished beside the run"
    );
    assert!(
        t.untyped.is_empty(),
        "calls neither worked nor were typed refusals: {:#?}",
        t.untyped
    );
    assert_eq!(worked + refused + t.killed, calls as u64);
    assert!(unique, "two claims reported the same generation: {gens:?}");
    assert!(
        swaps.load(Ordering::Relaxed) > calls as u64,
        "the swap loop barely ran"
    );
    assert!(worked > 0, "no call got through: the test proves nothing");
    // Every claim landed in the real run: its chain reaches at least the highest one, and
    // the whole run verifies.
    let head = status_json(&run)["generation"].as_u64().unwrap_or(0);
    assert!(
        gens.last().is_none_or(|g| *g <= head),
        "head {head} < {gens:?}"
    );
    let v = runlease(&["verify", run.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(0), "{}", text(&v.stderr));
}

/// A `RUN_DIR` that is a symlink (to a run of the same name) is refused by `run`,
/// `retire`, `takeover`, `status` and `doctor` with one and the same code, and nothing
/// changes on either side.
#[test]
fn a_symlinked_run_dir_gets_one_code_from_run_retire_takeover_status_and_doctor() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("other").join("job");
    let o = runlease(&["run", target.to_str().unwrap(), "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let link: PathBuf = tmp.path().join("job");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let before = tree(tmp.path());
    let l = link.to_str().unwrap();
    let mut seen = BTreeSet::new();
    for args in [
        vec!["run", l, "--", "true"],
        vec!["run", "--init", l, "--", "true"],
        vec!["retire", l],
        vec!["takeover", l, "--yes"],
        vec!["status", l],
        vec!["doctor", l],
    ] {
        let o = runlease(&args);
        let err = text(&o.stderr);
        let code = typed_code(&err);
        assert!(code.is_some(), "{args:?}: {err}");
        assert!(err.contains("symlink"), "{args:?}: {err}");
        seen.insert((o.status.code(), code));
    }
    assert_eq!(
        seen.into_iter().collect::<Vec<_>>(),
        vec![(Some(65), Some("RUN_LAYOUT_INVALID".to_string()))]
    );
    assert_eq!(before, tree(tmp.path()));
}
