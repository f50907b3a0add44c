//! The wire: its limits and timeouts, the handshake's messages and proofs, the requests
//! and answers, and the length-prefixed frames they travel in.

use crate::error::RunError;
use hmac::{Hmac, Mac};
use lease_core::Code;
use lease_sqlite::{Batch, Commit, Document, Write};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::io::Read;
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

pub(super) fn hmac_of(secret: &str) -> Hmac<Sha256> {
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
    hex::decode(text).ok().filter(|n| n.len() == NONCE_LEN)
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
    pub(super) fn writes(&self) -> bool {
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

impl WireWrite {
    /// On the wire.
    pub fn of(w: &Write) -> WireWrite {
        match w {
            Write::Put { key, value } => WireWrite::Put {
                put: key.clone(),
                value: hex::encode(value),
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
                value: hex::decode(value)
                    .map_err(|_| format!("the value of {put:?} is not hex"))?,
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
            value: hex::encode(&d.value),
            updated_seq: d.updated_seq,
        }
    }

    pub(super) fn to_doc(&self) -> Result<Document, String> {
        Ok(Document {
            key: self.key.clone(),
            value: hex::decode(&self.value).map_err(|_| "a value that is not hex")?,
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
            log: c.log.iter().map(hex::encode).collect(),
        }
    }

    pub(super) fn to_commit(&self) -> Result<Commit, String> {
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
                .map(|l| hex::decode(l).map_err(|_| "a log entry that is not hex".to_string()))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// A batch as the `commit` operation.
pub fn commit_op(batch: &Batch) -> Op {
    Op::Commit {
        writes: batch.writes.iter().map(WireWrite::of).collect(),
        log: batch.log.iter().map(hex::encode).collect(),
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
            .map(|l| hex::decode(l).map_err(|_| "a log entry is not hex".to_string()))
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
/// its first byte). For the project's tests and fuzz targets (feature `internals`): the
/// owner and the client read with an explicit limit.
#[cfg(any(test, feature = "internals"))]
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
