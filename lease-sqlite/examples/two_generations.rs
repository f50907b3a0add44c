//! lease-sqlite alone: the store of a run across two owners. Generation 1 commits and
//! seals; generation 2 opens it against the seal, commits, and a late commit of
//! generation 1 is fenced inside the transaction; a copy of the store from before the
//! seal (a restored backup) is refused.
//!
//! Run: `cargo run -p lease-sqlite --example two_generations`

use lease_core::seal::Requirements;
use lease_core::{Generation, RunId};
use lease_sqlite::{Batch, Store, StoreOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("store/run.sqlite");
    let run = RunId::new("job")?;
    let (g1, g2) = (
        Generation::new(1).expect("1"),
        Generation::new(2).expect("2"),
    );

    // Generation 1: create the store (no seal yet: the lease chain names no store).
    let opened = Store::open(
        &run,
        &path,
        StoreOptions {
            create: true,
            expect: None,
        },
    )?;
    let mut store = opened.check_seal(None, None)?;
    store.commit(g1, &Batch::new().put("step", "1").log("step 1"))?;
    // A backup taken now, before the next commit.
    store.close()?;
    let backup = dir.path().join("backup.sqlite");
    std::fs::copy(&path, &backup)?;
    let mut store =
        Store::open(&run, &path, StoreOptions::default())?.check(&Requirements::no_chain())?;
    store.commit(g1, &Batch::new().put("step", "2").log("step 2"))?;
    let seal = store.seal(g1)?;
    println!(
        "generation 1 sealed store {} at sequence {}",
        seal.store_id, seal.sequence
    );

    // Generation 2: its lease chain names generation 1's seal (an owner reads it with
    // `LeaseOps::store_requirements`); one call opens the sealed store and checks it.
    let chain = Requirements::new(Some(seal.clone()), None);
    let mut store = Store::open_for_chain(&run, &path, &chain)?;
    let seq = store.commit(g2, &Batch::new().put("step", "3"))?;
    println!("generation 2 committed sequence {seq}");

    // A late commit of generation 1 (a paused old owner): refused inside the transaction.
    let late = store
        .commit(g1, &Batch::new().put("step", "late"))
        .expect_err("a superseded token is fenced");
    println!("late commit of generation 1: {late}");
    assert_eq!(late.code().as_str(), "FENCED");
    assert_eq!(store.get("step")?.expect("a value").value, b"3");
    store.close()?;

    // The backup put back in place: same store id, but behind the seal. Refused, untouched.
    std::fs::copy(&backup, &path)?;
    let rewound = Store::open_for_chain(&run, &path, &chain)
        .map(|_| ())
        .expect_err("a rewound store is refused");
    println!("rewound copy: {rewound}");
    assert_eq!(rewound.code().as_str(), "STORE_BEHIND_SEAL");
    Ok(())
}
