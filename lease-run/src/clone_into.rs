//! Starting a command's spawn gate directly inside the run's cgroup (issue #33):
//! `clone3(CLONE_INTO_CGROUP | CLONE_PIDFD)`, then `execve`. This module is lease-run's only
//! `unsafe` code (the crate denies it everywhere else; lease-sqlite's VFS shim is the
//! workspace's other audited module).
//!
//! # Why
//!
//! Moving a process into a cgroup (a write to `cgroup.procs`) takes the write side of the
//! kernel's cgroup threadgroup lock, which waits an RCU grace period (5–20 ms measured on the
//! reference VM) unless the hierarchy is mounted `favordynmods`; while it waits, every `fork`
//! and `clone` on the machine blocks. A process *born* in the cgroup takes only the read side.
//! std's and tokio's `Command` have no way to ask for that, hence this module.
//!
//! # What it does, and the rules it keeps
//!
//! [`spawn_into`] prepares everything the child needs **before** the clone (the program path,
//! argv and envp as NUL-terminated arrays, the working folder, a close-on-exec pipe for an
//! exec error), because the child of a multi-threaded process may only make
//! async-signal-safe calls: it allocates nothing, takes no lock, and calls only thin system
//! call wrappers (`setpgid`, `sigprocmask`, `sigaction`, `chdir`, `execve`, `write`,
//! `_exit`). The child, in order: its own process group (as `process_group(0)`), an empty
//! signal mask and `SIGPIPE` back to its default (as std does: the Rust runtime ignores it),
//! the working folder, `execve`. If any of these fails it writes its `errno` to the pipe and
//! `_exit(127)`s; the parent reads the pipe (end of file: the exec happened), reaps a failed
//! child through its pidfd, and returns the error. Standard streams and every descriptor
//! without `FD_CLOEXEC` are inherited, exactly as `Command` with inherited stdio does (the
//! incarnation mark relies on that, `procs::Mark::inheritable`).
//!
//! When the kernel cannot (no `clone3`: before 5.3; no `CLONE_INTO_CGROUP`: before 5.7; a
//! cgroup we may not start into), [`spawn_into`] returns `Ok(None)` having started nothing,
//! and the caller starts the gate the portable way and moves it.

#![allow(unsafe_code)]

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `struct clone_args` of `clone3(2)` (all fields `u64`, the kernel's stable layout; the
/// size passed tells the kernel which fields exist: through `cgroup`, `CLONE_ARGS_SIZE_VER2`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// `CLONE_PIDFD` (`linux/sched.h`).
const CLONE_PIDFD: u64 = 0x0000_1000;
/// `CLONE_INTO_CGROUP` (`linux/sched.h`, Linux 5.7).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// A program to start: everything the child needs, built before the clone.
pub(crate) struct Program {
    path: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    cwd: Option<CString>,
}

fn cstring(what: &str, s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("the {what} contains a NUL byte"),
        )
    })
}

impl Program {
    /// `path` (absolute: no `PATH` search here) with `argv` (its `argv[0]` included), the
    /// whole environment `env` (`KEY`, `VALUE` pairs) and the working folder `cwd`
    /// (`None`: this process's).
    pub(crate) fn new<'a>(
        path: &OsStr,
        argv: impl IntoIterator<Item = &'a OsStr>,
        env: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
        cwd: Option<&Path>,
    ) -> io::Result<Program> {
        let argv = argv
            .into_iter()
            .map(|a| cstring("argument", a))
            .collect::<io::Result<Vec<_>>>()?;
        let envp = env
            .into_iter()
            .map(|(k, v)| {
                let mut kv = k;
                kv.push("=");
                kv.push(v);
                cstring("environment", &kv)
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Program {
            path: cstring("program path", path)?,
            argv,
            envp,
            cwd: cwd
                .map(|d| cstring("working folder", d.as_os_str()))
                .transpose()?,
        })
    }
}

impl Program {
    /// `self`, to be started in the cgroup at `cgroup` ([`Direct::spawn`]).
    pub(crate) fn into_direct(self, cgroup: std::path::PathBuf) -> Direct {
        Direct {
            program: self,
            cgroup,
        }
    }
}

/// A program and the cgroup directory to start it in.
pub(crate) struct Direct {
    program: Program,
    cgroup: std::path::PathBuf,
}

impl Direct {
    /// [`spawn_into`] the cgroup, opened now (`O_DIRECTORY|O_NOFOLLOW`). `Ok(None)` when it
    /// cannot be opened or the kernel cannot start into it: the caller starts the gate the
    /// portable way, whose move then reports what is wrong with the cgroup.
    pub(crate) fn spawn(&self) -> io::Result<Option<(u32, OwnedFd)>> {
        use rustix::fs::{Mode, OFlags};
        let Ok(dir) = rustix::fs::open(
            &self.cgroup,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return Ok(None);
        };
        spawn_into(dir.as_fd(), &self.program)
    }
}

/// Register a child's pidfd with tokio's reactor (readable once the child has exited), for
/// waiting on a child started by [`spawn_into`].
pub(crate) fn watch_pidfd(pidfd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` owns the `OwnedFd` for as long as it is registered, so the
    // descriptor is neither closed nor reused while the reactor watches it (the I/O-safety
    // condition of `register_with_interest`).
    let fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    }?;
    Ok(fd)
}

/// Whether a `clone3` error means "this kernel or this cgroup cannot": the caller falls
/// back to the portable spawn (nothing was started).
fn unsupported(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOSYS | libc::EINVAL | libc::E2BIG | libc::EOPNOTSUPP | libc::EPERM | libc::EACCES
    )
}

/// Start `p` as a child of this process born in the cgroup whose directory `cgroup` is
/// open, in a process group of its own; returns its pid and pidfd (the pid cannot be
/// reused while we have not reaped it). `Ok(None)`: the kernel cannot start into that
/// cgroup, nothing was started. `Err`: the child could not exec (it was reaped) or the
/// clone failed otherwise.
pub(crate) fn spawn_into(
    cgroup: BorrowedFd<'_>,
    p: &Program,
) -> io::Result<Option<(u32, OwnedFd)>> {
    // Everything the child touches, prepared now (it may not allocate).
    let mut argv: Vec<*const libc::c_char> = p.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = p.envp.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let path = p.path.as_ptr();
    let cwd = p.cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    let (rd, wr) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let wr_fd = wr.as_raw_fd();

    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: CLONE_PIDFD | CLONE_INTO_CGROUP,
        pidfd: std::ptr::addr_of_mut!(pidfd) as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: u64::try_from(cgroup.as_raw_fd()).unwrap_or(u64::MAX),
        ..CloneArgs::default()
    };
    // SAFETY: `args` is a valid `clone_args` of the size passed; without `CLONE_VM` the
    // child gets a copy of this address space (fork semantics) and runs only `child`,
    // which makes async-signal-safe calls on data prepared above and never returns.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            std::ptr::addr_of!(args),
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if ret == 0 {
        // SAFETY: in the child; see `child`.
        unsafe { child(path, argv.as_ptr(), envp.as_ptr(), cwd, wr_fd) }
    }
    if ret < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(errno) if unsupported(errno) => Ok(None),
            _ => Err(e),
        };
    }
    let pid = u32::try_from(ret).map_err(|_| io::Error::other("clone3 returned no pid"))?;
    // SAFETY: CLONE_PIDFD stored a new descriptor we own in `pidfd`.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    drop(wr);
    let mut buf = [0u8; 4];
    let mut got = 0;
    while got < buf.len() {
        match rustix::io::read(&rd, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if got == 0 {
        return Ok(Some((pid, pidfd)));
    }
    // The child failed before or at its exec and `_exit`ed: reap it, report its errno.
    let _ = rustix::process::waitid(
        rustix::process::WaitId::PidFd(pidfd.as_fd()),
        rustix::process::WaitIdOptions::EXITED,
    );
    Err(io::Error::from_raw_os_error(i32::from_ne_bytes(buf)))
}

/// Report `errno` on the pipe `err` and end the child (`_exit`: no atexit handlers, no
/// flushing of this process's copied buffers).
///
/// # Safety
/// Only in the child of `clone3` (see [`child`]).
unsafe fn fail(err: libc::c_int, errno: libc::c_int) -> ! {
    let b = errno.to_ne_bytes();
    // SAFETY: a write of 4 bytes from a live buffer, then `_exit`.
    unsafe {
        libc::write(err, b.as_ptr().cast(), b.len());
        libc::_exit(127)
    }
}

/// The child, between `clone3` and `execve`. Only async-signal-safe calls, no allocation.
///
/// # Safety
/// Called only in the child of `clone3` without `CLONE_VM`, with valid NUL-terminated
/// `path` and `cwd` (or null), and null-terminated `argv`/`envp` arrays of them.
unsafe fn child(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    err: libc::c_int,
) -> ! {
    // SAFETY (whole body): thin system-call wrappers on prepared data; see the fn docs.
    unsafe {
        if libc::setpgid(0, 0) != 0 {
            fail(err, *libc::__errno_location());
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGPIPE, &dfl, std::ptr::null_mut());
        if !cwd.is_null() && libc::chdir(cwd) != 0 {
            fail(err, *libc::__errno_location());
        }
        libc::execve(path, argv, envp);
        fail(err, *libc::__errno_location())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cgroup v2 directory this process is in, if it can make a child there (root or
    /// a delegated subtree); `None` skips (no cgroup v2 here).
    fn scratch_cgroup() -> Option<std::path::PathBuf> {
        let cg =
            crate::cgroup::Cgroup::create("clone-into-test", std::process::id().into()).ok()?;
        Some(cg.path().to_path_buf())
    }

    fn exit_code(pidfd: &OwnedFd) -> Option<i32> {
        rustix::process::waitid(
            rustix::process::WaitId::PidFd(pidfd.as_fd()),
            rustix::process::WaitIdOptions::EXITED,
        )
        .ok()
        .flatten()
        .and_then(|s| s.exit_status())
    }

    /// A child started into a cgroup is a member from its first instruction (it reads its
    /// own `/proc/self/cgroup`), in its own process group, with the environment and
    /// working folder given; an exec failure is the error, with its errno.
    #[test]
    fn a_child_is_born_in_the_cgroup_with_its_environment() {
        let Some(dir) = scratch_cgroup() else {
            eprintln!("skipped: no cgroup v2 this process can create a child in");
            return;
        };
        let cg = std::fs::File::open(&dir).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let script = format!(
            "cat /proc/self/cgroup > {o}; echo \"$X\" >> {o}; pwd >> {o}; cut -d' ' -f5 /proc/$$/stat >> {o}; echo $$ >> {o}",
            o = out.display()
        );
        let p = Program::new(
            OsStr::new("/bin/sh"),
            ["sh", "-c", script.as_str()].map(OsStr::new),
            [
                ("X".into(), "hello".into()),
                ("PATH".into(), "/usr/bin:/bin".into()),
            ],
            Some(tmp.path()),
        )
        .unwrap();
        let (pid, pidfd) = spawn_into(cg.as_fd(), &p).unwrap().expect("kernel >= 5.7");
        assert_eq!(exit_code(&pidfd), Some(0));
        let text = std::fs::read_to_string(&out).unwrap();
        let name = dir.file_name().unwrap().to_str().unwrap();
        let v2 = text.lines().find(|l| l.starts_with("0::")).unwrap();
        assert!(v2.ends_with(&format!("/{name}")), "{text}");
        assert!(text.contains("\nhello\n"), "{text}");
        assert!(
            text.contains(&format!("\n{}\n", tmp.path().display())),
            "{text}"
        );
        // Its own process group: the group id (from /proc) and the pid are the same.
        assert!(
            text.trim_end().ends_with(&format!("\n{pid}\n{pid}")),
            "{text}"
        );
        let _ = std::fs::remove_dir(&dir);

        let bad = Program::new(
            OsStr::new("/nonexistent/program"),
            ["x"].map(OsStr::new),
            [],
            None,
        )
        .unwrap();
        let cg_dir = scratch_cgroup().unwrap();
        let cg = std::fs::File::open(&cg_dir).unwrap();
        let e = spawn_into(cg.as_fd(), &bad).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
        let _ = std::fs::remove_dir(&cg_dir);
    }
}
