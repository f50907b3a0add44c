//! The exclusive create as one transaction: the epoch guard, a new active owner's liveness
//! key, and a retry that adopts its own landed attempt.

use super::call::Call;
use super::{EtcdRun, lease_ttl_secs};
use crate::error::EtcdError;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use lease_core::ops::Response;
use lease_core::{EpochRecord, EpochState, FileRef, Generation, LeaseError};
use std::time::Instant;

/// Whether an exclusive create that found its key taken (`existing`, the value the
/// transaction read) found its own record: the value is byte for byte what this request
/// writes (`ours`), and an earlier attempt of this very request was sent and not answered
/// (`retried`), so it may have landed. Then that attempt created it and the answer is
/// `Created`.
///
/// Why this is safe (PROTOCOL §17): `create_revision == 0` lets at most one value ever
/// occupy the key, so an attempt that landed late either landed first (and the retry
/// reads its bytes) or fails its own compare; and equal bytes are the same record (owner
/// id, generation, sequence, previous hash, time: every field). Without an unanswered
/// attempt the same bytes are somebody else's identical request (two appends of the same
/// owner with the same type, payload and millisecond, say): `AlreadyExists`, as on the run
/// folder, so neither is told it wrote the other's event.
pub(super) fn is_own_record(existing: Option<&[u8]>, ours: &[u8], retried: bool) -> bool {
    retried && existing == Some(ours)
}

/// The value the else branch of a create's transaction read (`TxnOp::get` of the key it
/// meant to create), `None` if the key is absent or the transaction succeeded.
fn got_value(resp: &TxnResponse) -> Option<Vec<u8>> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
        _ => None,
    })
}

impl EtcdRun {
    /// Exclusive create as one transaction (module docs: the epoch guard and the liveness
    /// key of a new active owner).
    pub(super) async fn create(
        &self,
        f: FileRef,
        bytes: Vec<u8>,
        deadline: Instant,
    ) -> Result<Response, EtcdError> {
        // Besides the key's absence: what must hold, and what else is put with it.
        let mut compares = Vec::new();
        let mut puts = Vec::new();
        // The generation whose owner's liveness key must be absent (module docs).
        let mut guard: Option<Generation> = None;
        let mut granted: Option<(Generation, i64)> = None;
        if let FileRef::Epoch(g) = f {
            if let Some(prev) = Generation::new(g.get() - 1) {
                let ours = self.owned.lock().is_ok_and(|o| o.contains_key(&prev));
                if !ours {
                    compares.push(Compare::create_revision(
                        self.live_key(prev),
                        CompareOp::Equal,
                        0,
                    ));
                    guard = Some(prev);
                }
            }
            // The operation built these bytes; a record that does not decode gets no
            // liveness key (and will be refused by every reader anyway).
            if let Ok(rec) = lease_core::decode_for::<EpochRecord>(&self.run_id, &bytes) {
                if rec.state == EpochState::Active {
                    let ttl = lease_ttl_secs(&rec.policy);
                    let lk = self.live_key(g);
                    let id = self
                        .call(
                            "lease grant",
                            &lk,
                            deadline,
                            Call::Read,
                            move |mut c| async move { c.lease_grant(ttl, None).await },
                        )
                        .await?
                        .id();
                    let holder = serde_json::to_vec(&rec.holder).map_err(|e| {
                        EtcdError::Lease(LeaseError::ProtocolViolation {
                            detail: format!("holder does not encode: {e}"),
                        })
                    })?;
                    puts.push(TxnOp::put(
                        lk,
                        holder,
                        Some(PutOptions::new().with_lease(id)),
                    ));
                    granted = Some((g, id));
                }
            }
        }
        let answer = match self.create_txn(f, bytes, compares, puts, deadline).await {
            Ok(a) => a,
            Err(e) => {
                // Outcome unknown. The granted lease is remembered for `g` all the same: if
                // the epoch was created it is an attempt of this very call, and a retry of
                // the operation adopts it (lease-core's adoption on retry), after which this
                // handle must be able to keep that lease alive and release. If it was not
                // created, the entry is inert: only an `OwnedLease` of `g`, which exists
                // only if `g` is ours, is ever heartbeated, and the release guard compares
                // against the lease actually attached in etcd. Unused, it simply expires.
                if let Some((g, id)) = granted {
                    self.keep_lease(g, id);
                }
                return Err(e);
            }
        };
        // Created by this attempt, or by an earlier attempt of this call whose answer was
        // lost: either way the record is ours, and so is an active epoch's liveness key,
        // which every attempt put with the one etcd lease granted above (so it is kept,
        // never revoked).
        if answer == Some(Response::Created) {
            if let Some((g, id)) = granted {
                self.keep_lease(g, id);
            }
            return Ok(Response::Created);
        }
        if let Some((_, id)) = granted {
            self.revoke_quietly(id).await;
        }
        if let Some(taken) = answer {
            return Ok(taken);
        }
        match guard {
            Some(prev) => Err(EtcdError::Lease(LeaseError::TakeoverRace {
                run: self.run_id.to_string(),
                detail: format!(
                    "the owner of generation {prev} still holds its etcd lease; generation {} can be created only after it expires",
                    prev.get() + 1
                ),
            })),
            None => Err(EtcdError::Lease(LeaseError::ProtocolViolation {
                detail: format!(
                    "etcd refused the exclusive create of {} without a reason",
                    self.key(f)
                ),
            })),
        }
    }

    /// The one transaction of an exclusive create of `f`: put `bytes`, and the puts in
    /// `also`, only while `f`'s key is absent and every compare in `guards` holds; its else
    /// branch reads the key. `Created` when this attempt put it, or when the key holds
    /// exactly `bytes` after an attempt of this call went unanswered (that attempt landed:
    /// [`is_own_record`]); `AlreadyExists` when another value occupies it; `None` when the
    /// key is absent, so one of `guards` refused. Retried on unavailability within
    /// `deadline` (at most one value ever occupies the key, so a retry is safe).
    pub(super) async fn create_txn(
        &self,
        f: FileRef,
        bytes: Vec<u8>,
        guards: Vec<Compare>,
        also: Vec<TxnOp>,
        deadline: Instant,
    ) -> Result<Option<Response>, EtcdError> {
        let key = self.key(f);
        let mut compares = vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)];
        compares.extend(guards);
        let mut then = vec![TxnOp::put(key.clone(), bytes.clone(), None)];
        then.extend(also);
        let txn = Txn::new()
            .when(compares)
            .and_then(then)
            // The value, not only the key: a retry finding exactly its own bytes was
            // preceded by an attempt of its own that landed (`is_own_record`).
            .or_else(vec![TxnOp::get(key.clone(), None)]);
        let (resp, retried) = self
            .txn(&key, deadline, txn)
            .await
            .map_err(|e| e.about(f))?;
        let existing = got_value(&resp);
        if resp.succeeded() || is_own_record(existing.as_deref(), &bytes, retried) {
            return Ok(Some(Response::Created));
        }
        Ok(existing.map(|_| Response::AlreadyExists))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // PROTOCOL §17 (issue #31): a retried exclusive create adopts exactly its own record.
    #[test]
    fn a_retried_create_adopts_only_its_own_bytes_after_an_unanswered_attempt() {
        let ours = br#"{"sequence":7,"owner_id":"run-a"}"#.as_slice();
        // An earlier attempt landed and its answer was lost: the retry reads our bytes.
        assert!(is_own_record(Some(ours), ours, true));
        // Another value occupies the slot: somebody else's record.
        assert!(!is_own_record(
            Some(br#"{"sequence":7,"owner_id":"run-b"}"#),
            ours,
            true
        ));
        // One byte more or less is another record.
        assert!(!is_own_record(Some(&ours[..ours.len() - 1]), ours, true));
        // The key is absent (the compare failed for the epoch guard): not ours.
        assert!(!is_own_record(None, ours, true));
        // The same bytes with no unanswered attempt of ours: an identical request of
        // somebody else (two equal appends in one millisecond), not ours.
        assert!(!is_own_record(Some(ours), ours, false));
    }
}
