//! The spawn gate: a command's record is durable before its program starts.

use super::status::wall_now;
use super::step::blocking;
use super::{Run, StepName};
use crate::error::RunError;
use crate::fence::{gate, start_tracked};
use crate::procs::{self, INCARNATION_VAR};
use lease_core::{CommandRecord, Dir, FileRef, Identity, encode};
use lease_fs::{FsError, primitives, probe};
use rustix::process::Signal;
use std::time::{Duration, Instant};

/// A command started by [`Run::spawn`].
#[derive(Debug)]
pub struct RunCommand {
    pid: u32,
    child: tokio::process::Child,
}

impl RunCommand {
    /// Its pid (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Wait for it to exit. Its process group stays tracked: whatever it left behind is
    /// killed at release or fence.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }
}

impl Run {
    /// Start `argv` with `env` added, in its own process group, stdio inherited. Its
    /// [`CommandRecord`] is durable in `commands/` before the program starts: see the
    /// crate docs ("The spawn gate") for exactly what runs before.
    pub async fn spawn(
        &self,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<RunCommand, RunError> {
        if argv.is_empty() || argv[0].is_empty() {
            return Err(RunError::InvalidArgument(
                "argv must be non-empty with a non-empty program".into(),
            ));
        }
        self.check_live()?;
        // OQ-5: never overlap with a replaced owner that may still be running.
        let wait = self.commands_wait();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
            self.check_live()?;
        }
        let run = self.shared.run.clone();
        let spawn_err = |detail: String| RunError::Spawn {
            run: run.clone(),
            detail,
        };
        let mut cmd = tokio::process::Command::new(procs::GATE[0]);
        cmd.arg(procs::GATE[1])
            .arg(procs::GATE[2])
            .arg(procs::GATE[3])
            .args(argv)
            .process_group(0)
            .env("RUNLEASE_RUN", self.lease.run_id.as_str())
            .env(
                "RUNLEASE_GENERATION",
                self.lease.generation.get().to_string(),
            );
        // The authority, so `runlease append`/`release` in the command find the lease
        // where it lives; an inherited one must not point the command elsewhere.
        match self.opts.authority.url() {
            Some(url) => cmd.env("RUNLEASE_AUTHORITY", url),
            None => cmd.env_remove("RUNLEASE_AUTHORITY"),
        };
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        // The proof a later owner asks for before it signals a process this one started
        // (PROTOCOL §11.1); set after `env`, so a caller cannot override it.
        cmd.env(INCARNATION_VAR, &self.shared.incarnation);
        // Start and track in one critical section of the tracking lock, so the watchdog
        // never takes a snapshot without the group (`fence::fence_tick`).
        let (mut child, pid) = start_tracked(&self.shared.tracked, |t| {
            let child = cmd
                .spawn()
                .map_err(|e| spawn_err(format!("cannot start /bin/sh: {e}")))?;
            let pid = child
                .id()
                .ok_or_else(|| spawn_err("the child has no pid".into()))?;
            t.groups.insert(pid);
            // The leader's start time at once (it is our unreaped child, its pid cannot be
            // reused yet): its group counts as ours exactly while it exists (`procs`).
            if let Ok(Some(st)) = probe::process_start_time(pid) {
                t.known.insert(pid, st);
            }
            Ok::<_, RunError>((child, pid))
        })?;
        // Wait until the gate has stopped itself, then record, then continue it.
        let (dir, lease, argv2) = (self.dir.clone(), self.lease.clone(), argv.to_vec());
        let incarnation = CommandRecord::incarnation_digest(
            &lease.run_id,
            lease.generation,
            &self.shared.incarnation,
        );
        let cgroup = self.shared.tracked().cgroup.clone();
        let recorded = blocking(
            &run,
            StepName::Commands,
            self.opts.step_deadline,
            move || {
                let end = Instant::now() + Duration::from_secs(5);
                loop {
                    match procs::state_of(pid) {
                        // 't': the same stop seen by a tracer (runlease run under strace
                        // or a debugger); SIGCONT resumes it all the same.
                        Some('T' | 't') => break,
                        None | Some('Z') | Some('X') => {
                            return Err(RunError::Io(format!("command gate {pid} exited early")));
                        }
                        _ if Instant::now() >= end => {
                            return Err(RunError::Io(format!("command gate {pid} did not stop")));
                        }
                        _ => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
                if let Some(cg) = &cgroup {
                    // Before the program starts: all it ever forks is born inside.
                    crate::cgroup::Cgroup::at(cg.clone())
                        .add(pid)
                        .map_err(|e| {
                            RunError::Io(format!("cannot move {pid} into {}: {e}", cg.display()))
                        })?;
                }
                let start_time = probe::process_start_time(pid)
                    .map_err(|e| RunError::Io(format!("/proc/{pid}/stat: {e}")))?
                    .ok_or_else(|| RunError::Io(format!("command {pid} vanished")))?;
                let boot = probe::boot_id().map_err(|e| RunError::Io(format!("boot id: {e}")))?;
                let rec = CommandRecord {
                    run_id: lease.run_id.clone(),
                    generation: lease.generation,
                    pid,
                    pgid: pid,
                    start_time,
                    boot_id: Identity::arg("boot id", boot)?,
                    argv: argv2,
                    started_at: wall_now()?,
                    incarnation: Some(incarnation),
                };
                let f = FileRef::Command {
                    generation: lease.generation,
                    pid,
                };
                let p = f.path();
                let io = |e| FsError::io(lease.run_id.as_str(), "create", &p, e);
                dir.fs().ensure_dir(Dir::Commands.path()).map_err(io)?;
                let created =
                    primitives::create_exclusive(&**dir.fs(), &p, &encode(&rec)?).map_err(io)?;
                if !created {
                    return Err(RunError::Io(format!("{p} already exists")));
                }
                Ok(())
            },
        )
        .await;
        // Liveness is checked after the command is tracked and recorded: live → SIGCONT
        // (the program starts), else SIGKILL (it never ran). A lost lease is the answer
        // even when recording failed too: an owner stopped during this step (SIGSTOP, a
        // frozen VM) and replaced meanwhile comes back to a step past its deadline, and
        // must say FENCED (75), not that the spawn failed.
        let live = match recorded {
            Ok(()) => self.check_live(),
            Err(e) => match self.check_live() {
                Err(fenced @ RunError::Fenced { .. }) => Err(fenced),
                _ => Err(e),
            },
        };
        let gated = gate(
            live,
            || procs::kill_group(pid, Signal::CONT),
            || procs::kill_group(pid, Signal::KILL),
        );
        if let Err(e) = gated {
            let _ = child.wait().await;
            return Err(match e {
                RunError::Fenced { .. } => e,
                other => spawn_err(other.to_string()),
            });
        }
        // Under a tracer (`strace -f`, a debugger) the gate's SIGSTOP is first a
        // signal-delivery stop ('t'), and a SIGCONT sent then is lost when the tracer
        // re-injects the SIGSTOP: the gate would stay stopped for ever. So until the gate
        // has exec'd the program (or exited), a stopped gate gets SIGCONT again, for at
        // most 10 s. Its pid cannot be reused meanwhile: it is our unreaped child. Without
        // a tracer the exec follows the first SIGCONT within a millisecond or so.
        for _ in 0..10_000 {
            if !procs::is_gate(pid) {
                break;
            }
            if matches!(procs::state_of(pid), Some('T' | 't')) {
                procs::kill_group(pid, Signal::CONT);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(RunCommand { pid, child })
    }
}
