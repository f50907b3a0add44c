//! Gathering what lease-core's one diagnosis ([`lease_core::diagnose`]) looks at, for a run
//! folder: reads only (nothing is written, removed or signalled; the store is never
//! opened). `runlease doctor` is [`gather_facts`], [`lease_core::diagnose::diagnose`] and
//! rendering.

use crate::error::RunError;
use crate::preflight::first_unproven;
use lease_core::diagnose::{CommandFacts, Facts, RunJsonFacts, VerifyFacts};
use lease_core::{Code, Dir, FileRef, LeaseOps, RunStatus, Timestamp};
use lease_fs::RunDir;
use lease_fs::fs::Fs;

pub use crate::compact::TEMP_MIN_AGE_SECS;

/// Every fact of the run at `dir` that [`lease_core::diagnose::diagnose`] looks at, read
/// at wall time `now` with liveness probed. A data error (a broken chain, an unreadable
/// record, an unprovable command) is a fact; anything else (I/O, a folder that is not
/// ours) is the error.
///
/// Every judgement of the command records in it (its own and the admission rule's) shares
/// one scan of `/proc` ([`crate::one_proc_scan`], issue #29).
pub fn gather_facts(dir: &RunDir, now: Timestamp) -> Result<Facts, RunError> {
    crate::one_proc_scan(|| gather_facts_once(dir, now))
}

fn gather_facts_once(dir: &RunDir, now: Timestamp) -> Result<Facts, RunError> {
    let view = crate::admission::status_view(&crate::admission::BorrowedFolder(dir), now, true)?;
    let mut facts = Facts::of_view(view);
    let (temps, not_removable) = count_temp_files(&**dir.fs());
    facts.temp_files = temps;
    facts.verify = match dir.verify() {
        Ok(r) => VerifyFacts::Held(r),
        Err(e)
            if matches!(
                e.code(),
                Code::ChainBroken
                    | Code::EventLogGap
                    | Code::RecordInvalid
                    | Code::SchemaUnsupported
                    | Code::RunLayoutInvalid
                    | Code::RunNotOwned
            ) =>
        {
            VerifyFacts::Failed {
                code: e.code(),
                message: e.code().prefixed(&e),
            }
        }
        Err(e) => return Err(e.into()),
    };
    // run.json (written by `runlease run`): reported when unreadable, never repaired.
    facts.run_json = run_json_facts(dir);
    // Command records (read by the next open to reap a killed incarnation's commands):
    // one it cannot read, or one naming a live process it cannot prove ours, refuses it.
    facts.commands = match first_unproven(dir) {
        Ok(None) => CommandFacts::Clean,
        Ok(Some(refusal)) => {
            let message = refusal.code().prefixed(&refusal);
            CommandFacts::Unproven { message }
        }
        // More records than runlease judges (issue #29): none was read.
        Err(e) if e.code() == Code::RunCommandRecordsOverLimit => CommandFacts::OverLimit {
            message: e.code().prefixed(&e),
        },
        // Bad data in a record (not I/O, not a folder that is not ours): a finding.
        Err(e)
            if matches!(
                e.code(),
                Code::RecordInvalid | Code::RunLayoutInvalid | Code::ChainBroken
            ) =>
        {
            let message = e.code().prefixed(&e);
            CommandFacts::Invalid { message }
        }
        Err(e) => return Err(e),
    };
    // Directories named like the run's cgroups that the next open leaves alone (issue #29):
    // reported, never touched. A live owner's own (the head's generation) is not judged:
    // its records may not be written yet. Not looked at past the record limit.
    let live_gen = match facts.view.status {
        lease_core::ops::Status::Active | lease_core::ops::Status::Stale => {
            facts.view.head.as_ref().map(|h| h.generation().get())
        }
        _ => None,
    };
    facts.cgroups_left_alone = match crate::audit_cgroups(dir, live_gen) {
        Ok(found) => found
            .into_iter()
            .map(|c| lease_core::diagnose::CgroupLeftAlone {
                path: c.path.display().to_string(),
                generation: c.generation,
                uid: c.uid,
                members: c.members,
                why: c.why,
            })
            .collect(),
        // A record that cannot be read is reported above (the open refuses over it).
        Err(e)
            if matches!(
                e.code(),
                Code::RecordInvalid
                    | Code::RunLayoutInvalid
                    | Code::ChainBroken
                    | Code::RunCommandRecordsOverLimit
            ) =>
        {
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    // The store is never opened: its owner holds it exclusively, and opening a WAL
    // database may run SQLite's recovery, a write. Its presence is looked at beneath the
    // held root, without following a symlink.
    facts.store_present = dir.fs().exists(lease_core::layout::STORE_FILE).ok();
    facts.stray_names = dir.stray_names()?;
    // Named like our temp files but never removed by a clean-up (not a regular file of
    // ours): a stray to move by hand, not a temp file a clean-up would take.
    facts.stray_names.extend(not_removable);
    // The head's cutoff, due but never written (a crash between a release's, takeover's
    // or retirement's epoch and its cutoff): reported with the step that finalizes it
    // (issue #28: the released owner's events read `pending`, and status, doctor and
    // verify all said fine). An unreadable answer is not reported as open.
    facts.open_cutoff = facts.view.head.as_ref().and_then(|h| {
        lease_core::diagnose::open_cutoff_of(&h.epoch, |g| {
            dir.fs().exists(&FileRef::Cutoff(g).path()).unwrap_or(true)
        })
    });
    facts.adoption_refusal = adoption_refusal(dir);
    // What the writer the next step names would refuse: the one admission rule
    // ([`claim_refusal`], [`crate::admission::judge`]), asked as that writer asks it.
    // For a live owner, doctor reports what a replacement would be refused (status, which
    // polls, asks nothing then).
    let action = match facts.view.status {
        lease_core::ops::Status::Active => Some(crate::admission::Action::Takeover),
        _ => None,
    };
    facts.claim_refusal = refusal_of(dir, &facts.view, action)?;
    Ok(facts)
}

/// What `runlease run` would refuse of the folder `dir` itself (not a run, not empty:
/// `RUN_FOLDER_FOREIGN`), as its message; read only. `None` for a run, an empty folder, or
/// when it cannot be told (the claim then reports it).
pub fn adoption_refusal(dir: &RunDir) -> Option<String> {
    match dir.adoption_refusal_held() {
        Ok(Some(e)) => Some(e.code().prefixed(&e)),
        _ => None,
    }
}

/// What the writer that `view`'s next step names (a claim of a free run, a retirement of
/// a dead owner, a takeover of a stale one) would refuse before writing anything, by the
/// one admission rule ([`crate::admission::judge`]) that writer calls: rollback evidence
/// (`run.json` unreadable or ahead of the chain, the newest event above the head), the
/// folder's layout and command records, the whole log and both chains exactly as
/// `runlease verify` checks them, names above the head, the store the chain names present.
/// `Ok(None)` when it would refuse none of these, or when no writer would act (a live
/// owner: the next step is to wait); a data error (65, or 76 for an unprovable command) is
/// `Some((code, CODE: message))` naming the file; anything else (I/O, a folder that is not
/// ours) is the error. Read-only; O(n) in the log's length (the verify walk), as the
/// writers' own check is, plus the store's read-only open (`STORE_BEHIND_SEAL` and the
/// like, as the claim would refuse before it claims).
pub fn claim_refusal(
    dir: &RunDir,
    view: &lease_core::ops::StatusView,
) -> Result<Option<(Code, String)>, RunError> {
    refusal_of(dir, view, None)
}

/// [`claim_refusal`] asked about `action`, or (`None`) about the action the view's next
/// step names.
fn refusal_of(
    dir: &RunDir,
    view: &lease_core::ops::StatusView,
    action: Option<crate::admission::Action>,
) -> Result<Option<(Code, String)>, RunError> {
    use crate::admission::{Action, BorrowedFolder, Folder, judge, read_run_json};
    use lease_core::ops::Status;
    let action = match (action, &view.status) {
        (Some(a), _) => a,
        (None, Status::Free | Status::Invalid(_)) => Action::Claim,
        (None, Status::Dead) => Action::Retire,
        (None, Status::Stale) => Action::Takeover,
        (None, Status::Active) => return Ok(None),
    };
    let run_json = match read_run_json(dir) {
        Ok(r) => r,
        Err(e) => return as_finding(e).map(Some),
    };
    let folder = Folder {
        dir,
        run_json: &run_json,
        // The store judged as the claim will judge it, from a snapshot read without the
        // owner lock (SQLite `immutable`, nothing written): O(store size) for its
        // quick_check, only for a run whose next step is a claim or a replacement.
        store_root: dir.real_fs().map(|f| &**f),
    };
    match judge(&BorrowedFolder(dir), Some(folder), view.clone(), action) {
        Ok(_) => Ok(None),
        Err(e) => as_finding(e).map(Some),
    }
}

/// A refusal of the admission rule as a finding (`code`, `CODE: message`) when it is bad
/// data on disk (65, 76 for an unprovable command, 77 for a file or folder in the run
/// that is not ours or open to others); anything else (I/O, a run folder that cannot be
/// opened) stays the error.
fn as_finding(e: RunError) -> Result<(Code, String), RunError> {
    let code = e.code();
    if matches!(
        code,
        Code::RecordInvalid
            | Code::SchemaUnsupported
            | Code::ChainBroken
            | Code::EventLogGap
            | Code::RunLayoutInvalid
            | Code::RunCommandUnproven
            | Code::RunCommandRecordsOverLimit
            | Code::RunNotOwned
            | Code::StoreBehindSeal
            | Code::StoreIdentityMismatch
            | Code::StoreMissing
            | Code::StoreCorrupt
    ) {
        Ok((code, code.prefixed(&e)))
    } else {
        Err(e)
    }
}

/// Read `run.json` beneath the held root, reporting, never repairing: `Ok(None)` when
/// there is none, `Err` with the error and its code (`CODE: message`, naming the file)
/// when it cannot be read or decoded. The one reader of `run.json` for observers
/// (`doctor`'s facts, `status`'s `run_status`).
pub fn read_run_json(dir: &RunDir) -> Result<Option<RunStatus>, String> {
    match crate::admission::read_run_json(dir) {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(e.code().prefixed(&e)),
        Err(e) => Err(format!("cannot read {}: {e}", FileRef::RunStatus.path())),
    }
}

/// What `run.json` says, as diagnosis facts ([`read_run_json`]).
pub fn run_json_facts(dir: &RunDir) -> RunJsonFacts {
    match read_run_json(dir) {
        Ok(None) => RunJsonFacts::Absent,
        Ok(Some(r)) => RunJsonFacts::Written {
            failed: r.status == lease_core::RunState::Failed,
            generation: r.generation.get(),
            detail: r.detail,
        },
        Err(message) => RunJsonFacts::Invalid { message },
    }
}

/// Count our temp files ([`lease_fs::primitives::is_temp_name`]) in the run's protocol
/// folders, its root and `store/` (every folder `doctor --clean-temp` cleans), exactly as
/// that clean-up judges them ([`lease_fs::primitives::clean_temp_files`]): `(total, old)`
/// of the regular files of ours, `old` those of at least [`TEMP_MIN_AGE_SECS`], which the
/// clean-up removes; and the temp names it never removes (a directory, FIFO, symlink or
/// another user's file under such a name), as paths. So `ORPHAN_TEMP_FILES` names the
/// clean-up only when it removes something (issue #28: a young temp file named it, it
/// removed nothing, and the same finding and step came back).
fn count_temp_files(fs: &dyn Fs) -> ((usize, usize), Vec<String>) {
    let (mut total, mut old) = (0, 0);
    let mut not_removable = Vec::new();
    for d in Dir::ALL
        .iter()
        .map(|d| d.path())
        .chain(["", lease_core::layout::STORE_DIR])
    {
        // Beneath the held root; a missing or refused folder has nothing to count.
        let mut temps = Vec::new();
        let listed = fs.for_each_name(d, &mut |name| {
            if lease_fs::primitives::is_temp_name(name) {
                temps.push(lease_fs::fs::join(d, name));
            }
        });
        if listed.is_err() {
            continue;
        }
        for t in temps {
            match fs.entry_info(&t) {
                // Gone meanwhile (its writer renamed or removed it).
                Ok(None) => {}
                Ok(Some(i)) if i.regular && i.ours => {
                    total += 1;
                    if i.age_secs >= TEMP_MIN_AGE_SECS {
                        old += 1;
                    }
                }
                Ok(Some(_)) => not_removable.push(t),
                // Cannot be told: counted, not as old (the clean-up would not remove it
                // either: it reads the same entry first).
                Err(_) => total += 1,
            }
        }
    }
    ((total, old), not_removable)
}
