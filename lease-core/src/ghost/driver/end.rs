//! How an operation ends for its actor and what it is then told ([`end`]), how a concurrent
//! reader is judged ([`check_reader`]), and the decisions on disk ([`Decisions`]).

use super::{Actor, AnyOp, Out};
use crate::ghost::{Ghost, OpGhost, Told, Violation, stable_judgements};
use crate::ops::EventLogView;
use crate::{Checkpoint, Dir, HeartbeatDurability, LeaseError, RetirementRecord, decode};

/// What an operation's end changed for its actor ([`end`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// A claim or takeover was granted this generation.
    Granted(u64),
    /// A retirement freed the run at this generation.
    Retired(u64),
    /// A heartbeat succeeded.
    Beat,
    /// The actor learned it no longer owns the run (`FENCED`, or an append that counted
    /// but found its owner superseded); with `fenced_exits` its process exited.
    Fenced,
    /// Anything else.
    Other,
}

/// Error codes that say a run is damaged: a wrong answer unless a record was ever corrupted
/// by hand or `lease/` rolled back (crashes, power loss and concurrency never damage a run).
const DAMAGED: [&str; 4] = [
    "CHAIN_BROKEN",
    "RECORD_INVALID",
    "EVENT_LOG_GAP",
    "RUN_LAYOUT_INVALID",
];

/// Actor `a`'s operation `op` (ghost `g`) ended with `result`: check what it was told
/// against the ghost ([`Ghost::finish`], and no damage reported on a sound run), record
/// it, and apply it to the actor as lease-run's owner does: a grant is held, a successful
/// heartbeat counted (and noted in the ghost when durable), a release or a `FENCED` answer
/// drops the lease. With `fenced_exits` (lease-run's `runlease run`, which exits when
/// fenced) a fenced actor's process exits: the next incarnation starts. Answers the trace
/// line and what changed.
pub fn end(
    ghost: &mut Ghost,
    a: &mut Actor,
    op: &AnyOp,
    g: &OpGhost,
    result: &Result<Out, LeaseError>,
    fenced_exits: bool,
) -> Result<(String, Ended), Violation> {
    let who = a.who();
    let line = format!(
        "{who}: {:?} -> {}",
        g.kind,
        match result {
            Ok(Out::Lease(l)) => format!("ok, generation {}", l.generation),
            Ok(Out::Appended(ap)) => format!("ok, event {}", ap.sequence),
            Ok(_) => "ok".into(),
            Err(e) => e.code().to_string(),
        }
    );
    if let Err(e) = result
        && !ghost.ever_corrupted
        && !ghost.rolled_back
        && DAMAGED.contains(&e.code().as_str())
    {
        return Err(format!("{line}: a sound run was refused as damaged: {e}"));
    }
    let told = match result {
        Ok(Out::Lease(l)) => Ok(Told::Granted(l.generation)),
        Ok(Out::Appended(ap)) => Ok(Told::Appended(ap.sequence.get())),
        Ok(Out::Unit | Out::Retired(_) | Out::Read(_)) => Ok(Told::Done),
        Err(e) => Err(e),
    };
    ghost
        .finish(g, &who, a.mine(), told)
        .map_err(|v| format!("{line}: {v}"))?;
    let fenced = match (op, result) {
        (AnyOp::Claim(_) | AnyOp::Takeover(_), Ok(Out::Lease(l))) => {
            a.lease = Some((**l).clone());
            a.beats = 0;
            return Ok((line, Ended::Granted(l.generation.get())));
        }
        (AnyOp::Retire(_), Ok(Out::Retired(n))) => return Ok((line, Ended::Retired(*n))),
        (AnyOp::Heartbeat(_), Ok(_)) => {
            a.beats += 1;
            if let Some(l) = &a.lease
                && l.policy.heartbeat_durability() == HeartbeatDurability::Durable
            {
                ghost.on_durable_beat(l.generation.get(), a.beats);
            }
            return Ok((line, Ended::Beat));
        }
        (AnyOp::Release(_), Ok(_)) => {
            a.lease = None;
            false
        }
        (AnyOp::Append(_), Ok(Out::Appended(ap))) => ap.superseded_by.is_some(),
        (AnyOp::Append(_) | AnyOp::Heartbeat(_) | AnyOp::Release(_), Err(e)) => {
            e.code() == "FENCED"
        }
        _ => false,
    };
    if !fenced {
        return Ok((line, Ended::Other));
    }
    a.lease = None;
    if fenced_exits {
        a.crash();
    }
    Ok((line, Ended::Fenced))
}

/// A finalizing reader that ran concurrently with the other actors ended with `result`:
/// what it judged must pass the ghost's checks of a read of `1..=last`
/// ([`Ghost::check_read`]), and each verdict must be the one an atomic finalizing reader
/// gives right now (`now`, I12, OQ-15). It may give up only with `CONCURRENT_CHANGE`, on a
/// hand-corrupted record, or after a rollback of `lease/`.
pub fn check_reader(
    ghost: &Ghost,
    result: &Result<Out, LeaseError>,
    now: impl FnOnce() -> Result<EventLogView, LeaseError>,
) -> Result<(), Violation> {
    let view = match result {
        Ok(Out::Read(view)) => view,
        Ok(_) => return Err("a reader answered something else than a view".into()),
        Err(e) if e.code() == "CONCURRENT_CHANGE" || ghost.ever_corrupted => return Ok(()),
        _ if ghost.rolled_back => return Ok(()),
        Err(e) => return Err(format!("a finalizing reader failed: {e}")),
    };
    ghost.check_read(view)?;
    let now = now().map_err(|e| format!("log unreadable: {e}"))?;
    stable_judgements(view, &now)
}

/// The cutoffs and checkpoints on disk, as decided (what does not decode is `verify`'s to
/// report).
#[derive(Clone, Debug, Default)]
pub struct Decisions {
    /// Each cutoff: (generation, `events_through`).
    pub cutoffs: Vec<(u64, u64)>,
    /// Each checkpoint.
    pub checkpoints: Vec<Checkpoint>,
    /// The highest checkpoint floor (0: none).
    pub floor: u64,
}

impl Decisions {
    /// Decode them from `records(dir)`, the bytes of every record file in `dir`.
    pub fn read(records: impl Fn(Dir) -> Vec<Vec<u8>>) -> Decisions {
        let cutoffs = records(Dir::Cutoffs)
            .iter()
            .filter_map(|b| decode::<RetirementRecord>(b).ok())
            .map(|r| (r.generation.get(), r.events_through))
            .collect();
        let checkpoints: Vec<Checkpoint> = records(Dir::Checkpoints)
            .iter()
            .filter_map(|b| decode::<Checkpoint>(b).ok())
            .collect();
        let floor = checkpoints
            .iter()
            .map(|c| c.floor_generation.get())
            .max()
            .unwrap_or(0);
        Decisions {
            cutoffs,
            checkpoints,
            floor,
        }
    }

    /// Each decision against what each writer was told ([`Ghost::check_decisions`]: I4, I9,
    /// I5).
    pub fn check(&self, ghost: &Ghost) -> Result<(), Violation> {
        ghost.check_decisions(
            self.cutoffs.iter().copied(),
            self.checkpoints.iter().map(|c| {
                (
                    c.floor_generation.get(),
                    c.through_sequence,
                    c.not_authoritative.as_slice(),
                )
            }),
        )
    }
}
