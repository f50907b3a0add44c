//! Release: stop the commands, the barrier, the seal, the final `run.json`, the lease.

#[cfg(doc)]
use super::RunStore;
use super::status::status_write;
use super::step::{blocking, timed};
use super::{Run, StepName, WATCHDOG_TICK};
use crate::clock::wall_now;
use crate::error::RunError;
use crate::fence::Taken;
use crate::procs;
use crate::sync::lock_std;
use lease_core::LeaseOps;
use lease_core::ops::ReleaseParams;
use lease_core::{Code, Dir, FileRef, Generation, RunState, Seal, Timestamp};
use lease_fs::{FsError, RunDir, primitives};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The final status a release writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinalStatus {
    /// Stopped on purpose, to be resumed (optionally at `wake_at`).
    Paused {
        /// When to resume.
        wake_at: Option<Timestamp>,
    },
    /// Finished successfully.
    Done,
    /// Finished with a failure (`detail`, at most 4096 bytes).
    Failed {
        /// Why.
        detail: String,
    },
}

impl FinalStatus {
    /// The final status of a run whose command ended with `status`: `Done` for exit 0,
    /// else `Failed` naming the true cause, read from the status itself (an exit code, or
    /// the signal that killed it: a command that exited 143 is not one killed by signal 15,
    /// though both are 143 as a shell's `$?`).
    ///
    /// ```
    /// use std::os::unix::process::ExitStatusExt;
    /// use lease_run::FinalStatus;
    /// let exited = std::process::ExitStatus::from_raw(143 << 8);
    /// let killed = std::process::ExitStatus::from_raw(15);
    /// assert_eq!(
    ///     FinalStatus::of_exit(exited),
    ///     FinalStatus::Failed { detail: "the command exited with code 143".into() }
    /// );
    /// assert_eq!(
    ///     FinalStatus::of_exit(killed),
    ///     FinalStatus::Failed { detail: "the command was killed by signal 15".into() }
    /// );
    /// assert_eq!(FinalStatus::of_exit(std::process::ExitStatus::from_raw(0)), FinalStatus::Done);
    /// ```
    pub fn of_exit(status: std::process::ExitStatus) -> FinalStatus {
        use std::os::unix::process::ExitStatusExt;
        let detail = match (status.code(), status.signal()) {
            (Some(0), _) => return FinalStatus::Done,
            (Some(code), _) => format!("the command exited with code {code}"),
            (None, Some(sig)) => format!("the command was killed by signal {sig}"),
            // Stopped or continued: not an end (a caller that reaped it never sees these).
            (None, None) => format!("the command ended with wait status {}", status.into_raw()),
        };
        FinalStatus::Failed { detail }
    }
}

impl Run {
    /// Release the run, in order, each step under its own deadline: stop-commands (TERM,
    /// grace, KILL; then their records are removed) → barrier (the store is taken from
    /// every [`RunStore`] handle, after any commit in flight: no commit can start after
    /// it) → seal-store (the seal: store id, head, this generation; the store's highest
    /// token is raised to this generation, the WAL checkpointed, the store closed) →
    /// final-status (`run.json` as `final_status`, `sealed_sequence` = the sealed head) →
    /// stop-heartbeat → release-lease (the release epoch carries the seal) → unlock →
    /// compact ([`crate::compact::after_release`]: best-effort, its failure is logged and
    /// never returned). A fenced run reports the fence and writes nothing.
    ///
    /// Returns the generation of the release epoch: the run's head once released (the
    /// generation the next owner supersedes; the owner's was [`Run::generation`]).
    ///
    /// **Cancellation-safe:** the steps run in a task of their own; dropping this future
    /// does not stop them (the release finishes in the background, and [`Run::settle`] or
    /// the next [`Run::open`] of the path in this process waits for it).
    pub async fn release(self, final_status: FinalStatus) -> Result<Generation, RunError> {
        self.release_in_task(final_status, false).await
    }

    /// Release the run like [`Run::release`], except that its commands are **detached**
    /// instead of stopped: for a command that asked its owner to hand the run over and
    /// goes on without the lease (`runlease release` under `runlease run`).
    ///
    /// In place of stop-commands: the watchdog stops tracking this generation's processes
    /// (they are no longer killed on a fence or at release), their command records are
    /// removed durably (so the next owner does not reap them), and the members of the
    /// incarnation's cgroup v2 directory, if any, are moved up into the owner's own cgroup
    /// and the directory removed (`cgroup::detach`; a member that cannot be moved
    /// is logged, and the next open of the run kills it). All
    /// this happens before the barrier, the seal and the lease release, so a crash in
    /// between leaves a held run whose next owner finds no record (the commands are not
    /// reaped: they were handed over on purpose). What a detached command still holds:
    /// nothing that counts: the store is sealed and closed at the barrier that follows, and
    /// once the lease is released its generation is fenced everywhere (lease-fs appends
    /// answer `FENCED`).
    /// Returns the release epoch's generation, as [`Run::release`] does.
    pub async fn release_detached(self, final_status: FinalStatus) -> Result<Generation, RunError> {
        self.release_in_task(final_status, true).await
    }

    /// Run the release in a task of its own (so dropping the caller's future does not stop
    /// it half-way), marked pending for [`Run::settle`] until it ends.
    async fn release_in_task(
        self,
        final_status: FinalStatus,
        detach: bool,
    ) -> Result<Generation, RunError> {
        // Still armed until the task starts its steps: a task that never runs (its runtime
        // shutting down) drops the handle armed, and the drop releases it in the background.
        let name = self.shared.run.clone();
        let pending = super::background::Pending::start(&self.path);
        let task = tokio::spawn(async move {
            let _pending = pending;
            self.release_with(final_status, detach).await
        });
        match task.await {
            Ok(r) => r,
            Err(e) => Err(RunError::from_join(&format!("run {name}: the release"), &e)),
        }
    }

    pub(super) async fn release_with(
        mut self,
        final_status: FinalStatus,
        detach: bool,
    ) -> Result<Generation, RunError> {
        self.armed = false;
        let name = self.shared.run.clone();
        let cb = self.opts.on_step.clone();
        let deadline = self.opts.step_deadline;
        if let Err(e) = self.check_live() {
            return Err(self.finish_fenced(e).await);
        }

        let (sh, grace, kill_wait, dir, g) = (
            self.shared.clone(),
            self.opts.term_grace,
            self.opts.kill_wait,
            self.dir.clone(),
            self.lease.generation,
        );
        let stopped = timed(
            &cb,
            StepName::StopCommands,
            blocking(
                &name,
                StepName::StopCommands,
                grace + kill_wait + deadline,
                move || {
                    if detach {
                        // The guard first: the commands are handed over, never killed.
                        sh.guard_finish();
                        let cg = {
                            let mut t = sh.tracked();
                            t.forget_all();
                            t.cgroup.take()
                        };
                        if let Some(cg) = cg {
                            crate::cgroup::detach(&cg);
                        }
                        return remove_own_records(&dir, g);
                    }
                    let mut t = sh.tracked().clone();
                    let gone = procs::terminate(&mut t, grace, kill_wait);
                    let cg = t.cgroup.clone();
                    *sh.tracked() = t;
                    if !gone {
                        // Name a survivor (pid and group) from a fresh scan; one that died
                        // since still leaves its recorded group to name.
                        let (pid, pgid) = sh.tracked().first_alive(&procs::scan()).unwrap_or((
                            0,
                            sh.tracked().groups.iter().next().copied().unwrap_or(0),
                        ));
                        return Err(RunError::CommandsSurvive {
                            run: sh.run.clone(),
                            pid,
                            pgid,
                            generation: g.get(),
                        });
                    }
                    // Every command is gone: the guard has nothing left to kill.
                    sh.guard_finish();
                    if let Some(cg) = cg {
                        crate::cgroup::Cgroup::at(cg).remove_within(Duration::from_secs(1));
                    }
                    remove_own_records(&dir, g)
                },
            ),
        )
        .await;
        if let Err(e) = stopped {
            // The watchdog keeps watching: once the lease lapses it SIGKILLs them again.
            for t in self.tasks.drain(..) {
                t.abort();
            }
            return Err(e);
        }

        // Barrier: take the store out of the shared slot. The slot's mutex is held by a
        // commit for its whole duration, so this waits for one in flight; afterwards every
        // `RunStore` call answers RUN_RELEASED.
        let sh = self.shared.clone();
        let store = timed(
            &cb,
            StepName::Barrier,
            blocking(&name, StepName::Barrier, deadline, move || {
                Ok(sh.core.take_store())
            }),
        )
        .await?;

        // With the store in the engine (issue #32) the view is closed, not sealed: the
        // engine's log is the store, and the next owner catches up from it.
        let in_engine = self.shared.engine.get().is_some();
        let carried = self
            .shared
            .deferred
            .get()
            .and_then(|d| d.req.seal().cloned())
            .map(|s| Seal { generation: g, ..s });
        let sealed = timed(
            &cb,
            StepName::SealStore,
            blocking(&name, StepName::SealStore, deadline, move || match store {
                Taken::Open(s) if in_engine => {
                    s.close()?;
                    Ok(None)
                }
                Taken::Open(s) => Ok(Some(s.seal(g)?)),
                // Deferred and never opened (issue #33): no commit ran, so the store is
                // still exactly what the chain's seal says; the release carries that seal,
                // stamped with this generation (as a failed open's undo does).
                Taken::Deferred => Ok(carried),
                Taken::Empty => Err(RunError::Io(
                    "the store was closed before the release (fenced?)".into(),
                )),
            }),
        )
        .await;
        let seal = match sealed {
            Ok(seal) => seal,
            Err(e) => {
                if self.check_live().is_err() || e.code() == Code::Fenced {
                    return Err(self.finish_fenced(e).await);
                }
                return Err(e);
            }
        };

        let now = wall_now()?;
        let mut rec = self.status();
        let (state, detail, wake_at) = match final_status {
            FinalStatus::Paused { wake_at } => (RunState::Paused, None, wake_at),
            FinalStatus::Done => (RunState::Done, None, None),
            FinalStatus::Failed { detail } => (RunState::Failed, Some(detail), None),
        };
        rec.status = state;
        rec.detail = detail;
        rec.wake_at = wake_at;
        rec.sealed_sequence = seal.as_ref().map(|s| s.sequence);
        rec.updated_at = now;
        let write = status_write(&self.dir, &self.auth, &self.shared, &self.lease, &rec);
        let written = timed(
            &cb,
            StepName::FinalStatus,
            blocking(&name, StepName::FinalStatus, deadline, write),
        )
        .await;
        if let Err(e) = written {
            if matches!(e, RunError::Fenced { .. }) {
                return Err(self.finish_fenced(e).await);
            }
            return Err(e);
        }
        *lock_std(&self.current) = rec;

        timed(&cb, StepName::StopHeartbeat, async {
            for t in self.tasks.drain(..) {
                t.abort();
                let _ = tokio::time::timeout(deadline, t).await;
            }
            Ok(())
        })
        .await?;

        let (auth, l) = (self.auth.clone(), self.lease.clone());
        let released = timed(
            &cb,
            StepName::ReleaseLease,
            blocking(&name, StepName::ReleaseLease, deadline, move || {
                // lease-core's compaction off: it runs below, after the unlock and
                // reported (crate::compact's docs say why).
                auth.release_compacting(
                    ReleaseParams {
                        lease: l.clone(),
                        now: wall_now()?,
                        seal,
                    },
                    None,
                )
            }),
        )
        .await?;

        timed(&cb, StepName::Unlock, async {
            self.shared.stop.store(true, Ordering::SeqCst);
            self.lock.take();
            Ok(())
        })
        .await?;

        // Automatic compaction (crate::compact), after the unlock so it never holds up the
        // next owner. Its order of writes is the prune's own (PROTOCOL §7.10: pending
        // cutoffs below the floor, then the checkpoint, both durable, then the removals),
        // then the temp collection; a crash or timeout anywhere in it leaves a valid state
        // and the release above stands. `after_release` logs its outcome; a timeout is
        // logged here (the prune goes on in the blocking pool or dies with the process).
        let (auth, dir, by) = (
            self.auth.clone(),
            self.dir.clone(),
            self.lease.owner_id.clone(),
        );
        let compacted = timed(
            &cb,
            StepName::Compact,
            blocking(&name, StepName::Compact, deadline, move || {
                Ok(crate::compact::after_release(
                    &*auth,
                    Some(&dir),
                    released,
                    by,
                ))
            }),
        )
        .await;
        if let Err(e) = compacted {
            tracing::warn!(
                target: "lease_run::compact",
                run = %name,
                code = e.code().as_str(),
                "the compaction after the release did not finish (the release stands): {e}"
            );
        }
        Ok(released)
    }

    /// The fence path of release: stop the tasks, wait (bounded) for the watchdog to
    /// confirm the kill, drop the lock; nothing is written.
    async fn finish_fenced(&mut self, e: RunError) -> RunError {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        // Close the store (unless a commit holds it: it drops the store itself once it
        // sees the fence), so the next owner can open it.
        self.shared.core.drop_store_if_free();
        let wait = self.opts.kill_wait + WATCHDOG_TICK * 3;
        let confirmed = tokio::time::timeout(wait, self.fenced()).await;
        self.lock.take();
        confirmed.unwrap_or(e)
    }
}

/// Remove this generation's command records (their processes are gone).
fn remove_own_records(dir: &RunDir, ours: Generation) -> Result<(), RunError> {
    let run = dir.run_id().as_str().to_string();
    let names = dir
        .fs()
        .list(Dir::Commands.path())
        .map_err(|e| FsError::io(&run, "list", Dir::Commands.path(), e))?;
    for n in names {
        if let Some(f @ FileRef::Command { generation, .. }) = Dir::Commands.parse_name(&n) {
            if generation == ours {
                let p = f.path();
                // Not fsynced (issue #33): only a power loss can bring the record back,
                // and that is a new boot, whose next open removes another boot's records
                // unread (their processes died with it, `reap_or_refuse`); within one boot
                // a record whose process is gone is judged gone and removed. Never a
                // signal without proof either way (PROTOCOL §11.1).
                primitives::remove(&**dir.fs(), &p, false)
                    .map_err(|e| FsError::io(&run, "remove", &p, e))?;
            }
        }
    }
    Ok(())
}
