//! # lease-fs: the runlease protocol on a POSIX disk
//!
//! The file-system adapter of runlease. It drives the sans-IO operations of
//! [`lease_core`] over a run folder:
//!
//! - [`fs::Fs`], the seam: the few system calls the protocol needs, relative to a held
//!   descriptor of the run root; [`RealFs`] implements it with `openat2`-style calls that
//!   never follow a symlink, and `SimFs` (feature `sim`) simulates it for crash tests (data durable only
//!   after fsync, directory entries only after fsync of their directory, torn writes,
//!   failing the N-th call). RECHECK's listing of `lease/epochs` (every heartbeat) is
//!   replayed while an inotify watch on that folder has queued nothing, on local disk file
//!   systems only ([`listing`]).
//! - [`primitives`]: link-exclusive create, atomic replace, remove, orphan temp cleanup, each
//!   with its order of writes and fsyncs.
//! - [`RunDir`]: the run folder as a lease-core [`Transport`](lease_core::Transport), so
//!   every operation of [`LeaseOps`](lease_core::LeaseOps) runs on it: the lease (claim,
//!   heartbeat, release, exact takeover, dead-owner retirement, prune, status) and the event
//!   log (append, authoritative read, verify).
//! - [`lock::OwnerLock`]: the kernel owner lock (`flock`), released by the kernel when the
//!   owner dies; [`probe`]: boot id and process start times for liveness evidence.
//!
//! ```
//! use lease_fs::{RunDir, this_holder};
//! use lease_core::ops::{AppendParams, ClaimParams, ReleaseParams};
//! use lease_core::{Identity, LeaseOps, Timestamp, TimingPolicy};
//!
//! let dir = tempfile::tempdir()?;
//! let run = RunDir::create(&dir.path().join("demo-run"))?;
//! let now = Timestamp::parse("2026-12-02T12:00:00.000Z").unwrap();
//! let lease = run.claim(ClaimParams {
//!     run_id: run.run_id().clone(),
//!     owner_id: Identity::new("owner-1").unwrap(),
//!     holder: this_holder()?,
//!     policy: TimingPolicy::default(),
//!     now,
//!     store_floor: None,
//! })?;
//! let ev = run.append(&lease, AppendParams {
//!     event_type: Identity::new("step.done").unwrap(),
//!     payload: serde_json::json!({"n": 1}),
//!     now,
//!     tail_hint: None,
//! })?;
//! assert_eq!(ev.sequence.get(), 1);
//! run.release(ReleaseParams { lease, now, seal: None })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! To hold a run as one process, prefer [`OwnedRun`]: the claim and the kernel owner lock
//! in one guard, heartbeats numbered for you under the self-fence rule;
//! `Timestamp::now()` comes from [`WallClock`]. A claim, a crash and a retirement, end to
//! end: `examples/claim_crash_retire.rs` (`cargo run -p lease-fs --example
//! claim_crash_retire`).
#![deny(missing_docs)]

pub mod clock;
mod crash;
pub mod error;
pub mod fs;
pub mod fstype;
pub mod listing;
pub mod lock;
pub mod owned;
pub mod primitives;
pub mod probe;
pub mod real;
pub mod run_dir;
// The simulated crash file system (feature `sim`): for this project's model checker,
// crash tests and fuzz targets, not for production use.
#[cfg(feature = "sim")]
pub mod sim;
mod trust;

pub use clock::{ClockError, WallClock};
pub use error::{FS_ERROR_CODES, FsError};
pub use owned::OwnedRun;
pub use real::{RealFs, is_run_folder};
pub use run_dir::{
    Found, Initialized, LAYOUT_DIRS, Liveness, ProcLiveness, RunDir, run_id_held, run_id_of,
    this_holder,
};
#[cfg(feature = "sim")]
pub use sim::SimFs;
