//! cgroup v2 containment of a run's commands, when a subtree can be created.
//!
//! Each incarnation (generation) of a run gets its own cgroup v2 directory
//! `runlease-<key>-<generation>`, created below the owner's own cgroup (the `0::` line of
//! `/proc/self/cgroup`, under the cgroup2 mount found in `/proc/self/mountinfo`). `<key>` is
//! 16 hex digits of SHA-256 over the run's root path and run id.
//!
//! Every command is moved into it while its spawn gate is stopped (before the program
//! starts), and everything it starts is born inside it: setsid, setpgid and double forks
//! do not leave a cgroup. Killing writes `1` to `cgroup.kill` (the kernel kills every
//! member, including ones forked meanwhile); membership is `cgroup.procs` (exited members
//! leave it at once, zombies included).
//!
//! **Whose it is (issue #29).** A name proves nothing: anyone allowed to create a
//! directory in the cgroup tree (root, or the owner of a delegated subtree) can name one
//! `runlease-<key>-<generation>`. So every command record carries the identity of the
//! directory the owner created ([`identity`]: the cgroup id, which on cgroup2 is the
//! directory's inode number, and its owning uid; [`lease_core::CommandCgroup`]), and a
//! later owner acts on a leftover (`cgroup.kill`, `rmdir`) only when it is [`Verdict::Ours`]:
//! a directory directly below the later owner's *own* cgroup, named like the run's for a
//! recorded older generation, whose id and owner are exactly those the record of that
//! generation names, and whose owner is the later owner's effective uid ([`judge`]).
//! Nothing else in the cgroup tree is looked at; anything named like the run's that is not
//! ours is [`Verdict::NotOurs`], reported (`doctor`'s `CGROUP_NOT_PROVEN`) and never
//! signalled or removed. [`Cgroup::create`] never adopts a directory that already exists.
//!
//! If the directory cannot be created (no cgroup2 mount, no write permission: an
//! unprivileged owner without a delegated subtree), [`Cgroup::create`] reports why and
//! the run falls back to process groups, sessions, the child subreaper and /proc scans.

use lease_core::{CommandCgroup, Digest};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The name prefix of every run cgroup.
const PREFIX: &str = "runlease-";

/// A run incarnation's cgroup directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    path: PathBuf,
}

/// The `<key>` of a run: 16 hex digits of SHA-256 over `root` and the run id.
pub fn run_key(root: &Path, run_id: &str) -> String {
    let mut b = root.as_os_str().as_encoded_bytes().to_vec();
    b.push(0);
    b.extend_from_slice(run_id.as_bytes());
    Digest::of(&b).as_str()[..16].to_string()
}

/// The cgroup2 mount point (`/proc/self/mountinfo`, field 5 of the line whose file-system
/// type after ` - ` is `cgroup2`).
pub fn mount_point() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

/// The cgroup v2 path of `pid` (`0::<path>` in `/proc/<pid>/cgroup`), `None` without one.
pub fn cgroup_of(pid: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// Parse `runlease-<key>-<generation>` (the last component of a cgroup path).
fn parse_name(name: &str) -> Option<(&str, u64)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (key, g) = rest.split_once('-')?;
    if key.len() != 16 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((key, g.parse().ok()?))
}

/// Why no cgroup v2 directory could be made for a run's commands (they are then tracked
/// by group, session and `/proc` scans; see the crate docs, "Escapes").
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CgroupUnavailable(pub String);

impl Cgroup {
    /// Create `runlease-<key>-<generation>` below this process's own cgroup. A directory
    /// that already exists under that name is never adopted (issue #29: it may be anyone's;
    /// no generation is claimed twice, so no crashed attempt of this one left it): the run
    /// then goes without a cgroup, and the directory is left as it is.
    pub fn create(key: &str, generation: u64) -> Result<Cgroup, CgroupUnavailable> {
        let no = |why: String| CgroupUnavailable(why);
        let parent = own_dir().ok_or_else(|| {
            no("no cgroup2 file system is mounted, or this process has no cgroup v2 path".into())
        })?;
        let path = parent.join(format!("{PREFIX}{key}-{generation}"));
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(no(format!(
                    "{} already exists and this owner did not create it: left alone",
                    path.display()
                )));
            }
            Err(e) => return Err(no(format!("cannot create {}: {e}", path.display()))),
        }
        if !path.join("cgroup.procs").exists() {
            let _ = std::fs::remove_dir(&path);
            return Err(no(format!(
                "{} is not a cgroup v2 directory",
                path.display()
            )));
        }
        Ok(Cgroup { path })
    }

    /// The cgroup at `path` (no check).
    pub fn at(path: PathBuf) -> Cgroup {
        Cgroup { path }
    }

    /// Its directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Move `pid` (and its threads) into it.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string())
    }

    /// Its members (`cgroup.procs`; exited processes are not listed). Empty if the
    /// directory is gone.
    pub fn pids(&self) -> Vec<u32> {
        crate::procs::pids_in(&self.path)
    }

    /// SIGKILL every member (`cgroup.kill`; on kernels before 5.14, each listed pid that
    /// is still a member once held by a pidfd, [`Cgroup::member`]).
    pub fn kill(&self) {
        if std::fs::write(self.path.join("cgroup.kill"), "1").is_err() {
            for pid in self.pids() {
                if let Some(h) = self.member(pid) {
                    let _ = h.signal(rustix::process::Signal::KILL);
                }
            }
        }
    }

    /// `pid`, held by a pidfd and confirmed to be a member of this cgroup *after* the
    /// pidfd was opened (its `/proc/<pid>/cgroup` names this directory, then the pidfd
    /// shows it has not exited): a pid listed in `cgroup.procs` and reused by a process
    /// elsewhere before the pidfd was opened is not held. `None` otherwise.
    pub fn member(&self, pid: u32) -> Option<crate::procs::HeldProcess> {
        let h = crate::procs::HeldProcess::current(pid)?;
        let mount = mount_point()?;
        let rel = self.path.strip_prefix(&mount).ok()?;
        let cg = cgroup_of(&pid.to_string())?;
        let inside = Path::new(cg.trim_start_matches('/')).starts_with(rel);
        (inside && !h.exited()).then_some(h)
    }

    /// Remove the directory (only possible once it has no members; best effort).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir(&self.path);
    }

    /// Remove the directory, retrying for up to `within` while it is busy: a process
    /// that was just killed can stay listed for a moment while it exits. Best effort; an
    /// empty directory left behind is removed by the next open of the run.
    pub fn remove_within(&self, within: std::time::Duration) {
        let end = std::time::Instant::now() + within;
        loop {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return,
                Err(_) if std::time::Instant::now() < end => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(_) => return,
            }
        }
    }
}

/// Hand a run incarnation's members over to the cgroup above it (this owner's own, where
/// the directory was created) and remove the emptied directory, so that processes handed
/// over on purpose ([`crate::Run::release_detached`]) are not taken for a killed
/// incarnation's leftovers by the next open. (cgroup v2 forbids renaming a directory.)
/// Each member is moved by writing its pid to the parent's `cgroup.procs`, repeated until
/// the directory is empty (a member forking meanwhile) or 100 rounds passed. Best effort:
/// members left behind are logged at `warn` (the release removes their records, so the next
/// open never kills them: it reports the directory, `CGROUP_NOT_PROVEN`).
pub fn detach(dir: &Path) {
    let Some(parent) = dir.parent() else { return };
    for _ in 0..100 {
        let pids = crate::procs::pids_in(dir);
        if pids.is_empty() {
            let _ = std::fs::remove_dir(dir);
            return;
        }
        for pid in pids {
            let _ = std::fs::write(parent.join("cgroup.procs"), pid.to_string());
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    tracing::warn!(
        cgroup = %dir.display(),
        "cannot move every detached command out of the run's cgroup: they stay in it (the next open of the run reports it, never kills them)"
    );
}

/// This process's own cgroup directory (the cgroup2 mount joined with the `0::` path of
/// `/proc/self/cgroup`): where its runs' cgroups are created, and the only place a later
/// owner looks for leftovers. `None` without a cgroup2 mount or path.
pub fn own_dir() -> Option<PathBuf> {
    let mount = mount_point()?;
    let own = cgroup_of("self")?;
    Some(mount.join(own.trim_start_matches('/')))
}

/// The identity of the directory at `dir` ([`CommandCgroup`]: its inode number, which on
/// cgroup2 is the cgroup id, and its owning uid), read without following a symlink.
pub fn identity(dir: &Path) -> io::Result<CommandCgroup> {
    let m = std::fs::symlink_metadata(dir)?;
    if !m.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            dir.display()
        )));
    }
    Ok(CommandCgroup {
        id: m.ino(),
        uid: m.uid(),
    })
}

/// A directory named like one of a run's cgroups of an older generation, directly below
/// this owner's cgroup, as it was looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// Its path.
    pub path: PathBuf,
    /// The generation its name says.
    pub generation: u64,
    /// Its identity when it was looked at.
    pub identity: CommandCgroup,
}

/// The directories directly below `parent` named `runlease-<key>-<g>` with `g < ours`:
/// one listing of `parent` and an `lstat` of each match, whatever the number of processes
/// or of other cgroups in the tree. Unreadable entries are skipped.
pub fn named_below(parent: &Path, key: &str, ours: u64) -> Vec<Named> {
    let Ok(dir) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut out: Vec<Named> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let (k, g) = parse_name(name.to_str()?)?;
            if k != key || g >= ours {
                return None;
            }
            let path = e.path();
            let identity = identity(&path).ok()?;
            Some(Named {
                path,
                generation: g,
                identity,
            })
        })
        .collect();
    out.sort_by_key(|n| n.generation);
    out
}

/// Whose a [`Named`] directory is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A command record of its generation names exactly its identity, and it belongs to
    /// this process's effective uid: this run created it, and it may be killed and removed.
    Ours,
    /// Anything else: left alone (never signalled, never removed), and reported.
    NotOurs {
        /// Why it is not proved ours.
        why: String,
    },
}

/// Judge `named` against the cgroup identities the command records of this boot name
/// (`recorded`: generation and identity), for an owner of effective uid `euid` (see the
/// module docs).
pub fn judge(named: &Named, recorded: &[(u64, CommandCgroup)], euid: u32) -> Verdict {
    let id = named.identity;
    if id.uid != euid {
        return Verdict::NotOurs {
            why: format!(
                "it belongs to uid {}, not to this owner's uid {euid}",
                id.uid
            ),
        };
    }
    let of_gen: Vec<&CommandCgroup> = recorded
        .iter()
        .filter(|(g, _)| *g == named.generation)
        .map(|(_, c)| c)
        .collect();
    if of_gen.iter().any(|c| **c == id) {
        return Verdict::Ours;
    }
    Verdict::NotOurs {
        why: if of_gen.is_empty() {
            format!(
                "no command record of generation {} names a cgroup (its records are gone, or were written without one)",
                named.generation
            )
        } else {
            format!(
                "its cgroup id {} is not the one generation {}'s command records name ({})",
                id.id,
                named.generation,
                of_gen
                    .iter()
                    .map(|c| c.id.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    }
}

/// Whether `named`'s directory still has the identity it was judged with (checked again
/// right before each `cgroup.kill` and the `rmdir`: only this uid or root can replace a
/// directory below this owner's cgroup, and it is not acted on if one did).
pub fn unchanged(named: &Named) -> bool {
    identity(&named.path).is_ok_and(|i| i == named.identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_only_with_a_key_and_a_generation() {
        assert_eq!(
            parse_name("runlease-0123456789abcdef-7"),
            Some(("0123456789abcdef", 7))
        );
        assert_eq!(parse_name("runlease-0123456789abcdef-x"), None);
        assert_eq!(parse_name("runlease-0123-7"), None);
        assert_eq!(parse_name("other-0123456789abcdef-7"), None);
        let k = run_key(Path::new("/a/b"), "b");
        assert_eq!(k.len(), 16);
        assert_ne!(k, run_key(Path::new("/a/c"), "c"));
    }

    /// Issue #29: only a directory whose id and owner a record of its generation names, and
    /// whose owner is this uid, is ours; a name, another uid (even named by a record), or
    /// an identity no record of that generation names is not.
    #[test]
    fn only_the_recorded_identity_of_this_uid_is_ours() {
        let id = |id, uid| CommandCgroup { id, uid };
        let named = Named {
            path: PathBuf::from("/sys/fs/cgroup/x/runlease-0123456789abcdef-3"),
            generation: 3,
            identity: id(77, 1000),
        };
        assert_eq!(judge(&named, &[(3, id(77, 1000))], 1000), Verdict::Ours);
        let not = |v: Verdict| match v {
            Verdict::NotOurs { why } => why,
            Verdict::Ours => panic!("judged ours"),
        };
        assert!(not(judge(&named, &[(3, id(77, 1000))], 0)).contains("uid 1000"));
        assert!(not(judge(&named, &[(3, id(78, 1000))], 1000)).contains("78"));
        assert!(not(judge(&named, &[(2, id(77, 1000))], 1000)).contains("no command record"));
        assert!(not(judge(&named, &[], 1000)).contains("no command record"));
    }
}
