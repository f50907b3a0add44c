//! Liveness evidence from `/proc`: the boot id, process start times, the host name.
//!
//! A process is identified by `(boot id, pid, start time)`: a pid alone can be reused, but a
//! reused pid has a different start time (clock ticks since boot, field 22 of
//! `/proc/<pid>/stat`), and a start time means nothing across boots, hence the boot id.

use std::io;

/// Path of the kernel's random per-boot id.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The id of the current boot (`/proc/sys/kernel/random/boot_id`, trimmed).
pub fn boot_id() -> io::Result<String> {
    let id = std::fs::read_to_string(BOOT_ID)?;
    let id = id.trim();
    if id.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{BOOT_ID} is empty"),
        ));
    }
    Ok(id.to_string())
}

/// Where this process's time namespace is named (Linux ≥ 5.6).
const TIME_NS: &str = "/proc/self/ns/time";

/// The name of this process's `CLOCK_BOOTTIME`: `<boot id>/<time namespace>` (e.g.
/// `0f3c…/time:[4026531834]`), read once per process. Two processes read comparable
/// `CLOCK_BOOTTIME` values exactly when they are on the same boot and in the same time
/// namespace (a time namespace offsets the clock). `None` when either cannot be read (no
/// `/proc`, or a kernel without time namespaces, which cannot tell us whether it offsets):
/// heartbeats then carry no monotonic stamp, and observers watch instead
/// (PROTOCOL.md §10, the same-clock rule).
pub fn clock_domain() -> Option<lease_core::Identity> {
    static DOMAIN: std::sync::OnceLock<Option<lease_core::Identity>> = std::sync::OnceLock::new();
    DOMAIN
        .get_or_init(|| {
            let boot = boot_id().ok()?;
            let ns = std::fs::read_link(TIME_NS).ok()?;
            lease_core::Identity::new(format!("{boot}/{}", ns.to_str()?)).ok()
        })
        .clone()
}

/// The fields of one `/proc/<pid>/stat` line that runlease uses. The one parser of that
/// file in the workspace: lease-run, lease-cli and the tests read through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 3, the state letter (`R`, `S`, `D`, `T` stopped, `t` tracing stop, `Z`
    /// zombie, `X`/`x` dead, …).
    pub state: char,
    /// Field 4, the parent pid.
    pub ppid: u32,
    /// Field 5, the process group (0 when it lies outside this pid namespace).
    pub pgrp: u32,
    /// Field 6, the session.
    pub session: u32,
    /// Field 22, the start time in clock ticks after boot.
    pub start_time: u64,
}

impl ProcStat {
    /// Whether it has exited (`Z`, `X` or `x`): only its exit status is left to reap.
    pub fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parse a `/proc/<pid>/stat` line. The second field, `(comm)`, may contain spaces and
/// parentheses, so the line is split at its *last* `)`; the fields after it start with
/// field 3 (`state`). `None` if a field is missing or not a number.
pub fn parse_stat(line: &str) -> Option<ProcStat> {
    let (_, rest) = line.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    fn num<T: std::str::FromStr>(f: &[&str], field: usize) -> Option<T> {
        f.get(field - 3)?.parse().ok()
    }
    Some(ProcStat {
        state: f.first()?.chars().next()?,
        ppid: num(&f, 4)?,
        pgrp: num(&f, 5)?,
        session: num(&f, 6)?,
        start_time: num(&f, 22)?,
    })
}

/// `/proc/<pid>/stat` of process `pid`, parsed; `Ok(None)` if no such process exists (a
/// zombie exists until it is reaped: see [`ProcStat::exited`]).
pub fn read_stat(pid: u32) -> io::Result<Option<ProcStat>> {
    if pid == 0 {
        return Ok(None);
    }
    let path = format!("/proc/{pid}/stat");
    let text = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        // The process exited between open and read.
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    // comm may hold any bytes, so parse bytes (lossily: only the fields after it matter).
    parse_stat(&String::from_utf8_lossy(&text))
        .map(Some)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("cannot parse {path}")))
}

/// The start time of process `pid` (clock ticks after boot, field 22 of `/proc/<pid>/stat`),
/// or `None` if no such process exists (a zombie still exists until it is reaped).
pub fn process_start_time(pid: u32) -> io::Result<Option<u64>> {
    Ok(read_stat(pid)?.map(|st| st.start_time))
}

/// Whether process `pid` can still act: `Ok(Some(start_time))` for a running (or
/// stopped) process, `Ok(None)` when it does not exist **or is a zombie** (state `Z`/`X`:
/// it has exited and closed its files, only its exit status waits to be reaped).
pub fn live_process_start_time(pid: u32) -> io::Result<Option<u64>> {
    Ok(read_stat(pid)?
        .filter(|st| !st.exited())
        .map(|st| st.start_time))
}

/// Field 22 (`starttime`) of a `/proc/<pid>/stat` line ([`parse_stat`]'s `start_time`).
pub fn parse_start_time(stat: &str) -> Option<u64> {
    parse_stat(stat).map(|st| st.start_time)
}

/// This host's name (`uname().nodename`, lossily decoded).
pub fn hostname() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// The liveness identity of the current process: `(host name, boot id, pid, start time)`.
pub fn current_holder_parts() -> io::Result<(String, String, u32, u64)> {
    let pid = std::process::id();
    let start = process_start_time(pid)?.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("/proc/{pid}/stat of the current process is missing (is /proc mounted?)"),
        )
    })?;
    Ok((hostname(), boot_id()?, pid, start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::Duration;

    #[test]
    fn own_start_time_is_stable() {
        let pid = std::process::id();
        let a = process_start_time(pid).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let b = process_start_time(pid).unwrap();
        assert!(a.is_some());
        assert_eq!(a, b);
        let (host, boot, me, start) = current_holder_parts().unwrap();
        assert_eq!(me, pid);
        assert_eq!(Some(start), a);
        assert_eq!(boot, boot_id().unwrap());
        assert_eq!(host, hostname());
        assert!(!boot.is_empty() && boot.trim() == boot);
    }

    #[test]
    fn a_reaped_child_has_no_start_time() {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(process_start_time(pid).unwrap(), None);
        assert_eq!(process_start_time(0).unwrap(), None);
        assert_eq!(process_start_time(u32::MAX).unwrap(), None);
    }

    #[test]
    fn a_zombie_still_exists() {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Wait until it has exited but is not reaped.
        let mut state = String::new();
        for _ in 0..500 {
            state = read_stat(pid).unwrap().unwrap().state.to_string();
            if state == "Z" {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(state, "Z");
        assert!(process_start_time(pid).unwrap().is_some());
        child.wait().unwrap();
        assert_eq!(process_start_time(pid).unwrap(), None);
    }

    #[test]
    fn parse_splits_at_the_last_parenthesis() {
        let fields: Vec<String> = (3..=52).map(|i| format!("{}", i * 10)).collect();
        let rest = fields.join(" ");
        for comm in ["sleep", "a b", "x) (y) z", ") ) 1 2 3 (", "((", "))"] {
            let line = format!("1234 ({comm}) {rest}\n");
            assert_eq!(parse_start_time(&line), Some(220), "{comm:?}");
        }
        assert_eq!(parse_start_time("1234 (x) S 1 2"), None);
        assert_eq!(parse_start_time("garbage"), None);
        assert_eq!(parse_start_time(""), None);
    }

    #[test]
    fn parse_stat_reads_state_parent_group_session_and_start() {
        let line = "77 (a) (b)) t 5 6 7 0 -1 4194304 66 0 0 0 1 0 0 0 20 0 1 0 1265854 265 3\n";
        let st = parse_stat(line).unwrap();
        assert_eq!(
            (st.state, st.ppid, st.pgrp, st.session, st.start_time),
            ('t', 5, 6, 7, 1_265_854)
        );
        assert!(!st.exited());
        assert!(parse_stat(&line.replace(" t ", " Z ")).unwrap().exited());
        // A group outside this pid namespace reads as 0.
        assert_eq!(
            parse_stat(&line.replace(" 5 6 7 ", " 5 0 0 "))
                .unwrap()
                .pgrp,
            0
        );
        assert_eq!(parse_stat(&line.replace(" 5 6 7 ", " 5 x 7 ")), None);
    }

    #[test]
    fn a_comm_with_spaces_and_parentheses_parses() {
        let name = "x) (y) z";
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR").to_owned() + "/../target")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let exe = dir.path().join(name);
        let sleep = ["/bin/sleep", "/usr/bin/sleep"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("a sleep binary");
        std::fs::copy(sleep, &exe).unwrap();
        // Copying and exec'ing in a multi-threaded test binary can race with a fork in
        // another thread that briefly holds the written file open (ETXTBSY): retry.
        let mut child = None;
        for _ in 0..50 {
            match Command::new(&exe).arg("30").stdin(Stdio::null()).spawn() {
                Ok(c) => {
                    child = Some(c);
                    break;
                }
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::TXTBSY.raw_os_error()) => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("cannot run {}: {e}", exe.display()),
            }
        }
        let mut child = child.expect("spawn kept failing with ETXTBSY");
        let pid = child.id();
        // Wait until the exec has happened (comm is the new name).
        let mut comm = String::new();
        for _ in 0..500 {
            comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim_end() == name {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let start = process_start_time(pid);
        let own = process_start_time(std::process::id()).unwrap().unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(comm.trim_end(), name);
        let start = start.unwrap().unwrap();
        assert!(
            start >= own,
            "child start {start} before ours {own}: misparsed"
        );
        // It must also be at most "now" in clock ticks since boot (uptime * 100 Hz + slack).
        let uptime: f64 = std::fs::read_to_string("/proc/uptime")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (start as f64) <= uptime * 1000.0 + 1000.0,
            "{start} vs uptime {uptime}"
        );
    }
}
