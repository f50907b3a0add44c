//! Schema version 1 of the store (a run's local store, `store/run.sqlite`), schema version
//! 2 (a view of the engine's store log, `store/view.sqlite`: version 1's tables plus
//! `engine_view`), and the checks that decide whether a database is one.

/// The schema version of a local store that this build reads and writes (`PRAGMA
/// user_version` and `store_meta.schema_version`).
pub const SCHEMA_VERSION: u32 = 1;

/// The schema version of a view of the engine's store log ([`crate::VIEW_FILE_NAME`]):
/// exactly version 1's tables plus `engine_view` (the position of the log it applied). A
/// version 2 file is only ever a view and a version 1 file only ever a local store: there
/// is no migration between them, and opening one as the other is refused
/// (`SCHEMA_UNSUPPORTED`).
pub const VIEW_SCHEMA_VERSION: u32 = 2;

/// What a database file is: which schema it must have, and what it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A local store (schema version 1, `store/run.sqlite`).
    Store,
    /// A view of the engine's store log (schema version 2, `store/view.sqlite`).
    View,
}

impl Kind {
    /// The schema version a file of this kind has.
    pub(crate) fn version(self) -> u32 {
        match self {
            Kind::Store => SCHEMA_VERSION,
            Kind::View => VIEW_SCHEMA_VERSION,
        }
    }

    /// The `sqlite_master` rows a file of this kind has, exactly.
    pub(crate) fn expected(self) -> Result<&'static [SchemaObject], String> {
        match self {
            Kind::Store => expected_v1(),
            Kind::View => expected_v2(),
        }
    }

    /// What `found`, a schema version a file of this kind must not have, is (for the
    /// `SCHEMA_UNSUPPORTED` message): the other kind's version is named as such.
    pub(crate) fn describe_other(self, found: u32) -> String {
        match (self, found) {
            (_, 0) => "0 (no runlease schema: not a runlease store)".to_string(),
            (Kind::Store, VIEW_SCHEMA_VERSION) => format!(
                "{found}: a view of the engine's store log (store/view.sqlite), which is never opened as a local store"
            ),
            (Kind::View, SCHEMA_VERSION) => format!(
                "{found}: a local store (store/run.sqlite), which is never opened as a view of the engine's store log (no migration)"
            ),
            _ => found.to_string(),
        }
    }
}

/// Tables of schema version 1, in the order `CREATE_V1` makes them (the pin's test).
#[cfg(test)]
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

/// The one table a view (schema version 2) adds to version 1's: the position of the
/// engine's store log the view has applied, one row. `record_seq` is the last applied
/// record's sequence (0: none), `record_hash` that record's hash (64 lowercase hex; `NULL`
/// exactly when `record_seq` is 0), `commits` the store sequence of the last commit it
/// carried (always the view's head: checked at every open). Appended to [`CREATE_V1`],
/// never changing it, so version 1's pin is untouched; frozen for version 2 like
/// `CREATE_V1` is for version 1 (`schema_pin_v2_is_frozen`).
pub(crate) const CREATE_VIEW_V2: &str = "
CREATE TABLE engine_view (
    singleton   INTEGER PRIMARY KEY CHECK (singleton = 1),
    record_seq  INTEGER NOT NULL CHECK (record_seq >= 0),
    record_hash TEXT,
    commits     INTEGER NOT NULL CHECK (commits >= 0)
);
";

/// One row of `sqlite_master`: what the schema pin compares (everything but `rootpage`,
/// which is where the object's b-tree happens to start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SchemaObject {
    /// `table`, `index`, `view` or `trigger`.
    pub(crate) kind: String,
    /// The object's name.
    pub(crate) name: String,
    /// The table it belongs to (its own name for a table).
    pub(crate) tbl_name: String,
    /// Its `CREATE` statement as SQLite keeps it (`NULL` for an automatic index).
    pub(crate) sql: Option<String>,
}

/// The most rows a `sqlite_master` is read for: a store has five (a view six); anything
/// far beyond is refused without reading further.
pub(crate) const MAX_SCHEMA_ROWS: usize = 64;

/// Exactly the `sqlite_master` rows that [`CREATE_V1`] makes, in the order it makes them:
/// built once per process by running `CREATE_V1` on an in-memory database, so the texts
/// are byte for byte those a store's creation stored (`create_store` runs the same
/// batch). `CREATE_V1` is therefore frozen for schema version 1: a changed character
/// would refuse every existing store (`schema_pin_is_frozen` pins it).
pub(crate) fn expected_v1() -> Result<&'static [SchemaObject], String> {
    static EXPECTED: std::sync::OnceLock<Result<Vec<SchemaObject>, String>> =
        std::sync::OnceLock::new();
    EXPECTED
        .get_or_init(|| schema_of(&[CREATE_V1]))
        .as_ref()
        .map(Vec::as_slice)
        .map_err(Clone::clone)
}

/// Exactly the `sqlite_master` rows of a view (schema version 2): [`CREATE_V1`] then
/// [`CREATE_VIEW_V2`], run on an in-memory database once per process (the view's creation
/// runs the same two batches in the same order).
pub(crate) fn expected_v2() -> Result<&'static [SchemaObject], String> {
    static EXPECTED: std::sync::OnceLock<Result<Vec<SchemaObject>, String>> =
        std::sync::OnceLock::new();
    EXPECTED
        .get_or_init(|| schema_of(&[CREATE_V1, CREATE_VIEW_V2]))
        .as_ref()
        .map(Vec::as_slice)
        .map_err(Clone::clone)
}

/// The `sqlite_master` rows that running `batches` in order on an empty in-memory
/// database makes, in the order it makes them.
fn schema_of(batches: &[&str]) -> Result<Vec<SchemaObject>, String> {
    let conn = rusqlite::Connection::open_in_memory().map_err(|e| e.to_string())?;
    for batch in batches {
        conn.execute_batch(batch).map_err(|e| e.to_string())?;
    }
    let mut st = conn
        .prepare("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY rowid")
        .map_err(|e| e.to_string())?;
    st.query_map([], |r| {
        Ok(SchemaObject {
            kind: r.get(0)?,
            name: r.get(1)?,
            tbl_name: r.get(2)?,
            sql: r.get(3)?,
        })
    })
    .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
    .map_err(|e| e.to_string())
}

/// What is wrong with a store's `sqlite_master` rows `found` compared with `expected`
/// (those of schema version `version`, [`expected_v1`] or [`expected_v2`]): `None` when they are exactly the expected set; else the missing tables
/// (`Err`: not a runlease store of this version) or, all present, the first unknown or
/// altered object, described with its kind and name (`Ok`).
pub(crate) fn compare(
    expected: &[SchemaObject],
    found: &[SchemaObject],
    version: u32,
) -> Option<Result<String, Vec<String>>> {
    let missing: Vec<String> = expected
        .iter()
        .filter(|e| !found.iter().any(|f| f.kind == e.kind && f.name == e.name))
        .map(|e| e.name.clone())
        .collect();
    if !missing.is_empty() {
        return Some(Err(missing));
    }
    for f in found {
        let Some(e) = expected.iter().find(|e| e.name == f.name) else {
            return Some(Ok(format!(
                "its schema has {} {:?} (on {:?}), which a version {version} store never has: {}",
                f.kind,
                f.name,
                f.tbl_name,
                shorten(f.sql.as_deref().unwrap_or("(no sql)"))
            )));
        };
        if e != f {
            return Some(Ok(format!(
                "its schema's {} {:?} is not the one a version {version} store is created with: found {} {:?} on {:?}: {}",
                e.kind,
                e.name,
                f.kind,
                f.name,
                f.tbl_name,
                shorten(f.sql.as_deref().unwrap_or("(no sql)"))
            )));
        }
    }
    // Same names, none altered, none missing: only a duplicate row could remain.
    (found.len() != expected.len()).then(|| {
        Ok(format!(
            "its schema has {} objects, a version {version} store has {}",
            found.len(),
            expected.len()
        ))
    })
}

/// At most 200 characters of an SQL text for a message, on one line.
fn shorten(sql: &str) -> String {
    let one_line: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(200) {
        Some((at, _)) => format!("{}…", &one_line[..at]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Assert that the SQL texts of `objects`, concatenated, have the SHA-256 `digest`
    /// (`why`: what a change of them would break).
    fn assert_pinned(objects: &[SchemaObject], digest: &str, why: &str) {
        let texts: String = objects.iter().filter_map(|o| o.sql.clone()).collect();
        assert_eq!(
            lease_core::Digest::of(texts.as_bytes()).as_str(),
            digest,
            "{why}"
        );
    }

    /// The pin is the five tables of version 1 with their exact texts; if this fails,
    /// `CREATE_V1` was edited, which would refuse every store already created.
    #[test]
    fn schema_pin_is_frozen() {
        let objects = expected_v1().unwrap();
        let names: Vec<&str> = objects.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, TABLES);
        assert!(
            objects
                .iter()
                .all(|o| o.kind == "table" && o.tbl_name == o.name)
        );
        assert_pinned(
            objects,
            "c7bbe84199fdeb8ffa64db4c876d7333c71d82f96f246d00071a6f5cba6c3da0",
            "CREATE_V1 changed: stores already created would be refused",
        );
    }

    /// Version 2 (a view) is version 1's five tables, unchanged and in the same order,
    /// plus `engine_view`; if this fails, `CREATE_VIEW_V2` was edited, which would refuse
    /// every view already built.
    #[test]
    fn schema_pin_v2_is_frozen() {
        let v1 = expected_v1().unwrap();
        let v2 = expected_v2().unwrap();
        assert_eq!(
            &v2[..v1.len()],
            v1,
            "a view's first tables are exactly a store's"
        );
        assert_eq!(v2.len(), v1.len() + 1);
        let view = &v2[v1.len()];
        assert_eq!(
            (
                view.kind.as_str(),
                view.name.as_str(),
                view.tbl_name.as_str()
            ),
            ("table", "engine_view", "engine_view")
        );
        assert_pinned(
            v2,
            "503d9b2e44b79c3ab832e25fe58dad8f1fed917459781f8bc31855b8b0ea90ab",
            "CREATE_VIEW_V2 changed: views already built would be refused",
        );
        // Each kind's pin refuses the other's schema.
        assert!(compare(v1, v2, SCHEMA_VERSION).unwrap().is_ok());
        assert_eq!(
            compare(v2, v1, VIEW_SCHEMA_VERSION).unwrap().unwrap_err(),
            ["engine_view"]
        );
    }

    #[test]
    fn an_unknown_or_altered_object_is_named() {
        let expected = expected_v1().unwrap();
        assert_eq!(compare(expected, expected, SCHEMA_VERSION), None);
        let mut found = expected.to_vec();
        found.push(SchemaObject {
            kind: "trigger".into(),
            name: "t".into(),
            tbl_name: "fence".into(),
            sql: Some("CREATE TRIGGER t AFTER UPDATE ON fence BEGIN SELECT 1; END".into()),
        });
        let why = compare(expected, &found, SCHEMA_VERSION).unwrap().unwrap();
        assert!(why.contains("trigger \"t\""), "{why}");
        let mut found = expected.to_vec();
        found[1].sql = Some(found[1].sql.clone().unwrap().replace(">= 0", ">= -1"));
        let why = compare(expected, &found, SCHEMA_VERSION).unwrap().unwrap();
        assert!(why.contains("\"fence\""), "{why}");
        let err = compare(expected, &found[1..], SCHEMA_VERSION)
            .unwrap()
            .unwrap_err();
        assert_eq!(err, ["store_meta"]);
    }
}
