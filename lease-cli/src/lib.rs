//! The `runlease` command-line definition as a library, so `cargo xtask dist` can generate
//! shell completions and the man page from the same clap `Command` the binary parses with.
//! The subcommands themselves live in the binary (`src/main.rs`).
//!
//! ```
//! use clap::Parser;
//! use lease_cli::cli::{Cli, Cmd};
//!
//! // What `runlease status --json ./demo-run ./other-run` parses to.
//! let cli = Cli::try_parse_from(["runlease", "status", "--json", "./demo-run", "./other-run"])?;
//! assert!(cli.json);
//! match cli.command {
//!     Cmd::Status { dirs } => assert_eq!(dirs.len(), 2),
//!     other => panic!("parsed as {other:?}"),
//! }
//! // The same definition renders the man page and completions (`cargo xtask dist`).
//! assert_eq!(lease_cli::cli::command().get_name(), "runlease");
//! # Ok::<(), clap::Error>(())
//! ```

pub mod cli;
pub mod exit_codes;
