//! Appends and cutoffs: the hash chain, superseded owners fenced, pending cutoffs finalized,
//! and a retired owner's events never counted.

use crate::common::*;
use lease_core::mem::MemDisk;
use lease_core::ops::*;
use lease_core::*;

// PROTOCOL §7.2 step 2, §7.3 step 1, §7.6 step 1, I3, I8
#[test]
fn a_superseded_owner_is_fenced_on_heartbeat_append_and_release() {
    let mut d = MemDisk::new();
    let old = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &old, 10, 1).unwrap();
    let new = takeover(&mut d, "b", 2, 60_000).unwrap();
    let before = d.files.clone();
    // Heartbeat: writes its own beat file (harmless) but reports FENCED.
    let e = heartbeat(&mut d, &old, 60_001, 5).unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED");
    // Append: refused before writing anything (its cutoff exists).
    let e = append(&mut d, &old, 60_002, 2).unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED");
    // Release: a harmless no-op.
    let e = release(&mut d, &old, 60_003).unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED");
    let changed: Vec<_> = d
        .files
        .keys()
        .filter(|k| before.get(k) != d.files.get(k))
        .collect();
    assert_eq!(changed, vec![&FileRef::Beat(old.generation)]);
    // The authoritative record is still the new owner's.
    let s = status(&mut d, 60_010);
    assert_eq!(s.head.unwrap().epoch.owner_id, new.owner_id);
    assert_eq!(counted(&read_events(&mut d, 60_010).unwrap()), vec![1]);
}

// PROTOCOL §7.6, I9
#[test]
fn a_zombie_append_racing_a_takeover_answers_exactly_its_authority() {
    // Interleave the zombie's append with every point of a takeover: whatever the
    // interleaving, an acknowledged event counts and a fenced one does not.
    for split in 0..40 {
        let mut d = MemDisk::new();
        let old = claim(&mut d, "a", 1, 0).unwrap();
        append(&mut d, &old, 10, 1).unwrap();
        let exp = expect_head(&mut d, 60_000);
        let mut tk = Takeover::new(takeover_params("b", 2, 60_000, exp));
        let mut ap = Append::new(
            &old,
            AppendParams {
                event_type: id("late"),
                payload: serde_json::json!(null),
                now: t(60_000),
                tail_hint: None,
            },
        );
        let mut it = None;
        let mut tk_res = None;
        for _ in 0..split {
            match tk.next(it.take()) {
                Step::Io(r) => it = Some(d.perform(r, &all_alive)),
                Step::Done(r) => {
                    tk_res = Some(r);
                    break;
                }
            }
        }
        let ap_res = d.run(&mut ap, &all_alive);
        if tk_res.is_none() {
            let mut input = it;
            loop {
                match tk.next(input.take()) {
                    Step::Io(r) => input = Some(d.perform(r, &all_alive)),
                    Step::Done(r) => {
                        tk_res = Some(r);
                        break;
                    }
                }
            }
        }
        tk_res.unwrap().unwrap();
        let view = read_events(&mut d, 70_000).unwrap();
        match ap_res {
            Ok(a) => assert!(
                counted(&view).contains(&a.sequence.get()),
                "split {split}: acknowledged event {} does not count",
                a.sequence
            ),
            Err(e) => {
                assert_eq!(e.code().as_str(), "FENCED", "split {split}");
                assert_eq!(counted(&view), vec![1], "split {split}");
            }
        }
    }
}

// PROTOCOL §7.6 steps 2–4, §13
#[test]
fn appends_get_consecutive_sequences_and_form_a_hash_chain() {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "a", 1, 0).unwrap();
    let mut hint = None;
    for n in 1..=20u64 {
        let a = d
            .run(
                &mut Append::new(
                    &l,
                    AppendParams {
                        event_type: id("e"),
                        payload: serde_json::json!(n),
                        now: t(n),
                        tail_hint: if n % 3 == 0 { None } else { hint.clone() },
                    },
                ),
                &all_alive,
            )
            .unwrap();
        assert_eq!(a.sequence.get(), n);
        hint = Some((a.sequence, a.hash));
    }
    let v = read_events(&mut d, 100).unwrap();
    assert_eq!(counted(&v), (1..=20).collect::<Vec<_>>());
    let report = d.run(&mut Verify::new(run_id()), &all_alive).unwrap();
    assert_eq!((report.epochs, report.events), (1, 20));
}

// PROTOCOL §7.9 step 5, §7.6 step 1, I4
#[test]
fn a_pending_cutoff_is_finalized_by_the_next_reader() {
    let mut d = MemDisk::new();
    let old = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &old, 5, 1).unwrap();
    // The taker crashes right after creating generation 2 (before FINALIZE).
    let exp = expect_head(&mut d, 60_000);
    let mut tk = Takeover::new(takeover_params("b", 2, 60_000, exp));
    let mut input = None;
    loop {
        match tk.next(input.take()) {
            Step::Io(r @ Request::CreateExclusive(FileRef::Epoch(_), _)) => {
                d.perform(r, &all_alive);
                break;
            }
            Step::Io(r) => input = Some(d.perform(r, &all_alive)),
            Step::Done(r) => panic!("finished early: {r:?}"),
        }
    }
    assert!(!d.files.contains_key(&FileRef::Cutoff(old.generation)));
    // A read-only reader reports the zombie's generation as pending...
    let ro = d
        .run(&mut ReadEvents::new(run_id(), None), &all_alive)
        .unwrap();
    assert_eq!(ro.events[0].standing, Standing::Pending);
    // ...a finalizing reader decides the cutoff as the log tail now (1).
    let v = read_events(&mut d, 60_100).unwrap();
    assert_eq!(counted(&v), vec![1]);
    // The zombie's next append is past the cutoff and fenced.
    assert_eq!(
        append(&mut d, &old, 60_200, 2).unwrap_err().code().as_str(),
        "FENCED"
    );
    assert_eq!(counted(&read_events(&mut d, 60_300).unwrap()), vec![1]);
}

// PROTOCOL §7.9 step 6, I4
#[test]
fn corrupting_or_deleting_the_newest_epoch_never_makes_a_retired_owners_events_count() {
    let mut d = MemDisk::new();
    let old = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &old, 5, 1).unwrap();
    let new = takeover(&mut d, "b", 2, 60_000).unwrap();
    // Simulate a zombie that wrote past its cutoff behind the protocol's back.
    let zombie_event = {
        let prev = d.files[&FileRef::Event(Sequence::FIRST)].clone();
        encode(&Event {
            run_id: run_id(),
            sequence: Sequence::new(2).unwrap(),
            generation: old.generation,
            owner_id: old.owner_id.clone(),
            event_type: id("late"),
            payload: serde_json::json!(null),
            timestamp: t(60_001),
            prev_hash: Some(Digest::of(&prev)),
        })
        .unwrap()
    };
    d.files
        .insert(FileRef::Event(Sequence::new(2).unwrap()), zombie_event);
    assert_eq!(counted(&read_events(&mut d, 60_010).unwrap()), vec![1]);
    // Corrupt the newest epoch: reading fails with a typed error naming the file.
    let good = d.files[&FileRef::Epoch(new.generation)].clone();
    d.files
        .insert(FileRef::Epoch(new.generation), b"{}\n".to_vec());
    let e = read_events(&mut d, 60_020).unwrap_err();
    assert_eq!(e.code().as_str(), "RECORD_INVALID");
    assert!(
        e.to_string()
            .contains("lease/epochs/00000000000000000002.json"),
        "{e}"
    );
    // Delete it: the cutoff still applies.
    d.files.remove(&FileRef::Epoch(new.generation));
    assert_eq!(counted(&read_events(&mut d, 60_030).unwrap()), vec![1]);
    d.files.insert(FileRef::Epoch(new.generation), good);
}

/// OQ-2 (docs/DECISIONS.md; was PROTOCOL.md §15): a taker crashes after creating its epoch
/// and before finalizing the cutoff of the owner it replaced; a second taker replaces it.
/// The first owner, paused all along, must not be able to finalize its own (missing) cutoff
/// later and count.
// PROTOCOL §7.0 GATE, I13
#[test]
fn a_cutoff_left_pending_by_a_crashed_taker_is_finalized_before_the_chain_moves_on() {
    let mut d = MemDisk::new();
    let a = claim(&mut d, "a", 1, 0).unwrap();
    append(&mut d, &a, 5, 1).unwrap();
    // B takes over A and crashes right after creating generation 2.
    let exp = expect_head(&mut d, 60_000);
    let mut tk = Takeover::new(takeover_params("b", 2, 60_000, exp));
    let mut input = None;
    loop {
        match tk.next(input.take()) {
            Step::Io(r @ Request::CreateExclusive(FileRef::Epoch(_), _)) => {
                d.perform(r, &all_alive);
                break;
            }
            Step::Io(r) => input = Some(d.perform(r, &all_alive)),
            Step::Done(r) => panic!("finished early: {r:?}"),
        }
    }
    // C takes over B (stale) and appends.
    let c = takeover(&mut d, "c", 3, 200_000).unwrap();
    assert_eq!(c.generation.get(), 3);
    let c1 = append(&mut d, &c, 200_001, 2).unwrap();
    // A wakes up and appends: it must be fenced, and its event must not count.
    let e = append(&mut d, &a, 200_002, 3).unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED");
    let v = read_events(&mut d, 200_003).unwrap();
    assert_eq!(counted(&v), vec![1, c1.sequence.get()]);
}
