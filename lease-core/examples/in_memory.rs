//! lease-core alone, on an in-memory disk (`MemTransport`): no file system, no clock, no
//! processes. An owner claims, heartbeats and appends; it dies; a retirer frees the run;
//! a new owner claims; the dead owner's late append is fenced and the log says what counts.
//!
//! Run: `cargo run -p lease-core --example in_memory`

use lease_core::mem::MemTransport;
use lease_core::ops::{
    AppendParams, ClaimParams, Expectation, ReleaseParams, RetireParams, Status,
};
use lease_core::{Holder, Identity, LeaseOps, RunId, Timestamp, TimingPolicy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let run = RunId::new("job")?;
    // Every holder this transport is asked about is reported gone (a crashed owner).
    let disk = MemTransport::new(run.clone());
    let at = |ms: u64| Timestamp::from_unix_millis(1_800_000_000_000 + ms).expect("in range");
    let holder = |pid: u32| Holder {
        host: Identity::new("host-a").expect("identity"),
        boot_id: Identity::new("boot-1").expect("identity"),
        pid,
        start_time: 1,
    };

    // 1. Owner A claims, beats once, appends an event.
    let a = disk.claim(ClaimParams {
        run_id: run.clone(),
        owner_id: Identity::new("owner-a")?,
        holder: holder(100),
        policy: TimingPolicy::default(),
        now: at(0),
        store_floor: None,
    })?;
    disk.heartbeat(&a, at(1_000), 1, None)?;
    let first = disk.append(
        &a,
        AppendParams {
            event_type: Identity::new("step.done")?,
            payload: serde_json::json!({ "step": 1 }),
            now: at(1_500),
            tail_hint: None,
        },
    )?;
    println!(
        "owner A holds generation {}, appended event {}",
        a.generation, first.sequence
    );

    // 2. A dies. An observer sees it dead and retires it, conditioned on exactly what it saw.
    let view = disk.status(at(30_000), true)?;
    assert_eq!(view.status, Status::Dead);
    let head = view.head.expect("a head");
    let retired = disk.retire(RetireParams {
        run_id: run.clone(),
        owner_id: Identity::new("operator")?,
        holder: holder(200),
        policy: TimingPolicy::default(),
        now: at(30_000),
        expect: Some(Expectation::of(&head)),
    })?;
    println!("retired generation {} (the run is free)", retired.retired);

    // 3. Owner B claims the next generation.
    let b = disk.claim(ClaimParams {
        run_id: run.clone(),
        owner_id: Identity::new("owner-b")?,
        holder: holder(300),
        policy: TimingPolicy::default(),
        now: at(31_000),
        store_floor: None,
    })?;
    println!("owner B holds generation {}", b.generation);

    // 4. A comes back (it was only paused) and tries to append: fenced, nothing counts.
    let late = disk
        .append(
            &a,
            AppendParams {
                event_type: Identity::new("step.done")?,
                payload: serde_json::json!({ "step": 2 }),
                now: at(32_000),
                tail_hint: None,
            },
        )
        .expect_err("a replaced owner's append is fenced");
    assert!(late.code().as_str() == "FENCED", "{late}");
    println!("A's late append: {late}");

    // 5. The log: A's first event counts (it was appended while A held the run).
    let log = disk.read_events(None)?;
    for e in &log.events {
        println!(
            "event {} by generation {}: {:?}",
            e.event.sequence, e.event.generation, e.standing
        );
    }
    assert_eq!(log.events.len(), 1);
    disk.release(ReleaseParams {
        lease: b,
        now: at(33_000),
        seal: None,
    })?;
    println!("B released the run");
    Ok(())
}
