//! Arbitrary bytes into the store socket's frames, requests, hex and answers (see src/store_wire.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runlease_fuzz::store_wire::check(data));
