//! An actor: a process running one operation at a time, and the incarnations after its
//! crashes.

use super::{AnyOp, Out, boot_id, ident};
use crate::ghost::{Ghost, OpGhost};
use crate::ops::{Expectation, OwnedLease, Request, Response, Step};
use crate::{Holder, Identity, LeaseError, TimingPolicy};

/// Where and when an operation starts: the world's time, boot and timing policy.
#[derive(Clone, Copy, Debug)]
pub struct Site {
    /// The world's time (ms since its start).
    pub now: u64,
    /// The boot the actors run on.
    pub boot: u32,
    /// The policy claims, takeovers and retirements write into their epoch.
    pub policy: TimingPolicy,
}

/// One actor: a process that runs one operation at a time, and the incarnations that
/// replace it after a crash.
#[derive(Clone, Debug)]
pub struct Actor {
    /// Its name (`a`, `b`, ...).
    pub name: char,
    /// Bumped at each crash (a new process, a new pid).
    pub incarnation: u32,
    /// The lease it holds.
    pub lease: Option<OwnedLease>,
    /// Its successful heartbeats in this generation (the next one is `beats + 1`).
    pub beats: u64,
    /// The operation in flight, with its ghost.
    pub op: Option<(AnyOp, OpGhost)>,
    /// The answer to the operation's last request, not yet fed to it.
    pub input: Option<Response>,
}

/// What an actor's operation does next ([`Actor::advance`]).
#[expect(
    clippy::large_enum_variant,
    reason = "a step's result, moved out at once; boxing would only add an allocation per step"
)]
pub enum Next {
    /// Perform this request (the operation stays in the actor).
    Io(Request),
    /// The operation ended (taken out of the actor): give it to [`super::end`].
    Done(AnyOp, OpGhost, Result<Out, LeaseError>),
}

impl Actor {
    /// A new actor, incarnation 0, holding nothing.
    pub fn new(name: char) -> Actor {
        Actor {
            name,
            incarnation: 0,
            lease: None,
            beats: 0,
            op: None,
            input: None,
        }
    }

    /// Its label: name and incarnation (`a0`), also its owner id and the ghost's label of
    /// what it was granted.
    pub fn who(&self) -> String {
        format!("{}{}", self.name, self.incarnation)
    }

    /// Its owner id.
    pub fn owner(&self) -> Identity {
        ident(&self.who())
    }

    /// Its process id (each incarnation its own).
    pub fn pid(&self) -> u32 {
        1000 + u32::from(self.name as u8) * 100 + self.incarnation
    }

    /// Its process's start time: with the pid, what identifies the incarnation (a pid
    /// two incarnations share is a reused pid).
    pub fn start_time(&self) -> u64 {
        u64::from(self.incarnation) + 1
    }

    /// Its holder record on boot `boot`.
    pub fn holder(&self, boot: u32) -> Holder {
        Holder {
            host: ident("host"),
            boot_id: boot_id(boot),
            pid: self.pid(),
            start_time: self.start_time(),
        }
    }

    /// The generation it holds (0: none).
    pub fn mine(&self) -> u64 {
        self.lease.as_ref().map_or(0, |l| l.generation.get())
    }

    /// Start `op` (its ghost begun now, with the head `head` noted).
    pub fn begin(&mut self, ghost: &Ghost, op: AnyOp, observed: Option<Expectation>, head: u64) {
        let mut g = ghost.begin(op.kind(), observed);
        g.note_head(Some(head));
        self.op = Some((op, g));
        self.input = None;
    }

    /// Feed the operation its pending answer and compute its next step (`None`: idle).
    pub fn advance(&mut self) -> Option<Next> {
        let (mut op, g) = self.op.take()?;
        match op.next(self.input.take()) {
            Step::Io(req) => {
                self.op = Some((op, g));
                Some(Next::Io(req))
            }
            Step::Done(r) => Some(Next::Done(op, g, r)),
        }
    }

    /// The process died: the next incarnation starts with nothing.
    pub fn crash(&mut self) {
        self.incarnation += 1;
        self.op = None;
        self.input = None;
        self.lease = None;
        self.beats = 0;
    }
}
