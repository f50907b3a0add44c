//! Decoding what the sub-steps read: the generations in a listing, and records checked
//! against the name of the file they were read from.

use crate::canonical::{Record, decode_for};
use crate::error::LeaseError;
use crate::ids::{Generation, RunId};
use crate::layout::FileRef;
use crate::records::{Checkpoint, EpochRecord, HeartbeatRecord, RetirementRecord};

pub(crate) fn epochs_of(listing: Vec<FileRef>) -> Vec<Generation> {
    let mut v: Vec<Generation> = listing
        .into_iter()
        .filter_map(|f| match f {
            FileRef::Epoch(g) => Some(g),
            _ => None,
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The floor generation of the newest checkpoint in a listing of `lease/checkpoints`.
pub(crate) fn newest_checkpoint(listing: Vec<FileRef>) -> Option<Generation> {
    listing
        .into_iter()
        .filter_map(|f| match f {
            FileRef::Checkpoint(g) => Some(g),
            _ => None,
        })
        .max()
}

/// Decode `bytes`, read from `file`, as `run`'s record `R`, and check that the number the
/// file's name carries (`named`) is the one its content carries (`content`, named `what` in
/// the message): else `RECORD_INVALID` naming the file. The one check of name against
/// content behind every `decode_*` of a record named by a number.
pub(crate) fn decode_named<R: Record>(
    run: &RunId,
    file: FileRef,
    what: &str,
    named: u64,
    content: impl Fn(&R) -> u64,
    bytes: &[u8],
) -> Result<R, LeaseError> {
    let file = file.path();
    let rec: R = decode_for(run, bytes).map_err(|e| e.in_file(&file))?;
    let says = content(&rec);
    if says != named {
        return Err(LeaseError::RecordInvalid {
            run: run.to_string(),
            kind: R::KIND,
            file: Some(file),
            detail: format!("file name says {what} {named}, content says {says}"),
        });
    }
    Ok(rec)
}

pub(crate) fn decode_epoch(
    run: &RunId,
    g: Generation,
    bytes: &[u8],
) -> Result<EpochRecord, LeaseError> {
    decode_named(
        run,
        FileRef::Epoch(g),
        "generation",
        g.get(),
        |r: &EpochRecord| r.generation.get(),
        bytes,
    )
}

pub(crate) fn decode_beat(
    run: &RunId,
    epoch: &EpochRecord,
    bytes: &[u8],
) -> Result<HeartbeatRecord, LeaseError> {
    let file = FileRef::Beat(epoch.generation).path();
    let beat: HeartbeatRecord = decode_for(run, bytes).map_err(|e| e.in_file(&file))?;
    if beat.generation != epoch.generation || beat.owner_id != epoch.owner_id {
        return Err(LeaseError::RecordInvalid {
            run: run.to_string(),
            kind: crate::error::RecordKind::Heartbeat,
            file: Some(file),
            detail: format!(
                "heartbeat of generation {} owner {} does not belong to epoch {} owner {}",
                beat.generation, beat.owner_id, epoch.generation, epoch.owner_id
            ),
        });
    }
    Ok(beat)
}

pub(crate) fn decode_cutoff(
    run: &RunId,
    g: Generation,
    bytes: &[u8],
) -> Result<RetirementRecord, LeaseError> {
    decode_named(
        run,
        FileRef::Cutoff(g),
        "generation",
        g.get(),
        |r: &RetirementRecord| r.generation.get(),
        bytes,
    )
}

pub(crate) fn decode_checkpoint(
    run: &RunId,
    g: Generation,
    bytes: &[u8],
) -> Result<Checkpoint, LeaseError> {
    decode_named(
        run,
        FileRef::Checkpoint(g),
        "floor",
        g.get(),
        |c: &Checkpoint| c.floor_generation.get(),
        bytes,
    )
}
