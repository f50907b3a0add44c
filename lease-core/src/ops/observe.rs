//! Judging the head of the epoch chain: freshness and death, and the status read.
//! Observing the head, and the small sub-operations every operation shares (finalize a
//! cutoff, re-check supersession, find the log tail), are in `common` (PROTOCOL §7.0).

use super::common::{Head, Observe};
use super::{Operation, Request, Response, Step, violation};
use crate::error::LeaseError;
use crate::ids::{Identity, RunId};
use crate::records::Holder;
use crate::time::Timestamp;

/// Wall-clock freshness of an active head, as seen by an observer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Heartbeat age within `stale_after` (or in the future: clock skew counts as fresh).
    Fresh {
        /// Age in ms (negative when the heartbeat is ahead of the observer's clock).
        age_ms: i64,
    },
    /// Heartbeat older than `stale_after`.
    Stale {
        /// Age in ms.
        age_ms: i64,
    },
}

/// Judge the freshness of `head` at the observer's wall time `now`, using the
/// `stale_after` of the policy the owner recorded in its epoch.
pub fn freshness(head: &Head, now: Timestamp) -> Freshness {
    let age_ms = now.millis_since(head.heartbeat_at());
    let stale_after = head.epoch.policy.stale_after_ms();
    if age_ms > 0 && age_ms as u64 > stale_after {
        Freshness::Stale { age_ms }
    } else {
        Freshness::Fresh { age_ms }
    }
}

/// What the observer knows about a recorded process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// No process with that pid exists (in the observer's pid namespace).
    Gone,
    /// A process with that pid exists, with this start time.
    Running {
        /// Its start time in clock ticks since boot.
        start_time: u64,
    },
    /// Could not tell (permission, no /proc).
    Unknown,
}

/// What the observer knows about the run's kernel owner lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockEvidence {
    /// The observer could take it (so no live process holds it).
    Free,
    /// Some process holds it.
    Held,
    /// Could not tell.
    Unknown,
}

/// What an authority that keeps leases of its own (etcd) says of the owner's lease
/// (PROTOCOL §11). Such an authority decides liveness alone: its lease is what lets the
/// owner stay, whatever any wall clock says of its heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthorityLease {
    /// The authority keeps no lease of its own (a run folder): the kernel evidence
    /// (boot id, process, owner lock) decides.
    NotKept,
    /// The authority holds the owner's lease alive (etcd: its etcd lease has not expired).
    /// The owner is alive as far as the authority knows, however old or new its heartbeat
    /// is by an observer's wall clock, and no takeover or retirement can replace it until
    /// that lease expires.
    Alive,
    /// The owner's lease expired or was revoked (etcd: its liveness key is gone). The owner
    /// fenced itself before that could happen, so it is dead.
    Expired,
}

/// Liveness evidence gathered by an adapter about a [`Holder`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LivenessEvidence {
    /// The observer's own boot id.
    pub observer_boot_id: Identity,
    /// The recorded pid, as seen by the observer.
    pub process: ProcessState,
    /// The run's kernel owner lock.
    pub owner_lock: LockEvidence,
    /// The authority's own lease of the owner, when it keeps one: then it alone decides
    /// ([`definitely_dead`]), and the kernel evidence above is not looked at.
    pub lease: AuthorityLease,
}

/// Is the holder definitely dead? With an authority that keeps leases ([`AuthorityLease`]),
/// exactly when its lease expired. Otherwise only when all of: the observer is on the same
/// boot (same boot id), the recorded process is gone or its pid now has another start
/// time, and the kernel owner lock is free. `Err` says which piece is missing.
pub fn definitely_dead(holder: &Holder, ev: &LivenessEvidence) -> Result<(), String> {
    match ev.lease {
        AuthorityLease::Alive => {
            return Err(
                "its lease in the authority is alive (etcd: its etcd lease has not expired): it cannot be replaced until that lease expires, whatever a wall clock says of its heartbeat".into(),
            );
        }
        AuthorityLease::Expired => return Ok(()),
        AuthorityLease::NotKept => {}
    }
    if ev.observer_boot_id != holder.boot_id {
        return Err(format!(
            "it ran on boot {} (host {}) and this observer is on boot {}: liveness cannot be judged from here; wait for staleness and take over",
            holder.boot_id, holder.host, ev.observer_boot_id
        ));
    }
    match ev.process {
        ProcessState::Gone => {}
        ProcessState::Running { start_time } if start_time != holder.start_time => {}
        ProcessState::Running { .. } => {
            return Err(format!(
                "process {} with the recorded start time {} is alive",
                holder.pid, holder.start_time
            ));
        }
        ProcessState::Unknown => return Err("the process state cannot be read".into()),
    }
    match ev.owner_lock {
        LockEvidence::Free => Ok(()),
        LockEvidence::Held => Err("the kernel owner lock is still held".into()),
        LockEvidence::Unknown => Err("the kernel owner lock cannot be checked".into()),
    }
}

/// How a run looks to an observer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// Never claimed, released or retired: anyone may claim.
    Free,
    /// A fresh owner, or one whose lease the authority holds alive
    /// ([`AuthorityLease::Alive`]) whatever its heartbeat's wall-clock age.
    Active,
    /// The owner's heartbeat is older than its `stale_after` on the observer's wall clock
    /// and no authority vouches for it: an exact takeover (which watches the record on the
    /// taker's own clock first) may replace it.
    Stale,
    /// The owner is definitely dead: it may be retired at once.
    Dead,
    /// A record is invalid: nothing may replace the owner until an operator repairs it.
    Invalid(LeaseError),
}

impl Status {
    /// Lowercase name (`free`, `active`, `stale`, `dead`, `invalid`).
    pub fn name(&self) -> &'static str {
        match self {
            Status::Free => "free",
            Status::Active => "active",
            Status::Stale => "stale",
            Status::Dead => "dead",
            Status::Invalid(_) => "invalid",
        }
    }
}

/// The result of [`StatusView`]'s operation: the state plus what it was judged from.
#[derive(Debug, Clone)]
pub struct StatusView {
    /// The judgment.
    pub status: Status,
    /// The head, when it could be read.
    pub head: Option<Head>,
    /// Heartbeat age on the observer's wall clock, for an active head.
    pub age_ms: Option<i64>,
    /// Why the owner is not proven dead (or why it is), when liveness was probed.
    pub liveness: Option<Result<(), String>>,
    /// What the authority said of the owner's lease, when liveness was probed.
    pub authority_lease: Option<AuthorityLease>,
}

impl StatusView {
    /// Whether the head is stale on the observer's wall clock: its heartbeat is older than
    /// its own `stale_after`. A `dead` status may be fresh or stale; only a stale head may
    /// be taken over.
    pub fn is_stale(&self) -> bool {
        match (&self.head, self.age_ms) {
            (Some(h), Some(age)) => age > 0 && age.unsigned_abs() > h.epoch.policy.stale_after_ms(),
            _ => false,
        }
    }

    /// Whether the authority holds the owner's lease alive ([`AuthorityLease::Alive`]): the
    /// owner is active whatever [`StatusView::is_stale`] says, and no takeover can succeed
    /// until that lease expires.
    pub fn lease_alive(&self) -> bool {
        self.authority_lease == Some(AuthorityLease::Alive)
    }

    /// Start a status read of `run` at wall time `now`. With `probe_liveness`, an active
    /// head's holder is probed (a [`Request::ProbeLiveness`]) to tell `dead` from the rest.
    pub fn read(run: RunId, now: Timestamp, probe_liveness: bool) -> ReadStatus {
        ReadStatus {
            obs: Observe::new(run),
            now,
            probe: probe_liveness,
            pending: None,
        }
    }
}

/// Status read operation (see [`StatusView::read`]).
#[derive(Debug, Clone)]
pub struct ReadStatus {
    obs: Observe,
    now: Timestamp,
    probe: bool,
    pending: Option<Box<(Head, Freshness)>>,
}

impl Operation for ReadStatus {
    type Output = StatusView;
    fn next(&mut self, input: Option<Response>) -> Step<StatusView> {
        if let Some(p) = self.pending.take() {
            let (head, fr) = *p;
            let Some(Response::Liveness(ev)) = input else {
                return Step::Done(Err(violation("Liveness", &input)));
            };
            let verdict = definitely_dead(&head.epoch.holder, &ev);
            let age = match fr {
                Freshness::Fresh { age_ms } | Freshness::Stale { age_ms } => age_ms,
            };
            // The wall clock judges freshness only where no authority vouches for the
            // owner: an authority's live lease is the owner's liveness (PROTOCOL §7.8).
            let status = match (&verdict, ev.lease, fr) {
                (Ok(()), _, _) => Status::Dead,
                (Err(_), AuthorityLease::Alive, _) => Status::Active,
                (Err(_), _, Freshness::Fresh { .. }) => Status::Active,
                (Err(_), _, Freshness::Stale { .. }) => Status::Stale,
            };
            return Step::Done(Ok(StatusView {
                status,
                head: Some(head),
                age_ms: Some(age),
                liveness: Some(verdict),
                authority_lease: Some(ev.lease),
            }));
        }
        let observed = match self.obs.next(input) {
            Step::Io(r) => return Step::Io(r),
            Step::Done(Err(e)) => {
                return match e {
                    LeaseError::RecordInvalid { .. } | LeaseError::SchemaUnsupported { .. } => {
                        Step::Done(Ok(StatusView {
                            status: Status::Invalid(e),
                            head: None,
                            age_ms: None,
                            liveness: None,
                            authority_lease: None,
                        }))
                    }
                    e => Step::Done(Err(e)),
                };
            }
            Step::Done(Ok(o)) => o,
        };
        let Some(head) = observed.head else {
            return Step::Done(Ok(StatusView {
                status: Status::Free,
                head: None,
                age_ms: None,
                liveness: None,
                authority_lease: None,
            }));
        };
        if !head.is_active() {
            return Step::Done(Ok(StatusView {
                status: Status::Free,
                head: Some(head),
                age_ms: None,
                liveness: None,
                authority_lease: None,
            }));
        }
        let fr = freshness(&head, self.now);
        if self.probe {
            let holder = head.epoch.holder.clone();
            self.pending = Some(Box::new((head, fr)));
            return Step::Io(Request::ProbeLiveness(holder));
        }
        let (status, age) = match fr {
            Freshness::Fresh { age_ms } => (Status::Active, age_ms),
            Freshness::Stale { age_ms } => (Status::Stale, age_ms),
        };
        Step::Done(Ok(StatusView {
            status,
            head: Some(head),
            age_ms: Some(age),
            liveness: None,
            authority_lease: None,
        }))
    }
}
