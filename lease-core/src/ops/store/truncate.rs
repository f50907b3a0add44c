//! Remove what a snapshot made unnecessary (§18.5): the records it folds in, then older
//! snapshots.

use crate::ids::Sequence;
use crate::layout::{Dir, FileRef};
use crate::ops::{Durability, Operation, Request, Response, Step, violation};

/// What [`TruncateStoreLog`] removed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Truncated {
    /// Records removed (all at or below the snapshot's `through`).
    pub records: u64,
    /// Older snapshots' manifests and chunks removed, and chunks left without a manifest
    /// by a writer that died (all of snapshots older than this one).
    pub snapshot_files: u64,
}

/// Remove what the snapshot `keep` made unnecessary (PROTOCOL.md §18.5): every record up
/// to its `through`, then every older snapshot (manifest first, then its chunks), and
/// chunks of older snapshots that never got a manifest. Run after `keep`'s manifest was
/// created: a reader that began before it finds records missing and reads again
/// (`CONCURRENT_CHANGE`, [`super::ReadStoreLog`]), one that begins after starts from `keep`.
///
/// Removals are plain deletes (§17): each removes only what the durable manifest of `keep`
/// already covers, so a late removal by a deposed owner changes no answer. Snapshots at
/// `keep`'s `through` or above are never touched.
#[derive(Debug, Clone)]
pub struct TruncateStoreLog {
    through: Sequence,
    keep: FileRef,
    removing: Vec<FileRef>,
    done: Truncated,
    st: TruncState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TruncState {
    Start,
    ListedLog,
    ListedSnapshots,
    Removing,
    Done,
}

impl TruncateStoreLog {
    /// Truncate up to the snapshot `keep` (a [`FileRef::Snapshot`]; anything else removes
    /// nothing).
    pub fn new(keep: FileRef) -> TruncateStoreLog {
        let through = match keep {
            FileRef::Snapshot { through, .. } => through,
            _ => Sequence::FIRST,
        };
        TruncateStoreLog {
            through,
            keep,
            removing: Vec::new(),
            done: Truncated::default(),
            st: TruncState::Start,
        }
    }

    fn next_removal(&mut self) -> Step<Truncated> {
        match self.removing.pop() {
            Some(f) => {
                match f {
                    FileRef::StoreRecord(_) => self.done.records += 1,
                    _ => self.done.snapshot_files += 1,
                }
                self.st = TruncState::Removing;
                Step::Io(Request::Remove(f, Durability::NoFsync))
            }
            None => {
                self.st = TruncState::Done;
                Step::Done(Ok(std::mem::take(&mut self.done)))
            }
        }
    }
}

impl Operation for TruncateStoreLog {
    type Output = Truncated;

    fn next(&mut self, input: Option<Response>) -> Step<Truncated> {
        if !matches!(self.keep, FileRef::Snapshot { .. }) {
            self.st = TruncState::Done;
            return Step::Done(Ok(Truncated::default()));
        }
        match (self.st, input) {
            (TruncState::Start, None) => {
                self.st = TruncState::ListedLog;
                Step::Io(Request::List(Dir::StoreLog))
            }
            (TruncState::ListedLog, Some(Response::Listing(files))) => {
                let mut records: Vec<FileRef> = files
                    .into_iter()
                    .filter(|f| matches!(f, FileRef::StoreRecord(s) if *s <= self.through))
                    .collect();
                // Popped from the end: the oldest record goes first, so what is left is
                // always a suffix of the log (a reader never meets a hole below a record).
                records.sort();
                records.reverse();
                self.removing = records;
                self.st = TruncState::ListedSnapshots;
                Step::Io(Request::List(Dir::StoreSnapshots))
            }
            (TruncState::ListedSnapshots, Some(Response::Listing(files))) => {
                let older = |t: &Sequence| *t < self.through;
                let mut manifests = Vec::new();
                let mut chunks = Vec::new();
                for f in files {
                    match f {
                        FileRef::Snapshot { through, .. } if older(&through) => manifests.push(f),
                        FileRef::SnapshotChunk { through, .. } if older(&through) => chunks.push(f),
                        _ => {}
                    }
                }
                // Removal order (popped from the end): records, then manifests, then
                // chunks, so no manifest ever names a removed chunk.
                let mut order = chunks;
                order.extend(manifests);
                order.append(&mut self.removing);
                self.removing = order;
                self.next_removal()
            }
            (TruncState::Removing, Some(Response::Done)) => self.next_removal(),
            (_, got) => {
                self.st = TruncState::Done;
                Step::Done(Err(violation("the answer to a store log truncation", &got)))
            }
        }
    }
}
