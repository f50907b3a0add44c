//! Schema version 1 of the store, and the checks that decide whether a database is one.

/// The schema version this build reads and writes (`PRAGMA user_version` and
/// `store_meta.schema_version`).
pub const SCHEMA_VERSION: u32 = 1;

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

/// The most rows a `sqlite_master` is read for: a store has five; anything
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
        .get_or_init(|| {
            let conn = rusqlite::Connection::open_in_memory().map_err(|e| e.to_string())?;
            conn.execute_batch(CREATE_V1).map_err(|e| e.to_string())?;
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
        })
        .as_ref()
        .map(Vec::as_slice)
        .map_err(Clone::clone)
}

/// What is wrong with a store's `sqlite_master` rows `found` compared with
/// [`expected_v1`]: `None` when they are exactly the expected set; else the missing tables
/// (`Err`: not a runlease store of this version) or, all present, the first unknown or
/// altered object, described with its kind and name (`Ok`).
pub(crate) fn compare(
    expected: &[SchemaObject],
    found: &[SchemaObject],
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
                "its schema has {} {:?} (on {:?}), which a version {SCHEMA_VERSION} store never has: {}",
                f.kind,
                f.name,
                f.tbl_name,
                shorten(f.sql.as_deref().unwrap_or("(no sql)"))
            )));
        };
        if e != f {
            return Some(Ok(format!(
                "its schema's {} {:?} is not the one a version {SCHEMA_VERSION} store is created with: found {} {:?} on {:?}: {}",
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
            "its schema has {} objects, a version {SCHEMA_VERSION} store has {}",
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
        let texts: String = objects.iter().filter_map(|o| o.sql.clone()).collect();
        let digest = lease_core::Digest::of(texts.as_bytes());
        assert_eq!(
            digest.as_str(),
            "c7bbe84199fdeb8ffa64db4c876d7333c71d82f96f246d00071a6f5cba6c3da0",
            "CREATE_V1 changed: stores already created would be refused"
        );
    }

    #[test]
    fn an_unknown_or_altered_object_is_named() {
        let expected = expected_v1().unwrap();
        assert_eq!(compare(expected, expected), None);
        let mut found = expected.to_vec();
        found.push(SchemaObject {
            kind: "trigger".into(),
            name: "t".into(),
            tbl_name: "fence".into(),
            sql: Some("CREATE TRIGGER t AFTER UPDATE ON fence BEGIN SELECT 1; END".into()),
        });
        let why = compare(expected, &found).unwrap().unwrap();
        assert!(why.contains("trigger \"t\""), "{why}");
        let mut found = expected.to_vec();
        found[1].sql = Some(found[1].sql.clone().unwrap().replace(">= 0", ">= -1"));
        let why = compare(expected, &found).unwrap().unwrap();
        assert!(why.contains("\"fence\""), "{why}");
        let err = compare(expected, &found[1..]).unwrap().unwrap_err();
        assert_eq!(err, ["store_meta"]);
    }
}
