//! The checks behind runlease's fuzz targets (issue #4, item 2).
//!
//! Each target in `fuzz_targets/` is a one-line call into this library, so that the same
//! code also runs on the stable toolchain: `tests/replay.rs` replays every committed corpus
//! input and every saved regression through it, and `examples/gen_corpus.rs` builds the seed
//! corpus with the real encoders.
//!
//! | target           | module          | what it checks                                                |
//! |------------------|-----------------|---------------------------------------------------------------|
//! | `decode_records` | [`records`]     | every record decoder: no panic, typed error, exact re-encoding |
//! | `parse_names`    | [`names`]       | `Dir::parse_name`: only names it would produce, none escaping |
//! | `read_folder`    | [`folder`]      | status / log / verify / claim / takeover / retire over any folder, in `MemDisk` and in `SimFs` |
//! | `transitions`    | [`transitions`] | 2-3 actors interleaving the real step machines: the protocol invariants |
//! | `store_wire`     | [`store_wire`]  | the store socket's frames, requests, hex and answers: no panic, exact framing, commits survive the wire |

pub mod fixtures;
pub mod folder;
pub mod names;
pub mod records;
pub mod store_wire;
pub mod transitions;

/// A target's check: panics on a finding.
pub type Check = fn(&[u8]);

/// Every fuzz target by name, with its check (for the replay test).
pub const TARGETS: [(&str, Check); 5] = [
    ("decode_records", records::check),
    ("parse_names", names::check),
    ("read_folder", folder::check),
    ("transitions", transitions::check),
    ("store_wire", store_wire::check),
];
