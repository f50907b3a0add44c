//! Whom runlease trusts on disk, as a rule and its wording (pure: the I/O layers stat the
//! file and ask): a file or folder is trusted only when the effective uid owns it and its
//! permission bits hold no group or other write ([`trusted`]); anything else is a
//! [`NotOwned`], worded once for every layer that refuses (`RUN_NOT_OWNED`, 77), with its
//! fix quoted by [`shell_quote`], the one shell-quoting rule of the next steps runlease
//! prints.

use std::fmt;
use std::path::{Path, PathBuf};

/// Permission bits a file or folder runlease trusts must not have: group or other write
/// (issue #15). Read bits are no threat to what runlease decides (it writes its own files
/// 0600, but a record copied back from a backup with umask 022 is still ours and
/// unchanged).
pub const FORBIDDEN: u32 = 0o022;

/// Whether a file or folder owned by `uid` with permission bits `perm` is trusted by a
/// process running as `euid`.
pub fn trusted(uid: u32, perm: u32, euid: u32) -> bool {
    uid == euid && perm & FORBIDDEN == 0
}

/// A file or directory runlease does not trust: owned by another uid than the effective
/// one, or with permission bits others could use to change it. lease-fs carries it as the
/// payload of an `io::Error` (kind `PermissionDenied`, `FsError::io` turns it into
/// `RUN_NOT_OWNED`, 77); lease-sqlite words its store refusals with it.
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
        if self.mode & FORBIDDEN != 0 {
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
