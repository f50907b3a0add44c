//! Writing: the commit gate, commits with the fencing-token check, seal and close.

#[cfg(doc)]
use super::OpenedStore;
use super::position::{ViewPosition, ViewStep, read_position, write_position};
use super::sqlite::{from_i64, now_text, sqlite_err, to_i64};
use super::{Batch, CommitGate, Store, Write};
use crate::codec;
use crate::error::StoreError;
use crate::schema::Kind;
use lease_core::{Generation, Identity, Seal};
use rusqlite::{TransactionBehavior, params};

impl Store {
    /// Install the commit gate: a hook called at the start of every [`Store::commit`] and
    /// [`Store::seal`], before the transaction begins. If it returns an error the commit is
    /// refused with that error and nothing touches the database.
    ///
    /// The run layer plugs its self-fence check in here (`docs/PROTOCOL.md` §7.11: "a store
    /// commit checks the rule before starting"): the gate returns
    /// `LeaseError::Fenced` (converted with `?`/`into()`) once the last successful heartbeat
    /// started longer than `self_fence_after` ago. It runs on the committing thread and
    /// should be quick (read a monotonic clock and an atomic). A commit that was already
    /// running when the deadline passed is not interrupted; the run layer re-checks after
    /// the commit returns. Replaces any previous gate.
    pub fn set_commit_gate(&mut self, gate: CommitGate) {
        self.inner.gate = Some(gate);
    }

    /// Commit `batch` as writer `token` (its lease generation), in one `BEGIN IMMEDIATE`
    /// transaction: read the highest accepted token; if `token` is lower, roll back and
    /// refuse with `FENCED` (75); else raise the highest token to `token`, record the
    /// commit under the next sequence, apply the writes and log entries, and commit (the
    /// WAL is fsynced before this returns). Returns the new sequence.
    ///
    /// The commit gate (see [`Store::set_commit_gate`]) runs first.
    ///
    /// # Errors
    /// `FENCED` (75); the gate's error; `ARGUMENT_INVALID` (64) for a token above
    /// `i64::MAX`; `STORE_IO` (74), `STORE_CORRUPT` (65) or `STORE_INTERNAL` (70) if SQLite
    /// fails, after which this handle refuses every call. Such a failure at the final
    /// `COMMIT` (a failed fsync) leaves the outcome unknown: the commit may or may not be in
    /// the WAL, so the caller treats it as not acknowledged, reopens, and reads `head()`.
    pub fn commit(&mut self, token: Generation, batch: &Batch) -> Result<u64, StoreError> {
        let seqs = self.commit_group(token, std::slice::from_ref(batch))?;
        Ok(seqs.first().copied().unwrap_or(0))
    }

    /// Group commit: commit each of `batches` as writer `token`, in order, in **one**
    /// `BEGIN IMMEDIATE` transaction (one fencing check, one WAL fsync for all of them).
    /// Each batch is a commit of its own, with its own sequence (consecutive, no gaps) and
    /// its own row in `commits`, exactly as if committed one by one; returns their
    /// sequences in order. All or none: a refusal or failure commits none of them.
    ///
    /// This is what lets an owner serving many clients pay one fsync for the requests
    /// that arrived while the previous commit was being made (lease-run's store server).
    /// An empty slice commits nothing and returns an empty vector (the gate still runs).
    ///
    /// # Errors
    /// As [`Store::commit`], for the group as a whole. `ARGUMENT_INVALID` (64) on a view of
    /// the engine's store log (only [`Store::apply_record`] changes a view, so its
    /// commits always match its position in the log).
    pub fn commit_group(
        &mut self,
        token: Generation,
        batches: &[Batch],
    ) -> Result<Vec<u64>, StoreError> {
        self.inner.must_be(Kind::Store, "commit")?;
        self.commit_in_tx(token, batches, None)
    }

    /// [`Store::commit_group`]'s transaction, shared with [`Store::apply_record`]: with
    /// `view` (the record's first commit and the position it moves the view to), the
    /// view's position is checked first (inside the transaction, before the fencing check;
    /// a view not at the record before is refused, nothing written) and `engine_view` is
    /// set to the new position after the batches, before the one `COMMIT`. An empty
    /// `batches` commits nothing unless there is a `view` to move.
    pub(super) fn commit_in_tx(
        &mut self,
        token: Generation,
        batches: &[Batch],
        view: Option<ViewStep<'_>>,
    ) -> Result<Vec<u64>, StoreError> {
        self.inner.usable()?;
        self.inner.run_gate()?;
        let tok = to_i64("token", token.get())?;
        let encoded = batches
            .iter()
            .map(|b| codec::encode(&b.writes))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|reason| StoreError::ArgumentInvalid {
                what: "batch",
                reason,
            })?;
        for (i, (b, e)) in batches.iter().zip(&encoded).enumerate() {
            let size = b
                .log
                .iter()
                .fold(e.len(), |n, entry| n.saturating_add(entry.len()));
            if size > crate::MAX_COMMIT_BYTES {
                return Err(StoreError::ArgumentInvalid {
                    what: "batch",
                    reason: format!(
                        "batch {i} holds {size} bytes of writes and log entries, above the store's limit of {} per commit; nothing was written",
                        crate::MAX_COMMIT_BYTES
                    ),
                });
            }
        }
        if batches.is_empty() && view.is_none() {
            return Ok(Vec::new());
        }
        let (ctx, conn) = self.inner.ctx_and_conn();
        let outcome = (|| -> Result<Result<Vec<u64>, Refusal>, (&'static str, rusqlite::Error)> {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(|e| ("begin", e))?;
            // The fencing check reads the highest accepted token inside this transaction
            // (the write lock is already held), with the head, in one statement.
            let (max, head): (i64, i64) = tx
                .prepare_cached(
                    "SELECT (SELECT max_token FROM fence WHERE singleton = 1), \
                            (SELECT COALESCE(MAX(seq), 0) FROM commits)",
                )
                .and_then(|mut s| s.query_row([], |r| Ok((r.get(0)?, r.get(1)?))))
                .map_err(|e| ("read fence", e))?;
            if let Some(step) = &view {
                // The view must be exactly at the record before: its last commit is the
                // one before the record's first, and its last record the one before.
                let at = read_position(&tx).map_err(|e| ("read engine_view", e))?;
                let at_head = u64::try_from(head).unwrap_or(u64::MAX);
                if at_head.checked_add(1) != Some(step.first_commit)
                    || at.commits != at_head
                    || at.record_seq.checked_add(1) != Some(step.to.record_seq)
                {
                    // Dropping `tx` rolls back; nothing was written.
                    return Ok(Err(Refusal::NotAt(at)));
                }
            }
            // mutant store_fencing_token_ignored: a lower token commits (I3).
            if tok < max && !lease_core::mutant::mutant("store_fencing_token_ignored") {
                // Dropping `tx` rolls back; nothing was written.
                return Ok(Err(Refusal::Fenced(max)));
            }
            if tok > max {
                tx.prepare_cached("UPDATE fence SET max_token = ?1 WHERE singleton = 1")
                    .and_then(|mut s| s.execute([tok]))
                    .map_err(|e| ("raise fence", e))?;
            }
            let committed_at = now_text();
            let mut seqs = Vec::with_capacity(batches.len());
            let mut seq = head;
            for (batch, encoded) in batches.iter().zip(encoded) {
                seq = seq.checked_add(1).ok_or((
                    "next sequence",
                    rusqlite::Error::IntegralValueOutOfRange(0, seq),
                ))?;
                apply(&tx, seq, tok, &committed_at, batch, encoded)?;
                seqs.push(u64::try_from(seq).unwrap_or(0));
            }
            if let Some(step) = &view {
                write_position(&tx, step.to).map_err(|e| ("write engine_view", e))?;
            }
            tx.commit().map_err(|e| ("commit", e))?;
            Ok(Ok(seqs))
        })();
        match outcome {
            Ok(Ok(seqs)) => Ok(seqs),
            Ok(Err(Refusal::NotAt(at))) => Err(StoreError::ViewNotAt {
                run: ctx.run.to_string(),
                file: ctx.file.to_string(),
                at_record: at.record_seq,
                at_commits: at.commits,
                record: view.as_ref().map_or(0, |s| s.to.record_seq),
                first_commit: view.as_ref().map_or(0, |s| s.first_commit),
            }),
            Ok(Err(Refusal::Fenced(max))) => Err(StoreError::Fenced {
                run: ctx.run.to_string(),
                file: ctx.file.to_string(),
                token: token.get(),
                max_token: from_i64(max),
            }),
            Err((op, e)) => {
                let err = sqlite_err(&ctx, op, e);
                if !matches!(err, StoreError::Busy { .. }) {
                    self.inner.broken = Some(err.code().prefixed(&err));
                }
                Err(err)
            }
        }
    }

    /// Seal the store for a clean release by `generation` and close it: the commit gate
    /// runs; a `generation` below the highest accepted token is refused `FENCED` (a fenced
    /// owner cannot release cleanly); otherwise the highest token is raised to
    /// `generation` (so no older writer can commit after the release), the WAL is
    /// checkpointed into the file and the store closed. The returned [`Seal`] (store id,
    /// head, generation) goes into the release epoch; the next opener checks it with
    /// [`OpenedStore::check_seal`].
    ///
    /// A view of the engine's store log is never sealed (`ARGUMENT_INVALID`, 64): the
    /// engine's log, not a seal, says what it must hold.
    pub fn seal(mut self, generation: Generation) -> Result<Seal, StoreError> {
        self.inner.must_be(Kind::Store, "seal")?;
        self.inner.usable()?;
        self.inner.run_gate()?;
        let tok = to_i64("generation", generation.get())?;
        let (ctx, conn) = self.inner.ctx_and_conn();
        let outcome = (|| -> Result<Result<i64, i64>, rusqlite::Error> {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let max: i64 =
                tx.query_row("SELECT max_token FROM fence WHERE singleton = 1", [], |r| {
                    r.get(0)
                })?;
            // mutant store_seal_fencing_ignored: a fenced generation seals (I3, §7.3).
            if tok < max && !lease_core::mutant::mutant("store_seal_fencing_ignored") {
                return Ok(Err(max));
            }
            if tok > max {
                tx.execute("UPDATE fence SET max_token = ?1 WHERE singleton = 1", [tok])?;
            }
            let head: i64 = tx.query_row("SELECT COALESCE(MAX(seq), 0) FROM commits", [], |r| {
                r.get(0)
            })?;
            tx.commit()?;
            Ok(Ok(head))
        })();
        let head = match outcome {
            Ok(Ok(head)) => from_i64(head),
            Ok(Err(max)) => {
                return Err(StoreError::Fenced {
                    run: ctx.run.to_string(),
                    file: ctx.file.to_string(),
                    token: generation.get(),
                    max_token: from_i64(max),
                });
            }
            Err(e) => {
                let err = sqlite_err(&ctx, "seal", e);
                self.inner.broken = Some(err.code().prefixed(&err));
                return Err(err);
            }
        };
        let store_id = Identity::new(self.inner.store_id.clone()).map_err(|reason| {
            self.inner
                .ctx()
                .corrupt(format!("its store id is not valid: {reason}"))
        })?;
        self.inner.close()?;
        Ok(Seal {
            store_id,
            sequence: head,
            generation,
        })
    }

    /// Close the store: checkpoint the WAL into the database file (fsynced), remove the
    /// WAL, close. Dropping a `Store` without `close` loses nothing (the WAL is replayed at
    /// the next open) but does not checkpoint.
    pub fn close(mut self) -> Result<(), StoreError> {
        self.inner.usable()?;
        self.inner.close()
    }
}

/// Why a commit transaction refused, having written nothing.
enum Refusal {
    /// The fencing check: the highest accepted token.
    Fenced(i64),
    /// A view not at the record before: where it is.
    NotAt(ViewPosition),
}

/// Record one commit (sequence `seq`, writer `tok`) and apply its writes and log entries,
/// inside the caller's transaction.
fn apply(
    tx: &rusqlite::Transaction<'_>,
    seq: i64,
    tok: i64,
    committed_at: &str,
    batch: &Batch,
    encoded: Vec<u8>,
) -> Result<(), (&'static str, rusqlite::Error)> {
    let n_writes = i64::try_from(batch.writes.len()).unwrap_or(i64::MAX);
    let n_log = i64::try_from(batch.log.len()).unwrap_or(i64::MAX);
    tx.prepare_cached(
        "INSERT INTO commits (seq, token, committed_at, write_count, log_entries, writes) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )
    .and_then(|mut s| s.execute(params![seq, tok, committed_at, n_writes, n_log, encoded]))
    .map_err(|e| ("record commit", e))?;
    if !batch.writes.is_empty() {
        let mut put = tx
            .prepare_cached(
                "INSERT INTO docs (key, value, updated_seq) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_seq = excluded.updated_seq",
            )
            .map_err(|e| ("prepare writes", e))?;
        let mut del = tx
            .prepare_cached("DELETE FROM docs WHERE key = ?1")
            .map_err(|e| ("prepare writes", e))?;
        for w in &batch.writes {
            match w {
                Write::Put { key, value } => put
                    .execute(params![key, value, seq])
                    .map_err(|e| ("apply put", e))?,
                Write::Delete { key } => del.execute([key]).map_err(|e| ("apply delete", e))?,
            };
        }
    }
    if !batch.log.is_empty() {
        let mut log = tx
            .prepare_cached("INSERT INTO log (seq, idx, entry) VALUES (?1, ?2, ?3)")
            .map_err(|e| ("prepare log", e))?;
        for (idx, entry) in batch.log.iter().enumerate() {
            let idx = i64::try_from(idx).unwrap_or(i64::MAX);
            log.execute(params![seq, idx, entry])
                .map_err(|e| ("append log", e))?;
        }
    }
    Ok(())
}
