//! The incarnation's mark: a memfd every command inherits, so a leftover is proved ours even
//! after `env -i`, `setsid` or `nohup`; and the registry of every run's command leaders.

use std::collections::BTreeSet;

/// The lowest descriptor number [`Mark::create`] moves the mark to (the lowest free one at
/// or above it, when the soft `RLIMIT_NOFILE` allows; otherwise wherever `memfd_create` put
/// it): far above what programs use, below the usual soft limit of 1024. Its number in each
/// command is [`MARK_FD_VAR`].
pub const MARK_FD_MIN: i32 = 1000;

/// The variable that tells a command which descriptor holds its incarnation's mark (a
/// daemon that closes its descriptors can keep it, so a later owner still proves it).
pub const MARK_FD_VAR: &str = "RUNLEASE_INCARNATION_FD";

/// Serializes the moments a mark is inheritable (see [`Mark::inheritable`]): two runs of
/// one process never hand each other's mark to a command.
pub(super) static MARK_SPAWN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Every command leader (pid, start time) of every run open in this process. A run adopts
/// its owner's children (the subreaper) and reaps adopted zombies; a zombie holds no
/// descriptor and no environment, so another run's exited command carries no evidence of
/// being another run's, and two runs in one process (a library that opens two, a test
/// binary's parallel tests) reaped each other's exited leaders, whose own run's wait then
/// failed `ECHILD` (seen in `cargo xtask containment` under load). Registered right after
/// the spawn, while the leader is stopped in its gate (so before it can exit), and kept
/// while a scan still shows it (an unreaped child's number cannot be reused).
pub(super) static ALL_LEADERS: std::sync::Mutex<BTreeSet<(u32, u64)>> =
    std::sync::Mutex::new(BTreeSet::new());

/// Register a command leader of a run of this process ([`ALL_LEADERS`]).
pub(crate) fn register_leader(pid: u32, start_time: u64) {
    ALL_LEADERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert((pid, start_time));
}

/// Whether `(pid, start_time)` is a command leader of some run of this process.
pub(super) fn any_runs_leader(pid: u32, start_time: u64) -> bool {
    ALL_LEADERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&(pid, start_time))
}

/// An owner incarnation's mark (PROTOCOL §11.1, [`lease_core::CommandMark`]): a sealed
/// memfd named after the incarnation digest, holding the run, the generation and that
/// digest, kept open by the owner (close-on-exec) and inherited by each command at
/// [`MARK_FD_MIN`] or above. It survives `env -i`, `setsid`, `nohup` and double forks; a
/// process loses it only by closing the descriptor.
#[derive(Debug)]
pub struct Mark {
    fd: rustix::fd::OwnedFd,
    /// Its identity, as command records hold it.
    pub id: lease_core::CommandMark,
    content: Vec<u8>,
}

impl Mark {
    /// Create the mark of `run`'s owner at `generation` whose incarnation digest is
    /// `digest`: `memfd_create(name, CLOEXEC|ALLOW_SEALING)`, the content written, sealed
    /// (`SHRINK|GROW|WRITE|SEAL`: nobody, not even its holders, can change it), moved to
    /// [`MARK_FD_MIN`] or above, and its `(st_dev, st_ino)` read.
    pub fn create(
        run: &lease_core::RunId,
        generation: lease_core::Generation,
        digest: &lease_core::Digest,
    ) -> std::io::Result<Mark> {
        use rustix::fs::{MemfdFlags, SealFlags};
        use std::io::Write;
        let name = lease_core::CommandMark::name_for(digest);
        let content = lease_core::CommandMark::content(run, generation, digest);
        let fd = rustix::fs::memfd_create(
            name.as_str(),
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        let mut file = std::fs::File::from(fd);
        file.write_all(&content)?;
        let fd = rustix::fd::OwnedFd::from(file);
        rustix::fs::fcntl_add_seals(
            &fd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE | SealFlags::SEAL,
        )?;
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(u64::MAX);
        let fd = if soft > u64::try_from(MARK_FD_MIN).unwrap_or(0) + 16 {
            rustix::io::fcntl_dupfd_cloexec(&fd, MARK_FD_MIN).unwrap_or(fd)
        } else {
            fd
        };
        let st = rustix::fs::fstat(&fd)?;
        Ok(Mark {
            fd,
            id: lease_core::CommandMark {
                name,
                dev: st.st_dev,
                ino: st.st_ino,
            },
            content,
        })
    }

    /// Its descriptor number in this process, the same in every command
    /// ([`MARK_FD_VAR`]).
    pub fn fd_number(&self) -> i32 {
        use rustix::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    /// Run `spawn` with the mark inheritable (close-on-exec cleared, then set again), under
    /// a process-wide lock that every run's spawns take, so a command of another run of
    /// this process never inherits it. **Limit:** a child that the embedding program
    /// spawns itself at that very moment, from another thread, inherits it too; a later
    /// owner of this run would then count that child as one of this incarnation's.
    pub fn inheritable<T>(&self, spawn: impl FnOnce() -> T) -> T {
        use rustix::io::{FdFlags, fcntl_setfd};
        let _one = MARK_SPAWN.lock().unwrap_or_else(|e| e.into_inner());
        let shared = fcntl_setfd(&self.fd, FdFlags::empty()).is_ok();
        let out = spawn();
        if shared {
            // If this fails the descriptor stays inheritable: the owner's later children
            // would carry the mark; better to say so than to hide it.
            if let Err(e) = fcntl_setfd(&self.fd, FdFlags::CLOEXEC) {
                tracing::warn!(error = %e, "the incarnation mark stays inheritable");
            }
        }
        out
    }

    /// Whether `pid` holds this very mark (see [`holds_mark`]).
    pub fn held_by(&self, pid: u32) -> bool {
        holds_mark(pid, &self.id, &self.content)
    }
}

/// Run `spawn` (a process that must carry no run's mark: the guard) under the lock every
/// mark-carrying spawn takes ([`Mark::inheritable`]), so no run's mark is inheritable
/// while it starts.
#[cfg(not(loom))]
pub(crate) fn spawn_unmarked<T>(spawn: impl FnOnce() -> T) -> T {
    let _one = MARK_SPAWN.lock().unwrap_or_else(|e| e.into_inner());
    spawn()
}

/// Whether process `pid` holds, among its open descriptors, the mark `mark` with sealed
/// content `content` (PROTOCOL §11.1): a descriptor whose link reads
/// `/memfd:<name> (deleted)`, whose `stat` (through the link) has the recorded
/// `(st_dev, st_ino)`, and which, opened read-only, is the same object, sealed against
/// writes, shrinking and growth, and holds exactly `content`. Needs the right to read
/// `/proc/<pid>/fd` (same uid and dumpable, or privilege); otherwise `false`.
pub fn holds_mark(pid: u32, mark: &lease_core::CommandMark, content: &[u8]) -> bool {
    use std::os::unix::fs::MetadataExt;
    let want = format!("/memfd:{} (deleted)", mark.name);
    for (path, link) in fd_links(pid) {
        if link.as_os_str() != want.as_str() {
            continue;
        }
        match std::fs::metadata(&path) {
            Ok(md) if (md.dev(), md.ino()) == (mark.dev, mark.ino) => {}
            _ => continue,
        }
        if mark_content_is(&path, mark, content) {
            return true;
        }
    }
    false
}

/// Open the descriptor `path` (`/proc/<pid>/fd/<n>`) read-only and check it is the mark:
/// same `(st_dev, st_ino)`, sealed, `content` exactly.
pub(super) fn mark_content_is(
    path: &std::path::Path,
    mark: &lease_core::CommandMark,
    content: &[u8],
) -> bool {
    use rustix::fs::SealFlags;
    use std::io::Read;
    let Ok(file) = std::fs::File::open(path) else {
        return false;
    };
    let Ok(st) = rustix::fs::fstat(&file) else {
        return false;
    };
    if (st.st_dev, st.st_ino) != (mark.dev, mark.ino) {
        return false;
    }
    let sealed = SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE;
    if !rustix::fs::fcntl_get_seals(&file).is_ok_and(|s| s.contains(sealed)) {
        return false;
    }
    let mut got = Vec::with_capacity(content.len() + 1);
    let limit = u64::try_from(content.len() + 1).unwrap_or(u64::MAX);
    if file.take(limit).read_to_end(&mut got).is_err() {
        return false;
    }
    got == content
}

/// Whether `pid` holds a descriptor of *some* runlease incarnation's mark (a memfd named
/// `runlease-inc-…`) other than `ours`: a process of another run (of this process or of
/// another owner) that this run must not adopt.
pub(super) fn holds_other_mark(pid: u32, ours: Option<&lease_core::CommandMark>) -> bool {
    let prefix = format!("/memfd:{}", lease_core::CommandMark::PREFIX);
    let own = ours.map(|m| format!("/memfd:{} (deleted)", m.name));
    fd_links(pid).any(|(_, l)| {
        let l = l.to_string_lossy();
        l.starts_with(&prefix) && own.as_deref() != Some(&*l)
    })
}

/// Each open descriptor of `pid` (`/proc/<pid>/fd/<n>`) with what its link says, read
/// lazily; nothing when the folder cannot be read (another uid, not dumpable, gone), and
/// a descriptor whose link cannot be read is skipped.
pub(super) fn fd_links(pid: u32) -> impl Iterator<Item = (std::path::PathBuf, std::path::PathBuf)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let path = e.path();
            std::fs::read_link(&path).ok().map(|link| (path, link))
        })
}
