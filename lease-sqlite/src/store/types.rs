//! The values a store is opened with, commits and reads back.

use lease_core::Identity;

/// The most one commit may hold: its encoded writes (keys and values, 9 bytes of framing
/// per put) plus its log entries. [`crate::Store::commit`] refuses a larger batch
/// (`ARGUMENT_INVALID`, nothing written), and a reader refuses a stored value, commit or
/// log entry above it as `STORE_CORRUPT` (SQLite's `SQLITE_LIMIT_LENGTH` is set to it on
/// every connection), so no single read of a store holds more than this in memory. The
/// store socket's 16 MiB frame carries values as hex, so what it can commit is below it.
pub const MAX_COMMIT_BYTES: usize = 16 << 20;

/// How to open a store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// Create the store (and its missing parent folders, mode 0700) if the file does not
    /// exist. An existing file is never recreated, whatever it contains.
    pub create: bool,
    /// The store the caller expects to find (for example the store id of the run's last
    /// seal). A different store id is refused with `STORE_IDENTITY_MISMATCH`, and a missing
    /// file with `STORE_MISSING` even when `create` is set: a new, empty store is never
    /// created in place of an expected one.
    pub expect: Option<Expected>,
}

impl StoreOptions {
    /// The options the lease chain's requirements call for: a new store is created only
    /// when the chain names none, and the sealed store's identity is expected when it
    /// names one (so a missing or replaced store is refused, never silently recreated).
    pub fn for_chain(req: &lease_core::seal::Requirements) -> StoreOptions {
        StoreOptions {
            create: req.names_no_store(),
            expect: req.seal().map(|s| Expected {
                store_id: s.store_id.clone(),
            }),
        }
    }
}

/// What the caller expects the store to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// The identity created with the store.
    pub store_id: Identity,
}

/// One keyed document write of a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Set `key` to `value`.
    Put {
        /// The key.
        key: String,
        /// The new value.
        value: Vec<u8>,
    },
    /// Remove `key` (nothing happens if it does not exist).
    Delete {
        /// The key.
        key: String,
    },
}

/// The writes of one commit, applied in order (a later write to the same key wins), plus
/// log entries recorded with the commit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Document writes, in order.
    pub writes: Vec<Write>,
    /// Log entries, in order.
    pub log: Vec<Vec<u8>>,
}

impl Batch {
    /// An empty batch (committing it still takes a sequence number and records the token).
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Add a put of `key`.
    pub fn put(mut self, key: impl Into<String>, value: impl Into<Vec<u8>>) -> Batch {
        self.writes.push(Write::Put {
            key: key.into(),
            value: value.into(),
        });
        self
    }

    /// Add a delete of `key`.
    pub fn delete(mut self, key: impl Into<String>) -> Batch {
        self.writes.push(Write::Delete { key: key.into() });
        self
    }

    /// Add a log entry.
    pub fn log(mut self, entry: impl Into<Vec<u8>>) -> Batch {
        self.log.push(entry.into());
        self
    }
}

impl From<&lease_core::store_log::RecordBatch> for Batch {
    /// The batch a record of the engine's store log carries, as a commit of a view applies
    /// it ([`crate::Store::apply_record`]): a write with a value is a put, one without a
    /// delete; the log entries as they are. (The batch's id stays in the engine's record.)
    fn from(b: &lease_core::store_log::RecordBatch) -> Batch {
        Batch {
            writes: b
                .writes
                .iter()
                .map(|w| match &w.value {
                    Some(v) => Write::Put {
                        key: w.key.clone(),
                        value: v.0.clone(),
                    },
                    None => Write::Delete { key: w.key.clone() },
                })
                .collect(),
            log: b.log.iter().map(|e| e.0.clone()).collect(),
        }
    }
}

/// A document as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// Its key.
    pub key: String,
    /// Its value.
    pub value: Vec<u8>,
    /// The sequence of the commit that last wrote it.
    pub updated_seq: u64,
}

/// One committed batch, as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    /// Its sequence number (1, 2, 3, ... without gaps).
    pub seq: u64,
    /// The fencing token (generation) of its writer.
    pub token: u64,
    /// When it was committed (the writer's wall clock, `YYYY-MM-DDTHH:MM:SS.mmmZ`).
    pub committed_at: String,
    /// Its writes, in order.
    pub writes: Vec<Write>,
    /// Its log entries, in order.
    pub log: Vec<Vec<u8>>,
}
