//! `runlease`'s tracing subscriber (issue #34): what the layers log with `tracing`
//! (lease-run's "the compaction after the release failed", "store socket accept failed",
//! an undo that did not finish, …) reaches the operator on stderr.
//!
//! - The filter is `RUST_LOG` (tracing-subscriber's `EnvFilter` syntax, e.g.
//!   `RUST_LOG=lease_run=debug`); unset, empty or unparsable (said once on stderr), it is
//!   `warn`: warnings and errors only.
//! - Always stderr, never stdout: `--json` output on stdout stays one object per line.
//! - `--quiet` does not silence it: `--quiet` drops informational lines, and what passes
//!   the default filter is a warning (as the CLI's own `runlease: warning:` lines, which
//!   `--quiet` keeps too). `RUST_LOG=error` (or `off`) is the way to drop them.
//! - Compact, one line per event, no colours ever (a line goes through
//!   `text::terminal_safe` like every other stderr line, since fields carry text
//!   from records); a timestamp only when stderr is a terminal, so a script or a test that
//!   reads stderr sees the same lines from run to run.
//! - What `runlease` already says itself, in its own words, from lease-run's typed API is
//!   not said twice (`said_by_the_cli`).

use std::io::{self, IsTerminal, Write};
use tracing::{Level, Metadata};
use tracing_subscriber::filter::{EnvFilter, LevelFilter, filter_fn};
use tracing_subscriber::fmt;
use tracing_subscriber::prelude::*;

/// Install the subscriber for the whole process (once, first thing in `main`).
pub fn install() {
    let builder = || EnvFilter::builder().with_default_directive(LevelFilter::WARN.into());
    let filter = match std::env::var("RUST_LOG") {
        Err(std::env::VarError::NotPresent) => builder().parse_lossy(""),
        Ok(v) => builder().parse(&v).unwrap_or_else(|e| {
            eprintln!("runlease: warning: RUST_LOG={v:?} ignored ({e}): warnings only");
            builder().parse_lossy("")
        }),
        Err(std::env::VarError::NotUnicode(v)) => {
            eprintln!("runlease: warning: RUST_LOG={v:?} ignored (not UTF-8): warnings only");
            builder().parse_lossy("")
        }
    };
    let layer = fmt::layer()
        .compact()
        .with_ansi(false)
        .with_writer(|| SafeStderr)
        // A write that fails (a closed stderr) is dropped, never reported with std's
        // `eprintln!` (which panics on EPIPE).
        .log_internal_errors(false);
    let layer = if io::stderr().is_terminal() {
        layer.boxed()
    } else {
        layer.without_time().boxed()
    };
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(filter_fn(|m| !said_by_the_cli(m)))
        .with(layer)
        .try_init();
}

/// lease-run's warnings that `runlease` reports itself from what lease-run's API hands it,
/// with what they lead to: each failed heartbeat (`Run::heartbeat_warnings`, said as
/// `runlease: warning: heartbeat failed …`), the fence (the `FENCED` error `run` ends
/// with names its reason) and durable heartbeats on a network file system (`run`'s
/// `note:`, from the policy the claim recorded). Matched by target and field names, the
/// most a subscriber sees before the event's values; `tests/owner_reports.rs` fails if the
/// heartbeat's is said twice.
fn said_by_the_cli(m: &Metadata<'_>) -> bool {
    const SAID: &[(&str, &[&str])] = &[
        (
            "lease_run::run::heartbeat",
            &["message", "run", "code", "error"],
        ),
        ("lease_run::run", &["message", "run", "reason"]),
        ("lease_run::run::open", &["message", "run"]),
    ];
    *m.level() == Level::WARN
        && m.is_event()
        && SAID.iter().any(|(target, fields)| {
            m.target() == *target
                && m.fields().len() == fields.len()
                && m.fields().iter().all(|f| fields.contains(&f.name()))
        })
}

/// stderr through `text::terminal_safe`, a write error dropped (see `eprintln!`
/// in main.rs). The fmt layer writes each event whole, one line ending in a newline.
struct SafeStderr;

impl Write for SafeStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let mut out = String::with_capacity(text.len());
        for line in text.split_inclusive('\n') {
            match line.strip_suffix('\n') {
                Some(l) => {
                    out.push_str(&crate::text::terminal_safe(l));
                    out.push('\n');
                }
                None => out.push_str(&crate::text::terminal_safe(line)),
            }
        }
        let _ = io::stderr().write_all(out.as_bytes());
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}
