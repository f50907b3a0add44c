//! Reading: the facts of every handle (an opened one's too), documents, prefix scans and
//! the commit history.

use super::sqlite::{from_i64, sqlite_err, to_i64};
use super::{Commit, Document, OpenedStore, ReadOnlyStore, Store};
use crate::codec;
use crate::error::StoreError;
use lease_core::seal::StoreState;
use rusqlite::{OptionalExtension, params};
use std::path::Path;

/// The facts every handle reports, the same on an [`OpenedStore`] (whose seal is not
/// checked yet), a [`Store`] and a [`ReadOnlyStore`].
macro_rules! fact_methods {
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

            /// The store's identity (created with it) and its head: what the seal check compares.
            pub fn identity(&self) -> Result<StoreState, StoreError> {
                self.inner.identity()
            }

            /// The last committed sequence (0 for an empty store).
            pub fn head(&self) -> Result<u64, StoreError> {
                self.inner.head()
            }
        }
    };
}

fact_methods!(OpenedStore);
fact_methods!(Store);
fact_methods!(ReadOnlyStore);

/// The reading methods, the same on a [`Store`] (an owner's) and a [`ReadOnlyStore`].
macro_rules! read_methods {
    ($t:ty) => {
impl $t {
    /// When the store was created (creator's wall clock).
    pub fn created_at(&self) -> &str {
        &self.inner.created_at
    }

    /// The position of the engine's store log this view has applied (its `engine_view`
    /// row; see [`Store::apply_record`]).
    ///
    /// # Errors
    /// `ARGUMENT_INVALID` (64) on a local store (it has no position in a log);
    /// `STORE_CORRUPT` (65) for a row that is not a position; `STORE_IO` (74) or
    /// `STORE_INTERNAL` (70) if SQLite fails.
    pub fn view_position(&self) -> Result<super::ViewPosition, StoreError> {
        super::view::position_of(&self.inner)
    }

    /// A serialized image of the whole database, consistent (one read transaction; what
    /// the WAL holds included): the bytes a snapshot of a view carries, which
    /// [`Store::build_view_in`] turns back into a view. SQLite's `sqlite3_serialize`
    /// (rusqlite's `serialize` feature): the pages are copied through SQLite's own pager
    /// under the connection's lock, with no second file or connection, so nothing is
    /// written beside the store (a `VACUUM INTO` would need a temp file beside it and an
    /// `ATTACH`, which every store connection forbids). The image is as large as the
    /// database and held in memory whole.
    ///
    /// # Errors
    /// `STORE_IO` (74), `STORE_CORRUPT` (65) or `STORE_INTERNAL` (70) if SQLite fails
    /// (out of memory included).
    pub fn image(&self) -> Result<Vec<u8>, StoreError> {
        super::view::image_of(&self.inner)
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

    /// One page of a prefix scan, for serving a listing in bounded pieces (the store
    /// socket, `runlease store list`): the documents whose key starts with `prefix` and
    /// is above `after` (all of them from the start when `after` is `None`), in key order
    /// (byte order of UTF-8), read row by row and stopped at `limit_rows` documents or
    /// before the document that would take the page's keys and values above
    /// `limit_bytes`.
    ///
    /// A page holds at least one document when any remains, even one above `limit_bytes`
    /// by itself (a value is at most [`crate::MAX_COMMIT_BYTES`], so a page is at most
    /// `max(limit_bytes, MAX_COMMIT_BYTES)` of keys and values); a `limit_rows` of 0 is
    /// taken as 1. The second value is `Some(key)` of the page's last document when more
    /// documents follow (pass it as `after` for the next page), `None` when the scan is
    /// complete. Each page is its own read: documents written between pages are seen or
    /// not according to their key.
    ///
    /// ```
    /// # use lease_core::{Generation, RunId};
    /// # use lease_sqlite::{Batch, StoreOptions, Store};
    /// # let dir = tempfile::tempdir()?;
    /// # let run = RunId::new("demo")?;
    /// # let opened = Store::open(&run, dir.path().join("run.sqlite"), StoreOptions { create: true, expect: None })?;
    /// # let mut store = opened.check(&lease_core::seal::Requirements::no_chain())?;
    /// store.commit(Generation::new(1).unwrap(), &Batch::new().put("a/1", "x").put("a/2", "y").put("b", "z"))?;
    /// let (page, next) = store.scan_prefix_page("a/", None, 1, 1 << 20)?;
    /// assert_eq!((page[0].key.as_str(), next.as_deref()), ("a/1", Some("a/1")));
    /// let (page, next) = store.scan_prefix_page("a/", next.as_deref(), 1, 1 << 20)?;
    /// assert_eq!((page[0].key.as_str(), next), ("a/2", None));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// `STORE_CORRUPT` (65) for a row that does not read as a document (a value above
    /// [`crate::MAX_COMMIT_BYTES`] included); `STORE_IO` (74) or `STORE_INTERNAL` (70)
    /// if SQLite fails.
    pub fn scan_prefix_page(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit_rows: usize,
        limit_bytes: usize,
    ) -> Result<(Vec<Document>, Option<String>), StoreError> {
        self.inner.usable()?;
        let ctx = self.inner.ctx();
        let sq = |e| sqlite_err(&ctx, "scan (page)", e);
        let limit_rows = limit_rows.max(1);
        // The lower bound: strictly above `after` when it is at or above `prefix`,
        // else from `prefix` itself; the upper bound: below the prefix's successor.
        let (lower, strict) = match after {
            Some(a) if a >= prefix => (a, true),
            _ => (prefix, false),
        };
        let upper = prefix_successor(prefix);
        let sql = format!(
            "SELECT key, value, updated_seq FROM docs WHERE key {} ?1{} ORDER BY key",
            if strict { ">" } else { ">=" },
            if upper.is_some() { " AND key < ?2" } else { "" }
        );
        let conn = self.inner.conn();
        let mut st = conn.prepare_cached(&sql).map_err(sq)?;
        let mut rows = match &upper {
            Some(u) => st.query(params![lower, u]),
            None => st.query(params![lower]),
        }
        .map_err(sq)?;
        let mut page: Vec<Document> = Vec::new();
        let mut bytes = 0usize;
        while let Some(r) = rows.next().map_err(sq)? {
            if page.len() >= limit_rows {
                // One more row exists: the page was cut by the row limit.
                let next = page.last().map(|d| d.key.clone());
                return Ok((page, next));
            }
            let key: String = r.get(0).map_err(sq)?;
            let len = match r.get_ref(1).map_err(sq)? {
                rusqlite::types::ValueRef::Blob(b) => b.len(),
                other => {
                    return Err(ctx.corrupt(format!(
                        "the value of document {key:?} is {:?}, not a BLOB",
                        other.data_type()
                    )));
                }
            };
            let size = key.len().saturating_add(len);
            if !page.is_empty() && bytes.saturating_add(size) > limit_bytes {
                let next = page.last().map(|d| d.key.clone());
                return Ok((page, next));
            }
            bytes = bytes.saturating_add(size);
            page.push(Document {
                key,
                value: r.get(1).map_err(sq)?,
                updated_seq: from_i64(r.get(2).map_err(sq)?),
            });
        }
        Ok((page, None))
    }

    /// Every commit with a sequence above `after`, in order, with its writes and log
    /// entries (`commits_since(0)` is the whole history, loaded whole: a reader that
    /// serves others pages with [`Self::commits_page_bytes`]).
    pub fn commits_since(&self, after: u64) -> Result<Vec<Commit>, StoreError> {
        self.commits_page(after, usize::MAX)
    }

    /// At most `max` commits with a sequence above `after`, in order (for paging through a
    /// long history without loading it whole).
    pub fn commits_page(&self, after: u64, max: usize) -> Result<Vec<Commit>, StoreError> {
        self.commits_page_bytes(after, max, usize::MAX)
    }

    /// At most `max` commits with a sequence above `after`, in order, read row by row and
    /// stopped before the commit that would take the page's writes and log entries above
    /// `max_bytes` (keys, values and entries counted). A page holds at least one commit
    /// when any remains (a commit is at most [`crate::MAX_COMMIT_BYTES`]); `max` 0 gives
    /// an empty page. The next page starts after the last commit's `seq`; an empty page
    /// means the history is read.
    ///
    /// # Errors
    /// `STORE_CORRUPT` (65) for a commit whose writes do not decode; `STORE_IO` (74) or
    /// `STORE_INTERNAL` (70) if SQLite fails; `ARGUMENT_INVALID` for `after` above
    /// `i64::MAX`.
    pub fn commits_page_bytes(
        &self,
        after: u64,
        max: usize,
        max_bytes: usize,
    ) -> Result<Vec<Commit>, StoreError> {
        self.inner.usable()?;
        let after = to_i64("after", after)?;
        let ctx = self.inner.ctx();
        let sq = |e| sqlite_err(&ctx, "read commits", e);
        let conn = self.inner.conn();
        let mut st = conn
            .prepare_cached(
                "SELECT seq, token, committed_at, writes FROM commits WHERE seq > ?1 ORDER BY seq",
            )
            .map_err(sq)?;
        let mut log_st = conn
            .prepare_cached("SELECT entry FROM log WHERE seq = ?1 ORDER BY idx")
            .map_err(sq)?;
        let mut rows = st.query(params![after]).map_err(sq)?;
        let mut commits: Vec<Commit> = Vec::new();
        let mut bytes = 0usize;
        while commits.len() < max {
            let Some(r) = rows.next().map_err(sq)? else {
                break;
            };
            let seq: i64 = r.get(0).map_err(sq)?;
            let rusqlite::types::ValueRef::Blob(blob) = r.get_ref(3).map_err(sq)? else {
                return Err(ctx.corrupt(format!("the writes of commit {seq} are not a BLOB")));
            };
            let mut size = blob.len();
            if !commits.is_empty() && bytes.saturating_add(size) > max_bytes {
                break;
            }
            let writes = codec::decode(blob).map_err(|e| {
                ctx.corrupt(format!("the writes of commit {seq} do not decode: {e}"))
            })?;
            let mut log = Vec::new();
            let mut entries = log_st.query(params![seq]).map_err(sq)?;
            while let Some(e) = entries.next().map_err(sq)? {
                let entry: Vec<u8> = e.get(0).map_err(sq)?;
                size = size.saturating_add(entry.len());
                if size > crate::MAX_COMMIT_BYTES {
                    return Err(ctx.corrupt(format!(
                        "commit {seq} holds more than {} bytes of writes and log entries",
                        crate::MAX_COMMIT_BYTES
                    )));
                }
                log.push(entry);
            }
            if !commits.is_empty() && bytes.saturating_add(size) > max_bytes {
                break;
            }
            bytes = bytes.saturating_add(size);
            commits.push(Commit {
                seq: from_i64(seq),
                token: from_i64(r.get(1).map_err(sq)?),
                committed_at: r.get(2).map_err(sq)?,
                writes,
                log,
            });
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
