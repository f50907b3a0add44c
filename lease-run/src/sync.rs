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

/// Lock `m`, ignoring poison: a panic while a lock was held leaves state that is still
/// consistent (every critical section here writes whole values), and the fence must keep
/// working after a panicking thread.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`lock`] for a `std::sync::Mutex` outside the loom models (the run handle's state).
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn lock_std<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
