//! Whether an event counts: the pure judgment of an event against the epoch chain.

use crate::ids::{Digest, Generation, Identity};
use crate::records::{Checkpoint, EpochRecord, EpochState, Event, RetirementRecord};
use std::collections::BTreeMap;

/// What a reader knows of the epoch chain, for judging events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainView {
    /// The newest checkpoint, if the chain was compacted.
    pub checkpoint: Option<Checkpoint>,
    /// Epochs at or above the checkpoint floor.
    pub epochs: BTreeMap<Generation, EpochRecord>,
    /// Finalized cutoffs (`events_through`) by retired generation.
    pub cutoffs: BTreeMap<Generation, u64>,
    /// The cutoff records behind [`ChainView::cutoffs`] with the hash of their bytes, for
    /// `verify`'s checks of the epochs that bind them (`cutoff_hash`, issue #17).
    pub cutoff_records: BTreeMap<Generation, (RetirementRecord, Digest)>,
}

impl ChainView {
    /// The head generation.
    pub fn head(&self) -> Option<Generation> {
        self.epochs.keys().next_back().copied()
    }

    /// Active generations that were superseded and have no finalized cutoff yet.
    pub fn pending_cutoffs(&self) -> Vec<(Generation, Identity, Generation)> {
        let floor = self.checkpoint.as_ref().map(|c| c.floor_generation);
        self.epochs
            .values()
            .filter_map(|e| e.retired.as_ref().map(|r| (r, e.generation)))
            .filter(|(r, _)| !self.cutoffs.contains_key(&r.generation))
            .filter(|(r, _)| floor.is_none_or(|f| r.generation >= f))
            .map(|(r, by)| (r.generation, r.owner_id.clone(), by))
            .collect()
    }
}

/// Whether an event counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Standing {
    /// It counts.
    Authoritative,
    /// Written by a superseded generation past its cutoff: shown, never counted.
    PastCutoff {
        /// The generation's cutoff.
        cutoff: u64,
    },
    /// Its generation was superseded and the cutoff is not finalized yet (read-only reader).
    Pending,
    /// Its owner id is not the owner of its generation.
    NotOwner,
    /// Its generation is a released or retired (free) epoch: nobody owned it.
    FreeGeneration,
    /// No epoch with its generation exists.
    UnknownGeneration,
    /// Below the checkpoint floor and excluded by it.
    ExcludedByCheckpoint,
}

impl Standing {
    /// Whether the event counts.
    pub fn counts(&self) -> bool {
        matches!(self, Standing::Authoritative)
    }
}

/// Judge one event against the chain (pure).
///
/// A finalized cutoff always applies, even when its generation is the newest epoch on
/// disk (so deleting or corrupting a newer epoch can never make a retired owner's late
/// events count).
pub fn judge_event(ev: &Event, chain: &ChainView) -> Standing {
    if let Some(cp) = &chain.checkpoint {
        if ev.generation < cp.floor_generation {
            let s = ev.sequence.get();
            return if s <= cp.through_sequence && cp.not_authoritative.binary_search(&s).is_err() {
                Standing::Authoritative
            } else {
                Standing::ExcludedByCheckpoint
            };
        }
    }
    let Some(epoch) = chain.epochs.get(&ev.generation) else {
        return Standing::UnknownGeneration;
    };
    if epoch.state != EpochState::Active {
        return Standing::FreeGeneration;
    }
    if epoch.owner_id != ev.owner_id {
        return Standing::NotOwner;
    }
    if let Some(&cutoff) = chain.cutoffs.get(&ev.generation) {
        return if ev.sequence.get() <= cutoff {
            Standing::Authoritative
        } else {
            Standing::PastCutoff { cutoff }
        };
    }
    if chain.head() == Some(ev.generation) {
        Standing::Authoritative
    } else {
        Standing::Pending
    }
}
