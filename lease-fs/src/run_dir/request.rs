//! One request of a lease-core operation carried out over an [`Fs`]: a read's one system
//! call, or the primitive a write steps ([`start_request`]), shared with the model checker.

use super::Liveness;
use crate::fs::Fs;
use crate::primitives;
use lease_core::canonical::MAX_RECORD_BYTES;
use lease_core::ops::{Durability, Request, Response};
use lease_core::{Dir, FileRef};
use std::io;

/// How one request is carried out.
#[derive(Debug, Clone)]
pub enum Exec {
    /// Answered by exactly one system call, already made.
    Ready(Response),
    /// Carried out by a primitive, one system call per step (with the target's path).
    Prim(primitives::PrimOp, String),
}

/// Start carrying out `req` on `fs`: read-only requests make their one system call now;
/// writes return the primitive to step. `tmp` names a temp file in a directory. Shared by
/// `RunDir`'s [`Transport::execute`](lease_core::Transport::execute) and the model checker, so both run the same order of calls.
/// Directories must exist (RunDir creates them on first use).
pub fn start_request(
    fs: &dyn Fs,
    liveness: &dyn Liveness,
    req: Request,
    tmp: impl FnOnce(&str) -> String,
) -> Result<Exec, (&'static str, String, io::Error)> {
    Ok(match req {
        // Every name that parses is judged as a record file (PROTOCOL §5.1: a directory,
        // symlink, FIFO, socket, device or oversize file named like a record is
        // `RUN_LAYOUT_INVALID`, the same error `Read` and `Exists` give for it).
        Request::List(dir) => {
            let mut refs = Vec::new();
            fs.list_records(
                dir.path(),
                MAX_RECORD_BYTES,
                &|n| dir.parse_name(n).is_some(),
                &mut |n| refs.extend(dir.parse_name(n)),
            )
            .map_err(|e| ("list", dir.path().to_string(), e))?;
            Exec::Ready(Response::Listing(refs))
        }
        Request::CountEvents => {
            // Streamed: no list of names is built, whatever the log's length.
            let (mut count, mut highest) = (0u64, 0u64);
            fs.list_records(
                Dir::Events.path(),
                MAX_RECORD_BYTES,
                &|n| Dir::Events.parse_name(n).is_some(),
                &mut |n| {
                    if let Some(FileRef::Event(s)) = Dir::Events.parse_name(n) {
                        count += 1;
                        highest = highest.max(s.get());
                    }
                },
            )
            .map_err(|e| ("list", Dir::Events.path().to_string(), e))?;
            Exec::Ready(Response::EventCount { count, highest })
        }
        Request::Read(f) => {
            let p = f.path();
            let content = fs.read(&p, MAX_RECORD_BYTES).map_err(|e| ("read", p, e))?;
            Exec::Ready(Response::Content(content))
        }
        Request::Exists(f) => {
            let p = f.path();
            let exists = fs
                .exists_record(&p, MAX_RECORD_BYTES)
                .map_err(|e| ("stat", p, e))?;
            Exec::Ready(Response::Exists(exists))
        }
        Request::CreateExclusive(f, bytes) => {
            let p = f.path();
            let t = tmp(crate::fs::split(&p).0);
            Exec::Prim(primitives::PrimOp::create_exclusive(&p, bytes, t), p)
        }
        Request::WriteBeat {
            file,
            seq,
            record,
            durability,
        } => {
            let p = file.path();
            let t = tmp(crate::fs::split(&p).0);
            // On a file system that can lose unsynced writes while the owner lives (NFS,
            // SMB, FUSE, …: `fstype`), every beat is made durable whatever the policy says
            // (PROTOCOL §5.3): a `local` beat lost there would make a live owner look stale.
            let durable = durability == Durability::Fsync || fs.loses_unsynced_writes();
            let prim =
                primitives::PrimOp::write_beat(&p, seq, &record, durable, t).map_err(|e| {
                    (
                        "write heartbeat",
                        p.clone(),
                        io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
                    )
                })?;
            Exec::Prim(prim, p)
        }
        Request::Remove(f, d) => {
            let p = f.path();
            Exec::Prim(primitives::PrimOp::remove(&p, d == Durability::Fsync), p)
        }
        Request::ProbeLiveness(h) => Exec::Ready(Response::Liveness(liveness.probe(&h))),
        // One `fsync` of the directory: every entry it holds now (the record the operation
        // read among them; its data was fsynced by its creator before the link) survives a
        // power loss from here on (PROTOCOL §7.0 SYNC).
        Request::SyncDir(dir) => {
            fs.fsync_dir(dir.path())
                .map_err(|e| ("fsync", dir.path().to_string(), e))?;
            Exec::Ready(Response::Done)
        }
        Request::Monotonic => Exec::Ready(Response::Monotonic(liveness.monotonic_ns())),
        // The engine-committed store (PROTOCOL §18) needs a create and a check of the
        // epochs made one atomic step, which a run folder cannot give: refused, nothing
        // written. A run folder keeps its store in SQLite (§2); the shared-disk record log
        // of issue #32 is not built yet.
        Request::CreateGuarded { file, .. } => {
            return Err(unsupported(
                "create guarded",
                file.path(),
                "a run folder cannot create a file and check the epochs in one atomic step; the engine-committed store needs an engine (--authority etcd://...)",
            ));
        }
        Request::ReplaceGuarded { file, .. } => {
            return Err(unsupported(
                "replace guarded",
                file.path(),
                "a run folder cannot replace a file and check the epochs in one atomic step; the run folder's run.json is written under the owner's checks instead",
            ));
        }
        Request::ReadStoreRecords { .. } => {
            return Err(unsupported(
                "read store records",
                Dir::StoreLog.path().to_string(),
                "a run folder has no engine-committed store log; its store is store/run.sqlite",
            ));
        }
    })
}

/// A request a run folder refuses (its one error), nothing written: `op` on `path`,
/// `why` it cannot be done here.
fn unsupported(op: &'static str, path: String, why: &str) -> (&'static str, String, io::Error) {
    (op, path, io::Error::new(io::ErrorKind::Unsupported, why))
}

/// The response to a finished primitive.
pub fn prim_response(kind: primitives::PrimKind, outcome: bool) -> Response {
    match (kind, outcome) {
        (primitives::PrimKind::CreateExclusive, true) => Response::Created,
        (primitives::PrimKind::CreateExclusive, false) => Response::AlreadyExists,
        _ => Response::Done,
    }
}
