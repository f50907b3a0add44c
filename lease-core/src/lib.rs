//! # lease-core: the runlease protocol, without I/O
//!
//! The pure state machine of runlease: strict records with one canonical byte form, hash
//! chains, validation, the timing policy, and every protocol operation (claim, heartbeat,
//! release, exact takeover, dead-owner retirement, append, authoritative reads, prune,
//! verify, self-fence, seal check) as a step machine that asks its caller for each I/O
//! request and never performs one itself. No file system, no processes, no clock, no
//! randomness: wall time, monotonic readings and ids are arguments. The normative
//! description is `docs/PROTOCOL.md`.
//!
//! ```
//! use lease_core::ops::{drive, Claim, ClaimParams, Request, Response};
//! use lease_core::{Holder, Identity, RunId, Timestamp, TimingPolicy};
//! use std::collections::BTreeMap;
//!
//! // A toy in-memory "disk": enough to drive a claim.
//! let mut disk: BTreeMap<lease_core::FileRef, Vec<u8>> = BTreeMap::new();
//! let mut claim = Claim::new(ClaimParams {
//!     run_id: RunId::new("demo")?,
//!     owner_id: Identity::new("owner-a").unwrap(),
//!     holder: Holder {
//!         host: Identity::new("host").unwrap(),
//!         boot_id: Identity::new("boot-1").unwrap(),
//!         pid: 42,
//!         start_time: 7,
//!     },
//!     policy: TimingPolicy::default(),
//!     now: Timestamp::parse("2026-12-02T12:00:00.000Z").unwrap(),
//!     store_floor: None,
//! });
//! let lease = drive(&mut claim, |req| -> Result<Response, lease_core::LeaseError> {
//!     Ok(match req {
//!         Request::List(dir) => Response::Listing(
//!             disk.keys().filter(|f| f.dir() == Some(dir)).copied().collect(),
//!         ),
//!         Request::Read(f) => Response::Content(disk.get(&f).cloned()),
//!         Request::CreateExclusive(f, bytes) => {
//!             if disk.contains_key(&f) {
//!                 Response::AlreadyExists
//!             } else {
//!                 disk.insert(f, bytes);
//!                 Response::Created
//!             }
//!         }
//!         other => unreachable!("a claim on an empty run does not ask {other:?}"),
//!     })
//! })?;
//! assert_eq!(lease.generation.get(), 1);
//! assert!(disk.contains_key(&lease_core::FileRef::Epoch(lease.generation)));
//! # Ok::<(), lease_core::LeaseError>(())
//! ```
//!
//! The same through [`LeaseOps`] on the in-memory transport ([`mem::MemTransport`]), with
//! a dead owner retired and its late append fenced: `examples/in_memory.rs`
//! (`cargo run -p lease-core --example in_memory`). Errors are typed ([`LeaseError`], with
//! a stable [`Code`]); constructors refuse bad values with [`InvalidValue`].
#![deny(missing_docs)]

pub mod beat;
pub mod canonical;
pub mod code;
pub mod diagnose;
pub mod error;
#[cfg(feature = "ghost")]
pub mod ghost;
pub mod ids;
mod invalid;
pub mod layout;
pub mod mem;
pub mod mutant;
pub mod ops;
pub mod policy;
pub mod records;
pub mod rollback;
pub mod seal;
pub mod store_log;
pub mod time;
pub mod transport;
pub mod trust;
pub mod watch;

pub use canonical::{Record, decode, decode_for, encode};
pub use code::{Code, ETCD_ERROR_CODES};
pub use error::{ERROR_CODES, HeldBy, LeaseError, RecordKind};
pub use ids::{Digest, Generation, Identity, InvalidValue, RunId, Sequence};
pub use layout::{Dir, FileRef};
pub use policy::{HeartbeatDurability, TimingPolicy, lapse_reason, must_self_fence};
pub use records::{
    Checkpoint, CommandCgroup, CommandMark, CommandRecord, EpochRecord, EpochState, Event,
    HeartbeatRecord, Holder, MonoStamp, Observation, RetireReason, RetiredOwner, RetirementRecord,
    RunState, RunStatus, Seal, TakeoverIntent, TakeoverMode,
};
pub use time::Timestamp;
pub use transport::{LeaseOps, TailHint, Transport};
