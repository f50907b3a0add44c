//! # lease-sqlite — the sequenced SQLite store for runlease (NOT IMPLEMENTED YET)
//!
//! **Status: skeleton.** This crate contains no working code yet. It opens no
//! database, checks no fencing token and seals nothing today. Do not depend on it
//! for anything but its [`STATUS`] constant.
//!
//! What this crate **will** hold, once its issue lands (see `ARCHITECTURE.md`,
//! section 2):
//!
//! - **A sequenced store on rusqlite:** every commit gets the next sequence number
//!   and carries the writer's fencing token; `head()` returns the last committed
//!   sequence.
//! - **The fencing-token check** (Kleppmann): a commit whose token is lower than
//!   the highest token the store has accepted is refused, inside the same
//!   transaction as the write.
//! - **The seal check:** a store that is behind its seal is reported, not used.
//! - **Chosen and documented durability settings** (`synchronous`, WAL or rollback
//!   journal), backed by a crash test.
//!
//! # Example
//!
//! The only thing this skeleton offers is an honest status string:
//!
//! ```
//! assert!(lease_sqlite::STATUS.contains("not implemented yet"));
//! ```

/// Implementation status of this crate: it is a placeholder with no functionality.
pub const STATUS: &str = "lease-sqlite skeleton: not implemented yet";
