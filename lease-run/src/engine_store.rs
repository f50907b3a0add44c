//! The engine-committed store (docs/PROTOCOL.md §18, issue #32): the run's store when its
//! lease lives in an engine (etcd). Every group commit is a record the engine creates
//! under its guard; the SQLite file on this host (`store/view.sqlite`) is only a view of
//! the engine's log, caught up or rebuilt at open and applied record by record after.
//!
//! [`crate::Run`] uses it when its authority commits in the engine
//! ([`crate::LeaseAuthority::commits_in_engine`]): the owner's open catches the view up
//! ([`EngineLog::catch_up`]), each group commit is a record, and every 1024 records a
//! snapshot is written and the log truncated behind it. [`EngineReader`] reads the store
//! without a lease. [`EngineStore`] holds a log with its view, for callers of this module
//! alone (tests, examples, a library user composing the layers).
//!
//! ```
//! use lease_core::mem::MemTransport;
//! use lease_core::ops::ClaimParams;
//! use lease_core::{Holder, Identity, LeaseOps, RunId, Timestamp, TimingPolicy};
//! use lease_run::engine_store::EngineStore;
//! use lease_run::Batch;
//!
//! let run = RunId::new("job").unwrap();
//! let engine = MemTransport::new(run.clone());
//! let now = Timestamp::from_unix_millis(1_000).unwrap();
//! let holder = Holder {
//!     host: Identity::new("host-a").unwrap(),
//!     boot_id: Identity::new("boot").unwrap(),
//!     pid: 42,
//!     start_time: 1,
//! };
//! let lease = engine.claim(ClaimParams {
//!     run_id: run.clone(),
//!     owner_id: Identity::new("owner-1").unwrap(),
//!     holder,
//!     policy: TimingPolicy::default(),
//!     now,
//!     store_floor: None,
//! })?;
//! let dir = tempfile::tempdir()?;
//! let mut store = EngineStore::open_at(&engine, &lease, dir.path())?;
//! let mut n = 0u64;
//! let seqs = store.commit_group(&engine, &[Batch::new().put("k", "v")], now, &mut || {
//!     n += 1;
//!     n
//! })?;
//! assert_eq!(seqs, [1]);
//! assert_eq!(store.view().get("k")?.unwrap().value, b"v");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use crate::error::RunError;
use lease_core::ops::{
    CommitParams, CommitRecord, LoggedRecord, OwnedLease, StoreLogView, commit_id,
};
use lease_core::store_log::{
    Blob, DEFAULT_BUDGET_BYTES, RecordBatch, RecordWrite, StoreRecord, StoreTail, pack_batches,
};
use lease_core::{Code, LeaseOps, RunId, Timestamp, Transport};
use lease_sqlite::{Batch, Store, ViewPosition, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

/// How the store folder is reached: a function opening it (beneath the run's held root,
/// as the run layer does) and its path, for messages.
pub struct StoreDir<'a> {
    /// Open the folder (called once per use: a rebuild and the open after it).
    pub open: &'a dyn Fn() -> std::io::Result<OwnedFd>,
    /// Its path, for messages.
    pub path: PathBuf,
}

/// What [`EngineStore::open`] did to the local view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// The view was at the log's tail.
    UpToDate,
    /// The view was a prefix of the log; this many records were applied.
    Applied(usize),
    /// The view was missing, ahead of the log, different from it, or older than the
    /// snapshot: rebuilt (from the snapshot's image, if any), then this many records
    /// applied.
    Rebuilt(usize),
}

/// The owner's state of the engine-committed store, apart from its view: the log's tail,
/// and a commit whose outcome is unknown, if any (resolved before anything else is
/// committed). The run layer keeps the view where it keeps a local store (behind the
/// fence) and this beside it; [`EngineStore`] holds both, for callers of this module alone.
pub struct EngineLog {
    lease: OwnedLease,
    tail: StoreTail,
    unresolved: Option<CommitRecord>,
    budget: u64,
    caught_up: CatchUp,
    /// Records after the newest snapshot (what a new host's catch-up applies one by one).
    since_snapshot: u64,
    /// [`SNAPSHOT_EVERY_RECORDS`], unless set.
    snapshot_every: u64,
}

/// After this many records past the newest snapshot, a commit also writes a snapshot and
/// truncates the log (§18.5), so a new host's catch-up applies at most about this many
/// records after one image.
pub const SNAPSHOT_EVERY_RECORDS: u64 = 1024;

impl std::fmt::Debug for EngineLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineLog")
            .field("run", &self.lease.run_id)
            .field("generation", &self.lease.generation)
            .field("tail", &self.tail)
            .field(
                "unresolved",
                &self.unresolved.as_ref().map(|u| u.sequence()),
            )
            .finish_non_exhaustive()
    }
}

/// The engine-committed store with its view: [`EngineLog`] and the [`Store`] it keeps.
#[derive(Debug)]
pub struct EngineStore {
    log: EngineLog,
    view: Store,
}

fn position_of(tail: &StoreTail) -> ViewPosition {
    match &tail.last {
        Some((s, h)) => ViewPosition {
            record_seq: s.get(),
            record_hash: Some(h.clone()),
            commits: tail.commits,
        },
        None => ViewPosition::EMPTY,
    }
}

fn batches_of(r: &StoreRecord) -> Vec<Batch> {
    r.batches.iter().map(Batch::from).collect()
}

/// A new view in `dir` at the snapshot `log` starts from (its image), or empty.
fn rebuild<A: Transport + ?Sized>(
    auth: &A,
    run: &RunId,
    log: &StoreLogView,
    dir: &StoreDir<'_>,
) -> Result<Store, RunError>
where
    RunError: From<A::Error>,
{
    let (image, at) = match &log.snapshot {
        Some((file, m)) => (
            Some(auth.read_snapshot(*file, m.clone())?),
            ViewPosition {
                record_seq: m.through.get(),
                record_hash: Some(m.through_hash.clone()),
                commits: m.commits.get(),
            },
        ),
        None => (None, ViewPosition::EMPTY),
    };
    let io = |e: std::io::Error| RunError::os(dir.path.display().to_string(), e);
    Store::build_view_in(
        run,
        (dir.open)().map_err(io)?,
        &dir.path,
        image.as_deref(),
        &at,
    )?;
    Ok(Store::open_view_in(
        run,
        (dir.open)().map_err(io)?,
        &dir.path,
        false,
    )?)
}

/// Apply `records` (checked, in order, each following the view's position) to `view`.
fn apply_records(view: &mut Store, records: &[LoggedRecord]) -> Result<(), RunError> {
    for r in records {
        let to = ViewPosition {
            record_seq: r.record.sequence.get(),
            record_hash: Some(r.hash.clone()),
            commits: r.record.last_commit(),
        };
        view.apply_record(
            r.record.generation,
            r.record.first_commit.get(),
            &batches_of(&r.record),
            &to,
        )?;
    }
    Ok(())
}

/// The engine's store read without a lease (`runlease store get`, `list` and `log` over
/// etcd, from any host, whoever owns the run): the log and its newest snapshot are read
/// and checked as an owner's catch-up reads them (§18.4), and a view is built from them
/// in a private scratch folder (mode 0700, removed when the reader is dropped). What it
/// shows is every commit the engine had accepted when the read began, and possibly some
/// accepted while it read: never an unaccepted one. Writes nothing: not the engine, not
/// the run folder.
#[derive(Debug)]
pub struct EngineReader {
    // Field order: the view closes before its folder is removed.
    view: Store,
    tail: StoreTail,
    _scratch: tempfile::TempDir,
}

/// How often [`EngineReader::open`] reads when the owner truncated the log or removed the
/// snapshot under the read (`CONCURRENT_CHANGE`): a truncation follows a newer snapshot,
/// so the next read starts from that one.
const READ_ATTEMPTS: usize = 4;

impl EngineReader {
    /// Read the store of `auth`'s run (see the type's docs).
    ///
    /// # Errors
    /// `STORE_MISSING` (65) when the engine holds no record of the run at all (no epoch,
    /// no store record: a misspelt run, or one never opened with this authority);
    /// `STORE_LOG_INVALID` (65) for a log whose chain, numbering or generations do not
    /// hold; the engine's own errors (`UNAVAILABLE`, 69); `CONCURRENT_CHANGE` (75) when
    /// the log was truncated under every one of a few reads; the scratch folder's I/O.
    pub fn open<A: Transport + ?Sized>(auth: &A) -> Result<EngineReader, RunError>
    where
        RunError: From<A::Error>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            match Self::read_once(auth) {
                Err(e) if e.code() == Code::ConcurrentChange && attempt < READ_ATTEMPTS => {}
                other => return other,
            }
        }
    }

    /// One read: the log, then the snapshot's image, either of which a truncation by the
    /// owner may remove under it (`CONCURRENT_CHANGE`: [`EngineReader::open`] reads again).
    fn read_once<A: Transport + ?Sized>(auth: &A) -> Result<EngineReader, RunError>
    where
        RunError: From<A::Error>,
    {
        let run = auth.run_id().clone();
        let log = auth.read_store_log(None, 0)?;
        if log.tail.last.is_none() && log.snapshot.is_none() {
            let now = <Timestamp as lease_fs::WallClock>::now()
                .map_err(|e| RunError::Io(e.to_string()))?;
            let view = auth.status(now, false)?;
            if view.head.is_none() {
                return Err(RunError::Store(lease_sqlite::StoreError::Missing {
                    run: run.to_string(),
                    file: "store/log/ in the engine".into(),
                    detail: "the engine holds no epoch and no store record of this run (is the run name right? an owner's open makes its store)".into(),
                }));
            }
        }
        let scratch = tempfile::Builder::new()
            .prefix("runlease-view-")
            .tempdir()
            .map_err(|e| RunError::os("a scratch folder for the view", e))?;
        let path = scratch.path().to_path_buf();
        let p = path.clone();
        let open = move || std::fs::File::open(&p).map(OwnedFd::from);
        let dir = StoreDir { open: &open, path };
        let mut view = rebuild(auth, &run, &log, &dir)?;
        apply_records(&mut view, &log.records)?;
        Ok(EngineReader {
            view,
            tail: log.tail,
            _scratch: scratch,
        })
    }

    /// The store as read, to read from.
    pub fn store(&self) -> &Store {
        &self.view
    }

    /// The log's tail as read.
    pub fn tail(&self) -> &StoreTail {
        &self.tail
    }
}

impl EngineLog {
    /// Catch up as the owner of `lease` (§18.4), before serving anything: read the engine's
    /// log (checked: chain, numbering, generations; `FENCED` if a newer generation wrote
    /// to it), then open the local view in `dir`. A view whose position is a record of the
    /// log (or the snapshot's) gets the records after it; any other view (missing, ahead,
    /// different, older than the snapshot) is rebuilt from the snapshot's image, or empty,
    /// then gets every record after it. The engine is never written here.
    pub fn catch_up<A: Transport + ?Sized>(
        auth: &A,
        lease: &OwnedLease,
        dir: &StoreDir<'_>,
    ) -> Result<(EngineLog, Store), RunError>
    where
        RunError: From<A::Error>,
    {
        let log = auth.read_store_log(Some(lease.generation), 0)?;
        let run = &lease.run_id;
        let opened = (dir.open)().map_err(|e| RunError::os(dir.path.display().to_string(), e))?;
        let existing = match Store::open_view_in(run, opened, &dir.path, false) {
            Ok(s) => Some(s),
            Err(e) if e.code() == Code::StoreMissing => None,
            // A view that does not open (damaged, forged, another kind) is rebuilt: the
            // view is never the truth. Trust failures (another user's file) are not.
            Err(e) if matches!(e.code(), Code::RunNotOwned) => return Err(e.into()),
            Err(e) => {
                tracing::warn!(run = %run, error = %e, "the local view does not open; rebuilding it from the engine");
                None
            }
        };
        let start = match &existing {
            Some(v) => Self::resume_from(&log, &v.view_position()?),
            None => None,
        };
        let (mut view, rebuilt, from) = match (existing, start) {
            (Some(v), Some(i)) => (v, false, i),
            (v, _) => {
                drop(v);
                (rebuild(auth, run, &log, dir)?, true, 0)
            }
        };
        let applied = log.records.len() - from;
        apply_records(&mut view, &log.records[from..])?;
        let caught_up = match (rebuilt, applied) {
            (true, n) => CatchUp::Rebuilt(n),
            (false, 0) => CatchUp::UpToDate,
            (false, n) => CatchUp::Applied(n),
        };
        let state = EngineLog {
            lease: lease.clone(),
            tail: log.tail,
            unresolved: None,
            budget: DEFAULT_BUDGET_BYTES,
            caught_up,
            since_snapshot: log.records.len() as u64,
            snapshot_every: SNAPSHOT_EVERY_RECORDS,
        };
        Ok((state, view))
    }

    /// Where the view may resume: the index in `log.records` of the first record after
    /// the view's position, when that position is a record of the log (or the snapshot
    /// the log starts from); `None` when the view must be rebuilt.
    fn resume_from(log: &StoreLogView, at: &ViewPosition) -> Option<usize> {
        if at.record_seq == 0 {
            // An empty view fits only a log that starts at record 1.
            return log.snapshot.is_none().then_some(0);
        }
        if let Some((_, m)) = &log.snapshot {
            if m.through.get() == at.record_seq {
                return (Some(&m.through_hash) == at.record_hash.as_ref()
                    && m.commits.get() == at.commits)
                    .then_some(0);
            }
        }
        let i = log
            .records
            .iter()
            .position(|r| r.record.sequence.get() == at.record_seq)?;
        let r = &log.records[i];
        (Some(&r.hash) == at.record_hash.as_ref() && r.record.last_commit() == at.commits)
            .then_some(i + 1)
    }

    /// What the open did to the view.
    pub fn caught_up(&self) -> CatchUp {
        self.caught_up
    }

    /// The log's tail as this owner knows it.
    pub fn tail(&self) -> &StoreTail {
        &self.tail
    }

    /// Set the run's byte budget (§18.6; default 64 MiB).
    pub fn set_budget(&mut self, bytes: u64) {
        self.budget = bytes;
    }

    /// Write a snapshot (and truncate) once this many records follow the newest one
    /// (default [`SNAPSHOT_EVERY_RECORDS`]; 0 or 1: after every commit).
    pub fn set_snapshot_every(&mut self, records: u64) {
        self.snapshot_every = records.max(1);
    }

    /// Commit `batches` (§18.3): one record per group that fits, each created by the
    /// engine under its guard and then applied to the view; returns the commits'
    /// sequences. A commit whose answer was lost earlier is resolved first (the same
    /// record in the same slot). `nonce` draws the commit ids' random parts.
    ///
    /// # Errors
    /// `FENCED` (a newer generation exists: nothing of this call was written);
    /// `OUTCOME_UNKNOWN` (the engine did not answer: the record may be there; the next call
    /// resolves it first); `STORE_COMMIT_TOO_LARGE`, `STORE_BUDGET_EXCEEDED` (nothing
    /// written); `CONCURRENT_CHANGE` (another writer of this generation: reopen). When a
    /// group needs several records and a later one fails, the earlier ones are committed
    /// (and in the view) though this call fails: they were not acknowledged, which a
    /// commit is allowed to be.
    pub fn commit_group<A: Transport + ?Sized>(
        &mut self,
        auth: &A,
        view: &mut Store,
        batches: &[Batch],
        now: Timestamp,
        nonce: &mut dyn FnMut() -> u64,
    ) -> Result<Vec<u64>, RunError>
    where
        RunError: From<A::Error>,
    {
        self.resolve(auth, view)?;
        let records: Vec<RecordBatch> = batches
            .iter()
            .map(|b| RecordBatch {
                id: commit_id(&self.lease.owner_id, nonce()),
                writes: b
                    .writes
                    .iter()
                    .map(|w| match w {
                        Write::Put { key, value } => RecordWrite {
                            key: key.clone(),
                            value: Some(Blob(value.clone())),
                        },
                        Write::Delete { key } => RecordWrite {
                            key: key.clone(),
                            value: None,
                        },
                    })
                    .collect(),
                log: b.log.iter().map(|e| Blob(e.clone())).collect(),
            })
            .collect();
        let mut seqs = Vec::with_capacity(batches.len());
        let mut at = 0;
        for n in pack_batches(&records) {
            let group = records[at..at + n].to_vec();
            let op = CommitRecord::new(
                &self.lease,
                CommitParams {
                    tail: self.tail.clone(),
                    batches: group,
                    now,
                    budget: self.budget,
                },
            )?;
            let mut running = op.again();
            match auth.drive(&mut running).map_err(RunError::from) {
                Ok(_) => self.apply(view, &op)?,
                Err(e) => {
                    if e.code() == Code::OutcomeUnknown {
                        self.unresolved = Some(op);
                    }
                    return Err(e);
                }
            }
            let first = self.tail.commits + 1 - n as u64;
            seqs.extend(first..=self.tail.commits);
            at += n;
        }
        if self.since_snapshot >= self.snapshot_every {
            // The commits are in the engine and the view: a failed snapshot is no failed
            // commit (it is tried again at the next one; a fence shows at the next commit).
            if let Err(e) = self.snapshot(auth, view, nonce(), now) {
                tracing::warn!(run = %self.lease.run_id, error = %e, "the store's automatic snapshot failed");
            }
        }
        Ok(seqs)
    }

    /// Resolve a commit whose answer was lost, if any: committed (applied to the view),
    /// or refused (`FENCED`, and it never will be), or still unknown (`OUTCOME_UNKNOWN`).
    pub fn resolve<A: Transport + ?Sized>(
        &mut self,
        auth: &A,
        view: &mut Store,
    ) -> Result<(), RunError>
    where
        RunError: From<A::Error>,
    {
        let Some(pending) = self.unresolved.take() else {
            return Ok(());
        };
        match auth.resolve_record(&pending).map_err(RunError::from) {
            Ok(_) => self.apply(view, &pending),
            Err(e) => {
                if e.code() == Code::OutcomeUnknown {
                    self.unresolved = Some(pending);
                }
                Err(e)
            }
        }
    }

    /// Apply the committed record `op` to the view and move the tail past it.
    fn apply(&mut self, view: &mut Store, op: &CommitRecord) -> Result<(), RunError> {
        let r: StoreRecord = lease_core::decode(op.record())?;
        let tail = StoreTail {
            last: Some((r.sequence, lease_core::Digest::of(op.record()))),
            commits: r.last_commit(),
            bytes: self.tail.bytes + op.record().len() as u64,
        };
        view.apply_record(
            self.lease.generation,
            r.first_commit.get(),
            &batches_of(&r),
            &position_of(&tail),
        )?;
        self.tail = tail;
        self.since_snapshot += 1;
        Ok(())
    }

    /// Write a snapshot of the view under the engine's guard, then truncate the log up to
    /// it (§18.5); returns the manifest's path. A truncation that fails leaves records a
    /// later truncation removes (the snapshot stands).
    pub fn snapshot<A: Transport + ?Sized>(
        &mut self,
        auth: &A,
        view: &mut Store,
        nonce: u64,
        now: Timestamp,
    ) -> Result<String, RunError>
    where
        RunError: From<A::Error>,
    {
        self.resolve(auth, view)?;
        let image = view.image()?;
        let size = image.len() as u64;
        let file = auth.write_snapshot(&self.lease, &self.tail, image, nonce, now)?;
        self.tail.bytes = size;
        self.since_snapshot = 0;
        if let Err(e) = auth.truncate_store_log(file).map_err(RunError::from) {
            tracing::warn!(run = %self.lease.run_id, error = %e, "truncating the store's log after a snapshot failed; the next snapshot removes the rest");
        }
        Ok(file.path())
    }
}

impl EngineStore {
    /// [`EngineLog::catch_up`] with the store folder reached by `dir`.
    pub fn open<A: Transport + ?Sized>(
        auth: &A,
        lease: &OwnedLease,
        dir: &StoreDir<'_>,
    ) -> Result<EngineStore, RunError>
    where
        RunError: From<A::Error>,
    {
        let (log, view) = EngineLog::catch_up(auth, lease, dir)?;
        Ok(EngineStore { log, view })
    }

    /// [`EngineStore::open`] with the store folder at `store_dir` (created if missing;
    /// opened by path, for tests and examples: the run layer opens it beneath its held
    /// root).
    pub fn open_at<A: Transport + ?Sized>(
        auth: &A,
        lease: &OwnedLease,
        store_dir: &Path,
    ) -> Result<EngineStore, RunError>
    where
        RunError: From<A::Error>,
    {
        std::fs::create_dir_all(store_dir)
            .map_err(|e| RunError::os(store_dir.display().to_string(), e))?;
        let p = store_dir.to_path_buf();
        let open = move || std::fs::File::open(&p).map(OwnedFd::from);
        EngineStore::open(
            auth,
            lease,
            &StoreDir {
                open: &open,
                path: store_dir.to_path_buf(),
            },
        )
    }

    /// What the open did to the view.
    pub fn caught_up(&self) -> CatchUp {
        self.log.caught_up()
    }

    /// The log's tail as this owner knows it.
    pub fn tail(&self) -> &StoreTail {
        self.log.tail()
    }

    /// The local view, for reads (every acknowledged commit of this owner is in it).
    pub fn view(&self) -> &Store {
        &self.view
    }

    /// [`EngineLog::set_snapshot_every`].
    pub fn set_snapshot_every(&mut self, records: u64) {
        self.log.set_snapshot_every(records);
    }

    /// [`EngineLog::commit_group`] on this store's view.
    pub fn commit_group<A: Transport + ?Sized>(
        &mut self,
        auth: &A,
        batches: &[Batch],
        now: Timestamp,
        nonce: &mut dyn FnMut() -> u64,
    ) -> Result<Vec<u64>, RunError>
    where
        RunError: From<A::Error>,
    {
        self.log
            .commit_group(auth, &mut self.view, batches, now, nonce)
    }

    /// [`EngineLog::resolve`] on this store's view.
    pub fn resolve<A: Transport + ?Sized>(&mut self, auth: &A) -> Result<(), RunError>
    where
        RunError: From<A::Error>,
    {
        self.log.resolve(auth, &mut self.view)
    }

    /// [`EngineLog::snapshot`] of this store's view.
    pub fn snapshot<A: Transport + ?Sized>(
        &mut self,
        auth: &A,
        nonce: u64,
        now: Timestamp,
    ) -> Result<String, RunError>
    where
        RunError: From<A::Error>,
    {
        self.log.snapshot(auth, &mut self.view, nonce, now)
    }
}
