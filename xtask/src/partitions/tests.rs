//! The checker on synthetic histories: a clean one passes, and each kind of violation is
//! found (so a figure of 0 means something).

use super::check::{Verdict, check, check_store};
use super::history::{Line, Outcome, Seen, parse, parse_events, parse_store_docs, store_written};
use super::{Mode, Scenario, parse_args};

const S: u64 = 1_000_000_000;

fn start(host: usize, generation: u64, t: u64) -> Line {
    Line::Start {
        host,
        generation,
        owner: format!("o{generation}"),
        t,
    }
}

/// An append `id` of `generation`, invoked at `t0`, completed at `t1` with `rc` and `seq`.
fn op(id: &str, generation: u64, t0: u64, t1: u64, rc: i32, seq: Option<u64>) -> [Line; 2] {
    [
        Line::Invoke {
            id: id.into(),
            host: 1,
            generation,
            t: t0,
        },
        Line::Complete {
            id: id.into(),
            outcome: Outcome::of_append(rc),
            rc,
            seq,
            t: t1,
        },
    ]
}

fn ev(seq: u64, generation: u64, id: &str, counts: bool) -> Seen {
    Seen {
        seq,
        generation,
        id: Some(id.into()),
        counts,
        pending: false,
    }
}

fn read(t0: u64, t1: u64, events: Vec<Seen>) -> Line {
    Line::Read {
        host: 2,
        t0,
        t1,
        rc: 0,
        events,
    }
}

/// Generation 1 appends a and b, generation 2 takes over and appends c.
fn clean() -> (Vec<Line>, Vec<Seen>) {
    let mut h = vec![start(1, 1, S)];
    h.extend(op("a", 1, S + 1, S + 2, 0, Some(1)));
    h.extend(op("b", 1, S + 3, S + 4, 0, Some(2)));
    h.push(read(
        S + 5,
        S + 6,
        vec![ev(1, 1, "a", true), ev(2, 1, "b", true)],
    ));
    h.push(start(2, 2, 3 * S));
    h.extend(op("c", 2, 3 * S + 1, 3 * S + 2, 0, Some(3)));
    let log = vec![
        ev(1, 1, "a", true),
        ev(2, 1, "b", true),
        ev(3, 2, "c", true),
    ];
    (h, log)
}

#[test]
fn a_clean_history_passes_with_its_figures() {
    let (mut h, log) = clean();
    h.push(Line::Exit {
        host: 1,
        rc: 75,
        t: 3 * S,
    });
    let v = check(&h, &log, (S, 4 * S));
    assert!(v.passed(), "{v:?}");
    assert_eq!((v.ops, v.acked, v.reads), (3, 3, 1));
    // One owner change: from b's acknowledgement to generation 2's start.
    assert_eq!(v.failovers_ms, vec![1999]);
    // The gap b -> c is 2 s: 1 s of it unavailable; c -> end 1 s: none.
    assert_eq!(v.unavailable_ns, S - 2);
    assert_eq!(v.run_exits.get(&75), Some(&1));
}

#[test]
fn an_acknowledged_append_missing_or_moved_is_lost() {
    let (h, mut log) = clean();
    log.retain(|e| e.id.as_deref() != Some("b"));
    let v = check(&h, &log, (S, 4 * S));
    assert_eq!(v.lost.len(), 1, "{v:?}");
    let (h, mut log) = clean();
    log[1].counts = false;
    assert_eq!(check(&h, &log, (S, 4 * S)).lost.len(), 1);
    let (h, mut log) = clean();
    log[2].seq = 9;
    assert_eq!(check(&h, &log, (S, 4 * S)).lost.len(), 1);
}

#[test]
fn a_fenced_append_that_counts_is_deposed_counted() {
    let (mut h, mut log) = clean();
    h.extend(op("d", 1, 3 * S + 3, 3 * S + 4, 75, None));
    log.push(ev(4, 1, "d", true));
    let v = check(&h, &log, (S, 4 * S));
    assert_eq!(v.deposed_counted.len(), 1, "{v:?}");
    assert!(v.deposed_counted[0].contains("FENCED"), "{v:?}");
}

#[test]
fn an_unknown_outcome_invoked_after_a_newer_start_must_not_count() {
    let (mut h, mut log) = clean();
    // Invoked after generation 2 started; the worker was killed (no completion).
    h.push(Line::Invoke {
        id: "late".into(),
        host: 1,
        generation: 1,
        t: 3 * S + 5,
    });
    log.push(ev(4, 1, "late", true));
    assert_eq!(check(&h, &log, (S, 4 * S)).deposed_counted.len(), 1);
    // The same event not counting is fine.
    log.last_mut().unwrap().counts = false;
    assert!(check(&h, &log, (S, 4 * S)).passed());
}

#[test]
fn a_read_seeing_a_fenced_append_counting_is_deposed_counted() {
    let (mut h, log) = clean();
    h.extend(op("d", 1, 2 * S, 2 * S + 1, 75, None));
    h.push(read(2 * S + 2, 2 * S + 3, vec![ev(3, 1, "d", true)]));
    let v = check(&h, &log, (S, 4 * S));
    assert!(!v.deposed_counted.is_empty(), "{v:?}");
}

#[test]
fn two_owners_in_effect_are_found() {
    // The same generation started twice.
    let (mut h, log) = clean();
    h.push(start(3, 2, 3 * S + 5));
    assert_eq!(check(&h, &log, (S, 4 * S)).double_owner.len(), 1);
    // Generation 1 acknowledged after generation 2 was: invoked after c completed.
    let (mut h, mut log) = clean();
    h.extend(op("e", 1, 3 * S + 3, 3 * S + 4, 0, Some(4)));
    log.push(ev(4, 1, "e", true));
    let v = check(&h, &log, (S, 4 * S));
    assert_eq!(v.double_owner.len(), 1, "{v:?}");
}

#[test]
fn stale_reads_are_found() {
    // Misses c, acknowledged before the read was invoked.
    let (mut h, log) = clean();
    h.push(read(
        3 * S + 5,
        3 * S + 6,
        vec![ev(1, 1, "a", true), ev(2, 1, "b", true)],
    ));
    assert_eq!(check(&h, &log, (S, 4 * S)).stale_reads.len(), 1);
    // No longer sees b counting, which an earlier read saw counting.
    let (mut h, log) = clean();
    h.push(read(2 * S, 2 * S + 1, vec![ev(1, 1, "a", true)]));
    let v = check(&h, &log, (S, 4 * S));
    assert!(
        v.stale_reads.iter().any(|s| s.contains("no longer sees")),
        "{v:?}"
    );
    // An acknowledged append shown pending (superseded, cutoff not yet written) is
    // undecided in that read, not missed; shown as not counting, it is missed.
    let (mut h, log) = clean();
    let mut b = ev(2, 1, "b", false);
    b.pending = true;
    h.push(read(
        3 * S + 5,
        3 * S + 6,
        vec![ev(1, 1, "a", true), b.clone(), ev(3, 2, "c", true)],
    ));
    let v = check(&h, &log, (S, 4 * S));
    assert!(v.passed() && v.undecided_reads == 1, "{v:?}");
    b.pending = false;
    h.pop();
    h.push(read(
        3 * S + 5,
        3 * S + 6,
        vec![ev(1, 1, "a", true), b, ev(3, 2, "c", true)],
    ));
    assert_eq!(check(&h, &log, (S, 4 * S)).stale_reads.len(), 2);
    // A read concurrent with an append may or may not see it.
    let (mut h, log) = clean();
    h.push(read(
        3 * S + 1,
        3 * S + 2,
        vec![ev(1, 1, "a", true), ev(2, 1, "b", true)],
    ));
    assert!(check(&h, &log, (S, 4 * S)).passed());
}

#[test]
fn a_counting_event_nobody_wrote_is_a_problem() {
    let (h, mut log) = clean();
    log.push(Seen {
        seq: 4,
        generation: 2,
        id: None,
        counts: true,
        pending: false,
    });
    assert_eq!(check(&h, &log, (S, 4 * S)).problems.len(), 1);
}

#[test]
fn history_lines_and_events_round_trip() {
    let (h, _) = clean();
    let text: String = h
        .iter()
        .map(|l| serde_json::to_string(l).unwrap() + "\n")
        .collect();
    assert_eq!(parse(&text).unwrap(), h);
    assert!(parse("{\"k\":\"nope\"}\n").is_err());
    let events = "{\"sequence\":3,\"generation\":2,\"authoritative\":true,\"payload\":{\"id\":\"c\"}}\n\
                  {\"sequence\":4,\"generation\":2,\"authoritative\":false}\n";
    let seen = parse_events(events).unwrap();
    assert_eq!(seen[0], ev(3, 2, "c", true));
    assert_eq!(seen[1].id, None);
    assert!(parse_events("{\"sequence\":1}\n").is_err());
}

#[test]
fn arguments_parse_and_bad_ones_are_refused() {
    let a = |v: &[&str]| parse_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    match a(&[
        "--trials",
        "5",
        "--seed",
        "7",
        "--scenario",
        "heal",
        "--no-pre-vote",
    ]) {
        Ok(Mode::Drive(o)) => {
            assert_eq!(
                (o.trials, o.seed, o.scenario, o.pre_vote),
                (5, 7, Scenario::Heal, false)
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(a(&["--trials", "0"]).is_err());
    assert!(a(&["--seconds", "1"]).is_err());
    assert!(a(&["--scenario", "chaos"]).is_err());
    assert!(a(&["--worker", "--host", "1"]).is_err());
    let worker = [
        "--worker",
        "--host",
        "2",
        "--history",
        "h",
        "--runlease",
        "r",
        "--until",
        "9",
    ];
    match a(&worker) {
        Ok(Mode::Worker(w)) => assert!(w.host == 2 && w.releases, "{w:?}"),
        other => panic!("{other:?}"),
    }
    match a(&[&worker[..], &["--no-release"]].concat()) {
        Ok(Mode::Worker(w)) => assert!(!w.releases, "{w:?}"),
        other => panic!("{other:?}"),
    }
    assert!(a(&["--bogus"]).is_err());
}

/// A store write `key` = `v-<key>` of `generation`, invoked at `t0`, completed at `t1`
/// with `rc` (`None`: never completed, its worker killed).
fn put(key: &str, generation: u64, t0: u64, t1: u64, rc: Option<i32>) -> Vec<Line> {
    let mut l = vec![Line::StoreInvoke {
        key: key.into(),
        value: format!("v-{key}"),
        host: 1,
        generation,
        t: t0,
    }];
    if let Some(rc) = rc {
        l.push(Line::StoreComplete {
            key: key.into(),
            outcome: Outcome::of_store(rc),
            rc,
            code: (rc == 75).then(|| "FENCED".to_string()),
            seq: (rc == 0).then_some(1),
            t: t1,
        });
    }
    l
}

/// A final store read from `host` holding `keys`, each with its write's value.
fn store_read(host: usize, keys: &[&str]) -> Line {
    Line::StoreRead {
        host,
        t0: 9 * S,
        t1: 9 * S + 1,
        rc: 0,
        docs: keys
            .iter()
            .map(|k| (k.to_string(), format!("v-{k}")))
            .collect(),
    }
}

/// Generation 1 puts a (acknowledged), generation 2 takes over and puts c
/// (acknowledged); generation 1's b was answered FENCED, u1 and u2 are unknown (u1
/// `OUTCOME_UNKNOWN`, u2 never completed), both invoked before generation 2 started.
fn store_history() -> Vec<Line> {
    let mut h = vec![start(1, 1, S)];
    h.extend(put("a", 1, S + 1, S + 2, Some(0)));
    h.extend(put("u1", 1, S + 3, S + 4, Some(71)));
    h.extend(put("u2", 1, S + 5, 0, None));
    h.push(start(2, 2, 3 * S));
    h.extend(put("b", 1, 2 * S, 3 * S + 1, Some(75)));
    h.extend(put("c", 2, 3 * S + 2, 3 * S + 3, Some(0)));
    h
}

fn judge(h: &[Line]) -> Verdict {
    let mut v = Verdict::default();
    check_store(h, &mut v);
    v
}

#[test]
fn store_writes_acknowledged_and_read_back_pass_with_their_figures() {
    let mut h = store_history();
    h.push(store_read(1, &["a", "c"]));
    h.push(store_read(3, &["a", "c"]));
    let v = judge(&h);
    assert!(v.passed(), "{v:?}");
    assert_eq!(
        (
            v.store_ops,
            v.store_acked,
            v.store_fenced,
            v.store_unknown,
            v.store_reads
        ),
        (5, 2, 1, 2, 2)
    );
}

#[test]
fn acknowledged_store_writes_count_for_availability_and_failover() {
    // The clean history's 2 s gap between b and c, with a store write of generation 1
    // acknowledged in it at 2 s: gaps under 1 s, and the failover measured from it.
    let (mut h, log) = clean();
    h.extend(put("s", 1, 2 * S + 1, 2 * S + 2, Some(0)));
    let v = check(&h, &log, (S, 4 * S));
    assert!(v.passed(), "{v:?}");
    assert_eq!((v.unavailable_ns, v.failovers_ms.clone()), (0, vec![999]));
    // Unknown or fenced, it counts for neither.
    let (mut h, log) = clean();
    h.extend(put("s", 1, 2 * S + 1, 2 * S + 2, Some(71)));
    let v = check(&h, &log, (S, 4 * S));
    assert_eq!((v.unavailable_ns, v.failovers_ms), (S - 2, vec![1999]));
}

#[test]
fn an_acknowledged_store_write_missing_or_changed_is_lost() {
    // Missing from one of the final reads: lost once, naming that host.
    let mut h = store_history();
    h.push(store_read(1, &["a", "c"]));
    h.push(store_read(2, &["c"]));
    let v = judge(&h);
    assert_eq!(v.store_lost.len(), 1, "{v:?}");
    assert!(v.store_lost[0].contains("h2 has no such key"), "{v:?}");
    // Missing from every read: still one finding.
    let mut h = store_history();
    h.push(store_read(1, &["c"]));
    h.push(store_read(2, &["c"]));
    assert_eq!(judge(&h).store_lost.len(), 1);
    // Present with another value.
    let mut h = store_history();
    let mut r = store_read(1, &["a", "c"]);
    if let Line::StoreRead { docs, .. } = &mut r {
        docs.insert("a".into(), "v-other".into());
    }
    h.push(r);
    let v = judge(&h);
    assert_eq!(v.store_lost.len(), 1, "{v:?}");
    assert!(!v.passed());
}

#[test]
fn a_fenced_store_write_found_in_the_store_is_deposed_counted() {
    let mut h = store_history();
    h.push(store_read(1, &["a", "b", "c"]));
    let v = judge(&h);
    assert_eq!(v.store_deposed_counted.len(), 1, "{v:?}");
    assert!(v.store_deposed_counted[0].contains("FENCED"), "{v:?}");
    assert!(v.store_lost.is_empty() && !v.passed(), "{v:?}");
    // Refused by the socket (77) is as definite.
    let mut h = vec![start(1, 1, S)];
    h.extend(put("r", 1, S + 1, S + 2, Some(77)));
    h.push(store_read(1, &["r"]));
    assert_eq!(judge(&h).store_deposed_counted.len(), 1);
}

#[test]
fn a_store_write_of_unknown_outcome_may_be_there_or_not() {
    for keys in [
        &["a", "c"][..],
        &["a", "u1", "c"],
        &["a", "u2", "c"],
        &["a", "u1", "u2", "c"],
    ] {
        let mut h = store_history();
        h.push(store_read(2, keys));
        let v = judge(&h);
        assert!(v.passed(), "{keys:?}: {v:?}");
    }
}

#[test]
fn a_store_write_invoked_after_a_newer_start_must_not_be_there() {
    let mut h = store_history();
    // Generation 1, invoked after generation 2 started; outcome unknown.
    h.extend(put("late", 1, 3 * S + 5, 0, None));
    h.push(store_read(1, &["a", "c", "late"]));
    let v = judge(&h);
    assert_eq!(v.store_deposed_counted.len(), 1, "{v:?}");
    let mut h = store_history();
    h.extend(put("late", 1, 3 * S + 5, 0, None));
    h.push(store_read(1, &["a", "c"]));
    assert!(judge(&h).passed());
}

#[test]
fn store_reads_that_fail_or_show_strangers_are_problems() {
    // No final read at all.
    let v = judge(&store_history());
    assert_eq!(v.problems.len(), 1, "{v:?}");
    // A free run refused on one host, read on another.
    let mut h = store_history();
    h.push(Line::StoreRead {
        host: 2,
        t0: 9 * S,
        t1: 9 * S + 1,
        rc: 65,
        docs: Default::default(),
    });
    h.push(store_read(1, &["a", "c"]));
    let v = judge(&h);
    assert_eq!((v.problems.len(), v.store_reads), (1, 1), "{v:?}");
    assert!(v.problems[0].contains("exited 65"), "{v:?}");
    // A key nobody wrote.
    let mut h = store_history();
    h.push(store_read(1, &["a", "c", "stranger"]));
    assert_eq!(judge(&h).problems.len(), 1);
}

#[test]
fn store_outputs_parse() {
    let docs = "{\"schema\":\"runlease/cli/store-doc/1\",\"ok\":true,\"run\":\"r\",\"key\":\"a\",\"value\":\"x\",\"updated_seq\":3}\n\
                {\"schema\":\"runlease/cli/store-doc/1\",\"ok\":true,\"run\":\"r\",\"key\":\"b\",\"value_hex\":\"ff00\",\"updated_seq\":4}\n";
    let d = parse_store_docs(docs).unwrap();
    assert_eq!(d.get("a").map(String::as_str), Some("x"));
    assert_eq!(d.get("b").map(String::as_str), Some("hex:ff00"));
    assert!(parse_store_docs("{\"schema\":\"runlease/cli/store-doc/1\",\"key\":\"a\"}\n").is_err());
    assert!(parse_store_docs("not json\n").is_err());
    assert_eq!(
        store_written(b"{\"schema\":\"runlease/cli/store-write/1\",\"ok\":true,\"seq\":7}\n"),
        (Some(7), None)
    );
    assert_eq!(
        store_written(b"{\"ok\":false,\"code\":\"FENCED\",\"exit_code\":75}\n"),
        (None, Some("FENCED".into()))
    );
    assert_eq!(store_written(b""), (None, None));
    // Store lines round trip through the history.
    let mut h = store_history();
    h.push(store_read(1, &["a"]));
    let text: String = h
        .iter()
        .map(|l| serde_json::to_string(l).unwrap() + "\n")
        .collect();
    assert_eq!(parse(&text).unwrap(), h);
}
