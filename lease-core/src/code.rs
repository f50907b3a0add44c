//! [`Code`]: every stable error code of the library layers as one enum, so control flow
//! matches on variants, never on strings. Each layer's error has `code() -> Code`; the text
//! (`Code::as_str`) is what `--json` prints and the docs list (docs/PROTOCOL.md §12). The
//! runlease CLI's own codes are variants too, so a CLI error's code is a `Code` as well.
//! Errors' `Display` is the message alone; [`Code::prefixed`] gives `CODE: message`.
//! Exit codes are not here: the CLI maps a code to its exit code
//! (`lease_cli::exit_codes::exit_for`, the one mapping); a layer only says which codes
//! for library users, and every copy is checked against the docs' tables.
//!
//! ```
//! use lease_core::Code;
//! assert_eq!(Code::Fenced.as_str(), "FENCED");
//! assert_eq!(Code::parse("FENCED"), Some(Code::Fenced));
//! assert!(Code::Fenced == "FENCED");
//! ```

use std::fmt;

macro_rules! codes {
    ($($variant:ident = $text:literal,)*) => {
        /// A stable error code (its text is [`Code::as_str`]).
        #[non_exhaustive]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Code {
            $(
                #[doc = concat!("`", $text, "`")]
                $variant,
            )*
        }

        impl Code {
            /// Every code, in the order of docs/PROTOCOL.md §12's layers.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The code's stable text (`FENCED`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $text,)*
                }
            }

            /// The code named by `text`, if any.
            pub fn parse(text: &str) -> Option<Code> {
                match text {
                    $($text => Some(Code::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

codes! {
    RunIdInvalid = "RUN_ID_INVALID",
    ArgumentInvalid = "ARGUMENT_INVALID",
    PolicyInvalid = "POLICY_INVALID",
    RecordInvalid = "RECORD_INVALID",
    ChainBroken = "CHAIN_BROKEN",
    EventLogGap = "EVENT_LOG_GAP",
    GenerationOverflow = "GENERATION_OVERFLOW",
    StoreBehindSeal = "STORE_BEHIND_SEAL",
    StoreIdentityMismatch = "STORE_IDENTITY_MISMATCH",
    SchemaUnsupported = "SCHEMA_UNSUPPORTED",
    ProtocolViolation = "PROTOCOL_VIOLATION",
    TakeoverRace = "TAKEOVER_RACE",
    Fenced = "FENCED",
    EventContention = "EVENT_CONTENTION",
    ConcurrentChange = "CONCURRENT_CHANGE",
    RunAlreadyActive = "RUN_ALREADY_ACTIVE",
    RunStaleRequiresTakeover = "RUN_STALE_REQUIRES_TAKEOVER",
    RunDeadRequiresRetirement = "RUN_DEAD_REQUIRES_RETIREMENT",
    TakeoverActiveRefused = "TAKEOVER_ACTIVE_REFUSED",
    RetireRefusedNotDead = "RETIRE_REFUSED_NOT_DEAD",
    RunNotFound = "RUN_NOT_FOUND",
    RunRootChanged = "RUN_ROOT_CHANGED",
    RunLayoutInvalid = "RUN_LAYOUT_INVALID",
    IoError = "IO_ERROR",
    RunNotOwned = "RUN_NOT_OWNED",
    RunFolderForeign = "RUN_FOLDER_FOREIGN",
    StoreCorrupt = "STORE_CORRUPT",
    StoreMissing = "STORE_MISSING",
    StorePragma = "STORE_PRAGMA",
    StoreInternal = "STORE_INTERNAL",
    StoreIo = "STORE_IO",
    StoreBusy = "STORE_BUSY",
    OwnerLockHeld = "OWNER_LOCK_HELD",
    RunCommandsSurvive = "RUN_COMMANDS_SURVIVE",
    RunCommandUnproven = "RUN_COMMAND_UNPROVEN",
    RunCommandNotPermitted = "RUN_COMMAND_NOT_PERMITTED",
    RunCommandRecordsOverLimit = "RUN_COMMAND_RECORDS_OVER_LIMIT",
    StepTimeout = "STEP_TIMEOUT",
    RunReleased = "RUN_RELEASED",
    SpawnFailed = "SPAWN_FAILED",
    Unavailable = "UNAVAILABLE",
    EtcdRefused = "ETCD_REFUSED",
    EtcdNoSpace = "ETCD_NOSPACE",
    AuthorityInvalid = "AUTHORITY_INVALID",
    LivenessInvalid = "LIVENESS_INVALID",
    OutcomeUnknown = "OUTCOME_UNKNOWN",
    StoreLogInvalid = "STORE_LOG_INVALID",
    StoreCommitTooLarge = "STORE_COMMIT_TOO_LARGE",
    StoreBudgetExceeded = "STORE_BUDGET_EXCEEDED",
    // The runlease CLI's own (lease_cli::exit_codes::CLI_ERROR_CODES): no library layer
    // raises them, but they are codes of the same vocabulary (`--json`'s `code`).
    Aborted = "ABORTED",
    ClockInvalid = "CLOCK_INVALID",
    AuthorityUnsupported = "AUTHORITY_UNSUPPORTED",
    RunNotHeld = "RUN_NOT_HELD",
    Internal = "INTERNAL",
    ReleaseTimeout = "RELEASE_TIMEOUT",
    ReleaseNotDelivered = "RELEASE_NOT_DELIVERED",
    CommandNotStarted = "COMMAND_NOT_STARTED",
    Interrupted = "INTERRUPTED",
    StoreRequestRefused = "STORE_REQUEST_REFUSED",
}

/// Every code the etcd engine (lease-etcd's `EtcdError`) raises beyond lease-core's own
/// (`TAKEOVER_ACTIVE_REFUSED` 76 and every [`ERROR_CODES`](crate::ERROR_CODES) code are
/// shared with it). Listed here, with the vocabulary, rather than in lease-etcd: error
/// codes are part of the product's contract, so every build names them, with or without
/// the etcd engine compiled in (a build without it refuses an etcd address, but its code
/// tables, `--help` and docs are the same). lease-etcd re-exports this table as
/// `lease_etcd::ETCD_ERROR_CODES` and checks its variants against it.
pub const ETCD_ERROR_CODES: &[Code] = &[
    Code::Unavailable,
    Code::OutcomeUnknown,
    Code::EtcdRefused,
    Code::EtcdNoSpace,
    Code::AuthorityInvalid,
    Code::LivenessInvalid,
];

impl Code {
    /// `CODE: message`, the one-line form that keeps the code with a message, for a
    /// human line, a log or a record's detail. Every error's own `Display` is the message
    /// alone, without its code.
    ///
    /// ```
    /// assert_eq!(lease_core::Code::Fenced.prefixed("run r: gone"), "FENCED: run r: gone");
    /// ```
    pub fn prefixed(self, message: impl fmt::Display) -> String {
        format!("{}: {message}", self.as_str())
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<&str> for Code {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<str> for Code {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<Code> for &str {
    fn eq(&self, other: &Code) -> bool {
        *self == other.as_str()
    }
}

impl serde::Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl From<Code> for String {
    fn from(c: Code) -> String {
        c.as_str().to_string()
    }
}

impl From<Code> for &'static str {
    fn from(c: Code) -> &'static str {
        c.as_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_is_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for c in Code::ALL {
            assert_eq!(Code::parse(c.as_str()), Some(*c));
            assert!(seen.insert(c.as_str()), "{c} twice");
            assert!(
                c.as_str()
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b == b'_')
            );
        }
        assert_eq!(Code::parse("NOPE"), None);
    }
}
