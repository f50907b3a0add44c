//! The clocks and the randomness lease-run reads, in one place (lease-core reads none: they
//! come in as arguments): `CLOCK_BOOTTIME` for every local duration (self-fence, watches,
//! waits), the wall clock for what records carry, and the random words ids are made of.
//!
//! ```
//! let a = lease_run::new_owner_id().unwrap();
//! assert_ne!(a, lease_run::new_owner_id().unwrap());
//! assert!(lease_run::procs::boottime_ns() > 0);
//! assert!(lease_run::wall_now().is_ok());
//! ```

use crate::error::RunError;
use lease_core::{Identity, Timestamp};

/// `CLOCK_BOOTTIME` in nanoseconds: monotonic and counting time spent suspended (the same
/// reading lease-fs answers the core's `Request::Monotonic` with). 0 if the clock cannot
/// be read: a window then reads as empty, never as a pause.
pub fn boottime_ns() -> u64 {
    lease_fs::run_dir::boottime_ns()
}

/// Wall-clock now as a protocol timestamp.
/// (`lease_fs::WallClock`'s `Timestamp::now()` with the run layer's error.)
pub fn wall_now() -> Result<Timestamp, RunError> {
    <Timestamp as lease_fs::WallClock>::now().map_err(|e| RunError::Io(e.to_string()))
}

/// 128 random bits from the system as 32 lowercase hex digits: an owner id's, an
/// incarnation secret's or a socket name's random part. `IO_ERROR` only when the system's
/// randomness cannot be read.
pub(crate) fn random_hex128() -> Result<String, RunError> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| RunError::Io(format!("random: {e}")))?;
    Ok(hex::encode(b))
}

/// A fresh random owner id, unique per acquisition (PROTOCOL §1): `run-` and 128 random
/// bits as 32 lowercase hex digits, the one owner-id form runlease makes (its owners,
/// `takeover` and `retire`), a word ([`Identity::check_word`]) as every record requires.
/// `IO_ERROR` only when the system's randomness cannot be read.
///
/// ```
/// let id = lease_run::new_owner_id().unwrap();
/// assert!(id.as_str().starts_with("run-") && id.as_str().len() == 36);
/// assert!(id.check_word("owner id").is_ok());
/// ```
pub fn new_owner_id() -> Result<Identity, RunError> {
    Identity::word("owner id", format!("run-{}", random_hex128()?))
        .map_err(|e| RunError::Io(format!("owner id: {e}")))
}
