//! The `runlease` command-line definition as a library, so `cargo xtask dist` can generate
//! shell completions and the man page from the same clap `Command` the binary parses with.
//! The subcommands themselves live in the binary (`src/main.rs`).

pub mod cli;
