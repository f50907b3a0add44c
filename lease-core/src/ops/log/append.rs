//! append (PROTOCOL §7.6): one event as the owner, with the fencing pre- and post-check.

use super::{decode_event, gap};
use crate::canonical::encode;
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, Identity, RunId, Sequence};
use crate::layout::{Dir, FileRef};
use crate::ops::common::{Cut, Finalize, Tail, decode_cutoff, epochs_of};
use crate::ops::{Operation, OwnedLease, Request, Response, Step, step_try, sub_step, violation};
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
/// find the tail (from the hint, else an `Exists` gallop, whose answer `T` must have its
/// predecessor `T-1`, else `EVENT_LOG_GAP`), read the last event for its hash, the guard (`event s+1` must be absent, else `event s` present: a lost race, or absent:
/// `EVENT_LOG_GAP`, nothing written), create the next sequence exclusively (on collision
/// read the winner and try the next),
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
    /// TAIL found `T`: is `T - 1` there? (no: `T` is a stray past a gap)
    TailPrev(Sequence),
    ReadPrev(Sequence),
    /// About to create event `s` (bytes ready): is `s + 1` already there? (GUARD)
    GuardNext(Sequence, Digest, Vec<u8>),
    /// `s + 1` was there: is `s`? (yes: another appender got ahead; no: a gap)
    GuardThis(Sequence),
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

    /// Event `s` chaining after `prev`, encoded; then the GUARD before creating it.
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
        let bytes = step_try!(encode(&ev));
        let hash = Digest::of(&bytes);
        // GUARD (PROTOCOL §7.6 step 4): never create `s` below an event that is already
        // there. `event s+1` present while `event s` is absent cannot be a legitimate
        // appender's work: an appender creates `s+1` only after it saw `s` exist (it read
        // `s` for its `prev_hash`, or created `s` itself, or holds `s` as its acknowledged
        // hint), and an event is never removed, so from then on `s` exists. A power loss
        // cannot undo that order either: `s+1` becomes durable only by an fsync of
        // `events/` made after `s` was linked, and that fsync makes `s` durable too (A2).
        // So the probe of `s+1` is made first and, if it is there, `s` second: `s` absent
        // then means a stray or a hand-made gap, and filling `s` below it would leave a log
        // whose `s+1` does not link to `s` (what `verify` rejects). Past `u64::MAX` there is
        // no `s+1` to probe.
        match s.next(&self.lease.run_id) {
            Ok(after) => {
                self.st = AppendState::GuardNext(s, hash, bytes);
                Step::Io(Request::Exists(FileRef::Event(after)))
            }
            Err(_) => {
                self.st = AppendState::Create(s, hash);
                Step::Io(Request::CreateExclusive(FileRef::Event(s), bytes))
            }
        }
    }

    /// Count one lost race for a sequence; the 10 000th is `EVENT_CONTENTION`.
    fn collided(&mut self, run: &RunId) -> Result<(), LeaseError> {
        self.collisions += 1;
        if self.collisions >= MAX_APPEND_COLLISIONS {
            return Err(LeaseError::EventContention {
                run: run.to_string(),
                attempts: self.collisions,
            });
        }
        Ok(())
    }

    fn after_tail(&mut self, tail: u64) -> Step<Appended> {
        let run = &self.lease.run_id;
        match Sequence::new(tail) {
            None => self.create(Sequence::FIRST, None),
            Some(t) => {
                if let Err(e) = t.next(run) {
                    return Step::Done(Err(e));
                }
                // TAIL's gallop probes `lo+1, lo+2, lo+4, ...`, so it can land on a stray
                // past a gap (events 1..5 and a stray 7: it finds 7). The same argument as
                // the guard's (see `create`): a legitimate `T` exists only after `T-1`
                // did, so `T-1` absent is a gap, `EVENT_LOG_GAP`, nothing written.
                match Sequence::new(tail - 1) {
                    Some(before) => {
                        self.st = AppendState::TailPrev(t);
                        Step::Io(Request::Exists(FileRef::Event(before)))
                    }
                    None => self.read_prev(t),
                }
            }
        }
    }

    fn read_prev(&mut self, t: Sequence) -> Step<Appended> {
        self.st = AppendState::ReadPrev(t);
        Step::Io(Request::Read(FileRef::Event(t)))
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
                    // Planted mutant `append_unfenced` (issue #31: the partition harness
                    // catches it end to end): a retired generation's append goes on.
                    Some(Response::Exists(true)) if !crate::mutant::mutant("append_unfenced") => {
                        return Step::Done(Err(fenced(
                            &run,
                            g,
                            "this generation has been retired (its cutoff exists); nothing was appended",
                        )));
                    }
                    Some(Response::Exists(_)) => match self.p.tail_hint.clone() {
                        Some((s, h)) => {
                            let next = step_try!(s.next(&run));
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
                        let next = step_try!(s.next(&run));
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
                AppendState::TailPrev(t) => match input.take() {
                    Some(Response::Exists(true)) => return self.read_prev(t),
                    Some(Response::Exists(false)) => {
                        return Step::Done(Err(gap(&run, t.get() - 1, t.get())));
                    }
                    other => return Step::Done(Err(violation("Exists", &other))),
                },
                AppendState::ReadPrev(t) | AppendState::ReadWinner(t) => {
                    let bytes = match input.take() {
                        Some(Response::Content(Some(b))) => b,
                        Some(Response::Content(None)) => {
                            return Step::Done(Err(gap(
                                &run,
                                t.get(),
                                // `t` was seen to exist (the tail, or a winner's create)
                                // and is gone now: removed under the appender.
                                0,
                            )));
                        }
                        other => return Step::Done(Err(violation("Content", &other))),
                    };
                    if let Err(e) = decode_event(&run, t, &bytes) {
                        return Step::Done(Err(e));
                    }
                    let next = step_try!(t.next(&run));
                    return self.create(next, Some(Digest::of(&bytes)));
                }
                AppendState::GuardNext(s, hash, bytes) => match input.take() {
                    Some(Response::Exists(false)) => {
                        self.st = AppendState::Create(s, hash);
                        return Step::Io(Request::CreateExclusive(FileRef::Event(s), bytes));
                    }
                    Some(Response::Exists(true)) => {
                        self.st = AppendState::GuardThis(s);
                        return Step::Io(Request::Exists(FileRef::Event(s)));
                    }
                    other => return Step::Done(Err(violation("Exists", &other))),
                },
                AppendState::GuardThis(s) => match input.take() {
                    // Another appender created `s` and `s+1` since this one found its
                    // tail: a lost race, like `AlreadyExists`; find the new tail from `s`.
                    Some(Response::Exists(true)) => {
                        if let Err(e) = self.collided(&run) {
                            return Step::Done(Err(e));
                        }
                        self.st = AppendState::Tail(Tail::new(s.get()));
                    }
                    // `s+1` without `s`: a stray or a gap (see `create`); nothing written.
                    Some(Response::Exists(false)) => {
                        return Step::Done(Err(gap(&run, s.get(), s.get() + 1)));
                    }
                    other => return Step::Done(Err(violation("Exists", &other))),
                },
                AppendState::Create(s, hash) => match input.take() {
                    Some(Response::Created) => {
                        self.st = AppendState::PostCutoff(s, hash);
                        return Step::Io(Request::Read(FileRef::Cutoff(g)));
                    }
                    Some(Response::AlreadyExists) => {
                        if let Err(e) = self.collided(&run) {
                            return Step::Done(Err(e));
                        }
                        self.st = AppendState::ReadWinner(s);
                        return Step::Io(Request::Read(FileRef::Event(s)));
                    }
                    other => return Step::Done(Err(violation("Created/AlreadyExists", &other))),
                },
                AppendState::PostCutoff(s, hash) => match input.take() {
                    Some(Response::Content(Some(b))) => {
                        let cutoff = step_try!(decode_cutoff(&run, g, &b));
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
                            let by = step_try!(g.next(&run));
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
    // Planted mutant `append_unfenced` (I9): an event that does not count is acknowledged.
    if cutoff.counts(s.get()) || crate::mutant::mutant("append_unfenced") {
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
