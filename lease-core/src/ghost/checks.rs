//! The checks of the §8 invariants against what the ghost was told: what the checker read
//! back (the head, the epochs, the heartbeats, the log, a reader's answer, a new epoch).

use super::answers::standing_of;
use super::{Ghost, OpGhost, OpKind, Violation, counted, generation_monotone, within_cutoffs};
use crate::ops::EventLogView;
use crate::{EpochRecord, FileRef, Generation, Holder};
use std::collections::BTreeSet;

impl Ghost {
    /// Every heartbeat acknowledged as durable is still on disk ([`Ghost::on_durable_beat`]):
    /// `read(g)` is generation `g`'s heartbeat file now, and its newest valid slot must
    /// hold that beat or a newer one. A hand-corrupted heartbeat file is not judged.
    pub fn check_durable_beats(
        &self,
        read: impl Fn(u64) -> Option<Vec<u8>>,
    ) -> Result<(), Violation> {
        for (&g, &n) in &self.durable_beats {
            let beat = Generation::new(g).map(FileRef::Beat);
            if beat.is_some_and(|f| self.corrupted.contains(&f)) {
                continue;
            }
            let bytes = read(g);
            let count = bytes
                .as_deref()
                .and_then(crate::beat::newest_record)
                .and_then(|r| crate::decode::<crate::HeartbeatRecord>(r).ok())
                .map(|r| r.count);
            if count.is_none_or(|c| c < n) {
                return Err(format!(
                    "heartbeat {n} of generation {g} was acknowledged as durable, but the heartbeat file now holds {} (PROTOCOL §5.3)",
                    match (count, bytes) {
                        (Some(c), _) => format!("beat {c}"),
                        (None, Some(_)) => "no valid beat".into(),
                        (None, None) => "nothing (it is gone)".into(),
                    }
                ));
            }
        }
        Ok(())
    }

    /// No event counts that its writer linked after its generation's cutoff was linked
    /// (I4), judged from the ghost's own record of the order of links
    /// ([`Ghost::on_linked`], [`Ghost::on_cutoff_linked`]), never from the cutoff values a
    /// reader used: a cutoff decided too high (one past the log's end) lets a zombie's
    /// later event count by the reader's rule, and this still sees it. Checks nothing for a
    /// checker that does not report links.
    pub fn check_within_cutoffs(&self, view: &EventLogView) -> Result<(), Violation> {
        for e in view.events.iter().filter(|e| e.standing.counts()) {
            let (s, g) = (e.event.sequence.get(), e.event.generation.get());
            if !view.chain.cutoffs.contains_key(&e.event.generation) {
                continue;
            }
            if let (Some(&(w, at)), Some(&cut)) = (self.linked.get(&s), self.cutoff_linked.get(&g))
                && w == g
                && at > cut
            {
                return Err(format!(
                    "event {s} of generation {g} counts, but it was linked after generation {g}'s cutoff was (I4)"
                ));
            }
        }
        Ok(())
    }

    /// The head generation is now `head` (`None`: not observed, or no epoch): it never
    /// goes down (I2), except that a power loss may drop epochs whose creation was never
    /// acknowledged (`after_power_loss` restarts the watermark).
    pub fn observe_head(
        &mut self,
        head: Option<u64>,
        after_power_loss: bool,
    ) -> Result<(), Violation> {
        let Some(h) = head else { return Ok(()) };
        if after_power_loss {
            self.max_head = h;
        } else if h < self.max_head {
            return Err(format!("head went down from {} to {h}", self.max_head));
        }
        self.max_head = self.max_head.max(h);
        Ok(())
    }

    /// While a record is invalid, no epoch appears (I7): `epochs` is the number on disk,
    /// never more than when the record was corrupted, and the head (as last observed,
    /// [`Ghost::observe_head`]) never above the head then. Fewer is fine: a prune may
    /// remove epochs below its floor while a heartbeat record it does not read is invalid.
    pub fn check_no_new_epoch(&self, epochs: usize) -> Result<(), Violation> {
        if self.is_corrupted()
            && (epochs > self.epochs_at_corruption || self.max_head > self.head_at_corruption)
        {
            return Err("a new epoch appeared after an invalid record".into());
        }
        Ok(())
    }

    /// Granted generations survive any crash (their creation was durable before the lease
    /// was returned), unless compacted below the checkpoint floor `floor`.
    pub fn check_granted_epochs(
        &self,
        floor: u64,
        epoch_exists: impl Fn(Generation) -> bool,
    ) -> Result<(), Violation> {
        for &g in self.granted.keys() {
            if g >= floor && !Generation::new(g).is_some_and(&epoch_exists) {
                return Err(format!("granted generation {g} lost its epoch"));
            }
        }
        Ok(())
    }

    /// Every acknowledged append counts (I5).
    pub fn check_acknowledged(&self, counted: &BTreeSet<u64>) -> Result<(), Violation> {
        match self.acked.iter().find(|s| !counted.contains(s)) {
            Some(s) => Err(format!("acknowledged event {s} does not count")),
            None => Ok(()),
        }
    }

    /// No event whose append answered `FENCED` counts (I9).
    pub fn check_refused(&self, counted: &BTreeSet<u64>) -> Result<(), Violation> {
        match self.refused.iter().find(|s| counted.contains(s)) {
            Some(s) => Err(format!("event {s} whose append answered FENCED counts")),
            None => Ok(()),
        }
    }

    /// No event linked after its writer's generation was superseded by a granted one
    /// counts.
    pub fn check_late(&self, counted: &BTreeSet<u64>) -> Result<(), Violation> {
        match self.late.iter().find(|s| counted.contains(s)) {
            Some(s) => Err(format!(
                "event {s} counts although its writer's generation had been superseded by a granted one when it was written"
            )),
            None => Ok(()),
        }
    }

    /// I4 and I9 against what each writer was told, not against the cutoffs a reader
    /// used: every cutoff on disk, `(g, events_through)` in `cutoffs`, leaves out each
    /// event of generation `g` whose append answered `FENCED` or that was linked late,
    /// and counts each acknowledged one; every checkpoint on disk, `(floor, through,
    /// not_authoritative)` in `checkpoints`, lists as not authoritative exactly those of
    /// them written by a generation below its floor, up to `through`. A cutoff or
    /// checkpoint is immutable once created, so a wrong one makes the event's standing
    /// wrong for good: a retirement or takeover that issued a generation a second time over
    /// a rolled-back `lease/` and decided the cutoff again, through an event that had been
    /// refused (issue #28), is reported here as the cutoff is created, whatever a reader
    /// then makes of the damaged chain.
    pub fn check_decisions<'a>(
        &self,
        cutoffs: impl IntoIterator<Item = (u64, u64)>,
        checkpoints: impl IntoIterator<Item = (u64, u64, &'a [u64])>,
    ) -> Result<(), Violation> {
        let told_no = |s: &u64| self.refused.contains(s) || self.late.contains(s);
        let why_not = |s: u64| {
            if self.refused.contains(&s) {
                "was refused: its append answered FENCED"
            } else {
                "was linked after a newer generation had been granted: it must never count"
            }
        };
        for (g, through) in cutoffs {
            for (&s, _) in self.writer.iter().filter(|(_, w)| **w == g) {
                if told_no(&s) && s <= through {
                    return Err(format!(
                        "cutoff {g} counts events through {through}, but event {s} of generation {g} {} (I4, I9)",
                        why_not(s)
                    ));
                }
                if self.acked.contains(&s) && s > through {
                    return Err(format!(
                        "cutoff {g} counts events through {through}, but event {s} of generation {g} was acknowledged (I5, I9)"
                    ));
                }
            }
        }
        for (floor, through, not_authoritative) in checkpoints {
            for (&s, _) in self
                .writer
                .iter()
                .filter(|(s, w)| **w < floor && **s <= through)
            {
                let listed = not_authoritative.contains(&s);
                if told_no(&s) && !listed {
                    return Err(format!(
                        "checkpoint {floor} counts event {s}, which {} (I4, I9)",
                        why_not(s)
                    ));
                }
                if self.acked.contains(&s) && listed {
                    return Err(format!(
                        "checkpoint {floor} does not count event {s}, which was acknowledged (I5)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every check of an authoritative read of the log: [`Ghost::check_acknowledged`],
    /// [`Ghost::check_refused`], [`Ghost::check_late`], [`generation_monotone`] and
    /// [`within_cutoffs`], in that order.
    pub fn check_log(&self, view: &EventLogView) -> Result<(), Violation> {
        let counted = counted(view);
        self.check_acknowledged(&counted)?;
        self.check_refused(&counted)?;
        self.check_late(&counted)?;
        generation_monotone(view)?;
        self.check_within_cutoffs(view)?;
        within_cutoffs(view)
    }

    /// Every check of [`Ghost::check_log`] that applies to a reader that read the log
    /// `1..=last` (`view.last`) at some moment, checked when its answer comes: the
    /// acknowledged appends it read count (I5), and no event whose append answered
    /// `FENCED` (I9) or that was linked late counts, the counted events are
    /// generation-monotone (I13) and within their cutoffs (I4). Appends acknowledged with
    /// a sequence past `last` are not the reader's: they were linked after it counted the
    /// log (log first, R3).
    pub fn check_read(&self, view: &EventLogView) -> Result<(), Violation> {
        let last = view.last.as_ref().map_or(0, |(s, _)| s.get());
        let counted = counted(view);
        if let Some(s) = self.acked.range(..=last).find(|s| !counted.contains(s)) {
            return Err(format!(
                "a reader judged acknowledged event {s} as not counting: {:?}",
                standing_of(view, *s)
            ));
        }
        self.check_refused(&counted)?;
        self.check_late(&counted)?;
        generation_monotone(view)?;
        self.check_within_cutoffs(view)?;
        within_cutoffs(view)
    }

    /// Check an epoch `g` that operation `op` just created (as its creation is answered):
    /// `prev` is the valid epoch below it (if any), `alive` says whether a holder is alive,
    /// `mine` is the generation the actor holds. A takeover commits only over exactly the
    /// owner it observed (I6), a retirement only over a dead holder, a release supersedes
    /// only its own generation (I8).
    pub fn check_epoch_created(
        &self,
        op: &OpGhost,
        g: Generation,
        prev: Option<(Generation, &EpochRecord)>,
        alive: impl Fn(&Holder) -> bool,
        mine: Option<Generation>,
    ) -> Result<(), Violation> {
        match op.kind {
            OpKind::Takeover => {
                let Some((p, e)) = prev else {
                    return Err(format!(
                        "takeover created epoch {g} with no valid epoch below"
                    ));
                };
                let Some(expect) = &op.observed else {
                    return Err(format!("takeover created epoch {g} without an observation"));
                };
                if expect.generation.is_some_and(|x| x != p) || e.owner_id != expect.owner_id {
                    return Err(format!(
                        "takeover created epoch {g} over generation {p} owner {}, but observed generation {:?} owner {}",
                        e.owner_id, expect.generation, expect.owner_id
                    ));
                }
            }
            OpKind::Retire => {
                let Some((p, e)) = prev else {
                    return Err(format!(
                        "retirement created epoch {g} with no valid epoch below"
                    ));
                };
                if alive(&e.holder) {
                    return Err(format!(
                        "retirement created epoch {g} over generation {p} whose holder pid {} is alive",
                        e.holder.pid
                    ));
                }
            }
            OpKind::Release if g.prev() != mine => {
                return Err(format!("release (generation {mine:?}) created epoch {g}"));
            }
            _ => {}
        }
        Ok(())
    }
}
