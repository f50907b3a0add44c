//! Paged reads (issue #29): `scan_prefix_page` and `commits_page_bytes` return bounded
//! pieces that, chained, give exactly what the unbounded reads give.

mod common;

use common::*;
use lease_sqlite::{Batch, MAX_COMMIT_BYTES, Store};

#[test]
fn prefix_pages_chain_to_the_whole_scan_within_their_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("store/run.sqlite");
    let mut s = open_store(&path);
    let mut b = Batch::new().put("a", "outside").put("b/", "empty tail");
    for i in 0..25 {
        b = b.put(format!("b/{i:02}"), vec![b'v'; 10 * i]);
    }
    s.commit(g(1), &b.put("c", "after")).unwrap();
    let whole = s.scan_prefix("b/").unwrap();
    assert_eq!(whole.len(), 26);
    for (rows, bytes) in [
        (1, usize::MAX),
        (7, usize::MAX),
        (100, 50),
        (100, 0),
        (0, 1000),
    ] {
        let mut got = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let (page, next) = s
                .scan_prefix_page("b/", after.as_deref(), rows, bytes)
                .unwrap();
            assert!(
                !page.is_empty() || got.is_empty(),
                "an empty page after a cut"
            );
            assert!(page.len() <= rows.max(1));
            let size: usize = page.iter().map(|d| d.key.len() + d.value.len()).sum();
            assert!(page.len() == 1 || size <= bytes, "{rows}/{bytes}: {size}");
            got.extend(page);
            match next {
                Some(k) => {
                    assert_eq!(Some(&k), got.last().map(|d| &d.key));
                    after = Some(k);
                }
                None => break,
            }
        }
        assert_eq!(got, whole, "rows {rows} bytes {bytes}");
    }
    // An empty prefix pages through everything; an `after` below the prefix starts at it.
    let (page, _) = s.scan_prefix_page("b/", Some("a"), 1, 1).unwrap();
    assert_eq!(page[0].key, "b/");
    let (page, next) = s.scan_prefix_page("", Some("b/24"), 10, 1 << 20).unwrap();
    assert_eq!((page[0].key.as_str(), page.len(), next), ("c", 1, None));
}

#[test]
fn commit_pages_are_bounded_by_count_and_bytes_and_keep_their_log() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("store/run.sqlite");
    let mut s = open_store(&path);
    for i in 0..10u8 {
        s.commit(
            g(1),
            &Batch::new()
                .put(format!("k{i}"), vec![i; 100])
                .log(vec![i; 50])
                .log("second"),
        )
        .unwrap();
    }
    let whole = s.commits_since(0).unwrap();
    // One commit is 9 + 2 + 100 bytes of writes and 56 of log: 167.
    let page = s.commits_page_bytes(0, 100, 400).unwrap();
    assert_eq!(page.len(), 2);
    assert_eq!(page[..], whole[..2]);
    let page = s.commits_page_bytes(2, 100, 0).unwrap();
    assert_eq!(page[..], whole[2..3], "at least one commit per page");
    assert!(s.commits_page_bytes(0, 0, usize::MAX).unwrap().is_empty());
    assert!(s.commits_page_bytes(10, 5, usize::MAX).unwrap().is_empty());
    let mut got = Vec::new();
    let mut after = 0;
    loop {
        let page = s.commits_page_bytes(after, 3, 350).unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        got.extend(page);
    }
    assert_eq!(got, whole);
}

#[test]
fn a_commit_above_the_limit_is_refused_and_nothing_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("store/run.sqlite");
    let mut s = open_store(&path);
    let big = Batch::new().put("k", vec![0u8; MAX_COMMIT_BYTES - 9]);
    let e = s.commit(g(1), &big).unwrap_err();
    assert_eq!(e.code().as_str(), "ARGUMENT_INVALID", "{e}");
    let logged = Batch::new()
        .put("k", vec![0u8; MAX_COMMIT_BYTES / 2])
        .log(vec![0u8; MAX_COMMIT_BYTES / 2]);
    assert_eq!(
        s.commit(g(1), &logged).unwrap_err().code().as_str(),
        "ARGUMENT_INVALID"
    );
    assert_eq!(s.head().unwrap(), 0);
    let fits = Batch::new().put("k", vec![0u8; MAX_COMMIT_BYTES - 10]);
    assert_eq!(s.commit(g(1), &fits).unwrap(), 1);
    s.close().unwrap();
    let r = Store::open_read_only(&run(), &path).unwrap();
    assert_eq!(
        r.get("k").unwrap().unwrap().value.len(),
        MAX_COMMIT_BYTES - 10
    );
}
