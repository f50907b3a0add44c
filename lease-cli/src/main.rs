//! `runlease` — the operator CLI of runlease (first version, built on lease-fs alone).
//!
//! Every subcommand takes `--json` (one JSON object per line on stdout, each with a
//! `schema` field such as `runlease/cli/status/1`); human output otherwise. Errors go to
//! stderr as `runlease: CODE: message` (and, with `--json`, also as a
//! `runlease/cli/error/1` object on stdout); the exit code follows ARCHITECTURE.md §6
//! (`FsError::exit_code`), and usage errors exit 64 (not clap's default 2).
//!
//! **Partial.** `run` drives the lease directly with lease-fs (threads, no tokio): there is
//! no `run.json`, no command records, no reaping of a dead incarnation's commands, no store
//! and no seal yet; those come with the lease-run layer. `release` is not implemented (exit
//! 70). Shell completions, the man page and `docs/cli-json.md` are not generated yet. See
//! `runlease --help`.

mod common;
mod ops;
mod run;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use common::{CliError, EX_USAGE, Out};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

/// Top-level help appended after the subcommand list.
const AFTER_HELP: &str = "\
Exit codes:
  0    ok; for `run`, the command's own exit code (128+N if a signal N killed it)
  1    other failure (e.g. a takeover not confirmed)
  64   usage error: bad arguments, unknown subcommand, run folder not found
  65   data error: invalid record, broken hash chain, event log gap
  69   authority unavailable (reserved: no remote authority yet)
  70   internal error, unsupported record schema, or not implemented yet (`release`)
  74   I/O error
  75   fenced, or a race lost (temporary: observe again, then retry)
  76   held: a live owner (on this host or another) holds the run
  126, 127  `run` only: the command could not be started / was not found

Examples:
  runlease run ./demo-run -- sh -c 'echo \"I own $RUNLEASE_RUN at generation $RUNLEASE_GENERATION\"'
  runlease status ./demo-run
  runlease takeover ./demo-run --expect-owner ID --expect-heartbeat 2026-01-01T00:00:00.000Z
  runlease retire ./demo-run
  runlease append \"$RUNLEASE_RUN\" --type step.done --payload '{\"n\":1}'
  runlease events ./demo-run --follow
  runlease verify ./demo-run
  runlease doctor ./demo-run --clean-temp
  runlease prune ./demo-run --keep 8
  runlease list ./runs

Status: first version (issue #7), on lease-fs alone. Not yet: `release` (exit 70); in
`run`: run.json, command records and reaping a dead incarnation's leftover commands,
cgroup/subreaper containment, the store and its seal, CLOCK_BOOTTIME (the self-fence uses
CLOCK_MONOTONIC); shell completions and a man page.";

/// Exclusive, fenced ownership of a durable run folder.
#[derive(Debug, Parser)]
#[command(
    name = "runlease",
    version,
    about = "runlease - exclusive, fenced ownership of a durable run folder",
    after_help = AFTER_HELP,
    propagate_version = true
)]
struct Cli {
    /// Print one JSON object per line on stdout instead of human text.
    #[arg(long, global = true)]
    json: bool,
    /// No informational lines on stderr (errors and warnings are still printed).
    #[arg(long, short, global = true)]
    quiet: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Own a run (creating its folder) and run a command under the lease.
    #[command(after_help = "\
The command runs in its own process group with RUNLEASE_RUN (absolute run folder),
RUNLEASE_GENERATION (the fencing token) and RUNLEASE_OWNER in its environment. SIGINT,
SIGTERM and SIGHUP are forwarded to it. When it exits, whatever it left running in its
process group is killed, the run is released and runlease exits with the command's code.
If the lease is lost (a newer owner, or no successful heartbeat for --self-fence-after),
the process group is killed with SIGKILL and runlease exits 75 without releasing.
The command does not get the terminal (it is not the foreground process group): when
runlease's stdin is a terminal the command's stdin is /dev/null, and a command stopped by
SIGTTIN/SIGTTOU is terminated with a message. Interactive commands: not yet.
Put --wait after RUN_DIR (or write --wait=30s): a bare word after --wait is read as its
duration. While waiting, runlease retries at least every second.
Partial: no run.json, no command records, a command that leaves its process group (setsid,
double fork) is not killed, and --retire-dead does not kill commands a dead runlease left.

Examples:
  runlease run ./demo-run -- sh -c 'echo \"I own $RUNLEASE_RUN at generation $RUNLEASE_GENERATION\"'
  runlease run ./job --wait 5m --takeover-stale -- ./train.sh --resume")]
    Run(RunArgs),
    /// Show who owns each run, how fresh it is, and the one safe next step.
    #[command(after_help = "\
States: free, active, stale, dead (proven: same boot, process gone, owner lock free),
invalid. Exit 0 when every status could be read (an invalid run is printed, not a failure);
otherwise the exit code of the first run that could not be read (64 for a missing folder).
With --json, expect_owner and expect_heartbeat are ready for `runlease takeover`.

Example:
  runlease status ./demo-run --json")]
    Status {
        /// Run folders.
        #[arg(required = true, value_name = "RUN_DIR")]
        dirs: Vec<PathBuf>,
    },
    /// Exact takeover of a stale owner; the run is then released (free).
    #[command(after_help = "\
On a terminal without expectations it asks for confirmation. In scripts pass exactly what
`runlease status --json` printed (expect_owner, expect_heartbeat); any change in between
refuses with TAKEOVER_RACE (75). A fresh owner is refused (76). --yes takes over exactly
what is observed now, without asking. The old owner is fenced: its later writes never count.

Example:
  runlease takeover ./demo-run --expect-owner 0b9e...-... --expect-heartbeat 2026-01-01T12:00:00.000Z")]
    Takeover(TakeoverArgs),
    /// Retire a definitely-dead owner (same boot, process gone, owner lock free).
    #[command(after_help = "\
Exit 76 (RETIRE_REFUSED_NOT_DEAD) names the missing evidence; a stale owner on another host
or boot is never proven dead: use takeover.

Example:
  runlease retire ./demo-run")]
    Retire {
        /// The run folder.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
    },
    /// NOT IMPLEMENTED YET (exit 70): release a run from another process.
    #[command(after_help = "\
A lease is held by the process that owns it: `runlease run` releases when its command
exits. A hand-over from another process needs the lease-run layer.

Example (refused with exit 70):
  runlease release ./demo-run --owner ID --generation 3")]
    Release {
        /// The run folder.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
        /// The owner id.
        #[arg(long)]
        owner: Option<String>,
        /// The generation.
        #[arg(long)]
        generation: Option<u64>,
    },
    /// Append an event as the current owner (exit 0 only if it counts, 75 if fenced).
    #[command(after_help = "\
Meant for commands run under `runlease run`: the generation and owner come from
RUNLEASE_GENERATION and RUNLEASE_OWNER. Prints the event's sequence number.

Example:
  runlease run ./demo-run -- sh -c 'runlease append \"$RUNLEASE_RUN\" --type step.done --payload \"{\\\"n\\\":1}\"'")]
    Append(AppendArgs),
    /// The event log, each event with its authority (non-counting events are shown, marked).
    #[command(after_help = "\
Human output marks events that do not count with `!` and says why. Read-only: pending
cutoffs are not finalized. --follow polls every 500 ms until interrupted.

Example:
  runlease events ./demo-run --json")]
    Events {
        /// The run folder.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
        /// Keep printing new events (polls every 500 ms).
        #[arg(long, short)]
        follow: bool,
    },
    /// Check the epoch and event hash chains (exit 65 when broken).
    #[command(after_help = "\
Example:
  runlease verify ./demo-run")]
    Verify {
        /// The run folder.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
    },
    /// Findings with stable codes and one next step each.
    #[command(after_help = "\
Codes: OK, ORPHAN_TEMP_FILES, STALE_OWNER, DEAD_OWNER, INVALID_RECORD, BROKEN_CHAIN,
STRAY_NAMES, STRAY_EPOCHS, FUTURE_HEARTBEAT (and TEMP_FILES_REMOVED with --clean-temp).
Exit 65 when a finding is a data error (INVALID_RECORD, BROKEN_CHAIN), else 0.
Not yet: run.json, command records, store behind seal (they need lease-run).

Example:
  runlease doctor ./demo-run --clean-temp")]
    Doctor {
        /// The run folder.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
        /// Remove orphan temp files older than 60 s.
        #[arg(long)]
        clean_temp: bool,
    },
    /// Compact old epochs, cutoffs, heartbeats and intents (events stay).
    #[command(after_help = "\
Example:
  runlease prune ./demo-run --keep 8")]
    Prune {
        /// The run folder.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
        /// Generations to keep (at least 2).
        #[arg(long, default_value_t = 8)]
        keep: u64,
    },
    /// One row per run below a folder (its subfolders that hold a `lease/` folder).
    #[command(after_help = "\
Example:
  runlease list ./runs")]
    List {
        /// The folder holding run folders.
        #[arg(value_name = "FOLDER")]
        folder: PathBuf,
    },
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The run folder (created if missing).
    #[arg(value_name = "RUN_DIR")]
    dir: PathBuf,
    /// Heartbeat interval in ms.
    #[arg(long, value_name = "MS", default_value_t = 5000)]
    heartbeat: u64,
    /// Others may call the owner stale after this many ms without a heartbeat.
    #[arg(long, value_name = "MS", default_value_t = 20000)]
    stale_after: u64,
    /// The owner kills its command after this many ms without a successful heartbeat.
    #[arg(long, value_name = "MS", default_value_t = 15000)]
    self_fence_after: u64,
    /// fsync every heartbeat (for shared disks; costs two fsyncs per beat).
    #[arg(long)]
    durable_heartbeats: bool,
    /// Wait while the run is held: forever, or at most DURATION (500ms, 30s, 5m, 1h).
    #[arg(long, value_name = "DURATION", num_args = 0..=1, default_missing_value = "forever",
          value_parser = run::parse_wait)]
    wait: Option<run::WaitFor>,
    /// Replace a stale owner after watching its record unchanged for its stale_after.
    #[arg(long)]
    takeover_stale: bool,
    /// Retire a definitely-dead owner (same boot, process gone, owner lock free) first.
    #[arg(long)]
    retire_dead: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct TakeoverArgs {
    /// The run folder.
    #[arg(value_name = "RUN_DIR")]
    dir: PathBuf,
    /// The owner id you observed (expect_owner of `status --json`).
    #[arg(long, value_name = "ID", requires = "expect_heartbeat")]
    expect_owner: Option<String>,
    /// The heartbeat time you observed (expect_heartbeat of `status --json`).
    #[arg(long, value_name = "TS", requires = "expect_owner")]
    expect_heartbeat: Option<String>,
    /// The generation you observed (optional, checked if given).
    #[arg(long, value_name = "G")]
    expect_generation: Option<u64>,
    /// The heartbeat count you observed (optional, checked if given).
    #[arg(long, value_name = "N")]
    expect_count: Option<u64>,
    /// Do not ask; without --expect-* take over exactly what is observed now.
    #[arg(long, short)]
    yes: bool,
}

#[derive(Debug, Args)]
struct AppendArgs {
    /// The run folder.
    #[arg(value_name = "RUN_DIR")]
    dir: PathBuf,
    /// Event type.
    #[arg(long = "type", value_name = "T")]
    event_type: String,
    /// Event payload (JSON; default null).
    #[arg(long, value_name = "JSON")]
    payload: Option<String>,
    /// The owner's generation (fencing token).
    #[arg(long, value_name = "G", env = "RUNLEASE_GENERATION")]
    generation: Option<u64>,
    /// The owner id.
    #[arg(long, value_name = "ID", env = "RUNLEASE_OWNER")]
    owner: Option<String>,
}

fn dispatch(cli: Cli, out: Out) -> Result<i32, CliError> {
    match cli.command {
        Cmd::Run(a) => run::run(
            run::RunOpts {
                dir: a.dir,
                heartbeat_ms: a.heartbeat,
                stale_after_ms: a.stale_after,
                self_fence_after_ms: a.self_fence_after,
                durable_heartbeats: a.durable_heartbeats,
                wait: a.wait,
                takeover_stale: a.takeover_stale,
                retire_dead: a.retire_dead,
                command: a.command,
            },
            out,
        ),
        Cmd::Status { dirs } => ops::status(&dirs, out),
        Cmd::Takeover(a) => ops::takeover(
            &a.dir,
            &ops::TakeoverOpts {
                expect_owner: a.expect_owner,
                expect_heartbeat: a.expect_heartbeat,
                expect_generation: a.expect_generation,
                expect_count: a.expect_count,
                yes: a.yes,
            },
            out,
        ),
        Cmd::Retire { dir } => ops::retire(&dir, out),
        Cmd::Release { .. } => ops::release(),
        Cmd::Append(a) => ops::append(
            &a.dir,
            &ops::AppendOpts {
                event_type: a.event_type,
                payload: a.payload,
                generation: a.generation,
                owner: a.owner,
            },
            out,
        ),
        Cmd::Events { dir, follow } => ops::events(&dir, follow, out),
        Cmd::Verify { dir } => ops::verify(&dir, out),
        Cmd::Doctor { dir, clean_temp } => ops::doctor(&dir, clean_temp, out),
        Cmd::Prune { dir, keep } => ops::prune(&dir, keep, out),
        Cmd::List { folder } => ops::list(&folder, out),
    }
}

/// Parse the command line; usage errors exit 64 (clap's own default is 2).
fn parse() -> Result<Cli, i32> {
    let matches = Cli::command().try_get_matches();
    let result = matches.and_then(|m| Cli::from_arg_matches(&m));
    match result {
        Ok(cli) => Ok(cli),
        Err(e) => {
            use clap::error::ErrorKind;
            let code = match e.kind() {
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => 0,
                _ => EX_USAGE,
            };
            let _ = e.print();
            Err(code)
        }
    }
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn main() -> ExitCode {
    let cli = match parse() {
        Ok(c) => c,
        Err(code) => return exit(code),
    };
    let out = Out {
        json: cli.json,
        quiet: cli.quiet,
    };
    match dispatch(cli, out) {
        Ok(code) => exit(code),
        Err(e) => {
            e.report(&out);
            exit(e.exit)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
