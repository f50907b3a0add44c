//! Unit tests of the wire and the client.

use super::*;
use lease_sqlite::Batch;

/// The wire's hex is the `hex` crate's: lowercase out, either case in, anything else
/// refused (a value, log entry, nonce or proof that is not hex is refused, never guessed).
#[test]
fn the_wire_hex_refuses_what_is_not_hex() {
    let all: Vec<u8> = (0..=255).collect();
    assert_eq!(hex::decode(hex::encode(&all)).unwrap(), all);
    assert_eq!(hex::encode(b"hi"), "6869");
    assert_eq!(hex::decode("6A").unwrap(), vec![0x6a]);
    for bad in ["6", "zz", "6g", "é1"] {
        assert!(hex::decode(bad).is_err(), "{bad}");
    }
    let put = WireWrite::Put {
        put: "k".into(),
        value: "zz".into(),
    };
    assert!(
        put.to_write().is_err(),
        "a value that is not hex is refused"
    );
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
    let back: Op = serde_json::from_str(&json).unwrap();
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
    assert_eq!(nonce_of(&hex::encode(cn)), Some(cn.to_vec()));
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
