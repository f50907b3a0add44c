//! The run's store served to its commands over a local socket (issues #20, #29): the wire
//! format, the handshake, and [`StoreClient`], the client a command uses.
//!
//! An owner opened with [`crate::OpenOptions::serve_store`] listens on an **abstract** Unix
//! stream socket (Linux: a name with no file behind it, so nothing is left in the run
//! folder after a crash and no path length limit applies) named
//! `runlease-store-<128 random bits>`, and gives its commands the name in
//! [`SOCKET_VAR`] (`@` + name, as `ss` prints abstract names) beside the incarnation
//! secret ([`crate::INCARNATION_VAR`]), the generation and the run folder.
//!
//! ## Who is answered: the handshake (protocol version 2)
//!
//! Anyone in the network namespace can connect to an abstract socket, and after an owner
//! died anyone of its user can bind its name. So both sides prove, before anything secret
//! or any data travels, that they know this incarnation's secret `K` (the value of
//! [`crate::INCARNATION_VAR`]); the secret itself is never sent. Every proof is
//! `HMAC-SHA-256(K, transcript)` (verified in constant time), where the transcript is a
//! label and then, each as a 4-byte big-endian length and its bytes: the socket's abstract
//! name, the client's nonce, the server's nonce, the generation the client claims (8 bytes
//! big-endian). The two labels differ (`runlease-store/2/server`, `runlease-store/2/client`),
//! so a proof cannot be reflected; both fresh 32-byte nonces are in both proofs, so none can
//! be replayed; the name is in both, so a proof made for one socket is worth nothing at
//! another.
//!
//! ```text
//! C → S  {"v":2,"nonce":"<64 hex: cn>","generation":3}                 (hello, ≤ 512 bytes)
//! S → C  {"v":2,"nonce":"<64 hex: sn>","proof":"<HMAC server>"}        (challenge)
//!        the client checks the server's proof; a server that cannot make it is refused
//!        (STORE_REQUEST_REFUSED) and is sent nothing more
//! C → S  {"proof":"<HMAC client>"}                                      (≤ 512 bytes)
//! S → C  {"ok":true,"run":"/abs/run","root":[dev,ino],"generation":3}   (welcome)
//!     or {"ok":false,"code":"FENCED","message":"run …: …"}             (a stale generation,
//!                                                                        a fenced or released owner)
//! ```
//!
//! Before the client's proof is checked the owner says nothing about itself: a refusal is
//! `{"ok":false,"code":"STORE_REQUEST_REFUSED","message":"refused: …"}` with a fixed reason
//! (no path, no user, no run name), and the connection is closed. The welcome names the
//! run the owner serves (its folder's device and inode): [`StoreClient::from_env`] refuses
//! (`ARGUMENT_INVALID`, 64) a command whose `RUNLEASE_RUN` names another folder, naming
//! both, before any request.
//!
//! Besides the proof, the owner answers only its own user (or root): another user's
//! connection (`SO_PEERCRED`) is closed at once, without a word. The client
//! checks the other way round too: the listener must belong to its own user (or root).
//!
//! ## Limits (what a connection can cost the owner)
//!
//! - Before authentication: frames of at most [`MAX_HELLO`] bytes (a longer one is refused
//!   unread); the whole handshake within [`HANDSHAKE_DEADLINE`]; nothing allocated but a
//!   [`MAX_HELLO`]-byte buffer; at most [`UNAUTHENTICATED_SLOTS`] such connections at once
//!   (fewer if the descriptor limit is low). A new connection over that number evicts the
//!   oldest one that has not sent a whole, well-formed hello, taken from the process
//!   (`SO_PEERCRED` pid) that holds the most slots: a flood of silent or garbage
//!   connections cycles out among its own, and a command (one connection, its hello sent
//!   as it connects) is not locked out; if every slot holds a connection that did speak,
//!   nothing more is accepted until one finishes its handshake or its deadline. A client
//!   whose connection is closed before the challenge tries twice more (nothing was asked).
//! - After it: frames of at most [`MAX_FRAME`] bytes, each read within [`READ_TIMEOUT`]
//!   once its length arrived; a connection idle for [`IDLE_TIMEOUT`] is closed (the client
//!   reconnects before its next request when it finds it closed); at most a number of
//!   connections computed from `RLIMIT_NOFILE` (a quarter of what is left after a reserve,
//!   at most 256), so the heartbeat always finds a descriptor; the requests queued for the
//!   committer are bounded by that number.
//! - The server runs on its own thread with its own runtime: a flood costs that thread's
//!   time, never the heartbeat's.
//!
//! ## Frames and requests
//!
//! Each frame is a 4-byte big-endian length, then that many bytes of JSON. After the
//! welcome a connection carries any number of requests, answered in order; a request
//! carries no secret and no generation (both were bound by the handshake). Byte strings
//! (values, log entries) travel as lowercase hex. An answer is at most [`MAX_ANSWER`]
//! bytes: `list` and `log` answer a page that fits and say `"more":true` when there is
//! more, and the client asks for the next page (after the last key / the last sequence).
//!
//! ```text
//! → {"op":"commit","writes":[{"put":"k","value":"6869"},{"delete":"old"}],"log":["646f6e65"]}
//! ← {"ok":true,"seq":12,"generation":3}
//! → {"op":"get","key":"k"}
//! ← {"ok":true,"doc":{"key":"k","value":"6869","updated_seq":12}}
//! → {"op":"list","prefix":"k","after":"k0","limit":1000}
//! ← {"ok":true,"docs":[…],"more":true}
//! ← {"ok":false,"code":"FENCED","message":"run r: this owner is fenced: superseded by generation 4"}
//! ```
//!
//! Operations: `commit` (answered once the commit is durable **and** covered by the floor:
//! see [`crate::OpenOptions::serve_store`]), `get` (`key`), `list` (`prefix`, `after`,
//! `limit`), `log` (`since`, `max`), `head`, `release` (asks the owner to release the run;
//! answered `{"ok":true,"accepted":true}` once the request is queued).

use crate::error::RunError;
use hmac::{Hmac, Mac};
use lease_core::Code;
use lease_sqlite::{Batch, Commit, Document, Write};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The environment variable that carries the store socket's name to the run's commands.
pub const SOCKET_VAR: &str = "RUNLEASE_STORE_SOCKET";

/// The largest request frame (16 MiB), accepted only after the handshake: a longer one is
/// refused, never read.
pub const MAX_FRAME: usize = 16 << 20;

/// The largest answer frame, read only from an authenticated owner: one document or commit
/// as large as the store takes (`lease_sqlite::MAX_COMMIT_BYTES`, 16 MiB, as hex: twice
/// that) with room for the fields around it. A `list` or `log` page is cut at about
/// [`MAX_FRAME`] unless its one item is larger.
pub const MAX_ANSWER: usize = 2 * MAX_FRAME + (64 << 10);

/// The largest frame before the handshake is done (hello, challenge, proof, refusals).
pub const MAX_HELLO: usize = 512;

/// The largest welcome frame (it names the run folder, which may be a long path).
pub const MAX_WELCOME: usize = 16 << 10;

/// How long the owner waits for a connection's whole handshake (hello and proof).
pub const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(2);

/// How long an authenticated connection may stay idle between requests before the owner
/// closes it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// How long the rest of a frame may take once its length arrived (and how long an answer
/// may take to be written).
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The most unauthenticated connections the owner holds at once (fewer under a low
/// descriptor limit).
pub const UNAUTHENTICATED_SLOTS: usize = 16;

/// The wire protocol's version (the `v` of the hello and the challenge).
pub const VERSION: u32 = 2;

/// The length of each side's nonce, in bytes.
pub const NONCE_LEN: usize = 32;

/// The client's hello: the first frame on a connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    /// [`VERSION`].
    pub v: u32,
    /// The client's nonce, hex ([`NONCE_LEN`] bytes).
    pub nonce: String,
    /// The generation the command was started by (`RUNLEASE_GENERATION`).
    pub generation: u64,
}

/// The owner's answer to a hello: its nonce and its proof.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Challenge {
    /// [`VERSION`].
    pub v: u32,
    /// The server's nonce, hex ([`NONCE_LEN`] bytes).
    pub nonce: String,
    /// `HMAC(K, transcript("server", …))`, hex.
    pub proof: String,
}

/// The client's proof, sent once the owner's proof checked out.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Proof {
    /// `HMAC(K, transcript("client", …))`, hex.
    pub proof: String,
}

/// Which side a proof speaks for (its label in the transcript).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The owner's proof (the challenge).
    Server,
    /// The command's proof.
    Client,
}

/// The bytes a proof covers (see the module docs): the side's label, then the socket's
/// abstract name, both nonces and the claimed generation, each length-prefixed.
pub fn transcript(side: Side, name: &str, cn: &[u8], sn: &[u8], generation: u64) -> Vec<u8> {
    let label: &[u8] = match side {
        Side::Server => b"runlease-store/2/server",
        Side::Client => b"runlease-store/2/client",
    };
    let mut t = Vec::with_capacity(label.len() + 4 * 4 + name.len() + cn.len() + sn.len() + 8);
    t.extend_from_slice(label);
    for part in [name.as_bytes(), cn, sn, &generation.to_be_bytes()] {
        let n = u32::try_from(part.len()).unwrap_or(u32::MAX);
        t.extend_from_slice(&n.to_be_bytes());
        t.extend_from_slice(part);
    }
    t
}

fn hmac_of(secret: &str) -> Hmac<Sha256> {
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"))
}

/// `HMAC-SHA-256(secret, transcript)`.
pub fn prove(secret: &str, transcript: &[u8]) -> [u8; 32] {
    let mut m = hmac_of(secret);
    m.update(transcript);
    m.finalize().into_bytes().into()
}

/// Whether `proof` is `HMAC-SHA-256(secret, transcript)` (constant-time comparison).
pub fn verify(secret: &str, transcript: &[u8], proof: &[u8]) -> bool {
    let mut m = hmac_of(secret);
    m.update(transcript);
    m.verify_slice(proof).is_ok()
}

/// A fresh nonce from the OS.
pub fn nonce() -> Result<[u8; NONCE_LEN], RunError> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| RunError::Io(format!("cannot draw a nonce: {e}")))?;
    Ok(n)
}

/// A nonce given as hex; `None` unless it is exactly [`NONCE_LEN`] bytes.
pub fn nonce_of(text: &str) -> Option<Vec<u8>> {
    unhex(text).filter(|n| n.len() == NONCE_LEN)
}

/// What the owner says before authentication: the bare refusal, with a fixed reason that
/// names no path, user or run.
pub fn stranger_refusal(reason: &str) -> Answer {
    Answer {
        ok: false,
        code: Some(Code::StoreRequestRefused.as_str().to_string()),
        message: Some(format!("refused: {reason}")),
        ..Answer::default()
    }
}

/// A request after the handshake: one operation.
pub type Request = Op;

/// One write of a commit on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum WireWrite {
    /// Put `value` (hex) at `put`.
    Put {
        /// The key.
        put: String,
        /// The value, hex.
        value: String,
    },
    /// Delete the key `delete`.
    Delete {
        /// The key.
        delete: String,
    },
}

/// The operations of a request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Commit one batch.
    Commit {
        /// Its writes, in order.
        #[serde(default)]
        writes: Vec<WireWrite>,
        /// Its log entries (hex), in order.
        #[serde(default)]
        log: Vec<String>,
    },
    /// Read one document.
    Get {
        /// Its key.
        key: String,
    },
    /// Read a page of the documents under a prefix.
    List {
        /// The prefix ("" for all).
        #[serde(default)]
        prefix: String,
        /// Only keys after this one (the last key of the previous page).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<String>,
        /// At most this many documents (the page may hold fewer: it is also bounded by
        /// bytes; `more` says whether there are more).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u64>,
    },
    /// Read the commits after `since`, at most `max` (a page: `more` says whether to ask
    /// again after the last one).
    Log {
        /// The last sequence already seen (0 for all).
        #[serde(default)]
        since: u64,
        /// At most this many commits.
        max: Option<u64>,
    },
    /// The last committed sequence.
    Head,
    /// Ask the owner to release the run.
    Release,
}

impl Op {
    /// Whether carrying it out writes (a lost answer leaves its outcome unknown).
    fn writes(&self) -> bool {
        matches!(self, Op::Commit { .. } | Op::Release)
    }
}

/// A document on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireDoc {
    /// Its key.
    pub key: String,
    /// Its value, hex.
    pub value: String,
    /// The commit that last wrote it.
    pub updated_seq: u64,
}

/// A commit on the wire.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireCommit {
    /// Its sequence.
    pub seq: u64,
    /// Its writer's generation.
    pub token: u64,
    /// When it was committed (the owner's wall clock).
    pub committed_at: String,
    /// Its writes.
    pub writes: Vec<WireWrite>,
    /// Its log entries, hex.
    pub log: Vec<String>,
}

/// An answer, as sent: `ok` with the fields of the operation, or a refusal. The welcome
/// of the handshake is one too (`run`, `root`, `generation`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Answer {
    /// Whether the request was carried out.
    pub ok: bool,
    /// A refusal's stable code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// A refusal's message (names the run once the peer is authenticated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `commit`: the new sequence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// `commit`: the generation it was committed as; the welcome: the owner's generation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// `get`: the document (absent = no such key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub doc: Option<WireDoc>,
    /// `list`: the documents.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub docs: Option<Vec<WireDoc>>,
    /// `log`: the commits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commits: Option<Vec<WireCommit>>,
    /// `list`, `log`: there is more after this page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub more: Option<bool>,
    /// `head`: the head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<u64>,
    /// `release`: the request was queued.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted: Option<bool>,
    /// The welcome: the run the owner serves, as it names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// The welcome: the run folder's `(st_dev, st_ino)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root: Option<(u64, u64)>,
}

impl Answer {
    /// A refusal.
    pub fn refused(code: Code, message: impl Into<String>) -> Answer {
        Answer {
            ok: false,
            code: Some(code.as_str().to_string()),
            message: Some(message.into()),
            ..Answer::default()
        }
    }

    /// The refusal of a failed operation.
    pub fn of_error(e: &RunError) -> Answer {
        Answer::refused(e.code(), e.to_string())
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const D: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(D[usize::from(b >> 4)]));
        s.push(char::from(D[usize::from(b & 15)]));
    }
    s
}

/// The bytes of lowercase or uppercase hex `text`; `None` if it is not hex.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    let t = text.as_bytes();
    if t.len() % 2 != 0 {
        return None;
    }
    let v = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    t.chunks(2)
        .map(|p| Some(v(p[0])? << 4 | v(p[1])?))
        .collect()
}

impl WireWrite {
    /// On the wire.
    pub fn of(w: &Write) -> WireWrite {
        match w {
            Write::Put { key, value } => WireWrite::Put {
                put: key.clone(),
                value: hex(value),
            },
            Write::Delete { key } => WireWrite::Delete {
                delete: key.clone(),
            },
        }
    }

    /// Back to a store write; `Err` says what is not hex.
    pub fn to_write(&self) -> Result<Write, String> {
        Ok(match self {
            WireWrite::Put { put, value } => Write::Put {
                key: put.clone(),
                value: unhex(value).ok_or_else(|| format!("the value of {put:?} is not hex"))?,
            },
            WireWrite::Delete { delete } => Write::Delete {
                key: delete.clone(),
            },
        })
    }
}

impl WireDoc {
    /// On the wire.
    pub fn of(d: &Document) -> WireDoc {
        WireDoc {
            key: d.key.clone(),
            value: hex(&d.value),
            updated_seq: d.updated_seq,
        }
    }

    fn to_doc(&self) -> Result<Document, String> {
        Ok(Document {
            key: self.key.clone(),
            value: unhex(&self.value).ok_or("a value that is not hex")?,
            updated_seq: self.updated_seq,
        })
    }
}

impl WireCommit {
    /// On the wire.
    pub fn of(c: &Commit) -> WireCommit {
        WireCommit {
            seq: c.seq,
            token: c.token,
            committed_at: c.committed_at.clone(),
            writes: c.writes.iter().map(WireWrite::of).collect(),
            log: c.log.iter().map(|l| hex(l)).collect(),
        }
    }

    fn to_commit(&self) -> Result<Commit, String> {
        Ok(Commit {
            seq: self.seq,
            token: self.token,
            committed_at: self.committed_at.clone(),
            writes: self
                .writes
                .iter()
                .map(WireWrite::to_write)
                .collect::<Result<_, _>>()?,
            log: self
                .log
                .iter()
                .map(|l| unhex(l).ok_or_else(|| "a log entry that is not hex".to_string()))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// A batch as the `commit` operation.
pub fn commit_op(batch: &Batch) -> Op {
    Op::Commit {
        writes: batch.writes.iter().map(WireWrite::of).collect(),
        log: batch.log.iter().map(|l| hex(l)).collect(),
    }
}

/// The batch a `commit` operation carries; `Err` says what is malformed.
pub fn batch_of(writes: &[WireWrite], log: &[String]) -> Result<Batch, String> {
    Ok(Batch {
        writes: writes
            .iter()
            .map(WireWrite::to_write)
            .collect::<Result<_, _>>()?,
        log: log
            .iter()
            .map(|l| unhex(l).ok_or_else(|| "a log entry is not hex".to_string()))
            .collect::<Result<_, _>>()?,
    })
}

/// Write one frame (at most [`MAX_ANSWER`] bytes; a request is also checked against
/// [`MAX_FRAME`] by its sender).
pub fn write_frame(w: &mut impl std::io::Write, body: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|n| (*n as usize) <= MAX_ANSWER)
        .ok_or_else(|| std::io::Error::other(format!("a frame of {} bytes", body.len())))?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(body);
    w.write_all(&buf)?;
    w.flush()
}

/// Read one frame of at most [`MAX_FRAME`] bytes (`None` at a clean end of stream before
/// its first byte).
pub fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    read_frame_limited(r, MAX_FRAME)
}

/// Read one frame of at most `limit` bytes: a longer one is refused (`InvalidData`)
/// before any of its body is read or allocated.
pub fn read_frame_limited(r: &mut impl Read, limit: usize) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..])? {
            0 if got == 0 => return Ok(None),
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => got += n,
        }
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {n} bytes (at most {limit})"),
        ));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)?;
    Ok(Some(body))
}

/// The abstract name behind a [`SOCKET_VAR`] value (`@name`).
fn abstract_name(announced: &str) -> Option<&str> {
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
const CLIENT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// A stuck owner is a fenced one within its self-fence deadline; no request should wait
/// much longer than a deadline of minutes.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

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
        let more = a.more.unwrap_or(false);
        let docs = a.docs.ok_or_else(|| self.malformed("docs"))?;
        let docs = docs
            .iter()
            .map(|d| d.to_doc().map_err(|e| self.malformed(&e)))
            .collect::<Result<Vec<_>, _>>()?;
        if more && docs.is_empty() {
            return Err(self.malformed("documents in a page that says more follow"));
        }
        Ok((docs, more))
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
        let more = a.more.unwrap_or(false);
        let commits = a.commits.ok_or_else(|| self.malformed("commits"))?;
        let commits = commits
            .iter()
            .map(|c| c.to_commit().map_err(|e| self.malformed(&e)))
            .collect::<Result<Vec<_>, _>>()?;
        if more && commits.is_empty() {
            return Err(self.malformed("commits in a page that says more follow"));
        }
        Ok((commits, more))
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

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `a` if it says ok, else its refusal as [`RunError::Served`].
fn answer_or_refusal(run: &str, a: Answer) -> Result<Answer, RunError> {
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
fn open(
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
enum Attempt {
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

fn open_once(
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
        _ => RunError::Io(format!(
            "run {run}: cannot connect to its store socket {socket}: {e}"
        )),
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
        nonce: hex(&cn),
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
    let proof = unhex(&ch.proof);
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
        proof: hex(&prove(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_refuses_what_is_not_hex() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&all)).unwrap(), all);
        assert_eq!(hex(b"hi"), "6869");
        assert_eq!(unhex("6A"), Some(vec![0x6a]));
        for bad in ["6", "zz", "6g", "é1"] {
            assert_eq!(unhex(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_batch_survives_the_wire() {
        let b = Batch::new()
            .put("a", vec![0u8, 255, 10])
            .delete("b")
            .log("done");
        let Op::Commit { writes, log } = commit_op(&b) else {
            panic!()
        };
        let json = serde_json::to_string(&Op::Commit { writes, log }).unwrap();
        let back: Request = serde_json::from_str(&json).unwrap();
        let Op::Commit { writes, log } = back else {
            panic!()
        };
        assert_eq!(batch_of(&writes, &log).unwrap(), b);
        assert!(json.contains(r#""op":"commit""#), "{json}");
    }

    #[test]
    fn frames_round_trip_and_an_oversized_one_is_refused_unread() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"{}").unwrap();
        write_frame(&mut buf, b"[1]").unwrap();
        let mut r = &buf[..];
        assert_eq!(read_frame(&mut r).unwrap().unwrap(), b"{}");
        assert_eq!(read_frame(&mut r).unwrap().unwrap(), b"[1]");
        assert!(read_frame(&mut r).unwrap().is_none());
        let huge = u32::try_from(MAX_FRAME + 1).unwrap().to_be_bytes();
        let e = read_frame(&mut &huge[..]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        let e = read_frame(&mut &[0u8, 0, 0, 9, 1][..]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_before_its_body_is_read() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &[b'x'; MAX_HELLO + 1]).unwrap();
        let mut r = &buf[..];
        let e = read_frame_limited(&mut r, MAX_HELLO).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(r.len(), MAX_HELLO + 1, "the body is left unread");
    }

    #[test]
    fn proofs_bind_the_side_the_nonces_the_generation_and_the_name() {
        let (cn, sn) = ([1u8; NONCE_LEN], [2u8; NONCE_LEN]);
        let t = transcript(Side::Server, "runlease-store-ab", &cn, &sn, 3);
        let p = prove("secret", &t);
        assert!(verify("secret", &t, &p));
        assert!(!verify("other", &t, &p), "another key");
        for other in [
            transcript(Side::Client, "runlease-store-ab", &cn, &sn, 3),
            transcript(Side::Server, "runlease-store-ac", &cn, &sn, 3),
            transcript(Side::Server, "runlease-store-ab", &sn, &cn, 3),
            transcript(Side::Server, "runlease-store-ab", &cn, &sn, 4),
        ] {
            assert!(!verify("secret", &other, &p));
        }
        assert!(!verify("secret", &t, &p[..31]), "a short proof");
        assert_eq!(nonce_of(&hex(&cn)), Some(cn.to_vec()));
        assert_eq!(nonce_of("00ff"), None, "too short");
    }

    #[test]
    fn a_strangers_refusal_names_nothing() {
        let a = serde_json::to_string(&stranger_refusal("not authenticated")).unwrap();
        assert_eq!(
            a,
            r#"{"ok":false,"code":"STORE_REQUEST_REFUSED","message":"refused: not authenticated"}"#
        );
    }

    #[test]
    fn only_runlease_store_names_are_connected_to() {
        assert_eq!(
            abstract_name("@runlease-store-00ff"),
            Some("runlease-store-00ff")
        );
        for bad in [
            "runlease-store-1",
            "@other",
            "@runlease-store-a/b",
            "@runlease-store-a b",
        ] {
            assert_eq!(abstract_name(bad), None, "{bad}");
        }
    }
}
