//! Reading a store without being its owner (issue #20: `runlease store get/list/log` on a
//! free run), writing nothing at all.
//!
//! What SQLite does with a read-only open of a WAL-mode store is pinned down by
//! `tests/readonly_facts.rs`: in shared locking mode it creates `-shm` (a write), in
//! exclusive mode it fails, and with `immutable=1` it writes nothing and takes no lock,
//! reading the database file alone: whole after a clean close (the owner's close
//! checkpoints and removes the WAL), stale when a crashed owner left a `-wal`. So this open
//! uses `immutable=1` and refuses when a non-empty `-wal` is there (`NeedsOwner`, `STORE_BUSY`
//! 75; an empty one holds no frame).
//! Because `immutable` takes no lock, **the caller must keep owners out while it reads**
//! (lease-run takes the run's kernel owner lock first); the open re-checks that no `-wal`
//! appeared and that the name is still the file it checked.

use super::create::{TempNames, check_single_name};
use super::open::{in_held, name_and_parent, open_parent, opened_inner, trusted_folder_and_file};
use super::sqlite::{harden, journal_name, sqlite_err, wal_name};
use super::validate::validate;
use super::{ReadOnlyStore, Store};
use crate::error::StoreError;
use crate::folder::{self, Folder};
use crate::header::{self, Ctx};
use crate::registry::Registration;
use crate::schema::Kind;
use lease_core::RunId;
use rusqlite::{Connection, OpenFlags};
use rustix::fd::OwnedFd;
use std::path::Path;

impl Store {
    /// Open the store file at `path` of run `run` to read only, writing nothing (see the
    /// module docs: the caller keeps owners out meanwhile). The checks of [`Store::open`]
    /// that only read apply (file kind, one name, header, schema, run binding, integrity);
    /// nothing is created, migrated, locked or replayed.
    ///
    /// # Errors
    /// `STORE_MISSING` (65) when there is no store yet; `STORE_BUSY` (75) when this process
    /// already has it open, or when a `-wal` left by an owner that did not close it holds
    /// commits only an owner's open replays ([`StoreError::NeedsOwner`]); otherwise as
    /// [`Store::open`]. The files are left byte for byte as they were.
    pub fn open_read_only(
        run: &RunId,
        path: impl AsRef<Path>,
    ) -> Result<ReadOnlyStore, StoreError> {
        let path = path.as_ref();
        let (name, parent) = name_and_parent(path)?;
        Ctx::with(run, path, |ctx| {
            let dir = open_parent(ctx, &parent)?;
            read_only_in_folder(ctx, dir, name, Kind::Store)
        })
    }

    /// [`Store::open_read_only`] for the file `name` in the folder `dir`, a descriptor the
    /// caller opened (lease-run passes `store/`, opened beneath the run's held root);
    /// `dir_path` is used only in messages.
    ///
    /// # Errors
    /// As [`Store::open_read_only`]; `ARGUMENT_INVALID` if `name` is not a plain file name.
    pub fn open_read_only_in(
        run: &RunId,
        dir: OwnedFd,
        dir_path: &Path,
        name: &str,
    ) -> Result<ReadOnlyStore, StoreError> {
        in_held(run, dir, dir_path, name, |ctx, dir| {
            read_only_in_folder(ctx, dir, name, Kind::Store)
        })
    }

    /// [`Store::open_read_only_in`] for the view of the engine's store log,
    /// [`crate::VIEW_FILE_NAME`] in the folder `dir` (`store/`): the same checks, with a
    /// view's schema (version 2) and its `engine_view` row; writes nothing. Its
    /// [`ReadOnlyStore::view_position`] says which record it has applied.
    ///
    /// # Errors
    /// As [`Store::open_read_only`]; a local store (schema version 1) under the view's
    /// name is `SCHEMA_UNSUPPORTED` (70).
    pub fn open_view_read_only_in(
        run: &RunId,
        dir: OwnedFd,
        dir_path: &Path,
    ) -> Result<ReadOnlyStore, StoreError> {
        let name = crate::VIEW_FILE_NAME;
        in_held(run, dir, dir_path, name, |ctx, dir| {
            read_only_in_folder(ctx, dir, name, Kind::View)
        })
    }
}

/// `?`, `#` and `%` percent-encoded: what an SQLite URI's path may not hold as is.
fn uri_path(p: &Path) -> String {
    let mut out = String::new();
    for c in p.to_string_lossy().chars() {
        match c {
            '?' => out.push_str("%3f"),
            '#' => out.push_str("%23"),
            '%' => out.push_str("%25"),
            c => out.push(c),
        }
    }
    out
}

fn read_only_in_folder(
    ctx: &Ctx<'_>,
    dir: Folder,
    name: &str,
    kind: Kind,
) -> Result<ReadOnlyStore, StoreError> {
    let lstat = |n: &str| dir.lstat(n).map_err(|e| ctx.io("stat", e));
    let wal_left = |ctx: &Ctx<'_>, len: i64| StoreError::NeedsOwner {
        run: ctx.run.to_string(),
        file: ctx.file.to_string(),
        detail: format!(
            "a write-ahead log ({len} bytes) is left beside it by an owner that did not close it (a crash or a kill), and its last commits may be only there; only an owner's open replays it. Read it after the next owner's open"
        ),
    };
    let Some(meta) = lstat(name)? else {
        return Err(StoreError::Missing {
            run: ctx.run.to_string(),
            file: ctx.file.to_string(),
            detail: "no owner has created it yet".into(),
        });
    };
    header::check_kind(ctx, &meta)?;
    trusted_folder_and_file(ctx, &dir, name, &meta)?;
    let key = folder::key(&meta);
    // One connection per file per process: closing a second descriptor of the file
    // would drop the POSIX locks of this process's owner connection, if it has one.
    let registration = Registration::take(key).ok_or_else(|| StoreError::Busy {
        run: ctx.run.to_string(),
        file: ctx.file.to_string(),
        detail: "this process already has it open; only one connection per store file per process is allowed".into(),
    })?;
    if meta.st_nlink > 1 {
        check_single_name(ctx, &dir, name, &meta, TempNames::Tolerate)?;
    }
    // An empty WAL (an owner killed before its first write since its last checkpoint)
    // holds no frame: the database file alone is the whole store.
    let wal = wal_name(name);
    // Judged (kind, owner, mode on a descriptor) even though `immutable` reads neither.
    header::check_side(ctx, &dir, &journal_name(name))?;
    if let Some(w) = header::check_side(ctx, &dir, &wal)?.filter(|w| w.st_size > 0) {
        return Err(wal_left(ctx, w.st_size));
    }
    header::check(ctx, &dir, name, &meta, true, kind)?;
    let (target, vfs) = dir.sqlite_target(name);
    // immutable: no lock, no -shm, no WAL; read-only: nothing written.
    let uri = format!("file:{}?immutable=1", uri_path(&target));
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NOFOLLOW
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_EXRESCODE;
    let conn = match vfs {
        Some(v) => Connection::open_with_flags_and_vfs(&uri, flags, v),
        None => Connection::open_with_flags(&uri, flags),
    }
    .map_err(|e| sqlite_err(ctx, "open (read-only)", e))?;
    harden(&conn).map_err(|e| sqlite_err(ctx, "configure (read-only)", e))?;
    let m = validate(ctx, &conn, kind)?;
    // Still the file checked, and still no WAL (an owner that opened meanwhile: the caller
    // did not keep owners out, and what was read may be stale).
    match dir.lstat(name) {
        Ok(Some(now)) if folder::key(&now) == key => {}
        _ => return Err(ctx.corrupt("the file was replaced while it was being opened")),
    }
    if let Some(w) = lstat(&wal)?.filter(|w| w.st_size > 0) {
        return Err(wal_left(ctx, w.st_size));
    }
    Ok(ReadOnlyStore {
        inner: opened_inner(ctx, conn, registration, dir, name, m, kind),
    })
}
