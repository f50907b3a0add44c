//! Rollback evidence: is the lease chain behind what the run already saw (issue #28)?
//!
//! An owner writes `run.json`, its events and its store commits only after its epoch is
//! durable (PROTOCOL §7.1, §7.4: `run.json` follows the claim, before the command runs).
//! So no crash and no power loss leaves any of them stamped with a generation the lease
//! chain does not reach. When one is, `lease/` was restored from an older copy (or its
//! newest epochs were deleted), and a claim, takeover or retirement on that chain would
//! issue generations a second time: its FINALIZE would decide a cutoff again over a log
//! that holds events the first decision had refused (their writers were told `FENCED`),
//! and those events would count for good (an I4 violation).
//!
//! [`rollback_evidence`] is the decision, pure: the caller gathers the facts (the head of
//! the chain, the generation that last wrote `run.json`, the generation of the newest
//! event, the highest fencing token the store committed) and refuses every claim,
//! takeover and retirement when it answers `Some`. Who asks: lease-run's admission rule
//! and the model checker's claim, takeover and retire actors (lease-fs/tests/model_check/).
//!
//! What it cannot see: generations whose owners died after their epoch and before
//! writing `run.json`, an event or a commit leave nothing outside `lease/`, so a copy that
//! drops only such generations passes (the model checker keeps a trace of it:
//! `model_schedule_known_limit_a_taker_dead_before_run_json_leaves_no_evidence`); nor can
//! a copy whose head is the current head (only a cutoff, beat or intent older), which looks
//! like a crash in the middle of a takeover. PROTOCOL §16.

use std::fmt;

/// Which fact shows the chain was rolled back, with the generation it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// `run.json` was written by `written_by`, above the head.
    RunJson {
        /// The generation that wrote `run.json`.
        written_by: u64,
        /// The head of the chain (0: no epoch).
        head: u64,
    },
    /// The newest event was written by `generation`, above the head. (Events are
    /// generation-monotone, I13, so the newest one carries the highest generation.)
    Event {
        /// The newest event's generation.
        generation: u64,
        /// The head of the chain (0: no epoch).
        head: u64,
    },
    /// The store holds a commit fenced by `token`, above the head.
    Store {
        /// The highest fencing token of the store's commits.
        token: u64,
        /// The head of the chain (0: no epoch).
        head: u64,
    },
}

impl Evidence {
    /// The generation the evidence names (above the head).
    pub fn generation(&self) -> u64 {
        match *self {
            Evidence::RunJson { written_by, .. } => written_by,
            Evidence::Event { generation, .. } => generation,
            Evidence::Store { token, .. } => token,
        }
    }

    /// The head of the chain it was judged against (0: no epoch).
    pub fn head(&self) -> u64 {
        match *self {
            Evidence::RunJson { head, .. }
            | Evidence::Event { head, .. }
            | Evidence::Store { head, .. } => head,
        }
    }
}

impl fmt::Display for Evidence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            Evidence::RunJson { .. } => "run.json was written",
            Evidence::Event { .. } => "the newest event was written",
            Evidence::Store { .. } => "the store holds commits",
        };
        let head = self.head();
        let chain = if head == 0 {
            "the lease chain (lease/epochs/) has no epoch".to_string()
        } else {
            format!("the lease chain (lease/epochs/) ends at generation {head}")
        };
        write!(
            f,
            "{what} by generation {}, but {chain}: epochs were deleted or lease/ was restored from an older copy, and claiming or replacing the owner would reuse fencing tokens already given out",
            self.generation()
        )
    }
}

/// The rollback evidence against a chain whose head is generation `head` (0: no epoch),
/// given the generation that last wrote `run.json` (`None`: no `run.json`), the
/// generation of the newest event (`None`: an empty log, or its newest event unreadable:
/// `verify` names that) and the highest fencing token among the store's commits (`None`:
/// no store, or not read). `None` means no evidence: the chain reaches everything the run
/// saw. Checked in that order; the first fact above the head is the answer.
///
/// No I/O and no clock: the caller reads the facts (lease-run through its authority and
/// run folder, the model checker through the simulated file system) right before it
/// claims, takes over or retires, and refuses on `Some` (lease-run: `CHAIN_BROKEN`).
pub fn rollback_evidence(
    head: u64,
    run_json_generation: Option<u64>,
    newest_event_generation: Option<u64>,
    store_max_token: Option<u64>,
) -> Option<Evidence> {
    // mutant rollback_evidence_ignored: no fact above the head is evidence (§7.14 step 2).
    if crate::mutant::mutant("rollback_evidence_ignored") {
        return None;
    }
    if let Some(written_by) = run_json_generation.filter(|&g| g > head) {
        return Some(Evidence::RunJson { written_by, head });
    }
    if let Some(generation) = newest_event_generation.filter(|&g| g > head) {
        return Some(Evidence::Event { generation, head });
    }
    if let Some(token) = store_max_token.filter(|&g| g > head) {
        return Some(Evidence::Store { token, head });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_above_the_head_is_no_evidence() {
        assert_eq!(rollback_evidence(0, None, None, None), None);
        assert_eq!(rollback_evidence(4, Some(4), Some(3), Some(4)), None);
        assert_eq!(rollback_evidence(4, Some(1), Some(1), Some(0)), None);
    }

    /// Issue #28: `lease/` restored to a copy taken while generation 1 was active,
    /// `run.json` written by generation 4.
    #[test]
    fn run_json_ahead_of_the_chain_is_evidence() {
        let e = rollback_evidence(1, Some(4), Some(1), None).unwrap();
        assert_eq!(
            e,
            Evidence::RunJson {
                written_by: 4,
                head: 1
            }
        );
        assert_eq!((e.generation(), e.head()), (4, 1));
        assert!(e.to_string().contains("generation 4"), "{e}");
        assert!(e.to_string().contains("ends at generation 1"), "{e}");
    }

    #[test]
    fn the_newest_event_ahead_of_the_chain_is_evidence() {
        assert_eq!(
            rollback_evidence(2, None, Some(3), None),
            Some(Evidence::Event {
                generation: 3,
                head: 2
            })
        );
        let none = rollback_evidence(0, None, Some(1), None).unwrap();
        assert!(none.to_string().contains("has no epoch"), "{none}");
    }

    #[test]
    fn a_store_commit_ahead_of_the_chain_is_evidence() {
        assert_eq!(
            rollback_evidence(2, Some(2), Some(2), Some(5)),
            Some(Evidence::Store { token: 5, head: 2 })
        );
    }

    /// The first fact above the head answers: run.json, then the event, then the store.
    #[test]
    fn run_json_then_event_then_store() {
        assert!(matches!(
            rollback_evidence(1, Some(2), Some(3), Some(4)),
            Some(Evidence::RunJson { written_by: 2, .. })
        ));
        assert!(matches!(
            rollback_evidence(1, Some(1), Some(3), Some(4)),
            Some(Evidence::Event { generation: 3, .. })
        ));
    }
}
