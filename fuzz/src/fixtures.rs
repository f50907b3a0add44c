//! Fixed identities, times and liveness answers shared by the targets.

use lease_core::ops::{AuthorityLease, LivenessEvidence, LockEvidence, ProcessState};
use lease_core::{Holder, Identity, RunId, Timestamp};

/// The run every target works on.
pub fn run_id() -> RunId {
    RunId::new("run-1").expect("valid run id")
}

/// An identity from a literal known to be valid.
pub fn id(s: &str) -> Identity {
    Identity::new(s).expect("valid identity literal")
}

/// Milliseconds of 2026-12-02T00:00:00.000Z, the base of every fuzzed clock.
pub const T0_MS: u64 = 1_796_169_600_000;

/// `T0 + ms`, saturating at the last representable timestamp.
pub fn t(ms: u64) -> Timestamp {
    Timestamp::EPOCH.plus_millis(T0_MS.saturating_add(ms))
}

/// The boot every simulated process runs in.
pub const BOOT: &str = "boot-a";

/// A holder on host `host-a`, boot [`BOOT`], with a start time derived from the pid.
pub fn holder(pid: u32) -> Holder {
    Holder {
        host: id("host-a"),
        boot_id: id(BOOT),
        pid,
        start_time: 5000 + u64::from(pid),
    }
}

/// What a liveness probe answers about any holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveMode {
    /// Running with the recorded start time, lock held.
    Alive,
    /// Gone, lock free: definitely dead (on the same boot).
    Dead,
    /// Nothing is known.
    Unknown,
    /// The observer runs in another boot than the holder.
    OtherBoot,
}

impl LiveMode {
    /// From two bits.
    pub fn from_bits(b: u8) -> LiveMode {
        match b & 3 {
            0 => LiveMode::Alive,
            1 => LiveMode::Dead,
            2 => LiveMode::Unknown,
            _ => LiveMode::OtherBoot,
        }
    }

    /// The two bits of [`LiveMode::from_bits`].
    pub fn bits(self) -> u8 {
        match self {
            LiveMode::Alive => 0,
            LiveMode::Dead => 1,
            LiveMode::Unknown => 2,
            LiveMode::OtherBoot => 3,
        }
    }

    /// The evidence a probe of `h` returns.
    pub fn evidence(self, h: &Holder) -> LivenessEvidence {
        match self {
            LiveMode::Alive => LivenessEvidence {
                observer_boot_id: h.boot_id.clone(),
                process: ProcessState::Running {
                    start_time: h.start_time,
                },
                owner_lock: LockEvidence::Held,
                lease: AuthorityLease::NotKept,
            },
            LiveMode::Dead => LivenessEvidence {
                observer_boot_id: h.boot_id.clone(),
                process: ProcessState::Gone,
                owner_lock: LockEvidence::Free,
                lease: AuthorityLease::NotKept,
            },
            LiveMode::Unknown => LivenessEvidence {
                observer_boot_id: h.boot_id.clone(),
                process: ProcessState::Unknown,
                owner_lock: LockEvidence::Unknown,
                lease: AuthorityLease::NotKept,
            },
            LiveMode::OtherBoot => LivenessEvidence {
                observer_boot_id: id("boot-other"),
                process: ProcessState::Gone,
                owner_lock: LockEvidence::Free,
                lease: AuthorityLease::NotKept,
            },
        }
    }
}
