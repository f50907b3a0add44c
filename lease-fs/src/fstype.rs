//! What file system a run folder lives on, and whether unsynced heartbeats can be trusted
//! there (PROTOCOL §5.3).
//!
//! A `local` heartbeat is never fsynced: on a local disk a power loss kills the owner too,
//! so losing its last beat changes nothing. On a network or user-space file system the
//! server (or the daemon) can lose writes that were never synced while the owner lives on
//! (a server restart, a dropped connection), so a live owner could look stale to others.
//! There, runlease writes every heartbeat durably whatever the policy says.

use rustix::fd::AsFd;
use std::io;

/// The file system a run folder is on (from `fstatfs(2)` of the held root).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileSystem {
    /// `f_type`, the file system's magic number.
    pub magic: u64,
    /// Its name, when runlease knows it (`"nfs"`, `"fuse"`, `"ext4"`, …), else `"unknown"`.
    pub name: &'static str,
    /// Whether writes that were never synced may be lost while the writer lives (network
    /// and user-space file systems): heartbeats are then always made durable.
    pub loses_unsynced_writes: bool,
}

/// (magic, name, loses unsynced writes while the writer lives). Magic numbers from
/// `linux/magic.h` and `statfs(2)`.
const KNOWN: &[(u64, &str, bool)] = &[
    (0x6969, "nfs", true),
    (0x517B, "smb", true),
    (0xFE53_4D42, "smb2", true),
    (0xFF53_4D42, "cifs", true),
    (0x6573_5546, "fuse", true),
    (0x00C3_6400, "ceph", true),
    (0x0116_1970, "gfs2", true),
    (0x7461_636F, "ocfs2", true),
    (0x5346_414F, "afs", true),
    (0x6B41_4653, "kafs", true),
    (0x0102_1997, "9p", true),
    (0x0BD0_0BD0, "lustre", true),
    (0x4750_4653, "gpfs", true),
    (0x7375_7245, "coda", true),
    (0xEF53, "ext4", false),
    (0x5846_5342, "xfs", false),
    (0x9123_683E, "btrfs", false),
    (0x0102_1994, "tmpfs", false),
    (0x794C_7630, "overlayfs", false),
    (0xF2F5_2010, "f2fs", false),
    (0x2FC1_2FC1, "zfs", false),
    (0x4244, "hfs", false),
    (0x4d44, "vfat", false),
    (0x2011_BAB0, "exfat", false),
    (0x5346_544E, "ntfs", false),
    (0x7366_746E, "ntfs3", false),
    (0xCA45_1A4E, "bcachefs", false),
    (0x858458F6, "ramfs", false),
];

/// The file systems whose every change is a local kernel event (see
/// [`FileSystem::changes_are_local_events`]): ext2/3/4 (`EXT4_SUPER_MAGIC`, shared by
/// ext2 and ext3), xfs, btrfs, tmpfs, f2fs. Magic numbers from `linux/magic.h`.
const LOCAL_EVENTS: &[u64] = &[0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994, 0xF2F5_2010];

impl FileSystem {
    /// Classify a magic number. Unknown file systems are taken as local disks (the
    /// documented list of supported ones is in PROTOCOL §5.3).
    pub fn from_magic(magic: u64) -> FileSystem {
        match KNOWN.iter().find(|(m, _, _)| *m == magic) {
            Some(&(magic, name, loses)) => FileSystem {
                magic,
                name,
                loses_unsynced_writes: loses,
            },
            None => FileSystem {
                magic,
                name: "unknown",
                loses_unsynced_writes: false,
            },
        }
    }

    /// Whether every change of a directory's entries and of its files' sizes on this file
    /// system is made by a system call of this kernel, which queues its inotify event before
    /// it returns: the allowlist of the cached `lease/epochs` listing
    /// ([`crate::listing`]). Only ext2/3/4, xfs, btrfs, tmpfs and f2fs. Everything else,
    /// known or not, is `false`: a network file system (NFS, SMB/CIFS, Ceph, …) changes
    /// on the server or another client, FUSE in its daemon, overlayfs in its layers and 9p
    /// on its host, none of which queues an event here.
    pub fn changes_are_local_events(&self) -> bool {
        LOCAL_EVENTS.contains(&self.magic)
    }

    /// The file system of the directory (or file) `fd` is open on.
    pub fn of(fd: impl AsFd) -> io::Result<FileSystem> {
        let st = rustix::fs::fstatfs(fd)?;
        // `f_type` is signed on some targets; the magic numbers are its bit pattern.
        #[allow(clippy::unnecessary_cast)]
        let magic = (st.f_type as i64 as u64) & 0xFFFF_FFFF;
        Ok(FileSystem::from_magic(magic))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_and_user_space_file_systems_lose_unsynced_writes() {
        for m in [0x6969u64, 0x6573_5546, 0xFF53_4D42, 0x00C3_6400] {
            assert!(FileSystem::from_magic(m).loses_unsynced_writes, "{m:#x}");
        }
        for m in [0xEF53u64, 0x5846_5342, 0x0102_1994, 0x1234] {
            assert!(!FileSystem::from_magic(m).loses_unsynced_writes, "{m:#x}");
        }
        assert_eq!(FileSystem::from_magic(0x6969).name, "nfs");
    }

    #[test]
    fn only_local_disk_file_systems_are_allowlisted_for_the_cached_listing() {
        // ext2/3/4, xfs, btrfs, tmpfs, f2fs.
        for m in [
            0xEF53u64,
            0x5846_5342,
            0x9123_683E,
            0x0102_1994,
            0xF2F5_2010,
        ] {
            assert!(
                FileSystem::from_magic(m).changes_are_local_events(),
                "{m:#x}"
            );
        }
        // NFS, SMB, SMB2, CIFS, FUSE, overlayfs, 9p, Ceph, ZFS (not on the list), ramfs,
        // and an unknown magic.
        for m in [
            0x6969u64,
            0x517B,
            0xFE53_4D42,
            0xFF53_4D42,
            0x6573_5546,
            0x794C_7630,
            0x0102_1997,
            0x00C3_6400,
            0x2FC1_2FC1,
            0x8584_58F6,
            0x1234,
        ] {
            assert!(
                !FileSystem::from_magic(m).changes_are_local_events(),
                "{m:#x}"
            );
        }
    }

    #[test]
    fn the_temp_folder_is_classified() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::open(dir.path()).unwrap();
        let fs = FileSystem::of(&f).unwrap();
        assert!(fs.magic != 0);
    }
}
