//! The automatic compaction (lease-run's `compact`, issue #17) from the command line: every
//! way `runlease` hands a run back (`run`'s release, `release` with the token, `takeover`'s
//! takeover-then-release) compacts `lease/` once the chain has grown enough, with no
//! operator running `prune`.

mod common;

use common::*;
use lease_core::LeaseOps;
use lease_core::ops::ClaimParams;
use lease_core::{Holder, Identity, Timestamp, TimingPolicy};
use lease_fs::RunDir;
use lease_run::compact::{COMPACT_EVERY, COMPACT_KEEP};
use std::path::Path;

fn checkpoints(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("lease/checkpoints")).map_or(0, |d| d.count())
}

fn epochs(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("lease/epochs")).map_or(0, |d| d.count())
}

/// Claim as an owner on another host (so `release` does not look for an ancestor), at wall
/// time `at_ms` (in the past, for a takeover of a stale owner).
fn claim_elsewhere(dir: &Path, owner: &str, at_ms: u64) -> u64 {
    let run = RunDir::open(dir).unwrap();
    run.claim(ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: Identity::new(owner).unwrap(),
        holder: Holder {
            host: Identity::new("another-host").unwrap(),
            boot_id: Identity::new("another-boot").unwrap(),
            pid: 4242,
            start_time: 1,
        },
        // A short stale_after: `takeover` watches the record for it before it acts.
        policy: TimingPolicy::from_millis(100, 300, 1000, lease_core::HeartbeatDurability::Local)
            .unwrap(),
        now: Timestamp::from_unix_millis(at_ms).unwrap(),
        store_floor: None,
    })
    .unwrap()
    .generation
    .get()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn run_cycles_compact_with_no_operator() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    // Each `run` adds two generations; the release of generation EVERY + KEEP compacts.
    let cycles = (COMPACT_EVERY + COMPACT_KEEP) / 2;
    for i in 0..cycles {
        let o = runlease(&["run", d, "--", "true"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        assert_eq!(checkpoints(&dir), usize::from(i + 1 == cycles), "run {i}");
    }
    assert_eq!(epochs(&dir) as u64, COMPACT_KEEP);
    let o = runlease(&["verify", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v = json_lines(&o).remove(0);
    assert_eq!(v["floor"], 2 * cycles - COMPACT_KEEP + 1);
}

#[test]
fn release_with_the_token_compacts_when_due() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    assert_eq!(runlease(&["init", d]).status.code(), Some(0));
    let cycles = (COMPACT_EVERY + COMPACT_KEEP) / 2;
    for i in 0..cycles {
        let owner = format!("owner-{i}");
        let g = claim_elsewhere(&dir, &owner, now_ms());
        let o = runlease(&[
            "release",
            "--json",
            d,
            "--generation",
            &g.to_string(),
            "--owner",
            &owner,
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        assert_eq!(json_lines(&o)[0]["how"], "direct");
        assert_eq!(
            checkpoints(&dir),
            usize::from(i + 1 == cycles),
            "release {i}"
        );
    }
    assert_eq!(epochs(&dir) as u64, COMPACT_KEEP);
    assert_eq!(runlease(&["verify", d]).status.code(), Some(0));
}

#[test]
fn takeover_then_release_compacts_when_due() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    assert_eq!(runlease(&["init", d]).status.code(), Some(0));
    // Each round: a claim long ago (stale at once) and `takeover --yes`, which takes over
    // and releases: three generations. Due at the first release at or above EVERY + KEEP.
    let mut head = 0;
    let mut round = 0;
    while head < COMPACT_EVERY + COMPACT_KEEP {
        claim_elsewhere(&dir, &format!("stale-{round}"), now_ms() - 600_000);
        let o = runlease(&["takeover", "--json", d, "--yes"]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        head = json_lines(&o)[0]["released_as"].as_u64().unwrap();
        let due = head >= COMPACT_EVERY + COMPACT_KEEP;
        assert_eq!(
            checkpoints(&dir),
            usize::from(due),
            "round {round}, head {head}"
        );
        round += 1;
    }
    assert_eq!(epochs(&dir) as u64, COMPACT_KEEP);
    assert_eq!(runlease(&["verify", d]).status.code(), Some(0));
    // The files of the folded generations are gone: intents included.
    let intents = std::fs::read_dir(dir.join("lease/intents")).map_or(0, |d| d.count());
    assert!(intents <= 2, "{intents} intents left");
}

/// Owners that crash and are retired never release: the retirement compacts too, so a
/// crash loop (`run` killed, `retire`; `run --retire-dead` killed, ...) stays bounded.
#[test]
fn a_crash_loop_of_retired_owners_stays_bounded() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let lease_files = |dir: &Path| {
        ["epochs", "beats", "cutoffs", "intents", "checkpoints"]
            .iter()
            .map(|f| std::fs::read_dir(dir.join("lease").join(f)).map_or(0, |d| d.count()))
            .sum::<usize>()
    };
    let mut most = 0;
    for i in 0..30 {
        // The owner is SIGKILLed by its own command (its parent): a crash, no release.
        let how: &[&str] = if i % 2 == 0 { &[] } else { &["--retire-dead"] };
        let args: Vec<&str> = [&["run"][..], how, &[d, "--", "sh", "-c", "kill -9 $PPID"]].concat();
        let o = runlease(&args);
        assert_ne!(o.status.code(), Some(0), "{}", text(&o.stderr));
        if i % 2 == 0 {
            let o = runlease(&["retire", d]);
            assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        }
        most = most.max(lease_files(&dir));
    }
    assert!(checkpoints(&dir) >= 1, "never compacted");
    assert!(most < 100, "lease/ reached {most} files");
    let o = runlease(&["verify", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    println!("crash loop of 30 retired owners: lease/ peaked at {most} files");
}
