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

/// The start time of process `pid` (clock ticks after boot, field 22 of `/proc/<pid>/stat`),
/// or `None` if no such process exists (a zombie still exists until it is reaped).
pub fn process_start_time(pid: u32) -> io::Result<Option<u64>> {
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
    let text = String::from_utf8_lossy(&text);
    parse_start_time(&text).map(Some).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("cannot parse the start time (field 22) of {path}"),
        )
    })
}

/// Whether process `pid` can still act: `Ok(Some(start_time))` for a running (or
/// stopped) process, `Ok(None)` when it does not exist **or is a zombie** (state `Z`/`X`:
/// it has exited and closed its files, only its exit status waits to be reaped).
pub fn live_process_start_time(pid: u32) -> io::Result<Option<u64>> {
    if pid == 0 {
        return Ok(None);
    }
    let path = format!("/proc/{pid}/stat");
    let text = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::SRCH.raw_os_error()) => {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let text = String::from_utf8_lossy(&text);
    let state = text
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_ascii_whitespace().next());
    if matches!(state, Some("Z") | Some("X") | Some("x")) {
        return Ok(None);
    }
    parse_start_time(&text).map(Some).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("cannot parse the start time (field 22) of {path}"),
        )
    })
}

/// Field 22 (`starttime`) of a `/proc/<pid>/stat` line.
///
/// The second field, `(comm)`, may contain spaces and parentheses, so the line is split at
/// its *last* `)`; the fields after it start with field 3 (`state`).
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_ascii_whitespace().nth(22 - 3)?.parse().ok()
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
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
            state = stat
                .rsplit_once(')')
                .unwrap()
                .1
                .split_whitespace()
                .next()
                .unwrap()
                .into();
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
