//! The input: bytes decoded into a small folder of files ([`Folder::parse`]) and written
//! back ([`Folder::encode`]), each file under a typed or a raw name, durable or not.

use super::{MAX_FILES, MAX_NAME};
use crate::fixtures::{LiveMode, t};
use lease_core::mem::MemDisk;
use lease_core::{Dir, FileRef, Generation, Sequence, Timestamp};
use lease_fs::SimFs;
use lease_fs::fs::Fs;

/// How a file's name is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Name {
    /// The layout's name for a typed number (`num`: generation or sequence; `aux`: intent
    /// nonce or command pid). Numbers the layout cannot name (0) give a zero-padded stray.
    Typed {
        /// Generation or sequence.
        num: u64,
        /// Nonce or pid.
        aux: u64,
    },
    /// Any name (SimFs only; MemDisk cannot hold a name that does not parse).
    Raw(String),
}

/// What survives of a file after the simulated power loss (SimFs only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    /// Written durably.
    Durable,
    /// Entry fsynced, data not: comes back empty, or torn if it is the torn file.
    DataLost,
    /// Nothing fsynced: the file vanishes.
    EntryLost,
}

/// The folders an entry's `dir` code `0..=6` names, in the corpus's fixed order (the
/// layout's first seven folders, as `Dir::ALL` listed them before issue #33 appended
/// `lease/marks`); `7` is the run root. Taken from `Dir::ALL`, which keeps `lease/marks`
/// last so the others' positions stay; a folder added to the layout fails to compile here
/// until the corpus's codes are decided for it.
const FOLDER_DIRS: [Dir; 7] = match Dir::ALL {
    [first_seven @ .., Dir::Marks] => first_seven,
    _ => panic!("Dir::ALL no longer ends with lease/marks: the corpus's dir codes would move"),
};

/// One file of the folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// `0..=6`: `FOLDER_DIRS[dir]`; `7`: the run root.
    pub dir: u8,
    /// Its name.
    pub name: Name,
    /// Its durability.
    pub persist: Persist,
    /// Its content.
    pub bytes: Vec<u8>,
}

/// A run folder described by a fuzz input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folder {
    /// Which wall time the observer uses (see [`Folder::now`]).
    pub now_sel: u8,
    /// What liveness probes answer.
    pub live: LiveMode,
    /// Whether the power loss tears the newest unsynced file.
    pub tear: bool,
    /// The files, in write order (a later file replaces an earlier one of the same name).
    pub entries: Vec<Entry>,
}

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn done(&self) -> bool {
        self.at >= self.data.len()
    }
    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }
    /// LEB128, at most 10 bytes.
    fn varint(&mut self) -> u64 {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.byte();
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                break;
            }
        }
        v
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let start = self.at.min(self.data.len());
        let end = start.saturating_add(n).min(self.data.len());
        self.at = end;
        &self.data[start..end]
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

impl Folder {
    /// Decode an input. Byte 0: bits 0-1 the observer's time, bits 2-3 the liveness answer,
    /// bit 4 tear. Then per file: a tag (bits 0-2 folder, bit 3 raw name, bits 4-5
    /// durability), the name (typed: two LEB128 numbers; raw: LEB128 length + bytes), then
    /// LEB128 length + content. Every input decodes to some folder.
    pub fn parse(data: &[u8]) -> Folder {
        let mut r = Reader { data, at: 0 };
        let h = r.byte();
        let mut f = Folder {
            now_sel: h & 3,
            live: LiveMode::from_bits(h >> 2),
            tear: h & 0x10 != 0,
            entries: Vec::new(),
        };
        while !r.done() && f.entries.len() < MAX_FILES {
            let tag = r.byte();
            let name = if tag & 8 == 0 {
                let num = r.varint();
                let aux = r.varint();
                Name::Typed { num, aux }
            } else {
                let n = usize::try_from(r.varint())
                    .unwrap_or(usize::MAX)
                    .min(MAX_NAME);
                Name::Raw(String::from_utf8_lossy(r.bytes(n)).into_owned())
            };
            let persist = match (tag >> 4) & 3 {
                1 => Persist::DataLost,
                2 => Persist::EntryLost,
                _ => Persist::Durable,
            };
            let len = usize::try_from(r.varint()).unwrap_or(usize::MAX);
            let bytes = r.bytes(len).to_vec();
            f.entries.push(Entry {
                dir: tag & 7,
                name,
                persist,
                bytes,
            });
        }
        f
    }

    /// The input that [`Folder::parse`] decodes into this folder.
    pub fn encode(&self) -> Vec<u8> {
        let mut out =
            vec![(self.now_sel & 3) | (self.live.bits() << 2) | if self.tear { 0x10 } else { 0 }];
        for e in &self.entries {
            let persist = match e.persist {
                Persist::Durable => 0,
                Persist::DataLost => 1,
                Persist::EntryLost => 2,
            };
            let raw = matches!(e.name, Name::Raw(_));
            out.push((e.dir & 7) | if raw { 8 } else { 0 } | (persist << 4));
            match &e.name {
                Name::Typed { num, aux } => {
                    put_varint(&mut out, *num);
                    put_varint(&mut out, *aux);
                }
                Name::Raw(s) => {
                    put_varint(&mut out, s.len() as u64);
                    out.extend_from_slice(s.as_bytes());
                }
            }
            put_varint(&mut out, e.bytes.len() as u64);
            out.extend_from_slice(&e.bytes);
        }
        out
    }

    /// A folder holding exactly the files of `disk`, durably.
    pub fn from_mem(disk: &MemDisk, now_sel: u8, live: LiveMode) -> Folder {
        let entries = disk
            .files
            .iter()
            .filter_map(|(f, bytes)| {
                let (dir, num, aux) = match *f {
                    FileRef::Epoch(g) => (0, g.get(), 0),
                    FileRef::Beat(g) => (1, g.get(), 0),
                    FileRef::Cutoff(g) => (2, g.get(), 0),
                    FileRef::Intent { generation, nonce } => (3, generation.get(), nonce),
                    FileRef::Checkpoint(g) => (4, g.get(), 0),
                    FileRef::Event(s) => (5, s.get(), 0),
                    FileRef::Command { generation, pid } => (6, generation.get(), u64::from(pid)),
                    FileRef::RunStatus => (7, 0, 0),
                    // The engine store's files (issue #32) live only in an engine, never
                    // in a run folder (not in `Dir::ALL`): nothing of a folder to fuzz.
                    FileRef::StoreRecord(_)
                    | FileRef::Snapshot { .. }
                    | FileRef::SnapshotChunk { .. } => return None,
                    // Verified-prefix marks (issue #33) have no code in the entry's three
                    // bits (the corpus's encoding): not generated here; lease-core's
                    // marks tests cover them.
                    FileRef::Mark(_) => return None,
                };
                Some(Entry {
                    dir,
                    name: Name::Typed { num, aux },
                    persist: Persist::Durable,
                    bytes: bytes.clone(),
                })
            })
            .collect();
        Folder {
            now_sel,
            live,
            tear: false,
            entries,
        }
    }

    /// The observer's wall time: T0, T0 + 1 min (past the default `stale_after`),
    /// T0 + 10 days, or the last representable instant.
    pub fn now(&self) -> Timestamp {
        match self.now_sel & 3 {
            0 => t(0),
            1 => t(60_000),
            2 => t(10 * 24 * 3600 * 1000),
            _ => t(u64::MAX),
        }
    }

    /// Whether every file has a typed name the layout can produce and is durable: then the
    /// MemDisk and the SimFs hold the same run.
    pub fn is_plain(&self) -> bool {
        self.entries
            .iter()
            .all(|e| e.persist == Persist::Durable && e.file_ref().is_some())
    }

    /// The MemDisk holding every typed, nameable file.
    pub fn mem_disk(&self) -> MemDisk {
        let mut d = MemDisk::new();
        for e in &self.entries {
            if let Some(f) = e.file_ref() {
                d.files.insert(f, e.bytes.clone());
            }
        }
        d
    }

    /// The SimFs after writing every file and a power loss.
    pub fn sim_fs(&self) -> SimFs {
        let fs = SimFs::new();
        for e in &self.entries {
            let path = e.sim_path();
            let (parent, _) = lease_fs::fs::split(&path);
            // Errors (a name that is not a plain path, a file in the way of a folder, an
            // existing name for write_new) just leave that file out.
            match e.persist {
                Persist::Durable => {
                    let _ = fs.put(&path, &e.bytes);
                }
                Persist::DataLost | Persist::EntryLost => {
                    if !parent.is_empty() && fs.ensure_dir(parent).is_err() {
                        continue;
                    }
                    if fs.write_new(&path, &e.bytes).is_ok() && e.persist == Persist::DataLost {
                        let _ = fs.fsync_dir(parent);
                    }
                }
            }
        }
        fs.recover(self.tear);
        fs
    }
}

impl Entry {
    /// The typed file this entry names, if the layout can name it.
    pub fn file_ref(&self) -> Option<FileRef> {
        let Name::Typed { num, aux } = self.name else {
            return None;
        };
        let g = Generation::new(num);
        Some(match self.dir {
            0 => FileRef::Epoch(g?),
            1 => FileRef::Beat(g?),
            2 => FileRef::Cutoff(g?),
            3 => FileRef::Intent {
                generation: g?,
                nonce: aux,
            },
            4 => FileRef::Checkpoint(g?),
            5 => FileRef::Event(Sequence::new(num)?),
            6 => FileRef::Command {
                generation: g?,
                pid: u32::try_from(aux).ok().filter(|&p| p > 0)?,
            },
            _ => FileRef::RunStatus,
        })
    }

    /// Its path in the SimFs.
    pub fn sim_path(&self) -> String {
        let dir = FOLDER_DIRS.get(usize::from(self.dir)).map(|d| d.path());
        let name = match (&self.name, self.file_ref()) {
            (Name::Raw(s), _) => s.clone(),
            (Name::Typed { .. }, Some(f)) => return f.path(),
            (Name::Typed { num, .. }, None) => format!("{num:020}.json"),
        };
        match dir {
            Some(d) => format!("{d}/{name}"),
            None => name,
        }
    }
}
