//! The one admission rule (issue #28): what every writer of a run checks before it writes
//! anything, and what `status` and `doctor` evaluate read-only to name a next step the
//! writer will accept.
//!
//! Before issue #28 each entry point kept its own subset of the rules (`runlease run`
//! refused `run.json` ahead of the lease chain, `retire` and `takeover` did not, and issued
//! generations a second time on a rolled-back chain, making an event its writer had been
//! told does not count count for good: an I4 violation). Now there is one function,
//! [`judge`], and the writers differ only in the [`Action`] they ask it about.
//!
//! What [`judge`] checks, in this order (each refusal is a typed error naming the run and
//! the file; nothing has been written when it returns one):
//!
//! 1. **the head** is readable (`RECORD_INVALID` / `SCHEMA_UNSUPPORTED`, 65);
//! 2. **rollback evidence**, for every action: `run.json` cannot be read
//!    (`RECORD_INVALID`, 65: whether the chain was rolled back cannot be told), `run.json`
//!    was written by a generation the chain does not reach, the newest event was written by
//!    a generation above the chain's head, or the store holds a commit fenced by a
//!    generation above the head (`CHAIN_BROKEN`, 65). No crash produces any of these: an
//!    owner writes `run.json`, events and commits only after its epoch is durable. A chain
//!    that ends below them was restored from an older copy or had its newest epochs
//!    deleted, and a replacement on it would issue generations a second time;
//! 3. unless the action cannot change the owner (a claim of a held run, refused by the
//!    claim itself without writing): the folder's layout and every command record
//!    ([`crate::preflight`]: 65, or 76 for a live command that cannot be proved ours), the
//!    whole log and both chains as `runlease verify` checks them, no heartbeat, cutoff or
//!    command record named above the head (65), the store the chain names present
//!    (`STORE_MISSING`, 65) and the store itself against the seal and floor the chain
//!    requires, read with SQLite's `immutable` open that writes nothing
//!    (`STORE_BEHIND_SEAL`, `STORE_IDENTITY_MISMATCH`, `STORE_CORRUPT`, 65). A store with
//!    a write-ahead log left beside it is not judged here: only an owner's open replays
//!    it, and that open judges the store after the claim (and hands the run back, released
//!    with the seal, if it refuses).
//!
//! Who asks: `Run::open` (its preflight, holding the owner lock), `Replacer::observe`
//! (retire holding the owner lock when it could take it, takeover without), and
//! [`crate::diagnosis::claim_refusal`] for `status` and `doctor`, with the action their
//! next step would name.

use crate::authority::LeaseAuthority;
use crate::clock::wall_now;
use crate::error::RunError;
use crate::preflight::refuse_evidence;
use lease_core::LeaseOps;
use lease_core::canonical::MAX_RECORD_BYTES;
use lease_core::ops::{Request, Response, Status, StatusView};
use lease_core::{Event, FileRef, LeaseError, RunStatus, Sequence, decode_for};
use lease_fs::{FsError, RealFs, RunDir};

/// What a writer means to do to the run, for [`judge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// Claim a free run (a held one is refused by the claim itself, without writing).
    Claim,
    /// Claim, or retire the head first if it is definitely dead (`runlease run`).
    ClaimOrRetireDead,
    /// Exact takeover of the active head.
    Takeover,
    /// Retirement of a definitely-dead head.
    Retire,
}

/// What the run's folder (on this host) gives [`judge`] beyond the lease.
#[derive(Debug, Clone, Copy)]
pub struct Folder<'a> {
    /// The run folder (`run.json`, command records, the store).
    pub dir: &'a RunDir,
    /// `run.json` as read by the caller ([`read_run_json`]): `Ok(None)` when there is
    /// none, the record's error (naming the file) when it cannot be decoded.
    pub run_json: &'a Result<Option<RunStatus>, LeaseError>,
    /// The run folder's held root, to read the store beneath it (SQLite `immutable`: no
    /// lock, nothing written) and judge it; `None`: the store is not read. A writer gives
    /// it holding the run's kernel owner lock, so no owner on this host has the store
    /// open; `status` and `doctor` give it without the lock, for a snapshot (an owner that
    /// has the store open has a write-ahead log beside it, and such a store is not judged:
    /// see [`judge`]).
    pub store_root: Option<&'a RealFs>,
}

/// What [`judge`] admitted.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Admitted {
    /// The status view it judged.
    pub view: StatusView,
    /// Whether the checks of step 3 ran (false only when the action cannot change the
    /// owner: a claim of a held run).
    pub verified: bool,
    /// A verified-prefix mark the writer may leave once its own write succeeded (the tail
    /// check read at least [`lease_core::ops::MARK_EVERY`] events past the newest mark:
    /// [`lease_core::ops::VerifyReport::mark_due`]); never written on a refusal.
    pub mark_due: Option<(Sequence, lease_core::Digest)>,
}

/// Judge `action` on the run whose lease is `auth` and whose folder on this host is
/// `folder` (none: etcd without a local folder), from the status view `view` (read by the
/// caller, liveness probed when it matters). Read-only: see the module docs for what is
/// checked and in which order. `Ok` is the admission; an error is the refusal, with the
/// same code whichever writer asked.
pub fn judge(
    auth: &dyn LeaseAuthority,
    folder: Option<Folder<'_>>,
    view: StatusView,
    action: Action,
) -> Result<Admitted, RunError> {
    // 1. and 2.: the head readable; no rollback evidence (the store's included, when it
    // can be read without its owner).
    let (head, run_json) = head_and_run_json(&view, folder)?;
    // With the store committed in the engine (issue #32), the local file is a view the
    // owner catches up or rebuilds: it is no evidence, and the chain's seal names none.
    let engine = auth.commits_in_engine();
    let store = match folder.and_then(|f| f.store_root.map(|r| (f, r))) {
        Some((f, root)) if !engine => store_snapshot(auth, f.dir, root)?,
        _ => None,
    };
    refuse_evidence(auth, head, run_json, newest_event(auth)?, store.as_ref())?;
    let acting = match (&view.head, action) {
        (None, _) => true,
        (Some(h), _) if !h.is_active() => true,
        (Some(_), Action::Takeover | Action::Retire) => true,
        (Some(_), Action::ClaimOrRetireDead) => view.status == Status::Dead,
        (Some(_), Action::Claim) => false,
    };
    if let (Some((store, file)), true) = (&store, acting) {
        store_against_chain(auth.run_id(), store, file, &view)?;
    }
    if !acting {
        return Ok(Admitted {
            view,
            verified: false,
            mark_due: None,
        });
    }
    // 3. The whole run.
    let mut mark_due = None;
    let mut whole = || -> Result<(), RunError> {
        if let Some(f) = folder {
            crate::preflight::preflight(f.dir)?;
        }
        // The log from its newest verified-prefix mark (PROTOCOL §13.1): what `verify`
        // rejects after the mark is refused with the same code; below it is `verify`'s.
        mark_due = auth.verify_tail()?.mark_due();
        if engine {
            // The engine's store log, checked as the new owner's catch-up will check it
            // (§18.4), so a broken one refuses before anything is written.
            let log = auth.read_store_log(None, u64::MAX)?;
            if let (None, Some(f)) = (&log.tail.last, folder) {
                local_store_unseen(auth, f.dir)?;
            }
        }
        if let Some(f) = folder {
            crate::preflight::strays_above(auth, f.dir, head)?;
            if let (Some(h), false) = (&view.head, engine) {
                crate::preflight::store_named(f.dir, h)?;
            }
        }
        Ok(())
    };
    if let Err(e) = whole() {
        // A judgment of bad data made while the chain moved past `head` (with etcd,
        // another host claimed between these reads, which are not one snapshot) judged a
        // run that no longer is: `CONCURRENT_CHANGE` (75), observe again; bad data that is
        // really there is refused again by the next judgment, on a still chain.
        if is_data_refusal(e.code()) {
            crate::preflight::moved_past(
                auth.run_id().as_str(),
                &|d| auth.perform(Request::List(d)),
                head,
                head + 1,
            )?;
        }
        return Err(e);
    }
    Ok(Admitted {
        view,
        verified: true,
        mark_due,
    })
}

/// `STORE_MISSING` (65) when the engine holds no record of the run's store while the
/// folder holds a local store (`store/run.sqlite`: a run that kept its store here, with the
/// run folder as its authority or with etcd before issue #32): the engine's store would
/// start empty beside data it never saw. Refused before anything is written, never set
/// aside silently.
fn local_store_unseen(auth: &dyn LeaseAuthority, dir: &RunDir) -> Result<(), RunError> {
    let local = lease_core::layout::STORE_FILE;
    let present = dir
        .fs()
        .exists(local)
        .map_err(|e| FsError::io(dir.run_id().as_str(), "stat", local, e))?;
    if !present {
        return Ok(());
    }
    Err(RunError::Store(lease_sqlite::StoreError::Missing {
        run: auth.run_id().to_string(),
        file: format!("{} in the engine", lease_core::Dir::StoreLog.path()),
        detail: format!(
            "the engine holds no record of this run's store, but the folder holds a local store ({local}) it would not see; this version cannot import it: move {local} out of the folder to start the run with an empty store in the engine, or keep the run folder as the authority"
        ),
    }))
}

/// Whether `code` refuses a run for what its records say (the data errors a judgment on a
/// moving chain can meet), as opposed to access, I/O or availability.
fn is_data_refusal(code: lease_core::Code) -> bool {
    use lease_core::Code;
    matches!(
        code,
        Code::ChainBroken
            | Code::EventLogGap
            | Code::RecordInvalid
            | Code::RunLayoutInvalid
            | Code::StoreMissing
            | Code::StoreBehindSeal
            | Code::StoreIdentityMismatch
            | Code::StoreLogInvalid
    )
}

/// Read `run.json` beneath the held root of `dir`, never repairing it: the outer error is
/// an I/O error (the caller's refusal, 74), the inner one a record that cannot be decoded
/// (naming the file). The one reader of `run.json` for writers and observers.
pub fn read_run_json(dir: &RunDir) -> Result<Result<Option<RunStatus>, LeaseError>, RunError> {
    let p = FileRef::RunStatus.path();
    let bytes = dir
        .fs()
        .read(&p, MAX_RECORD_BYTES)
        .map_err(|e| FsError::io(dir.run_id().as_str(), "read", &p, e))?;
    Ok(match bytes {
        None => Ok(None),
        Some(b) => decode_for::<RunStatus>(dir.run_id(), &b)
            .map(Some)
            .map_err(|e| e.in_file(p)),
    })
}

/// [`read_run_json`], but from the engine when the run's status follows its lease there
/// (`LeaseAuthority::commits_in_engine`, issue #32): the engine's copy is the one every
/// host's owner wrote under the guard; the folder's is only this host's. A run whose engine
/// holds none yet (written before #32) falls back to the folder's.
pub fn read_run_json_of(
    auth: &dyn LeaseAuthority,
    dir: &RunDir,
) -> Result<Result<Option<RunStatus>, LeaseError>, RunError> {
    if auth.commits_in_engine() {
        match auth.perform(Request::Read(FileRef::RunStatus))? {
            Response::Content(Some(b)) => {
                return Ok(decode_for::<RunStatus>(dir.run_id(), &b)
                    .map(Some)
                    .map_err(|e| e.in_file(FileRef::RunStatus.path())));
            }
            Response::Content(None) => {}
            other => {
                return Err(RunError::Io(format!(
                    "run {}: reading run.json answered {other:?}",
                    dir.run_id()
                )));
            }
        }
    }
    read_run_json(dir)
}

/// The generation of the newest event and its file (`None`: an empty log, or its newest event
/// unreadable: the verify walk of step 3 names that). Events are generation-monotone (I13),
/// so the newest one carries the highest generation: a few `Exists` probes and one read,
/// whatever the log's length. The verify walk refuses an event above the head too (its generation has
/// no epoch); this look is O(1) and comes first, before the action is known to change the
/// owner.
fn newest_event(auth: &dyn LeaseAuthority) -> Result<Option<(u64, String)>, RunError> {
    // From the newest verified-prefix mark with `Exists` probes (issue #33), not a count
    // of `events/`: O(log n). A stray far past a gap is the whole `verify`'s to find.
    let highest = auth.log_end()?;
    let Some(seq) = Sequence::new(highest) else {
        return Ok(None);
    };
    let file = FileRef::Event(seq);
    let Response::Content(Some(bytes)) = auth.perform(Request::Read(file))? else {
        return Ok(None);
    };
    Ok(decode_for::<Event>(auth.run_id(), &bytes)
        .ok()
        .map(|e| (e.generation.get(), file.path())))
}

/// The store opened to read without writing (SQLite `immutable`: no lock, no `-shm`, no
/// WAL replay) beneath the held root `root`, with its path for messages; `None` when there
/// is nothing to judge: no store, a store folder that cannot be opened (the layout check
/// and the owner's open name it, with their codes), or a write-ahead log beside it (its
/// owner has it open, or crashed: only an owner's open replays it, and that open judges
/// the store after the claim, handing the run back if it refuses). A store that cannot be
/// opened otherwise (corrupt, of another run) is the refusal (65), as the owner's open
/// would give it after the claim.
fn store_snapshot(
    auth: &dyn LeaseAuthority,
    dir: &RunDir,
    root: &RealFs,
) -> Result<Option<(lease_sqlite::ReadOnlyStore, String)>, RunError> {
    use lease_sqlite::{Store, StoreError};
    let Ok(store_dir) = root.open_dir(lease_core::layout::STORE_DIR) else {
        return Ok(None);
    };
    let shown = dir.root().join(lease_core::layout::STORE_DIR);
    let file = shown
        .join(lease_core::layout::STORE_FILE_NAME)
        .display()
        .to_string();
    match Store::open_read_only_in(
        auth.run_id(),
        store_dir,
        &shown,
        lease_core::layout::STORE_FILE_NAME,
    ) {
        Ok(s) => Ok(Some((s, file))),
        // No store yet: the owner's open will create one beside whatever is at the
        // log's name, and refuse a log that is not a regular file (`STORE_CORRUPT`) after
        // the claim. Judged here instead, before it (found by the gate test: a FIFO or a
        // folder at `store/run.sqlite-wal` of a run that never opened a store).
        Err(StoreError::Missing { .. }) => {
            let wal = format!("{}-wal", lease_core::layout::STORE_FILE);
            match dir.fs().entry_info(&wal) {
                Ok(Some(info)) if !info.regular => Err(RunError::Store(StoreError::Corrupt {
                    run: auth.run_id().to_string(),
                    file,
                    detail: format!(
                        "its write-ahead log {wal} is not a regular file (a folder, FIFO, symlink or device); move it out of the run by hand (keep a copy)"
                    ),
                })),
                _ => Ok(None),
            }
        }
        Err(StoreError::NeedsOwner { .. } | StoreError::Busy { .. }) => Ok(None),
        Err(e) => Err(RunError::Store(e)),
    }
}

/// The store against what the next owner's open will require at least: the head's seal
/// and floor and, for an active head being replaced, the store head its owner reported in
/// its last heartbeat (the replacement records it as the floor). `STORE_BEHIND_SEAL`,
/// `STORE_IDENTITY_MISMATCH` (65), naming the file. The one judgement of a store read
/// without its owner (the admission rule, and `store get/list/log`'s reader).
pub(crate) fn store_against_chain(
    run: &lease_core::RunId,
    store: &lease_sqlite::ReadOnlyStore,
    file: &str,
    view: &StatusView,
) -> Result<(), RunError> {
    let Some(h) = &view.head else {
        return Ok(());
    };
    let (seal, floor) = lease_core::seal::seal_of(&h.epoch);
    let reported = h
        .beat
        .as_ref()
        .filter(|_| h.is_active())
        .and_then(|b| b.store_head)
        .filter(|&s| s > 0)
        .map(|s| (s, h.generation()));
    let floor = match (floor, reported) {
        (Some(a), Some(b)) => Some(if b.0 > a.0 { b } else { a }),
        (a, b) => a.or(b),
    };
    let state = store.identity().map_err(RunError::Store)?;
    lease_core::seal::check_seal(run, seal, floor, &state).map_err(|error| {
        RunError::Store(lease_sqlite::StoreError::Lease {
            file: Some(file.to_string()),
            error,
        })
    })
}

/// Steps 1 and 2 of [`judge`] alone, for a writer that changes no owner but compacts or
/// removes what the chain's head decides (`runlease prune`): the head is readable and no
/// rollback evidence stands (`run.json`, the newest event or the store ahead of the
/// chain: `CHAIN_BROKEN`, 65). Pruning a rolled-back chain would fold its older cutoffs
/// into a checkpoint and remove the records that show what happened. Read-only; the
/// store is not read (`folder`'s `store_root` is ignored: a live owner may have it open).
pub fn rollback_refusal(
    auth: &dyn LeaseAuthority,
    folder: Option<Folder<'_>>,
    view: &StatusView,
) -> Result<(), RunError> {
    let (head, run_json) = head_and_run_json(view, folder)?;
    refuse_evidence(auth, head, run_json, newest_event(auth)?, None)
}

/// Step 1 of [`judge`] and the fact `run.json` gives step 2: the head generation (0: no
/// epoch) and the generation that wrote `run.json`. An unreadable head is that record's
/// error, not a chain that ends early; an unreadable `run.json` is its own error (65):
/// whether the chain was rolled back cannot be told without it.
fn head_and_run_json(
    view: &StatusView,
    folder: Option<Folder<'_>>,
) -> Result<(u64, Option<u64>), RunError> {
    if let Status::Invalid(e) = &view.status {
        return Err(RunError::Lease(e.clone()));
    }
    let head = view.head.as_ref().map_or(0, |h| h.generation().get());
    let run_json = match folder.map(|f| f.run_json) {
        Some(Err(e)) => return Err(RunError::Lease(e.clone())),
        Some(Ok(r)) => r.as_ref().map(|r| r.generation.get()),
        None => None,
    };
    Ok((head, run_json))
}

/// The status view of the run's lease, read at wall time `now` (liveness probed when
/// `probe`), for observers (`status`, `doctor`): a lease folder whose layout the
/// transport refuses (a folder, FIFO or symlink named like an epoch: `RUN_LAYOUT_INVALID`)
/// is judged `invalid` with that refusal ([`LeaseError::LayoutInvalid`]), so the observer
/// reports a state, the finding and the repair, as it does for an unreadable record,
/// instead of only an error (issue #28). Every other error stays the error, among them a
/// file runlease does not trust (`RUN_NOT_OWNED`, 77): every subcommand refuses that
/// before reading it, with the fix (`chown`/`chmod`) in its message (issue #15).
/// Read-only; the writers meet the same refusal with the same code.
pub fn status_view(
    auth: &dyn LeaseAuthority,
    now: lease_core::Timestamp,
    probe: bool,
) -> Result<StatusView, RunError> {
    match auth.status(now, probe) {
        Err(RunError::Fs(FsError::LayoutInvalid { run, path, detail })) => {
            Ok(StatusView::invalid(LeaseError::LayoutInvalid {
                run,
                path,
                detail,
            }))
        }
        other => other,
    }
}

/// The layout part of the admission rule's folder check, for readers that must refuse
/// what the writers refuse (`runlease verify`): every protocol folder listed as the lease
/// lists it (a folder, FIFO or symlink named like a record, a misplaced file, a symlinked
/// folder: `RUN_LAYOUT_INVALID`, 65) and the run layer's own entries (`store/`, `work/`,
/// `tmp/`, `owner.lock`: 65, or `RUN_NOT_OWNED`, 77). Read-only; command records are only
/// listed here, not judged against `/proc` (the writers' check adds that).
pub fn check_layout(dir: &RunDir) -> Result<(), RunError> {
    crate::preflight::list_layout(dir, true)
}

/// A run folder borrowed as the lease's authority, for the observers that hold a
/// `&RunDir` ([`crate::diagnosis::claim_refusal`]): [`crate::FolderAuthority`] without
/// The lease half of an open's preflight, on `auth` (the run folder or etcd) with the run
/// folder `dir` (where `run.json`, command records and the store are) and its held root
/// `root` (the open holds the owner lock), before the claim: the one admission rule,
/// [`judge`], asked about `intent`. Read-only; each refusal is the error
/// the open returns, and nothing was written. Its checks (the module docs of
/// [`crate::admission`] list them in order) include `run.json`, the newest event and the
/// store against the chain (rollback evidence), the whole log and both chains as
/// `runlease verify` checks them, names above the head, the store the chain names present,
/// and the store itself against the seal and floor, read without writing.
///
/// What is still found only after the claim (and handed back, released with the seal):
/// a store a crashed owner left with a write-ahead log (only an owner's open replays it),
/// and anything that changes between this check and the claim (another host's owner,
/// with etcd).
pub(crate) fn preflight_lease(
    auth: &dyn LeaseAuthority,
    dir: &RunDir,
    root: &lease_fs::RealFs,
    run_json: &Result<Option<RunStatus>, LeaseError>,
    intent: Action,
) -> Result<Admitted, RunError> {
    let view = auth.status(wall_now()?, intent == Action::ClaimOrRetireDead)?;
    let folder = Folder {
        dir,
        run_json,
        store_root: Some(root),
    };
    judge(auth, Some(folder), view, intent)
}

/// the `Arc`.
#[derive(Debug)]
pub(crate) struct BorrowedFolder<'a>(pub &'a RunDir);

impl lease_core::transport::Transport for BorrowedFolder<'_> {
    type Error = RunError;
    type Bound = std::time::Instant;
    fn run_id(&self) -> &lease_core::RunId {
        self.0.run_id()
    }
    fn default_bound(&self) -> std::time::Instant {
        // Unused by the folder: each request is one blocking call.
        std::time::Instant::now()
    }
    fn execute(&self, req: Request, _bound: std::time::Instant) -> Result<Response, RunError> {
        Ok(lease_core::transport::Transport::execute(self.0, req, ())?)
    }
    fn tail_hint(&self) -> &lease_core::transport::TailHint {
        lease_core::transport::Transport::tail_hint(self.0)
    }
    fn begin(&self) -> Result<(), RunError> {
        Ok(lease_core::transport::Transport::begin(self.0)?)
    }
    fn clock_domain(&self) -> Option<lease_core::Identity> {
        lease_core::transport::Transport::clock_domain(self.0)
    }
}

impl LeaseAuthority for BorrowedFolder<'_> {
    fn describe(&self) -> String {
        "run folder".into()
    }
    fn folder(&self) -> Option<&RunDir> {
        Some(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_core::ops::{AppendParams, ClaimParams, ReleaseParams};
    use lease_core::{Holder, Identity, Timestamp, TimingPolicy};

    fn id(s: &str) -> Identity {
        Identity::new(s).unwrap()
    }

    fn claim(dir: &RunDir, owner: &str, ms: u64) -> lease_core::ops::OwnedLease {
        dir.claim(ClaimParams {
            run_id: dir.run_id().clone(),
            owner_id: id(owner),
            holder: Holder {
                host: id("elsewhere"),
                boot_id: id("boot-x"),
                pid: 7,
                start_time: 7,
            },
            policy: TimingPolicy::default(),
            now: Timestamp::from_unix_millis(1_700_000_000_000 + ms).unwrap(),
            store_floor: None,
        })
        .unwrap()
    }

    /// A run folder `job` whose generation 1 released: free at generation 2.
    fn released_once() -> (tempfile::TempDir, RunDir) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::create(&tmp.path().join("job")).unwrap();
        let a = claim(&dir, "a", 0);
        dir.release(ReleaseParams {
            lease: a,
            now: Timestamp::from_unix_millis(1_700_000_000_100).unwrap(),
            seal: None,
        })
        .unwrap();
        (tmp, dir)
    }

    #[test]
    fn an_event_above_a_head_that_moved_meanwhile_is_a_concurrent_change_not_a_rollback() {
        let (_tmp, dir) = released_once();
        // Then 3 claimed and appending: what a reader that read the head at 2 meets when
        // another host claims between its two reads.
        let b = claim(&dir, "b", 200);
        assert_eq!(b.generation.get(), 3);
        let e = dir
            .append(
                &b,
                AppendParams {
                    event_type: id("step"),
                    payload: serde_json::json!(1),
                    now: Timestamp::from_unix_millis(1_700_000_000_300).unwrap(),
                    tail_hint: None,
                },
            )
            .unwrap();
        let file = FileRef::Event(e.sequence).path();
        let auth = BorrowedFolder(&dir);
        let err = refuse_evidence(&auth, 2, None, Some((3, file.clone())), None).unwrap_err();
        assert_eq!(err.code(), lease_core::Code::ConcurrentChange, "{err}");
        // An event above a chain that does not reach it is rollback evidence, as before.
        let err = refuse_evidence(&auth, 2, None, Some((4, file)), None).unwrap_err();
        assert_eq!(err.code(), lease_core::Code::ChainBroken, "{err}");
    }

    #[test]
    fn a_data_refusal_judged_on_a_chain_that_moved_meanwhile_is_a_concurrent_change() {
        let (tmp, dir) = released_once();
        // The view a claimer read while the run was free at generation 2 ...
        let auth = BorrowedFolder(&dir);
        let now = Timestamp::from_unix_millis(1_700_000_000_150).unwrap();
        let stale = status_view(&auth, now, false).unwrap();
        // ... then another owner claimed 3, and the log has a gap verify refuses.
        claim(&dir, "b", 200);
        let stray = tmp
            .path()
            .join("job")
            .join(FileRef::Event(Sequence::new(5).unwrap()).path());
        std::fs::create_dir_all(stray.parent().unwrap()).unwrap();
        std::fs::write(&stray, b"{}").unwrap();
        let run_json = Ok(None);
        let folder = Folder {
            dir: &dir,
            run_json: &run_json,
            store_root: None,
        };
        let err = judge(&auth, Some(folder), stale, Action::Claim).unwrap_err();
        assert_eq!(err.code(), lease_core::Code::ConcurrentChange, "{err}");
        // Judged again on a still chain, the bad data is refused for what it is.
        let fresh = status_view(&auth, now, false).unwrap();
        let err = judge(&auth, Some(folder), fresh, Action::Retire).unwrap_err();
        assert_ne!(err.code(), lease_core::Code::ConcurrentChange, "{err}");
    }
}
