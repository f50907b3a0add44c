//! Retirement: a dead owner retired at once, a live one never.

use crate::common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;

// PROTOCOL §7.5, §11
#[test]
fn dead_owner_is_retired_at_once_and_the_run_can_be_claimed() {
    let mut d = MemDisk::new();
    let old = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &old, 5, 1).unwrap();
    let r = d
        .run(
            &mut Retire::new(RetireParams {
                run_id: run_id(),
                owner_id: id("retirer"),
                holder: holder(9),
                policy: TimingPolicy::default(),
                now: t(100),
                expect: None,
            }),
            &all_dead,
        )
        .unwrap();
    assert_eq!((r.retired.get(), r.generation.get(), r.cutoff), (1, 2, 1));
    assert_eq!(status(&mut d, 100).status, Status::Free);
    assert_eq!(claim(&mut d, "b", 2, 200).unwrap().generation.get(), 3);
}

// PROTOCOL §7.5 step 2, §11
#[test]
fn a_live_owner_is_never_retired() {
    type Probe = fn(&Holder) -> LivenessEvidence;
    let cases: Vec<(&str, Probe)> = vec![
        ("alive with its start time", all_alive),
        ("pid reused but lock held", |h| LivenessEvidence {
            observer_boot_id: id(BOOT),
            process: ProcessState::Running {
                start_time: h.start_time + 1,
            },
            owner_lock: LockEvidence::Held,
            lease: AuthorityLease::NotKept,
        }),
        ("pid gone in our namespace but lock held", |_| {
            LivenessEvidence {
                observer_boot_id: id(BOOT),
                process: ProcessState::Gone,
                owner_lock: LockEvidence::Held,
                lease: AuthorityLease::NotKept,
            }
        }),
        ("another boot", |_| LivenessEvidence {
            observer_boot_id: id("boot-b"),
            process: ProcessState::Gone,
            owner_lock: LockEvidence::Free,
            lease: AuthorityLease::NotKept,
        }),
        ("lock unknown", |_| LivenessEvidence {
            observer_boot_id: id(BOOT),
            process: ProcessState::Gone,
            owner_lock: LockEvidence::Unknown,
            lease: AuthorityLease::NotKept,
        }),
        // An authority that keeps leases (etcd) decides alone: its live lease outweighs
        // kernel evidence that would prove death.
        ("its lease in the authority alive", |_| LivenessEvidence {
            observer_boot_id: id(BOOT),
            process: ProcessState::Gone,
            owner_lock: LockEvidence::Free,
            lease: AuthorityLease::Alive,
        }),
    ];
    for (name, live) in cases {
        let mut d = MemDisk::new();
        claim(&mut d, "a", 1, 0).unwrap();
        let e = d
            .run(
                &mut Retire::new(RetireParams {
                    run_id: run_id(),
                    owner_id: id("retirer"),
                    holder: holder(9),
                    policy: TimingPolicy::default(),
                    now: t(100),
                    expect: None,
                }),
                &live,
            )
            .unwrap_err();
        assert_eq!(e.code().as_str(), "RETIRE_REFUSED_NOT_DEAD", "{name}");
        assert_eq!(status(&mut d, 100).status, Status::Active, "{name}");
    }
}
