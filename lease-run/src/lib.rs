//! # lease-run — the run lifecycle for runlease on tokio (issue #6)
//!
//! [`Run::open`] owns a run folder (composed from `lease-core`, `lease-fs` and
//! `lease-sqlite`): it takes the kernel owner lock, claims the lease, writes `run.json`,
//! heartbeats, self-fences on `CLOCK_BOOTTIME`, runs a watchdog OS thread that kills the
//! commands even when the tokio runtime is blocked, reaps a killed incarnation's commands,
//! opens the run's store and checks it against the seal and floor of the lease chain, and
//! [`Run::release`]s (sealing the store).
//!
//! ## Read first: what it does to your process, and the path rule
//!
//! - **Absolute paths.** [`Run::open`] and [`Run::acquire`] take the run folder's
//!   absolute path and refuse a relative one with `ARGUMENT_INVALID` before touching
//!   anything (a relative path would be resolved against a working directory that may
//!   change under a long-lived owner). Make it absolute once, yourself:
//!   `std::path::absolute(p)?`, and pass that same path to every call.
//! - **Your process becomes a child subreaper** at the first command
//!   ([`OpenOptions::subreaper`], on by default, `PR_SET_CHILD_SUBREAPER`): orphans of
//!   *any* child of your process are reparented to it, and a run adopts and reaps those
//!   that started after its first command. It stays a subreaper for the rest of the
//!   process's life. Turn it off if your program manages other children of its own (the
//!   run then finds escaped commands only by their mark, see "Escapes").
//! - **Signal handlers stay installed** once [`Run::release_on_signals`] has been called
//!   (tokio's: from then on the signals it names no longer terminate the process by
//!   default). Nothing else installs a handler.
//! - **A tokio runtime that keeps running** is needed while a run is open: its heartbeat
//!   is a task. Its self-fence and the kill of its commands are not: they run on an OS
//!   thread of their own (the watchdog), so a blocked runtime still fences.
//! - **Commands run in a cgroup** of their own below your process's cgroup when cgroup v2
//!   lets this user create one, else in their own process group and session.
//!
//! ## The shortest correct use
//!
//! ```
//! use lease_run::{Batch, FinalStatus, OpenOptions, Run};
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! # rt.block_on(async {
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("demo-run");
//! let run = Run::open(&path, OpenOptions::default()).await?;
//! let mut cmd = run.spawn(&["true".to_string()], &[]).await?;
//! assert!(cmd.wait().await?.success());
//!
//! // Commit to the run's store as this generation (blocking: `Run::commit` runs it off
//! // the runtime; `run.store()` gives the blocking handle).
//! let seq = run.commit(Batch::new().put("step/1", "done").log("step 1")).await?;
//! assert_eq!(seq, 1);
//! assert_eq!(run.store().get("step/1")?.unwrap().value, b"done");
//! run.release(FinalStatus::Done).await?;
//!
//! // The release sealed the store at its head; the next owner checks that seal.
//! let status: lease_run::RunStatus =
//!     lease_run::decode(&std::fs::read(path.join("run.json"))?)?;
//! assert_eq!(status.sealed_sequence, Some(1));
//! let run = Run::open(&path, OpenOptions::default()).await?;
//! assert!(run.generation().get() > 1);
//! assert_eq!(run.store().head()?, 1);
//! run.release(FinalStatus::Paused { wake_at: None }).await?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The same with a stalled owner whose fence is observed (the command's wait, a refused
//! commit): `examples/open_commit_spawn_release.rs` (`cargo run -p lease-run --example
//! open_commit_spawn_release`).
//!
//! ## Guarantees
//!
//! - **One owner at a time.** Another process replaces this owner only once its heartbeat
//!   is stale or it is proved dead; before that, this owner has fenced itself: once it can
//!   no longer prove its lease (its last successful heartbeat started more than
//!   `self_fence_after` ago on `CLOCK_BOOTTIME`, or a heartbeat was answered `FENCED`) it
//!   is fenced: [`Run::check_live`] and every store commit fail with `FENCED`
//!   ([`RunError::is_fenced`]) and the watchdog thread kills its commands.
//! - **Nothing counts after a fence.** Commits carry the generation as a fencing token
//!   checked inside the store's transaction; a replaced owner's writes are refused.
//! - **Cancellation-safe** (below): dropping a future of this crate, or a [`Run`], never
//!   leaves a heartbeat running or a run its own process cannot open again.
//!
//! ## Cancellation
//!
//! Every future of lease-run either completes or, dropped, leaves the run in a state its
//! own process recovers without an operator:
//!
//! - [`Run::open`] runs its steps in a task of its own. Dropped (a `timeout`, a losing
//!   `select!` branch), the task sees it between two steps and undoes the open as a failed
//!   open is undone (tasks stopped, `run.json` `failed` with a detail saying so, the lease
//!   released with the seal, the owner lock dropped); dropped after its last step, the run
//!   it opened is released as `failed`.
//! - [`Run::release`] (and [`Run::release_detached`]) run in a task of their own and
//!   finish even when their caller stops waiting.
//! - Dropping a [`Run`] that was not released (an early `?`, a panic) stops its heartbeat
//!   at once and releases it as `failed` on a background thread (commands stopped first,
//!   store sealed), so the run is free moments later instead of going stale.
//! - [`Run::spawn`] dropped before its command started kills the stopped gate (the
//!   program never runs); [`Run::commit`] and [`Run::set_status`] dropped finish their
//!   blocking write in the background (an unacknowledged commit may or may not be in the
//!   store, as with any lost acknowledgement).
//! - Until such a hand-back is done the path is busy for this process: the next
//!   [`Run::open`] of it waits for it first, and [`Run::settle`] waits for it explicitly.
//!
//! **Limits.** The background work lives in this process: if the process exits (or the
//! tokio runtime running a cancelled open is shut down) before it is done, the run is left
//! as after a crash: its owner is gone, `status` says dead (or stale), and `retire` (or an
//! open with [`OpenOptions::retire_dead`]) frees it. A fenced run is never released by a
//! drop (the lease is someone else's); the watchdog finishes the kill. The suite in
//! `tests/cancellation.rs` drops the open and the release at each of their steps and
//! await points and prints `cancellation: points=N leaked_heartbeats=0 unrecoverable=0`.
//!
//! ## Where the lease lives ([`OpenOptions::authority`], [`authority`])
//!
//! By default the lease is in the run folder (lease-fs's `RunDir`). With the cargo feature
//! **`etcd`** (off by default: etcd-client's build script needs `protoc`),
//! `Authority::Etcd(addr)` keeps it in an etcd cluster under `/<prefix>/<run id>/` instead
//! (lease-etcd; the run id is the folder's name). Every step below goes through the
//! [`LeaseAuthority`] trait, so there is one code path. **Only the lease moves**:
//! `run.json`, command records, the owner lock, the cgroup and the store stay in the run
//! folder, and the seal and floor are read from the lease chain wherever it lives (a
//! folder lacking the store the chain names is `STORE_MISSING`). With etcd, "dead" (for
//! `retire_dead`) is the owner's etcd lease gone, not a pid probe; each heartbeat ends by
//! the self-fence deadline, and every etcd operation of a step by half the step's
//! deadline (`UNAVAILABLE`, exit 69, rather than a hang); commands get
//! `RUNLEASE_AUTHORITY` (the `etcd://` URL; removed from their environment otherwise).
//!
//! ```no_run
//! # #[cfg(feature = "etcd")]
//! # async fn etcd_example() -> Result<(), Box<dyn std::error::Error>> {
//! use lease_run::{Authority, FinalStatus, OpenOptions, Run};
//! let addr = lease_etcd::AuthorityAddr::parse("etcd://10.0.0.1:2379,10.0.0.2:2379/runlease")?;
//! let opts = OpenOptions { authority: Authority::Etcd(addr), ..OpenOptions::default() };
//! // The lease of run "job" is in etcd; run.json, commands and the store in /srv/runs/job.
//! let run = Run::open(std::path::Path::new("/srv/runs/job"), opts).await?;
//! run.release(FinalStatus::Done).await?;
//! # Ok(())
//! # }
//! ```
//!
//! ## Open, in order (each step timed: [`OpenOptions::on_step`] and a `lease_run.step` span)
//!
//! 1. `owner-lock`: `flock` on `owner.lock` through the held root descriptor, retried for
//!    `lock_timeout`; held → `OWNER_LOCK_HELD` (76). With etcd, then the connection to the
//!    cluster.
//! 2. `read-status`: the previous `run.json`; an invalid one is `RECORD_INVALID` (65) and is
//!    never overwritten (nothing is claimed). Then the preflight, read-only: the layout and
//!    every command record ([`preflight`]); the head readable and reaching `run.json`
//!    ([`chain_reaches`]); and unless the run is held and will not be replaced, the whole
//!    log and both chains by the call `runlease verify` makes (its codes), no heartbeat,
//!    cutoff or command record named above the head (`RUN_LAYOUT_INVALID`), and the store
//!    the chain names present (`STORE_MISSING`). A refusal here uses up no generation.
//! 3. `claim`: claim the lease; with [`OpenOptions::takeover`], an exact takeover of a
//!    stale owner instead (the caller's observation: owner id, heartbeat time and count);
//!    with [`OpenOptions::retire_dead`], a definitely-dead owner (judged with the owner lock
//!    held) is retired first.
//! 4. `run.json`: status `running`, the new generation and holder, no sealed sequence (the
//!    seal is the chain's; written once per open, durably).
//! 5. `heartbeat`: the cgroup v2 directory for the commands (when one can be created, see
//!    "Escapes"), the child subreaper, the heartbeat task, the async self-fence timer and
//!    the watchdog thread (the guard process, if any, starts at the first command).
//! 6. `layout`: `store/`, `work/`, `tmp/` (0700).
//! 7. `commands`: reap or refuse older generations' commands, by their records and by
//!    their cgroups (below).
//! 8. `store`: read this generation's epoch and the one the claim replaced; from them
//!    [`lease_core::seal::requirements`] gives the seal (of a clean release: store id,
//!    sequence, generation) and the floor (the highest store head any change of owner
//!    recorded, including the head a crashed or stale owner last reported in a heartbeat).
//!    Open `store/run.sqlite` beneath the held `store/` descriptor
//!    (`lease_sqlite::Store::open_in`) expecting the sealed store id;
//!    a new store is created only when the chain names none (no seal, floor absent or 0);
//!    otherwise a missing store is `STORE_MISSING` (65), never recreated.
//! 9. `seal`: `OpenedStore::check_seal(seal, floor)`: another store id is
//!    `STORE_IDENTITY_MISMATCH` (65), a head below the seal or the floor `STORE_BEHIND_SEAL`
//!    (65). The commit gate (the self-fence rule) is installed; the store is live.
//!
//! A failure after the claim (at any step, including a claim or takeover that failed after
//! creating its epoch) hands the run back: tasks stopped; unless fenced, the store is
//! sealed if it was opened (else the seal the chain requires of this owner, known from the
//! claim on, is re-issued, stamped with this generation, which committed nothing: a failed
//! open never drops the identity binding), `run.json` is written `failed` with `detail` =
//! the error's code and message (best effort: if it cannot be written the release still
//! happens), and the lease is released with that seal, so the run is free; the owner lock
//! is dropped; the watchdog thread ends.
//!
//! ## The store ([`Run::store`], [`RunStore`])
//!
//! One `lease_sqlite::Store` per run, behind a mutex (the store is `Send`, not `Sync`).
//! Every commit is stamped with the run's generation as its fencing token, and the store's
//! commit gate applies the self-fence rule before the transaction starts, so no commit
//! begins after the deadline (PROTOCOL §7.11); the store itself refuses a token below the
//! highest it accepted (`FENCED`). Each heartbeat reports the head after the last
//! acknowledged commit (read before the beat starts) in `lease/beats/<g>.json`; whoever
//! takes over or retires this owner records it as the next epoch's `store_floor`. A
//! [`Run::commit`] is in the floor from the next heartbeat on; [`Run::commit_covered`] and
//! every commit made through the store socket (below) are in it before they are
//! acknowledged (one durable heartbeat carrying the head). Once fenced, the store is closed (by the
//! watchdog, the release, or the next call), so the next owner in another process can
//! open it; a process stuck while holding it keeps it locked (the next owner gets
//! `STORE_BUSY`, 75, and retries) until it dies.
//!
//! ## The store served to the commands ([`store_client`], [`OpenOptions::serve_store`])
//!
//! A command cannot open the store (its owner holds it exclusively), so the owner serves
//! it: at the `heartbeat` step it listens on an abstract Unix socket named with 128 random
//! bits and gives every command its name (`RUNLEASE_STORE_SOCKET`) beside the incarnation
//! secret. A request is answered only for a peer of the owner's user carrying that secret
//! (`STORE_REQUEST_REFUSED`, 77, otherwise) and stamped with the owner's generation
//! (`FENCED` otherwise); the owner must be live (`FENCED` once fenced; nobody answers once
//! it released). Commits are **group commits**: every request queued while the previous
//! group was being made goes into one store transaction (each its own sequence), then one
//! durable heartbeat carries the new head, then all are answered, so an acknowledged commit
//! is always in the floor (a copy of the store rewound below it is refused after a crash).
//! `runlease release` inside a command arrives there too ([`Run::release_requested`]).
//! [`store_client::StoreClient`] is the command's side:
//!
//! ```no_run
//! // In a program started as a command of a run (`run.command(..)` or `runlease run`):
//! use lease_run::{Batch, store_client::StoreClient};
//! let mut store = StoreClient::from_env()?.expect("started by a serving owner");
//! let seq = store.commit(&Batch::new().put("step/1", "done").log("step 1"))?;
//! assert_eq!(store.get("step/1")?.unwrap().updated_seq, seq);
//! # Ok::<(), lease_run::RunError>(())
//! ```
//!
//! The whole round trip, with a stale generation's request refused `FENCED`:
//! `examples/served_store.rs` (`cargo run -p lease-run --example served_store`).
//!
//! Every `run.json` write (open, [`Run::set_status`], release) first re-reads the lease
//! head and writes only if it is still this owner's active generation and the run is not
//! fenced (otherwise it fences); then atomically replaces the file with fsyncs.
//!
//! ## Self-fence and watchdog
//!
//! The start of the last successful heartbeat-class write (the claim, then each lease
//! heartbeat) is kept in an atomic as `CLOCK_BOOTTIME` nanoseconds. Once it is more than
//! `self_fence_after` old ([`lease_core::must_self_fence`]), or a heartbeat returns
//! `FENCED`, the run is fenced (sticky). [`Run::check_live`] fails from then on; call it
//! before every commit (the store's commit gate does). The watchdog thread (`std::thread`,
//! 100 ms tick, and it also wakes right at the self-fence deadline; atomics and short std
//! mutexes only) applies the same rule on its own, and once fenced SIGKILLs every
//! tracked process on every tick until none is left; only then is the fence *confirmed*
//! ([`Run::fenced`] resolves; with [`OpenOptions::exit_on_fence`] the thread exits the
//! process with 75).
//!
//! **The guard** ([`OpenOptions::guard`], [`guard`]; issue #31). The watchdog thread is
//! inside the owner process: while the owner is stopped (SIGSTOP, a debugger, a frozen
//! container) it is stopped too, and without more the commands would run on beside the
//! next owner (with etcd, the next owner may claim as soon as the stopped owner's etcd
//! lease expires). So when a guard program is named (`runlease run` names its own binary),
//! the first spawn also starts it: a process in a process group of its own, fed over a
//! socket pair each self-fence deadline (after every successful heartbeat), the run's cgroup
//! directory and each command leader as descriptors. Once a deadline passes (plus
//! [`guard::GUARD_GRACE`]) with no later one, or at once when the owner died (or dropped
//! its run) without telling it it is done, the guard kills what it holds and exits; a
//! release, a confirmed fence or a detached release tells it it is done. An owner resumed
//! after the guard killed fences itself as before (its watchdog sees the lapsed deadline,
//! its commands are already gone) and `runlease run` exits 75. Default for the library: no
//! guard.
//!
//! ## Commands and the spawn gate ([`Run::command`], [`Run::spawn`])
//!
//! [`Run::command`] gives a [`Command`] builder modelled on `tokio::process::Command`
//! (`OsStr` arguments, environment, working directory, stdio, `spawn`, `output`); the
//! [`RunCommand`] it starts has its pipes, `wait`, `try_wait`, `kill` (its whole group) and
//! `wait_with_output`, and its `wait` answers [`RunError::Fenced`] when the fence's kill
//! ended it. Every command gets `RUNLEASE_RUN` (the absolute run folder),
//! `RUNLEASE_GENERATION`, `RUNLEASE_OWNER` and the incarnation secret, as under
//! `runlease run`. [`Run::release_on_signals`] turns SIGTERM/SIGINT (or any set) into a
//! release, sending the signal on to the commands first.
//!
//! The child is `/bin/sh -c 'kill -STOP $$ && exec "$@"' lease-run-gate ARGV...` in its own
//! process group (`process_group(0)`), stdio as configured (inherited by default). Its group is tracked by the watchdog
//! from the moment it is spawned (before the gate can be continued). The parent waits (≤ 5 s) until `/proc/<pid>/stat`
//! shows it stopped, writes its `CommandRecord` (pid, pgid, start time, boot id, argv) with a
//! link-exclusive durable create of `commands/<generation>-<pid>.json`, hands the guard (if
//! the run has one, started now at the first command) a pidfd of the stopped gate, checks
//! the run is still live, then sends SIGCONT to the group. **Guarantee:** the program in `ARGV` is not
//! `exec`ed before its record is durable; what runs before is only `/bin/sh` starting and
//! its builtin `kill`. **Limits:** another process of the same user could SIGCONT the gate
//! early; `ARGV[0]` is resolved by `sh` (PATH lookup); a failed record kills the group.
//!
//! ## Reap or refuse (step `commands`)
//!
//! Anyone who can write the run folder can write a record, and pids are reused, so a record
//! never selects what is signalled (docs/PROTOCOL.md §11.1). Each incarnation puts a
//! 128-bit secret into its commands' environment ([`INCARNATION_VAR`]) and writes only its
//! digest (bound to run and generation) into their records. For each record of an older
//! generation from this boot, the processes **proved** to be its are those that carry a
//! secret with that digest, run as our uid and started no earlier than the recorded
//! command, wherever they are (a daemon that left the group included); they get SIGTERM,
//! `term_grace`, SIGKILL and up to `kill_wait` to be gone, through pidfds (zombies count
//! as gone), rescanned every 10 ms. A recorded leader that is alive (same pid and start
//! time) but not proved refuses the open with `RUN_COMMAND_UNPROVEN` (76) and is never
//! signalled; `EPERM` is `RUN_COMMAND_NOT_PERMITTED` (77); a survivor is
//! `RUN_COMMANDS_SURVIVE` (76). Each refusal keeps the record and undoes the claim
//! (`run.json` failed + release). Otherwise the record is removed durably.
//! [`audit_commands`] gives the same judgement without signalling (for doctor).
//!
//! ## Release, in order ([`Run::release`])
//!
//! `stop-commands` (TERM, grace, KILL; records of this generation removed) → `barrier` (the
//! store is taken from every handle after the commit in flight, if any; no commit starts
//! after it) → `seal-store` (`Store::seal`: sealed sequence = the head, bound to the store
//! id and this generation; the store's highest token is raised to it, the WAL checkpointed,
//! the store closed) → `final-status` (`paused`/`done`/`failed`, `sealed_sequence`) →
//! `stop-heartbeat` → `release-lease` (the release epoch carries the seal) → `unlock` →
//! `compact` (best-effort, after the lock is let go: the prune of PROTOCOL §7.10 once the
//! chain grew by [`compact::COMPACT_EVERY`] generations, and orphaned temp files collected;
//! its failure is logged, never the release's, see [`compact`]). Each step has its own
//! deadline. A fenced run: release waits (bounded) for the kill to be confirmed, writes
//! nothing and returns `FENCED`.
//!
//! ## Escapes (what the kill reaches)
//!
//! **With a cgroup v2 subtree** ([`OpenOptions::cgroup`], default on; the `cgroup` module):
//! at open the owner creates `runlease-<key>-<generation>` below its own cgroup (`<key>`:
//! 16 hex digits of SHA-256 over the run's path and id). Each command's spawn gate is
//! started directly inside it (`clone3` with `CLONE_INTO_CGROUP`, Linux 5.7, when its
//! standard streams are inherited), or else moved into it while the gate is stopped, so
//! everything it ever starts is born inside, whatever
//! it does with process groups, sessions or forks. A kill writes `cgroup.kill` (the kernel
//! kills every member, including ones forked meanwhile) besides the signals below; a member
//! counts as alive until it leaves `cgroup.procs`. The release removes the emptied
//! directory. Each command record names the directory's identity (cgroup id and owning
//! uid, [`lease_core::CommandCgroup`]); the next open looks only directly below its own
//! cgroup and kills and removes a killed incarnation's directory only when a record of
//! that generation names exactly its identity and it belongs to the open's own uid
//! (issue #29; the `cgroup` module's "Whose it is"): TERM to the members it proves (pidfd,
//! membership, uid, start time), grace, `cgroup.kill`; a survivor refuses the open (76).
//! A directory named like the run's but not proved its own (another uid's, an identity no
//! record names) is never signalled or removed, and refuses nothing: `doctor` reports it
//! (`CGROUP_NOT_PROVEN`). **What can still escape then:** only a process privileged enough
//! to move itself to another cgroup (root, or an owner of a delegated subtree) or to
//! signal-proof itself; processes in a cgroup subtree another tool manages under ours; and
//! a killed incarnation's cgroup when the next owner runs in another cgroup (it is not
//! looked for there). An empty directory left without a record (a crash between the
//! release's removal of the directory and of the records) is reported, not removed.
//!
//! **Without one** (no cgroup2 mount, or no permission to create a directory below our
//! cgroup: usual for an unprivileged owner without systemd delegation; the reason is logged
//! at `info`): tracked are every recorded process group; every process whose session id
//! equals a recorded group (a command that itself called `setsid`); every descendant seen by
//! a watchdog scan of `/proc` (by parent pid, remembered with its start time, every 100 ms
//! from the first spawn on); every orphan reparented to the owner, a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`, [`OpenOptions::subreaper`], process-wide), confirmed by a
//! pidfd while it is our child (issue #29: a double-forked `setsid` daemon no longer
//! escapes between two scans); and every process of our uid that holds the incarnation's
//! *mark* (a sealed memfd inherited at fd ≥ 1000, `RUNLEASE_INCARNATION_FD`) or carries
//! its secret. After a crash of the owner the next open proves the same way (secret or
//! mark, PROTOCOL §11.1), so `env -i`, `setsid` and `nohup` do not hide a process either.
//! **What can still escape:** a descendant that clears its environment **and** closes the
//! mark's descriptor **and** is reparented to another subreaper (or outlives a crashed
//! owner); any process in another pid namespace or otherwise invisible in our `/proc`;
//! processes we may not signal or read (setuid helpers, non-dumpable: EPERM); work started
//! on the command's behalf by another service. Close these with a cgroup: as an
//! unprivileged user, `systemd-run --user --scope -p Delegate=yes runlease run ...`. With
//! `subreaper` on, a child the embedding program itself spawns in a new process group while
//! a run is open counts as the run's (turn `subreaper` off, or spawn through
//! [`Run::command`]). A process found only by its group or session counts as ours while
//! that group's leader exists with its recorded start time (the number cannot have been
//! reused), afterwards only if it carries the incarnation's secret or mark.
//!
//! **While the owner is stopped** only its guard process acts (see "Self-fence and
//! watchdog"), and it signals only what the owner handed it as a descriptor, never a pid or
//! path it read (anyone who can write the run folder can edit any file in it; pids are
//! reused). With a cgroup it writes `cgroup.kill` of the directory the owner opened for it:
//! every process of the run dies, as above. Without one it holds only the command leaders'
//! pidfds (opened while each leader was the owner's stopped, unreaped spawn gate): it kills
//! each leader through its pidfd and, while that pidfd shows the leader alive (so the group's
//! number is still the leader's), the leader's process group. A group kill cannot prove
//! every member (a process of the owner's session may have joined the group), and it misses
//! whatever left the leader's group (`setsid`, a double fork) and the members of a group
//! whose leader has exited: those run on until the owner resumes and its watchdog kills
//! them (it fences at once), or, after a crash of the owner, until the next open reaps them.
//!
//! In both cases every signal to one process goes through a pidfd opened and re-checked
//! (start time, not exited) first, a group is signalled whole only while its leader is
//! confirmed alive that way, and nothing is ever sent to pid or group 0 or 1, nor to the
//! owner process or its own group.
//!
//! ## Not yet
//!
//! - cgroup v2: no controllers (memory, pids limits) are set; the directory is containment
//!   and kill only. A cgroup that cannot be joined at spawn fails the spawn
//!   (`SPAWN_FAILED`), it never silently falls back for one command.
//! - A `store` or `seal` step that times out keeps running in the blocking pool; if it
//!   finishes after the undo, the store stays open in this process until it exits.
//! - The heartbeat updates the lease beat only; `run.json`'s `heartbeat_at` is written at
//!   `running` and status changes, not on every beat.
//! - Orphan zombies reparented to the owner are reaped by the watchdog only when they are
//!   the run's (adopted or tracked); another orphan's zombie stays until the owner exits.
//! - Release after surviving commands: returns `RUN_COMMANDS_SURVIVE` without releasing the
//!   lease; the watchdog SIGKILLs them once the lease lapses.
//! - Terminal handling (foreground process group): not done. Signal forwarding: by
//!   [`Run::release_on_signals`] (opt-in) and [`Run::command_signaller`]; `runlease run`
//!   forwards SIGINT, SIGTERM and SIGHUP through the same `CommandSignaller`, from its own
//!   signal thread (which keeps a signal that arrives before the command starts, and
//!   escalates a second SIGINT/SIGTERM or `--kill-after` to SIGKILL of the command's tree);
//!   it does not call `release_on_signals` itself, because it waits for the command to
//!   decide and hands the run over on a request over the store socket.
//! - Exit 75 on fence is only via [`OpenOptions::exit_on_fence`] (no `onFenced` callback).
//! - Not covered by tests yet: a `FENCED` heartbeat after a live takeover (the tests fence
//!   by the deadline: a paused owner resumed after a takeover, suspended heartbeats, a
//!   blocked runtime), the `STEP_TIMEOUT` deadlines.
//! - Invalid options ([`OpenOptions::validate`], before anything is touched): a relative
//!   path, zero deadlines, `stale_after − self_fence_after` below [`MIN_FENCE_MARGIN`],
//!   `retire_dead` with `takeover`; the timing policy's own rules are enforced by
//!   [`lease_core::TimingPolicy`]'s constructor.
//!
#![deny(missing_docs)]

#[cfg(not(loom))]
mod acquire;
#[cfg(not(loom))]
pub mod admission;
#[cfg(not(loom))]
pub mod authority;
// Internals (issue #34): public only with the `internals` feature, for this project's
// tests, benches and fuzz targets.
#[cfg(feature = "internals")]
pub mod cgroup;
#[cfg(not(feature = "internals"))]
mod cgroup;
mod clock;
mod clone_into;
#[cfg(not(loom))]
pub mod compact;
#[cfg(not(loom))]
pub mod diagnosis;
pub mod engine_store;
pub mod error;
mod fence;
#[cfg(not(loom))]
pub mod folder;
#[cfg(not(loom))]
pub mod guard;
#[cfg(not(loom))]
mod preflight;
pub mod procs;
#[cfg(not(loom))]
pub mod replace;
// tokio compiles its process module out under `--cfg loom`: the loom build (`cargo xtask
// loom`) checks only the fence core and leaves the runtime layer out.
#[cfg(not(loom))]
mod run;
#[cfg(not(loom))]
pub mod store_client;
#[cfg(not(loom))]
pub mod store_read;
#[cfg(all(not(loom), feature = "internals"))]
pub mod store_socket;
#[cfg(all(not(loom), not(feature = "internals")))]
mod store_socket;
#[cfg(not(loom))]
mod superseded;
mod sync;

#[cfg(not(loom))]
pub use acquire::{
    Acquire, AcquireError, AcquireObserver, Acquired, Held, NextStep, Progress, Wait,
    is_our_own_owner,
};
#[cfg(not(loom))]
pub use authority::{Authority, FolderAuthority, LeaseAuthority};
#[cfg(not(loom))]
pub use clock::{new_owner_id, wall_now};
pub use error::{RUN_ERROR_CODES, RunError};
/// The etcd engine's error codes, for callers that document codes: in every build, with
/// or without the `etcd` feature (the table is lease-core's; lease-etcd re-exports it).
pub use lease_core::ETCD_ERROR_CODES;
/// What a lease-run user needs from lease-core (issue #34: one dependency for the common job):
/// the timing policy, the lease operations behind [`Run::authority`] and the values they
/// take and give, and `decode` for the records on disk (`run.json`). `lease_run::ops` is
/// lease-core's operations module (`AppendParams`, ...).
pub use lease_core::{
    Code, Generation, HeartbeatDurability, Identity, LeaseError, LeaseOps, RunId, RunState,
    RunStatus, Seal, Timestamp, TimingPolicy, decode, ops,
};
pub use lease_sqlite::{Batch, Commit, Document, ReadOnlyStore, Write};
#[cfg(not(loom))]
pub use preflight::{chain_reaches, preflight};
#[cfg(not(loom))]
pub use run::{CgroupAudit, MAX_COMMAND_RECORDS, audit_cgroups, one_proc_scan};
#[cfg(not(loom))]
pub use run::{
    Command, CommandAudit, CommandSignaller, CommandState, FinalStatus, HeartbeatFailure,
    HeartbeatWarnings, INCARNATION_VAR, MIN_FENCE_MARGIN, OpenOptions, Run, RunCommand, RunStore,
    Served, StepCallback, StepName, WATCHDOG_TICK, audit_commands,
};
/// The JSON crate event payloads and `--json` records are built with, so a lease-run user
/// needs no dependency of its own for them (`lease_run::serde_json::json!`).
pub use serde_json;
#[cfg(not(loom))]
pub use superseded::{Superseded, superseded_by};
