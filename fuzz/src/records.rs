//! `decode_records`: arbitrary bytes into every record decoder.
//!
//! - Never a panic; a failure is a typed `RECORD_INVALID` or `SCHEMA_UNSUPPORTED`.
//! - When a decoder accepts the bytes, `encode` of the record gives back exactly those
//!   bytes, and decoding them again gives the same record (one canonical byte form).
//! - `decode_for` agrees with `decode` and only accepts records of its own run.
//! - When the input is any JSON value, an event carrying it as payload encodes and decodes
//!   back to the same event: whatever an appender may write, every reader can read.

use crate::fixtures::{id, run_id, t};
use lease_core::{
    Checkpoint, CommandRecord, EpochRecord, Event, HeartbeatRecord, Record, RetirementRecord,
    RunStatus, Sequence, TakeoverIntent, decode, decode_for, encode,
};
use std::fmt::Debug;

fn one<R: Record + Debug + PartialEq>(data: &[u8]) {
    match decode::<R>(data) {
        Ok(r) => {
            let again = match encode(&r) {
                Ok(b) => b,
                Err(e) => panic!("{:?}: decoded record does not re-encode: {e}", R::KIND),
            };
            assert!(
                again == data,
                "{:?}: re-encoding differs from the accepted input\n input: {:?}\noutput: {:?}",
                R::KIND,
                String::from_utf8_lossy(data),
                String::from_utf8_lossy(&again)
            );
            match decode::<R>(&again) {
                Ok(r2) => assert_eq!(r2, r, "{:?}: decode is not stable", R::KIND),
                Err(e) => panic!("{:?}: canonical bytes do not decode again: {e}", R::KIND),
            }
            // decode_for: accepted for the record's own run, refused for another.
            if let Some(run) = r.run_id() {
                assert!(decode_for::<R>(run, data).is_ok(), "{:?}", R::KIND);
                let other = if run.as_str() == "other-run" {
                    run_id()
                } else {
                    lease_core::RunId::new("other-run").expect("valid")
                };
                let e = decode_for::<R>(&other, data).expect_err("a record of another run");
                assert_eq!(e.code(), "RECORD_INVALID", "{:?}", R::KIND);
            }
        }
        Err(e) => {
            assert!(
                matches!(e.code().as_str(), "RECORD_INVALID" | "SCHEMA_UNSUPPORTED"),
                "{:?}: unexpected error kind {}: {e}",
                R::KIND,
                e.code()
            );
            // The message renders (no panic in Display).
            let _ = e.to_string();
        }
    }
}

/// An event with `payload` must survive its own round trip: `Append` writes exactly these
/// bytes, and every reader decodes them with `decode`.
fn payload_round_trip(data: &[u8]) {
    let Ok(payload) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let ev = Event {
        run_id: run_id(),
        sequence: Sequence::FIRST,
        generation: lease_core::Generation::FIRST,
        owner_id: id("owner"),
        event_type: id("e"),
        payload,
        timestamp: t(0),
        prev_hash: None,
    };
    let bytes = match encode(&ev) {
        Ok(b) => b,
        // Refusing to write is fine: nothing unreadable reaches the disk.
        Err(_) => return,
    };
    match decode::<Event>(&bytes) {
        Ok(back) => assert_eq!(back, ev, "payload changed across a round trip"),
        Err(e) => panic!(
            "an event that encode() writes cannot be decoded: {e}\nbytes: {:?}",
            String::from_utf8_lossy(&bytes)
        ),
    }
}

/// The check of the `decode_records` target.
pub fn check(data: &[u8]) {
    one::<EpochRecord>(data);
    one::<HeartbeatRecord>(data);
    one::<RetirementRecord>(data);
    one::<TakeoverIntent>(data);
    one::<Checkpoint>(data);
    one::<RunStatus>(data);
    one::<CommandRecord>(data);
    one::<Event>(data);
    payload_round_trip(data);
}
