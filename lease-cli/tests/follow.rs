//! `runlease events --follow`: events appended after it started are printed as they
//! become durable, once each, in order.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn events_follow_prints_new_events_once_in_order() {
    let (_tmp, dir) = scratch();
    let d = dir.to_str().unwrap();
    let o = runlease(&[
        "run",
        d,
        "--",
        "sh",
        "-c",
        r#"runlease append "$RUNLEASE_RUN" --type first"#,
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));

    let mut follower = spawn(&["events", "--follow", "--json", d]);
    let stdout = follower.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = |what: &str| -> serde_json::Value {
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("follow printed no line for {what}"));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    assert_eq!(next("the existing event")["type"], "first");

    // Two more, each by a later owner, while the follower polls; each must show up before
    // the next is written.
    let append = |t: &str| {
        std::thread::sleep(Duration::from_millis(700));
        let script = format!(r#"runlease append "$RUNLEASE_RUN" --type {t}"#);
        let o = runlease(&["run", d, "--", "sh", "-c", &script]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    };
    append("second");
    let second = next("the second event");
    append("third");
    let third = next("the third event");
    assert_eq!(
        (&second["type"], &second["sequence"]),
        (&"second".into(), &2.into())
    );
    assert_eq!(
        (&third["type"], &third["sequence"]),
        (&"third".into(), &3.into())
    );
    assert_eq!(third["authority"], "counts", "{third}");
    // Nothing is printed twice.
    assert!(
        rx.recv_timeout(Duration::from_millis(1200)).is_err(),
        "an event was printed again"
    );
    follower.kill().unwrap();
    follower.wait().unwrap();
}
