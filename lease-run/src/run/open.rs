//! Open, in order, each step timed, and its undo.

use super::heartbeat::heartbeat_loop;
use super::reap::{reap_cgroups, reap_or_refuse};
use super::status::{failure_detail, record_fallback, status_write, write_status_blocking};
use super::step::{blocking, timed};
use super::watchdog::watchdog;
use super::{
    FenceState, FinalStatus, GuardSlot, OpenOptions, Run, Shared, StepName, WATCHDOG_TICK,
    background,
};
use crate::admission::{Action as Intent, preflight_lease};
use crate::clock::boottime_ns;
use crate::clock::wall_now;
use crate::error::RunError;
use crate::fence::{FenceCore, Taken};
use crate::procs::Tracked;
use crate::sync::lock_std;
use lease_core::LeaseOps;
use lease_core::ops::{OwnedLease, ReleaseParams};
use lease_core::{RunId, RunState, RunStatus, Seal};
use lease_fs::lock::OwnerLock;
use lease_fs::{FsError, ProcLiveness, RealFs, RunDir, run_id_of};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

mod claim;
mod state;
mod store;

use claim::*;
use state::*;
pub(super) use store::open_deferred;
use store::*;

impl Run {
    /// Open (claim) the run at the absolute `path`, in this order, each step timed:
    /// owner-lock → read-status → claim → run.json → heartbeat → layout → commands →
    /// store → seal. A failure undoes what was done (see the crate docs).
    ///
    /// **Cancellation-safe.** The steps run in a task of their own, so dropping this future
    /// (a `timeout`, a `select!`) never stops one half-way: the task notices between steps
    /// and undoes the open (tasks stopped, `run.json` `failed`, the lease released, the
    /// owner lock dropped), or, if the open had already finished, releases the run it
    /// opened as `failed`. Until then the path counts as busy: a later `Run::open` of it in
    /// this process (and [`Run::settle`]) waits for that hand-back first. Needs a tokio
    /// runtime that keeps running: a runtime shut down meanwhile ends the task like a
    /// crash ends a process (see the crate docs, "Cancellation").
    pub async fn open(path: &Path, opts: OpenOptions) -> Result<Run, RunError> {
        opts.validate(path)?;
        // Our own hand-back of this run (a cancelled open, a dropped or cancelled release)
        // finishes first: the same process never races itself for the owner lock.
        background::settle(path).await;
        let pending = background::Pending::start(path);
        let (tx, rx) = tokio::sync::oneshot::channel::<Result<Run, RunError>>();
        let owned = path.to_path_buf();
        let task = tokio::spawn(async move {
            let _pending = pending;
            let r = Run::open_steps(&owned, opts, &|| tx.is_closed()).await;
            if let Err(Ok(run)) = tx.send(r) {
                // Opened, but nobody is waiting for it any more: hand it back released.
                let path = run.path.clone();
                let released = run
                    .release_with(
                        FinalStatus::Failed {
                            detail: CANCELLED_AFTER_OPEN.into(),
                        },
                        false,
                    )
                    .await;
                if let Err(e) = released {
                    tracing::warn!(run = %path.display(), error = %e, "the release of a run whose open was cancelled failed");
                }
            }
        });
        match rx.await {
            Ok(r) => r,
            // The task ended without an answer: it panicked, or the runtime is shutting down.
            Err(_) => Err(match task.await {
                Err(e) => RunError::from_join(&format!("run {}: the open", path.display()), &e),
                Ok(()) => RunError::Io(format!(
                    "run {}: the open was stopped by the runtime shutting down",
                    path.display()
                )),
            }),
        }
    }

    /// Wait until no background step of this process is working on the run at `path`: the
    /// hand-back of a cancelled [`Run::open`], a cancelled [`Run::release`] finishing, the
    /// release of a dropped [`Run`]. [`Run::open`] does this itself; call it to observe the
    /// run (`status`, another process) only once the hand-back is done.
    pub async fn settle(path: &Path) {
        background::settle(path).await;
    }

    /// The steps of [`Run::open`]; `cancelled` is asked between steps (the caller stopped
    /// waiting): then the open is undone as a failure would be.
    async fn open_steps(
        path: &Path,
        opts: OpenOptions,
        cancelled: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<Run, RunError> {
        // A held folder names itself (`.`, `…/..` by the kernel's name of the held root).
        let run_id = match &opts.folder {
            Some(held) => lease_fs::run_id_held(path, held)?,
            None => run_id_of(path)?,
        };
        let cx = Ctx {
            path,
            name: path.display().to_string(),
            opts: &opts,
        };

        let mut st = owner_lock(&cx, run_id).await?;
        // Steps 2 to 9; a failure (or a cancellation, seen between steps) is undone.
        let go = |step: StepName| {
            if cancelled() {
                Err(Halt::Cancelled(step))
            } else {
                Ok(())
            }
        };
        let steps = async {
            go(StepName::OwnerLock)?;
            read_status(&mut st, &cx).await?;
            go(StepName::ReadStatus)?;
            let (lease, claim_started) = claim(&mut st, &cx).await?;
            let shared = share(&mut st, &cx, &lease, claim_started)?;
            go(StepName::Claim)?;
            run_json(&mut st, &cx, &lease, &shared).await?;
            go(StepName::RunJson)?;
            heartbeat(&mut st, &cx, &lease, &shared).await?;
            go(StepName::Heartbeat)?;
            layout(&st, &cx).await?;
            go(StepName::Layout)?;
            commands(&st, &cx, &lease, &shared).await?;
            go(StepName::Commands)?;
            let opened = store(&st, &cx, &lease).await?;
            go(StepName::Store)?;
            seal(&cx, &lease, &shared, st.auth.clone(), opened).await?;
            Ok::<(), Halt>(())
        };
        match steps.await {
            Ok(()) => {}
            Err(Halt::Failed(e)) => {
                Run::undo(st, &opts, failure_detail(&e)).await;
                return Err(e);
            }
            Err(Halt::Cancelled(after)) => {
                let detail = format!(
                    "the open was cancelled (its caller stopped waiting) after its {} step; it was undone",
                    after.as_str()
                );
                tracing::info!(run = %cx.name, step = after.as_str(), "open cancelled: undoing it");
                Run::undo(st, &opts, detail).await;
                return Err(RunError::Io(format!(
                    "run {}: the open was cancelled",
                    cx.name
                )));
            }
        }
        let (Some(lease), Some(shared), Some(current)) = (st.lease, st.shared, st.current) else {
            return Err(RunError::Io("open finished without a lease".into()));
        };
        if let Some((p, _)) = &st.commands_after {
            tracing::warn!(
                run = %cx.name,
                replaced = p.generation.get(),
                owner = %p.owner_id,
                wait_ms = p.self_fence_after_ms,
                "the takeover may have replaced a live owner (its heartbeat changed after the last look): commands wait for its self-fence"
            );
        }
        Ok(Run {
            commands_after: st.commands_after.map(|(_, at)| at),
            dir: st.dir,
            auth: st.auth,
            lease,
            lock: st.lock,
            shared,
            tasks: st.tasks,
            current: Mutex::new(current),
            opts,
            path: path.to_path_buf(),
            armed: true,
        })
    }

    /// Undo a failed open, so that a failure after the claim hands the run back (the next
    /// `status` says free, the next open proceeds). Stop the tasks; then, if a lease was
    /// claimed and the run is not fenced (fenced: the lease is someone else's now, nothing
    /// is written), in this order:
    ///
    /// 1. the seal: the store's own if it was opened (`Store::seal`), else the seal the
    ///    chain required of this owner, re-issued stamped with this generation (which
    ///    committed nothing), so a failed open never drops the store's identity binding;
    /// 2. `run.json` `failed`, `detail` = the error's code and message (atomic replace:
    ///    temp, fsync, rename, fsync of the folder), if the shared state exists; a failure
    ///    here is logged and does **not** stop step 3 (a run.json that cannot be written,
    ///    e.g. over a stray, must not keep the run claimed by an owner that is gone);
    /// 3. release the lease with that seal (the release reads no heartbeat, so a stray
    ///    named like this generation's beat cannot block it).
    ///
    /// A crash between 2 and 3 leaves `run.json` `failed` and an active epoch whose owner
    /// is gone: `status` says dead (or stale), and `retire` or `run --retire-dead` frees it.
    /// Then the cgroup (empty: no command ran) is removed and the owner lock dropped. Best
    /// effort, under one step deadline.
    async fn undo(mut st: Opening, opts: &OpenOptions, detail: String) {
        for t in st.tasks.drain(..) {
            t.abort();
        }
        let name = st.dir.root().display().to_string();
        let shared = st.shared.clone();
        if let Some(lease) = st.lease.clone() {
            let fenced = shared.as_ref().is_some_and(|sh| sh.is_fenced());
            if !fenced {
                // A deferred store was never opened: the carried seal is its seal.
                let store = shared.as_ref().and_then(|sh| match sh.core.take_store() {
                    Taken::Open(s) => Some(s),
                    Taken::Deferred | Taken::Empty => None,
                });
                let carried = lock_std(&st.carry_seal).clone().map(|s| Seal {
                    generation: lease.generation,
                    ..s
                });
                let current = st.current.clone();
                let (dir, auth, sh, l, n) = (
                    st.dir.clone(),
                    st.auth.clone(),
                    shared.clone(),
                    lease.clone(),
                    name.clone(),
                );
                let r = blocking(
                    &name,
                    StepName::FinalStatus,
                    opts.step_deadline,
                    move || {
                        let now = wall_now()?;
                        let mut rec = current.unwrap_or(record_fallback(&l, now));
                        rec.status = RunState::Failed;
                        rec.detail = Some(detail);
                        rec.wake_at = None;
                        rec.updated_at = now;
                        // A view of the engine's store (issue #32) is closed, not sealed.
                        let in_engine = sh.as_ref().is_some_and(|sh| sh.engine.get().is_some());
                        let (store, carried) = match store {
                            Some(v) if in_engine => {
                                if let Err(e) = v.close() {
                                    tracing::warn!(run = %n, error = %e, "undo: closing the store's view failed");
                                }
                                (None, None)
                            }
                            other => (other, carried),
                        };
                        let seal = match store.map(|s| s.seal(l.generation)) {
                            Some(Ok(s)) => Some(s),
                            Some(Err(e)) => {
                                tracing::warn!(run = %n, error = %e, "undo: sealing the store failed; the seal the chain required is re-issued");
                                carried
                            }
                            None => carried,
                        };
                        rec.sealed_sequence = seal.as_ref().map(|s| s.sequence);
                        if let Some(sh) = &sh {
                            if let Err(e) = write_status_blocking(&dir, &*auth, sh, &l, &rec) {
                                tracing::warn!(run = %n, error = %e, "undo: run.json not written; releasing all the same");
                            }
                        }
                        auth.release(ReleaseParams {
                            lease: l.clone(),
                            now: wall_now()?,
                            seal,
                        })?;
                        Ok(())
                    },
                )
                .await;
                if let Err(e) = r {
                    tracing::warn!(run = %name, error = %e, "undo of a failed open incomplete: the lease was not released");
                }
            }
        }
        if let Some(shared) = shared {
            // No command ran yet: the cgroup (if any) is empty and can go.
            if let Some(cg) = shared.tracked().cgroup.clone() {
                crate::cgroup::Cgroup::at(cg).remove();
            }
            // The watchdog ends once nothing is tracked (no command ran yet).
            shared.stop.store(true, Ordering::SeqCst);
        }
        // Refused before the claim: nothing of this open may stay, not even the
        // `owner.lock` its lock step created (issue #28); removed while still held
        // (`OwnerLock::release_removing_created`). After a claim the file stays (an owner
        // has run here).
        match (st.lock.take(), st.lease.is_none()) {
            (Some(lock), true) => {
                if let Err(e) = lock.release_removing_created(&st.root) {
                    tracing::warn!(run = %name, error = %e, "undo: the owner.lock this open created was not removed");
                }
            }
            (lock, _) => drop(lock),
        }
    }
}

/// (1) owner lock (and, with etcd, the connection to the cluster).
async fn owner_lock(cx: &Ctx<'_>, run_id: RunId) -> Result<Opening, RunError> {
    let (path, name, opts) = (cx.path, &cx.name, cx.opts);
    let cb = &opts.on_step;
    let deadline = opts.step_deadline;
    let (p, create, lock_timeout) = (path.to_path_buf(), opts.create, opts.lock_timeout);
    let held = opts.folder.clone();
    let (rid, nm) = (run_id.clone(), name.clone());
    let (authority, fence_after) = (opts.authority.clone(), opts.policy.self_fence_after());
    let (dir, lock, auth, root) = timed(
        cb,
        StepName::OwnerLock,
        blocking(
            name,
            StepName::OwnerLock,
            deadline + lock_timeout,
            move || {
                let io = |e: std::io::Error| FsError::io(rid.as_str(), "open run folder", &nm, e);
                // The folder is opened once: the caller's held root (a duplicate of its
                // descriptor: no second lookup of the path), else `path` itself
                // (`O_NOFOLLOW|O_DIRECTORY`). The owner lock, the records and the store
                // are all reached beneath this descriptor.
                let fs = match &held {
                    Some(f) => f.try_clone(),
                    None if create => RealFs::create(&p),
                    None => RealFs::open(&p),
                };
                let fs = Arc::new(fs.map_err(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        RunError::Fs(FsError::RunNotFound { path: nm.clone() })
                    } else {
                        io(e).into()
                    }
                })?);
                let end = Instant::now() + lock_timeout;
                let lock = loop {
                    if let Some(l) = OwnerLock::try_acquire_in(&fs).map_err(io)? {
                        break l;
                    }
                    if Instant::now() >= end {
                        return Err(RunError::OwnerLockHeld { run: nm });
                    }
                    std::thread::sleep(Duration::from_millis(10));
                };
                let dir = Arc::new(RunDir::with_fs(
                    fs.clone(),
                    rid.clone(),
                    &p,
                    Arc::new(ProcLiveness::new(&p).holding_lock()),
                ));
                let auth = authority.connect(dir.clone(), rid, deadline, fence_after)?;
                Ok((dir, lock, auth, fs))
            },
        ),
    )
    .await?;

    Ok(Opening {
        dir,
        root,
        auth,
        lock: Some(lock),
        lease: None,
        shared: None,
        tasks: Vec::new(),
        current: None,
        carry_seal: Arc::new(Mutex::new(None)),
        verified: false,
        mark_due: None,
        commands_after: None,
    })
}

/// (2) previous run.json (an invalid one is refused and never overwritten), then the one
/// admission rule ([`preflight_lease`], [`crate::admission::judge`]): rollback evidence
/// (run.json, the newest event or the store ahead of the chain); unless the run is held
/// and will not be replaced, the folder ([`crate::preflight`]: the layout, every command record),
/// the whole log and both chains as `runlease verify` checks them, no heartbeat, cutoff or
/// command record above the head, the store the chain names present, and the store
/// against the seal and floor (read without writing, under the owner lock). All of it
/// reads only: a refusal here leaves the run exactly as it was (only the owner lock is let
/// go by the undo), and no generation is used up.
async fn read_status(st: &mut Opening, cx: &Ctx<'_>) -> Result<(), RunError> {
    let (name, cb, deadline) = (&cx.name, &cx.opts.on_step, cx.opts.step_deadline);
    let (dir, auth, st_root) = (st.dir.clone(), st.auth.clone(), st.root.clone());
    let intent = if cx.opts.takeover.is_some() {
        Intent::Takeover
    } else if cx.opts.retire_dead {
        Intent::ClaimOrRetireDead
    } else {
        Intent::Claim
    };
    let checked = timed(cb, StepName::ReadStatus, async move {
        let (d, a) = (dir.clone(), auth.clone());
        let (previous, events) = blocking(name, StepName::ReadStatus, deadline, move || {
            let previous = crate::admission::read_run_json_of(&*a, &d)?;
            // Where the log ends (a few `Exists` probes from the newest mark), to bound
            // the walk below: at most that many events (a log with a recent mark walks few).
            let events = a.log_end()?;
            Ok((previous, events))
        })
        .await?;
        // The walk of the log is O(n): its deadline grows by 1 ms per event (some 40 to 75
        // times what one event costs on the reference VM, docs/BENCHMARKS.md), so a long
        // log is never refused as a hung disk.
        let walk = deadline + Duration::from_millis(events);
        let prev = previous;
        let root = st_root;
        let checked = blocking(name, StepName::ReadStatus, walk, move || {
            preflight_lease(&*auth, &dir, &root, &prev, intent)
        })
        .await?;
        Ok(checked)
    })
    .await?;
    st.verified = checked.verified;
    st.mark_due = checked.mark_due;
    // Until the claim reads its own epoch: the seal a claim of this free head inherits.
    if let Some(h) = checked.view.head.as_ref().filter(|h| !h.is_active()) {
        *lock_std(&st.carry_seal) = h.epoch.seal.clone();
    }
    Ok(())
}

/// The state the run's tasks share (its first beat: the start of the claim).
fn share(
    st: &mut Opening,
    cx: &Ctx<'_>,
    lease: &OwnedLease,
    claim_started: u64,
) -> Result<Arc<Shared>, RunError> {
    let (name, opts) = (&cx.name, cx.opts);
    let (fence_tx, _) = watch::channel(FenceState::Live);
    let incarnation = crate::clock::random_hex128()?;
    let shared = Arc::new(Shared {
        run: name.clone(),
        policy: opts.policy,
        core: FenceCore::new(claim_started),
        stop: AtomicBool::new(false),
        beats_suspended: AtomicBool::new(false),
        tracked: Mutex::new(Tracked {
            secret: Some(incarnation.clone()),
            ..Tracked::default()
        }),
        fence_tx,
        exit_on_fence: opts.exit_on_fence,
        generation: lease.generation,
        incarnation,
        beat_count: tokio::sync::Mutex::new(1),
        release_request: tokio::sync::Notify::new(),
        store_socket: std::sync::OnceLock::new(),
        engine: std::sync::OnceLock::new(),
        deferred: std::sync::OnceLock::new(),
        guard: Mutex::new(GuardSlot {
            program: opts.guard.clone(),
            ..GuardSlot::default()
        }),
    });
    st.shared = Some(shared.clone());
    Ok(shared)
}

/// (4) run.json: running, as the new generation, with no sealed sequence (the seal of the
/// last clean release is the chain's: the store check reads it there). Written once per
/// open: until issue #19 a second durable write after the seal check only cleared the
/// sealed sequence this one had carried over, two fsyncs for an advisory field.
async fn run_json(
    st: &mut Opening,
    cx: &Ctx<'_>,
    lease: &OwnedLease,
    shared: &Arc<Shared>,
) -> Result<(), RunError> {
    let (name, cb, deadline) = (&cx.name, &cx.opts.on_step, cx.opts.step_deadline);
    let now = wall_now()?;
    let record = RunStatus {
        heartbeat_at: Some(now),
        ..record_fallback(lease, now)
    };
    let write = status_write(&st.dir, &st.auth, shared, lease, &record);
    timed(
        cb,
        StepName::RunJson,
        blocking(name, StepName::RunJson, deadline, write),
    )
    .await?;
    st.current = Some(record);
    Ok(())
}

/// (5) heartbeat task, self-fence timer task, watchdog OS thread.
async fn heartbeat(
    st: &mut Opening,
    cx: &Ctx<'_>,
    lease: &OwnedLease,
    shared: &Arc<Shared>,
) -> Result<(), RunError> {
    let (path, name, opts) = (cx.path, &cx.name, cx.opts);
    let cb = &opts.on_step;
    let (dir, sh, l) = (st.auth.clone(), shared.clone(), lease.clone());
    let subreaper = opts.subreaper;
    let serve_store = opts.serve_store;
    if opts.cgroup {
        let key = crate::cgroup::run_key(path, lease.run_id.as_str());
        match crate::cgroup::Cgroup::create(&key, lease.generation.get()) {
            // No warm-up migration any more (issue #33): it took the kernel's cgroup
            // threadgroup lock for writing, and every fork waited for it, the gate's
            // `clone3` into this cgroup included (`crate::clone_into`).
            Ok(cg) => shared.tracked().cgroup = Some(cg.path().to_path_buf()),
            Err(reason) => tracing::info!(
                run = %name,
                %reason,
                "no cgroup v2 subtree: commands are tracked by group, session and /proc scans"
            ),
        }
    }
    let tasks = timed(cb, StepName::Heartbeat, async move {
        if subreaper {
            if let Err(e) = rustix::process::set_child_subreaper(Some(rustix::process::getpid())) {
                tracing::warn!(error = %e, "cannot become a child subreaper");
            }
        }
        // The store server first: a failure to bind fails the open before any task runs.
        let server = if serve_store {
            Some(super::serve::start(
                dir.clone(),
                sh.clone(),
                l.clone(),
                path,
            )?)
        } else {
            None
        };
        let hb = tokio::spawn(heartbeat_loop(dir, sh.clone(), l));
        let sh2 = sh.clone();
        let timer = tokio::spawn(async move {
            let mut tick = tokio::time::interval(WATCHDOG_TICK);
            loop {
                tick.tick().await;
                if sh2.is_fenced() {
                    return;
                }
                if sh2.lapsed(boottime_ns()) {
                    sh2.fence(sh2.lapse_reason());
                    return;
                }
            }
        });
        std::thread::Builder::new()
            .name("lease-run-watchdog".into())
            .spawn(move || watchdog(sh))
            .map_err(|e| RunError::os("cannot start the watchdog thread", e))?;
        Ok([hb, timer].into_iter().chain(server).collect())
    })
    .await?;
    st.tasks = tasks;
    Ok(())
}

/// (6) layout.
async fn layout(st: &Opening, cx: &Ctx<'_>) -> Result<(), RunError> {
    let (name, cb, deadline) = (&cx.name, &cx.opts.on_step, cx.opts.step_deadline);
    let dir = st.dir.clone();
    timed(
        cb,
        StepName::Layout,
        blocking(name, StepName::Layout, deadline, move || {
            for d in ["store", "work", "tmp"] {
                dir.fs()
                    .ensure_dir(d)
                    .map_err(|e| FsError::io(dir.run_id().as_str(), "mkdir", d, e))?;
            }
            Ok(())
        }),
    )
    .await?;
    Ok(())
}

/// (7) reap or refuse the previous incarnations' commands.
async fn commands(
    st: &Opening,
    cx: &Ctx<'_>,
    lease: &OwnedLease,
    shared: &Arc<Shared>,
) -> Result<(), RunError> {
    let (path, name, opts) = (cx.path, &cx.name, cx.opts);
    let (cb, deadline) = (&opts.on_step, opts.step_deadline);
    let dir = st.dir.clone();
    let (gen_, grace, kill_wait) = (lease.generation, opts.term_grace, opts.kill_wait);
    let key = crate::cgroup::run_key(path, lease.run_id.as_str());
    timed(
        cb,
        StepName::Commands,
        blocking(
            name,
            StepName::Commands,
            deadline + 2 * (grace + kill_wait),
            move || {
                // The cgroups first: their identities are in the records that reaping
                // removes (issue #29).
                reap_cgroups(&dir, &key, gen_, grace, kill_wait)?;
                reap_or_refuse(&dir, gen_, grace, kill_wait)
            },
        ),
    )
    .await?;
    shared.check_live()?;
    Ok(())
}
