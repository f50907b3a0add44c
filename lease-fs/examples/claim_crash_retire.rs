//! lease-fs on a real run folder: an owner process claims the run and crashes (exits
//! without releasing); the next process finds it dead (this boot, its pid gone, the
//! kernel owner lock free), retires it, and claims with the lock held (`OwnedRun`).
//!
//! Run: `cargo run -p lease-fs --example claim_crash_retire`

use lease_core::ops::{Expectation, RetireParams, Status};
use lease_core::{Identity, LeaseOps, Timestamp, TimingPolicy};
use lease_fs::{OwnedRun, RunDir, WallClock, this_holder};
use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, role, path] = args.as_slice() {
        if role == "crashing-owner" {
            // The child: claim with the lock, beat once, then die without a release.
            let mut run = OwnedRun::claim(
                Path::new(path),
                Identity::new("crashing-owner")?,
                TimingPolicy::default(),
                Timestamp::now()?,
            )?;
            run.heartbeat(Timestamp::now()?)?;
            println!(
                "child {}: claimed generation {}, now crashing",
                std::process::id(),
                run.lease().generation
            );
            std::process::exit(3);
        }
    }

    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("job");
    RunDir::create(&path)?;

    // 1. The owner process claims and crashes.
    let status = std::process::Command::new(std::env::current_exe()?)
        .arg("crashing-owner")
        .arg(&path)
        .status()?;
    assert_eq!(status.code(), Some(3));

    // 2. Another process looks: dead (its process is gone and nobody holds the lock).
    let dir = RunDir::open(&path)?;
    let view = dir.status(Timestamp::now()?, true)?;
    println!("status after the crash: {:?}", view.status);
    assert_eq!(view.status, Status::Dead);

    // A plain claim says what to do.
    let refused = OwnedRun::claim(
        &path,
        Identity::new("next")?,
        TimingPolicy::default(),
        Timestamp::now()?,
    )
    .expect_err("the dead owner must be retired first");
    println!("claim refused: {refused}");
    assert_eq!(refused.code().as_str(), "RUN_DEAD_REQUIRES_RETIREMENT");

    // 3. Retire it, conditioned on exactly what was observed.
    let head = view.head.expect("a head");
    let retired = dir.retire(RetireParams {
        run_id: dir.run_id().clone(),
        owner_id: Identity::new("retirer")?,
        holder: this_holder()?,
        policy: TimingPolicy::default(),
        now: Timestamp::now()?,
        expect: Some(Expectation::of(&head)),
    })?;
    println!("retired generation {}", retired.retired);

    // 4. Claim, with the owner lock, and release.
    let mut run = OwnedRun::claim(
        &path,
        Identity::new("next")?,
        TimingPolicy::default(),
        Timestamp::now()?,
    )?;
    run.heartbeat(Timestamp::now()?)?;
    println!("claimed generation {}", run.lease().generation);
    let released = run.release(Timestamp::now()?, None)?;
    println!("released as generation {released}");
    Ok(())
}
