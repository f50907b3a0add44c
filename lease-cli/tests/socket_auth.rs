//! The store socket's handshake seen from `runlease store` (issue #29): an impostor of this
//! user holding the socket's name is refused and sent nothing secret; an environment whose
//! `RUNLEASE_RUN` names another run than its socket serves is refused (64) naming both, and
//! nothing is written to either; `store list` and `store log` inside a command read answers
//! larger than one frame a page at a time.

mod common;

use common::*;
use std::os::linux::net::SocketAddrExt;
use std::path::Path;
use std::time::Duration;

/// An impostor (this user, no secret) bound to a name: it plays the whole protocol but for
/// the proof it cannot make (a made-up challenge, then a welcome naming `run`, then
/// protocol 1's answer to a commit, `committed #424242`, to anything); returns the name
/// and what it received.
fn impostor(run: &Path) -> (String, std::thread::JoinHandle<Vec<u8>>) {
    use std::os::unix::fs::MetadataExt;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = format!("runlease-store-impostor{}x{nanos}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let m = std::fs::metadata(run).unwrap();
    let answers = [
        format!(
            r#"{{"v":2,"nonce":"{}","proof":"{}"}}"#,
            "11".repeat(32),
            "22".repeat(32)
        ),
        format!(
            r#"{{"ok":true,"run":{:?},"root":[{},{}],"generation":1}}"#,
            run.display().to_string(),
            m.dev(),
            m.ino()
        ),
        r#"{"ok":true,"seq":424242,"generation":1}"#.to_string(),
    ];
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        let mut i = 0;
        while let Ok(n) = std::io::Read::read(&mut s, &mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
            let a = answers[i.min(2)].as_bytes();
            i += 1;
            let mut f = u32::try_from(a.len()).unwrap().to_be_bytes().to_vec();
            f.extend_from_slice(a);
            if std::io::Write::write_all(&mut s, &f).is_err() {
                break;
            }
        }
        got
    });
    (format!("@{name}"), t)
}

#[test]
fn an_impostor_holding_the_socket_name_is_refused_and_sent_nothing_secret() {
    let (_tmp, dir) = scratch();
    let run = dir.join("job");
    std::fs::create_dir_all(&run).unwrap();
    let d = run.to_str().unwrap();
    let (socket, fake) = impostor(&run);
    let secret = "5ec2e75ec2e75ec2e75ec2e75ec2e7aa";
    let o = cmd(&["store", "put", d, "the-key", "the-value"])
        .env("RUNLEASE_STORE_SOCKET", &socket)
        .env("RUNLEASE_RUN", d)
        .env("RUNLEASE_GENERATION", "1")
        .env("RUNLEASE_INCARNATION", secret)
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(77), "{err}");
    assert!(err.contains("STORE_REQUEST_REFUSED"), "{err}");
    assert!(err.contains("did not prove"), "{err}");
    assert!(err.contains("nothing secret was sent"), "{err}");
    assert!(
        !text(&o.stdout).contains("committed"),
        "{}",
        text(&o.stdout)
    );
    let got = fake.join().unwrap();
    let seen = String::from_utf8_lossy(&got);
    let len = u32::from_be_bytes(got[..4].try_into().unwrap()) as usize;
    assert_eq!(len, got.len() - 4, "one frame, the hello: {seen}");
    let hello: serde_json::Value = serde_json::from_slice(&got[4..]).unwrap();
    let keys: Vec<&str> = hello
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["generation", "nonce", "v"], "{seen}");
    for secretish in [secret, "the-key", "the-value", "746865", "proof", "secret"] {
        assert!(
            !seen.contains(secretish),
            "the impostor received {secretish}: {seen}"
        );
    }
}

#[test]
fn a_command_whose_runlease_run_names_another_run_is_refused_naming_both() {
    let (tmp, dir) = scratch();
    let (a, b) = (dir.join("run-a"), dir.join("run-b"));
    let (da, db) = (a.to_str().unwrap(), b.to_str().unwrap());
    let o = runlease(&[
        "run", "-q", db, "--", "runlease", "store", "put", db, "k", "b",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = tmp.path().join("out");
    let script = format!(
        r#"RUNLEASE_RUN='{db}' runlease store put '{db}' k from-a > '{o}.stdout' 2> '{o}.stderr'; echo $? > '{o}.rc'"#,
        o = out.display()
    );
    let o = runlease(&["run", "-q", da, "--", "sh", "-c", &script]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let read = |ext: &str| std::fs::read_to_string(format!("{}.{ext}", out.display())).unwrap();
    let err = read("stderr");
    assert_eq!(read("rc").trim(), "64", "{err}");
    assert!(err.contains("ARGUMENT_INVALID"), "{err}");
    assert!(
        err.contains(&format!("RUNLEASE_RUN names run {db}")),
        "{err}"
    );
    assert!(err.contains(&format!("serves run {da}")), "{err}");
    assert!(
        read("stdout").is_empty(),
        "nothing printed: {}",
        read("stdout")
    );
    // Nothing was written to either run.
    let o = runlease(&["store", "log", da, "--json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(json_lines(&o).is_empty(), "run A has no commit");
    let o = runlease(&["store", "get", db, "k"]);
    assert_eq!((o.status.code(), o.stdout.as_slice()), (Some(0), &b"b"[..]));
}

/// Six values of 1.5 MiB: `list` and `log` answers of 18 MiB as hex, more than one frame.
#[test]
fn list_and_log_inside_a_command_read_answers_beyond_one_frame() {
    let (tmp, dir) = scratch();
    let run = dir.join("big");
    let d = run.to_str().unwrap();
    let out = tmp.path().join("out");
    let script = format!(
        r#"set -e
for i in 1 2 3 4 5 6; do head -c 1572864 /dev/zero | tr '\0' "$i" | runlease store put "$RUNLEASE_RUN" "big/$i" - > /dev/null; done
runlease store list "$RUNLEASE_RUN" big/ > '{o}.list'
runlease store log "$RUNLEASE_RUN" --json > '{o}.log'"#,
        o = out.display()
    );
    let o = runlease(&["run", "-q", d, "--", "sh", "-c", &script]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let list = std::fs::read_to_string(format!("{}.list", out.display())).unwrap();
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 6);
    for (i, l) in lines.iter().enumerate() {
        let (k, v) = l.split_once('\t').unwrap();
        assert_eq!(k, format!("big/{}", i + 1));
        assert_eq!(v.len(), 1_572_864);
        assert!(v.bytes().all(|b| b == b'1' + u8::try_from(i).unwrap()));
    }
    let log = std::fs::read_to_string(format!("{}.log", out.display())).unwrap();
    let seqs: Vec<u64> = log
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6]);
}
