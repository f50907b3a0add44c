//! Paused, SIGKILLed and retired owners: fenced or retired, and nothing late counts.

use crate::{claim, counted, id, me, new_run, spawn_child, t, takeover};
use lease_core::LeaseOps;
use lease_core::ops::Status;
use lease_core::*;
use std::time::{Duration, Instant};

// PROTOCOL §7.2, §7.3, §7.6, I3, I8
#[test]
fn a_paused_owner_is_fenced_on_heartbeat_append_and_release_and_nothing_it_writes_counts() {
    let dir = tempfile::tempdir().unwrap();
    let (_, run) = new_run(dir.path(), "paused");
    let old = claim(&run, "old", 0).unwrap();
    run.append(
        &old,
        lease_core::ops::AppendParams {
            event_type: id("e"),
            payload: serde_json::json!(1),
            now: t(1),
            tail_hint: None,
        },
    )
    .unwrap();
    // The owner "pauses" (stops heartbeating); another takes over after staleness.
    let new = takeover(&run, "new", 60_000).unwrap();
    // It resumes: every operation reports fenced.
    assert_eq!(
        run.heartbeat(&old, t(60_001), 1, None)
            .unwrap_err()
            .code()
            .as_str(),
        "FENCED"
    );
    let e = run
        .append(
            &old,
            lease_core::ops::AppendParams {
                event_type: id("e"),
                payload: serde_json::json!(2),
                now: t(60_002),
                tail_hint: None,
            },
        )
        .unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED");
    assert_eq!(
        run.release(lease_core::ops::ReleaseParams {
            lease: old.clone(),
            now: t(60_003),
            seal: None
        })
        .unwrap_err()
        .code()
        .as_str(),
        "FENCED"
    );
    let s = run.status(t(60_004), false).unwrap();
    assert_eq!(s.status, Status::Active);
    assert_eq!(s.head.unwrap().epoch.owner_id, new.owner_id);
    assert_eq!(counted(&run, 60_005), vec![1]);
}

// PROTOCOL §7.5, §11
#[test]
fn a_sigkilled_owner_is_retired_at_once_and_a_live_one_never_is() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "dead");
    let mut child = spawn_child("hold", &path);
    // Wait until the child holds the run.
    let start = Instant::now();
    loop {
        let s = run.status(t(0), false).unwrap();
        if s.status == Status::Active {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "child never claimed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Alive (holds the owner lock, pid and start time match): never retired.
    let e = run
        .retire(lease_core::ops::RetireParams {
            run_id: run.run_id().clone(),
            owner_id: id("retirer"),
            holder: me(),
            policy: TimingPolicy::default(),
            now: t(1),
            expect: None,
        })
        .unwrap_err();
    assert_eq!(e.code().as_str(), "RETIRE_REFUSED_NOT_DEAD", "{e}");
    // A forged record whose pid matches the live child but whose start time does not: the
    // pid evidence says "dead", the held kernel lock says otherwise. Never retired.
    {
        let head = run.status(t(1), false).unwrap().head.unwrap();
        let mut forged = head.epoch.clone();
        forged.holder.start_time += 1;
        let bytes = encode(&forged).unwrap();
        let epoch_path = path.join(FileRef::Epoch(head.generation()).path());
        let original = std::fs::read(&epoch_path).unwrap();
        std::fs::write(&epoch_path, &bytes).unwrap();
        let e = run
            .retire(lease_core::ops::RetireParams {
                run_id: run.run_id().clone(),
                owner_id: id("retirer"),
                holder: me(),
                policy: TimingPolicy::default(),
                now: t(2),
                expect: None,
            })
            .unwrap_err();
        assert_eq!(e.code().as_str(), "RETIRE_REFUSED_NOT_DEAD", "{e}");
        std::fs::write(&epoch_path, original).unwrap();
    }
    // SIGKILL: retired at once, no waiting for staleness.
    child.kill().unwrap();
    child.wait().unwrap();
    let r = run
        .retire(lease_core::ops::RetireParams {
            run_id: run.run_id().clone(),
            owner_id: id("retirer"),
            holder: me(),
            policy: TimingPolicy::default(),
            now: t(3),
            expect: None,
        })
        .unwrap();
    assert_eq!(r.generation.get(), r.retired.get() + 1);
    assert_eq!(run.status(t(4), false).unwrap().status, Status::Free);
}

// PROTOCOL §7.6 step 1, §7.9 step 6, I4
#[test]
fn a_retired_owners_late_append_never_counts_even_after_corrupting_the_newest_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let (path, run) = new_run(dir.path(), "late");
    let old = claim(&run, "old", 0).unwrap();
    run.append(
        &old,
        lease_core::ops::AppendParams {
            event_type: id("e"),
            payload: serde_json::json!(1),
            now: t(1),
            tail_hint: None,
        },
    )
    .unwrap();
    let new = takeover(&run, "new", 60_000).unwrap();
    assert_eq!(
        run.append(
            &old,
            lease_core::ops::AppendParams {
                event_type: id("late"),
                payload: serde_json::json!(2),
                now: t(60_001),
                tail_hint: None
            }
        )
        .unwrap_err()
        .code()
        .as_str(),
        "FENCED"
    );
    // Delete the newest epoch by hand: the recorded cutoff still applies.
    let newest = path.join(FileRef::Epoch(new.generation).path());
    let saved = std::fs::read(&newest).unwrap();
    std::fs::remove_file(&newest).unwrap();
    assert_eq!(
        run.append(
            &old,
            lease_core::ops::AppendParams {
                event_type: id("late"),
                payload: serde_json::json!(3),
                now: t(60_002),
                tail_hint: None
            }
        )
        .unwrap_err()
        .code()
        .as_str(),
        "FENCED"
    );
    assert_eq!(counted(&run, 60_003), vec![1]);
    // Corrupt it instead: a typed error naming the file, never "counts". (Written 0600 as
    // runlease would: a record others may read is refused before it is read, 77.)
    std::fs::write(&newest, b"{\"version\":\"runlease/epoch/1\"}\n").unwrap();
    std::fs::set_permissions(&newest, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let e = run.read_events(None).unwrap_err();
    assert_eq!(e.code().as_str(), "RECORD_INVALID");
    assert!(e.to_string().contains("lease/epochs/"), "{e}");
    std::fs::write(&newest, saved).unwrap();
    let view = run.read_events(None).unwrap();
    assert!(
        view.events
            .iter()
            .all(|e| e.event.sequence.get() == 1 || !e.standing.counts())
    );
}
