//! The owner's side of the store socket ([`crate::store_socket`]): the listener, one task
//! per connection, and the committer that makes group commits.
//!
//! ## A commit, in order
//!
//! 1. The connection task checks the request (secret, generation, live owner) and queues
//!    its batch for the committer.
//! 2. The committer takes every batch queued so far (at most [`MAX_GROUP`]) and commits
//!    them in one store transaction (`RunStore::commit_group`: one fencing check, one WAL
//!    fsync, one sequence each); the slot's head is raised to the last sequence.
//! 3. It writes one **durable** heartbeat (fsynced whatever the policy) carrying that
//!    head, under the beat lock the heartbeat task also takes.
//! 4. Only then are the requests answered, each with its sequence.
//!
//! A crash between 2 and 4 leaves commits in the store that nobody was told about (as a
//! lost answer always can); the floor a replacer records is the previous one, which those
//! commits are above, so nothing acknowledged is ever below the floor. A crash after 3
//! leaves a floor that covers every answered commit: a store rewound below it is refused
//! (`STORE_BEHIND_SEAL`) by the next open. If the beat of step 3 fails, the commits are
//! in the store but the requests are answered with the beat's error (their outcome is
//! unknown to the client, as with any failed acknowledgement); a `FENCED` beat fences the
//! run.

use super::heartbeat::beat;
use super::{Run, RunStore, Shared};
use crate::authority::LeaseAuthority;
use crate::error::RunError;
use crate::store_socket::{Answer, MAX_FRAME, Op, Request, VERSION, WireCommit, WireDoc, batch_of};
use lease_core::Code;
use lease_core::CommandRecord;
use lease_core::ops::OwnedLease;
use lease_sqlite::Batch;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;

/// The most batches one group commit takes.
pub const MAX_GROUP: usize = 256;

type Reply = oneshot::Sender<Answer>;

/// What a request's secret is checked against: the digest of this incarnation's secret.
struct Check {
    run_id: lease_core::RunId,
    digest: lease_core::Digest,
}

/// Bind the socket (an abstract name with 128 random bits) and start serving; returns the
/// serving task (aborting it closes the listener and every connection).
pub(super) fn start(
    auth: Arc<dyn LeaseAuthority>,
    shared: Arc<Shared>,
    lease: OwnedLease,
) -> Result<tokio::task::JoinHandle<()>, RunError> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!(
        "runlease-store-{:016x}{:016x}",
        super::open::random_u64()?,
        super::open::random_u64()?
    );
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| RunError::Io(format!("run {}: store socket name: {e}", shared.run)))?;
    let std_listener = std::os::unix::net::UnixListener::bind_addr(&addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| {
            RunError::Io(format!(
                "run {}: cannot listen on the store socket @{name}: {e}",
                shared.run
            ))
        })?;
    let listener = UnixListener::from_std(std_listener)
        .map_err(|e| RunError::Io(format!("run {}: store socket: {e}", shared.run)))?;
    let _ = shared.store_socket.set(format!("@{name}"));
    Ok(tokio::spawn(serve(listener, auth, shared, lease)))
}

async fn serve(
    listener: UnixListener,
    auth: Arc<dyn LeaseAuthority>,
    shared: Arc<Shared>,
    lease: OwnedLease,
) {
    let (tx, rx) = mpsc::unbounded_channel::<(Batch, Reply)>();
    // Every task lives in this set: aborting `serve` drops it, which aborts them all.
    let mut tasks = JoinSet::new();
    let check = Arc::new(Check {
        digest: CommandRecord::incarnation_digest(
            &lease.run_id,
            shared.generation,
            &shared.incarnation,
        ),
        run_id: lease.run_id.clone(),
    });
    tasks.spawn(committer(rx, auth, shared.clone(), lease));
    let me = rustix::process::geteuid().as_raw();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    // Another user's process is not answered at all (it cannot have been
                    // given the secret by us; refusing here costs it nothing to learn).
                    let uid = stream.peer_cred().map(|c| c.uid());
                    match uid {
                        Ok(uid) if uid == me || uid == 0 => {
                            tasks.spawn(connection(stream, shared.clone(), check.clone(), tx.clone()));
                        }
                        _ => {
                            let a = Answer::refused(
                                Code::StoreRequestRefused,
                                format!("run {}: the store socket answers only its owner's user (uid {me})", shared.run),
                            );
                            tasks.spawn(async move {
                                let mut s = stream;
                                let _ = send(&mut s, &a).await;
                            });
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(run = %shared.run, error = %e, "store socket accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = tasks.join_next() => {}
        }
    }
}

async fn send(s: &mut UnixStream, a: &Answer) -> std::io::Result<()> {
    let body = serde_json::to_vec(a).map_err(std::io::Error::other)?;
    // The frame as the client reads it (one definition of the format), then sent whole.
    let mut buf = Vec::with_capacity(4 + body.len());
    crate::store_socket::write_frame(&mut buf, &body)?;
    s.write_all(&buf).await
}

/// Serve one connection: requests in order until the peer closes it (or sends a frame
/// that is too long, which ends the connection after a refusal).
async fn connection(
    mut s: UnixStream,
    shared: Arc<Shared>,
    check: Arc<Check>,
    tx: mpsc::UnboundedSender<(Batch, Reply)>,
) {
    loop {
        let mut len = [0u8; 4];
        if s.read_exact(&mut len).await.is_err() {
            return;
        }
        let n = u32::from_be_bytes(len) as usize;
        if n > MAX_FRAME {
            let a = Answer::refused(
                Code::ArgumentInvalid,
                format!(
                    "run {}: a request of {n} bytes (at most {MAX_FRAME})",
                    shared.run
                ),
            );
            let _ = send(&mut s, &a).await;
            return;
        }
        let mut body = vec![0u8; n];
        if s.read_exact(&mut body).await.is_err() {
            return;
        }
        let answer = match serde_json::from_slice::<Request>(&body) {
            Err(e) => Answer::refused(
                Code::ArgumentInvalid,
                format!("run {}: not a store request: {e}", shared.run),
            ),
            Ok(req) => handle(req, &shared, &check, &tx).await,
        };
        if send(&mut s, &answer).await.is_err() {
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

/// Check a request, then carry it out.
async fn handle(
    req: Request,
    shared: &Arc<Shared>,
    check: &Check,
    tx: &mpsc::UnboundedSender<(Batch, Reply)>,
) -> Answer {
    let run = &shared.run;
    if req.v != VERSION {
        return Answer::refused(
            Code::ArgumentInvalid,
            format!(
                "run {run}: store protocol version {} (this owner speaks {VERSION})",
                req.v
            ),
        );
    }
    // The secret first: nothing about the store is said to a stranger.
    if CommandRecord::incarnation_digest(&check.run_id, shared.generation, &req.secret)
        != check.digest
    {
        return Answer::refused(
            Code::StoreRequestRefused,
            format!(
                "run {run}: the request's incarnation secret is not this owner's: only the commands of generation {} may use its store",
                shared.generation
            ),
        );
    }
    if req.generation != shared.generation.get() {
        return Answer::refused(
            Code::Fenced,
            format!(
                "run {run}: the request is stamped generation {}, but this owner is generation {}",
                req.generation, shared.generation
            ),
        );
    }
    if let Err(e) = shared.check_live() {
        return refusal(&e);
    }
    let store = RunStore {
        shared: shared.clone(),
    };
    match req.op {
        Op::Commit { writes, log } => {
            let batch = match batch_of(&writes, &log) {
                Ok(b) => b,
                Err(e) => {
                    return Answer::refused(Code::ArgumentInvalid, format!("run {run}: {e}"));
                }
            };
            let (reply, answer) = oneshot::channel();
            if tx.send((batch, reply)).is_err() {
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

fn read_op(store: &RunStore, op: Op) -> Result<Answer, RunError> {
    let mut a = Answer {
        ok: true,
        ..Answer::default()
    };
    match op {
        Op::Get { key } => a.doc = store.get(&key)?.as_ref().map(WireDoc::of),
        Op::List { prefix } => {
            a.docs = Some(
                store
                    .scan_prefix(&prefix)?
                    .iter()
                    .map(WireDoc::of)
                    .collect(),
            );
        }
        Op::Log { since, max } => {
            let max = max.map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX));
            a.commits = Some(
                store
                    .commits_page(since, max)?
                    .iter()
                    .map(WireCommit::of)
                    .collect(),
            );
        }
        Op::Head => a.head = Some(store.head()?),
        Op::Commit { .. } | Op::Release => {
            return Err(RunError::InvalidArgument("not a read".into()));
        }
    }
    Ok(a)
}

/// The committer: group commits (see the module docs).
async fn committer(
    mut rx: mpsc::UnboundedReceiver<(Batch, Reply)>,
    auth: Arc<dyn LeaseAuthority>,
    shared: Arc<Shared>,
    lease: OwnedLease,
) {
    let store = RunStore {
        shared: shared.clone(),
    };
    while let Some(first) = rx.recv().await {
        let mut group = vec![first];
        while group.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(r) => group.push(r),
                Err(_) => break,
            }
        }
        let (batches, replies): (Vec<Batch>, Vec<Reply>) = group.into_iter().unzip();
        let s = store.clone();
        let committed = tokio::task::spawn_blocking(move || s.commit_group(&batches))
            .await
            .unwrap_or_else(|e| Err(RunError::Io(format!("commit task failed: {e}"))));
        let answers: Vec<Answer> = match committed {
            Err(e) => vec![refusal(&e); replies.len()],
            Ok(seqs) => match beat(&auth, &shared, &lease, true).await {
                Ok(()) => seqs
                    .iter()
                    .map(|seq| Answer {
                        ok: true,
                        seq: Some(*seq),
                        generation: Some(shared.generation.get()),
                        ..Answer::default()
                    })
                    .collect(),
                Err(e) => {
                    let e = RunError::Io(format!(
                        "run {}: commits {}..={} are in the store but the heartbeat that makes them part of the floor failed ({}); they are not acknowledged",
                        shared.run,
                        seqs.first().copied().unwrap_or(0),
                        seqs.last().copied().unwrap_or(0),
                        e.code().prefixed(&e)
                    ));
                    let e = if shared.is_fenced() {
                        shared.check_live().err().unwrap_or(e)
                    } else {
                        e
                    };
                    vec![refusal(&e); replies.len()]
                }
            },
        };
        for (reply, a) in replies.into_iter().zip(answers) {
            let _ = reply.send(a);
        }
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
