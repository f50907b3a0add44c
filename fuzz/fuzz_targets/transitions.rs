//! 2-3 actors interleaving the real step machines, checked against the protocol invariants (see src/transitions.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runlease_fuzz::transitions::check(data));
