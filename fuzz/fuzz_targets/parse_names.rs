//! Arbitrary strings into Dir::parse_name for every folder (see src/names.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runlease_fuzz::names::check(data));
