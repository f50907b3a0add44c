//! The engine-committed store's records (PROTOCOL.md §18, issue #32).
//!
//! With an engine (etcd) as the run's authority, the run's store follows its lease: every
//! group commit becomes one immutable [`StoreRecord`] in the engine, created by one guarded
//! request ([`crate::ops::Request::CreateGuarded`]: the slot is free **and** no epoch above
//! the writer's generation exists), and the owner's SQLite file is only a local view,
//! rebuilt from the newest [`SnapshotManifest`] and the records after it. This module holds
//! the records and their rules; the step machines are in [`crate::ops`]
//! ([`crate::ops::CommitRecord`], [`crate::ops::ReadStoreLog`]).
//!
//! ```
//! use lease_core::store_log::{Blob, RecordBatch, RecordWrite, StoreRecord};
//! use lease_core::{Generation, Identity, RunId, Sequence, Timestamp};
//!
//! let record = StoreRecord {
//!     run_id: RunId::new("job").unwrap(),
//!     sequence: Sequence::new(1).unwrap(),
//!     generation: Generation::new(1).unwrap(),
//!     owner_id: Identity::new("owner-1").unwrap(),
//!     prev_hash: None,
//!     first_commit: Sequence::new(1).unwrap(),
//!     timestamp: Timestamp::from_unix_millis(1_000).unwrap(),
//!     batches: vec![RecordBatch {
//!         id: Identity::new("c-1").unwrap(),
//!         writes: vec![RecordWrite { key: "k".into(), value: Some(Blob(b"v".to_vec())) }],
//!         log: vec![],
//!     }],
//! };
//! let bytes = lease_core::encode(&record).unwrap();
//! let back: StoreRecord = lease_core::decode(&bytes).unwrap();
//! assert_eq!(back, record);
//! assert_eq!(record.last_commit(), 1);
//! ```

use crate::canonical::Record;
use crate::error::RecordKind;
use crate::ids::{Digest, Generation, Identity, RunId, Sequence};
use crate::time::Timestamp;
use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The largest encoded store record: it must fit one engine request (etcd's default
/// `--max-request-bytes` is 1.5 MiB; the record's key and the transaction's compares take
/// the rest). Equal to the protocol's record limit ([`crate::canonical::MAX_RECORD_BYTES`]).
pub const MAX_STORE_RECORD_BYTES: usize = crate::canonical::MAX_RECORD_BYTES;

/// The largest snapshot chunk (PROTOCOL.md §18.5): one engine request each.
pub const MAX_CHUNK_BYTES: usize = 1 << 20;

/// The most chunks one snapshot may have (`<index:06>` in the name): a 976 GiB image.
pub const MAX_CHUNKS: u32 = 999_999;

/// An upper bound on what a record holds besides its batches (run id, owner id, hash,
/// timestamp, field names), used to pack a group of batches into records
/// ([`pack_batches`]); the commit machine checks the exact size.
pub const RECORD_OVERHEAD_BYTES: usize = 1024;

/// The default byte budget of one run's store in the engine (PROTOCOL.md §18.6): its newest
/// snapshot and the records after it.
pub const DEFAULT_BUDGET_BYTES: u64 = 64 << 20;

/// Bytes, carried in a record as standard base64 with padding (RFC 4648 §4). Decoding is
/// strict: non-zero trailing bits and missing padding are refused, so each byte string has
/// exactly one text (the canonical-form check of §3 step 6 relies on it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Blob(pub Vec<u8>);

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Blob, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map(Blob)
            .map_err(|e| serde::de::Error::custom(format!("not standard base64: {e}")))
    }
}

/// One document write of a commit: a put (`value` set) or a delete (`value` null).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordWrite {
    /// The document's key (any UTF-8 string).
    pub key: String,
    /// The new value; `None` deletes the key.
    pub value: Option<Blob>,
}

/// One client commit inside a record: its id, its writes in order, its log entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordBatch {
    /// The commit's id (a word, chosen by its writer): how a writer whose answer was lost
    /// recognizes its own commit in the log.
    pub id: Identity,
    /// Document writes, in order.
    pub writes: Vec<RecordWrite>,
    /// Log entries, in order.
    pub log: Vec<Blob>,
}

impl RecordBatch {
    /// The length of this batch's canonical encoding inside a record (exact).
    pub fn encoded_len(&self) -> usize {
        let mut out = Vec::new();
        match serde_json::to_value(self) {
            Ok(v) => crate::canonical::write_value(&v, &mut out),
            Err(_) => return usize::MAX,
        }
        out.len()
    }
}

/// One group commit of the engine-committed store: `store/log/<sequence:020>.json`,
/// immutable once created (PROTOCOL.md §18.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreRecord {
    /// The run.
    pub run_id: RunId,
    /// Its position in the record log (1-based, no gaps).
    pub sequence: Sequence,
    /// The writer's generation (its fencing token; the guard refused it once a newer epoch
    /// existed).
    pub generation: Generation,
    /// The writer's owner id.
    pub owner_id: Identity,
    /// SHA-256 of record `sequence − 1`; `null` only for sequence 1.
    pub prev_hash: Option<Digest>,
    /// The store sequence of its first batch: batches are numbered 1, 2, … across the
    /// whole log, as the local store numbers its commits.
    pub first_commit: Sequence,
    /// The writer's wall time (informative: no decision reads it).
    pub timestamp: Timestamp,
    /// The client commits, in order (at least one).
    pub batches: Vec<RecordBatch>,
}

impl StoreRecord {
    /// The store sequence of its last batch.
    pub fn last_commit(&self) -> u64 {
        let n = u64::try_from(self.batches.len()).unwrap_or(u64::MAX);
        self.first_commit.get().saturating_add(n).saturating_sub(1)
    }
}

impl Record for StoreRecord {
    const KIND: RecordKind = RecordKind::StoreRecord;
    const VERSION: &'static str = "runlease/store-record/1";
    fn validate(&self) -> Result<(), String> {
        self.owner_id.check_word("owner_id")?;
        match (self.sequence.get() == 1, &self.prev_hash) {
            (true, Some(_)) => return Err("sequence 1 must have prev_hash null".into()),
            (false, None) => return Err("prev_hash is required above sequence 1".into()),
            _ => {}
        }
        if self.batches.is_empty() {
            return Err("a store record holds at least one batch".into());
        }
        if self.sequence.get() == 1 && self.first_commit.get() != 1 {
            return Err("record 1 must start at commit 1".into());
        }
        if self.first_commit.get() < self.sequence.get() {
            return Err(format!(
                "first_commit {} is below the record's sequence {} (every record holds at least one commit)",
                self.first_commit.get(),
                self.sequence.get()
            ));
        }
        for b in &self.batches {
            b.id.check_word("batches.id")?;
        }
        if self.last_commit() == u64::MAX {
            return Err("the commit numbers overflow".into());
        }
        Ok(())
    }
    fn run_id(&self) -> Option<&RunId> {
        Some(&self.run_id)
    }
}

/// A snapshot of the store: `store/snapshots/<through:020>-<nonce:016x>.json`, created
/// after all its chunks (PROTOCOL.md §18.5). Its image is a serialized SQLite database
/// holding the state after record `through`; it lets the records up to `through` be
/// removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotManifest {
    /// The run.
    pub run_id: RunId,
    /// The last record folded into the image.
    pub through: Sequence,
    /// SHA-256 of record `through`: record `through + 1` links to it.
    pub through_hash: Digest,
    /// The store sequence of the last commit in the image (record `through`'s last).
    pub commits: Sequence,
    /// The writer's generation (the guard refused it once a newer epoch existed).
    pub generation: Generation,
    /// The writer's owner id.
    pub owner_id: Identity,
    /// The writer's nonce, as in the file name.
    pub nonce: u64,
    /// SHA-256 of each chunk, in order (chunk `i` is `…-<i:06>.bin`).
    pub chunks: Vec<Digest>,
    /// The image's length in bytes (the sum of the chunks').
    pub size: u64,
    /// The writer's wall time (informative).
    pub timestamp: Timestamp,
}

impl Record for SnapshotManifest {
    const KIND: RecordKind = RecordKind::StoreSnapshot;
    const VERSION: &'static str = "runlease/store-snapshot/1";
    fn validate(&self) -> Result<(), String> {
        self.owner_id.check_word("owner_id")?;
        let n = u64::try_from(self.chunks.len()).unwrap_or(u64::MAX);
        if n == 0 || n > u64::from(MAX_CHUNKS) {
            return Err(format!("a snapshot has 1..={MAX_CHUNKS} chunks, not {n}"));
        }
        let max = n.saturating_mul(MAX_CHUNK_BYTES as u64);
        if self.size > max || self.size <= (n - 1).saturating_mul(MAX_CHUNK_BYTES as u64) {
            return Err(format!(
                "size {} does not need exactly {n} chunks of at most {MAX_CHUNK_BYTES} bytes",
                self.size
            ));
        }
        if self.commits.get() < self.through.get() {
            return Err("commits is below through (every record holds a commit)".into());
        }
        Ok(())
    }
    fn run_id(&self) -> Option<&RunId> {
        Some(&self.run_id)
    }
}

/// Where the record log ends, as its reader found it: what the next commit builds on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoreTail {
    /// The last record and its hash (`None`: no record and no snapshot yet).
    pub last: Option<(Sequence, Digest)>,
    /// The store sequence of the last commit (0: none).
    pub commits: u64,
    /// Bytes the run's store holds in the engine: the newest snapshot's image and the
    /// encoded records after it (what the budget counts).
    pub bytes: u64,
}

impl StoreTail {
    /// The sequence of the next record (1 for an empty log).
    pub fn next_sequence(&self) -> u64 {
        self.last
            .as_ref()
            .map_or(1, |(s, _)| s.get().saturating_add(1))
    }
}

/// Split a group of batches into consecutive runs that each fit one record, greedily, by
/// [`RecordBatch::encoded_len`] plus [`RECORD_OVERHEAD_BYTES`] per record (base64 grows the
/// bytes by a third). Returns the length of each run; a batch too large on its own gets a
/// run of its own, which the commit machine then refuses (`STORE_COMMIT_TOO_LARGE`).
pub fn pack_batches(batches: &[RecordBatch]) -> Vec<usize> {
    let budget = MAX_STORE_RECORD_BYTES.saturating_sub(RECORD_OVERHEAD_BYTES);
    let mut runs = Vec::new();
    let (mut len, mut bytes) = (0usize, 0usize);
    for b in batches {
        let n = b.encoded_len().saturating_add(1);
        if len > 0 && bytes.saturating_add(n) > budget {
            runs.push(len);
            (len, bytes) = (0, 0);
        }
        len += 1;
        bytes = bytes.saturating_add(n);
    }
    if len > 0 {
        runs.push(len);
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, prev: Option<Digest>, first: u64) -> StoreRecord {
        StoreRecord {
            run_id: RunId::new("r").unwrap(),
            sequence: Sequence::new(seq).unwrap(),
            generation: Generation::new(2).unwrap(),
            owner_id: Identity::new("o-2").unwrap(),
            prev_hash: prev,
            first_commit: Sequence::new(first).unwrap(),
            timestamp: Timestamp::from_unix_millis(5).unwrap(),
            batches: vec![RecordBatch {
                id: Identity::new("c1").unwrap(),
                writes: vec![
                    RecordWrite {
                        key: "a\nb".into(),
                        value: Some(Blob(vec![0, 255, 10])),
                    },
                    RecordWrite {
                        key: String::new(),
                        value: None,
                    },
                ],
                log: vec![Blob(b"step".to_vec())],
            }],
        }
    }

    #[test]
    fn a_record_round_trips_and_its_rules_hold() {
        let r = record(1, None, 1);
        let bytes = crate::encode(&r).unwrap();
        assert_eq!(crate::decode::<StoreRecord>(&bytes).unwrap(), r);
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.contains("\"version\":\"runlease/store-record/1\""),
            "{text}"
        );
        assert!(text.contains("\"value\":\"AP8K\""), "{text}");
        // Non-canonical base64 (a trailing bit set, no padding) is refused.
        assert!(text.contains("\"c3RlcA==\""), "{text}");
        for bad in ["c3RlcB==", "c3RlcA", "c3Rl cA=="] {
            let forged = text.replace("c3RlcA==", bad);
            assert!(
                crate::decode::<StoreRecord>(forged.as_bytes()).is_err(),
                "{bad}"
            );
        }
        let h = Digest::of(&bytes);
        assert!(
            crate::encode(&record(2, None, 2)).is_err(),
            "prev_hash needed"
        );
        assert!(crate::encode(&record(1, Some(h.clone()), 1)).is_err());
        assert!(
            crate::encode(&record(1, None, 2)).is_err(),
            "record 1 starts at 1"
        );
        assert!(crate::encode(&record(3, Some(h.clone()), 2)).is_err());
        let mut empty = record(2, Some(h), 2);
        empty.batches.clear();
        assert!(crate::encode(&empty).is_err(), "no batch");
    }

    #[test]
    fn packing_keeps_every_record_under_the_limit() {
        let big = |n: usize| RecordBatch {
            id: Identity::new("c").unwrap(),
            writes: vec![RecordWrite {
                key: "k".into(),
                value: Some(Blob(vec![7; n])),
            }],
            log: vec![],
        };
        let batches: Vec<_> = (0..10).map(|_| big(300_000)).collect();
        let runs = pack_batches(&batches);
        assert_eq!(runs.iter().sum::<usize>(), 10);
        assert_eq!(runs, [1; 10].chunks(2).map(|c| c.len()).collect::<Vec<_>>());
        assert_eq!(pack_batches(&[big(5)]), vec![1]);
        assert_eq!(pack_batches(&[big(2 << 20), big(5)]), vec![1, 1]);
        assert!(pack_batches(&[]).is_empty());
    }

    #[test]
    fn a_manifest_needs_exactly_its_chunks() {
        let m = SnapshotManifest {
            run_id: RunId::new("r").unwrap(),
            through: Sequence::new(4).unwrap(),
            through_hash: Digest::of(b"x"),
            commits: Sequence::new(9).unwrap(),
            generation: Generation::new(2).unwrap(),
            owner_id: Identity::new("o").unwrap(),
            nonce: 7,
            chunks: vec![Digest::of(b"a"), Digest::of(b"b")],
            size: (MAX_CHUNK_BYTES + 1) as u64,
            timestamp: Timestamp::from_unix_millis(5).unwrap(),
        };
        assert!(crate::encode(&m).is_ok());
        for size in [MAX_CHUNK_BYTES as u64, 2 * MAX_CHUNK_BYTES as u64 + 1] {
            let bad = SnapshotManifest { size, ..m.clone() };
            assert!(crate::encode(&bad).is_err(), "{size}");
        }
    }
}
