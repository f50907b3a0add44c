//! The exit codes of `runlease`, and the codes only the CLI produces: the one table that
//! `runlease --help` is rendered from and that README.md's "Exit codes" table and
//! docs/PROTOCOL.md §12 are checked against (`lease-cli/tests/docs_drift.rs` fails when a
//! copy drifts).

use lease_core::Code;

/// Every exit code (as written in the docs: `128+N` for a signal) with its meaning.
pub const EXIT_CODES: &[(&str, &str)] = &[
    ("0", "ok; for `run`, the command's own exit code"),
    (
        "1",
        "other failure: a takeover not confirmed at the prompt, a wall clock before 1970 or past 9999",
    ),
    (
        "64",
        "usage error: bad arguments, unknown subcommand, run folder not found, bad run id, `run` on a non-empty folder that is not a run (see `init`)",
    ),
    (
        "65",
        "data error: invalid record, broken hash chain, event log gap, symlinked run folder, a store that is not the sealed one",
    ),
    (
        "69",
        "the etcd cluster of --authority did not answer within the deadline; retry",
    ),
    (
        "70",
        "internal error, or a record schema this build does not read (a newer runlease)",
    ),
    (
        "71",
        "the outcome of a write is unknown: the etcd cluster did not answer after the request was sent; look before retrying (the message says how)",
    ),
    ("74", "I/O error"),
    (
        "75",
        "fenced, a race lost, or a release not answered in time (temporary: observe again, then retry)",
    ),
    (
        "76",
        "held: a live owner (on this host or another) holds the run, or a process a command record names is still alive",
    ),
    (
        "77",
        "not owned: the run folder, or a file or folder in it, is not owned by the user runlease runs as, or others may write it (refused, never read, written or chmodded); or a command process runlease may not signal; or a store request without the owner's secret",
    ),
    ("126", "`run`: the command could not be started"),
    ("127", "`run`: the command was not found"),
    (
        "128+N",
        "`run`: the command was killed by signal N (also: runlease was interrupted by signal N before the command started)",
    ),
];

/// The sysexits-style exit code `runlease` uses for a failure with `code`: the one
/// mapping from a code to an exit code. `tests/docs_drift.rs` checks it against every
/// layer's code table and the docs. `COMMAND_NOT_STARTED` (126 or 127) and `INTERRUPTED`
/// (128+N) depend on the case; their constructors set the exit code themselves, and this
/// gives 126 and 130.
pub fn exit_for(code: Code) -> i32 {
    match code {
        Code::RunIdInvalid
        | Code::ArgumentInvalid
        | Code::PolicyInvalid
        | Code::RunNotFound
        | Code::RunFolderForeign
        | Code::AuthorityInvalid
        | Code::AuthorityUnsupported
        | Code::RunNotHeld => 64,
        Code::RecordInvalid
        | Code::ChainBroken
        | Code::EventLogGap
        | Code::GenerationOverflow
        | Code::StoreBehindSeal
        | Code::StoreIdentityMismatch
        | Code::RunLayoutInvalid
        | Code::StoreCorrupt
        | Code::StoreMissing
        | Code::LivenessInvalid
        | Code::StoreLogInvalid
        | Code::StoreCommitTooLarge
        | Code::StoreBudgetExceeded => 65,
        Code::Unavailable => 69,
        // Not "retry" like 69: the write may have landed (an append retried blindly would
        // append a second event).
        Code::OutcomeUnknown => 71,
        Code::SchemaUnsupported
        | Code::ProtocolViolation
        | Code::StorePragma
        | Code::StoreInternal
        | Code::RunReleased
        | Code::SpawnFailed
        | Code::EtcdRefused
        | Code::Internal => 70,
        Code::RunRootChanged
        | Code::IoError
        | Code::StoreIo
        | Code::StepTimeout
        | Code::EtcdNoSpace => 74,
        Code::TakeoverRace
        | Code::Fenced
        | Code::EventContention
        | Code::ConcurrentChange
        | Code::StoreBusy
        | Code::ReleaseTimeout => 75,
        Code::RunAlreadyActive
        | Code::RunStaleRequiresTakeover
        | Code::RunDeadRequiresRetirement
        | Code::TakeoverActiveRefused
        | Code::RetireRefusedNotDead
        | Code::OwnerLockHeld
        | Code::RunCommandsSurvive
        | Code::RunCommandUnproven
        | Code::ReleaseNotDelivered => 76,
        // More command records than any run leaves (issue #29): bad data, judged by
        // nobody until an operator removes them.
        Code::RunCommandRecordsOverLimit => 65,
        Code::RunNotOwned | Code::RunCommandNotPermitted | Code::StoreRequestRefused => 77,
        Code::Aborted | Code::ClockInvalid => 1,
        Code::CommandNotStarted => 126,
        Code::Interrupted => 130,
        // A code added to lease-core before this table learns it: an internal error,
        // and docs_drift fails until it is mapped.
        _ => 70,
    }
}

/// The error codes only lease-cli produces, with their exit codes as written in the docs
/// (the layers' own: `lease_core::ERROR_CODES`, `lease_run::folder::FS_ERROR_CODES`,
/// `lease_sqlite::STORE_ERROR_CODES`, `lease_run::RUN_ERROR_CODES`,
/// `lease_run::ETCD_ERROR_CODES`).
pub const CLI_ERROR_CODES: &[(&str, &str)] = &[
    ("ABORTED", "1"),
    ("CLOCK_INVALID", "1"),
    ("AUTHORITY_UNSUPPORTED", "64"),
    ("RUN_NOT_HELD", "64"),
    ("INTERNAL", "70"),
    ("RELEASE_TIMEOUT", "75"),
    ("RELEASE_NOT_DELIVERED", "76"),
    ("COMMAND_NOT_STARTED", "126/127"),
    ("INTERRUPTED", "128+N"),
];

/// The `Exit codes:` block of `runlease --help`, rendered from [`EXIT_CODES`] (wrapped at
/// 90 columns, continuation lines indented under the meaning).
pub fn help_block() -> String {
    const WIDTH: usize = 90;
    let mut out = String::from(
        "Exit codes (README.md \"Exit codes\"; every code: docs/PROTOCOL.md section 12):",
    );
    for (code, meaning) in EXIT_CODES {
        // Meanings start at column 9, after the widest code (`128+N`) and a space.
        let indent = " ".repeat(8);
        let mut line = format!("  {code:<6}");
        let mut first = true;
        for word in meaning.split(' ') {
            let fits = line.len() + 1 + word.len() <= WIDTH;
            if !first && !fits {
                out.push('\n');
                out.push_str(line.trim_end());
                line = indent.clone();
            } else if !first {
                line.push(' ');
            }
            line.push_str(word);
            first = false;
        }
        out.push('\n');
        out.push_str(line.trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_block_lists_every_exit_code_within_90_columns() {
        let b = help_block();
        for (code, meaning) in EXIT_CODES {
            assert!(
                b.lines().any(|l| l.starts_with(&format!("  {code} "))),
                "{code} missing:\n{b}"
            );
            // Every word of the meaning is there, in order.
            let flat: String = b.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(flat.contains(meaning), "{meaning}");
        }
        assert!(b.lines().all(|l| l.len() <= 90), "{b}");
    }
}
