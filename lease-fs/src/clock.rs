//! The wall clock, read on the adapter side (lease-core never reads a clock):
//! [`WallClock::now`] gives `Timestamp::now()` once the trait is in scope.
//!
//! ```
//! use lease_core::Timestamp;
//! use lease_fs::WallClock;
//! let now = Timestamp::now()?;
//! assert!(now > Timestamp::parse("2020-01-01T00:00:00.000Z")?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use lease_core::Timestamp;
use std::time::{SystemTime, UNIX_EPOCH};

/// The wall clock cannot be expressed as a protocol [`Timestamp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClockError {
    /// The system clock reads before 1970-01-01.
    #[error("the wall clock is before 1970")]
    BeforeEpoch,
    /// The system clock reads past 9999-12-31.
    #[error("the wall clock is past the year 9999")]
    OutOfRange,
}

/// `Timestamp::now()`: this host's wall clock as a protocol timestamp (ms, UTC).
pub trait WallClock: Sized {
    /// Now, from the system clock.
    fn now() -> Result<Self, ClockError>;
}

impl WallClock for Timestamp {
    fn now() -> Result<Timestamp, ClockError> {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|_| ClockError::BeforeEpoch)?
            .as_millis();
        u64::try_from(ms)
            .ok()
            .and_then(Timestamp::from_unix_millis)
            .ok_or(ClockError::OutOfRange)
    }
}
