//! Prune: compaction that changes no judgment, concurrent prunes and readers, strays below
//! the floor, and refusal under an invalid head.

use crate::common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;

// PROTOCOL §7.10, §13, I12
#[test]
fn prune_keeps_a_run_small_and_every_judgment_unchanged() {
    let mut d = MemDisk::new();
    let mut now = 0;
    let mut zombie = None;
    for i in 0..60u64 {
        now += 100_000;
        let l = match claim(&mut d, &format!("o{i}"), 10 + i as u32, now) {
            Ok(l) => l,
            Err(_) => takeover(&mut d, &format!("o{i}"), 10 + i as u32, now).unwrap(),
        };
        append(&mut d, &l, now + 1, i).unwrap();
        if i % 3 == 0 {
            // Without the release's own compaction (§7.3 step 7): this test is about one
            // explicit prune over the whole history.
            release_uncompacted(&mut d, &l, now + 2).unwrap();
        } else if i == 10 {
            zombie = Some(l);
        }
    }
    // A zombie of generation ~ (i=10) appends late: past its cutoff.
    let z = zombie.unwrap();
    assert_eq!(
        append(&mut d, &z, now + 10, 999)
            .unwrap_err()
            .code()
            .as_str(),
        "FENCED"
    );
    let before = read_events(&mut d, now + 20).unwrap();
    let files_before = d.files.len();
    let report = d
        .run(
            &mut Prune::new(PruneParams {
                run_id: run_id(),
                keep: 4,
                by: id("pruner"),
                now: t(now + 30),
            }),
            &all_alive,
        )
        .unwrap();
    assert!(report.floor.is_some() && report.removed > 100, "{report:?}");
    assert!(d.files.len() < files_before - 100);
    let after = read_events(&mut d, now + 40).unwrap();
    assert_eq!(counted(&before), counted(&after));
    // A zombie below the floor stays fenced.
    assert_eq!(
        append(&mut d, &z, now + 50, 1000)
            .unwrap_err()
            .code()
            .as_str(),
        "FENCED"
    );
    let v = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert_eq!(v.floor, report.floor);
    // Claims keep working above the floor.
    let head = status(&mut d, now + 60).head.unwrap();
    assert!(head.generation() > report.floor.unwrap());
}

/// OQ-17 (docs/DECISIONS.md; was PROTOCOL.md §15): two prunes interleaved at every point
/// never change which events count (a prune that sees the chain change under it gives up
/// with CONCURRENT_CHANGE).
// PROTOCOL §7.10, I12
#[test]
fn concurrent_prunes_never_change_which_events_count() {
    fn build() -> MemDisk {
        let mut d = MemDisk::new();
        let mut now = 0;
        for i in 0..12u64 {
            now += 100_000;
            let l = match claim(&mut d, &format!("o{i}"), 10 + i as u32, now) {
                Ok(l) => l,
                Err(_) => takeover(&mut d, &format!("o{i}"), 10 + i as u32, now).unwrap(),
            };
            append(&mut d, &l, now + 1, i).unwrap();
            if i % 2 == 0 {
                release(&mut d, &l, now + 2).unwrap();
            }
        }
        d
    }
    let prune = |keep: u64| {
        Prune::new(PruneParams {
            run_id: run_id(),
            keep,
            by: id("pruner"),
            now: t(10_000_000),
        })
    };
    let mut base = build();
    let expected = counted(&read_events(&mut base, 9_000_000).unwrap());
    let mut explored = 0;
    for (k1, k2) in [(8u64, 4u64), (4, 8), (5, 5)] {
        for split in 0..120 {
            let mut d = build();
            let (mut p1, mut p2) = (prune(k1), prune(k2));
            let (mut i1, mut i2) = (None, None);
            let (mut r1, mut r2) = (None, None);
            let mut n = 0;
            while r1.is_none() || r2.is_none() {
                let first = n < split || r2.is_some();
                n += 1;
                if first && r1.is_none() {
                    match p1.next(i1.take()) {
                        Step::Io(r) => i1 = Some(d.perform(r, &all_alive)),
                        Step::Done(r) => r1 = Some(r),
                    }
                } else if r2.is_none() {
                    match p2.next(i2.take()) {
                        Step::Io(r) => i2 = Some(d.perform(r, &all_alive)),
                        Step::Done(r) => r2 = Some(r),
                    }
                } else {
                    match p1.next(i1.take()) {
                        Step::Io(r) => i1 = Some(d.perform(r, &all_alive)),
                        Step::Done(r) => r1 = Some(r),
                    }
                }
            }
            for r in [r1.unwrap(), r2.unwrap()] {
                if let Err(e) = r {
                    assert_eq!(e.code().as_str(), "CONCURRENT_CHANGE", "{e}");
                }
            }
            let got = counted(&read_events(&mut d, 9_000_000).unwrap());
            assert_eq!(got, expected, "keep {k1}/{k2}, split {split}");
            explored += 1;
        }
    }
    assert!(explored > 300);
}

/// OQ-15 (docs/DECISIONS.md; was PROTOCOL.md §15): a reader (and verify) interleaved with a
/// prune at every point sees exactly the same judgments, or answers CONCURRENT_CHANGE;
/// never a wrong answer and never CHAIN_BROKEN.
// PROTOCOL §7.9, §7.10, I12
#[test]
fn a_reader_racing_a_prune_never_misjudges_and_verify_never_reports_a_broken_chain() {
    fn build() -> MemDisk {
        let mut d = MemDisk::new();
        let mut now = 0;
        for i in 0..10u64 {
            now += 100_000;
            let l = match claim(&mut d, &format!("o{i}"), 10 + i as u32, now) {
                Ok(l) => l,
                Err(_) => takeover(&mut d, &format!("o{i}"), 10 + i as u32, now).unwrap(),
            };
            append(&mut d, &l, now + 1, i).unwrap();
            if i % 2 == 0 {
                release(&mut d, &l, now + 2).unwrap();
            }
        }
        d
    }
    let mut base = build();
    let expected = counted(&read_events(&mut base, 9_000_000).unwrap());
    for (split, rsplit) in (0..60)
        .step_by(3)
        .flat_map(|a| (0..40).step_by(4).map(move |b| (a, b)))
    {
        for verify in [false, true] {
            let mut d = build();
            let mut p = Prune::new(PruneParams {
                run_id: run_id(),
                keep: 3,
                by: id("pruner"),
                now: t(10_000_000),
            });
            let mut pi = None;
            let mut pdone = false;
            for _ in 0..split {
                match p.next(pi.take()) {
                    Step::Io(r) => pi = Some(d.perform(r, &all_alive)),
                    Step::Done(r) => {
                        r.unwrap();
                        pdone = true;
                        break;
                    }
                }
            }
            // The reader runs one request at a time, the prune finishes in between.
            let mut reader = ReadEvents::new(run_id(), None);
            let mut verifier = Verify::new(run_id());
            let mut ri = None;
            let mut reader_steps = 0;
            let result = loop {
                let step = if verify {
                    match verifier.next(ri.take()) {
                        Step::Io(r) => Step::Io(r),
                        Step::Done(r) => Step::Done(r.map(|_| None)),
                    }
                } else {
                    match reader.next(ri.take()) {
                        Step::Io(r) => Step::Io(r),
                        Step::Done(r) => Step::Done(r.map(Some)),
                    }
                };
                match step {
                    Step::Io(r) => ri = Some(d.perform(r, &all_alive)),
                    Step::Done(r) => break r,
                }
                reader_steps += 1;
                if reader_steps == rsplit && !pdone {
                    loop {
                        match p.next(pi.take()) {
                            Step::Io(r) => pi = Some(d.perform(r, &all_alive)),
                            Step::Done(r) => {
                                r.unwrap();
                                pdone = true;
                                break;
                            }
                        }
                    }
                }
            };
            match result {
                Ok(Some(view)) => assert_eq!(counted(&view), expected, "split {split}/{rsplit}"),
                Ok(None) => {}
                Err(e) => assert_eq!(
                    e.code().as_str(),
                    "CONCURRENT_CHANGE",
                    "split {split}/{rsplit} verify {verify}: {e}"
                ),
            }
        }
    }
}

/// Issue #28: verify (and doctor's `STRAY_EPOCHS`) reported epochs left below the
/// checkpoint floor (a claimer that lost to a compaction, a prune that crashed in its
/// removals) and named prune, which said "nothing to prune" and left them. With nothing to
/// compact, prune now removes what is below the existing floor, after syncing the
/// checkpoint it read; judgments are unchanged and verify reports no stray.
// PROTOCOL §7.10 step 2, §13, I12
#[test]
fn prune_with_nothing_to_compact_removes_the_strays_below_the_floor() {
    let mut d = MemDisk::new();
    let mut kept = Vec::new();
    for i in 0..8u64 {
        let l = claim(&mut d, &format!("o{i}"), 10 + i as u32, i * 100).unwrap();
        append(&mut d, &l, i * 100 + 1, i).unwrap();
        release(&mut d, &l, i * 100 + 2).unwrap();
        kept.push(d.files.clone());
    }
    let prune = |keep| {
        Prune::new(PruneParams {
            run_id: run_id(),
            keep,
            by: id("pruner"),
            now: t(5_000),
        })
    };
    let first = d.run(&mut prune(4), &all_alive).unwrap();
    let floor = first.floor.unwrap();
    // Strays: the records of two generations below the floor come back (as a prune's
    // lost removals would).
    let strays: Vec<Generation> = [1, 3].map(|g| Generation::new(g).unwrap()).to_vec();
    for g in &strays {
        assert!(*g < floor);
        let all = kept.last().unwrap();
        d.files
            .insert(FileRef::Epoch(*g), all[&FileRef::Epoch(*g)].clone());
        d.files
            .insert(FileRef::Cutoff(*g), all[&FileRef::Cutoff(*g)].clone());
    }
    let v = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert_eq!(v.strays, strays);
    let before = read_events(&mut d, 6_000).unwrap();
    d.counts.clear();
    let r = d.run(&mut prune(4), &all_alive).unwrap();
    assert_eq!(
        r,
        PruneReport {
            floor: None,
            removed: 4
        }
    );
    // The checkpoint it read was synced before anything it folds was removed.
    assert_eq!(d.counts.get("sync"), Some(&1), "{:?}", d.counts);
    let v = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert!(v.strays.is_empty(), "{v:?}");
    assert_eq!(v.floor, Some(floor));
    assert!(d.files.keys().all(|f| match f {
        FileRef::Epoch(g) | FileRef::Cutoff(g) => *g >= floor,
        _ => true,
    }));
    let after = read_events(&mut d, 6_000).unwrap();
    assert_eq!(counted(&before), counted(&after));
    // Nothing left below the floor: nothing to do, nothing synced.
    d.counts.clear();
    let r = d.run(&mut prune(4), &all_alive).unwrap();
    assert_eq!(
        r,
        PruneReport {
            floor: None,
            removed: 0
        }
    );
    assert_eq!(d.counts.get("sync"), None);
}

/// Found by the model checker's random walks: prune compacted the chain while the head
/// epoch was hand-corrupted. Bad input must be reported, never worked around: prune now
/// refuses and removes nothing.
#[test]
fn prune_refuses_to_compact_under_an_invalid_head_and_removes_nothing() {
    let mut d = MemDisk::new();
    for i in 0..6u64 {
        let l = claim(&mut d, &format!("o{i}"), 10 + i as u32, i * 100).unwrap();
        release(&mut d, &l, i * 100 + 1).unwrap();
    }
    let head = status(&mut d, 1_000).head.unwrap().generation();
    d.files.insert(FileRef::Epoch(head), b"{}\n".to_vec());
    let before = d.files.clone();
    let e = d
        .run(
            &mut Prune::new(PruneParams {
                run_id: run_id(),
                keep: 2,
                by: id("pruner"),
                now: t(2_000),
            }),
            &all_alive,
        )
        .unwrap_err();
    assert_eq!(e.code().as_str(), "RECORD_INVALID", "{e}");
    assert_eq!(d.files, before);
}
