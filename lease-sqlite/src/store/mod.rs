//! The store: open (and create), the seal check, commits with the fencing-token check,
//! reads, seal and close.

mod commit;
mod create;
mod open;
mod opened;
mod position;
mod read;
mod read_only;
mod sqlite;
mod types;
mod validate;
mod view;

pub use position::ViewPosition;
pub use sqlite::WAL_AUTOCHECKPOINT_PAGES;
pub use types::{Batch, Commit, Document, Expected, MAX_COMMIT_BYTES, StoreOptions, Write};
pub use view::VIEW_FILE_NAME;

use crate::error::StoreError;
use crate::folder::Folder;
use crate::header::Ctx;
use crate::registry::Registration;
use crate::schema::Kind;
use lease_core::seal::StoreState;
use rusqlite::Connection;
use rusqlite::config::DbConfig;
use sqlite::{from_i64, sqlite_err};
use std::path::PathBuf;

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
    /// The store carries this run's `application_id` (false only for a store created
    /// before stores were bound to their run: bound by the first accepted seal check).
    bound: bool,
    /// Set when a commit failed in a way that leaves this handle untrustworthy (I/O error,
    /// corruption, an unexpected SQLite error): every later call is refused.
    broken: Option<String>,
    gate: Option<CommitGate>,
    /// A local store (schema version 1: [`Store::commit`]) or a view of the engine's
    /// store log (version 2: only [`Store::apply_record`] changes it).
    kind: Kind,
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
/// use lease_sqlite::{Batch, StoreOptions, Store};
///
/// fn skip_the_seal(path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
///     let mut opened = Store::open(&RunId::new("demo")?, path, StoreOptions::default())?;
///     opened.commit(Generation::new(1).unwrap(), &Batch::new())?; // no such method
///     Ok(())
/// }
/// ```
pub struct OpenedStore {
    inner: Inner,
}

/// A store opened to read only, by a process that is not its owner
/// ([`Store::open_read_only`]): no write of any kind reaches its folder (no lock, no
/// `-shm`, no WAL replay, no checkpoint); it has the reading methods of a [`Store`] and
/// nothing else.
pub struct ReadOnlyStore {
    inner: Inner,
}

impl std::fmt::Debug for ReadOnlyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.debug_as("ReadOnlyStore", f)
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.debug_as("Store", f)
    }
}

impl std::fmt::Debug for OpenedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.debug_as("OpenedStore", f)
    }
}

impl Inner {
    /// The `Debug` form every handle shares: its type name, run, file and store id.
    fn debug_as(&self, name: &str, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(name)
            .field("run", &self.run)
            .field("file", &self.file)
            .field("store_id", &self.store_id)
            .finish_non_exhaustive()
    }

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

    /// The context of this store's errors with its connection, borrowed together: a
    /// transaction on the connection names the store in its errors.
    fn ctx_and_conn(&mut self) -> (Ctx<'_>, &mut Connection) {
        let conn = self.conn.as_mut().expect("connection present until close");
        let ctx = Ctx {
            run: &self.run,
            file: &self.file,
        };
        (ctx, conn)
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

    /// Refuse `op` (`ARGUMENT_INVALID`) unless this handle's file is of `kind`: a local
    /// store commits and seals, a view only applies records of the engine's log.
    fn must_be(&self, kind: Kind, op: &str) -> Result<(), StoreError> {
        if self.kind == kind {
            return Ok(());
        }
        let why = match self.kind {
            Kind::View => {
                "it is a view of the engine's store log, which only apply_record changes (so its commits always match its position in the log)"
            }
            Kind::Store => {
                "it is a local store; only a view of the engine's store log (store/view.sqlite) applies the log's records"
            }
        };
        Err(StoreError::ArgumentInvalid {
            what: "store kind",
            reason: format!(
                "run {}: {op} refused on {}: {why}; nothing was written",
                self.run, self.file
            ),
        })
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
        let ctx = self.ctx();
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
            let first = e.to_string();
            let err = sqlite_err(&ctx, "checkpoint (close)", e);
            self.broken = Some(first);
            return Err(err);
        }
        conn.close().map_err(|(_, e)| sqlite_err(&ctx, "close", e))
    }
}
