//! Whom runlease trusts on disk: the effective uid, and files and folders owned by it and
//! not writable by group or others ([`check_trusted`]); anything else is a [`NotOwned`]
//! error (`RUN_NOT_OWNED`, 77) before anything is read or written through it. Split out of
//! `real.rs` (which re-exports these), with the one shell-quoting rule of next steps.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Stat};

use crate::real::{perm_of, type_of};

/// Permission bits a directory runlease trusts must not have: group or other write.
const DIR_FORBIDDEN: u32 = 0o022;
/// Permission bits a file runlease reads must not have: group or other write (issue #15:
/// "not writable by group/others"). Read bits are no threat to what runlease decides (it
/// writes its own files 0600, but a record copied back from a backup with umask 022 is
/// still ours and unchanged).
const FILE_FORBIDDEN: u32 = 0o022;

/// The effective uid of this process.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// A file or directory runlease does not trust: owned by another uid than the effective
/// one, or with permission bits others could use to change it. Carried as the payload of an
/// `io::Error` (kind `PermissionDenied`); `FsError::io` turns it into `RUN_NOT_OWNED` (77).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotOwned {
    /// The path relative to the run root (`""`: the run root itself).
    pub path: String,
    /// The absolute path, for the fix.
    pub abs: PathBuf,
    /// Its owner.
    pub uid: u32,
    /// Its permission bits.
    pub mode: u32,
    /// The effective uid runlease runs as.
    pub euid: u32,
    /// Whether it is a directory (directories may be group/other readable).
    pub is_dir: bool,
}

impl NotOwned {
    /// What is wrong and the fix, one sentence each, without the run's name.
    pub fn describe(&self) -> String {
        let what = if self.path.is_empty() {
            "the run folder itself".to_string()
        } else if self.is_dir {
            format!("folder {}", self.path)
        } else {
            format!("file {}", self.path)
        };
        let forbidden = if self.is_dir {
            DIR_FORBIDDEN
        } else {
            FILE_FORBIDDEN
        };
        let mut wrong = Vec::new();
        let mut fix = Vec::new();
        let q = shell_quote(&self.abs);
        if self.uid != self.euid {
            wrong.push(format!(
                "it is owned by uid {}, not by uid {} that runlease runs as",
                self.uid, self.euid
            ));
            fix.push(format!(
                "run runlease as uid {} (its owner), or `chown {} {q}` if it really belongs to uid {}",
                self.uid, self.euid, self.euid
            ));
        }
        if self.mode & forbidden != 0 {
            wrong.push("group or others may write it".to_string());
            fix.push(format!("`chmod go-w {q}`"));
        }
        format!(
            "{what} ({}, owner uid {}, mode {:04o}) is not trusted: {}; runlease trusts only what uid {} owns and nobody else can change, so it was not read and nothing was written; fix: {}",
            self.abs.display(),
            self.uid,
            self.mode,
            wrong.join(" and "),
            self.euid,
            fix.join(", then ")
        )
    }
}

impl fmt::Display for NotOwned {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl std::error::Error for NotOwned {}

/// Quote a path for a shell command suggestion if it needs it (the one quoting rule of
/// every next step runlease prints).
pub fn shell_quote(p: &Path) -> String {
    let s = p.display().to_string();
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+,:@%".contains(c))
    {
        s
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// `Ok` if `st` (of `rel` below the run root `root`; `""` = the root) is owned by the
/// effective uid and not open to others: no group/other write bit. Else a [`NotOwned`] error. Symlinks are not
/// judged here (they are refused as such wherever they matter).
pub(crate) fn check_trusted(root: &Path, st: &Stat, rel: &str) -> io::Result<()> {
    let ft = type_of(st);
    if ft == FileType::Symlink {
        return Ok(());
    }
    let is_dir = ft == FileType::Directory;
    let forbidden = if is_dir {
        DIR_FORBIDDEN
    } else {
        FILE_FORBIDDEN
    };
    let (uid, mode, me) = (st.st_uid, perm_of(st), euid());
    if uid == me && mode & forbidden == 0 {
        return Ok(());
    }
    let abs = if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    };
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        NotOwned {
            path: rel.to_string(),
            abs,
            uid,
            mode,
            euid: me,
            is_dir,
        },
    ))
}

/// The [`NotOwned`] inside `e` (its payload, or anywhere in its chain of sources).
pub fn not_owned_in(e: &io::Error) -> Option<&NotOwned> {
    crate::fs::error_in(e)
}
