//! Schema version 1 of the store, and the checks that decide whether a database is one.

/// The schema version this build reads and writes (`PRAGMA user_version` and
/// `store_meta.schema_version`).
pub const SCHEMA_VERSION: u32 = 1;

/// Tables of schema version 1; every one must exist in a store this build opens.
pub(crate) const TABLES: &[&str] = &["store_meta", "fence", "commits", "docs", "log"];

/// The DDL of schema version 1, run once inside the creating transaction.
///
/// `commits.writes` holds the commit's puts and deletes, in order, encoded as described in
/// the `codec` module (one row per commit keeps a one-document commit to two b-tree pages).
pub(crate) const CREATE_V1: &str = "
CREATE TABLE store_meta (
    singleton      INTEGER PRIMARY KEY CHECK (singleton = 1),
    store_id       TEXT    NOT NULL,
    created_at     TEXT    NOT NULL,
    schema_version INTEGER NOT NULL
);
CREATE TABLE fence (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    max_token INTEGER NOT NULL CHECK (max_token >= 0)
);
CREATE TABLE commits (
    seq          INTEGER PRIMARY KEY CHECK (seq >= 1),
    token        INTEGER NOT NULL CHECK (token >= 1),
    committed_at TEXT    NOT NULL,
    write_count  INTEGER NOT NULL,
    log_entries  INTEGER NOT NULL,
    writes       BLOB    NOT NULL
);
CREATE TABLE docs (
    key         TEXT    PRIMARY KEY,
    value       BLOB    NOT NULL,
    updated_seq INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE log (
    seq   INTEGER NOT NULL,
    idx   INTEGER NOT NULL,
    entry BLOB    NOT NULL,
    PRIMARY KEY (seq, idx)
) WITHOUT ROWID;
";
