//! A run that changes owner 10,000 times stays small when pruned regularly, and every
//! judgment and both hash chains survive the compaction.

use lease_core::LeaseOps;
use lease_core::ops::{AuthorityLease, LivenessEvidence, LockEvidence, ProcessState};
use lease_core::*;
use lease_fs::{Liveness, RunDir, SimFs};
use std::path::Path;
use std::sync::Arc;

struct Alive;
impl Liveness for Alive {
    fn probe(&self, h: &Holder) -> LivenessEvidence {
        LivenessEvidence {
            observer_boot_id: h.boot_id.clone(),
            process: ProcessState::Running {
                start_time: h.start_time,
            },
            owner_lock: LockEvidence::Held,
            lease: AuthorityLease::NotKept,
        }
    }
}

fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_796_169_600_000 + ms).unwrap()
}

#[test]
fn ten_thousand_owner_changes_stay_small_with_regular_prunes() {
    let sim = SimFs::new();
    let run = RunDir::with_fs(
        Arc::new(sim.clone()),
        RunId::new("churn").unwrap(),
        Path::new("sim"),
        Arc::new(Alive),
    );
    let holder = Holder {
        host: Identity::new("h").unwrap(),
        boot_id: Identity::new("b").unwrap(),
        pid: 1,
        start_time: 1,
    };
    let owners = 5_000u64; // each claims and releases: 10,000 changes of owner
    let mut counted = 0u64;
    let mut max_lease_files = 0usize;
    for i in 0..owners {
        let l = run
            .claim(lease_core::ops::ClaimParams {
                run_id: run.run_id().clone(),
                owner_id: Identity::new(format!("o{i}")).unwrap(),
                holder: holder.clone(),
                policy: TimingPolicy::default(),
                now: t(i * 10),
                store_floor: None,
            })
            .unwrap();
        if i % 100 == 0 {
            run.append(
                &l,
                lease_core::ops::AppendParams {
                    event_type: Identity::new("e").unwrap(),
                    payload: serde_json::json!(i),
                    now: t(i * 10 + 1),
                    tail_hint: None,
                },
            )
            .unwrap();
            counted += 1;
        }
        run.release(lease_core::ops::ReleaseParams {
            lease: l.clone(),
            now: t(i * 10 + 2),
            seal: None,
        })
        .unwrap();
        if i % 32 == 31 {
            let before = sim
                .snapshot_live()
                .keys()
                .filter(|k| k.starts_with("lease/"))
                .count();
            max_lease_files = max_lease_files.max(before);
            run.prune(lease_core::ops::PruneParams {
                run_id: run.run_id().clone(),
                keep: 8,
                by: Identity::new("pruner").unwrap(),
                now: t(i * 10 + 3),
            })
            .unwrap();
            let lease_files = sim
                .snapshot_live()
                .keys()
                .filter(|k| k.starts_with("lease/"))
                .count();
            max_lease_files = max_lease_files.max(lease_files);
        }
    }
    let head = run.status(t(owners * 10), false).unwrap().head.unwrap();
    assert_eq!(head.generation().get(), owners * 2);
    // Bounded: the newest `keep` epochs plus what accumulates between two prunes.
    assert!(max_lease_files < 200, "{max_lease_files} lease files");
    let view = run.read_events(None).unwrap();
    assert_eq!(
        view.events.iter().filter(|e| e.standing.counts()).count() as u64,
        counted
    );
    let v = run.verify().unwrap();
    assert!(v.floor.is_some());
    println!(
        "owner changes: {}, max lease files: {max_lease_files}, events: {}",
        owners * 2,
        v.events
    );
}
