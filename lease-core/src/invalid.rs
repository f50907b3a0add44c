//! [`InvalidValue`]: the one refusal of a value's constructor or parser (an identity, a
//! digest, a timestamp). A leaf: the modules of values use it, and it uses none of them.

/// A value refused by a constructor or parser ([`crate::Identity::new`],
/// [`crate::Digest::parse`], [`crate::Timestamp::parse`]): what it was meant to be and why it
/// is not. A real error type, so `?` works into `Box<dyn Error>` and `anyhow`; protocol
/// operations report the same refusal as [`crate::LeaseError::ArgumentInvalid`] (see
/// [`crate::Identity::arg`]).
///
/// ```
/// use lease_core::{Identity, InvalidValue};
/// let e: InvalidValue = Identity::new(" padded").unwrap_err();
/// assert_eq!(e.what(), "identity");
/// assert_eq!(e.to_string(), "invalid identity: \" padded\" has leading or trailing whitespace");
/// let boxed: Box<dyn std::error::Error> = e.into();
/// # drop(boxed);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what}: {reason}")]
pub struct InvalidValue {
    what: &'static str,
    reason: String,
}

impl InvalidValue {
    /// A refusal of a `what` (`"identity"`, `"timestamp"`, ...) because of `reason`.
    pub fn new(what: &'static str, reason: impl Into<String>) -> InvalidValue {
        InvalidValue {
            what,
            reason: reason.into(),
        }
    }

    /// What the value was meant to be.
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// Why it is not.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}
