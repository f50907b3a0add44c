//! `read_folder`: the lease and event-log readers (and the writers that start by reading)
//! over arbitrary folder contents.
//!
//! The input is decoded into a small set of files ([`Folder::parse`]): each file sits in one
//! of the protocol folders (or the run root), under either the name the layout gives a typed
//! number or an arbitrary raw name, with arbitrary bytes (the seed corpus holds real runs, so
//! mutations give valid-looking names with garbage or mutated valid records). The same
//! folder is materialized twice:
//!
//! - in a [`MemDisk`] (typed names only), driven by the step machines directly;
//! - in a [`SimFs`] through [`RunDir::with_fs`], the real adapter: raw names (strays, temp
//!   files, files where folders belong, subfolders where files belong), and files whose data
//!   or entry was never fsynced before a simulated power loss (empty or torn files).
//!
//! On each: status (with and without a liveness probe), a read-only `ReadEvents`, `Verify`,
//! and, each on its own copy, claim, exact takeover, dead-owner retirement, a finalizing
//! `ReadEvents`, and heartbeat / append / release with a lease forged for the head.
//!
//! Checked: no panic; no `PROTOCOL_VIOLATION` (the machines never misread a correct
//! answer); every operation finishes within a bounded number of requests; read-only
//! operations write nothing; an `invalid` status lets no claim, takeover or retirement
//! succeed; a claim succeeds only on a free run, a takeover only on a stale one, a
//! retirement only on a dead one (or the caller adopts its own epoch), each creating
//! exactly head + 1; an append that returned success counts in the log as read afterwards
//! whenever the folder verified before; orphan temp cleanup removes only temp files; and
//! when every file is plainly named and durable, `MemDisk` and `SimFs` give the same
//! answers.

use crate::fixtures::{LiveMode, holder, id, run_id, t};
use lease_core::LeaseOps;
use lease_core::mem::MemDisk;
use lease_core::ops::{
    Append, AppendParams, Claim, ClaimParams, Expectation, Heartbeat, LivenessEvidence, Operation,
    OwnedLease, ReadEvents, Release, ReleaseParams, Retire, RetireParams, Status, StatusView, Step,
    Takeover, TakeoverParams, TakeoverTrigger, Verify,
};
use lease_core::{
    Dir, EpochRecord, FileRef, Generation, HeartbeatRecord, Holder, LeaseError, Sequence,
    Timestamp, TimingPolicy, decode,
};
use lease_fs::fs::Fs;
use lease_fs::{FsError, RunDir, SimFs};
use std::path::Path;
use std::sync::Arc;

/// Most files one input may describe.
pub const MAX_FILES: usize = 48;
/// Longest raw name.
const MAX_NAME: usize = 64;
/// Requests after which an operation over a static folder is considered stuck.
const MAX_REQUESTS: usize = 20_000;

/// How a file's name is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Name {
    /// The layout's name for a typed number (`num`: generation or sequence; `aux`: intent
    /// nonce or command pid). Numbers the layout cannot name (0) give a zero-padded stray.
    Typed {
        /// Generation or sequence.
        num: u64,
        /// Nonce or pid.
        aux: u64,
    },
    /// Any name (SimFs only; MemDisk cannot hold a name that does not parse).
    Raw(String),
}

/// What survives of a file after the simulated power loss (SimFs only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    /// Written durably.
    Durable,
    /// Entry fsynced, data not: comes back empty, or torn if it is the torn file.
    DataLost,
    /// Nothing fsynced: the file vanishes.
    EntryLost,
}

/// The folders an entry's `dir` code `0..=6` names, in the corpus's fixed order (the
/// layout's first seven folders, as `Dir::ALL` listed them before issue #33 appended
/// `lease/marks`); `7` is the run root.
const FOLDER_DIRS: [Dir; 7] = [
    Dir::Epochs,
    Dir::Beats,
    Dir::Cutoffs,
    Dir::Intents,
    Dir::Checkpoints,
    Dir::Events,
    Dir::Commands,
];

/// One file of the folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `0..=6`: `FOLDER_DIRS[dir]`; `7`: the run root.
    pub dir: u8,
    /// Its name.
    pub name: Name,
    /// Its durability.
    pub persist: Persist,
    /// Its content.
    pub bytes: Vec<u8>,
}

/// A run folder described by a fuzz input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folder {
    /// Which wall time the observer uses (see [`Folder::now`]).
    pub now_sel: u8,
    /// What liveness probes answer.
    pub live: LiveMode,
    /// Whether the power loss tears the newest unsynced file.
    pub tear: bool,
    /// The files, in write order (a later file replaces an earlier one of the same name).
    pub entries: Vec<Entry>,
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    /// LEB128, at most 10 bytes.
    fn varint(&mut self) -> u64 {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.byte();
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                break;
            }
        }
        v
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let start = self.at.min(self.data.len());
        let end = start.saturating_add(n).min(self.data.len());
        self.at = end;
        &self.data[start..end]
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

impl Folder {
    /// Decode an input. Byte 0: bits 0-1 the observer's time, bits 2-3 the liveness answer,
    /// bit 4 tear. Then per file: a tag (bits 0-2 folder, bit 3 raw name, bits 4-5
    /// durability), the name (typed: two LEB128 numbers; raw: LEB128 length + bytes), then
    /// LEB128 length + content. Every input decodes to some folder.
    pub fn parse(data: &[u8]) -> Folder {
        let mut r = Reader { data, at: 0 };
        let h = r.byte();
        let mut f = Folder {
            now_sel: h & 3,
            live: LiveMode::from_bits(h >> 2),
            tear: h & 0x10 != 0,
            entries: Vec::new(),
        };
        while !r.done() && f.entries.len() < MAX_FILES {
            let tag = r.byte();
            let name = if tag & 8 == 0 {
                let num = r.varint();
                let aux = r.varint();
                Name::Typed { num, aux }
            } else {
                let n = usize::try_from(r.varint())
                    .unwrap_or(usize::MAX)
                    .min(MAX_NAME);
                Name::Raw(String::from_utf8_lossy(r.bytes(n)).into_owned())
            };
            let persist = match (tag >> 4) & 3 {
                1 => Persist::DataLost,
                2 => Persist::EntryLost,
                _ => Persist::Durable,
            };
            let len = usize::try_from(r.varint()).unwrap_or(usize::MAX);
            let bytes = r.bytes(len).to_vec();
            f.entries.push(Entry {
                dir: tag & 7,
                name,
                persist,
                bytes,
            });
        }
        f
    }

    /// The input that [`Folder::parse`] decodes into this folder.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            vec![(self.now_sel & 3) | (self.live.bits() << 2) | if self.tear { 0x10 } else { 0 }];
        for e in &self.entries {
            let persist = match e.persist {
                Persist::Durable => 0,
                Persist::DataLost => 1,
                Persist::EntryLost => 2,
            };
            let raw = matches!(e.name, Name::Raw(_));
            out.push((e.dir & 7) | if raw { 8 } else { 0 } | (persist << 4));
            match &e.name {
                Name::Typed { num, aux } => {
                    put_varint(&mut out, *num);
                    put_varint(&mut out, *aux);
                }
                Name::Raw(s) => {
                    put_varint(&mut out, s.len() as u64);
                    out.extend_from_slice(s.as_bytes());
                }
            }
            put_varint(&mut out, e.bytes.len() as u64);
            out.extend_from_slice(&e.bytes);
        }
        out
    }

    /// A folder holding exactly the files of `disk`, durably.
    pub fn from_mem(disk: &MemDisk, now_sel: u8, live: LiveMode) -> Folder {
        let entries = disk
            .files
            .iter()
            .filter_map(|(f, bytes)| {
                let (dir, num, aux) = match *f {
                    FileRef::Epoch(g) => (0, g.get(), 0),
                    FileRef::Beat(g) => (1, g.get(), 0),
                    FileRef::Cutoff(g) => (2, g.get(), 0),
                    FileRef::Intent { generation, nonce } => (3, generation.get(), nonce),
                    FileRef::Checkpoint(g) => (4, g.get(), 0),
                    FileRef::Event(s) => (5, s.get(), 0),
                    FileRef::Command { generation, pid } => (6, generation.get(), u64::from(pid)),
                    FileRef::RunStatus => (7, 0, 0),
                    // The engine store's files (issue #32) live only in an engine, never
                    // in a run folder (not in `Dir::ALL`): nothing of a folder to fuzz.
                    FileRef::StoreRecord(_)
                    | FileRef::Snapshot { .. }
                    | FileRef::SnapshotChunk { .. } => return None,
                    // Verified-prefix marks (issue #33) have no code in the entry's three
                    // bits (the corpus's encoding): not generated here; lease-core's
                    // marks tests cover them.
                    FileRef::Mark(_) => return None,
                };
                Some(Entry {
                    dir,
                    name: Name::Typed { num, aux },
                    persist: Persist::Durable,
                    bytes: bytes.clone(),
                })
            })
            .collect();
        Folder {
            now_sel,
            live,
            tear: false,
            entries,
        }
    }

    /// The observer's wall time: T0, T0 + 1 min (past the default `stale_after`),
    /// T0 + 10 days, or the last representable instant.
    pub fn now(&self) -> Timestamp {
        match self.now_sel & 3 {
            0 => t(0),
            1 => t(60_000),
            2 => t(10 * 24 * 3600 * 1000),
            _ => t(u64::MAX),
        }
    }

    /// Whether every file has a typed name the layout can produce and is durable: then the
    /// MemDisk and the SimFs hold the same run.
    pub fn is_plain(&self) -> bool {
        self.entries
            .iter()
            .all(|e| e.persist == Persist::Durable && e.file_ref().is_some())
    }

    /// The MemDisk holding every typed, nameable file.
    pub fn mem_disk(&self) -> MemDisk {
        let mut d = MemDisk::new();
        for e in &self.entries {
            if let Some(f) = e.file_ref() {
                d.files.insert(f, e.bytes.clone());
            }
        }
        d
    }

    /// The SimFs after writing every file and a power loss.
    pub fn sim_fs(&self) -> SimFs {
        let fs = SimFs::new();
        for e in &self.entries {
            let path = e.sim_path();
            let (parent, _) = lease_fs::fs::split(&path);
            // Errors (a name that is not a plain path, a file in the way of a folder, an
            // existing name for write_new) just leave that file out.
            match e.persist {
                Persist::Durable => {
                    let _ = fs.put(&path, &e.bytes);
                }
                Persist::DataLost | Persist::EntryLost => {
                    if !parent.is_empty() && fs.ensure_dir(parent).is_err() {
                        continue;
                    }
                    if fs.write_new(&path, &e.bytes).is_ok() && e.persist == Persist::DataLost {
                        let _ = fs.fsync_dir(parent);
                    }
                }
            }
        }
        fs.recover(self.tear);
        fs
    }
}

impl Entry {
    /// The typed file this entry names, if the layout can name it.
    pub fn file_ref(&self) -> Option<FileRef> {
        let Name::Typed { num, aux } = self.name else {
            return None;
        };
        let g = Generation::new(num);
        Some(match self.dir {
            0 => FileRef::Epoch(g?),
            1 => FileRef::Beat(g?),
            2 => FileRef::Cutoff(g?),
            3 => FileRef::Intent {
                generation: g?,
                nonce: aux,
            },
            4 => FileRef::Checkpoint(g?),
            5 => FileRef::Event(Sequence::new(num)?),
            6 => FileRef::Command {
                generation: g?,
                pid: u32::try_from(aux).ok().filter(|&p| p > 0)?,
            },
            _ => FileRef::RunStatus,
        })
    }

    /// Its path in the SimFs.
    pub fn sim_path(&self) -> String {
        let dir = FOLDER_DIRS.get(usize::from(self.dir)).map(|d| d.path());
        let name = match (&self.name, self.file_ref()) {
            (Name::Raw(s), _) => s.clone(),
            (Name::Typed { .. }, Some(f)) => return f.path(),
            (Name::Typed { num, .. }, None) => format!("{num:020}.json"),
        };
        match dir {
            Some(d) => format!("{d}/{name}"),
            None => name,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Driving

/// Outcome of one operation, comparable between the two disks.
type Outcome = Result<String, String>;

fn no_violation(what: &str, e: &LeaseError) {
    assert_ne!(
        e.code(),
        "PROTOCOL_VIOLATION",
        "{what}: the machine rejected a correct answer: {e}"
    );
    let _ = e.to_string();
}

/// Run `op` against `disk`, answering liveness with `live`; panics if it does not finish.
fn run_mem<O: Operation>(
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

fn run_dir(fs: &SimFs, live: LiveMode) -> RunDir {
    RunDir::with_fs(
        Arc::new(fs.clone()),
        run_id(),
        Path::new("/fuzz/run-1"),
        Arc::new(FuzzLive(live)),
    )
}

fn fs_outcome<T>(what: &str, r: &Result<T, FsError>, ok: impl Fn(&T) -> String) -> Outcome {
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

fn outcome<T>(r: &Result<T, LeaseError>, ok: impl Fn(&T) -> String) -> Outcome {
    match r {
        Ok(v) => Ok(ok(v)),
        Err(e) => Err(e.code().to_string()),
    }
}

fn status_str(v: &StatusView) -> String {
    let head = v.head.as_ref().map(|h| h.generation().get());
    format!("{} head {head:?}", v.status.name())
}

fn events_str(v: &lease_core::ops::EventLogView) -> String {
    v.events
        .iter()
        .map(|e| format!("{}:{:?}", e.event.sequence, e.standing))
        .collect::<Vec<_>>()
        .join(",")
}

/// The identities of the operations' callers.
struct Callers {
    claimer: (lease_core::Identity, Holder),
    taker: (lease_core::Identity, Holder),
    retirer: (lease_core::Identity, Holder),
}

fn callers() -> Callers {
    Callers {
        claimer: (id("fuzz-claimer"), holder(4242)),
        taker: (id("fuzz-taker"), holder(4343)),
        retirer: (id("fuzz-retirer"), holder(4444)),
    }
}

/// What the readers saw, and what the checks need of it.
#[derive(Debug, PartialEq, Eq)]
struct Summary {
    status: Outcome,
    status_no_probe: Outcome,
    events: Outcome,
    verify: Outcome,
    claim: Outcome,
    takeover: Outcome,
    retire: Outcome,
    finalizing_read: Outcome,
    heartbeat: Outcome,
    append: Outcome,
    release: Outcome,
}

/// The expectation a takeover uses: the observed head exactly, or, when the head cannot be
/// read, the loosest one the raw files suggest (so a protocol that wrongly took over an
/// invalid record would be caught).
fn expectation(disk: &MemDisk, view: Option<&StatusView>) -> Expectation {
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
fn forged_lease(view: Option<&StatusView>) -> Option<OwnedLease> {
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

fn params_claim(c: &Callers, now: Timestamp) -> ClaimParams {
    ClaimParams {
        run_id: run_id(),
        owner_id: c.claimer.0.clone(),
        holder: c.claimer.1.clone(),
        policy: TimingPolicy::default(),
        now,
        store_floor: None,
    }
}

fn params_takeover(c: &Callers, now: Timestamp, expect: Expectation) -> TakeoverParams {
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

fn params_retire(c: &Callers, now: Timestamp) -> RetireParams {
    RetireParams {
        run_id: run_id(),
        owner_id: c.retirer.0.clone(),
        holder: c.retirer.1.clone(),
        policy: TimingPolicy::default(),
        now,
        expect: None,
    }
}

fn append_params(now: Timestamp) -> AppendParams {
    AppendParams {
        event_type: id("fuzz.event"),
        payload: serde_json::json!({"fuzz": true}),
        now,
        tail_hint: None,
    }
}

fn judge_mem(folder: &Folder) -> (Summary, Expectation, Option<OwnedLease>) {
    let now = folder.now();
    let live = folder.live;
    let c = callers();
    let base = folder.mem_disk();

    // Read-only operations, on one copy that must stay unchanged.
    let mut d = base.clone();
    let status = run_mem(
        "status",
        &mut d,
        &mut StatusView::read(run_id(), now, true),
        live,
    );
    let status_np = run_mem(
        "status",
        &mut d,
        &mut StatusView::read(run_id(), now, false),
        live,
    );
    let events = run_mem("read", &mut d, &mut ReadEvents::new(run_id(), None), live);
    let verify = run_mem("verify", &mut d, &mut Verify::new(run_id()), live);
    assert!(
        d.files == base.files,
        "a read-only operation (status, read without finalize, verify) changed the folder"
    );

    let view = status.as_ref().ok();
    let view_np = status_np.as_ref().ok();
    if let (Some(a), Some(b)) = (view, view_np) {
        assert_eq!(a.head, b.head, "the probe changed the observed head");
    }
    let expect = expectation(&base, view_np);
    let forged = forged_lease(view_np);

    let claim = run_mem(
        "claim",
        &mut base.clone(),
        &mut Claim::new(params_claim(&c, now)),
        live,
    );
    // As `LeaseOps::claim` does (the adapters' path, which the SimFs side takes): a claim
    // refused over a holder the probing status proves dead says to retire it.
    let claim = claim.map_err(|e| {
        lease_core::ops::refine_claim_refusal(e, || {
            view.is_some_and(|v| v.status == lease_core::ops::Status::Dead)
        })
    });
    let takeover = run_mem(
        "takeover",
        &mut base.clone(),
        &mut Takeover::new(params_takeover(&c, now, expect.clone())),
        live,
    );
    let retire = run_mem(
        "retire",
        &mut base.clone(),
        &mut Retire::new(params_retire(&c, now)),
        live,
    );
    let fin = run_mem(
        "finalizing read",
        &mut base.clone(),
        &mut ReadEvents::new(run_id(), Some((id("fuzz-reader"), now))),
        live,
    );

    // Ownership changes: what the status allowed, and exactly the next generation.
    let head = view_np.and_then(|v| v.head.as_ref());
    let next = head.map_or(1, |h| h.generation().get().saturating_add(1));
    let adopts = |who: &(lease_core::Identity, Holder)| {
        head.is_some_and(|h| h.is_active() && h.epoch.owner_id == who.0 && h.epoch.holder == who.1)
    };
    let invalid = matches!(view_np.map(|v| &v.status), Some(Status::Invalid(_)) | None);
    if let Ok(l) = &claim {
        assert!(!invalid, "a claim succeeded over an invalid record");
        if !adopts(&c.claimer) {
            assert!(
                matches!(view_np.map(|v| &v.status), Some(Status::Free)),
                "a claim succeeded on a run that is {:?}",
                view_np.map(|v| v.status.name())
            );
            assert_eq!(l.generation.get(), next, "a claim skipped a generation");
        }
    }
    if let Ok(l) = &takeover {
        assert!(!invalid, "a takeover succeeded over an invalid record");
        if !adopts(&c.taker) {
            assert!(
                matches!(view_np.map(|v| &v.status), Some(Status::Stale)),
                "a takeover succeeded on a run that is {:?}",
                view_np.map(|v| v.status.name())
            );
            assert_eq!(l.generation.get(), next, "a takeover skipped a generation");
        }
    }
    if let Ok(r) = &retire {
        assert!(!invalid, "a retirement succeeded over an invalid record");
        assert!(
            matches!(view.map(|v| &v.status), Some(Status::Dead)),
            "a retirement succeeded on a run that is {:?}",
            view.map(|v| v.status.name())
        );
        assert_eq!(
            r.generation.get(),
            next,
            "a retirement skipped a generation"
        );
        assert_eq!(Some(r.retired), head.map(|h| h.generation()));
    }

    // The head's owner: heartbeat, release, and an append that must count if acknowledged.
    let (mut hb, mut ap, mut rel) = (
        Err("no lease".to_string()),
        Err("no lease".to_string()),
        Err("no lease".to_string()),
    );
    if let Some(l) = &forged {
        match Heartbeat::new(l, now, 1) {
            Ok(mut op) => {
                hb = outcome(
                    &run_mem("heartbeat", &mut base.clone(), &mut op, live),
                    |_| "ok".into(),
                );
            }
            Err(e) => hb = Err(e.code().into()),
        }
        rel = outcome(
            &run_mem(
                "release",
                &mut base.clone(),
                &mut Release::new(ReleaseParams {
                    lease: l.clone(),
                    now,
                    seal: None,
                }),
                live,
            ),
            |g| g.to_string(),
        );
        let mut d = base.clone();
        let appended = run_mem(
            "append",
            &mut d,
            &mut Append::new(l, append_params(now)),
            live,
        );
        if let Ok(a) = &appended {
            let after = run_mem(
                "read after append",
                &mut d,
                &mut ReadEvents::new(run_id(), Some((id("fuzz-reader"), now))),
                live,
            );
            if verify.is_ok()
                && let Ok(v) = &after
            {
                let counts = v
                    .events
                    .iter()
                    .any(|e| e.event.sequence == a.sequence && e.standing.counts());
                assert!(
                    counts,
                    "append of event {} returned success but the event does not count: {:?}",
                    a.sequence,
                    v.events
                        .iter()
                        .find(|e| e.event.sequence == a.sequence)
                        .map(|e| &e.standing)
                );
            }
        }
        ap = outcome(&appended, |a| a.sequence.to_string());
    }

    let summary = Summary {
        status: outcome(&status, status_str),
        status_no_probe: outcome(&status_np, status_str),
        events: outcome(&events, events_str),
        verify: outcome(&verify, |r| {
            format!("{} epochs {} events", r.epochs, r.events)
        }),
        claim: outcome(&claim, |l| l.generation.to_string()),
        takeover: outcome(&takeover, |l| l.generation.to_string()),
        retire: outcome(&retire, |r| r.generation.to_string()),
        finalizing_read: outcome(&fin, events_str),
        heartbeat: hb,
        append: ap,
        release: rel,
    };
    (summary, expect, forged)
}

fn judge_sim(folder: &Folder, expect: Expectation, forged: Option<&OwnedLease>) -> Summary {
    let now = folder.now();
    let live = folder.live;
    let c = callers();

    // The folder is materialized once; every operation that may write gets its own fork
    // (a deep copy: `SimFs` is deterministic, so a fork is the same file system a fresh
    // `folder.sim_fs()` would build, at a fraction of the cost).
    let base = folder.sim_fs();
    let fs = base.fork();
    let before = fs.snapshot_live();
    let rd = run_dir(&fs, live);
    let status = rd.status(now, true);
    let status_np = rd.status(now, false);
    let events = rd.read_events(None);
    let verify = rd.verify();
    let _ = rd.stray_names();
    assert!(
        fs.snapshot_live() == before,
        "a read-only operation (status, read without finalize, verify) changed the SimFs"
    );

    // Orphan cleanup removes temp files only.
    let fresh = base.fork();
    let kept = fresh.snapshot_live();
    let _ = run_dir(&fresh, live).clean_temp_files(0);
    let after = fresh.snapshot_live();
    for (path, bytes) in &kept {
        let name = lease_fs::fs::split(path).1;
        if !name.starts_with(lease_core::layout::TEMP_PREFIX) {
            assert_eq!(
                after.get(path),
                Some(bytes),
                "temp cleanup removed or changed {path}"
            );
        }
    }

    let fresh = || run_dir(&base.fork(), live);
    let claim = fresh().claim(lease_core::ops::ClaimParams {
        run_id: run_id(),
        owner_id: c.claimer.0.clone(),
        holder: c.claimer.1.clone(),
        policy: TimingPolicy::default(),
        now,
        store_floor: None,
    });
    let takeover = fresh().takeover(lease_core::ops::TakeoverParams {
        run_id: run_id(),
        owner_id: c.taker.0.clone(),
        holder: c.taker.1.clone(),
        policy: TimingPolicy::default(),
        now,
        trigger: TakeoverTrigger::Operator {
            watched_unchanged_ms: lease_core::ghost::simulated_watch(&expect, now),
        },
        expect,
    });
    let retire = fresh().retire(lease_core::ops::RetireParams {
        run_id: run_id(),
        owner_id: c.retirer.0.clone(),
        holder: c.retirer.1.clone(),
        policy: TimingPolicy::default(),
        now,
        expect: None,
    });
    let fin = fresh().read_events(Some((id("fuzz-reader"), now)));
    let (mut hb, mut ap, mut rel) = (
        Err("no lease".to_string()),
        Err("no lease".to_string()),
        Err("no lease".to_string()),
    );
    if let Some(l) = forged {
        hb = fs_outcome("heartbeat", &fresh().heartbeat(l, now, 1, None), |_| {
            "ok".into()
        });
        rel = fs_outcome(
            "release",
            &fresh().release(lease_core::ops::ReleaseParams {
                lease: l.clone(),
                now,
                seal: None,
            }),
            |g| g.to_string(),
        );
        let p = append_params(now);
        ap = fs_outcome(
            "append",
            &fresh().append(
                l,
                lease_core::ops::AppendParams {
                    event_type: p.event_type,
                    payload: p.payload,
                    now,
                    tail_hint: None,
                },
            ),
            |a| a.sequence.to_string(),
        );
    }
    Summary {
        status: fs_outcome("status", &status, status_str),
        status_no_probe: fs_outcome("status", &status_np, status_str),
        events: fs_outcome("read", &events, events_str),
        verify: fs_outcome("verify", &verify, |r| {
            format!("{} epochs {} events", r.epochs, r.events)
        }),
        claim: fs_outcome("claim", &claim, |l| l.generation.to_string()),
        takeover: fs_outcome("takeover", &takeover, |l| l.generation.to_string()),
        retire: fs_outcome("retire", &retire, |r| r.generation.to_string()),
        finalizing_read: fs_outcome("finalizing read", &fin, events_str),
        heartbeat: hb,
        append: ap,
        release: rel,
    }
}

/// The check of the `read_folder` target.
pub fn check(data: &[u8]) {
    let _ = judge(data);
}

/// Run an input through every check; the folder and both summaries.
fn judge(data: &[u8]) -> (Folder, Summary, Summary) {
    let folder = Folder::parse(data);
    let (mem, expect, forged) = judge_mem(&folder);
    let sim = judge_sim(&folder, expect, forged.as_ref());
    if folder.is_plain() {
        assert_eq!(
            &mem, &sim,
            "MemDisk and SimFs disagree on the same plainly named, durable folder"
        );
    }
    (folder, mem, sim)
}

/// Run an input and describe the folder and what each operation answered, on the MemDisk
/// and on the SimFs (for triage: `examples/show.rs`). Formatting is left out of
/// [`check`]: pretty-printing every content byte cost the target a quarter of its time.
pub fn describe(data: &[u8]) -> String {
    let (folder, mem, sim) = judge(data);
    format!("{folder:#?}\nMemDisk: {mem:#?}\nSimFs: {sim:#?}")
}
