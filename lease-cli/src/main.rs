//! `runlease` — the operator CLI of runlease.
//!
//! Every subcommand takes `--json` (one JSON object per line on stdout, each with a
//! `schema` field such as `runlease/cli/status/1`); human output otherwise. Errors go to
//! stderr as `runlease: CODE: message` (and, with `--json`, also as a
//! `runlease/cli/error/1` object on stdout); the exit code follows README.md "Exit codes"
//! (`exit_codes::exit_for`), and usage errors exit 64 (not clap's default 2).
//!
//! `run` is built on the lease-run lifecycle (`run.json`, command records, reaping of a
//! killed incarnation's commands, store and seal: see `run.rs`); the inspection and repair
//! subcommands (`ops/`) use lease-run's folder handle (`lease_run::folder`), never lease-fs,
//! and never open the store (it is locked exclusively by its owner), except `store
//! get/list/log`, which read a free run's store without writing anything (lease-run's
//! `store_read`). See `runlease --help`.

/// `eprintln!` that never panics. The std macro panics when stderr is gone (a closed pipe,
/// EPIPE): mid-run that would kill `runlease` and leave the run claimed by a dead process
/// with its command running. Messages to a closed stderr are dropped instead. Defined
/// before the modules so it shadows the std macro in all of them.
/// Its text goes through [`text::terminal_safe`]: control and bidirectional-override
/// characters from records (a hostile `run.json` detail, a host name) are shown escaped,
/// never interpreted by the terminal.
macro_rules! eprintln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let text = format!($($arg)*);
        let _ = writeln!(std::io::stderr(), "{}", crate::text::terminal_safe(&text));
    }};
}

/// `eprint!` that never panics (see `eprintln!` above).
macro_rules! eprint {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let text = format!($($arg)*);
        let _ = write!(std::io::stderr(), "{}", crate::text::terminal_safe(&text));
    }};
}

mod diagnosis;
mod error;
mod holder;
mod log;
mod open;
mod ops;
mod output;
mod run;
mod stamps;
mod text;

use clap::FromArgMatches;
use error::{CliError, EX_USAGE};
use lease_cli::cli::{Cli, Cmd, StoreCmd};
use output::Out;
use std::process::ExitCode;

fn dispatch(cli: Cli, out: Out) -> Result<i32, CliError> {
    // Before anything is touched: an etcd address this build cannot use, or a bad one,
    // exits 64.
    let authority = open::resolve_authority(cli.authority.as_deref())?;
    let a_ = &authority;
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
                kill_after: a.kill_after,
                init: a.init,
                command: a.command,
                authority: authority.clone(),
            },
            out,
        ),
        Cmd::Init { dir } => ops::init(&dir, out),
        Cmd::Status { dirs } => ops::status(&dirs, a_, out),
        Cmd::Takeover(a) => ops::takeover(
            &a.dir,
            a_,
            &ops::TakeoverOpts {
                expect_owner: a.expect_owner,
                expect_heartbeat: a.expect_heartbeat,
                expect_generation: a.expect_generation,
                expect_count: a.expect_count,
                yes: a.yes,
            },
            out,
        ),
        Cmd::Retire { dir } => ops::retire(&dir, a_, out),
        Cmd::Release(a) => ops::release(
            &a.dir,
            a_,
            &ops::ReleaseOpts {
                generation: a.generation,
                owner: a.owner,
                timeout: a.timeout,
            },
            out,
        ),
        Cmd::Append(a) => ops::append(
            &a.dir,
            a_,
            &ops::AppendOpts {
                event_type: a.event_type,
                payload: a.payload,
                generation: a.generation,
                owner: a.owner,
            },
            out,
        ),
        Cmd::Events { dir, follow } => ops::events(&dir, a_, follow, out),
        Cmd::Verify { dir } => ops::verify(&dir, a_, out),
        Cmd::Doctor { dir, clean_temp } => {
            // Partial: temp files, stray names and run.json are folder concepts.
            open::folder_only("doctor", a_)?;
            ops::doctor(&dir, clean_temp, out)
        }
        Cmd::Prune { dir, keep } => ops::prune(&dir, a_, keep, out),
        Cmd::Store(c) => match c {
            StoreCmd::Get { dir, key } => ops::store_get(&dir, a_, &key, out),
            StoreCmd::List { dir, prefix } => ops::store_list(&dir, a_, &prefix, out),
            StoreCmd::Log { dir, since } => ops::store_log(&dir, a_, since, out),
            StoreCmd::Put { dir, key, value } => {
                let req = ops::WriteRequest::put(key, value)?;
                ops::store_write(&dir, a_, &req, out)
            }
            StoreCmd::Delete { dir, key } => {
                let req = ops::WriteRequest::delete(key);
                ops::store_write(&dir, a_, &req, out)
            }
            StoreCmd::Commit {
                dir,
                puts,
                deletes,
                logs,
            } => {
                let req = ops::WriteRequest::commit(&puts, &deletes, &logs)?;
                ops::store_write(&dir, a_, &req, out)
            }
        },
        Cmd::List { folder } => {
            // Partial: listing runs means listing subfolders that hold a lease.
            open::folder_only("list", a_)?;
            ops::list(&folder, out)
        }
    }
}

/// Parse the command line; usage errors exit 64 (clap's own default is 2).
fn parse() -> Result<Cli, i32> {
    let matches = lease_cli::cli::command().try_get_matches();
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
            if code == EX_USAGE && json_requested() {
                // docs/cli-json.md: every failure also prints an error object on stdout.
                // clap's text up to its usage block, as one line.
                let rendered = e.to_string();
                let message = rendered
                    .lines()
                    .map(str::trim)
                    .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("tip:"))
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
                    .join(" ");
                let err = CliError::usage(message.trim_start_matches("error: "));
                Out {
                    json: true,
                    quiet: true,
                }
                .json_line(&err.json());
            }
            Err(code)
        }
    }
}

/// Whether `--json` is among runlease's own arguments (before a `--`, after which the
/// arguments are the command's), for errors found before they could be parsed.
fn json_requested() -> bool {
    std::env::args_os()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json")
}

fn exit(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn main() -> ExitCode {
    // The layers' `tracing` events on stderr: RUST_LOG, default warn, whatever `--quiet`
    // and `--json` say (log.rs). The guard's too.
    log::install();
    // The guard process `runlease run` starts beside its command (lease-run's `guard`),
    // recognised before any parsing: it is no subcommand of the CLI.
    if std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new(run::GUARD_ARG)) {
        return exit(lease_run::guard::serve_stdin());
    }
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
