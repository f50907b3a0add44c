//! Claim and release: the first and next generations, a fresh owner refused, generation
//! overflow, and the core's error-code table.

use crate::common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;

// PROTOCOL §7.1, §7.8
#[test]
fn claim_on_an_empty_run_creates_generation_one() {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    assert_eq!(l.generation.get(), 1);
    let s = status(&mut d, 10);
    assert_eq!(s.status, Status::Active);
    assert_eq!(s.head.unwrap().epoch.owner_id.as_str(), "a");
}

// PROTOCOL §7.1 step 3, §10
#[test]
fn claim_is_refused_while_the_owner_is_fresh_and_needs_takeover_once_stale() {
    let mut d = MemDisk::new();
    claim(&mut d, "a", 1, 0).unwrap();
    let e = claim(&mut d, "b", 2, 20_000).unwrap_err();
    assert_eq!(e.code().as_str(), "RUN_ALREADY_ACTIVE");
    assert!(e.to_string().contains("host-a"), "{e}");
    let e = claim(&mut d, "b", 2, 20_001).unwrap_err();
    assert_eq!(e.code().as_str(), "RUN_STALE_REQUIRES_TAKEOVER");
}

// PROTOCOL §7.3, §7.1
#[test]
fn release_frees_the_run_and_the_next_claim_gets_the_next_generation() {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    let g = release(&mut d, &l, 100).unwrap();
    assert_eq!(g.get(), 2);
    assert_eq!(status(&mut d, 100).status, Status::Free);
    let l2 = claim(&mut d, "b", 2, 200).unwrap();
    assert_eq!(l2.generation.get(), 3);
    // The released generation's cutoff exists and its beat is gone.
    assert!(d.files.contains_key(&FileRef::Cutoff(l.generation)));
    assert!(!d.files.contains_key(&FileRef::Beat(l.generation)));
}

// PROTOCOL §7.1 step 3
#[test]
fn a_claim_with_a_generation_at_u64_max_reports_overflow() {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    let mut rec: EpochRecord = decode(&d.files[&FileRef::Epoch(l.generation)]).unwrap();
    rec.generation = Generation::new(u64::MAX).unwrap();
    rec.prev_hash = Some(Digest::of(b"x"));
    rec.state = EpochState::Retired;
    rec.retired = Some(RetiredOwner {
        generation: Generation::new(u64::MAX - 1).unwrap(),
        owner_id: id("z"),
        reason: RetireReason::Dead,
        observed: None,
    });
    d.files
        .insert(FileRef::Epoch(rec.generation), encode(&rec).unwrap());
    let e = claim(&mut d, "b", 2, 10).unwrap_err();
    assert_eq!(e.code().as_str(), "GENERATION_OVERFLOW");
}

// PROTOCOL §12 (exit codes: lease-cli's docs_drift test maps every code)
#[test]
fn the_core_code_table_lists_each_code_once() {
    let mut codes: Vec<_> = ERROR_CODES.to_vec();
    codes.sort();
    codes.dedup();
    assert_eq!(codes.len(), ERROR_CODES.len());
}
