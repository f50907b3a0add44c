//! lease-fs on a real run folder: an owner process claims the run, appends 1,000 events
//! (beating whenever a beat is due) and crashes (exits without releasing). The next
//! process asks for the run with `OwnedRun::claim_or_retire_dead`: the crashed owner is
//! proved dead (this boot, its process gone, the kernel owner lock free) and retired,
//! holding the lock, and every one of its 1,000 acknowledged events still counts. A late
//! append under the dead owner's generation would not: its epoch is superseded.
//!
//! Run: `cargo run -p lease-fs --example claim_crash_retire`

use lease_core::ops::{Standing, Status};
use lease_core::{Identity, LeaseOps, Timestamp, TimingPolicy};
use lease_fs::{OwnedRun, RunDir, WallClock};
use std::path::Path;

const EVENTS: u64 = 1_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, role, path] = args.as_slice()
        && role == "crashing-owner"
    {
        // The child: claim with the lock, append, then die without a release.
        let mut run = OwnedRun::claim(
            Path::new(path),
            Identity::new("crashing-owner")?,
            TimingPolicy::default(),
            Timestamp::now()?,
        )?;
        let step = Identity::new("step")?;
        for n in 1..=EVENTS {
            if run.heartbeat_due() {
                run.heartbeat(Timestamp::now()?)?;
            }
            // Any `Serialize` payload; `append` checks the self-fence first.
            run.append(
                step.clone(),
                serde_json::json!({ "n": n }),
                Timestamp::now()?,
            )?;
        }
        println!(
            "child {}: generation {} appended {EVENTS} events, now crashing",
            std::process::id(),
            run.lease().generation
        );
        std::process::exit(3);
    }

    let tmp = tempfile::tempdir()?;
    let path = tmp.path().join("job");
    RunDir::create(&path)?;

    // 1. The owner process appends and crashes.
    let status = std::process::Command::new(std::env::current_exe()?)
        .arg("crashing-owner")
        .arg(&path)
        .status()?;
    assert_eq!(status.code(), Some(3));

    // 2. Another process looks: dead (its process is gone and nobody holds the lock).
    let view = RunDir::open(&path)?.status(Timestamp::now()?, true)?;
    println!("status after the crash: {:?}", view.status);
    assert_eq!(view.status, Status::Dead);

    // 3. Claim it, retiring the dead owner first (owner lock held throughout).
    let (mut run, retired) = OwnedRun::claim_or_retire_dead(
        &path,
        Identity::new("next-owner")?,
        Identity::new("next-owner-retirer")?,
        TimingPolicy::default(),
        Timestamp::now()?,
    )?;
    let retired = retired.ok_or("the dead owner was not retired")?;
    println!(
        "retired generation {retired}; claimed generation {}",
        run.lease().generation
    );

    // 4. Nothing acknowledged was lost: all 1,000 events count, in order, chained.
    let log = run.dir().read_events(None)?;
    let counted = log
        .events
        .iter()
        .filter(|e| e.standing == Standing::Authoritative)
        .count();
    println!("{counted} events count after the replacement");
    assert_eq!(counted as u64, EVENTS);
    run.dir().verify()?;

    // 5. The new owner appends after them and releases.
    let a = run.append(
        Identity::new("resumed")?,
        "after the crash",
        Timestamp::now()?,
    )?;
    assert_eq!(a.sequence.get(), EVENTS + 1);
    let released = run.release(Timestamp::now()?, None)?;
    println!("released as generation {released}");
    Ok(())
}
