//! cgroup v2 containment of a run's commands, when a subtree can be created.
//!
//! Each incarnation (generation) of a run gets its own cgroup v2 directory
//! `runlease-<key>-<generation>`, created below the owner's own cgroup (the `0::` line of
//! `/proc/self/cgroup`, under the cgroup2 mount found in `/proc/self/mountinfo`). `<key>` is 16 hex digits of SHA-256 over the run's root path
//! and run id, so the next incarnation of the same run, wherever it lives in the cgroup
//! tree, recognizes the leftovers of a killed one.
//!
//! Every command is moved into it while its spawn gate is stopped (before the program
//! starts), and everything it starts is born inside it: setsid, setpgid and double forks
//! do not leave a cgroup. Killing writes `1` to `cgroup.kill` (the kernel kills every
//! member, including ones forked meanwhile); membership is `cgroup.procs` (exited members
//! leave it at once, zombies included).
//!
//! If the directory cannot be created (no cgroup2 mount, no write permission: an
//! unprivileged owner without a delegated subtree), [`Cgroup::create`] reports why and
//! the run falls back to process groups, sessions, the child subreaper and /proc scans.

use lease_core::Digest;
use std::io;
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
    /// Create `runlease-<key>-<generation>` below this process's own cgroup. An existing
    /// directory of that name (a crashed attempt of this very generation) is reused.
    pub fn create(key: &str, generation: u64) -> Result<Cgroup, CgroupUnavailable> {
        let no = |why: String| CgroupUnavailable(why);
        let mount = mount_point().ok_or_else(|| no("no cgroup2 file system is mounted".into()))?;
        let own =
            cgroup_of("self").ok_or_else(|| no("this process has no cgroup v2 path".into()))?;
        let parent = mount.join(own.trim_start_matches('/'));
        let path = parent.join(format!("{PREFIX}{key}-{generation}"));
        match std::fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
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

    /// Start, on a thread of its own, a migration of this process into the cgroup it is
    /// already in (the parent of this one, where [`Cgroup::create`] made it): a no-op for
    /// membership, done only for its cost. The kernel's first migration after a quiet spell
    /// waits for an RCU grace period (the write side of its cgroup threadgroup lock), 6–11 ms
    /// measured on the reference VM, while one that follows another within about a grace
    /// period costs some 50 µs. Started when the run's cgroup is made, this one pays that
    /// wait while the open goes on with its other steps, so the command's own move ([`Cgroup::add`],
    /// a few milliseconds later) usually finds the lock warm (issue #19). Best effort: a
    /// failure (no permission on the parent's `cgroup.procs`, controllers enabled there) is
    /// ignored and costs nothing but the lost saving; the kernel takes the lock before it
    /// checks either, so even a refused write warms it.
    pub fn warm_migration_lock(&self) {
        let Some(parent) = self.path.parent().map(|p| p.join("cgroup.procs")) else {
            return;
        };
        let pid = std::process::id().to_string();
        let _ = std::thread::Builder::new()
            .name("lease-run-cgroup-warm".into())
            .spawn(move || {
                let _ = std::fs::write(parent, pid);
            });
    }

    /// Move `pid` (and its threads) into it.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        std::fs::write(self.path.join("cgroup.procs"), pid.to_string())
    }

    /// Its members (`cgroup.procs`; exited processes are not listed). Empty if the
    /// directory is gone.
    pub fn pids(&self) -> Vec<u32> {
        pids_in(&self.path)
    }

    /// SIGKILL every member (`cgroup.kill`; on kernels before 5.14, each listed pid).
    pub fn kill(&self) {
        if std::fs::write(self.path.join("cgroup.kill"), "1").is_err() {
            for pid in self.pids() {
                // Through a pidfd confirmed to be the member just listed.
                if let Some(h) = crate::procs::Held::current(pid) {
                    let _ = h.signal(rustix::process::Signal::KILL);
                }
            }
        }
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
/// members left behind are logged at `warn` (the next open of the run kills them).
pub fn detach(dir: &Path) {
    let Some(parent) = dir.parent() else { return };
    for _ in 0..100 {
        let pids = pids_in(dir);
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
        "cannot move every detached command out of the run's cgroup: the next open of the run kills the rest"
    );
}

/// The pids listed in `<dir>/cgroup.procs` (empty if unreadable).
pub(crate) fn pids_in(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// The cgroups of older incarnations (generation below `ours`) of the run with `key` that
/// still hold processes anywhere in the cgroup tree (found through `/proc/*/cgroup`), plus
/// empty ones beside this process's own cgroup (left by a clean exit or a crash).
pub fn leftovers(key: &str, ours: u64) -> Vec<Cgroup> {
    let Some(mount) = mount_point() else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = Vec::new();
    let mine = |name: &str| parse_name(name).is_some_and(|(k, g)| k == key && g < ours);
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let name = e.file_name();
            let Some(pid) = name
                .to_str()
                .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let Some(cg) = cgroup_of(pid) else { continue };
            let comps: Vec<&str> = cg.split('/').collect();
            // The run's cgroup, or the one above a nested cgroup a command made.
            for i in (0..comps.len()).rev() {
                if mine(comps[i]) {
                    let p = mount.join(comps[..=i].join("/").trim_start_matches('/'));
                    if !found.contains(&p) {
                        found.push(p);
                    }
                    break;
                }
            }
        }
    }
    if let Some(own) = cgroup_of("self") {
        if let Ok(dir) = std::fs::read_dir(mount.join(own.trim_start_matches('/'))) {
            for e in dir.flatten() {
                if e.file_name().to_str().is_some_and(mine) && !found.contains(&e.path()) {
                    found.push(e.path());
                }
            }
        }
    }
    found.into_iter().map(|path| Cgroup { path }).collect()
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
}
