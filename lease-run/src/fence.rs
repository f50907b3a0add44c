//! The fence core: the state the heartbeat task, the watchdog thread, commits and release
//! share, with every primitive from [`crate::sync`] so the loom models below explore it.
//!
//! - the start of the last successful heartbeat (`CLOCK_BOOTTIME` ns), only ever moved
//!   forward (`fetch_max`), so a slow heartbeat finishing late never moves it back;
//! - the sticky fence flag and its first reason: the reason is stored under its mutex in the
//!   same critical section that flips the flag, so whoever sees the flag finds a reason;
//! - the store slot: a commit holds the slot's mutex for its whole duration and checks the
//!   flag inside it; the release barrier takes the store out under the same mutex (after a
//!   commit in flight, before any later one); a fence drops it (`try_lock`: the watchdog
//!   never waits on a commit; a commit that holds it drops it when it sees the flag). The
//!   slot may hold a *deferred* store (issue #33, PROTOCOL §9): the first access opens it,
//!   under the slot's mutex and after the flag check, so an open never starts once fenced
//!   and never races the barrier; a barrier that finds it still deferred learns that no
//!   commit ever ran ([`Taken::Deferred`]);
//! - the store head of the last acknowledged commit (raised under the slot's mutex), which
//!   each heartbeat reports as the floor;
//! - the last heartbeat failure (its code and message) and how many there were, so a lapse
//!   names why no heartbeat succeeded and the owner's output can warn of each failure.
//!   Only recorded and read, never part of a decision.

use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering, lock};
use lease_core::Code;

/// One failed heartbeat, as recorded in the fence core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatFailure {
    /// How many heartbeats failed since the run was opened (this one included): a reader
    /// that saw a smaller number has missed the ones in between.
    pub failures: u64,
    /// When the failed heartbeat started (`CLOCK_BOOTTIME`, ns): a failure older than the
    /// last successful heartbeat is not why the lease lapsed.
    pub started_ns: u64,
    /// The error's stable code.
    pub code: Code,
    /// The error's message (it names the run and, for a file of the run, the file).
    pub message: String,
}

/// Why a store access was refused.
#[derive(Debug)]
pub(crate) enum Access<E> {
    /// The run is fenced (the store has been dropped).
    Fenced,
    /// The store is not open (before the `seal` step, or after the release barrier).
    Closed,
    /// Opening a deferred store failed (it stays deferred: the next access tries again).
    OpenFailed(E),
    /// The operation itself failed.
    Failed(E),
}

/// The store slot's content.
enum Slot<S> {
    /// No store: before the `seal` step, after the barrier, or dropped by a fence.
    Empty,
    /// A store checked by the preflight and not opened yet: the first access opens it.
    Deferred,
    /// An open, checked store.
    Open(S),
}

/// What the release barrier took out of the slot ([`FenceCore::take_store`]).
#[derive(Debug)]
pub(crate) enum Taken<S> {
    /// The open store (to seal).
    Open(S),
    /// The store was deferred and never opened: no commit ran, the seal the chain
    /// required is still the store's.
    Deferred,
    /// Nothing: never installed, or dropped by a fence.
    Empty,
}

/// See the module docs.
pub(crate) struct FenceCore<S> {
    beat_ns: AtomicU64,
    fenced: AtomicBool,
    reason: Mutex<Option<String>>,
    store: Mutex<Slot<S>>,
    store_head: AtomicU64,
    has_store: AtomicBool,
    last_failure: Mutex<Option<HeartbeatFailure>>,
}

impl<S> FenceCore<S> {
    /// A live core whose last heartbeat-class write started at `beat_ns`.
    pub(crate) fn new(beat_ns: u64) -> FenceCore<S> {
        FenceCore {
            beat_ns: AtomicU64::new(beat_ns),
            fenced: AtomicBool::new(false),
            reason: Mutex::new(None),
            store: Mutex::new(Slot::Empty),
            store_head: AtomicU64::new(0),
            has_store: AtomicBool::new(false),
            last_failure: Mutex::new(None),
        }
    }

    /// A heartbeat failed with `code` and `message` (not a fence: that is [`fence`]).
    /// Returns the failure as recorded, numbered.
    ///
    /// [`fence`]: Self::fence
    pub(crate) fn note_failure(
        &self,
        started_ns: u64,
        code: Code,
        message: String,
    ) -> HeartbeatFailure {
        let mut last = lock(&self.last_failure);
        let failures = last.as_ref().map_or(0, |f| f.failures) + 1;
        let f = HeartbeatFailure {
            failures,
            started_ns,
            code,
            message,
        };
        *last = Some(f.clone());
        f
    }

    /// The last heartbeat failure, if any heartbeat failed.
    pub(crate) fn last_failure(&self) -> Option<HeartbeatFailure> {
        lock(&self.last_failure).clone()
    }

    /// The last heartbeat failure if no heartbeat succeeded since it started: the cause
    /// of a lapse, if it has one (none: the heartbeats did not run, as in a stopped or
    /// starved owner).
    pub(crate) fn failure_since_beat(&self) -> Option<HeartbeatFailure> {
        let beat = self.beat_ns();
        self.last_failure().filter(|f| f.started_ns >= beat)
    }

    /// A heartbeat that started at `started_ns` succeeded (never moves the beat back).
    pub(crate) fn note_beat(&self, started_ns: u64) {
        self.beat_ns.fetch_max(started_ns, Ordering::SeqCst);
    }

    /// Start of the last successful heartbeat-class write.
    pub(crate) fn beat_ns(&self) -> u64 {
        self.beat_ns.load(Ordering::SeqCst)
    }

    /// Whether the run is fenced.
    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::SeqCst)
    }

    /// Fence the run; `true` for the first caller only, whose reason is kept.
    pub(crate) fn fence(&self, reason: String) -> bool {
        let mut r = lock(&self.reason);
        if self.fenced.swap(true, Ordering::SeqCst) {
            return false;
        }
        *r = Some(reason);
        true
    }

    /// The first fence's reason, once fenced.
    pub(crate) fn reason(&self) -> Option<String> {
        if !self.is_fenced() {
            return None;
        }
        lock(&self.reason).clone()
    }

    /// Hand the checked store to commits; `head` is its head now.
    pub(crate) fn install_store(&self, store: S, head: u64) {
        let mut slot = lock(&self.store);
        self.store_head.store(head, Ordering::SeqCst);
        *slot = Slot::Open(store);
        self.has_store.store(true, Ordering::SeqCst);
    }

    /// Defer the store: the first [`with_store`](Self::with_store) opens it. `head` is
    /// the head the chain vouches for (the seal's sequence), reported by heartbeats
    /// until the store is opened.
    pub(crate) fn defer_store(&self, head: u64) {
        let mut slot = lock(&self.store);
        self.store_head.store(head, Ordering::SeqCst);
        *slot = Slot::Deferred;
        self.has_store.store(true, Ordering::SeqCst);
    }

    /// Run `f` on the store, holding the slot for its whole duration. Refused once fenced
    /// (the store is dropped then), or when no store is open. A deferred store is opened
    /// first by `open` (which returns it with its head), still under the slot and after
    /// the fence check: an open that fails leaves it deferred. `f` gets the core too, to
    /// [`acknowledge`](Self::acknowledge) a commit while the slot is held.
    pub(crate) fn with_store<T, E>(
        &self,
        open: impl FnOnce() -> Result<(S, u64), E>,
        f: impl FnOnce(&Self, &mut S) -> Result<T, E>,
    ) -> Result<T, Access<E>> {
        let mut slot = lock(&self.store);
        if self.is_fenced() {
            self.has_store.store(false, Ordering::SeqCst);
            *slot = Slot::Empty;
            return Err(Access::Fenced);
        }
        if matches!(*slot, Slot::Deferred) {
            let (store, head) = open().map_err(Access::OpenFailed)?;
            if self.is_fenced() {
                // Fenced while opening (the watchdog does not wait for the slot): the
                // store goes at once, unused.
                drop(store);
                self.has_store.store(false, Ordering::SeqCst);
                *slot = Slot::Empty;
                return Err(Access::Fenced);
            }
            self.store_head.fetch_max(head, Ordering::SeqCst);
            *slot = Slot::Open(store);
        }
        let Slot::Open(store) = &mut *slot else {
            return Err(Access::Closed);
        };
        let r = f(self, store);
        if r.is_err() && self.is_fenced() {
            // Fenced by the gate or meanwhile: close the store for the next owner.
            self.has_store.store(false, Ordering::SeqCst);
            *slot = Slot::Empty;
        }
        r.map_err(Access::Failed)
    }

    /// A commit with sequence `seq` was acknowledged (call inside [`with_store`]).
    ///
    /// [`with_store`]: Self::with_store
    pub(crate) fn acknowledge(&self, seq: u64) {
        self.store_head.fetch_max(seq, Ordering::SeqCst);
    }

    /// The head to report in a heartbeat: `None` while no store is installed (a deferred
    /// store reports the head the chain vouches for).
    pub(crate) fn reported_head(&self) -> Option<u64> {
        self.has_store
            .load(Ordering::SeqCst)
            .then(|| self.store_head.load(Ordering::SeqCst))
    }

    /// The release barrier: take the store (waiting for a commit in flight); afterwards
    /// every access is `Closed`.
    pub(crate) fn take_store(&self) -> Taken<S> {
        let mut slot = lock(&self.store);
        self.has_store.store(false, Ordering::SeqCst);
        match std::mem::replace(&mut *slot, Slot::Empty) {
            Slot::Empty => Taken::Empty,
            Slot::Deferred => Taken::Deferred,
            Slot::Open(s) => Taken::Open(s),
        }
    }

    /// On a fence: drop the store unless a commit holds it (that commit drops it when it
    /// sees the flag). Never waits. A deferred store is never opened afterwards.
    pub(crate) fn drop_store_if_free(&self) {
        if let Ok(mut slot) = self.store.try_lock() {
            self.has_store.store(false, Ordering::SeqCst);
            *slot = Slot::Empty;
        }
    }
}

/// What the watchdog's kill hand-off needs from the tracked processes (implemented by
/// `procs::Tracked` over `/proc`, and by a fake process table in the loom models).
pub(crate) trait Tracking {
    /// A snapshot of the system's processes.
    type Scan;
    /// Take a snapshot (slow: reads `/proc`).
    fn scan(&self) -> Self::Scan;
    /// Update what is tracked from `scan` (a recorded group with no process in it is
    /// forgotten) and tell whether a tracked process can still act.
    fn refresh_alive(&mut self, scan: &Self::Scan) -> bool;
    /// SIGKILL everything tracked.
    fn kill_all(&mut self, scan: &Self::Scan);
    /// A command is about to be started ([`start_tracked`], under the tracking lock).
    fn before_start(&mut self) {}
}

/// The outcome of one watchdog tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tick {
    /// Not fenced.
    Live,
    /// Fenced; something tracked was still alive and was sent SIGKILL.
    Killing,
    /// Fenced and nothing tracked is alive: the fence may be reported.
    Confirmed,
}

/// One tick of the watchdog's kill hand-off. The snapshot is taken **while holding the
/// tracking lock**, the same lock `Run::spawn` holds while it starts a command and adds its
/// group, so a command is either in the snapshot or not yet started: a snapshot taken
/// before the lock could miss a command added meanwhile, and refreshing from it would
/// forget that command's group for good (found by the loom model below).
pub(crate) fn fence_tick<S, T: Tracking>(core: &FenceCore<S>, tracked: &Mutex<T>) -> Tick {
    let fenced = core.is_fenced();
    let mut t = lock(tracked);
    let scan = t.scan();
    let alive = t.refresh_alive(&scan);
    if fenced && alive {
        t.kill_all(&scan);
    }
    drop(t);
    match (fenced, alive) {
        (false, _) => Tick::Live,
        (true, true) => Tick::Killing,
        (true, false) => Tick::Confirmed,
    }
}

/// Start a command and track it in one critical section of the tracking lock (see
/// [`fence_tick`]); `Run::spawn` starts its stopped gate this way, then records it, then
/// lets it run only if the run is still live ([`gate`]). [`Tracking::before_start`] runs
/// first, in the same critical section (for `procs::Tracked`: the pid counter before the
/// first command).
pub(crate) fn start_tracked<T: Tracking, C, E>(
    tracked: &Mutex<T>,
    start: impl FnOnce(&mut T) -> Result<C, E>,
) -> Result<C, E> {
    let mut t = lock(tracked);
    t.before_start();
    start(&mut t)
}

/// The end of the spawn gate: the run's liveness is checked *after* the command is
/// tracked and recorded; live → `run` (SIGCONT), else `kill`.
pub(crate) fn gate<E>(
    live: Result<(), E>,
    run: impl FnOnce(),
    kill: impl FnOnce(),
) -> Result<(), E> {
    match live {
        Ok(()) => {
            run();
            Ok(())
        }
        Err(e) => {
            kill();
            Err(e)
        }
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! Each model asserts something a wrong ordering breaks. Run: `cargo xtask loom`.
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicUsize;
    use loom::thread;

    /// A stand-in for the SQLite store: counts commits and how often it is dropped.
    struct FakeStore {
        commits: u64,
        drops: Arc<AtomicUsize>,
    }

    impl Drop for FakeStore {
        fn drop(&mut self) {
            self.drops.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn core_with_store() -> (Arc<FenceCore<FakeStore>>, Arc<AtomicUsize>) {
        let drops = Arc::new(AtomicUsize::new(0));
        let core = Arc::new(FenceCore::new(0));
        core.install_store(
            FakeStore {
                commits: 0,
                drops: drops.clone(),
            },
            0,
        );
        (core, drops)
    }

    /// A commit: the gate (the fence flag) is checked by `with_store` under the slot; the
    /// sequence is acknowledged while the slot is held.
    fn commit(core: &FenceCore<FakeStore>) -> Result<u64, Access<()>> {
        core.with_store(
            || panic!("no deferred store here"),
            |c, s| {
                s.commits += 1;
                c.acknowledge(s.commits);
                Ok(s.commits)
            },
        )
    }

    /// Two fences race: exactly one wins, its reason is the one kept, and an observer that
    /// sees the flag always finds a reason.
    #[test]
    fn one_fence_wins_and_whoever_sees_the_flag_finds_its_reason() {
        loom::model(|| {
            let core: Arc<FenceCore<FakeStore>> = Arc::new(FenceCore::new(0));
            let (a, b) = (core.clone(), core.clone());
            let ta = thread::spawn(move || a.fence("a".into()));
            let tb = thread::spawn(move || b.fence("b".into()));
            if core.is_fenced() {
                assert!(core.reason().is_some(), "fenced without a reason");
            }
            let (wa, wb) = (ta.join().unwrap(), tb.join().unwrap());
            assert!(wa ^ wb, "exactly one fence wins");
            let winner = if wa { "a" } else { "b" };
            assert_eq!(core.reason().as_deref(), Some(winner));
        });
    }

    /// Two heartbeats finish in either order: the beat ends at the later start, so a slow
    /// old heartbeat never postpones the self-fence deadline.
    #[test]
    fn racing_heartbeats_never_move_the_beat_back() {
        loom::model(|| {
            let core: Arc<FenceCore<FakeStore>> = Arc::new(FenceCore::new(5));
            let (a, b) = (core.clone(), core.clone());
            let ta = thread::spawn(move || a.note_beat(10));
            let tb = thread::spawn(move || b.note_beat(20));
            let seen = core.beat_ns();
            assert!([5, 10, 20].contains(&seen));
            ta.join().unwrap();
            tb.join().unwrap();
            assert_eq!(core.beat_ns(), 20);
        });
    }

    /// Commits race the release barrier and a heartbeat: the sealed head is exactly the
    /// number of acknowledged commits (none lands after the barrier), every commit after
    /// it is refused as closed, the store is dropped once, and a heartbeat that starts
    /// after a commit was acknowledged reports at least its sequence.
    #[test]
    fn no_commit_after_the_release_barrier_and_heartbeats_cover_acknowledged_commits() {
        loom::model(|| {
            let (core, drops) = core_with_store();
            let acked = Arc::new(AtomicU64::new(0));
            let (c1, a1) = (core.clone(), acked.clone());
            let committer = thread::spawn(move || {
                let mut ok = 0;
                for _ in 0..2 {
                    match commit(&c1) {
                        Ok(seq) => {
                            ok += 1;
                            a1.store(seq, Ordering::SeqCst);
                        }
                        Err(Access::Closed) => {}
                        Err(other) => panic!("unexpected {other:?}"),
                    }
                }
                ok
            });
            let (c2, a2) = (core.clone(), acked.clone());
            let heartbeat = thread::spawn(move || {
                let before = a2.load(Ordering::SeqCst);
                if let Some(head) = c2.reported_head() {
                    assert!(
                        head >= before,
                        "beat reports {head} < acknowledged {before}"
                    );
                }
            });
            let sealed = match core.take_store() {
                Taken::Open(s) => Some(s.commits),
                Taken::Deferred | Taken::Empty => None,
            };
            let ok = committer.join().unwrap();
            heartbeat.join().unwrap();
            assert_eq!(sealed, Some(ok), "a commit landed after the barrier");
            assert_eq!(drops.load(Ordering::SeqCst), 1);
            assert!(matches!(commit(&core), Err(Access::Closed)));
        });
    }

    /// The system's processes in the spawn hand-off model: alive, and running its
    /// program (continued past the gate).
    #[derive(Default)]
    struct Kernel {
        procs: Mutex<Vec<(u32, bool, bool)>>,
    }

    /// Tracking over the fake kernel with `procs::Tracked`'s rule: a recorded group
    /// missing from the snapshot is forgotten.
    struct FakeTracked {
        kernel: Arc<Kernel>,
        groups: Vec<u32>,
    }

    impl Tracking for FakeTracked {
        type Scan = Vec<(u32, bool, bool)>;
        fn scan(&self) -> Self::Scan {
            lock(&self.kernel.procs).clone()
        }
        fn refresh_alive(&mut self, scan: &Self::Scan) -> bool {
            self.groups.retain(|g| scan.iter().any(|p| p.0 == *g));
            scan.iter().any(|p| p.1 && self.groups.contains(&p.0))
        }
        fn kill_all(&mut self, _scan: &Self::Scan) {
            for p in lock(&self.kernel.procs).iter_mut() {
                if self.groups.contains(&p.0) {
                    p.1 = false;
                }
            }
        }
    }

    /// A spawn (start stopped and tracked → gate: run only if live) races a fence and the
    /// watchdog's ticks: when the watchdog confirms the kill, no command is running its
    /// program, and at the end nothing is alive. With the snapshot taken outside the
    /// tracking lock this fails: the group added in between is forgotten.
    #[test]
    fn the_kill_hand_off_leaves_no_command_running_once_confirmed() {
        loom::model(|| {
            let core: Arc<FenceCore<FakeStore>> = Arc::new(FenceCore::new(0));
            let kernel = Arc::new(Kernel::default());
            let tracked = Arc::new(Mutex::new(FakeTracked {
                kernel: kernel.clone(),
                groups: Vec::new(),
            }));
            let (c, k, t) = (core.clone(), kernel.clone(), tracked.clone());
            let spawner = thread::spawn(move || {
                if c.is_fenced() {
                    return;
                }
                let pid = start_tracked(&t, |t| {
                    lock(&k.procs).push((7, true, false));
                    t.groups.push(7);
                    Ok::<u32, ()>(7)
                })
                .unwrap();
                let live = if c.is_fenced() { Err(()) } else { Ok(()) };
                let set = |alive: bool, running: bool| {
                    for p in lock(&k.procs).iter_mut().filter(|p| p.0 == pid) {
                        // SIGCONT does not revive a killed process.
                        p.2 = running && p.1;
                        p.1 = alive && p.1;
                    }
                };
                let _ = gate(live, || set(true, true), || set(false, false));
            });
            // The tick before the fence: the watchdog keeps learning the commands.
            assert_eq!(fence_tick(&core, &tracked), Tick::Live);
            core.fence("lapsed".into());
            loop {
                match fence_tick(&core, &tracked) {
                    Tick::Confirmed => {
                        let running = lock(&kernel.procs).iter().any(|p| p.1 && p.2);
                        assert!(!running, "confirmed while a command runs its program");
                        break;
                    }
                    Tick::Killing => thread::yield_now(),
                    Tick::Live => unreachable!("fenced"),
                }
            }
            spawner.join().unwrap();
            assert!(
                lock(&kernel.procs).iter().all(|p| !p.1),
                "a command outlived the fence"
            );
        });
    }

    /// A release (check → barrier → gate → seal) races a fence (flag → drop the store if
    /// free): it seals only if the gate saw no fence, it reports the fence otherwise, and
    /// the store is dropped exactly once whoever gets it.
    #[test]
    fn a_release_racing_a_fence_seals_only_unfenced_and_the_store_goes_once() {
        loom::model(|| {
            let (core, drops) = core_with_store();
            let w = core.clone();
            let watchdog = thread::spawn(move || {
                w.fence("lapsed".into());
                w.drop_store_if_free();
            });
            // The release (the order of `Run::release`).
            let sealed = if core.is_fenced() {
                None
            } else {
                match core.take_store() {
                    // The store's commit gate runs first in `Store::seal`.
                    Taken::Open(s) if !core.is_fenced() => Some(s.commits),
                    _ => None,
                }
            };
            watchdog.join().unwrap();
            // Nobody kept it and nobody dropped it twice (checked before anything else
            // could take a leftover out of the slot).
            assert_eq!(drops.load(Ordering::SeqCst), 1, "the store is dropped once");
            assert!(
                matches!(core.take_store(), Taken::Empty),
                "no store left behind"
            );
            assert!(core.is_fenced());
            assert!(matches!(commit(&core), Err(Access::Fenced)));
            if let Some(head) = sealed {
                assert_eq!(head, 0);
            }
        });
    }

    /// A deferred store (issue #33): two commits race the release barrier and a fence.
    /// The store is opened at most once, never after the fence was seen, and dropped
    /// exactly once if it was opened; a barrier that finds it still deferred saw no
    /// commit succeed (so carrying the chain's seal forward is truthful); a heartbeat
    /// reports at least every acknowledged commit.
    #[test]
    fn a_deferred_store_opens_once_never_after_the_fence_and_the_barrier_sees_every_commit() {
        loom::model(|| {
            let core: Arc<FenceCore<FakeStore>> = Arc::new(FenceCore::new(0));
            let drops = Arc::new(AtomicUsize::new(0));
            let opens = Arc::new(AtomicUsize::new(0));
            core.defer_store(0);
            let acked = Arc::new(AtomicU64::new(0));
            let commit_lazily = {
                let (drops, opens) = (drops.clone(), opens.clone());
                move |core: &FenceCore<FakeStore>| -> Result<u64, Access<()>> {
                    core.with_store(
                        || {
                            opens.fetch_add(1, Ordering::SeqCst);
                            Ok((
                                FakeStore {
                                    commits: 0,
                                    drops: drops.clone(),
                                },
                                0,
                            ))
                        },
                        |c, s| {
                            s.commits += 1;
                            c.acknowledge(s.commits);
                            Ok(s.commits)
                        },
                    )
                }
            };
            let (c1, a1, k1) = (core.clone(), acked.clone(), commit_lazily.clone());
            let committer = thread::spawn(move || {
                let mut ok = 0;
                for _ in 0..2 {
                    match k1(&c1) {
                        Ok(seq) => {
                            ok += 1;
                            a1.store(seq, Ordering::SeqCst);
                            if let Some(head) = c1.reported_head() {
                                assert!(head >= seq, "beat reports {head} < acknowledged {seq}");
                            }
                        }
                        Err(Access::Closed | Access::Fenced) => {}
                        Err(other) => panic!("unexpected {other:?}"),
                    }
                }
                ok
            });
            let w = core.clone();
            let watchdog = thread::spawn(move || {
                w.fence("lapsed".into());
                w.drop_store_if_free();
            });
            let taken = core.take_store();
            let ok = committer.join().unwrap();
            watchdog.join().unwrap();
            let opened = opens.load(Ordering::SeqCst);
            assert!(opened <= 1, "opened {opened} times");
            match taken {
                Taken::Deferred => {
                    assert_eq!(ok, 0, "a commit succeeded but the barrier saw none");
                    assert_eq!(opened, 0);
                }
                Taken::Open(s) => {
                    assert_eq!(s.commits, ok, "a commit landed after the barrier");
                    drop(s);
                }
                Taken::Empty => assert!(core.is_fenced(), "emptied without a fence"),
            }
            assert_eq!(
                drops.load(Ordering::SeqCst),
                opened,
                "an opened store leaked"
            );
            assert!(matches!(commit_lazily(&core), Err(Access::Fenced)));
            assert_eq!(
                opens.load(Ordering::SeqCst),
                opened,
                "opened after the fence"
            );
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A lapse names only a failure that no successful heartbeat followed: an old failure
    /// is not why a later lapse (say, a stopped owner) happened.
    #[test]
    fn only_a_failure_after_the_last_successful_beat_is_a_lapse_cause() {
        let core: FenceCore<()> = FenceCore::new(10);
        assert_eq!(core.failure_since_beat(), None);
        let f = core.note_failure(20, Code::IoError, "disk".into());
        assert_eq!(f.failures, 1);
        assert_eq!(core.failure_since_beat(), Some(f));
        core.note_beat(30);
        assert_eq!(core.failure_since_beat(), None, "a beat succeeded since");
        assert_eq!(core.last_failure().map(|f| f.failures), Some(1));
        let g = core.note_failure(40, Code::RunLayoutInvalid, "stray".into());
        assert_eq!(
            (g.failures, core.failure_since_beat()),
            (2, Some(g.clone()))
        );
    }
}
