//! Readers and ownership changes over arbitrary folder contents, in MemDisk and SimFs (see src/folder.rs).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| runlease_fuzz::folder::check(data));
