//! `runlease` — the operator CLI for runlease (PLACEHOLDER, NOT IMPLEMENTED YET).
//!
//! **Status: placeholder.** The real CLI (clap, `--json` on every subcommand,
//! sysexits exit codes; see `ARCHITECTURE.md`, sections 2 and 6) arrives with
//! issue #7. Until then this binary only answers `--help` and `--version`; every
//! subcommand is refused with a clear message and exit code 70 (`EX_SOFTWARE`),
//! so no script can mistake it for a working tool.

use std::process::ExitCode;

/// Exit code for a successful `--help` / `--version`.
const EX_OK: u8 = 0;
/// sysexits `EX_USAGE`: no subcommand, or an unknown option.
const EX_USAGE: u8 = 64;
/// sysexits `EX_SOFTWARE`: every subcommand, because none is implemented yet.
const EX_SOFTWARE: u8 = 70;

/// Version printed by `--version`, taken from the workspace package version.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Help text. The exit-code table is the contract the real CLI will follow
/// (ARCHITECTURE.md section 6); this placeholder itself only ever uses 0, 64 and 70.
const HELP: &str = "\
runlease - exclusive, fenced ownership of a durable run directory

STATUS: placeholder. The operator CLI is NOT implemented yet; it arrives with
issue #7. Every subcommand currently exits with code 70 (EX_SOFTWARE).

Usage: runlease <SUBCOMMAND> [ARGS...]
       runlease --help | -h
       runlease --version | -V

Exit codes planned for the real CLI (sysexits):
  0   ok (or the child command's own code for `runlease run`)
  1   other failure
  64  usage error
  65  data error (unreadable or inconsistent state, store behind its seal, corrupt store)
  69  authority unavailable
  70  internal error or unsupported schema
  74  I/O error
  75  fenced (temporary: the caller may retry later)
  76  held (a live owner, on this host or another, holds the run)
This placeholder only uses 0 (--help, --version), 64 (no subcommand, unknown
option) and 70 (any subcommand: not implemented yet).
";

/// What the placeholder does for a given command line.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    /// Print the help text to stdout and succeed.
    Help,
    /// Print the version to stdout and succeed.
    Version,
    /// Usage error: print the reason and the help text to stderr.
    Usage(String),
    /// A subcommand was named: refuse it, it is not implemented yet.
    NotImplemented(String),
}

/// Decide what to do from the arguments (without the program name).
fn decide(args: &[String]) -> Action {
    match args.first().map(String::as_str) {
        None => Action::Usage("no subcommand given".to_owned()),
        Some("--help" | "-h" | "help") => Action::Help,
        Some("--version" | "-V") => Action::Version,
        Some(opt) if opt.starts_with('-') => Action::Usage(format!("unknown option `{opt}`")),
        Some(sub) => Action::NotImplemented(sub.to_owned()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match decide(&args) {
        Action::Help => {
            print!("{HELP}");
            ExitCode::from(EX_OK)
        }
        Action::Version => {
            println!("runlease {VERSION} (placeholder CLI: not implemented yet, see issue #7)");
            ExitCode::from(EX_OK)
        }
        Action::Usage(reason) => {
            eprintln!("runlease: error: {reason}\n");
            eprint!("{HELP}");
            ExitCode::from(EX_USAGE)
        }
        Action::NotImplemented(sub) => {
            eprintln!(
                "runlease: `{sub}` is not implemented yet: this binary is a placeholder and the \
                 operator CLI arrives with issue #7 (exit 70, EX_SOFTWARE)"
            );
            ExitCode::from(EX_SOFTWARE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Action, decide};

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn help_and_version_are_recognised() {
        assert_eq!(decide(&args(&["--help"])), Action::Help);
        assert_eq!(decide(&args(&["-h"])), Action::Help);
        assert_eq!(decide(&args(&["help"])), Action::Help);
        assert_eq!(decide(&args(&["--version"])), Action::Version);
        assert_eq!(decide(&args(&["-V"])), Action::Version);
    }

    #[test]
    fn every_subcommand_is_refused() {
        for sub in ["run", "status", "takeover", "release", "anything"] {
            assert_eq!(
                decide(&args(&[sub, "--json"])),
                Action::NotImplemented(sub.to_owned())
            );
        }
    }

    #[test]
    fn missing_subcommand_and_unknown_option_are_usage_errors() {
        assert!(matches!(decide(&[]), Action::Usage(_)));
        assert!(matches!(decide(&args(&["--frobnicate"])), Action::Usage(_)));
    }
}
