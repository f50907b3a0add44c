//! The operation of each kind ([`AnyOp`]), and how an actor's next one is built ([`build`]) as
//! lease-run's owner would build it.

use super::{Actor, Site, at, boot_id, ident, run_id, watched};
use crate::LeaseError;
use crate::ghost::OpKind;
use crate::ops::{
    Append, AppendParams, Appended, Claim, ClaimParams, EventLogView, Expectation, Heartbeat,
    Operation, OwnedLease, Prune, PruneParams, ReadEvents, Release, ReleaseParams, Response,
    Retire, RetireParams, StatusView, Step, Takeover, TakeoverParams, TakeoverTrigger,
};

/// An operation of any kind, in flight.
#[derive(Clone, Debug)]
pub enum AnyOp {
    /// [`Claim`].
    Claim(Claim),
    /// [`Heartbeat`].
    Heartbeat(Heartbeat),
    /// [`Append`].
    Append(Append),
    /// [`Takeover`].
    Takeover(Takeover),
    /// [`Retire`].
    Retire(Retire),
    /// [`Release`].
    Release(Release),
    /// [`Prune`].
    Prune(Prune),
    /// A finalizing reader of the log (PROTOCOL §7.9), racing the others.
    Read(ReadEvents),
}

/// What an operation answered, whatever its kind.
#[derive(Clone, Debug)]
pub enum Out {
    /// A claim's or takeover's lease.
    Lease(Box<OwnedLease>),
    /// An append's event.
    Appended(Box<Appended>),
    /// A heartbeat, release or prune that succeeded.
    Unit,
    /// A retirement's new (free) generation.
    Retired(u64),
    /// What a reader judged.
    Read(Box<EventLogView>),
}

fn map<T>(s: Step<T>, f: impl FnOnce(T) -> Out) -> Step<Out> {
    match s {
        Step::Io(r) => Step::Io(r),
        Step::Done(r) => Step::Done(r.map(f)),
    }
}

impl AnyOp {
    /// Its kind.
    pub fn kind(&self) -> OpKind {
        match self {
            AnyOp::Claim(_) => OpKind::Claim,
            AnyOp::Heartbeat(_) => OpKind::Heartbeat,
            AnyOp::Append(_) => OpKind::Append,
            AnyOp::Takeover(_) => OpKind::Takeover,
            AnyOp::Retire(_) => OpKind::Retire,
            AnyOp::Release(_) => OpKind::Release,
            AnyOp::Prune(_) => OpKind::Prune,
            AnyOp::Read(_) => OpKind::Read,
        }
    }

    /// The operation's next step, given the answer to its last request.
    pub fn next(&mut self, input: Option<Response>) -> Step<Out> {
        match self {
            AnyOp::Claim(o) => map(o.next(input), |l| Out::Lease(Box::new(l))),
            AnyOp::Takeover(o) => map(o.next(input), |l| Out::Lease(Box::new(l))),
            AnyOp::Retire(o) => map(o.next(input), |r| Out::Retired(r.generation.get())),
            AnyOp::Heartbeat(o) => map(o.next(input), |_| Out::Unit),
            AnyOp::Append(o) => map(o.next(input), |a| Out::Appended(Box::new(a))),
            AnyOp::Release(o) => map(o.next(input), |_| Out::Unit),
            AnyOp::Prune(o) => map(o.next(input), |_| Out::Unit),
            AnyOp::Read(o) => map(o.next(input), |v| Out::Read(Box::new(v))),
        }
    }
}

/// The operation of `kind` actor `a` would start now, as lease-run's owner starts it
/// (`None` when it cannot: a heartbeat without a lease, a claim with one, a takeover
/// without `takeover`, the expectation and watch of the head it observed).
pub fn build(
    kind: OpKind,
    a: &Actor,
    site: &Site,
    takeover: Option<(Expectation, u64)>,
) -> Option<AnyOp> {
    let now = at(site.now);
    let policy = site.policy;
    Some(match (kind, a.lease.clone()) {
        (OpKind::Claim, None) => AnyOp::Claim(Claim::new(ClaimParams {
            run_id: run_id(),
            owner_id: a.owner(),
            holder: a.holder(site.boot),
            policy,
            now,
            store_floor: None,
        })),
        (OpKind::Heartbeat, Some(l)) => AnyOp::Heartbeat(
            Heartbeat::new(&l, now, a.beats + 1)
                .ok()?
                .on_clock(Some(boot_id(site.boot))),
        ),
        (OpKind::Append, Some(l)) => AnyOp::Append(Append::new(
            &l,
            AppendParams {
                event_type: ident("e"),
                payload: serde_json::json!(a.name.to_string()),
                now,
                tail_hint: None,
            },
        )),
        (OpKind::Release, Some(l)) => AnyOp::Release(Release::new(ReleaseParams {
            lease: l,
            now,
            seal: None,
        })),
        (OpKind::Takeover, None) => {
            let (expect, watched_unchanged_ms) = takeover?;
            AnyOp::Takeover(Takeover::new(TakeoverParams {
                run_id: run_id(),
                owner_id: a.owner(),
                holder: a.holder(site.boot),
                policy,
                now,
                expect,
                trigger: TakeoverTrigger::Operator {
                    watched_unchanged_ms,
                },
            }))
        }
        (OpKind::Retire, None) => AnyOp::Retire(Retire::new(RetireParams {
            run_id: run_id(),
            owner_id: a.owner(),
            holder: a.holder(site.boot),
            policy,
            now,
            expect: None,
        })),
        (OpKind::Prune, _) => AnyOp::Prune(Prune::new(PruneParams {
            run_id: run_id(),
            keep: 2,
            by: a.owner(),
            now,
        })),
        (OpKind::Read, _) => AnyOp::Read(ReadEvents::new(run_id(), Some((a.owner(), now)))),
        _ => return None,
    })
}

/// What a takeover starting now would expect and how long it has watched, from a status
/// read of the run: `None` unless the head is active (nothing to take over).
pub fn takeover_plan(
    view: Result<StatusView, LeaseError>,
    boot: u32,
    now: u64,
) -> Option<(Expectation, u64)> {
    let h = view.ok()?.head?;
    if !h.is_active() {
        return None;
    }
    Some((Expectation::of(&h), watched(&h, boot, now)))
}
