//! heartbeat (PROTOCOL §7.2): write the owner's heartbeat into its slot, then RECHECK.

use super::{OwnedLease, fenced};
use crate::canonical::encode;
use crate::error::LeaseError;
use crate::ids::Identity;
use crate::layout::FileRef;
use crate::ops::common::Recheck;
use crate::ops::{Durability, Operation, Request, Response, Step, step_sub, step_try, violation};
use crate::policy::HeartbeatDurability;
use crate::records::{HeartbeatRecord, MonoStamp};
use crate::time::Timestamp;

/// One heartbeat of an owner: write its heartbeat record in place into the slot of beat
/// `count` ([`Request::WriteBeat`], [`crate::beat`]), then check from a listing that no
/// higher generation exists (`FENCED` if one does).
///
/// The caller reads its monotonic clock *before* starting, and on success records that
/// reading as the start of the last successful heartbeat (the self-fence reference). With
/// [`Heartbeat::on_clock`], the operation first asks the driver for its monotonic reading
/// ([`Request::Monotonic`]) and stamps the record with it: a reading taken after the
/// caller's, so an observer on the same clock never over-states how long ago the beat the
/// owner fences from started (PROTOCOL.md §10, the same-clock rule).
#[derive(Debug, Clone)]
pub struct Heartbeat {
    lease: OwnedLease,
    rec: HeartbeatRecord,
    clock: Option<Identity>,
    /// Written durably whatever the policy says ([`Heartbeat::durable`]).
    durable: bool,
    step: BeatStep,
    recheck: Recheck,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BeatStep {
    Start,
    Clock,
    Write,
    Recheck,
}

impl Heartbeat {
    /// Heartbeat number `count` (1, 2, ...: the caller numbers its beats, the claim being
    /// 0) at wall time `now`. A `count` of 0 is `ARGUMENT_INVALID` (it was silently taken
    /// as 1 before).
    ///
    /// `count` is also the beat's slot sequence: beat 1 writes a fresh heartbeat file,
    /// every later one overwrites the slot of beat `count − 2` in place. So a caller's
    /// counts must increase within one lease (a retry after a failed beat may repeat its
    /// count); a caller that starts over (a new process adopting its epoch) starts at 1.
    /// A count lower than one already in the file would leave the higher, older beat the
    /// one readers see (the owner would look staler than it is, never fresher).
    pub fn new(lease: &OwnedLease, now: Timestamp, count: u64) -> Result<Heartbeat, LeaseError> {
        if count == 0 {
            return Err(LeaseError::ArgumentInvalid {
                what: "heartbeat count",
                reason: "heartbeats are numbered from 1 (the claim is 0)".into(),
            });
        }
        let rec = HeartbeatRecord {
            run_id: lease.run_id.clone(),
            generation: lease.generation,
            owner_id: lease.owner_id.clone(),
            heartbeat_at: now,
            count,
            store_head: None,
            mono: None,
        };
        // Fail early, before any I/O, on a record that cannot be encoded or does not fit
        // a heartbeat slot.
        let bytes = encode(&rec)?;
        // The stamp added later (`on_clock`) is at most one identity and a number longer.
        if bytes.len() + crate::ids::IDENTITY_MAX_BYTES + 64 > crate::beat::MAX_PAYLOAD {
            return Err(LeaseError::ArgumentInvalid {
                what: "heartbeat record",
                reason: crate::beat::SlotError::TooLong { len: bytes.len() }.to_string(),
            });
        }
        Ok(Heartbeat {
            lease: lease.clone(),
            rec,
            clock: None,
            durable: false,
            step: BeatStep::Start,
            recheck: Recheck::new(lease.generation),
        })
    }

    /// Report the owner's store head (its last acknowledged commit, read when the heartbeat
    /// started) in the heartbeat record: whoever replaces this owner by takeover or
    /// retirement records it as the new epoch's `store_floor` (PROTOCOL.md §7.2).
    /// (Any `store_head` encodes: [`Heartbeat::new`] already checked the rest of the
    /// record, so this never fails; the `Result` is kept for callers.)
    pub fn with_store_head(mut self, store_head: Option<u64>) -> Result<Heartbeat, LeaseError> {
        self.rec.store_head = store_head;
        Ok(self)
    }

    /// Stamp the record with the driver's monotonic reading on the clock named `clock`
    /// (the boot and time namespace the driver's `CLOCK_BOOTTIME` belongs to), or with
    /// nothing when `None` (the driver cannot name its clock).
    pub fn on_clock(mut self, clock: Option<Identity>) -> Heartbeat {
        self.clock = clock;
        self
    }

    /// Write this beat durably ([`Durability::Fsync`]) even when the policy's heartbeats
    /// are `local`: the beat then survives a power loss, and with it the store head it
    /// reports, which a replacer records as its floor. An owner that acknowledges a store
    /// commit only after such a beat carrying its sequence has returned makes every
    /// acknowledged commit part of the floor (issue #20). The record and the protocol
    /// steps are those of any beat; only the fsync is added.
    pub fn durable(mut self) -> Heartbeat {
        self.durable = true;
        self
    }

    fn write(&mut self) -> Step<()> {
        self.step = BeatStep::Write;
        let bytes = step_try!(encode(&self.rec));
        let durability = match self.lease.policy.heartbeat_durability() {
            _ if self.durable => Durability::Fsync,
            HeartbeatDurability::Local => Durability::NoFsync,
            HeartbeatDurability::Durable => Durability::Fsync,
        };
        Step::Io(Request::WriteBeat {
            file: FileRef::Beat(self.lease.generation),
            seq: self.rec.count,
            record: bytes,
            durability,
        })
    }
}

impl Operation for Heartbeat {
    type Output = ();
    fn next(&mut self, input: Option<Response>) -> Step<()> {
        match self.step {
            BeatStep::Start if self.clock.is_some() => {
                self.step = BeatStep::Clock;
                return Step::Io(Request::Monotonic);
            }
            BeatStep::Start => return self.write(),
            BeatStep::Clock => {
                let Some(Response::Monotonic(ns)) = input else {
                    return Step::Done(Err(violation("Monotonic", &input)));
                };
                self.rec.mono = self.clock.take().map(|clock| MonoStamp { clock, ns });
                return self.write();
            }
            BeatStep::Write | BeatStep::Recheck => {}
        }
        let input = if self.step == BeatStep::Recheck {
            input
        } else {
            match input {
                Some(Response::Done) => {
                    self.step = BeatStep::Recheck;
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
