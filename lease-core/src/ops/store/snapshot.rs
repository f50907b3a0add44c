//! A snapshot of the store (§18.5): its image written in chunks under the engine's guard,
//! then its manifest; and read back, each chunk checked against the manifest.

use super::{fenced, log_invalid};
use crate::canonical::encode;
use crate::error::LeaseError;
use crate::ids::{Digest, Generation, RunId, Sequence};
use crate::layout::FileRef;
use crate::ops::{Operation, OwnedLease, Request, Response, Step, violation};
use crate::store_log::{MAX_CHUNK_BYTES, MAX_CHUNKS, SnapshotManifest, StoreTail};
use crate::time::Timestamp;

/// Read a snapshot's image (PROTOCOL.md §18.5), read-only: each chunk in order, each
/// checked against the manifest's hash; returns the image. A chunk missing or different is
/// `STORE_LOG_INVALID`, unless the manifest itself was removed meanwhile (a newer snapshot
/// replaced it), which is `CONCURRENT_CHANGE`.
#[derive(Debug, Clone)]
pub struct ReadSnapshot {
    run: RunId,
    file: FileRef,
    manifest: SnapshotManifest,
    image: Vec<u8>,
    index: u32,
    st: SnapState,
}

#[derive(Debug, Clone)]
enum SnapState {
    Start,
    Chunk,
    Confirm(Box<LeaseError>),
    Done,
}

impl ReadSnapshot {
    /// Read the image of the snapshot `file` whose manifest is `manifest` (from
    /// [`super::StoreLogView::snapshot`]).
    pub fn new(run: RunId, file: FileRef, manifest: SnapshotManifest) -> ReadSnapshot {
        ReadSnapshot {
            run,
            file,
            manifest,
            image: Vec::new(),
            index: 0,
            st: SnapState::Start,
        }
    }

    fn chunk(&self) -> FileRef {
        let (through, nonce) = (self.manifest.through, self.manifest.nonce);
        FileRef::SnapshotChunk {
            through,
            nonce,
            index: self.index,
        }
    }

    fn fail(&mut self, e: LeaseError) -> Step<Vec<u8>> {
        self.st = SnapState::Done;
        Step::Done(Err(e))
    }
}

impl Operation for ReadSnapshot {
    type Output = Vec<u8>;

    fn next(&mut self, input: Option<Response>) -> Step<Vec<u8>> {
        match (std::mem::replace(&mut self.st, SnapState::Done), input) {
            (SnapState::Start, None) => {
                self.st = SnapState::Chunk;
                Step::Io(Request::Read(self.chunk()))
            }
            (SnapState::Chunk, Some(Response::Content(found))) => {
                let chunk = self.chunk();
                let want = self.manifest.chunks.get(self.index as usize).cloned();
                let problem = match (&found, &want) {
                    (None, _) => Some("the chunk is missing".to_string()),
                    (Some(b), _) if b.len() > MAX_CHUNK_BYTES => {
                        Some(format!("the chunk holds {} bytes", b.len()))
                    }
                    (Some(b), Some(h)) if Digest::of(b) != *h => {
                        Some("the chunk's hash is not the manifest's".into())
                    }
                    (Some(_), None) => Some("the manifest lists fewer chunks".into()),
                    _ => None,
                };
                if let Some(p) = problem {
                    self.st = SnapState::Confirm(Box::new(log_invalid(&self.run, chunk, p)));
                    return Step::Io(Request::Exists(self.file));
                }
                self.image.extend_from_slice(&found.unwrap_or_default());
                self.index += 1;
                if (self.index as usize) < self.manifest.chunks.len() {
                    self.st = SnapState::Chunk;
                    return Step::Io(Request::Read(self.chunk()));
                }
                if self.image.len() as u64 != self.manifest.size {
                    let e = log_invalid(
                        &self.run,
                        self.file,
                        format!(
                            "the chunks hold {} bytes, the manifest says {}",
                            self.image.len(),
                            self.manifest.size
                        ),
                    );
                    return self.fail(e);
                }
                self.st = SnapState::Done;
                Step::Done(Ok(std::mem::take(&mut self.image)))
            }
            (SnapState::Confirm(e), Some(Response::Exists(still))) => {
                if still {
                    return self.fail(*e);
                }
                self.fail(LeaseError::ConcurrentChange {
                    run: self.run.to_string(),
                    detail: "the snapshot was removed while it was read (a newer one replaced it)"
                        .into(),
                })
            }
            (_, got) => self.fail(violation("the answer to a snapshot read", &got)),
        }
    }
}

/// Write a snapshot of the store under the engine's guard (PROTOCOL.md §18.5): each chunk
/// of at most [`MAX_CHUNK_BYTES`] with [`Request::CreateGuarded`], then the manifest, the
/// same way. Until the manifest exists nobody reads the chunks; once it does, the records
/// up to `through` may be removed. `Superseded` at any step is `FENCED`.
#[derive(Debug, Clone)]
pub struct WriteSnapshot {
    run: RunId,
    generation: Generation,
    manifest: SnapshotManifest,
    manifest_bytes: Vec<u8>,
    image: Vec<u8>,
    index: u32,
    st: WriteSnapState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteSnapState {
    Start,
    Chunk,
    Manifest,
    Done,
}

impl WriteSnapshot {
    /// A snapshot by `lease` of the image `image` (the store after record `tail.last`),
    /// named with `nonce` (random: two writers never share chunk names). Refused before any
    /// request: `ARGUMENT_INVALID` (an empty log, or an image too large for
    /// [`MAX_CHUNKS`] chunks).
    pub fn new(
        lease: &OwnedLease,
        tail: &StoreTail,
        image: Vec<u8>,
        nonce: u64,
        now: Timestamp,
    ) -> Result<WriteSnapshot, LeaseError> {
        let Some((through, through_hash)) = tail.last.clone() else {
            return Err(LeaseError::ArgumentInvalid {
                what: "tail",
                reason: "a snapshot folds in at least one record".into(),
            });
        };
        let commits = Sequence::new(tail.commits).ok_or(LeaseError::ArgumentInvalid {
            what: "tail",
            reason: "a snapshot folds in at least one commit".into(),
        })?;
        let chunks: Vec<Digest> = if image.is_empty() {
            vec![Digest::of(&[])]
        } else {
            image.chunks(MAX_CHUNK_BYTES).map(Digest::of).collect()
        };
        if chunks.len() > MAX_CHUNKS as usize {
            return Err(LeaseError::ArgumentInvalid {
                what: "image",
                reason: format!("{} bytes need more than {MAX_CHUNKS} chunks", image.len()),
            });
        }
        let manifest = SnapshotManifest {
            run_id: lease.run_id.clone(),
            through,
            through_hash,
            commits,
            generation: lease.generation,
            owner_id: lease.owner_id.clone(),
            nonce,
            chunks,
            size: image.len() as u64,
            timestamp: now,
        };
        let manifest_bytes = encode(&manifest)?;
        Ok(WriteSnapshot {
            run: lease.run_id.clone(),
            generation: lease.generation,
            manifest,
            manifest_bytes,
            image,
            index: 0,
            st: WriteSnapState::Start,
        })
    }

    /// The manifest's file.
    pub fn file(&self) -> FileRef {
        FileRef::Snapshot {
            through: self.manifest.through,
            nonce: self.manifest.nonce,
        }
    }

    fn chunk_request(&self) -> Request {
        let i = self.index as usize;
        let start = i * MAX_CHUNK_BYTES;
        let end = (start + MAX_CHUNK_BYTES).min(self.image.len());
        Request::CreateGuarded {
            file: FileRef::SnapshotChunk {
                through: self.manifest.through,
                nonce: self.manifest.nonce,
                index: self.index,
            },
            bytes: self.image.get(start..end).unwrap_or_default().to_vec(),
            generation: self.generation,
        }
    }

    fn fail(&mut self, e: LeaseError) -> Step<FileRef> {
        self.st = WriteSnapState::Done;
        Step::Done(Err(e))
    }

    fn refused(&self, what: &str, got: &Response) -> LeaseError {
        match got {
            Response::Superseded => fenced(
                &self.run,
                self.generation,
                format!("the engine refused the snapshot's {what}: a newer epoch exists"),
            ),
            _ => LeaseError::ConcurrentChange {
                run: self.run.to_string(),
                detail: format!(
                    "the snapshot's {what} already exists (its nonce {:016x} was used before)",
                    self.manifest.nonce
                ),
            },
        }
    }
}

impl Operation for WriteSnapshot {
    type Output = FileRef;

    fn next(&mut self, input: Option<Response>) -> Step<FileRef> {
        match (self.st, input) {
            (WriteSnapState::Start, None) => {
                self.st = WriteSnapState::Chunk;
                Step::Io(self.chunk_request())
            }
            (WriteSnapState::Chunk, Some(Response::Created)) => {
                self.index += 1;
                if (self.index as usize) < self.manifest.chunks.len() {
                    return Step::Io(self.chunk_request());
                }
                self.st = WriteSnapState::Manifest;
                Step::Io(Request::CreateGuarded {
                    file: self.file(),
                    bytes: self.manifest_bytes.clone(),
                    generation: self.generation,
                })
            }
            (WriteSnapState::Manifest, Some(Response::Created)) => {
                self.st = WriteSnapState::Done;
                Step::Done(Ok(self.file()))
            }
            (st @ (WriteSnapState::Chunk | WriteSnapState::Manifest), Some(got))
                if matches!(got, Response::Superseded | Response::AlreadyExists) =>
            {
                let what = if st == WriteSnapState::Chunk {
                    "chunk"
                } else {
                    "manifest"
                };
                let e = self.refused(what, &got);
                self.fail(e)
            }
            (_, got) => self.fail(violation("the answer to a snapshot write", &got)),
        }
    }
}
