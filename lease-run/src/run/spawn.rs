//! The spawn gate: a command's record is durable before its program starts.

use super::step::blocking;
use super::{Run, Shared, StepName};
use crate::clock::wall_now;
use crate::error::RunError;
use crate::fence::{gate, start_tracked};
use crate::procs::{self, INCARNATION_VAR};
use lease_core::{CommandRecord, Dir, FileRef, Identity, encode};
use lease_fs::{FsError, primitives, probe};
use rustix::process::Signal;
use std::ffi::{OsStr, OsString};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// A command started by [`Command::spawn`] (or [`Run::spawn`]), like
/// `tokio::process::Child`: its pipes, `wait`, `try_wait`, `kill`, `wait_with_output`.
///
/// Its process group stays tracked by the run: whatever it leaves behind is killed at
/// release or on a fence. **Fences are reported:** once the run is fenced its watchdog
/// kills the command, and [`RunCommand::wait`] then answers [`RunError::Fenced`] (with the
/// fence's reason) instead of "killed by signal 9".
pub struct RunCommand {
    pid: u32,
    child: Child,
    shared: Arc<Shared>,
    /// The command's stdin, if it was [`Command::stdin`]`(Stdio::piped())`.
    pub stdin: Option<tokio::process::ChildStdin>,
    /// The command's stdout, if piped.
    pub stdout: Option<tokio::process::ChildStdout>,
    /// The command's stderr, if piped.
    pub stderr: Option<tokio::process::ChildStderr>,
}

impl std::fmt::Debug for RunCommand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunCommand")
            .field("pid", &self.pid)
            .field("run", &self.shared.run)
            .finish_non_exhaustive()
    }
}

/// The gate's process as this process holds it: tokio's child (started by tokio, moved into
/// the cgroup afterwards), or one started directly in the cgroup ([`crate::clone_into`]),
/// held by its pidfd.
enum Child {
    Tokio(tokio::process::Child),
    Own(OwnChild),
}

/// A child started by [`crate::clone_into`]: waited for through its pidfd (readable once
/// it exited; `waitid(P_PIDFD)` reaps it), never by pid.
struct OwnChild {
    /// `None` only once dropped.
    pidfd: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
    status: Option<ExitStatus>,
}

impl Drop for OwnChild {
    /// Never leave a zombie behind (as tokio reaps a dropped child in the background): a
    /// child still running when its handle goes is reaped by a thread of its own, blocked
    /// on its pidfd until it exits.
    fn drop(&mut self) {
        // Already reaped (`try_wait` answers the kept status), or reaped now.
        if matches!(self.try_wait(), Ok(Some(_))) {
            return;
        }
        let Some(fd) = self.pidfd.take() else {
            return;
        };
        let fd = fd.into_inner();
        let _ = std::thread::Builder::new()
            .name("lease-run-reap".into())
            .spawn(move || {
                let _ = rustix::process::waitid(
                    rustix::process::WaitId::PidFd(std::os::fd::AsFd::as_fd(&fd)),
                    rustix::process::WaitIdOptions::EXITED,
                );
            });
    }
}

impl OwnChild {
    fn new(pidfd: std::os::fd::OwnedFd) -> std::io::Result<OwnChild> {
        Ok(OwnChild {
            pidfd: Some(crate::clone_into::watch_pidfd(pidfd)?),
            status: None,
        })
    }

    fn fd(&self) -> std::io::Result<&tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
        self.pidfd
            .as_ref()
            .ok_or_else(|| std::io::Error::other("the child's pidfd is gone"))
    }

    /// Reap it if it exited (`WNOHANG`).
    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if let Some(st) = self.status {
            return Ok(Some(st));
        }
        use rustix::process::{WaitId, WaitIdOptions, waitid};
        let got = waitid(
            WaitId::PidFd(std::os::fd::AsFd::as_fd(self.fd()?.get_ref())),
            WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
        )?;
        // A wait status as `waitpid` gives it: the code in the second byte, or the signal
        // (with 0x80 when it dumped core).
        let raw = got.and_then(|w| match (w.exit_status(), w.terminating_signal()) {
            (Some(code), _) => Some((code & 0xff) << 8),
            (None, Some(sig)) => Some(sig | if w.dumped() { 0x80 } else { 0 }),
            (None, None) => None,
        });
        self.status = raw.map(ExitStatus::from_raw);
        Ok(self.status)
    }

    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        loop {
            if let Some(st) = self.try_wait()? {
                return Ok(st);
            }
            let mut ready = self.fd()?.readable().await?;
            ready.clear_ready();
        }
    }
}

impl Child {
    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            Child::Tokio(c) => c.wait().await,
            Child::Own(c) => c.wait().await,
        }
    }

    fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        match self {
            Child::Tokio(c) => c.try_wait(),
            Child::Own(c) => c.try_wait(),
        }
    }

    /// Its piped standard streams (none for a directly started child: it inherits them).
    #[allow(clippy::type_complexity)]
    fn take_stdio(
        &mut self,
    ) -> (
        Option<tokio::process::ChildStdin>,
        Option<tokio::process::ChildStdout>,
        Option<tokio::process::ChildStderr>,
    ) {
        match self {
            Child::Tokio(c) => (c.stdin.take(), c.stdout.take(), c.stderr.take()),
            Child::Own(_) => (None, None, None),
        }
    }
}

impl RunCommand {
    /// Its pid (also its process group id).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// An exit by a signal while the run is fenced is the fence's kill: report the fence.
    fn judge(&self, status: ExitStatus) -> Result<ExitStatus, RunError> {
        if status.signal().is_some() {
            if let Some(reason) = self.shared.fence_reason() {
                return Err(self.shared.fenced_error(reason));
            }
        }
        Ok(status)
    }

    /// Wait for it to exit. `Err(`[`RunError::Fenced`]`)` when it was killed by a signal
    /// while the run is fenced (the fence killed it); an I/O failure of the wait is
    /// [`RunError::Io`].
    pub async fn wait(&mut self) -> Result<ExitStatus, RunError> {
        let status = self.wait_raw().await?;
        self.judge(status)
    }

    /// Wait for it to exit and return its status as the OS reports it, fence or not: for a
    /// caller that reports the fence itself (it can ask [`Run::check_live`]), as
    /// `runlease run` does with the command's exit code.
    pub async fn wait_raw(&mut self) -> Result<ExitStatus, RunError> {
        drop(self.stdin.take());
        self.child.wait().await.map_err(|e| self.io("wait", e))
    }

    /// Its exit status if it has exited, without waiting (fences reported as by
    /// [`RunCommand::wait`]).
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>, RunError> {
        match self.child.try_wait().map_err(|e| self.io("try_wait", e))? {
            Some(st) => self.judge(st).map(Some),
            None => Ok(None),
        }
    }

    /// Send SIGKILL to its whole process group (it is the leader) without waiting; a
    /// command that already exited is left alone (its group id may be reused once reaped).
    pub fn start_kill(&mut self) -> Result<(), RunError> {
        if self
            .child
            .try_wait()
            .map_err(|e| self.io("try_wait", e))?
            .is_none()
        {
            procs::kill_group(self.pid, Signal::KILL);
        }
        Ok(())
    }

    /// SIGKILL its process group and wait for it to exit.
    pub async fn kill(&mut self) -> Result<(), RunError> {
        self.start_kill()?;
        self.child.wait().await.map_err(|e| self.io("wait", e))?;
        Ok(())
    }

    /// Wait for it to exit, collecting its piped stdout and stderr (see
    /// `tokio::process::Child::wait_with_output`); fences reported as by
    /// [`RunCommand::wait`].
    pub async fn wait_with_output(mut self) -> Result<Output, RunError> {
        drop(self.stdin.take());
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (so, se) = (self.stdout.take(), self.stderr.take());
        let read_out = async {
            if let Some(mut so) = so {
                so.read_to_end(&mut out).await?;
            }
            Ok::<(), std::io::Error>(())
        };
        let read_err = async {
            if let Some(mut se) = se {
                se.read_to_end(&mut err).await?;
            }
            Ok::<(), std::io::Error>(())
        };
        let (a, b, st) = tokio::join!(read_out, read_err, self.child.wait());
        a.and(b).map_err(|e| self.io("read output", e))?;
        let status = st.map_err(|e| self.io("wait", e))?;
        let status = self.judge(status)?;
        Ok(Output {
            status,
            stdout: out,
            stderr: err,
        })
    }

    fn io(&self, what: &str, e: std::io::Error) -> RunError {
        RunError::os(
            format!("run {}: command {}: {what}", self.shared.run, self.pid),
            e,
        )
    }
}

/// A command to start under the run, like `tokio::process::Command`: built with
/// [`Run::command`], started with [`Command::spawn`] (or [`Command::output`]).
///
/// It starts through the spawn gate (its record is durable before its program runs), in
/// a process group of its own tracked by the run, with these variables set after the
/// caller's (so they cannot be overridden), the same as `runlease run` gives its command:
/// `RUNLEASE_RUN` (the absolute run folder), `RUNLEASE_GENERATION`, `RUNLEASE_OWNER` (the
/// owner id), `RUNLEASE_AUTHORITY` (only for an etcd authority), the incarnation secret
/// ([`INCARNATION_VAR`]) and, when the run serves its store, `RUNLEASE_STORE_SOCKET`
/// ([`crate::store_client`]). Standard streams are inherited unless set.
///
/// ```no_run
/// # async fn demo(run: &lease_run::Run) -> Result<(), lease_run::RunError> {
/// use std::process::Stdio;
/// let out = run
///     .command("sh")
///     .args(["-c", "echo $RUNLEASE_GENERATION"])
///     .current_dir("/tmp")
///     .env("GREETING", "hi")
///     .stdin(Stdio::null())
///     .output()
///     .await?;
/// assert!(out.status.success());
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Command<'r> {
    run: &'r Run,
    program: OsString,
    args: Vec<OsString>,
    envs: Vec<(OsString, Option<OsString>)>,
    env_clear: bool,
    cwd: Option<PathBuf>,
    stdin: Option<Stdio>,
    stdout: Option<Stdio>,
    stderr: Option<Stdio>,
}

impl<'r> Command<'r> {
    /// One argument.
    pub fn arg(&mut self, arg: impl AsRef<OsStr>) -> &mut Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    /// Several arguments.
    pub fn args<I, S>(&mut self, args: I) -> &mut Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Set a variable.
    pub fn env(&mut self, key: impl AsRef<OsStr>, val: impl AsRef<OsStr>) -> &mut Self {
        self.envs.push((
            key.as_ref().to_os_string(),
            Some(val.as_ref().to_os_string()),
        ));
        self
    }

    /// Set several variables.
    pub fn envs<I, K, V>(&mut self, vars: I) -> &mut Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        for (k, v) in vars {
            self.env(k, v);
        }
        self
    }

    /// Remove a variable (inherited or set earlier).
    pub fn env_remove(&mut self, key: impl AsRef<OsStr>) -> &mut Self {
        self.envs.push((key.as_ref().to_os_string(), None));
        self
    }

    /// Start from an empty environment (the run's own variables are still set).
    pub fn env_clear(&mut self) -> &mut Self {
        self.env_clear = true;
        self.envs.clear();
        self
    }

    /// The working directory of the program.
    pub fn current_dir(&mut self, dir: impl AsRef<Path>) -> &mut Self {
        self.cwd = Some(dir.as_ref().to_path_buf());
        self
    }

    /// Its stdin (default: inherited).
    pub fn stdin(&mut self, cfg: impl Into<Stdio>) -> &mut Self {
        self.stdin = Some(cfg.into());
        self
    }

    /// Its stdout (default: inherited).
    pub fn stdout(&mut self, cfg: impl Into<Stdio>) -> &mut Self {
        self.stdout = Some(cfg.into());
        self
    }

    /// Its stderr (default: inherited).
    pub fn stderr(&mut self, cfg: impl Into<Stdio>) -> &mut Self {
        self.stderr = Some(cfg.into());
        self
    }

    /// Start it (see [`Run::spawn`] for the gate and what can fail). The standard stream
    /// settings are used up: a second `spawn` of the same builder inherits them.
    pub async fn spawn(&mut self) -> Result<RunCommand, RunError> {
        let run = self.run;
        run.spawn_command(self).await
    }

    /// Start it with stdout and stderr piped (unless set) and stdin null (unless set), and
    /// collect its output.
    pub async fn output(&mut self) -> Result<Output, RunError> {
        self.stdin.get_or_insert_with(Stdio::null);
        self.stdout.get_or_insert_with(Stdio::piped);
        self.stderr.get_or_insert_with(Stdio::piped);
        self.spawn().await?.wait_with_output().await
    }
}

/// Kills a spawn gate's group when dropped armed (the spawn was cancelled before the
/// gate was continued). Its pid cannot be reused meanwhile: the gate is our unreaped child.
struct KillGateOnDrop(Option<u32>);

impl Drop for KillGateOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            procs::kill_group(pid, Signal::KILL);
        }
    }
}

impl Run {
    /// A command to start under this run, configured like `tokio::process::Command`
    /// ([`Command`]).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command<'_> {
        Command {
            run: self,
            program: program.as_ref().to_os_string(),
            args: Vec::new(),
            envs: Vec::new(),
            env_clear: false,
            cwd: None,
            stdin: None,
            stdout: None,
            stderr: None,
        }
    }

    /// Start `argv` with `env` added, in its own process group, stdio inherited: the short
    /// form of `run.command(&argv[0]).args(&argv[1..]).envs(env).spawn()` ([`Command`]).
    /// Its [`CommandRecord`] is durable in `commands/` before the program starts: see the
    /// crate docs ("The spawn gate") for exactly what runs before.
    pub async fn spawn(
        &self,
        argv: &[String],
        env: &[(String, String)],
    ) -> Result<RunCommand, RunError> {
        let Some((program, args)) = argv.split_first() else {
            return Err(RunError::InvalidArgument(
                "argv must be non-empty with a non-empty program".into(),
            ));
        };
        self.command(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .spawn()
            .await
    }

    async fn spawn_command(&self, spec: &mut Command<'_>) -> Result<RunCommand, RunError> {
        if spec.program.is_empty() {
            return Err(RunError::InvalidArgument(
                "argv must be non-empty with a non-empty program".into(),
            ));
        }
        // The record's argv (for audits and `doctor`): lossy where not UTF-8.
        let argv: Vec<String> = std::iter::once(&spec.program)
            .chain(&spec.args)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
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
        // The gate's environment as operations on the inherited one (or on an empty one
        // after `env_clear`), in order: the caller's, then the run's own variables, set
        // after the caller's so they cannot be overridden.
        let mut env: Vec<(OsString, Option<OsString>)> = spec.envs.clone();
        let mut set = |k: &str, v: Option<&OsStr>| env.push((k.into(), v.map(OsStr::to_os_string)));
        set("RUNLEASE_RUN", Some(self.path.as_os_str()));
        set(
            "RUNLEASE_GENERATION",
            Some(OsStr::new(&self.lease.generation.get().to_string())),
        );
        set(
            "RUNLEASE_OWNER",
            Some(OsStr::new(self.lease.owner_id.as_str())),
        );
        // The authority, so `runlease append`/`release` in the command find the lease
        // where it lives; an inherited one must not point the command elsewhere.
        set(
            "RUNLEASE_AUTHORITY",
            self.opts.authority.url().as_deref().map(OsStr::new),
        );
        // The proof a later owner asks for before it signals a process this one started
        // (PROTOCOL §11.1); set after `env`, so a caller cannot override it.
        set(INCARNATION_VAR, Some(OsStr::new(&self.shared.incarnation)));
        // The store socket this owner serves (an inherited one names another owner's).
        set(
            crate::store_socket::SOCKET_VAR,
            self.shared.store_socket.get().map(OsStr::new),
        );
        let incarnation = CommandRecord::incarnation_digest(
            &self.lease.run_id,
            self.lease.generation,
            &self.shared.incarnation,
        );
        // The incarnation's mark (PROTOCOL §11.1), created at the first spawn: every
        // command inherits it as a descriptor, the proof a later owner accepts after
        // `env -i`. No memfd (an old kernel, a seccomp filter): the secret alone proves.
        let mark = {
            let mut t = self.shared.tracked();
            if t.mark.is_none() {
                match procs::Mark::create(&self.lease.run_id, self.lease.generation, &incarnation) {
                    Ok(m) => t.mark = Some(Arc::new(m)),
                    Err(e) => tracing::warn!(
                        run = %run,
                        error = %e,
                        "no incarnation mark (memfd): commands are proved by their environment only"
                    ),
                }
            }
            t.mark.clone()
        };
        let mark_fd = mark.as_ref().map(|m| m.fd_number().to_string());
        set(procs::MARK_FD_VAR, mark_fd.as_deref().map(OsStr::new));
        let gate_argv: Vec<&OsStr> = procs::GATE[1..]
            .iter()
            .map(OsStr::new)
            .chain(std::iter::once(spec.program.as_os_str()))
            .chain(spec.args.iter().map(OsString::as_os_str))
            .collect();
        // Born in the run's cgroup when the kernel can (`clone3(CLONE_INTO_CGROUP)`, issue
        // #33: a move afterwards waits an RCU grace period that blocks every fork), for a
        // command whose standard streams are inherited (`std::process::Stdio` cannot be
        // taken apart into descriptors); otherwise tokio's spawn and the move below.
        let cgroup = self.shared.tracked().cgroup.clone();
        let direct = match &cgroup {
            Some(cg) if spec.stdin.is_none() && spec.stdout.is_none() && spec.stderr.is_none() => {
                let mut vars: std::collections::BTreeMap<OsString, OsString> = if spec.env_clear {
                    Default::default()
                } else {
                    std::env::vars_os().collect()
                };
                for (k, v) in &env {
                    match v {
                        Some(v) => vars.insert(k.clone(), v.clone()),
                        None => vars.remove(k),
                    };
                }
                let argv =
                    std::iter::once(OsStr::new(procs::GATE[0])).chain(gate_argv.iter().copied());
                let program = crate::clone_into::Program::new(
                    OsStr::new(procs::GATE[0]),
                    argv,
                    vars,
                    spec.cwd.as_deref(),
                )
                .map_err(|e| spawn_err(format!("cannot start /bin/sh: {e}")))?;
                Some(program.into_direct(cg.clone()))
            }
            _ => None,
        };
        let mut cmd = tokio::process::Command::new(procs::GATE[0]);
        cmd.args(&gate_argv).process_group(0);
        if spec.env_clear {
            cmd.env_clear();
        }
        for (k, v) in &env {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        if let Some(d) = &spec.cwd {
            cmd.current_dir(d);
        }
        if let Some(s) = spec.stdin.take() {
            cmd.stdin(s);
        }
        if let Some(s) = spec.stdout.take() {
            cmd.stdout(s);
        }
        if let Some(s) = spec.stderr.take() {
            cmd.stderr(s);
        }
        // Start and track in one critical section of the tracking lock, so the watchdog
        // never takes a snapshot without the group (`fence::fence_tick`).
        let adopt = self.opts.subreaper;
        let (mut child, pid, born_inside) = start_tracked(&self.shared.tracked, |t| {
            let mut start = || -> std::io::Result<(Child, u32, bool)> {
                if let Some(d) = &direct {
                    if let Some((pid, pidfd)) = d.spawn()? {
                        return Ok((Child::Own(OwnChild::new(pidfd)?), pid, true));
                    }
                }
                let c = cmd.spawn()?;
                let pid = c
                    .id()
                    .ok_or_else(|| std::io::Error::other("the child has no pid"))?;
                Ok((Child::Tokio(c), pid, false))
            };
            let spawned = match &mark {
                Some(m) => m.inheritable(start),
                None => start(),
            };
            let (child, pid, born_inside) =
                spawned.map_err(|e| spawn_err(format!("cannot start /bin/sh: {e}")))?;
            t.groups.insert(pid);
            t.adopt_children = adopt;
            // The leader's start time at once (it is our unreaped child, its pid cannot be
            // reused yet): its group counts as ours exactly while it exists (`procs`);
            // nothing that started before the first command is ever adopted or swept.
            if let Ok(Some(st)) = probe::process_start_time(pid) {
                t.known.insert(pid, st);
                t.leaders.insert((pid, st));
                crate::procs::register_leader(pid, st);
                t.since = Some(t.since.map_or(st, |s| s.min(st)));
            }
            Ok::<_, RunError>((child, pid, born_inside))
        })?;
        // Dropped (cancelled) from here until the gate is continued or killed, the gate is
        // killed: its program never runs, and no stopped gate is left behind.
        let mut unstarted = KillGateOnDrop(Some(pid));
        // Wait until the gate has stopped itself, then record, then continue it.
        let (dir, lease, argv2) = (self.dir.clone(), self.lease.clone(), argv);
        let mark_id = mark.as_ref().map(|m| m.id.clone());
        let recorded = blocking(
            &run,
            StepName::Commands,
            self.opts.step_deadline,
            move || {
                let start = Instant::now();
                let end = start + Duration::from_secs(5);
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
                        // A shell stops itself within about a millisecond: polled every
                        // 50 µs for the first 20 ms (a 1 ms poll cost a whole millisecond
                        // per command, issue #19), then every millisecond.
                        _ if start.elapsed() < Duration::from_millis(20) => {
                            std::thread::sleep(Duration::from_micros(50))
                        }
                        _ => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
                if let Some(cg) = cgroup.as_ref().filter(|_| !born_inside) {
                    // Before the program starts: all it ever forks is born inside.
                    crate::cgroup::Cgroup::at(cg.clone())
                        .add(pid)
                        .map_err(|e| {
                            RunError::os(format!("cannot move {pid} into {}", cg.display()), e)
                        })?;
                }
                let start_time = probe::process_start_time(pid)
                    .map_err(|e| RunError::os(format!("/proc/{pid}/stat"), e))?
                    .ok_or_else(|| RunError::Io(format!("command {pid} vanished")))?;
                let boot = probe::boot_id().map_err(|e| RunError::os("boot id", e))?;
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
                    // The cgroup it was just moved into, as this owner created it: what a
                    // later owner checks before it kills or removes a leftover (issue #29).
                    cgroup: cgroup
                        .as_deref()
                        .map(crate::cgroup::identity)
                        .transpose()
                        .map_err(|e| RunError::os("the run's cgroup", e))?,
                    // The mark it inherited: what a later owner finds among the descriptors
                    // of its descendants, whatever they did to their environment.
                    mark: mark_id,
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
        // Then, before the program can run, the guard (if the run has one) holds the
        // leader by a pidfd opened now, while the leader is our stopped, unreaped gate:
        // from its first instruction on the program is killed by the self-fence deadline
        // even if this process is stopped (issue #31). Order: tracked, recorded, guarded,
        // live, continued.
        let recorded = recorded.and_then(|()| self.shared.guard_leader(pid));
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
        unstarted.0 = None;
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
        // a tracer (`TracerPid: 0`) the first SIGCONT cannot be lost, and the spawn returns
        // at once (issue #19: waiting for the exec cost 1.7–3.7 ms per command, polled on
        // the runtime's 1 ms timer).
        let traced = procs::tracer_of(pid) != Some(0);
        for _ in 0..if traced { 10_000 } else { 0 } {
            if !procs::is_gate(pid) {
                break;
            }
            if matches!(procs::state_of(pid), Some('T' | 't')) {
                procs::kill_group(pid, Signal::CONT);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (stdin, stdout, stderr) = child.take_stdio();
        Ok(RunCommand {
            pid,
            stdin,
            stdout,
            stderr,
            child,
            shared: self.shared.clone(),
        })
    }
}
