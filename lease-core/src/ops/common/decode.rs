//! Decoding what the sub-steps read: the generations in a listing, and records checked
//! against the name of the file they were read from.

use crate::canonical::decode_for;
use crate::error::{LeaseError, RecordKind};
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

pub(crate) fn decode_epoch(
    run: &RunId,
    g: Generation,
    bytes: &[u8],
) -> Result<EpochRecord, LeaseError> {
    let file = FileRef::Epoch(g).path();
    let rec: EpochRecord = decode_for(run, bytes).map_err(|e| e.in_file(&file))?;
    if rec.generation != g {
        return Err(LeaseError::RecordInvalid {
            run: run.to_string(),
            kind: crate::error::RecordKind::Epoch,
            file: Some(file),
            detail: format!(
                "file name says generation {g}, content says {}",
                rec.generation
            ),
        });
    }
    Ok(rec)
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
    let file = FileRef::Cutoff(g).path();
    let rec: RetirementRecord = decode_for(run, bytes).map_err(|e| e.in_file(&file))?;
    if rec.generation != g {
        return Err(LeaseError::RecordInvalid {
            run: run.to_string(),
            kind: crate::error::RecordKind::Retirement,
            file: Some(file),
            detail: format!(
                "file name says generation {g}, content says {}",
                rec.generation
            ),
        });
    }
    Ok(rec)
}
pub(crate) fn decode_checkpoint(
    run: &RunId,
    g: Generation,
    bytes: &[u8],
) -> Result<Checkpoint, LeaseError> {
    let file = FileRef::Checkpoint(g).path();
    let cp: Checkpoint = decode_for(run, bytes).map_err(|e| e.in_file(&file))?;
    if cp.floor_generation != g {
        return Err(LeaseError::RecordInvalid {
            run: run.to_string(),
            kind: RecordKind::Checkpoint,
            file: Some(file),
            detail: format!(
                "file name says floor {g}, content says {}",
                cp.floor_generation
            ),
        });
    }
    Ok(cp)
}
