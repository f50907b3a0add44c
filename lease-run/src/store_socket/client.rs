//! The client a command uses ([`StoreClient`]): it finds the owner's socket, proves the
//! owner and itself, and sends requests, reconnecting once when an answer is lost.

use super::wire::*;
use crate::error::RunError;
use lease_core::Code;
use lease_sqlite::{Batch, Commit, Document};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The abstract name behind a [`SOCKET_VAR`] value (`@name`).
pub(super) fn abstract_name(announced: &str) -> Option<&str> {
    announced.strip_prefix('@').filter(|n| {
        n.starts_with("runlease-store-")
            && n.len() < 100
            && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    })
}

/// The run an owner said it serves, in its welcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedRun {
    /// The run folder, as the owner names it.
    pub run: String,
    /// The run folder's `(st_dev, st_ino)`.
    pub root: (u64, u64),
    /// The owner's generation.
    pub generation: u64,
}

/// A command's connection to its owner's store (see the module docs).
///
/// ```no_run
/// // Inside a command started by an owner that serves its store (`runlease run` does):
/// use lease_run::store_socket::StoreClient;
/// use lease_sqlite::Batch;
/// let mut store = StoreClient::from_env()?.expect("not started by a serving owner");
/// let seq = store.commit(&Batch::new().put("step/1", "done"))?;
/// assert_eq!(store.get("step/1")?.unwrap().updated_seq, seq);
/// # Ok::<(), lease_run::RunError>(())
/// ```
#[derive(Debug)]
pub struct StoreClient {
    run: String,
    socket: String,
    secret: String,
    generation: u64,
    served: ServedRun,
    /// The request timeout, in milliseconds (kept for a reconnection).
    timeout_ms: std::sync::atomic::AtomicU64,
    stream: UnixStream,
}

/// How long the client waits for each handshake frame.
pub(super) const CLIENT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// A stuck owner is a fenced one within its self-fence deadline; no request should wait
/// much longer than a deadline of minutes.
pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

impl StoreClient {
    /// Connect as the command this process is: `None` when [`SOCKET_VAR`] is not set (not
    /// started by an owner that serves its store); an error when the environment is
    /// incomplete, the owner cannot be reached (the owner of that generation is gone:
    /// `FENCED`), the socket cannot prove it is the owner (`STORE_REQUEST_REFUSED`), or the
    /// owner serves another folder than `RUNLEASE_RUN` names (`ARGUMENT_INVALID`: the
    /// environment mixes two runs; both are named, nothing is requested).
    pub fn from_env() -> Result<Option<StoreClient>, RunError> {
        StoreClient::from_env_within(CLIENT_HANDSHAKE_TIMEOUT)
    }

    /// [`StoreClient::from_env`], with the handshake bounded by `handshake` instead of the
    /// default 30 s (`runlease release --timeout`: a stopped owner cannot answer, and the
    /// caller's own deadline must hold from the first byte). Past it the error is an I/O
    /// error saying nothing was requested.
    pub fn from_env_within(handshake: Duration) -> Result<Option<StoreClient>, RunError> {
        let Some(socket) = std::env::var_os(SOCKET_VAR) else {
            return Ok(None);
        };
        let var = |name: &str| {
            std::env::var(name).map_err(|_| {
                RunError::InvalidArgument(format!(
                    "{SOCKET_VAR} is set but {name} is not (or is not UTF-8): not the environment runlease gives a command"
                ))
            })
        };
        let run = var("RUNLEASE_RUN")?;
        let generation = var("RUNLEASE_GENERATION")?
            .parse::<u64>()
            .map_err(|_| RunError::InvalidArgument("RUNLEASE_GENERATION is not a number".into()))?;
        let secret = var(crate::procs::INCARNATION_VAR)?;
        let socket = socket
            .to_str()
            .ok_or_else(|| RunError::InvalidArgument(format!("{SOCKET_VAR} is not UTF-8")))?;
        let (stream, served) = open(socket, &run, generation, &secret, handshake)?;
        let client = StoreClient::of_stream(socket, &run, generation, &secret, stream, served);
        client.check_serves(std::path::Path::new(&run))?;
        Ok(Some(client))
    }

    /// Refuse (`ARGUMENT_INVALID`) unless the owner serves the folder at `dir` (same device
    /// and inode, whatever the path): the message names both runs.
    pub fn check_serves(&self, dir: &std::path::Path) -> Result<(), RunError> {
        use std::os::unix::fs::MetadataExt;
        let here = std::fs::metadata(dir).map(|m| (m.dev(), m.ino()));
        if here.as_ref().ok() == Some(&self.served.root) {
            return Ok(());
        }
        let why = match here {
            Ok(_) => "another folder".to_string(),
            Err(e) => format!("a folder this process cannot see ({e})"),
        };
        Err(RunError::InvalidArgument(format!(
            "RUNLEASE_RUN names run {}, but this command's store socket {} serves run {} ({why}): the environment mixes two runs; nothing was requested (a command writes only its own owner's run: unset RUNLEASE_RUN's override, or run the command under the other run's owner)",
            self.run, self.socket, self.served.run
        )))
    }

    /// Connect to the socket announced as `socket` (`@runlease-store-…`) for run `run`
    /// (named in errors), as a command of `generation` holding `secret`, and do the
    /// handshake (module docs): the owner proves it knows `secret` before this client
    /// proves it; neither sends it.
    pub fn connect(
        socket: &str,
        run: &str,
        generation: u64,
        secret: &str,
    ) -> Result<StoreClient, RunError> {
        let (stream, served) = open(socket, run, generation, secret, CLIENT_HANDSHAKE_TIMEOUT)?;
        Ok(StoreClient::of_stream(
            socket, run, generation, secret, stream, served,
        ))
    }

    /// A client on a connection whose handshake is done, with the default request timeout.
    fn of_stream(
        socket: &str,
        run: &str,
        generation: u64,
        secret: &str,
        stream: UnixStream,
        served: ServedRun,
    ) -> StoreClient {
        let _ = stream.set_read_timeout(Some(DEFAULT_TIMEOUT));
        let _ = stream.set_write_timeout(Some(DEFAULT_TIMEOUT));
        StoreClient {
            run: run.to_string(),
            socket: socket.to_string(),
            secret: secret.to_string(),
            generation,
            served,
            timeout_ms: std::sync::atomic::AtomicU64::new(millis(DEFAULT_TIMEOUT)),
            stream,
        }
    }

    /// Bound how long one request waits for its answer (default 300 s); a request past it
    /// fails with an I/O error saying its outcome is unknown.
    pub fn set_timeout(&self, timeout: Duration) {
        let timeout = timeout.max(Duration::from_millis(1));
        self.timeout_ms
            .store(millis(timeout), std::sync::atomic::Ordering::Relaxed);
        let t = Some(timeout);
        let _ = self.stream.set_read_timeout(t);
        let _ = self.stream.set_write_timeout(t);
    }

    /// The generation this client's requests are stamped with.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The run the owner said it serves (its welcome).
    pub fn served(&self) -> &ServedRun {
        &self.served
    }

    /// Reconnect when the owner closed this connection while it was idle (nothing was
    /// sent on it since its last answer, so nothing is lost by connecting again).
    fn reopen_if_closed(&mut self) -> Result<(), RunError> {
        use rustix::net::{RecvFlags, recv};
        let mut b = [0u8; 1];
        // Readable without waiting: the end of the stream (or a frame nobody asked for).
        let closed = match recv(
            &self.stream,
            &mut b[..],
            RecvFlags::PEEK | RecvFlags::DONTWAIT,
        ) {
            Ok(_) => true,
            Err(e) => e != rustix::io::Errno::AGAIN,
        };
        if closed {
            let t =
                Duration::from_millis(self.timeout_ms.load(std::sync::atomic::Ordering::Relaxed));
            let (stream, served) = open(
                &self.socket,
                &self.run,
                self.generation,
                &self.secret,
                t.min(CLIENT_HANDSHAKE_TIMEOUT),
            )?;
            let _ = stream.set_read_timeout(Some(t));
            let _ = stream.set_write_timeout(Some(t));
            self.stream = stream;
            self.served = served;
        }
        Ok(())
    }

    /// Send `op` and read its answer; a refusal becomes [`RunError::Served`] (with the
    /// owner's code and message).
    pub fn call(&mut self, op: Op) -> Result<Answer, RunError> {
        let body = serde_json::to_vec(&op)
            .map_err(|e| RunError::Io(format!("run {}: cannot encode a request: {e}", self.run)))?;
        if body.len() > MAX_FRAME {
            return Err(RunError::InvalidArgument(format!(
                "run {}: a request of {} bytes on the wire is over the store socket's limit of {MAX_FRAME} (values travel as hex: at most about 8 MiB of values per commit); nothing was sent",
                self.run,
                body.len()
            )));
        }
        self.reopen_if_closed()?;
        let writes = op.writes();
        let run = self.run.clone();
        let lost = |e: std::io::Error| {
            let outcome = match &op {
                Op::Commit { .. } => {
                    "a commit may or may not have been made: read the store to know"
                }
                Op::Release => "the release request may or may not have reached the owner",
                _ => "nothing was written (a read): ask again",
            };
            let _ = writes;
            RunError::Io(format!(
                "run {run}: the owner's store socket failed mid-request ({e}); {outcome}"
            ))
        };
        write_frame(&mut self.stream, &body).map_err(&lost)?;
        let answer = read_frame_limited(&mut self.stream, MAX_ANSWER)
            .map_err(&lost)?
            .ok_or_else(|| {
                lost(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "the owner closed the connection",
                ))
            })?;
        let a: Answer = serde_json::from_slice(&answer).map_err(|e| {
            RunError::Io(format!(
                "run {}: the owner's answer is not valid: {e}",
                self.run
            ))
        })?;
        answer_or_refusal(&self.run, a)
    }

    fn malformed(&self, what: &str) -> RunError {
        RunError::Io(format!("run {}: the owner's answer lacks {what}", self.run))
    }

    /// A page of an answer: its `field` (required) decoded item by item, and its `more`
    /// (absent = no more); a page that says more follow must hold some `items`.
    fn page<W, T>(
        &self,
        more: Option<bool>,
        field_value: Option<Vec<W>>,
        field: &str,
        items: &str,
        decode: impl Fn(&W) -> Result<T, String>,
    ) -> Result<(Vec<T>, bool), RunError> {
        let more = more.unwrap_or(false);
        let wire = field_value.ok_or_else(|| self.malformed(field))?;
        let page = wire
            .iter()
            .map(|w| decode(w).map_err(|e| self.malformed(&e)))
            .collect::<Result<Vec<_>, _>>()?;
        if more && page.is_empty() {
            return Err(self.malformed(&format!("{items} in a page that says more follow")));
        }
        Ok((page, more))
    }

    /// Commit `batch` as the owner's generation; returns its sequence once it is durable
    /// and covered by the floor.
    pub fn commit(&mut self, batch: &Batch) -> Result<u64, RunError> {
        let a = self.call(commit_op(batch))?;
        a.seq.ok_or_else(|| self.malformed("seq"))
    }

    /// The document at `key`, if any.
    pub fn get(&mut self, key: &str) -> Result<Option<Document>, RunError> {
        let a = self.call(Op::Get {
            key: key.to_string(),
        })?;
        a.doc
            .map(|d| d.to_doc().map_err(|e| self.malformed(&e)))
            .transpose()
    }

    /// One page of the documents whose key starts with `prefix` and comes after `after`,
    /// in key order, at most `limit` (the owner bounds a page by bytes too); `true` when
    /// there are more (ask again after the last key returned).
    pub fn scan_prefix_page(
        &mut self,
        prefix: &str,
        after: Option<&str>,
        limit: Option<u64>,
    ) -> Result<(Vec<Document>, bool), RunError> {
        let a = self.call(Op::List {
            prefix: prefix.to_string(),
            after: after.map(str::to_string),
            limit,
        })?;
        self.page(a.more, a.docs, "docs", "documents", WireDoc::to_doc)
    }

    /// Every document whose key starts with `prefix`, in key order (read a page at a
    /// time: the whole answer may be larger than one frame).
    pub fn scan_prefix(&mut self, prefix: &str) -> Result<Vec<Document>, RunError> {
        let mut all: Vec<Document> = Vec::new();
        loop {
            let after = all.last().map(|d| d.key.clone());
            let (page, more) = self.scan_prefix_page(prefix, after.as_deref(), None)?;
            all.extend(page);
            if !more {
                return Ok(all);
            }
        }
    }

    /// One page of the commits after `since`, at most `max` (the owner bounds a page by
    /// bytes too); `true` when there may be more (ask again after the last sequence).
    pub fn commits_page(
        &mut self,
        since: u64,
        max: Option<u64>,
    ) -> Result<(Vec<Commit>, bool), RunError> {
        let a = self.call(Op::Log { since, max })?;
        self.page(
            a.more,
            a.commits,
            "commits",
            "commits",
            WireCommit::to_commit,
        )
    }

    /// The commits after `since`, at most `max` (all if `None`), read a page at a time.
    pub fn commits_since(&mut self, since: u64, max: Option<u64>) -> Result<Vec<Commit>, RunError> {
        let mut all: Vec<Commit> = Vec::new();
        loop {
            let left = max.map(|m| m.saturating_sub(all.len() as u64));
            if left == Some(0) {
                return Ok(all);
            }
            let after = all.last().map_or(since, |c| c.seq);
            let (page, more) = self.commits_page(after, left)?;
            all.extend(page);
            if !more {
                return Ok(all);
            }
        }
    }

    /// The last committed sequence.
    pub fn head(&mut self) -> Result<u64, RunError> {
        let a = self.call(Op::Head)?;
        a.head.ok_or_else(|| self.malformed("head"))
    }

    /// Ask the owner to release the run (it releases as soon as it sees the request;
    /// watch the lease to know when it did).
    pub fn request_release(&mut self) -> Result<(), RunError> {
        self.call(Op::Release).map(|_| ())
    }
}

pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `a` if it says ok, else its refusal as [`RunError::Served`].
pub(super) fn answer_or_refusal(run: &str, a: Answer) -> Result<Answer, RunError> {
    if a.ok {
        return Ok(a);
    }
    let code = a
        .code
        .as_deref()
        .and_then(Code::parse)
        .unwrap_or(Code::Internal);
    Err(RunError::Served {
        run: run.to_string(),
        code,
        message: a
            .message
            .unwrap_or_else(|| "refused without a message".into()),
    })
}

/// Connect to `socket`, check its listener's user, and do the handshake (module docs). A
/// connection the owner closed before answering the hello (it evicts connections that
/// have not spoken when its unauthenticated slots are full) is tried again, twice: nothing
/// was requested on it.
pub(super) fn open(
    socket: &str,
    run: &str,
    generation: u64,
    secret: &str,
    handshake: Duration,
) -> Result<(UnixStream, ServedRun), RunError> {
    let mut attempt = 0u64;
    loop {
        match open_once(socket, run, generation, secret, handshake) {
            Err(Attempt::Closed(_)) if attempt < 2 => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(20 * attempt));
            }
            Err(Attempt::Closed(e) | Attempt::Failed(e)) => return Err(e),
            Ok(x) => return Ok(x),
        }
    }
}

/// Why one connection attempt failed.
pub(super) enum Attempt {
    /// Closed by the owner before it answered the hello: worth another attempt.
    Closed(RunError),
    /// Anything else.
    Failed(RunError),
}

impl From<RunError> for Attempt {
    fn from(e: RunError) -> Attempt {
        Attempt::Failed(e)
    }
}

pub(super) fn open_once(
    socket: &str,
    run: &str,
    generation: u64,
    secret: &str,
    handshake: Duration,
) -> Result<(UnixStream, ServedRun), Attempt> {
    use std::os::linux::net::SocketAddrExt;
    let name = abstract_name(socket).ok_or_else(|| {
        RunError::InvalidArgument(format!(
            "{SOCKET_VAR}={socket:?} is not a runlease store socket (@runlease-store-…)"
        ))
    })?;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| RunError::InvalidArgument(format!("{SOCKET_VAR}: {e}")))?;
    let mut stream = UnixStream::connect_addr(&addr).map_err(|e| match e.kind() {
        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => RunError::Served {
            run: run.to_string(),
            code: Code::Fenced,
            message: format!(
                "run {run}: the owner of generation {generation} no longer serves its store (socket {socket}: {e}): it released the run or exited; nothing was sent"
            ),
        },
        _ => RunError::os(
            format!("run {run}: cannot connect to its store socket {socket}"),
            e,
        ),
    })?;
    // The listener must be our own user's (or root's): never talk to a name another user
    // took over.
    let me = rustix::process::geteuid();
    let peer = rustix::net::sockopt::socket_peercred(&stream).map_err(|e| {
        RunError::Io(format!(
            "run {run}: cannot read the store socket's owner: {e}"
        ))
    })?;
    if peer.uid != me && !peer.uid.is_root() {
        return Err(Attempt::Failed(RunError::Served {
            run: run.to_string(),
            code: Code::StoreRequestRefused,
            message: format!(
                "run {run}: the store socket {socket} is held by uid {}, not by this user (uid {}): not this run's owner; nothing was sent",
                peer.uid.as_raw(),
                me.as_raw()
            ),
        }));
    }
    let handshake = handshake.max(Duration::from_millis(1));
    let _ = stream.set_read_timeout(Some(handshake));
    let _ = stream.set_write_timeout(Some(handshake));
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        RunError::Io(format!(
            "run {run}: the store socket {socket} failed during the handshake ({what}: {e}); nothing was requested"
        ))
    };
    let refused = |why: String| RunError::Served {
        run: run.to_string(),
        code: Code::StoreRequestRefused,
        message: format!("run {run}: the store socket {socket} {why}; nothing secret was sent"),
    };
    // 1. hello
    let cn = nonce()?;
    let hello = serde_json::to_vec(&Hello {
        v: VERSION,
        nonce: hex::encode(cn),
        generation,
    })
    .map_err(|e| failed("hello", &e))?;
    write_frame(&mut stream, &hello).map_err(|e| Attempt::Closed(failed("hello", &e)))?;
    // 2. the owner's proof, checked before this side proves anything
    let frame = match read_frame_limited(&mut stream, MAX_HELLO) {
        Ok(Some(f)) => f,
        Ok(None) => {
            return Err(Attempt::Closed(failed(
                "challenge",
                &"the socket closed the connection",
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Err(Attempt::Failed(refused(format!(
                "did not prove it knows this run's incarnation secret: it answered the hello with an oversized frame ({e}); it is not this run's owner"
            ))));
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            return Err(Attempt::Closed(failed("challenge", &e)));
        }
        Err(e) => return Err(failed("challenge", &e).into()),
    };
    if let Ok(a) = serde_json::from_slice::<Answer>(&frame)
        && !a.ok
        && a.code.is_some()
    {
        // Unauthenticated: its code is not trusted, its reason is shown.
        return Err(Attempt::Failed(refused(format!(
            "refused the handshake ({})",
            a.message.as_deref().unwrap_or("no reason given")
        ))));
    }
    let ch: Challenge = serde_json::from_slice(&frame).map_err(|e| {
        refused(format!(
            "did not prove it knows this run's incarnation secret: its answer to the hello is not a challenge ({e}); it is not this run's owner"
        ))
    })?;
    let sn = nonce_of(&ch.nonce);
    let proof = hex::decode(&ch.proof).ok();
    let proved = match (&sn, &proof) {
        (Some(sn), Some(p)) if ch.v == VERSION => verify(
            secret,
            &transcript(Side::Server, name, &cn, sn, generation),
            p,
        ),
        _ => false,
    };
    let Some(sn) = sn.filter(|_| proved) else {
        return Err(Attempt::Failed(refused(
            "did not prove it knows this run's incarnation secret: it is not this run's owner (an impostor holding the name, or an owner of another incarnation)".into(),
        )));
    };
    // 3. this side's proof
    let mine = serde_json::to_vec(&Proof {
        proof: hex::encode(prove(
            secret,
            &transcript(Side::Client, name, &cn, &sn, generation),
        )),
    })
    .map_err(|e| failed("proof", &e))?;
    write_frame(&mut stream, &mine).map_err(|e| failed("proof", &e))?;
    // 4. the welcome (from the proved owner: its refusals are trusted)
    let frame = read_frame_limited(&mut stream, MAX_WELCOME)
        .map_err(|e| failed("welcome", &e))?
        .ok_or_else(|| failed("welcome", &"the owner closed the connection"))?;
    let a: Answer = serde_json::from_slice(&frame).map_err(|e| failed("welcome", &e))?;
    let a = answer_or_refusal(run, a)?;
    let served = match (a.run, a.root, a.generation) {
        (Some(run), Some(root), Some(generation)) => ServedRun {
            run,
            root,
            generation,
        },
        _ => {
            return Err(Attempt::Failed(failed(
                "welcome",
                &"it lacks the run, root or generation",
            )));
        }
    };
    Ok((stream, served))
}
