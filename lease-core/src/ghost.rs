//! # The ghost model of runlease's model-based checkers (feature `ghost`)
//!
//! Three checkers drive the real step machines of [`crate::ops`] through random or
//! exhaustive interleavings of 2-3 actors: the proptest (`lease-core/tests/model.rs`, over
//! [`crate::mem::MemDisk`]), the breadth-first model checker and its random walks
//! (`lease-fs/tests/model_check/`, `cargo xtask model`, over lease-fs's simulated file
//! system) and the `transitions` fuzz target (`fuzz/src/transitions.rs`). They share this
//! one *ghost*: what each actor was told (grants, acknowledged and refused appends), what
//! was true when each operation started, which records were hand-corrupted, and the checks
//! of the invariants of `docs/PROTOCOL.md` §8 against it.
//!
//! The ghost is pure, like the rest of this crate: it performs no I/O and reads no clock.
//! The checker owns the disk, the actors and the schedule; it tells the ghost what happened
//! at fixed points ([`Ghost::begin`], [`Ghost::on_request`], [`Ghost::on_response`],
//! [`Ghost::on_linked`], [`Ghost::finish`], [`Ghost::corrupt`]) and asks it to check what
//! it read back ([`Ghost::observe_head`], [`Ghost::check_no_new_epoch`],
//! [`Ghost::check_granted_epochs`], [`Ghost::check_log`], ...). A check answers
//! `Err(description)` on a violation; the checker decides how to report it (a panic, or
//! the shortest trace).
//!
//! | invariant (§8) | check |
//! |---|---|
//! | I1 one owner per generation | [`Ghost::finish`]: a generation is granted to one actor, above every grant completed before the operation started, increasing per actor |
//! | I2 generations never decrease | [`Ghost::observe_head`]; [`Ghost::check_granted_epochs`] (a granted epoch survives power loss) |
//! | I4 nothing past a cutoff counts | [`Ghost::check_within_cutoffs`] (no event linked after its generation's cutoff was linked counts: the ghost's record of the order of links, not the cutoff's value); [`within_cutoffs`] (a reader's answer against its own cutoffs, blind to a cutoff written wrong); [`Ghost::check_decisions`] (every cutoff and checkpoint on disk against what each writer was told, so a cutoff decided a second time over a rolled-back chain is seen) |
//! | I5 acknowledged appends count | [`Ghost::check_acknowledged`] |
//! | I6 takeover only over the observed owner | [`check_takeover_retired`] (owner, generation, and the beat time and count the new epoch records as judged, against the taker's expectation [`OpGhost::observed`]), [`Ghost::check_epoch_created`] |
//! | I7 an invalid record blocks ownership changes | [`Ghost::finish`], [`Ghost::check_no_new_epoch`] |
//! | I8 a superseded heartbeat or release never succeeds | [`Ghost::finish`] (with [`OpGhost::head_at_start`]); [`Ghost::check_epoch_created`] (a release supersedes only its own generation) |
//! | I9 an append's answer is its event's authority | [`Ghost::check_refused`]; [`Ghost::check_late`] (an event linked after a newer grant never counts) |
//! | I10 every prefix is a valid state | [`status_valid`] |
//! | I11 a cutoff never outlives its successor | [`cutoffs_have_successors`] |
//! | I12 judgements are stable | [`stable_judgements`] (a concurrent reader against an atomic one); [`Ghost::check_read`] |
//! | I13 the counted history is generation-monotone | [`generation_monotone`] |
//!
//! Who checks what. Since issue #30 the three checkers drive their actors with one driver,
//! [`driver`]: the proptest and the fuzzer share its whole world ([`driver::MemWorld`], over
//! [`crate::mem::MemDisk`], one request at a time, a create's link and its directory fsync
//! as two steps), the model checker its actors, operations and ends (one system call at a
//! time over lease-fs's simulated file system). So they check the same things, at their
//! own granularity:
//!
//! | check | proptest and fuzzer ([`driver::MemWorld`]) | model checker |
//! |---|---|---|
//! | [`Ghost::finish`] (grants, I7 on success, superseded heartbeat or release, acknowledged = created, `PROTOCOL_VIOLATION`), no damage reported on a sound run | after each operation ([`driver::end`]) | after each operation ([`driver::end`]) |
//! | [`Ghost::observe_head`], [`Ghost::check_no_new_epoch`], [`Ghost::check_durable_beats`] | every step | every state |
//! | [`Ghost::on_linked`] / [`Ghost::check_late`], [`Ghost::on_cutoff_linked`] / [`Ghost::check_within_cutoffs`] | at each link | at each link |
//! | [`Ghost::check_log`] (acknowledged, refused, late, [`generation_monotone`], cutoffs by links, [`within_cutoffs`]) | at the end, and the streaming read agrees | every state |
//! | [`Ghost::check_decisions`], [`Ghost::check_granted_epochs`], [`cutoffs_have_successors`], `verify`, [`status_valid`] | after each power loss and at the end | every state |
//! | [`check_takeover_retired`] | each takeover | each takeover, with the model's OQ-5 look-to-commit check |
//! | [`Ghost::check_epoch_created`] | as each epoch is linked | no (its own [`check_takeover_retired`] and the model's OQ-5 check) |
//! | [`Ghost::check_read`], [`stable_judgements`] | as a reader ([`OpKind::Read`]) finishes ([`driver::check_reader`]) | the same |
//!
//! While a record is hand-corrupted the checkers check only [`Ghost::check_no_new_epoch`],
//! what each decision on disk says ([`Ghost::check_decisions`]) and what each operation was
//! told; an unreadable log is accepted then. After `lease/` was rolled back to an older copy ([`Ghost::rollback`],
//! the model checker's rollback fault, issue #28) the run is damaged from outside: the
//! model checker then checks [`Ghost::finish`] (no generation granted twice, I1) and
//! [`Ghost::check_decisions`] (I4/I9 against what each writer was told), not the reader's
//! view of the log, `verify`, the head's watermark or the granted epochs, which the
//! rollback itself breaks.
//!
//! Where it stands: here the ghost's data ([`Ghost`], [`OpGhost`], [`Told`]); `told.rs`
//! what the checker tells it, `checks.rs` its checks against what it was told,
//! `answers.rs` the checks of an answer on its own; [`driver`] the one actor driver.

pub mod driver;

mod answers;
mod checks;
mod told;

pub use answers::{
    check_takeover_retired, counted, cutoffs_have_successors, generation_monotone,
    stable_judgements, status_valid, within_cutoffs,
};

use std::collections::{BTreeMap, BTreeSet};

use crate::ops::{AuthorityLease, Expectation, LivenessEvidence, LockEvidence, ProcessState};
use crate::{FileRef, Generation, Holder, Identity};

/// What a violated invariant is reported as.
pub type Violation = String;

/// The kind of an actor's operation.
///
/// The order is the model checker's exploration order of operations to start: keep it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// [`crate::ops::Claim`].
    Claim,
    /// [`crate::ops::Heartbeat`].
    Heartbeat,
    /// [`crate::ops::Append`].
    Append,
    /// [`crate::ops::Takeover`].
    Takeover,
    /// [`crate::ops::Retire`].
    Retire,
    /// [`crate::ops::Release`].
    Release,
    /// [`crate::ops::Prune`].
    Prune,
    /// [`crate::ops::ReadEvents`], finalizing: a reader of the log (its answer is checked
    /// with [`Ghost::check_read`] and [`stable_judgements`]).
    Read,
}

/// Ghost data about one operation in flight.
#[derive(Clone, Debug)]
pub struct OpGhost {
    /// What the operation is.
    pub kind: OpKind,
    /// The head generation when the operation started, if the checker noted it
    /// ([`OpGhost::note_head`]): a heartbeat or release that started after its owner was
    /// superseded must not succeed (I8).
    pub head_at_start: Option<u64>,
    /// The highest generation granted to anyone when the operation started.
    pub granted_max_at_start: u64,
    /// The event sequence this append created, if any.
    pub created_event: Option<u64>,
    /// What a takeover observed (and must take over exactly).
    pub observed: Option<Expectation>,
}

impl OpGhost {
    /// Note the head generation as the operation starts (`None`: no epoch yet).
    pub fn note_head(&mut self, head: Option<u64>) {
        self.head_at_start = head;
    }
}

/// How an operation ended, as the ghost needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Told {
    /// A claim or takeover returned a lease of this generation.
    Granted(Generation),
    /// An append acknowledged this event sequence.
    Appended(u64),
    /// Any other success.
    Done,
}

/// What the actors were told, and what must therefore hold.
#[derive(Clone, Debug, Default)]
pub struct Ghost {
    /// Sequences whose append returned success: they must count (I5).
    pub acked: BTreeSet<u64>,
    /// Sequences created by an append that then answered `FENCED`: they must not count (I9).
    pub refused: BTreeSet<u64>,
    /// Events linked by a writer whose generation was below one already granted (returned)
    /// to someone: they must not count (only tracked through [`Ghost::on_linked`]).
    pub late: BTreeSet<u64>,
    /// Generation -> the actor it was granted to (the checker's label).
    pub granted: BTreeMap<u64, String>,
    /// Highest generation ever granted.
    pub max_granted: u64,
    /// Highest head generation observed (since the last power loss).
    pub max_head: u64,
    /// Hand-corrupted records still on disk: while any is, no ownership change may succeed
    /// and no epoch may appear (I7).
    pub corrupted: BTreeSet<FileRef>,
    /// The number of epochs when the last record was corrupted.
    pub epochs_at_corruption: usize,
    /// The head (as last observed) when the last record was corrupted.
    pub head_at_corruption: u64,
    /// A record was ever corrupted by hand (even if no longer invalid: an operation that
    /// read it before the owner's next beat or release repaired it may still answer that
    /// the run is damaged).
    pub ever_corrupted: bool,
    /// The generation that wrote each event in `acked`, `refused` and `late` (sequence ->
    /// generation), for [`Ghost::check_decisions`].
    pub writer: BTreeMap<u64, u64>,
    /// `lease/` was restored from an older copy ([`Ghost::rollback`]).
    pub rolled_back: bool,
    /// Every event the ghost saw linked (only tracked through [`Ghost::on_linked`]):
    /// sequence -> (its writer's generation, the link's place in [`Ghost::links`]).
    pub linked: BTreeMap<u64, (u64, u64)>,
    /// Every cutoff the ghost saw linked (only tracked through [`Ghost::on_cutoff_linked`]):
    /// generation -> the link's place in [`Ghost::links`] (the latest, if a power loss
    /// dropped an earlier one).
    pub cutoff_linked: BTreeMap<u64, u64>,
    /// The number of links the ghost saw: the order of [`Ghost::linked`] and
    /// [`Ghost::cutoff_linked`].
    pub links: u64,
    /// Generation -> the count of its newest heartbeat acknowledged as durable
    /// ([`Ghost::on_durable_beat`]): a power loss never takes it back (PROTOCOL §5.3).
    pub durable_beats: BTreeMap<u64, u64>,
}

impl Ghost {
    /// A new, empty ghost.
    pub fn new() -> Ghost {
        Ghost::default()
    }

    /// The ghost of an operation of `kind` starting now (`observed`: what a takeover saw).
    pub fn begin(&self, kind: OpKind, observed: Option<Expectation>) -> OpGhost {
        OpGhost {
            kind,
            head_at_start: None,
            granted_max_at_start: self.max_granted,
            created_event: None,
            observed,
        }
    }
}

/// The liveness evidence of the checkers' simulated world, seen from `observer_boot_id`:
/// a holder whose process is `up` runs with its recorded start time and holds the owner
/// lock; otherwise its process is gone and the lock is free.
pub fn simulated_evidence(observer_boot_id: Identity, h: &Holder, up: bool) -> LivenessEvidence {
    LivenessEvidence {
        observer_boot_id,
        process: if up {
            ProcessState::Running {
                start_time: h.start_time,
            }
        } else {
            ProcessState::Gone
        },
        owner_lock: if up {
            LockEvidence::Held
        } else {
            LockEvidence::Free
        },
        lease: AuthorityLease::NotKept,
    }
}

/// The watch a taker of the checkers' simulated world reports: the world has one clock, and
/// a watcher that began watching when the expected heartbeat was written has watched it
/// unchanged for its wall age (0 if dated later). Simulation only: a real taker measures
/// the watch on its own monotonic clock (`lease_core::watch`), never from a wall age.
pub fn simulated_watch(expect: &crate::ops::Expectation, now: crate::Timestamp) -> u64 {
    u64::try_from(now.millis_since(expect.heartbeat_at)).unwrap_or(0)
}
