//! The transition system: the world (simulated file system, actors, ghost), its
//! successors at system-call granularity, and the invariants checked in every state.

mod check;
mod faults;
mod observe;
mod step;
mod successors;

pub(crate) use check::check_no_unseen_beat;

use lease_core::ghost::driver::{self, evidence};
use lease_core::ghost::{Ghost, OpKind as Kind};
use lease_core::ops::{LivenessEvidence, Request};
use lease_core::*;
use lease_fs::fs::Fs;
use lease_fs::primitives::PrimOp;
use lease_fs::{Liveness, SimFs};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub(crate) fn hash128(s: &str) -> u128 {
    use std::hash::{Hash, Hasher};
    let mut a = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut a);
    let mut b = std::collections::hash_map::DefaultHasher::new();
    (s.len(), s).hash(&mut b);
    b.write_u64(0x9e37_79b9_7f4a_7c15);
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

/// A copy of `lease/`: every file below it, by path, with its content.
pub(crate) type LeaseCopy = Arc<BTreeMap<String, Vec<u8>>>;

/// `run.json`, the run layer's record (PROTOCOL §4).
pub(crate) const RUN_JSON: &str = "run.json";

pub(crate) use lease_core::ghost::driver::{at as t, run_id};

pub(crate) fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

/// An actor: the shared driver's ([`driver::Actor`]: name, incarnation, lease, beats, the
/// operation in flight and its pending answer) and what this checker adds to run it one
/// system call at a time.
#[derive(Clone, Debug)]
pub(crate) struct Actor {
    pub(crate) core: driver::Actor,
    /// The operation's next request, computed but not yet executed.
    pub(crate) pending: Option<Request>,
    pub(crate) exec: Option<(PrimOp, String)>,
    /// Operations it may still start, by kind.
    pub(crate) budget: BTreeMap<Kind, u8>,
    pub(crate) crashes_left: u8,
    /// A takeover in flight: the world time of its last read of the owner's beat, and of
    /// its request to create the next epoch (its commit) (OQ-5).
    pub(crate) looked_at: Option<u64>,
    pub(crate) commit_at: Option<u64>,
    /// A heartbeat in flight: the world time it started (its self-fence reference).
    pub(crate) beat_started_at: Option<u64>,
    /// After a claim, takeover or retirement succeeded: `run.json` still to be written
    /// (lease-run writes it after the epoch is durable, before the command runs).
    pub(crate) run_json: Option<RunJsonWrite>,
}

/// `run.json` being written after an owner change, as lease-run does it: read the old one
/// (left alone if written by this generation or a newer one), then a durable replace
/// (temp file written and fsynced, renamed over `run.json`, the folder fsynced), one call
/// per step. Only in configurations with [`Config::run_layer`].
#[derive(Clone, Debug)]
pub(crate) enum RunJsonWrite {
    /// Read the old `run.json` next; then write it as this generation.
    Read(u64),
    /// The replace in flight, as this generation.
    Write(u64, PrimOp),
}

impl std::ops::Deref for Actor {
    type Target = driver::Actor;
    fn deref(&self) -> &driver::Actor {
        &self.core
    }
}

impl std::ops::DerefMut for Actor {
    fn deref_mut(&mut self) -> &mut driver::Actor {
        &mut self.core
    }
}

impl Actor {
    /// In the middle of an operation (or of the `run.json` write that follows one).
    pub(crate) fn busy(&self) -> bool {
        self.op.is_some() || self.run_json.is_some()
    }
    pub(crate) fn tmp(&self, dir: &str) -> String {
        let name = format!(".tmp-{}{}", self.name, self.incarnation);
        if dir.is_empty() {
            name
        } else {
            format!("{dir}/{name}")
        }
    }
}

#[derive(Clone)]
pub(crate) struct World {
    pub(crate) fs: SimFs,
    pub(crate) actors: Vec<Actor>,
    pub(crate) now: u64,
    pub(crate) boot: u32,
    /// What each actor was told (grants labelled by actor incarnation, `a0`), and the
    /// hand-corrupted record.
    pub(crate) ghost: Ghost,
    pub(crate) power_losses_left: u8,
    pub(crate) time_jumps_left: u8,
    pub(crate) corrupt_left: u8,
    /// The actor that ran last, and how many more preemptions (switching away from an
    /// actor in the middle of an operation) are allowed; `None` = unbounded.
    pub(crate) running: Option<usize>,
    pub(crate) preemptions_left: Option<u8>,
    /// Every heartbeat that succeeded: (generation, world time it finished) (OQ-5).
    pub(crate) beats_ok: Vec<(u64, u64)>,
    /// Actors behave as lease-run's owners ([`Config::run_layer`]).
    pub(crate) run_layer: bool,
    /// Claims, takeovers and retirements refuse on rollback evidence
    /// ([`Config::rollback_check`]).
    pub(crate) rollback_check: bool,
    /// Copies of `lease/` still to take, rollbacks still to make, and the copy taken
    /// (every file below `lease/`, by path), with its hash for the fingerprint.
    pub(crate) copies_left: u8,
    pub(crate) rollbacks_left: u8,
    pub(crate) lease_copy: Option<(LeaseCopy, u128)>,
    /// The policy claims and takeovers write ([`Config::durable_beats`]).
    pub(crate) policy: TimingPolicy,
}

/// Liveness as the world knows it: a holder is up iff it ran on this boot and a live
/// actor incarnation has its pid and start time (each live owner holds its kernel lock):
/// the driver's [`evidence`].
pub(crate) struct WorldLiveness {
    boot: u32,
    live: BTreeSet<(u32, u64)>,
    now_ms: u64,
}

impl Liveness for WorldLiveness {
    fn probe(&self, h: &Holder) -> LivenessEvidence {
        evidence(self.boot, &self.live, h)
    }

    /// The world's clock (ms, moved only by time jumps), as every actor's monotonic clock.
    fn monotonic_ns(&self) -> u64 {
        self.now_ms.saturating_mul(1_000_000)
    }

    /// The world's clock is one clock per boot: beats are stamped with it, and a taker on
    /// the same boot ages a stamped beat on it (PROTOCOL §10, the same-clock rule).
    fn clock_domain(&self) -> Option<lease_core::Identity> {
        Some(driver::boot_id(self.boot))
    }
}

pub(crate) const POLICY_STALE_MS: u64 = 20_000;

pub(crate) type ActorSpec = (char, Vec<(Kind, u8)>, u8);

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) name: &'static str,
    /// (name, operation budget, process crashes allowed)
    pub(crate) actors: Vec<ActorSpec>,
    pub(crate) power_losses: u8,
    pub(crate) time_jumps: u8,
    pub(crate) corrupt: u8,
    /// Preemption bound (`None`: every interleaving at system-call granularity).
    pub(crate) preemptions: Option<u8>,
    pub(crate) max_states: usize,
    /// Actors behave as lease-run's: they write `run.json` after each claim, takeover and
    /// retirement (the evidence a rollback of `lease/` leaves behind), and an owner told
    /// `FENCED` exits (a new incarnation: its holder is dead).
    pub(crate) run_layer: bool,
    /// Claims, takeovers and retirements refuse on rollback evidence (lease-run's
    /// admission rule, `lease_core::rollback`); `RUNLEASE_MODEL_NO_ROLLBACK_CHECK=1`
    /// turns it off, to show what the checker finds without it.
    pub(crate) rollback_check: bool,
    /// Copies of `lease/` that may be taken, and rollbacks of `lease/` to the copy
    /// (issue #28).
    pub(crate) copies: u8,
    pub(crate) rollbacks: u8,
    /// The policy claims and takeovers write: `durable` heartbeats (fsynced, so a power
    /// loss or a torn write never takes an acknowledged beat back, PROTOCOL §5.3) or the
    /// default `local`.
    pub(crate) durable_beats: bool,
    /// How much of a torn write reaches the disk (`SimFs::set_tear_fraction`; `None`: the
    /// simulated file system's half). A heartbeat slot is 2,048 bytes whose record fills
    /// the first few hundred: only a fraction below about 1/8 cuts into the record.
    pub(crate) tear: Option<(u64, u64)>,
}

/// What a configuration does not say: no faults, every interleaving, the folder layer
/// only, the rollback check on, the `local` heartbeat policy and the simulated file
/// system's own tear. Each configuration names itself, its actors and its state cap.
impl Default for Config {
    fn default() -> Config {
        Config {
            name: "",
            actors: Vec::new(),
            power_losses: 0,
            time_jumps: 0,
            corrupt: 0,
            preemptions: None,
            max_states: 0,
            run_layer: false,
            rollback_check: true,
            copies: 0,
            rollbacks: 0,
            durable_beats: false,
            tear: None,
        }
    }
}

pub(crate) fn world(c: &Config) -> World {
    let fs = SimFs::new();
    for d in Dir::ALL {
        fs.ensure_dir(d.path()).unwrap();
    }
    // Where power can fail, renames outrun their data (the file system the issue-#17
    // tester used): a `local` heartbeat, renamed into place unsynced, can come back empty
    // or torn, and the run must stay recoverable by the protocol alone (OQ-6).
    if c.power_losses > 0 {
        fs.set_renames_outrun_data(true);
    }
    if let Some((num, den)) = c.tear {
        fs.set_tear_fraction(num, den);
    }
    World {
        fs,
        actors: c
            .actors
            .iter()
            .map(|(name, budget, crashes)| Actor {
                core: driver::Actor::new(*name),
                pending: None,
                exec: None,
                budget: budget.iter().copied().collect(),
                crashes_left: *crashes,
                looked_at: None,
                commit_at: None,
                beat_started_at: None,
                run_json: None,
            })
            .collect(),
        now: 0,
        boot: 0,
        ghost: Ghost::new(),
        power_losses_left: c.power_losses,
        time_jumps_left: c.time_jumps,
        corrupt_left: c.corrupt,
        running: None,
        preemptions_left: c.preemptions,
        beats_ok: Vec::new(),
        run_layer: c.run_layer,
        rollback_check: c.rollback_check
            && std::env::var("RUNLEASE_MODEL_NO_ROLLBACK_CHECK").map_or(true, |v| v != "1"),
        copies_left: c.copies,
        rollbacks_left: c.rollbacks,
        lease_copy: None,
        policy: if c.durable_beats {
            TimingPolicy::default().with_durability(HeartbeatDurability::Durable)
        } else {
            TimingPolicy::default()
        },
    }
}
