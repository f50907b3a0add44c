//! Every successor of a state: steps, starts and faults, within the preemption bound.

use super::{Actor, POLICY_STALE_MS, World};
use lease_core::ghost::OpKind as Kind;

impl World {
    /// Whether running actor `i` now is a preemption (another actor is in the middle of an
    /// operation), and whether one is still allowed.
    pub(crate) fn schedule(&self, i: usize) -> Option<u8> {
        let busy_other = self
            .running
            .is_some_and(|r| r != i && self.actors[r].busy());
        match (busy_other, self.preemptions_left) {
            (false, p) => Some(p.unwrap_or(u8::MAX)),
            (true, None) => Some(u8::MAX),
            (true, Some(0)) => None,
            (true, Some(p)) => Some(p - 1),
        }
    }

    pub(crate) fn successors(&self) -> Vec<(World, String, bool)> {
        let mut out = Vec::new();
        let n = self.actors.len();
        for i in 0..n {
            let Some(left) = self.schedule(i) else {
                // Switching to this actor would exceed the preemption bound; it may still
                // crash.
                if self.actors[i].crashes_left > 0
                    && (self.actors[i].busy() || self.actors[i].lease.is_some())
                {
                    let mut w = self.clone_deep();
                    let line = w.crash_actor(i);
                    out.push((w, line, false));
                }
                continue;
            };
            let left = self.preemptions_left.map(|_| left);
            if self.actors[i].busy() {
                let mut w = self.clone_deep();
                w.running = Some(i);
                w.preemptions_left = left;
                match w.step(i) {
                    Ok(line) => out.push((w, line, false)),
                    Err(msg) => {
                        let mut w = self.clone_deep();
                        w.actors.clear();
                        out.push((w, format!("VIOLATION: {msg}"), false));
                    }
                }
            } else {
                let kinds: Vec<Kind> = self.actors[i]
                    .budget
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(k, _)| *k)
                    .collect();
                for k in kinds {
                    let mut w = self.clone_deep();
                    w.running = Some(i);
                    w.preemptions_left = left;
                    if let Some(line) = w.start(i, k) {
                        if line.starts_with("VIOLATION") {
                            let mut w = self.clone_deep();
                            w.actors.clear();
                            out.push((w, line, false));
                        } else {
                            out.push((w, line, false));
                        }
                    }
                }
            }
            if self.actors[i].crashes_left > 0
                && (self.actors[i].busy() || self.actors[i].lease.is_some())
            {
                let mut w = self.clone_deep();
                let line = w.crash_actor(i);
                out.push((w, line, false));
            }
        }
        // Issue #28: a copy of lease/ taken between operations, and lease/ restored from it
        // later (events/ and run.json kept). The rollback restarts the head's watermark,
        // as a power loss does.
        let quiet = !self.actors.iter().any(Actor::busy);
        if quiet && self.copies_left > 0 {
            let mut w = self.clone_deep();
            let line = w.copy_lease();
            out.push((w, line, false));
        }
        if quiet && self.rollbacks_left > 0 {
            let mut w = self.clone_deep();
            if let Some(line) = w.restore_lease() {
                out.push((w, line, true));
            }
        }
        if self.power_losses_left > 0 && self.actors.iter().any(|a| a.busy() || a.lease.is_some()) {
            for tear in [false, true] {
                let mut w = self.clone_deep();
                let line = w.power_loss(tear);
                out.push((w, line, true));
            }
        }
        if self.time_jumps_left > 0 {
            let mut w = self.clone_deep();
            w.time_jumps_left -= 1;
            w.now += POLICY_STALE_MS + 1;
            out.push((
                w,
                format!("clock jumps to t={}", self.now + POLICY_STALE_MS + 1),
                false,
            ));
        }
        if self.corrupt_left > 0 {
            let mut w = self.clone_deep();
            if let Some(line) = w.corrupt() {
                out.push((w, line, false));
            }
        }
        out
    }

    pub(crate) fn clone_deep(&self) -> World {
        let mut w = self.clone();
        w.fs = self.fs.fork();
        w
    }
}
