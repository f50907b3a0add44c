//! An in-memory authority: a map from [`FileRef`] to bytes that answers [`Request`]s.
//!
//! It is pure (no I/O) and atomic per request, which makes it the reference "disk" for the
//! core's own tests, examples, fuzz targets and property tests. It does **not** model
//! crashes or torn writes; the simulated file system of `lease-fs` does.

use crate::LeaseError;
use crate::RunId;
use crate::layout::FileRef;
use crate::ops::{
    AuthorityLease, LivenessEvidence, LockEvidence, Operation, ProcessState, Request, Response,
};
use crate::records::Holder;
use crate::transport::{TailHint, Transport};
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
            Request::CreateExclusive(..) => "create",
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
            Request::CreateExclusive(f, bytes) => match self.files.entry(f) {
                std::collections::btree_map::Entry::Occupied(_) => Response::AlreadyExists,
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(bytes);
                    Response::Created
                }
            },
            Request::WriteBeat {
                file, seq, record, ..
            } => {
                // The same bytes the disk adapters write (lease_core::beat): a fresh file
                // for beat 1 or a missing file, else the one slot in place.
                match self.files.get_mut(&file) {
                    Some(bytes) if seq > 1 => {
                        if let Ok(slot) = crate::beat::slot_bytes(seq, &record) {
                            crate::beat::put_slot(bytes, seq, &slot);
                        }
                    }
                    _ => {
                        if let Ok(whole) = crate::beat::fresh_file(seq, &record) {
                            self.files.insert(file, whole);
                        }
                    }
                }
                Response::Done
            }
            Request::Remove(f, _) => {
                self.files.remove(&f);
                Response::Done
            }
            Request::ProbeLiveness(h) => Response::Liveness(liveness(&h)),
            // Every request is durable at once here.
            Request::SyncDir(_) => Response::Done,
            Request::Monotonic => Response::Monotonic(self.mono_ns),
        }
    }

    /// Run an operation to completion against this disk.
    pub fn run<O: Operation>(
        &mut self,
        op: &mut O,
        liveness: &dyn Fn(&Holder) -> LivenessEvidence,
    ) -> Result<O::Output, LeaseError> {
        match crate::ops::drive(op, |req| {
            Ok::<_, std::convert::Infallible>(self.perform(req, liveness))
        }) {
            Ok(result) => result,
            Err(never) => match never {},
        }
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
