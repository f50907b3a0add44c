//! An in-memory authority: a map from [`FileRef`] to bytes that answers [`Request`]s.
//!
//! It is pure (no I/O) and atomic per request, which makes it the reference "disk" for the
//! core's own tests, examples, fuzz targets and property tests.
//!
//! It models a power loss at request granularity ([`MemDisk::power_loss`]): what a request
//! made durable stays (a created file, an fsynced heartbeat or removal); what it did not can
//! be undone (a `NoFsync` heartbeat or removal), and with a tear the newest such heartbeat
//! comes back half written. [`MemDisk::link`] and [`MemDisk::sync_dir`] split a
//! create into its link (visible, not durable) and the directory fsync that makes it
//! durable, so a driver can let others read a record before it is durable (PROTOCOL §7.0
//! SYNC). The system-call-level simulated file system of `lease-fs` models more (every
//! fsync, any call torn).

use crate::LeaseError;
use crate::layout::FileRef;
use crate::ops::{
    AuthorityLease, Durability, LivenessEvidence, LockEvidence, Operation, ProcessState, Request,
    Response,
};
use crate::records::Holder;
use crate::transport::{TailHint, Transport};
use crate::{Generation, RunId};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// An in-memory run directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemDisk {
    /// The files.
    pub files: BTreeMap<FileRef, Vec<u8>>,
    /// How many requests of each kind were answered (`list`, `read`, `exists`, `create`,
    /// `replace`, `remove`, `probe`, `sync`, `clock`).
    pub counts: BTreeMap<&'static str, u64>,
    /// What [`Request::Monotonic`] answers (ns): a simulated clock the caller moves.
    pub mono_ns: u64,
    /// Files changed since they were last durable, with what a power loss leaves of each.
    pub volatile: BTreeMap<FileRef, Volatile>,
    /// Writes so far (the order of [`Volatile::order`]).
    writes: u64,
}

/// A file whose latest change a power loss may undo ([`MemDisk::volatile`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volatile {
    /// What survives a power loss (`None`: no file).
    pub durable: Option<Vec<u8>>,
    /// What a power loss that tears this file's last write leaves, if that write can tear
    /// (a heartbeat written without fsync).
    pub torn: Option<Option<Vec<u8>>>,
    /// Only the directory entry is not durable (a link, a removal): a directory fsync
    /// makes it durable. Otherwise the data is not (a heartbeat written without fsync).
    pub entry_only: bool,
    /// When it was last changed: a tear takes the newest write that can tear.
    pub order: u64,
}

impl MemDisk {
    /// An empty run.
    pub fn new() -> MemDisk {
        MemDisk::default()
    }

    /// Answer one request. `liveness` answers [`Request::ProbeLiveness`].
    pub fn perform(
        &mut self,
        req: Request,
        liveness: &dyn Fn(&Holder) -> LivenessEvidence,
    ) -> Response {
        let kind = match &req {
            Request::List(_) | Request::CountEvents => "list",
            Request::Read(_) => "read",
            Request::Exists(_) => "exists",
            Request::CreateExclusive(..) | Request::CreateGuarded { .. } => "create",
            Request::ReplaceGuarded { .. } => "replace",
            Request::ReadStoreRecords { .. } => "read",
            Request::WriteBeat { .. } => "beat",
            Request::Remove(..) => "remove",
            Request::ProbeLiveness(_) => "probe",
            Request::SyncDir(_) => "sync",
            Request::Monotonic => "clock",
        };
        *self.counts.entry(kind).or_default() += 1;
        match req {
            Request::List(dir) => Response::Listing(
                self.files
                    .keys()
                    .filter(|f| f.dir() == Some(dir))
                    .copied()
                    .collect(),
            ),
            Request::CountEvents => {
                let mut count = 0;
                let mut highest = 0;
                for f in self.files.keys() {
                    if let FileRef::Event(s) = f {
                        count += 1;
                        highest = highest.max(s.get());
                    }
                }
                Response::EventCount { count, highest }
            }
            Request::Read(f) => Response::Content(self.files.get(&f).cloned()),
            Request::Exists(f) => Response::Exists(self.files.contains_key(&f)),
            Request::CreateExclusive(f, bytes) => self.create_durably(f, bytes),
            // The engine's guard (PROTOCOL §18.2): one atomic step here, as in etcd.
            Request::CreateGuarded {
                file,
                bytes,
                generation,
            } => {
                if self.files.contains_key(&file) {
                    return Response::AlreadyExists;
                }
                if self.epoch_above(generation) {
                    return Response::Superseded;
                }
                self.create_durably(file, bytes)
            }
            Request::ReplaceGuarded {
                file,
                bytes,
                generation,
            } => {
                if self.epoch_above(generation) {
                    return Response::Superseded;
                }
                self.volatile.remove(&file);
                self.files.insert(file, bytes);
                Response::Done
            }
            Request::ReadStoreRecords {
                from,
                max_count,
                max_bytes,
            } => {
                let mut out = Vec::new();
                let mut bytes = 0u64;
                let first = FileRef::StoreRecord(from);
                for (f, b) in self.files.range(first..) {
                    let FileRef::StoreRecord(s) = f else { break };
                    if out.len() >= max_count as usize || (!out.is_empty() && bytes >= max_bytes) {
                        break;
                    }
                    bytes = bytes.saturating_add(b.len() as u64);
                    out.push((*s, b.clone()));
                }
                Response::Records(out)
            }
            Request::WriteBeat {
                file,
                seq,
                record,
                durability,
            } => {
                self.write_beat(file, seq, &record, durability);
                Response::Done
            }
            Request::Remove(f, durability) => {
                if durability == Durability::NoFsync {
                    self.note_volatile(f, None, true);
                } else {
                    self.volatile.remove(&f);
                }
                self.files.remove(&f);
                Response::Done
            }
            Request::ProbeLiveness(h) => Response::Liveness(liveness(&h)),
            Request::SyncDir(dir) => {
                self.sync_dir(dir);
                Response::Done
            }
            Request::Monotonic => Response::Monotonic(self.mono_ns),
        }
    }

    /// The link of a create, without its directory fsync: the file is visible (others can
    /// read it) but a power loss before [`MemDisk::sync_dir`] of its directory removes it.
    /// Answers [`Response::Created`] or [`Response::AlreadyExists`] (nothing changes).
    pub fn link(&mut self, f: FileRef, bytes: Vec<u8>) -> Response {
        if self.files.contains_key(&f) {
            return Response::AlreadyExists;
        }
        // The temp file was fsynced before the link: the file is whole or absent.
        self.note_volatile(f, None, true);
        self.files.insert(f, bytes);
        Response::Created
    }

    /// `fsync` of directory `dir`: every entry it holds now is durable (a heartbeat's
    /// unsynced data is not).
    pub fn sync_dir(&mut self, dir: crate::layout::Dir) {
        self.volatile
            .retain(|f, v| !(v.entry_only && f.dir() == Some(dir)));
    }

    /// A power loss: every file in [`MemDisk::volatile`] goes back to what was durable,
    /// except that with `tear` the newest write that can tear is left half written.
    pub fn power_loss(&mut self, tear: bool) {
        let torn = if tear {
            self.volatile
                .iter()
                .filter(|(_, v)| v.torn.is_some())
                .max_by_key(|(_, v)| v.order)
                .map(|(f, _)| *f)
        } else {
            None
        };
        for (f, v) in std::mem::take(&mut self.volatile) {
            let left = match v.torn {
                Some(t) if Some(f) == torn => t,
                _ => v.durable,
            };
            match left {
                Some(b) => self.files.insert(f, b),
                None => self.files.remove(&f),
            };
        }
    }

    /// `f` is about to change without being made durable: remember what was durable (the
    /// first time since it last was) and what a tear of this write leaves.
    /// An exclusive create as answered: the temp written and fsynced, linked, the directory
    /// fsynced, so durable.
    fn create_durably(&mut self, f: FileRef, bytes: Vec<u8>) -> Response {
        let r = self.link(f, bytes);
        self.volatile.remove(&f);
        r
    }

    /// The engine's guard (PROTOCOL §18.2): an epoch above `generation` exists.
    fn epoch_above(&self, generation: Generation) -> bool {
        self.files
            .keys()
            .any(|f| matches!(f, FileRef::Epoch(h) if *h > generation))
    }

    fn note_volatile(&mut self, f: FileRef, torn: Option<Option<Vec<u8>>>, entry_only: bool) {
        self.writes += 1;
        let before = self.files.get(&f).cloned();
        let v = self.volatile.entry(f).or_insert(Volatile {
            durable: before,
            torn: None,
            entry_only,
            order: 0,
        });
        v.torn = torn;
        v.entry_only &= entry_only;
        v.order = self.writes;
    }

    /// A heartbeat: the same bytes the disk adapters write ([`crate::beat`]): a fresh file
    /// for beat 1 or a missing file, else the one slot in place. With `Fsync` it is durable
    /// as answered; without, a power loss may undo it or (the newest) tear it: a fresh
    /// file whose rename outran its data comes back cut short, an in-place write keeps
    /// its slot's header and half of its record (the rest of a slot is zeros: a cut
    /// there would tear nothing).
    fn write_beat(&mut self, file: FileRef, seq: u64, record: &[u8], durability: Durability) {
        let fsync = durability == Durability::Fsync;
        let cut = crate::beat::HEADER_BYTES + record.len() / 2;
        match self.files.get(&file).cloned() {
            Some(mut bytes) if seq > 1 => {
                let Ok(slot) = crate::beat::slot_bytes(seq, record) else {
                    return;
                };
                if !fsync {
                    let mut torn = bytes.clone();
                    crate::beat::put_slot(&mut torn, seq, &slot[..cut]);
                    self.note_volatile(file, Some(Some(torn)), false);
                }
                crate::beat::put_slot(&mut bytes, seq, &slot);
                self.files.insert(file, bytes);
            }
            _ => {
                let Ok(whole) = crate::beat::fresh_file(seq, record) else {
                    return;
                };
                if !fsync {
                    let at = crate::beat::slot_offset(seq) as usize;
                    let torn = whole[..at + cut].to_vec();
                    self.note_volatile(file, Some(Some(torn)), false);
                }
                self.files.insert(file, whole);
            }
        }
        if fsync {
            self.volatile.remove(&file);
        }
    }

    /// Run an operation to completion against this disk.
    pub fn run<O: Operation>(
        &mut self,
        op: &mut O,
        liveness: &dyn Fn(&Holder) -> LivenessEvidence,
    ) -> Result<O::Output, LeaseError> {
        crate::ops::drive(op, |req| Ok::<_, LeaseError>(self.perform(req, liveness)))
    }
}

/// A [`MemDisk`] behind the [`Transport`] seam, so every [`crate::LeaseOps`] operation runs
/// against memory (examples, property tests). Liveness probes answer what its `liveness`
/// function says; [`MemTransport::new`]'s answers "gone, lock free" (every owner dead).
pub struct MemTransport {
    run_id: RunId,
    disk: Mutex<MemDisk>,
    tail: TailHint,
    liveness: Box<dyn Fn(&Holder) -> LivenessEvidence + Send + Sync>,
}

impl std::fmt::Debug for MemTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemTransport")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl MemTransport {
    /// An empty run `run_id` whose every probed owner is gone.
    pub fn new(run_id: RunId) -> MemTransport {
        MemTransport::with_liveness(run_id, |h| LivenessEvidence {
            observer_boot_id: h.boot_id.clone(),
            process: ProcessState::Gone,
            owner_lock: LockEvidence::Free,
            lease: AuthorityLease::NotKept,
        })
    }

    /// An empty run whose liveness probes `liveness` answers.
    pub fn with_liveness(
        run_id: RunId,
        liveness: impl Fn(&Holder) -> LivenessEvidence + Send + Sync + 'static,
    ) -> MemTransport {
        MemTransport {
            run_id,
            disk: Mutex::new(MemDisk::new()),
            tail: TailHint::new(),
            liveness: Box::new(liveness),
        }
    }

    /// A copy of the disk as it is now.
    pub fn disk(&self) -> MemDisk {
        self.disk
            .lock()
            .map(|d| d.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }
}

impl Transport for MemTransport {
    type Error = LeaseError;
    type Bound = ();
    fn run_id(&self) -> &RunId {
        &self.run_id
    }
    fn default_bound(&self) {}
    fn execute(&self, req: Request, _bound: ()) -> Result<Response, LeaseError> {
        let mut disk = self.disk.lock().unwrap_or_else(|p| p.into_inner());
        Ok(disk.perform(req, &*self.liveness))
    }
    fn tail_hint(&self) -> &TailHint {
        &self.tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Dir;
    use crate::{Generation, Sequence};

    fn nobody(h: &Holder) -> LivenessEvidence {
        LivenessEvidence {
            observer_boot_id: h.boot_id.clone(),
            process: ProcessState::Gone,
            owner_lock: LockEvidence::Free,
            lease: AuthorityLease::NotKept,
        }
    }

    fn beat(seq: u64, durability: Durability) -> Request {
        Request::WriteBeat {
            file: FileRef::Beat(Generation::FIRST),
            seq,
            record: format!("{{\"beat\":{seq}}}").into_bytes(),
            durability,
        }
    }

    fn newest(d: &MemDisk) -> Option<Vec<u8>> {
        let bytes = d.files.get(&FileRef::Beat(Generation::FIRST))?;
        crate::beat::newest_record(bytes).map(<[u8]>::to_vec)
    }

    #[test]
    fn a_link_is_durable_only_after_its_directory_fsync() {
        let e1 = FileRef::Event(Sequence::new(1).unwrap());
        let e2 = FileRef::Event(Sequence::new(2).unwrap());
        let mut d = MemDisk::new();
        assert!(matches!(d.link(e1, b"one".to_vec()), Response::Created));
        assert!(matches!(
            d.link(e1, b"again".to_vec()),
            Response::AlreadyExists
        ));
        assert!(d.files.contains_key(&e1), "visible at once");
        d.power_loss(false);
        assert!(
            !d.files.contains_key(&e1),
            "lost before the directory fsync"
        );
        d.link(e1, b"one".to_vec());
        d.link(e2, b"two".to_vec());
        d.sync_dir(Dir::Epochs);
        d.power_loss(false);
        assert!(
            d.files.is_empty(),
            "another directory's fsync keeps nothing"
        );
        d.link(e1, b"one".to_vec());
        d.perform(Request::SyncDir(Dir::Events), &nobody);
        d.perform(Request::CreateExclusive(e2, b"two".to_vec()), &nobody);
        d.power_loss(true);
        assert_eq!(d.files.len(), 2, "synced and created durably");
    }

    #[test]
    fn unsynced_beats_and_removals_are_undone_and_the_newest_beat_can_tear() {
        let mut d = MemDisk::new();
        d.perform(beat(1, Durability::Fsync), &nobody);
        d.perform(beat(2, Durability::Fsync), &nobody);
        d.perform(beat(3, Durability::NoFsync), &nobody);
        assert_eq!(newest(&d).unwrap(), b"{\"beat\":3}");
        let mut lost = d.clone();
        lost.power_loss(false);
        assert_eq!(
            newest(&lost).unwrap(),
            b"{\"beat\":2}",
            "back to the durable beat"
        );
        let mut torn = d.clone();
        torn.power_loss(true);
        // Beat 3's slot (beat 1's, in place) is half written; beat 2's slot is whole.
        assert_eq!(newest(&torn).unwrap(), b"{\"beat\":2}");
        assert_ne!(torn.files, lost.files, "the tear left bytes of beat 3");
        d.perform(beat(4, Durability::Fsync), &nobody);
        d.power_loss(true);
        assert_eq!(
            newest(&d).unwrap(),
            b"{\"beat\":4}",
            "fsynced: nothing to undo"
        );
        let remove_then_lose_power = |d: &mut MemDisk, durability| {
            d.perform(
                Request::Remove(FileRef::Beat(Generation::FIRST), durability),
                &nobody,
            );
            d.power_loss(false);
        };
        remove_then_lose_power(&mut d, Durability::NoFsync);
        assert_eq!(
            newest(&d).unwrap(),
            b"{\"beat\":4}",
            "an unsynced removal comes back"
        );
        remove_then_lose_power(&mut d, Durability::Fsync);
        assert!(d.files.is_empty());
    }

    #[test]
    fn a_fresh_unsynced_beat_file_can_come_back_cut_short() {
        let mut d = MemDisk::new();
        d.perform(beat(1, Durability::NoFsync), &nobody);
        let mut torn = d.clone();
        torn.power_loss(true);
        let bytes = torn.files.get(&FileRef::Beat(Generation::FIRST)).unwrap();
        assert!(bytes.len() < d.files[&FileRef::Beat(Generation::FIRST)].len());
        d.power_loss(false);
        assert!(d.files.is_empty(), "never made durable");
    }
}
