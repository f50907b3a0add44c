//! Owning the run: [`Run::acquire`] with the flags' claim, retirement or takeover and
//! `--wait`, its progress said on the terminal, its refusals worded as `runlease` steps.

use super::args::RunOpts;
use super::signals::{PENDING_SIGNAL, check_pending_signal};
use crate::error::{CliError, EX_SOFTWARE};
use crate::holder::held_description;
use crate::output::{Out, Progress};
use crate::text::{human_duration, shell_path};
use lease_cli::cli::WaitFor;
use lease_core::Code;
use lease_core::TimingPolicy;
use lease_run::{Acquire, AcquireError, Acquired, Held, NextStep, OpenOptions, Run, Wait};
use serde_json::json;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// The hidden first argument that makes `runlease` the guard process of a `runlease run`
/// (`lease_run::guard`): the owner re-executes its own binary with it at the first
/// command, so the command is killed by the self-fence deadline even while the owner is
/// stopped (issue #31).
pub(crate) const GUARD_ARG: &str = "__guard";

/// The CLI's hooks into [`Run::acquire`]: the terminal progress line, the "waited" note,
/// and stopping when a signal arrived before the command started.
struct Observer {
    progress: Progress,
    dir: PathBuf,
    held_once: bool,
    /// Not a terminal and not quiet: say once per watched record what the watch is for.
    announce: bool,
    /// The (generation, heartbeat count) last announced.
    announced: Option<(u64, u64)>,
}

impl lease_run::AcquireObserver for Observer {
    fn progress(&mut self, p: lease_run::Progress<'_>) {
        match p {
            lease_run::Progress::Waiting { held, elapsed } => {
                self.held_once = true;
                let who = match held.view.head.as_ref().filter(|h| h.is_active()) {
                    Some(h) if !matches!(held.next, NextStep::WaitForLockHolder) => format!(
                        "held by owner {} (pid {} on {}, generation {})",
                        h.epoch.owner_id,
                        h.epoch.holder.pid,
                        h.epoch.holder.host,
                        h.generation()
                    ),
                    _ => "its owner lock is held".into(),
                };
                self.progress.show(&format!(
                    "waiting {} for {}: {who}",
                    human_duration(elapsed),
                    self.dir.display(),
                ));
            }
            lease_run::Progress::Unavailable { error, elapsed } => {
                self.progress.show(&format!(
                    "waiting {} for {}: the lease authority did not answer ({}); trying again",
                    human_duration(elapsed),
                    self.dir.display(),
                    error.code(),
                ));
            }
            lease_run::Progress::Watching {
                head,
                watched,
                needed,
            } => {
                let key = (head.generation().get(), head.heartbeat_count());
                if self.announce && self.announced != Some(key) {
                    self.announced = Some(key);
                    eprintln!(
                        "runlease: watching owner {} of {} (generation {}): it is taken over only if its record stays unchanged for {} on this host's clock",
                        head.epoch.owner_id,
                        self.dir.display(),
                        head.generation(),
                        human_duration(needed),
                    );
                }
                self.progress.show(&format!(
                    "owner {} of {}: record unchanged for {} of the {} needed before an automatic takeover",
                    head.epoch.owner_id,
                    self.dir.display(),
                    human_duration(watched),
                    human_duration(needed),
                ))
            }
            _ => {}
        }
    }

    fn proceed(&mut self) -> bool {
        PENDING_SIGNAL.load(Ordering::SeqCst) == 0
    }
}

/// Own the run with [`Run::acquire`] (claim, or as the flags allow retire a dead owner or
/// take over a stale one; wait while it is held if `--wait` was given) and render its
/// refusals.
pub(super) async fn acquire(
    abs: &Path,
    held: Option<Arc<lease_run::folder::RealFs>>,
    opts: &RunOpts,
    policy: TimingPolicy,
    out: Out,
) -> Result<(Run, Acquired), CliError> {
    let began = Instant::now();
    let wait = match opts.wait {
        None => Wait::No,
        Some(WaitFor::Forever) => Wait::Forever,
        Some(WaitFor::For(d)) => Wait::Until(began + d),
    };
    let o = OpenOptions {
        policy,
        authority: opts.authority.clone(),
        // The folder was made a run (or refused) by `init_run`; lease-run must never
        // create one behind that check, and works on the folder it opened.
        create: false,
        folder: held,
        // A process outside this one kills the command by the self-fence deadline even
        // while this process is stopped (issue #31): this binary, `runlease __guard`.
        guard: Some(lease_run::guard::GuardProgram::this_executable([GUARD_ARG])),
        ..OpenOptions::default()
    };
    let how = Acquire::from_flags(opts.retire_dead, opts.takeover_stale);
    let mut observer = Observer {
        progress: Progress::new(out),
        dir: opts.dir.clone(),
        held_once: false,
        announce: !out.quiet && !out.json && !std::io::stderr().is_terminal(),
        announced: None,
    };
    let r = Run::acquire(abs, how, wait, o, &mut observer).await;
    observer.progress.clear();
    match r {
        Ok(owned) => {
            if observer.held_once {
                // The one line a non-terminal stderr gets about the wait.
                out.info(&format!(
                    "waited {} for {}",
                    human_duration(began.elapsed()),
                    opts.dir.display()
                ));
            }
            Ok(owned)
        }
        Err(AcquireError::Stopped) => {
            check_pending_signal()?;
            Err(CliError::new(
                Code::Interrupted,
                EX_SOFTWARE,
                "the acquire stopped without a signal; nothing was claimed",
            ))
        }
        Err(AcquireError::Held(held)) => Err(held_error(&held, &opts.dir)),
        Err(AcquireError::Run(e)) => Err(CliError::from(e)),
        Err(e) => Err(CliError::of(Code::Internal, format!("acquire: {e}"))),
    }
}

/// The next step for a run held by the owner this process runs under.
const OWN_OWNER_HINT: &str = "that owner is the `runlease run` this process runs under (RUNLEASE_OWNER): a nested run of the same folder would wait for itself; use the run you already own, or another run folder";

/// A held-run refusal of [`Run::acquire`] as the CLI says it: the code (76), who holds
/// the run, and its next step as flags and commands of `runlease`.
fn held_error(held: &Held, dir: &Path) -> CliError {
    let run = &held.run;
    let err = if held.next == NextStep::WaitForLockHolder {
        CliError::of(
            held.code,
            format!(
                "run {run} is free, but a process on this host still holds its owner lock (an owner that is starting or stopping, or a stopped one already replaced, which also still holds the store); wait (--wait), or resume or end that process"
            ),
        )
        .with_extra(json!({"state": held.view.status.name()}))
    } else {
        let hint = match &held.next {
            NextStep::NestedRun => OWN_OWNER_HINT.to_string(),
            NextStep::RetireDead => format!(
                "the owner is definitely dead: add --retire-dead, or run `runlease retire {}`",
                shell_path(dir)
            ),
            NextStep::TakeoverStale => "the owner is stale: add --takeover-stale, or see `runlease status` for an exact `runlease takeover`".into(),
            NextStep::ResumeOrEndOwner { pid } => format!(
                "its process still holds the owner lock and the store (stopped or stuck?): if it runs on this host, resume it (`kill -CONT {pid}`: it fences itself, kills its command and exits 75) or end it, then add --takeover-stale (or --retire-dead once it is gone); --wait waits for it"
            ),
            _ => "wait (--wait), or ask the owner to release".into(),
        };
        let (desc, extra) = held_description(&held.view);
        let lock_note = if held.code == Code::RunAlreadyActive
            && held.view.head.as_ref().is_none_or(|h| !h.is_active())
        {
            " (a process on this host holds its owner lock: it is starting or stopping)"
        } else {
            ""
        };
        CliError::of(held.code, format!("run {run} is {desc}{lock_note}; {hint}")).with_extra(extra)
    };
    match held.gave_up_after {
        Some(d) => err.with_hint(format!("gave up after waiting {}", human_duration(d))),
        None => err,
    }
}
