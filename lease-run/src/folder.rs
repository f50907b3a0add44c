//! The run folder as callers above lease-run use it, so that they name no layer below
//! lease-run (ARCHITECTURE.md, "Crates and who may depend on whom"): the folder handle
//! ([`RunDir`]: open, init, its status, verify, events and prune through
//! [`lease_core::LeaseOps`]), what `init` found, which folders are runs, and the run id a
//! folder's name gives. These are lease-fs's own types and functions, re-exported: the
//! decisions stay where they are made (lease-fs judges folders and records; lease-run,
//! lease-core's diagnosis and `Replacer` decide what to do with a run).
//!
//! ```no_run
//! use lease_run::folder::{Found, RunDir};
//! # fn main() -> Result<(), lease_run::folder::FsError> {
//! let init = RunDir::init(std::path::Path::new("/srv/runs/job-1"), false)?;
//! assert!(matches!(init.found, Found::Missing | Found::Empty | Found::Run));
//! # Ok(()) }
//! ```

pub use lease_fs::real::shell_quote;
pub use lease_fs::{
    FS_ERROR_CODES, Found, FsError, Initialized, RealFs, RunDir, is_run_folder, run_id_held,
    run_id_of, this_holder,
};
