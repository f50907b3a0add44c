//! The steps of open and release: their names, the timing of each and its deadline.

#[cfg(doc)]
use super::{OpenOptions, Run, RunStore};
use crate::error::RunError;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// The steps of [`Run::open`] and [`Run::release`], in order, as reported to
/// [`OpenOptions::on_step`] and named in tracing spans (`lease_run.step`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepName {
    /// Open: take the kernel owner lock.
    OwnerLock,
    /// Open: read the previous `run.json`.
    ReadStatus,
    /// Open: claim the lease (or retire a dead owner, then claim).
    Claim,
    /// Open: write `run.json` status `running`.
    RunJson,
    /// Open: start the heartbeat, the self-fence timer and the watchdog thread.
    Heartbeat,
    /// Open: create `store/`, `work/`, `tmp/`.
    Layout,
    /// Open: reap or refuse the previous incarnation's commands.
    Commands,
    /// Open: open the store `store/run.sqlite` (created only when the chain names no
    /// store), after reading the seal and floor from the lease chain.
    Store,
    /// Open: the seal check against the seal and floor ([`lease_core::seal::requirements`]).
    Seal,
    /// Release: stop the commands (TERM, grace, KILL).
    StopCommands,
    /// Release: stop the heartbeat.
    StopHeartbeat,
    /// Release: barrier: take the store away from every [`RunStore`] handle (waiting for a
    /// commit in flight), so no commit can start after it.
    Barrier,
    /// Release: seal the store (sealed sequence = its head, bound to its id and generation).
    SealStore,
    /// Release: write the final `run.json`.
    FinalStatus,
    /// Release: release the lease.
    ReleaseLease,
    /// Release: stop the watchdog and drop the owner lock.
    Unlock,
    /// Release, after the unlock: the automatic compaction ([`crate::compact`]), best-effort
    /// (its failure is logged, the release stands).
    Compact,
}

impl StepName {
    /// The step's name (`owner-lock`, `run.json`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            StepName::OwnerLock => "owner-lock",
            StepName::ReadStatus => "read-status",
            StepName::Claim => "claim",
            StepName::RunJson => "run.json",
            StepName::Heartbeat => "heartbeat",
            StepName::Layout => "layout",
            StepName::Commands => "commands",
            StepName::Store => "store",
            StepName::Seal => "seal",
            StepName::StopCommands => "stop-commands",
            StepName::StopHeartbeat => "stop-heartbeat",
            StepName::Barrier => "barrier",
            StepName::SealStore => "seal-store",
            StepName::FinalStatus => "final-status",
            StepName::ReleaseLease => "release-lease",
            StepName::Unlock => "unlock",
            StepName::Compact => "compact",
        }
    }
}

/// Called after each step with its duration (also after a step that failed).
pub type StepCallback = Arc<dyn Fn(StepName, Duration) + Send + Sync>;

/// Run a step: a tracing span, the duration reported to `on_step` (even on failure).
pub(super) async fn timed<T>(
    on_step: &Option<StepCallback>,
    step: StepName,
    fut: impl std::future::Future<Output = Result<T, RunError>>,
) -> Result<T, RunError> {
    let span = tracing::info_span!("lease_run.step", step = step.as_str());
    let start = Instant::now();
    let r = fut.instrument(span).await;
    let took = start.elapsed();
    tracing::debug!(
        step = step.as_str(),
        ms = took.as_millis() as u64,
        ok = r.is_ok(),
        "step"
    );
    if let Some(cb) = on_step {
        cb(step, took);
    }
    r
}

/// Run blocking work off the runtime with a deadline. A step past its deadline is left
/// running in the blocking pool; the caller proceeds with `STEP_TIMEOUT`.
pub(super) async fn blocking<T: Send + 'static>(
    run: &str,
    step: StepName,
    deadline: Duration,
    f: impl FnOnce() -> Result<T, RunError> + Send + 'static,
) -> Result<T, RunError> {
    match tokio::time::timeout(deadline, tokio::task::spawn_blocking(f)).await {
        Err(_) => Err(RunError::StepTimeout {
            run: run.to_string(),
            step: step.as_str(),
            ms: u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX),
        }),
        Ok(Err(join)) => Err(RunError::from_join(
            &format!("run {run}: step {}", step.as_str()),
            &join,
        )),
        Ok(Ok(r)) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step whose work panics is `INTERNAL` (a bug, exit 70), not `IO_ERROR` (74), and
    /// names the run and the step.
    #[tokio::test]
    async fn a_panicking_step_is_internal_not_io() {
        let e = blocking(
            "r",
            StepName::Claim,
            Duration::from_secs(5),
            || -> Result<(), RunError> { panic!("boom") },
        )
        .await
        .unwrap_err();
        assert_eq!(e.code(), lease_core::Code::Internal, "{e}");
        assert!(e.to_string().contains("run r: step claim panicked"), "{e}");
    }
}
