//! Scenario tests of the protocol, one per clause of docs/PROTOCOL.md, over the in-memory
//! authority. Names say which clause they check.

mod common;

use common::*;
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

// PROTOCOL §7.4 step 6
#[test]
fn takeover_is_refused_while_fresh() {
    let mut d = MemDisk::new();
    claim(&mut d, "a", 1, 0).unwrap();
    let e = takeover(&mut d, "b", 2, 10_000).unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_ACTIVE_REFUSED");
    assert_eq!(
        status(&mut d, 10_000).head.unwrap().epoch.owner_id.as_str(),
        "a"
    );
}

// PROTOCOL §7.4 step 6, I6
#[test]
fn takeover_with_a_wrong_expectation_is_a_race_and_changes_no_owner() {
    let mut d = MemDisk::new();
    claim(&mut d, "a", 1, 0).unwrap();
    let mut exp = expect_head(&mut d, 60_000);
    exp.owner_id = id("someone-else");
    let e = d
        .run(
            &mut Takeover::new(takeover_params("b", 2, 60_000, exp)),
            &all_alive,
        )
        .unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_RACE");
    let mut exp = expect_head(&mut d, 60_000);
    exp.heartbeat_at = t(1);
    let e = d
        .run(
            &mut Takeover::new(takeover_params("b", 2, 60_000, exp)),
            &all_alive,
        )
        .unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_RACE");
    assert_eq!(status(&mut d, 60_000).head.unwrap().generation().get(), 1);
}

// PROTOCOL §7.4 steps 3 and 7 (issue #17: refusals write nothing; issue #19: an accepted
// takeover writes its epoch and the old generation's cutoff, no intent)
#[test]
fn a_refused_takeover_writes_nothing_and_an_accepted_one_its_epoch_and_cutoff() {
    let mut d = MemDisk::new();
    claim(&mut d, "a", 1, 0).unwrap();
    let before = d.files.clone();
    // Not watched long enough (the owner is fresh): refused, nothing written.
    let e = takeover(&mut d, "b", 2, 10_000).unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_ACTIVE_REFUSED", "{e}");
    assert_eq!(d.files, before);
    // A mismatched expectation: refused, nothing written, retried as often as you like.
    for _ in 2..20 {
        let mut exp = expect_head(&mut d, 60_000);
        exp.owner_id = id("x");
        let e = d
            .run(
                &mut Takeover::new(takeover_params("b", 2, 60_000, exp)),
                &all_alive,
            )
            .unwrap_err();
        assert_eq!(e.code().as_str(), "TAKEOVER_RACE", "{e}");
    }
    // Watched long enough (60 s in this one-clock world), yet a watch that says less than
    // stale_after is refused whatever the wall age: no clock comparison decides.
    let exp = expect_head(&mut d, 60_000);
    let mut p = takeover_params("b", 2, 60_000, exp);
    p.trigger = TakeoverTrigger::Operator {
        watched_unchanged_ms: TimingPolicy::default().stale_after_ms(),
    };
    let e = d.run(&mut Takeover::new(p), &all_alive).unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_ACTIVE_REFUSED", "{e}");
    assert_eq!(d.files, before);
    let judged = expect_head(&mut d, 60_000);
    takeover(&mut d, "c", 3, 60_000).unwrap();
    let written: Vec<_> = d
        .files
        .keys()
        .filter(|f| !before.contains_key(f))
        .cloned()
        .collect();
    let g1 = Generation::new(1).unwrap();
    let g2 = Generation::new(2).unwrap();
    assert_eq!(written, vec![FileRef::Epoch(g2), FileRef::Cutoff(g1)]);
    // The epoch carries what the takeover judged: the audit record an intent held before.
    let epoch: EpochRecord = decode(&d.files[&FileRef::Epoch(g2)]).unwrap();
    let retired = epoch.retired.unwrap();
    assert_eq!(retired.reason, RetireReason::TakenOver);
    assert_eq!(
        retired.observed,
        Some(Observation {
            heartbeat_at: judged.heartbeat_at,
            heartbeat_count: judged.heartbeat_count.unwrap(),
            watched_ms: Some(lease_core::ghost::simulated_watch(&judged, t(60_000))),
            mode: TakeoverMode::Operator,
        })
    );
}

// PROTOCOL §7.4, §10: a heartbeat dated in the future (the owner's clock runs fast) does not
// delay a takeover once it was watched unchanged for stale_after; a wall age beyond
// stale_after (the owner's clock runs slow) does not allow one without the watch.
#[test]
fn takeover_is_judged_by_the_watch_never_by_the_wall_age() {
    let mut d = MemDisk::new();
    // The owner's clock is 60 s ahead of the taker's: claimed "at" 60 000, seen at 1 000.
    claim(&mut d, "a", 1, 60_000).unwrap();
    let exp = expect_head(&mut d, 1_000);
    let stale_after = TimingPolicy::default().stale_after_ms();
    let mut p = takeover_params("b", 2, 1_000, exp);
    p.trigger = TakeoverTrigger::Operator {
        watched_unchanged_ms: stale_after + 1,
    };
    let l = d.run(&mut Takeover::new(p), &all_alive).unwrap();
    assert_eq!(l.generation.get(), 2);
    // The new owner's clock is 60 s behind: its claim looks 60 s old, but without a watch
    // longer than stale_after nobody takes it over.
    let exp = expect_head(&mut d, 120_000);
    let mut p = takeover_params("c", 3, 120_000, exp);
    p.trigger = TakeoverTrigger::Automatic {
        watched_unchanged_ms: stale_after,
    };
    let before = d.files.clone();
    let e = d.run(&mut Takeover::new(p), &all_alive).unwrap_err();
    assert_eq!(e.code().as_str(), "TAKEOVER_ACTIVE_REFUSED", "{e}");
    assert_eq!(d.files, before);
}

// PROTOCOL §7.4, I1
#[test]
fn two_concurrent_takeovers_have_one_winner() {
    let mut d = MemDisk::new();
    claim(&mut d, "a", 1, 0).unwrap();
    let exp = expect_head(&mut d, 60_000);
    let mut t1 = Takeover::new(takeover_params("b", 2, 60_000, exp.clone()));
    let mut t2 = Takeover::new(takeover_params("c", 3, 60_000, exp));
    // Interleave step by step.
    let (mut i1, mut i2) = (None, None);
    let (mut r1, mut r2) = (None, None);
    while r1.is_none() || r2.is_none() {
        if r1.is_none() {
            match t1.next(i1.take()) {
                Step::Io(req) => i1 = Some(d.perform(req, &all_alive)),
                Step::Done(r) => r1 = Some(r),
            }
        }
        if r2.is_none() {
            match t2.next(i2.take()) {
                Step::Io(req) => i2 = Some(d.perform(req, &all_alive)),
                Step::Done(r) => r2 = Some(r),
            }
        }
    }
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    assert!(r1.is_ok() != r2.is_ok(), "{r1:?} {r2:?}");
    let loser = if r1.is_ok() { r2 } else { r1 };
    assert_eq!(loser.unwrap_err().code().as_str(), "TAKEOVER_RACE");
}

// PROTOCOL §7.2 step 2, §7.3 step 1, §7.6 step 1, I3, I8
#[test]
fn a_superseded_owner_is_fenced_on_heartbeat_append_and_release() {
    let mut d = MemDisk::new();
    let old = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &old, 10, 1).unwrap();
    let new = takeover(&mut d, "b", 2, 60_000).unwrap();
    let before = d.files.clone();
    // Heartbeat: writes its own beat file (harmless) but reports FENCED.
    let e = heartbeat(&mut d, &old, 60_001, 5).unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED");
    // Append: refused before writing anything (its cutoff exists).
    let e = append(&mut d, &old, 60_002, 2).unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED");
    // Release: a harmless no-op.
    let e = release(&mut d, &old, 60_003).unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED");
    let changed: Vec<_> = d
        .files
        .keys()
        .filter(|k| before.get(k) != d.files.get(k))
        .collect();
    assert_eq!(changed, vec![&FileRef::Beat(old.generation)]);
    // The authoritative record is still the new owner's.
    let s = status(&mut d, 60_010);
    assert_eq!(s.head.unwrap().epoch.owner_id, new.owner_id);
    assert_eq!(counted(&read_events(&mut d, 60_010).unwrap()), vec![1]);
}

// PROTOCOL §7.6, I9
#[test]
fn a_zombie_append_racing_a_takeover_answers_exactly_its_authority() {
    // Interleave the zombie's append with every point of a takeover: whatever the
    // interleaving, an acknowledged event counts and a fenced one does not.
    for split in 0..40 {
        let mut d = MemDisk::new();
        let old = claim(&mut d, "a", 1, 0).unwrap();
        append(&mut d, &old, 10, 1).unwrap();
        let exp = expect_head(&mut d, 60_000);
        let mut tk = Takeover::new(takeover_params("b", 2, 60_000, exp));
        let mut ap = Append::new(
            &old,
            AppendParams {
                event_type: id("late"),
                payload: serde_json::json!(null),
                now: t(60_000),
                tail_hint: None,
            },
        );
        let mut it = None;
        let mut tk_res = None;
        for _ in 0..split {
            match tk.next(it.take()) {
                Step::Io(r) => it = Some(d.perform(r, &all_alive)),
                Step::Done(r) => {
                    tk_res = Some(r);
                    break;
                }
            }
        }
        let ap_res = d.run(&mut ap, &all_alive);
        if tk_res.is_none() {
            let mut input = it;
            loop {
                match tk.next(input.take()) {
                    Step::Io(r) => input = Some(d.perform(r, &all_alive)),
                    Step::Done(r) => {
                        tk_res = Some(r);
                        break;
                    }
                }
            }
        }
        tk_res.unwrap().unwrap();
        let view = read_events(&mut d, 70_000).unwrap();
        match ap_res {
            Ok(a) => assert!(
                counted(&view).contains(&a.sequence.get()),
                "split {split}: acknowledged event {} does not count",
                a.sequence
            ),
            Err(e) => {
                assert_eq!(e.code().as_str(), "FENCED", "split {split}");
                assert_eq!(counted(&view), vec![1], "split {split}");
            }
        }
    }
}

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

// PROTOCOL §7.6 steps 2–4, §13
#[test]
fn appends_get_consecutive_sequences_and_form_a_hash_chain() {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    let mut hint = None;
    for n in 1..=20u64 {
        let a = d
            .run(
                &mut Append::new(
                    &l,
                    AppendParams {
                        event_type: id("e"),
                        payload: serde_json::json!(n),
                        now: t(n),
                        tail_hint: if n % 3 == 0 { None } else { hint.clone() },
                    },
                ),
                &all_alive,
            )
            .unwrap();
        assert_eq!(a.sequence.get(), n);
        hint = Some((a.sequence, a.hash));
    }
    let v = read_events(&mut d, 100).unwrap();
    assert_eq!(counted(&v), (1..=20).collect::<Vec<_>>());
    let report = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert_eq!((report.epochs, report.events), (1, 20));
}

// PROTOCOL §7.9 step 5, §7.6 step 1, I4
#[test]
fn a_pending_cutoff_is_finalized_by_the_next_reader() {
    let mut d = MemDisk::new();
    let old = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &old, 5, 1).unwrap();
    // The taker crashes right after creating generation 2 (before FINALIZE).
    let exp = expect_head(&mut d, 60_000);
    let mut tk = Takeover::new(takeover_params("b", 2, 60_000, exp));
    let mut input = None;
    loop {
        match tk.next(input.take()) {
            Step::Io(r @ Request::CreateExclusive(FileRef::Epoch(_), _)) => {
                d.perform(r, &all_alive);
                break;
            }
            Step::Io(r) => input = Some(d.perform(r, &all_alive)),
            Step::Done(r) => panic!("finished early: {r:?}"),
        }
    }
    assert!(!d.files.contains_key(&FileRef::Cutoff(old.generation)));
    // A read-only reader reports the zombie's generation as pending...
    let ro = d
        .run(&mut ReadEvents::new(run_id(), None), &all_alive)
        .unwrap();
    assert_eq!(ro.events[0].standing, Standing::Pending);
    // ...a finalizing reader decides the cutoff as the log tail now (1).
    let v = read_events(&mut d, 60_100).unwrap();
    assert_eq!(counted(&v), vec![1]);
    // The zombie's next append is past the cutoff and fenced.
    assert_eq!(
        append(&mut d, &old, 60_200, 2).unwrap_err().code().as_str(),
        "FENCED"
    );
    assert_eq!(counted(&read_events(&mut d, 60_300).unwrap()), vec![1]);
}

// PROTOCOL §7.9 step 6, I4
#[test]
fn corrupting_or_deleting_the_newest_epoch_never_makes_a_retired_owners_events_count() {
    let mut d = MemDisk::new();
    let old = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &old, 5, 1).unwrap();
    let new = takeover(&mut d, "b", 2, 60_000).unwrap();
    // Simulate a zombie that wrote past its cutoff behind the protocol's back.
    let zombie_event = {
        let prev = d.files[&FileRef::Event(Sequence::FIRST)].clone();
        encode(&Event {
            run_id: run_id(),
            sequence: Sequence::new(2).unwrap(),
            generation: old.generation,
            owner_id: old.owner_id.clone(),
            event_type: id("late"),
            payload: serde_json::json!(null),
            timestamp: t(60_001),
            prev_hash: Some(Digest::of(&prev)),
        })
        .unwrap()
    };
    d.files
        .insert(FileRef::Event(Sequence::new(2).unwrap()), zombie_event);
    assert_eq!(counted(&read_events(&mut d, 60_010).unwrap()), vec![1]);
    // Corrupt the newest epoch: reading fails with a typed error naming the file.
    let good = d.files[&FileRef::Epoch(new.generation)].clone();
    d.files
        .insert(FileRef::Epoch(new.generation), b"{}\n".to_vec());
    let e = read_events(&mut d, 60_020).unwrap_err();
    assert_eq!(e.code().as_str(), "RECORD_INVALID");
    assert!(
        e.to_string()
            .contains("lease/epochs/00000000000000000002.json"),
        "{e}"
    );
    // Delete it: the cutoff still applies.
    d.files.remove(&FileRef::Epoch(new.generation));
    assert_eq!(counted(&read_events(&mut d, 60_030).unwrap()), vec![1]);
    d.files.insert(FileRef::Epoch(new.generation), good);
}

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

// PROTOCOL §7.10, §13, I12
#[test]
fn prune_keeps_a_run_small_and_every_judgment_unchanged() {
    let mut d = MemDisk::new();
    let mut now = 0;
    let mut zombie = None;
    for i in 0..60u64 {
        now += 100_000;
        let l = match claim(&mut d, &format!("o{i}"), 10 + i as u32, now) {
            Ok(l) => l,
            Err(_) => takeover(&mut d, &format!("o{i}"), 10 + i as u32, now).unwrap(),
        };
        append(&mut d, &l, now + 1, i).unwrap();
        if i % 3 == 0 {
            // Without the release's own compaction (§7.3 step 7): this test is about one
            // explicit prune over the whole history.
            release_uncompacted(&mut d, &l, now + 2).unwrap();
        } else if i == 10 {
            zombie = Some(l);
        }
    }
    // A zombie of generation ~ (i=10) appends late: past its cutoff.
    let z = zombie.unwrap();
    assert_eq!(
        append(&mut d, &z, now + 10, 999)
            .unwrap_err()
            .code()
            .as_str(),
        "FENCED"
    );
    let before = read_events(&mut d, now + 20).unwrap();
    let files_before = d.files.len();
    let report = d
        .run(
            &mut Prune::new(PruneParams {
                run_id: run_id(),
                keep: 4,
                by: id("pruner"),
                now: t(now + 30),
            }),
            &all_alive,
        )
        .unwrap();
    assert!(report.floor.is_some() && report.removed > 100, "{report:?}");
    assert!(d.files.len() < files_before - 100);
    let after = read_events(&mut d, now + 40).unwrap();
    assert_eq!(counted(&before), counted(&after));
    // A zombie below the floor stays fenced.
    assert_eq!(
        append(&mut d, &z, now + 50, 1000)
            .unwrap_err()
            .code()
            .as_str(),
        "FENCED"
    );
    let v = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert_eq!(v.floor, report.floor);
    // Claims keep working above the floor.
    let head = status(&mut d, now + 60).head.unwrap();
    assert!(head.generation() > report.floor.unwrap());
}

// PROTOCOL §13
#[test]
fn verify_reports_the_first_broken_link() {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    for n in 1..=3 {
        append(&mut d, &l, n, n).unwrap();
    }
    release(&mut d, &l, 10).unwrap();
    claim(&mut d, "b", 2, 20).unwrap();
    assert!(d.run(&mut Verify::new(run_id()), &all_alive).is_ok());
    // Swap in a different, valid event 2: event 3's link breaks.
    let mut e2: Event = decode(&d.files[&FileRef::Event(Sequence::new(2).unwrap())]).unwrap();
    e2.payload = serde_json::json!("edited");
    d.files.insert(
        FileRef::Event(Sequence::new(2).unwrap()),
        encode(&e2).unwrap(),
    );
    let e = d.run(&mut Verify::new(run_id()), &all_alive).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN");
    assert!(e.to_string().contains("event chain broken at 3"), "{e}");
}

// PROTOCOL §13
#[test]
fn verify_reports_a_log_that_ends_before_a_finalized_cutoff() {
    let mut d = MemDisk::new();
    let old = claim(&mut d, "a", 1, 0).unwrap();
    for n in 1..=2 {
        append(&mut d, &old, n, n).unwrap();
    }
    takeover(&mut d, "b", 2, 60_000).unwrap();
    let report = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert_eq!(report.short_tail, None, "an intact log is not short");
    // The cutoff of generation 1 says "through 2"; delete the log's tail.
    d.files.remove(&FileRef::Event(Sequence::new(2).unwrap()));
    let report = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert_eq!(
        report.short_tail,
        Some(ShortTail {
            named: 2,
            by_cutoff_of: Some(Generation::FIRST),
            tail: 1,
        })
    );
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

/// OQ-2 (docs/DECISIONS.md; was PROTOCOL.md §15): a taker crashes after creating its epoch
/// and before finalizing the cutoff of the owner it replaced; a second taker replaces it.
/// The first owner, paused all along, must not be able to finalize its own (missing) cutoff
/// later and count.
// PROTOCOL §7.0 GATE, I13
#[test]
fn a_cutoff_left_pending_by_a_crashed_taker_is_finalized_before_the_chain_moves_on() {
    let mut d = MemDisk::new();
    let a = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &a, 5, 1).unwrap();
    // B takes over A and crashes right after creating generation 2.
    let exp = expect_head(&mut d, 60_000);
    let mut tk = Takeover::new(takeover_params("b", 2, 60_000, exp));
    let mut input = None;
    loop {
        match tk.next(input.take()) {
            Step::Io(r @ Request::CreateExclusive(FileRef::Epoch(_), _)) => {
                d.perform(r, &all_alive);
                break;
            }
            Step::Io(r) => input = Some(d.perform(r, &all_alive)),
            Step::Done(r) => panic!("finished early: {r:?}"),
        }
    }
    // C takes over B (stale) and appends.
    let c = takeover(&mut d, "c", 3, 200_000).unwrap();
    assert_eq!(c.generation.get(), 3);
    let c1 = append(&mut d, &c, 200_001, 2).unwrap();
    // A wakes up and appends: it must be fenced, and its event must not count.
    let e = append(&mut d, &a, 200_002, 3).unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED");
    let v = read_events(&mut d, 200_003).unwrap();
    assert_eq!(counted(&v), vec![1, c1.sequence.get()]);
}

/// OQ-17 (docs/DECISIONS.md; was PROTOCOL.md §15): two prunes interleaved at every point
/// never change which events count (a prune that sees the chain change under it gives up
/// with CONCURRENT_CHANGE).
// PROTOCOL §7.10, I12
#[test]
fn concurrent_prunes_never_change_which_events_count() {
    fn build() -> MemDisk {
        let mut d = MemDisk::new();
        let mut now = 0;
        for i in 0..12u64 {
            now += 100_000;
            let l = match claim(&mut d, &format!("o{i}"), 10 + i as u32, now) {
                Ok(l) => l,
                Err(_) => takeover(&mut d, &format!("o{i}"), 10 + i as u32, now).unwrap(),
            };
            append(&mut d, &l, now + 1, i).unwrap();
            if i % 2 == 0 {
                release(&mut d, &l, now + 2).unwrap();
            }
        }
        d
    }
    let prune = |keep: u64| {
        Prune::new(PruneParams {
            run_id: run_id(),
            keep,
            by: id("pruner"),
            now: t(10_000_000),
        })
    };
    let mut base = build();
    let expected = counted(&read_events(&mut base, 9_000_000).unwrap());
    let mut explored = 0;
    for (k1, k2) in [(8u64, 4u64), (4, 8), (5, 5)] {
        for split in 0..120 {
            let mut d = build();
            let (mut p1, mut p2) = (prune(k1), prune(k2));
            let (mut i1, mut i2) = (None, None);
            let (mut r1, mut r2) = (None, None);
            let mut n = 0;
            while r1.is_none() || r2.is_none() {
                let first = n < split || r2.is_some();
                n += 1;
                if first && r1.is_none() {
                    match p1.next(i1.take()) {
                        Step::Io(r) => i1 = Some(d.perform(r, &all_alive)),
                        Step::Done(r) => r1 = Some(r),
                    }
                } else if r2.is_none() {
                    match p2.next(i2.take()) {
                        Step::Io(r) => i2 = Some(d.perform(r, &all_alive)),
                        Step::Done(r) => r2 = Some(r),
                    }
                } else {
                    match p1.next(i1.take()) {
                        Step::Io(r) => i1 = Some(d.perform(r, &all_alive)),
                        Step::Done(r) => r1 = Some(r),
                    }
                }
            }
            for r in [r1.unwrap(), r2.unwrap()] {
                if let Err(e) = r {
                    assert_eq!(e.code().as_str(), "CONCURRENT_CHANGE", "{e}");
                }
            }
            let got = counted(&read_events(&mut d, 9_000_000).unwrap());
            assert_eq!(got, expected, "keep {k1}/{k2}, split {split}");
            explored += 1;
        }
    }
    assert!(explored > 300);
}

/// OQ-15 (docs/DECISIONS.md; was PROTOCOL.md §15): a reader (and verify) interleaved with a
/// prune at every point sees exactly the same judgments, or answers CONCURRENT_CHANGE;
/// never a wrong answer and never CHAIN_BROKEN.
// PROTOCOL §7.9, §7.10, I12
#[test]
fn a_reader_racing_a_prune_never_misjudges_and_verify_never_reports_a_broken_chain() {
    fn build() -> MemDisk {
        let mut d = MemDisk::new();
        let mut now = 0;
        for i in 0..10u64 {
            now += 100_000;
            let l = match claim(&mut d, &format!("o{i}"), 10 + i as u32, now) {
                Ok(l) => l,
                Err(_) => takeover(&mut d, &format!("o{i}"), 10 + i as u32, now).unwrap(),
            };
            append(&mut d, &l, now + 1, i).unwrap();
            if i % 2 == 0 {
                release(&mut d, &l, now + 2).unwrap();
            }
        }
        d
    }
    let mut base = build();
    let expected = counted(&read_events(&mut base, 9_000_000).unwrap());
    for (split, rsplit) in (0..60)
        .step_by(3)
        .flat_map(|a| (0..40).step_by(4).map(move |b| (a, b)))
    {
        for verify in [false, true] {
            let mut d = build();
            let mut p = Prune::new(PruneParams {
                run_id: run_id(),
                keep: 3,
                by: id("pruner"),
                now: t(10_000_000),
            });
            let mut pi = None;
            let mut pdone = false;
            for _ in 0..split {
                match p.next(pi.take()) {
                    Step::Io(r) => pi = Some(d.perform(r, &all_alive)),
                    Step::Done(r) => {
                        r.unwrap();
                        pdone = true;
                        break;
                    }
                }
            }
            // The reader runs one request at a time, the prune finishes in between.
            let mut reader = ReadEvents::new(run_id(), None);
            let mut verifier = Verify::new(run_id());
            let mut ri = None;
            let mut reader_steps = 0;
            let result = loop {
                let step = if verify {
                    match verifier.next(ri.take()) {
                        Step::Io(r) => Step::Io(r),
                        Step::Done(r) => Step::Done(r.map(|_| None)),
                    }
                } else {
                    match reader.next(ri.take()) {
                        Step::Io(r) => Step::Io(r),
                        Step::Done(r) => Step::Done(r.map(Some)),
                    }
                };
                match step {
                    Step::Io(r) => ri = Some(d.perform(r, &all_alive)),
                    Step::Done(r) => break r,
                }
                reader_steps += 1;
                if reader_steps == rsplit && !pdone {
                    loop {
                        match p.next(pi.take()) {
                            Step::Io(r) => pi = Some(d.perform(r, &all_alive)),
                            Step::Done(r) => {
                                r.unwrap();
                                pdone = true;
                                break;
                            }
                        }
                    }
                }
            };
            match result {
                Ok(Some(view)) => assert_eq!(counted(&view), expected, "split {split}/{rsplit}"),
                Ok(None) => {}
                Err(e) => assert_eq!(
                    e.code().as_str(),
                    "CONCURRENT_CHANGE",
                    "split {split}/{rsplit} verify {verify}: {e}"
                ),
            }
        }
    }
}

/// Issue #28: verify (and doctor's `STRAY_EPOCHS`) reported epochs left below the
/// checkpoint floor (a claimer that lost to a compaction, a prune that crashed in its
/// removals) and named prune, which said "nothing to prune" and left them. With nothing to
/// compact, prune now removes what is below the existing floor, after syncing the
/// checkpoint it read; judgments are unchanged and verify reports no stray.
// PROTOCOL §7.10 step 2, §13, I12
#[test]
fn prune_with_nothing_to_compact_removes_the_strays_below_the_floor() {
    let mut d = MemDisk::new();
    let mut kept = Vec::new();
    for i in 0..8u64 {
        let l = claim(&mut d, &format!("o{i}"), 10 + i as u32, i * 100).unwrap();
        append(&mut d, &l, i * 100 + 1, i).unwrap();
        release(&mut d, &l, i * 100 + 2).unwrap();
        kept.push(d.files.clone());
    }
    let prune = |keep| {
        Prune::new(PruneParams {
            run_id: run_id(),
            keep,
            by: id("pruner"),
            now: t(5_000),
        })
    };
    let first = d.run(&mut prune(4), &all_alive).unwrap();
    let floor = first.floor.unwrap();
    // Strays: the records of two generations below the floor come back (as a prune's
    // lost removals would).
    let strays: Vec<Generation> = [1, 3].map(|g| Generation::new(g).unwrap()).to_vec();
    for g in &strays {
        assert!(*g < floor);
        let all = kept.last().unwrap();
        d.files
            .insert(FileRef::Epoch(*g), all[&FileRef::Epoch(*g)].clone());
        d.files
            .insert(FileRef::Cutoff(*g), all[&FileRef::Cutoff(*g)].clone());
    }
    let v = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert_eq!(v.strays, strays);
    let before = read_events(&mut d, 6_000).unwrap();
    d.counts.clear();
    let r = d.run(&mut prune(4), &all_alive).unwrap();
    assert_eq!(
        r,
        PruneReport {
            floor: None,
            removed: 4
        }
    );
    // The checkpoint it read was synced before anything it folds was removed.
    assert_eq!(d.counts.get("sync"), Some(&1), "{:?}", d.counts);
    let v = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert!(v.strays.is_empty(), "{v:?}");
    assert_eq!(v.floor, Some(floor));
    assert!(d.files.keys().all(|f| match f {
        FileRef::Epoch(g) | FileRef::Cutoff(g) => *g >= floor,
        _ => true,
    }));
    let after = read_events(&mut d, 6_000).unwrap();
    assert_eq!(counted(&before), counted(&after));
    // Nothing left below the floor: nothing to do, nothing synced.
    d.counts.clear();
    let r = d.run(&mut prune(4), &all_alive).unwrap();
    assert_eq!(
        r,
        PruneReport {
            floor: None,
            removed: 0
        }
    );
    assert_eq!(d.counts.get("sync"), None);
}

/// Found by the model checker's random walks: prune compacted the chain while the head
/// epoch was hand-corrupted. Bad input must be reported, never worked around: prune now
/// refuses and removes nothing.
#[test]
fn prune_refuses_to_compact_under_an_invalid_head_and_removes_nothing() {
    let mut d = MemDisk::new();
    for i in 0..6u64 {
        let l = claim(&mut d, &format!("o{i}"), 10 + i as u32, i * 100).unwrap();
        release(&mut d, &l, i * 100 + 1).unwrap();
    }
    let head = status(&mut d, 1_000).head.unwrap().generation();
    d.files.insert(FileRef::Epoch(head), b"{}\n".to_vec());
    let before = d.files.clone();
    let e = d
        .run(
            &mut Prune::new(PruneParams {
                run_id: run_id(),
                keep: 2,
                by: id("pruner"),
                now: t(2_000),
            }),
            &all_alive,
        )
        .unwrap_err();
    assert_eq!(e.code().as_str(), "RECORD_INVALID", "{e}");
    assert_eq!(d.files, before);
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

// Issue #17, rollback evidence (PROTOCOL §4 `cutoff_hash`, §7.0 FINALIZE, §13). A run where
// every cutoff but the newest is bound: a (g1) appends 1, b takes over (g2, cutoff 1
// through 1), b appends 2, b releases (g3 binds cutoff 1), c claims (g4 binds cutoff 2).
fn bound_run() -> (MemDisk, OwnedLease) {
    let mut d = MemDisk::new();
    let a = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &a, 1, 1).unwrap();
    let b = takeover(&mut d, "b", 2, 60_000).unwrap();
    append(&mut d, &b, 60_001, 2).unwrap();
    release(&mut d, &b, 60_002).unwrap();
    claim(&mut d, "c", 3, 60_003).unwrap();
    (d, a)
}

fn epoch_of(d: &MemDisk, g: u64) -> EpochRecord {
    decode(&d.files[&FileRef::Epoch(Generation::new(g).unwrap())]).unwrap()
}

fn verify(d: &mut MemDisk) -> Result<VerifyReport, LeaseError> {
    d.run(&mut Verify::new(run_id()), &all_alive)
}

#[test]
fn each_epoch_binds_the_cutoff_its_gate_finalized() {
    let (mut d, _) = bound_run();
    let cut =
        |d: &MemDisk, g: u64| Digest::of(&d.files[&FileRef::Cutoff(Generation::new(g).unwrap())]);
    assert_eq!(
        epoch_of(&d, 2).cutoff_hash,
        None,
        "epoch 1 superseded nobody"
    );
    assert_eq!(epoch_of(&d, 3).cutoff_hash, Some(cut(&d, 1)));
    assert_eq!(epoch_of(&d, 4).cutoff_hash, Some(cut(&d, 2)));
    let report = verify(&mut d).unwrap();
    assert_eq!((report.epochs, report.events), (4, 2));
}

#[test]
fn a_deleted_bound_cutoff_is_chain_broken_and_never_finalized_again() {
    let (mut d, zombie) = bound_run();
    let cutoff1 = FileRef::Cutoff(Generation::FIRST);
    d.files.remove(&cutoff1);
    let e = verify(&mut d).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
    assert!(
        e.to_string()
            .contains("lease/cutoffs/00000000000000000001.json is missing"),
        "{e}"
    );
    // A read-only reader does not call them "not counted yet" (pending): removed.
    let e = d
        .run(&mut ReadEvents::new(run_id(), None), &all_alive)
        .unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
    // A finalizing reader refuses rather than deciding generation 1's events again.
    let e = read_events(&mut d, 70_000).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
    assert!(
        !d.files.contains_key(&cutoff1),
        "the reader re-created the cutoff"
    );
    // The zombie of generation 1 appends (its PRE-check finds no cutoff): its event must
    // never be acknowledged. Before the binding, the lazy FINALIZE of its POST-check
    // re-created cutoff 1 through the new tail and acknowledged it.
    let e = append(&mut d, &zombie, 70_001, 3).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
    assert!(!d.files.contains_key(&cutoff1));
}

/// PROTOCOL §7.0 L4, found by the model checker's concurrent reader (OQ-15 configuration):
/// a lazy FINALIZE read `cutoff 1` missing while the releaser was about to create it; the
/// release then ended and a claim created epoch 3 before the finalizer's `Exists(epoch 3)`.
/// Epoch 3 existing means its creator had cutoff 1, but here it was created, not removed:
/// the finalizer reads it again and uses it instead of answering `CHAIN_BROKEN` on a sound
/// run.
#[test]
fn a_lazy_finalize_overtaken_by_the_cutoff_and_the_next_claim_uses_the_cutoff() {
    let mut d = MemDisk::new();
    let a = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &a, 1, 1).unwrap();
    let mut rel = Release::new(ReleaseParams {
        lease: a.clone(),
        now: t(2),
        seal: None,
    });
    // The release up to its eager FINALIZE's create of cutoff 1 (not yet performed).
    let mut ri = None;
    let cutoff = loop {
        match rel.next(ri.take()) {
            Step::Io(r @ Request::CreateExclusive(FileRef::Cutoff(_), _)) => break r,
            Step::Io(r) => ri = Some(d.perform(r, &all_alive)),
            Step::Done(r) => panic!("release ended early: {r:?}"),
        }
    };
    // A finalizing reader sees epoch 2 retire generation 1, no cutoff: it reads cutoff 1
    // (missing) lazily.
    let mut reader = ReadEvents::new(run_id(), Some((id("reader"), t(3))));
    let mut input = None;
    loop {
        match reader.next(input.take()) {
            Step::Io(r @ Request::Read(FileRef::Cutoff(_))) => {
                input = Some(d.perform(r, &all_alive));
                assert_eq!(input, Some(Response::Content(None)));
                break;
            }
            Step::Io(r) => input = Some(d.perform(r, &all_alive)),
            Step::Done(r) => panic!("reader ended early: {r:?}"),
        }
    }
    // The release creates cutoff 1 and ends; b claims generation 3.
    ri = Some(d.perform(cutoff, &all_alive));
    loop {
        match rel.next(ri.take()) {
            Step::Io(r) => ri = Some(d.perform(r, &all_alive)),
            Step::Done(r) => break assert_eq!(r.unwrap().get(), 2),
        }
    }
    assert_eq!(claim(&mut d, "b", 2, 4).unwrap().generation.get(), 3);
    let view = loop {
        match reader.next(input.take()) {
            Step::Io(r) => input = Some(d.perform(r, &all_alive)),
            Step::Done(r) => break r.unwrap(),
        }
    };
    assert_eq!(counted(&view), [1]);
    assert_eq!(counted(&read_events(&mut d, 5).unwrap()), [1]);
}

#[test]
fn an_edited_bound_cutoff_is_chain_broken() {
    let (mut d, _) = bound_run();
    let f = FileRef::Cutoff(Generation::FIRST);
    let mut c: RetirementRecord = decode(&d.files[&f]).unwrap();
    c.events_through = 2;
    d.files.insert(f, encode(&c).unwrap());
    let e = verify(&mut d).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
    assert!(e.to_string().contains("was changed"), "{e}");
}

#[test]
fn a_cutoff_that_disagrees_with_its_epoch_is_chain_broken() {
    // The newest cutoff (2) is not bound yet by hash, but it must still name its epoch's
    // owner and successor.
    let mut d = MemDisk::new();
    let a = claim(&mut d, "a", 1, 0).unwrap();
    release(&mut d, &a, 1).unwrap();
    let f = FileRef::Cutoff(Generation::FIRST);
    let good = d.files[&f].clone();
    let mut c: RetirementRecord = decode(&good).unwrap();
    c.owner_id = id("someone-else");
    d.files.insert(f, encode(&c).unwrap());
    let e = verify(&mut d).unwrap_err();
    assert!(e.to_string().contains("names owner someone-else"), "{e}");
    let mut c: RetirementRecord = decode(&good).unwrap();
    c.superseded_by = Generation::new(5).unwrap();
    d.files.insert(f, encode(&c).unwrap());
    let e = verify(&mut d).unwrap_err();
    assert!(e.to_string().contains("superseded by generation 5"), "{e}");
    d.files.insert(f, good);
    verify(&mut d).unwrap();
}

#[test]
fn deleted_newest_epochs_are_chain_broken() {
    // a: g1 appends 1, releases (g2); b: g3 appends 2, releases (g4).
    let mut d = MemDisk::new();
    let a = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &a, 1, 1).unwrap();
    release(&mut d, &a, 2).unwrap();
    let b = claim(&mut d, "b", 2, 3).unwrap();
    append(&mut d, &b, 4, 2).unwrap();
    release(&mut d, &b, 5).unwrap();
    verify(&mut d).unwrap();
    let epoch = |g: u64| FileRef::Epoch(Generation::new(g).unwrap());
    // Only the released head: cutoff 3 names epoch 4 as its successor.
    let mut d4 = d.clone();
    d4.files.remove(&epoch(4));
    let e = verify(&mut d4).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN");
    assert!(e.to_string().contains("epoch 4 superseded it"), "{e}");
    // Epochs 3 and 4: cutoff 3 exists without its epoch.
    d.files.remove(&epoch(4));
    d.files.remove(&epoch(3));
    let e = verify(&mut d).unwrap_err();
    assert!(e.to_string().contains("newest epochs were deleted"), "{e}");
    // And its cutoff too: event 2 still names generation 3.
    d.files
        .remove(&FileRef::Cutoff(Generation::new(3).unwrap()));
    let e = verify(&mut d).unwrap_err();
    assert!(
        e.to_string().contains("events of generation 3 exist"),
        "{e}"
    );
    // A beat above the head says the same (no event, no cutoff left).
    let mut d = MemDisk::new();
    let a = claim(&mut d, "a", 1, 0).unwrap();
    release(&mut d, &a, 1).unwrap();
    let b = claim(&mut d, "b", 2, 2).unwrap();
    heartbeat(&mut d, &b, 3, 1).unwrap();
    d.files.remove(&epoch(3));
    let e = verify(&mut d).unwrap_err();
    assert!(
        e.to_string()
            .contains("lease/beats/00000000000000000003.json exists"),
        "{e}"
    );
}

#[test]
fn a_checkpoint_binds_its_last_event_and_verify_checks_it() {
    let mut d = MemDisk::new();
    let mut now = 0;
    for i in 0..6u64 {
        now += 10;
        let l = claim(&mut d, &format!("o{i}"), 10 + i as u32, now).unwrap();
        append(&mut d, &l, now + 1, i).unwrap();
        release(&mut d, &l, now + 2).unwrap();
    }
    let report = d
        .run(
            &mut Prune::new(PruneParams {
                run_id: run_id(),
                keep: 2,
                by: id("pruner"),
                now: t(now + 3),
            }),
            &all_alive,
        )
        .unwrap();
    let floor = report.floor.unwrap();
    let cp: Checkpoint = decode(&d.files[&FileRef::Checkpoint(floor)]).unwrap();
    let last = FileRef::Event(Sequence::new(6).unwrap());
    assert_eq!(cp.through_sequence, 6);
    assert_eq!(cp.through_hash, Some(Digest::of(&d.files[&last])));
    verify(&mut d).unwrap();
    // Rewrite the last event (no later event links to it, so only the checkpoint can tell).
    let mut ev: Event = decode(&d.files[&last]).unwrap();
    ev.payload = serde_json::json!("rewritten");
    d.files.insert(last, encode(&ev).unwrap());
    let e = verify(&mut d).unwrap_err();
    assert_eq!(e.code().as_str(), "CHAIN_BROKEN", "{e}");
    assert!(e.to_string().contains("through_hash differs"), "{e}");
    // With a later event appended after it, the hash is read from the event itself.
    let mut d2 = d.clone();
    d2.files.remove(&last);
    let mut ev: Event = decode(&d.files[&last]).unwrap();
    ev.payload = serde_json::json!({ "n": 5 });
    d2.files.insert(last, encode(&ev).unwrap());
    verify(&mut d2).unwrap();
    let l = claim(&mut d2, "late", 99, now + 10).unwrap();
    append(&mut d2, &l, now + 11, 7).unwrap();
    verify(&mut d2).unwrap();
}

// PROTOCOL §7.4 steps 5–8, OQ-5 (issue #17): the takeover reads its monotonic clock before
// its last look at the owner's beat and right before its commit; more than half the owner's
// heartbeat interval between them is TAKEOVER_RACE (an owner that resumed meanwhile may
// have beaten unseen), and nothing is written (issue #19: no intent either).
#[test]
fn a_takeover_paused_between_its_last_look_and_its_commit_races() {
    for (pause_ms, ok) in [(0u64, true), (2_500, true), (2_501, false), (60_000, false)] {
        let mut d = MemDisk::new();
        claim(&mut d, "a", 1, 0).unwrap();
        let exp = expect_head(&mut d, 100_000);
        let before = d.files.clone();
        let mut op = Takeover::new(takeover_params("b", 2, 100_000, exp));
        let mut input = None;
        let mut clocks = 0;
        let result = loop {
            match op.next(input.take()) {
                Step::Io(req) => {
                    if matches!(req, Request::Monotonic) {
                        clocks += 1;
                        if clocks == 2 {
                            // The taker was paused after its look at the beat.
                            d.mono_ns += pause_ms * 1_000_000;
                        }
                    }
                    input = Some(d.perform(req, &all_alive));
                }
                Step::Done(r) => break r,
            }
        };
        assert_eq!(clocks, 2, "pause {pause_ms}");
        let epoch2 = FileRef::Epoch(Generation::new(2).unwrap());
        if ok {
            assert_eq!(result.unwrap().generation.get(), 2, "pause {pause_ms}");
        } else {
            let e = result.unwrap_err();
            assert_eq!(e.code().as_str(), "TAKEOVER_RACE", "pause {pause_ms}: {e}");
            assert!(
                e.to_string()
                    .contains("half the owner's heartbeat interval"),
                "{e}"
            );
            assert!(!d.files.contains_key(&epoch2), "no epoch after the race");
            assert_eq!(d.files, before, "the race wrote nothing");
        }
    }
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
