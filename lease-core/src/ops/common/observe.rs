//! OBSERVE (PROTOCOL §7.0): list the epochs, read the highest and its heartbeat.

use super::{decode_beat, decode_epoch, epochs_of};
use crate::error::{HeldBy, LeaseError};
use crate::ids::{Digest, Generation, RunId};
use crate::layout::{Dir, FileRef};
use crate::ops::{Operation, Request, Response, Step, listing, step_try, violation};
use crate::policy::HeartbeatDurability;
use crate::records::{EpochRecord, EpochState, HeartbeatRecord};
use crate::time::Timestamp;

/// The authoritative (highest) epoch with its heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The epoch record.
    pub epoch: EpochRecord,
    /// SHA-256 of its canonical bytes (the next epoch's `prev_hash`).
    pub hash: Digest,
    /// Its heartbeat record, if any was written (active epochs only).
    pub beat: Option<HeartbeatRecord>,
    /// The hash of a **torn** heartbeat file, if that is what is there (PROTOCOL §4, OQ-6):
    /// a heartbeat file with no valid slot (under the `local` policy a fresh beat file is
    /// never fsynced, so a power loss can leave it empty, cut short or zero-filled). Such a
    /// beat is no evidence either way: the head is judged as if no beat had been written
    /// (`heartbeat_at` = the claim time, count 0).
    pub torn_beat: Option<Digest>,
    /// The hash of the whole heartbeat file as read (`None` when there is none). A
    /// watcher keys its watch on it as well as on the record, so any write to the file
    /// (a slot in flight, a beat whose record looks the same, a torn one) restarts the
    /// watch: only a file nobody writes can be watched to staleness.
    pub beat_file: Option<Digest>,
}

/// Set `head`'s heartbeat fields (`beat`, `torn_beat`, `beat_file`) from its heartbeat
/// file's bytes (`None`: no file), read as [`crate::beat`] says: the valid slot with the
/// highest sequence is the beat; slots that are not valid (a write in flight, or one cut by a
/// power loss) are ignored. A file with no valid slot (empty, zero-filled, cut short)
/// under the `local` policy is torn, not invalid (OQ-6): only a power loss during a fresh
/// beat file that was never fsynced leaves one, and it only ever mattered to liveness.
/// Under `durable` a fresh file is fsynced before its rename and later writes touch one
/// slot only, so a file with no valid slot is damage: `RECORD_INVALID`. A valid slot whose
/// record does not decode, or belongs to another generation or owner, is
/// `RECORD_INVALID` under either policy (and `head` is left as it was). Files in the older
/// one-record format (a JSON record replaced by rename) are read as before.
pub(crate) fn read_beat(
    head: &mut Head,
    run: &RunId,
    bytes: Option<&[u8]>,
) -> Result<(), LeaseError> {
    let Some(bytes) = bytes else {
        (head.beat, head.torn_beat, head.beat_file) = (None, None, None);
        return Ok(());
    };
    let beat = beat_of(run, &head.epoch, bytes)?;
    let file = Digest::of(bytes);
    head.torn_beat = beat.is_none().then(|| file.clone());
    (head.beat, head.beat_file) = (beat, Some(file));
    Ok(())
}

/// The newest valid beat of a heartbeat file's bytes; `None` when it is torn (above).
fn beat_of(
    run: &RunId,
    epoch: &EpochRecord,
    bytes: &[u8],
) -> Result<Option<HeartbeatRecord>, LeaseError> {
    let local = epoch.policy.heartbeat_durability() == HeartbeatDurability::Local;
    let payload = match crate::beat::read_slots(bytes) {
        crate::beat::SlotRead::Valid { payload, .. } => payload,
        crate::beat::SlotRead::Legacy(b) if local && b.last() != Some(&b'\n') => {
            return Ok(None);
        }
        crate::beat::SlotRead::Legacy(b) => b,
        crate::beat::SlotRead::Empty | crate::beat::SlotRead::Torn if local => {
            return Ok(None);
        }
        crate::beat::SlotRead::Empty | crate::beat::SlotRead::Torn => {
            return Err(LeaseError::RecordInvalid {
                run: run.to_string(),
                kind: crate::error::RecordKind::Heartbeat,
                file: Some(FileRef::Beat(epoch.generation).path()),
                detail: "no valid heartbeat slot (empty, zero-filled or damaged) under the \
                         durable policy, whose beats are fsynced"
                    .into(),
            });
        }
    };
    decode_beat(run, epoch, payload).map(Some)
}

impl Head {
    /// The head's generation.
    pub fn generation(&self) -> Generation {
        self.epoch.generation
    }
    /// Last heartbeat time: the beat's, else the claim time.
    pub fn heartbeat_at(&self) -> Timestamp {
        self.beat
            .as_ref()
            .map_or(self.epoch.claimed_at, |b| b.heartbeat_at)
    }
    /// Heartbeat counter: 0 when no heartbeat was written yet.
    pub fn heartbeat_count(&self) -> u64 {
        self.beat.as_ref().map_or(0, |b| b.count)
    }
    /// Whether the head is an active owner.
    pub fn is_active(&self) -> bool {
        self.epoch.state == EpochState::Active
    }
    /// Describe the holder for messages.
    pub fn held_by(&self) -> HeldBy {
        HeldBy {
            generation: self.epoch.generation,
            owner_id: self.epoch.owner_id.to_string(),
            host: self.epoch.holder.host.to_string(),
            pid: self.epoch.holder.pid,
            since: self.epoch.claimed_at,
            heartbeat_at: self.heartbeat_at(),
            heartbeat_count: self.heartbeat_count(),
        }
    }
}

/// Sub-operation: list epochs, read the highest and its heartbeat.
#[derive(Debug, Clone)]
pub(crate) struct Observe {
    run: RunId,
    st: ObserveState,
    beat: bool,
    restarts: u32,
}

#[derive(Debug, Clone)]
enum ObserveState {
    Start,
    Listed,
    ReadEpoch(Generation),
    ReadBeat(Box<(EpochRecord, Digest)>),
}

/// The result of [`Observe`].
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    /// The head, if any epoch exists.
    pub head: Option<Head>,
}

impl Observe {
    pub(crate) fn new(run: RunId) -> Observe {
        Observe {
            run,
            st: ObserveState::Start,
            beat: true,
            restarts: 0,
        }
    }

    /// Do not read the head's heartbeat record (`Head::beat` stays `None`).
    pub(crate) fn without_beat(mut self) -> Observe {
        self.beat = false;
        self
    }
}

impl Operation for Observe {
    type Output = Observed;
    fn next(&mut self, input: Option<Response>) -> Step<Observed> {
        match std::mem::replace(&mut self.st, ObserveState::Start) {
            ObserveState::Start => {
                self.st = ObserveState::Listed;
                Step::Io(Request::List(Dir::Epochs))
            }
            ObserveState::Listed => {
                let l = step_try!(listing(input));
                match epochs_of(l).last() {
                    None => Step::Done(Ok(Observed { head: None })),
                    Some(&h) => {
                        self.st = ObserveState::ReadEpoch(h);
                        Step::Io(Request::Read(FileRef::Epoch(h)))
                    }
                }
            }
            ObserveState::ReadEpoch(h) => {
                let bytes = match input {
                    Some(Response::Content(Some(b))) => b,
                    Some(Response::Content(None)) => {
                        // Listed a moment ago and gone now: epochs are only removed below a
                        // checkpoint floor, never the head, so this is concurrent compaction
                        // of a stray or outside interference. Start over, a bounded number of
                        // times.
                        self.restarts += 1;
                        if self.restarts > 8 {
                            return Step::Done(Err(LeaseError::ConcurrentChange {
                                run: self.run.to_string(),
                                detail: format!(
                                    "epoch {h} keeps vanishing between listing and reading"
                                ),
                            }));
                        }
                        self.st = ObserveState::Listed;
                        return Step::Io(Request::List(Dir::Epochs));
                    }
                    other => return Step::Done(Err(violation("Content", &other))),
                };
                let epoch = step_try!(decode_epoch(&self.run, h, &bytes));
                let hash = Digest::of(&bytes);
                if epoch.state == EpochState::Active && self.beat {
                    self.st = ObserveState::ReadBeat(Box::new((epoch, hash)));
                    Step::Io(Request::Read(FileRef::Beat(h)))
                } else {
                    Step::Done(Ok(Observed {
                        head: Some(Head {
                            epoch,
                            hash,
                            beat: None,
                            torn_beat: None,
                            beat_file: None,
                        }),
                    }))
                }
            }
            ObserveState::ReadBeat(b) => {
                let (epoch, hash) = *b;
                let Some(Response::Content(content)) = input else {
                    return Step::Done(Err(violation("Content", &input)));
                };
                let mut head = Head {
                    epoch,
                    hash,
                    beat: None,
                    torn_beat: None,
                    beat_file: None,
                };
                if let Err(e) = read_beat(&mut head, &self.run, content.as_deref()) {
                    return Step::Done(Err(e));
                }
                Step::Done(Ok(Observed { head: Some(head) }))
            }
        }
    }
}
