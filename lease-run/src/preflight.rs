//! What an open checks before it writes anything.
//!
//! Two parts, both read-only and both run under the kernel owner lock, before the claim:
//! [`preflight`] (the folder: its layout and command records) and [`preflight_lease`] (the
//! lease the open is about to change: the chain against `run.json`, the whole log exactly
//! as `runlease verify` checks it, names above the head, and the store the chain names).
//! Whatever they refuse, the run is left exactly as it was: no generation is used up.

use crate::authority::LeaseAuthority;
use crate::clock::wall_now;
use crate::error::RunError;
use crate::run::reap::{CommandState, audit_commands};
use lease_core::LeaseOps;
use lease_core::diagnose::{NamedStore, named_store};
use lease_core::ops::{Head, Request, Response, Status};
use lease_core::rollback::Evidence;
use lease_core::{Dir, FileRef, LeaseError, RunStatus};
use lease_fs::{FsError, RunDir};
use lease_sqlite::StoreError;

/// What an open checks before it writes anything, for runs it is about to claim: every
/// protocol folder of the layout is listed (the event folder counted) as the lease will
/// list it, so a misplaced file or a symlinked folder (`RUN_LAYOUT_INVALID`, 65) is refused
/// now instead of at the release, after the command ran; and every command record is read
/// and judged ([`audit_commands`]): an unreadable or misnamed one (65) or a live recorded
/// process that cannot be proved ours (`RUN_COMMAND_UNPROVEN`, 76) is refused before a
/// claim or a retirement, not while reaping after it. Read-only.
pub fn preflight(dir: &RunDir) -> Result<(), RunError> {
    // The events folder is not counted here (issue #33: a count is one directory entry
    // per event): the tail check that follows reads every event after the newest
    // verified-prefix mark, and a bad file named like one of them is refused there with
    // the same code; below the mark it is `runlease verify`'s and `doctor`'s to find.
    list_layout(dir, false)?;
    match first_unproven(dir)? {
        Some(refusal) => Err(refusal),
        None => Ok(()),
    }
}

/// The layout half of [`preflight`]: every protocol folder listed as the lease lists it
/// (the event folder counted when `events`: `verify` counts it, the open's preflight
/// leaves it to the tail check), so a misplaced file, a symlinked folder or a bad file named
/// like a record is its error; then the run layer's own entries as the open will meet
/// them ([`run_entries`]).
pub(crate) fn list_layout(dir: &RunDir, events: bool) -> Result<(), RunError> {
    for d in lease_core::Dir::ALL {
        if d == lease_core::Dir::Events && !events {
            continue;
        }
        let req = if d == lease_core::Dir::Events {
            lease_core::ops::Request::CountEvents
        } else {
            lease_core::ops::Request::List(d)
        };
        dir.perform(req)?;
    }
    run_entries(dir)
}

/// The run layer's entries of the run folder, judged as the open will meet them (issue
/// #28: `status` said "free, claim it" and `doctor` OK where `run` refused): `store/`,
/// `work/` and `tmp/`, when present, are folders of ours that are not symlinks (listed
/// beneath the held root, trust-checked), and `owner.lock`, when present, is a regular
/// file of ours that is not a symlink (read the way every record is read: no symlink
/// followed, nothing but a regular file opened, `O_NONBLOCK`). A symlink, FIFO or misplaced
/// entry is `RUN_LAYOUT_INVALID` (65), one not ours or open to others `RUN_NOT_OWNED` (77),
/// naming it; an absent one is fine (the open creates it). Read-only.
pub(crate) fn run_entries(dir: &RunDir) -> Result<(), RunError> {
    let run = dir.run_id().as_str();
    for d in ["store", "work", "tmp"] {
        match dir.fs().list(d) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(FsError::io(run, "open", d, e).into()),
        }
    }
    let lock = lease_fs::lock::LOCK_FILE;
    match dir.fs().read(lock, lease_core::canonical::MAX_RECORD_BYTES) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FsError::io(run, "open", lock, e).into()),
    }
}

/// The refusal (`RUN_COMMAND_UNPROVEN`, 76) for the first command record that names a live
/// process runlease cannot prove it started (PROTOCOL §11.1), if any; an unreadable or
/// misnamed record is the error. Reads `/proc` only. The next open refuses over it
/// ([`preflight`]) and `doctor` reports it (`diagnosis::gather_facts`).
pub(crate) fn first_unproven(dir: &RunDir) -> Result<Option<RunError>, RunError> {
    Ok(audit_commands(dir)?
        .into_iter()
        .find_map(|a| match a.state {
            CommandState::Unproven { why } => Some(RunError::CommandUnproven {
                run: dir.run_id().to_string(),
                file: a.file,
                pid: a.pid,
                start_time: a.start_time,
                why,
            }),
            _ => None,
        }))
}

/// `CHAIN_BROKEN` (65) when `run.json` was written by a generation the lease chain does
/// not reach (its newest epochs deleted, `lease/` restored from an older copy or emptied).
/// An owner writes `run.json` only after its epoch is durable, so no crash produces this;
/// claiming would hand out fencing tokens already given out (the store accepts an equal
/// token). The `run.json` part of the admission rule's rollback evidence
/// ([`crate::admission::judge`], which the open asks for the whole of it).
pub fn chain_reaches(
    auth: &dyn LeaseAuthority,
    run_json: Option<&RunStatus>,
) -> Result<(), RunError> {
    let Some(written_by) = run_json.map(|r| r.generation.get()) else {
        return Ok(());
    };
    let view = auth.status(wall_now()?, false)?;
    // An unreadable head is that record's error, not a chain that ends early.
    if let Status::Invalid(e) = view.status {
        return Err(RunError::Lease(e));
    }
    let head = view.head.as_ref().map_or(0, |h| h.generation().get());
    refuse_evidence(auth, head, Some(written_by), None, None)
}

/// `RUN_LAYOUT_INVALID` (65) naming the first heartbeat or cutoff (listed where the lease
/// lives) or command record (in the run folder) whose generation is above `head`, the
/// chain's head generation (0: none). Whatever its type (a file, a directory, a FIFO):
/// only the name is looked at, and nothing is opened.
pub fn strays_above(auth: &dyn LeaseAuthority, dir: &RunDir, head: u64) -> Result<(), RunError> {
    strays_above_in(
        auth.run_id().as_str(),
        &|d| auth.perform(Request::List(d)),
        dir,
        head,
    )
}

/// The files of the answer `r` to `List(d)` (any other answer is an I/O error naming the
/// folder: a transport that broke its contract).
pub(crate) fn listed(run_id: &str, d: Dir, r: Response) -> Result<Vec<FileRef>, RunError> {
    match r {
        Response::Listing(l) => Ok(l),
        other => Err(RunError::Io(format!(
            "run {run_id}: listing {} answered {other:?}",
            d.path()
        ))),
    }
}

/// [`strays_above`] with the lease's folders listed by `list` (the lease's authority, or
/// the run folder itself).
pub(crate) fn strays_above_in(
    run_id: &str,
    list: &dyn Fn(Dir) -> Result<Response, RunError>,
    dir: &RunDir,
    head: u64,
) -> Result<(), RunError> {
    let above = |refs: Vec<FileRef>| {
        refs.into_iter().find(|f| match f {
            FileRef::Beat(g) | FileRef::Cutoff(g) | FileRef::Command { generation: g, .. } => {
                g.get() > head
            }
            _ => false,
        })
    };
    let mut found = None;
    for d in [Dir::Beats, Dir::Cutoffs] {
        found = found.or(above(listed(run_id, d, list(d)?)?));
    }
    // A heartbeat or cutoff above `head` in the lease's own folders may be a newer owner's
    // that appeared after `head` was read: with etcd another host claims without this
    // host's owner lock (the partition harness of issue #31 met it). The listings are not
    // one snapshot, so the chain is listed again: if it now reaches that generation the
    // run changed under the judgment (`CONCURRENT_CHANGE`, 75: observe again), which is no
    // evidence of a bad folder.
    if let Some(g) = found.as_ref().and_then(|f| match f {
        FileRef::Beat(g) | FileRef::Cutoff(g) => Some(g.get()),
        _ => None,
    }) {
        moved_past(run_id, list, head, g)?;
    }
    let commands = listed(
        run_id,
        Dir::Commands,
        dir.perform(Request::List(Dir::Commands))?,
    )?;
    found = found.or(above(commands));
    let Some(f) = found else {
        return Ok(());
    };
    let what = match f {
        FileRef::Beat(_) => "a heartbeat",
        FileRef::Cutoff(_) => "a cutoff",
        _ => "a command record",
    };
    let g = match &f {
        FileRef::Beat(g) | FileRef::Cutoff(g) | FileRef::Command { generation: g, .. } => g.get(),
        _ => 0,
    };
    let chain = if head == 0 {
        "the lease chain has no epoch".to_string()
    } else {
        format!("the lease chain ends at generation {head}")
    };
    Err(RunError::Fs(FsError::LayoutInvalid {
        run: run_id.to_string(),
        path: f.path(),
        detail: format!(
            "named like {what} of generation {g}, but {chain}: no crash leaves one (it is written only after its epoch), and the next owner would meet it at generation {g}; move it out of the run by hand (keep a copy), then run again; nothing was claimed"
        ),
    }))
}

/// `CONCURRENT_CHANGE` (75) when the lease chain, listed again by `list`, now reaches
/// generation `g`, which the judgment made at head `head` found named above it: another
/// owner claimed the run meanwhile (with etcd, another host claims without this host's
/// owner lock, and a judgment's reads are not one snapshot), which is no evidence of a bad
/// or rolled-back lease. `Ok` when the chain still ends below `g`: the finding stands.
pub(crate) fn moved_past(
    run_id: &str,
    list: &dyn Fn(Dir) -> Result<Response, RunError>,
    head: u64,
    g: u64,
) -> Result<(), RunError> {
    let now_head = listed(run_id, Dir::Epochs, list(Dir::Epochs)?)?
        .into_iter()
        .filter_map(|f| match f {
            FileRef::Epoch(e) => Some(e.get()),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    if now_head < g {
        return Ok(());
    }
    Err(RunError::Lease(LeaseError::ConcurrentChange {
        run: run_id.to_string(),
        detail: format!(
            "the lease chain ended at generation {head} when this was judged and now reaches generation {now_head}: another owner claimed the run meanwhile; observe it again"
        ),
    }))
}

/// `STORE_MISSING` (65) when the store that whoever owns the run after `head` must open is
/// not in the run folder `dir`: the one `head` names ([`named_store`], the judgement
/// doctor's `STORE_MISSING` makes), or, for an active head about to be replaced, the store
/// head its owner reported in its last heartbeat (the replacement records it as the floor).
/// Looked at beneath the held root without following a symlink; the store is not opened,
/// and only a store certainly absent is refused here.
pub fn store_named(dir: &RunDir, head: &Head) -> Result<(), RunError> {
    let reported = head
        .beat
        .as_ref()
        .filter(|_| head.is_active())
        .and_then(|b| b.store_head)
        .filter(|&h| h > 0);
    let named = match (named_store(&head.epoch), reported) {
        (Some(n), _) => n,
        (None, Some(floor)) => NamedStore::Floor {
            floor,
            generation: head.generation(),
        },
        (None, None) => return Ok(()),
    };
    let file = lease_core::layout::STORE_FILE;
    // Only a name that is certainly absent refuses here. Anything else (a file lease-fs
    // would not trust, a symlinked `store/`, an I/O error) is for the `store` step to
    // judge: `store/`'s contents are lease-sqlite's (PROTOCOL §2 Trust).
    if !matches!(dir.fs().exists(file), Ok(false)) {
        return Ok(());
    }
    let names = match named {
        NamedStore::Sealed {
            sequence,
            generation,
            store_id,
        } => format!(
            "the lease chain names store {store_id}, sealed at sequence {sequence} by generation {generation}"
        ),
        NamedStore::Floor { floor, generation } => format!(
            "the lease chain names a store at sequence {floor} or later (recorded by generation {generation})"
        ),
    };
    Err(RunError::Store(StoreError::Missing {
        run: dir.run_id().to_string(),
        file: file.to_string(),
        detail: format!(
            "{names}, but this run folder has none; it is never recreated: restore it (or run on the host that has it); nothing was claimed"
        ),
    }))
}

/// Step 2 of [`judge`](crate::admission::judge): the facts gathered (`run.json`'s generation, the newest event and
/// its file, the store read without its owner and its file), the decision lease-core's
/// (`rollback_evidence`, the one the model checker's actors make too), and the refusal
/// `CHAIN_BROKEN` (65) naming what showed it.
pub(crate) fn refuse_evidence(
    auth: &dyn LeaseAuthority,
    head: u64,
    run_json: Option<u64>,
    event: Option<(u64, String)>,
    store: Option<&(lease_sqlite::ReadOnlyStore, String)>,
) -> Result<(), RunError> {
    let token = match store {
        Some((s, _)) => Some(s.max_token().map_err(RunError::Store)?),
        None => None,
    };
    let newest = event.as_ref().map(|(g, _)| *g);
    let Some(ev) = lease_core::rollback::rollback_evidence(head, run_json, newest, token) else {
        return Ok(());
    };
    // An event above `head` may be a newer owner's, claimed and appended after `head` was
    // read (with etcd, on another host): no rollback if the chain now reaches it.
    if let Evidence::Event { .. } = ev {
        moved_past(
            auth.run_id().as_str(),
            &|d| auth.perform(Request::List(d)),
            head,
            ev.generation(),
        )?;
    }
    let named = match (&ev, store, &event) {
        (Evidence::Store { .. }, Some((_, file)), _) => format!(" (the store: {file})"),
        (Evidence::Event { .. }, _, Some((_, file))) => format!(" ({file})"),
        _ => String::new(),
    };
    Err(RunError::Lease(LeaseError::ChainBroken {
        run: auth.run_id().to_string(),
        chain: "epoch",
        at: ev.generation(),
        detail: format!("{ev}{named}; restore lease/ from a backup"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_core::Generation;

    /// A lease whose listings are given: beats and epochs, nothing else.
    fn lister(beats: &[u64], epochs: &[u64]) -> impl Fn(Dir) -> Result<Response, RunError> {
        let g = |n: &u64| Generation::new(*n).unwrap();
        let beats: Vec<FileRef> = beats.iter().map(|n| FileRef::Beat(g(n))).collect();
        let epochs: Vec<FileRef> = epochs.iter().map(|n| FileRef::Epoch(g(n))).collect();
        move |d| {
            Ok(Response::Listing(match d {
                Dir::Beats => beats.clone(),
                Dir::Epochs => epochs.clone(),
                _ => Vec::new(),
            }))
        }
    }

    #[test]
    fn a_heartbeat_above_a_head_that_moved_meanwhile_is_a_concurrent_change() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RunDir::create(&tmp.path().join("job")).unwrap();
        // Judged at head 2; another host claimed 3 and beat before the listing.
        let e = strays_above_in("job", &lister(&[1, 2, 3], &[1, 2, 3]), &dir, 2).unwrap_err();
        assert_eq!(e.code(), lease_core::Code::ConcurrentChange, "{e}");
        assert!(e.to_string().contains("now reaches generation 3"), "{e}");
        // No epoch 3 anywhere: a stray heartbeat, refused as before.
        let e = strays_above_in("job", &lister(&[1, 2, 3], &[1, 2]), &dir, 2).unwrap_err();
        assert_eq!(e.code(), lease_core::Code::RunLayoutInvalid, "{e}");
        // Nothing above the head: admitted.
        strays_above_in("job", &lister(&[1, 2], &[1, 2]), &dir, 2).unwrap();
    }
}
