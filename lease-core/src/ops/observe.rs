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
    judge_age(head, now.millis_since(head.heartbeat_at()))
}

/// Judge an age in ms (on whichever clock measured it) against the head's `stale_after`.
fn judge_age(head: &Head, age_ms: i64) -> Freshness {
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
    /// Heartbeat age on the observer's own monotonic clock, for an active head whose beat
    /// was stamped on that same clock (same boot and time namespace, PROTOCOL.md §10): it
    /// then judges freshness instead of [`StatusView::age_ms`], so no wall clock decides.
    pub mono_age_ms: Option<u64>,
    /// How far, in ms, a beat stamped on the observer's own clock is *ahead* of the
    /// observer's reading of that clock. No process on that clock can have written such a
    /// stamp (the file was edited), so it is ignored for freshness (the wall clock advises,
    /// a takeover watches) and `doctor` reports it (`HEARTBEAT_STAMP_AHEAD`).
    pub mono_ahead_ms: Option<u64>,
    /// Why the owner is not proven dead (or why it is), when liveness was probed.
    pub liveness: Option<Result<(), String>>,
    /// What the authority said of the owner's lease, when liveness was probed.
    pub authority_lease: Option<AuthorityLease>,
}

impl StatusView {
    /// A view judged `invalid` with `e`, nothing else known (an unreadable head record,
    /// or a lease folder whose layout the transport refuses).
    pub fn invalid(e: LeaseError) -> StatusView {
        StatusView::only(Status::Invalid(e))
    }

    /// A view that knows `status` and nothing else (no head, ages, liveness or lease).
    fn only(status: Status) -> StatusView {
        StatusView {
            status,
            head: None,
            age_ms: None,
            mono_age_ms: None,
            mono_ahead_ms: None,
            liveness: None,
            authority_lease: None,
        }
    }

    /// Whether the head is stale: its heartbeat is older than its own `stale_after`, on the
    /// observer's monotonic clock when the beat was stamped on it, else on the observer's
    /// wall clock (advice only: a takeover watches first). A `dead` status may be fresh or
    /// stale; only a stale head may be taken over.
    pub fn is_stale(&self) -> bool {
        match (&self.head, self.judged_age_ms()) {
            (Some(h), Some(age)) => matches!(judge_age(h, age), Freshness::Stale { .. }),
            _ => false,
        }
    }

    /// The heartbeat age freshness is judged on: [`StatusView::mono_age_ms`] when the
    /// beat was stamped on the observer's clock, else [`StatusView::age_ms`].
    pub fn judged_age_ms(&self) -> Option<i64> {
        self.age_ms.map(|wall| judged_age(wall, self.mono_age_ms))
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
            clock: None,
            mono_ahead: None,
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
    clock: Option<Identity>,
    mono_ahead: Option<u64>,
    pending: Option<Box<Pending>>,
}

/// What a status read waits on after OBSERVE found an active head.
#[derive(Debug, Clone)]
enum Pending {
    /// The driver's monotonic reading, to age a beat stamped on the observer's clock (the
    /// head and its wall age).
    Clock(Head, i64),
    /// The liveness probe: the head, its wall age and its monotonic age.
    Probe(Head, i64, Option<u64>),
}

impl ReadStatus {
    /// Judge freshness on the observer's monotonic clock, named `clock`, when the head's
    /// beat was stamped on that same clock ([`crate::records::MonoStamp`]): the read then
    /// asks the driver for a [`Request::Monotonic`] reading. `None`: the wall clock only.
    pub fn on_clock(mut self, clock: Option<Identity>) -> ReadStatus {
        self.clock = clock;
        self
    }

    /// An active head's status once its ages are known: probe liveness, or judge.
    fn judge(&mut self, head: Head, wall: i64, mono: Option<u64>) -> Step<StatusView> {
        if self.probe {
            let holder = head.epoch.holder.clone();
            self.pending = Some(Box::new(Pending::Probe(head, wall, mono)));
            return Step::Io(Request::ProbeLiveness(holder));
        }
        let status = match freshness_of(&head, wall, mono) {
            Freshness::Fresh { .. } => Status::Active,
            Freshness::Stale { .. } => Status::Stale,
        };
        Step::Done(Ok(StatusView {
            status,
            head: Some(head),
            age_ms: Some(wall),
            mono_age_ms: mono,
            mono_ahead_ms: self.mono_ahead,
            liveness: None,
            authority_lease: None,
        }))
    }
}

/// The age freshness is judged on: the monotonic age when there is one, else the wall age.
fn judged_age(wall: i64, mono: Option<u64>) -> i64 {
    mono.map_or(wall, |m| i64::try_from(m).unwrap_or(i64::MAX))
}

/// Freshness on [`judged_age`].
fn freshness_of(head: &Head, wall: i64, mono: Option<u64>) -> Freshness {
    judge_age(head, judged_age(wall, mono))
}

impl Operation for ReadStatus {
    type Output = StatusView;
    fn next(&mut self, input: Option<Response>) -> Step<StatusView> {
        if let Some(p) = self.pending.take() {
            let (head, wall, mono) = match *p {
                Pending::Clock(head, wall) => {
                    let Some(Response::Monotonic(now_ns)) = input else {
                        return Step::Done(Err(violation("Monotonic", &input)));
                    };
                    let stamp = head.beat.as_ref().and_then(|b| b.mono.as_ref());
                    let mono = stamp.and_then(|m| m.age_ms_on(self.clock.as_ref(), now_ns));
                    // Same clock (checked before asking) and no age: the stamp is ahead.
                    self.mono_ahead = stamp
                        .filter(|_| mono.is_none())
                        .map(|m| m.ns.saturating_sub(now_ns) / 1_000_000);
                    return self.judge(head, wall, mono);
                }
                Pending::Probe(head, wall, mono) => (head, wall, mono),
            };
            let Some(Response::Liveness(ev)) = input else {
                return Step::Done(Err(violation("Liveness", &input)));
            };
            let verdict = definitely_dead(&head.epoch.holder, &ev);
            let fr = freshness_of(&head, wall, mono);
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
                age_ms: Some(wall),
                mono_age_ms: mono,
                mono_ahead_ms: self.mono_ahead,
                liveness: Some(verdict),
                authority_lease: Some(ev.lease),
            }));
        }
        let observed = match self.obs.next(input) {
            Step::Io(r) => return Step::Io(r),
            Step::Done(Err(e)) => {
                return match e {
                    LeaseError::RecordInvalid { .. } | LeaseError::SchemaUnsupported { .. } => {
                        Step::Done(Ok(StatusView::invalid(e)))
                    }
                    e => Step::Done(Err(e)),
                };
            }
            Step::Done(Ok(o)) => o,
        };
        let Some(head) = observed.head else {
            return Step::Done(Ok(StatusView::only(Status::Free)));
        };
        if !head.is_active() {
            return Step::Done(Ok(StatusView {
                status: Status::Free,
                head: Some(head),
                age_ms: None,
                mono_age_ms: None,
                mono_ahead_ms: None,
                liveness: None,
                authority_lease: None,
            }));
        }
        // A beat stamped on the observer's own clock is aged on that clock (one more
        // request, no I/O); otherwise the wall clock gives the advice.
        let same_clock = head
            .beat
            .as_ref()
            .and_then(|b| b.mono.as_ref())
            .is_some_and(|m| self.clock.as_ref() == Some(&m.clock));
        let wall = self.now.millis_since(head.heartbeat_at());
        if same_clock {
            self.pending = Some(Box::new(Pending::Clock(head, wall)));
            return Step::Io(Request::Monotonic);
        }
        self.judge(head, wall, None)
    }
}
