//! `parse_names`: arbitrary strings into `Dir::parse_name` for every `Dir`.
//!
//! - A name is accepted only if the parsed file formats back to exactly that name, in that
//!   directory; an accepted name never contains `/`, never starts with `.` (so never `..`,
//!   never a temp file) and is not empty.
//! - Conversely, every file built from typed numbers (taken from the input) parses back
//!   from its own name, in its own directory.

use lease_core::{Dir, FileRef, Generation, Sequence};

fn check_name(name: &str) {
    for dir in Dir::ALL {
        let Some(f) = dir.parse_name(name) else {
            continue;
        };
        let formatted = f.file_name();
        assert_eq!(
            formatted, name,
            "{dir:?} accepted a name it would not produce"
        );
        assert!(!name.is_empty(), "{dir:?} accepted an empty name");
        assert!(!name.contains('/'), "{dir:?} accepted {name:?} with a '/'");
        assert!(!name.contains('\0'), "{dir:?} accepted {name:?} with a NUL");
        assert!(
            !name.starts_with('.'),
            "{dir:?} accepted {name:?} starting with '.'"
        );
        assert_eq!(
            f.dir(),
            Some(dir),
            "{name:?} parsed in {dir:?} names another folder"
        );
        assert_eq!(f.path(), format!("{}/{name}", dir.path()));
    }
}

fn u64_at(data: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    for (i, slot) in b.iter_mut().enumerate() {
        *slot = data.get(at + i).copied().unwrap_or(0);
    }
    u64::from_le_bytes(b)
}

fn check_round_trip(data: &[u8]) {
    let a = u64_at(data, 0);
    let b = u64_at(data, 8);
    let files: Vec<FileRef> = [
        Generation::new(a).map(FileRef::Epoch),
        Generation::new(a).map(FileRef::Beat),
        Generation::new(a).map(FileRef::Cutoff),
        Generation::new(a).map(FileRef::Checkpoint),
        Sequence::new(a).map(FileRef::Event),
        Generation::new(a).map(|generation| FileRef::Intent {
            generation,
            nonce: b,
        }),
        Generation::new(a).and_then(|generation| {
            let pid = u32::try_from(b & 0xffff_ffff).ok().filter(|&p| p > 0)?;
            Some(FileRef::Command { generation, pid })
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    for f in files {
        let dir = f.dir().expect("every file but run.json has a folder");
        let name = f.file_name();
        assert_eq!(dir.parse_name(&name), Some(f), "{f:?} does not parse back");
        check_name(&name);
    }
}

/// The check of the `parse_names` target.
pub fn check(data: &[u8]) {
    match std::str::from_utf8(data) {
        Ok(s) => check_name(s),
        Err(_) => check_name(&String::from_utf8_lossy(data)),
    }
    check_round_trip(data);
}
