//! Reading: the handle's facts, documents, prefix scans and the commit history.

use super::sqlite::{from_i64, sqlite_err, to_i64};
use super::{Commit, Document, ReadOnlyStore, Store};
use crate::codec;
use crate::error::StoreError;
use lease_core::seal::StoreState;
use rusqlite::{OptionalExtension, params};
use std::path::Path;

/// The reading methods, the same on a [`Store`] (an owner's) and a [`ReadOnlyStore`].
macro_rules! read_methods {
    ($t:ty) => {
impl $t {
    /// The run this store belongs to.
    pub fn run(&self) -> &str {
        &self.inner.run
    }

    /// The store file's path as given to [`Store::open`].
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Whether SQLite reaches the store's files beneath the held folder descriptor
    /// (`/proc/self/fd/N/…`, see the crate docs). False only where `/proc` is not mounted:
    /// then SQLite is given the folder's path, and the open re-checks that the name still
    /// is the file it checked.
    pub fn reached_through_fd(&self) -> bool {
        self.inner.dir.through_fd()
    }

    /// When the store was created (creator's wall clock).
    pub fn created_at(&self) -> &str {
        &self.inner.created_at
    }

    /// The store's identity (created with it) and its head.
    pub fn identity(&self) -> Result<StoreState, StoreError> {
        self.inner.identity()
    }

    /// The last committed sequence (0 for an empty store).
    pub fn head(&self) -> Result<u64, StoreError> {
        self.inner.head()
    }

    /// The highest fencing token the store has accepted (0 before the first commit).
    pub fn max_token(&self) -> Result<u64, StoreError> {
        self.inner.usable()?;
        let ctx = self.inner.ctx();
        self.inner
            .conn()
            .query_row("SELECT max_token FROM fence WHERE singleton = 1", [], |r| {
                r.get::<_, i64>(0)
            })
            .map(from_i64)
            .map_err(|e| sqlite_err(&ctx, "read fence", e))
    }

    /// The document at `key`, if any.
    pub fn get(&self, key: &str) -> Result<Option<Document>, StoreError> {
        self.inner.usable()?;
        let ctx = self.inner.ctx();
        self.inner
            .conn()
            .prepare_cached("SELECT value, updated_seq FROM docs WHERE key = ?1")
            .and_then(|mut s| {
                s.query_row([key], |r| {
                    Ok(Document {
                        key: key.to_string(),
                        value: r.get(0)?,
                        updated_seq: from_i64(r.get(1)?),
                    })
                })
                .optional()
            })
            .map_err(|e| sqlite_err(&ctx, "get", e))
    }

    /// Every document whose key starts with `prefix`, in key order (byte order of UTF-8).
    pub fn scan_prefix(&self, prefix: &str) -> Result<Vec<Document>, StoreError> {
        self.inner.usable()?;
        let ctx = self.inner.ctx();
        let conn = self.inner.conn();
        let map = |r: &rusqlite::Row<'_>| {
            Ok(Document {
                key: r.get(0)?,
                value: r.get(1)?,
                updated_seq: from_i64(r.get(2)?),
            })
        };
        let rows: Result<Vec<Document>, rusqlite::Error> = match prefix_successor(prefix) {
            Some(upper) => conn
                .prepare_cached(
                    "SELECT key, value, updated_seq FROM docs WHERE key >= ?1 AND key < ?2 ORDER BY key",
                )
                .and_then(|mut s| s.query_map(params![prefix, upper], map)?.collect()),
            None => conn
                .prepare_cached(
                    "SELECT key, value, updated_seq FROM docs WHERE key >= ?1 ORDER BY key",
                )
                .and_then(|mut s| s.query_map(params![prefix], map)?.collect()),
        };
        rows.map_err(|e| sqlite_err(&ctx, "scan", e))
    }

    /// Every commit with a sequence above `after`, in order, with its writes and log
    /// entries (`commits_since(0)` is the whole history).
    pub fn commits_since(&self, after: u64) -> Result<Vec<Commit>, StoreError> {
        self.commits_page(after, usize::MAX)
    }

    /// At most `max` commits with a sequence above `after`, in order (for paging through a
    /// long history without loading it whole).
    pub fn commits_page(&self, after: u64, max: usize) -> Result<Vec<Commit>, StoreError> {
        self.inner.usable()?;
        let after = to_i64("after", after)?;
        let limit = i64::try_from(max).unwrap_or(i64::MAX);
        self.read_commits(after, limit)
    }

    fn read_commits(&self, after: i64, limit: i64) -> Result<Vec<Commit>, StoreError> {
        let ctx = self.inner.ctx();
        let sq = |e| sqlite_err(&ctx, "read commits", e);
        let conn = self.inner.conn();
        let rows: Vec<(i64, i64, String, Vec<u8>)> = conn
            .prepare_cached(
                "SELECT seq, token, committed_at, writes FROM commits WHERE seq > ?1 ORDER BY seq LIMIT ?2",
            )
            .and_then(|mut st| {
                st.query_map(params![after, limit], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })?
                .collect()
            })
            .map_err(sq)?;
        let mut commits = Vec::with_capacity(rows.len());
        for (seq, token, committed_at, writes) in rows {
            let writes = codec::decode(&writes).map_err(|e| {
                ctx.corrupt(format!("the writes of commit {seq} do not decode: {e}"))
            })?;
            commits.push(Commit {
                seq: from_i64(seq),
                token: from_i64(token),
                committed_at,
                writes,
                log: Vec::new(),
            });
        }
        let (Some(first), Some(last)) = (commits.first(), commits.last()) else {
            return Ok(commits);
        };
        let (first, last) = (first.seq as i64, last.seq as i64);
        let index = |commits: &[Commit], seq: i64| {
            commits.binary_search_by_key(&from_i64(seq), |c| c.seq).ok()
        };
        let entries: Vec<(i64, Vec<u8>)> = conn
            .prepare_cached(
                "SELECT seq, entry FROM log WHERE seq >= ?1 AND seq <= ?2 ORDER BY seq, idx",
            )
            .and_then(|mut st| {
                st.query_map(params![first, last], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect()
            })
            .map_err(sq)?;
        for (seq, entry) in entries {
            if let Some(i) = index(&commits, seq) {
                commits[i].log.push(entry);
            }
        }
        Ok(commits)
    }
}
    };
}

read_methods!(Store);
read_methods!(ReadOnlyStore);

/// The smallest string above every string that starts with `prefix`, if any.
fn prefix_successor(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let mut next = u32::from(last) + 1;
        while next <= u32::from(char::MAX) {
            if let Some(c) = char::from_u32(next) {
                chars.push(c);
                return Some(chars.into_iter().collect());
            }
            next += 1;
        }
    }
    None
}
