//! `read_folder`: the lease and event-log readers (and the writers that start by reading)
//! over arbitrary folder contents.
//!
//! The input is decoded into a small set of files ([`Folder::parse`]): each file sits in one
//! of the protocol folders (or the run root), under either the name the layout gives a typed
//! number or an arbitrary raw name, with arbitrary bytes (the seed corpus holds real runs, so
//! mutations give valid-looking names with garbage or mutated valid records). The same
//! folder is materialized twice:
//!
//! - in a [`MemDisk`] (typed names only), driven by the step machines directly;
//! - in a [`SimFs`] through [`RunDir::with_fs`], the real adapter: raw names (strays, temp
//!   files, files where folders belong, subfolders where files belong), and files whose data
//!   or entry was never fsynced before a simulated power loss (empty or torn files).
//!
//! On each: status (with and without a liveness probe), a read-only `ReadEvents`, `Verify`,
//! and, each on its own copy, claim, exact takeover, dead-owner retirement, a finalizing
//! `ReadEvents`, and heartbeat / append / release with a lease forged for the head.
//!
//! Checked: no panic; no `PROTOCOL_VIOLATION` (the machines never misread a correct
//! answer); every operation finishes within a bounded number of requests; read-only
//! operations write nothing; an `invalid` status lets no claim, takeover or retirement
//! succeed; a claim succeeds only on a free run, a takeover only on a stale one, a
//! retirement only on a dead one (or the caller adopts its own epoch), each creating
//! exactly head + 1; an append that returned success counts in the log as read afterwards
//! whenever the folder verified before; orphan temp cleanup removes only temp files; and
//! when every file is plainly named and durable, `MemDisk` and `SimFs` give the same
//! answers.

mod drive;
mod input;
mod judge;

use drive::Summary;
pub use input::{Entry, Folder, Name, Persist};
use judge::{judge_mem, judge_sim};

/// Most files one input may describe.
pub const MAX_FILES: usize = 48;
/// Longest raw name.
const MAX_NAME: usize = 64;
/// Requests after which an operation over a static folder is considered stuck.
const MAX_REQUESTS: usize = 20_000;

/// The check of the `read_folder` target.
pub fn check(data: &[u8]) {
    let _ = judge(data);
}

/// Run an input through every check; the folder and both summaries.
fn judge(data: &[u8]) -> (Folder, Summary, Summary) {
    let folder = Folder::parse(data);
    let (mem, expect, forged) = judge_mem(&folder);
    let sim = judge_sim(&folder, expect, forged.as_ref());
    if folder.is_plain() {
        assert_eq!(
            &mem, &sim,
            "MemDisk and SimFs disagree on the same plainly named, durable folder"
        );
    }
    (folder, mem, sim)
}

/// Run an input and describe the folder and what each operation answered, on the MemDisk
/// and on the SimFs (for triage: `examples/show.rs`). Formatting is left out of
/// [`check`]: pretty-printing every content byte cost the target a quarter of its time.
pub fn describe(data: &[u8]) -> String {
    let (folder, mem, sim) = judge(data);
    format!("{folder:#?}\nMemDisk: {mem:#?}\nSimFs: {sim:#?}")
}
