//! # lease-run — the run lifecycle for runlease (NOT IMPLEMENTED YET)
//!
//! **Status: skeleton.** This crate contains no working code yet. It opens no
//! run, starts no command, runs no timer and reaps nothing today. Do not depend on
//! it for anything but its [`STATUS`] constant.
//!
//! What this crate **will** hold, once its issue lands (see `ARCHITECTURE.md`,
//! section 2), composed on tokio from `lease-core`, `lease-fs` and `lease-sqlite`:
//!
//! - **Open:** take the kernel owner lock, claim or take over the lease, write run
//!   status `running` with generation + 1, start the heartbeat, lay out the run,
//!   open the store and pass its seal check, then go live.
//! - **Self-fence and watchdog:** a self-fence timer plus a watchdog OS thread so
//!   an owner that can no longer prove its lease stops acting.
//! - **Child commands:** each in its own process group, recorded before it
//!   starts, killed on fence.
//! - **Release:** stop commands, barrier, seal, final status, unlock.
//! - **Reaping:** clean up a killed incarnation's commands, or refuse to open
//!   beside a survivor.
//! - **Observable step timings.**
//!
//! # Example
//!
//! The only thing this skeleton offers is an honest status string:
//!
//! ```
//! assert!(lease_run::STATUS.contains("not implemented yet"));
//! ```

/// Implementation status of this crate: it is a placeholder with no functionality.
pub const STATUS: &str = "lease-run skeleton: not implemented yet";
