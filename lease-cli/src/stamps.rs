//! What this process stamps on what it reads and writes: the wall clock as a protocol
//! timestamp, a fresh owner id, the maintainer identity of the records `prune` writes.

use crate::error::CliError;
use lease_core::{Code, Timestamp};
use std::time::{SystemTime, UNIX_EPOCH};

/// The observer's wall clock (`CLOCK_REALTIME`) as a protocol timestamp.
pub fn wall_now() -> Result<Timestamp, CliError> {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|_| CliError::of(Code::ClockInvalid, "the wall clock is before 1970"))?
        .as_millis();
    u64::try_from(ms)
        .ok()
        .and_then(Timestamp::from_unix_millis)
        .ok_or_else(|| CliError::of(Code::ClockInvalid, "the wall clock is past 9999"))
}

/// A fresh random owner id for `takeover` and `retire`: lease-run's
/// [`lease_run::new_owner_id`], the one form (`run-<32 hex>`) `runlease run` gets too.
pub fn new_owner_id() -> Result<lease_core::Identity, CliError> {
    lease_run::new_owner_id().map_err(CliError::from)
}

/// An identity naming this CLI process for records it writes as a maintainer (prune).
pub fn cli_identity(what: &str) -> lease_core::Identity {
    let host = lease_run::folder::this_holder()
        .map(|h| h.host.to_string())
        .unwrap_or_else(|_| "unknown-host".into());
    lease_core::Identity::new(format!("runlease-{what}@{host}:{}", std::process::id()))
        .unwrap_or_else(|_| {
            lease_core::Identity::new(format!("runlease-{what}")).expect("static identity")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_ids_are_run_and_32_hex_digits_and_differ() {
        let a = new_owner_id().unwrap().to_string();
        let b = new_owner_id().unwrap().to_string();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert!(a.starts_with("run-"), "{a}");
        assert!(
            a[4..]
                .bytes()
                .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')),
            "{a}"
        );
    }
}
