//! The engine-committed store's composition (`lease_run::engine_store`, issue #32) over
//! the in-memory engine: the run's state follows its lease to a host with an empty folder,
//! a deposed owner's commits are refused and never reach anyone's view, a local view that
//! is behind, ahead, different or damaged is caught up or rebuilt (never trusted), a
//! snapshot rebuilds a view, and a commit whose answer was lost is resolved first.
#![cfg(feature = "etcd")] // a lost answer is lease-etcd's OUTCOME_UNKNOWN

use lease_core::mem::MemTransport;
use lease_core::ops::{ClaimParams, OwnedLease, Request, Response, RetireParams};
use lease_core::{Code, Holder, Identity, LeaseOps, RunId, Timestamp, TimingPolicy, Transport};
use lease_run::engine_store::{CatchUp, EngineReader, EngineStore};
use lease_run::{Batch, RunError};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

fn run() -> RunId {
    RunId::new("job").unwrap()
}

fn now() -> Timestamp {
    Timestamp::from_unix_millis(1_796_169_600_000).unwrap()
}

fn holder(host: &str, pid: u32) -> Holder {
    Holder {
        host: Identity::new(host).unwrap(),
        boot_id: Identity::new(format!("boot-{host}")).unwrap(),
        pid,
        start_time: 1,
    }
}

/// The in-memory engine behind a transport whose errors are the run layer's, and which
/// can lose the answer of its next guarded create (it takes effect; the caller is told
/// `OUTCOME_UNKNOWN`, as lease-etcd tells it).
struct Engine {
    mem: MemTransport,
    lose: AtomicU32,
    /// Drop the next guarded creates before they reach the engine (a partition).
    drop_next: AtomicU32,
    /// Run once, just before the first read of a snapshot chunk reaches the engine (an
    /// owner's snapshot and truncation racing a reader).
    on_chunk_read: std::sync::Mutex<Option<ChunkHook>>,
}

type ChunkHook = Box<dyn FnOnce(&MemTransport) + Send>;

impl Engine {
    fn new() -> Engine {
        Engine {
            mem: MemTransport::new(run()),
            lose: AtomicU32::new(0),
            drop_next: AtomicU32::new(0),
            on_chunk_read: std::sync::Mutex::new(None),
        }
    }
}

impl Transport for Engine {
    type Error = RunError;
    type Bound = ();
    fn run_id(&self) -> &RunId {
        self.mem.run_id()
    }
    fn default_bound(&self) {}
    fn execute(&self, req: Request, _: ()) -> Result<Response, RunError> {
        let guarded = matches!(req, Request::CreateGuarded { .. });
        let take = |n: &AtomicU32| {
            n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        };
        let unknown = || {
            RunError::Etcd(lease_etcd::EtcdError::OutcomeUnknown {
                run: "job".into(),
                op: "txn",
                key: "store/log/…".into(),
                file: None,
                detail: "test: the answer was lost".into(),
            })
        };
        if matches!(
            req,
            Request::Read(lease_core::FileRef::SnapshotChunk { .. })
        ) {
            let hook = self.on_chunk_read.lock().unwrap().take();
            if let Some(hook) = hook {
                hook(&self.mem);
            }
        }
        if guarded && take(&self.drop_next) {
            return Err(unknown());
        }
        let resp = self.mem.execute(req, ())?;
        if guarded && take(&self.lose) {
            return Err(unknown());
        }
        Ok(resp)
    }
    fn tail_hint(&self) -> &lease_core::TailHint {
        self.mem.tail_hint()
    }
}

fn claim(e: &Engine, owner: &str, host: &str) -> OwnedLease {
    e.mem
        .claim(ClaimParams {
            run_id: run(),
            owner_id: Identity::new(owner).unwrap(),
            holder: holder(host, 7),
            policy: TimingPolicy::default(),
            now: now(),
            store_floor: None,
        })
        .unwrap()
}

/// The owner's etcd lease expired (it was cut off): a janitor on another host retires it.
fn retire(e: &Engine, host: &str) {
    e.mem
        .retire(RetireParams {
            run_id: run(),
            owner_id: Identity::new("janitor").unwrap(),
            holder: holder(host, 9),
            policy: TimingPolicy::default(),
            now: now(),
            expect: None,
        })
        .unwrap();
}

fn commit(s: &mut EngineStore, e: &Engine, batches: &[Batch]) -> Result<Vec<u64>, RunError> {
    let mut n = 0u64;
    s.commit_group(e, batches, now(), &mut || {
        n += 1;
        n
    })
}

fn value(s: &EngineStore, k: &str) -> Option<Vec<u8>> {
    s.view().get(k).unwrap().map(|d| d.value)
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap_or_default(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_state_follows_the_lease_to_an_empty_host_and_a_deposed_owner_is_refused() {
    let e = Engine::new();
    let (host_a, host_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = claim(&e, "owner-a", "host-a");
    let mut sa = EngineStore::open_at(&e, &a, host_a.path()).unwrap();
    assert_eq!(
        sa.caught_up(),
        CatchUp::Rebuilt(0),
        "no view yet: built empty"
    );
    // k = 1..=1000, in groups of 10 (one record each).
    for g in 0..100 {
        let batches: Vec<Batch> = (1..=10)
            .map(|i| {
                let k = g * 10 + i;
                Batch::new()
                    .put(format!("k{k}"), format!("v{k}"))
                    .log(format!("step {k}"))
            })
            .collect();
        let seqs = commit(&mut sa, &e, &batches).unwrap();
        assert_eq!(seqs, ((g * 10 + 1)..=(g * 10 + 10)).collect::<Vec<u64>>());
    }
    assert_eq!(sa.tail().commits, 1000);
    // Host A is cut off; its lease expires; host B, with its own empty folder, retires
    // it, claims, and catches up from the engine alone.
    retire(&e, "host-b");
    let b = claim(&e, "owner-b", "host-b");
    let mut sb = EngineStore::open_at(&e, &b, host_b.path()).unwrap();
    assert_eq!(sb.caught_up(), CatchUp::Rebuilt(100));
    for k in [1, 500, 1000] {
        assert_eq!(
            value(&sb, &format!("k{k}")),
            Some(format!("v{k}").into_bytes())
        );
    }
    assert_eq!(sb.view().head().unwrap(), 1000);
    assert_eq!(
        sb.view().commits_since(999).unwrap()[0].log,
        [b"step 1000".to_vec()]
    );
    // B goes on; A, still running, is refused by the engine and its view is unchanged.
    assert_eq!(
        commit(&mut sb, &e, &[Batch::new().put("k1", "b")]).unwrap(),
        [1001]
    );
    let before = files(host_a.path());
    let err = commit(&mut sa, &e, &[Batch::new().put("k1", "zombie")]).unwrap_err();
    assert_eq!(err.code(), Code::Fenced, "{err}");
    assert_eq!(
        files(host_a.path()),
        before,
        "a refused commit leaves A's view as it was"
    );
    // Nobody's view ever holds the zombie's write: B's, and a third host's catch-up.
    assert_eq!(value(&sb, "k1"), Some(b"b".to_vec()));
    drop(sb);
    let host_c = tempfile::tempdir().unwrap();
    let c_lease = {
        retire(&e, "host-c");
        claim(&e, "owner-c", "host-c")
    };
    let sc = EngineStore::open_at(&e, &c_lease, host_c.path()).unwrap();
    assert_eq!(value(&sc, "k1"), Some(b"b".to_vec()));
    assert_eq!(sc.view().head().unwrap(), 1001);
    // And the deposed owner A, reading the log as its own generation, learns it.
    drop(sa);
    let err = EngineStore::open_at(&e, &a, host_a.path()).unwrap_err();
    assert_eq!(err.code(), Code::Fenced, "{err}");
}

#[test]
fn a_view_behind_is_caught_up_and_one_ahead_or_different_is_rebuilt() {
    let e = Engine::new();
    let host = tempfile::tempdir().unwrap();
    let a = claim(&e, "owner-a", "host-a");
    let mut s = EngineStore::open_at(&e, &a, host.path()).unwrap();
    commit(&mut s, &e, &[Batch::new().put("x", "1")]).unwrap();
    drop(s);
    // Reopened on the same host: the view is at the tail.
    let s = EngineStore::open_at(&e, &a, host.path()).unwrap();
    assert_eq!(s.caught_up(), CatchUp::UpToDate);
    drop(s);
    // Another host's owner commits twice more (same lease here: another process).
    let other = tempfile::tempdir().unwrap();
    let mut s2 = EngineStore::open_at(&e, &a, other.path()).unwrap();
    commit(&mut s2, &e, &[Batch::new().put("x", "2")]).unwrap();
    commit(&mut s2, &e, &[Batch::new().put("y", "3")]).unwrap();
    let ahead = files(other.path());
    drop(s2);
    // The first host's view is behind: two records applied.
    let s = EngineStore::open_at(&e, &a, host.path()).unwrap();
    assert_eq!(s.caught_up(), CatchUp::Applied(2));
    assert_eq!(value(&s, "x"), Some(b"2".to_vec()));
    drop(s);

    // A view ahead of the engine (copied from a run with more commits) is rebuilt.
    let e2 = Engine::new();
    let a2 = claim(&e2, "owner-a", "host-a");
    let fresh = tempfile::tempdir().unwrap();
    let mut s = EngineStore::open_at(&e2, &a2, fresh.path()).unwrap();
    commit(&mut s, &e2, &[Batch::new().put("x", "only")]).unwrap();
    drop(s);
    for (name, bytes) in &ahead {
        std::fs::write(fresh.path().join(name), bytes).unwrap();
    }
    let err = EngineStore::open_at(&e2, &a2, fresh.path());
    // The copied view is another run's engine position (same run id, other history):
    // its hash differs, so it is rebuilt from the engine, never trusted.
    let s = err.unwrap();
    assert!(
        matches!(s.caught_up(), CatchUp::Rebuilt(1)),
        "{:?}",
        s.caught_up()
    );
    assert_eq!(value(&s, "x"), Some(b"only".to_vec()));
    assert_eq!(value(&s, "y"), None);
    drop(s);

    // A damaged view (garbage in the file) is rebuilt too.
    std::fs::write(fresh.path().join("view.sqlite"), b"not a database").unwrap();
    let s = EngineStore::open_at(&e2, &a2, fresh.path()).unwrap();
    assert!(
        matches!(s.caught_up(), CatchUp::Rebuilt(1)),
        "{:?}",
        s.caught_up()
    );
    assert_eq!(value(&s, "x"), Some(b"only".to_vec()));
}

#[test]
fn a_snapshot_rebuilds_a_new_hosts_view_with_the_records_after_it() {
    let e = Engine::new();
    let a = claim(&e, "owner-a", "host-a");
    let host_a = tempfile::tempdir().unwrap();
    let mut s = EngineStore::open_at(&e, &a, host_a.path()).unwrap();
    for i in 0..20 {
        commit(
            &mut s,
            &e,
            &[Batch::new().put(format!("k{i}"), vec![i as u8; 5000])],
        )
        .unwrap();
    }
    let manifest = s.snapshot(&e, 0xabc, now()).unwrap();
    assert!(
        manifest.starts_with("store/snapshots/00000000000000000020-"),
        "{manifest}"
    );
    let log = e.mem.read_store_log(None, 0).unwrap();
    assert!(
        log.records.is_empty(),
        "the records up to the snapshot were removed"
    );
    commit(&mut s, &e, &[Batch::new().put("after", "snap")]).unwrap();
    drop(s);
    retire(&e, "host-b");
    let b = claim(&e, "owner-b", "host-b");
    let host_b = tempfile::tempdir().unwrap();
    let sb = EngineStore::open_at(&e, &b, host_b.path()).unwrap();
    assert_eq!(
        sb.caught_up(),
        CatchUp::Rebuilt(1),
        "the image, then one record"
    );
    assert_eq!(value(&sb, "k19"), Some(vec![19; 5000]));
    assert_eq!(value(&sb, "after"), Some(b"snap".to_vec()));
    assert_eq!(sb.view().head().unwrap(), 21);
}

#[test]
fn a_commit_whose_answer_was_lost_is_resolved_before_the_next() {
    let e = Engine::new();
    let a = claim(&e, "owner-a", "host-a");
    let host = tempfile::tempdir().unwrap();
    let mut s = EngineStore::open_at(&e, &a, host.path()).unwrap();
    commit(&mut s, &e, &[Batch::new().put("a", "1")]).unwrap();
    e.lose.store(1, Ordering::SeqCst);
    let err = commit(&mut s, &e, &[Batch::new().put("b", "2")]).unwrap_err();
    assert_eq!(err.code(), Code::OutcomeUnknown, "{err}");
    assert_eq!(
        value(&s, "b"),
        None,
        "not in the view before it is resolved"
    );
    // The next commit resolves the first (it landed), then commits.
    let seqs = commit(&mut s, &e, &[Batch::new().put("c", "3")]).unwrap();
    assert_eq!(seqs, [3]);
    assert_eq!(value(&s, "b"), Some(b"2".to_vec()));
    let log = e.mem.read_store_log(None, 0).unwrap();
    assert_eq!(log.records.len(), 3, "one record per commit, none twice");
    // Lost after it landed, then the run taken over: the resolution finds its own
    // record (committed before the takeover). Lost before it reached the engine, then the
    // run taken over: FENCED, and the view keeps nothing of it.
    e.lose.store(1, Ordering::SeqCst);
    assert_eq!(
        commit(&mut s, &e, &[Batch::new().put("d", "4")])
            .unwrap_err()
            .code(),
        Code::OutcomeUnknown
    );
    e.drop_next.store(1, Ordering::SeqCst);
    assert_eq!(
        commit(&mut s, &e, &[Batch::new().put("e", "5")])
            .unwrap_err()
            .code(),
        Code::OutcomeUnknown,
        "the resolution of d is itself lost before the engine"
    );
    // (d is still unresolved: the dropped request was its resolution.)
    retire(&e, "host-b");
    s.resolve(&e).unwrap();
    assert_eq!(
        value(&s, "d"),
        Some(b"4".to_vec()),
        "d had landed: committed"
    );
    e.drop_next.store(1, Ordering::SeqCst);
    assert_eq!(
        commit(&mut s, &e, &[Batch::new().put("f", "6")])
            .unwrap_err()
            .code(),
        Code::OutcomeUnknown
    );
    let err = s.resolve(&e).unwrap_err();
    assert_eq!(err.code(), Code::Fenced, "{err}");
    assert_eq!(value(&s, "f"), None);
    let log = e.mem.read_store_log(None, 0).unwrap();
    assert_eq!(log.records.len(), 4, "a, b, c, d: f never landed");
}

#[test]
fn commits_snapshot_and_truncate_by_themselves_and_a_new_host_catches_up_from_that() {
    let e = Engine::new();
    let a = claim(&e, "owner-a", "host-a");
    let host_a = tempfile::tempdir().unwrap();
    let mut s = EngineStore::open_at(&e, &a, host_a.path()).unwrap();
    s.set_snapshot_every(5);
    for i in 0..12 {
        commit(&mut s, &e, &[Batch::new().put(format!("k{i}"), "v")]).unwrap();
    }
    // Snapshots after records 5 and 10; records 11 and 12 follow the newest.
    let log = e.mem.read_store_log(None, 0).unwrap();
    let (_, m) = log.snapshot.clone().expect("a snapshot");
    assert_eq!(m.through.get(), 10);
    assert_eq!(log.records.len(), 2);
    let manifests = e
        .mem
        .disk()
        .files
        .keys()
        .filter(|f| matches!(f, lease_core::FileRef::Snapshot { .. }))
        .count();
    assert_eq!(manifests, 1, "the older snapshot was removed");
    drop(s);
    retire(&e, "host-b");
    let b = claim(&e, "owner-b", "host-b");
    let host_b = tempfile::tempdir().unwrap();
    let sb = EngineStore::open_at(&e, &b, host_b.path()).unwrap();
    assert_eq!(sb.caught_up(), CatchUp::Rebuilt(2));
    assert_eq!(sb.view().head().unwrap(), 12);
    assert!(value(&sb, "k0").is_some() && value(&sb, "k11").is_some());
}

/// `a`'s store in `dir` after 12 commits putting `k<i>` = `v<i>`, snapshotting every 5
/// records (so a snapshot through record 10, and records 11 and 12 after it).
fn twelve_puts_snapshotting_every_five(e: &Engine, a: &OwnedLease, dir: &Path) -> EngineStore {
    let mut s = EngineStore::open_at(e, a, dir).unwrap();
    s.set_snapshot_every(5);
    for i in 0..12 {
        commit(
            &mut s,
            e,
            &[Batch::new().put(format!("k{i}"), format!("v{i}"))],
        )
        .unwrap();
    }
    s
}

/// A reader without a lease (`runlease store get` over etcd, on any host) builds the
/// same documents and commits the owner's view holds, from the newest snapshot and the
/// records after it, while the owner still holds the run; it writes nothing to the engine.
/// A run the engine has no epoch of is `STORE_MISSING`; a claimed run with no commit
/// reads as an empty store.
#[test]
fn a_reader_without_a_lease_builds_the_owners_view_from_the_engine() {
    let e = Engine::new();
    let err = EngineReader::open(&e).unwrap_err();
    assert_eq!(err.code(), Code::StoreMissing, "{err}");
    let a = claim(&e, "owner-a", "host-a");
    let r = EngineReader::open(&e).unwrap();
    assert!(r.store().scan_prefix("").unwrap().is_empty());
    assert_eq!(r.store().head().unwrap(), 0);
    let host_a = tempfile::tempdir().unwrap();
    let mut s = twelve_puts_snapshotting_every_five(&e, &a, host_a.path());
    commit(&mut s, &e, &[Batch::new().delete("k3").log("dropped k3")]).unwrap();
    let before = e.mem.disk().files.clone();
    let r = EngineReader::open(&e).unwrap();
    assert_eq!(e.mem.disk().files, before, "the reader wrote to the engine");
    let commits = |st: &lease_sqlite::Store| {
        st.commits_since(0)
            .unwrap()
            .into_iter()
            .map(|c| (c.seq, c.token, c.writes, c.log))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        r.store().scan_prefix("").unwrap(),
        s.view().scan_prefix("").unwrap()
    );
    assert_eq!(r.store().get("k3").unwrap(), None);
    assert_eq!(r.store().head().unwrap(), 13);
    assert_eq!(commits(r.store()), commits(s.view()));
    assert_eq!(r.tail(), s.tail());
    // Built from the snapshot (records 1-10 are gone from the log) and records 11-13.
    let log = e.mem.read_store_log(None, 0).unwrap();
    assert_eq!(
        (
            log.snapshot.map(|(_, m)| m.through.get()),
            log.records.len()
        ),
        (Some(10), 3)
    );
}

/// A reader whose snapshot is replaced and removed while it reads it (the owner wrote a
/// newer snapshot and truncated behind it) is told `CONCURRENT_CHANGE` by the read and
/// reads again from the newer snapshot: same documents as the owner, never an error.
#[test]
fn a_reader_racing_a_snapshot_and_truncation_reads_again() {
    let e = Engine::new();
    let a = claim(&e, "owner-a", "host-a");
    let host_a = tempfile::tempdir().unwrap();
    let s = twelve_puts_snapshotting_every_five(&e, &a, host_a.path());
    // The image the owner will snapshot during the read: after record 12.
    let image = s.view().image().unwrap();
    let tail = s.tail().clone();
    let ran = std::sync::Arc::new(AtomicU32::new(0));
    let ran2 = ran.clone();
    *e.on_chunk_read.lock().unwrap() = Some(Box::new(move |mem: &MemTransport| {
        let file = mem.write_snapshot(&a, &tail, image, 0x99, now()).unwrap();
        let t = mem.truncate_store_log(file).unwrap();
        assert!(t.records == 2 && t.snapshot_files >= 2, "{t:?}");
        ran2.fetch_add(1, Ordering::SeqCst);
    }));
    let r = EngineReader::open(&e).unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the race was not run");
    assert_eq!(
        r.store().scan_prefix("").unwrap(),
        s.view().scan_prefix("").unwrap()
    );
    assert_eq!(r.store().head().unwrap(), 12);
    let log = e.mem.read_store_log(None, 0).unwrap();
    assert_eq!(
        (
            log.snapshot.map(|(_, m)| m.through.get()),
            log.records.len()
        ),
        (Some(12), 0)
    );
}
