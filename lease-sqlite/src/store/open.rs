//! Opening a store: the folder, the file's kind and header, the registry, SQLite's
//! lock and checks, the durability settings, the expected identity.

use super::create::{TempNames, check_single_name, create_store};
use super::sqlite::{apply_durability, connect, journal_name, sqlite_err, wal_name};
use super::validate::{Meta, validate};
use super::{Inner, OpenedStore, Store, StoreOptions};
use crate::error::StoreError;
use crate::folder::{self, Folder};
use crate::header::{self, Ctx};
use crate::registry::Registration;
use crate::schema::Kind;
use lease_core::{LeaseError, RunId};
use rusqlite::Connection;
use rusqlite::config::DbConfig;
use rustix::fd::OwnedFd;
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

impl Store {
    /// Open the store file at `path` (normally `<run>/store/run.sqlite`, see
    /// `docs/PROTOCOL.md` §2) for run `run`.
    ///
    /// Checks, in this order, before anything is written: the path is a regular file (not
    /// a symlink or directory); it and its folder (and a `-wal` or `-journal` beside it)
    /// are owned by the effective uid and not writable by group or others; this process
    /// does not already have it open; its header is SQLite's with our schema version;
    /// SQLite's exclusive lock can be taken; the schema is exactly the one a store is
    /// created with (the pin, see the crate docs) and the store identity is there;
    /// `PRAGMA quick_check` passes; the durability settings read back as set. A missing file is created (whole, then linked into place)
    /// only if `options.create` is set and no particular store is expected.
    ///
    /// The result can report its identity and head; [`OpenedStore::check_seal`] turns it
    /// into a [`Store`] that commits.
    ///
    /// # Errors
    /// `STORE_CORRUPT` (65), `STORE_MISSING` (65), `STORE_IDENTITY_MISMATCH` (65),
    /// `SCHEMA_UNSUPPORTED` (70), `STORE_PRAGMA` (70), `STORE_BUSY` (75), `STORE_IO` (74),
    /// `RUN_NOT_OWNED` (77). A refused file is left byte for byte as it was.
    pub fn open(
        run: &RunId,
        path: impl AsRef<Path>,
        options: StoreOptions,
    ) -> Result<OpenedStore, StoreError> {
        let path = path.as_ref();
        Ctx::with(run, path, |ctx| Store::open_path(ctx, path, options))
    }

    /// Open the store at `path` as the lease chain requires and check it, in one call: the
    /// options from the requirements ([`StoreOptions::for_chain`]: created only when the
    /// chain names no store, the sealed identity expected otherwise), then
    /// [`OpenedStore::check`] against the seal and floor. `req` comes from the chain
    /// (`lease_core::LeaseOps::store_requirements` of the owner's generation), or is
    /// `Requirements::no_chain()` for a store used on its own.
    ///
    /// ```
    /// use lease_core::{Generation, RunId, seal::Requirements};
    /// use lease_sqlite::{Batch, Store};
    /// let dir = tempfile::tempdir()?;
    /// let path = dir.path().join("store/run.sqlite");
    /// let run = RunId::new("job")?;
    /// let mut store = Store::open_for_chain(&run, &path, &Requirements::no_chain())?;
    /// let g = Generation::new(1).unwrap();
    /// assert_eq!(store.commit(g, &Batch::new().put("k", "v"))?, 1);
    /// let seal = store.seal(g)?;
    /// // The next owner's chain names that seal: the same call now expects that store.
    /// let next = Requirements::new(Some(seal), None);
    /// assert_eq!(Store::open_for_chain(&run, &path, &next)?.head()?, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// Those of [`Store::open`] and [`OpenedStore::check`]; a refused file is left byte for
    /// byte as it was.
    pub fn open_for_chain(
        run: &RunId,
        path: impl AsRef<Path>,
        req: &lease_core::seal::Requirements,
    ) -> Result<Store, StoreError> {
        Store::open(run, path, StoreOptions::for_chain(req))?.check(req)
    }

    /// [`Store::open`] with the context its errors name.
    fn open_path(
        ctx: &Ctx<'_>,
        path: &Path,
        options: StoreOptions,
    ) -> Result<OpenedStore, StoreError> {
        let (name, parent) = name_and_parent(path)?;
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
        let dir = open_parent(ctx, &parent)?;
        Store::open_folder(ctx, dir, name, options, Kind::Store)
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
        options: StoreOptions,
    ) -> Result<OpenedStore, StoreError> {
        in_held(run, dir, dir_path, name, |ctx, dir| {
            Store::open_folder(ctx, dir, name, options, Kind::Store)
        })
    }

    /// Open the file `name` in `dir` as a file of `kind` (its schema version and pin; a
    /// view also has its `engine_view` row checked). Only a local store is ever created
    /// here (`options.create`); a view is created whole by the view's build
    /// (`view::build_view`), which removes a stale WAL first.
    pub(super) fn open_folder(
        ctx: &Ctx<'_>,
        dir: Folder,
        name: &str,
        options: StoreOptions,
        kind: Kind,
    ) -> Result<OpenedStore, StoreError> {
        let (run_s, file) = (ctx.run.to_string(), ctx.file.to_string());
        let lstat = |n: &str| dir.lstat(n).map_err(|e| ctx.io("stat", e));
        // The (dev, ino) of a store this open created, whose only name is `name`.
        let mut created = None;
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
                if !options.create || kind != Kind::Store {
                    return Err(StoreError::Missing {
                        run: run_s.clone(),
                        file: file.clone(),
                        detail: "it was opened without create".into(),
                    });
                }
                created = create_store(ctx, &dir, name)?;
                lstat(name)?.ok_or_else(|| {
                    ctx.io("open", "the new store vanished right after it was created")
                })?
            }
        };
        header::check_kind(ctx, &meta)?;
        // Trust (issue #29), before anything can be written: the folder (its descriptor)
        // and the file (its lstat here; `header::check` repeats it on the descriptor).
        trusted_folder_and_file(ctx, &dir, name, &meta)?;
        let key = folder::key(&meta);
        let registration = Registration::take(key).ok_or_else(|| StoreError::Busy {
            run: run_s.clone(),
            file: file.clone(),
            detail: "this process already has it open; only one connection per store file per process is allowed (closing a second descriptor would drop SQLite's POSIX locks)".into(),
        })?;
        // A store this open just created has one name whatever the link count says (a
        // FUSE file system can report the count from before the temp name was removed).
        if meta.st_nlink > 1 && created != Some(key) {
            check_single_name(ctx, &dir, name, &meta, TempNames::Remove)?;
        }
        // The WAL and a rollback journal, which SQLite reads into the database: regular
        // files, ours, not writable by others (each judged on a descriptor).
        let wal_meta = header::check_side(ctx, &dir, &wal_name(name))?;
        header::check_side(ctx, &dir, &journal_name(name))?;
        let wal_len = wal_meta.map(|m| m.st_size);
        header::check(ctx, &dir, name, &meta, wal_len.unwrap_or(0) == 0, kind)?;

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
        let m = match validate(ctx, &conn, kind) {
            Ok(m) => m,
            Err(e) => return Err(refuse(conn, e)),
        };
        match apply_durability(&conn, kind) {
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
                    error: LeaseError::StoreIdentityMismatch {
                        run: run_s.clone(),
                        sealed: expect.store_id.to_string(),
                        found: m.store_id.clone(),
                    },
                };
                return Err(refuse(conn, err));
            }
        }
        Ok(OpenedStore {
            inner: opened_inner(ctx, conn, registration, dir, name, m, kind),
        })
    }
}

/// The handle's state once its file `name` in `dir` is open as `conn` and checked (`m`):
/// usable, no commit gate yet.
pub(super) fn opened_inner(
    ctx: &Ctx<'_>,
    conn: Connection,
    registration: Registration,
    dir: Folder,
    name: &str,
    m: Meta,
    kind: Kind,
) -> Inner {
    let display_path = dir.display().join(name);
    Inner {
        conn: Some(conn),
        _registration: registration,
        dir,
        run: ctx.run.to_string(),
        file: ctx.file.to_string(),
        path: display_path,
        store_id: m.store_id,
        created_at: m.created_at,
        bound: m.app_id != 0,
        broken: None,
        gate: None,
        kind,
    }
}

/// The folder holding a store file, opened by path (the only path lookup of an open); a
/// missing folder is `STORE_MISSING`, a symlink or a non-directory `STORE_CORRUPT`.
pub(super) fn open_parent(ctx: &Ctx<'_>, parent: &Path) -> Result<Folder, StoreError> {
    match Folder::open(parent) {
        Ok(d) => Ok(d),
        Err(e) if e.kind() == ErrorKind::NotFound => Err(StoreError::Missing {
            run: ctx.run.to_string(),
            file: ctx.file.to_string(),
            detail: format!("its folder {} does not exist", parent.display()),
        }),
        Err(e)
            if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
                || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) =>
        {
            Err(ctx.corrupt(format!(
                "its folder {} is a symbolic link or not a directory (store files are never reached through a symlink)",
                parent.display()
            )))
        }
        // The kernel refused the folder (another uid's `0700` folder): judged like a
        // folder that opens, by its owner and mode, so another user's store is
        // `RUN_NOT_OWNED` whether or not its folder can be searched. The `lstat` only
        // words the refusal; nothing is read or written through it.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::ACCESS.raw_os_error()) => {
            match rustix::fs::lstat(parent) {
                Ok(st) if folder::kind(&st) == rustix::fs::FileType::Directory => {
                    header::check_trusted_stat(ctx, &folder_name(parent), parent, &st)?;
                }
                _ => {}
            }
            Err(ctx.io("open (store folder)", e))
        }
        Err(e) => Err(ctx.io("open (store folder)", e)),
    }
}

/// A store path's file name (UTF-8) and its folder (`.` when it has none).
pub(super) fn name_and_parent(path: &Path) -> Result<(&str, PathBuf), StoreError> {
    let name =
        path.file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| StoreError::ArgumentInvalid {
                what: "store path",
                reason: format!("{} does not end in a UTF-8 file name", path.display()),
            })?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((name, parent))
}

/// The store folder descriptor a caller opened, once `name` is known to be a plain file
/// name (`ARGUMENT_INVALID` otherwise).
pub(super) fn held_folder(
    ctx: &Ctx<'_>,
    dir: OwnedFd,
    dir_path: &Path,
    name: &str,
) -> Result<Folder, StoreError> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(StoreError::ArgumentInvalid {
            what: "store file name",
            reason: format!("{name:?} is not a plain file name"),
        });
    }
    Folder::from_fd(dir, dir_path.to_path_buf()).map_err(|e| ctx.io("open (store folder)", e))
}

/// Call `f` with the folder `dir`, a descriptor the caller opened at `dir_path`, held for
/// the store file `name` ([`held_folder`]), and the context that file's errors name.
pub(super) fn in_held<T>(
    run: &RunId,
    dir: OwnedFd,
    dir_path: &Path,
    name: &str,
    f: impl FnOnce(&Ctx<'_>, Folder) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    Ctx::with(run, &dir_path.join(name), |ctx| {
        let dir = held_folder(ctx, dir, dir_path, name)?;
        f(ctx, dir)
    })
}

/// Call `f` with the store folder `store_dir`, opened by path ([`open_parent`]), and the
/// context the errors of its file `name` name.
pub(super) fn in_parent<T>(
    run: &RunId,
    store_dir: &Path,
    name: &str,
    f: impl FnOnce(&Ctx<'_>, Folder) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    Ctx::with(run, &store_dir.join(name), |ctx| {
        let dir = open_parent(ctx, store_dir)?;
        f(ctx, dir)
    })
}

/// How a trust refusal names the store's folder: its last component (`.` when none).
fn folder_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(|| ".".to_string(), |n| n.to_string_lossy().into_owned())
}

/// The trust check of the held folder (`fstat` of its descriptor) and of the store file's
/// `lstat` (issue #29): owned by the effective uid, not writable by group or others.
pub(super) fn trusted_folder_and_file(
    ctx: &Ctx<'_>,
    dir: &Folder,
    name: &str,
    meta: &rustix::fs::Stat,
) -> Result<(), StoreError> {
    let st = dir.stat().map_err(|e| ctx.io("fstat (store folder)", e))?;
    header::check_trusted_stat(ctx, &folder_name(dir.display()), dir.display(), &st)?;
    header::check_trusted_stat(ctx, name, Path::new(ctx.file), meta)
}
