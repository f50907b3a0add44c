//! # lease-sqlite: the sequenced store of a run, with a fencing-token check and a seal
//!
//! A run's durable state lives in one SQLite file, `store/run.sqlite` inside the run folder
//! (`docs/PROTOCOL.md` §2). This crate is that store. It is the last line of defence: a
//! superseded owner's late write is refused here even if every other defence failed.
//!
//! - **Commits.** [`Store::commit`]`(token, batch)` applies a [`Batch`] (puts and deletes of
//!   keyed documents, plus log entries) in one `BEGIN IMMEDIATE` transaction. Each commit
//!   gets the next sequence number (1, 2, 3, ... without gaps) and records its writer's
//!   fencing token, the lease generation.
//! - **The fencing check** (Kleppmann's fencing token) is made *inside* that transaction:
//!   it reads the highest token the store has accepted (`fence.max_token`); a lower token
//!   rolls back and is refused with `FENCED` (exit 75); otherwise the highest token is
//!   raised and the commit proceeds. Check and write are one atomic step, so no interleaving
//!   can slip an old writer's commit in after a newer writer's.
//! - **Reads**: [`Store::get`], [`Store::scan_prefix`] (paged: [`Store::scan_prefix_page`]),
//!   [`Store::commits_since`] (with their writes and log entries; paged:
//!   [`Store::commits_page_bytes`]), [`Store::head`] (the last committed sequence).
//! - **The seal** (below): checked before anything can commit, by construction.
//!
//! ```
//! use lease_core::{Generation, RunId};
//! use lease_sqlite::{Batch, StoreOptions, Store};
//!
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("store/run.sqlite");
//! let run = RunId::new("demo")?;
//!
//! // Open (creating it); no lease chain here, said explicitly; commit as generation 1.
//! let opened = Store::open(&run, &path, StoreOptions { create: true, expect: None })?;
//! let mut store = opened.check(&lease_core::seal::Requirements::no_chain())?;
//! let g1 = Generation::new(1).unwrap();
//! let seq = store.commit(g1, &Batch::new().put("doc/a", "hello").log("step 1 done"))?;
//! assert_eq!((seq, store.head()?), (1, 1));
//! assert_eq!(store.get("doc/a")?.unwrap().value, b"hello");
//!
//! // Clean release: seal (store id + head + generation) and close.
//! let seal = store.seal(g1)?;
//! assert_eq!(seal.sequence, 1);
//!
//! // The next owner (generation 2) checks the seal, then commits; the old token is fenced.
//! let mut store = Store::open(&run, &path, StoreOptions::default())?.check_seal(Some(&seal), None)?;
//! let g2 = Generation::new(2).unwrap();
//! store.commit(g2, &Batch::new().delete("doc/a"))?;
//! let refused = store.commit(g1, &Batch::new().put("doc/a", "late")).unwrap_err();
//! assert_eq!(refused.code().as_str(), "FENCED");
//! assert_eq!(store.commits_since(0)?.len(), 2);
//! store.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With a restored (rewound) copy refused: `examples/two_generations.rs`
//! (`cargo run -p lease-sqlite --example two_generations`).
//!
//! ## Durability settings, and why
//!
//! Set at every open, each read back; a value that does not take refuses the open with
//! `STORE_PRAGMA` (exit 70):
//!
//! | pragma | value | why |
//! |---|---|---|
//! | `locking_mode` | `EXCLUSIVE`, set **before** `journal_mode` | With WAL, exclusive locking set before the WAL is first used keeps the WAL index in heap memory: no `-shm` file (no shared memory to go stale on network or FUSE file systems), and the connection holds an exclusive lock on the file for its whole life, so a second connection, in any process, gets "database is locked" (`STORE_BUSY`). |
//! | `journal_mode` | `WAL` | A commit appends to the WAL and fsyncs only the WAL: one sequential write and one fsync per commit, readers never see a half-applied batch, and a crash at any point leaves the last fsynced commit as the head (SQLite replays the WAL, checking its frame checksums, at the next open). |
//! | `synchronous` | `FULL` (2) | The WAL is fsynced at every commit, so a commit that returned `Ok` survives power loss, not just a process crash (`NORMAL` would sync only at checkpoints and may lose the last commits). This is what "acknowledged" means here. A view of an engine's log (`store/view.sqlite`) uses `NORMAL` (1): the engine holds the acknowledged commit, and a power loss only rewinds the view together with its recorded position, from which the next catch-up applies the records again. |
//! | `wal_autocheckpoint` | 1000 pages (SQLite's default, set explicitly) | Bounds the WAL (about 4 MiB at the default page size); the checkpoint runs inside a commit now and then and fsyncs the database file. |
//! | `mmap_size` | 0 | All I/O goes through `read`/`write`, so an I/O error is a reported error (`STORE_IO`), not a `SIGBUS`. |
//!
//! [`Store::close`] (and [`Store::seal`]) checkpoint with `wal_checkpoint(TRUNCATE)`, then
//! close, which removes the WAL: the file is whole on its own afterwards. A handle that is
//! merely dropped does not checkpoint (SQLite's checkpoint-on-close is turned off for it):
//! nothing is lost, the WAL is replayed at the next open, and a handle that failed or was
//! refused never writes on its way out. `busy_timeout` is 0: a held store is reported at
//! once, never waited for.
//!
//! A new store is built whole in a temp file beside its final name (schema, identity,
//! `user_version`, checkpointed and fsynced), then `link(2)`ed into place (which never
//! replaces a file) and the folder fsynced. So a store file is never half-initialized, and
//! an empty file in the store's place is never a store.
//!
//! ## Schema
//!
//! **Bound to its run:** a new store's SQLite `application_id` (a header field, no schema
//! change) is the first 32 bits of SHA-256 over `runlease-store/<run id>`;
//! [`Store::open`] refuses a store whose id is another run's (`STORE_IDENTITY_MISMATCH`, 65,
//! the file untouched). A store created before this binding (id 0) is accepted and bound at
//! its first accepted [`OpenedStore::check_seal`]. Two runs with the same id (the folder's
//! name) in different parents are not told apart by it; the seal's store id still is.
//!
//! Version [`SCHEMA_VERSION`] (1), recorded as `PRAGMA user_version` and in `store_meta`
//! (with the store id and creation time). Tables: `store_meta`, `fence` (one row:
//! `max_token`), `commits` (`seq`, `token`, `committed_at`, counts, and the commit's puts
//! and deletes encoded in one BLOB), `docs` (`key`, `value`, `updated_seq`), `log` (`seq`,
//! `idx`, `entry`).
//! **Pinned** (issue #29, a store file is data, not code): every open, the owner's and the
//! read-only one, reads `sqlite_master` (type, name, table, `CREATE` text) before any
//! statement reads a table, and compares it with exactly the rows the creation makes
//! (built once per process by running the same DDL in memory): a trigger, view, index or
//! table a store is not created with, or an altered `CREATE` text, is `STORE_CORRUPT`
//! naming the object. So nothing in a store file runs: no trigger (one kept
//! `fence.max_token` at 0 and turned the fencing check off), no view, no generated column
//! (a 24 KB file whose `docs.value` was a 1 GB `zeroblob` on every read made
//! `store list` use 2.6 GB).
//! Any other version, or our tables missing, is refused with `SCHEMA_UNSUPPORTED` (exit 70)
//! and the file is never altered: the version in the header is read with plain `read(2)`
//! before SQLite opens the file, and SQLite is asked again (after any WAL replay) before the
//! first write. There is no migration in this version.
//!
//! ## A view of the engine's store log (schema version 2)
//!
//! With an engine (etcd) as the run's authority (issue #32), the run's commits are
//! immutable records in the engine (`lease_core::store_log`), and each host's SQLite file
//! is a local, rebuildable **view** of that log: `store/view.sqlite` ([`VIEW_FILE_NAME`]),
//! schema version [`VIEW_SCHEMA_VERSION`] (2): exactly version 1's tables plus
//! `engine_view` (one row: the last applied record's sequence and hash, and the last
//! commit's sequence, [`ViewPosition`]), pinned the same way. A version 2 file is only
//! ever a view and a version 1 file only ever a local store: opening one as the other is
//! `SCHEMA_UNSUPPORTED` (70), decided from the header before SQLite opens the file, which
//! is left as it was (not `STORE_IDENTITY_MISMATCH`: that says "another store or another
//! run", and would send an operator looking for a restored copy when the file is simply
//! the other kind; there is no migration between them). Local mode is unchanged.
//!
//! - [`Store::open_view_in`] opens it through the same descriptor-relative machinery and
//!   checks (creating an empty view when asked); no seal check: the engine's log says
//!   what a view must hold.
//! - [`Store::apply_record`] is the only way a view changes: in one transaction, the view
//!   must be at the record before ([`StoreError::ViewNotAt`], `CONCURRENT_CHANGE` 75,
//!   otherwise), then the fencing check and commits of [`Store::commit_group`], then the
//!   new position. [`Store::commit`] and [`Store::seal`] refuse a view.
//! - [`Store::image`] serializes the whole database; [`Store::build_view_in`] replaces
//!   the view with an image (checked whole under a temp name first), in an order of
//!   renames and fsyncs that never lets an old view's WAL meet the new file.
//!
//! ## The seal, bound to the store's identity, and the floor
//!
//! Every store gets a random 128-bit id (32 hex digits) when it is created. A clean
//! release calls [`Store::seal`]`(generation)`, which returns a [`lease_core::Seal`]: the
//! store id, the head, and the sealing generation; the lease layer writes it into the
//! release epoch. A crash leaves no seal, so every change of owner also records the store
//! head it knew in the lease chain (`EpochRecord.store_floor`).
//!
//! [`Store::open`] returns an [`OpenedStore`]. It can tell its identity and head and nothing
//! else: the only way to a [`Store`] that commits is [`OpenedStore::check_seal`]`(seal,
//! floor)` (type-state), which runs [`lease_core::seal::check_seal`]: a seal naming another
//! store id is `STORE_IDENTITY_MISMATCH` (65), so a restored or foreign copy with a higher
//! head does not pass; a head below the seal or below the floor is `STORE_BEHIND_SEAL` (65).
//! Skipping the check cannot be written.
//!
//! ## One connection per file per process
//!
//! SQLite locks its file with POSIX advisory (`fcntl`) locks. Those belong to the process:
//! closing **any** descriptor of the file, from any code in the process, drops all of the
//! process's locks on it. A second open of the store file in the same process (even
//! read-only, even through another path or a hard link) would therefore, when closed,
//! silently drop the owner connection's exclusive lock, and another process could open the
//! store beside the owner. So:
//!
//! - a process-wide registry keyed by the file's identity (device, inode) refuses a second
//!   open of the same file in this process with `STORE_BUSY` until the first handle is gone
//!   (the run layer must never open the file by other means either);
//! - with `locking_mode = EXCLUSIVE`, another process cannot open it: its first read gets
//!   "database is locked", reported as `STORE_BUSY`;
//! - the crate's own header check opens and closes a descriptor only *before* SQLite opens
//!   the file and while holding the registry entry, so it can drop no lock.
//!
//! `STORE_BUSY` exits 75 ("temporary: retry later"), not 76: this crate does not know about
//! owners (the lease decides who holds a run, and reports 76); a busy store only means
//! another handle has not closed yet, which a retry can outlast.
//!
//! ## Opened beneath a held folder descriptor
//!
//! [`Store::open_in`] takes a descriptor of the store's folder (the run layer opens
//! `store/` beneath the run's held root) and makes every system call on the store's files
//! relative to it: `fstatat`, `openat` (`O_NOFOLLOW|O_NONBLOCK` for the header check),
//! `linkat`, `unlinkat`, `fsync` of the folder. SQLite itself is given the name
//! `/proc/self/fd/N/run.sqlite` and opens it through the VFS `runlease-fd`: SQLite's own
//! `unix` VFS, registered a second time with one function replaced, `xFullPathname`, which
//! leaves such a name as it is (the stock one resolves the magic link back into the folder's
//! path and would walk it again). The kernel resolves `/proc/self/fd/N` to the held
//! directory, so swapping `store/` for a symlink after it is held changes nothing; the last
//! component is opened `O_NOFOLLOW` by SQLite's VFS. That VFS shim (src/vfs.rs) is the only
//! `unsafe` code in the workspace. Where `/proc` is not mounted, SQLite is given the folder's
//! path instead, and the open re-checks afterwards that the name is still the file it
//! checked; [`Store::reached_through_fd`] says which happened. [`Store::open`] opens the
//! folder of a path (never through a symlink in its last component) and then does the same.
//!
//! ## Bad input
//!
//! A file in the store's place that is not a regular file (directory, symlink), is empty,
//! is not SQLite, is truncated, has a schema other than the pinned one or fails
//! `PRAGMA quick_check` is `STORE_CORRUPT` (exit 65)
//! naming the file. The store is never recreated over it (a store is created only when no
//! file exists) and a refused file is left byte for byte as it was. A store file with a
//! second hard link is refused the same way (SQLite finds the WAL by the name it opened, so
//! another name would miss acknowledged commits), except a `.tmp-*` name of the same file,
//! which is what a crash in the middle of creating a store leaves and is removed.
//! `quick_check` reads every page, so opening takes time linear in the store's size.
//!
//! ## Trust, limits and bounded reads
//!
//! - **Owner and mode** (lease-fs's rule for every record of a run): the store's folder,
//!   the store file, and a `-wal` or `-journal` beside it must be owned by the effective
//!   uid and not writable by group or others; otherwise `RUN_NOT_OWNED` (77), checked
//!   before SQLite opens anything and judged on an `fstat` of the descriptor opened (the
//!   folder's held descriptor; the header check's descriptor of the file; a descriptor of
//!   each side file). The name is re-checked to be that inode after SQLite's open, and only
//!   its owner (us) or root can change the owner or mode of an inode we trust.
//! - **Defence in depth on every connection**, set before its first read:
//!   `SQLITE_DBCONFIG_DEFENSIVE`, `trusted_schema` off, triggers and views disabled
//!   (`SQLITE_DBCONFIG_ENABLE_TRIGGER`/`_VIEW`), `cell_size_check` on, and
//!   `sqlite3_limit`s: no string or BLOB above [`MAX_COMMIT_BYTES`] (+4 KiB of record
//!   framing) is ever built or read (`SQLITE_LIMIT_LENGTH`; a bigger stored value is
//!   `STORE_CORRUPT`), small SQL, expression depth, columns, VDBE program, no `ATTACH`.
//! - **Commits are bounded**: one commit holds at most [`MAX_COMMIT_BYTES`] (16 MiB) of
//!   encoded writes and log entries (`ARGUMENT_INVALID` above it, nothing written).
//! - **Reads that serve others are paged**: [`Store::scan_prefix_page`] (by key, a row
//!   and a byte limit) and [`Store::commits_page_bytes`] (a count and a byte limit) read
//!   row by row and hold at most one page plus one value; [`Store::scan_prefix`] and
//!   [`Store::commits_since`] still return everything, for an owner reading its own store.
//!
//! `tests/hostile_store.rs` builds each hostile shape and measures a child reader's peak
//! RSS and time.
//!
//! ## Reading without being the owner
//!
//! [`Store::open_read_only`] (and [`Store::open_read_only_in`]) give a [`ReadOnlyStore`]:
//! the reading methods of a [`Store`], and not one byte written to the folder (SQLite's
//! `immutable=1`: no lock, no `-shm`, no WAL replay). A `-wal` left by an owner that did not
//! close the store holds commits only an owner's open replays, so it is refused
//! (`STORE_BUSY`, 75, [`StoreError::NeedsOwner`]). The caller keeps owners out while it
//! reads (the run layer holds the run's owner lock). `tests/readonly_facts.rs` pins down
//! the SQLite behaviour this rests on.
//!
//! ## The commit gate
//!
//! [`Store::set_commit_gate`] installs a hook that runs before each commit (and seal)
//! starts; the run layer plugs in its self-fence deadline check (`docs/PROTOCOL.md` §7.11).
//!
//! ## Error codes
//!
//! [`StoreError::code`]; [`STORE_ERROR_CODES`] lists this crate's (with the exit code
//! `runlease` gives each): `ARGUMENT_INVALID` 64 · `STORE_CORRUPT` 65 · `STORE_MISSING` 65 ·
//! `SCHEMA_UNSUPPORTED` 70 · `STORE_PRAGMA` 70 · `STORE_INTERNAL` 70 · `STORE_IO` 74 ·
//! `FENCED` 75 · `STORE_BUSY` 75 · `RUN_NOT_OWNED` 77; plus `STORE_BEHIND_SEAL` 65 and `STORE_IDENTITY_MISMATCH`
//! 65 from lease-core.
#![deny(missing_docs)]

mod codec;
pub mod error;
mod folder;
mod header;
mod registry;
pub mod schema;
pub mod store;
mod vfs;

pub use error::{STORE_ERROR_CODES, StoreError};
pub use schema::{SCHEMA_VERSION, VIEW_SCHEMA_VERSION};
pub use store::{
    Batch, Commit, CommitGate, Document, Expected, MAX_COMMIT_BYTES, OpenedStore, ReadOnlyStore,
    Store, StoreOptions, VIEW_FILE_NAME, ViewPosition, WAL_AUTOCHECKPOINT_PAGES, Write,
};
