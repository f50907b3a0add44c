//! The on-disk layout of a run: the only place where file names are made and parsed.
//!
//! Names are built from typed numbers only (never from strings read from disk), and a name
//! read from a directory listing is accepted only if re-formatting the parsed value gives
//! back exactly the same name. So nothing read from disk can become a path component that
//! escapes its folder.

use crate::ids::{Generation, Sequence};

/// A directory of the run that the protocol lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    /// `lease/epochs`
    Epochs,
    /// `lease/beats`
    Beats,
    /// `lease/cutoffs`
    Cutoffs,
    /// `lease/intents`
    Intents,
    /// `lease/checkpoints`
    Checkpoints,
    /// `lease/marks`: verified-prefix marks of the event log (PROTOCOL §13.1, issue #33).
    Marks,
    /// `events`
    Events,
    /// `commands`
    Commands,
    /// `store/log`: the engine-committed store's record log (PROTOCOL.md §18). Not in
    /// [`Dir::ALL`], the run folder's layout: only an engine transport (etcd) holds it.
    StoreLog,
    /// `store/snapshots`: the engine-committed store's snapshots, a manifest and its chunks
    /// (§18). Not in [`Dir::ALL`].
    StoreSnapshots,
}

impl Dir {
    /// The engine-committed store's directories (PROTOCOL.md §18): kept by an engine
    /// transport (etcd), not part of a run folder's layout, so not in [`Dir::ALL`].
    pub const ENGINE_STORE: [Dir; 2] = [Dir::StoreLog, Dir::StoreSnapshots];

    /// All directories of a run folder's layout, parents before children.
    pub const ALL: [Dir; 8] = [
        Dir::Epochs,
        Dir::Beats,
        Dir::Cutoffs,
        Dir::Intents,
        Dir::Checkpoints,
        Dir::Events,
        Dir::Commands,
        // Last (issue #33), so the positions of the others stay what they were.
        Dir::Marks,
    ];

    /// The directory's path relative to the run root.
    pub fn path(self) -> &'static str {
        match self {
            Dir::Epochs => "lease/epochs",
            Dir::Beats => "lease/beats",
            Dir::Cutoffs => "lease/cutoffs",
            Dir::Intents => "lease/intents",
            Dir::Checkpoints => "lease/checkpoints",
            Dir::Marks => "lease/marks",
            Dir::Events => "events",
            Dir::Commands => "commands",
            Dir::StoreLog => "store/log",
            Dir::StoreSnapshots => "store/snapshots",
        }
    }

    /// Parse one entry name of this directory. Temp files (leading `.`) and anything
    /// else that is not exactly a name this module would produce give `None`.
    pub fn parse_name(self, name: &str) -> Option<FileRef> {
        if self == Dir::StoreSnapshots {
            return parse_snapshot_name(name);
        }
        let stem = name.strip_suffix(".json")?;
        match self {
            Dir::StoreSnapshots => None,
            Dir::StoreLog => num20(stem)
                .and_then(Sequence::new)
                .map(FileRef::StoreRecord),
            Dir::Epochs => gen20(stem).map(FileRef::Epoch),
            Dir::Beats => gen20(stem).map(FileRef::Beat),
            Dir::Cutoffs => gen20(stem).map(FileRef::Cutoff),
            Dir::Checkpoints => gen20(stem).map(FileRef::Checkpoint),
            Dir::Events => num20(stem).and_then(Sequence::new).map(FileRef::Event),
            Dir::Marks => num20(stem).and_then(Sequence::new).map(FileRef::Mark),
            Dir::Intents => {
                let (g, n) = stem.split_once('-')?;
                let generation = gen20(g)?;
                if n.len() != 16 || !n.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
                    return None;
                }
                let nonce = u64::from_str_radix(n, 16).ok()?;
                Some(FileRef::Intent { generation, nonce })
            }
            Dir::Commands => {
                let (g, p) = stem.split_once('-')?;
                let generation = gen20(g)?;
                let pid: u32 = p.parse().ok()?;
                if pid == 0 || p != pid.to_string() {
                    return None;
                }
                Some(FileRef::Command { generation, pid })
            }
        }
    }
}

/// `<through:020>-<nonce:016x>.json` (a manifest) or
/// `<through:020>-<nonce:016x>-<index:06>.bin` (one of its chunks).
fn parse_snapshot_name(name: &str) -> Option<FileRef> {
    let (stem, chunk) = match name.strip_suffix(".json") {
        Some(stem) => (stem, false),
        None => (name.strip_suffix(".bin")?, true),
    };
    let (t, rest) = stem.split_once('-')?;
    let through = num20(t).and_then(Sequence::new)?;
    let (n, index) = if chunk {
        let (n, i) = rest.split_once('-')?;
        if i.len() != 6 || !i.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        (n, Some(i.parse::<u32>().ok()?))
    } else {
        (rest, None)
    };
    if n.len() != 16 || !n.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let nonce = u64::from_str_radix(n, 16).ok()?;
    Some(match index {
        None => FileRef::Snapshot { through, nonce },
        Some(index) => FileRef::SnapshotChunk {
            through,
            nonce,
            index,
        },
    })
}

fn num20(s: &str) -> Option<u64> {
    if s.len() != 20 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn gen20(s: &str) -> Option<Generation> {
    num20(s).and_then(Generation::new)
}

/// A file of the run, named by typed values only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileRef {
    /// `lease/epochs/<generation:020>.json`
    Epoch(Generation),
    /// `lease/beats/<generation:020>.json`
    Beat(Generation),
    /// `lease/cutoffs/<generation:020>.json`
    Cutoff(Generation),
    /// `lease/intents/<generation:020>-<nonce:016x>.json`
    Intent {
        /// The generation the taker tries to create.
        generation: Generation,
        /// A caller-chosen random nonce.
        nonce: u64,
    },
    /// `lease/checkpoints/<floor_generation:020>.json`
    Checkpoint(Generation),
    /// `events/<sequence:020>.json`
    Event(Sequence),
    /// `lease/marks/<through_sequence:020>.json`: a verified-prefix mark (PROTOCOL §13.1).
    Mark(Sequence),
    /// `commands/<generation:020>-<pid>.json`
    Command {
        /// The generation that started the command.
        generation: Generation,
        /// Its pid.
        pid: u32,
    },
    /// `run.json`
    RunStatus,
    /// `store/log/<sequence:020>.json`: one record of the engine-committed store (§18).
    StoreRecord(Sequence),
    /// `store/snapshots/<through:020>-<nonce:016x>.json`: a snapshot's manifest (§18).
    Snapshot {
        /// The last store record the snapshot folds in.
        through: Sequence,
        /// The writer's random nonce (two writers of a snapshot at one record never
        /// share chunk names).
        nonce: u64,
    },
    /// `store/snapshots/<through:020>-<nonce:016x>-<index:06>.bin`: chunk `index` (0, 1,
    /// …) of a snapshot's image, at most [`crate::store_log::MAX_CHUNK_BYTES`].
    SnapshotChunk {
        /// As the manifest's.
        through: Sequence,
        /// As the manifest's.
        nonce: u64,
        /// The chunk's position in the image (below 1,000,000).
        index: u32,
    },
}

impl FileRef {
    /// The generation of an epoch, beat, cutoff or checkpoint file that lies in `dir`
    /// (`None` for any other file): how a listing of one of those folders is read.
    pub(crate) fn generation_in(self, dir: Dir) -> Option<Generation> {
        match self {
            FileRef::Epoch(g) | FileRef::Beat(g) | FileRef::Cutoff(g) | FileRef::Checkpoint(g)
                if self.dir() == Some(dir) =>
            {
                Some(g)
            }
            _ => None,
        }
    }

    /// The sequence of a verified-prefix mark file (`None` for any other file).
    pub(crate) fn mark(self) -> Option<Sequence> {
        match self {
            FileRef::Mark(s) => Some(s),
            _ => None,
        }
    }

    /// The directory holding this file (`None` for files at the run root).
    pub fn dir(self) -> Option<Dir> {
        Some(match self {
            FileRef::Epoch(_) => Dir::Epochs,
            FileRef::Beat(_) => Dir::Beats,
            FileRef::Cutoff(_) => Dir::Cutoffs,
            FileRef::Intent { .. } => Dir::Intents,
            FileRef::Checkpoint(_) => Dir::Checkpoints,
            FileRef::Event(_) => Dir::Events,
            FileRef::Mark(_) => Dir::Marks,
            FileRef::Command { .. } => Dir::Commands,
            FileRef::RunStatus => return None,
            FileRef::StoreRecord(_) => Dir::StoreLog,
            FileRef::Snapshot { .. } | FileRef::SnapshotChunk { .. } => Dir::StoreSnapshots,
        })
    }

    /// The file name inside its directory.
    pub fn file_name(self) -> String {
        match self {
            FileRef::Epoch(g) | FileRef::Beat(g) | FileRef::Cutoff(g) | FileRef::Checkpoint(g) => {
                format!("{:020}.json", g.get())
            }
            FileRef::Intent { generation, nonce } => {
                format!("{:020}-{nonce:016x}.json", generation.get())
            }
            FileRef::Event(s) | FileRef::Mark(s) => format!("{:020}.json", s.get()),
            FileRef::Command { generation, pid } => {
                format!("{:020}-{pid}.json", generation.get())
            }
            FileRef::RunStatus => "run.json".into(),
            FileRef::StoreRecord(s) => format!("{:020}.json", s.get()),
            FileRef::Snapshot { through, nonce } => {
                format!("{:020}-{nonce:016x}.json", through.get())
            }
            FileRef::SnapshotChunk {
                through,
                nonce,
                index,
            } => format!("{:020}-{nonce:016x}-{index:06}.bin", through.get()),
        }
    }

    /// The path relative to the run root, with `/` separators.
    pub fn path(self) -> String {
        match self.dir() {
            Some(d) => format!("{}/{}", d.path(), self.file_name()),
            None => self.file_name(),
        }
    }
}

impl std::fmt::Display for FileRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.path())
    }
}

/// Prefix of every temporary file name; readers ignore such names.
pub const TEMP_PREFIX: &str = ".tmp-";

/// The run's SQLite store, relative to the run folder (lease-sqlite's file, PROTOCOL.md §2;
/// opened only by its owner). Not a [`FileRef`]: it is not a protocol record.
pub const STORE_FILE: &str = "store/run.sqlite";
/// The folder of the store file (relative to the run root).
pub const STORE_DIR: &str = "store";
/// The store file's name within [`STORE_DIR`].
pub const STORE_FILE_NAME: &str = "run.sqlite";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_nothing_else_parses() {
        let g = Generation::new(42).unwrap();
        let files = [
            FileRef::Epoch(g),
            FileRef::Beat(g),
            FileRef::Cutoff(g),
            FileRef::Checkpoint(g),
            FileRef::Event(Sequence::new(7).unwrap()),
            FileRef::Mark(Sequence::new(7).unwrap()),
            FileRef::Intent {
                generation: g,
                nonce: 0xdead_beef,
            },
            FileRef::Command {
                generation: g,
                pid: 1234,
            },
            FileRef::StoreRecord(Sequence::new(9).unwrap()),
            FileRef::Snapshot {
                through: Sequence::new(9).unwrap(),
                nonce: 0xabc,
            },
            FileRef::SnapshotChunk {
                through: Sequence::new(9).unwrap(),
                nonce: 0xabc,
                index: 12,
            },
        ];
        for f in files {
            let d = f.dir().unwrap();
            assert_eq!(d.parse_name(&f.file_name()), Some(f));
            assert!(f.path().starts_with(d.path()));
        }
        for bad in [
            "42.json",
            "00000000000000000000.json",
            "0000000000000000004x.json",
            "00000000000000000042.json.tmp",
            ".tmp-00000000000000000042.json",
            "../00000000000000000042.json",
            "00000000000000000042",
            "+0000000000000000042.json",
            "99999999999999999999.json",
        ] {
            assert_eq!(Dir::Epochs.parse_name(bad), None, "{bad}");
        }
        assert_eq!(
            Dir::Commands.parse_name("00000000000000000042-012.json"),
            None
        );
        assert_eq!(
            Dir::Commands.parse_name("00000000000000000042-0.json"),
            None
        );
        assert_eq!(
            Dir::Intents.parse_name("00000000000000000042-00000000DEADBEEF.json"),
            None
        );
        for bad in [
            "00000000000000000009-0000000000000abc-12.bin",
            "00000000000000000009-0000000000000abc-0000012.bin",
            "00000000000000000009-0000000000000ABC.json",
            "00000000000000000009-0000000000000abc-000012.json",
            "00000000000000000000-0000000000000abc.json",
            "00000000000000000009.json",
        ] {
            assert_eq!(Dir::StoreSnapshots.parse_name(bad), None, "{bad}");
        }
        assert_eq!(Dir::StoreLog.parse_name("00000000000000000009.bin"), None);
    }
}
