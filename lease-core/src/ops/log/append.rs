//! append (PROTOCOL §7.6): one event as the owner, with the fencing pre- and post-check.

use super::decode_event;
use crate::canonical::encode;
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, Identity, RunId, Sequence};
use crate::layout::{Dir, FileRef};
use crate::ops::common::{Cut, Finalize, Tail, decode_cutoff, epochs_of};
use crate::ops::{Operation, OwnedLease, Request, Response, Step, sub_step, violation};
use crate::records::{Event, RetirementRecord};
use crate::time::Timestamp;

/// Give up after this many sequence collisions in one append.
pub const MAX_APPEND_COLLISIONS: u32 = 10_000;

fn fenced(run: &RunId, generation: Generation, detail: impl Into<String>) -> LeaseError {
    LeaseError::Fenced {
        run: run.to_string(),
        generation,
        detail: detail.into(),
    }
}

/// Arguments of an append.
#[derive(Debug, Clone)]
pub struct AppendParams {
    /// Event type.
    pub event_type: Identity,
    /// Payload (any JSON).
    pub payload: serde_json::Value,
    /// Wall time.
    pub now: Timestamp,
    /// The last event this appender knows of (sequence and hash), to avoid searching.
    pub tail_hint: Option<(Sequence, Digest)>,
}

/// A successful append: the event is durable and authoritative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// Its sequence.
    pub sequence: Sequence,
    /// Its hash (the next append's `prev_hash`; pass it back as the tail hint).
    pub hash: Digest,
    /// Set when the owner was superseded while appending but the event fell within its
    /// cutoff: the event counts, and the owner must stop (every later write is fenced).
    pub superseded_by: Option<Generation>,
}

/// Append one event as the owner of `lease`.
///
/// Steps: pre-check (the cutoff of this generation must not exist; skip if it does: fenced),
/// find the tail (from the hint, else an `Exists` gallop), read the last event for its hash,
/// create the next sequence exclusively (on collision read the winner and try the next),
/// then the post-check: read this generation's cutoff; if absent, list epochs; if a higher
/// generation exists, finalize (or read) the cutoff. The answer always equals the event's
/// authority: acknowledged iff `sequence <= cutoff` or no cutoff exists and nothing
/// superseded this generation at the post-check.
#[derive(Debug, Clone)]
pub struct Append {
    lease: OwnedLease,
    p: AppendParams,
    st: AppendState,
    collisions: u32,
}

#[derive(Debug, Clone)]
enum AppendState {
    Start,
    PreCheck,
    HintProbe(Sequence, Digest),
    Tail(Tail),
    ReadPrev(Sequence),
    Create(Sequence, Digest),
    ReadWinner(Sequence),
    PostCutoff(Sequence, Digest),
    /// The cutoff the post-check read, while its folder is fsynced (SYNC).
    PostSync(Sequence, Digest, Box<RetirementRecord>),
    PostList(Sequence, Digest),
    Finalize(Sequence, Digest, Generation, Finalize),
    Done,
}

impl Append {
    /// Start an append.
    pub fn new(lease: &OwnedLease, p: AppendParams) -> Append {
        Append {
            lease: lease.clone(),
            p,
            st: AppendState::Start,
            collisions: 0,
        }
    }

    fn create(&mut self, s: Sequence, prev: Option<Digest>) -> Step<Appended> {
        let ev = Event {
            run_id: self.lease.run_id.clone(),
            sequence: s,
            generation: self.lease.generation,
            owner_id: self.lease.owner_id.clone(),
            event_type: self.p.event_type.clone(),
            payload: self.p.payload.clone(),
            timestamp: self.p.now,
            prev_hash: prev,
        };
        let bytes = match encode(&ev) {
            Ok(b) => b,
            Err(e) => return Step::Done(Err(e)),
        };
        self.st = AppendState::Create(s, Digest::of(&bytes));
        Step::Io(Request::CreateExclusive(FileRef::Event(s), bytes))
    }

    fn after_tail(&mut self, tail: u64) -> Step<Appended> {
        let run = &self.lease.run_id;
        match Sequence::new(tail) {
            None => self.create(Sequence::FIRST, None),
            Some(t) => {
                if let Err(e) = t.next(run) {
                    return Step::Done(Err(e));
                }
                self.st = AppendState::ReadPrev(t);
                Step::Io(Request::Read(FileRef::Event(t)))
            }
        }
    }
}

impl Operation for Append {
    type Output = Appended;
    fn next(&mut self, mut input: Option<Response>) -> Step<Appended> {
        let run = self.lease.run_id.clone();
        let g = self.lease.generation;
        loop {
            match std::mem::replace(&mut self.st, AppendState::Done) {
                AppendState::Start => {
                    self.st = AppendState::PreCheck;
                    return Step::Io(Request::Exists(FileRef::Cutoff(g)));
                }
                AppendState::PreCheck => match input.take() {
                    Some(Response::Exists(true)) => {
                        return Step::Done(Err(fenced(
                            &run,
                            g,
                            "this generation has been retired (its cutoff exists); nothing was appended",
                        )));
                    }
                    Some(Response::Exists(false)) => match self.p.tail_hint.clone() {
                        Some((s, h)) => {
                            let next = match s.next(&run) {
                                Ok(n) => n,
                                Err(e) => return Step::Done(Err(e)),
                            };
                            self.st = AppendState::HintProbe(s, h);
                            return Step::Io(Request::Exists(FileRef::Event(next)));
                        }
                        None => {
                            self.st = AppendState::Tail(Tail::new(0));
                        }
                    },
                    other => return Step::Done(Err(violation("Exists", &other))),
                },
                AppendState::HintProbe(s, h) => match input.take() {
                    Some(Response::Exists(false)) => {
                        let next = match s.next(&run) {
                            Ok(n) => n,
                            Err(e) => return Step::Done(Err(e)),
                        };
                        return self.create(next, Some(h));
                    }
                    Some(Response::Exists(true)) => {
                        self.st = AppendState::Tail(Tail::new(s.get() + 1));
                    }
                    other => return Step::Done(Err(violation("Exists", &other))),
                },
                AppendState::Tail(t) => {
                    let v = sub_step!(self.st, AppendState::Tail, [], t, input.take());
                    return self.after_tail(v);
                }
                AppendState::ReadPrev(t) | AppendState::ReadWinner(t) => {
                    let bytes = match input.take() {
                        Some(Response::Content(Some(b))) => b,
                        Some(Response::Content(None)) => {
                            return Step::Done(Err(LeaseError::EventLogGap {
                                run: run.to_string(),
                                missing: t.get(),
                            }));
                        }
                        other => return Step::Done(Err(violation("Content", &other))),
                    };
                    if let Err(e) = decode_event(&run, t, &bytes) {
                        return Step::Done(Err(e));
                    }
                    let next = match t.next(&run) {
                        Ok(n) => n,
                        Err(e) => return Step::Done(Err(e)),
                    };
                    return self.create(next, Some(Digest::of(&bytes)));
                }
                AppendState::Create(s, hash) => match input.take() {
                    Some(Response::Created) => {
                        self.st = AppendState::PostCutoff(s, hash);
                        return Step::Io(Request::Read(FileRef::Cutoff(g)));
                    }
                    Some(Response::AlreadyExists) => {
                        self.collisions += 1;
                        if self.collisions >= MAX_APPEND_COLLISIONS {
                            return Step::Done(Err(LeaseError::EventContention {
                                run: run.to_string(),
                                attempts: self.collisions,
                            }));
                        }
                        self.st = AppendState::ReadWinner(s);
                        return Step::Io(Request::Read(FileRef::Event(s)));
                    }
                    other => return Step::Done(Err(violation("Created/AlreadyExists", &other))),
                },
                AppendState::PostCutoff(s, hash) => match input.take() {
                    Some(Response::Content(Some(b))) => {
                        let cutoff = match decode_cutoff(&run, g, &b) {
                            Ok(c) => c,
                            Err(e) => return Step::Done(Err(e)),
                        };
                        // SYNC (PROTOCOL §7.0, §7.6 step 5): the cutoff may be linked but
                        // not yet durable (its finalizer has not fsynced `lease/cutoffs/`).
                        // Answering from it before it is durable let a power loss take it
                        // away while the event survived, and the event then counted after
                        // a FENCED answer (issue #14).
                        self.st = AppendState::PostSync(s, hash, Box::new(cutoff));
                        return Step::Io(Request::SyncDir(Dir::Cutoffs));
                    }
                    Some(Response::Content(None)) => {
                        self.st = AppendState::PostList(s, hash);
                        return Step::Io(Request::List(Dir::Epochs));
                    }
                    other => return Step::Done(Err(violation("Content", &other))),
                },
                AppendState::PostSync(s, hash, cutoff) => match input.take() {
                    Some(Response::Done) => {
                        let by = cutoff.superseded_by;
                        return Step::Done(judge_append(
                            &run,
                            g,
                            s,
                            hash,
                            &Cut::Record(*cutoff),
                            by,
                        ));
                    }
                    other => return Step::Done(Err(violation("Done", &other))),
                },
                AppendState::PostList(s, hash) => {
                    let listing = match input.take() {
                        Some(Response::Listing(l)) => l,
                        other => return Step::Done(Err(violation("Listing", &other))),
                    };
                    match epochs_of(listing).last().copied().filter(|&top| top > g) {
                        None => {
                            return Step::Done(Ok(Appended {
                                sequence: s,
                                hash,
                                superseded_by: None,
                            }));
                        }
                        Some(top) => {
                            let by = match g.next(&run) {
                                Ok(n) => n,
                                Err(e) => return Step::Done(Err(e)),
                            };
                            let f = Finalize::new(
                                run.clone(),
                                g,
                                self.lease.owner_id.clone(),
                                by,
                                self.lease.owner_id.clone(),
                                self.p.now,
                            )
                            .lazy();
                            self.st = AppendState::Finalize(s, hash, top, f);
                        }
                    }
                }
                AppendState::Finalize(s, hash, top, f) => {
                    let (s, hash, top, v) = sub_step!(
                        self.st,
                        AppendState::Finalize,
                        [s, hash, top],
                        f,
                        input.take()
                    );
                    return Step::Done(judge_append(&run, g, s, hash, &v, top));
                }
                AppendState::Done => {
                    return Step::Done(Err(violation("nothing (operation finished)", &input)));
                }
            }
        }
    }
}

fn judge_append(
    run: &RunId,
    g: Generation,
    s: Sequence,
    hash: Digest,
    cutoff: &Cut,
    by: Generation,
) -> Result<Appended, LeaseError> {
    if cutoff.counts(s.get()) {
        Ok(Appended {
            sequence: s,
            hash,
            superseded_by: Some(by),
        })
    } else {
        Err(fenced(
            run,
            g,
            format!("{}: event {s} does not count", cutoff.describe()),
        ))
    }
}
