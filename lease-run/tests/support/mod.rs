//! Helpers shared by lease-run's integration tests (each test file uses a subset).
#![allow(dead_code)]

use lease_core::{HeartbeatDurability, Timestamp, TimingPolicy};
use lease_run::{OpenOptions, Run};
use std::collections::BTreeMap;
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

/// [`fast`]'s timing with longer stop waits (term grace 300 ms, kill wait 1 s), for tests
/// whose commands must be seen to go (or stay) at release.
pub fn fast_patient() -> OpenOptions {
    OpenOptions {
        term_grace: Duration::from_millis(300),
        kill_wait: Duration::from_secs(1),
        ..fast()
    }
}

/// The variables a command of `run` is given, read from a real command (`env`).
pub async fn command_env(run: &Run) -> BTreeMap<String, String> {
    let out = run.command("env").output().await.unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
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
