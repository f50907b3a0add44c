//! `OwnedRun` (issue #18): one guard for the lease and the owner lock; its heartbeat
//! numbers its beats and applies the self-fence rule.

use lease_core::ops::Status;
use lease_core::{
    HeartbeatDurability, HeartbeatRecord, Identity, LeaseOps, Timestamp, TimingPolicy,
};
use lease_fs::{OwnedRun, RunDir, WallClock};
use std::time::Duration;

fn fast() -> TimingPolicy {
    TimingPolicy::from_millis(100, 300, 1000, HeartbeatDurability::Local).unwrap()
}

fn beat(path: &std::path::Path, g: u64) -> HeartbeatRecord {
    let b = std::fs::read(path.join(format!("lease/beats/{g:020}.json"))).unwrap();
    lease_core::decode(lease_core::beat::newest_record(&b).unwrap()).unwrap()
}

#[test]
fn the_guard_holds_the_lock_numbers_its_beats_and_fences_itself_when_late() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("owned");
    RunDir::create(&path).unwrap();
    let mut run = OwnedRun::claim(
        &path,
        Identity::new("w1").unwrap(),
        fast(),
        Timestamp::now().unwrap(),
    )
    .unwrap();
    let g = run.lease().generation.get();
    // Our own lock is not another owner's: the run is active, not dead or stale.
    let view = run.dir().status(Timestamp::now().unwrap(), true).unwrap();
    assert_eq!(view.status, Status::Active, "{view:?}");
    // The lock refuses a second owner on this host before anything is written.
    let before = std::fs::read_dir(path.join("lease/epochs"))
        .unwrap()
        .count();
    let e = OwnedRun::claim(
        &path,
        Identity::new("w2").unwrap(),
        fast(),
        Timestamp::now().unwrap(),
    )
    .unwrap_err();
    assert_eq!(e.code().as_str(), "OWNER_LOCK_HELD", "{e}");
    assert_eq!(
        std::fs::read_dir(path.join("lease/epochs"))
            .unwrap()
            .count(),
        before
    );

    // Beats are numbered by the guard.
    run.report_store_head(7);
    run.heartbeat(Timestamp::now().unwrap()).unwrap();
    run.heartbeat(Timestamp::now().unwrap()).unwrap();
    assert_eq!(run.heartbeats(), 2);
    let b = beat(&path, g);
    assert_eq!((b.count, b.store_head), (2, Some(7)));

    // Late past self_fence_after: nothing is written, FENCED, for good.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(run.time_to_self_fence(), Duration::ZERO);
    let e = run.heartbeat(Timestamp::now().unwrap()).unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED", "{e}");
    assert!(e.to_string().contains("the lease lapsed"), "{e}");
    assert_eq!(beat(&path, g).count, 2, "a late beat wrote nothing");
    assert_eq!(run.check_live().unwrap_err().code().as_str(), "FENCED");
    let e = run.release(Timestamp::now().unwrap(), None).unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED");
    // The release wrote nothing: the head is still our (now stale-to-be) epoch.
    let view = RunDir::open(&path)
        .unwrap()
        .status(Timestamp::now().unwrap(), false)
        .unwrap();
    assert_eq!(view.head.unwrap().generation().get(), g);
}

#[test]
fn a_released_guard_frees_the_run_and_its_lock() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("released");
    RunDir::create(&path).unwrap();
    let run = OwnedRun::claim(
        &path,
        Identity::new("w1").unwrap(),
        fast(),
        Timestamp::now().unwrap(),
    )
    .unwrap();
    run.release(Timestamp::now().unwrap(), None).unwrap();
    let again = OwnedRun::claim(
        &path,
        Identity::new("w2").unwrap(),
        fast(),
        Timestamp::now().unwrap(),
    )
    .unwrap();
    assert_eq!(
        again.lease().generation.get(),
        3,
        "claim 1, release 2, claim 3"
    );
    again.release(Timestamp::now().unwrap(), None).unwrap();
}

#[test]
fn heartbeat_number_zero_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = RunDir::create(&tmp.path().join("zero")).unwrap();
    let lease = dir
        .claim(lease_core::ops::ClaimParams {
            run_id: dir.run_id().clone(),
            owner_id: Identity::new("w").unwrap(),
            holder: lease_fs::this_holder().unwrap(),
            policy: fast(),
            now: Timestamp::now().unwrap(),
            store_floor: None,
        })
        .unwrap();
    let e = dir
        .heartbeat(&lease, Timestamp::now().unwrap(), 0, None)
        .unwrap_err();
    assert_eq!(e.code().as_str(), "ARGUMENT_INVALID", "{e}");
}

/// A claim refused over a holder proved dead says so: retire it (not "already active").
#[test]
fn a_claim_over_a_dead_holder_says_it_requires_retirement() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = RunDir::create(&tmp.path().join("dead")).unwrap();
    let claim = |owner: &str, holder: lease_core::Holder| lease_core::ops::ClaimParams {
        run_id: dir.run_id().clone(),
        owner_id: Identity::new(owner).unwrap(),
        holder,
        policy: fast(),
        now: Timestamp::now().unwrap(),
        store_floor: None,
    };
    // A holder on this boot whose process is gone (no such pid), nobody holding the lock.
    let mut gone = lease_fs::this_holder().unwrap();
    gone.pid = (3_000_000..4_000_000)
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .unwrap();
    dir.claim(claim("ghost", gone)).unwrap();
    let e = dir
        .claim(claim("next", lease_fs::this_holder().unwrap()))
        .unwrap_err();
    assert_eq!(e.code().as_str(), "RUN_DEAD_REQUIRES_RETIREMENT", "{e}");
    // A live holder is still "already active".
    let tmp2 = tempfile::tempdir().unwrap();
    let dir2 = RunDir::create(&tmp2.path().join("live")).unwrap();
    let held = OwnedRun::claim(
        dir2.root(),
        Identity::new("a").unwrap(),
        fast(),
        Timestamp::now().unwrap(),
    )
    .unwrap();
    let e = dir2
        .claim(lease_core::ops::ClaimParams {
            run_id: dir2.run_id().clone(),
            owner_id: Identity::new("b").unwrap(),
            holder: lease_fs::this_holder().unwrap(),
            policy: fast(),
            now: Timestamp::now().unwrap(),
            store_floor: None,
        })
        .unwrap_err();
    assert_eq!(e.code().as_str(), "RUN_ALREADY_ACTIVE", "{e}");
    drop(held);
}

/// Issue #34: `OwnedRun::append` applies the self-fence rule (the misuse: 200
/// appends through `dir()` were accepted after the deadline, then the owner's own release
/// was refused). Before the deadline it appends and chains its hint; past it nothing is
/// written and the answer is `FENCED`, sticky; `heartbeat_due` turns true after the
/// heartbeat interval.
#[test]
fn append_checks_the_self_fence_and_a_beat_is_due_after_the_interval() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("appends");
    RunDir::create(&path).unwrap();
    // A roomy self-fence deadline (1 s) so a slow disk cannot fence the first appends.
    let policy = TimingPolicy::from_millis(100, 1000, 3000, HeartbeatDurability::Local).unwrap();
    let mut run = OwnedRun::claim(
        &path,
        Identity::new("w1").unwrap(),
        policy,
        Timestamp::now().unwrap(),
    )
    .unwrap();
    let step = Identity::new("step").unwrap();
    let a = run
        .append(
            step.clone(),
            serde_json::json!(1),
            Timestamp::now().unwrap(),
        )
        .unwrap();
    let b = run
        .append(
            step.clone(),
            serde_json::json!(2),
            Timestamp::now().unwrap(),
        )
        .unwrap();
    assert_eq!((a.sequence.get(), b.sequence.get()), (1, 2));
    std::thread::sleep(Duration::from_millis(120));
    assert!(run.heartbeat_due(), "not due after the 100 ms interval");
    run.heartbeat(Timestamp::now().unwrap()).unwrap();
    assert!(!run.heartbeat_due(), "due right after a beat");
    // Past the 1 s self-fence deadline without a beat: nothing more is written.
    std::thread::sleep(Duration::from_millis(1100));
    let events = || std::fs::read_dir(path.join("events")).unwrap().count();
    let before = events();
    let e = run
        .append(
            step.clone(),
            serde_json::json!(3),
            Timestamp::now().unwrap(),
        )
        .unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED", "{e}");
    assert!(e.is_fenced());
    assert_eq!(events(), before, "an append past the deadline wrote");
    let e = run.heartbeat(Timestamp::now().unwrap()).unwrap_err();
    assert!(e.is_fenced(), "the fence is sticky: {e}");
}

/// A run whose recorded owner is this host's, this boot's, and a process that has exited:
/// `status` judges it dead (pid gone, owner lock free).
fn run_with_dead_owner(path: &std::path::Path) -> lease_core::Generation {
    RunDir::create(path).unwrap();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let me = lease_fs::this_holder().unwrap();
    let dir = RunDir::open(path).unwrap();
    let lease = dir
        .claim(lease_core::ops::ClaimParams {
            run_id: dir.run_id().clone(),
            owner_id: Identity::new("crashed").unwrap(),
            holder: lease_core::Holder {
                pid,
                start_time: 1,
                ..me
            },
            policy: TimingPolicy::default(),
            now: Timestamp::now().unwrap(),
            store_floor: None,
        })
        .unwrap();
    let view = dir.status(Timestamp::now().unwrap(), true).unwrap();
    assert_eq!(view.status, Status::Dead, "{view:?}");
    lease.generation
}

fn epochs(path: &std::path::Path) -> usize {
    std::fs::read_dir(path.join("lease/epochs"))
        .unwrap()
        .count()
}

/// Issue #34: `claim_or_retire_dead` retires a definitely-dead owner (holding the owner
/// lock) and claims; a free run is simply claimed.
#[test]
fn claim_or_retire_dead_retires_a_dead_owner_then_claims() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("dead");
    let dead = run_with_dead_owner(&path);
    // A plain claim is refused and says why.
    let e = OwnedRun::claim(
        &path,
        Identity::new("w1").unwrap(),
        fast(),
        Timestamp::now().unwrap(),
    )
    .unwrap_err();
    assert_eq!(e.code().as_str(), "RUN_DEAD_REQUIRES_RETIREMENT", "{e}");
    let (run, retired) = OwnedRun::claim_or_retire_dead(
        &path,
        Identity::new("w1").unwrap(),
        Identity::new("w1-retirer").unwrap(),
        fast(),
        Timestamp::now().unwrap(),
    )
    .unwrap();
    assert_eq!(retired, Some(dead));
    assert!(
        run.lease().generation.get() > dead.get() + 1,
        "retire epoch, then the claim"
    );
    let view = run.dir().status(Timestamp::now().unwrap(), true).unwrap();
    assert_eq!(view.status, Status::Active, "{view:?}");
    run.release(Timestamp::now().unwrap(), None).unwrap();

    // Free now: claimed, nothing retired.
    let (run, retired) = OwnedRun::claim_or_retire_dead(
        &path,
        Identity::new("w2").unwrap(),
        Identity::new("w2-retirer").unwrap(),
        fast(),
        Timestamp::now().unwrap(),
    )
    .unwrap();
    assert_eq!(retired, None);
    run.release(Timestamp::now().unwrap(), None).unwrap();
}

/// A live owner is never retired, and refusals write nothing: the lock held by a live
/// owner of this host (`OWNER_LOCK_HELD`), the same id for the retirer and the owner
/// (`ARGUMENT_INVALID`).
#[test]
fn claim_or_retire_dead_never_retires_a_live_owner_and_refusals_write_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("live");
    RunDir::create(&path).unwrap();
    let live = OwnedRun::claim(
        &path,
        Identity::new("live").unwrap(),
        fast(),
        Timestamp::now().unwrap(),
    )
    .unwrap();
    let before = epochs(&path);
    let e = OwnedRun::claim_or_retire_dead(
        &path,
        Identity::new("w1").unwrap(),
        Identity::new("w1-retirer").unwrap(),
        fast(),
        Timestamp::now().unwrap(),
    )
    .unwrap_err();
    assert_eq!(e.code().as_str(), "OWNER_LOCK_HELD", "{e}");
    assert_eq!(epochs(&path), before);
    drop(live);

    let dead_path = tmp.path().join("dead2");
    run_with_dead_owner(&dead_path);
    let before = epochs(&dead_path);
    let e = OwnedRun::claim_or_retire_dead(
        &dead_path,
        Identity::new("same").unwrap(),
        Identity::new("same").unwrap(),
        fast(),
        Timestamp::now().unwrap(),
    )
    .unwrap_err();
    assert_eq!(e.code().as_str(), "ARGUMENT_INVALID", "{e}");
    assert_eq!(epochs(&dead_path), before, "nothing written");
}

/// Issue #34: `append` takes any `Serialize` payload; one serde cannot write as JSON is
/// refused before anything is written.
#[test]
fn append_takes_any_serializable_payload() {
    #[derive(serde::Serialize)]
    struct Step<'a> {
        name: &'a str,
        n: u32,
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("payload");
    RunDir::create(&path).unwrap();
    let mut run = OwnedRun::claim(
        &path,
        Identity::new("w").unwrap(),
        fast(),
        Timestamp::now().unwrap(),
    )
    .unwrap();
    let ty = Identity::new("step").unwrap();
    let a = run
        .append(
            ty.clone(),
            Step { name: "load", n: 1 },
            Timestamp::now().unwrap(),
        )
        .unwrap();
    run.append(ty.clone(), "plain text", Timestamp::now().unwrap())
        .unwrap();
    let events = run.dir().read_events(None).unwrap();
    let first = events
        .events
        .iter()
        .find(|e| e.event.sequence == a.sequence)
        .unwrap();
    assert_eq!(
        first.event.payload,
        serde_json::json!({"name": "load", "n": 1})
    );
    let count = events.events.len();
    // A map with non-string keys is not JSON.
    let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
    let e = run.append(ty, bad, Timestamp::now().unwrap()).unwrap_err();
    assert_eq!(e.code().as_str(), "ARGUMENT_INVALID", "{e}");
    assert_eq!(run.dir().read_events(None).unwrap().events.len(), count);
    run.release(Timestamp::now().unwrap(), None).unwrap();
}
