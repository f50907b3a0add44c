//! `LeaseOps::store_requirements` (issue #34: one call from the chain to what a store must
//! be): the seal of the epoch a claim replaced, read through any transport; a generation
//! whose epoch is missing is `CHAIN_BROKEN`.

use lease_core::mem::MemTransport;
use lease_core::ops::{ClaimParams, ReleaseParams};
use lease_core::{Generation, Holder, Identity, LeaseOps, RunId, Seal, Timestamp, TimingPolicy};

fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

fn claim(owner: &str, now: Timestamp) -> ClaimParams {
    ClaimParams {
        run_id: RunId::new("req").unwrap(),
        owner_id: id(owner),
        holder: Holder {
            host: id("host"),
            boot_id: id("boot"),
            pid: 7,
            start_time: 1,
        },
        policy: TimingPolicy::default(),
        now,
        store_floor: None,
    }
}

#[test]
fn the_next_owner_is_required_the_seal_its_claim_replaced() {
    let t = Timestamp::parse("2026-12-06T12:00:00.000Z").unwrap();
    let m = MemTransport::new(RunId::new("req").unwrap());
    let first = m.claim(claim("a", t)).unwrap();
    let none = m.store_requirements(first.generation).unwrap();
    assert!(none.names_no_store(), "a first claim: no store named");
    let seal = Seal {
        store_id: id("store-1"),
        sequence: 9,
        generation: first.generation,
    };
    m.release(ReleaseParams {
        lease: first,
        now: t,
        seal: Some(seal.clone()),
    })
    .unwrap();
    let next = m.claim(claim("b", t)).unwrap();
    let req = m.store_requirements(next.generation).unwrap();
    assert_eq!(
        req.seal().map(|s| (&s.store_id, s.sequence)),
        Some((&seal.store_id, 9))
    );
    assert!(!req.names_no_store());
    let e = m
        .store_requirements(Generation::new(99).unwrap())
        .unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
}
