//! The CLI's error type and its exit codes: a stable code, a one-line message and the exit
//! code the one mapping gives it (`lease_cli::exit_codes::exit_for`), printed on stderr and,
//! with `--json`, as an error object.

use crate::output::Out;
use lease_core::Code;
use lease_core::LeaseError;
use lease_run::folder::FsError;
use serde_json::{Value, json};
use std::path::Path;

/// sysexits `EX_USAGE`.
pub const EX_USAGE: i32 = 64;

/// sysexits `EX_SOFTWARE`.
pub const EX_SOFTWARE: i32 = 70;

/// A failure of a subcommand: a stable code, a one-line message and the exit code.
#[derive(Debug, Clone)]
pub struct CliError {
    /// Stable machine-readable code (`RUN_NOT_FOUND`, `FENCED`, ...).
    pub code: Code,
    /// Human message, without the code prefix.
    pub message: String,
    /// Process exit code (README.md "Exit codes").
    pub exit: i32,
    /// Extra fields for the `--json` error object (e.g. who holds the run).
    pub extra: Option<Value>,
}

impl CliError {
    /// A new error with an explicit code and exit code.
    pub fn new(code: Code, exit: i32, message: impl Into<String>) -> CliError {
        CliError {
            code,
            message: message.into(),
            exit,
            extra: None,
        }
    }

    /// A new error whose exit code is the one the CLI maps its code to
    /// ([`lease_cli::exit_codes::exit_for`]).
    pub fn of(code: Code, message: impl Into<String>) -> CliError {
        CliError::new(code, lease_cli::exit_codes::exit_for(code), message)
    }

    /// A usage error (exit 64) with code `ARGUMENT_INVALID`.
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::of(Code::ArgumentInvalid, message)
    }

    /// Attach extra JSON fields.
    pub fn with_extra(mut self, extra: Value) -> CliError {
        self.extra = Some(extra);
        self
    }

    /// Append a sentence to the message.
    pub fn with_hint(mut self, hint: impl AsRef<str>) -> CliError {
        self.message = format!("{}; {}", self.message, hint.as_ref());
        self
    }

    /// Print the error: `runlease: CODE: message` on stderr, and with `--json` also an
    /// error object on stdout.
    pub fn report(&self, out: &Out) {
        eprintln!("runlease: {}: {}", self.code, self.message);
        if out.json {
            out.json_line(&self.json());
        }
    }

    /// The `runlease/cli/error/1` object of this error.
    pub fn json(&self) -> Value {
        let mut v = json!({
            "schema": "runlease/cli/error/1",
            "ok": false,
            "code": self.code,
            "message": self.message,
            "exit_code": self.exit,
        });
        if let (Some(Value::Object(extra)), Value::Object(map)) = (&self.extra, &mut v) {
            for (k, x) in extra {
                map.insert(k.clone(), x.clone());
            }
        }
        v
    }
}

impl From<FsError> for CliError {
    fn from(e: FsError) -> CliError {
        CliError::of(e.code(), e.to_string())
    }
}

impl From<LeaseError> for CliError {
    fn from(e: LeaseError) -> CliError {
        CliError::of(e.code(), e.to_string())
    }
}

/// Name the run folder argument in a `RUN_ID_INVALID` error (the run id is the folder's
/// last path component, so the message alone would not say which argument was wrong).
pub fn name_folder(dir: &Path, e: impl Into<CliError>) -> CliError {
    let err: CliError = e.into();
    if err.code == Code::RunIdInvalid {
        err.with_hint(format!(
            "run folder {}: the run id is the folder's name",
            dir.display()
        ))
    } else {
        err
    }
}

impl From<lease_run::RunError> for CliError {
    fn from(e: lease_run::RunError) -> CliError {
        CliError::of(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_owned_is_77() {
        let e = CliError::from(FsError::NotOwned {
            run: "r".into(),
            path: "run.json".into(),
            uid: 1,
            mode: 0o644,
            detail: "x".into(),
        });
        // sysexits EX_NOPERM, the CLI's mapping of lease-fs's code.
        assert_eq!((e.code.as_str(), e.exit), ("RUN_NOT_OWNED", 77));
    }

    #[test]
    fn codes_are_not_repeated_in_messages() {
        let e = CliError::from(FsError::RunNotFound { path: "x".into() });
        assert_eq!(e.code, "RUN_NOT_FOUND");
        assert_eq!(e.exit, 64);
        assert!(!e.message.starts_with("RUN_NOT_FOUND"), "{}", e.message);
    }
}
