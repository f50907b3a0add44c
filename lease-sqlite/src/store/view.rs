//! A view of the engine's store log (issue #32): with an engine (etcd) as the run's
//! authority, the run's commits are immutable records in the engine
//! ([`lease_core::store_log::StoreRecord`]) and each host's SQLite file is only a local,
//! rebuildable view of that log, `store/view.sqlite` ([`VIEW_FILE_NAME`], schema version
//! 2: a local store's tables plus `engine_view`, the position of the log it has applied).
//!
//! - [`Store::open_view_in`] opens it (creating an empty view at position 0 when asked);
//! - [`Store::apply_record`] applies one record in one transaction: the position check,
//!   the fencing check and the commits of [`Store::commit_group`], and the new position;
//! - [`Store::image`] serializes the whole database (a snapshot's bytes);
//! - [`Store::build_view_in`] replaces the view with an image (or an empty view), checked
//!   before anything of the old view is touched.

use super::create::{TEMP_PREFIX, build_new_store, remove_temp_names};
use super::open::{in_held, in_parent};
use super::position::{ViewPosition, ViewStep, view_position};
use super::sqlite::{random_hex, sqlite_err};
use super::{Batch, Store, StoreOptions};
use crate::error::StoreError;
use crate::folder::{self, Folder};
use crate::header::Ctx;
use crate::registry::Registration;
use crate::schema::Kind;
use lease_core::{Generation, RunId};
use rustix::fd::OwnedFd;
use rustix::fs::FileType;
use std::io::{ErrorKind, Write as _};
use std::path::Path;

/// The view's file name in the run's `store/` folder (beside the local store's
/// `run.sqlite`, `lease_core::layout`'s `STORE_FILE`).
pub const VIEW_FILE_NAME: &str = "view.sqlite";

impl Store {
    /// Open the view of the engine's store log, [`VIEW_FILE_NAME`] in the folder `dir` (a
    /// descriptor the caller opened: the run layer's `store/` beneath the run's held root;
    /// `dir_path` is used only in messages), with every check of [`Store::open_in`]
    /// (trust of the file, its folder and side files; one connection per file per
    /// process; header; the schema pin, here of version 2; run binding; `quick_check`;
    /// durability settings) and the view's own: its `engine_view` row is a position and
    /// names its last commit. A missing view is created empty (position
    /// [`ViewPosition::EMPTY`], by [`Store::build_view_in`]) when `create` is set.
    ///
    /// The handle returned commits only through [`Store::apply_record`] (with the fencing
    /// check of every commit); there is no seal check: the engine's log, not a seal, says
    /// what a view must hold, so the caller compares [`Store::view_position`] with it.
    ///
    /// # Errors
    /// As [`Store::open_in`]; a local store (schema version 1) under the view's name is
    /// `SCHEMA_UNSUPPORTED` (70), never migrated; `STORE_MISSING` (65) when there is no
    /// view and `create` is not set.
    pub fn open_view_in(
        run: &RunId,
        dir: OwnedFd,
        dir_path: &Path,
        create: bool,
    ) -> Result<Store, StoreError> {
        in_held(run, dir, dir_path, VIEW_FILE_NAME, |ctx, dir| {
            open_view_folder(ctx, dir, create)
        })
    }

    /// [`Store::open_view_in`] for the run's store folder at `store_dir` (opened here,
    /// never through a symlink in its last component; it must exist).
    ///
    /// # Errors
    /// As [`Store::open_view_in`].
    pub fn open_view(
        run: &RunId,
        store_dir: impl AsRef<Path>,
        create: bool,
    ) -> Result<Store, StoreError> {
        in_parent(run, store_dir.as_ref(), VIEW_FILE_NAME, |ctx, dir| {
            open_view_folder(ctx, dir, create)
        })
    }

    /// Whether this handle is a view of the engine's store log (schema version 2) rather
    /// than a local store.
    pub fn is_view(&self) -> bool {
        self.inner.kind == Kind::View
    }

    /// Apply one record of the engine's store log to this view, in **one** `BEGIN
    /// IMMEDIATE` transaction: the view must be at the record before (its last record
    /// `to.record_seq - 1` and its last commit `first_commit - 1`), then exactly what
    /// [`Store::commit_group`]`(token, batches)` does (the commit gate, the fencing check
    /// with the record's generation, one commit per batch with sequences `first_commit`,
    /// `first_commit + 1`, ...), then the view's position is set to `to` (whose `commits`
    /// must be the last batch's sequence; a record without batches only moves the
    /// position). Returns the batches' sequences.
    ///
    /// All or nothing: a crash leaves the view at its old position with its old commits or
    /// at `to` with the record's, never between (both are in the same WAL commit).
    ///
    /// # Errors
    /// `CONCURRENT_CHANGE` (75, [`StoreError::ViewNotAt`]): the view is not at the record
    /// before; `FENCED` (75): `token` is below the highest the view has accepted;
    /// `ARGUMENT_INVALID` (64): this is a local store, or `to` is not the position after
    /// the record (`record_seq` 0, no hash, `commits` not `first_commit - 1 +
    /// batches.len()`); otherwise as [`Store::commit_group`]. Nothing is written on a
    /// refusal.
    pub fn apply_record(
        &mut self,
        token: Generation,
        first_commit: u64,
        batches: &[Batch],
        to: &ViewPosition,
    ) -> Result<Vec<u64>, StoreError> {
        self.inner.must_be(Kind::View, "apply_record")?;
        to.check("record position")?;
        let count = u64::try_from(batches.len()).unwrap_or(u64::MAX);
        let last = first_commit
            .checked_sub(1)
            .and_then(|before| before.checked_add(count));
        if to.record_seq == 0 || first_commit == 0 || last != Some(to.commits) {
            return Err(StoreError::ArgumentInvalid {
                what: "record position",
                reason: format!(
                    "a record of {count} commits from commit {first_commit} ends at its last commit, and a record has a sequence of at least 1; it was to move the view to {}",
                    to.describe()
                ),
            });
        }
        self.commit_in_tx(token, batches, Some(ViewStep { first_commit, to }))
    }

    /// Replace the view of the engine's store log, [`VIEW_FILE_NAME`] in the folder `dir`
    /// (the run layer's `store/`), with `image` (the bytes of [`Store::image`], a
    /// snapshot's) or, when `None`, an empty view; it must then be at `expect` (an empty
    /// view at [`ViewPosition::EMPTY`]).
    ///
    /// The new file is built and checked whole under a temp name before anything of the
    /// old view is touched: it must open as a view of this run (the checks of
    /// [`Store::open_view_in`]: trust, header, the pinned schema of version 2, run
    /// binding, `quick_check`, `engine_view` naming its last commit) and be at `expect`.
    /// Refused, it is removed and the old view is left as it was.
    ///
    /// Order of writes (every call relative to `dir`):
    /// 1. remove what an earlier, interrupted build left (`.tmp-*-view-*`);
    /// 2. create `.tmp-<pid>-view-<random>` (`O_EXCL`, 0600), write the image (or build an
    ///    empty view in it), fsync it;
    /// 3. open it as a view and check it (SQLite may create `<temp>-wal`), then close it
    ///    (checkpointed, its WAL removed) and fsync it again;
    /// 4. rename the old `view.sqlite`, if any, aside to `.tmp-<pid>-view-old-<random>`;
    /// 5. unlink `view.sqlite-wal` and `view.sqlite-journal`; fsync `dir`;
    /// 6. rename the temp file to `view.sqlite`; fsync `dir`;
    /// 7. unlink the old view set aside; fsync `dir`.
    ///
    /// Why this order: SQLite finds a WAL by the database's name and replays any WAL whose
    /// header and frame checksums are valid, whatever database it was written for, so an
    /// old view's `view.sqlite-wal` beside the new file would be replayed onto it
    /// (`tests/view.rs` shows it). The old WAL therefore goes before the new file gets the
    /// name, and that removal is made durable (step 5's fsync) before the rename is. And a
    /// WAL is never removed while its own database still has the name `view.sqlite`: the
    /// old file may be only whole with its WAL (a checkpoint interrupted by a crash leaves
    /// the file half old, half new, which only the WAL's replay mends), so it is moved
    /// aside first (step 4). A crash therefore leaves, at every point, either the old view
    /// with its WAL (before 4), or no view at all (4 to 6; the next open says
    /// `STORE_MISSING` and the caller builds again, which removes the leftovers), or the
    /// new view without any WAL (after 6): never the old view without its WAL, never the
    /// new one with the old WAL.
    ///
    /// The caller keeps other processes from opening or building this view meanwhile (the
    /// run layer holds the run's owner lock); this process must not have it open
    /// (`STORE_BUSY`).
    ///
    /// # Errors
    /// `ARGUMENT_INVALID` (64): `expect` is not a position, or not
    /// [`ViewPosition::EMPTY`] without an image. For an image refused: `STORE_CORRUPT`
    /// (65: not SQLite, damaged, an object the schema does not have, not at `expect`),
    /// `SCHEMA_UNSUPPORTED` (70: a local store's image, or another version),
    /// `STORE_IDENTITY_MISMATCH` (65: another run's). `STORE_BUSY` (75): this process has
    /// the view open. `STORE_IO` (74) from a system call; after step 4 the view may then
    /// be missing (build again).
    pub fn build_view_in(
        run: &RunId,
        dir: OwnedFd,
        dir_path: &Path,
        image: Option<&[u8]>,
        expect: &ViewPosition,
    ) -> Result<(), StoreError> {
        in_held(run, dir, dir_path, VIEW_FILE_NAME, |ctx, dir| {
            build_view(ctx, &dir, image, expect, None)
        })
    }

    /// [`Store::build_view_in`] for the run's store folder at `store_dir` (opened here,
    /// never through a symlink in its last component; it must exist).
    ///
    /// # Errors
    /// As [`Store::build_view_in`].
    pub fn build_view(
        run: &RunId,
        store_dir: impl AsRef<Path>,
        image: Option<&[u8]>,
        expect: &ViewPosition,
    ) -> Result<(), StoreError> {
        in_parent(run, store_dir.as_ref(), VIEW_FILE_NAME, |ctx, dir| {
            build_view(ctx, &dir, image, expect, None)
        })
    }
}

/// Open the view in `dir`, first building an empty one if it is missing and `create`.
fn open_view_folder(ctx: &Ctx<'_>, dir: Folder, create: bool) -> Result<Store, StoreError> {
    if create
        && dir
            .lstat(VIEW_FILE_NAME)
            .map_err(|e| ctx.io("stat", e))?
            .is_none()
    {
        build_view(ctx, &dir, None, &ViewPosition::EMPTY, None)?;
    }
    let opened = Store::open_folder(
        ctx,
        dir,
        VIEW_FILE_NAME,
        StoreOptions::default(),
        Kind::View,
    )?;
    Ok(Store {
        inner: opened.inner,
    })
}

/// The points between the writes of [`build_view`], where the tests stop it as a crash
/// would (`stop`): every file is left as it is at that point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// The temp file is written and fsynced (step 2).
    Written,
    /// It was opened, checked and closed (step 3).
    Checked,
    /// The old view is renamed aside (step 4).
    MovedAside,
    /// The old WAL and journal are removed, the folder fsynced (step 5).
    SideFilesRemoved,
    /// The new view has the name, the folder fsynced (step 6).
    Renamed,
}

/// [`Store::build_view_in`]'s work in the held folder `dir`, stopped after `stop` (tests).
pub(super) fn build_view(
    ctx: &Ctx<'_>,
    dir: &Folder,
    image: Option<&[u8]>,
    expect: &ViewPosition,
    stop: Option<Step>,
) -> Result<(), StoreError> {
    expect.check("expected view position")?;
    if image.is_none() && *expect != ViewPosition::EMPTY {
        return Err(StoreError::ArgumentInvalid {
            what: "expected view position",
            reason: format!(
                "an empty view is at record 0, commit 0, not at {}",
                expect.describe()
            ),
        });
    }
    let name = VIEW_FILE_NAME;
    let old = dir.lstat(name).map_err(|e| ctx.io("stat", e))?;
    // The old view is never replaced under a handle of this process (its close would
    // checkpoint into the old file and remove `view.sqlite-wal` by name, perhaps the new
    // view's); held until the end so no open of this process starts meanwhile.
    let _old_registration = match &old {
        None => None,
        Some(m) => match folder::kind(m) {
            FileType::RegularFile => {
                Some(
                    Registration::take(folder::key(m)).ok_or_else(|| StoreError::Busy {
                        run: ctx.run.to_string(),
                        file: ctx.file.to_string(),
                        detail: "this process has the view open; close it before building it again"
                            .into(),
                    })?,
                )
            }
            // A symlink is replaced, never followed (renameat moves the link itself).
            FileType::Symlink => None,
            _ => {
                return Err(ctx.corrupt(
                    "it is a directory or not a regular file, which a view build does not replace; move it out of the run by hand",
                ));
            }
        },
    };
    // 1. What an interrupted build left: its temp file (and the temp's WAL), or an old
    //    view set aside. The caller keeps other builders out, so none is in use.
    remove_leftovers(ctx, dir)?;
    let suffix = random_hex(8).map_err(|e| ctx.io("getrandom", e))?;
    let pid = std::process::id();
    let tmp = format!("{TEMP_PREFIX}{pid}-view-{suffix}");
    let aside = format!("{TEMP_PREFIX}{pid}-view-old-{suffix}");
    let tmp_file = dir.display().join(&tmp).display().to_string();
    let tmp_ctx = Ctx {
        run: ctx.run,
        file: &tmp_file,
    };
    // 2 and 3, the old view untouched; a refused file is removed.
    match write_and_check(&tmp_ctx, dir, &tmp, image, expect, stop) {
        Ok(true) => {}
        Ok(false) => return Ok(()),
        Err(e) => {
            for n in [tmp.clone(), format!("{tmp}-wal"), format!("{tmp}-journal")] {
                let _ = dir.unlink(&n);
            }
            return Err(e);
        }
    }
    if stop == Some(Step::Checked) {
        return Ok(());
    }
    // 4. The old view aside, with its WAL still under its own name.
    if old.is_some() {
        dir.rename(name, &aside)
            .map_err(|e| ctx.io("rename (old view aside)", e))?;
    }
    if stop == Some(Step::MovedAside) {
        return Ok(());
    }
    // 5. No WAL or journal of an old view may meet the new file; durable before 6.
    for side in [
        super::sqlite::wal_name(name),
        super::sqlite::journal_name(name),
    ] {
        match dir.unlink(&side) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(ctx.io("remove (old view's WAL or journal)", e)),
        }
    }
    dir.fsync().map_err(|e| ctx.io("fsync (store folder)", e))?;
    if stop == Some(Step::SideFilesRemoved) {
        return Ok(());
    }
    // 6. The new view takes the name.
    dir.rename(&tmp, name)
        .map_err(|e| ctx.io("rename (new view into place)", e))?;
    dir.fsync().map_err(|e| ctx.io("fsync (store folder)", e))?;
    if stop == Some(Step::Renamed) {
        return Ok(());
    }
    // 7. The old view, set aside, goes.
    if old.is_some() {
        match dir.unlink(&aside) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(ctx.io("remove (old view set aside)", e)),
        }
        dir.fsync().map_err(|e| ctx.io("fsync (store folder)", e))?;
    }
    Ok(())
}

/// Steps 2 and 3 of [`build_view`] on the temp file `tmp`: `Ok(false)` when stopped after
/// step 2 (tests).
fn write_and_check(
    ctx: &Ctx<'_>,
    dir: &Folder,
    tmp: &str,
    image: Option<&[u8]>,
    expect: &ViewPosition,
    stop: Option<Step>,
) -> Result<bool, StoreError> {
    match image {
        None => build_new_store(ctx, dir, tmp, Kind::View)?,
        Some(bytes) => {
            let mut f = dir
                .create_new(tmp, 0o600)
                .map_err(|e| ctx.io("create (view image)", e))?;
            f.write_all(bytes)
                .and_then(|()| f.sync_all())
                .map_err(|e| ctx.io("write (view image)", e))?;
        }
    }
    if stop == Some(Step::Written) {
        return Ok(false);
    }
    let folder = dir
        .try_clone()
        .map_err(|e| ctx.io("dup (store folder)", e))?;
    let mut opened = Store::open_folder(ctx, folder, tmp, StoreOptions::default(), Kind::View)?;
    let at = view_position(ctx, opened.inner.conn())?;
    if at != *expect {
        return Err(ctx.corrupt(format!(
            "the view image is at {}, and was to be at {}",
            at.describe(),
            expect.describe()
        )));
    }
    opened.inner.close()?;
    drop(opened);
    dir.open_read(tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| ctx.io("fsync (view image)", e))?;
    Ok(true)
}

/// Remove every `.tmp-*-view-*` name in `dir`: what an interrupted [`build_view`] left.
fn remove_leftovers(ctx: &Ctx<'_>, dir: &Folder) -> Result<(), StoreError> {
    remove_temp_names(ctx, dir, "remove (leftover of a view build)", |n| {
        if !n.contains("-view-") {
            return Ok(false);
        }
        let m = dir.lstat(n).map_err(|e| ctx.io("stat", e))?;
        Ok(matches!(m, Some(m) if folder::kind(&m) == FileType::RegularFile))
    })
}

/// The view's position, for [`Store::view_position`] and
/// [`crate::ReadOnlyStore::view_position`].
pub(super) fn position_of(inner: &super::Inner) -> Result<ViewPosition, StoreError> {
    inner.usable()?;
    inner.must_be(Kind::View, "view_position")?;
    view_position(&inner.ctx(), inner.conn())
}

/// A serialized image of the whole database, for [`Store::image`].
pub(super) fn image_of(inner: &super::Inner) -> Result<Vec<u8>, StoreError> {
    inner.usable()?;
    let ctx = inner.ctx();
    inner
        .conn()
        .serialize(rusqlite::MAIN_DB)
        .map(|data| data.to_vec())
        .map_err(|e| sqlite_err(&ctx, "serialize (image)", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_core::Digest;
    use std::path::PathBuf;

    fn run() -> RunId {
        RunId::new("test-run").unwrap()
    }

    fn at(record_seq: u64, commits: u64) -> ViewPosition {
        ViewPosition {
            record_seq,
            record_hash: (record_seq > 0)
                .then(|| Digest::of(format!("record {record_seq}").as_bytes())),
            commits,
        }
    }

    fn store_dir(root: &Path, name: &str) -> PathBuf {
        let d = root.join(name);
        std::fs::create_dir(&d).unwrap();
        d
    }

    /// A view in `dir` with `records` records of one commit each, putting `tag/<n>`.
    fn view_with(dir: &Path, tag: &str, records: u64) -> Store {
        let mut v = Store::open_view(&run(), dir, true).unwrap();
        let g = Generation::new(1).unwrap();
        for n in 1..=records {
            let b = Batch::new().put(format!("{tag}/{n}"), format!("{tag} {n}"));
            v.apply_record(g, n, &[b], &at(n, n)).unwrap();
        }
        v
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        n.sort();
        n
    }

    /// A crash (the build stopped, files left as they are) after each step of a rebuild
    /// over a view whose owner was killed (its WAL holds commits): the next open finds the
    /// old view whole (its WAL replayed onto it, not onto anything else), or no view, or
    /// the new view exactly; never the new file with the old WAL. The next build then
    /// leaves exactly the new view and nothing else.
    #[test]
    fn a_rebuild_stopped_after_each_step_leaves_the_old_view_or_none_or_the_new() {
        let root = tempfile::tempdir().unwrap();
        let src = store_dir(root.path(), "source");
        let source = view_with(&src, "new", 2);
        let image = source.image().unwrap();
        let (new_at, new_docs) = (
            source.view_position().unwrap(),
            source.scan_prefix("").unwrap(),
        );
        source.close().unwrap();
        for stop in [
            Step::Written,
            Step::Checked,
            Step::MovedAside,
            Step::SideFilesRemoved,
            Step::Renamed,
        ] {
            let dir = store_dir(root.path(), &format!("{stop:?}"));
            // The old view: 5 records, its handle dropped without a close (a kill): its
            // last commits are only in view.sqlite-wal.
            let old = view_with(&dir, "old", 5);
            let (old_at, old_docs) = (old.view_position().unwrap(), old.scan_prefix("").unwrap());
            drop(old);
            let wal = dir.join("view.sqlite-wal");
            assert!(
                std::fs::metadata(&wal).unwrap().len() > 0,
                "{stop:?}: a WAL is left"
            );

            let file = dir.join(VIEW_FILE_NAME).display().to_string();
            let r = run().to_string();
            let ctx = Ctx {
                run: &r,
                file: &file,
            };
            let folder = Folder::open(&dir).unwrap();
            build_view(&ctx, &folder, Some(&image), &new_at, Some(stop)).unwrap();
            drop(folder);

            match Store::open_view(&run(), &dir, false) {
                Ok(v) => {
                    let (pos, docs) = (v.view_position().unwrap(), v.scan_prefix("").unwrap());
                    if matches!(stop, Step::Written | Step::Checked) {
                        assert_eq!((pos, docs), (old_at.clone(), old_docs.clone()), "{stop:?}");
                    } else {
                        assert_eq!(stop, Step::Renamed);
                        assert_eq!((pos, docs), (new_at.clone(), new_docs.clone()), "{stop:?}");
                    }
                    drop(v); // killed again: its WAL is left for the next build
                }
                Err(e) => {
                    assert!(
                        matches!(stop, Step::MovedAside | Step::SideFilesRemoved),
                        "{stop:?}: {e}"
                    );
                    assert_eq!(e.code().as_str(), "STORE_MISSING", "{stop:?}: {e}");
                }
            }
            // The next build (what the caller does after a crash, or a missing view).
            Store::build_view(&run(), &dir, Some(&image), &new_at).unwrap();
            assert_eq!(
                names(&dir),
                ["view.sqlite"],
                "{stop:?}: only the view is left"
            );
            let v = Store::open_view(&run(), &dir, false).unwrap();
            assert_eq!(v.view_position().unwrap(), new_at, "{stop:?}");
            assert_eq!(v.scan_prefix("").unwrap(), new_docs, "{stop:?}");
            v.close().unwrap();
        }
    }
}
