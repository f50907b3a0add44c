//! The owner's side of the store socket ([`crate::store_socket`]): the listener on its own
//! thread and runtime, the handshake, one task per connection, and the committer that
//! makes group commits.
//!
//! ## Where it runs, and what a connection may cost (issue #29)
//!
//! The server runs on two threads of its own, each with its own current-thread tokio
//! runtime and bounded blocking pool: `lease-run-store`, the doorway (accept, the
//! handshakes, the refusals), and `lease-run-store-served`, the authenticated connections'
//! requests and the committer (a connection moves there once its welcome is sent).
//! However many connections arrive, they cost the doorway's time: never the run's runtime,
//! where the heartbeat task, the self-fence timer and the commands' reaping live, and not
//! the requests of the commands already in. The run's runtime holds one task for the
//! server, a guard: aborting it (as the release and the fence path abort every task of the
//! run) stops both runtimes, which closes the listener and every connection.
//!
//! Descriptors: at most [`Limits::authenticated`] authenticated connections (a quarter of
//! what `RLIMIT_NOFILE` leaves after the descriptors open at start and a reserve of
//! [`FD_RESERVE`], at most 256) and [`Limits::unauthenticated`] connections still in their
//! handshake (at most [`crate::store_socket::UNAUTHENTICATED_SLOTS`]); another user's
//! connection is closed as it is accepted, holding no slot, and so is one whose first
//! frame already announces more than [`MAX_HELLO`] bytes (after the bare refusal). So
//! the heartbeat (which opens the beat file) always finds a descriptor. Memory: before
//! authentication a connection owns one [`MAX_HELLO`]-byte buffer; after it, a
//! [`READ_AHEAD`]-byte read buffer (a small request is read in one system call), and the
//! request bodies being read or carried out share a budget of [`REQUEST_BYTES`] (a reader
//! waits for its turn), and the committer's queue holds at most one request per
//! authenticated connection.
//!
//! ## A commit, in order
//!
//! 1. The connection task (authenticated by the handshake, which bound its generation)
//!    checks the live owner and queues its batch for the committer.
//! 2. The committer forms a group: every batch queued so far (at most [`MAX_GROUP`]),
//!    then, if connections that committed in the groups just before are missing, a short
//!    wait for them ([`Gatherer`], issue #33: at most the last group's commit and beat
//!    time, at most [`GATHER_MAX`]; a lone command never waits). Meanwhile nothing of the
//!    group is written.
//! 3. It commits the group in one store transaction (`RunStore::commit_group`: the fencing
//!    check, one WAL fsync, one sequence each); the slot's head is raised to the last
//!    sequence.
//! 4. Once that returned, it writes one **durable** heartbeat (fsynced whatever the
//!    policy) under the beat lock the heartbeat task also takes. The head it carries is
//!    read under that lock, after 3, so it is at or above every sequence of the group.
//! 5. Only then are the group's requests answered, each with its sequence; then the next
//!    group is formed (the requests that arrived meanwhile wait in the queue).
//!
//! So when an answer says a commit is made, all of this is durable and was checked: its
//! batch is in the store's WAL, fsynced (3 returned); a heartbeat that started after that,
//! carrying a head at or above its sequence, is fsynced (4 returned); the run was live
//! when the group was committed (the store's commit gate) and when the beat started
//! (`check_live` under the beat lock), and no newer owner existed when the beat landed
//! (the beat's own check, R4). One group is in 3 to 5 at a time, and each is answered
//! with the outcome of its own beat. A fenced owner answers nothing but refusals: a
//! group committed before the fence was seen is refused by its beat (which fails
//! `FENCED`, or finds the run fenced), one gathered after it by the store's gate.
//!
//! A crash between 3 and 5 leaves commits in the store that nobody was told about (as a
//! lost answer always can); the floor a replacer records is the previous one, which those
//! commits are above, so nothing acknowledged is ever below the floor. A crash after 4
//! leaves a floor that covers every answered commit: a store rewound below it is refused
//! (`STORE_BEHIND_SEAL`) by the next open. If the beat of step 4 fails, the commits are
//! in the store but not known to be under the floor: with an etcd authority the requests
//! are answered `OUTCOME_UNKNOWN` (71: in the store, `runlease store log` shows them; not
//! to be committed again blindly), on the run folder `IO_ERROR` naming the commits; a
//! `FENCED` beat fences the run and answers `FENCED`.

use super::{Run, Shared};
use crate::authority::LeaseAuthority;
use crate::error::RunError;
use crate::store_socket::{MAX_HELLO, stranger_refusal};
use lease_core::ops::OwnedLease;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc};

mod commit;
mod connection;
mod state;

use commit::*;
use connection::*;
use state::*;
pub use state::{Limits, REQUEST_BYTES};

/// Bind the socket (an abstract name with 128 random bits) and start serving on a thread
/// of its own; returns the guard task on the caller's runtime (aborting it stops the
/// server: the listener and every connection are closed).
pub(super) fn start(
    auth: Arc<dyn LeaseAuthority>,
    shared: Arc<Shared>,
    lease: OwnedLease,
    path: &std::path::Path,
) -> Result<tokio::task::JoinHandle<()>, RunError> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::fs::MetadataExt;
    let run = shared.run.clone();
    let io =
        |what: &str, e: std::io::Error| RunError::os(format!("run {run}: store socket: {what}"), e);
    let root = std::fs::metadata(path)
        .map(|m| (m.dev(), m.ino()))
        .map_err(|e| io("the run folder", e))?;
    let name = format!("runlease-store-{}", crate::clock::random_hex128()?);
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| io("its name", e))?;
    let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| io(&format!("cannot listen on @{name}"), e))?;
    let limits = Limits::now();
    // Two threads, each with a current-thread runtime: the doorway (accept, handshakes,
    // refusals: what a flood costs) and the authenticated requests with the committer (so
    // a flood delays a command's handshake at most, never its requests).
    let runtime = |thread: &str| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(8)
            .thread_name(thread)
            .build()
            .map_err(|e| io("its runtime", e))
    };
    let (door, served) = (
        runtime("lease-run-store-io")?,
        runtime("lease-run-store-io")?,
    );
    let listener = {
        let _in = door.enter();
        UnixListener::from_std(std_listener).map_err(|e| io("its listener", e))?
    };
    // Dropped by the guard task: both threads see their receiver end, and stop.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(());
    let (tx, rx) = mpsc::channel(limits.authenticated);
    let ctx = Arc::new(Ctx {
        shared: shared.clone(),
        name: name.clone(),
        root,
        limits,
        pending: Mutex::new(Pending::default()),
        freed: tokio::sync::Notify::new(),
        authenticated: Arc::new(Semaphore::new(limits.authenticated)),
        request_bytes: Arc::new(Semaphore::new(REQUEST_BYTES / MEM_UNIT)),
        tx,
        served: served.handle().clone(),
    });
    let mut stop = stop_rx.clone();
    let sh = ctx.shared.clone();
    std::thread::Builder::new()
        .name("lease-run-store-served".into())
        .spawn(move || {
            served.block_on(async move {
                let committer = tokio::spawn(committer(rx, auth, sh, lease));
                let _ = stop.changed().await;
                committer.abort();
            });
            served.shutdown_timeout(Duration::from_secs(5));
        })
        .map_err(|e| io("cannot start its thread", e))?;
    let mut stop = stop_rx;
    std::thread::Builder::new()
        .name("lease-run-store".into())
        .spawn(move || {
            door.block_on(async move {
                tokio::select! {
                    () = serve(listener, ctx) => {}
                    _ = stop.changed() => {}
                }
            });
            door.shutdown_timeout(Duration::from_secs(5));
        })
        .map_err(|e| io("cannot start its thread", e))?;
    let _ = shared.store_socket.set(format!("@{name}"));
    Ok(tokio::spawn(async move {
        // Held until this task is aborted (or its runtime ends): then the server stops.
        let _stop = stop_tx;
        std::future::pending::<()>().await;
    }))
}

async fn serve(listener: UnixListener, ctx: Arc<Ctx>) {
    let me = rustix::process::geteuid().as_raw();
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and the like: the limits keep this rare; wait instead of spinning.
                tracing::warn!(run = %ctx.shared.run, error = %e, "store socket accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // One connection at a time, then everyone else's turn: a burst of connections
        // does not queue ahead of the handshakes already under way.
        tokio::task::yield_now().await;
        match stream.peer_cred().map(|c| (c.uid(), c.pid())) {
            Ok((uid, pid)) if uid == me || uid == 0 => {
                if let Some(refusal) = oversized_at_once(&stream) {
                    // Garbage already there: refused without a task or a slot.
                    let _ = stream.try_write(&refusal);
                    continue;
                }
                make_room(&ctx).await;
                admit(&ctx, stream, pid);
            }
            // Another user's process: closed as it is accepted, without a word (it cannot
            // have been given the secret by us; it learns nothing, not even whose socket
            // this is; a runlease client refuses another user's socket before writing).
            _ => drop(stream),
        }
    }
}

/// The refusal frame for a connection whose first frame is already there and announces
/// more than [`MAX_HELLO`] bytes (what an HTTP request or random bytes look like).
fn oversized_at_once(stream: &UnixStream) -> Option<Vec<u8>> {
    use rustix::net::{RecvFlags, recv};
    let mut len = [0u8; 4];
    let (_, n) = recv(stream, &mut len[..], RecvFlags::PEEK | RecvFlags::DONTWAIT).ok()?;
    let announced = u32::from_be_bytes(len) as usize;
    if n < 4 || announced <= MAX_HELLO {
        return None;
    }
    let refusal = stranger_refusal(&format!(
        "a frame of {announced} bytes before authentication (at most {MAX_HELLO})"
    ));
    let mut frame = Vec::new();
    crate::store_socket::write_frame(&mut frame, &serde_json::to_vec(&refusal).ok()?).ok()?;
    Some(frame)
}

/// Make room for one more connection in the unauthenticated slots: when they are all
/// taken, let the connection tasks read what already arrived (a command's hello is there
/// as soon as it connected), then evict one that has not sent a whole hello ([`victim`]);
/// if every one has, wait until one finishes its handshake or its deadline.
async fn make_room(ctx: &Arc<Ctx>) {
    loop {
        if ctx.pending().slots.len() < ctx.limits.unauthenticated {
            return;
        }
        tokio::task::yield_now().await;
        {
            let mut p = ctx.pending();
            if p.slots.len() < ctx.limits.unauthenticated {
                return;
            }
            if let Some(i) = victim(&p.slots)
                && let Some(v) = p.slots.remove(i)
            {
                v.task.abort();
                return;
            }
        }
        tokio::select! {
            () = ctx.freed.notified() => {}
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
}

/// The slot to evict: the oldest that has not sent a whole hello, of the process that
/// holds the most slots (a flood comes from few processes, a command is one connection of
/// its own); `None` when every one has spoken.
fn victim(slots: &VecDeque<Slot>) -> Option<usize> {
    let silent = |s: &Slot| !s.spoke.load(Ordering::Relaxed);
    let held = |pid: Option<i32>| slots.iter().filter(|s| s.pid == pid).count();
    // The first of the greediest: `max_by_key` keeps the last maximum, so go backwards.
    let greediest = slots
        .iter()
        .rev()
        .filter(|s| silent(s))
        .map(|s| (held(s.pid), s.pid))
        .max_by_key(|(n, _)| *n)?
        .1;
    slots.iter().position(|s| s.pid == greediest && silent(s))
}

/// Give a new connection an unauthenticated slot (room was made).
fn admit(ctx: &Arc<Ctx>, stream: UnixStream, pid: Option<i32>) {
    let spoke = Arc::new(AtomicBool::new(false));
    let id = {
        let mut p = ctx.pending();
        p.next += 1;
        p.next
    };
    // A current-thread runtime: the task cannot run (and remove its slot) before the slot
    // is recorded below.
    let task = tokio::spawn(connection(stream, ctx.clone(), id, spoke.clone()));
    ctx.pending().slots.push_back(Slot {
        id,
        pid,
        spoke,
        task: task.abort_handle(),
    });
}

impl Run {
    /// The name of the store socket this run serves (`@runlease-store-…`), if it does
    /// ([`crate::OpenOptions::serve_store`]).
    pub fn store_socket(&self) -> Option<&str> {
        self.shared.store_socket.get().map(String::as_str)
    }

    /// Resolves when a command asked over the store socket for the run to be released
    /// (`runlease release` inside a command). The request is only a request: the owner
    /// decides (`runlease run` releases with `Run::release_detached`).
    pub async fn release_requested(&self) {
        self.shared.release_request.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limits_leave_descriptors_for_everything_else() {
        let l = |authenticated, unauthenticated| Limits {
            authenticated,
            unauthenticated,
        };
        assert_eq!(Limits::of(1024, 20), l(219, 16));
        assert_eq!(Limits::of(200, 10), l(15, 3));
        assert_eq!(
            Limits::of(100, 50),
            l(1, 1),
            "a tiny limit still serves one"
        );
        assert_eq!(Limits::of(1 << 20, 20), l(256, 16));
        for soft in [256u64, 1024, 4096, 65_536] {
            let x = Limits::of(soft, 30);
            let used = (x.authenticated + x.unauthenticated) as u64;
            assert!(used + 30 + FD_RESERVE <= soft, "{soft}: {x:?}");
        }
    }
}
