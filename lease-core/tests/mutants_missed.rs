//! Tests written for the mutants the one-off `cargo mutants` run of issue #30 found
//! missed: each pins a behaviour no other test checked. The step machines are driven by
//! small scripted drivers, so each test sets up exactly the answers that matter.

use lease_core::ops::*;
use lease_core::*;

fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

fn run_id() -> RunId {
    RunId::new("run-1").unwrap()
}

fn holder(pid: u32) -> Holder {
    Holder {
        host: id("host-a"),
        boot_id: id("boot-a"),
        pid,
        start_time: 1000 + u64::from(pid),
    }
}

fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_796_169_600_000 + ms).unwrap()
}

fn claim_op() -> Claim {
    Claim::new(ClaimParams {
        run_id: run_id(),
        owner_id: id("claimer"),
        holder: holder(7),
        policy: TimingPolicy::default(),
        now: t(0),
        store_floor: None,
    })
}

/// Drive a claim of a run whose listing of `lease/epochs/` is always empty, except that
/// the first `lost_creates` creates of epoch 1 lose (`AlreadyExists`) and the first
/// `lost_rechecks` RECHECKs after a won create list a generation above it. Gives up (the
/// outer `Err`) after 200 requests, so a claim that never stops retrying fails the test
/// instead of hanging it.
fn claim_racing(lost_creates: u32, lost_rechecks: u32) -> Result<OwnedLease, LeaseError> {
    let (mut creates, mut rechecks, mut requests) = (lost_creates, lost_rechecks, 0u32);
    let mut after_create = false;
    drive_split(&mut claim_op(), |req| {
        requests += 1;
        if requests > 200 {
            return Err(format!("still retrying after {requests} requests"));
        }
        Ok(match req {
            Request::List(Dir::Epochs) if after_create => {
                after_create = false;
                if rechecks > 0 {
                    rechecks -= 1;
                    let two = Generation::new(2).unwrap();
                    Response::Listing(vec![FileRef::Epoch(Generation::FIRST), FileRef::Epoch(two)])
                } else {
                    Response::Listing(vec![])
                }
            }
            Request::List(_) => Response::Listing(vec![]),
            Request::CreateExclusive(FileRef::Epoch(_), _) if creates > 0 => {
                creates -= 1;
                Response::AlreadyExists
            }
            Request::CreateExclusive(FileRef::Epoch(_), _) => {
                after_create = true;
                Response::Created
            }
            other => return Err(format!("unexpected request {other:?}")),
        })
    })
    .unwrap()
}

#[test]
fn a_claim_retries_eight_lost_create_races_and_gives_up_on_the_ninth() {
    assert_eq!(claim_racing(0, 0).unwrap().generation, Generation::FIRST);
    assert_eq!(claim_racing(8, 0).unwrap().generation, Generation::FIRST);
    let e = claim_racing(9, 0).unwrap_err();
    assert!(
        matches!(e, LeaseError::TakeoverRace { .. }),
        "expected TAKEOVER_RACE, got {e:?}"
    );
    assert!(e.to_string().contains("lost 8 claim races"), "{e}");
}

#[test]
fn a_claim_retries_eight_lost_rechecks_and_gives_up_on_the_ninth() {
    assert_eq!(claim_racing(0, 8).unwrap().generation, Generation::FIRST);
    let e = claim_racing(0, 9).unwrap_err();
    assert!(
        matches!(e, LeaseError::TakeoverRace { .. }),
        "expected TAKEOVER_RACE, got {e:?}"
    );
}

fn held() -> Box<HeldBy> {
    Box::new(HeldBy {
        generation: Generation::FIRST,
        owner_id: "owner".into(),
        host: "host-a".into(),
        pid: 7,
        since: t(0),
        heartbeat_at: t(0),
        heartbeat_count: 0,
    })
}

#[test]
fn refine_claim_refusal_names_a_dead_holder_and_only_a_dead_one() {
    let active = || LeaseError::RunAlreadyActive {
        run: "run-1".into(),
        held: held(),
    };
    let stale = || LeaseError::RunStaleRequiresTakeover {
        run: "run-1".into(),
        held: held(),
        age_ms: 60_000,
        stale_after_ms: 30_000,
    };
    for refusal in [active(), stale()] {
        assert_eq!(refine_claim_refusal(refusal.clone(), || false), refusal);
        match refine_claim_refusal(refusal, || true) {
            LeaseError::RunDeadRequiresRetirement { run, held: h } => {
                assert_eq!((run.as_str(), h), ("run-1", held()));
            }
            other => panic!("expected RUN_DEAD_REQUIRES_RETIREMENT, got {other:?}"),
        }
    }
    // Any other error is returned as it is, and the holder is not even asked about.
    let fenced = LeaseError::Fenced {
        run: "run-1".into(),
        generation: Generation::FIRST,
        detail: "superseded".into(),
    };
    let e = refine_claim_refusal(fenced.clone(), || panic!("asked about a holder"));
    assert_eq!(e, fenced);
}

fn claim_as(owner: &str, pid: u32) -> Claim {
    Claim::new(ClaimParams {
        run_id: run_id(),
        owner_id: id(owner),
        holder: holder(pid),
        policy: TimingPolicy::default(),
        now: t(0),
        store_floor: None,
    })
}

fn alive(h: &Holder) -> LivenessEvidence {
    LivenessEvidence {
        observer_boot_id: id("boot-a"),
        process: ProcessState::Running {
            start_time: h.start_time,
        },
        owner_lock: LockEvidence::Held,
        lease: AuthorityLease::NotKept,
    }
}

/// ADOPTION (PROTOCOL §7.0): a claim retried by the very process whose earlier attempt
/// created the head (same owner id and holder) gets that lease back; the same owner id in
/// another process, or another owner in the same process, is refused.
#[test]
fn a_retried_claim_adopts_its_own_epoch_and_only_its_own() {
    let mut d = lease_core::mem::MemDisk::new();
    let first = d.run(&mut claim_as("a", 1), &alive).unwrap();
    assert_eq!(d.run(&mut claim_as("a", 1), &alive).unwrap(), first);
    for (owner, pid) in [("a", 2), ("b", 1)] {
        let e = d.run(&mut claim_as(owner, pid), &alive).unwrap_err();
        assert!(
            matches!(e, LeaseError::RunAlreadyActive { .. }),
            "{owner}/{pid}: expected RUN_ALREADY_ACTIVE, got {e:?}"
        );
    }
}

fn lease_of(owner: &str) -> OwnedLease {
    OwnedLease {
        run_id: run_id(),
        generation: Generation::FIRST,
        owner_id: id(owner),
        holder: holder(1),
        policy: TimingPolicy::default(),
        epoch_hash: Digest::of(b"epoch 1"),
    }
}

/// The answer to a heartbeat's write must be `Done`: anything else is a protocol
/// violation, never taken as the start of RECHECK.
#[test]
fn a_heartbeat_refuses_a_wrong_answer_to_its_write() {
    for wrong in [Response::Created, Response::Listing(vec![])] {
        let mut hb = Heartbeat::new(&lease_of("a"), t(1), 1).unwrap();
        assert!(matches!(hb.next(None), Step::Io(Request::WriteBeat { .. })));
        match hb.next(Some(wrong.clone())) {
            Step::Done(Err(LeaseError::ProtocolViolation { .. })) => {}
            other => panic!("{wrong:?}: expected PROTOCOL_VIOLATION, got {other:?}"),
        }
    }
}

/// A release by a lease whose epoch hash is not the head's (same generation) changes
/// nothing and reports `CHAIN_BROKEN`.
#[test]
fn a_release_with_another_epoch_hash_is_chain_broken_and_changes_nothing() {
    let mut d = lease_core::mem::MemDisk::new();
    let lease = d.run(&mut claim_as("a", 1), &alive).unwrap();
    let forged = OwnedLease {
        epoch_hash: Digest::of(b"not the head"),
        ..lease.clone()
    };
    let mut release = |l: &OwnedLease| {
        d.run(
            &mut Release::new(ReleaseParams {
                lease: l.clone(),
                now: t(2),
                seal: None,
            }),
            &alive,
        )
    };
    let e = release(&forged).unwrap_err();
    assert!(
        matches!(e, LeaseError::ChainBroken { .. }),
        "expected CHAIN_BROKEN, got {e:?}"
    );
    // Nothing changed: the real lease still releases generation 1 into generation 2.
    assert_eq!(release(&lease).unwrap(), Generation::new(2).unwrap());
}

/// A takeover of owner "a" (which beat `beats_before` times, 0 or 1, before it was
/// observed) by "b"; with `beat_between`, "a" writes its next beat after the takeover's
/// commit and before its step-11 read of that beat.
fn takeover_of_a(beats_before: u64, beat_between: bool) -> (OwnedLease, Option<Preempted>) {
    let mut d = lease_core::mem::MemDisk::new();
    let old = d.run(&mut claim_as("a", 1), &alive).unwrap();
    for n in 1..=beats_before {
        d.run(&mut Heartbeat::new(&old, t(n), n).unwrap(), &alive)
            .unwrap();
    }
    let view = d
        .run(&mut StatusView::read(run_id(), t(5), false), &alive)
        .unwrap();
    let policy = TimingPolicy::default();
    let mut op = Takeover::new(TakeoverParams {
        run_id: run_id(),
        owner_id: id("b"),
        holder: holder(2),
        policy,
        now: t(6),
        expect: Expectation::of(view.head.as_ref().unwrap()),
        trigger: TakeoverTrigger::Operator {
            watched_unchanged_ms: policy.stale_after_ms() + 1,
        },
    });
    let mut committed = false;
    let lease = drive(&mut op, |req| {
        if matches!(req, Request::CreateExclusive(FileRef::Epoch(g), _) if g.get() == 2) {
            committed = true;
        }
        if beat_between && committed && req == Request::Read(FileRef::Beat(Generation::FIRST)) {
            // Its heartbeat's RECHECK fences it, but the beat is written.
            let n = beats_before + 1;
            let e = d
                .run(&mut Heartbeat::new(&old, t(7), n).unwrap(), &alive)
                .unwrap_err();
            assert!(matches!(e, LeaseError::Fenced { .. }), "{e:?}");
        }
        Ok::<_, LeaseError>(d.perform(req, &alive))
    })
    .unwrap();
    assert_eq!(lease.generation, Generation::new(2).unwrap());
    (lease, op.preempted().cloned())
}

/// PROTOCOL §7.4 step 11 (OQ-5): a takeover reports the owner it may have replaced while
/// live (the owner's beat changed after the commit), with that owner's self-fence bound;
/// and reports nothing when the beat did not change (absent or the same beat).
#[test]
fn a_takeover_reports_an_owner_that_beat_after_its_commit() {
    let replaced = Preempted {
        generation: Generation::FIRST,
        owner_id: id("a"),
        self_fence_after_ms: TimingPolicy::default().self_fence_after_ms(),
    };
    for beats_before in [0, 1] {
        assert_eq!(takeover_of_a(beats_before, false).1, None, "{beats_before}");
        assert_eq!(
            takeover_of_a(beats_before, true).1,
            Some(replaced.clone()),
            "{beats_before}"
        );
    }
}
