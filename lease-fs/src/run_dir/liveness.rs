//! Who holds a run and whether they live: the [`Liveness`] probe, [`ProcLiveness`] (`/proc`
//! and the owner lock) and this process's own [`Holder`] record.

use crate::error::FsError;
use lease_core::ops::{AuthorityLease, LivenessEvidence, LockEvidence, ProcessState};
use lease_core::{Holder, Identity};
use std::path::PathBuf;
use std::sync::Arc;

/// Gathers liveness evidence about a recorded holder (see `lease_core::ops::definitely_dead`).
pub trait Liveness: Send + Sync {
    /// Evidence about `holder`.
    fn probe(&self, holder: &Holder) -> LivenessEvidence;

    /// The answer to [`Request::Monotonic`](lease_core::ops::Request::Monotonic): this process's `CLOCK_BOOTTIME` in ns (it keeps
    /// counting while the machine sleeps, so a suspended taker's window shows its pause).
    /// A simulation overrides it with its own clock.
    fn monotonic_ns(&self) -> u64 {
        boottime_ns()
    }

    /// The name of the clock [`Liveness::monotonic_ns`] reads (see
    /// [`crate::probe::clock_domain`]); a simulation names its own.
    fn clock_domain(&self) -> Option<Identity> {
        crate::probe::clock_domain()
    }
}

/// `CLOCK_BOOTTIME` in nanoseconds (0 if the clock cannot be read: a window then reads as
/// empty, never as a pause).
pub fn boottime_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Liveness on this machine: boot id, `/proc/<pid>/stat` start time and the run's kernel
/// owner lock.
#[derive(Debug, Clone)]
pub struct ProcLiveness {
    root: PathBuf,
    /// The held descriptor of the run root, when the run was opened: the owner lock is
    /// probed in it (`openat`), never by looking `root` up again.
    held: Option<Arc<rustix::fd::OwnedFd>>,
    /// Set when the caller itself holds the owner lock (it took it, so no other live
    /// process on this boot does).
    self_holds_lock: bool,
}

impl ProcLiveness {
    /// Probe liveness for the run at `root` (the owner lock looked up by that path at
    /// each probe; a run already opened uses [`ProcLiveness::in_root`]).
    pub fn new(root: impl Into<PathBuf>) -> ProcLiveness {
        ProcLiveness {
            root: root.into(),
            held: None,
            self_holds_lock: false,
        }
    }

    /// Probe liveness for the run whose root `fs` holds: the owner lock is probed beneath
    /// that descriptor.
    pub fn in_root(fs: &crate::real::RealFs) -> ProcLiveness {
        ProcLiveness {
            root: fs.root_path().to_path_buf(),
            held: Some(fs.root_shared()),
            self_holds_lock: false,
        }
    }

    /// The caller holds the run's owner lock: report it free for any other holder.
    pub fn holding_lock(mut self) -> ProcLiveness {
        self.self_holds_lock = true;
        self
    }
}

impl Liveness for ProcLiveness {
    fn probe(&self, holder: &Holder) -> LivenessEvidence {
        let observer_boot_id = crate::probe::boot_id()
            .ok()
            .and_then(|b| Identity::new(b).ok())
            .unwrap_or_else(|| {
                Identity::new("unknown-boot").unwrap_or_else(|_| holder.boot_id.clone())
            });
        let process = match crate::probe::live_process_start_time(holder.pid) {
            Ok(None) => ProcessState::Gone,
            Ok(Some(start_time)) => ProcessState::Running { start_time },
            Err(_) => ProcessState::Unknown,
        };
        let owner_lock = if self.self_holds_lock {
            LockEvidence::Free
        } else {
            let probed = match &self.held {
                Some(fd) => {
                    use rustix::fd::AsFd;
                    crate::lock::probe_owner_lock_at(fd.as_fd(), &self.root)
                }
                None => crate::lock::probe_owner_lock(&self.root),
            };
            match probed {
                Ok(true) => LockEvidence::Free,
                Ok(false) => LockEvidence::Held,
                Err(_) => LockEvidence::Unknown,
            }
        };
        LivenessEvidence {
            observer_boot_id,
            process,
            owner_lock,
            lease: AuthorityLease::NotKept,
        }
    }
}

/// The identity of this process as a lease holder.
///
/// The host name must be a *word* ([`Identity::check_word`]: every record refuses another
/// holder host, `RECORD_INVALID`), so a host whose name breaks that rule is refused here,
/// before anything is written, with `ARGUMENT_INVALID` naming the host and the rule,
/// instead of a claim that fails while encoding its record.
pub fn this_holder() -> Result<Holder, FsError> {
    let (host, boot, pid, start) =
        crate::probe::current_holder_parts().map_err(|e| FsError::Io {
            run: "?".into(),
            op: "probe self",
            path: "/proc/self/stat".into(),
            source: e,
        })?;
    let ident = |what: &'static str, v: String| Identity::arg(what, v).map_err(FsError::from);
    Ok(Holder {
        host: holder_host(host)?,
        boot_id: ident("boot id", boot)?,
        pid,
        start_time: start,
    })
}

/// This host's name as a holder host: a word, or `ARGUMENT_INVALID` naming it.
fn holder_host(host: String) -> Result<Identity, FsError> {
    Identity::word("host name", host).map_err(|e| {
        FsError::from(lease_core::LeaseError::ArgumentInvalid {
            what: "host name",
            reason: format!(
                "this host's name cannot be recorded as a lease holder: {}; nothing was written. Rename the host (hostname(1)): every RFC 1123 host name is such a word",
                e.reason()
            ),
        })
    })
}

#[cfg(test)]
mod holder_host_tests {
    use super::*;

    #[test]
    fn a_host_name_that_is_no_word_is_argument_invalid_naming_it() {
        assert_eq!(
            holder_host("vm-1.example".into()).unwrap().as_str(),
            "vm-1.example"
        );
        for bad in ["bad host", "-x", "a;b", "\u{202e}x"] {
            let e = holder_host(bad.into()).unwrap_err();
            assert_eq!(e.code(), lease_core::Code::ArgumentInvalid, "{bad}: {e}");
            let m = e.to_string();
            assert!(
                m.contains(&format!("{bad:?}")) && m.contains("host name"),
                "{m}"
            );
        }
    }
}
