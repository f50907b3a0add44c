//! Unit tests of the checker, the history and event parsers and the arguments, on
//! synthetic histories.

use super::check::*;
use super::*;

fn start(g: u64, owner: &str, t: u64) -> Start {
    Start {
        slot: g,
        round: 1,
        generation: g,
        owner: owner.into(),
        t,
    }
}

fn att(g: u64, owner: &str, n: u64, rc: i32, seq: Option<u64>, t0: u64) -> Attempt {
    Attempt {
        slot: g,
        round: 1,
        n,
        generation: g,
        owner: owner.into(),
        rc,
        seq,
        t0,
        t1: t0 + 5,
    }
}

fn ev(a: &Attempt, sequence: u64, counts: bool) -> LogEvent {
    LogEvent {
        sequence,
        generation: a.generation,
        owner: a.owner.clone(),
        counts,
        authority: if counts { "counts" } else { "past_cutoff" }.into(),
        key: Some(a.key()),
    }
}

/// Assert that some overlap `v` found mentions `what` (the whole verdict shown if none does).
#[track_caller]
fn assert_overlap(v: &Verdict, what: &str) {
    assert!(v.overlaps.iter().any(|o| o.contains(what)), "{v:?}");
}

/// Two tenures: generation 1 appends twice (acked), a fenced third attempt whose
/// event stays on disk past the cutoff, then generation 3 appends once.
fn clean() -> (History, Vec<LogEvent>) {
    let a1 = att(1, "A", 1, 0, Some(1), 100);
    let a2 = att(1, "A", 2, 0, Some(2), 200);
    let a3 = att(1, "A", 3, FENCED, None, 250);
    let b1 = att(3, "B", 1, 0, Some(4), 400);
    let events = vec![
        ev(&a1, 1, true),
        ev(&a2, 2, true),
        ev(&a3, 3, false),
        ev(&b1, 4, true),
    ];
    let h = History {
        starts: vec![start(1, "A", 50), start(3, "B", 300)],
        attempts: vec![a1, a2, a3, b1],
    };
    (h, events)
}

#[test]
fn clean_history_passes() {
    let (h, e) = clean();
    let v = check(&h, &e);
    assert!(
        v.lost.is_empty() && v.overlaps.is_empty() && v.problems.is_empty(),
        "{v:?}"
    );
}

#[test]
fn missing_or_uncounted_acknowledged_event_is_lost() {
    let (h, mut e) = clean();
    e.remove(1);
    assert_eq!(check(&h, &e).lost.len(), 1);
    let (h, mut e) = clean();
    e[0].counts = false;
    assert_eq!(check(&h, &e).lost.len(), 1);
    let (h, mut e) = clean();
    e[3].sequence = 9;
    assert_eq!(
        check(&h, &e).lost.len(),
        1,
        "acknowledged with another sequence"
    );
}

#[test]
fn fenced_event_that_counts_is_an_overlap() {
    let (h, mut e) = clean();
    e[2].counts = true;
    let v = check(&h, &e);
    assert_overlap(&v, "fenced append counts");
}

#[test]
fn acknowledged_write_after_a_newer_tenure_began_is_an_overlap() {
    let (mut h, mut e) = clean();
    // A zombie write of generation 1, acknowledged, after generation 3 started (t=300)
    // and after its acknowledged append ended (t=405).
    let z = att(1, "A", 4, 0, Some(5), 500);
    e.push(ev(&z, 5, true));
    h.attempts.push(z);
    let v = check(&h, &e);
    assert_overlap(&v, "tenure of generation Some(3)");
    assert_overlap(&v, "acknowledged append of generation");
    assert_overlap(&v, "generation-monotone");
}

#[test]
fn two_owners_of_one_generation_is_an_overlap() {
    let (mut h, mut e) = clean();
    h.starts.push(start(3, "C", 350));
    let c = Attempt {
        owner: "C".into(),
        n: 7,
        ..att(3, "C", 7, 0, Some(5), 360)
    };
    e.push(ev(&c, 5, true));
    h.attempts.push(c);
    let v = check(&h, &e);
    assert_overlap(&v, "two tenures");
    assert_overlap(&v, "two owners");
}

#[test]
fn history_lines_parse_and_malformed_lines_are_refused() {
    let text = "start slot=0 round=1 gen=1 owner=A pid=9 t=5\n\
                append slot=0 round=1 n=1 gen=1 owner=A rc=0 seq=1 t0=6 t1=7\n\
                append slot=0 round=1 n=2 gen=1 owner=A rc=75 seq=- t0=8 t1=9\n";
    let h = parse_history(text).expect("parses");
    assert_eq!(h.starts.len(), 1);
    assert_eq!(h.attempts[0].seq, Some(1));
    assert_eq!(h.attempts[1].seq, None);
    assert_eq!(h.attempts[1].rc, FENCED);
    assert!(parse_history("append slot=0 round=1\n").is_err());
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn arguments_parse_and_bad_ones_are_refused() {
    match parse_args(&args(&["--procs", "8", "--seconds", "600", "--seed", "7"])) {
        Ok(Mode::Drive(o)) => {
            assert_eq!(
                (o.procs, o.seconds, o.seed, o.inject_lost),
                (8, 600, 7, false)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(parse_args(&args(&["--procs", "0"])).is_err());
    assert!(parse_args(&args(&["--seconds", "x"])).is_err());
    assert!(parse_args(&args(&["--procs"])).is_err());
    assert!(parse_args(&args(&["--bogus"])).is_err());
    assert!(
        parse_args(&args(&["--worker", "--slot", "1"])).is_err(),
        "worker needs all"
    );
    let w = args(&[
        "--worker",
        "--slot",
        "1",
        "--round",
        "2",
        "--history",
        "h",
        "--runlease",
        "r",
    ]);
    assert!(matches!(parse_args(&w), Ok(Mode::Worker(_))));
}

#[test]
fn events_json_parses() {
    let line = r#"{"authoritative":false,"authority":"past_cutoff","cutoff":3,"generation":1,"owner_id":"A","payload":{"slot":2,"round":4,"n":5},"sequence":7}"#;
    let e = parse_events(line).expect("parses");
    assert_eq!(e[0].key, Some((2, 4, 5)));
    assert!(!e[0].counts);
    assert_eq!(e[0].sequence, 7);
}
