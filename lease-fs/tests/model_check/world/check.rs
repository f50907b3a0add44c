//! The invariants checked in every state, and OQ-5's at each takeover.

use super::{World, id, run_id, t};
use lease_core::ghost::driver;
use lease_core::ghost::{cutoffs_have_successors, status_valid};
use lease_core::ops::{ReadEvents, StatusView, Verify};
use lease_core::*;
use lease_fs::fs::Fs;

impl World {
    /// Every invariant that can be read off the state itself. `memo` caches the verdict of
    /// the expensive part by what it depends on.
    pub(crate) fn check(
        &mut self,
        after_power_loss: bool,
        memo: &mut std::collections::HashMap<u128, Result<(), String>>,
    ) -> Result<(), String> {
        // Un-acknowledged creations may be lost with the power; acknowledged ones are
        // checked below (granted generations keep their epoch).
        let head = self.head();
        self.ghost.observe_head(Some(head), after_power_loss)?;
        let key = self.check_key();
        if let Some(r) = memo.get(&key) {
            return r.clone();
        }
        let r = self.check_state();
        memo.insert(key, r.clone());
        r
    }

    pub(crate) fn check_state(&mut self) -> Result<(), String> {
        self.check_decisions()?;
        if self.ghost.is_corrupted() {
            return self.ghost.check_no_new_epoch(self.epoch_count());
        }
        if self.ghost.rolled_back {
            // The run is damaged from outside (issue #28): what must still hold is that no
            // decision (cutoff, checkpoint) contradicts what a writer was told, checked
            // above, and that no generation is granted twice (`Ghost::finish`).
            return Ok(());
        }
        // No heartbeat acknowledged as durable is lost (PROTOCOL §5.3).
        self.ghost.check_durable_beats(|g| {
            let f = FileRef::Beat(Generation::new(g)?);
            self.fs.read(&f.path(), 1 << 20).ok().flatten()
        })?;
        let floor = self
            .fs
            .list("lease/checkpoints")
            .unwrap_or_default()
            .iter()
            .filter_map(|n| Dir::Checkpoints.parse_name(n))
            .filter_map(|f| match f {
                FileRef::Checkpoint(g) => Some(g.get()),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        self.ghost.check_granted_epochs(floor, |g| {
            self.fs.exists(&FileRef::Epoch(g).path()).unwrap_or(false)
        })?;
        let cutoffs = self.fs.list("lease/cutoffs").unwrap_or_default();
        cutoffs_have_successors(
            cutoffs
                .iter()
                .filter_map(|n| match Dir::Cutoffs.parse_name(n) {
                    Some(FileRef::Cutoff(g)) => Some(g),
                    _ => None,
                }),
            self.head(),
            floor,
        )?;
        // The whole-run check, read-only, in every state (issue #17): cutoffs bound by the
        // epochs after them (none missing or changed), cutoffs that agree with their epochs,
        // no record above the head, the checkpoint's last event. A power loss or a crash at
        // any point must never make it report a broken chain.
        self.observe(&mut Verify::new(run_id()))
            .map_err(|e| format!("verify: {e}"))?;
        let view = self
            .observe(&mut ReadEvents::new(
                run_id(),
                Some((id("checker"), t(self.now))),
            ))
            .map_err(|e| format!("log unreadable: {e}"))?;
        self.ghost.check_log(&view)?;
        let status = self
            .observe(&mut StatusView::read(run_id(), t(self.now), false))
            .map_err(|e| format!("status: {e}"))?;
        status_valid(&status.status)
    }

    /// Every cutoff and checkpoint on disk against what each writer was told
    /// (`Ghost::check_decisions`: I4, I9, I5).
    fn check_decisions(&self) -> Result<(), String> {
        let read = |dir: Dir| -> Vec<Vec<u8>> {
            self.fs
                .list(dir.path())
                .unwrap_or_default()
                .iter()
                .filter(|n| dir.parse_name(n).is_some())
                .filter_map(|n| {
                    self.fs
                        .read(&format!("{}/{n}", dir.path()), 1 << 20)
                        .ok()
                        .flatten()
                })
                .collect()
        };
        driver::Decisions::read(read).check(&self.ghost)
    }
}

/// OQ-5's invariant: a takeover that replaced generation `g` after its last look at `g`'s
/// beat at `looked_at` (committing at `commit_at`) reports `preempted` whenever a heartbeat
/// of `g` that *started* after that look (a later world time) succeeded: that owner proved
/// alive after the look and runs on until it fences itself, `self_fence_after` after that
/// start. (A beat that started before the look and finished after it, a paused heartbeat,
/// gives its owner nothing past its start + `self_fence_after`, already before the look.)
pub(crate) fn check_no_unseen_beat(
    beats_ok: &[(u64, u64)],
    g: u64,
    looked_at: Option<u64>,
    commit_at: Option<u64>,
    reported: bool,
) -> Result<(), String> {
    let (Some(look), Some(commit)) = (looked_at, commit_at) else {
        return Err("takeover committed without a recorded look or commit".into());
    };
    match beats_ok.iter().find(|(bg, at)| *bg == g && *at > look) {
        Some((_, at)) if !reported => Err(format!(
            "takeover replaced generation {g} (its commit requested at t={commit}) without reporting it preempted a live owner, although its heartbeat that started at t={at}, after the taker's last look at t={look}, succeeded (OQ-5)"
        )),
        _ => Ok(()),
    }
}
