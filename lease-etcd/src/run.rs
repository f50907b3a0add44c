//! The etcd authority: lease-core's requests executed as etcd calls, and the run
//! operations of lease-fs's `RunDir` on top of them.
//!
//! # Key layout
//!
//! Every file of the run folder becomes one key, `/<prefix>/<run id>/<FileRef::path()>`
//! (`.../lease/epochs/00000000000000000003.json`, `.../events/...`); a listing is a
//! keys-only range over `/<prefix>/<run id>/<dir>/` whose names are parsed exactly as on
//! disk. Liveness keys `/<prefix>/<run id>/live/<generation:020>` hold the owner's
//! [`Holder`] and are attached to the owner's etcd lease.
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

use crate::addr::AuthorityAddr;
use crate::error::EtcdError;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use lease_core::ops::{
    AuthorityLease, LivenessEvidence, LockEvidence, OwnedLease, ProcessState, Request, Response,
    Status, StatusView, TakeoverParams,
};
use lease_core::{
    Dir, EpochRecord, EpochState, FileRef, Generation, Holder, LeaseError, LeaseOps, RunId,
    Sequence, TailHint, Timestamp, TimingPolicy, Transport,
};
use std::collections::BTreeMap;
use std::future::Future;
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

/// Map an etcd-client error to `UNAVAILABLE` (try again: the cluster or a member is not
/// answering) or `ETCD_REFUSED` (it answered no).
fn classify(e: etcd_client::Error, run: &str, op: &'static str, key: &str) -> EtcdError {
    use etcd_client::Error as E;
    let unavailable = match &e {
        E::TransportError(_) | E::IoError(_) | E::LeaseKeepAliveError(_) => true,
        // gRPC status codes by their fixed numbers (the gRPC spec), so this crate needs
        // no direct tonic dependency: CANCELLED 1, UNKNOWN 2 (tonic's transport failures),
        // DEADLINE_EXCEEDED 4, RESOURCE_EXHAUSTED 8, ABORTED 10, UNAVAILABLE 14 (etcd's
        // "no leader" / "request timed out" / "leader changed").
        E::GRpcStatus(s) => matches!(s.code() as i32, 1 | 2 | 4 | 8 | 10 | 14),
        _ => false,
    };
    let detail = e.to_string();
    // RESOURCE_EXHAUSTED is also etcd's "too many requests" (a retry helps); a full
    // backend says "database space exceeded" (a retry never helps).
    if detail.contains("database space exceeded") {
        return EtcdError::NoSpace {
            run: run.to_string(),
            op,
            key: key.to_string(),
            detail,
        };
    }
    if unavailable {
        EtcdError::Unavailable {
            run: run.to_string(),
            op,
            key: key.to_string(),
            detail,
        }
    } else {
        EtcdError::Refused {
            run: run.to_string(),
            op,
            key: key.to_string(),
            detail,
        }
    }
}

/// Whether the call certainly never reached a member: somewhere in the error's cause
/// chain the TCP connection was refused.
fn never_sent(e: &etcd_client::Error) -> bool {
    use etcd_client::Error as E;
    let mut cur: Option<&(dyn std::error::Error + 'static)> = match e {
        E::GRpcStatus(s) => std::error::Error::source(s),
        E::TransportError(t) => std::error::Error::source(t),
        E::IoError(io) => Some(io),
        _ => None,
    };
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// How [`EtcdRun`]'s calls are retried after an availability error, and how they end
/// when the deadline passes (module docs, "Deadlines").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// Changes no record (a range, a keep-alive, a lease grant): retried until the
    /// deadline, then `UNAVAILABLE`.
    Read,
    /// A write that is safe to repeat (a delete, the guarded heartbeat put, the exclusive
    /// create, which tells its own earlier attempt by its bytes): retried until the
    /// deadline, then `OUTCOME_UNKNOWN` if an attempt was sent and not answered (it may
    /// have landed), else `UNAVAILABLE` (no attempt reached a member).
    Write,
    /// Best effort, not repeated once sent (a lease revoke): only a call that never
    /// reached a member is retried.
    Once,
}

/// Whether an exclusive create that found its key taken (`existing`, the value the
/// transaction read) found its own record: the value is byte for byte what this request
/// writes (`ours`), and an earlier attempt of this very request was sent and not answered
/// (`retried`), so it may have landed. Then that attempt created it and the answer is
/// `Created`.
///
/// Why this is safe (PROTOCOL §17): `create_revision == 0` lets at most one value ever
/// occupy the key, so an attempt that landed late either landed first (and the retry
/// reads its bytes) or fails its own compare; and equal bytes are the same record (owner
/// id, generation, sequence, previous hash, time: every field). Without an unanswered
/// attempt the same bytes are somebody else's identical request (two appends of the same
/// owner with the same type, payload and millisecond, say): `AlreadyExists`, as on the run
/// folder, so neither is told it wrote the other's event.
fn is_own_record(existing: Option<&[u8]>, ours: &[u8], retried: bool) -> bool {
    retried && existing == Some(ours)
}

/// The most store records one etcd range read asks for ([`EtcdRun`]'s `read_records`):
/// with records of at most 1 MiB, an answer is at most this many MiB.
const RECORDS_PER_RANGE: u32 = 32;

/// The largest range answer accepted when reading store records (etcd-client's default
/// decoding limit is 4 MiB): [`RECORDS_PER_RANGE`] records of 1 MiB and their keys.
const RANGE_ANSWER_BYTES: usize = 40 << 20;

/// How long one attempt of a call may wait when `remaining` is left of its operation's
/// deadline: `call_timeout`, but at most a third of what is left (and at least 100 ms),
/// so a call always gets about three attempts. A member cut off by a silent partition
/// holds an attempt routed to it until that attempt's end (nothing is refused); with a
/// heartbeat's deadline of `self_fence_after` (1.5 s in the partition harness) and the
/// 1 s default, one such attempt and a second unlucky one lapsed a healthy owner whose
/// cluster had a leader and a quorum all along (issue #31's fast-heal probe saw it).
fn attempt_budget(call_timeout: Duration, remaining: Duration) -> Duration {
    call_timeout.min((remaining / 3).max(Duration::from_millis(100)))
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

    /// One etcd call with deadlines: each attempt ends by `min(deadline, now +
    /// call_timeout)`; availability errors are retried until `deadline` as `kind` says
    /// ([`Call`]).
    async fn call<T, F, Fut>(
        &self,
        op: &'static str,
        key: &str,
        deadline: Instant,
        kind: Call,
        f: F,
    ) -> Result<T, EtcdError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.attempts(op, key, deadline, kind, f)
            .await
            .map(|(v, _)| v)
    }

    /// [`Self::call`], also saying whether an attempt before the one answered was sent and
    /// not answered (so it may have taken effect): what lets an exclusive create tell its
    /// own earlier attempt ([`is_own_record`]).
    ///
    /// When the deadline passes (or a [`Call::Once`] may not be retried) after an attempt
    /// of a [`Call::Write`] was sent and not answered (a timeout, or an availability error
    /// other than a refused connection), the error is `OUTCOME_UNKNOWN`, never
    /// `UNAVAILABLE`: the write may have landed. Errors etcd answered with
    /// (`ETCD_REFUSED`, `ETCD_NOSPACE`) end the call at once, as they are.
    async fn attempts<T, F, Fut>(
        &self,
        op: &'static str,
        key: &str,
        deadline: Instant,
        kind: Call,
        mut f: F,
    ) -> Result<(T, bool), EtcdError>
    where
        F: FnMut(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let run = self.run_id.as_str();
        let mut last: Option<EtcdError> = None;
        // Whether an attempt so far was sent and not answered.
        let mut unanswered = false;
        let unknown = |err: EtcdError, unanswered: bool| match err {
            EtcdError::Unavailable { detail, .. } if unanswered && kind == Call::Write => {
                EtcdError::OutcomeUnknown {
                    run: run.to_string(),
                    op,
                    key: key.to_string(),
                    file: None,
                    detail,
                }
            }
            e => e,
        };
        loop {
            let now = Instant::now();
            if now >= deadline {
                let err = last.unwrap_or_else(|| EtcdError::Unavailable {
                    run: run.to_string(),
                    op,
                    key: key.to_string(),
                    detail: "the operation's deadline passed before the call".into(),
                });
                return Err(unknown(err, unanswered));
            }
            let attempt_end =
                deadline.min(now + attempt_budget(self.inner.opts.call_timeout, deadline - now));
            let answer = tokio::time::timeout_at(
                tokio::time::Instant::from_std(attempt_end),
                f(self.inner.client.clone()),
            )
            .await;
            #[cfg(feature = "test-hooks")]
            let answer = match answer {
                Ok(Ok(_)) if kind == Call::Write && self.lose_answer() => Err(()),
                other => other.map_err(|_| ()),
            };
            let (err, sent) = match answer {
                Ok(Ok(v)) => return Ok((v, unanswered)),
                // A request that never left (the member refused the connection: the
                // client's balancer still picks a crashed member until it notices) changed
                // nothing, whatever the call.
                Ok(Err(e)) => {
                    let sent = !never_sent(&e);
                    (classify(e, run, op, key), sent)
                }
                Err(_) => (
                    EtcdError::Unavailable {
                        run: run.to_string(),
                        op,
                        key: key.to_string(),
                        detail: format!(
                            "no answer within {} ms",
                            attempt_end.saturating_duration_since(now).as_millis()
                        ),
                    },
                    true,
                ),
            };
            if !err.is_unavailable() {
                return Err(err);
            }
            unanswered |= sent;
            if kind == Call::Once && sent {
                return Err(unknown(err, unanswered));
            }
            last = Some(err);
            let pause = tokio::time::Instant::from_std(
                deadline.min(Instant::now() + Duration::from_millis(50)),
            );
            tokio::time::sleep_until(pause).await;
        }
    }

    /// Test hook (feature `test-hooks`): make the next `n` answered attempts of writes
    /// look unanswered, as if each answer was lost on its way back: the write took effect,
    /// the client times out and retries. How the tests show a retry adopting its own
    /// earlier attempt, and a write ending `OUTCOME_UNKNOWN`, deterministically.
    #[cfg(feature = "test-hooks")]
    pub fn lose_write_answers(&self, n: u32) {
        self.lost_answers
            .store(n, std::sync::atomic::Ordering::SeqCst);
    }

    #[cfg(feature = "test-hooks")]
    fn lose_answer(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.lost_answers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    async fn get_one(
        &self,
        key: String,
        keys_only: bool,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, EtcdError> {
        let k = key.clone();
        let resp = self
            .call("range", &key, deadline, Call::Read, move |mut c| {
                let k = k.clone();
                async move {
                    let opts = keys_only.then(|| GetOptions::new().with_keys_only());
                    c.get(k, opts).await
                }
            })
            .await?;
        Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
    }

    /// The entries of `dir` whose names parse, from a keys-only range read.
    async fn list(&self, dir: Dir, deadline: Instant) -> Result<Vec<FileRef>, EtcdError> {
        let p = format!("{}{}/", self.base, dir.path());
        let pk = p.clone();
        let resp = self
            .call("range", &p, deadline, Call::Read, move |mut c| {
                let pk = pk.clone();
                async move {
                    c.get(pk, Some(GetOptions::new().with_prefix().with_keys_only()))
                        .await
                }
            })
            .await?;
        // Names are parsed exactly as on disk: anything that is not a name the layout
        // produces (deeper keys, strays) is not a listed entry.
        Ok(resp
            .kvs()
            .iter()
            .filter_map(|kv| kv.key().strip_prefix(p.as_bytes()))
            .filter_map(|n| std::str::from_utf8(n).ok())
            .filter_map(|n| dir.parse_name(n))
            .collect())
    }

    /// Perform one request of a lease-core operation, finishing by `deadline`.
    async fn perform_async(&self, req: Request, deadline: Instant) -> Result<Response, EtcdError> {
        match req {
            Request::List(dir) => Ok(Response::Listing(self.list(dir, deadline).await?)),
            // Counted from a keys-only listing: over etcd the names come in one response
            // anyway (the run folder streams them).
            Request::CountEvents => {
                let (mut count, mut highest) = (0u64, 0u64);
                for f in self.list(Dir::Events, deadline).await? {
                    if let FileRef::Event(s) = f {
                        count += 1;
                        highest = highest.max(s.get());
                    }
                }
                Ok(Response::EventCount { count, highest })
            }
            Request::Read(f) => Ok(Response::Content(
                self.get_one(self.key(f), false, deadline).await?,
            )),
            Request::Exists(f) => Ok(Response::Exists(
                self.get_one(self.key(f), true, deadline).await?.is_some(),
            )),
            Request::CreateExclusive(f, bytes) => self.create(f, bytes, deadline).await,
            Request::CreateGuarded {
                file,
                bytes,
                generation,
            } => self.create_guarded(file, bytes, generation, deadline).await,
            Request::ReplaceGuarded {
                file,
                bytes,
                generation,
            } => {
                self.replace_guarded(file, bytes, generation, deadline)
                    .await
            }
            Request::ReadStoreRecords {
                from,
                max_count,
                max_bytes,
            } => {
                self.read_records(from, max_count, max_bytes, deadline)
                    .await
            }
            // A put is atomic and never torn: the record itself is the value, the older
            // one-record form every reader still accepts (lease_core::beat::SlotRead::Legacy).
            Request::WriteBeat {
                file: f,
                record: bytes,
                ..
            } => self.write_beat(f, bytes, deadline).await,
            Request::Remove(f, _durability) => {
                let key = self.key(f);
                let k = key.clone();
                self.call("delete", &key, deadline, Call::Write, move |mut c| {
                    let k = k.clone();
                    async move { c.delete(k, None).await }
                })
                .await
                .map_err(|e| e.about(f))?;
                Ok(Response::Done)
            }
            Request::ProbeLiveness(holder) => self.probe(&holder, deadline).await,
            // What a read returns was committed by a quorum, which is etcd's durability:
            // nothing visible can be lost to one member's power loss (PROTOCOL §7.0 SYNC).
            Request::SyncDir(_) => Ok(Response::Done),
            // This process's CLOCK_BOOTTIME (the takeover's look-to-commit window, OQ-5).
            Request::Monotonic => {
                let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
                let ns = u64::try_from(ts.tv_sec)
                    .unwrap_or(0)
                    .saturating_mul(1_000_000_000)
                    .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0));
                Ok(Response::Monotonic(ns))
            }
        }
    }

    /// One transaction writing `key`, retried within `deadline` ([`Call::Write`]: each
    /// transaction here is safe to repeat, see its caller); also whether an attempt before
    /// the one answered was sent and not answered ([`Self::attempts`]).
    async fn txn(
        &self,
        key: &str,
        deadline: Instant,
        txn: Txn,
    ) -> Result<(etcd_client::TxnResponse, bool), EtcdError> {
        self.attempts("txn", key, deadline, Call::Write, move |mut c| {
            let t = txn.clone();
            async move { c.txn(t).await }
        })
        .await
    }

    /// A heartbeat, as one guarded transaction, so that etcd itself refuses a deposed
    /// generation's beat (issue #31): the record of generation `g`'s heartbeat is put only
    /// while (1) no epoch above `g` exists, a range compare over every epoch key from
    /// `g + 1` on (prune removes epochs, so a point check on `g + 1` would not do), and (2)
    /// `g`'s liveness key exists, that is its owner's etcd lease is alive. The keep-alive
    /// before the heartbeat ([`LeaseOps::heartbeat_within`]'s `before_heartbeat`) checks
    /// (2) one request earlier; an owner paused between the two would otherwise land its
    /// beat after its lease expired and a taker created `g + 1`. Refused, nothing is
    /// written and the heartbeat is `FENCED` (never `Done`: a heartbeat that succeeded
    /// would extend the owner's self-fence deadline). Retried on unavailability: the put is
    /// idempotent, and a retry the guard refuses after an attempt that landed only answers
    /// `FENCED` for a beat nobody may act on any more.
    async fn write_beat(
        &self,
        f: FileRef,
        bytes: Vec<u8>,
        deadline: Instant,
    ) -> Result<Response, EtcdError> {
        let key = self.key(f);
        let FileRef::Beat(g) = f else {
            return Err(EtcdError::Lease(LeaseError::ProtocolViolation {
                detail: format!("a heartbeat write to {key}, which is not a heartbeat file"),
            }));
        };
        let mut compares = vec![Compare::version(self.live_key(g), CompareOp::Greater, 0)];
        compares.extend(self.no_epoch_above(g));
        let txn = Txn::new()
            .when(compares)
            .and_then(vec![TxnOp::put(key.clone(), bytes, None)]);
        let (resp, _) = self
            .txn(&key, deadline, txn)
            .await
            .map_err(|e| e.about(f))?;
        if resp.succeeded() {
            return Ok(Response::Done);
        }
        Err(fenced(
            &self.run_id,
            g,
            "etcd refused its heartbeat: a newer epoch exists or its etcd lease is gone",
        ))
    }

    /// The compare "no epoch above `g` exists": `create_revision = 0` over every epoch key
    /// from `g + 1` on, one range compare (prune removes epochs, so a point compare on
    /// `g + 1` could pass after a compaction). `None` when `g` is the last generation.
    fn no_epoch_above(&self, g: Generation) -> Option<Compare> {
        let from = Generation::new(g.get().checked_add(1)?)?;
        // Epoch keys are `<base>lease/epochs/<20 digits>.json`: the range ends at the
        // first key after that folder (`/` + 1 = `0`).
        let end = format!("{}0", self.key_dir(Dir::Epochs).trim_end_matches('/'));
        Some(
            Compare::create_revision(self.key(FileRef::Epoch(from)), CompareOp::Equal, 0)
                .with_range(end),
        )
    }

    /// The engine's guard (PROTOCOL §18.2, issue #32): create `f` only if it is absent and
    /// no epoch above `g` exists, as one transaction, so etcd itself refuses a deposed
    /// generation's store record, snapshot chunk or manifest. Its else branch reads `f`:
    /// present, the answer is `AlreadyExists` (or `Created` when it holds exactly these
    /// bytes after an attempt of this call went unanswered: the attempt landed, as for an
    /// exclusive create, [`is_own_record`]); absent, the failed compare was the epochs':
    /// `Superseded`. Retrying the same transaction is safe: at most one value ever
    /// occupies `f`, and once an epoch above `g` exists one always does (prune keeps the
    /// head), so a late attempt can only find the key taken or be refused.
    async fn create_guarded(
        &self,
        f: FileRef,
        bytes: Vec<u8>,
        g: Generation,
        deadline: Instant,
    ) -> Result<Response, EtcdError> {
        let key = self.key(f);
        let mut compares = vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)];
        compares.extend(self.no_epoch_above(g));
        let txn = Txn::new()
            .when(compares)
            .and_then(vec![TxnOp::put(key.clone(), bytes.clone(), None)])
            .or_else(vec![TxnOp::get(key.clone(), None)]);
        let (resp, retried) = self
            .txn(&key, deadline, txn)
            .await
            .map_err(|e| e.about(f))?;
        if resp.succeeded() {
            return Ok(Response::Created);
        }
        let existing: Option<Vec<u8>> = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        });
        if is_own_record(existing.as_deref(), &bytes, retried) {
            return Ok(Response::Created);
        }
        Ok(match existing {
            Some(_) => Response::AlreadyExists,
            None => Response::Superseded,
        })
    }

    /// A put of `f` guarded by "no epoch above `g`" (PROTOCOL §18: `run.json` in the
    /// engine), one transaction: `Done`, or `Superseded` with nothing written. Retried on
    /// unavailability: the put is idempotent, and once an epoch above `g` exists every
    /// attempt is refused.
    async fn replace_guarded(
        &self,
        f: FileRef,
        bytes: Vec<u8>,
        g: Generation,
        deadline: Instant,
    ) -> Result<Response, EtcdError> {
        let key = self.key(f);
        let txn = Txn::new()
            .when(self.no_epoch_above(g).into_iter().collect::<Vec<_>>())
            .and_then(vec![TxnOp::put(key.clone(), bytes, None)]);
        let (resp, _) = self
            .txn(&key, deadline, txn)
            .await
            .map_err(|e| e.about(f))?;
        Ok(if resp.succeeded() {
            Response::Done
        } else {
            Response::Superseded
        })
    }

    /// The store's records from `from` on, in key order (20-digit names sort as
    /// numbers): at most `max_count` of them, cut after the record that reaches
    /// `max_bytes`. Names that do not parse are skipped, as a listing skips them.
    ///
    /// Each etcd range read asks for at most [`RECORDS_PER_RANGE`] keys and accepts an
    /// answer of up to [`RANGE_ANSWER_BYTES`]: a record is at most 1 MiB, so one answer is
    /// bounded whatever the records hold (a range of 256 large records was a 15 MB answer,
    /// above etcd-client's default 4 MiB decoding limit, and a new host could not catch
    /// up: found by the engine store bench). Reads go on from the last key until the
    /// count or the bytes are reached or the folder ends.
    async fn read_records(
        &self,
        from: Sequence,
        max_count: u32,
        max_bytes: u64,
        deadline: Instant,
    ) -> Result<Response, EtcdError> {
        let dir = self.key_dir(Dir::StoreLog);
        // The first key after the folder (`/` + 1 = `0`).
        let end = format!("{}0", dir.trim_end_matches('/'));
        let mut out: Vec<(Sequence, Vec<u8>)> = Vec::new();
        let mut bytes = 0u64;
        let mut next = from;
        let want = max_count.max(1) as usize;
        loop {
            let start = self.key(FileRef::StoreRecord(next));
            let limit = RECORDS_PER_RANGE.min((want - out.len()) as u32);
            let (k, e) = (start.clone(), end.clone());
            let resp = self
                .call("range", &start, deadline, Call::Read, move |c| {
                    let (k, e) = (k.clone(), e.clone());
                    async move {
                        c.kv_client()
                            .max_decoding_message_size(RANGE_ANSWER_BYTES)
                            .get(
                                k,
                                Some(GetOptions::new().with_range(e).with_limit(i64::from(limit))),
                            )
                            .await
                    }
                })
                .await?;
            let got = resp.kvs().len();
            let mut last = None;
            for kv in resp.kvs() {
                let name = kv
                    .key()
                    .strip_prefix(dir.as_bytes())
                    .and_then(|n| std::str::from_utf8(n).ok());
                if let Some(FileRef::StoreRecord(s)) =
                    name.and_then(|n| Dir::StoreLog.parse_name(n))
                {
                    last = Some(s);
                    if out.len() < want && (out.is_empty() || bytes < max_bytes) {
                        bytes = bytes.saturating_add(kv.value().len() as u64);
                        out.push((s, kv.value().to_vec()));
                    }
                }
            }
            let full = out.len() >= want || bytes >= max_bytes;
            match last.and_then(|s| Sequence::new(s.get().checked_add(1)?)) {
                Some(n) if !full && got >= limit as usize => next = n,
                _ => break,
            }
        }
        Ok(Response::Records(out))
    }

    /// Exclusive create as one transaction (module docs: the epoch guard and the liveness
    /// key of a new active owner).
    async fn create(
        &self,
        f: FileRef,
        bytes: Vec<u8>,
        deadline: Instant,
    ) -> Result<Response, EtcdError> {
        let key = self.key(f);
        let mut compares = vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)];
        let mut then = vec![TxnOp::put(key.clone(), bytes.clone(), None)];
        // The generation whose owner's liveness key must be absent (module docs).
        let mut guard: Option<Generation> = None;
        let mut granted: Option<(Generation, i64)> = None;
        if let FileRef::Epoch(g) = f {
            if let Some(prev) = Generation::new(g.get() - 1) {
                let ours = self.owned.lock().is_ok_and(|o| o.contains_key(&prev));
                if !ours {
                    compares.push(Compare::create_revision(
                        self.live_key(prev),
                        CompareOp::Equal,
                        0,
                    ));
                    guard = Some(prev);
                }
            }
            // The operation built these bytes; a record that does not decode gets no
            // liveness key (and will be refused by every reader anyway).
            if let Ok(rec) = lease_core::decode_for::<EpochRecord>(&self.run_id, &bytes) {
                if rec.state == EpochState::Active {
                    let ttl = lease_ttl_secs(&rec.policy);
                    let lk = self.live_key(g);
                    let id = self
                        .call(
                            "lease grant",
                            &lk,
                            deadline,
                            Call::Read,
                            move |mut c| async move { c.lease_grant(ttl, None).await },
                        )
                        .await?
                        .id();
                    let holder = serde_json::to_vec(&rec.holder).map_err(|e| {
                        EtcdError::Lease(LeaseError::ProtocolViolation {
                            detail: format!("holder does not encode: {e}"),
                        })
                    })?;
                    then.push(TxnOp::put(
                        lk,
                        holder,
                        Some(PutOptions::new().with_lease(id)),
                    ));
                    granted = Some((g, id));
                }
            }
        }
        let txn = Txn::new()
            .when(compares)
            .and_then(then)
            // The value, not only the key: a retry finding exactly its own bytes was
            // preceded by an attempt of its own that landed (`is_own_record`).
            .or_else(vec![TxnOp::get(key.clone(), None)]);
        let result = self.txn(&key, deadline, txn).await;
        let (resp, retried) = match result {
            Ok(r) => r,
            Err(e) => {
                // Outcome unknown. The granted lease is remembered for `g` all the same: if
                // the epoch was created it is an attempt of this very call, and a retry of
                // the operation adopts it (lease-core's adoption on retry), after which this
                // handle must be able to keep that lease alive and release. If it was not
                // created, the entry is inert: only an `OwnedLease` of `g`, which exists
                // only if `g` is ours, is ever heartbeated, and the release guard compares
                // against the lease actually attached in etcd. Unused, it simply expires.
                if let (Some((g, id)), Ok(mut o)) = (granted, self.owned.lock()) {
                    o.insert(g, id);
                }
                return Err(e.about(f));
            }
        };
        let existing: Option<Vec<u8>> = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        });
        // Created by this attempt, or by an earlier attempt of this call whose answer was
        // lost: either way the record is ours, and so is an active epoch's liveness key,
        // which every attempt put with the one etcd lease granted above (so it is kept,
        // never revoked).
        if resp.succeeded() || is_own_record(existing.as_deref(), &bytes, retried) {
            if let (Some((g, id)), Ok(mut o)) = (granted, self.owned.lock()) {
                o.insert(g, id);
            }
            return Ok(Response::Created);
        }
        if let Some((_, id)) = granted {
            self.revoke_quietly(id).await;
        }
        if existing.is_some() {
            return Ok(Response::AlreadyExists);
        }
        match guard {
            Some(prev) => Err(EtcdError::Lease(LeaseError::TakeoverRace {
                run: self.run_id.to_string(),
                detail: format!(
                    "the owner of generation {prev} still holds its etcd lease; generation {} can be created only after it expires",
                    prev.get() + 1
                ),
            })),
            None => Err(EtcdError::Lease(LeaseError::ProtocolViolation {
                detail: format!("etcd refused the exclusive create of {key} without a reason"),
            })),
        }
    }

    /// Revoke an etcd lease, best effort within one call timeout (an unrevoked lease
    /// simply expires).
    async fn revoke_quietly(&self, id: i64) {
        let deadline = Instant::now() + self.inner.opts.call_timeout;
        let _ = self
            .call(
                "lease revoke",
                "",
                deadline,
                Call::Once,
                move |mut c| async move { c.lease_revoke(id).await },
            )
            .await;
    }

    /// Liveness as the cluster sees it: a liveness key holding `holder` exists while that
    /// owner's etcd lease is alive.
    ///
    /// The answer is the etcd lease itself ([`AuthorityLease`]): `Alive` while the key is
    /// there, `Expired` once the lease expired or was revoked, and lease-core judges by it
    /// alone (`lease_core::ops::definitely_dead`: dead exactly when it expired; a status
    /// read calls the owner active while it lives, whatever the heartbeat's age by a wall
    /// clock). That is sound because the owner fenced itself before its lease could expire
    /// (module docs). Nothing of the owner's host is observed from here: the process and
    /// the kernel owner lock are `Unknown`, the boot id is the holder's own.
    async fn probe(&self, holder: &Holder, deadline: Instant) -> Result<Response, EtcdError> {
        let p = format!("{}live/", self.base);
        let pk = p.clone();
        let resp = self
            .call("range", &p, deadline, Call::Read, move |mut c| {
                let pk = pk.clone();
                async move { c.get(pk, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        let mut alive = false;
        for kv in resp.kvs() {
            let h: Holder =
                serde_json::from_slice(kv.value()).map_err(|e| EtcdError::LivenessInvalid {
                    run: self.run_id.to_string(),
                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                    detail: format!("not a holder record: {e}"),
                })?;
            alive |= &h == holder;
        }
        Ok(Response::Liveness(LivenessEvidence {
            observer_boot_id: holder.boot_id.clone(),
            process: ProcessState::Unknown,
            owner_lock: LockEvidence::Unknown,
            lease: if alive {
                AuthorityLease::Alive
            } else {
                AuthorityLease::Expired
            },
        }))
    }

    /// Make sure this handle can keep `lease`'s etcd lease alive. A claim or takeover
    /// returns an epoch this handle did not create when it adopts the epoch of an earlier
    /// attempt of the same owner and process (lease-core's adoption on retry, e.g. after
    /// that attempt's handle died right after the creating transaction). The etcd lease is
    /// then taken over from the epoch's liveness key, which must hold this very holder;
    /// if the key is gone the lease already expired and the adopted epoch is `FENCED`.
    fn adopt_liveness(&self, lease: &OwnedLease, deadline: Instant) -> Result<(), EtcdError> {
        let g = lease.generation;
        if self.owned.lock().is_ok_and(|o| o.contains_key(&g)) {
            return Ok(());
        }
        let lk = self.live_key(g);
        let found = self.inner.rt.block_on(async {
            let k = lk.clone();
            let resp = self
                .call("range", &lk, deadline, Call::Read, move |mut c| {
                    let k = k.clone();
                    async move { c.get(k, None).await }
                })
                .await?;
            Ok::<_, EtcdError>(
                resp.kvs()
                    .first()
                    .map(|kv| (kv.lease(), kv.value().to_vec())),
            )
        })?;
        let Some((id, value)) = found else {
            return Err(fenced(
                &self.run_id,
                g,
                "the adopted epoch's etcd lease already expired",
            ));
        };
        let h: Holder = serde_json::from_slice(&value).map_err(|e| EtcdError::LivenessInvalid {
            run: self.run_id.to_string(),
            key: lk.clone(),
            detail: format!("not a holder record: {e}"),
        })?;
        if h != lease.holder {
            return Err(EtcdError::LivenessInvalid {
                run: self.run_id.to_string(),
                key: lk,
                detail: "the liveness key names another holder than the epoch".into(),
            });
        }
        if let Ok(mut o) = self.owned.lock() {
            o.insert(g, id);
        }
        Ok(())
    }

    /// Seconds left of the etcd lease of generation `g`'s owner, `None` when its
    /// liveness key is gone (lease expired or revoked, or never an active epoch).
    pub fn owner_lease_ttl(&self, g: Generation) -> Result<Option<i64>, EtcdError> {
        let deadline = self.deadline();
        let lk = self.live_key(g);
        self.inner.rt.block_on(async {
            let k = lk.clone();
            let resp = self
                .call("range", &lk, deadline, Call::Read, move |mut c| {
                    let k = k.clone();
                    async move { c.get(k, None).await }
                })
                .await?;
            let Some(kv) = resp.kvs().first() else {
                return Ok(None);
            };
            let id = kv.lease();
            let ttl = self
                .call(
                    "lease ttl",
                    &lk,
                    deadline,
                    Call::Read,
                    move |mut c| async move { c.lease_time_to_live(id, None).await },
                )
                .await?
                .ttl();
            // The key can outlive its lease by the leader's expiry sweep; report 0 then.
            Ok(Some(ttl.max(0)))
        })
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
    fn an_attempt_gets_at_most_a_third_of_what_is_left() {
        let ms = Duration::from_millis;
        // An ordinary operation (10 s): the call timeout.
        assert_eq!(attempt_budget(ms(1000), ms(10_000)), ms(1000));
        // A heartbeat with 1.5 s to its self-fence deadline: three attempts fit.
        assert_eq!(attempt_budget(ms(1000), ms(1500)), ms(500));
        // Never below 100 ms (then the deadline itself ends the attempt).
        assert_eq!(attempt_budget(ms(1000), ms(30)), ms(100));
    }

    #[test]
    fn lease_ttl_rounds_stale_after_up_to_whole_seconds() {
        let p = |s| TimingPolicy::from_millis(250, 500, s, lease_core::HeartbeatDurability::Local);
        assert_eq!(lease_ttl_secs(&p(1_000).unwrap()), 1);
        assert_eq!(lease_ttl_secs(&p(1_001).unwrap()), 2);
        assert_eq!(lease_ttl_secs(&TimingPolicy::default()), 20);
    }

    // PROTOCOL §17 (issue #31): a retried exclusive create adopts exactly its own record.
    #[test]
    fn a_retried_create_adopts_only_its_own_bytes_after_an_unanswered_attempt() {
        let ours = br#"{"sequence":7,"owner_id":"run-a"}"#.as_slice();
        // An earlier attempt landed and its answer was lost: the retry reads our bytes.
        assert!(is_own_record(Some(ours), ours, true));
        // Another value occupies the slot: somebody else's record.
        assert!(!is_own_record(
            Some(br#"{"sequence":7,"owner_id":"run-b"}"#),
            ours,
            true
        ));
        // One byte more or less is another record.
        assert!(!is_own_record(Some(&ours[..ours.len() - 1]), ours, true));
        // The key is absent (the compare failed for the epoch guard): not ours.
        assert!(!is_own_record(None, ours, true));
        // The same bytes with no unanswered attempt of ours: an identical request of
        // somebody else (two equal appends in one millisecond), not ours.
        assert!(!is_own_record(Some(ours), ours, false));
    }

    #[test]
    fn a_refused_connection_is_recognized_as_never_sent() {
        // A port nothing listens on: the call fails before any byte of it is sent, which is
        // what allows even a transaction to be retried on another member.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = rt.block_on(async {
            let mut c = Client::connect(
                [format!("http://127.0.0.1:{port}")],
                Some(ConnectOptions::new().with_connect_timeout(Duration::from_millis(500))),
            )
            .await?;
            c.get("k", None).await.map(|_| ())
        });
        let err = err.unwrap_err();
        assert!(never_sent(&err), "{err:?}");
        assert!(classify(err, "r", "range", "k").is_unavailable());
    }
}
