//! The one place lease-run takes its synchronization primitives from for the state shared
//! by the heartbeat task, the watchdog thread, commits and release ([`crate::fence`]):
//! `std::sync` normally, `loom::sync` when built with `RUSTFLAGS="--cfg loom"` (as tokio
//! does), so the loom models in `fence.rs` explore every interleaving of exactly the code
//! that runs. `cargo xtask loom` runs them.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
