//! Scenario tests of the protocol, one per clause of docs/PROTOCOL.md, over the in-memory
//! authority. Names say which clause they check.

#[path = "../common/mod.rs"]
mod common;

mod chain;
mod claim_release;
mod events;
mod heartbeat;
mod observe;
mod prune;
mod retire;
mod takeover;
