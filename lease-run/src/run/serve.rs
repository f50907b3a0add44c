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

use super::heartbeat::beat;
use super::{Run, RunStore, Shared};
use crate::authority::LeaseAuthority;
use crate::error::RunError;
use crate::store_socket::{
    Answer, HANDSHAKE_DEADLINE, Hello, IDLE_TIMEOUT, MAX_ANSWER, MAX_FRAME, MAX_HELLO, Op, Proof,
    READ_TIMEOUT, Side, UNAUTHENTICATED_SLOTS, VERSION, WireCommit, WireDoc, batch_of, hex, nonce,
    nonce_of, prove, stranger_refusal, transcript, unhex, verify,
};
use lease_core::Code;
use lease_core::ops::OwnedLease;
use lease_sqlite::Batch;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio::time::timeout;

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
const MEM_UNIT: usize = 4096;

/// The most commits one `log` page reads from the store.
const LOG_PAGE: usize = 1024;

/// The most documents one `list` page reads from the store.
const LIST_PAGE: usize = 10_000;

/// What one page of `list` or `log` may hold, in bytes of JSON (the first entry is always
/// included: a document or commit as large as a request fits in [`MAX_ANSWER`]).
const PAGE_BYTES: usize = MAX_FRAME;

type Reply = oneshot::Sender<Answer>;

/// A commit queued for the committer.
struct Request {
    /// The connection it came on (its slot id: unique in this server).
    from: u64,
    batch: Batch,
    reply: Reply,
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
    fn now() -> Limits {
        let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile)
            .current
            .unwrap_or(1 << 20);
        let open = std::fs::read_dir("/proc/self/fd").map_or(64, |d| d.count() as u64);
        Limits::of(soft, open)
    }
}

/// A connection still in its handshake, evictable.
struct Slot {
    id: u64,
    /// The connecting process (`SO_PEERCRED`), to evict from whoever holds the most.
    pid: Option<i32>,
    /// It has sent its whole hello (a silent one is evicted first).
    spoke: Arc<AtomicBool>,
    task: AbortHandle,
}

#[derive(Default)]
struct Pending {
    next: u64,
    slots: VecDeque<Slot>,
}

/// What every connection task shares.
struct Ctx {
    shared: Arc<Shared>,
    /// The abstract name (no `@`), bound into every proof.
    name: String,
    /// The run folder's `(st_dev, st_ino)`, said in the welcome.
    root: (u64, u64),
    limits: Limits,
    pending: Mutex<Pending>,
    /// An unauthenticated slot was freed.
    freed: tokio::sync::Notify,
    authenticated: Arc<Semaphore>,
    request_bytes: Arc<Semaphore>,
    tx: mpsc::Sender<Request>,
    /// The runtime of the authenticated connections and the committer.
    served: tokio::runtime::Handle,
}

impl Ctx {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Removes its connection from the unauthenticated slots when dropped (handshake done,
/// failed, or the task aborted).
struct Unslot {
    ctx: Arc<Ctx>,
    id: u64,
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
    let io = |what: &str, e: &dyn std::fmt::Display| {
        RunError::Io(format!("run {run}: store socket: {what}: {e}"))
    };
    let root = std::fs::metadata(path)
        .map(|m| (m.dev(), m.ino()))
        .map_err(|e| io("the run folder", &e))?;
    let name = format!("runlease-store-{}", crate::clock::random_hex128()?);
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| io("its name", &e))?;
    let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| io(&format!("cannot listen on @{name}"), &e))?;
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
            .map_err(|e| io("its runtime", &e))
    };
    let (door, served) = (
        runtime("lease-run-store-io")?,
        runtime("lease-run-store-io")?,
    );
    let listener = {
        let _in = door.enter();
        UnixListener::from_std(std_listener).map_err(|e| io("its listener", &e))?
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
        .map_err(|e| io("cannot start its thread", &e))?;
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
        .map_err(|e| io("cannot start its thread", &e))?;
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

/// Send a small frame without waiting (a refusal to a peer that may not read).
fn try_send(s: &UnixStream, a: &Answer) {
    let mut buf = Vec::new();
    if let Ok(body) = serde_json::to_vec(a)
        && crate::store_socket::write_frame(&mut buf, &body).is_ok()
    {
        let _ = s.try_write(&buf);
    }
}

async fn send(s: &mut UnixStream, a: &Answer) -> std::io::Result<()> {
    let mut body = serde_json::to_vec(a).map_err(std::io::Error::other)?;
    if body.len() > MAX_ANSWER {
        // One document or commit larger than a request can carry (written by the owner's
        // library API): said, not sent cut.
        let r = Answer::refused(
            Code::ArgumentInvalid,
            format!(
                "the answer of {} bytes is over the store socket's limit of {MAX_ANSWER} (one document or commit larger than a request can carry); read it with the run's library API or once the run is released",
                body.len()
            ),
        );
        body = serde_json::to_vec(&r).map_err(std::io::Error::other)?;
    }
    // The frame as the client reads it (one definition of the format), then sent whole.
    let mut buf = Vec::with_capacity(4 + body.len());
    crate::store_socket::write_frame(&mut buf, &body)?;
    s.write_all(&buf).await
}

/// Read one pre-authentication frame into `buf`; a longer one than [`MAX_HELLO`] is
/// refused unread. `Err(None)`: the peer closed or failed (nothing to say).
async fn read_small<'a>(
    s: &mut UnixStream,
    buf: &'a mut [u8; MAX_HELLO],
) -> Result<&'a [u8], Option<Answer>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.map_err(|_| None)?;
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_HELLO {
        return Err(Some(stranger_refusal(&format!(
            "a frame of {n} bytes before authentication (at most {MAX_HELLO})"
        ))));
    }
    let body = &mut buf[..n];
    s.read_exact(body).await.map_err(|_| None)?;
    Ok(body)
}

/// The handshake, owner's side (module docs of [`crate::store_socket`]); returns the
/// generation the authenticated client claims.
async fn handshake(
    s: &mut UnixStream,
    ctx: &Ctx,
    spoke: &AtomicBool,
) -> Result<u64, Option<Answer>> {
    let not_hello = || Some(stranger_refusal("not a store hello"));
    let mut buf = [0u8; MAX_HELLO];
    /// The version alone, to say so when it is another protocol's first frame.
    #[derive(serde::Deserialize)]
    struct Versioned {
        v: u32,
    }
    let hello: Hello = {
        let frame = read_small(s, &mut buf).await?;
        match serde_json::from_slice::<Versioned>(frame) {
            Ok(Versioned { v }) if v != VERSION => {
                return Err(Some(stranger_refusal(&format!(
                    "store protocol version {v} is not spoken here (version {VERSION})"
                ))));
            }
            _ => serde_json::from_slice(frame).map_err(|_| not_hello())?,
        }
    };
    let cn = nonce_of(&hello.nonce).ok_or_else(not_hello)?;
    // A whole, well-formed hello: no longer evicted before the silent ones.
    spoke.store(true, Ordering::Relaxed);
    let sn = nonce().map_err(|_| None)?;
    let key = &ctx.shared.incarnation;
    let g = hello.generation;
    let challenge = crate::store_socket::Challenge {
        v: VERSION,
        nonce: hex(&sn),
        proof: hex(&prove(
            key,
            &transcript(Side::Server, &ctx.name, &cn, &sn, g),
        )),
    };
    let body = serde_json::to_vec(&challenge).map_err(|_| None)?;
    let mut frame = Vec::new();
    crate::store_socket::write_frame(&mut frame, &body).map_err(|_| None)?;
    s.write_all(&frame).await.map_err(|_| None)?;
    let refused = || Some(stranger_refusal("not authenticated"));
    let proof: Proof = {
        let frame = read_small(s, &mut buf).await?;
        serde_json::from_slice(frame).map_err(|_| refused())?
    };
    let t = transcript(Side::Client, &ctx.name, &cn, &sn, g);
    match unhex(&proof.proof) {
        Some(p) if verify(key, &t, &p) => Ok(g),
        _ => Err(refused()),
    }
}

/// Serve one connection: the handshake within [`HANDSHAKE_DEADLINE`], then requests in
/// order until the peer closes it, idles past [`IDLE_TIMEOUT`], or sends a frame that is
/// too long (refused, then closed).
async fn connection(mut s: UnixStream, ctx: Arc<Ctx>, id: u64, spoke: Arc<AtomicBool>) {
    let slot = Unslot {
        ctx: ctx.clone(),
        id,
    };
    let generation = match timeout(HANDSHAKE_DEADLINE, handshake(&mut s, &ctx, &spoke)).await {
        Ok(Ok(g)) => g,
        Ok(Err(refusal)) => {
            if let Some(r) = refusal {
                try_send(&s, &r);
            }
            return;
        }
        Err(_) => {
            try_send(
                &s,
                &stranger_refusal(&format!(
                    "the handshake did not finish within {} ms",
                    HANDSHAKE_DEADLINE.as_millis()
                )),
            );
            return;
        }
    };
    drop(slot);
    let shared = &ctx.shared;
    let run = &shared.run;
    let Ok(permit) = ctx.authenticated.clone().try_acquire_owned() else {
        try_send(
            &s,
            &Answer::refused(
                Code::StoreRequestRefused,
                format!(
                    "run {run}: the store socket already serves {} connections (its limit, from the descriptor limit): close one and try again; nothing was requested",
                    ctx.limits.authenticated
                ),
            ),
        );
        return;
    };
    // mutant socket_generation_stamp_ignored: an older generation's command is served (I3, §11.2).
    let welcome = if generation != shared.generation.get()
        && !lease_core::mutant::mutant("socket_generation_stamp_ignored")
    {
        Answer::refused(
            Code::Fenced,
            format!(
                "run {run}: the command is of generation {generation}, but this owner is generation {}",
                shared.generation
            ),
        )
    } else if let Err(e) = shared.check_live() {
        refusal(&e)
    } else {
        Answer {
            ok: true,
            run: Some(run.clone()),
            root: Some(ctx.root),
            generation: Some(shared.generation.get()),
            ..Answer::default()
        }
    };
    let welcomed = welcome.ok;
    if !matches!(
        timeout(READ_TIMEOUT, send(&mut s, &welcome)).await,
        Ok(Ok(()))
    ) || !welcomed
    {
        return;
    }
    // To the other runtime: its requests never wait behind the doorway's work.
    let Ok(std) = s.into_std() else {
        return;
    };
    let c = ctx.clone();
    ctx.served.spawn(async move {
        let _permit = permit;
        if let Ok(s) = UnixStream::from_std(std) {
            requests(s, &c, id).await;
        }
    });
}

/// The requests of an authenticated connection.
async fn requests(s: UnixStream, ctx: &Arc<Ctx>, from: u64) {
    let run = &ctx.shared.run;
    let mut s = tokio::io::BufReader::with_capacity(READ_AHEAD, s);
    loop {
        let mut len = [0u8; 4];
        if !matches!(
            timeout(IDLE_TIMEOUT, s.read_exact(&mut len)).await,
            Ok(Ok(_))
        ) {
            return;
        }
        let n = u32::from_be_bytes(len) as usize;
        if n > MAX_FRAME {
            let a = Answer::refused(
                Code::ArgumentInvalid,
                format!("run {run}: a request of {n} bytes (at most {MAX_FRAME})"),
            );
            let _ = timeout(READ_TIMEOUT, send(s.get_mut(), &a)).await;
            return;
        }
        let units = u32::try_from(n.div_ceil(MEM_UNIT).max(1)).unwrap_or(u32::MAX);
        let Ok(_bytes) = ctx.request_bytes.clone().acquire_many_owned(units).await else {
            return;
        };
        let mut body = vec![0u8; n];
        if !matches!(
            timeout(READ_TIMEOUT, s.read_exact(&mut body)).await,
            Ok(Ok(_))
        ) {
            return;
        }
        let answer = match serde_json::from_slice::<Op>(&body) {
            Err(e) => Answer::refused(
                Code::ArgumentInvalid,
                format!("run {run}: not a store request: {e}"),
            ),
            Ok(op) => {
                drop(body);
                handle(op, ctx, from).await
            }
        };
        if !matches!(
            timeout(READ_TIMEOUT, send(s.get_mut(), &answer)).await,
            Ok(Ok(()))
        ) {
            return;
        }
    }
}

/// The answer to a failed request. A released owner's refusal (`RUN_RELEASED`, which the
/// library reports for a handle used after its release) is `FENCED` to a command: its
/// owner's generation no longer counts, exactly as after a takeover.
fn refusal(e: &RunError) -> Answer {
    match e {
        RunError::Released { run } => Answer::refused(
            Code::Fenced,
            format!("run {run}: this owner released the run; its generation no longer writes"),
        ),
        e => Answer::of_error(e),
    }
}

/// Carry out an authenticated request.
async fn handle(op: Op, ctx: &Arc<Ctx>, from: u64) -> Answer {
    let shared = &ctx.shared;
    let run = &shared.run;
    if let Err(e) = shared.check_live() {
        return refusal(&e);
    }
    let store = RunStore {
        shared: shared.clone(),
    };
    match op {
        Op::Commit { writes, log } => {
            let batch = match batch_of(&writes, &log) {
                Ok(b) => b,
                Err(e) => {
                    return Answer::refused(Code::ArgumentInvalid, format!("run {run}: {e}"));
                }
            };
            drop((writes, log));
            let (reply, answer) = oneshot::channel();
            let request = Request { from, batch, reply };
            if ctx.tx.send(request).await.is_err() {
                return refusal(&RunError::Released { run: run.clone() });
            }
            answer
                .await
                .unwrap_or_else(|_| refusal(&RunError::Released { run: run.clone() }))
        }
        Op::Release => {
            shared.release_request.notify_one();
            Answer {
                ok: true,
                accepted: Some(true),
                ..Answer::default()
            }
        }
        read => {
            let r = tokio::task::spawn_blocking(move || read_op(&store, read)).await;
            match r {
                Ok(Ok(a)) => a,
                Ok(Err(e)) => refusal(&e),
                Err(e) => refusal(&RunError::Io(format!("run {run}: read task: {e}"))),
            }
        }
    }
}

/// Counts the bytes written to it.
struct Count(usize);

impl std::io::Write for Count {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len();
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The length of `v` as JSON, plus its separator.
fn encoded_len<T: serde::Serialize>(v: &T) -> usize {
    let mut c = Count(1);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// Take entries while the page stays under [`PAGE_BYTES`] (the first always) and under
/// `limit`; whether some were left.
fn page<T: serde::Serialize>(items: impl Iterator<Item = T>, limit: usize) -> (Vec<T>, bool) {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for item in items {
        let n = encoded_len(&item);
        if out.len() >= limit || (!out.is_empty() && bytes + n > PAGE_BYTES) {
            return (out, true);
        }
        bytes += n;
        out.push(item);
    }
    (out, false)
}

fn read_op(store: &RunStore, op: Op) -> Result<Answer, RunError> {
    let mut a = Answer {
        ok: true,
        ..Answer::default()
    };
    let count = |n: Option<u64>| n.map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX));
    match op {
        Op::Get { key } => a.doc = store.get(&key)?.as_ref().map(WireDoc::of),
        Op::List {
            prefix,
            after,
            limit,
        } => {
            // The store reads one page row by row (values count once; as hex they count
            // twice), then the page is cut again by its size as JSON.
            let rows = count(limit).min(LIST_PAGE);
            let (docs, next) =
                store.scan_prefix_page(&prefix, after.as_deref(), rows, PAGE_BYTES / 2)?;
            let (docs, cut) = page(docs.iter().map(WireDoc::of), rows);
            a.more = Some(cut || next.is_some());
            a.docs = Some(docs);
        }
        Op::Log { since, max } => {
            let want = count(max).min(LOG_PAGE);
            let commits = store.commits_page_bytes(since, want, PAGE_BYTES / 2)?;
            let (commits, _) = page(commits.iter().map(WireCommit::of), want);
            // The store cannot say whether it stopped for bytes or at the end: a page with
            // commits says more may follow (until the caller's `max`); an empty one ends.
            a.more = Some(!commits.is_empty() && commits.len() < count(max));
            a.commits = Some(commits);
        }
        Op::Head => a.head = Some(store.head()?),
        Op::Commit { .. } | Op::Release => {
            return Err(RunError::InvalidArgument("not a read".into()));
        }
    }
    Ok(a)
}

/// The longest a group waits for more commits (see [`Gatherer`]).
pub const GATHER_MAX: Duration = Duration::from_millis(1);

/// The committer: group commits, one group at a time (see the module docs).
async fn committer(
    mut rx: mpsc::Receiver<Request>,
    auth: Arc<dyn LeaseAuthority>,
    shared: Arc<Shared>,
    lease: OwnedLease,
) {
    let store = RunStore {
        shared: shared.clone(),
    };
    let mut gatherer = Gatherer::default();
    while let Some(first) = rx.recv().await {
        // Step 2 (module docs): what is queued, then the regulars missing from it.
        let mut group = vec![first];
        take_queued(&mut rx, &mut group);
        gatherer.gather(&mut rx, &mut group).await;
        let started = Instant::now();
        let (batches, replies): (Vec<Batch>, Vec<Reply>) =
            group.into_iter().map(|r| (r.batch, r.reply)).unzip();
        // Step 3: one store transaction (the fencing check, one WAL fsync); once it
        // returned the group is durable in the store and the slot's head is at or above
        // its last sequence.
        let s = store.clone();
        let committed = tokio::task::spawn_blocking(move || s.commit_group(&batches))
            .await
            .unwrap_or_else(|e| Err(RunError::Io(format!("commit task failed: {e}"))));
        // With the store in the engine (issue #32) a commit is acknowledged once the
        // engine created its record: no floor to cover, no beat.
        let in_engine = shared.engine.get().is_some();
        match committed {
            Err(e) => answer(replies, std::iter::repeat(refusal(&e))),
            Ok(seqs) if in_engine => answer(replies, seqs.iter().map(|s| ok(&shared, *s))),
            // Step 4: one durable heartbeat, begun after step 3 returned, so the head it
            // reads under the beat lock covers the whole group. Step 5: the answers, only
            // once it is fsynced, with the outcome of this group's own beat.
            Ok(seqs) => match beat(&auth, &shared, &lease, true).await {
                Ok(()) => answer(replies, seqs.iter().map(|s| ok(&shared, *s))),
                Err(e) => {
                    let refused = not_covered(&auth, &shared, &seqs, &e);
                    answer(replies, std::iter::repeat(refused));
                }
            },
        }
        gatherer.last = started.elapsed();
    }
}

/// Move what is already queued into `group` (up to [`MAX_GROUP`]).
fn take_queued(rx: &mut mpsc::Receiver<Request>, group: &mut Vec<Request>) {
    while group.len() < MAX_GROUP {
        match rx.try_recv() {
            Ok(r) => group.push(r),
            Err(_) => break,
        }
    }
}

/// The gathering window of group commit (issue #33). A group takes what is queued, then
/// waits only for the **regulars** missing from it: the connections that were in one of
/// the two groups before (a command that commits back to back is answered, and sends its
/// next commit while this group forms), unless the group before was formed so long ago
/// that they had time to come and did not. It waits at most as long as the last group's
/// store commit and covering beat took, and never more than [`GATHER_MAX`]; it stops as
/// soon as every regular is in. So a lone command never waits (the only regular is its
/// own connection, already in the group), and neither does a group when nobody else
/// committed lately; a command left alone right after others stopped waits for them at
/// most twice (they stop being regulars after two groups without them). Without the
/// wait, K commands fall into cohorts that alternate, and groups stay near K/2 (issue #20's
/// figures): each cohort's answers go out just as the other's group starts.
#[derive(Default)]
struct Gatherer {
    /// Each regular connection and the number of the last group it was in.
    regulars: HashMap<u64, u64>,
    /// The number of the group being formed.
    group: u64,
    /// When the group before was formed.
    formed: Option<Instant>,
    /// How long the group before took to commit and cover (a window of zero before the
    /// first).
    last: Duration,
}

impl Gatherer {
    /// Add the regulars missing from `group` as they arrive, within the window.
    async fn gather(&mut self, rx: &mut mpsc::Receiver<Request>, group: &mut Vec<Request>) {
        let (n, now) = (self.group, Instant::now());
        self.group += 1;
        let window = self.last.min(GATHER_MAX);
        if self
            .formed
            .is_some_and(|t| now - t > self.last + GATHER_MAX)
        {
            // The regulars had time to come back and did not: wait for nobody.
            self.regulars.clear();
        } else {
            self.regulars.retain(|_, last| *last + 2 >= n);
        }
        self.note(n, group);
        // A connection has at most one commit queued, so the regulars count the commits
        // this group can expect.
        let expected = self.regulars.len().min(MAX_GROUP);
        if group.len() < expected && !window.is_zero() {
            // tokio's timers tick in whole milliseconds: the window is a sleep on a
            // blocking thread (left to finish on its own if the regulars come first).
            let mut timer = tokio::task::spawn_blocking(move || std::thread::sleep(window));
            while group.len() < expected {
                tokio::select! {
                    biased;
                    r = rx.recv() => match r {
                        Some(r) => {
                            let from = group.len();
                            group.push(r);
                            take_queued(rx, group);
                            self.note(n, &group[from..]);
                        }
                        None => break,
                    },
                    _ = &mut timer => break,
                }
            }
        }
        self.formed = Some(Instant::now());
    }

    /// `requests` are in group `n`.
    fn note(&mut self, n: u64, requests: &[Request]) {
        for r in requests {
            self.regulars.insert(r.from, n);
        }
    }
}

/// Send each reply its answer, in order (`commit_group` gives one sequence per batch).
fn answer(replies: Vec<Reply>, answers: impl IntoIterator<Item = Answer>) {
    for (reply, a) in replies.into_iter().zip(answers) {
        let _ = reply.send(a);
    }
}

/// A commit's acknowledgement.
fn ok(shared: &Shared, seq: u64) -> Answer {
    Answer {
        ok: true,
        seq: Some(seq),
        generation: Some(shared.generation.get()),
        ..Answer::default()
    }
}

/// The answer to commits `seqs` that are in the store when the durable heartbeat that
/// was to cover them failed with `e`.
fn not_covered(
    auth: &Arc<dyn LeaseAuthority>,
    shared: &Shared,
    seqs: &[u64],
    e: &RunError,
) -> Answer {
    let (first, last) = (
        seqs.first().copied().unwrap_or(0),
        seqs.last().copied().unwrap_or(0),
    );
    if shared.is_fenced() {
        let io = RunError::Io(format!(
            "run {}: commits {first}..={last} are in the store but the heartbeat that makes them part of the floor failed ({}); they are not acknowledged",
            shared.run,
            e.code().prefixed(e)
        ));
        refusal(&shared.check_live().err().unwrap_or(io))
    } else if auth.folder().is_none() {
        // The etcd cluster did not take the beat (issue #31): the commits
        // are in the store, and whether the floor covers them is unknown
        // (a later beat of this owner covers them; a replacer records the
        // floor it last saw). Not a plain failure: a client retrying it
        // blindly would commit the batch twice.
        Answer::refused(
            Code::OutcomeUnknown,
            format!(
                "run {}: commits {first}..={last} are in the store (generation {}), but the durable heartbeat that puts them under the lease's floor did not succeed ({}), so whether a replacing owner's floor covers them is unknown; do not commit them again blindly: `runlease store log` shows them",
                shared.run,
                shared.generation,
                e.code().prefixed(e)
            ),
        )
    } else {
        refusal(&RunError::Io(format!(
            "run {}: commits {first}..={last} are in the store but the heartbeat that makes them part of the floor failed ({}); they are not acknowledged",
            shared.run,
            e.code().prefixed(e)
        )))
    }
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
