//! The run's store served to its commands over a local socket (issue #20): the wire
//! format, and [`StoreClient`], the client a command uses.
//!
//! An owner opened with [`crate::OpenOptions::serve_store`] listens on an **abstract** Unix
//! stream socket (Linux: a name with no file behind it, so nothing is left in the run
//! folder after a crash and no path length limit applies) named
//! `runlease-store-<128 random bits>`, and gives its commands the name in
//! [`SOCKET_VAR`] (`@` + name, as `ss` prints abstract names) beside the incarnation
//! secret ([`crate::INCARNATION_VAR`]), the generation and the run folder.
//!
//! ## Who is answered
//!
//! Anyone in the network namespace can connect to an abstract socket, so the owner checks
//! every connection and every request before anything reaches the store:
//! - the peer's credentials (`SO_PEERCRED`): its user must be the owner's (or root);
//! - the request's secret: it must be this incarnation's (compared by digest), which only
//!   the owner's commands were given; else `STORE_REQUEST_REFUSED` (77);
//! - the request's generation: it must be the owner's; a command of an older incarnation
//!   (a stale environment) is `FENCED` (75);
//! - the owner itself must be live: a fenced owner answers `FENCED`, a released one
//!   `RUN_RELEASED`.
//!
//! The client checks the other way round too: the listener must belong to its own user
//! (or root), so a name squatted by another user after the owner died is not sent the secret.
//!
//! ## Frames
//!
//! Each request and each answer is one frame: a 4-byte big-endian length, then that many
//! bytes of JSON (at most [`MAX_FRAME`]). A connection carries any number of requests,
//! answered in order. Byte strings (values, log entries) travel as lowercase hex.
//!
//! ```text
//! → {"v":1,"secret":"…","generation":3,"op":"commit","writes":[{"put":"k","value":"6869"},{"delete":"old"}],"log":["646f6e65"]}
//! ← {"ok":true,"seq":12,"generation":3}
//! → {"v":1,"secret":"…","generation":3,"op":"get","key":"k"}
//! ← {"ok":true,"doc":{"key":"k","value":"6869","updated_seq":12}}
//! ← {"ok":false,"code":"FENCED","message":"run r: this owner is fenced: superseded by generation 4"}
//! ```
//!
//! Operations: `commit` (answered once the commit is durable **and** covered by the floor:
//! see [`crate::OpenOptions::serve_store`]), `get` (`key`), `list` (`prefix`), `log`
//! (`since`, `max`), `head`, `release` (asks the owner to release the run; answered
//! `{"ok":true,"accepted":true}` once the request is queued).

use crate::error::RunError;
use lease_core::Code;
use lease_sqlite::{Batch, Commit, Document, Write};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// The environment variable that carries the store socket's name to the run's commands.
pub const SOCKET_VAR: &str = "RUNLEASE_STORE_SOCKET";

/// The largest frame either side accepts (16 MiB): a longer one is refused, never read.
pub const MAX_FRAME: usize = 16 << 20;

/// The wire protocol's version (the `v` of every request).
pub const VERSION: u32 = 1;

/// A request, as sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Request {
    /// [`VERSION`].
    pub v: u32,
    /// The incarnation secret ([`crate::INCARNATION_VAR`]); missing = empty, which is
    /// refused like any wrong secret.
    #[serde(default)]
    pub secret: String,
    /// The generation the command was started by (`RUNLEASE_GENERATION`).
    pub generation: u64,
    /// What is asked.
    #[serde(flatten)]
    pub op: Op,
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

/// The operations of a [`Request`].
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
    /// Read the documents under a prefix.
    List {
        /// The prefix ("" for all).
        #[serde(default)]
        prefix: String,
    },
    /// Read the commits after `since`, at most `max`.
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

/// An answer, as sent: `ok` with the fields of the operation, or a refusal.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Answer {
    /// Whether the request was carried out.
    pub ok: bool,
    /// A refusal's stable code.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// A refusal's message (names the run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `commit`: the new sequence.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// `commit`: the generation it was committed as.
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
    /// `head`: the head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<u64>,
    /// `release`: the request was queued.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted: Option<bool>,
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

/// Write one frame.
pub fn write_frame(w: &mut impl std::io::Write, body: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|n| (*n as usize) <= MAX_FRAME)
        .ok_or_else(|| std::io::Error::other(format!("a frame of {} bytes", body.len())))?;
    let mut buf = Vec::with_capacity(4 + body.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(body);
    w.write_all(&buf)?;
    w.flush()
}

/// Read one frame (`None` at a clean end of stream before its first byte).
pub fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
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
    if n > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {n} bytes (at most {MAX_FRAME})"),
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
    secret: String,
    generation: u64,
    stream: UnixStream,
}

impl StoreClient {
    /// Connect as the command this process is: `None` when [`SOCKET_VAR`] is not set (not
    /// started by an owner that serves its store); an error when the environment is
    /// incomplete or the owner cannot be reached (the owner of that generation is gone:
    /// `FENCED`).
    pub fn from_env() -> Result<Option<StoreClient>, RunError> {
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
        StoreClient::connect(socket, &run, generation, &secret).map(Some)
    }

    /// Connect to the socket announced as `socket` (`@runlease-store-…`) for run `run`
    /// (named in errors), as a command of `generation` holding `secret`.
    pub fn connect(
        socket: &str,
        run: &str,
        generation: u64,
        secret: &str,
    ) -> Result<StoreClient, RunError> {
        use std::os::linux::net::SocketAddrExt;
        let name = abstract_name(socket).ok_or_else(|| {
            RunError::InvalidArgument(format!(
                "{SOCKET_VAR}={socket:?} is not a runlease store socket (@runlease-store-…)"
            ))
        })?;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|e| RunError::InvalidArgument(format!("{SOCKET_VAR}: {e}")))?;
        let stream = UnixStream::connect_addr(&addr).map_err(|e| match e.kind() {
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => {
                RunError::Served {
                    run: run.to_string(),
                    code: Code::Fenced,
                    message: format!(
                        "run {run}: the owner of generation {generation} no longer serves its store (socket {socket}: {e}): it released the run or exited; nothing was sent"
                    ),
                }
            }
            _ => RunError::Io(format!("run {run}: cannot connect to its store socket {socket}: {e}")),
        })?;
        // The listener must be our own user's (or root's): never send the secret to a
        // name another user took over.
        let me = rustix::process::geteuid();
        let peer = rustix::net::sockopt::socket_peercred(&stream).map_err(|e| {
            RunError::Io(format!(
                "run {run}: cannot read the store socket's owner: {e}"
            ))
        })?;
        if peer.uid != me && !peer.uid.is_root() {
            return Err(RunError::Served {
                run: run.to_string(),
                code: Code::StoreRequestRefused,
                message: format!(
                    "run {run}: the store socket {socket} is held by uid {}, not by this user (uid {}): not this run's owner; nothing was sent",
                    peer.uid.as_raw(),
                    me.as_raw()
                ),
            });
        }
        // A stuck owner is a fenced one within its self-fence deadline; no request should
        // wait much longer than a deadline of minutes.
        let t = Some(Duration::from_secs(300));
        let _ = stream.set_read_timeout(t);
        let _ = stream.set_write_timeout(t);
        Ok(StoreClient {
            run: run.to_string(),
            secret: secret.to_string(),
            generation,
            stream,
        })
    }

    /// Bound how long one request waits for its answer (default 300 s); a request past it
    /// fails with an I/O error saying its outcome is unknown.
    pub fn set_timeout(&self, timeout: Duration) {
        let t = Some(timeout.max(Duration::from_millis(1)));
        let _ = self.stream.set_read_timeout(t);
        let _ = self.stream.set_write_timeout(t);
    }

    /// The generation this client's requests are stamped with.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Send `op` and read its answer; a refusal becomes [`RunError::Served`] (with the
    /// owner's code and message).
    pub fn call(&mut self, op: Op) -> Result<Answer, RunError> {
        let req = Request {
            v: VERSION,
            secret: self.secret.clone(),
            generation: self.generation,
            op,
        };
        let body = serde_json::to_vec(&req)
            .map_err(|e| RunError::Io(format!("run {}: cannot encode a request: {e}", self.run)))?;
        if body.len() > MAX_FRAME {
            return Err(RunError::InvalidArgument(format!(
                "run {}: a request of {} bytes on the wire is over the store socket's limit of {MAX_FRAME} (values travel as hex: at most about 8 MiB of values per commit); nothing was sent",
                self.run,
                body.len()
            )));
        }
        let lost = |e: std::io::Error| {
            RunError::Io(format!(
                "run {}: the owner's store socket failed mid-request ({e}); a commit may or may not have been made: read the store to know",
                self.run
            ))
        };
        write_frame(&mut self.stream, &body).map_err(lost)?;
        let answer = read_frame(&mut self.stream).map_err(lost)?.ok_or_else(|| {
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
        if a.ok {
            return Ok(a);
        }
        let code = a
            .code
            .as_deref()
            .and_then(Code::parse)
            .unwrap_or(Code::Internal);
        Err(RunError::Served {
            run: self.run.clone(),
            code,
            message: a
                .message
                .unwrap_or_else(|| "refused without a message".into()),
        })
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

    /// Every document whose key starts with `prefix`, in key order.
    pub fn scan_prefix(&mut self, prefix: &str) -> Result<Vec<Document>, RunError> {
        let a = self.call(Op::List {
            prefix: prefix.to_string(),
        })?;
        let docs = a.docs.ok_or_else(|| self.malformed("docs"))?;
        docs.iter()
            .map(|d| d.to_doc().map_err(|e| self.malformed(&e)))
            .collect()
    }

    /// The commits after `since`, at most `max` (all if `None`).
    pub fn commits_since(&mut self, since: u64, max: Option<u64>) -> Result<Vec<Commit>, RunError> {
        let a = self.call(Op::Log { since, max })?;
        let commits = a.commits.ok_or_else(|| self.malformed("commits"))?;
        commits
            .iter()
            .map(|c| c.to_commit().map_err(|e| self.malformed(&e)))
            .collect()
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
        let json = serde_json::to_string(&Request {
            v: VERSION,
            secret: "s".into(),
            generation: 3,
            op: Op::Commit { writes, log },
        })
        .unwrap();
        let back: Request = serde_json::from_str(&json).unwrap();
        let Op::Commit { writes, log } = back.op else {
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
