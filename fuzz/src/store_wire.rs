//! `store_wire`: arbitrary bytes into the store socket's wire parser (issue #20,
//! `lease_run::store_socket`), what the owner reads from any local process that connects.
//!
//! - Frames: the input read as a connection's byte stream, frame after frame, gives what a
//!   model of the format says: `None` only at a clean end (nothing left), an `InvalidData`
//!   error for a length above [`MAX_FRAME`] with the body left unread, an `UnexpectedEof`
//!   for a cut length or body, and otherwise exactly the announced bytes, which
//!   `write_frame` frames back to exactly the bytes consumed. Every body is also checked as
//!   a request (below).
//! - Requests: `serde_json` never panics on a [`Op`]; one that parses serializes, and
//!   the writer's output parses again and serializes to the same bytes (one canonical
//!   form: whatever a client writes, the owner reads).
//! - Commits: a commit's writes and log either are refused by `batch_of` because some value
//!   or log entry is not hex, or give a batch that goes through `commit_op`, the wire and
//!   `batch_of` again unchanged; on the wire every value and log entry is then lowercase
//!   hex of even length, and the writes and log are the input's with their hex lowercased.
//! - Hex (the `hex` crate, as the wire uses it): `hex::decode` accepts exactly the strings of
//!   even length made of ASCII hex digits (of either case), and `hex::encode` of what it
//!   gives is the lowercased input; `decode(encode(b)) == b`.
//! - Handshake: a [`Hello`], [`Challenge`] or [`Proof`] (the frames before authentication)
//!   never panics the parser; a hello or proof that parses round-trips; a nonce is taken
//!   only at exactly [`NONCE_LEN`] bytes.
//! - Answers: an [`Answer`] (what the client reads from the owner) never panics the parser,
//!   and one that parses serializes to bytes that parse again.

use lease_run::store_socket::{
    Answer, Challenge, Hello, MAX_FRAME, NONCE_LEN, Op, Proof, WireWrite, batch_of, commit_op,
    nonce_of, read_frame, write_frame,
};
use std::io::ErrorKind;

/// Whether `s` is what the wire's hex decoding must accept: even length, ASCII hex digits only.
fn is_hex(s: &str) -> bool {
    s.len().is_multiple_of(2) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether `s` is what `hex` writes: even length, `0-9a-f` only.
fn is_lower_hex(s: &str) -> bool {
    s.len().is_multiple_of(2) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The input as the byte stream of one connection, read frame by frame.
fn frames(data: &[u8]) {
    let mut stream: &[u8] = data;
    loop {
        // What the format says the next read gives, from what is left.
        let rest = stream;
        let got = read_frame(&mut stream);
        let Some(prefix) = rest.first_chunk::<4>() else {
            if rest.is_empty() {
                assert!(
                    matches!(got, Ok(None)),
                    "a clean end of stream read as {got:?}"
                );
            } else {
                let e = got.expect_err("a cut length prefix was accepted");
                assert_eq!(
                    e.kind(),
                    ErrorKind::UnexpectedEof,
                    "a cut length prefix: {e}"
                );
            }
            return;
        };
        let n = u32::from_be_bytes(*prefix) as usize;
        let body = &rest[4..];
        if n > MAX_FRAME {
            let e = got.expect_err("a frame over MAX_FRAME was accepted");
            assert_eq!(e.kind(), ErrorKind::InvalidData, "an oversized frame: {e}");
            let _ = e.to_string();
            // Refused, never read: only the length was consumed.
            assert_eq!(
                stream.len(),
                body.len(),
                "an oversized frame's body was read"
            );
            return;
        }
        if body.len() < n {
            let e = got.expect_err("a cut body was accepted");
            assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "a cut body: {e}");
            return;
        }
        let frame = match got {
            Ok(Some(f)) => f,
            other => panic!("a whole frame of {n} bytes read as {other:?}"),
        };
        assert_eq!(frame.len(), n, "a frame's body is not the announced length");
        assert!(frame == body[..n], "a frame's body is not the bytes sent");
        assert_eq!(
            stream.len(),
            body.len() - n,
            "reading a frame consumed more or less than the frame"
        );
        let mut again = Vec::new();
        write_frame(&mut again, &frame).expect("a frame read back is writable");
        assert!(
            again == rest[..4 + n],
            "write_frame does not give back the frame read"
        );
        request(&frame);
    }
}

/// A commit's writes and log, through `batch_of`, the wire and back.
fn commit(writes: &[WireWrite], log: &[String]) {
    let batch = match batch_of(writes, log) {
        Ok(b) => b,
        Err(e) => {
            let not_hex = writes
                .iter()
                .any(|w| matches!(w, WireWrite::Put { value, .. } if !is_hex(value)))
                || log.iter().any(|l| !is_hex(l));
            assert!(not_hex, "batch_of refused a commit that is all hex: {e}");
            return;
        }
    };
    let sent: Op = commit_op(&batch);
    let bytes = serde_json::to_vec(&sent).expect("a commit request serializes");
    let back: Op = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => panic!(
            "a commit request as written does not parse: {e}\n{}",
            String::from_utf8_lossy(&bytes)
        ),
    };
    let Op::Commit {
        writes: wire_writes,
        log: wire_log,
    } = back
    else {
        panic!(
            "a commit request parses as another op: {:?}\n{}",
            back,
            String::from_utf8_lossy(&bytes)
        );
    };
    for w in &wire_writes {
        if let WireWrite::Put { put, value } = w {
            assert!(
                is_lower_hex(value),
                "the value of {put:?} goes on the wire as {value:?}, not lowercase hex"
            );
        }
    }
    for l in &wire_log {
        assert!(
            is_lower_hex(l),
            "a log entry goes on the wire as {l:?}, not lowercase hex"
        );
    }
    let lowered: Vec<WireWrite> = writes
        .iter()
        .map(|w| match w {
            WireWrite::Put { put, value } => WireWrite::Put {
                put: put.clone(),
                value: value.to_ascii_lowercase(),
            },
            WireWrite::Delete { .. } => w.clone(),
        })
        .collect();
    assert_eq!(wire_writes, lowered, "the writes changed on the wire");
    let lowered: Vec<String> = log.iter().map(|l| l.to_ascii_lowercase()).collect();
    assert_eq!(wire_log, lowered, "the log changed on the wire");
    match batch_of(&wire_writes, &wire_log) {
        Ok(b) => assert_eq!(b, batch, "a batch changed across the wire"),
        Err(e) => panic!("a batch as written is refused by batch_of: {e}"),
    }
}

/// The input as one request's JSON.
fn request(data: &[u8]) {
    let Ok(req) = serde_json::from_slice::<Op>(data) else {
        return;
    };
    // The writer's output is readable, and canonical.
    let bytes = serde_json::to_vec(&req).expect("a parsed request serializes");
    let again: Op = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => panic!(
            "a request as written does not parse: {e}\n input: {:?}\noutput: {:?}",
            String::from_utf8_lossy(data),
            String::from_utf8_lossy(&bytes)
        ),
    };
    let bytes2 = serde_json::to_vec(&again).expect("a parsed request serializes");
    assert!(
        bytes == bytes2,
        "a request changes across a round trip\n first: {:?}\nsecond: {:?}",
        String::from_utf8_lossy(&bytes),
        String::from_utf8_lossy(&bytes2)
    );
    if let Op::Commit { writes, log } = &req {
        commit(writes, log);
    }
}

/// The input as each handshake frame (what the owner reads before authentication, from
/// anyone of its user): parsing never panics, a frame that parses round-trips, and a nonce
/// is accepted only at its exact length.
fn handshake(data: &[u8]) {
    if let Ok(h) = serde_json::from_slice::<Hello>(data) {
        let back: Hello = serde_json::from_slice(&serde_json::to_vec(&h).expect("hello"))
            .expect("a hello as written parses");
        assert_eq!(
            (back.v, back.generation, &back.nonce),
            (h.v, h.generation, &h.nonce)
        );
        if let Some(n) = nonce_of(&h.nonce) {
            assert_eq!(n.len(), NONCE_LEN, "a nonce of another length");
        }
    }
    if let Ok(p) = serde_json::from_slice::<Proof>(data) {
        let back: Proof = serde_json::from_slice(&serde_json::to_vec(&p).expect("proof"))
            .expect("a proof as written parses");
        assert_eq!(back.proof, p.proof);
    }
    let _ = serde_json::from_slice::<Challenge>(data);
}

/// The input as an answer's JSON (what the client reads).
fn answer(data: &[u8]) {
    let Ok(a) = serde_json::from_slice::<Answer>(data) else {
        return;
    };
    let bytes = serde_json::to_vec(&a).expect("a parsed answer serializes");
    if let Err(e) = serde_json::from_slice::<Answer>(&bytes) {
        panic!(
            "an answer as written does not parse: {e}\n{}",
            String::from_utf8_lossy(&bytes)
        );
    }
}

/// The input as hex text, and as bytes to hex.
fn hex_text(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    match hex::decode(s.as_bytes()).ok() {
        Some(bytes) => {
            assert!(is_hex(&s), "hex::decode accepted {s:?}");
            assert_eq!(bytes.len() * 2, s.len(), "hex::decode of {s:?}");
            assert_eq!(
                hex::encode(&bytes),
                s.to_ascii_lowercase(),
                "hex::decode of {s:?}"
            );
        }
        None => assert!(!is_hex(&s), "hex::decode refused hex {s:?}"),
    }
    let h = hex::encode(data);
    assert!(
        is_lower_hex(&h) && h.len() == 2 * data.len(),
        "hex::encode wrote {h:?}"
    );
    assert_eq!(
        hex::decode(&h).ok().as_deref(),
        Some(data),
        "decode(encode(b)) != b"
    );
}

/// The check of the `store_wire` target.
pub fn check(data: &[u8]) {
    frames(data);
    handshake(data);
    request(data);
    answer(data);
    hex_text(data);
}
