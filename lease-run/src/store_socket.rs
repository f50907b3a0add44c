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

mod client;
#[cfg(test)]
mod tests;
mod wire;

pub use client::*;
pub use wire::*;
