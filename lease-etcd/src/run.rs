//! The etcd authority: lease-core's requests executed as etcd calls, and the run
//! operations of lease-fs's `RunDir` on top of them.
//!
//! # Key layout
//!
//! Every file of the run folder becomes one key, `/<prefix>/<run id>/<FileRef::path()>`
//! (`.../lease/epochs/00000000000000000003.json`, `.../events/...`); a listing is a
//! keys-only range over `/<prefix>/<run id>/<dir>/` whose names are parsed exactly as on
//! disk. Liveness keys `/<prefix>/<run id>/live/<generation:020>` hold the owner's
//! [`Holder`](lease_core::Holder) and are attached to the owner's etcd lease.
//!
//! # Requests
//!
//! | request | etcd |
//! |---|---|
//! | `List(dir)` | range, keys only |
//! | `Read(f)`, `Exists(f)` | range of one key (linearizable) |
//! | `CreateExclusive(f)` | txn: `create_revision(f) == 0` [and the epoch guard] then put, else get (the value); retried within the deadline: a retry after an unanswered attempt that reads exactly its own bytes is `Created` (that attempt landed), other bytes `AlreadyExists` |
//! | `WriteBeat{file, record}` | txn: no epoch above the beat's generation (a range compare) and its liveness key present, then put of the record itself (an etcd put is atomic, so no slots are needed; readers accept the one-record form); refused, `FENCED` (issue #31: etcd itself refuses a deposed owner's beat) |
//! | `Remove(f)` | delete; [`Durability`](lease_core::ops::Durability) maps to nothing: a write etcd acknowledged is committed by a Raft quorum |
//! | `ProbeLiveness(h)` | range over `live/`: is a liveness key with holder `h` there (`AuthorityLease::Alive`, else `Expired`) |
//!
//! The **epoch guard**: the creation of epoch `g` (every change of owner) by anyone but the
//! owner of `g - 1` is in the same transaction also conditioned on the liveness key of
//! `g - 1` being absent (that owner's etcd lease expired or was revoked). So a taker can
//! never create `g` while the owner of `g - 1` still holds its etcd lease, whatever wall
//! clocks say. The owner of `g - 1` itself (releasing) needs no such condition: a liveness
//! key is created only once, by the transaction that created its epoch, so nobody else can
//! hold `g - 1`'s. (As on the file system, an owner that is stale but not superseded may
//! still release; its heartbeats, though, are `FENCED` once its etcd lease expired.) When the epoch
//! created is `active`, the same transaction puts the new owner's liveness key with a fresh
//! etcd lease of time to live `ceil(stale_after)`: epoch and liveness appear together.
//!
//! # Liveness and fencing
//!
//! The fencing token stays the generation. The etcd lease is kept alive only by
//! [`LeaseOps::heartbeat_within`] (one keep-alive per heartbeat, no background keeper), so
//! the cluster stops hearing the owner exactly when its heartbeats stop succeeding. The
//! owner self-fences when its last successful heartbeat *started* `self_fence_after` ago
//! ([`lease_core::must_self_fence`]); the cluster can drop its etcd lease no earlier than
//! `ttl >= stale_after >= self_fence_after + heartbeat` after that keep-alive was
//! *received*, which is after the heartbeat started. So the owner has fenced itself at
//! least one heartbeat before anyone may create the next epoch (clock *rates* assumed
//! comparable, as for the file system; leader changes only extend etcd leases).
//!
//! # Crash points
//!
//! Each request is one atomic etcd write (a put, a delete, or one transaction), so a crash
//! falls between requests, where lease-core guarantees a recoverable state. The etcd-only
//! steps, in order, for an active epoch: (1) grant a lease, (2) one transaction creating
//! the epoch *and* its liveness key; at release, (3) the release's requests, then (4)
//! revoke. A crash after (1) leaves an unused lease that expires; after (2), a retry by
//! the same owner and process adopts the epoch and takes its etcd lease from the liveness
//! key (`a_claim_cut_short_after_its_transaction_is_adopted_by_a_retry`), or, with no
//! retry, the lease expires and the owner is `dead`; before (4), the liveness key lingers
//! until its lease expires, which blocks nothing (the guard only looks one generation
//! back, at the released epoch, which has none).
//!
//! # Deadlines
//!
//! Every etcd call has a per-attempt deadline ([`EtcdOptions::call_timeout`], but at most
//! a third of what is left of the operation's, so a heartbeat gets several attempts before
//! its self-fence deadline even when one is routed to a member cut off) and every
//! operation an overall one ([`EtcdOptions::op_timeout`], or the caller's for
//! heartbeats). Within it, a call is retried after an availability error only where a
//! repeat is provably harmless:
//!
//! - reads, keep-alives and lease grants change no record; at the deadline they fail
//!   `UNAVAILABLE` (69: nothing was written, retry);
//! - a delete and the guarded heartbeat put are idempotent;
//! - the exclusive create is retried by the record's identity: its transaction reads the
//!   key's value when the compare fails, and a retry that finds exactly the bytes it writes
//!   after an attempt of its own went unanswered answers `Created` (that attempt landed
//!   and its answer was lost; an active epoch's liveness key is then ours too, put with the
//!   one etcd lease granted before the attempts, which is kept). Other bytes are
//!   `AlreadyExists`, as always; the same bytes without an unanswered attempt of ours are
//!   somebody else's identical request, `AlreadyExists` too (PROTOCOL §17);
//! - a lease revoke (best effort) is never repeated once sent.
//!
//! When the deadline passes after an attempt of a write was sent and not answered (a
//! timeout, or an availability error other than a refused connection), the write may have
//! landed after the client stopped waiting: the error is `OUTCOME_UNKNOWN` (71), naming
//! the run and the key, never `UNAVAILABLE`, because a blind retry of, say, an append
//! would append a second event. A write none of whose attempts reached a member is
//! `UNAVAILABLE`. lease-run's heartbeat counts an `OUTCOME_UNKNOWN` beat as failed (no
//! success, the self-fence deadline does not move); a claim retried by the same owner
//! adopts its own epoch (lease-core's adoption on retry).

mod call;
mod create;
mod liveness;
mod requests;

use crate::addr::AuthorityAddr;
use crate::error::EtcdError;
use call::{Call, classify};
use etcd_client::{Client, ConnectOptions};
use lease_core::ops::{OwnedLease, Request, Response, Status, StatusView, TakeoverParams};
use lease_core::{
    Dir, FileRef, Generation, LeaseError, LeaseOps, RunId, TailHint, Timestamp, TimingPolicy,
    Transport,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Deadlines of the etcd authority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Deadline of one attempt of one etcd call (default 1 s).
    pub call_timeout: Duration,
    /// Deadline of a whole operation (claim, release, status, ...), retries included
    /// (default 10 s). Heartbeats take their deadline from the caller.
    pub op_timeout: Duration,
    /// Deadline of establishing a connection to one member (default 1 s).
    pub connect_timeout: Duration,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            call_timeout: Duration::from_secs(1),
            op_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(1),
        }
    }
}

struct Inner {
    // Field order matters: the client (and its connection tasks) drops before the runtime.
    client: Client,
    prefix: String,
    opts: EtcdOptions,
    rt: tokio::runtime::Runtime,
}

/// A connection to an etcd cluster under one key prefix; opens [`EtcdRun`]s.
///
/// It owns a small private tokio runtime (one worker thread) that drives the gRPC
/// connections; the API is blocking, like lease-fs's `RunDir`. Call it from plain threads
/// or from `tokio::task::spawn_blocking`, never directly from async code (blocking on the
/// private runtime inside another runtime's worker panics). Drop it outside async code too.
#[derive(Clone)]
pub struct EtcdAuthority {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EtcdAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdAuthority")
            .field("prefix", &self.inner.prefix)
            .field("opts", &self.inner.opts)
            .finish()
    }
}

impl EtcdAuthority {
    /// Connect to the cluster at `addr`. Connections are made lazily and re-made as members
    /// come and go; an unreachable cluster shows as `UNAVAILABLE` on the first operation.
    pub fn connect(addr: &AuthorityAddr, opts: EtcdOptions) -> Result<EtcdAuthority, EtcdError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("lease-etcd")
            .enable_all()
            .build()
            .map_err(|e| EtcdError::Unavailable {
                run: "?".into(),
                op: "start runtime",
                key: String::new(),
                detail: e.to_string(),
            })?;
        let options = ConnectOptions::new()
            .with_connect_timeout(opts.connect_timeout)
            .with_timeout(opts.call_timeout)
            // gRPC keep-alive pings find a dead or stopped member's connection.
            .with_keep_alive(opts.call_timeout, opts.call_timeout)
            .with_keep_alive_while_idle(true)
            // A member cut off from the leader answers at once instead of waiting.
            .with_require_leader(true);
        let endpoints = addr.endpoints.clone();
        let prefix_key = format!("/{}/", addr.prefix);
        let client = rt
            .block_on(async {
                tokio::time::timeout(
                    opts.op_timeout,
                    Client::connect(endpoints.clone(), Some(options)),
                )
                .await
            })
            .map_err(|_| EtcdError::Unavailable {
                run: "?".into(),
                op: "connect",
                key: prefix_key.clone(),
                detail: format!(
                    "no connection to {} within {} ms",
                    endpoints.join(","),
                    opts.op_timeout.as_millis()
                ),
            })?
            .map_err(|e| classify(e, "?", "connect", &prefix_key))?;
        Ok(EtcdAuthority {
            inner: Arc::new(Inner {
                client,
                prefix: addr.prefix.clone(),
                opts,
                rt,
            }),
        })
    }

    /// The handle of one run under this authority's prefix.
    pub fn run(&self, run_id: RunId) -> EtcdRun {
        EtcdRun {
            base: format!("/{}/{}/", self.inner.prefix, run_id),
            inner: self.inner.clone(),
            run_id,
            owned: Mutex::new(BTreeMap::new()),
            tail: TailHint::new(),
            #[cfg(feature = "test-hooks")]
            lost_answers: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// The deadlines in force.
    pub fn options(&self) -> EtcdOptions {
        self.inner.opts
    }
}

/// A run whose authority is an etcd cluster: the operations of lease-fs's `RunDir`, by the
/// same lease-core step machines, with each request executed as etcd calls (module docs).
///
/// The handle remembers the etcd leases it was granted for the epochs it created; only the
/// handle that claimed (or took over) a generation can heartbeat or release it. Dropping
/// the handle without releasing behaves like a crash: the etcd lease runs out.
pub struct EtcdRun {
    inner: Arc<Inner>,
    run_id: RunId,
    base: String,
    /// etcd lease id per generation this handle owns.
    owned: Mutex<BTreeMap<Generation, i64>>,
    /// Tail of the event log (a hint, verified on use).
    tail: TailHint,
    /// Answers of writes still to be lost (feature `test-hooks`, [`EtcdRun::lose_write_answers`]).
    #[cfg(feature = "test-hooks")]
    lost_answers: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for EtcdRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdRun")
            .field("run_id", &self.run_id)
            .field("base", &self.base)
            .finish()
    }
}

/// etcd lease time to live for `stale_after`: whole seconds, rounded up (never shorter
/// than `stale_after`, see the module docs for why that direction is the safe one).
pub fn lease_ttl_secs(policy: &TimingPolicy) -> i64 {
    let ms = policy.stale_after_ms();
    i64::try_from(ms.div_ceil(1000)).unwrap_or(i64::MAX).max(1)
}

/// The instant by which an owner whose last successful heartbeat started at
/// `last_ok_started` must have fenced itself: pass it to [`LeaseOps::heartbeat_within`] so a
/// heartbeat never outlives the self-fence deadline.
pub fn self_fence_deadline(policy: &TimingPolicy, last_ok_started: Instant) -> Instant {
    last_ok_started + policy.self_fence_after()
}

fn fenced(run: &RunId, generation: Generation, detail: impl Into<String>) -> EtcdError {
    EtcdError::Lease(LeaseError::Fenced {
        run: run.to_string(),
        generation,
        detail: detail.into(),
    })
}

impl EtcdRun {
    /// The run id.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The key prefix of this run (`/<prefix>/<run id>/`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The key of a run file.
    pub fn key(&self, f: FileRef) -> String {
        format!("{}{}", self.base, f.path())
    }

    /// The key prefix of folder `d` (`<base><dir>/`).
    fn key_dir(&self, d: Dir) -> String {
        format!("{}{}/", self.base, d.path())
    }

    /// The liveness key of generation `g`.
    pub fn live_key(&self, g: Generation) -> String {
        format!("{}live/{:020}", self.base, g.get())
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.inner.opts.op_timeout
    }

    /// Whether the run is held by a live owner (status `active`), for quick checks.
    pub fn is_active(&self, now: Timestamp) -> Result<bool, EtcdError> {
        Ok(matches!(self.status(now, false)?.status, Status::Active))
    }
}

/// The etcd cluster as a lease-core [`Transport`]: every operation of
/// [`lease_core::LeaseOps`] runs on it, each request as etcd calls (module docs), within
/// the operation's deadline (`Bound = Instant`: [`EtcdOptions::op_timeout`] from the start
/// of the operation, or the caller's for [`LeaseOps::heartbeat_within`]).
///
/// The hooks are what etcd adds to the folder's protocol: a takeover is refused with
/// `TAKEOVER_ACTIVE_REFUSED` (76) while the owner's etcd lease is alive (the epoch guard
/// enforces the same inside the creating transaction); a claim or takeover adopts the
/// epoch's etcd lease; each heartbeat first sends one keep-alive and is `FENCED` once the
/// etcd lease expired (the cluster may already have let another owner in); a release
/// that ended the lease revokes it (on an availability error it is kept: the release may
/// be retried, which needs it, and otherwise expires by itself).
///
/// The caller of a heartbeat reads its monotonic clock *before* the call and, on `Ok`,
/// records that reading as the start of its last successful heartbeat; it passes
/// [`self_fence_deadline`] of the previous one as the bound, so a cut-off cluster costs it
/// at most until the instant it must fence itself anyway.
impl Transport for EtcdRun {
    type Error = EtcdError;
    type Bound = Instant;
    fn run_id(&self) -> &RunId {
        &self.run_id
    }
    fn default_bound(&self) -> Instant {
        self.deadline()
    }
    fn execute(&self, req: Request, deadline: Instant) -> Result<Response, EtcdError> {
        self.inner.rt.block_on(self.perform_async(req, deadline))
    }
    fn tail_hint(&self) -> &TailHint {
        &self.tail
    }
    fn before_takeover(&self, p: &TakeoverParams, deadline: Instant) -> Result<(), EtcdError> {
        let view = self.drive_within(
            &mut StatusView::read(self.run_id.clone(), p.now, false),
            deadline,
        )?;
        if let Some(head) = view.head.as_ref().filter(|h| h.is_active()) {
            if let Some(ttl_s) = self.owner_lease_ttl(head.generation())? {
                return Err(EtcdError::OwnerLeaseAlive {
                    run: self.run_id.to_string(),
                    held: Box::new(head.held_by()),
                    ttl_s,
                    stale_after_ms: head.epoch.policy.stale_after_ms(),
                });
            }
        }
        Ok(())
    }
    fn acquired(&self, lease: &OwnedLease, deadline: Instant) -> Result<(), EtcdError> {
        self.adopt_liveness(lease, deadline)
    }
    fn before_heartbeat(&self, lease: &OwnedLease, deadline: Instant) -> Result<(), EtcdError> {
        let g = lease.generation;
        let Some(id) = self.owned.lock().ok().and_then(|o| o.get(&g).copied()) else {
            return Err(fenced(
                &self.run_id,
                g,
                "this handle holds no etcd lease for it (it was never claimed here, or the lease expired or was released)",
            ));
        };
        let lk = self.live_key(g);
        let alive = self.inner.rt.block_on(self.call(
            "keep-alive",
            &lk,
            deadline,
            Call::Read,
            move |mut c| async move {
                match c.lease_keep_alive(id).await {
                    Ok(_) => Ok(true),
                    // etcd-client's answer to a keep-alive with TTL <= 0.
                    Err(etcd_client::Error::LeaseKeepAliveError(m)) if m == "lease not found" => {
                        Ok(false)
                    }
                    Err(e) => Err(e),
                }
            },
        ))?;
        if !alive {
            if let Ok(mut o) = self.owned.lock() {
                o.remove(&g);
            }
            return Err(fenced(
                &self.run_id,
                g,
                "its etcd lease expired (the cluster stopped hearing its keep-alives for stale_after)",
            ));
        }
        Ok(())
    }
    fn released(&self, lease: &OwnedLease) {
        // After the next epoch exists (or the lease was superseded) the liveness key is
        // no longer needed.
        let id = self
            .owned
            .lock()
            .ok()
            .and_then(|mut o| o.remove(&lease.generation));
        if let Some(id) = id {
            self.inner.rt.block_on(self.revoke_quietly(id));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ttl_rounds_stale_after_up_to_whole_seconds() {
        let p = |s| TimingPolicy::from_millis(250, 500, s, lease_core::HeartbeatDurability::Local);
        assert_eq!(lease_ttl_secs(&p(1_000).unwrap()), 1);
        assert_eq!(lease_ttl_secs(&p(1_001).unwrap()), 2);
        assert_eq!(lease_ttl_secs(&TimingPolicy::default()), 20);
    }
}
