//! Faults: process crashes, power loss, hand-corruption, and rollbacks of `lease/`.

use super::{Actor, World, hash128};
use lease_core::*;
use lease_fs::fs::Fs;
use std::sync::Arc;

impl World {
    /// Copy `lease/` (between operations): the copy a later rollback restores.
    pub(crate) fn copy_lease(&mut self) -> String {
        self.copies_left -= 1;
        let files = self.lease_files();
        let h = hash128(&format!("{files:?}"));
        let line = format!("copy lease/ ({} files, head {})", files.len(), self.head());
        self.lease_copy = Some((Arc::new(files), h));
        line
    }

    /// Restore `lease/` from the copy (between operations), durably, keeping `events/` and
    /// `run.json` (issue #28): every file below `lease/` removed, each folder fsynced, the
    /// copy's files written back (durable).
    pub(crate) fn restore_lease(&mut self) -> Option<String> {
        let (copy, _) = self.lease_copy.clone()?;
        if *copy == self.lease_files() {
            return None;
        }
        self.rollbacks_left -= 1;
        let before = self.head();
        for d in Dir::ALL.iter().filter(|d| d.path().starts_with("lease/")) {
            for name in self.fs.list(d.path()).unwrap_or_default() {
                self.fs.unlink(&format!("{}/{name}", d.path())).unwrap();
            }
            self.fs.fsync_dir(d.path()).unwrap();
        }
        for (p, b) in copy.iter() {
            self.fs.put(p, b).unwrap();
        }
        self.ghost.rollback();
        Some(format!(
            "ROLLBACK: lease/ restored from the copy (head {before} -> {}), events/ and run.json kept",
            self.head()
        ))
    }

    pub(crate) fn crash_actor(&mut self, i: usize) -> String {
        let a = &mut self.actors[i];
        let line = format!("{}{} crashes (process)", a.name, a.incarnation);
        a.crashes_left -= 1;
        a.core.crash();
        a.exec = None;
        a.pending = None;
        a.looked_at = None;
        a.commit_at = None;
        a.beat_started_at = None;
        a.run_json = None;
        line
    }

    pub(crate) fn power_loss(&mut self, tear: bool) -> String {
        self.power_losses_left -= 1;
        self.fs.recover(tear);
        // Links the power loss undid are no longer facts about the disk.
        let fs = &self.fs;
        self.ghost.power_loss(
            |g| {
                Generation::new(g)
                    .is_some_and(|g| fs.exists(&FileRef::Cutoff(g).path()).unwrap_or(false))
            },
            |s| {
                Sequence::new(s)
                    .is_some_and(|s| fs.exists(&FileRef::Event(s).path()).unwrap_or(false))
            },
        );
        self.boot += 1;
        for a in &mut self.actors {
            a.core.crash();
            a.exec = None;
            a.pending = None;
            a.run_json = None;
        }
        format!(
            "POWER LOSS (tear {tear}); every process is gone, boot {}",
            self.boot
        )
    }

    pub(crate) fn corrupt(&mut self) -> Option<String> {
        if self.actors.iter().any(Actor::busy) {
            return None;
        }
        let h = Generation::new(self.head())?;
        self.corrupt_left -= 1;
        let path = FileRef::Epoch(h).path();
        self.fs
            .put(&path, b"{\"version\":\"runlease/epoch/1\"}\n")
            .unwrap();
        let epochs = self.epoch_count();
        self.ghost.corrupt(FileRef::Epoch(h), epochs);
        Some(format!("hand-corrupt {path}"))
    }
}
