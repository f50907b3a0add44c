//! heartbeat (PROTOCOL §7.2): replace the owner's heartbeat record, then RECHECK.

use super::{OwnedLease, fenced};
use crate::canonical::encode;
use crate::error::LeaseError;
use crate::layout::FileRef;
use crate::ops::common::Recheck;
use crate::ops::{Durability, Operation, Request, Response, Step, step_sub, violation};
use crate::policy::HeartbeatDurability;
use crate::records::HeartbeatRecord;
use crate::time::Timestamp;

/// One heartbeat of an owner: replace its heartbeat record, then check from a listing that
/// no higher generation exists (`FENCED` if one does).
///
/// The caller reads its monotonic clock *before* starting, and on success records that
/// reading as the start of the last successful heartbeat (the self-fence reference).
#[derive(Debug, Clone)]
pub struct Heartbeat {
    lease: OwnedLease,
    heartbeat_at: Timestamp,
    count: u64,
    bytes: Option<Vec<u8>>,
    recheck: Recheck,
    wrote: bool,
    rechecking: bool,
}

impl Heartbeat {
    /// Heartbeat number `count` (1, 2, ...) at wall time `now`.
    pub fn new(lease: &OwnedLease, now: Timestamp, count: u64) -> Result<Heartbeat, LeaseError> {
        let rec = HeartbeatRecord {
            run_id: lease.run_id.clone(),
            generation: lease.generation,
            owner_id: lease.owner_id.clone(),
            heartbeat_at: now,
            count: count.max(1),
            store_head: None,
        };
        Ok(Heartbeat {
            lease: lease.clone(),
            heartbeat_at: now,
            count: rec.count,
            bytes: Some(encode(&rec)?),
            recheck: Recheck::new(lease.generation),
            wrote: false,
            rechecking: false,
        })
    }
}

impl Heartbeat {
    /// Report the owner's store head (its last acknowledged commit, read when the heartbeat
    /// started) in the heartbeat record: whoever replaces this owner by takeover or
    /// retirement records it as the new epoch's `store_floor` (PROTOCOL.md §7.2).
    pub fn with_store_head(mut self, store_head: Option<u64>) -> Result<Heartbeat, LeaseError> {
        let rec = HeartbeatRecord {
            run_id: self.lease.run_id.clone(),
            generation: self.lease.generation,
            owner_id: self.lease.owner_id.clone(),
            heartbeat_at: self.heartbeat_at,
            count: self.count,
            store_head,
        };
        self.bytes = Some(encode(&rec)?);
        Ok(self)
    }
}

impl Operation for Heartbeat {
    type Output = ();
    fn next(&mut self, input: Option<Response>) -> Step<()> {
        if !self.wrote {
            self.wrote = true;
            let durability = match self.lease.policy.heartbeat_durability() {
                HeartbeatDurability::Local => Durability::NoFsync,
                HeartbeatDurability::Durable => Durability::Fsync,
            };
            return Step::Io(Request::Replace(
                FileRef::Beat(self.lease.generation),
                self.bytes.take().unwrap_or_default(),
                durability,
            ));
        }
        let input = if self.rechecking {
            input
        } else {
            match input {
                Some(Response::Done) => {
                    self.rechecking = true;
                    None
                }
                other => return Step::Done(Err(violation("Done", &other))),
            }
        };
        let higher = step_sub!(&mut self.recheck, input);
        match higher {
            None => Step::Done(Ok(())),
            Some(top) => Step::Done(Err(fenced(
                &self.lease.run_id,
                self.lease.generation,
                format!("superseded by generation {top}"),
            ))),
        }
    }
}
