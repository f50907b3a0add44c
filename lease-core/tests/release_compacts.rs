//! A release compacts the lease when due (PROTOCOL §7.3 step 7, issue #33): every user of
//! the release gets it, and it never fails the release.

mod common;

use common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

fn g(n: u64) -> Generation {
    Generation::new(n).unwrap()
}

/// One claim (epoch `2i+1`) and one release (epoch `2i+2`) by owner `o{i}`, the release
/// driven here so its compaction outcome can be read.
fn cycle(d: &mut MemDisk, i: u64) -> (Generation, Option<Result<PruneReport, LeaseError>>) {
    let now = 1_000 * (i + 1);
    let l = claim(d, &format!("o{i}"), 10, now).unwrap();
    let mut op = Release::new(ReleaseParams {
        lease: l,
        now: t(now + 1),
        seal: None,
    });
    let released = d.run(&mut op, &all_alive).unwrap();
    assert_eq!(op.committed(), Some(released));
    (released, op.compaction().cloned())
}

fn epochs(d: &MemDisk) -> Vec<u64> {
    d.files
        .keys()
        .filter_map(|f| match f {
            FileRef::Epoch(g) => Some(g.get()),
            _ => None,
        })
        .collect()
}

fn checkpoints(d: &MemDisk) -> Vec<u64> {
    d.files
        .keys()
        .filter_map(|f| match f {
            FileRef::Checkpoint(g) => Some(g.get()),
            _ => None,
        })
        .collect()
}

// PROTOCOL §7.3 step 7, §7.10
#[test]
fn a_release_past_the_due_point_leaves_a_checkpoint() {
    let p = CompactPolicy::DEFAULT;
    let due_at = p.every + p.keep; // the first release epoch with H − 1 ≥ every + keep − 1
    assert_eq!(due_at % 2, 0, "a release epoch is even here");
    let mut d = MemDisk::new();
    for i in 0..(due_at / 2 - 1) {
        let (h, compaction) = cycle(&mut d, i);
        assert!(h.get() < due_at);
        assert!(compaction.is_none(), "not due at {h}: {compaction:?}");
    }
    assert!(checkpoints(&d).is_empty());
    let (h, compaction) = cycle(&mut d, due_at / 2 - 1);
    assert_eq!(h.get(), due_at);
    let report = compaction
        .expect("due: the prune ran")
        .expect("and succeeded");
    let floor = due_at - p.keep + 1;
    assert_eq!(report.floor, Some(g(floor)));
    assert_eq!(checkpoints(&d), vec![floor]);
    assert_eq!(epochs(&d), (floor..=due_at).collect::<Vec<_>>());
    // The chain still verifies from the new floor, and the next owner claims as usual.
    let v = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert_eq!(v.floor, Some(g(floor)));
    // Not due again until the chain grew by `every` generations.
    for i in 0..(p.every / 2) {
        let (h, compaction) = cycle(&mut d, 100 + i);
        if h.get() < due_at + p.every {
            assert!(compaction.is_none(), "not due at {h}");
        } else {
            let floor = h.get() - p.keep + 1;
            assert_eq!(compaction.unwrap().unwrap().floor, Some(g(floor)));
            assert_eq!(checkpoints(&d), vec![floor]);
        }
    }
}

// PROTOCOL §7.3 step 7: the old request sequence, unchanged, when turned off
#[test]
fn a_release_without_compaction_makes_the_requests_of_steps_1_to_6_only() {
    let mut d = MemDisk::new();
    for i in 0..20 {
        let l = claim(&mut d, &format!("o{i}"), 10, 1_000 * (i + 1)).unwrap();
        let mut op = Release::new(ReleaseParams {
            lease: l,
            now: t(1_000 * (i + 1) + 1),
            seal: None,
        })
        .compacting(None);
        let mut last = None;
        d.run(
            &mut Recording {
                op: &mut op,
                last: &mut last,
            },
            &all_alive,
        )
        .unwrap();
        assert!(
            matches!(
                last,
                Some(Request::Remove(FileRef::Beat(_), Durability::NoFsync))
            ),
            "{last:?}"
        );
        assert!(op.compaction().is_none());
    }
    assert!(checkpoints(&d).is_empty());
    assert_eq!(epochs(&d).len(), 40);
}

/// Remembers the last request of the operation it wraps.
struct Recording<'a> {
    op: &'a mut Release,
    last: &'a mut Option<Request>,
}

impl Operation for Recording<'_> {
    type Output = Generation;
    fn next(&mut self, input: Option<Response>) -> Step<Generation> {
        let s = self.op.next(input);
        if let Step::Io(r) = &s {
            *self.last = Some(r.clone());
        }
        s
    }
}

// PROTOCOL §7.3 step 7: best-effort
#[test]
fn a_prune_that_refuses_does_not_fail_the_release() {
    let p = CompactPolicy::DEFAULT;
    let due_at = p.every + p.keep;
    let mut d = MemDisk::new();
    for i in 0..(due_at / 2 - 1) {
        cycle(&mut d, i);
    }
    // A checkpoint at floor 1 that does not decode: the due rule reads only its name, the
    // prune reads it and refuses (RECORD_INVALID). Nothing else reads it.
    d.files
        .insert(FileRef::Checkpoint(g(1)), b"not a checkpoint".to_vec());
    let files = d.files.len();
    let (h, compaction) = cycle(&mut d, due_at / 2 - 1);
    assert_eq!(h.get(), due_at, "the release stands");
    let e = compaction.expect("due: the prune ran").unwrap_err();
    assert_eq!(e.code().as_str(), "RECORD_INVALID", "{e}");
    // The claim and the release added their epochs and the cutoff; nothing was removed.
    assert_eq!(epochs(&d), (1..=due_at).collect::<Vec<_>>());
    assert_eq!(checkpoints(&d), vec![1]);
    assert!(d.files.len() > files);
    // The run is free at the release's generation.
    let view = status(&mut d, 1_000_000);
    assert_eq!(view.head.unwrap().generation(), h);
    assert_eq!(view.status, Status::Free);
}

/// A [`MemDisk`] transport whose `CreateExclusive` of a checkpoint fails with an I/O-like
/// error of the transport (never fed back to the machine: PROTOCOL §6 rule 4).
struct FailingCheckpoint {
    run_id: RunId,
    disk: Mutex<MemDisk>,
    tail: TailHint,
    failed: AtomicU64,
}

impl Transport for FailingCheckpoint {
    type Error = LeaseError;
    type Bound = ();
    fn run_id(&self) -> &RunId {
        &self.run_id
    }
    fn default_bound(&self) {}
    fn execute(&self, req: Request, _bound: ()) -> Result<Response, LeaseError> {
        if let Request::CreateExclusive(FileRef::Checkpoint(_), _) = req {
            self.failed.fetch_add(1, Ordering::Relaxed);
            return Err(LeaseError::ProtocolViolation {
                detail: "simulated I/O failure".into(),
            });
        }
        Ok(self.disk.lock().unwrap().perform(req, &all_alive))
    }
    fn tail_hint(&self) -> &TailHint {
        &self.tail
    }
}

// PROTOCOL §6 rule 4, §7.3 step 7: a failed request of the compaction is not the release's
#[test]
fn a_failed_request_of_the_compaction_does_not_fail_the_release() {
    let t_ = FailingCheckpoint {
        run_id: run_id(),
        disk: Mutex::new(MemDisk::new()),
        tail: TailHint::new(),
        failed: AtomicU64::new(0),
    };
    let p = CompactPolicy::DEFAULT;
    let due_at = p.every + p.keep;
    for i in 0..due_at / 2 {
        let now = 1_000 * (i + 1);
        let l = t_
            .claim(ClaimParams {
                run_id: run_id(),
                owner_id: id(&format!("o{i}")),
                holder: holder(10),
                policy: TimingPolicy::default(),
                now: t(now),
                store_floor: None,
            })
            .unwrap();
        let released = t_
            .release(ReleaseParams {
                lease: l,
                now: t(now + 1),
                seal: None,
            })
            .unwrap();
        assert_eq!(released.get(), 2 * i + 2);
    }
    let d = t_.disk.lock().unwrap().clone();
    assert_eq!(
        t_.failed.load(Ordering::Relaxed),
        1,
        "the due release tried"
    );
    assert!(checkpoints(&d).is_empty(), "the checkpoint's create failed");
    assert_eq!(epochs(&d).len() as u64, due_at);
}

// Issue #33: a run that only claims and releases stays small
#[test]
fn two_hundred_cycles_without_prune_keep_the_lease_folder_bounded() {
    let p = CompactPolicy::DEFAULT;
    let mut d = MemDisk::new();
    let mut most = 0;
    for i in 0..200 {
        cycle(&mut d, i);
        most = most.max(epochs(&d).len());
        assert!(checkpoints(&d).len() <= 1);
    }
    assert!(
        most as u64 <= p.every + p.keep + 1,
        "{most} epochs at most, policy {p:?}"
    );
    let v = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert!(v.floor.is_some());
}
