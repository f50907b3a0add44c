//! Heartbeats: freshness, the store head a beat reports becoming the next owner's floor,
//! and durable beats.

use crate::common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;

// PROTOCOL §7.2, §10
#[test]
fn heartbeat_keeps_the_owner_fresh() {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    heartbeat(&mut d, &l, 15_000, 1).unwrap();
    assert_eq!(
        claim(&mut d, "b", 2, 30_000).unwrap_err().code().as_str(),
        "RUN_ALREADY_ACTIVE"
    );
    assert_eq!(status(&mut d, 30_000).head.unwrap().heartbeat_count(), 1);
}

/// PROTOCOL §7.1, §7.2, §7.4, §7.5, §7.12: a crash leaves no seal, so the store head an
/// owner reports in its heartbeat becomes the floor of whoever replaces it (takeover or
/// retirement), is carried along the chain, and a store rewound below it is refused with
/// `STORE_BEHIND_SEAL` like one behind a seal.
// PROTOCOL §7.1, §7.2, §7.4, §7.5, §7.12
#[test]
fn the_store_head_in_the_last_heartbeat_becomes_the_floor_after_a_takeover_or_retirement() {
    use lease_core::seal::{StoreState, check_seal, requirements};
    fn epoch(d: &MemDisk, g: u64) -> EpochRecord {
        decode(&d.files[&FileRef::Epoch(Generation::new(g).unwrap())]).unwrap()
    }
    fn beat_with_head(d: &mut MemDisk, l: &OwnedLease, now: u64, n: u64, head: u64) {
        let mut hb = Heartbeat::new(l, t(now), n)
            .unwrap()
            .with_store_head(Some(head))
            .unwrap();
        d.run(&mut hb, &all_alive).unwrap();
    }
    let store = |head: u64| StoreState {
        store_id: "store-1".into(),
        head,
    };
    let mut d = MemDisk::new();

    // Owner a commits up to 42, reports it, then hangs: b takes it over once stale.
    let a = claim(&mut d, "a", 1, 0).unwrap();
    beat_with_head(&mut d, &a, 1_000, 1, 40);
    beat_with_head(&mut d, &a, 2_000, 2, 42);
    let b = takeover(&mut d, "b", 2, 30_000).unwrap();
    let (e1, e2) = (epoch(&d, 1), epoch(&d, 2));
    assert_eq!(
        e2.store_floor,
        Some(42),
        "the takeover records a's last head"
    );
    let (seal, floor) = requirements(&e2, Some(&e1));
    assert_eq!((seal, floor), (None, Some((42, b.generation))));
    let e = check_seal(&run_id(), seal, floor, &store(41)).unwrap_err();
    assert_eq!(e.code().as_str(), "STORE_BEHIND_SEAL");
    assert!(e.to_string().contains("floor"), "{e}");
    check_seal(&run_id(), seal, floor, &store(42)).unwrap();

    // b reports 50 and dies: the retirement records 50, the next claim inherits it.
    beat_with_head(&mut d, &b, 31_000, 1, 50);
    d.run(
        &mut Retire::new(RetireParams {
            run_id: run_id(),
            owner_id: id("retirer"),
            holder: holder(9),
            policy: TimingPolicy::default(),
            now: t(32_000),
            expect: None,
        }),
        &all_dead,
    )
    .unwrap();
    assert_eq!(epoch(&d, 3).store_floor, Some(50));
    let c = claim(&mut d, "c", 3, 33_000).unwrap();
    let (e3, e4) = (epoch(&d, 3), epoch(&d, 4));
    assert_eq!(e4.store_floor, Some(50));
    let (seal, floor) = requirements(&e4, Some(&e3));
    assert_eq!(
        check_seal(&run_id(), seal, floor, &store(49))
            .unwrap_err()
            .code()
            .as_str(),
        "STORE_BEHIND_SEAL"
    );

    // A clean release seals 60; the next owner must find the sealed store at 60 or more.
    beat_with_head(&mut d, &c, 34_000, 1, 55);
    d.run(
        &mut Release::new(ReleaseParams {
            lease: c.clone(),
            now: t(35_000),
            seal: Some(Seal {
                store_id: id("store-1"),
                sequence: 60,
                generation: c.generation,
            }),
        }),
        &all_alive,
    )
    .unwrap();
    claim(&mut d, "e", 5, 36_000).unwrap();
    let (e5, e6) = (epoch(&d, 5), epoch(&d, 6));
    assert_eq!(e6.store_floor, Some(60));
    let (seal, floor) = requirements(&e6, Some(&e5));
    assert_eq!(seal.map(|s| s.sequence), Some(60));
    check_seal(&run_id(), seal, floor, &store(60)).unwrap();
    assert_eq!(
        check_seal(&run_id(), seal, floor, &store(59))
            .unwrap_err()
            .code()
            .as_str(),
        "STORE_BEHIND_SEAL"
    );
}

// PROTOCOL §7.2 (issue #20): a beat asked to be durable is fsynced under a `local` policy;
// the record and the steps are those of any beat.
#[test]
fn a_durable_heartbeat_is_fsynced_whatever_the_policy() {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    assert_eq!(
        l.policy.heartbeat_durability(),
        HeartbeatDurability::Local,
        "the default policy's beats are not fsynced"
    );
    let first_write = |hb: &mut Heartbeat| match hb.next(None) {
        Step::Io(Request::WriteBeat {
            durability, record, ..
        }) => (durability, record),
        other => panic!("a heartbeat starts with WriteBeat, not {other:?}"),
    };
    let plain = Heartbeat::new(&l, t(1_000), 1)
        .unwrap()
        .with_store_head(Some(7))
        .unwrap();
    let (plain_d, plain_rec) = first_write(&mut plain.clone());
    let (durable_d, durable_rec) = first_write(&mut plain.durable());
    assert_eq!(plain_d, Durability::NoFsync);
    assert_eq!(durable_d, Durability::Fsync);
    assert_eq!(plain_rec, durable_rec, "only the fsync differs");
    // Driven to the end it is a beat like any other: the head is reported.
    let mut hb = Heartbeat::new(&l, t(1_000), 1)
        .unwrap()
        .with_store_head(Some(7))
        .unwrap()
        .durable();
    d.run(&mut hb, &all_alive).unwrap();
    assert_eq!(
        status(&mut d, 1_500).head.unwrap().beat.unwrap().store_head,
        Some(7)
    );
}
