//! The guard process (issue #31): the run's commands are killed by the self-fence deadline
//! even while their owner is stopped.
//!
//! The watchdog thread lives inside the owner process: a SIGSTOP of the owner (a debugger,
//! `kill -STOP`, a frozen container) stops it too, and the commands run on unsupervised
//! beside the next owner (with an etcd authority the next owner exists as soon as the
//! stopped owner's etcd lease expires; with the run folder once its heartbeat is stale).
//! Their writes are refused, but they run.
//!
//! So when [`crate::OpenOptions::guard`] names a program, the owner starts it as a small
//! process of its own at the run's first command ([`GuardProgram`]: `runlease run` re-executes
//! its own binary, `runlease __guard`; a library owner names a program that calls
//! [`serve_stdin`]). It runs in a process group of its own, so a SIGSTOP of the owner or of
//! the owner's group does not stop it. Its standard input is one end of a
//! `SOCK_SEQPACKET` socket pair; over the other the owner sends fixed-size records:
//!
//! - **owner**: the owner's pid, sent first, which the guard names when it kills (its
//!   parent pid is the reaper's once the owner is gone);
//! - **deadline**: the self-fence deadline on `CLOCK_BOOTTIME` (the start of the last
//!   successful heartbeat + `self_fence_after`), at start and after every successful
//!   heartbeat;
//! - **cgroup**: a descriptor of the run's cgroup v2 directory, opened by the owner when
//!   it created it;
//! - **leader**: a pidfd of each command leader, opened by the owner while the leader is
//!   its stopped, unreaped spawn gate (so it is that process), sent before the gate is
//!   continued;
//! - **done**: the owner stopped its commands itself (release, a confirmed fence) or handed
//!   them over ([`crate::Run::release_detached`]): the guard exits at once.
//!
//! The guard waits on the socket until the deadline (plus [`GUARD_GRACE`]). It kills when
//! the deadline passes with no later one (the owner is stopped or stuck), or at once when
//! the socket reaches its end without **done** (the owner died: only it held the other
//! end, so no later deadline can come, and a command left running until the deadline
//! would run unsupervised beside whoever replaces it). A read error other than the end
//! leaves the deadline alone to decide. To kill it sends `cgroup.kill` to the directory it
//! holds (every member, whatever it did with groups and sessions), then, for each leader
//! whose pidfd shows it has not exited, the leader's process group and the leader itself
//! through its pidfd; it repeats this until nothing it holds is alive (at most 5 s), says
//! so on its standard error (inherited from the owner) and exits.
//!
//! **Trust.** The guard signals only what the owner handed it as a descriptor: it never
//! reads a target from a path, an argument or the run folder (anyone who can write the run
//! folder can edit any file in it, and pids are reused). A pidfd proves the leader; a group
//! kill of the leader's group while the leader is alive cannot be reused for another group
//! (the number is the leader's), but it does not prove every member: a process of the
//! owner's session may have joined the group. Without a cgroup the guard reaches only the
//! leaders and their groups: a descendant that left its leader's group (`setsid`, a
//! double fork), or any member once its leader has exited, is not killed by the guard
//! (the owner's watchdog kills those when it runs: see the crate docs, "Escapes").
//!
//! **Limits.** The owner sends without blocking: a guard stopped *on its own* while its
//! owner beats on can miss deadlines once its socket's queue is full (some hundreds of
//! records), and when resumed kill the commands of a live owner at the last deadline it
//! got. A guard killed by someone leaves the owner's own watchdog as the only kill.

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use rustix::process::{Pid, Signal};
use std::ffi::OsString;
use std::io::{IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long after the self-fence deadline the guard kills: a heartbeat that started before
/// the deadline and succeeded just after it (the owner's watchdog then has not fenced) has
/// this long to reach the guard. A quarter of [`crate::MIN_FENCE_MARGIN`], so the kill is
/// done well before anyone may call the owner stale.
pub const GUARD_GRACE: Duration = Duration::from_millis(50);
const _: () = assert!(GUARD_GRACE.as_millis() * 4 <= crate::MIN_FENCE_MARGIN.as_millis());

/// The longest the guard waits at once (also while it waits for the first deadline), so a
/// suspended host's wake-up is seen within this on `CLOCK_BOOTTIME`.
const TICK: Duration = Duration::from_millis(100);

/// How long the guard keeps killing until nothing it holds is alive.
const KILL_FOR: Duration = Duration::from_secs(5);

/// One record: a tag byte, seven zero bytes, a little-endian `u64`.
const RECORD: usize = 16;

const TAG_DEADLINE: u8 = 1;
const TAG_CGROUP: u8 = 2;
const TAG_LEADER: u8 = 3;
const TAG_DONE: u8 = 4;
const TAG_OWNER: u8 = 5;

/// The program an owner starts as its guard ([`crate::OpenOptions::guard`]): it must call
/// [`serve_stdin`] and exit with its code. Started with an empty environment, stdin the
/// guard socket, stdout `/dev/null`, stderr inherited (the guard says there when it kills).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardProgram {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments (its `argv[0]` is `runlease-guard`).
    pub args: Vec<OsString>,
}

impl GuardProgram {
    /// This very executable (`/proc/self/exe`: the image the owner runs, even if its file
    /// was replaced since) with `args`: how `runlease run` starts `runlease __guard`.
    pub fn this_executable<I, S>(args: I) -> GuardProgram
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        GuardProgram {
            program: PathBuf::from("/proc/self/exe"),
            args: args.into_iter().map(Into::into).collect(),
        }
    }
}

/// The owner's side of a running guard.
pub(crate) struct Guard {
    sock: OwnedFd,
    child: Option<std::process::Child>,
    /// The guard's pid and start time (never adopted as one of the run's processes).
    pub(crate) id: (u32, u64),
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").field("id", &self.id).finish()
    }
}

impl Guard {
    /// Start `program` as a guard. Order: (1) the socket pair, both ends close-on-exec (a
    /// command never inherits either); (2) the guard spawned with its end as stdin (std
    /// clears close-on-exec on fd 0 only in the child) in a process group of its own,
    /// under the lock every mark-carrying spawn takes (so it inherits no run's mark), with
    /// an empty environment (no run's secret); (3) its start time read while it is our
    /// unreaped child (its pid cannot be reused). The caller holds the tracking lock, so the
    /// watchdog never sees it before it is excluded from adoption.
    pub(crate) fn start(program: &GuardProgram) -> std::io::Result<Guard> {
        use std::os::unix::process::CommandExt;
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )?;
        let mut cmd = std::process::Command::new(&program.program);
        cmd.arg0("runlease-guard")
            .args(&program.args)
            .env_clear()
            .stdin(std::process::Stdio::from(theirs))
            .stdout(std::process::Stdio::null())
            .process_group(0);
        let child = crate::procs::spawn_unmarked(|| cmd.spawn())?;
        let pid = child.id();
        // Who the guard serves, for its kill line (its parent pid is the reaper's once the
        // owner is gone). Best effort, like the deadlines.
        let _ = send_record(ours.as_fd(), TAG_OWNER, u64::from(std::process::id()), None);
        let start_time = lease_fs::probe::process_start_time(pid)
            .ok()
            .flatten()
            .unwrap_or(0);
        Ok(Guard {
            sock: ours,
            child: Some(child),
            id: (pid, start_time),
        })
    }

    /// Send one record (with `fd` attached), without blocking and without SIGPIPE.
    fn send(&self, tag: u8, value: u64, fd: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
        send_record(self.sock.as_fd(), tag, value, fd)
    }

    /// The self-fence deadline (`CLOCK_BOOTTIME` ns). Best effort: a full queue (the guard
    /// is stopped) or a gone guard is logged at `debug`; only later deadlines matter.
    pub(crate) fn deadline(&self, ns: u64) {
        if let Err(e) = self.send(TAG_DEADLINE, ns, None) {
            tracing::debug!(error = %e, "the guard missed a deadline");
        }
    }

    /// Hand the guard the run's cgroup directory: opened here (`O_DIRECTORY|O_NOFOLLOW`,
    /// the path the owner itself created), sent as a descriptor.
    pub(crate) fn cgroup(&self, dir: &Path) -> std::io::Result<()> {
        use rustix::fs::{Mode, OFlags};
        let fd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        self.send(TAG_CGROUP, 0, Some(fd.as_fd()))
    }

    /// Hand the guard a pidfd of command leader `pid`, which must be our unreaped child
    /// (so the pidfd is that process).
    pub(crate) fn leader(&self, pid: u32) -> std::io::Result<()> {
        let p = i32::try_from(pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or_else(|| std::io::Error::other(format!("invalid pid {pid}")))?;
        let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty())?;
        self.send(TAG_LEADER, u64::from(pid), Some(fd.as_fd()))
    }

    /// Tell the guard it is done (it exits without killing), close the socket and reap it
    /// on a thread of its own (it exits at once; a guard that already killed and exited
    /// is only reaped).
    pub(crate) fn finish(mut self) {
        let _ = self.send(TAG_DONE, 0, None);
        self.reap();
    }

    fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = std::thread::Builder::new()
                .name("lease-run-guard-reap".into())
                .spawn(move || {
                    let _ = child.wait();
                });
        }
    }
}

impl Drop for Guard {
    /// Without [`Guard::finish`] the socket closes with no **done**: the guard kills what
    /// it holds at once (no later deadline can come), then exits; it is reaped here.
    fn drop(&mut self) {
        self.reap();
    }
}

/// Send one record on `sock` (with `fd` attached), without blocking and without SIGPIPE.
fn send_record(
    sock: BorrowedFd<'_>,
    tag: u8,
    value: u64,
    fd: Option<BorrowedFd<'_>>,
) -> std::io::Result<()> {
    let mut rec = [0u8; RECORD];
    rec[0] = tag;
    rec[8..].copy_from_slice(&value.to_le_bytes());
    let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::other("no room for a descriptor"));
    }
    rustix::net::sendmsg(
        sock,
        &[IoSlice::new(&rec)],
        &mut control,
        SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// What a guard holds.
#[derive(Default)]
struct Held {
    /// The owner's pid, as it sent it.
    owner: Option<u32>,
    kill_at: Option<u64>,
    cgroup: Option<OwnedFd>,
    leaders: Vec<(u32, OwnedFd)>,
    done: bool,
}

/// One read of the socket.
enum Got {
    /// A record (or a malformed one, ignored).
    Record,
    /// The socket's end: every holder of the owner's end closed it (the owner exited).
    End,
    /// Nothing queued (a non-blocking read).
    Empty,
    /// An error other than the end: the socket cannot be read.
    Failed,
}

/// Why the guard kills.
#[derive(Clone, Copy)]
enum Why {
    /// The deadline passed with no later one.
    Deadline,
    /// The socket ended without **done**.
    OwnerGone,
}

/// The guard's side: serve the owner on descriptor 0 (see the module docs) and return the
/// process's exit code: 0 when the owner said **done** or nothing was ever handed over, 1
/// after a kill, 64 when stdin is not a guard socket.
pub fn serve_stdin() -> i32 {
    let stdin = std::io::stdin();
    let sock = stdin.as_fd();
    if rustix::net::sockopt::socket_type(sock) != Ok(SocketType::SEQPACKET) {
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            b"runlease: the guard is started by `runlease run` itself, its stdin a socket\n",
        );
        return 64;
    }
    serve(sock)
}

/// [`serve_stdin`] on `sock`.
fn serve(sock: BorrowedFd<'_>) -> i32 {
    // The owner's pid for the kill line: the one it sends first, else this process's
    // parent when it starts (read now: after the owner's death it is whoever reaps orphans).
    let parent = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().unsigned_abs().get());
    let mut held = Held::default();
    // The socket can no longer be read (an error other than its end): the deadline alone
    // decides, as if no later one will come.
    let mut clock_only = false;
    // The socket's end without done: the owner is gone (only it held the other end,
    // close-on-exec), so no later deadline can come and nothing supervises its commands.
    // Kill now rather than at the deadline: the deadline is certain to pass unextended, and
    // a command that outlives its owner runs unsupervised beside whoever replaces it (and
    // keeps every pipe it shares with its owner's caller open until then).
    let mut gone = false;
    loop {
        if held.done {
            return 0;
        }
        if gone {
            return kill_until_gone(&held, Why::OwnerGone, held.owner.unwrap_or(parent));
        }
        let now = crate::clock::boottime_ns();
        if let Some(at) = held.kill_at.filter(|at| now >= *at) {
            // Whatever the owner queued meanwhile first: a later deadline, done, or its end.
            while !clock_only && !gone {
                match recv(sock, &mut held, true) {
                    Got::Record => {}
                    Got::End => gone = true,
                    Got::Empty => break,
                    Got::Failed => clock_only = true,
                }
            }
            if held.done || gone || held.kill_at.is_some_and(|k| k > at) {
                continue;
            }
            return kill_until_gone(&held, Why::Deadline, held.owner.unwrap_or(parent));
        }
        let wait = held.kill_at.map_or(TICK, |at| {
            Duration::from_nanos(at.saturating_sub(now)).min(TICK)
        });
        if clock_only {
            if held.kill_at.is_none() {
                // Nothing was ever handed over: nothing to guard.
                return 0;
            }
            std::thread::sleep(wait);
            continue;
        }
        let mut fds = [rustix::event::PollFd::new(
            &sock,
            rustix::event::PollFlags::IN,
        )];
        let ts = rustix::event::Timespec::try_from(wait).unwrap_or(rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 100_000_000,
        });
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => {}
            Ok(_) => match recv(sock, &mut held, false) {
                Got::Record | Got::Empty => {}
                Got::End => gone = true,
                Got::Failed => clock_only = true,
            },
            // Cannot wait on the socket: wait on the clock alone.
            Err(_) => clock_only = true,
        }
    }
}

/// Read one record into `held`.
fn recv(sock: BorrowedFd<'_>, held: &mut Held, nonblocking: bool) -> Got {
    let mut rec = [0u8; RECORD];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut flags = RecvFlags::CMSG_CLOEXEC;
    if nonblocking {
        flags |= RecvFlags::DONTWAIT;
    }
    let got = rustix::net::recvmsg(sock, &mut [IoSliceMut::new(&mut rec)], &mut control, flags);
    let n = match got {
        Ok(m) => m.bytes,
        Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR) => return Got::Empty,
        Err(_) => return Got::Failed,
    };
    if n == 0 {
        return Got::End;
    }
    let mut fd: Option<OwnedFd> = None;
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = msg {
            for f in fds {
                fd.get_or_insert(f);
            }
        }
    }
    if n != RECORD {
        return Got::Record;
    }
    let value = u64::from_le_bytes(rec[8..].try_into().unwrap_or([0; 8]));
    match (rec[0], fd) {
        (TAG_DEADLINE, _) => held.kill_at = held.kill_at.max(Some(value + nanos(GUARD_GRACE))),
        (TAG_CGROUP, Some(fd)) => held.cgroup = Some(fd),
        (TAG_LEADER, Some(fd)) => {
            if let Ok(pid) = u32::try_from(value) {
                held.leaders.push((pid, fd));
            }
        }
        (TAG_DONE, _) => held.done = true,
        (TAG_OWNER, _) => held.owner = u32::try_from(value).ok(),
        _ => {}
    }
    Got::Record
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Kill everything held, again every 10 ms until nothing held is alive or [`KILL_FOR`]
/// passed; then say so on stderr (after the kill: a stderr that blocks cannot delay it),
/// naming `owner` (the pid that started this guard) and `why`.
/// Returns the exit code: 0 when nothing held was alive, 1 after a kill.
fn kill_until_gone(held: &Held, why: Why, owner: u32) -> i32 {
    if !alive(held) {
        return 0;
    }
    let end = Instant::now() + KILL_FOR;
    loop {
        kill(held);
        std::thread::sleep(Duration::from_millis(10));
        if !alive(held) || Instant::now() >= end {
            break;
        }
    }
    let left = if alive(held) { "; some survive" } else { "" };
    let said = match why {
        Why::Deadline => format!(
            "no heartbeat of owner pid {owner} extended the self-fence deadline (the owner is stopped or stuck): killed its commands"
        ),
        Why::OwnerGone => {
            format!("owner pid {owner} ended without stopping its commands: killed them")
        }
    };
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("runlease: guard: {said}{left}\n"),
    );
    1
}

/// One kill of everything held. Order: (1) `cgroup.kill` (the kernel kills every member,
/// including ones forked meanwhile); (2) for each leader, while its pidfd shows it has not
/// exited (so its pid, which is its group's number, cannot have been reused), its process
/// group; (3) the leader through its pidfd (a no-op once it is gone).
fn kill(held: &Held) {
    if let Some(dir) = &held.cgroup {
        if let Some(f) = open_in(dir, "cgroup.kill", true) {
            let _ = std::io::Write::write_all(&mut std::fs::File::from(f), b"1");
        }
    }
    let own_group = rustix::process::getpgrp().as_raw_nonzero().get();
    for (pid, fd) in &held.leaders {
        let Ok(p) = i32::try_from(*pid) else { continue };
        if !exited(fd) && p > 1 && p != own_group {
            if let Some(g) = Pid::from_raw(p) {
                let _ = rustix::process::kill_process_group(g, Signal::KILL);
            }
        }
        let _ = rustix::process::pidfd_send_signal(fd, Signal::KILL);
    }
}

/// Whether anything held is alive: a member listed in the cgroup's `cgroup.procs`, or a
/// leader whose pidfd shows it has not exited.
fn alive(held: &Held) -> bool {
    let members = held.cgroup.as_ref().is_some_and(|dir| {
        open_in(dir, "cgroup.procs", false).is_some_and(|f| {
            let mut s = String::new();
            std::fs::File::from(f)
                .read_to_string(&mut s)
                .is_ok_and(|_| s.lines().any(|l| !l.trim().is_empty()))
        })
    });
    members || held.leaders.iter().any(|(_, fd)| !exited(fd))
}

/// `name` in the directory `dir`, opened without following a symlink.
fn open_in(dir: &OwnedFd, name: &str, write: bool) -> Option<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let access = if write {
        OFlags::WRONLY
    } else {
        OFlags::RDONLY
    };
    rustix::fs::openat(
        dir,
        name,
        access | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// Whether the process behind `pidfd` has exited (readable); an error counts as exited,
/// so nothing is signalled on a guess.
fn exited(pidfd: &OwnedFd) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut fds, Some(&zero)).map_or(true, |n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `sleep 60` in a process group of its own, a child of the test.
    fn sleeper() -> std::process::Child {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap()
    }

    fn pair() -> (OwnedFd, OwnedFd) {
        rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    /// The guard's side in a thread, serving `theirs`.
    fn guard(theirs: OwnedFd) -> std::thread::JoinHandle<i32> {
        std::thread::spawn(move || serve(theirs.as_fd()))
    }

    fn leader(owner: &OwnedFd, child: &std::process::Child) {
        let p = Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
        let fd = rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).unwrap();
        send_record(
            owner.as_fd(),
            TAG_LEADER,
            u64::from(child.id()),
            Some(fd.as_fd()),
        )
        .unwrap();
    }

    /// Its exit status within 5 s (else it is killed and the test fails).
    fn wait_within(child: &mut std::process::Child) -> std::process::ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if t.elapsed() > Duration::from_secs(5) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the guard did not kill the leader within 5 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn in_ms(ms: u64) -> u64 {
        crate::clock::boottime_ns() + ms * 1_000_000
    }

    /// A guard serving the other end of the owner's socket (returned first), handed a
    /// deadline `ms` from now and then a sleeping leader (returned second).
    fn guarding_with_deadline(
        ms: u64,
    ) -> (OwnedFd, std::process::Child, std::thread::JoinHandle<i32>) {
        let (ours, theirs) = pair();
        let child = sleeper();
        let g = guard(theirs);
        send_record(ours.as_fd(), TAG_DEADLINE, in_ms(ms), None).unwrap();
        leader(&ours, &child);
        (ours, child, g)
    }

    /// The leader ended by SIGKILL and the guard exited 1 (it killed).
    fn assert_killed_by_the_guard(st: &std::process::ExitStatus, g: std::thread::JoinHandle<i32>) {
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(st), Some(9));
        assert_eq!(g.join().unwrap(), 1);
    }

    /// Without a cgroup: a deadline that passes unextended kills the leader it was handed
    /// (through its pidfd and its group), not before the deadline; the guard exits 1.
    #[test]
    fn an_unextended_deadline_kills_the_leader() {
        let (_ours, mut child, g) = guarding_with_deadline(300);
        let t = Instant::now();
        let st = wait_within(&mut child);
        assert!(
            t.elapsed() >= Duration::from_millis(250),
            "killed before the deadline"
        );
        assert_killed_by_the_guard(&st, g);
    }

    /// Deadlines extended in time keep the leader alive; **done** ends the guard without a
    /// kill, and so does the end of the socket after it.
    #[test]
    fn extended_deadlines_and_done_kill_nothing() {
        let (ours, theirs) = pair();
        let mut child = sleeper();
        let g = guard(theirs);
        leader(&ours, &child);
        for _ in 0..8 {
            send_record(ours.as_fd(), TAG_DEADLINE, in_ms(200), None).unwrap();
            std::thread::sleep(Duration::from_millis(100));
        }
        send_record(ours.as_fd(), TAG_DONE, 0, None).unwrap();
        drop(ours);
        assert_eq!(g.join().unwrap(), 0);
        assert!(
            child.try_wait().unwrap().is_none(),
            "the guard killed a live owner's command"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// The owner's pid arrives as a record (the kill line names it even once the guard's
    /// parent is the reaper); a record of an unknown tag is ignored.
    #[test]
    fn the_owner_record_names_the_owner() {
        let (ours, theirs) = pair();
        send_record(ours.as_fd(), TAG_OWNER, 4242, None).unwrap();
        send_record(ours.as_fd(), 99, 7, None).unwrap();
        let mut held = Held::default();
        assert!(matches!(recv(theirs.as_fd(), &mut held, true), Got::Record));
        assert!(matches!(recv(theirs.as_fd(), &mut held, true), Got::Record));
        assert_eq!(held.owner, Some(4242));
        assert!(held.kill_at.is_none() && !held.done);
        drop(ours);
        assert!(matches!(recv(theirs.as_fd(), &mut held, true), Got::End));
    }

    /// The owner gone without **done** (the socket's end): the guard kills at once, not
    /// at a deadline that no heartbeat can extend any more.
    #[test]
    fn the_owner_gone_without_done_kills_at_once() {
        let (ours, mut child, g) = guarding_with_deadline(60_000);
        let t = Instant::now();
        drop(ours);
        let st = wait_within(&mut child);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "killed {:?} after the owner's end, not at once",
            t.elapsed()
        );
        assert_killed_by_the_guard(&st, g);
    }
}
