//! The command line of `runlease`: the clap definition, shared by the binary and by
//! `cargo xtask dist` (shell completions and the man page).

use clap::{Args, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// How long `--wait` waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitFor {
    /// Until the run is free, however long.
    Forever,
    /// At most this long.
    For(Duration),
}

/// Parse a duration: `500ms`, `30s`, `5m`, `1h` or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    match parse_wait(s)? {
        WaitFor::For(d) => Ok(d),
        WaitFor::Forever => Err(format!(
            "invalid duration {s:?}: use e.g. 500ms, 30s, 5m, 1h"
        )),
    }
}

/// Parse a timing flag (`--heartbeat`, `--stale-after`, `--self-fence-after`) into
/// milliseconds: a plain number is milliseconds (as it always was), or a number with a
/// unit: `200ms`, `20s`, `5m`, `1h`.
pub fn parse_millis(s: &str) -> Result<u64, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse()
            .map_err(|_| format!("invalid duration {s:?}: too large"));
    }
    let d = parse_duration(t).map_err(|_| {
        format!("invalid duration {s:?}: use milliseconds (200) or 200ms, 20s, 5m, 1h")
    })?;
    u64::try_from(d.as_millis()).map_err(|_| format!("invalid duration {s:?}: too large"))
}

/// Parse a `--wait` value: `500ms`, `30s`, `5m`, `1h`, a plain number of seconds, or
/// `forever`.
pub fn parse_wait(s: &str) -> Result<WaitFor, String> {
    let s = s.trim();
    if s.is_empty() || s == "forever" {
        return Ok(WaitFor::Forever);
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?}: use e.g. 500ms, 30s, 5m, 1h or forever"))?;
    let ms = match unit {
        "ms" => Some(n),
        "" | "s" => n.checked_mul(1000),
        "m" | "min" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => None,
    }
    .ok_or_else(|| format!("invalid duration {s:?}: use e.g. 500ms, 30s, 5m, 1h or forever"))?;
    Ok(WaitFor::For(Duration::from_millis(ms)))
}

/// Top-level help appended after the subcommand list and the exit codes
/// ([`crate::exit_codes::help_block`]; [`command`] puts the two together).
pub const AFTER_HELP: &str = "\
Examples:
  runlease run ./demo-run -- sh -c 'echo \"I own $RUNLEASE_RUN at generation $RUNLEASE_GENERATION\"'
  runlease init ./existing-folder
  runlease status ./demo-run
  runlease takeover ./demo-run --expect-owner ID --expect-heartbeat 2026-01-01T00:00:00.000Z
  runlease retire ./demo-run
  runlease append \"$RUNLEASE_RUN\" --type step.done --payload '{\"n\":1}'
  runlease release
  runlease events ./demo-run --follow
  runlease verify ./demo-run
  runlease doctor ./demo-run --clean-temp
  runlease prune ./demo-run --keep 8
  runlease list ./runs
  runlease --authority etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379/runlease run ./job -- ./train.sh

--json output: docs/cli-json.md (one object per line, each with a versioned `schema`).

`run` is built on the lease-run lifecycle: run.json, command records (a killed run's
command is killed by the next owner on the same boot), cgroup v2 or process-group
containment, the self-fence on CLOCK_BOOTTIME, the store and its seal check.

--authority etcd://host:port[,host:port...]/prefix (or RUNLEASE_AUTHORITY) keeps the lease
in an etcd cluster instead of the run folder, for owners on several hosts: the run id is
the run folder's name, the keys live under /prefix/<run id>/. The store's commits and
run.json are committed in etcd too, so the run's state follows its lease to any host (the
folder keeps a copy of run.json and store/view.sqlite, a view rebuilt from etcd); command
records, the owner lock and the cgroup stay in the local run folder. Same codes, exit
codes and --json as with the folder; `doctor` and `list` are folder-only (exit 64). Needs
a build with `--features etcd` (else AUTHORITY_UNSUPPORTED, 64).";

/// Exclusive, fenced ownership of a durable run folder.
#[derive(Debug, Parser)]
#[command(
    name = "runlease",
    version,
    about = "runlease - exclusive, fenced ownership of a durable run folder",
    after_help = AFTER_HELP,
    propagate_version = true
)]
pub struct Cli {
    /// Print one JSON object per line on stdout instead of human text.
    #[arg(long, global = true)]
    pub json: bool,
    /// No informational lines on stderr (errors and warnings are still printed).
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Keep the lease in an etcd cluster instead of the run folder, e.g.
    /// etcd://10.0.0.1:2379,10.0.0.2:2379/runlease (needs a build with --features etcd).
    #[arg(long, global = true, value_name = "URL", env = "RUNLEASE_AUTHORITY")]
    pub authority: Option<String>,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Own a run (creating its folder) and run a command under the lease.
    #[command(after_help = "\
RUN_DIR must be a run, a missing folder or an empty one: an existing folder that is not
empty and not a run yet (it has no lease/epochs/ folder), and `.`, `..` or `/` (any folder
holding the current one) that is not a run yet, is refused (RUN_FOLDER_FOREIGN, 64) before
anything is written, unless --init says so (as `runlease init` does). The run folder and
everything runlease reads or writes in it must be owned by the user runlease runs as and
not writable by others, else RUN_NOT_OWNED (77); no existing mode is ever changed.
Before the command runs, its record (pid, start time, boot) is durable in commands/, and a
command a killed runlease left running (same boot) is killed. The command runs in its own
process group (and cgroup v2 subtree when one can be created) with RUNLEASE_RUN (absolute
run folder), RUNLEASE_GENERATION (the fencing token) and RUNLEASE_OWNER in its
environment (and RUNLEASE_AUTHORITY with --authority etcd://...). SIGINT, SIGTERM and
SIGHUP are forwarded to it; a second SIGINT or SIGTERM, or --kill-after DURATION past the
first, SIGKILLs the command and everything it started (the run is then released failed).
When it exits, whatever it left running is stopped (SIGTERM, 2 s, SIGKILL), run.json says done (exit 0) or failed,
the run is released and runlease exits with the command's code (128+N if signal N killed
it; 126/127 if the program is not executable / not found, then nothing is claimed).
`runlease release` from the command (a request on the run's store socket, checked with the
command's secret; SIGUSR1 releases nothing) makes runlease release at once (run.json paused) while the command runs on
without the lease. The command reads and writes the run's store through this owner
(`runlease store`, RUNLEASE_STORE_SOCKET).
A run held by a live owner is refused (exit 76) with one line naming its host, pid, since
when and generation; --wait waits for it (a progress line on a terminal only). A process
on this host that still holds the run's kernel owner lock (a stopped owner, even one
already replaced) also refuses the run (76) until it is resumed or ends.
If the lease is lost (a newer owner, or no successful heartbeat for --self-fence-after),
the commands are killed with SIGKILL and, once they are gone, runlease exits 75 without
releasing.
The command does not get the terminal (it is not the foreground process group): when
runlease's stdin is a terminal the command's stdin is /dev/null, and a command stopped by
SIGTTIN/SIGTTOU is terminated with a message. Interactive commands: not yet.
Put --wait after RUN_DIR (or write --wait=30s): a bare word after --wait is read as its
duration. While waiting, runlease retries at least every second.
The command's arguments must be UTF-8 (they are recorded).

Examples:
  runlease run ./demo-run -- sh -c 'echo \"I own $RUNLEASE_RUN at generation $RUNLEASE_GENERATION\"'
  runlease run ./job --wait 5m --takeover-stale -- ./train.sh --resume
  runlease --authority etcd://10.0.0.1:2379,10.0.0.2:2379/runlease run ./job -- ./train.sh")]
    Run(RunArgs),
    /// Make a folder a run explicitly (also an existing, non-empty one); idempotent.
    #[command(after_help = "\
Creates the layout (lease/ and its folders, events/, commands/, store/, work/, tmp/; each
0700 whatever the umask) in RUN_DIR, creating RUN_DIR if missing. On a run it only adds
missing folders. On an existing folder that is not a run yet, what is there stays as it
is: no file is touched and no existing mode is changed. It is the explicit step `runlease
run` asks for on a non-empty folder and on `.`, `..` or `/`. Refused (RUN_NOT_OWNED, 77,
nothing written) when RUN_DIR, an existing layout folder, run.json or owner.lock is not
owned by the user runlease runs as, or others may write it: fix it with chown/chmod go-w
first (runlease never chmods what it did not create).

Example:
  runlease init ./existing-folder && runlease run ./existing-folder -- ./job.sh")]
    Init {
        /// The folder to make a run.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
    },
    /// Show who owns each run, how fresh it is, and the one safe next step.
    #[command(after_help = "\
States: free, active, stale, dead (proven: same boot, process gone, owner lock free),
invalid, and not_a_run (a folder `run` refuses: not empty and no lease/epochs/; the next
step is `runlease init`, or what init would refuse). Exit 0 when every status could be read (an invalid run is printed, not a failure);
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
`runlease status --json` printed (expect_owner, expect_heartbeat). The same owner with a
heartbeat written after the one expected has beaten since: a live owner, refused (76). A
record that differs otherwise (another owner or --expect-generation, a heartbeat the owner
never wrote such as a date ahead of the record, another --expect-count) refuses with
TAKEOVER_RACE (75): observe again. A malformed value is 64 before anything is read.
It then watches the owner's record for the owner's stale_after (20 s by default) on this
host's clock, never comparing another host's clock: a record that changes meanwhile is a
live owner, refused (76); nothing is written before the watch ends. --yes takes over
exactly what is observed now, without asking (a record changed since that look is a live
owner, 76). The old owner is fenced: its later writes never count.

Example:
  runlease takeover ./demo-run --expect-owner run-0b9e... --expect-heartbeat 2026-01-01T12:00:00.000Z")]
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
    /// Hand the run over cleanly: release the current owner's generation (its token).
    #[command(after_help = "\
The token (generation and owner) comes from RUNLEASE_GENERATION and RUNLEASE_OWNER, as
set for a command run under `runlease run`, or from --generation/--owner; RUN_DIR defaults
to RUNLEASE_RUN. It must name the current, active generation: a superseded, released or
foreign generation is refused with FENCED (75) and nothing is written.
Under `runlease run` the request goes to that owner over its store socket (checked with
the command's secret, so any copy of runlease can ask; without the socket nothing is
written: RELEASE_NOT_DELIVERED, 76), which stops heartbeating and releases; the command runs on without the
lease (its later appends exit 75) and `runlease run` still exits with its code. Otherwise
the release is written directly as that owner; an owner process that still heartbeats is
fenced at its next heartbeat. Exit 0 once the run is free.

Example:
  runlease run ./demo-run -- sh -c 'runlease append \"$RUNLEASE_RUN\" --type done && runlease release && ./cleanup.sh'")]
    Release(ReleaseArgs),
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
cutoffs are not finalized. --follow polls every 500 ms until interrupted and prints each
new event once, with its authority when it was printed (an event shown `pending` is not
printed again once its owner's cutoff is final: run `runlease events` again to see it).

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
STRAY_NAMES, STRAY_EPOCHS, FUTURE_HEARTBEAT, HEARTBEAT_STAMP_AHEAD, TORN_HEARTBEAT,
EVENT_LOG_SHORT, STORE_MISSING, RUN_FOLDER_FOREIGN, RUN_NOT_OWNED,
STORE_BEHIND_SEAL, STORE_IDENTITY_MISMATCH, STORE_CORRUPT, COMMAND_UNPROVEN,
RUN_COMMAND_RECORDS_OVER_LIMIT, CGROUP_NOT_PROVEN, OPEN_CUTOFF
(and TEMP_FILES_REMOVED with --clean-temp). Exit 65 when a finding is an error (INVALID_RECORD,
BROKEN_CHAIN, RUN_NOT_OWNED, STORE_*, COMMAND_UNPROVEN, RUN_COMMAND_RECORDS_OVER_LIMIT),
else 0. Doctor evaluates, read-only,
the admission rule that run, retire and takeover call before they write: what it reports
as an error, they refuse. Of a free, dead or stale run it reads the store without
writing anything (SQLite immutable: no lock, no -shm, no WAL replay) and judges it
against the seal and floor the lease chain names; a store with a write-ahead log beside
it is left to the next owner's open.

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
    /// Read a run's store (`store/run.sqlite`): documents and the commit log.
    #[command(
        subcommand,
        after_help = "\
Inside a command of the run's owner (under `runlease run`), every subcommand goes through
the owner: writes are committed as its generation and acknowledged once durable and covered
by the lease's floor. Elsewhere a free run's store is read without writing anything, writes
are refused (RUN_NOT_HELD, 64) with the command that makes them, and a held run is refused
(76) with its holder named. With --authority etcd://... the readers read the commits etcd
holds, from any host, whoever owns the run. See each subcommand's --help.

Examples:
  runlease run ./demo-run -- sh -c 'runlease store put \"$RUNLEASE_RUN\" config/model small'
  runlease store list ./demo-run
  runlease store get ./demo-run config/model
  runlease store log ./demo-run --since 40 --json"
    )]
    Store(StoreCmd),
    /// One row per run below a folder (its subfolders that hold a `lease/epochs/` folder).
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
pub struct RunArgs {
    /// The run folder (created if missing; an existing one must be a run or empty).
    #[arg(value_name = "RUN_DIR")]
    pub dir: PathBuf,
    /// Make RUN_DIR a run even if it is a non-empty folder or `.`, `..`, `/` (as `runlease
    /// init`).
    #[arg(long)]
    pub init: bool,
    /// Heartbeat interval: milliseconds, or with a unit (200ms, 5s).
    #[arg(long, value_name = "DURATION", default_value = "5000", value_parser = parse_millis)]
    pub heartbeat: u64,
    /// Others may call the owner stale after this long without a heartbeat (ms, or 20s).
    #[arg(long, value_name = "DURATION", default_value = "20000", value_parser = parse_millis)]
    pub stale_after: u64,
    /// The owner kills its command after this long without a successful heartbeat (ms, or
    /// 15s).
    #[arg(long, value_name = "DURATION", default_value = "15000", value_parser = parse_millis)]
    pub self_fence_after: u64,
    /// fsync every heartbeat (for shared disks; one fdatasync per beat after the first; on
    /// NFS, SMB, FUSE and the like this is chosen for you)
    #[arg(long)]
    pub durable_heartbeats: bool,
    /// Wait while the run is held: forever, or at most DURATION (500ms, 30s, 5m, 1h).
    #[arg(long, value_name = "DURATION", num_args = 0..=1, default_missing_value = "forever",
          value_parser = parse_wait)]
    pub wait: Option<WaitFor>,
    /// Replace a stale owner after watching its record unchanged for its stale_after.
    #[arg(long)]
    pub takeover_stale: bool,
    /// Retire a definitely-dead owner (same boot, process gone, owner lock free) first.
    #[arg(long)]
    pub retire_dead: bool,
    /// After a SIGINT or SIGTERM is forwarded to the command, SIGKILL the command and
    /// everything it started if it is still running DURATION later (500ms, 30s, 5m). A
    /// second SIGINT or SIGTERM does the same at once.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub kill_after: Option<std::time::Duration>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct TakeoverArgs {
    /// The run folder.
    #[arg(value_name = "RUN_DIR")]
    pub dir: PathBuf,
    /// The owner id you observed (expect_owner of `status --json`).
    #[arg(long, value_name = "ID", requires = "expect_heartbeat")]
    pub expect_owner: Option<String>,
    /// The heartbeat time you observed (expect_heartbeat of `status --json`).
    #[arg(long, value_name = "TS", requires = "expect_owner")]
    pub expect_heartbeat: Option<String>,
    /// The generation you observed (optional, checked if given).
    #[arg(long, value_name = "G")]
    pub expect_generation: Option<u64>,
    /// The heartbeat count you observed (optional, checked if given).
    #[arg(long, value_name = "N")]
    pub expect_count: Option<u64>,
    /// Do not ask; without --expect-* take over exactly what is observed now.
    #[arg(long, short)]
    pub yes: bool,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The run folder (default: RUNLEASE_RUN).
    #[arg(value_name = "RUN_DIR", env = "RUNLEASE_RUN")]
    pub dir: PathBuf,
    /// The owner's generation (fencing token).
    #[arg(long, value_name = "G", env = "RUNLEASE_GENERATION")]
    pub generation: Option<u64>,
    /// The owner id.
    #[arg(long, value_name = "ID", env = "RUNLEASE_OWNER")]
    pub owner: Option<String>,
    /// How long to wait for a `runlease run` owner to release.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub timeout: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct AppendArgs {
    /// The run folder.
    #[arg(value_name = "RUN_DIR")]
    pub dir: PathBuf,
    /// Event type.
    #[arg(long = "type", value_name = "T")]
    pub event_type: String,
    /// Event payload (JSON; default null).
    #[arg(long, value_name = "JSON")]
    pub payload: Option<String>,
    /// The owner's generation (fencing token).
    #[arg(long, value_name = "G", env = "RUNLEASE_GENERATION")]
    pub generation: Option<u64>,
    /// The owner id.
    #[arg(long, value_name = "ID", env = "RUNLEASE_OWNER")]
    pub owner: Option<String>,
}

/// The clap `Command` of `runlease` (for parsing, completions and the man page).
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command().after_help(format!(
        "{}\n\n{AFTER_HELP}",
        crate::exit_codes::help_block()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
        command().debug_assert();
    }

    #[test]
    fn wait_durations_parse() {
        assert_eq!(
            parse_wait("500ms"),
            Ok(WaitFor::For(Duration::from_millis(500)))
        );
        assert_eq!(parse_wait("30s"), Ok(WaitFor::For(Duration::from_secs(30))));
        assert_eq!(parse_wait("5m"), Ok(WaitFor::For(Duration::from_secs(300))));
        assert_eq!(parse_wait("2"), Ok(WaitFor::For(Duration::from_secs(2))));
        assert_eq!(parse_wait("forever"), Ok(WaitFor::Forever));
        assert!(parse_wait("./run").is_err());
        assert!(parse_wait("5x").is_err());
    }

    #[test]
    fn timing_flags_take_units_and_plain_numbers_stay_milliseconds() {
        assert_eq!(parse_millis("200"), Ok(200));
        assert_eq!(parse_millis("200ms"), Ok(200));
        assert_eq!(parse_millis("20s"), Ok(20_000));
        assert_eq!(parse_millis("1m"), Ok(60_000));
        assert_eq!(parse_millis(" 15s "), Ok(15_000));
        for bad in ["", "forever", "5x", "-1", "1.5s", "99999999999999999999999"] {
            assert!(parse_millis(bad).is_err(), "{bad:?}");
        }
    }
}

/// `runlease store ...`.
#[derive(Debug, Subcommand)]
pub enum StoreCmd {
    /// Set KEY to VALUE (`-`: read the value from stdin), as one commit.
    #[command(after_help = "\
Only inside a command of the run's owner (`runlease run DIR -- ...`, which gives its command
RUNLEASE_STORE_SOCKET): the owner commits it as its generation, makes the new head part of
the lease's floor with a durable heartbeat, then answers. Prints the commit's sequence
(--json: runlease/cli/store-write/1). Refused: FENCED (75) once the owner is fenced or
released (nothing written); STORE_REQUEST_REFUSED (77) for a process that does not carry the
owner's secret; RUN_NOT_HELD (64) outside a command of the owner, with the next step; 76 on a
run held by another owner.

Examples:
  runlease run ./demo-run -- runlease store put ./demo-run config/model small
  runlease run ./demo-run -- sh -c 'date | runlease store put \"$RUNLEASE_RUN\" last-run -'")]
    Put {
        /// The run folder.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
        /// The document's key.
        key: String,
        /// Its value (`-`: read from stdin, bytes as they are).
        #[arg(allow_hyphen_values = true)]
        value: String,
    },
    /// Delete KEY, as one commit (deleting a missing key still commits).
    #[command(after_help = "\
Written as `store put` is (see its --help).

Example:
  runlease run ./demo-run -- runlease store delete ./demo-run config/old")]
    Delete {
        /// The run folder.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
        /// The document's key.
        key: String,
    },
    /// Commit several writes and log entries atomically, as one commit.
    #[command(after_help = "\
All of --put, --delete and --log become one commit: all of them or none. --put K=V splits at
the first `=`; a key given to --put twice keeps the last value; a key both put and deleted
is refused (ARGUMENT_INVALID, 64: the order would be ambiguous). Puts apply before deletes.
Written as `store put` is (see its --help).

Example:
  runlease run ./demo-run -- runlease store commit ./demo-run \\
      --put step/3=done --put step/4=started --delete lock/step3 --log \"step 3 done\"")]
    Commit {
        /// The run folder.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
        /// Set a key: `KEY=VALUE` (repeatable).
        #[arg(long = "put", value_name = "KEY=VALUE")]
        puts: Vec<String>,
        /// Delete a key (repeatable).
        #[arg(long = "delete", value_name = "KEY")]
        deletes: Vec<String>,
        /// A log entry recorded with the commit (repeatable).
        #[arg(long = "log", value_name = "TEXT")]
        logs: Vec<String>,
    },
    /// Print one document's value (as it is, no newline added).
    #[command(after_help = "\
Inside a command of the run's owner: asked of the owner over its store socket. Elsewhere:
reads a free run's store without writing anything (not even a lock file); the run's owner
lock is held while it reads, so no owner starts meanwhile. A run held by an owner is
refused (76) with the holder named (its commands read through it). A store a crashed owner
left with a write-ahead log is refused (STORE_BUSY, 75) until the next `runlease run`
replays it. With --authority etcd://...: read from the commits etcd holds, on any host and
whoever owns the run (nothing is written, the run folder need not exist here; a run etcd
has no record of is STORE_MISSING, 65). Exit 1, printing nothing, when KEY does not exist
(with --json: an object with \"found\": false).

Examples:
  runlease store get ./demo-run config/model
  runlease store get ./demo-run config/model --json")]
    Get {
        /// The run folder.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
        /// The document's key.
        key: String,
    },
    /// List the documents whose key starts with PREFIX (all without one), in key order.
    #[command(after_help = "\
Human output: KEY<TAB>VALUE per line. --json: one runlease/cli/store-doc/1 object per
document (`value` for UTF-8 text, else `value_hex`). Reads as `store get` does.

Examples:
  runlease store list ./demo-run
  runlease store list ./demo-run step/ --json")]
    List {
        /// The run folder.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
        /// Only keys that start with this.
        #[arg(default_value = "")]
        prefix: String,
    },
    /// The store's commits, oldest first: sequence, generation, time, writes and log.
    #[command(after_help = "\
--json: one runlease/cli/store-commit/1 object per commit. Reads as `store get` does.

Examples:
  runlease store log ./demo-run
  runlease store log ./demo-run --since 40 --json")]
    Log {
        /// The run folder.
        #[arg(value_name = "RUN_DIR")]
        dir: PathBuf,
        /// Only commits with a sequence above this.
        #[arg(long, value_name = "SEQ", default_value_t = 0)]
        since: u64,
    },
}
