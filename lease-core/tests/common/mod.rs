//! Shared helpers for lease-core's integration tests.
#![allow(dead_code)]

use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;

pub fn run_id() -> RunId {
    RunId::new("run-1").unwrap()
}

pub fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

pub fn t(ms: u64) -> Timestamp {
    // 2026-12-02T00:00:00.000Z + ms
    Timestamp::from_unix_millis(1_796_169_600_000 + ms).unwrap()
}

pub const BOOT: &str = "boot-a";

pub fn holder(pid: u32) -> Holder {
    Holder {
        host: id("host-a"),
        boot_id: id(BOOT),
        pid,
        start_time: 1000 + u64::from(pid),
    }
}

/// Liveness where every process is alive and holds its lock.
pub fn all_alive(h: &Holder) -> LivenessEvidence {
    LivenessEvidence {
        observer_boot_id: id(BOOT),
        process: ProcessState::Running {
            start_time: h.start_time,
        },
        owner_lock: LockEvidence::Held,
        lease: AuthorityLease::NotKept,
    }
}

/// Liveness where every process is gone and the lock is free.
pub fn all_dead(_: &Holder) -> LivenessEvidence {
    LivenessEvidence {
        observer_boot_id: id(BOOT),
        process: ProcessState::Gone,
        owner_lock: LockEvidence::Free,
        lease: AuthorityLease::NotKept,
    }
}

pub fn claim(
    disk: &mut MemDisk,
    owner: &str,
    pid: u32,
    now: u64,
) -> Result<OwnedLease, LeaseError> {
    disk.run(
        &mut Claim::new(ClaimParams {
            run_id: run_id(),
            owner_id: id(owner),
            holder: holder(pid),
            policy: TimingPolicy::default(),
            now: t(now),
            store_floor: None,
        }),
        &all_alive,
    )
}

pub fn heartbeat(
    disk: &mut MemDisk,
    lease: &OwnedLease,
    now: u64,
    n: u64,
) -> Result<(), LeaseError> {
    disk.run(&mut Heartbeat::new(lease, t(now), n).unwrap(), &all_alive)
}

pub fn release(disk: &mut MemDisk, lease: &OwnedLease, now: u64) -> Result<Generation, LeaseError> {
    disk.run(
        &mut Release::new(ReleaseParams {
            lease: lease.clone(),
            now: t(now),
            seal: None,
        }),
        &all_alive,
    )
}

/// A release without lease-core's automatic compaction (§7.3 step 7), for tests of an
/// explicit prune over a long history.
pub fn release_uncompacted(
    disk: &mut MemDisk,
    lease: &OwnedLease,
    now: u64,
) -> Result<Generation, LeaseError> {
    disk.run(
        &mut Release::new(ReleaseParams {
            lease: lease.clone(),
            now: t(now),
            seal: None,
        })
        .compacting(None),
        &all_alive,
    )
}

pub fn takeover_params(owner: &str, pid: u32, now: u64, expect: Expectation) -> TakeoverParams {
    TakeoverParams {
        run_id: run_id(),
        owner_id: id(owner),
        holder: holder(pid),
        policy: TimingPolicy::default(),
        now: t(now),
        trigger: TakeoverTrigger::Operator {
            watched_unchanged_ms: lease_core::ghost::simulated_watch(&expect, t(now)),
        },
        expect,
    }
}

pub fn status(disk: &mut MemDisk, now: u64) -> StatusView {
    disk.run(&mut StatusView::read(run_id(), t(now), false), &all_alive)
        .unwrap()
}

pub fn expect_head(disk: &mut MemDisk, now: u64) -> Expectation {
    Expectation::of(status(disk, now).head.as_ref().unwrap())
}

pub fn takeover(
    disk: &mut MemDisk,
    owner: &str,
    pid: u32,
    now: u64,
) -> Result<OwnedLease, LeaseError> {
    let expect = expect_head(disk, now);
    disk.run(
        &mut Takeover::new(takeover_params(owner, pid, now, expect)),
        &all_alive,
    )
}

pub fn append(
    disk: &mut MemDisk,
    lease: &OwnedLease,
    now: u64,
    n: u64,
) -> Result<Appended, LeaseError> {
    disk.run(
        &mut Append::new(
            lease,
            AppendParams {
                event_type: id("test.event"),
                payload: serde_json::json!({ "n": n }),
                now: t(now),
                tail_hint: None,
            },
        ),
        &all_alive,
    )
}

pub fn read_events(disk: &mut MemDisk, now: u64) -> Result<EventLogView, LeaseError> {
    disk.run(
        &mut ReadEvents::new(run_id(), Some((id("reader"), t(now)))),
        &all_alive,
    )
}

/// Sequences of the events that count.
pub fn counted(view: &EventLogView) -> Vec<u64> {
    view.events
        .iter()
        .filter(|e| e.standing.counts())
        .map(|e| e.event.sequence.get())
        .collect()
}
