//! lease-core's one diagnosis (`lease_core::diagnose`): what each fact means and the next
//! step, as `status`, `doctor` and `runlease run` rely on it.

mod common;

use common::*;
use lease_core::Code;
use lease_core::diagnose::*;
use lease_core::mem::MemDisk;

fn written(generation: u64, failed: bool, detail: Option<&str>) -> RunJsonFacts {
    RunJsonFacts::Written {
        failed,
        generation,
        detail: detail.map(str::to_string),
    }
}

fn codes(f: &[Finding]) -> Vec<&'static str> {
    f.iter().map(|f| f.code.as_str()).collect()
}

#[test]
fn a_free_run_is_claimed_and_a_free_run_the_next_claim_refuses_needs_doctor_first() {
    let mut disk = MemDisk::new();
    let lease = claim(&mut disk, "a", 10, 0).unwrap();
    release(&mut disk, &lease, 10).unwrap();
    let mut facts = Facts::of_view(status(&mut disk, 20));
    assert_eq!(next_step(&facts), Next::Claim);
    assert_eq!(codes(&diagnose(&facts)), ["OK"]);

    // run.json written by generation 2 (the release): the chain reaches it.
    facts.run_json = written(2, false, None);
    assert_eq!(next_step(&facts), Next::Claim);

    // Written by generation 5: the chain was cut back (PROTOCOL: CHAIN_BROKEN).
    facts.run_json = written(5, false, None);
    assert_eq!(next_step(&facts), Next::DoctorBeforeRun);
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["BROKEN_CHAIN"]);
    assert_eq!(f[0].severity, Severity::Error);
    assert_eq!(f[0].next, Next::RestoreLease);

    // The last open refused the store: doctor first, and the finding names the code.
    facts.run_json = written(2, true, Some("STORE_BEHIND_SEAL: run r: store head 2 < 3"));
    assert_eq!(next_step(&facts), Next::DoctorBeforeRun);
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["STORE_BEHIND_SEAL"]);
    assert_eq!(f[0].next, Next::RestoreStore);

    // A transient refusal (STORE_BUSY) or another failure is no store refusal.
    facts.run_json = written(2, true, Some("STORE_BUSY: in use"));
    assert_eq!(next_step(&facts), Next::Claim);
    facts.run_json = written(2, true, Some("STORE_BEHIND_SEALED: not a code"));
    assert_eq!(store_refusal(&facts.run_json), None);

    // An unreadable run.json: doctor first, INVALID_RECORD with its own next step.
    facts.run_json = RunJsonFacts::Invalid {
        message: "run.json: bad".into(),
    };
    assert_eq!(next_step(&facts), Next::DoctorBeforeRun);
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["INVALID_RECORD"]);
    assert_eq!(f[0].next, Next::RepairRunJson);
}

#[test]
fn a_stale_owner_is_taken_over_exactly_but_only_after_the_errors_are_repaired() {
    let mut disk = MemDisk::new();
    claim(&mut disk, "a", 10, 0).unwrap();
    // Default policy: stale after 30 s without a heartbeat.
    let view = disk
        .run(
            &mut lease_core::ops::StatusView::read(run_id(), t(600_000), false),
            &all_alive,
        )
        .unwrap();
    assert_eq!(view.status.name(), "stale");
    let h = view.head.clone().unwrap();
    let mut facts = Facts::of_view(view);
    let take = Next::Takeover {
        owner_id: "a".into(),
        heartbeat_at: h.heartbeat_at().to_string(),
    };
    assert_eq!(next_step(&facts), take);
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["STALE_OWNER"]);
    assert_eq!(f[0].next, take);

    // A broken event chain: the takeover would be refused (it verifies first), so the
    // owner's next step says to repair first.
    facts.verify = VerifyFacts::Failed {
        code: Code::ChainBroken,
        message: "event chain broken at 3".into(),
    };
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["STALE_OWNER", "BROKEN_CHAIN"]);
    assert_eq!(f[0].next, Next::RepairFirst(Box::new(take.clone())));
    assert_eq!(f[1].next, Next::VerifyAndRestore);
}

/// Liveness as an authority that keeps leases (etcd) answers it: nothing observed of the
/// owner's host, only its lease.
fn authority_lease(
    lease: lease_core::ops::AuthorityLease,
) -> impl Fn(&lease_core::Holder) -> lease_core::ops::LivenessEvidence {
    move |h| lease_core::ops::LivenessEvidence {
        observer_boot_id: h.boot_id.clone(),
        process: lease_core::ops::ProcessState::Unknown,
        owner_lock: lease_core::ops::LockEvidence::Unknown,
        lease,
    }
}

// PROTOCOL §7.8, §11 (issue #17): an owner whose lease the authority holds alive is active
// whatever this host's wall clock says of its heartbeat, and the next step is to wait (a
// takeover would be refused until that lease expires); once it expired the owner is dead.
#[test]
fn an_owner_whose_authority_lease_lives_is_waited_for_whatever_the_wall_clock_says() {
    use lease_core::ops::{AuthorityLease, Status, StatusView};
    let alive = authority_lease(AuthorityLease::Alive);
    let expired = authority_lease(AuthorityLease::Expired);
    let mut disk = MemDisk::new();
    claim(&mut disk, "a", 10, 100_000).unwrap();
    let mut read =
        |now: u64, live: &dyn Fn(&lease_core::Holder) -> lease_core::ops::LivenessEvidence| {
            disk.run(&mut StatusView::read(run_id(), t(now), true), live)
                .unwrap()
        };
    // Older than stale_after by this clock (the owner's runs slow), and dated ahead of it
    // (the owner's runs fast): active, wait for the lease.
    for now in [100_000 + 600_000, 0] {
        let view = read(now, &alive);
        assert!(view.lease_alive());
        assert_eq!(view.status, Status::Active, "{now}");
        assert!(
            view.liveness
                .clone()
                .unwrap()
                .unwrap_err()
                .contains("etcd lease")
        );
        let facts = Facts::of_view(view);
        assert_eq!(next_step(&facts), Next::WaitForLease, "{now}");
        assert!(!codes(&diagnose(&facts)).contains(&"STALE_OWNER"));
    }
    // Fresh by this clock too: a plain wait.
    let view = read(100_500, &alive);
    assert_eq!(view.status, Status::Active);
    assert_eq!(next_step(&Facts::of_view(view)), Next::Wait);
    // The lease expired: dead, retire (at once, whatever the wall clock says).
    for now in [100_500, 100_000 + 600_000, 0] {
        let view = read(now, &expired);
        assert!(!view.lease_alive());
        assert_eq!(view.status, Status::Dead, "{now}");
        assert_eq!(next_step(&Facts::of_view(view)), Next::Retire, "{now}");
    }
    // Without an authority's lease the wall clock still calls a silent owner stale (advice
    // only: the takeover watches on its own clock).
    let view = read(100_000 + 600_000, &all_alive);
    assert_eq!(view.authority_lease, Some(AuthorityLease::NotKept));
    assert_eq!(view.status, Status::Stale);
}

#[test]
fn a_dead_owner_is_retired_and_an_unproven_command_blocks_the_run() {
    let mut disk = MemDisk::new();
    claim(&mut disk, "a", 10, 0).unwrap();
    let view = disk
        .run(
            &mut lease_core::ops::StatusView::read(run_id(), t(1_000), true),
            &all_dead,
        )
        .unwrap();
    assert_eq!(view.status.name(), "dead");
    let mut facts = Facts::of_view(view);
    assert_eq!(next_step(&facts), Next::Retire);
    assert_eq!(codes(&diagnose(&facts)), ["DEAD_OWNER"]);

    facts.commands = CommandFacts::Unproven {
        message: "RUN_COMMAND_UNPROVEN: commands/x.json names live process 7".into(),
    };
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["DEAD_OWNER", "COMMAND_UNPROVEN"]);
    assert_eq!(f[0].next, Next::RepairFirst(Box::new(Next::Retire)));
    assert_eq!(f[1].next, Next::StopOrRemoveRecord);
    assert_eq!(f[1].severity, Severity::Error);
}

#[test]
fn a_missing_store_is_reported_once_when_run_json_names_the_same_refusal() {
    let mut disk = MemDisk::new();
    let lease = claim(&mut disk, "a", 10, 0).unwrap();
    disk.run(
        &mut lease_core::ops::Release::new(lease_core::ops::ReleaseParams {
            lease: lease.clone(),
            now: t(10),
            seal: Some(lease_core::Seal {
                store_id: id("store-1"),
                sequence: 4,
                generation: lease.generation,
            }),
        }),
        &all_alive,
    )
    .unwrap();
    let mut facts = Facts::of_view(status(&mut disk, 20));
    // The store file is there: nothing to say.
    facts.store_present = Some(true);
    assert_eq!(codes(&diagnose(&facts)), ["OK"]);
    assert_eq!(next_step(&facts), Next::Claim);
    // Gone while the chain names a seal: STORE_MISSING, naming the seal; and the next
    // step is doctor, not "claim it" (the claim's preflight refuses it, issue #17).
    facts.store_present = Some(false);
    assert_eq!(next_step(&facts), Next::DoctorBeforeRun);
    assert!(matches!(
        named_store(&facts.view.head.as_ref().unwrap().epoch),
        Some(NamedStore::Sealed { sequence: 4, .. })
    ));
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["STORE_MISSING"]);
    match &f[0].subject {
        Subject::StoreMissing {
            named: NamedStore::Sealed { sequence, .. },
            ..
        } => assert_eq!(*sequence, 4),
        other => panic!("{other:?}"),
    }
    // The last open refused with STORE_MISSING too: still one finding.
    facts.run_json = written(2, true, Some("STORE_MISSING: gone"));
    assert_eq!(codes(&diagnose(&facts)), ["STORE_MISSING"]);
    // Not looked at: no finding (not checked is never "fine" nor "missing").
    facts.store_present = None;
    facts.run_json = RunJsonFacts::Absent;
    assert_eq!(codes(&diagnose(&facts)), ["OK"]);
    assert_eq!(next_step(&facts), Next::Claim);
}

#[test]
fn chain_behind_names_both_generations() {
    assert_eq!(chain_behind(3, 3), None);
    assert_eq!(chain_behind(2, 3), None);
    let m = chain_behind(4, 0).unwrap();
    assert!(
        m.contains("generation 4") && m.contains("has no epoch"),
        "{m}"
    );
    let m = chain_behind(9, 3).unwrap();
    assert!(
        m.contains("generation 9") && m.contains("ends at generation 3"),
        "{m}"
    );
}

#[test]
fn an_unreadable_head_is_an_invalid_record_not_a_chain_that_ends_early() {
    // run.json says generation 1 wrote it; the head epoch cannot be read, so the view has
    // no head. The finding is the record, never "the chain has no epoch: restore lease/".
    let mut disk = MemDisk::new();
    claim(&mut disk, "a", 10, 0).unwrap();
    let mut view = status(&mut disk, 20);
    view.status = lease_core::ops::Status::Invalid(lease_core::LeaseError::RecordInvalid {
        kind: lease_core::RecordKind::Epoch,
        run: "run-1".into(),
        file: Some("lease/epochs/00000000000000000001.json".into()),
        detail: "torn".into(),
    });
    view.head = None;
    let mut facts = Facts::of_view(view);
    facts.run_json = written(1, false, None);
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["INVALID_RECORD"]);
    assert_eq!(next_step(&facts), Next::DoctorDoNotTakeOver);
}

// Issue #28: a next step makes progress. The temp-file clean-up removes only temp files
// older than the grace, so doctor names it only when there is one; younger ones alone are
// reported with nothing to run now (it would remove none, and the same step came back).
#[test]
fn the_temp_file_clean_up_is_named_only_when_it_would_remove_one() {
    let mut disk = MemDisk::new();
    let lease = claim(&mut disk, "a", 10, 0).unwrap();
    release(&mut disk, &lease, 10).unwrap();
    let mut facts = Facts::of_view(status(&mut disk, 20));
    facts.temp_files = (2, 0);
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["ORPHAN_TEMP_FILES"]);
    assert_eq!(f[0].next, Next::WaitTempFiles);
    facts.temp_files = (2, 1);
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["ORPHAN_TEMP_FILES"]);
    assert_eq!(f[0].next, Next::CleanTemp);
    // Temp files never block the run: status still names the claim.
    assert_eq!(next_step(&facts), Next::Claim);
}

// Issue #28: an open cutoff (the head superseded a generation whose cutoff was never
// written) is a finding with the step that closes it: the next change of owner, which
// finalizes it first (PROTOCOL §7.0 GATE), so the step status names for the run.
#[test]
fn an_open_cutoff_is_reported_with_the_change_of_owner_that_finalizes_it() {
    let mut disk = MemDisk::new();
    let lease = claim(&mut disk, "a", 10, 0).unwrap();
    release(&mut disk, &lease, 10).unwrap();
    let view = status(&mut disk, 20);
    let head = view.head.clone().unwrap();
    assert_eq!(open_cutoff_of(&head.epoch, |_| true), None);
    let open = open_cutoff_of(&head.epoch, |_| false).unwrap();
    assert_eq!((open.retired.get(), open.by.get()), (1, 2));
    let mut facts = Facts::of_view(view);
    facts.open_cutoff = Some(open);
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["OPEN_CUTOFF"]);
    assert_eq!(f[0].severity, Severity::Warning);
    assert_eq!(f[0].next, Next::Claim);
    assert_eq!(next_step(&facts), Next::Claim);
    // While the claim would be refused, the repair comes first.
    facts.run_json = written(5, false, None);
    let f = diagnose(&facts);
    let open = f
        .iter()
        .find(|f| f.code == FindingCode::OpenCutoff)
        .unwrap();
    assert_eq!(open.next, Next::RepairFirst(Box::new(Next::Claim)));
}

/// Issue #29: a cgroup named like the run's that runlease leaves alone is a warning with a
/// step of its own (never "nothing to do", never a claim refused over it); more command
/// records than runlease judges is an error whose step moves them aside, also when only
/// the admission rule's refusal reports it (`status`).
#[test]
fn a_cgroup_left_alone_is_named_and_too_many_records_are_an_error() {
    let mut disk = MemDisk::new();
    let lease = claim(&mut disk, "a", 10, 0).unwrap();
    release(&mut disk, &lease, 10).unwrap();
    let mut facts = Facts::of_view(status(&mut disk, 20));
    facts.cgroups_left_alone = vec![CgroupLeftAlone {
        path: "/sys/fs/cgroup/runlease-0123456789abcdef-1".into(),
        generation: 1,
        uid: 65534,
        members: vec![42],
        why: "it belongs to uid 65534, not to this owner's uid 0".into(),
    }];
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["CGROUP_NOT_PROVEN"]);
    assert_eq!(f[0].severity, Severity::Warning);
    assert_eq!(
        f[0].next,
        Next::InspectCgroup {
            path: "/sys/fs/cgroup/runlease-0123456789abcdef-1".into()
        }
    );
    // Nothing refuses the run over it: the next step is still the claim.
    assert_eq!(next_step(&facts), Next::Claim);

    facts.cgroups_left_alone.clear();
    let message = "RUN_COMMAND_RECORDS_OVER_LIMIT: run a: commands holds 5000".to_string();
    facts.claim_refusal = Some((Code::RunCommandRecordsOverLimit, message.clone()));
    let f = diagnose(&facts);
    assert_eq!(codes(&f), ["RUN_COMMAND_RECORDS_OVER_LIMIT"]);
    assert_eq!(f[0].next, Next::MoveCommandRecordsAside);
    assert_eq!(f[0].severity, Severity::Error);
    assert_eq!(next_step(&facts), Next::DoctorBeforeRun);
    // Reported once when the audit says it too.
    facts.commands = CommandFacts::OverLimit { message };
    assert_eq!(codes(&diagnose(&facts)), ["RUN_COMMAND_RECORDS_OVER_LIMIT"]);
}
