//! # lease-etcd: the runlease lease with an etcd cluster as its authority
//!
//! For runs whose owners live on different machines: the epoch chain, heartbeats,
//! cutoffs, intents and the event log are keys under a per-run prefix in etcd instead of
//! files in a run folder, and liveness is an etcd lease. The protocol is not re-implemented:
//! [`EtcdRun`] is a lease-core [`Transport`](lease_core::Transport): the one implementation
//! of every operation ([`LeaseOps`](lease_core::LeaseOps)) runs on it as on lease-fs's
//! `RunDir`, each [`Request`](lease_core::ops::Request) answered with etcd calls
//! (see [`run`] for the mapping, the epoch guard and the timing argument). The fencing token
//! stays the generation; the run's data (its SQLite store) stays on its own disk.
//!
//! ```no_run
//! use lease_etcd::{AuthorityAddr, EtcdAuthority, EtcdOptions};
//! use lease_core::ops::{ClaimParams, ReleaseParams};
//! use lease_core::{Holder, Identity, LeaseOps, RunId, Timestamp, TimingPolicy};
//!
//! let addr = AuthorityAddr::parse("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/runlease")?;
//! let authority = EtcdAuthority::connect(&addr, EtcdOptions::default())?;
//! let run = authority.run(RunId::new("nightly-build")?);
//! let holder = Holder {
//!     host: Identity::new("builder-7").unwrap(),
//!     boot_id: Identity::new("3f1c").unwrap(),
//!     pid: 4242,
//!     start_time: 99,
//! };
//! let now = Timestamp::parse("2026-12-02T12:00:00.000Z").unwrap();
//! let lease = run.claim(ClaimParams {
//!     run_id: run.run_id().clone(),
//!     owner_id: Identity::new("owner-1").unwrap(),
//!     holder,
//!     policy: TimingPolicy::default(),
//!     now,
//!     store_floor: None,
//! })?;
//! run.heartbeat(&lease, now, 1, None)?;
//! run.release(ReleaseParams { lease, now, seal: None })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(missing_docs)]

pub mod addr;
pub mod error;
pub mod run;

pub use addr::AuthorityAddr;
pub use error::{ETCD_ERROR_CODES, EtcdError};
pub use run::{EtcdAuthority, EtcdOptions, EtcdRun, lease_ttl_secs, self_fence_deadline};
