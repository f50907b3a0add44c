//! The watchdog OS thread: the self-fence rule on CLOCK_BOOTTIME and the kill, even
//! when the tokio runtime is blocked.

use super::{FenceState, Shared};
use crate::clock::boottime_ns;
use crate::fence::{Tick, Tracking, fence_tick};
use crate::procs::{self, Tracked};
use rustix::process::Signal;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How often the watchdog thread (and the async self-fence timer) check the deadline.
pub const WATCHDOG_TICK: Duration = Duration::from_millis(100);

/// The watchdog OS thread: every 100 ms, apply the self-fence rule on CLOCK_BOOTTIME,
/// learn the commands' descendants from /proc, and once fenced SIGKILL every tracked
/// process until all are gone; then confirm the fence (and exit 75 if asked).
pub(super) fn watchdog(shared: Arc<Shared>) {
    loop {
        // Wake at the next tick, or right at the self-fence deadline if that comes first,
        // so the kill starts as soon as the deadline passes, not up to a tick later.
        let nap = if shared.is_fenced() {
            WATCHDOG_TICK
        } else {
            WATCHDOG_TICK.min(shared.until_lapse(boottime_ns()) + Duration::from_millis(1))
        };
        std::thread::sleep(nap);
        let fenced = shared.is_fenced();
        if !fenced && shared.stop.load(Ordering::SeqCst) {
            return;
        }
        if !fenced && shared.lapsed(boottime_ns()) {
            shared.fence(shared.lapse_reason());
        }
        // Learn the commands' descendants; once fenced, SIGKILL everything tracked (the
        // snapshot is taken under the tracking lock: see `fence::fence_tick`).
        if fence_tick(&shared.core, &shared.tracked) == Tick::Confirmed {
            // Close the store so the next owner can open it. A commit in flight holds the
            // slot: it finds the run fenced afterwards and drops the store itself.
            shared.core.drop_store_if_free();
            // Nothing of the run is alive: the guard has nothing left to kill.
            shared.guard_finish();
            let reason = shared.fence_reason().unwrap_or_default();
            shared
                .fence_tx
                .send_replace(FenceState::Confirmed(reason.clone()));
            // After the fence is reported: a member just killed may stay listed for a
            // moment while it exits (rmdir is busy then); an empty directory left anyway
            // is removed by the next open of the run.
            let cg = shared.tracked().cgroup.clone();
            if let Some(cg) = cg {
                crate::cgroup::Cgroup::at(cg).remove_within(Duration::from_millis(250));
            }
            if shared.exit_on_fence {
                // Never `eprintln!`: it panics on a closed stderr, and this thread must
                // reach the exit.
                let _ = std::io::Write::write_fmt(
                    &mut std::io::stderr(),
                    format_args!(
                        "lease-run: fenced ({}): {reason}; commands killed, exiting 75\n",
                        shared.run
                    ),
                );
                std::process::exit(75);
            }
            return;
        }
    }
}

impl Tracking for Tracked {
    type Scan = Vec<procs::ProcInfo>;

    fn scan(&self) -> Self::Scan {
        // Nothing before the first command; then only what the run can count (issue #33).
        self.snapshot()
    }

    fn refresh_alive(&mut self, scan: &Self::Scan) -> bool {
        self.refresh(scan);
        reap_orphans(self, scan);
        self.any_alive(scan)
    }

    fn kill_all(&mut self, scan: &Self::Scan) {
        self.signal_all(Signal::KILL, scan);
    }

    fn before_start(&mut self) {
        self.note_spawn();
    }
}

/// Reap the zombies of adopted orphans: children of this (subreaper) process that the
/// refresh just counted as the run's (`known`, which takes in a zombie child of ours only by
/// the adoption rule of [`Tracked`]), never a command leader (a tokio `Child`, reaped by its
/// `RunCommand`; any pid a leader or a recorded group had is skipped). Its pid cannot have been reused: a child
/// is ours until reaped, and this runs under the tracking lock right after the scan.
fn reap_orphans(t: &Tracked, procs: &[procs::ProcInfo]) {
    let me = std::process::id();
    for p in procs {
        if p.zombie
            && p.ppid == me
            && !t.is_leader(p.pid)
            && !t.groups.contains(&p.pid)
            && t.known.get(&p.pid) == Some(&p.start_time)
        {
            if let Some(pid) = rustix::process::Pid::from_raw(i32::try_from(p.pid).unwrap_or(0)) {
                let _ = rustix::process::waitid(
                    rustix::process::WaitId::Pid(pid),
                    rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOHANG,
                );
            }
        }
    }
}
