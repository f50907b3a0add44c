//! The owner's etcd lease: the liveness probe, adopting an epoch's lease, its time left, and
//! revoking it.

use super::call::Call;
use super::{EtcdRun, fenced};
use crate::error::EtcdError;
use etcd_client::GetOptions;
use lease_core::Generation;
use lease_core::Holder;
use lease_core::ops::{
    AuthorityLease, LivenessEvidence, LockEvidence, OwnedLease, ProcessState, Response,
};
use std::time::Instant;

impl EtcdRun {
    /// Revoke an etcd lease, best effort within one call timeout (an unrevoked lease
    /// simply expires).
    pub(super) async fn revoke_quietly(&self, id: i64) {
        let deadline = Instant::now() + self.inner.opts.call_timeout;
        let _ = self
            .call(
                "lease revoke",
                "",
                deadline,
                Call::Once,
                move |mut c| async move { c.lease_revoke(id).await },
            )
            .await;
    }

    /// Liveness as the cluster sees it: a liveness key holding `holder` exists while that
    /// owner's etcd lease is alive.
    ///
    /// The answer is the etcd lease itself ([`AuthorityLease`]): `Alive` while the key is
    /// there, `Expired` once the lease expired or was revoked, and lease-core judges by it
    /// alone (`lease_core::ops::definitely_dead`: dead exactly when it expired; a status
    /// read calls the owner active while it lives, whatever the heartbeat's age by a wall
    /// clock). That is sound because the owner fenced itself before its lease could expire
    /// (module docs). Nothing of the owner's host is observed from here: the process and
    /// the kernel owner lock are `Unknown`, the boot id is the holder's own.
    pub(super) async fn probe(
        &self,
        holder: &Holder,
        deadline: Instant,
    ) -> Result<Response, EtcdError> {
        let p = format!("{}live/", self.base);
        let resp = self
            .range(&p, Some(GetOptions::new().with_prefix()), deadline)
            .await?;
        let mut alive = false;
        for kv in resp.kvs() {
            let h = self.holder_in(&String::from_utf8_lossy(kv.key()), kv.value())?;
            alive |= &h == holder;
        }
        Ok(Response::Liveness(LivenessEvidence {
            observer_boot_id: holder.boot_id.clone(),
            process: ProcessState::Unknown,
            owner_lock: LockEvidence::Unknown,
            lease: if alive {
                AuthorityLease::Alive
            } else {
                AuthorityLease::Expired
            },
        }))
    }

    /// Make sure this handle can keep `lease`'s etcd lease alive. A claim or takeover
    /// returns an epoch this handle did not create when it adopts the epoch of an earlier
    /// attempt of the same owner and process (lease-core's adoption on retry, e.g. after
    /// that attempt's handle died right after the creating transaction). The etcd lease is
    /// then taken over from the epoch's liveness key, which must hold this very holder;
    /// if the key is gone the lease already expired and the adopted epoch is `FENCED`.
    pub(super) fn adopt_liveness(
        &self,
        lease: &OwnedLease,
        deadline: Instant,
    ) -> Result<(), EtcdError> {
        let g = lease.generation;
        if self.owned.lock().is_ok_and(|o| o.contains_key(&g)) {
            return Ok(());
        }
        let lk = self.live_key(g);
        let found = self.inner.rt.block_on(async {
            let resp = self.range(&lk, None, deadline).await?;
            Ok::<_, EtcdError>(
                resp.kvs()
                    .first()
                    .map(|kv| (kv.lease(), kv.value().to_vec())),
            )
        })?;
        let Some((id, value)) = found else {
            return Err(fenced(
                &self.run_id,
                g,
                "the adopted epoch's etcd lease already expired",
            ));
        };
        let h = self.holder_in(&lk, &value)?;
        if h != lease.holder {
            return Err(EtcdError::LivenessInvalid {
                run: self.run_id.to_string(),
                key: lk,
                detail: "the liveness key names another holder than the epoch".into(),
            });
        }
        self.keep_lease(g, id);
        Ok(())
    }

    /// The holder a liveness key `key` holds (`value`), or `LIVENESS_INVALID` naming it.
    fn holder_in(&self, key: &str, value: &[u8]) -> Result<Holder, EtcdError> {
        serde_json::from_slice(value).map_err(|e| EtcdError::LivenessInvalid {
            run: self.run_id.to_string(),
            key: key.to_string(),
            detail: format!("not a holder record: {e}"),
        })
    }

    /// Remember `id` as the etcd lease of generation `g`'s owner on this handle (what its
    /// heartbeats keep alive and its release revokes).
    pub(super) fn keep_lease(&self, g: Generation, id: i64) {
        if let Ok(mut o) = self.owned.lock() {
            o.insert(g, id);
        }
    }

    /// Seconds left of the etcd lease of generation `g`'s owner, `None` when its
    /// liveness key is gone (lease expired or revoked, or never an active epoch).
    pub fn owner_lease_ttl(&self, g: Generation) -> Result<Option<i64>, EtcdError> {
        let deadline = self.deadline();
        let lk = self.live_key(g);
        self.inner.rt.block_on(async {
            let resp = self.range(&lk, None, deadline).await?;
            let Some(kv) = resp.kvs().first() else {
                return Ok(None);
            };
            let id = kv.lease();
            let ttl = self
                .call(
                    "lease ttl",
                    &lk,
                    deadline,
                    Call::Read,
                    move |mut c| async move { c.lease_time_to_live(id, None).await },
                )
                .await?
                .ttl();
            // The key can outlive its lease by the leader's expiry sweep; report 0 then.
            Ok(Some(ttl.max(0)))
        })
    }
}
