//! The checks an open makes with SQLite before it writes anything.

use super::position::view_position;
use super::sqlite::sqlite_err;
use crate::error::StoreError;
use crate::header::Ctx;
use crate::schema::{self, Kind, MAX_SCHEMA_ROWS, SchemaObject};
use lease_core::Identity;
use rusqlite::{Connection, OptionalExtension};

/// What validation found.
pub(super) struct Meta {
    pub(super) store_id: String,
    pub(super) created_at: String,
    /// The store's `application_id`: this run's, or 0 for a store created before stores
    /// were bound to their run (bound at its first accepted seal check).
    pub(super) app_id: u32,
}

/// The SQLite `application_id` binding a store to run `run`: the first 32 bits of
/// SHA-256 over `runlease-store/<run id>`, never 0 (0 means "not bound").
pub(crate) fn run_app_id(run: &str) -> u32 {
    let d = lease_core::Digest::of(format!("runlease-store/{run}").as_bytes());
    u32::from_str_radix(&d.as_str()[..8], 16)
        .unwrap_or(1)
        .max(1)
}

/// The statement that binds a store to run `run` (SQLite keeps `application_id` as a
/// signed 32-bit integer: the same bits).
pub(crate) fn bind_to_run_sql(run: &str) -> String {
    let id = i32::from_ne_bytes(run_app_id(run).to_ne_bytes());
    format!("PRAGMA application_id = {id}")
}

/// Checks made with SQLite, in an order that writes nothing before the file is known to be
/// a store of our schema: the schema of `kind` (a local store's, version 1, or a view's,
/// version 2), and for a view its `engine_view` row.
pub(super) fn validate(ctx: &Ctx<'_>, conn: &Connection, kind: Kind) -> Result<Meta, StoreError> {
    let version = kind.version();
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
    if user_version != i64::from(version) {
        let found = u32::try_from(user_version)
            .map_or_else(|_| user_version.to_string(), |v| kind.describe_other(v));
        return Err(ctx.unsupported_as(kind, found));
    }
    // The schema pin (issue #29: a store file is data, not code), before any statement
    // reads a table of ours: the `sqlite_master` rows must be exactly those the creation
    // made. A trigger (one kept `fence.max_token` at 0, turning the fencing check off),
    // a view, an index, an extra table or an altered `CREATE` text (a generated column
    // that builds a huge value on every read) is refused, naming the object.
    pin_schema(ctx, conn, user_version, kind)?;
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
    if schema_version != i64::from(version) {
        return Err(ctx.unsupported_as(
            kind,
            format!("{schema_version} (store_meta; the header says {user_version})"),
        ));
    }
    if Identity::new(store_id.clone()).is_err() {
        return Err(ctx.corrupt(format!("its store id {store_id:?} is not valid")));
    }
    // Bound to this run? (0: created before the binding; accepted, bound later.)
    let app_id: i32 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .map_err(|e| sq("read application id", e))?;
    let app_id = u32::from_ne_bytes(app_id.to_ne_bytes());
    let expected = run_app_id(ctx.run);
    // A view is always built bound to its run (there were no views before the binding).
    if (app_id != 0 || kind == Kind::View) && app_id != expected {
        return Err(StoreError::OtherRun {
            run: ctx.run.to_string(),
            file: ctx.file.to_string(),
            found: app_id,
            expected,
        });
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
    if kind == Kind::View {
        // A view's position must be one, and name its last commit.
        view_position(ctx, conn)?;
    }
    Ok(Meta {
        store_id,
        created_at,
        app_id,
    })
}

/// Compare the store's `sqlite_master` (read row by row, at most [`MAX_SCHEMA_ROWS`])
/// with exactly what `kind`'s creation makes ([`schema::CREATE_V1`], and for a view
/// [`schema::CREATE_VIEW_V2`] after it): missing tables are `SCHEMA_UNSUPPORTED`
/// (not a runlease store of this version), any other difference `STORE_CORRUPT` naming
/// the object. Reading `sqlite_master` only parses the schema (a malformed one is
/// `STORE_CORRUPT` from SQLite); nothing in it runs.
fn pin_schema(
    ctx: &Ctx<'_>,
    conn: &Connection,
    user_version: i64,
    kind: Kind,
) -> Result<(), StoreError> {
    let version = kind.version();
    let sq = |e| sqlite_err(ctx, "read schema", e);
    let expected = kind.expected().map_err(|e| StoreError::Internal {
        run: ctx.run.to_string(),
        file: ctx.file.to_string(),
        op: "schema pin",
        detail: e,
    })?;
    let mut st = conn
        .prepare("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid")
        .map_err(sq)?;
    let mut rows = st.query([]).map_err(sq)?;
    let mut found = Vec::new();
    while let Some(r) = rows.next().map_err(sq)? {
        if found.len() >= MAX_SCHEMA_ROWS {
            return Err(ctx.corrupt(format!(
                "its schema has more than {MAX_SCHEMA_ROWS} objects; a version {version} store has {}",
                expected.len()
            )));
        }
        found.push(SchemaObject {
            kind: r.get(0).map_err(sq)?,
            name: r.get(1).map_err(sq)?,
            tbl_name: r.get(2).map_err(sq)?,
            sql: r.get(3).map_err(sq)?,
        });
    }
    match schema::compare(expected, &found, version) {
        None => Ok(()),
        Some(Err(missing)) => Err(ctx.unsupported(format!(
            "{user_version} without the tables {} (not a runlease store of that version)",
            missing.join(", ")
        ))),
        Some(Ok(why)) => Err(ctx.corrupt(why)),
    }
}
