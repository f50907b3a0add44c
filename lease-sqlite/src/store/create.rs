//! Creating a store (whole, then linked into place) and its one-name rule (removing the
//! temp name a crashed creation left).

use super::sqlite::{apply_durability, connect, now_text, random_hex, sqlite_err, wal_name};
use crate::error::StoreError;
use crate::folder::{self, Folder};
use crate::header::Ctx;
use crate::schema::{CREATE_V1, CREATE_VIEW_V2, Kind};
use rusqlite::{TransactionBehavior, params};
use rustix::fs::Stat;
use std::io::ErrorKind;

/// Prefix of temp names (reserved for temp files by docs/PROTOCOL.md §2).
pub(super) const TEMP_PREFIX: &str = ".tmp-";

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
/// was not yet reported as created. Returns `Ok(Some(key))` with the new file's (dev, ino)
/// when ours was linked into place and its temp name removed (so the only name it has is
/// `name`, whatever a file system's cached link count says), `Ok(None)` when another creator
/// won or the temp name could not be removed.
pub(super) fn create_store(
    ctx: &Ctx<'_>,
    dir: &Folder,
    name: &str,
) -> Result<Option<(u64, u64)>, StoreError> {
    // A temp name in the reserved `.tmp-` namespace of docs/PROTOCOL.md §2: it never parses
    // as anything, and lease-fs's orphan cleanup may remove it after a crash.
    let suffix = random_hex(8).map_err(|e| ctx.io("getrandom", e))?;
    let tmp = format!("{TEMP_PREFIX}{}-store-{suffix}", std::process::id());
    let result = build_new_store(ctx, dir, &tmp, Kind::Store).and_then(|()| {
        let built = dir
            .lstat(&tmp)
            .ok()
            .flatten()
            .map(|m| crate::folder::key(&m));
        match dir.link(&tmp, name) {
            Ok(()) => Ok(built),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(None),
            Err(e) => Err(ctx.io("link (store into place)", e)),
        }
    });
    let unlinked = dir.unlink(&tmp).is_ok();
    let _ = dir.unlink(&wal_name(&tmp));
    let ours = result?.filter(|_| unlinked);
    dir.fsync().map_err(|e| ctx.io("fsync (store folder)", e))?;
    Ok(ours)
}

/// Build a new, empty database of `kind` in the file `tmp` (created here, mode 0600; it
/// must not exist): the schema (for a view, `engine_view` after version 1's tables, at
/// position 0), identity, `user_version`, run binding, in one transaction; closed (its WAL
/// checkpointed and removed) and fsynced, so the file is whole on its own.
pub(super) fn build_new_store(
    ctx: &Ctx<'_>,
    dir: &Folder,
    tmp: &str,
    kind: Kind,
) -> Result<(), StoreError> {
    let version = kind.version();
    // The empty file is created here with mode 0600 (SQLite's journal and WAL files take
    // the mode of the database file).
    drop(
        dir.create_new(tmp, 0o600)
            .map_err(|e| ctx.io("create (new store)", e))?,
    );
    let store_id = random_hex(16).map_err(|e| ctx.io("getrandom", e))?;
    let sq = |op, e| sqlite_err(ctx, op, e);
    let mut conn = connect(dir, tmp).map_err(|e| sq("open", e))?;
    // Built with full durability whatever the kind: the build fsyncs it before linking
    // it into place, and every commit of the build is one the file needs.
    let mismatches =
        apply_durability(&conn, crate::schema::Kind::Store).map_err(|e| sq("pragma", e))?;
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
    // `application_id` binds the store to its run (checked at every open).
    tx.execute_batch(CREATE_V1)
        .and_then(|()| match kind {
            Kind::Store => Ok(()),
            Kind::View => tx.execute_batch(CREATE_VIEW_V2).and_then(|()| {
                tx.execute(
                    "INSERT INTO engine_view (singleton, record_seq, record_hash, commits) VALUES (1, 0, NULL, 0)",
                    [],
                )
                .map(|_| ())
            }),
        })
        .and_then(|()| tx.execute_batch(&format!("PRAGMA user_version = {version}")))
        .and_then(|()| tx.execute_batch(&super::validate::bind_to_run_sql(ctx.run)))
        .and_then(|()| {
            tx.execute(
                "INSERT INTO store_meta (singleton, store_id, created_at, schema_version) VALUES (1, ?1, ?2, ?3)",
                params![store_id, now_text(), version],
            )
        })
        .and_then(|_| tx.execute("INSERT INTO fence (singleton, max_token) VALUES (1, 0)", []))
        .and_then(|_| tx.commit())
        .map_err(|e| sq("create schema", e))?;
    // The WAL is checkpointed into the file explicitly and checked, and then the close
    // removes it, so the file linked into place is whole on its own. A close alone
    // checkpoints only when it can take its exclusive lock, and says nothing when it
    // cannot: the pages would stay in the temp's WAL, which step 5 removes, and the store
    // linked into place would be a header without its pages (`STORE_CORRUPT`, "its header
    // says N pages", was seen once on a loaded 2-core machine). A checkpoint that cannot
    // finish is an error here, before anything is linked.
    let (busy, log, done): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .map_err(|e| sq("checkpoint (create)", e))?;
    if busy != 0 || done != log {
        return Err(ctx.io(
            "checkpoint (create)",
            std::io::Error::other(format!(
                "the new store's WAL was not checkpointed whole (busy {busy}, {done} of {log} frames); nothing was linked"
            )),
        ));
    }
    conn.close().map_err(|(_, e)| sq("close (create)", e))?;
    if dir
        .lstat(&wal_name(tmp))
        .map_err(|e| ctx.io("stat (new store's WAL)", e))?
        .is_some_and(|st| st.st_size > 0)
    {
        return Err(ctx.io(
            "close (create)",
            std::io::Error::other("the new store's WAL outlived its close; nothing was linked"),
        ));
    }
    dir.open_read(tmp)
        .and_then(|f| f.sync_all())
        .map_err(|e| ctx.io("fsync (new store)", e))
}

/// What [`check_single_name`] does with a leftover temp name of the store's inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TempNames {
    /// Remove it (`unlinkat`, then one fsync of the folder): the owner's open.
    Remove,
    /// Leave it and count it as the store's own name: the read-only open, which writes
    /// nothing (issue #28: it removed the name and fsynced `store/`). Reading through
    /// `name` is unaffected: with `immutable` SQLite reads the database file alone, never
    /// a WAL found by name; the next owner's open removes the temp name.
    Tolerate,
}

/// A store file must have exactly one name: SQLite finds the WAL by the name it opened the
/// file under, so a store reached through another hard link would miss (and later clash
/// with) the commits in the WAL. The only second name this crate makes is the temp name it
/// creates a store under, which a crash between `link` and `unlink` can leave behind: such
/// a `.tmp-*` sibling with the same inode is removed here ([`TempNames::Remove`]) or, by a
/// reader that writes nothing, left and not counted ([`TempNames::Tolerate`]). Any other
/// extra link is refused.
pub(super) fn check_single_name(
    ctx: &Ctx<'_>,
    dir: &Folder,
    name: &str,
    meta: &Stat,
    temps: TempNames,
) -> Result<(), StoreError> {
    let mut tolerated: u64 = 0;
    remove_temp_names(ctx, dir, "remove (leftover temp name)", |entry| {
        let same = matches!(dir.lstat(entry), Ok(Some(m)) if folder::key(&m) == folder::key(meta));
        if same && temps == TempNames::Tolerate {
            tolerated += 1;
            return Ok(false);
        }
        Ok(same)
    })?;
    let stat_now = || {
        dir.lstat(name)
            .map_err(|e| ctx.io("stat", e))?
            .ok_or_else(|| ctx.io("stat", "the file vanished while it was being opened"))
    };
    let mut now = stat_now()?;
    // A FUSE file system (and some network ones) caches attributes for about a second: a
    // link count read right after another process removed a name can be the old one.
    // Before refusing, look again for up to 1.5 s; a real second name stays.
    let names = |st: &Stat| st.st_nlink.saturating_sub(tolerated);
    for wait_ms in [20u64, 80, 200, 400, 800] {
        if names(&now) <= 1 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(wait_ms));
        now = stat_now()?;
    }
    if names(&now) > 1 {
        return Err(ctx.corrupt(format!(
            "the file has {} hard links; a store file must have exactly one name (SQLite finds its WAL by name, so another name would miss acknowledged commits)",
            now.st_nlink
        )));
    }
    Ok(())
}

/// Remove each temp name (`.tmp-*`) of `dir` that `pick` selects, one `unlinkat` each (a
/// name already gone is no error), then fsync `dir` once if any was removed: the cleanup of
/// what a crashed creation or view build left. `op` names the removal in its errors.
pub(super) fn remove_temp_names(
    ctx: &Ctx<'_>,
    dir: &Folder,
    op: &'static str,
    mut pick: impl FnMut(&str) -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    let names = dir.names().map_err(|e| ctx.io("list (store folder)", e))?;
    let mut removed = false;
    for n in names {
        let Some(n) = n.to_str().filter(|n| n.starts_with(TEMP_PREFIX)) else {
            continue;
        };
        if !pick(n)? {
            continue;
        }
        match dir.unlink(n) {
            Ok(()) => removed = true,
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(ctx.io(op, e)),
        }
    }
    if removed {
        dir.fsync().map_err(|e| ctx.io("fsync (store folder)", e))?;
    }
    Ok(())
}
