//! The checks of an answer on its own, without the ghost: what counts in a read of the log,
//! whether two reads judge alike, whether a status or a takeover's epoch is valid.

use super::{OpGhost, Violation};
use crate::ops::{EventLogView, Status};
use crate::{EpochRecord, Generation};
use std::collections::BTreeSet;

/// The sequences of the events that count in `view`.
pub fn counted(view: &EventLogView) -> BTreeSet<u64> {
    view.events
        .iter()
        .filter(|e| e.standing.counts())
        .map(|e| e.event.sequence.get())
        .collect()
}

/// The standing `view` gave event `s`, if it judged it.
pub(super) fn standing_of(view: &EventLogView, s: u64) -> Option<&crate::ops::Standing> {
    view.events
        .iter()
        .find(|e| e.event.sequence.get() == s)
        .map(|e| &e.standing)
}

/// Judgements are stable (I12): every event a reader judged (`read`, the answer of a
/// reader that ran concurrently with other operations) has the same verdict, counts or
/// does not count, as in `now`, the answer of an atomic finalizing reader run on the state
/// the reader finished in. A reader must never say "does not count" of an event the run
/// counts, nor the other way round (OQ-15: a reader racing a prune).
pub fn stable_judgements(read: &EventLogView, now: &EventLogView) -> Result<(), Violation> {
    for e in &read.events {
        let s = e.event.sequence.get();
        let Some(then) = standing_of(now, s) else {
            return Err(format!(
                "a reader judged event {s}, which is no longer in the log"
            ));
        };
        if e.standing.counts() != then.counts() {
            return Err(format!(
                "a reader judged event {s} (generation {}) {:?}, but the run judges it {then:?} (judgements must be stable, I12)",
                e.event.generation, e.standing
            ));
        }
    }
    Ok(())
}

/// The authoritative history is generation-monotone (I13): once an event of generation
/// `g` counts, no later event of an older generation counts (a zombie writing after its
/// successors).
pub fn generation_monotone(view: &EventLogView) -> Result<(), Violation> {
    let mut max_gen = 0;
    for e in view.events.iter().filter(|e| e.standing.counts()) {
        let g = e.event.generation.get();
        if g < max_gen {
            return Err(format!(
                "event {} of generation {g} counts after an event of generation {max_gen}",
                e.event.sequence
            ));
        }
        max_gen = g;
    }
    Ok(())
}

/// No event of a superseded generation past its cutoff counts (I4), by the reader's own
/// cutoffs (`view.chain.cutoffs`): a consistency check of the reader's answer with itself,
/// blind to a cutoff written wrong; [`super::Ghost::check_within_cutoffs`] judges from the
/// ghost's facts.
pub fn within_cutoffs(view: &EventLogView) -> Result<(), Violation> {
    for e in &view.events {
        if let Some(&c) = view.chain.cutoffs.get(&e.event.generation)
            && e.standing.counts()
            && e.event.sequence.get() > c
        {
            return Err(format!(
                "event {} of generation {} counts past its cutoff {c}",
                e.event.sequence, e.event.generation
            ));
        }
    }
    Ok(())
}

/// A cutoff never outlives its successor (I11, PROTOCOL §7.0 SYNC): every cutoff on disk,
/// even right after a power loss, has a higher epoch (`head`) or a checkpoint floor above
/// it.
pub fn cutoffs_have_successors(
    cutoffs: impl IntoIterator<Item = Generation>,
    head: u64,
    floor: u64,
) -> Result<(), Violation> {
    for g in cutoffs {
        if g.get() >= head && g.get() >= floor {
            return Err(format!(
                "cutoff {g} outlived its successor (head epoch {head})"
            ));
        }
    }
    Ok(())
}

/// Without outside interference the run never becomes invalid (I10).
pub fn status_valid(status: &Status) -> Result<(), Violation> {
    match status {
        Status::Invalid(e) => Err(format!(
            "the run became invalid without outside interference: {e}"
        )),
        _ => Ok(()),
    }
}

/// A takeover that returned generation `new`'s lease retired exactly the owner it
/// observed, at exactly the beat it observed (I6): `record` is epoch `new` as read back.
///
/// Judged against the ghost's own record of the takeover ([`OpGhost::observed`], the
/// expectation the taker was started with), never against the takeover's judgement: the
/// retired owner's generation and id, and the beat time and count its epoch records as
/// judged (`retired.observed`), must all equal what the taker expected. An owner whose
/// beat landed after the taker's look and that the takeover replaced anyway (a takeover
/// that skipped its re-read's judgement, §7.4 step 6) leaves a beat in the new epoch the
/// taker never expected.
pub fn check_takeover_retired(op: &OpGhost, record: Option<&EpochRecord>) -> Result<(), Violation> {
    let Some(exp) = &op.observed else {
        return Err("a takeover without an observation".into());
    };
    let Some(r) = record.and_then(|r| r.retired.as_ref()) else {
        return Err(format!(
            "a takeover's epoch retired no owner (expected {exp:?}, epoch {record:?})"
        ));
    };
    if r.owner_id != exp.owner_id || Some(r.generation) != exp.generation {
        return Err(format!(
            "took over an owner other than the one observed ({exp:?} vs {record:?})"
        ));
    }
    let Some(seen) = &r.observed else {
        return Err(format!(
            "a takeover's epoch records no observation of generation {} (I6)",
            r.generation
        ));
    };
    if seen.heartbeat_at != exp.heartbeat_at
        || exp
            .heartbeat_count
            .is_some_and(|c| c != seen.heartbeat_count)
    {
        return Err(format!(
            "took over generation {} at beat #{} ({}), but the taker expected beat {:?} ({}): the owner beat after the taker's look and was replaced anyway (I6)",
            r.generation,
            seen.heartbeat_count,
            seen.heartbeat_at,
            exp.heartbeat_count,
            exp.heartbeat_at
        ));
    }
    Ok(())
}
