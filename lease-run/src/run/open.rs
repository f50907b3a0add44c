//! Open, in order, each step timed, and its undo.

use super::heartbeat::heartbeat_loop;
use super::reap::{reap_cgroups, reap_or_refuse};
use super::status::{failure_detail, record_fallback, write_status_blocking};
use super::step::{blocking, timed};
use super::watchdog::watchdog;
use super::{
    FenceState, FinalStatus, GuardSlot, OpenOptions, Run, Shared, StepName, WATCHDOG_TICK,
    background,
};
use crate::admission::{Action as Intent, preflight_lease};
use crate::authority::LeaseAuthority;
use crate::clock::boottime_ns;
use crate::clock::{new_owner_id, wall_now};
use crate::error::RunError;
use crate::fence::{FenceCore, Taken};
use crate::procs::Tracked;
use crate::sync::lock_std;
use lease_core::Code;
use lease_core::LeaseOps;
use lease_core::ops::{
    ClaimParams, Expectation, OwnedLease, ReleaseParams, RetireParams, Status, TakeoverParams,
    TakeoverTrigger,
};
use lease_core::{Generation, Identity, LeaseError, RunId, RunState, RunStatus, Seal};
use lease_fs::lock::OwnerLock;
use lease_fs::{FsError, ProcLiveness, RealFs, RunDir, run_id_of, this_holder};
use lease_sqlite::{Expected, OpenedStore, Store, StoreError};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Why the steps of an open stopped early.
enum Halt {
    /// A step failed.
    Failed(RunError),
    /// The caller stopped waiting; seen after this step.
    Cancelled(StepName),
}

impl From<RunError> for Halt {
    fn from(e: RunError) -> Halt {
        Halt::Failed(e)
    }
}

/// The `failed` detail of a run whose open finished after its caller stopped waiting.
const CANCELLED_AFTER_OPEN: &str =
    "the open was cancelled (its caller stopped waiting) after it finished; the run was released";

/// What open has done so far, for the undo.
struct Opening {
    dir: Arc<RunDir>,
    /// The held run root (the store folder is opened beneath it).
    root: Arc<RealFs>,
    auth: Arc<dyn LeaseAuthority>,
    lock: Option<OwnerLock>,
    lease: Option<OwnedLease>,
    shared: Option<Arc<Shared>>,
    tasks: Vec<JoinHandle<()>>,
    current: Option<RunStatus>,
    /// The seal the chain requires of this owner (the replaced epoch's), known from the
    /// claim on (and read again at the `store` step): re-issued by the undo of an open
    /// that fails before the store is live, so the next opener still checks the store's
    /// identity.
    carry_seal: Arc<Mutex<Option<Seal>>>,
    /// The preflight verified the log and both chains (so a replacement in the claim step
    /// need not walk them again).
    verified: bool,
    /// The verified-prefix mark the preflight's tail check made due, left by the claim
    /// step once the claim succeeded (never on a refusal).
    mark_due: Option<(lease_core::Sequence, lease_core::Digest)>,
    /// The takeover of the claim step may have replaced a live owner (OQ-5): commands
    /// wait until `CLOCK_BOOTTIME` reaches this (ns).
    commands_after: Option<(lease_core::ops::Preempted, u64)>,
}

/// What every open step reads: the run folder's path, its name (as messages show it) and
/// the options.
struct Ctx<'a> {
    path: &'a Path,
    name: String,
    opts: &'a OpenOptions,
}

/// The seal and store floor the chain requires of an owner
/// ([`lease_core::seal::requirements`]).
use lease_core::seal::Requirements;

/// The store as the `store` step opened it: a local store with the seal and floor the
/// `seal` step checks it against, or (the store in the engine, issue #32) the view the
/// catch-up brought to the engine's tail, with the log's state.
enum Unchecked {
    Local(OpenedStore, Requirements),
    Engine(Store, Box<crate::engine_store::EngineLog>),
    /// Not opened (issue #33): the chain's seal is the store's, the preflight checked the
    /// store against it, and the first access opens it ([`open_deferred`]).
    Deferred(super::DeferredStore),
}

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

/// (3) claim; or exact takeover of a stale owner; or retire a definitely-dead owner
/// and claim (with etcd, "dead" is judged by the owner's etcd lease).
///
/// Returns the lease and the `CLOCK_BOOTTIME` instant the claim started (the run's first
/// beat). A claim or takeover that fails after its epoch was created (an I/O error at its
/// recheck or finalize) left this owner's epoch at the head: it is found by its owner id
/// and holder (read-only, as ADOPTION would) and kept as the lease, so the undo hands it
/// back instead of leaving an active claim without an owner. Then the seal and floor the
/// chain requires of this owner are read, so an undo from any later step re-issues the
/// seal.
async fn claim(st: &mut Opening, cx: &Ctx<'_>) -> Result<(OwnedLease, u64), RunError> {
    let (name, opts) = (&cx.name, cx.opts);
    let (cb, deadline) = (&opts.on_step, opts.step_deadline);
    let dir = st.auth.clone();
    let (retire_dead, verified) = (opts.retire_dead, st.verified);
    let mark_due = st.mark_due.take();
    let policy = durable_where_needed(dir.as_ref(), opts.policy);
    let takeover = opts.takeover.clone();
    // No watch, no takeover: without one the core refuses (watched 0 ms), writing nothing.
    let trigger = match opts.takeover_watched {
        None => TakeoverTrigger::Operator {
            watched_unchanged_ms: 0,
        },
        Some(d) => TakeoverTrigger::Automatic {
            watched_unchanged_ms: u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
        },
    };
    let carry = st.carry_seal.clone();
    let chosen = opts.owner_id.clone();
    let preempted = Arc::new(Mutex::new(None));
    let preempted_out = preempted.clone();
    let claim_started = boottime_ns();
    let (lease, failed) = timed(
        cb,
        StepName::Claim,
        blocking(name, StepName::Claim, deadline, move || {
            let holder = this_holder()?;
            let owner_id = match chosen {
                Some(id) => id,
                None => new_owner_id()?,
            };
            let attempt = claim_blocking(
                &*dir,
                ClaimAttempt {
                    owner_id: owner_id.clone(),
                    holder: holder.clone(),
                    policy,
                    takeover,
                    trigger,
                    retire_dead,
                    verified,
                },
            );
            let (lease, failed) = match attempt {
                Ok((l, p)) => {
                    *lock_std(&preempted) = p;
                    // The claim succeeded: leave the mark the preflight made due
                    // (PROTOCOL §13.1). Best-effort: a failure costs the next tail check
                    // a longer walk, nothing else.
                    if let (Some((s, h)), Ok(now)) = (mark_due, wall_now()) {
                        if let Err(e) = dir.write_mark(s, h, l.owner_id.clone(), now) {
                            tracing::debug!(error = %e, "the verified-prefix mark was not written");
                        }
                    }
                    (l, None)
                }
                Err(e) => match own_head(&*dir, &owner_id, &holder) {
                    Some(l) => (l, Some(e)),
                    None => return Err(e),
                },
            };
            if let Ok(req) = requirements(&*dir, lease.generation) {
                *lock_std(&carry) = req.seal().cloned();
            }
            Ok((lease, failed))
        }),
    )
    .await?;
    st.lease = Some(lease.clone());
    // OQ-5: the replaced owner, if its beat changed after the takeover's last look, may run
    // on until its self-fence (at most its `self_fence_after` after that beat started, then
    // its commands are killed): this owner's commands start after that, plus our own kill
    // timings as the margin for its kill (its own are not recorded).
    if let Some(p) = lock_std(&preempted_out).take() {
        let wait = std::time::Duration::from_millis(p.self_fence_after_ms)
            + opts.term_grace
            + opts.kill_wait;
        let at = boottime_ns().saturating_add(u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX));
        st.commands_after = Some((p, at));
    }
    match failed {
        None => Ok((lease, claim_started)),
        Some(e) => Err(e),
    }
}

/// What one claim step attempts ([`claim_blocking`]).
struct ClaimAttempt {
    owner_id: Identity,
    holder: lease_core::Holder,
    policy: lease_core::TimingPolicy,
    takeover: Option<Expectation>,
    trigger: TakeoverTrigger,
    retire_dead: bool,
    /// The preflight verified the run already.
    verified: bool,
}

/// The claim step's lease operations (blocking).
fn claim_blocking(
    dir: &dyn LeaseAuthority,
    a: ClaimAttempt,
) -> Result<(OwnedLease, Option<lease_core::ops::Preempted>), RunError> {
    if let Some(expect) = a.takeover.clone() {
        // Replacing an owner finalizes its cutoff over the log and writes on top of the
        // chain: a broken record anywhere refuses it (65, naming the file), as doctor
        // advises ("do not take over"). The preflight verified it (under the owner lock,
        // with the same call) unless told otherwise.
        if !a.verified {
            dir.verify_tail()?;
        }
        return dir.takeover_reporting(TakeoverParams {
            run_id: dir.run_id().clone(),
            owner_id: a.owner_id,
            holder: a.holder,
            policy: a.policy,
            now: wall_now()?,
            expect,
            trigger: a.trigger,
        });
    }
    claim_or_retire(dir, a).map(|l| (l, None))
}

/// The policy the claim records: `policy`, but with durable heartbeats when the run folder
/// is on a file system that may lose unsynced writes while the owner lives (NFS, SMB,
/// FUSE, …; PROTOCOL §5.3). lease-fs makes every beat there durable anyway; recording it
/// in the epoch makes `status` and every reader say so. One warning (the CLI shows it).
fn durable_where_needed(
    dir: &dyn LeaseAuthority,
    policy: lease_core::TimingPolicy,
) -> lease_core::TimingPolicy {
    use lease_core::HeartbeatDurability::{Durable, Local};
    match dir.folder() {
        Some(f) if policy.heartbeat_durability() == Local && f.fs().loses_unsynced_writes() => {
            tracing::warn!(
                run = %f.root().display(),
                "the run folder is on a network or user-space file system, which can lose unsynced writes: heartbeats are durable (fsynced) there"
            );
            policy.with_durability(Durable)
        }
        _ => policy,
    }
}

/// The claim step without a takeover: claim, or retire a dead holder (`retire_dead`).
fn claim_or_retire(dir: &dyn LeaseAuthority, a: ClaimAttempt) -> Result<OwnedLease, RunError> {
    let claim = |owner_id: Identity, holder: lease_core::Holder| -> Result<ClaimParams, RunError> {
        Ok(ClaimParams {
            run_id: dir.run_id().clone(),
            owner_id,
            holder,
            policy: a.policy,
            now: wall_now()?,
            store_floor: None,
        })
    };
    match dir.claim(claim(a.owner_id.clone(), a.holder.clone())?) {
        Ok(l) => Ok(l),
        // Held (76): the status below decides whether the holder is dead.
        Err(e)
            if a.retire_dead
                && matches!(
                    e.code(),
                    Code::RunAlreadyActive
                        | Code::RunStaleRequiresTakeover
                        | Code::RunDeadRequiresRetirement
                        | Code::TakeoverActiveRefused
                        | Code::RetireRefusedNotDead
                ) =>
        {
            let view = dir.status(wall_now()?, true)?;
            match (&view.status, &view.head) {
                (Status::Dead, Some(head)) => {
                    // Verified by the preflight only if it saw the owner dead already.
                    if !a.verified {
                        dir.verify_tail()?;
                    }
                    let retirer = new_owner_id()?;
                    let retired = dir.retire(RetireParams {
                        run_id: dir.run_id().clone(),
                        owner_id: retirer.clone(),
                        holder: a.holder.clone(),
                        policy: a.policy,
                        now: wall_now()?,
                        expect: Some(Expectation::of(head)),
                    })?;
                    // The retirement freed the run as a release does: compact if due
                    // (best-effort, never this open's error; the prune's own order of
                    // writes, PROTOCOL §7.10), so owners that crash and are retired, and
                    // never release, still leave a bounded `lease/`.
                    let _ = crate::compact::after_release(
                        dir,
                        dir.folder(),
                        retired.generation,
                        retirer,
                    );
                    // The first claim was refused: it created nothing under this id.
                    dir.claim(claim(a.owner_id, a.holder)?)
                }
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// The lease of this open's own epoch if it is the active head (`owner_id` and `holder`
/// ours): a claim or takeover that failed after creating it. Read-only; `None` when the
/// head cannot be read or is not ours.
fn own_head(
    dir: &dyn LeaseAuthority,
    owner_id: &Identity,
    holder: &lease_core::Holder,
) -> Option<OwnedLease> {
    let view = dir.status(wall_now().ok()?, false).ok()?;
    let h = view.head?;
    (h.is_active() && h.epoch.owner_id == *owner_id && h.epoch.holder == *holder).then(|| {
        OwnedLease {
            run_id: dir.run_id().clone(),
            generation: h.generation(),
            owner_id: owner_id.clone(),
            holder: holder.clone(),
            policy: h.epoch.policy,
            epoch_hash: h.hash.clone(),
        }
    })
}

/// The seal and floor the chain requires of the owner of generation `g`: from its own
/// epoch and the one its claim replaced ([`lease_core::seal::requirements`]).
fn requirements(dir: &dyn LeaseAuthority, g: Generation) -> Result<Requirements, RunError> {
    let own = dir
        .read_epoch(g)?
        .ok_or_else(|| RunError::Io(format!("epoch {g} vanished right after it was created")))?;
    let replaced = match g.get().checked_sub(1).and_then(Generation::new) {
        Some(prev) => dir.read_epoch(prev)?,
        None => None,
    };
    Ok(Requirements::from_chain(&own, replaced.as_ref()))
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
        run_id: lease.run_id.clone(),
        status: RunState::Running,
        generation: lease.generation,
        sealed_sequence: None,
        wake_at: None,
        holder: Some(lease.holder.clone()),
        heartbeat_at: Some(now),
        updated_at: now,
        detail: None,
    };
    let (dir, auth, sh, l, r) = (
        st.dir.clone(),
        st.auth.clone(),
        shared.clone(),
        lease.clone(),
        record.clone(),
    );
    timed(
        cb,
        StepName::RunJson,
        blocking(name, StepName::RunJson, deadline, move || {
            write_status_blocking(&dir, &*auth, &sh, &l, &r)
        }),
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
            .map_err(|e| RunError::Io(format!("cannot start the watchdog thread: {e}")))?;
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

/// (8) store: the seal and floor from the lease chain (our epoch and the one our
/// claim replaced), then open `store/run.sqlite`. A new store is created only when
/// the chain names none (no seal, floor 0 or none); an expected store that is
/// missing is STORE_MISSING, never recreated.
async fn store(st: &Opening, cx: &Ctx<'_>, lease: &OwnedLease) -> Result<Unchecked, RunError> {
    let (path, name, cb, deadline) = (cx.path, &cx.name, &cx.opts.on_step, cx.opts.step_deadline);
    let dir = st.auth.clone();
    let (rid, g, carry) = (
        lease.run_id.clone(),
        lease.generation,
        st.carry_seal.clone(),
    );
    let root = st.root.clone();
    let store_dir = path.join(lease_core::layout::STORE_DIR);
    if dir.commits_in_engine() {
        let l = lease.clone();
        return timed(
            cb,
            StepName::Store,
            blocking(name, StepName::Store, deadline, move || {
                engine_store(&*dir, &root, &store_dir, &l)
            }),
        )
        .await;
    }
    let lazy = cx.opts.lazy_store;
    timed(
        cb,
        StepName::Store,
        blocking(name, StepName::Store, deadline, move || {
            let req = requirements(&*dir, g)?;
            *lock_std(&carry) = req.seal().cloned();
            if lazy && deferrable(&req) && !leftover_log(&root) {
                return Ok(Unchecked::Deferred(super::DeferredStore {
                    run_id: rid,
                    root,
                    store_dir,
                    req,
                }));
            }
            Ok(Unchecked::Local(
                open_local(&rid, &root, &store_dir, &req)?,
                req,
            ))
        }),
    )
    .await
}

/// Whether the store may be opened lazily (issue #33, PROTOCOL §9): the chain names a
/// seal (the claimed-over head was a clean release, which closed the store at that
/// sequence) and no floor above it (no change of owner recorded a higher head since).
/// Then, until a commit needs it, the sealed store is exactly what the next owner must
/// find, and the release may carry that seal forward. The preflight has already checked
/// the store against the seal and floor (read-only). A store that must be created, or
/// one only a floor vouches for (after a takeover or retirement), is opened eagerly.
fn deferrable(req: &Requirements) -> bool {
    req.seal()
        .is_some_and(|seal| req.floor().is_none_or(|(f, _)| f <= seal.sequence))
}

/// Open `store/run.sqlite` for the owner whose chain requires `req`: the store folder
/// beneath the held root (no symlink followed, trust-checked; the store's files only ever
/// beneath it), a new store created only when the chain names none, the sealed identity
/// expected. The eager `store` step and a deferred store's first access both open it here.
fn open_local(
    rid: &RunId,
    root: &RealFs,
    store_dir: &Path,
    req: &Requirements,
) -> Result<OpenedStore, RunError> {
    let folder = root
        .open_dir(lease_core::layout::STORE_DIR)
        .map_err(|e| FsError::io(rid.as_str(), "open", lease_core::layout::STORE_DIR, e))?;
    let expect = req.seal().map(|s| Expected {
        store_id: s.store_id.clone(),
    });
    Ok(Store::open_in(
        rid,
        folder,
        store_dir,
        lease_core::layout::STORE_FILE_NAME,
        lease_sqlite::OpenOptions {
            create: req.names_no_store(),
            expect,
        },
    )?)
}

/// Whether `store/` holds a write-ahead log or rollback journal beside the store (a crash
/// left commits to replay, or something unexplained is there), or cannot be looked at: then
/// the store is opened eagerly, so the replay happens (and anything wrong is refused)
/// before the command starts, and the step `store get`'s `STORE_BUSY` names ("run it
/// once") does what it says. A clean close removes the `-wal`, so after a clean release
/// there is none. One `fstatat` each, beneath the held root, no symlink followed.
fn leftover_log(root: &RealFs) -> bool {
    let Ok(folder) = root.open_dir(lease_core::layout::STORE_DIR) else {
        return true;
    };
    [
        format!("{}-wal", lease_core::layout::STORE_FILE_NAME),
        format!("{}-journal", lease_core::layout::STORE_FILE_NAME),
    ]
    .iter()
    .any(|name| {
        !matches!(
            rustix::fs::statat(
                &folder,
                name.as_str(),
                rustix::fs::AtFlags::SYMLINK_NOFOLLOW
            ),
            Err(rustix::io::Errno::NOENT)
        )
    })
}

/// Open a deferred store at its first access (called by the fence core under its store
/// slot, after the fence check): [`open_local`] (never created: the chain names a seal),
/// checked against the seal and floor, and the commit gate installed, exactly as the eager
/// `store` and `seal` steps do. Returns the store with its head.
pub(super) fn open_deferred(
    shared: &Arc<Shared>,
    d: &super::DeferredStore,
) -> Result<(Store, u64), RunError> {
    let mut store = open_local(&d.run_id, &d.root, &d.store_dir, &d.req)?.check(&d.req)?;
    let head = store.head()?;
    store.set_commit_gate(commit_gate(shared, shared.run.clone(), shared.generation));
    Ok((store, head))
}

/// The store's commit gate: the self-fence rule of `shared` (while it exists), as the
/// store error the commit returns.
fn commit_gate(shared: &Arc<Shared>, run_s: String, g: Generation) -> lease_sqlite::CommitGate {
    let weak = Arc::downgrade(shared);
    Box::new(move || match weak.upgrade() {
        Some(sh) => sh.check_live().map_err(|e| {
            // The fence's own reason, not its message: one prefix per message.
            let reason = match e {
                RunError::Fenced { reason, .. } => reason,
                other => other.to_string(),
            };
            StoreError::from(sh.fenced_lease_error(reason))
        }),
        None => Err(StoreError::from(LeaseError::Fenced {
            run: run_s.clone(),
            generation: g,
            detail: "the run is gone".into(),
        })),
    })
}

/// (8), the store in the engine (docs/PROTOCOL.md §18.4): the view `store/view.sqlite`
/// caught up to the engine's log, or rebuilt from it, before anything is served. A run
/// whose chain names a local store (a seal or a floor from before the store followed the
/// lease) while the engine holds no record of it is refused: its data is in that
/// `store/run.sqlite`, and starting from an empty store would lose it.
fn engine_store(
    auth: &dyn LeaseAuthority,
    root: &lease_fs::RealFs,
    store_dir: &Path,
    lease: &OwnedLease,
) -> Result<Unchecked, RunError> {
    let rid = lease.run_id.clone();
    // Opened beneath the held root (the layout step made it), never through a symlink.
    let open = || root.open_dir(lease_core::layout::STORE_DIR);
    let dir = crate::engine_store::StoreDir {
        open: &open,
        path: store_dir.to_path_buf(),
    };
    let (log, view) = crate::engine_store::EngineLog::catch_up(auth, lease, &dir)?;
    if log.tail().last.is_none() {
        let req = requirements(auth, lease.generation)?;
        if !req.names_no_store() {
            return Err(RunError::Store(lease_sqlite::StoreError::Missing {
                run: rid.to_string(),
                file: store_dir
                    .join(lease_core::layout::STORE_FILE_NAME)
                    .display()
                    .to_string(),
                detail: "the lease chain names this local store (from before the store was committed in the engine), and the engine holds no record of it; this version cannot import it yet, and will not start this run with an empty store".into(),
            }));
        }
    }
    Ok(Unchecked::Engine(view, Box::new(log)))
}

/// (9) seal: the store must be the sealed one, at or past the seal and the floor.
/// Then the commit gate (the self-fence rule) is installed and the store handed to
/// `RunStore` handles.
async fn seal(
    cx: &Ctx<'_>,
    lease: &OwnedLease,
    shared: &Arc<Shared>,
    auth: Arc<dyn LeaseAuthority>,
    opened: Unchecked,
) -> Result<(), RunError> {
    let (name, cb, deadline) = (&cx.name, &cx.opts.on_step, cx.opts.step_deadline);
    let sh = shared.clone();
    let (run_s, g) = (name.clone(), lease.generation);
    timed(
        cb,
        StepName::Seal,
        blocking(name, StepName::Seal, deadline, move || {
            let (mut store, engine) = match opened {
                Unchecked::Local(opened, req) => (opened.check(&req)?, None),
                Unchecked::Engine(view, log) => (view, Some(log)),
                Unchecked::Deferred(d) => {
                    // Nothing opened, nothing written: heartbeats report the seal's
                    // sequence (the head the chain vouches for) until a commit opens it.
                    let head = d.req.seal().map_or(0, |s| s.sequence);
                    let _ = sh.deferred.set(d);
                    sh.core.defer_store(head);
                    return Ok(());
                }
            };
            let head = store.head()?;
            store.set_commit_gate(commit_gate(&sh, run_s, g));
            if let Some(log) = engine {
                let _ = sh.engine.set(super::EngineSlot {
                    auth: auth.clone(),
                    log: Mutex::new(*log),
                });
            }
            sh.core.install_store(store, head);
            Ok(())
        }),
    )
    .await?;
    shared.check_live()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::FolderAuthority;
    use lease_core::Transport;

    /// A claim that failed after creating its epoch is recognised by its owner id and
    /// holder (and only then), with the lease the claim would have returned.
    #[test]
    fn own_head_finds_only_this_opens_own_active_epoch() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(RunDir::create(&tmp.path().join("own")).unwrap());
        let auth = FolderAuthority(dir.clone());
        let (me, holder) = (new_owner_id().unwrap(), this_holder().unwrap());
        assert!(own_head(&auth, &me, &holder).is_none(), "no epoch yet");
        let lease = auth
            .claim(ClaimParams {
                run_id: auth.run_id().clone(),
                owner_id: me.clone(),
                holder: holder.clone(),
                policy: lease_core::TimingPolicy::default(),
                now: wall_now().unwrap(),
                store_floor: None,
            })
            .unwrap();
        assert_eq!(own_head(&auth, &me, &holder), Some(lease.clone()));
        let other = new_owner_id().unwrap();
        assert!(
            own_head(&auth, &other, &holder).is_none(),
            "another owner id"
        );
        let elsewhere = lease_core::Holder {
            pid: holder.pid + 1,
            ..holder.clone()
        };
        assert!(
            own_head(&auth, &me, &elsewhere).is_none(),
            "another process"
        );
        auth.release(ReleaseParams {
            lease,
            now: wall_now().unwrap(),
            seal: None,
        })
        .unwrap();
        assert!(
            own_head(&auth, &me, &holder).is_none(),
            "released: not active"
        );
    }
}
