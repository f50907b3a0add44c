//! Helpers shared by lease-run's integration tests (each test file uses a subset).
#![allow(dead_code)]

use lease_core::{HeartbeatDurability, Timestamp, TimingPolicy};
use lease_run::OpenOptions;
use std::time::Duration;

/// Fast timing (heartbeat 100 ms, self-fence 300 ms, stale 1 s) and short stop waits.
pub fn fast() -> OpenOptions {
    OpenOptions {
        policy: TimingPolicy::from_millis(100, 300, 1000, HeartbeatDurability::Local).unwrap(),
        term_grace: Duration::from_millis(200),
        kill_wait: Duration::from_millis(500),
        ..OpenOptions::default()
    }
}

/// A two-worker tokio runtime.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// This host's wall clock as a protocol timestamp.
pub fn now_ts() -> Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    Timestamp::from_unix_millis(u64::try_from(ms).unwrap()).unwrap()
}
