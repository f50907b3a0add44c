//! Driving one operation to its end on either disk, the callers and parameters every
//! operation is given, and the [`Summary`] of what each answered.

use super::MAX_REQUESTS;
use crate::fixtures::{LiveMode, holder, id, run_id, t};
use lease_core::mem::MemDisk;
use lease_core::ops::{
    AppendParams, ClaimParams, Expectation, LivenessEvidence, Operation, OwnedLease, RetireParams,
    StatusView, Step, TakeoverParams, TakeoverTrigger,
};
use lease_core::{
    EpochRecord, FileRef, HeartbeatRecord, Holder, LeaseError, Timestamp, TimingPolicy, decode,
};
use lease_fs::{FsError, RunDir, SimFs};
use std::path::Path;
use std::sync::Arc;

/// Outcome of one operation, comparable between the two disks.
pub(super) type Outcome = Result<String, String>;

pub(super) fn no_violation(what: &str, e: &LeaseError) {
    assert_ne!(
        e.code(),
        "PROTOCOL_VIOLATION",
        "{what}: the machine rejected a correct answer: {e}"
    );
    let _ = e.to_string();
}

/// Run `op` against `disk`, answering liveness with `live`; panics if it does not finish.
pub(super) fn run_mem<O: Operation>(
    what: &str,
    disk: &mut MemDisk,
    op: &mut O,
    live: LiveMode,
) -> Result<O::Output, LeaseError> {
    let liveness = move |h: &Holder| -> LivenessEvidence { live.evidence(h) };
    let mut input = None;
    for _ in 0..MAX_REQUESTS {
        match op.next(input.take()) {
            Step::Io(req) => input = Some(disk.perform(req, &liveness)),
            Step::Done(r) => {
                if let Err(e) = &r {
                    no_violation(what, e);
                }
                return r;
            }
        }
    }
    panic!("{what}: no answer after {MAX_REQUESTS} requests over a static folder");
}

struct FuzzLive(LiveMode);

impl lease_fs::Liveness for FuzzLive {
    fn probe(&self, holder: &Holder) -> LivenessEvidence {
        self.0.evidence(holder)
    }
}

pub(super) fn run_dir(fs: &SimFs, live: LiveMode) -> RunDir {
    RunDir::with_fs(
        Arc::new(fs.clone()),
        run_id(),
        Path::new("/fuzz/run-1"),
        Arc::new(FuzzLive(live)),
    )
}

pub(super) fn fs_outcome<T>(
    what: &str,
    r: &Result<T, FsError>,
    ok: impl Fn(&T) -> String,
) -> Outcome {
    match r {
        Ok(v) => Ok(ok(v)),
        Err(e) => {
            if let Some(le) = e.lease() {
                no_violation(what, le);
            }
            let _ = e.to_string();
            Err(e.code().to_string())
        }
    }
}

pub(super) fn outcome<T>(r: &Result<T, LeaseError>, ok: impl Fn(&T) -> String) -> Outcome {
    match r {
        Ok(v) => Ok(ok(v)),
        Err(e) => Err(e.code().to_string()),
    }
}

pub(super) fn status_str(v: &StatusView) -> String {
    let head = v.head.as_ref().map(|h| h.generation().get());
    format!("{} head {head:?}", v.status.name())
}

pub(super) fn events_str(v: &lease_core::ops::EventLogView) -> String {
    v.events
        .iter()
        .map(|e| format!("{}:{:?}", e.event.sequence, e.standing))
        .collect::<Vec<_>>()
        .join(",")
}

/// The identities of the operations' callers.
pub(super) struct Callers {
    pub(super) claimer: (lease_core::Identity, Holder),
    pub(super) taker: (lease_core::Identity, Holder),
    pub(super) retirer: (lease_core::Identity, Holder),
}

pub(super) fn callers() -> Callers {
    Callers {
        claimer: (id("fuzz-claimer"), holder(4242)),
        taker: (id("fuzz-taker"), holder(4343)),
        retirer: (id("fuzz-retirer"), holder(4444)),
    }
}

/// What the readers saw, and what the checks need of it.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Summary {
    pub(super) status: Outcome,
    pub(super) status_no_probe: Outcome,
    pub(super) events: Outcome,
    pub(super) verify: Outcome,
    pub(super) claim: Outcome,
    pub(super) takeover: Outcome,
    pub(super) retire: Outcome,
    pub(super) finalizing_read: Outcome,
    pub(super) heartbeat: Outcome,
    pub(super) append: Outcome,
    pub(super) release: Outcome,
}

/// The expectation a takeover uses: the observed head exactly, or, when the head cannot be
/// read, the loosest one the raw files suggest (so a protocol that wrongly took over an
/// invalid record would be caught).
pub(super) fn expectation(disk: &MemDisk, view: Option<&StatusView>) -> Expectation {
    if let Some(h) = view.and_then(|v| v.head.as_ref()) {
        return Expectation::of(h);
    }
    let top = disk
        .files
        .keys()
        .filter_map(|f| match f {
            FileRef::Epoch(g) => Some(*g),
            _ => None,
        })
        .max();
    let epoch = top
        .and_then(|g| disk.files.get(&FileRef::Epoch(g)))
        .and_then(|b| decode::<EpochRecord>(b).ok());
    let beat = top
        .and_then(|g| disk.files.get(&FileRef::Beat(g)))
        .and_then(|b| decode::<HeartbeatRecord>(b).ok());
    Expectation {
        generation: top,
        owner_id: epoch
            .as_ref()
            .map_or_else(|| id("owner"), |e| e.owner_id.clone()),
        heartbeat_at: beat
            .map(|b| b.heartbeat_at)
            .or(epoch.as_ref().map(|e| e.claimed_at))
            .unwrap_or(t(0)),
        heartbeat_count: None,
    }
}

/// A lease for the head's owner, as if this process were it.
pub(super) fn forged_lease(view: Option<&StatusView>) -> Option<OwnedLease> {
    let h = view?.head.as_ref()?;
    h.is_active().then(|| OwnedLease {
        run_id: run_id(),
        generation: h.generation(),
        owner_id: h.epoch.owner_id.clone(),
        holder: h.epoch.holder.clone(),
        policy: h.epoch.policy,
        epoch_hash: h.hash.clone(),
    })
}

pub(super) fn params_claim(c: &Callers, now: Timestamp) -> ClaimParams {
    ClaimParams {
        run_id: run_id(),
        owner_id: c.claimer.0.clone(),
        holder: c.claimer.1.clone(),
        policy: TimingPolicy::default(),
        now,
        store_floor: None,
    }
}

pub(super) fn params_takeover(c: &Callers, now: Timestamp, expect: Expectation) -> TakeoverParams {
    TakeoverParams {
        run_id: run_id(),
        owner_id: c.taker.0.clone(),
        holder: c.taker.1.clone(),
        policy: TimingPolicy::default(),
        now,
        trigger: TakeoverTrigger::Operator {
            watched_unchanged_ms: lease_core::ghost::simulated_watch(&expect, now),
        },
        expect,
    }
}

pub(super) fn params_retire(c: &Callers, now: Timestamp) -> RetireParams {
    RetireParams {
        run_id: run_id(),
        owner_id: c.retirer.0.clone(),
        holder: c.retirer.1.clone(),
        policy: TimingPolicy::default(),
        now,
        expect: None,
    }
}

pub(super) fn append_params(now: Timestamp) -> AppendParams {
    AppendParams {
        event_type: id("fuzz.event"),
        payload: serde_json::json!({"fuzz": true}),
        now,
        tail_hint: None,
    }
}
