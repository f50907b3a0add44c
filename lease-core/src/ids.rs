//! Validated identifiers: run ids, identities, generations, sequences and digests.
//!
//! A leaf of values: the errors of the protocol name these ids, so the constructors that
//! refuse with a [`crate::LeaseError`] ([`RunId::new`], [`Identity::arg`],
//! [`Generation::next`], [`Sequence::next`]) stand with that error, in `error.rs`; the
//! rules they apply are here.

pub use crate::invalid::InvalidValue;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::num::NonZeroU64;

/// `Display` and serde for a validated text id: written as its text, and read back only
/// through `check` (the type's own validation), so a decoded record never holds a value its
/// constructor refuses.
macro_rules! text_id {
    ($name:ident, |$text:ident| $check:expr) => {
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let $text = String::deserialize(d)?;
                $check.map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A run id: `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`.
///
/// A run id never contains `/`, and never starts with `.`, so it can never name `..` or a
/// hidden file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunId(String);

impl RunId {
    /// `value` as a run id, or why it is not one: the rule of [`RunId::new`].
    pub(crate) fn validate(value: String) -> Result<RunId, (String, &'static str)> {
        let reason = if value.is_empty() {
            Some("it is empty")
        } else if value.len() > 128 {
            Some("it is longer than 128 characters")
        } else if !value.as_bytes()[0].is_ascii_alphanumeric() {
            Some("it must start with a letter or digit")
        } else if !value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
        {
            Some("only letters, digits, '.', '_' and '-' are allowed")
        } else {
            None
        };
        match reason {
            Some(reason) => Err((value, reason)),
            None => Ok(RunId(value)),
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How a refused run id reads, in a decoding error and in
/// [`crate::LeaseError::RunIdInvalid`] alike.
pub(crate) fn run_id_refusal(value: &str, reason: &str) -> String {
    format!("run id {value:?} is not valid ({reason})")
}

text_id!(RunId, |s| RunId::validate(s)
    .map_err(|(value, reason)| run_id_refusal(&value, reason)));

/// Maximum length in bytes of an [`Identity`].
pub const IDENTITY_MAX_BYTES: usize = 256;

/// A non-empty, trimmed identity string without control characters (at most 256 bytes):
/// owner ids, host names, boot ids, store ids, event types.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Identity(String);

impl Identity {
    /// Validate and wrap an identity.
    pub fn new(value: impl Into<String>) -> Result<Identity, InvalidValue> {
        let value = value.into();
        let bad = |reason: String| Err(InvalidValue::new("identity", reason));
        if value.is_empty() {
            return bad("it is empty".into());
        }
        if value.trim() != value {
            return bad(format!("{value:?} has leading or trailing whitespace"));
        }
        if value.len() > IDENTITY_MAX_BYTES {
            return bad(format!("it is longer than {IDENTITY_MAX_BYTES} bytes"));
        }
        if value.chars().any(char::is_control) {
            return bad(format!("{value:?} contains a control character"));
        }
        Ok(Identity(value))
    }

    /// The identity as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Maximum length in bytes of a *word* ([`Identity::check_word`]): an owner id or a host
/// name.
pub const WORD_MAX_BYTES: usize = 128;

/// Whether `b` may appear in a *word* ([`Identity::check_word`]).
fn word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':' | b'@')
}

impl Identity {
    /// `Ok` if this identity is a *word*, the strict form of every identity that reaches a
    /// suggested command or an operator's screen as a name (owner ids, host names): 1 to
    /// [`WORD_MAX_BYTES`] ASCII letters, digits and `-_.:@`, starting with a letter or a
    /// digit. So a word is never taken for an option (no leading `-`), holds nothing a
    /// shell or a terminal would act on, and reads the same everywhere. Every owner id
    /// runlease makes is one (`run-<32 hex>`), and so is every host name RFC 1123 allows.
    /// `Err` says why not, naming `field`; the records refuse such a value when decoded
    /// (and encoded): `RECORD_INVALID` naming the file.
    ///
    /// ```
    /// use lease_core::Identity;
    /// let ok = Identity::new("run-0123abcd").unwrap();
    /// assert!(ok.check_word("owner_id").is_ok());
    /// let bad = Identity::new("-rf").unwrap();
    /// assert!(bad.check_word("owner_id").unwrap_err().contains("owner_id"));
    /// ```
    pub fn check_word(&self, field: &str) -> Result<(), String> {
        let s = self.0.as_bytes();
        let why = if s.len() > WORD_MAX_BYTES {
            Some(format!("is longer than {WORD_MAX_BYTES} bytes"))
        } else if !s.first().is_some_and(u8::is_ascii_alphanumeric) {
            Some("must start with a letter or digit".to_string())
        } else if !s.iter().copied().all(word_byte) {
            Some("may hold only ASCII letters, digits and '-', '_', '.', ':', '@'".to_string())
        } else {
            None
        };
        match why {
            None => Ok(()),
            Some(why) => Err(format!("{field} {:?} {why}", self.0)),
        }
    }

    /// Validate a *word* ([`Identity::check_word`]), e.g. an owner id given as an argument.
    pub fn word(what: &'static str, value: impl Into<String>) -> Result<Identity, InvalidValue> {
        let id = Identity::new(value).map_err(|e| InvalidValue::new(what, e.reason()))?;
        id.check_word(what)
            .map_err(|reason| InvalidValue::new(what, reason))?;
        Ok(id)
    }
}

text_id!(Identity, |s| Identity::new(s));

macro_rules! positive_u64 {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(NonZeroU64);

        impl $name {
            /// The first value, 1.
            pub const FIRST: $name = $name(NonZeroU64::MIN);

            /// Wrap a value; `None` for 0.
            pub fn new(value: u64) -> Option<$name> {
                NonZeroU64::new(value).map($name)
            }

            /// The value.
            pub fn get(self) -> u64 {
                self.0.get()
            }

            /// The next value; `None` past `u64::MAX` (`next`, in `error.rs`, names the
            /// run in that refusal).
            pub(crate) fn checked_next(self) -> Option<$name> {
                self.0.checked_add(1).map($name)
            }

            /// The previous value, if any.
            pub fn prev(self) -> Option<$name> {
                $name::new(self.get() - 1)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_u64(self.get())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let v = u64::deserialize(d)?;
                $name::new(v).ok_or_else(|| serde::de::Error::custom(concat!($what, " must be > 0")))
            }
        }
    };
}

positive_u64!(
    /// A lease generation: the fencing token. Starts at 1 and only grows.
    Generation,
    "generation"
);
positive_u64!(
    /// An event sequence number: starts at 1, no gaps.
    Sequence,
    "sequence"
);

/// A lowercase hex SHA-256 digest.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

impl Digest {
    /// SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        use sha2::Digest as _;
        Digest(hex::encode(sha2::Sha256::digest(bytes)))
    }

    /// Parse 64 lowercase hex characters.
    pub fn parse(s: &str) -> Result<Digest, InvalidValue> {
        if s.len() == 64 && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(Digest(s.to_owned()))
        } else {
            Err(InvalidValue::new(
                "digest",
                format!("{s:?} is not 64 lowercase hex characters"),
            ))
        }
    }

    /// The digest as hex.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

text_id!(Digest, |s| Digest::parse(&s));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_follow_the_pattern() {
        for ok in ["a", "A1", "run-1.x_y", &"a".repeat(128)] {
            assert!(RunId::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../x",
            "a/b",
            "-a",
            "_a",
            ".hidden",
            "a b",
            "é",
            &"a".repeat(129),
        ] {
            let e = RunId::new(bad).unwrap_err();
            assert_eq!(e.code(), "RUN_ID_INVALID", "{bad}");
        }
    }

    #[test]
    fn identities_are_trimmed_non_empty_and_printable() {
        assert!(Identity::new("owner-1").is_ok());
        assert!(Identity::new("host name.local").is_ok());
        for bad in ["", " a", "a ", "\t", "a\nb", "a\u{7f}b"] {
            assert!(Identity::new(bad).is_err(), "{bad:?}");
        }
        assert!(Identity::new("x".repeat(257)).is_err());
    }

    #[test]
    fn words_are_strict() {
        for ok in [
            "run-0123456789abcdef0123456789abcdef",
            "1b4e28ba-2fa1-41d2-883f-0016d3cca427",
            "runlease-prune@host-1.example.com:4242",
            "node_7",
            "a",
            &"a".repeat(WORD_MAX_BYTES),
        ] {
            assert!(
                Identity::new(ok).unwrap().check_word("owner_id").is_ok(),
                "{ok}"
            );
        }
        for bad in [
            "-rf",
            "--expect-owner",
            ".hidden",
            "_x",
            "a b",
            "$(touch PWNED)",
            "a;b",
            "a`b`",
            "a'b",
            "a\"b",
            "a/b",
            "é",
            "a\u{202e}b",
            &"a".repeat(WORD_MAX_BYTES + 1),
        ] {
            let e = Identity::new(bad)
                .unwrap()
                .check_word("owner_id")
                .unwrap_err();
            assert!(e.starts_with("owner_id "), "{e}");
        }
        assert_eq!(
            Identity::word("owner id", "-x").unwrap_err().what(),
            "owner id"
        );
        assert!(Identity::word("owner id", " x").is_err());
    }

    #[test]
    fn digest_is_sha256_hex() {
        assert_eq!(
            Digest::of(b"abc").as_str(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(Digest::parse(&"A".repeat(64)).is_err());
    }

    #[test]
    fn generation_overflow_is_typed() {
        let run = RunId::new("r").unwrap();
        let g = Generation::new(u64::MAX).unwrap();
        assert_eq!(g.next(&run).unwrap_err().code(), "GENERATION_OVERFLOW");
        assert_eq!(Generation::FIRST.next(&run).unwrap().get(), 2);
    }
}
