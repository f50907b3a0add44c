//! RECHECK(mine) (PROTOCOL §7.0): is any generation above `mine`?

use super::epochs_of;
use crate::ids::Generation;
use crate::layout::Dir;
use crate::ops::{Operation, Request, Response, Step, violation};

/// Sub-operation: "is any generation above `mine`?" from a listing (never a stat of
/// `mine + 1`, which compaction could make miss a newer one).
#[derive(Debug, Clone)]
pub(crate) struct Recheck {
    mine: Generation,
    asked: bool,
}

impl Recheck {
    pub(crate) fn new(mine: Generation) -> Recheck {
        Recheck { mine, asked: false }
    }
}

impl Operation for Recheck {
    /// `Some(highest)` when superseded.
    type Output = Option<Generation>;
    fn next(&mut self, input: Option<Response>) -> Step<Option<Generation>> {
        if !self.asked {
            self.asked = true;
            return Step::Io(Request::List(Dir::Epochs));
        }
        match input {
            Some(Response::Listing(l)) => {
                let top = epochs_of(l).last().copied();
                // mutant recheck_ignores_higher: a higher generation goes unseen (R4, I1).
                let top = if crate::mutant::mutant("recheck_ignores_higher") {
                    None
                } else {
                    top
                };
                Step::Done(Ok(top.filter(|&t| t > self.mine)))
            }
            other => Step::Done(Err(violation("Listing", &other))),
        }
    }
}
