//! The engine-committed store's step machines (PROTOCOL.md §18, issue #32) against the
//! in-memory authority, whose `CreateGuarded` is one atomic step as etcd's transaction is.
//!
//! What is shown: a commit is acknowledged only when its record was created; a deposed
//! generation's record is refused and never lands; an unanswered commit is resolved by
//! the same record in the same slot (committed, or fenced, never both, never a second
//! record); the reader refuses a log that breaks its rules and tells a truncation under it
//! from damage; snapshots round-trip and anchor the chain. A property test runs random
//! schedules of owners, takeovers and lost answers and checks that every answer agrees
//! with the final log.

mod common;

use common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::store_log::*;
use lease_core::*;
use proptest::prelude::*;

fn seq(n: u64) -> Sequence {
    Sequence::new(n).unwrap()
}

fn batch(id_: &str, key: &str, value: &[u8]) -> RecordBatch {
    RecordBatch {
        id: id(id_),
        writes: vec![RecordWrite {
            key: key.into(),
            value: Some(Blob(value.to_vec())),
        }],
        log: vec![Blob(format!("{id_} done").into_bytes())],
    }
}

fn params(tail: &StoreTail, batches: Vec<RecordBatch>) -> CommitParams {
    CommitParams {
        tail: tail.clone(),
        batches,
        now: t(500),
        budget: DEFAULT_BUDGET_BYTES,
    }
}

fn commit(
    d: &mut MemDisk,
    l: &OwnedLease,
    tail: &StoreTail,
    b: Vec<RecordBatch>,
) -> Result<Committed, LeaseError> {
    d.run(&mut CommitRecord::new(l, params(tail, b))?, &all_alive)
}

fn read_log(d: &mut MemDisk, as_of: Option<Generation>) -> Result<StoreLogView, LeaseError> {
    d.run(&mut ReadStoreLog::new(run_id(), as_of, 0), &all_alive)
}

fn records(d: &MemDisk) -> Vec<u64> {
    d.files
        .keys()
        .filter_map(|f| match f {
            FileRef::StoreRecord(s) => Some(s.get()),
            _ => None,
        })
        .collect()
}

/// A run whose owner `a` (generation 1) committed `n` records of one batch each.
fn owner_with(n: u64) -> (MemDisk, OwnedLease, StoreTail) {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    let mut tail = StoreTail::default();
    for i in 1..=n {
        tail = commit(&mut d, &l, &tail, vec![batch(&format!("c{i}"), "k", b"v")])
            .unwrap()
            .tail;
    }
    (d, l, tail)
}

#[test]
fn commits_chain_and_read_back_as_they_were_acknowledged() {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    let mut tail = StoreTail::default();
    let mut acked = Vec::new();
    for i in 1..=3u64 {
        let bs = (0..i)
            .map(|j| batch(&format!("c{i}-{j}"), &format!("k{j}"), b"v"))
            .collect();
        let c = commit(&mut d, &l, &tail, bs).unwrap();
        assert_eq!(c.sequence.get(), i);
        acked.push(c.clone());
        tail = c.tail;
    }
    // Commits are numbered across records: 1, 2-3, 4-6.
    assert_eq!(
        acked
            .iter()
            .map(|c| c.first_commit.get())
            .collect::<Vec<_>>(),
        [1, 2, 4]
    );
    let view = read_log(&mut d, Some(l.generation)).unwrap();
    assert_eq!(view.tail, tail);
    assert_eq!(view.tail.commits, 6);
    assert_eq!(view.records.len(), 3);
    for (r, c) in view.records.iter().zip(&acked) {
        assert_eq!((r.record.sequence, &r.hash), (c.sequence, &c.hash));
    }
    // Keeping only what a view lacks: records 1-2 checked, not returned.
    let partial = d
        .run(&mut ReadStoreLog::new(run_id(), None, 2), &all_alive)
        .unwrap();
    assert_eq!(partial.records.len(), 1);
    assert_eq!(partial.hash_at_keep_after, Some(acked[1].hash.clone()));
    assert_eq!(partial.tail, tail);
}

#[test]
fn a_deposed_generations_commit_is_fenced_and_nothing_is_written() {
    let (mut d, a, tail) = owner_with(2);
    release(&mut d, &a, 100).unwrap();
    let b = claim(&mut d, "b", 2, 200).unwrap();
    let before = d.files.clone();
    let e = commit(&mut d, &a, &tail, vec![batch("late", "k", b"zombie")]).unwrap_err();
    assert_eq!(e.code(), Code::Fenced, "{e}");
    assert_eq!(d.files, before, "the guard wrote nothing");
    // The new owner builds on the same tail and is accepted.
    let c = commit(&mut d, &b, &tail, vec![batch("b1", "k", b"new")]).unwrap();
    assert_eq!(c.sequence.get(), 3);
    // And the deposed owner now finds the slot taken by a newer generation: still FENCED.
    let e = commit(&mut d, &a, &tail, vec![batch("late", "k", b"zombie")]).unwrap_err();
    assert_eq!(e.code(), Code::Fenced, "{e}");
    let view = read_log(&mut d, Some(b.generation)).unwrap();
    assert_eq!(view.records.len(), 3);
    // An owner reading a log that holds a newer generation's record learns it is deposed.
    let e = read_log(&mut d, Some(a.generation)).unwrap_err();
    assert_eq!(e.code(), Code::Fenced, "{e}");
}

/// Perform the first request of `op` on the disk and lose its answer (or lose it before it
/// reaches the disk, with `lands` false).
fn send_and_lose(d: &mut MemDisk, op: &mut CommitRecord, lands: bool) {
    let Step::Io(req) = op.next(None) else {
        panic!("a commit starts with a request")
    };
    assert!(matches!(req, Request::CreateGuarded { .. }), "{req:?}");
    if lands {
        let _lost = d.perform(req, &all_alive);
    }
}

#[test]
fn an_unanswered_commit_that_landed_is_resolved_as_committed_once() {
    let (mut d, l, tail) = owner_with(1);
    let mut op = CommitRecord::new(&l, params(&tail, vec![batch("c2", "k", b"v2")])).unwrap();
    send_and_lose(&mut d, &mut op, true);
    let c = d.run(&mut op.again(), &all_alive).unwrap();
    assert_eq!(c.sequence.get(), 2);
    assert_eq!(records(&d), [1, 2], "one record, not two");
    assert_eq!(d.files[&FileRef::StoreRecord(seq(2))], op.record());
}

#[test]
fn an_unanswered_commit_that_did_not_land_is_created_by_its_resolution() {
    let (mut d, l, tail) = owner_with(1);
    let mut op = CommitRecord::new(&l, params(&tail, vec![batch("c2", "k", b"v2")])).unwrap();
    send_and_lose(&mut d, &mut op, false);
    assert_eq!(records(&d), [1]);
    let c = d.run(&mut op.again(), &all_alive).unwrap();
    assert_eq!(c.sequence.get(), 2);
    assert_eq!(records(&d), [1, 2]);
}

#[test]
fn an_unanswered_commit_overtaken_by_a_new_owner_is_fenced_and_never_lands() {
    for newer_commits in [false, true] {
        let (mut d, a, tail) = owner_with(1);
        let mut op = CommitRecord::new(&a, params(&tail, vec![batch("c2", "k", b"a")])).unwrap();
        // The request is still on its way when a new owner takes the run.
        let Step::Io(in_flight) = op.next(None) else {
            panic!()
        };
        release(&mut d, &a, 100).unwrap();
        let b = claim(&mut d, "b", 2, 200).unwrap();
        if newer_commits {
            commit(&mut d, &b, &tail, vec![batch("b1", "k", b"b")]).unwrap();
        }
        let e = d.run(&mut op.again(), &all_alive).unwrap_err();
        assert_eq!(e.code(), Code::Fenced, "newer commits {newer_commits}: {e}");
        // The lost request arrives late: the guard refuses it too.
        let late = d.perform(in_flight, &all_alive);
        assert!(
            matches!(late, Response::Superseded | Response::AlreadyExists),
            "{late:?}"
        );
        let view = read_log(&mut d, None).unwrap();
        assert!(
            view.records
                .iter()
                .all(|r| r.record.generation == b.generation || r.record.sequence.get() == 1),
            "generation 1's record 2 never landed"
        );
    }
}

#[test]
fn a_commit_on_a_stale_tail_of_its_own_generation_is_a_concurrent_change() {
    let (mut d, l, _) = owner_with(2);
    let stale = StoreTail::default();
    let before = d.files.clone();
    let e = commit(&mut d, &l, &stale, vec![batch("x", "k", b"v")]).unwrap_err();
    assert_eq!(e.code(), Code::ConcurrentChange, "{e}");
    assert_eq!(d.files, before);
}

#[test]
fn oversized_and_over_budget_commits_are_refused_before_any_request() {
    let (mut d, l, tail) = owner_with(1);
    let counts = d.counts.clone();
    let huge = batch("big", "k", &vec![1u8; MAX_STORE_RECORD_BYTES]);
    let e = CommitRecord::new(&l, params(&tail, vec![huge])).unwrap_err();
    assert_eq!(e.code(), Code::StoreCommitTooLarge, "{e}");
    assert!(e.to_string().contains("split it"), "{e}");
    let mut p = params(&tail, vec![batch("c", "k", &[7; 1000])]);
    p.budget = tail.bytes + 500;
    let e = CommitRecord::new(&l, p).unwrap_err();
    assert_eq!(e.code(), Code::StoreBudgetExceeded, "{e}");
    let e = CommitRecord::new(&l, params(&tail, vec![])).unwrap_err();
    assert_eq!(e.code(), Code::ArgumentInvalid, "{e}");
    assert_eq!(d.counts, counts, "no request was made");
    let _ = &mut d;
}

/// Replace record `n` with `f(record)`, re-encoded canonically (a forgery that decodes).
fn forge(d: &mut MemDisk, n: u64, f: impl FnOnce(&mut StoreRecord)) {
    let file = FileRef::StoreRecord(seq(n));
    let mut r: StoreRecord = decode(&d.files[&file]).unwrap();
    f(&mut r);
    d.files.insert(file, encode(&r).unwrap());
}

#[test]
fn the_reader_refuses_a_log_that_breaks_its_rules_and_names_the_record() {
    type Damage = Box<dyn Fn(&mut MemDisk)>;
    let cases: Vec<(&str, Damage, Code, &str)> = vec![
        (
            "gap",
            Box::new(|d: &mut MemDisk| {
                d.files.remove(&FileRef::StoreRecord(seq(2)));
            }),
            Code::StoreLogInvalid,
            "store/log/00000000000000000002.json",
        ),
        (
            "broken link",
            Box::new(|d: &mut MemDisk| forge(d, 3, |r| r.prev_hash = Some(Digest::of(b"x")))),
            Code::StoreLogInvalid,
            "00000000000000000003.json",
        ),
        (
            "commit numbers",
            Box::new(|d: &mut MemDisk| {
                forge(d, 2, |r| r.first_commit = seq(5));
            }),
            Code::StoreLogInvalid,
            "00000000000000000002.json",
        ),
        (
            "wrong name",
            Box::new(|d: &mut MemDisk| {
                let b = d.files[&FileRef::StoreRecord(seq(3))].clone();
                d.files.insert(FileRef::StoreRecord(seq(4)), b);
            }),
            Code::StoreLogInvalid,
            "00000000000000000004.json",
        ),
        (
            "not canonical",
            Box::new(|d: &mut MemDisk| {
                let f = FileRef::StoreRecord(seq(2));
                let mut b = d.files[&f].clone();
                b.insert(1, b' ');
                d.files.insert(f, b);
            }),
            Code::RecordInvalid,
            "00000000000000000002.json",
        ),
    ];
    for (what, damage, code, names) in cases {
        let (mut d, _, _) = owner_with(3);
        damage(&mut d);
        let e = read_log(&mut d, None).unwrap_err();
        assert_eq!(e.code(), code, "{what}: {e}");
        assert!(e.to_string().contains(names), "{what}: {e}");
    }
}

#[test]
fn a_generation_going_down_in_the_log_is_refused() {
    let (mut d, a, tail) = owner_with(1);
    release(&mut d, &a, 100).unwrap();
    let b = claim(&mut d, "b", 2, 200).unwrap();
    let tail = commit(&mut d, &b, &tail, vec![batch("b", "k", b"v")])
        .unwrap()
        .tail;
    // Generation 1's record after generation 2's: only a forgery can put it there (the
    // guard refuses it), so it is written by hand, linked correctly.
    let r = StoreRecord {
        run_id: run_id(),
        sequence: seq(3),
        generation: a.generation,
        owner_id: a.owner_id.clone(),
        prev_hash: tail.last.as_ref().map(|(_, h)| h.clone()),
        first_commit: seq(3),
        timestamp: t(300),
        batches: vec![batch("z", "k", b"zombie")],
    };
    d.files
        .insert(FileRef::StoreRecord(seq(3)), encode(&r).unwrap());
    let e = read_log(&mut d, None).unwrap_err();
    assert_eq!(e.code(), Code::StoreLogInvalid, "{e}");
    assert!(
        e.to_string()
            .contains("generation 1 is below the generation"),
        "{e}"
    );
}

fn image(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

#[test]
fn a_snapshot_round_trips_and_anchors_the_records_after_it() {
    let (mut d, l, tail) = owner_with(3);
    let img = image(MAX_CHUNK_BYTES * 2 + 12345);
    let file = d
        .run(
            &mut WriteSnapshot::new(&l, &tail, img.clone(), 0xfeed, t(600)).unwrap(),
            &all_alive,
        )
        .unwrap();
    let chunks = d
        .files
        .keys()
        .filter(|f| matches!(f, FileRef::SnapshotChunk { .. }))
        .count();
    assert_eq!(chunks, 3);
    // The records up to the snapshot are removed (truncation), and the log goes on.
    for n in 1..=3 {
        d.files.remove(&FileRef::StoreRecord(seq(n)));
    }
    let tail2 = commit(&mut d, &l, &tail, vec![batch("c4", "k", b"v")])
        .unwrap()
        .tail;
    let view = read_log(&mut d, Some(l.generation)).unwrap();
    let (f, m) = view.snapshot.clone().unwrap();
    assert_eq!(f, file);
    assert_eq!((m.through.get(), m.commits.get()), (3, 3));
    assert_eq!(view.records.len(), 1);
    assert_eq!(view.tail.last, tail2.last);
    assert_eq!(
        view.tail.bytes,
        img.len() as u64 + d.files[&FileRef::StoreRecord(seq(4))].len() as u64
    );
    let back = d
        .run(&mut ReadSnapshot::new(run_id(), f, m.clone()), &all_alive)
        .unwrap();
    assert_eq!(back, img);
    // A chunk changed by hand is refused, naming it.
    let c1 = FileRef::SnapshotChunk {
        through: seq(3),
        nonce: 0xfeed,
        index: 1,
    };
    d.files.get_mut(&c1).unwrap()[0] ^= 1;
    let e = d
        .run(&mut ReadSnapshot::new(run_id(), f, m.clone()), &all_alive)
        .unwrap_err();
    assert_eq!(e.code(), Code::StoreLogInvalid, "{e}");
    assert!(e.to_string().contains(&c1.path()), "{e}");
    // A snapshot removed while it is read is a concurrent change, not damage.
    d.files.remove(&f);
    let e = d
        .run(&mut ReadSnapshot::new(run_id(), f, m), &all_alive)
        .unwrap_err();
    assert_eq!(e.code(), Code::ConcurrentChange, "{e}");
}

#[test]
fn a_deposed_owners_snapshot_is_fenced() {
    let (mut d, a, tail) = owner_with(2);
    release(&mut d, &a, 100).unwrap();
    let before = d.files.clone();
    let e = d
        .run(
            &mut WriteSnapshot::new(&a, &tail, image(10), 1, t(600)).unwrap(),
            &all_alive,
        )
        .unwrap_err();
    assert_eq!(e.code(), Code::Fenced, "{e}");
    assert_eq!(d.files, before);
}

#[test]
fn a_truncation_under_a_reader_is_a_concurrent_change_not_damage() {
    let (mut d, l, tail) = owner_with(3);
    let mut reader = ReadStoreLog::new(run_id(), None, 0);
    // The reader lists the snapshots (none yet) ...
    let Step::Io(list) = reader.next(None) else {
        panic!()
    };
    let listed = d.perform(list, &all_alive);
    // ... then the owner snapshots through record 2 and removes records 1-2.
    let two = StoreTail {
        last: Some((seq(2), {
            let v = read_log(&mut d, None).unwrap();
            v.records[1].hash.clone()
        })),
        commits: 2,
        bytes: 0,
    };
    d.run(
        &mut WriteSnapshot::new(&l, &two, image(100), 9, t(600)).unwrap(),
        &all_alive,
    )
    .unwrap();
    d.files.remove(&FileRef::StoreRecord(seq(1)));
    d.files.remove(&FileRef::StoreRecord(seq(2)));
    let _ = tail;
    let mut input = Some(listed);
    let e = loop {
        match reader.next(input.take()) {
            Step::Io(req) => input = Some(d.perform(req, &all_alive)),
            Step::Done(r) => break r.unwrap_err(),
        }
    };
    assert_eq!(e.code(), Code::ConcurrentChange, "{e}");
    // Read again: the snapshot anchors the log.
    let view = read_log(&mut d, None).unwrap();
    assert_eq!(view.records.len(), 1);
}

/// The same race when the truncation removes every record the reader would have read: an
/// empty page is then no end of the log. Before the reader listed the snapshots again at
/// the end, it answered an empty log (found by the engine model's snapshot configuration).
#[test]
fn a_truncation_of_the_whole_log_under_a_reader_is_a_concurrent_change_not_an_empty_log() {
    let (mut d, l, tail) = owner_with(2);
    let mut reader = ReadStoreLog::new(run_id(), None, 0);
    let Step::Io(list) = reader.next(None) else {
        panic!()
    };
    let listed = d.perform(list, &all_alive);
    let file = d
        .run(
            &mut WriteSnapshot::new(&l, &tail, image(100), 9, t(600)).unwrap(),
            &all_alive,
        )
        .unwrap();
    let cut = d.run(&mut TruncateStoreLog::new(file), &all_alive).unwrap();
    assert_eq!(cut.records, 2);
    let mut input = Some(listed);
    let r = loop {
        match reader.next(input.take()) {
            Step::Io(req) => input = Some(d.perform(req, &all_alive)),
            Step::Done(r) => break r,
        }
    };
    let e = r.expect_err("a truncated log read as an empty one");
    assert_eq!(e.code(), Code::ConcurrentChange, "{e}");
    let view = read_log(&mut d, None).unwrap();
    assert_eq!(
        (view.records.len(), view.tail.last, view.tail.commits),
        (0, tail.last, tail.commits)
    );
}

#[derive(Debug, Clone)]
enum Act {
    /// The current owner commits `n` batches.
    Commit(u8),
    /// The current owner commits and the answer is lost; it lands or not.
    CommitLost { lands: bool },
    /// The pending lost commit of the oldest owner is resolved.
    Resolve,
    /// A new owner replaces the current one (release + claim: an epoch above it).
    Replace,
    /// A deposed owner (the previous one) commits on its stale tail.
    Zombie,
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        4 => (1u8..4).prop_map(Act::Commit),
        2 => any::<bool>().prop_map(|lands| Act::CommitLost { lands }),
        2 => Just(Act::Resolve),
        1 => Just(Act::Replace),
        1 => Just(Act::Zombie),
    ]
}

struct Owner {
    lease: OwnedLease,
    tail: StoreTail,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every answer agrees with the final log: an acknowledged record is there with its
    /// bytes; a fenced or stale one is not, and never will be; the log has no gap, no
    /// broken link and no generation going down; no generation's record follows a newer
    /// generation's.
    #[test]
    fn every_answer_agrees_with_the_final_log(acts in proptest::collection::vec(act(), 1..40)) {
        let mut d = MemDisk::new();
        let mut owners = vec![Owner { lease: claim(&mut d, "o1", 1, 0).unwrap(), tail: StoreTail::default() }];
        let mut acked: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut refused: Vec<Vec<u8>> = Vec::new();
        let mut pending: Vec<(usize, CommitRecord, Request)> = Vec::new();
        let mut n = 0u64;
        for a in acts {
            n += 1;
            let cur = owners.len() - 1;
            // An owner never builds a new record while one's outcome is unknown.
            let writes = matches!(a, Act::Commit(_) | Act::CommitLost { .. });
            if writes && pending.iter().any(|(o, ..)| *o == cur) {
                continue;
            }
            match a {
                Act::Commit(k) => {
                    let bs = (0..k).map(|j| batch(&format!("c{n}-{j}"), "k", &[j])).collect();
                    let o = &mut owners[cur];
                    let mut op = CommitRecord::new(&o.lease, params(&o.tail, bs)).unwrap();
                    match d.run(&mut op, &all_alive) {
                        Ok(c) => { acked.push((c.sequence.get(), op.record().to_vec())); o.tail = c.tail; }
                        Err(e) => { prop_assert!(matches!(e.code(), Code::Fenced | Code::ConcurrentChange), "{e}"); refused.push(op.record().to_vec()); }
                    }
                }
                Act::CommitLost { lands } => {
                    let o = &owners[cur];
                    let mut op = CommitRecord::new(&o.lease, params(&o.tail, vec![batch(&format!("l{n}"), "k", b"l")])).unwrap();
                    let Step::Io(req) = op.next(None) else { panic!() };
                    if lands { let _ = d.perform(req.clone(), &all_alive); }
                    pending.push((cur, op, req));
                }
                Act::Resolve => {
                    if pending.is_empty() { continue; }
                    let (o, op, late) = pending.remove(0);
                    match d.run(&mut op.again(), &all_alive) {
                        Ok(c) => { acked.push((c.sequence.get(), op.record().to_vec())); owners[o].tail = c.tail; }
                        Err(e) => {
                            prop_assert!(matches!(e.code(), Code::Fenced | Code::ConcurrentChange), "{e}");
                            refused.push(op.record().to_vec());
                            // The lost request may still arrive: it must not land now.
                            let r = d.perform(late, &all_alive);
                            prop_assert!(!matches!(r, Response::Created), "a refused record landed late");
                        }
                    }
                }
                Act::Replace => {
                    let prev = owners[cur].lease.clone();
                    release(&mut d, &prev, 100 + n).unwrap();
                    let g = owners.len() as u32 + 1;
                    let l = claim(&mut d, &format!("o{g}"), g, 200 + n).unwrap();
                    let view = read_log(&mut d, Some(l.generation)).unwrap();
                    owners.push(Owner { lease: l, tail: view.tail });
                }
                Act::Zombie => {
                    if owners.len() < 2 { continue; }
                    let z = &owners[owners.len() - 2];
                    let mut op = CommitRecord::new(&z.lease, params(&z.tail, vec![batch(&format!("z{n}"), "k", b"z")])).unwrap();
                    let e = d.run(&mut op, &all_alive).unwrap_err();
                    prop_assert_eq!(e.code(), Code::Fenced, "{}", e);
                    refused.push(op.record().to_vec());
                }
            }
        }
        let view = read_log(&mut d, None).unwrap();
        let log: Vec<Vec<u8>> = records(&d).iter().map(|s| d.files[&FileRef::StoreRecord(seq(*s))].clone()).collect();
        prop_assert_eq!(view.records.len(), log.len());
        for (s, bytes) in &acked {
            prop_assert_eq!(&log[(*s - 1) as usize], bytes, "acknowledged record {} is in the log", s);
        }
        for bytes in &refused {
            prop_assert!(!log.contains(bytes), "a refused record is in the log");
        }
    }
}

#[test]
fn a_truncation_leaves_the_newest_snapshot_and_the_records_after_it() {
    let (mut d, l, tail3) = owner_with(3);
    let s1 = d
        .run(
            &mut WriteSnapshot::new(&l, &tail3, image(10), 1, t(600)).unwrap(),
            &all_alive,
        )
        .unwrap();
    let mut tail = tail3.clone();
    for i in 4..=5 {
        tail = commit(&mut d, &l, &tail, vec![batch(&format!("c{i}"), "k", b"v")])
            .unwrap()
            .tail;
    }
    // A writer that died after a chunk of an older snapshot, before its manifest.
    let orphan = FileRef::SnapshotChunk {
        through: seq(2),
        nonce: 9,
        index: 0,
    };
    d.files.insert(orphan, b"half".to_vec());
    let s2 = d
        .run(
            &mut WriteSnapshot::new(&l, &tail, image(20), 2, t(700)).unwrap(),
            &all_alive,
        )
        .unwrap();
    let done = d.run(&mut TruncateStoreLog::new(s2), &all_alive).unwrap();
    assert_eq!(done.records, 5);
    assert_eq!(
        done.snapshot_files, 3,
        "s1's manifest and chunk, the orphan chunk"
    );
    assert!(records(&d).is_empty());
    assert!(!d.files.contains_key(&s1) && !d.files.contains_key(&orphan));
    assert!(d.files.contains_key(&s2));
    let view = read_log(&mut d, Some(l.generation)).unwrap();
    assert_eq!(view.snapshot.as_ref().map(|(f, _)| *f), Some(s2));
    assert_eq!(view.tail.last, tail.last);
    assert_eq!(view.tail.commits, 5);
    // The log goes on from the snapshot.
    let c = commit(&mut d, &l, &view.tail, vec![batch("c6", "k", b"v")]).unwrap();
    assert_eq!(c.sequence.get(), 6);
    assert_eq!(read_log(&mut d, None).unwrap().records.len(), 1);
    // Truncating again is a no-op.
    let again = d.run(&mut TruncateStoreLog::new(s2), &all_alive).unwrap();
    assert_eq!(again, Truncated::default());
}

#[test]
fn a_guarded_replace_is_refused_once_a_newer_epoch_exists() {
    let (mut d, a, _) = owner_with(0);
    let put = |d: &mut MemDisk, g: Generation, b: &[u8]| {
        d.perform(
            Request::ReplaceGuarded {
                file: FileRef::RunStatus,
                bytes: b.to_vec(),
                generation: g,
            },
            &all_alive,
        )
    };
    assert_eq!(put(&mut d, a.generation, b"one"), Response::Done);
    assert_eq!(put(&mut d, a.generation, b"two"), Response::Done);
    release(&mut d, &a, 100).unwrap();
    let b = claim(&mut d, "b", 2, 200).unwrap();
    assert_eq!(put(&mut d, a.generation, b"late"), Response::Superseded);
    assert_eq!(d.files[&FileRef::RunStatus], b"two");
    assert_eq!(put(&mut d, b.generation, b"b"), Response::Done);
}
