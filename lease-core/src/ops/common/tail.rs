//! TAIL (PROTOCOL §7.0): the last sequence of the event log, without a listing.

use crate::ids::Sequence;
use crate::layout::FileRef;
use crate::ops::{Operation, Request, Response, Step, violation};

/// Sub-operation: find the last sequence of the gap-free event log with `Exists` probes:
/// gallop up from a known-present hint, then binary search. O(log n) requests.
#[derive(Debug, Clone)]
pub(crate) struct Tail {
    /// Highest sequence known to exist (0 = none).
    lo: u64,
    /// Lowest sequence known to be absent, once found.
    hi: Option<u64>,
    step: u64,
    probing: u64,
}

impl Tail {
    /// `hint`: a sequence the caller knows exists (0 for none).
    pub(crate) fn new(hint: u64) -> Tail {
        Tail {
            lo: hint,
            hi: None,
            step: 1,
            probing: 0,
        }
    }

    fn probe(&mut self) -> Step<u64> {
        let candidate = match self.hi {
            None => self.lo.saturating_add(self.step),
            Some(hi) => {
                if hi - self.lo <= 1 {
                    return Step::Done(Ok(self.lo));
                }
                self.lo + (hi - self.lo) / 2
            }
        };
        match Sequence::new(candidate) {
            Some(s) if candidate > self.lo => {
                self.probing = candidate;
                Step::Io(Request::Exists(FileRef::Event(s)))
            }
            _ => Step::Done(Ok(self.lo)),
        }
    }
}

impl Operation for Tail {
    type Output = u64;
    fn next(&mut self, input: Option<Response>) -> Step<u64> {
        match input {
            None => self.probe(),
            Some(Response::Exists(true)) => {
                self.lo = self.probing;
                if self.hi.is_none() {
                    self.step = self.step.saturating_mul(2);
                }
                self.probe()
            }
            Some(Response::Exists(false)) => {
                self.hi = Some(self.probing);
                self.probe()
            }
            other => Step::Done(Err(violation("Exists", &other))),
        }
    }
}
