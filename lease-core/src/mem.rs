//! An in-memory authority: a map from [`FileRef`] to bytes that answers [`Request`]s.
//!
//! It is pure (no I/O) and atomic per request, which makes it the reference "disk" for the
//! core's own tests, examples, fuzz targets and property tests. It does **not** model
//! crashes or torn writes; the simulated file system of `lease-fs` does.

use crate::LeaseError;
use crate::layout::FileRef;
use crate::ops::{LivenessEvidence, Operation, Request, Response, Step};
use crate::records::Holder;
use std::collections::BTreeMap;

/// An in-memory run directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemDisk {
    /// The files.
    pub files: BTreeMap<FileRef, Vec<u8>>,
    /// How many requests of each kind were answered (`list`, `read`, `exists`, `create`,
    /// `replace`, `remove`, `probe`, `sync`).
    pub counts: BTreeMap<&'static str, u64>,
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
            Request::Replace(..) => "replace",
            Request::Remove(..) => "remove",
            Request::ProbeLiveness(_) => "probe",
            Request::SyncDir(_) => "sync",
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
            Request::Replace(f, bytes, _) => {
                self.files.insert(f, bytes);
                Response::Done
            }
            Request::Remove(f, _) => {
                self.files.remove(&f);
                Response::Done
            }
            Request::ProbeLiveness(h) => Response::Liveness(liveness(&h)),
            // Every request is durable at once here.
            Request::SyncDir(_) => Response::Done,
        }
    }

    /// Run an operation to completion against this disk.
    pub fn run<O: Operation>(
        &mut self,
        op: &mut O,
        liveness: &dyn Fn(&Holder) -> LivenessEvidence,
    ) -> Result<O::Output, LeaseError> {
        let mut input = None;
        loop {
            match op.next(input.take()) {
                Step::Io(req) => input = Some(self.perform(req, liveness)),
                Step::Done(r) => return r,
            }
        }
    }
}
