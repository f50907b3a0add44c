//! Exhaustive, bounded, breadth-first model check of the engine-committed store (PROTOCOL.md
//! §18, issue #32) *as implemented*: lease-core's step machines (claim, retire, the store
//! log's read and commit) over an etcd-like engine, the in-memory authority, whose every
//! request is one atomic step (a guarded create is one transaction with its compares).
//!
//! The network is the nemesis. Any request of a store commit may be answered, have its
//! answer lost after it took effect, or be held in the network (a partition) and delivered
//! at any later point, or never; an actor whose answer is lost resolves the commit with the
//! same record ([`CommitRecord::again`]), as lease-run does. Owners on other hosts retire the
//! owner (its etcd lease expired while it was cut off: the engine's liveness says dead),
//! claim, catch up by reading the log, and commit, while the deposed owner keeps trying.
//! Owners also snapshot and truncate the log behind the snapshot (§18.5) while a reader
//! without a lease reads it (`runlease store get` over etcd), and reads again when told
//! `CONCURRENT_CHANGE`.
//!
//! Checked in every state: **S1** every acknowledged record is in the log, byte for byte;
//! **S2** no record of a generation lands once an epoch above it exists (checked when it
//! lands, including a late delivery), and no record whose writer was told `FENCED` or
//! `CONCURRENT_CHANGE` is ever in the log; **S3** the log reads as one valid chain, and a
//! slot is never held by two different records over time; and, when a read answers (an
//! owner's catch-up or a reader's), it holds every record acknowledged before it began:
//! among its records, or folded into its snapshot (whose `through_hash` leads back to it).
//!
//! `RUNLEASE_MODEL=ci` (`cargo xtask model`) and `deep` (`cargo xtask model --deep`)
//! explore larger configurations than the default `cargo test` bound.

#[path = "../common/mod.rs"]
mod common;

mod checks;
mod explore;
mod world;

use explore::explore_covering;
use world::{Config, Do, Op, World, world};

fn configs(mode: &str) -> Vec<Config> {
    use Do::*;
    let scale = match mode {
        "deep" => 8.0,
        "ci" => 1.0,
        _ => 0.05,
    };
    let cap = |n: f64| (n * scale) as usize;
    let deep = mode == "deep";
    let mut a = vec![Claim, Commit, Commit];
    let mut b = vec![Retire, Claim, Read, Commit];
    if mode == "ci" || deep {
        a.push(Commit);
        b.push(Commit);
    }
    if deep {
        a.push(Commit);
    }
    vec![
        Config {
            name: "owner committing with lost answers vs a taker on another host (retire, claim, catch up, commit)",
            scripts: vec![('a', a.clone()), ('b', b.clone())],
            losses: if deep { 4 } else { 2 },
            max_states: cap(150_000.0),
        },
        Config {
            name: "two takers in turn, the deposed owners' commits in flight",
            scripts: vec![
                ('a', vec![Claim, Commit, Commit]),
                ('b', vec![Retire, Claim, Read, Commit, Commit]),
                ('c', vec![Retire, Claim, Read, Commit]),
            ],
            losses: if deep { 2 } else { 1 },
            max_states: cap(150_000.0),
        },
        Config {
            name: "snapshots and truncation by an owner and its taker, a reader without a lease, lost answers",
            scripts: vec![
                ('a', vec![Claim, Commit, Commit, Snapshot, Commit]),
                ('b', vec![Retire, Claim, Read, Commit, Snapshot, Commit]),
                ('o', vec![Observe, Observe]),
            ],
            losses: if deep { 2 } else { 1 },
            max_states: cap(150_000.0),
        },
    ]
}

#[test]
// A test of lease-core, not lease-core: it reads its bound from the environment
// (`cargo xtask model` sets it) and times itself for the report line.
#[expect(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "the test's own configuration and timing, not the core's"
)]
fn engine_model_check_the_store_log_as_implemented() {
    let mode = std::env::var("RUNLEASE_MODEL").unwrap_or_default();
    for c in configs(&mode) {
        let started = std::time::Instant::now();
        let ((states, violation), cov) = explore_covering(&c);
        if let Some(trace) = violation {
            panic!(
                "engine model ({}): invariant violated after {states} states:\n{}",
                c.name,
                trace.join("\n")
            );
        }
        println!(
            "engine model states explored: {states}, invariant violations: 0 ({}; {}; {:.1} s)",
            c.name,
            if states < c.max_states {
                "exhaustive"
            } else {
                "bounded"
            },
            started.elapsed().as_secs_f64()
        );
        println!("engine model coverage: {cov:?}");
        assert!(states > 50, "the model explored too little: {states}");
        assert!(
            cov.refused > 0 && cov.lost > 0 && cov.held > 0 && cov.late > 0 && cov.resolutions > 0,
            "the model did not reach every case it is for: {cov:?}"
        );
        if c.name.starts_with("snapshots") {
            // A reader racing a truncation needs more than the default bound's states.
            assert!(
                cov.truncations > 0 && cov.observer_retries > 0,
                "the snapshot configuration did not truncate under a reader: {cov:?}"
            );
        }
    }
}

/// The checker can fail: a committer that takes any record found in its slot for its own
/// (no comparison of the bytes) is caught (the planted bug is in this test's own copy of
/// the answer handling: an `AlreadyExists` answered as `Created`).
#[test]
fn engine_model_catches_a_commit_acknowledged_without_its_record() {
    let c = Config {
        name: "planted bug",
        scripts: vec![
            ('a', vec![Do::Claim, Do::Commit, Do::Commit]),
            ('b', vec![Do::Retire, Do::Claim, Do::Read, Do::Commit]),
        ],
        losses: 1,
        max_states: 200_000,
    };
    let mut start = world(&c);
    // Drive a schedule by hand: a claims and its commit's request is held by the network;
    // b retires a, claims, reads and commits into the same slot; the planted bug then
    // answers a's resolution (which finds b's record) as committed.
    let mut w = start.clone();
    let run = |w: &mut World, i: usize| {
        w.start(i);
        w.feed(i, None).unwrap();
        while let Some(req) = w.actors[i].pending.take() {
            let resp = w.perform(req).unwrap();
            w.feed(i, Some(resp)).unwrap();
        }
    };
    run(&mut w, 0); // a claims
    w.start(0);
    w.feed(0, None).unwrap();
    let held = w.actors[0].pending.take().unwrap();
    if let Some(Op::Commit(m)) = w.actors[0].op.take() {
        w.actors[0].unresolved = Some(m);
    }
    w.network.push(held);
    for _ in 0..4 {
        run(&mut w, 1); // b: retire, claim, read, commit
    }
    assert_eq!(w.acked.len(), 1, "b's commit is acknowledged");
    // The planted bug: a's resolution is told "committed" whatever the slot holds.
    let u = w.actors[0].unresolved.take().unwrap();
    w.acked.push((u.sequence().get(), u.record().to_vec()));
    let e = w.check().unwrap_err();
    assert!(e.starts_with("S1"), "{e}");
    // And the real machine, on the same schedule, is told FENCED and the state is valid.
    let mut ok = start.clone();
    run(&mut ok, 0);
    ok.start(0);
    ok.feed(0, None).unwrap();
    let held = ok.actors[0].pending.take().unwrap();
    if let Some(Op::Commit(m)) = ok.actors[0].op.take() {
        ok.actors[0].unresolved = Some(m);
    }
    ok.network.push(held);
    for _ in 0..4 {
        run(&mut ok, 1);
    }
    run(&mut ok, 0); // a resolves
    assert_eq!(ok.refused.len(), 1, "a's record is refused");
    ok.check().unwrap();
    start.check().unwrap();
}
