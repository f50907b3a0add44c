//! The engine-committed store (issue #32, PROTOCOL §18) over a real 3-member etcd cluster.
//!
//! What these tests prove, each by an assertion that fails if the guard or the resolution
//! were wrong:
//!
//! - an owner's records are created in order, chained by hash, numbered across batches,
//!   and read back (paged by [`lease_core::ops::READ_PAGE_RECORDS`]) exactly as committed;
//! - etcd itself refuses a deposed generation's record (`CreateGuarded` answers
//!   `Superseded`, the commit is `FENCED`, nothing is written), also when the epoch just
//!   above it was removed and a later one exists (the guard is a range compare over every
//!   epoch above, not a point compare on `g + 1`);
//! - a commit whose answer was lost is resolved by the same record in the same slot: a
//!   retry within the deadline adopts exactly its own bytes (never another record's), and
//!   a commit unanswered until its deadline is `OUTCOME_UNKNOWN` and then resolved by
//!   [`LeaseOps::resolve_record`] without a second record;
//! - a record near the 1 MiB limit commits, one above it is `STORE_COMMIT_TOO_LARGE` with
//!   nothing written;
//! - a snapshot's chunks and manifest are written under the same guard and read back
//!   byte for byte; a deposed owner's snapshot is `FENCED` and leaves no chunk nor
//!   manifest.

// The cluster helpers are shared with tests/etcd/; this file uses only some of them.
#[allow(dead_code)]
mod cluster;

use cluster::{Cluster, SERIAL, etcd_binary};
use lease_core::LeaseOps;
use lease_core::ops::{CommitParams, CommitRecord, Committed, Durability, Request, Response};
use lease_core::store_log::{
    Blob, DEFAULT_BUDGET_BYTES, RecordBatch, RecordWrite, StoreTail, pack_batches,
};
use lease_core::{
    Code, Digest, Dir, FileRef, Generation, HeartbeatDurability, Holder, Identity, RunId, Sequence,
    Timestamp, TimingPolicy,
};
use lease_etcd::{EtcdOptions, EtcdRun};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

fn now_ts() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    Timestamp::from_unix_millis(ms).unwrap()
}

fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

fn holder(n: u32) -> Holder {
    Holder {
        host: id(&format!("host-{n}")),
        boot_id: id(&format!("boot-{n}")),
        pid: 1000 + n,
        start_time: 77,
    }
}

/// Short timings so a deposition takes seconds: stale after 2 s (the etcd lease's time to
/// live).
fn fast_policy() -> TimingPolicy {
    TimingPolicy::from_millis(300, 900, 2_000, HeartbeatDurability::Local).unwrap()
}

fn opts() -> EtcdOptions {
    EtcdOptions {
        call_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_millis(500),
    }
}

fn claim_params(run: &EtcdRun, owner: &str, n: u32) -> lease_core::ops::ClaimParams {
    lease_core::ops::ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: id(owner),
        holder: holder(n),
        policy: fast_policy(),
        now: now_ts(),
        store_floor: None,
    }
}

fn retire_params(run: &EtcdRun, janitor: &str, n: u32) -> lease_core::ops::RetireParams {
    lease_core::ops::RetireParams {
        run_id: run.run_id().clone(),
        owner_id: id(janitor),
        holder: holder(n),
        policy: fast_policy(),
        now: now_ts(),
        expect: None,
    }
}

/// Retire `run`'s owner as "janitor" as soon as its etcd lease expired (it never beat):
/// every earlier attempt must be `RETIRE_REFUSED_NOT_DEAD`; within 10 s.
fn retire_once_dead(run: &EtcdRun) -> lease_core::ops::Retired {
    let since = Instant::now();
    loop {
        assert!(since.elapsed() < Duration::from_secs(10), "never retired");
        match run.retire(retire_params(run, "janitor", 3)) {
            Ok(r) => return r,
            Err(e) => assert_eq!(e.code().as_str(), "RETIRE_REFUSED_NOT_DEAD", "{e}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn lock_serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// One client commit `tag`: a put of `doc/<tag>` to `value` and a log entry.
fn batch(tag: &str, value: Vec<u8>) -> RecordBatch {
    RecordBatch {
        id: id(tag),
        writes: vec![RecordWrite {
            key: format!("doc/{tag}"),
            value: Some(Blob(value)),
        }],
        log: vec![Blob(tag.as_bytes().to_vec())],
    }
}

fn params(tail: &StoreTail, batches: Vec<RecordBatch>) -> CommitParams {
    CommitParams {
        tail: tail.clone(),
        batches,
        now: now_ts(),
        budget: DEFAULT_BUDGET_BYTES,
    }
}

/// `n` pseudo-random bytes (xorshift64*, fixed seed).
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(n);
    out
}

fn slot(n: u64) -> FileRef {
    FileRef::StoreRecord(Sequence::new(n).unwrap())
}

fn exists(run: &EtcdRun, f: FileRef) -> bool {
    match run.perform(Request::Exists(f)).unwrap() {
        Response::Exists(e) => e,
        r => panic!("exists {f:?}: {r:?}"),
    }
}

fn listing(run: &EtcdRun, d: Dir) -> Vec<FileRef> {
    match run.perform(Request::List(d)).unwrap() {
        Response::Listing(l) => l,
        r => panic!("list {d:?}: {r:?}"),
    }
}

fn generation(n: u64) -> Generation {
    Generation::new(n).unwrap()
}

/// Test 1: an owner commits three records chaining each answer's tail; the log read back
/// (as the owner and as an observer) holds them with the same hashes, numbers, links and
/// batch ids, and its tail is the last answer's. A commit built on a stale tail finds its
/// slot taken by the same generation: `CONCURRENT_CHANGE`, nothing written.
#[test]
fn an_owners_records_are_committed_in_order_and_read_back() {
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let run = auth.run(RunId::new("store-basic").unwrap());
    let lease = run.claim(claim_params(&run, "owner-a", 1)).unwrap();
    assert_eq!(lease.generation.get(), 1);

    let groups: Vec<Vec<&str>> = vec![vec!["c-1"], vec!["c-2", "c-3"], vec!["c-4"]];
    let mut tail = StoreTail::default();
    let mut done: Vec<Committed> = Vec::new();
    for g in &groups {
        let batches = g.iter().map(|t| batch(t, t.as_bytes().to_vec())).collect();
        let c = run.commit_record(&lease, params(&tail, batches)).unwrap();
        tail = c.tail.clone();
        done.push(c);
    }
    let seqs: Vec<u64> = done.iter().map(|c| c.sequence.get()).collect();
    assert_eq!(seqs, [1, 2, 3]);
    let firsts: Vec<u64> = done.iter().map(|c| c.first_commit.get()).collect();
    assert_eq!(firsts, [1, 2, 4], "commits are numbered across batches");
    assert_eq!(tail.commits, 4);

    let other = auth.run(RunId::new("store-basic").unwrap());
    for (who, view) in [
        (
            "owner",
            run.read_store_log(Some(lease.generation), 0).unwrap(),
        ),
        ("observer", other.read_store_log(None, 0).unwrap()),
    ] {
        assert!(view.snapshot.is_none(), "{who}");
        assert_eq!(view.records.len(), 3, "{who}");
        assert_eq!(view.tail, tail, "{who}: the tail is the last commit's");
        for (i, (logged, c)) in view.records.iter().zip(&done).enumerate() {
            assert_eq!(logged.hash, c.hash, "{who} record {}", i + 1);
            assert_eq!(logged.record.sequence, c.sequence);
            assert_eq!(logged.record.first_commit, c.first_commit);
            assert_eq!(logged.record.generation, lease.generation);
            assert_eq!(logged.record.owner_id.as_str(), "owner-a");
            let prev = i.checked_sub(1).map(|p| done[p].hash.clone());
            assert_eq!(logged.record.prev_hash, prev, "{who}: the chain");
            let ids: Vec<&str> = logged
                .record
                .batches
                .iter()
                .map(|b| b.id.as_str())
                .collect();
            assert_eq!(ids, groups[i], "{who}");
            for b in &logged.record.batches {
                assert_eq!(
                    b.writes[0].value,
                    Some(Blob(b.id.as_str().as_bytes().to_vec()))
                );
            }
        }
    }
    // Keeping only what follows record 2: its hash, and record 3.
    let part = run.read_store_log(Some(lease.generation), 2).unwrap();
    assert_eq!(part.hash_at_keep_after, Some(done[1].hash.clone()));
    assert_eq!(part.records.len(), 1);
    assert_eq!(part.tail, tail);

    // A commit built on record 1's tail: slot 2 is taken by this generation's record.
    let stale = run
        .commit_record(&lease, params(&done[0].tail, vec![batch("c-x", vec![1])]))
        .unwrap_err();
    assert_eq!(stale.code(), Code::ConcurrentChange, "{stale}");
    assert_eq!(run.read_store_log(None, 0).unwrap().tail, tail);
    assert!(!exists(&run, slot(4)), "nothing was written past the tail");
}

/// Test 2: etcd refuses a deposed owner's record. Owner 1 commits record 1 and stops
/// beating; once its etcd lease expired a janitor retires it (epoch 2). Its next commit is
/// `FENCED` (the guarded create answers `Superseded`) and slot 2 stays empty. Then owner 3
/// claims, epoch 2 is removed by hand (as a prune could), and owner 1's commit is still
/// `FENCED`: the guard compares every epoch key above 1, not just epoch 2's.
#[test]
fn a_deposed_owners_record_is_refused_by_etcd() {
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let run_id = RunId::new("store-fenced").unwrap();
    let owner = auth.run(run_id.clone());
    let lease = owner.claim(claim_params(&owner, "owner-a", 1)).unwrap();
    let c1 = owner
        .commit_record(
            &lease,
            params(&StoreTail::default(), vec![batch("c-1", vec![1])]),
        )
        .unwrap();
    let other = auth.run(run_id.clone());
    // Before the deposition the same request would land: the guarded create's answer
    // for another slot is Created (removed again so the log stays a chain).
    let probe = slot(90);
    assert_eq!(
        owner
            .perform(Request::CreateGuarded {
                file: probe,
                bytes: b"probe".to_vec(),
                generation: lease.generation,
            })
            .unwrap(),
        Response::Created
    );
    owner
        .perform(Request::Remove(probe, Durability::Fsync))
        .unwrap();

    // run.json in the engine (a guarded replace) lands while the owner holds the run.
    let put = |g: Generation, b: &[u8]| {
        owner
            .perform(Request::ReplaceGuarded {
                file: FileRef::RunStatus,
                bytes: b.to_vec(),
                generation: g,
            })
            .unwrap()
    };
    assert_eq!(put(lease.generation, b"status-1"), Response::Done);

    let retired = retire_once_dead(&other);
    assert_eq!(retired.generation.get(), 2);
    // ... and is refused once a newer epoch exists, the value left as it was.
    assert_eq!(put(lease.generation, b"late"), Response::Superseded);
    assert_eq!(
        other.perform(Request::Read(FileRef::RunStatus)).unwrap(),
        Response::Content(Some(b"status-1".to_vec()))
    );
    let refused = owner
        .commit_record(&lease, params(&c1.tail, vec![batch("c-2", vec![2])]))
        .unwrap_err();
    assert_eq!(refused.code().as_str(), "FENCED", "{refused}");
    assert!(
        refused.to_string().contains("an epoch above generation 1"),
        "{refused}"
    );
    assert!(!exists(&other, slot(2)), "the deposed record did not land");
    let view = other.read_store_log(None, 0).unwrap();
    assert_eq!(view.records.len(), 1);
    assert_eq!(view.tail, c1.tail);
    // The bare request: Superseded, not AlreadyExists.
    assert_eq!(
        owner
            .perform(Request::CreateGuarded {
                file: slot(2),
                bytes: b"late".to_vec(),
                generation: lease.generation,
            })
            .unwrap(),
        Response::Superseded
    );

    // Owner 3 claims; epoch 2 is removed, epoch 3 stays.
    let third = auth.run(run_id.clone());
    let lease3 = third.claim(claim_params(&third, "owner-c", 4)).unwrap();
    assert_eq!(lease3.generation.get(), 3);
    other
        .perform(Request::Remove(
            FileRef::Epoch(generation(2)),
            Durability::Fsync,
        ))
        .unwrap();
    let epochs = listing(&other, Dir::Epochs);
    assert!(
        !epochs.contains(&FileRef::Epoch(generation(2))),
        "{epochs:?}"
    );
    assert!(
        epochs.contains(&FileRef::Epoch(generation(3))),
        "{epochs:?}"
    );
    let refused = owner
        .commit_record(&lease, params(&c1.tail, vec![batch("c-2", vec![2])]))
        .unwrap_err();
    assert_eq!(refused.code().as_str(), "FENCED", "{refused}");
    assert!(
        !exists(&other, slot(2)),
        "epoch 3 refuses generation 1 with epoch 2 gone"
    );
    // The current owner commits in that slot; the deposed one reading as itself is FENCED.
    let c2 = third
        .commit_record(&lease3, params(&c1.tail, vec![batch("c-3", vec![3])]))
        .unwrap();
    assert_eq!(c2.sequence.get(), 2);
    let e = owner.read_store_log(Some(lease.generation), 0).unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED", "{e}");
    let view = third.read_store_log(Some(lease3.generation), 0).unwrap();
    let gens: Vec<u64> = view
        .records
        .iter()
        .map(|r| r.record.generation.get())
        .collect();
    assert_eq!(gens, [1, 3]);
}

/// Test 3: a commit whose answer is lost is resolved by the same record in the same slot.
/// A retry within the deadline adopts its own bytes (`Created` at the request level, only
/// after an attempt of its own went unanswered, and never for another record's bytes);
/// a commit unanswered until its deadline is `OUTCOME_UNKNOWN` and resolved by
/// `resolve_record` on the same machine, one record in the slot.
#[test]
fn a_lost_answer_is_resolved_by_the_same_record() {
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let o = EtcdOptions {
        call_timeout: Duration::from_millis(300),
        op_timeout: Duration::from_millis(1_500),
        connect_timeout: Duration::from_millis(500),
    };
    let auth = cluster.authority(&[0, 1, 2], "t", o);
    let run = auth.run(RunId::new("store-lost").unwrap());
    let lease = run.claim(claim_params(&run, "owner-a", 1)).unwrap();
    let c1 = run
        .commit_record(
            &lease,
            params(&StoreTail::default(), vec![batch("c-1", vec![1])]),
        )
        .unwrap();

    // The commit's create lands, its answer is lost, the retry adopts it.
    run.lose_write_answers(1);
    let c2 = run
        .commit_record(&lease, params(&c1.tail, vec![batch("c-2", vec![2])]))
        .expect("the retry adopts its own record");
    assert_eq!(c2.sequence.get(), 2);
    let view = run.read_store_log(Some(lease.generation), 0).unwrap();
    assert_eq!(view.records.len(), 2);
    assert_eq!(view.records[1].hash, c2.hash);
    assert!(!exists(&run, slot(3)), "one record, not two");

    // The bare request: Created after a lost answer; the same bytes again, with nothing
    // of ours unanswered, are AlreadyExists.
    let op3 = CommitRecord::new(&lease, params(&c2.tail, vec![batch("c-3", vec![3])])).unwrap();
    let create3 = || Request::CreateGuarded {
        file: slot(3),
        bytes: op3.record().to_vec(),
        generation: lease.generation,
    };
    run.lose_write_answers(1);
    assert_eq!(run.perform(create3()).unwrap(), Response::Created);
    assert_eq!(run.perform(create3()).unwrap(), Response::AlreadyExists);
    let c3 = run.resolve_record(&op3).unwrap();
    assert_eq!(c3.sequence.get(), 3);
    assert_eq!(c3.hash, Digest::of(op3.record()));

    // Another record of the same slot, its first answer lost: the retry reads the other
    // bytes and does not adopt them.
    let other4 = CommitRecord::new(&lease, params(&c3.tail, vec![batch("c-4a", vec![4])])).unwrap();
    assert_eq!(
        run.perform(Request::CreateGuarded {
            file: slot(4),
            bytes: other4.record().to_vec(),
            generation: lease.generation,
        })
        .unwrap(),
        Response::Created
    );
    run.lose_write_answers(1);
    let mismatch = run
        .commit_record(&lease, params(&c3.tail, vec![batch("c-4b", vec![4])]))
        .unwrap_err();
    assert_eq!(mismatch.code(), Code::ConcurrentChange, "{mismatch}");
    let view = run.read_store_log(Some(lease.generation), 0).unwrap();
    assert_eq!(view.records.len(), 4);
    assert_eq!(view.records[3].hash, Digest::of(other4.record()));
    let c4 = run.resolve_record(&other4).unwrap();
    assert_eq!(c4.tail, view.tail);

    // Every answer lost until the deadline: OUTCOME_UNKNOWN (the create landed).
    let mut op = CommitRecord::new(&lease, params(&c4.tail, vec![batch("c-5", vec![5])])).unwrap();
    run.lose_write_answers(u32::MAX);
    let start = Instant::now();
    let e = run.drive(&mut op).unwrap_err();
    run.lose_write_answers(0);
    assert!(start.elapsed() < Duration::from_secs(4), "{e}");
    assert_eq!(e.code(), Code::OutcomeUnknown, "{e}");
    // Resolved by the same record: committed once, in its slot.
    let c5 = run.resolve_record(&op).unwrap();
    assert_eq!(c5.sequence, op.sequence());
    assert_eq!(c5.sequence.get(), 5);
    assert_eq!(c5.hash, Digest::of(op.record()));
    let view = run.read_store_log(Some(lease.generation), 0).unwrap();
    assert_eq!(view.records.len(), 5);
    assert_eq!(view.records[4].hash, c5.hash);
    assert_eq!(view.tail, c5.tail);
    assert!(!exists(&run, slot(6)));
    // Resolving again is idempotent.
    assert_eq!(run.resolve_record(&op).unwrap(), c5);
}

/// Test 4: 600 records read back in order across pages of 256 (and etcd's range read
/// honors the page's count and byte limits); a record near the 1 MiB limit commits, and
/// two 400 KB batches pack into two records that both commit; one batch above 1 MiB is
/// `STORE_COMMIT_TOO_LARGE` and nothing is written.
#[test]
fn many_records_are_read_back_in_pages_and_sizes_are_bounded() {
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let run = auth.run(RunId::new("store-many").unwrap());
    let lease = run.claim(claim_params(&run, "owner-a", 1)).unwrap();
    let started = Instant::now();
    let mut tail = StoreTail::default();
    let mut hashes = Vec::new();
    for n in 1..=600u64 {
        let c = run
            .commit_record(
                &lease,
                params(
                    &tail,
                    vec![batch(&format!("c-{n}"), n.to_le_bytes().to_vec())],
                ),
            )
            .unwrap();
        assert_eq!(c.sequence.get(), n);
        hashes.push(c.hash.clone());
        tail = c.tail;
    }
    eprintln!("600 commits in {:?}", started.elapsed());
    let view = run.read_store_log(Some(lease.generation), 0).unwrap();
    assert_eq!(view.records.len(), 600, "every page was read");
    for (i, r) in view.records.iter().enumerate() {
        let n = i as u64 + 1;
        assert_eq!(r.record.sequence.get(), n);
        assert_eq!(r.record.first_commit.get(), n);
        assert_eq!(r.hash, hashes[i]);
        assert_eq!(r.record.batches[0].id.as_str(), format!("c-{n}"));
    }
    assert_eq!(view.tail, tail);
    let part = run.read_store_log(Some(lease.generation), 300).unwrap();
    assert_eq!(part.records.len(), 300);
    assert_eq!(part.records[0].record.sequence.get(), 301);
    assert_eq!(part.hash_at_keep_after, Some(hashes[299].clone()));
    // etcd's range read: at most max_count, cut after the record reaching max_bytes.
    let page = |from: u64, max_count: u32, max_bytes: u64| match run
        .perform(Request::ReadStoreRecords {
            from: Sequence::new(from).unwrap(),
            max_count,
            max_bytes,
        })
        .unwrap()
    {
        Response::Records(r) => r.into_iter().map(|(s, _)| s.get()).collect::<Vec<u64>>(),
        r => panic!("{r:?}"),
    };
    assert_eq!(page(1, 256, 4 << 20), (1..=256).collect::<Vec<_>>());
    assert_eq!(page(513, 256, 4 << 20), (513..=600).collect::<Vec<_>>());
    assert_eq!(page(10, 256, 1), vec![10]);
    assert!(page(601, 256, 4 << 20).is_empty());

    // Two 380 KB values in one record: about 1.01 MB encoded, under the limit.
    let near = vec![
        batch("big-1", noise(380_000, 1)),
        batch("big-2", noise(380_000, 2)),
    ];
    let c = run
        .commit_record(&lease, params(&tail, near.clone()))
        .unwrap();
    assert_eq!(c.sequence.get(), 601);
    assert!(c.tail.bytes - tail.bytes > 1_000_000, "{}", c.tail.bytes);
    tail = c.tail;
    // Two 400 KB values do not fit one record: packed into two, each commits.
    let wide = vec![
        batch("big-3", noise(400_000, 3)),
        batch("big-4", noise(400_000, 4)),
    ];
    let runs = pack_batches(&wide);
    assert_eq!(runs, vec![1, 1]);
    let mut rest = wide.clone();
    for n in runs {
        let group: Vec<RecordBatch> = rest.drain(..n).collect();
        tail = run
            .commit_record(&lease, params(&tail, group))
            .unwrap()
            .tail;
    }
    assert_eq!(tail.last.as_ref().unwrap().0.get(), 603);
    // One batch above 1 MiB encoded: refused before any request.
    let e = run
        .commit_record(
            &lease,
            params(&tail, vec![batch("huge", noise(800_000, 5))]),
        )
        .unwrap_err();
    assert_eq!(e.code().as_str(), "STORE_COMMIT_TOO_LARGE", "{e}");
    assert!(!exists(&run, slot(604)), "nothing written");
    let view = run.read_store_log(Some(lease.generation), 600).unwrap();
    assert_eq!(view.tail, tail);
    let got: Vec<&RecordBatch> = view
        .records
        .iter()
        .flat_map(|r| &r.record.batches)
        .collect();
    let want: Vec<&RecordBatch> = near.iter().chain(&wide).collect();
    assert_eq!(got, want, "the large batches read back byte for byte");
}

/// Test 5: a 2.5 MiB snapshot (three chunks) written under the guard is what the log read
/// starts from, and reads back byte for byte; a record after it links to its hash. A
/// deposed owner's snapshot is `FENCED` and leaves neither a chunk nor a manifest.
#[test]
fn a_snapshot_is_written_under_the_guard_and_read_back() {
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let run_id = RunId::new("store-snap").unwrap();
    let run = auth.run(run_id.clone());
    let lease = run.claim(claim_params(&run, "owner-a", 1)).unwrap();
    let c1 = run
        .commit_record(
            &lease,
            params(&StoreTail::default(), vec![batch("c-1", vec![1])]),
        )
        .unwrap();
    let c2 = run
        .commit_record(
            &lease,
            params(&c1.tail, vec![batch("c-2", vec![2]), batch("c-3", vec![3])]),
        )
        .unwrap();
    let image = noise(5 << 19, 42);
    let nonce = 0x5eed_0001;
    let file = run
        .write_snapshot(&lease, &c2.tail, image.clone(), nonce, now_ts())
        .unwrap();
    assert_eq!(
        file,
        FileRef::Snapshot {
            through: Sequence::new(2).unwrap(),
            nonce
        }
    );
    let view = run.read_store_log(Some(lease.generation), 0).unwrap();
    let (f, m) = view.snapshot.clone().expect("the snapshot is found");
    assert_eq!(f, file);
    assert_eq!(m.through.get(), 2);
    assert_eq!(m.through_hash, c2.hash);
    assert_eq!(m.commits.get(), 3);
    assert_eq!(m.chunks.len(), 3);
    assert_eq!(m.size, image.len() as u64);
    assert_eq!(m.generation, lease.generation);
    assert!(view.records.is_empty(), "the log starts after the snapshot");
    assert_eq!(view.tail.last, c2.tail.last);
    assert_eq!(view.tail.commits, 3);
    assert_eq!(view.tail.bytes, image.len() as u64);
    assert_eq!(
        run.read_snapshot(f, m.clone()).unwrap(),
        image,
        "same image"
    );
    // A record after the snapshot links to it.
    let c3 = run
        .commit_record(&lease, params(&view.tail, vec![batch("c-4", vec![4])]))
        .unwrap();
    assert_eq!(c3.sequence.get(), 3);
    let view = run.read_store_log(Some(lease.generation), 0).unwrap();
    assert_eq!(view.records.len(), 1);
    assert_eq!(view.records[0].record.prev_hash, Some(c2.hash.clone()));
    assert_eq!(view.records[0].record.first_commit.get(), 4);
    assert_eq!(view.tail, c3.tail);

    // Deposed: its next snapshot is refused at the first chunk.
    let other = auth.run(run_id.clone());
    let retired = retire_once_dead(&other);
    assert_eq!(retired.generation.get(), 2);
    let late_nonce = 0x5eed_0002;
    let e = run
        .write_snapshot(&lease, &c3.tail, noise(3 << 19, 7), late_nonce, now_ts())
        .unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED", "{e}");
    let files = listing(&other, Dir::StoreSnapshots);
    let late: Vec<&FileRef> = files
        .iter()
        .filter(|f| {
            matches!(f, FileRef::Snapshot { nonce, .. } | FileRef::SnapshotChunk { nonce, .. }
                if *nonce == late_nonce)
        })
        .collect();
    assert!(late.is_empty(), "no chunk nor manifest of it: {late:?}");
    assert_eq!(
        files
            .iter()
            .filter(|f| matches!(f, FileRef::Snapshot { .. }))
            .count(),
        1,
        "{files:?}"
    );
    let view = other.read_store_log(None, 0).unwrap();
    assert_eq!(view.snapshot.map(|(f, _)| f), Some(file));
    assert_eq!(view.tail, c3.tail);
}

/// A log of large records (about 0.9 MiB each, 12 of them: 11 MB) reads back whole: each
/// etcd range answer is bounded by the record limit, whatever a page of the reader asks
/// for (a page of 256 such records was one 15 MB answer, above etcd-client's 4 MiB
/// decoding limit, and a new host could not catch up).
#[test]
fn a_log_of_large_records_reads_back_whole() {
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let run = auth.run(RunId::new("store-large").unwrap());
    let lease = run.claim(claim_params(&run, "owner-a", 1)).unwrap();
    let mut tail = StoreTail::default();
    for n in 1..=12u64 {
        tail = run
            .commit_record(
                &lease,
                params(&tail, vec![batch(&format!("c-{n}"), noise(700_000, n))]),
            )
            .unwrap()
            .tail;
    }
    let view = run.read_store_log(Some(lease.generation), 0).unwrap();
    assert_eq!(view.records.len(), 12);
    assert_eq!(view.tail, tail);
    assert!(view.tail.bytes > 11_000_000, "{}", view.tail.bytes);
    for (i, r) in view.records.iter().enumerate() {
        let n = i as u64 + 1;
        assert_eq!(
            r.record.batches[0].writes[0].value.as_ref().unwrap().0,
            noise(700_000, n)
        );
    }
}
