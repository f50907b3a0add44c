//! What the server's threads share: the limits, the connection slots, the committer's
//! queue entries and the context every task holds.

use crate::error::RunError;
use crate::run::Shared;
use crate::store_socket::{Answer, MAX_FRAME, UNAUTHENTICATED_SLOTS};
use lease_core::Code;
use lease_sqlite::Batch;
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::AbortHandle;

/// The most batches one group commit takes.
pub const MAX_GROUP: usize = 256;

/// Descriptors left to everything else (the heartbeat, the store, commands' pidfds and
/// pipes) before the store socket's connections are counted.
pub const FD_RESERVE: u64 = 128;

/// The request bytes the authenticated connections may hold at once (read, queued or
/// being committed): four full frames.
pub const REQUEST_BYTES: usize = 4 * MAX_FRAME;

/// The read buffer of an authenticated connection: a request this small (a commit of a
/// few hundred bytes of values) arrives with its length in one read (issue #33: the
/// connections' thread does the reading and answering of a whole group between its
/// commits).
pub const READ_AHEAD: usize = 1024;

/// The unit of [`REQUEST_BYTES`]' semaphore.
pub(super) const MEM_UNIT: usize = 4096;

/// The most commits one `log` page reads from the store.
pub(super) const LOG_PAGE: usize = 1024;

/// The most documents one `list` page reads from the store.
pub(super) const LIST_PAGE: usize = 10_000;

/// What one page of `list` or `log` may hold, in bytes of JSON (the first entry is always
/// included: a document or commit as large as a request fits in [`MAX_ANSWER`]).
pub(super) const PAGE_BYTES: usize = MAX_FRAME;

pub(super) type Reply = oneshot::Sender<Answer>;

/// A commit queued for the committer.
pub(super) struct Queued {
    /// The connection it came on (its slot id: unique in this server).
    pub(super) from: u64,
    pub(super) batch: Batch,
    pub(super) reply: Reply,
}

/// How many connections the server holds at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections past the handshake.
    pub authenticated: usize,
    /// Connections still in their handshake.
    pub unauthenticated: usize,
}

impl Limits {
    /// The limits for a soft `RLIMIT_NOFILE` of `soft` with `open` descriptors in use:
    /// a quarter of what is left after [`FD_RESERVE`] (1 to 256) authenticated, a
    /// sixteenth (1 to [`UNAUTHENTICATED_SLOTS`]) unauthenticated.
    pub fn of(soft: u64, open: u64) -> Limits {
        let budget = soft.saturating_sub(open).saturating_sub(FD_RESERVE);
        let cap = |n: u64, most: usize| usize::try_from(n).unwrap_or(most).clamp(1, most);
        Limits {
            authenticated: cap(budget / 4, 256),
            unauthenticated: cap(budget / 16, UNAUTHENTICATED_SLOTS),
        }
    }

    /// This process's limits, now.
    pub(super) fn now() -> Limits {
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(1 << 20);
        let open = std::fs::read_dir("/proc/self/fd").map_or(64, |d| d.count() as u64);
        Limits::of(soft, open)
    }
}

/// A connection still in its handshake, evictable.
pub(super) struct Slot {
    pub(super) id: u64,
    /// The connecting process (`SO_PEERCRED`), to evict from whoever holds the most.
    pub(super) pid: Option<i32>,
    /// It has sent its whole hello (a silent one is evicted first).
    pub(super) spoke: Arc<AtomicBool>,
    pub(super) task: AbortHandle,
}

#[derive(Default)]
pub(super) struct Pending {
    pub(super) next: u64,
    pub(super) slots: VecDeque<Slot>,
}

/// What every connection task shares.
pub(super) struct Ctx {
    pub(super) shared: Arc<Shared>,
    /// The abstract name (no `@`), bound into every proof.
    pub(super) name: String,
    /// The run folder's `(st_dev, st_ino)`, said in the welcome.
    pub(super) root: (u64, u64),
    pub(super) limits: Limits,
    pub(super) pending: Mutex<Pending>,
    /// An unauthenticated slot was freed.
    pub(super) freed: tokio::sync::Notify,
    pub(super) authenticated: Arc<Semaphore>,
    pub(super) request_bytes: Arc<Semaphore>,
    pub(super) tx: mpsc::Sender<Queued>,
    /// The runtime of the authenticated connections and the committer.
    pub(super) served: tokio::runtime::Handle,
}

impl Ctx {
    pub(super) fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Removes its connection from the unauthenticated slots when dropped (handshake done,
/// failed, or the task aborted).
pub(super) struct Unslot {
    pub(super) ctx: Arc<Ctx>,
    pub(super) id: u64,
}

impl Drop for Unslot {
    fn drop(&mut self) {
        let mut p = self.ctx.pending();
        if let Some(i) = p.slots.iter().position(|s| s.id == self.id) {
            p.slots.remove(i);
        }
        drop(p);
        self.ctx.freed.notify_one();
    }
}

/// The answer to a failed request. A released owner's refusal (`RUN_RELEASED`, which the
/// library reports for a handle used after its release) is `FENCED` to a command: its
/// owner's generation no longer counts, exactly as after a takeover.
pub(super) fn refusal(e: &RunError) -> Answer {
    match e {
        RunError::Released { run } => Answer::refused(
            Code::Fenced,
            format!("run {run}: this owner released the run; its generation no longer writes"),
        ),
        e => Answer::of_error(e),
    }
}
