//! Appending to the run's event log as its owner, behind the self-fence check.

use super::Run;
use crate::clock::wall_now;
use crate::error::RunError;
use lease_core::ops::{AppendParams, Appended};
use lease_core::{Identity, LeaseOps};

impl Run {
    /// Append an event of `event_type` with `payload` (anything serde serializes) to the
    /// run's event log, as this owner. The self-fence rule is applied first
    /// ([`Run::check_live`]: once fenced or past the deadline nothing is written, `FENCED`),
    /// so an owner that stopped beating cannot keep adding events a replacer must judge;
    /// then lease-core's append through the run's authority (off the runtime): `Ok` means
    /// durable and counting. An answer that says this owner was superseded meanwhile
    /// (`FENCED`, or an event that counts with `superseded_by` set) fences the run, as a
    /// heartbeat answered `FENCED` does.
    ///
    /// `event_type` must be a word (letters, digits, `-_.:@`) and `payload` JSON
    /// (`ARGUMENT_INVALID`, nothing written, otherwise).
    ///
    /// ```no_run
    /// # async fn demo(run: &lease_run::Run) -> Result<(), lease_run::RunError> {
    /// #[derive(serde::Serialize)]
    /// struct Step { name: &'static str, n: u32 }
    /// let a = run.append("step", Step { name: "load", n: 1 }).await?;
    /// println!("event {} is durable and counts", a.sequence);
    /// # Ok(()) }
    /// ```
    pub async fn append(
        &self,
        event_type: &str,
        payload: impl serde::Serialize,
    ) -> Result<Appended, RunError> {
        let event_type = Identity::word("event type", event_type)
            .map_err(|e| RunError::InvalidArgument(format!("run {}: {e}", self.shared.run)))?;
        let payload = serde_json::to_value(payload).map_err(|e| {
            RunError::InvalidArgument(format!(
                "run {}: the event payload cannot be written as JSON: {e}",
                self.shared.run
            ))
        })?;
        self.check_live()?;
        let (auth, lease, shared) = (self.auth.clone(), self.lease.clone(), self.shared.clone());
        tokio::task::spawn_blocking(move || {
            // The check again, on the blocking thread right before the write.
            shared.check_live()?;
            let r = auth.append(
                &lease,
                AppendParams {
                    event_type,
                    payload,
                    now: wall_now()?,
                    tail_hint: None,
                },
            );
            match &r {
                Ok(a) => {
                    if let Some(g) = a.superseded_by {
                        shared.fence(format!("superseded by generation {g}"));
                    }
                }
                Err(e) if e.is_fenced() => shared.fence(e.to_string()),
                Err(_) => {}
            }
            r
        })
        .await
        .map_err(|e| RunError::from_join(&format!("run {}: an append", self.shared.run), &e))?
    }
}
