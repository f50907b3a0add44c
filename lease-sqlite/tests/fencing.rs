//! The fencing-token check: a property over random interleavings of two owners and a
//! takeover, and the commit gate, seal and read paths around it.

mod common;

use common::{g, open_store, run};
use lease_core::LeaseError;
use lease_sqlite::{Batch, Store, StoreError, StoreOptions, Write};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// A random batch over a small key space (so puts, overwrites and deletes collide).
fn batch() -> impl Strategy<Value = Batch> {
    let write = prop_oneof![
        3 => (0u8..6, proptest::collection::vec(any::<u8>(), 0..24))
            .prop_map(|(k, v)| Write::Put { key: format!("doc/{k}"), value: v }),
        1 => (0u8..6).prop_map(|k| Write::Delete { key: format!("doc/{k}") }),
    ];
    (
        proptest::collection::vec(write, 0..5),
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..16), 0..3),
    )
        .prop_map(|(writes, log)| Batch { writes, log })
}

fn apply(docs: &mut BTreeMap<String, (Vec<u8>, u64)>, seq: u64, b: &Batch) {
    for w in &b.writes {
        match w {
            Write::Put { key, value } => {
                docs.insert(key.clone(), (value.clone(), seq));
            }
            Write::Delete { key } => {
                docs.remove(key);
            }
        }
    }
}

/// Compare everything readable with the model of accepted commits.
fn check_against_model(
    store: &Store,
    accepted: &[(u64, u64, Batch)],
    docs: &BTreeMap<String, (Vec<u8>, u64)>,
) -> Result<(), TestCaseError> {
    let commits = store.commits_since(0).unwrap();
    prop_assert_eq!(commits.len(), accepted.len());
    for (i, (c, (seq, token, b))) in commits.iter().zip(accepted).enumerate() {
        prop_assert_eq!(c.seq, i as u64 + 1, "sequences are contiguous from 1");
        prop_assert_eq!(c.seq, *seq);
        prop_assert_eq!(c.token, *token);
        prop_assert_eq!(&c.writes, &b.writes);
        prop_assert_eq!(&c.log, &b.log);
    }
    prop_assert_eq!(store.head().unwrap(), accepted.len() as u64);
    let scanned: BTreeMap<String, (Vec<u8>, u64)> = store
        .scan_prefix("")
        .unwrap()
        .into_iter()
        .map(|d| (d.key, (d.value, d.updated_seq)))
        .collect();
    prop_assert_eq!(&scanned, docs);
    for (key, (value, seq)) in docs {
        let d = store.get(key).unwrap().unwrap();
        prop_assert_eq!((&d.value, d.updated_seq), (value, *seq));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Two owners, the old one with token `g` and the new one with `g+1`, commit in a random
    /// interleaving; before the takeover point only the old owner exists. Every commit of
    /// the old token after the new token's first commit is refused `FENCED` and writes
    /// nothing; every commit that returned `Ok` is readable afterwards (in order, with its
    /// token and writes; sequences contiguous), also after closing and reopening.
    #[test]
    fn token_fencing_property(
        old in 1u64..1_000_000,
        takeover in 0usize..24,
        steps in proptest::collection::vec((any::<bool>(), batch()), 1..24),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store/run.sqlite");
        let mut store = open_store(&path);
        let new = old + 1;
        let mut accepted: Vec<(u64, u64, Batch)> = Vec::new();
        let mut docs = BTreeMap::new();
        let mut new_has_committed = false;
        for (i, (by_new, b)) in steps.iter().enumerate() {
            let by_new = *by_new && i >= takeover;
            let token = if by_new { new } else { old };
            let head_before = store.head().unwrap();
            match store.commit(g(token), b) {
                Ok(seq) => {
                    prop_assert!(by_new || !new_has_committed,
                        "old token {old} committed after the new token {new} did");
                    prop_assert_eq!(seq, accepted.len() as u64 + 1);
                    apply(&mut docs, seq, b);
                    accepted.push((seq, token, b.clone()));
                    new_has_committed |= by_new;
                }
                Err(StoreError::Fenced { token: t, max_token, run: r, file }) => {
                    prop_assert!(!by_new && new_has_committed, "refused without cause");
                    prop_assert_eq!((t, max_token), (old, new));
                    prop_assert_eq!(r, run().to_string());
                    prop_assert_eq!(file, path.display().to_string());
                    prop_assert_eq!(store.head().unwrap(), head_before, "a fenced commit wrote");
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
            prop_assert_eq!(store.max_token().unwrap(), if new_has_committed { new } else { old });
        }
        check_against_model(&store, &accepted, &docs)?;
        store.close().unwrap();
        let store = Store::open(&run(), &path, StoreOptions::default())
            .unwrap()
            .check_seal(None, Some((accepted.len() as u64, g(new))))
            .unwrap();
        check_against_model(&store, &accepted, &docs)?;
    }
}

#[test]
fn an_equal_token_commits_and_a_lower_one_after_a_higher_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.sqlite");
    let mut store = open_store(&path);
    assert_eq!(store.max_token().unwrap(), 0);
    assert_eq!(store.commit(g(5), &Batch::new().put("a", "1")).unwrap(), 1);
    assert_eq!(store.commit(g(5), &Batch::new().put("a", "2")).unwrap(), 2);
    assert_eq!(store.commit(g(9), &Batch::new()).unwrap(), 3);
    let e = store
        .commit(g(8), &Batch::new().put("a", "late"))
        .unwrap_err();
    common::assert_refused(&e, "FENCED", &path);
    assert!(e.to_string().contains("token (generation) 8"), "{e}");
    assert!(e.to_string().contains("accepted token 9"), "{e}");
    assert_eq!(store.get("a").unwrap().unwrap().value, b"2");
    assert_eq!(store.head().unwrap(), 3);
    store.close().unwrap();
}

#[test]
fn commit_gate_refuses_before_the_transaction() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.sqlite");
    let mut store = open_store(&path);
    let lapsed = Arc::new(AtomicBool::new(false));
    let flag = lapsed.clone();
    store.set_commit_gate(Box::new(move || {
        if flag.load(Ordering::SeqCst) {
            Err(LeaseError::Fenced {
                run: "test-run".into(),
                generation: g(3),
                detail: "self-fence: last heartbeat started too long ago".into(),
            }
            .into())
        } else {
            Ok(())
        }
    }));
    assert_eq!(store.commit(g(3), &Batch::new().put("k", "v")).unwrap(), 1);
    lapsed.store(true, Ordering::SeqCst);
    let e = store.commit(g(3), &Batch::new().put("k", "w")).unwrap_err();
    common::assert_refused(&e, "FENCED", &path);
    assert!(e.to_string().contains("self-fence"), "{e}");
    assert_eq!(store.head().unwrap(), 1);
    assert_eq!(store.get("k").unwrap().unwrap().value, b"v");
    // A self-fenced owner cannot seal either.
    let e = store.seal(g(3)).unwrap_err();
    assert_eq!(e.code().as_str(), "FENCED");
    // The handle was consumed and dropped: the file can be opened again.
    let store = open_store(&path);
    assert_eq!(store.head().unwrap(), 1);
}

#[test]
fn a_fenced_generation_cannot_seal_and_a_seal_raises_the_fence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.sqlite");
    let mut store = open_store(&path);
    store.commit(g(4), &Batch::new().put("x", "1")).unwrap();
    let e = open_store_err_free_seal(store, 3);
    common::assert_refused(&e, "FENCED", &path);
    // Sealing as generation 6 (never committed) raises the fence to 6.
    let store = open_store(&path);
    let seal = store.seal(g(6)).unwrap();
    assert_eq!((seal.sequence, seal.generation), (1, g(6)));
    let mut store = Store::open(&run(), &path, StoreOptions::default())
        .unwrap()
        .check_seal(Some(&seal), None)
        .unwrap();
    assert_eq!(store.identity().unwrap().store_id, seal.store_id.as_str());
    assert_eq!(
        store
            .commit(g(5), &Batch::new())
            .unwrap_err()
            .code()
            .as_str(),
        "FENCED"
    );
    assert_eq!(store.commit(g(7), &Batch::new()).unwrap(), 2);
}

fn open_store_err_free_seal(store: Store, generation: u64) -> StoreError {
    store.seal(g(generation)).unwrap_err()
}

#[test]
fn reads_prefix_scan_deletes_and_paging() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.sqlite");
    let mut store = open_store(&path);
    let b = Batch::new()
        .put("a/1", "x")
        .put("a/2", "y")
        .put("a\u{10FFFF}", "edge")
        .put("ab", "z")
        .put("b", "w")
        .put("", "empty key")
        .log("first");
    assert_eq!(store.commit(g(1), &b).unwrap(), 1);
    store
        .commit(
            g(1),
            &Batch::new()
                .delete("a/2")
                .delete("missing")
                .put("a/1", "x2"),
        )
        .unwrap();
    let keys = |p: &str| -> Vec<String> {
        store
            .scan_prefix(p)
            .unwrap()
            .into_iter()
            .map(|d| d.key)
            .collect()
    };
    assert_eq!(keys("a/"), ["a/1"]);
    assert_eq!(keys("a"), ["a/1", "ab", "a\u{10FFFF}"]);
    assert_eq!(keys("a\u{10FFFF}"), ["a\u{10FFFF}"]);
    assert_eq!(keys("c"), Vec::<String>::new());
    assert_eq!(keys("").len(), 5);
    let a1 = store.get("a/1").unwrap().unwrap();
    assert_eq!((a1.value.as_slice(), a1.updated_seq), (&b"x2"[..], 2));
    assert!(store.get("a/2").unwrap().is_none());
    let since1 = store.commits_since(1).unwrap();
    assert_eq!(since1.len(), 1);
    assert_eq!(
        since1[0].writes,
        [
            Write::Delete { key: "a/2".into() },
            Write::Delete {
                key: "missing".into()
            },
            Write::Put {
                key: "a/1".into(),
                value: b"x2".to_vec()
            }
        ]
    );
    let page = store.commits_page(0, 1).unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].log, [b"first".to_vec()]);
    assert_eq!(page[0].committed_at.len(), 24);
    assert!(store.commits_since(2).unwrap().is_empty());
    let e = store.commits_since(u64::MAX).unwrap_err();
    assert_eq!(e.code().as_str(), "ARGUMENT_INVALID");
    let e = store.commit(g(u64::MAX), &Batch::new()).unwrap_err();
    assert_eq!(e.code().as_str(), "ARGUMENT_INVALID");
    assert_eq!(store.head().unwrap(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// A group commit is the same as committing its batches one by one: the same
    /// sequences (consecutive, one per batch), tokens, writes, log entries and documents,
    /// after reopening too; a group with a fenced token commits none of its batches.
    #[test]
    fn a_group_commit_equals_its_batches_committed_one_by_one(
        groups in proptest::collection::vec(
            (any::<bool>(), proptest::collection::vec(batch(), 0..5)), 1..8),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let grouped_path = dir.path().join("grouped/run.sqlite");
        let single_path = dir.path().join("single/run.sqlite");
        let mut grouped = open_store(&grouped_path);
        let mut single = open_store(&single_path);
        let mut accepted: Vec<(u64, u64, Batch)> = Vec::new();
        let mut docs = BTreeMap::new();
        // A newer writer (token 7) commits first, so every group of token 6 is fenced.
        grouped.commit(g(7), &Batch::new()).unwrap();
        single.commit(g(7), &Batch::new()).unwrap();
        accepted.push((1, 7, Batch::new()));
        for (stale, group) in &groups {
            let token = if *stale { 6 } else { 7 };
            let head = grouped.head().unwrap();
            match grouped.commit_group(g(token), group) {
                Ok(seqs) => {
                    // An empty group commits nothing, so it is never refused.
                    prop_assert!(!stale || group.is_empty());
                    let want: Vec<u64> = (head + 1..=head + group.len() as u64).collect();
                    prop_assert_eq!(&seqs, &want);
                    for (seq, b) in seqs.iter().zip(group) {
                        prop_assert_eq!(single.commit(g(token), b).unwrap(), *seq);
                        apply(&mut docs, *seq, b);
                        accepted.push((*seq, token, b.clone()));
                    }
                }
                Err(StoreError::Fenced { .. }) => {
                    prop_assert!(*stale && !group.is_empty());
                    prop_assert_eq!(grouped.head().unwrap(), head, "a fenced group wrote");
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
        check_against_model(&grouped, &accepted, &docs)?;
        check_against_model(&single, &accepted, &docs)?;
        grouped.close().unwrap();
        let reopened = Store::open(&run(), &grouped_path, StoreOptions::default())
            .unwrap()
            .check_seal(None, Some((accepted.len() as u64, g(7))))
            .unwrap();
        check_against_model(&reopened, &accepted, &docs)?;
    }
}
