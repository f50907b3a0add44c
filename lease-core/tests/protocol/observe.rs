//! What observers make of the head: an invalid head record, a torn beat, and a beat aged on
//! the observer's own clock.

use crate::common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;

// PROTOCOL §7.0 OBSERVE, §7.8, I7
#[test]
fn an_invalid_head_record_never_allows_claim_takeover_or_retirement() {
    for bad in [
        &b"{}\n"[..],
        b"",
        b"not json",
        b"{\"version\":\"runlease/epoch/9\"}\n",
    ] {
        let mut d = MemDisk::new();
        let l = claim(&mut d, "a", 1, 0).unwrap();
        let exp = expect_head(&mut d, 0);
        d.files.insert(FileRef::Epoch(l.generation), bad.to_vec());
        let before = d.files.clone();
        let s = status(&mut d, 100_000);
        assert!(matches!(s.status, Status::Invalid(_)), "{:?}", s.status);
        assert!(claim(&mut d, "b", 2, 100_000).is_err());
        let e = d
            .run(
                &mut Takeover::new(takeover_params("b", 2, 100_000, exp)),
                &all_dead,
            )
            .unwrap_err();
        assert!(
            matches!(e.code().as_str(), "RECORD_INVALID" | "SCHEMA_UNSUPPORTED"),
            "{e}"
        );
        let e = d
            .run(
                &mut Retire::new(RetireParams {
                    run_id: run_id(),
                    owner_id: id("r"),
                    holder: holder(9),
                    policy: TimingPolicy::default(),
                    now: t(100_000),
                    expect: None,
                }),
                &all_dead,
            )
            .unwrap_err();
        assert!(
            matches!(e.code().as_str(), "RECORD_INVALID" | "SCHEMA_UNSUPPORTED"),
            "{e}"
        );
        assert_eq!(d.files, before, "nothing may change on disk");
    }
}

// PROTOCOL §4 HeartbeatRecord, §5.3, §7.0 OBSERVE, OQ-6 (issue #17): a torn `local` beat
// (what a power loss leaves of a beat that was never fsynced) is no evidence: the head is
// judged from its claim time and an exact takeover may replace it; it never wedges the run.
// The same bytes under `durable` (fsynced before the rename: never torn by a power loss),
// and a complete but undecodable beat under either policy, stay RECORD_INVALID.
#[test]
fn a_torn_local_heartbeat_is_no_evidence_and_never_wedges_the_run() {
    for cut in [0usize, 1, 2] {
        let mut d = MemDisk::new();
        let l = claim(&mut d, "a", 1, 0).unwrap();
        heartbeat(&mut d, &l, 1000, 1).unwrap();
        let full = d.files[&FileRef::Beat(l.generation)].clone();
        let torn = match cut {
            0 => Vec::new(),
            1 => full[..full.len() / 2].to_vec(),
            _ => vec![0u8; full.len()],
        };
        d.files.insert(FileRef::Beat(l.generation), torn.clone());
        let s = status(&mut d, 100_000);
        assert_eq!(s.status, Status::Stale, "cut {cut}: {:?}", s.status);
        let head = s.head.unwrap();
        assert_eq!(head.torn_beat, Some(Digest::of(&torn)));
        assert_eq!((head.heartbeat_at(), head.heartbeat_count()), (t(0), 0));
        // The watch key names the torn bytes: a rewrite restarts a watch.
        let key = lease_core::watch::watch_key(&head);
        assert!(key.2.contains("torn"), "{key:?}");
        // An exact takeover of that observation succeeds (after its watch).
        let exp = Expectation::of(&head);
        let b = d
            .run(
                &mut Takeover::new(takeover_params("b", 2, 100_000, exp.clone())),
                &all_alive,
            )
            .unwrap();
        assert_eq!(b.generation.get(), 2);
        // If the owner had come back and written a whole beat, the same expectation races.
        let mut d = MemDisk::new();
        let l = claim(&mut d, "a", 1, 0).unwrap();
        d.files.insert(FileRef::Beat(l.generation), torn);
        let exp = expect_head(&mut d, 100_000);
        heartbeat(&mut d, &l, 99_000, 1).unwrap();
        let e = d
            .run(
                &mut Takeover::new(takeover_params("b", 2, 100_000, exp)),
                &all_alive,
            )
            .unwrap_err();
        assert_eq!(e.code().as_str(), "TAKEOVER_RACE", "{e}");
    }
    // A complete record that does not decode is a hand edit, not a tear: invalid.
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    d.files
        .insert(FileRef::Beat(l.generation), b"{\"garbage\":1}\n".to_vec());
    assert!(matches!(
        status(&mut d, 100_000).status,
        Status::Invalid(LeaseError::RecordInvalid { .. })
    ));
    // Under `durable` even a cut-short beat is damage (a power loss cannot tear it).
    let mut d = MemDisk::new();
    let l = d
        .run(
            &mut Claim::new(ClaimParams {
                run_id: run_id(),
                owner_id: id("a"),
                holder: holder(1),
                policy: TimingPolicy::from_millis(5000, 15000, 20000, HeartbeatDurability::Durable)
                    .unwrap(),
                now: t(0),
                store_floor: None,
            }),
            &all_alive,
        )
        .unwrap();
    d.files.insert(FileRef::Beat(l.generation), Vec::new());
    let before = d.files.clone();
    assert!(matches!(
        status(&mut d, 100_000).status,
        Status::Invalid(LeaseError::RecordInvalid { .. })
    ));
    let exp = Expectation {
        generation: None,
        owner_id: id("a"),
        heartbeat_at: t(0),
        heartbeat_count: None,
    };
    assert_eq!(
        d.run(
            &mut Takeover::new(takeover_params("b", 2, 100_000, exp)),
            &all_alive
        )
        .unwrap_err()
        .code()
        .as_str(),
        "RECORD_INVALID"
    );
    assert_eq!(d.files, before);
}

// PROTOCOL §10, the same-clock rule (issue #17): a beat stamped on the observer's own
// monotonic clock is aged on that clock, whatever its wall time says; a stamp on another
// clock, or none, leaves the wall clock (status) and a watch from now (takeover).
#[test]
fn a_beat_stamped_on_the_observers_clock_is_aged_on_it_and_starts_the_watch_there() {
    let clock = id("boot-1/time:[1]");
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 100_000).unwrap();
    d.mono_ns = 7_000_000_000;
    // The owner's wall clock runs 60 s slow: its beat is dated a minute before the claim.
    let mut beat = Heartbeat::new(&l, t(40_000), 1)
        .unwrap()
        .on_clock(Some(clock.clone()));
    d.run(&mut beat, &all_alive).unwrap();
    let read = |d: &mut MemDisk, clock: Option<Identity>| {
        d.run(
            &mut StatusView::read(run_id(), t(101_000), false).on_clock(clock),
            &all_alive,
        )
        .unwrap()
    };
    // 1 s later on the owner's clock: fresh, though its wall time is 61 s old.
    d.mono_ns = 8_000_000_000;
    let same = read(&mut d, Some(clock.clone()));
    assert_eq!(same.status, Status::Active);
    assert_eq!(same.mono_age_ms, Some(1_000));
    assert_eq!(same.age_ms, Some(61_000));
    assert!(!same.is_stale());
    // On another clock (or none) the wall clock advises: stale.
    let other = read(&mut d, Some(id("boot-2/time:[1]")));
    assert_eq!(
        (other.status.clone(), other.mono_age_ms),
        (Status::Stale, None)
    );
    assert_eq!(read(&mut d, None).status, Status::Stale);
    // The watch: on the owner's clock it starts at the stamp, elsewhere now.
    let head = same.head.unwrap();
    let stale_after = head.epoch.policy.stale_after();
    let mut w = lease_core::watch::StaleWatch::on_clock(Some(clock.clone()));
    let v = w.observe(&head, 8_000_000_000);
    assert_eq!(
        v,
        lease_core::watch::Verdict::Watching {
            watched: std::time::Duration::from_millis(1_000),
            needed: stale_after
        }
    );
    let past = 7_000_000_000 + (stale_after.as_millis() as u64 + 1) * 1_000_000;
    let mut w = lease_core::watch::StaleWatch::on_clock(Some(clock.clone()));
    assert!(matches!(
        w.observe(&head, past),
        lease_core::watch::Verdict::TakeOver { .. }
    ));
    // The same instant seen from another clock: the watch only begins.
    let mut w = lease_core::watch::StaleWatch::on_clock(Some(id("boot-2/time:[1]")));
    assert_eq!(
        w.observe(&head, past),
        lease_core::watch::Verdict::Watching {
            watched: std::time::Duration::ZERO,
            needed: stale_after
        }
    );
    // A watch that knows no clock never uses a stamp.
    let mut w = lease_core::watch::StaleWatch::new();
    assert!(matches!(
        w.observe(&head, past),
        lease_core::watch::Verdict::Watching { watched, .. } if watched.is_zero()
    ));
    // A stamp ahead of the reading (not genuine on one clock) is ignored, never waited for.
    let mut w = lease_core::watch::StaleWatch::on_clock(Some(clock.clone()));
    assert_eq!(
        w.observe(&head, 6_000_000_000),
        lease_core::watch::Verdict::Watching {
            watched: std::time::Duration::ZERO,
            needed: stale_after
        }
    );
    // Once the owner beats again the key changes and the watch restarts at the new stamp.
    d.mono_ns = past;
    d.run(
        &mut Heartbeat::new(&l, t(40_000), 2)
            .unwrap()
            .on_clock(Some(clock.clone())),
        &all_alive,
    )
    .unwrap();
    let head2 = read(&mut d, Some(clock.clone())).head.unwrap();
    let mut w = lease_core::watch::StaleWatch::on_clock(Some(clock.clone()));
    w.observe(&head, past);
    assert_eq!(
        w.observe(&head2, past + 5_000_000),
        lease_core::watch::Verdict::Watching {
            watched: std::time::Duration::from_millis(5),
            needed: stale_after
        }
    );
}
