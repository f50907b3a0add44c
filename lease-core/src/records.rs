//! The durable records of the protocol (see `docs/PROTOCOL.md` §4).
//!
//! Every record is strict: unknown fields are rejected, every field is validated, and the
//! bytes must be canonical ([`crate::canonical`]). Optional fields are always present
//! (`null` when empty) so each record has exactly one byte form.

use crate::canonical::Record;
use crate::error::RecordKind;
use crate::ids::{Digest, Generation, Identity, RunId, Sequence};
use crate::policy::TimingPolicy;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};

/// The process that wrote a record: the liveness evidence of an owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holder {
    /// Host name.
    pub host: Identity,
    /// Kernel boot id (`/proc/sys/kernel/random/boot_id`): a reboot changes it.
    pub boot_id: Identity,
    /// Process id (> 0).
    pub pid: u32,
    /// Process start time in clock ticks since boot (`/proc/<pid>/stat` field 22), so that a
    /// reused pid is never mistaken for the owner.
    pub start_time: u64,
}

impl Holder {
    fn check(&self) -> Result<(), String> {
        if self.pid == 0 {
            return Err("holder.pid must be > 0".into());
        }
        // The host is shown to operators as a name (status, refusals): a word, never text
        // a terminal or a pasted command would act on (issue #28).
        self.host.check_word("holder.host")
    }
}

/// State of an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpochState {
    /// `owner_id` owns the run in this generation.
    Active,
    /// The previous owner released the run cleanly; the run is free.
    Released,
    /// The previous owner was retired as definitely dead; the run is free.
    Retired,
}

/// Why an epoch superseded the generation before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetireReason {
    /// The owner released it.
    Released,
    /// An exact takeover replaced a stale owner.
    TakenOver,
    /// The owner was proven dead.
    Dead,
}

/// The owner an epoch superseded.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetiredOwner {
    /// The superseded generation (always this epoch's generation − 1).
    pub generation: Generation,
    /// Its owner.
    pub owner_id: Identity,
    /// Why it was superseded.
    pub reason: RetireReason,
    /// What a takeover or a retirement judged before it wrote this epoch (issue #19: the
    /// audit record a separate intent file held before, now bound into the chain at no
    /// extra create). **Absent when `None`** (never `null`): a release has none, and epochs
    /// written before it existed decode byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<Observation>,
}

/// What the writer of a takeover or retirement epoch judged of the owner it replaced
/// (PROTOCOL §4): the owner's heartbeat as read at the last look, how long the taker watched
/// it unchanged on its own monotonic clock, and how the replacement was asked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Observation {
    /// The replaced owner's heartbeat time as judged (its claim time if it never beat).
    pub heartbeat_at: Timestamp,
    /// The replaced owner's heartbeat count as judged (0 if it never beat).
    pub heartbeat_count: u64,
    /// How long the taker watched the owner's record unchanged, in ms; `null` for a
    /// retirement (proof of death, not a watch, allowed it).
    pub watched_ms: Option<u64>,
    /// How the replacement was asked for: `operator` or `automatic` for a takeover,
    /// `retire_dead` for a retirement.
    pub mode: TakeoverMode,
}

impl RetiredOwner {
    fn check(&self) -> Result<(), String> {
        self.owner_id.check_word("retired.owner_id")?;
        let Some(o) = &self.observed else {
            return Ok(());
        };
        match (self.reason, o.mode, o.watched_ms) {
            (
                RetireReason::TakenOver,
                TakeoverMode::Operator | TakeoverMode::Automatic,
                Some(_),
            )
            | (RetireReason::Dead, TakeoverMode::RetireDead, None) => Ok(()),
            (RetireReason::Released, _, _) => {
                Err("retired.observed is only for a takeover or a retirement, not a release".into())
            }
            (RetireReason::TakenOver, _, _) => Err(
                "retired.observed of a takeover needs mode operator or automatic and watched_ms"
                    .into(),
            ),
            (RetireReason::Dead, _, _) => Err(
                "retired.observed of a retirement needs mode retire_dead and watched_ms null"
                    .into(),
            ),
        }
    }
}

/// The seal a clean release writes: the store's identity and head at release.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seal {
    /// The identity created with the store.
    pub store_id: Identity,
    /// The store's last committed sequence at release (0 for an empty store).
    pub sequence: u64,
    /// The generation that sealed it.
    pub generation: Generation,
}

/// One generation of the lease: `lease/epochs/<generation>.json`, immutable once created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochRecord {
    /// The run.
    pub run_id: RunId,
    /// This generation (the fencing token).
    pub generation: Generation,
    /// SHA-256 of the canonical bytes of the epoch before it; `null` only for generation 1.
    pub prev_hash: Option<Digest>,
    /// Active, released or retired.
    pub state: EpochState,
    /// Active: the owner. Released: the owner that released. Retired: the retirer.
    pub owner_id: Identity,
    /// The process that created this epoch.
    pub holder: Holder,
    /// When this epoch was created (writer's wall clock).
    pub claimed_at: Timestamp,
    /// The timing policy the writer runs with.
    pub policy: TimingPolicy,
    /// The owner this epoch superseded, if the previous epoch was active.
    pub retired: Option<RetiredOwner>,
    /// Set only on a released epoch with a store.
    pub seal: Option<Seal>,
    /// The highest store head the writer knew of (a floor for the store).
    pub store_floor: Option<u64>,
    /// SHA-256 of the cutoff (`lease/cutoffs/<g>.json`) of the generation `g` that the
    /// previous epoch superseded (`retired.generation` of epoch `generation − 1`), as GATE
    /// finalized it before this epoch was created (PROTOCOL.md §4, §7.0): it binds every
    /// cutoff into the epoch chain, so `verify` finds an edited or deleted cutoff and a lazy
    /// finalizer never re-creates one. `None` when the previous epoch superseded nobody or
    /// the cutoff was already folded into a checkpoint. **Absent when `None`** (never
    /// `null`), like the heartbeat's `store_head`, so epochs written before it existed
    /// decode byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cutoff_hash: Option<Digest>,
}

impl Record for EpochRecord {
    const KIND: RecordKind = RecordKind::Epoch;
    const VERSION: &'static str = "runlease/epoch/1";

    fn validate(&self) -> Result<(), String> {
        // Owner ids reach suggested commands (`takeover --expect-owner ID`): words only,
        // so one read from a hand-edited record is refused here, never quoted into a step.
        self.owner_id.check_word("owner_id")?;
        self.holder.check()?;
        match (self.generation.get() == 1, &self.prev_hash) {
            (true, Some(_)) => return Err("generation 1 must have prev_hash null".into()),
            (false, None) => return Err("prev_hash is required above generation 1".into()),
            _ => {}
        }
        if let Some(r) = &self.retired {
            r.check()?;
            if r.generation.get().checked_add(1) != Some(self.generation.get()) {
                return Err(format!(
                    "retired.generation {} must be generation - 1 ({})",
                    r.generation,
                    self.generation.get() - 1
                ));
            }
        }
        match (self.state, &self.retired) {
            (EpochState::Active, None) => {}
            (EpochState::Active, Some(r)) if r.reason == RetireReason::TakenOver => {}
            (EpochState::Released, Some(r))
                if r.reason == RetireReason::Released && r.owner_id == self.owner_id => {}
            (EpochState::Retired, Some(r)) if r.reason == RetireReason::Dead => {}
            (state, retired) => {
                let state = match state {
                    EpochState::Active => "active",
                    EpochState::Released => "released",
                    EpochState::Retired => "retired",
                };
                return Err(match retired {
                    None => format!("state {state} requires a `retired` owner, found none"),
                    Some(r) => format!(
                        "state {state} does not match `retired` (owner {}, reason {})",
                        r.owner_id,
                        match r.reason {
                            RetireReason::Released => "released",
                            RetireReason::TakenOver => "taken_over",
                            RetireReason::Dead => "dead",
                        }
                    ),
                });
            }
        }
        if self.cutoff_hash.is_some() && self.generation.get() < 3 {
            return Err(
                "cutoff_hash binds the cutoff of generation - 2: only from generation 3".into(),
            );
        }
        if let Some(seal) = &self.seal {
            if self.state != EpochState::Released {
                return Err("a seal is only allowed on a released epoch".into());
            }
            if seal.generation.get().checked_add(1) != Some(self.generation.get()) {
                return Err("seal.generation must be the released generation".into());
            }
        }
        Ok(())
    }

    fn run_id(&self) -> Option<&RunId> {
        Some(&self.run_id)
    }
}

/// The heartbeat of an active generation: `lease/beats/<generation>.json`, replaced by its
/// owner only. A missing file means "no heartbeat since the claim".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRecord {
    /// The run.
    pub run_id: RunId,
    /// The generation heartbeating.
    pub generation: Generation,
    /// Its owner.
    pub owner_id: Identity,
    /// Wall time at which this heartbeat was written.
    pub heartbeat_at: Timestamp,
    /// Heartbeats written by this generation so far (>= 1).
    pub count: u64,
    /// The owner's store head when this heartbeat started (its last acknowledged commit),
    /// if the owner has a store. The creator of the next epoch by takeover or retirement
    /// folds it into that epoch's `store_floor`, so a crash (which leaves no seal) still
    /// leaves a floor. **Absent when `None`** (never `null`): the one field of the
    /// protocol that is omitted when empty, so heartbeat records written before it existed
    /// still decode, byte for byte (PROTOCOL.md §4). `"store_head":null` is not canonical.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_head: Option<u64>,
    /// The owner's monotonic clock when this heartbeat started, and which clock that is
    /// (PROTOCOL.md §10, the same-clock rule). An observer on the same clock (same boot and
    /// time namespace: [`MonoStamp::clock`] equal to its own) measures the beat's age on
    /// that clock instead of watching the record, so no wall clock is compared. **Absent
    /// when `None`**, like `store_head`: beats written before it existed, and beats of an
    /// owner that cannot name its clock, decode byte for byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mono: Option<MonoStamp>,
}

/// A reading of a named monotonic clock: `CLOCK_BOOTTIME` of one boot in one time namespace.
/// Two readings compare only when their `clock` is the same string: the boot id alone is
/// not enough, since Linux time namespaces give processes of one boot different
/// `CLOCK_BOOTTIME` offsets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MonoStamp {
    /// Which clock: the boot id and the time namespace (lease-fs:
    /// `<boot id>/<time namespace>`, e.g. `0f3c…/time:[4026531834]`).
    pub clock: Identity,
    /// The clock's reading in nanoseconds.
    pub ns: u64,
}

impl MonoStamp {
    /// How long ago, in ms, `self` was read, for an observer on clock `clock` reading
    /// `now_ns` now. `None` when the clocks differ (or the observer names none), or when the
    /// stamp is ahead of the observer's reading: a stamp from the future is no evidence of
    /// age (it cannot be genuine on one clock) and is ignored, never waited for.
    pub fn age_ms_on(&self, clock: Option<&Identity>, now_ns: u64) -> Option<u64> {
        if clock != Some(&self.clock) {
            return None;
        }
        now_ns.checked_sub(self.ns).map(|d| d / 1_000_000)
    }
}

impl Record for HeartbeatRecord {
    const KIND: RecordKind = RecordKind::Heartbeat;
    const VERSION: &'static str = "runlease/heartbeat/1";
    fn validate(&self) -> Result<(), String> {
        self.owner_id.check_word("owner_id")?;
        if self.count == 0 {
            return Err("count must be >= 1".into());
        }
        Ok(())
    }
    fn run_id(&self) -> Option<&RunId> {
        Some(&self.run_id)
    }
}

/// The event cutoff of a superseded active generation: `lease/cutoffs/<generation>.json`,
/// created exclusively after the superseding generation exists; the first finalizer wins.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetirementRecord {
    /// The run.
    pub run_id: RunId,
    /// The retired generation.
    pub generation: Generation,
    /// Its owner.
    pub owner_id: Identity,
    /// The generation that superseded it.
    pub superseded_by: Generation,
    /// Events of `generation` with a sequence up to this one count; later ones never do.
    pub events_through: u64,
    /// When the cutoff was decided.
    pub finalized_at: Timestamp,
    /// Who decided it.
    pub finalized_by: Identity,
}

impl Record for RetirementRecord {
    const KIND: RecordKind = RecordKind::Retirement;
    const VERSION: &'static str = "runlease/retirement/1";
    fn validate(&self) -> Result<(), String> {
        self.owner_id.check_word("owner_id")?;
        if self.superseded_by <= self.generation {
            return Err("superseded_by must be above generation".into());
        }
        Ok(())
    }
    fn run_id(&self) -> Option<&RunId> {
        Some(&self.run_id)
    }
}

/// How a replacement was requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TakeoverMode {
    /// An operator confirmed the exact observation.
    Operator,
    /// A program watched the record unchanged for `stale_after` on its own monotonic clock.
    Automatic,
    /// Dead-owner retirement.
    RetireDead,
}

/// The audit record of one takeover or retirement attempt:
/// `lease/intents/<generation>-<nonce>.json`, written before the commit by versions before
/// issue #19. No operation writes it any more (the epoch's [`RetiredOwner::observed`] holds
/// the same observation); it stays readable so old runs verify, and compaction removes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TakeoverIntent {
    /// The run.
    pub run_id: RunId,
    /// The generation the taker will try to create.
    pub generation: Generation,
    /// The generation it saw as the head.
    pub expected_generation: Generation,
    /// The owner it expects to replace.
    pub expected_owner_id: Identity,
    /// The heartbeat time it expects.
    pub expected_heartbeat_at: Timestamp,
    /// The heartbeat counter it expects.
    pub expected_heartbeat_count: u64,
    /// Who takes over.
    pub taker_owner_id: Identity,
    /// The taker's process.
    pub taker_holder: Holder,
    /// When.
    pub requested_at: Timestamp,
    /// How it was requested.
    pub mode: TakeoverMode,
}

impl Record for TakeoverIntent {
    const KIND: RecordKind = RecordKind::TakeoverIntent;
    const VERSION: &'static str = "runlease/takeover-intent/1";
    fn validate(&self) -> Result<(), String> {
        self.expected_owner_id.check_word("expected_owner_id")?;
        self.taker_owner_id.check_word("taker_owner_id")?;
        self.taker_holder.check()?;
        if self.expected_generation.get().checked_add(1) != Some(self.generation.get()) {
            return Err("generation must be expected_generation + 1".into());
        }
        Ok(())
    }
    fn run_id(&self) -> Option<&RunId> {
        Some(&self.run_id)
    }
}

/// A compaction checkpoint: `lease/checkpoints/<floor_generation>.json`.
///
/// Epochs, beats, cutoffs and intents below `floor_generation` may be deleted; events of
/// generations below the floor count iff their sequence is `<= through_sequence` and not
/// listed in `not_authoritative`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// The run.
    pub run_id: RunId,
    /// The lowest epoch kept.
    pub floor_generation: Generation,
    /// SHA-256 of that epoch's canonical bytes: where `verify` starts the chain.
    pub floor_epoch_hash: Digest,
    /// The log tail when the checkpoint was computed.
    pub through_sequence: u64,
    /// SHA-256 of event `through_sequence` (OQ-8): `verify` checks it, so a log rewritten
    /// or cut below the checkpoint is found. **Absent when `None`** (an empty log, or a
    /// checkpoint written before it existed), never `null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through_hash: Option<Digest>,
    /// Sequences `<= through_sequence` whose events do not count (strictly increasing).
    pub not_authoritative: Vec<u64>,
    /// The first sequence `<= through_sequence` whose event this checkpoint did not judge
    /// (its generation was at or above the floor, so its epoch and cutoff were kept): the
    /// next prune that moves the floor past that generation reads the log again from
    /// here (PROTOCOL §7.10 step 7). **Absent when `None`** (every event up to
    /// `through_sequence` judged, or a checkpoint written before it existed), never `null`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unjudged_from: Option<u64>,
    /// When.
    pub created_at: Timestamp,
    /// Who.
    pub created_by: Identity,
}

impl Record for Checkpoint {
    const KIND: RecordKind = RecordKind::Checkpoint;
    const VERSION: &'static str = "runlease/checkpoint/1";
    fn validate(&self) -> Result<(), String> {
        let mut prev = 0u64;
        for &s in &self.not_authoritative {
            if s <= prev || s > self.through_sequence {
                return Err(format!(
                    "not_authoritative must be strictly increasing sequences in 1..={}",
                    self.through_sequence
                ));
            }
            prev = s;
        }
        if self.through_sequence == 0 && self.through_hash.is_some() {
            return Err("through_hash needs an event: through_sequence is 0".into());
        }
        if let Some(u) = self.unjudged_from
            && (u == 0 || u > self.through_sequence)
        {
            return Err(format!(
                "unjudged_from must be a sequence in 1..={}",
                self.through_sequence
            ));
        }
        Ok(())
    }
    fn run_id(&self) -> Option<&RunId> {
        Some(&self.run_id)
    }
}

/// A verified-prefix mark of the event log: `lease/marks/<through_sequence>.json`
/// (PROTOCOL §13.1, issue #33). Whoever wrote it had checked events `1..=through_sequence`
/// link by link (from the mark before it, by induction) and found event
/// `through_sequence` hashing to `through_hash`, and had made `events/` durable first.
/// `append`, `run`, `status` and the admission of a new owner check the log only from the
/// newest mark on (its event's hash first); `verify` and `doctor` still check it all, every
/// mark included, so tampering below a mark is found there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifiedMark {
    /// The run.
    pub run_id: RunId,
    /// The last event of the verified prefix.
    pub through_sequence: Sequence,
    /// SHA-256 of that event's canonical bytes.
    pub through_hash: Digest,
    /// When it was written (writer's wall time; informational, never judged).
    pub verified_at: Timestamp,
    /// Who wrote it.
    pub verified_by: Identity,
}

impl Record for VerifiedMark {
    const KIND: RecordKind = RecordKind::VerifiedMark;
    const VERSION: &'static str = "runlease/verified-mark/1";
    fn validate(&self) -> Result<(), String> {
        self.verified_by.check_word("verified_by")
    }
    fn run_id(&self) -> Option<&RunId> {
        Some(&self.run_id)
    }
}

/// Lifecycle status of a run as written to `run.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// An owner is running it.
    Running,
    /// Stopped on purpose, to be resumed (possibly at `wake_at`).
    Paused,
    /// Finished successfully.
    Done,
    /// Finished with a failure (see `detail`).
    Failed,
}

/// Maximum length of [`RunStatus::detail`].
pub const DETAIL_MAX_BYTES: usize = 4096;

/// The run status record `run.json`, written by the run layer as the current generation only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunStatus {
    /// The run.
    pub run_id: RunId,
    /// Lifecycle status.
    pub status: RunState,
    /// The generation that wrote it.
    pub generation: Generation,
    /// The store head sealed at the last clean release; `null` while live or after a crash.
    pub sealed_sequence: Option<u64>,
    /// When a paused run should be resumed.
    pub wake_at: Option<Timestamp>,
    /// The writer's process.
    pub holder: Option<Holder>,
    /// The writer's last successful heartbeat.
    pub heartbeat_at: Option<Timestamp>,
    /// When the status last changed.
    pub updated_at: Timestamp,
    /// Free text (at most 4096 bytes), e.g. the code of the failure.
    pub detail: Option<String>,
}

impl Record for RunStatus {
    const KIND: RecordKind = RecordKind::RunStatus;
    const VERSION: &'static str = "runlease/run-status/1";
    fn validate(&self) -> Result<(), String> {
        if let Some(h) = &self.holder {
            h.check()?;
        }
        if let Some(d) = &self.detail {
            if d.len() > DETAIL_MAX_BYTES {
                return Err(format!("detail is longer than {DETAIL_MAX_BYTES} bytes"));
            }
        }
        if self.wake_at.is_some() && self.status != RunState::Paused {
            return Err("wake_at is only allowed on a paused run".into());
        }
        Ok(())
    }
    fn run_id(&self) -> Option<&RunId> {
        Some(&self.run_id)
    }
}

/// A child command started by an owner, recorded before it can do any work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandRecord {
    /// The run.
    pub run_id: RunId,
    /// The generation that started it.
    pub generation: Generation,
    /// Its pid.
    pub pid: u32,
    /// Its process group.
    pub pgid: u32,
    /// Its start time in clock ticks since boot.
    pub start_time: u64,
    /// The boot it started in.
    pub boot_id: Identity,
    /// Its argument vector (non-empty).
    pub argv: Vec<String>,
    /// When it was started.
    pub started_at: Timestamp,
    /// [`CommandRecord::incarnation_digest`] of the secret the owner put into the
    /// command's environment (`RUNLEASE_INCARNATION`): the only evidence a later owner
    /// accepts that a live process was started by this run's owner (PROTOCOL §11.1). The
    /// secret itself is never written anywhere. **Absent when `None`** (never `null`), so
    /// records written before it existed still decode; such a record's processes can never
    /// be proved ours and are left alone and reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<Digest>,
    /// The cgroup v2 directory the owner created for its commands and moved this one into
    /// before its program started ([`CommandCgroup`]): the only evidence a later owner
    /// accepts that a leftover cgroup is this run's to kill and remove (PROTOCOL §11.1).
    /// **Absent when `None`** (never `null`): no cgroup (none could be created), or a
    /// record written before it existed; a cgroup named like the run's is then never
    /// killed or removed, only reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CommandCgroup>,
    /// The incarnation's mark ([`CommandMark`]): a sealed memfd every command inherits as
    /// a descriptor, which survives `env -i`, `setsid` and `nohup`; a later owner accepts a
    /// process that holds this very object as proved ours (PROTOCOL §11.1). **Absent when
    /// `None`** (never `null`): a record written before it existed, whose processes are
    /// proved by the environment secret only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mark: Option<CommandMark>,
}

/// The identity of an owner incarnation's mark: an anonymous memory file
/// (`memfd_create`) named [`CommandMark::name_for`] the incarnation digest, holding
/// [`CommandMark::content`] (the run, the generation and that digest) and sealed against
/// any change, that each of the incarnation's commands inherits as a descriptor. A later
/// owner proves a process by finding, among its open descriptors, one whose link names
/// this memfd and whose `(st_dev, st_ino)` and sealed content are these: only a process
/// descended from the owner's commands (or handed the descriptor by one) holds it, so
/// writing a record cannot make an unrelated process carry it. The content binds the
/// object to this run and generation, so an inode number reused or wrapped around, or a
/// mark copied from another run's record, never matches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandMark {
    /// The memfd's name, [`CommandMark::name_for`] the record's incarnation digest.
    pub name: String,
    /// Its `st_dev`.
    pub dev: u64,
    /// Its `st_ino`.
    pub ino: u64,
}

impl CommandMark {
    /// What every mark's name starts with.
    pub const PREFIX: &'static str = "runlease-inc-";

    /// The memfd name of the incarnation whose digest is `digest`: [`CommandMark::PREFIX`]
    /// and the digest's first 16 hex digits.
    pub fn name_for(digest: &Digest) -> String {
        let hex = digest.as_str();
        format!("{}{}", Self::PREFIX, hex.get(..16).unwrap_or(hex))
    }

    /// The sealed content of the mark of `run`'s owner at `generation` whose incarnation
    /// digest is `digest`.
    pub fn content(run: &RunId, generation: Generation, digest: &Digest) -> Vec<u8> {
        format!(
            "runlease/mark/1\n{}\n{}\n{}\n",
            run.as_str(),
            generation.get(),
            digest.as_str()
        )
        .into_bytes()
    }
}

/// The identity of the cgroup v2 directory an owner created for its commands, as it was
/// when the owner created it: the kernel's cgroup id (on cgroup2 the directory's inode
/// number, unique for the boot) and the uid that owns the directory. A later owner acts on
/// a leftover cgroup (`cgroup.kill`, `rmdir`) only when a directory below its own cgroup,
/// named like the run's for the record's generation, has exactly this id and owner, and
/// that owner is its own effective uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandCgroup {
    /// The cgroup id (the directory's inode number on cgroup2).
    pub id: u64,
    /// The uid that owns the directory.
    pub uid: u32,
}

impl CommandRecord {
    /// The digest a record carries for the secret `secret` of an owner of `run` at
    /// `generation`: SHA-256 over a fixed label, the run id, the generation and the secret,
    /// so a digest copied from another run or generation never matches.
    pub fn incarnation_digest(run: &RunId, generation: Generation, secret: &str) -> Digest {
        Digest::of(
            format!(
                "runlease/incarnation/1\n{}\n{}\n{secret}",
                run.as_str(),
                generation.get()
            )
            .as_bytes(),
        )
    }
}

impl Record for CommandRecord {
    const KIND: RecordKind = RecordKind::Command;
    const VERSION: &'static str = "runlease/command/1";
    fn validate(&self) -> Result<(), String> {
        if self.pid <= 1 || self.pgid <= 1 {
            return Err("pid and pgid must be > 1".into());
        }
        if self.pgid != self.pid {
            // Every command is started as the leader of its own process group; a record
            // naming another group would make a reaper signal processes it never started.
            return Err(format!(
                "pgid {} differs from pid {}: a command leads its own process group",
                self.pgid, self.pid
            ));
        }
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err("argv must be non-empty with a non-empty program".into());
        }
        if self.cgroup.is_some_and(|c| c.id <= 1) {
            // 0 is no inode; 1 is the root cgroup, which no owner creates.
            return Err("cgroup.id must be > 1 (a cgroup the owner created)".into());
        }
        if let Some(m) = &self.mark {
            // The mark's content is bound to the incarnation digest: no digest, no mark.
            match &self.incarnation {
                Some(d) if m.name == CommandMark::name_for(d) => {}
                Some(_) => return Err("mark.name is not the incarnation digest's".into()),
                None => return Err("a mark needs an incarnation digest".into()),
            }
        }
        Ok(())
    }
    fn run_id(&self) -> Option<&RunId> {
        Some(&self.run_id)
    }
}

/// One event of the run's log: `events/<sequence>.json`, immutable once created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// The run.
    pub run_id: RunId,
    /// Position in the log (1-based, no gaps).
    pub sequence: Sequence,
    /// The writer's generation (its fencing token).
    pub generation: Generation,
    /// The writer's owner id.
    pub owner_id: Identity,
    /// Event type (an identity: non-empty, trimmed, printable).
    #[serde(rename = "type")]
    pub event_type: Identity,
    /// Arbitrary JSON.
    pub payload: serde_json::Value,
    /// Writer's wall time.
    pub timestamp: Timestamp,
    /// SHA-256 of the event before it; `null` only for sequence 1.
    pub prev_hash: Option<Digest>,
}

impl Record for Event {
    const KIND: RecordKind = RecordKind::Event;
    const VERSION: &'static str = "runlease/event/1";
    fn validate(&self) -> Result<(), String> {
        self.owner_id.check_word("owner_id")?;
        match (self.sequence.get() == 1, &self.prev_hash) {
            (true, Some(_)) => Err("sequence 1 must have prev_hash null".into()),
            (false, None) => Err("prev_hash is required above sequence 1".into()),
            _ => Ok(()),
        }
    }
    fn run_id(&self) -> Option<&RunId> {
        Some(&self.run_id)
    }
}
