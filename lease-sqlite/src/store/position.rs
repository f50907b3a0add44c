//! Where a view stands in the engine's store log: [`ViewPosition`], its `engine_view` row
//! (read and written inside a commit's transaction, checked at open) and [`ViewStep`], what
//! moves it in a commit. A leaf: it imports no other module of the store.

use super::sqlite::{from_i64, sqlite_err, to_i64};
use crate::error::StoreError;
use crate::header::Ctx;
use lease_core::Digest;
use rusqlite::{Connection, OptionalExtension};

/// Where a view stands in the engine's store log: what its `engine_view` row says, and
/// what a snapshot's manifest (`through`, `through_hash`, `commits`) names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ViewPosition {
    /// The sequence of the last record applied (0: none).
    pub record_seq: u64,
    /// That record's hash; `None` exactly when `record_seq` is 0.
    pub record_hash: Option<Digest>,
    /// The store sequence of the last commit applied (the view's head).
    pub commits: u64,
}

impl ViewPosition {
    /// The position of an empty view: no record, no commit.
    pub const EMPTY: ViewPosition = ViewPosition {
        record_seq: 0,
        record_hash: None,
        commits: 0,
    };

    /// `ARGUMENT_INVALID` unless this is a position a view can have: a hash exactly when
    /// there is a record, and numbers SQLite can hold.
    pub(super) fn check(&self, what: &'static str) -> Result<(), StoreError> {
        to_i64(what, self.record_seq)?;
        to_i64(what, self.commits)?;
        if (self.record_seq == 0) != self.record_hash.is_none() {
            return Err(StoreError::ArgumentInvalid {
                what,
                reason: format!(
                    "record {} with{} a hash: a position has a record hash exactly when it has a record",
                    self.record_seq,
                    if self.record_hash.is_some() {
                        ""
                    } else {
                        "out"
                    }
                ),
            });
        }
        Ok(())
    }

    pub(super) fn describe(&self) -> String {
        format!(
            "record {} ({}), last commit {}",
            self.record_seq,
            self.record_hash.as_ref().map_or("no hash", Digest::as_str),
            self.commits
        )
    }
}

/// The `engine_view` row, read inside the caller's transaction (the open already checked
/// it; a hash that does not parse is a conversion failure).
pub(super) fn read_position(conn: &Connection) -> rusqlite::Result<ViewPosition> {
    let (seq, hash, commits): (i64, Option<String>, i64) = conn
        .prepare_cached(
            "SELECT record_seq, record_hash, commits FROM engine_view WHERE singleton = 1",
        )?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    let record_hash = hash.map(|h| Digest::parse(&h)).transpose().map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(
            1,
            rusqlite::types::Type::Text,
            e.to_string().into(),
        )
    })?;
    Ok(ViewPosition {
        record_seq: from_i64(seq),
        record_hash,
        commits: from_i64(commits),
    })
}

/// Set the `engine_view` row to `to`, inside the caller's transaction.
pub(super) fn write_position(conn: &Connection, to: &ViewPosition) -> rusqlite::Result<()> {
    let changed = conn
        .prepare_cached(
            "UPDATE engine_view SET record_seq = ?1, record_hash = ?2, commits = ?3 WHERE singleton = 1",
        )?
        .execute(rusqlite::params![
            i64::try_from(to.record_seq).unwrap_or(i64::MAX),
            to.record_hash.as_ref().map(Digest::as_str),
            i64::try_from(to.commits).unwrap_or(i64::MAX),
        ])?;
    if changed == 1 {
        Ok(())
    } else {
        Err(rusqlite::Error::QueryReturnedNoRows)
    }
}

/// What moves a view in [`Store::commit_in_tx`](super::Store::commit_in_tx): the record's first commit's sequence and
/// the position the view is at once the record is applied.
pub(super) struct ViewStep<'a> {
    /// The store sequence of the record's first commit.
    pub(super) first_commit: u64,
    /// The view's position after the record.
    pub(super) to: &'a ViewPosition,
}

/// A view's `engine_view` row, checked: present; `record_hash` 64 lowercase hex, `NULL`
/// exactly when `record_seq` is 0; `commits` equal to the view's head (the last commit's
/// sequence): [`crate::Store::apply_record`] moves both in one transaction, so any other
/// row was not written by it (`STORE_CORRUPT`).
pub(super) fn view_position(ctx: &Ctx<'_>, conn: &Connection) -> Result<ViewPosition, StoreError> {
    let sq = |op, e| sqlite_err(ctx, op, e);
    let row: Option<(i64, Option<String>, i64, i64)> = conn
        .prepare_cached(
            "SELECT record_seq, record_hash, commits, (SELECT COALESCE(MAX(seq), 0) FROM commits) \
             FROM engine_view WHERE singleton = 1",
        )
        .and_then(|mut s| {
            s.query_row([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                .optional()
        })
        .map_err(|e| sq("read engine_view", e))?;
    let Some((seq, hash, commits, head)) = row else {
        return Err(ctx.corrupt("its engine_view row is missing"));
    };
    let (Ok(record_seq), Ok(commits)) = (u64::try_from(seq), u64::try_from(commits)) else {
        return Err(ctx.corrupt(format!(
            "its engine_view row is not a position: record {seq}, commits {commits}"
        )));
    };
    let record_hash =
        match (record_seq, hash) {
            (0, None) => None,
            (1.., Some(h)) => Some(Digest::parse(&h).map_err(|e| {
                ctx.corrupt(format!("its engine_view record hash is not valid: {e}"))
            })?),
            (0, Some(_)) => {
                return Err(ctx.corrupt(
                    "its engine_view row has a record hash but no record (record_seq 0)",
                ));
            }
            (_, None) => {
                return Err(ctx.corrupt(format!(
                    "its engine_view row is at record {record_seq} without that record's hash"
                )));
            }
        };
    if i64::try_from(commits).ok() != Some(head) {
        return Err(ctx.corrupt(format!(
            "its engine_view row says commit {commits} was the last applied, but its last commit is {head}"
        )));
    }
    Ok(ViewPosition {
        record_seq,
        record_hash,
        commits,
    })
}
