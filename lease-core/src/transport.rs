//! The operations of a run, written once over a [`Transport`].
//!
//! A backend (lease-fs's `RunDir` on a run folder, lease-etcd's `EtcdRun` on a cluster, a
//! test double) implements [`Transport`]: it carries out one [`Request`] and offers a few
//! hooks (etcd adopts and keeps alive its own lease, and revokes it after a release). Every
//! operation of PROTOCOL.md §7 (claim, heartbeat, release, takeover, retire, append, the
//! readers, verify, prune) is implemented **once**, by [`LeaseOps`], which every transport
//! gets for free: the operation's step machine is driven with [`crate::ops::drive`], the
//! transport performs each request. Adding an operation or a parameter is an edit here and
//! in the step machine; the backends do not change.
//!
//! Nothing here does I/O or reads a clock: wall time comes in the parameters, and what
//! bounds an operation (etcd's deadline) is the transport's own opaque
//! [`Transport::Bound`].
//!
//! ```
//! use lease_core::mem::MemTransport;
//! use lease_core::ops::ClaimParams;
//! use lease_core::{Holder, Identity, LeaseOps, RunId, Timestamp, TimingPolicy};
//!
//! let run = RunId::new("job").unwrap();
//! let t = MemTransport::new(run.clone());
//! let holder = Holder {
//!     host: Identity::new("host").unwrap(),
//!     boot_id: Identity::new("boot").unwrap(),
//!     pid: 42,
//!     start_time: 1,
//! };
//! let lease = t
//!     .claim(ClaimParams {
//!         run_id: run,
//!         owner_id: Identity::new("owner-1").unwrap(),
//!         holder,
//!         policy: TimingPolicy::default(),
//!         now: Timestamp::from_unix_millis(1_000).unwrap(),
//!         store_floor: None,
//!     })
//!     .unwrap();
//! assert_eq!(lease.generation.get(), 1);
//! t.heartbeat(&lease, Timestamp::from_unix_millis(2_000).unwrap(), 1, None).unwrap();
//! ```

use crate::ops::{
    Append, AppendParams, Appended, Claim, ClaimParams, CompactPolicy, EventLogView, Heartbeat,
    JudgeLog, JudgedEvent, Operation, OwnedLease, Prune, PruneParams, PruneReport, ReadEvents,
    Release, ReleaseParams, Request, Response, Retire, RetireParams, Retired, StatusView, Takeover,
    TakeoverParams, Verify, VerifyReport,
};
use crate::{Code, Digest, EpochRecord, FileRef, Generation, Identity, LeaseError, RunId};
use crate::{Sequence, Timestamp};
use std::sync::Mutex;

/// The last event a handle appended (sequence and hash): a hint that spares the next
/// append its search for the tail. Always verified on use (PROTOCOL.md §7.6), so a stale
/// hint costs a search, never a wrong link.
#[derive(Debug, Default)]
pub struct TailHint(Mutex<Option<(Sequence, Digest)>>);

impl TailHint {
    /// An empty hint.
    pub fn new() -> TailHint {
        TailHint::default()
    }

    /// The hint, if any (a poisoned lock reads as none: the hint is only an optimization).
    pub fn get(&self) -> Option<(Sequence, Digest)> {
        self.0.lock().ok().and_then(|t| t.clone())
    }

    /// Remember the tail after a successful append.
    pub fn set(&self, sequence: Sequence, hash: Digest) {
        if let Ok(mut t) = self.0.lock() {
            *t = Some((sequence, hash));
        }
    }
}

/// A backend that carries out lease-core's requests for one run.
///
/// Only [`Transport::run_id`], [`Transport::default_bound`], [`Transport::execute`] and
/// [`Transport::tail_hint`] are required; the hooks default to doing nothing.
pub trait Transport {
    /// The backend's error: its own I/O or cluster failures, and lease-core's refusals.
    type Error: From<LeaseError>;
    /// What bounds one operation: etcd's deadline, `()` for a file system (the caller
    /// bounds its blocking calls).
    type Bound: Copy;

    /// The run this transport serves.
    fn run_id(&self) -> &RunId;

    /// The bound of an operation whose caller gave none (etcd: now + its operation
    /// timeout, read when the operation starts).
    fn default_bound(&self) -> Self::Bound;

    /// Carry out one request.
    fn execute(&self, req: Request, bound: Self::Bound) -> Result<Response, Self::Error>;

    /// Where this handle keeps its append tail hint.
    fn tail_hint(&self) -> &TailHint;

    /// The name of the monotonic clock [`Request::Monotonic`] reads (lease-fs: the boot id
    /// and the time namespace of its `CLOCK_BOOTTIME`), or `None` if it cannot be named.
    /// Heartbeats are stamped with it and a status read ages a beat stamped on the same
    /// clock on that clock (PROTOCOL.md §10, the same-clock rule). Default: `None`, so
    /// beats carry no stamp and every age is a wall-clock age.
    fn clock_domain(&self) -> Option<Identity> {
        None
    }

    /// Called once before each operation's first request (the run folder re-checks that
    /// its root is still the folder it opened).
    fn begin(&self) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Called before a takeover's step machine starts (etcd refuses while the owner's
    /// own etcd lease is alive, whatever wall clocks say).
    fn before_takeover(&self, _p: &TakeoverParams, _bound: Self::Bound) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Called after a claim or takeover returned `lease` (etcd makes sure this handle can
    /// keep that epoch's etcd lease alive, adopting it after a retried attempt).
    fn acquired(&self, _lease: &OwnedLease, _bound: Self::Bound) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Called before a heartbeat's step machine starts (etcd sends its keep-alive and
    /// answers `FENCED` if its etcd lease expired).
    fn before_heartbeat(
        &self,
        _lease: &OwnedLease,
        _bound: Self::Bound,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Called after a release of `lease` that ended the lease: it released, or it was
    /// superseded (`FENCED`). Not called after a transport failure, which may be retried
    /// (etcd revokes its etcd lease here).
    fn released(&self, _lease: &OwnedLease) {}
}

/// Every operation of a run, implemented once for every [`Transport`] (see the module
/// docs). Bring it into scope with `use lease_core::LeaseOps`.
pub trait LeaseOps: Transport {
    /// Run a step machine to completion within `bound`: [`Transport::begin`], then each
    /// request through [`Transport::execute`]. A transport failure is returned as is; a
    /// refusal of the machine converts into the transport's error.
    fn drive_within<O: Operation>(
        &self,
        op: &mut O,
        bound: Self::Bound,
    ) -> Result<O::Output, Self::Error> {
        self.begin()?;
        crate::ops::drive(op, |req| self.execute(req, bound))
    }

    /// Run a step machine to completion within the default bound.
    fn drive<O: Operation>(&self, op: &mut O) -> Result<O::Output, Self::Error> {
        self.drive_within(op, self.default_bound())
    }

    /// Carry out one request within the default bound (for adapters and tests).
    fn perform(&self, req: Request) -> Result<Response, Self::Error> {
        self.execute(req, self.default_bound())
    }

    /// Claim a free run (PROTOCOL.md §7.1).
    ///
    /// Refused over a holder (`RUN_ALREADY_ACTIVE`, `RUN_STALE_REQUIRES_TAKEOVER`), the
    /// refusal is made precise by a liveness probe ([`LeaseOps::status`] with `probe`,
    /// read-only, after the claim wrote nothing): a holder proved dead is
    /// `RUN_DEAD_REQUIRES_RETIREMENT` (retire it, then claim). A probe that fails leaves
    /// the claim's own refusal.
    fn claim(&self, p: ClaimParams) -> Result<OwnedLease, Self::Error> {
        same_run(self.run_id(), &p.run_id)?;
        let bound = self.default_bound();
        let now = p.now;
        self.begin()?;
        let lease = crate::ops::drive_split(&mut Claim::new(p), |req| self.execute(req, bound))?
            .map_err(|e| {
                crate::ops::refine_claim_refusal(e, || {
                    self.status(now, true)
                        .is_ok_and(|v| v.status == crate::ops::Status::Dead)
                })
            })?;
        self.acquired(&lease, bound)?;
        Ok(lease)
    }

    /// Exact takeover of a stale owner (§7.4).
    fn takeover(&self, p: TakeoverParams) -> Result<OwnedLease, Self::Error> {
        self.takeover_reporting(p).map(|(lease, _)| lease)
    }

    /// [`LeaseOps::takeover`], also saying whether it may have replaced a live owner
    /// ([`crate::ops::Preempted`], §7.4 step 11, OQ-5): a caller about to start work as the
    /// new owner waits the replaced owner's `self_fence_after` first when it did.
    fn takeover_reporting(
        &self,
        p: TakeoverParams,
    ) -> Result<(OwnedLease, Option<crate::ops::Preempted>), Self::Error> {
        same_run(self.run_id(), &p.run_id)?;
        let bound = self.default_bound();
        self.before_takeover(&p, bound)?;
        let mut op = Takeover::new(p);
        let lease = self.drive_within(&mut op, bound)?;
        self.acquired(&lease, bound)?;
        Ok((lease, op.preempted().cloned()))
    }

    /// Retire a definitely-dead owner; the run becomes free (§7.5).
    fn retire(&self, p: RetireParams) -> Result<Retired, Self::Error> {
        same_run(self.run_id(), &p.run_id)?;
        self.drive(&mut Retire::new(p))
    }

    /// Heartbeat number `count` (1, 2, ...) of `lease`, reporting the owner's store head
    /// (its last acknowledged commit, read before the beat started), within the default
    /// bound (§7.2). `FENCED` if a higher generation exists.
    fn heartbeat(
        &self,
        lease: &OwnedLease,
        now: Timestamp,
        count: u64,
        store_head: Option<u64>,
    ) -> Result<(), Self::Error> {
        self.heartbeat_within(lease, now, count, store_head, self.default_bound())
    }

    /// [`LeaseOps::heartbeat`] within `bound` (etcd: the owner's self-fence deadline, so a
    /// heartbeat never outlives the instant its owner must fence itself anyway).
    fn heartbeat_within(
        &self,
        lease: &OwnedLease,
        now: Timestamp,
        count: u64,
        store_head: Option<u64>,
        bound: Self::Bound,
    ) -> Result<(), Self::Error> {
        let mut op = Heartbeat::new(lease, now, count)?
            .with_store_head(store_head)?
            .on_clock(self.clock_domain());
        self.before_heartbeat(lease, bound)?;
        self.drive_within(&mut op, bound)
    }

    /// [`LeaseOps::heartbeat_within`], written durably whatever the policy
    /// ([`Heartbeat::durable`]): once it returns, `store_head` is the floor any replacer
    /// of this owner records, after a crash or a power loss alike. An owner acknowledges
    /// a commit after such a beat to make the floor cover every acknowledged commit.
    fn heartbeat_durable_within(
        &self,
        lease: &OwnedLease,
        now: Timestamp,
        count: u64,
        store_head: Option<u64>,
        bound: Self::Bound,
    ) -> Result<(), Self::Error> {
        let mut op = Heartbeat::new(lease, now, count)?
            .with_store_head(store_head)?
            .on_clock(self.clock_domain())
            .durable();
        self.before_heartbeat(lease, bound)?;
        self.drive_within(&mut op, bound)
    }

    /// Release the lease with the store's seal, if any (§7.3); returns the release
    /// epoch's generation. `FENCED` (a no-op) if superseded. Then compacts the lease when
    /// due (§7.3 step 7, [`CompactPolicy::DEFAULT`]): best-effort, never this release's
    /// error (see [`LeaseOps::release_compacting`]).
    fn release(&self, p: ReleaseParams) -> Result<Generation, Self::Error> {
        self.release_compacting(p, Some(CompactPolicy::DEFAULT))
    }

    /// [`LeaseOps::release`] with the compaction of §7.3 step 7 under `compact` (`None`:
    /// none; the caller compacts by itself, as lease-run does once its owner lock is let
    /// go). Once the release itself is durable ([`Release::committed`]), nothing fails it:
    /// a refusal of the prune is dropped, and so is a failed request of the prune (the
    /// transport's error): the release's generation is returned, and the next release
    /// tries again.
    fn release_compacting(
        &self,
        p: ReleaseParams,
        compact: Option<CompactPolicy>,
    ) -> Result<Generation, Self::Error> {
        let lease = p.lease.clone();
        self.begin()?;
        let bound = self.default_bound();
        let mut op = Release::new(p).compacting(compact);
        let outcome = match crate::ops::drive_split(&mut op, |req| self.execute(req, bound)) {
            Ok(outcome) => outcome,
            Err(e) => match op.committed() {
                // A request of the compaction failed: the release stands.
                Some(g) => Ok(g),
                None => return Err(e),
            },
        };
        // Released, or superseded: either way the lease has ended.
        if outcome.is_ok() || outcome.as_ref().is_err_and(|e| e.code() == Code::Fenced) {
            self.released(&lease);
        }
        outcome.map_err(Self::Error::from)
    }

    /// The run's status (§7.8); with `probe`, an active owner's liveness decides `dead` (and an
    /// authority's live lease `active`, whatever the wall clock says).
    fn status(&self, now: Timestamp, probe: bool) -> Result<StatusView, Self::Error> {
        self.drive(
            &mut StatusView::read(self.run_id().clone(), now, probe).on_clock(self.clock_domain()),
        )
    }

    /// Read and decode epoch `g` (`None` if absent: never created, or pruned).
    fn read_epoch(&self, g: Generation) -> Result<Option<EpochRecord>, Self::Error> {
        let f = FileRef::Epoch(g);
        match self.perform(Request::Read(f))? {
            Response::Content(None) => Ok(None),
            Response::Content(Some(bytes)) => Ok(Some(
                crate::decode_for(self.run_id(), &bytes).map_err(|e| e.in_file(f.path()))?,
            )),
            other => Err(LeaseError::ProtocolViolation {
                detail: format!("Read answered {other:?}"),
            }
            .into()),
        }
    }

    /// What the chain requires of the store the owner of generation `g` opens: the seal and
    /// floor from its own epoch and the one its claim or takeover replaced
    /// ([`crate::seal::Requirements::from_chain`]). Two reads, nothing written. Its own
    /// epoch missing (pruned, or `g` was never claimed) is `CHAIN_BROKEN`.
    fn store_requirements(&self, g: Generation) -> Result<crate::seal::Requirements, Self::Error> {
        let own = self.read_epoch(g)?.ok_or_else(|| LeaseError::ChainBroken {
            run: self.run_id().to_string(),
            chain: "epoch",
            at: g.get(),
            detail: format!("epoch {g} is missing: the store's requirements cannot be read"),
        })?;
        let replaced = match g.get().checked_sub(1).and_then(Generation::new) {
            Some(prev) => self.read_epoch(prev)?,
            None => None,
        };
        Ok(crate::seal::Requirements::from_chain(
            &own,
            replaced.as_ref(),
        ))
    }

    /// Append an event as the owner of `lease` (§7.6): returns when the event is durable
    /// and authoritative, `FENCED` when it does not count. A `tail_hint` of `None` is
    /// filled from this handle's [`TailHint`].
    fn append(&self, lease: &OwnedLease, mut p: AppendParams) -> Result<Appended, Self::Error> {
        if p.tail_hint.is_none() {
            p.tail_hint = self.tail_hint().get();
        }
        let now = p.now;
        let a = self.drive(&mut Append::new(lease, p))?;
        self.tail_hint().set(a.sequence, a.hash.clone());
        // Every MARK_EVERY-th event of the log, its appender checks the tail since the
        // newest mark and leaves a new one (PROTOCOL §13.1), so a later tail check by
        // `append`, `run` or `status` stays short even when only in-process appenders
        // (which check nothing themselves) wrote the log. Best-effort: the event is
        // already acknowledged; a tail that does not verify is refused, with its code, by
        // the next entry point that checks it, and no mark is written over it.
        if a.sequence.get() % crate::ops::MARK_EVERY == 0 {
            if let Ok(VerifyReport {
                last: Some((s, h)), ..
            }) = self.verify_tail()
            {
                let _ = self.write_mark(s, h, lease.owner_id.clone(), now);
            }
        }
        Ok(a)
    }

    /// Read and judge the whole event log (§7.9). With `finalize_as`, pending cutoffs are
    /// finalized (a write); without, the read is read-only.
    fn read_events(
        &self,
        finalize_as: Option<(Identity, Timestamp)>,
    ) -> Result<EventLogView, Self::Error> {
        self.drive(&mut ReadEvents::new(self.run_id().clone(), finalize_as))
    }

    /// Read and judge the event log one event at a time, memory flat in its length: a
    /// read-only first pass verifies the log link by link and reads the chain
    /// ([`ReadEvents::chain_only`]), then each event is read again and handed to `each`,
    /// judged ([`JudgeLog`]), until `each` returns `false`. The judgments are those of
    /// [`LeaseOps::read_events`] with `None`.
    fn for_each_event(
        &self,
        each: &mut dyn FnMut(&JudgedEvent) -> bool,
    ) -> Result<(), Self::Error> {
        let view = self.drive(&mut ReadEvents::chain_only(self.run_id().clone(), None))?;
        let mut pass = JudgeLog::new(self.run_id().clone(), view);
        while let Some(req) = pass.request() {
            let judged = pass.feed(self.perform(req)?)?;
            if !each(&judged) {
                break;
            }
        }
        Ok(())
    }

    /// Walk both hash chains (§13), the whole log from event 1 and every
    /// verified-prefix mark checked against its event.
    fn verify(&self) -> Result<VerifyReport, Self::Error> {
        self.drive(&mut Verify::new(self.run_id().clone()))
    }

    /// [`LeaseOps::verify`], but the log walked only from its newest verified-prefix mark
    /// (§13.1, [`Verify::tail`]): the check of `append`, `run`, `status` and every
    /// change of owner, whose cost does not grow with the log. Read-only.
    fn verify_tail(&self) -> Result<VerifyReport, Self::Error> {
        self.drive(&mut Verify::tail(self.run_id().clone()))
    }

    /// The last sequence of the log (0 when empty), from the newest verified-prefix mark
    /// with `Exists` probes ([`crate::ops::LogEnd`]): O(log n), never a listing of the
    /// events; checks nothing.
    fn log_end(&self) -> Result<u64, Self::Error> {
        self.drive(&mut crate::ops::LogEnd::new())
    }

    /// Leave a verified-prefix mark at event `through`, which the caller verified to hash
    /// to `hash` ([`crate::ops::WriteMark`]: events fsynced first, then the mark, then
    /// older marks removed). A writer calls it with [`VerifyReport::mark_due`] once its
    /// own write succeeded, never on a refusal.
    fn write_mark(
        &self,
        through: Sequence,
        hash: Digest,
        by: Identity,
        now: Timestamp,
    ) -> Result<Sequence, Self::Error> {
        let mut op = crate::ops::WriteMark::new(self.run_id().clone(), through, hash, by, now)?;
        self.drive(&mut op)
    }

    /// Commit one record of the engine-committed store as the owner of `lease` (§18.3):
    /// acknowledged only once the engine created it under its guard. On a transport
    /// failure the outcome is unknown: resolve it with [`LeaseOps::resolve_record`] on the
    /// same machine, never with a new record.
    fn commit_record(
        &self,
        lease: &OwnedLease,
        p: crate::ops::CommitParams,
    ) -> Result<crate::ops::Committed, Self::Error> {
        let mut op = crate::ops::CommitRecord::new(lease, p)?;
        self.drive(&mut op)
    }

    /// Resolve a commit whose answer was lost: the same record in the same slot
    /// ([`crate::ops::CommitRecord::again`]). `Ok` means it is committed (by this attempt
    /// or the lost one); `FENCED` that it never will be.
    fn resolve_record(
        &self,
        pending: &crate::ops::CommitRecord,
    ) -> Result<crate::ops::Committed, Self::Error> {
        self.drive(&mut pending.again())
    }

    /// Read and check the store's record log (§18.4) as the owner of `as_of` (or an
    /// observer), keeping the records after `keep_after`.
    fn read_store_log(
        &self,
        as_of: Option<Generation>,
        keep_after: u64,
    ) -> Result<crate::ops::StoreLogView, Self::Error> {
        self.drive(&mut crate::ops::ReadStoreLog::new(
            self.run_id().clone(),
            as_of,
            keep_after,
        ))
    }

    /// Read a snapshot's image, each chunk checked (§18.5).
    fn read_snapshot(
        &self,
        file: FileRef,
        manifest: crate::store_log::SnapshotManifest,
    ) -> Result<Vec<u8>, Self::Error> {
        self.drive(&mut crate::ops::ReadSnapshot::new(
            self.run_id().clone(),
            file,
            manifest,
        ))
    }

    /// Write a snapshot of the store after `tail` under the engine's guard (§18.5);
    /// returns its manifest's file.
    fn write_snapshot(
        &self,
        lease: &OwnedLease,
        tail: &crate::store_log::StoreTail,
        image: Vec<u8>,
        nonce: u64,
        now: Timestamp,
    ) -> Result<FileRef, Self::Error> {
        let mut op = crate::ops::WriteSnapshot::new(lease, tail, image, nonce, now)?;
        self.drive(&mut op)
    }

    /// Remove what the snapshot `keep` made unnecessary: the records up to its `through`
    /// and older snapshots (§18.5). Run after `keep` was written.
    fn truncate_store_log(&self, keep: FileRef) -> Result<crate::ops::Truncated, Self::Error> {
        self.drive(&mut crate::ops::TruncateStoreLog::new(keep))
    }

    /// Compact old epochs, cutoffs, heartbeats and intents (§7.10).
    fn prune(&self, p: PruneParams) -> Result<PruneReport, Self::Error> {
        same_run(self.run_id(), &p.run_id)?;
        self.drive(&mut Prune::new(p))
    }
}

impl<T: Transport + ?Sized> LeaseOps for T {}

/// Parameters built for another run than the transport's are refused, before any request.
fn same_run(transport: &RunId, params: &RunId) -> Result<(), LeaseError> {
    if transport == params {
        Ok(())
    } else {
        Err(LeaseError::ArgumentInvalid {
            what: "run_id",
            reason: format!("the parameters name run {params}, this handle serves run {transport}"),
        })
    }
}
