//! Decoding what the sub-steps read: the generations in a listing, and records checked
//! against the name of the file they were read from.

use crate::canonical::{Record, decode_for};
use crate::error::LeaseError;
use crate::ids::{Generation, RunId};
use crate::layout::{Dir, FileRef};
use crate::records::{
    Checkpoint, EpochRecord, Event, HeartbeatRecord, RetirementRecord, VerifiedMark,
};

/// The epochs of a listing, oldest first.
pub(crate) fn epochs_of(listing: Vec<FileRef>) -> Vec<Generation> {
    numbers_of(listing, |f| f.generation_in(Dir::Epochs))
}

/// The numbers of the files of one kind in a listing (`pick` names the kind), sorted and
/// deduplicated: the one filter behind `epochs_of`, `marks_of` and the cutoff listings.
pub(crate) fn numbers_of<T: Ord>(
    listing: Vec<FileRef>,
    pick: impl FnMut(FileRef) -> Option<T>,
) -> Vec<T> {
    let mut v: Vec<T> = listing.into_iter().filter_map(pick).collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The floor generation of the newest checkpoint in a listing of `lease/checkpoints`.
pub(crate) fn newest_checkpoint(listing: Vec<FileRef>) -> Option<Generation> {
    listing
        .into_iter()
        .filter_map(|f| f.generation_in(Dir::Checkpoints))
        .max()
}

/// A record stored in a file named by a number its content carries too (an epoch or a
/// cutoff by its generation, a checkpoint by its floor, an event or a mark by its sequence).
pub(crate) trait Numbered: Record {
    /// What the number is called in a mismatch's message.
    const NUMBER: &'static str;
    /// The number the content carries.
    fn number(&self) -> u64;
}

/// `impl Numbered for $record` whose number is called `$name` and is its field `$field`.
macro_rules! numbered {
    ($($record:ty: $name:literal, $field:ident;)*) => {$(
        impl Numbered for $record {
            const NUMBER: &'static str = $name;
            fn number(&self) -> u64 {
                self.$field.get()
            }
        }
    )*};
}

numbered! {
    EpochRecord: "generation", generation;
    RetirementRecord: "generation", generation;
    Checkpoint: "floor", floor_generation;
    Event: "sequence", sequence;
    VerifiedMark: "sequence", through_sequence;
}

/// Decode `bytes`, read from `file`, as `run`'s record `R`, and check that the number the
/// file's name carries (`named`) is the one its content carries ([`Numbered::number`]):
/// else `RECORD_INVALID` naming the file. The one check of name against content behind
/// every `decode_*` of a record named by a number.
pub(crate) fn decode_named<R: Numbered>(
    run: &RunId,
    file: FileRef,
    named: u64,
    bytes: &[u8],
) -> Result<R, LeaseError> {
    let file = file.path();
    let rec: R = decode_for(run, bytes).map_err(|e| e.in_file(&file))?;
    let says = rec.number();
    if says != named {
        return Err(LeaseError::RecordInvalid {
            run: run.to_string(),
            kind: R::KIND,
            file: Some(file),
            detail: format!("file name says {} {named}, content says {says}", R::NUMBER),
        });
    }
    Ok(rec)
}

pub(crate) fn decode_epoch(
    run: &RunId,
    g: Generation,
    bytes: &[u8],
) -> Result<EpochRecord, LeaseError> {
    decode_named(run, FileRef::Epoch(g), g.get(), bytes)
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
    decode_named(run, FileRef::Cutoff(g), g.get(), bytes)
}

pub(crate) fn decode_checkpoint(
    run: &RunId,
    g: Generation,
    bytes: &[u8],
) -> Result<Checkpoint, LeaseError> {
    decode_named(run, FileRef::Checkpoint(g), g.get(), bytes)
}
