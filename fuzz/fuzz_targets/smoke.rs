//! PLACEHOLDER fuzz target: it exercises no runlease code at all.
//!
//! It exists only because cargo rejects a package without any target. The real
//! targets (every lease-core parser, and transition sequences) arrive with issue #4.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Placeholder: deliberately tests nothing.
    let _ = data.len();
});
