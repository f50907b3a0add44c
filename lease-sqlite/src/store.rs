//! The store: open (and create), the seal check, commits with the fencing-token check,
//! reads, seal and close.

use crate::codec;
use crate::error::StoreError;
use crate::folder::{self, Folder};
use crate::header::{self, Ctx};
use crate::registry::Registration;
use crate::schema::{CREATE_V1, SCHEMA_VERSION, TABLES};
use lease_core::seal::StoreState;
use lease_core::{Generation, Identity, LeaseError, RunId, Seal, Timestamp};
use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags, OptionalExtension, TransactionBehavior, params};
use rustix::fd::OwnedFd;
use rustix::fs::Stat;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// `PRAGMA wal_autocheckpoint`: SQLite's default (pages), set explicitly and read back.
pub const WAL_AUTOCHECKPOINT_PAGES: i64 = 1000;

/// How to open a store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenOptions {
    /// Create the store (and its missing parent folders, mode 0700) if the file does not
    /// exist. An existing file is never recreated, whatever it contains.
    pub create: bool,
    /// The store the caller expects to find (for example the store id of the run's last
    /// seal). A different store id is refused with `STORE_IDENTITY_MISMATCH`, and a missing
    /// file with `STORE_MISSING` even when `create` is set: a new, empty store is never
    /// created in place of an expected one.
    pub expect: Option<Expected>,
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

/// The hook called before each commit starts; an `Err` refuses the commit before it
/// touches the database (see [`Store::set_commit_gate`]).
pub type CommitGate = Box<dyn Fn() -> Result<(), StoreError> + Send>;

/// What every handle holds. Field order matters: the connection closes before the
/// registry entry is released.
struct Inner {
    conn: Option<Connection>,
    _registration: Registration,
    /// The held store folder: SQLite's names (`/proc/self/fd/N/…`) resolve through it, so
    /// it is closed only after the connection.
    dir: Folder,
    run: String,
    file: String,
    path: PathBuf,
    store_id: String,
    created_at: String,
    /// Set when a commit failed in a way that leaves this handle untrustworthy (I/O error,
    /// corruption, an unexpected SQLite error): every later call is refused.
    broken: Option<String>,
    gate: Option<CommitGate>,
}

/// The store entry point: [`Store::open`] gives an [`OpenedStore`], and only
/// [`OpenedStore::check_seal`] turns that into a `Store` that can commit.
pub struct Store {
    inner: Inner,
}

/// A store that is open and checked (header, schema, integrity, durability settings) but
/// whose seal has not been checked yet: it can report its identity and head, and nothing
/// else. [`OpenedStore::check_seal`] is the only way to get a [`Store`] that commits, so a
/// commit without a seal check cannot be written:
///
/// ```compile_fail
/// use lease_core::{Generation, RunId};
/// use lease_sqlite::{Batch, OpenOptions, Store};
///
/// fn skip_the_seal(path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
///     let mut opened = Store::open(&RunId::new("demo")?, path, OpenOptions::default())?;
///     opened.commit(Generation::new(1).unwrap(), &Batch::new())?; // no such method
///     Ok(())
/// }
/// ```
pub struct OpenedStore {
    inner: Inner,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("run", &self.inner.run)
            .field("file", &self.inner.file)
            .field("store_id", &self.inner.store_id)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for OpenedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenedStore")
            .field("run", &self.inner.run)
            .field("file", &self.inner.file)
            .field("store_id", &self.inner.store_id)
            .finish_non_exhaustive()
    }
}

fn now_text() -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0);
    Timestamp::from_unix_millis(ms)
        .unwrap_or(Timestamp::EPOCH)
        .to_string()
}

fn random_hex(bytes: usize) -> Result<String, getrandom::Error> {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Prefix of temp names (reserved for temp files by docs/PROTOCOL.md §2).
const TEMP_PREFIX: &str = ".tmp-";

fn wal_name(name: &str) -> String {
    format!("{name}-wal")
}

/// Open a connection to `name` in `dir`: beneath the held folder descriptor through the
/// [`crate::vfs`] shim (`/proc/self/fd/N/name`), or by path when `/proc` is unavailable.
fn connect(dir: &Folder, name: &str) -> Result<Connection, rusqlite::Error> {
    match dir.sqlite_target(name) {
        (target, Some(vfs)) => Connection::open_with_flags_and_vfs(target, open_flags(), vfs),
        (target, None) => Connection::open_with_flags(target, open_flags()),
    }
}

/// Classify an SQLite error.
fn sqlite_err(ctx: &Ctx<'_>, op: &'static str, e: rusqlite::Error) -> StoreError {
    let code = match &e {
        rusqlite::Error::SqliteFailure(f, _) => Some(f.code),
        _ => None,
    };
    match code {
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Busy {
            run: ctx.run.to_string(),
            file: ctx.file.to_string(),
            detail: format!(
                "another process holds SQLite's exclusive lock on it ({e}); only one process may have a store open"
            ),
        },
        Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
            ctx.corrupt(format!("{op}: {e}"))
        }
        Some(
            ErrorCode::SystemIoFailure
            | ErrorCode::DiskFull
            | ErrorCode::CannotOpen
            | ErrorCode::PermissionDenied
            | ErrorCode::ReadOnly
            | ErrorCode::FileLockingProtocolFailed
            | ErrorCode::NoLargeFileSupport,
        ) => ctx.io(op, e),
        _ => StoreError::Internal {
            run: ctx.run.to_string(),
            file: ctx.file.to_string(),
            op,
            detail: e.to_string(),
        },
    }
}

fn to_i64(what: &'static str, v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::ArgumentInvalid {
        what,
        reason: format!("{v} is above the store's limit {}", i64::MAX),
    })
}

fn from_i64(v: i64) -> u64 {
    // Columns are CHECKed non-negative; a negative value (a hand-edited file) reads as 0.
    u64::try_from(v).unwrap_or(0)
}

fn open_flags() -> OpenFlags {
    // No SQLITE_OPEN_CREATE: the file exists (created whole and linked into place, or it
    // was already there); NOFOLLOW: never through a symlink; NO_MUTEX: a handle is used by
    // one thread at a time (`&mut self` for writes, `Store: Send + !Sync`).
    OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NOFOLLOW
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_EXRESCODE
}

/// Set a pragma and read back what SQLite reports it as; a mismatch is recorded.
fn set_pragma(
    conn: &Connection,
    name: &str,
    value: &str,
    want: &str,
    mismatches: &mut Vec<String>,
) -> Result<(), rusqlite::Error> {
    conn.execute_batch(&format!("PRAGMA {name} = {value}"))?;
    let got: String = conn.query_row(&format!("PRAGMA {name}"), [], |r| {
        let v: rusqlite::types::Value = r.get(0)?;
        Ok(match v {
            rusqlite::types::Value::Integer(i) => i.to_string(),
            rusqlite::types::Value::Text(t) => t.to_lowercase(),
            other => format!("{other:?}"),
        })
    })?;
    if got != want {
        mismatches.push(format!("{name}: wanted {want}, got {got}"));
    }
    Ok(())
}

/// The durability settings (see the crate docs), each read back.
fn apply_durability(conn: &Connection) -> Result<Vec<String>, rusqlite::Error> {
    let mut m = Vec::new();
    // locking_mode first: set before the WAL is first used, the WAL index lives in heap
    // memory (no `-shm` file) and the connection holds an exclusive lock on the file.
    set_pragma(conn, "locking_mode", "EXCLUSIVE", "exclusive", &mut m)?;
    set_pragma(conn, "journal_mode", "WAL", "wal", &mut m)?;
    set_pragma(conn, "synchronous", "FULL", "2", &mut m)?;
    set_pragma(conn, "mmap_size", "0", "0", &mut m)?;
    let ckpt = WAL_AUTOCHECKPOINT_PAGES.to_string();
    set_pragma(conn, "wal_autocheckpoint", &ckpt, &ckpt, &mut m)?;
    Ok(m)
}

/// Create a new store named `name` in `dir`. Order of writes (every call relative to the
/// held folder descriptor):
/// 1. create a temp file `.tmp-<pid>-store-<random>` (O_EXCL, mode 0600);
/// 2. SQLite builds the schema in it (its WAL is checkpointed and removed by the close);
/// 3. fsync the temp file;
/// 4. `linkat` it to `name` (never replaces an existing file: a concurrent creator that won
///    keeps its store, and ours is discarded);
/// 5. `unlinkat` the temp name (and a WAL a failed build left);
/// 6. fsync the folder, so the new name is durable.
///
/// A crash before 4 leaves only a temp name (reserved namespace, removed by orphan
/// cleanup); between 4 and 5 a second name of the whole store, which the next open removes
/// ([`check_single_name`]); between 5 and 6 a power loss may drop the name, and the store
/// was not yet reported as created. Returns `Ok(())` also when another creator won.
fn create_store(ctx: &Ctx<'_>, dir: &Folder, name: &str) -> Result<(), StoreError> {
    // A temp name in the reserved `.tmp-` namespace of docs/PROTOCOL.md §2: it never parses
    // as anything, and lease-fs's orphan cleanup may remove it after a crash.
    let suffix = random_hex(8).map_err(|e| ctx.io("getrandom", e))?;
    let tmp = format!("{TEMP_PREFIX}{}-store-{suffix}", std::process::id());
    let result = build_new_store(ctx, dir, &tmp).and_then(|()| match dir.link(&tmp, name) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(ctx.io("link (store into place)", e)),
    });
    let _ = dir.unlink(&tmp);
    let _ = dir.unlink(&wal_name(&tmp));
    result?;
    dir.fsync().map_err(|e| ctx.io("fsync (store folder)", e))
}

fn build_new_store(ctx: &Ctx<'_>, dir: &Folder, tmp: &str) -> Result<(), StoreError> {
    // The empty file is created here with mode 0600 (SQLite's journal and WAL files take
    // the mode of the database file).
    drop(
        dir.create_new(tmp, 0o600)
            .map_err(|e| ctx.io("create (new store)", e))?,
    );
    let store_id = random_hex(16).map_err(|e| ctx.io("getrandom", e))?;
    let sq = |op, e| sqlite_err(ctx, op, e);
    let mut conn = connect(dir, tmp).map_err(|e| sq("open", e))?;
    let mismatches = apply_durability(&conn).map_err(|e| sq("pragma", e))?;
    if !mismatches.is_empty() {
        return Err(StoreError::Pragma {
            run: ctx.run.to_string(),
            file: ctx.file.to_string(),
            mismatches: mismatches.join("; "),
        });
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|e| sq("begin (create)", e))?;
    tx.execute_batch(CREATE_V1)
        .and_then(|()| tx.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}")))
        .and_then(|()| {
            tx.execute(
                "INSERT INTO store_meta (singleton, store_id, created_at, schema_version) VALUES (1, ?1, ?2, ?3)",
                params![store_id, now_text(), SCHEMA_VERSION],
            )
        })
        .and_then(|_| tx.execute("INSERT INTO fence (singleton, max_token) VALUES (1, 0)", []))
        .and_then(|_| tx.commit())
        .map_err(|e| sq("create schema", e))?;
    // Close checkpoints the WAL into the file and removes the WAL, so the file linked into
    // place is whole on its own.
    conn.close().map_err(|(_, e)| sq("close (create)", e))?;
    dir.open_read(tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| ctx.io("fsync (new store)", e))
}

/// What validation found.
struct Meta {
    store_id: String,
    created_at: String,
}

/// Checks made with SQLite, in an order that writes nothing before the file is known to be
/// a store of our schema.
fn validate(ctx: &Ctx<'_>, conn: &Connection) -> Result<Meta, StoreError> {
    let sq = |op, e| sqlite_err(ctx, op, e);
    // Exclusive locking before the first read: in WAL mode the first read then takes the
    // exclusive lock (a second process gets "database is locked" from here on).
    let mode: String = conn
        .query_row("PRAGMA locking_mode = EXCLUSIVE", [], |r| r.get(0))
        .map_err(|e| sq("pragma locking_mode", e))?;
    if !mode.eq_ignore_ascii_case("exclusive") {
        return Err(StoreError::Pragma {
            run: ctx.run.to_string(),
            file: ctx.file.to_string(),
            mismatches: format!("locking_mode: wanted exclusive, got {mode}"),
        });
    }
    // The first read of the file: locks it, replays a WAL left by a crash (in memory).
    let user_version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| sq("read schema version", e))?;
    if user_version != i64::from(SCHEMA_VERSION) {
        return Err(ctx.unsupported(user_version.to_string()));
    }
    let mut present = Vec::new();
    {
        let mut st = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table'")
            .map_err(|e| sq("read schema", e))?;
        let rows = st
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(|e| sq("read schema", e))?;
        for r in rows {
            present.push(r.map_err(|e| sq("read schema", e))?);
        }
    }
    let missing: Vec<&str> = TABLES
        .iter()
        .copied()
        .filter(|t| !present.iter().any(|p| p == t))
        .collect();
    if !missing.is_empty() {
        return Err(ctx.unsupported(format!(
            "{user_version} without the tables {} (not a runlease store of that version)",
            missing.join(", ")
        )));
    }
    let meta: Option<(String, String, i64)> = conn
        .query_row(
            "SELECT store_id, created_at, schema_version FROM store_meta WHERE singleton = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(|e| sq("read store_meta", e))?;
    let Some((store_id, created_at, schema_version)) = meta else {
        return Err(ctx.corrupt("its store_meta row is missing"));
    };
    if schema_version != i64::from(SCHEMA_VERSION) {
        return Err(ctx.unsupported(format!(
            "{schema_version} (store_meta; the header says {user_version})"
        )));
    }
    if Identity::new(store_id.clone()).is_err() {
        return Err(ctx.corrupt(format!("its store id {store_id:?} is not valid")));
    }
    let fence: Option<i64> = conn
        .query_row("SELECT max_token FROM fence WHERE singleton = 1", [], |r| {
            r.get(0)
        })
        .optional()
        .map_err(|e| sq("read fence", e))?;
    if fence.is_none() {
        return Err(ctx.corrupt("its fence row is missing"));
    }
    let mut problems = Vec::new();
    {
        let mut st = conn
            .prepare("PRAGMA quick_check(5)")
            .map_err(|e| sq("quick_check", e))?;
        let rows = st
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(|e| sq("quick_check", e))?;
        for r in rows {
            problems.push(r.map_err(|e| sq("quick_check", e))?);
        }
    }
    if problems != ["ok"] {
        return Err(ctx.corrupt(format!("integrity check failed: {}", problems.join("; "))));
    }
    Ok(Meta {
        store_id,
        created_at,
    })
}

impl Store {
    /// Open the store file at `path` (normally `<run>/store/run.sqlite`, see
    /// `docs/PROTOCOL.md` §2) for run `run`.
    ///
    /// Checks, in this order, before anything is written: the path is a regular file (not
    /// a symlink or directory); this process does not already have it open; its header is
    /// SQLite's with our schema version; SQLite's exclusive lock can be taken; the schema's
    /// tables and the store identity are there; `PRAGMA quick_check` passes; the durability
    /// settings read back as set. A missing file is created (whole, then linked into place)
    /// only if `options.create` is set and no particular store is expected.
    ///
    /// The result can report its identity and head; [`OpenedStore::check_seal`] turns it
    /// into a [`Store`] that commits.
    ///
    /// # Errors
    /// `STORE_CORRUPT` (65), `STORE_MISSING` (65), `STORE_IDENTITY_MISMATCH` (65),
    /// `SCHEMA_UNSUPPORTED` (70), `STORE_PRAGMA` (70), `STORE_BUSY` (75), `STORE_IO` (74).
    /// A refused file is left byte for byte as it was.
    pub fn open(
        run: &RunId,
        path: impl AsRef<Path>,
        options: OpenOptions,
    ) -> Result<OpenedStore, StoreError> {
        let path = path.as_ref();
        let file = path.display().to_string();
        let run_s = run.to_string();
        let ctx = Ctx {
            run: &run_s,
            file: &file,
        };
        let name = path.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
            StoreError::ArgumentInvalid {
                what: "store path",
                reason: format!("{file} does not end in a UTF-8 file name"),
            }
        })?;
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // Only the folders above the store file are reached by path, and a missing one is
        // created (mode 0700, its parent fsynced) only when a new store may be created.
        if options.create
            && options.expect.is_none()
            && matches!(fs::symlink_metadata(&parent), Err(e) if e.kind() == ErrorKind::NotFound)
        {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&parent)
                .map_err(|e| ctx.io("mkdir (store folder)", e))?;
            if let Some(grand) = parent.parent().filter(|g| !g.as_os_str().is_empty()) {
                fs::File::open(grand)
                    .and_then(|d| d.sync_all())
                    .map_err(|e| ctx.io("fsync (store folder's parent)", e))?;
            }
        }
        let dir = match Folder::open(&parent) {
            Ok(d) => d,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(StoreError::Missing {
                    run: run_s.clone(),
                    file: file.clone(),
                    detail: format!("its folder {} does not exist", parent.display()),
                });
            }
            Err(e)
                if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
                    || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) =>
            {
                return Err(ctx.corrupt(format!(
                    "its folder {} is a symbolic link or not a directory (store files are never reached through a symlink)",
                    parent.display()
                )));
            }
            Err(e) => return Err(ctx.io("open (store folder)", e)),
        };
        Store::open_folder(&ctx, dir, name, options)
    }

    /// Open the store file `name` in the folder `dir`, a descriptor the caller opened (the
    /// run layer passes `store/`, opened beneath the run's held root). `dir_path` is the
    /// folder's path, used only in messages. Every system call on the store's files is
    /// then made relative to `dir` (SQLite reaches them as `/proc/self/fd/N/name`; see the
    /// crate docs), so nothing below the folder is looked up by path. Otherwise exactly
    /// [`Store::open`], whose checks and errors apply.
    ///
    /// # Errors
    /// As [`Store::open`]; `ARGUMENT_INVALID` if `name` is not a plain file name.
    pub fn open_in(
        run: &RunId,
        dir: OwnedFd,
        dir_path: &Path,
        name: &str,
        options: OpenOptions,
    ) -> Result<OpenedStore, StoreError> {
        let file = dir_path.join(name).display().to_string();
        let run_s = run.to_string();
        let ctx = Ctx {
            run: &run_s,
            file: &file,
        };
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(StoreError::ArgumentInvalid {
                what: "store file name",
                reason: format!("{name:?} is not a plain file name"),
            });
        }
        let dir = Folder::from_fd(dir, dir_path.to_path_buf())
            .map_err(|e| ctx.io("open (store folder)", e))?;
        Store::open_folder(&ctx, dir, name, options)
    }

    fn open_folder(
        ctx: &Ctx<'_>,
        dir: Folder,
        name: &str,
        options: OpenOptions,
    ) -> Result<OpenedStore, StoreError> {
        let (run_s, file) = (ctx.run.to_string(), ctx.file.to_string());
        let lstat = |n: &str| dir.lstat(n).map_err(|e| ctx.io("stat", e));
        let meta = match lstat(name)? {
            Some(m) => m,
            None => {
                if options.expect.is_some() {
                    let expected = options.expect.as_ref().map(|e| e.store_id.to_string());
                    return Err(StoreError::Missing {
                        run: run_s.clone(),
                        file: file.clone(),
                        detail: format!(
                            "store {} was expected; a new store is never created in its place",
                            expected.unwrap_or_default()
                        ),
                    });
                }
                if !options.create {
                    return Err(StoreError::Missing {
                        run: run_s.clone(),
                        file: file.clone(),
                        detail: "it was opened without create".into(),
                    });
                }
                create_store(ctx, &dir, name)?;
                lstat(name)?.ok_or_else(|| {
                    ctx.io("open", "the new store vanished right after it was created")
                })?
            }
        };
        header::check_kind(ctx, &meta)?;
        let key = folder::key(&meta);
        let registration = Registration::take(key).ok_or_else(|| StoreError::Busy {
            run: run_s.clone(),
            file: file.clone(),
            detail: "this process already has it open; only one connection per store file per process is allowed (closing a second descriptor would drop SQLite's POSIX locks)".into(),
        })?;
        if meta.st_nlink > 1 {
            check_single_name(ctx, &dir, name, &meta)?;
        }
        let wal_len = lstat(&wal_name(name))?.map(|m| m.st_size);
        header::check(ctx, &dir, name, &meta, wal_len.unwrap_or(0) == 0)?;

        let conn = connect(&dir, name).map_err(|e| sqlite_err(ctx, "open", e))?;
        let refuse = |conn: Connection, err: StoreError| -> StoreError {
            // Leave the file as it was: no checkpoint on close, except that a WAL SQLite
            // created itself (there was none) is empty and is removed by the close.
            let _ = conn.set_db_config(
                DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
                wal_len.is_some(),
            );
            drop(conn);
            err
        };
        let setup = conn
            .set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
            .and_then(|_| conn.busy_timeout(std::time::Duration::ZERO))
            .and_then(|()| conn.is_readonly(rusqlite::MAIN_DB))
            .map_err(|e| sqlite_err(ctx, "configure", e));
        match setup {
            Ok(false) => {}
            // SQLite falls back to read-only when the file is write-protected; a store that
            // cannot commit is refused now rather than at its first commit.
            Ok(true) => {
                return Err(refuse(
                    conn,
                    ctx.io(
                        "open",
                        "the file can only be opened read-only (permissions?)",
                    ),
                ));
            }
            Err(e) => return Err(refuse(conn, e)),
        }
        let m = match validate(ctx, &conn) {
            Ok(m) => m,
            Err(e) => return Err(refuse(conn, e)),
        };
        match apply_durability(&conn) {
            Ok(mismatches) if mismatches.is_empty() => {}
            Ok(mismatches) => {
                return Err(refuse(
                    conn,
                    StoreError::Pragma {
                        run: run_s.clone(),
                        file: file.clone(),
                        mismatches: mismatches.join("; "),
                    },
                ));
            }
            Err(e) => return Err(refuse(conn, sqlite_err(ctx, "pragma", e))),
        }
        // The name must still be the file we registered and SQLite locked.
        match dir.lstat(name) {
            Ok(Some(now)) if folder::key(&now) == key => {}
            _ => {
                return Err(refuse(
                    conn,
                    ctx.corrupt("the file was replaced while it was being opened"),
                ));
            }
        }
        if let Some(expect) = &options.expect {
            if expect.store_id.as_str() != m.store_id {
                let err = StoreError::Lease {
                    file: Some(file.clone()),
                    source: LeaseError::StoreIdentityMismatch {
                        run: run_s.clone(),
                        sealed: expect.store_id.to_string(),
                        found: m.store_id.clone(),
                    },
                };
                return Err(refuse(conn, err));
            }
        }
        let display_path = dir.display().join(name);
        Ok(OpenedStore {
            inner: Inner {
                conn: Some(conn),
                _registration: registration,
                dir,
                run: run_s,
                file,
                path: display_path,
                store_id: m.store_id,
                created_at: m.created_at,
                broken: None,
                gate: None,
            },
        })
    }

    /// Install the commit gate: a hook called at the start of every [`Store::commit`] and
    /// [`Store::seal`], before the transaction begins. If it returns an error the commit is
    /// refused with that error and nothing touches the database.
    ///
    /// The run layer plugs its self-fence check in here (`docs/PROTOCOL.md` §7.11: "a store
    /// commit checks the rule before starting"): the gate returns
    /// `LeaseError::Fenced` (converted with `?`/`into()`) once the last successful heartbeat
    /// started longer than `self_fence_after` ago. It runs on the committing thread and
    /// should be quick (read a monotonic clock and an atomic). A commit that was already
    /// running when the deadline passed is not interrupted; the run layer re-checks after
    /// the commit returns. Replaces any previous gate.
    pub fn set_commit_gate(&mut self, gate: CommitGate) {
        self.inner.gate = Some(gate);
    }

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

    /// Commit `batch` as writer `token` (its lease generation), in one `BEGIN IMMEDIATE`
    /// transaction: read the highest accepted token; if `token` is lower, roll back and
    /// refuse with `FENCED` (75); else raise the highest token to `token`, record the
    /// commit under the next sequence, apply the writes and log entries, and commit (the
    /// WAL is fsynced before this returns). Returns the new sequence.
    ///
    /// The commit gate (see [`Store::set_commit_gate`]) runs first.
    ///
    /// # Errors
    /// `FENCED` (75); the gate's error; `ARGUMENT_INVALID` (64) for a token above
    /// `i64::MAX`; `STORE_IO` (74), `STORE_CORRUPT` (65) or `STORE_INTERNAL` (70) if SQLite
    /// fails, after which this handle refuses every call. Such a failure at the final
    /// `COMMIT` (a failed fsync) leaves the outcome unknown: the commit may or may not be in
    /// the WAL, so the caller treats it as not acknowledged, reopens, and reads `head()`.
    pub fn commit(&mut self, token: Generation, batch: &Batch) -> Result<u64, StoreError> {
        self.inner.usable()?;
        self.inner.run_gate()?;
        let tok = to_i64("token", token.get())?;
        let encoded =
            codec::encode(&batch.writes).map_err(|reason| StoreError::ArgumentInvalid {
                what: "batch",
                reason,
            })?;
        let run = self.inner.run.clone();
        let file = self.inner.file.clone();
        let ctx = Ctx {
            run: &run,
            file: &file,
        };
        let conn = self.inner.conn_mut();
        let outcome = (|| -> Result<Result<u64, i64>, (&'static str, rusqlite::Error)> {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| ("begin", e))?;
            // The fencing check reads the highest accepted token inside this transaction
            // (the write lock is already held), with the head, in one statement.
            let (max, head): (i64, i64) = tx
                .prepare_cached(
                    "SELECT (SELECT max_token FROM fence WHERE singleton = 1), \
                            (SELECT COALESCE(MAX(seq), 0) FROM commits)",
                )
                .and_then(|mut s| s.query_row([], |r| Ok((r.get(0)?, r.get(1)?))))
                .map_err(|e| ("read fence", e))?;
            if tok < max {
                // Dropping `tx` rolls back; nothing was written.
                return Ok(Err(max));
            }
            if tok > max {
                tx.prepare_cached("UPDATE fence SET max_token = ?1 WHERE singleton = 1")
                    .and_then(|mut s| s.execute([tok]))
                    .map_err(|e| ("raise fence", e))?;
            }
            let seq = head.checked_add(1).ok_or((
                "next sequence",
                rusqlite::Error::IntegralValueOutOfRange(0, head),
            ))?;
            let n_writes = i64::try_from(batch.writes.len()).unwrap_or(i64::MAX);
            let n_log = i64::try_from(batch.log.len()).unwrap_or(i64::MAX);
            tx.prepare_cached(
                "INSERT INTO commits (seq, token, committed_at, write_count, log_entries, writes) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut s| s.execute(params![seq, tok, now_text(), n_writes, n_log, encoded]))
            .map_err(|e| ("record commit", e))?;
            if !batch.writes.is_empty() {
                let mut put = tx
                    .prepare_cached(
                        "INSERT INTO docs (key, value, updated_seq) VALUES (?1, ?2, ?3) \
                         ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_seq = excluded.updated_seq",
                    )
                    .map_err(|e| ("prepare writes", e))?;
                let mut del = tx
                    .prepare_cached("DELETE FROM docs WHERE key = ?1")
                    .map_err(|e| ("prepare writes", e))?;
                for w in &batch.writes {
                    match w {
                        Write::Put { key, value } => put
                            .execute(params![key, value, seq])
                            .map_err(|e| ("apply put", e))?,
                        Write::Delete { key } => {
                            del.execute([key]).map_err(|e| ("apply delete", e))?
                        }
                    };
                }
            }
            if !batch.log.is_empty() {
                let mut log = tx
                    .prepare_cached("INSERT INTO log (seq, idx, entry) VALUES (?1, ?2, ?3)")
                    .map_err(|e| ("prepare log", e))?;
                for (idx, entry) in batch.log.iter().enumerate() {
                    let idx = i64::try_from(idx).unwrap_or(i64::MAX);
                    log.execute(params![seq, idx, entry])
                        .map_err(|e| ("append log", e))?;
                }
            }
            tx.commit().map_err(|e| ("commit", e))?;
            Ok(Ok(u64::try_from(seq).unwrap_or(0)))
        })();
        match outcome {
            Ok(Ok(seq)) => Ok(seq),
            Ok(Err(max)) => Err(StoreError::Fenced {
                run: run.clone(),
                file: file.clone(),
                token: token.get(),
                max_token: from_i64(max),
            }),
            Err((op, e)) => {
                let err = sqlite_err(&ctx, op, e);
                if !matches!(err, StoreError::Busy { .. }) {
                    self.inner.broken = Some(err.to_string());
                }
                Err(err)
            }
        }
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

    /// Seal the store for a clean release by `generation` and close it: the commit gate
    /// runs; a `generation` below the highest accepted token is refused `FENCED` (a fenced
    /// owner cannot release cleanly); otherwise the highest token is raised to
    /// `generation` (so no older writer can commit after the release), the WAL is
    /// checkpointed into the file and the store closed. The returned [`Seal`] (store id,
    /// head, generation) goes into the release epoch; the next opener checks it with
    /// [`OpenedStore::check_seal`].
    pub fn seal(mut self, generation: Generation) -> Result<Seal, StoreError> {
        self.inner.usable()?;
        self.inner.run_gate()?;
        let tok = to_i64("generation", generation.get())?;
        let run = self.inner.run.clone();
        let file = self.inner.file.clone();
        let ctx = Ctx {
            run: &run,
            file: &file,
        };
        let conn = self.inner.conn_mut();
        let outcome = (|| -> Result<Result<i64, i64>, rusqlite::Error> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let max: i64 =
                tx.query_row("SELECT max_token FROM fence WHERE singleton = 1", [], |r| {
                    r.get(0)
                })?;
            if tok < max {
                return Ok(Err(max));
            }
            if tok > max {
                tx.execute("UPDATE fence SET max_token = ?1 WHERE singleton = 1", [tok])?;
            }
            let head: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM commits", [], |r| {
                r.get(0)
            })?;
            tx.commit()?;
            Ok(Ok(head))
        })();
        let head = match outcome {
            Ok(Ok(head)) => from_i64(head),
            Ok(Err(max)) => {
                return Err(StoreError::Fenced {
                    run,
                    file,
                    token: generation.get(),
                    max_token: from_i64(max),
                });
            }
            Err(e) => {
                let err = sqlite_err(&ctx, "seal", e);
                self.inner.broken = Some(err.to_string());
                return Err(err);
            }
        };
        let store_id = Identity::new(self.inner.store_id.clone())
            .map_err(|reason| ctx.corrupt(format!("its store id is not valid: {reason}")))?;
        self.inner.close()?;
        Ok(Seal {
            store_id,
            sequence: head,
            generation,
        })
    }

    /// Close the store: checkpoint the WAL into the database file (fsynced), remove the
    /// WAL, close. Dropping a `Store` without `close` loses nothing (the WAL is replayed at
    /// the next open) but does not checkpoint.
    pub fn close(mut self) -> Result<(), StoreError> {
        self.inner.usable()?;
        self.inner.close()
    }
}

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

/// A store file must have exactly one name: SQLite finds the WAL by the name it opened the
/// file under, so a store reached through another hard link would miss (and later clash
/// with) the commits in the WAL. The only second name this crate makes is the temp name it
/// creates a store under, which a crash between `link` and `unlink` can leave behind: such
/// a `.tmp-*` sibling with the same inode is removed here. Any other extra link is refused.
fn check_single_name(
    ctx: &Ctx<'_>,
    dir: &Folder,
    name: &str,
    meta: &Stat,
) -> Result<(), StoreError> {
    let entries = dir.names().map_err(|e| ctx.io("list (store folder)", e))?;
    let mut removed = false;
    for entry in entries {
        let Some(entry) = entry.to_str().filter(|n| n.starts_with(TEMP_PREFIX)) else {
            continue;
        };
        let same = matches!(dir.lstat(entry), Ok(Some(m)) if folder::key(&m) == folder::key(meta));
        if same {
            match dir.unlink(entry) {
                Ok(()) => removed = true,
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(ctx.io("remove (leftover temp name)", e)),
            }
        }
    }
    if removed {
        dir.fsync().map_err(|e| ctx.io("fsync (store folder)", e))?;
    }
    let now = dir
        .lstat(name)
        .map_err(|e| ctx.io("stat", e))?
        .ok_or_else(|| ctx.io("stat", "the file vanished while it was being opened"))?;
    if now.st_nlink > 1 {
        return Err(ctx.corrupt(format!(
            "the file has {} hard links; a store file must have exactly one name (SQLite finds its WAL by name, so another name would miss acknowledged commits)",
            now.st_nlink
        )));
    }
    Ok(())
}

impl Inner {
    fn ctx(&self) -> Ctx<'_> {
        Ctx {
            run: &self.run,
            file: &self.file,
        }
    }

    fn conn(&self) -> &Connection {
        // `conn` is only taken by `close`, which consumes the handle.
        self.conn.as_ref().expect("connection present until close")
    }

    fn conn_mut(&mut self) -> &mut Connection {
        self.conn.as_mut().expect("connection present until close")
    }

    fn usable(&self) -> Result<(), StoreError> {
        match &self.broken {
            None => Ok(()),
            Some(first) => Err(StoreError::Io {
                run: self.run.clone(),
                file: self.file.clone(),
                op: "use after a failed commit",
                detail: format!("this handle refuses further use after: {first}; reopen the store"),
            }),
        }
    }

    fn run_gate(&self) -> Result<(), StoreError> {
        match &self.gate {
            Some(gate) => gate().map_err(|e| e.in_file(&self.file)),
            None => Ok(()),
        }
    }

    fn head(&self) -> Result<u64, StoreError> {
        self.usable()?;
        let ctx = self.ctx();
        self.conn()
            .prepare_cached("SELECT COALESCE(MAX(seq), 0) FROM commits")
            .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
            .map(from_i64)
            .map_err(|e| sqlite_err(&ctx, "read head", e))
    }

    fn identity(&self) -> Result<StoreState, StoreError> {
        Ok(StoreState {
            store_id: self.store_id.clone(),
            head: self.head()?,
        })
    }

    fn close(&mut self) -> Result<(), StoreError> {
        let Some(conn) = self.conn.take() else {
            return Ok(());
        };
        let run = self.run.clone();
        let file = self.file.clone();
        let ctx = Ctx {
            run: &run,
            file: &file,
        };
        // TRUNCATE: copy every WAL frame into the file, fsync it, and empty the WAL; then
        // closing with checkpoint-on-close enabled removes the WAL file.
        let result = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, i64>(2)?,
                ))
            })
            .and_then(|(busy, _, _)| {
                if busy != 0 {
                    return Err(rusqlite::Error::SqliteFailure(
                        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY),
                        Some("checkpoint could not complete".into()),
                    ));
                }
                conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, false)
                    .map(|_| ())
            });
        if let Err(e) = result {
            self.broken = Some(e.to_string());
            return Err(sqlite_err(&ctx, "checkpoint (close)", e));
        }
        conn.close().map_err(|(_, e)| sqlite_err(&ctx, "close", e))
    }
}

impl OpenedStore {
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

    /// Check the store against the run's newest seal and store floor (from the epoch the
    /// claim replaced, `lease_core::seal::seal_of`) with [`lease_core::seal::check_seal`],
    /// and return the [`Store`] that can commit.
    ///
    /// # Errors
    /// `STORE_IDENTITY_MISMATCH` (65): the seal names another store (a restored or
    /// foreign copy never passes, whatever its head). `STORE_BEHIND_SEAL` (65): the head is
    /// below the seal's sequence or below the floor. The store is closed untouched.
    pub fn check_seal(
        self,
        seal: Option<&Seal>,
        floor: Option<(u64, Generation)>,
    ) -> Result<Store, StoreError> {
        let state = self.inner.identity()?;
        let run = RunId::new(self.inner.run.clone())?;
        lease_core::seal::check_seal(&run, seal, floor, &state).map_err(|source| {
            StoreError::Lease {
                file: Some(self.inner.file.clone()),
                source,
            }
        })?;
        Ok(Store { inner: self.inner })
    }

    /// Close without using the store (nothing is written, no checkpoint).
    pub fn close(self) {
        drop(self);
    }
}
