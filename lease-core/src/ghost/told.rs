//! What the checker tells the ghost: the requests, answers and links of each operation,
//! its end ([`Ghost::finish`], which checks what the operation was told), corruption,
//! rollback and power loss.

use super::{Ghost, OpGhost, OpKind, Told, Violation};
use crate::ops::{Request, Response};
use crate::{FileRef, LeaseError};

impl Ghost {
    /// The checker restored `lease/` from an older copy (issue #28): the run is damaged
    /// from outside from now on.
    pub fn rollback(&mut self) {
        self.rolled_back = true;
    }

    /// Whether a hand-corrupted record is still on disk.
    pub fn is_corrupted(&self) -> bool {
        !self.corrupted.is_empty()
    }

    /// The checker hand-corrupted `target` (between operations); `epochs`: the number of
    /// epochs on disk.
    pub fn corrupt(&mut self, target: FileRef, epochs: usize) {
        if let FileRef::Beat(g) = target {
            // Its beats are gone by hand, not by a power loss.
            self.durable_beats.remove(&g.get());
        }
        self.corrupted.insert(target);
        self.ever_corrupted = true;
        self.epochs_at_corruption = epochs;
        self.head_at_corruption = self.max_head;
    }

    /// Operation `op` is about to perform `req`.
    pub fn on_request(&mut self, op: &mut OpGhost, req: &Request) {
        if let (OpKind::Append, Request::CreateExclusive(FileRef::Event(s), _)) = (op.kind, req) {
            op.created_event = Some(s.get());
        }
        if let (OpKind::Release, Request::CreateExclusive(FileRef::Epoch(_), _)) = (op.kind, req) {
            // An owner may release despite a corrupted heartbeat record of its own (the
            // release does not read it); the released generation's heartbeat is never
            // read again.
            self.corrupted.retain(|f| !matches!(f, FileRef::Beat(_)));
        }
        if let Request::Remove(FileRef::Beat(g), _) = req {
            // A released or pruned heartbeat file: its beats are no longer facts on disk.
            self.durable_beats.remove(&g.get());
        }
        if let Request::WriteBeat { file, .. } = req {
            // The live owner's next heartbeat makes its own (hand-corrupted) heartbeat file
            // valid again: beat 1 replaces it whole, a later beat writes a valid slot, and
            // the hand corruption (bytes that are not a valid slot, or a short record in
            // the older form, which a slot written past it turns into a torn first slot)
            // is ignored by readers from then on (`beat::read_slots`).
            self.corrupted.remove(file);
        }
    }

    /// Operation `op`'s request (an event creation iff `event_create`) was answered `resp`.
    pub fn on_response(&mut self, op: &mut OpGhost, event_create: bool, resp: &Response) {
        if let (OpKind::Append, Response::AlreadyExists, true) = (op.kind, resp, event_create) {
            op.created_event = None;
        }
    }

    /// Operation `op`, of an actor holding generation `mine` (0: none), was answered
    /// `resp`: an event it linked while a higher generation had already been granted is
    /// fenced and must never count.
    ///
    /// Every link is also recorded, in order, in [`Ghost::linked`]: the facts
    /// [`Ghost::check_within_cutoffs`] judges a reader by.
    pub fn on_linked(&mut self, op: &OpGhost, resp: &Response, mine: u64) {
        if let (OpKind::Append, Response::Created, Some(s)) = (op.kind, resp, op.created_event) {
            self.links += 1;
            self.linked.insert(s, (mine, self.links));
            if mine < self.max_granted {
                self.late.insert(s);
                self.writer.insert(s, mine);
            }
        }
    }

    /// Heartbeat `count` of generation `g` was acknowledged and was written durably
    /// (`Durability::Fsync`): from now on the heartbeat file holds it or a newer beat,
    /// whatever a power loss or a torn write does (PROTOCOL §5.3 `durable`).
    pub fn on_durable_beat(&mut self, g: u64, count: u64) {
        let c = self.durable_beats.entry(g).or_default();
        *c = (*c).max(count);
    }

    /// The cutoff of generation `g` became visible on disk (its link): no event of `g`
    /// linked after this may ever count (I4).
    pub fn on_cutoff_linked(&mut self, g: u64) {
        self.links += 1;
        self.cutoff_linked.insert(g, self.links);
    }

    /// A power loss: forget the links it undid (`cutoff_survived(g)`: generation `g`'s
    /// cutoff is still on disk; `event_survived(s)`: event `s` is), and the late events
    /// among them. A cutoff linked but
    /// never made durable may be decided again, through later events, and that is sound.
    pub fn power_loss(
        &mut self,
        cutoff_survived: impl Fn(u64) -> bool,
        event_survived: impl Fn(u64) -> bool,
    ) {
        self.cutoff_linked.retain(|&g, _| cutoff_survived(g));
        self.linked.retain(|&s, _| event_survived(s));
        // A late event whose link was undone is gone: its sequence may be written again,
        // by a writer that is not late. (Acknowledged and refused events were created
        // durably before their answer; they survive.)
        let lost: Vec<u64> = self
            .late
            .iter()
            .copied()
            .filter(|&s| !event_survived(s))
            .collect();
        for s in lost {
            self.late.remove(&s);
            if !self.acked.contains(&s) && !self.refused.contains(&s) {
                self.writer.remove(&s);
            }
        }
    }

    /// Operation `op` of the actor labelled `actor`, holding generation `mine` (0: none),
    /// ended with `told`: check what it was told and record it.
    pub fn finish(
        &mut self,
        op: &OpGhost,
        actor: &str,
        mine: u64,
        told: Result<Told, &LeaseError>,
    ) -> Result<(), Violation> {
        if let Err(e) = told
            && e.code() == "PROTOCOL_VIOLATION"
        {
            return Err(format!("{e}"));
        }
        match (op.kind, told) {
            (OpKind::Claim | OpKind::Takeover, Ok(Told::Granted(g))) => {
                let g = g.get();
                if self.is_corrupted() {
                    return Err("an ownership change succeeded over an invalid record".into());
                }
                // Every grant is above every grant completed before this operation started
                // (grants that overlap in time may complete in either order: the later one
                // learns it is fenced at its next heartbeat).
                if g <= op.granted_max_at_start {
                    return Err(format!(
                        "granted generation {g} although {} was granted before the operation started",
                        op.granted_max_at_start
                    ));
                }
                if let Some(other) = self.granted.get(&g)
                    && other != actor
                {
                    return Err(format!("generation {g} granted to {other} and to {actor}"));
                }
                if let Some(last) = self
                    .granted
                    .iter()
                    .filter(|(_, who)| *who == actor)
                    .map(|(g, _)| *g)
                    .next_back()
                    && g <= last
                {
                    return Err(format!("{actor} was granted {g} after {last}"));
                }
                self.granted.insert(g, actor.to_string());
                self.max_granted = self.max_granted.max(g);
            }
            (OpKind::Retire, Ok(_)) if self.is_corrupted() => {
                return Err("a retirement succeeded over an invalid record".into());
            }
            (OpKind::Heartbeat | OpKind::Release, Ok(_)) => {
                if let Some(h) = op.head_at_start
                    && h > mine
                {
                    return Err(format!(
                        "a superseded owner's {} succeeded (generation {mine}, head {h} when it started)",
                        if op.kind == OpKind::Heartbeat {
                            "heartbeat"
                        } else {
                            "release"
                        }
                    ));
                }
            }
            (OpKind::Append, Ok(Told::Appended(s))) => {
                if op.created_event != Some(s) {
                    return Err(format!(
                        "acknowledged event {s} but created {:?}",
                        op.created_event
                    ));
                }
                self.acked.insert(s);
                self.writer.insert(s, mine);
            }
            (OpKind::Append, Err(e)) if e.code() == "FENCED" => {
                if let Some(s) = op.created_event {
                    self.refused.insert(s);
                    self.writer.insert(s, mine);
                }
            }
            _ => {}
        }
        Ok(())
    }
}
