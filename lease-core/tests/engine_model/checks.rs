//! The invariants checked in every state (S1, S2, S3) and when a read answers (it holds every
//! record acknowledged before it began).

use crate::common::*;
use crate::world::World;
use lease_core::ops::*;
use lease_core::store_log::*;
use lease_core::*;

impl World {
    /// S1, S2 (refused records never in the log) and S3 (one valid chain).
    pub(crate) fn check(&mut self) -> Result<(), String> {
        // S3 first: the log as any reader reads it, whole.
        let mut d = self.disk.clone();
        let view = d
            .run(&mut ReadStoreLog::new(run_id(), None, 0), &all_dead)
            .map_err(|e| format!("S3: the log does not read as one chain: {e}"))?;
        for (seq, bytes) in &self.acked {
            let f = FileRef::StoreRecord(Sequence::new(*seq).unwrap());
            if self.landed.get(seq) != Some(bytes) {
                return Err(format!("S1: acknowledged record {seq} never landed"));
            }
            // In the engine as it was acknowledged, or folded into the snapshot readers
            // start from (its chain leads back to it).
            if self.disk.files.get(&f) != Some(bytes) {
                covers(&self.landed, &view, *seq, bytes)
                    .map_err(|e| format!("S1: acknowledged record {seq} is not in the log: {e}"))?;
            }
        }
        let log: Vec<&Vec<u8>> = self
            .disk
            .files
            .iter()
            .filter(|(f, _)| matches!(f, FileRef::StoreRecord(_)))
            .map(|(_, b)| b)
            .collect();
        for bytes in &self.refused {
            if log.contains(&bytes) {
                return Err("S2: a record its writer was told was refused is in the log".into());
            }
        }
        Ok(())
    }
}

/// Whether the log `view` (as a read answered it) holds every record of `acked` (those
/// acknowledged before the read began); the first it lacks, as `record N: why`.
pub(crate) fn holds_acked(
    landed: &std::collections::BTreeMap<u64, Vec<u8>>,
    acked: &[(u64, Vec<u8>)],
    view: &StoreLogView,
) -> Result<(), String> {
    for (seq, bytes) in acked {
        covers(landed, view, *seq, bytes).map_err(|e| format!("record {seq}: {e}"))?;
    }
    Ok(())
}

/// Whether the log `view` (as a reader found it) holds the acknowledged record `seq`
/// (`bytes`): among its records, or folded into its snapshot, whose `through_hash` leads
/// back along the landed records' `prev_hash` links to exactly these bytes.
fn covers(
    landed: &std::collections::BTreeMap<u64, Vec<u8>>,
    view: &StoreLogView,
    seq: u64,
    bytes: &[u8],
) -> Result<(), String> {
    let h = Digest::of(bytes);
    if view
        .records
        .iter()
        .any(|x| x.record.sequence.get() == seq && x.hash == h)
    {
        return Ok(());
    }
    let Some((_, m)) = view
        .snapshot
        .as_ref()
        .filter(|(_, m)| m.through.get() >= seq)
    else {
        return Err("not among the records read and no snapshot covers it".into());
    };
    let mut k = m.through.get();
    let mut want = m.through_hash.clone();
    loop {
        let Some(b) = landed.get(&k) else {
            return Err(format!(
                "the snapshot's chain reaches record {k}, which never landed"
            ));
        };
        if Digest::of(b) != want {
            return Err(format!(
                "the snapshot's chain does not lead to the record {k} that landed"
            ));
        }
        if k == seq {
            return if b.as_slice() == bytes {
                Ok(())
            } else {
                Err(format!("the snapshot folds in another record {seq}"))
            };
        }
        let r: StoreRecord = decode(b).map_err(|e| e.to_string())?;
        want = r.prev_hash.ok_or("the chain ends before the record")?;
        k -= 1;
    }
}
