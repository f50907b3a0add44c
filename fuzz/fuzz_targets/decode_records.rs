//! Arbitrary bytes into every record decoder: typed error or exact canonical re-encoding (see src/records.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runlease_fuzz::records::check(data));
