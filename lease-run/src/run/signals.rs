//! Signals: turn SIGTERM/SIGINT (or any set) into a release, as `runlease run` does.

use super::{FinalStatus, Run};
use crate::error::RunError;
use rustix::process::Signal;
use std::future::poll_fn;
use std::task::Poll;
use tokio::signal::unix::{SignalKind, signal};

/// How [`Run::release_on_signals`] ended (the run is released either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The work finished; the run was released with the status it returned.
    Finished,
    /// This signal (its number) arrived first: it was sent on to the run's commands, and
    /// the run released with the status the work returned within `term_grace`, else (the
    /// work dropped) as `failed` ("interrupted by signal N"). A process that wants the
    /// shell's convention exits with 128 + N.
    Signalled(i32),
}

impl Run {
    /// Run `work` under this run until it finishes or one of `signals` arrives, then
    /// release the run: the one-line way for a library owner to behave as `runlease run`
    /// does on SIGTERM or SIGINT.
    ///
    /// - `work` finishes first: the run is released with the [`FinalStatus`] it returned
    ///   ([`Served::Finished`]). `work` returns a `Result`, so `?` works inside it: an
    ///   `Err(e)` releases the run as `failed` with `e`'s message (its stable code first)
    ///   and is then returned as this call's error; if that release itself fails (a fence
    ///   meanwhile), the release's error is returned instead, as it says more: the run was
    ///   not released.
    /// - A signal first: it is sent on to every command process this run tracks (so a
    ///   command can shut down cleanly, as under `runlease run`), and `work` (typically
    ///   waiting for them) gets [`OpenOptions::term_grace`](super::OpenOptions::term_grace)
    ///   to finish: the run is released with its status; past the grace `work` is dropped
    ///   (its futures cancelled; lease-run's own are cancellation-safe) and the run
    ///   released as `failed` with "interrupted by signal N", the release stopping what is
    ///   left (TERM, grace, KILL). Either way [`Served::Signalled`].
    /// - The run is fenced meanwhile: the release reports it (`Err`, [`RunError::is_fenced`]).
    ///
    /// The handlers are installed when this is called (tokio's: from then on, for the rest
    /// of the process's life, these signals no longer terminate it by default) and are
    /// listened to only while this runs.
    ///
    /// ```no_run
    /// use lease_run::{FinalStatus, OpenOptions, Run, Served};
    /// use tokio::signal::unix::SignalKind;
    /// # async fn demo() -> Result<(), lease_run::RunError> {
    /// let run = Run::open(std::path::Path::new("/srv/runs/job"), OpenOptions::default()).await?;
    /// let served = run
    ///     .release_on_signals(&[SignalKind::terminate(), SignalKind::interrupt()], async |run| {
    ///         let st = run.command("./job.sh").spawn().await?.wait().await?;
    ///         Ok(if st.success() {
    ///             FinalStatus::Done
    ///         } else {
    ///             FinalStatus::Failed { detail: format!("job.sh: {st}") }
    ///         })
    ///     })
    ///     .await?;
    /// if let Served::Signalled(n) = served {
    ///     std::process::exit(128 + n);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn release_on_signals(
        self,
        signals: &[SignalKind],
        work: impl AsyncFnOnce(&Run) -> Result<FinalStatus, RunError>,
    ) -> Result<Served, RunError> {
        let mut streams = Vec::with_capacity(signals.len());
        for kind in signals {
            let stream = signal(*kind).map_err(|e| {
                let n = kind.as_raw_value();
                RunError::os(
                    format!("run {}: cannot listen for signal {n}", self.shared.run),
                    e,
                )
            })?;
            streams.push((kind.as_raw_value(), stream));
        }
        let first_signal = poll_fn(|cx| {
            for (n, s) in &mut streams {
                if let Poll::Ready(Some(())) = s.poll_recv(cx) {
                    return Poll::Ready(*n);
                }
            }
            Poll::Pending
        });
        let (status, signalled) = {
            let work = work(&self);
            tokio::pin!(work);
            tokio::select! {
                status = &mut work => (status, None),
                n = first_signal => {
                    // As `runlease run` does: the signal goes on to the commands, and the
                    // work (typically waiting for them) gets `term_grace` to finish.
                    self.signal_commands(n).await;
                    match tokio::time::timeout(self.opts.term_grace, &mut work).await {
                        Ok(status) => (status, Some(n)),
                        Err(_) => (
                            Ok(FinalStatus::Failed {
                                detail: format!("interrupted by signal {n}"),
                            }),
                            Some(n),
                        ),
                    }
                }
            }
        };
        match status {
            Ok(status) => {
                self.release(status).await?;
                Ok(signalled.map_or(Served::Finished, Served::Signalled))
            }
            Err(e) => {
                let detail = e.code().prefixed(&e);
                self.release(FinalStatus::Failed { detail }).await?;
                Err(e)
            }
        }
    }

    /// Send signal `n` to every process this run tracks ([`CommandSignaller::signal`]).
    async fn signal_commands(&self, n: i32) {
        let Some(sig) = Signal::from_named_raw(n) else {
            return;
        };
        let to = self.command_signaller();
        let _ = tokio::task::spawn_blocking(move || to.signal(sig)).await;
    }

    /// A handle that signals this run's commands from any thread (a signal-handling thread
    /// included), through the same proved-ours checks as the release's TERM: every tracked
    /// process group and known descendant, each through a pidfd re-checked first, leaders
    /// confirmed alive. `runlease run` forwards SIGINT, SIGTERM and SIGHUP with it, and
    /// [`Run::release_on_signals`] does too.
    pub fn command_signaller(&self) -> CommandSignaller {
        CommandSignaller {
            shared: self.shared.clone(),
        }
    }
}

/// Signals a run's commands from any thread ([`Run::command_signaller`]). Holding it keeps
/// nothing of the run alive but its tracking state; after a release (or a detached
/// release) nothing is tracked and [`CommandSignaller::signal`] reaches nothing.
#[derive(Clone)]
pub struct CommandSignaller {
    shared: std::sync::Arc<super::Shared>,
}

impl std::fmt::Debug for CommandSignaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandSignaller")
            .field("run", &self.shared.run)
            .finish()
    }
}

impl CommandSignaller {
    /// Send `sig` to every process the run tracks (blocking: one `/proc` scan, taken under
    /// the tracking lock as the watchdog's is, so a command started meanwhile is either in
    /// it or not yet tracked: a scan taken before the lock would make the refresh forget
    /// that command's group, `fence::fence_tick`).
    pub fn signal(&self, sig: Signal) {
        let mut t = self.shared.tracked();
        let procs = t.snapshot();
        t.refresh(&procs);
        t.signal_all(sig, &procs);
    }
}
