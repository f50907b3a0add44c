//! End-to-end tests of the `runlease` binary: real processes, real run folders.

#[path = "../common/mod.rs"]
mod common;

mod doctor;
mod events;
mod held;
mod replace;
mod run_command;
mod usage;
