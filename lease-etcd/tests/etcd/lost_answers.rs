//! Lost answers (PROTOCOL §17): a retry adopts its own write, else `OUTCOME_UNKNOWN`.

use crate::cluster::{Cluster, etcd_binary};
use crate::{claim_params, fast_policy, id, lock_serial, now_ts, opts};
use lease_core::{FileRef, LeaseOps, RunId};
use lease_etcd::{EtcdError, EtcdOptions, EtcdRun};
use std::time::{Duration, Instant};

/// Append parameters: an event of type `t` with payload `{"n": n}`, now.
fn append_params(t: &str, n: u64) -> lease_core::ops::AppendParams {
    lease_core::ops::AppendParams {
        event_type: id(t),
        payload: serde_json::json!({ "n": n }),
        now: now_ts(),
        tail_hint: None,
    }
}

/// The sequences of the events of type `t` in `run`'s log.
fn events_of_type(run: &EtcdRun, t: &str) -> Vec<u64> {
    run.read_events(None)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.event.event_type.as_str() == t)
        .map(|e| e.event.sequence.get())
        .collect()
}

/// PROTOCOL §17 (issue #31): an exclusive create whose first attempt landed and whose
/// answer was lost (the test hook drops it; the client times out and retries) is adopted
/// by its retry, which reads exactly its own bytes: an append then appends one event, not
/// two; a claim keeps the etcd lease its epoch's liveness key is attached to (not revoked)
/// and heartbeats with it.
#[test]
fn a_create_whose_answer_was_lost_is_adopted_by_its_retry() {
    use lease_core::Sequence;
    use lease_core::ops::{Request, Response};
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let policy = fast_policy();
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let run = auth.run(RunId::new("lost-answer").unwrap());
    // A claim whose epoch transaction (with its liveness key) lands unanswered.
    run.lose_write_answers(1);
    let lease = run
        .claim(claim_params(&run, "owner-a", 1, policy))
        .expect("the retry adopts the epoch its first attempt created");
    assert_eq!(lease.generation.get(), 1);
    run.heartbeat(&lease, now_ts(), 1, None)
        .expect("its etcd lease was kept: the liveness key is attached to it");
    assert!(run.owner_lease_ttl(lease.generation).unwrap().is_some());
    // An append whose event create lands unanswered: one event, not a second one.
    run.lose_write_answers(1);
    let a = run.append(&lease, append_params("once", 1)).unwrap();
    assert_eq!(events_of_type(&run, "once"), vec![a.sequence.get()]);
    // The bare request: Created, and the key holds the bytes once.
    let f = FileRef::Event(Sequence::new(a.sequence.get() + 10).unwrap());
    run.lose_write_answers(1);
    assert_eq!(
        run.perform(Request::CreateExclusive(f, b"ours".to_vec()))
            .unwrap(),
        Response::Created
    );
    assert_eq!(
        run.perform(Request::Read(f)).unwrap(),
        Response::Content(Some(b"ours".to_vec()))
    );
    // A heartbeat and a delete whose answers are lost are retried (idempotent) and done.
    run.lose_write_answers(1);
    run.heartbeat(&lease, now_ts(), 2, None).unwrap();
    run.lose_write_answers(1);
    assert_eq!(
        run.perform(Request::Remove(f, lease_core::ops::Durability::Fsync))
            .unwrap(),
        Response::Done
    );
    assert_eq!(
        run.perform(Request::Read(f)).unwrap(),
        Response::Content(None)
    );
}

/// PROTOCOL §17: only the request's own bytes are adopted, and only after an attempt of
/// its own went unanswered. Other bytes in the slot are `AlreadyExists` even on a retry;
/// the very same bytes put there by somebody else (no attempt of ours unanswered) are
/// `AlreadyExists` too, as on the run folder.
#[test]
fn a_create_finding_another_record_is_already_exists_even_on_a_retry() {
    use lease_core::Sequence;
    use lease_core::ops::{Request, Response};
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let other = auth.run(RunId::new("slots").unwrap());
    let run = auth.run(RunId::new("slots").unwrap());
    let f = |n| FileRef::Event(Sequence::new(n).unwrap());
    let create = |r: &EtcdRun, n, b: &[u8]| r.perform(Request::CreateExclusive(f(n), b.to_vec()));
    assert_eq!(create(&other, 1, b"theirs").unwrap(), Response::Created);
    assert_eq!(create(&other, 2, b"same").unwrap(), Response::Created);
    // Other bytes, with the first answer lost (the retry reads "theirs").
    run.lose_write_answers(1);
    assert_eq!(create(&run, 1, b"ours").unwrap(), Response::AlreadyExists);
    // The same bytes, nothing of ours unanswered: somebody else's identical record.
    assert_eq!(create(&run, 2, b"same").unwrap(), Response::AlreadyExists);
    assert_eq!(
        run.perform(Request::Read(f(1))).unwrap(),
        Response::Content(Some(b"theirs".to_vec()))
    );
}

/// Issue #31: a write that was sent and never answered until the operation's deadline is
/// `OUTCOME_UNKNOWN` (71), naming the run and the key, never `UNAVAILABLE` (69, "nothing
/// was written, retry"): here each attempt lands and every answer is lost, so the create,
/// the heartbeat and the delete all took effect, and a reader can see they did.
#[test]
fn a_write_unanswered_until_its_deadline_is_outcome_unknown() {
    use lease_core::Code;
    use lease_core::Sequence;
    use lease_core::ops::{Request, Response};
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let cluster = Cluster::start(&bin);
    let o = EtcdOptions {
        call_timeout: Duration::from_millis(300),
        op_timeout: Duration::from_millis(1_500),
        connect_timeout: Duration::from_millis(500),
    };
    let auth = cluster.authority(&[0, 1, 2], "t", o);
    let run = auth.run(RunId::new("unknown").unwrap());
    let lease = run
        .claim(claim_params(&run, "owner-a", 1, fast_policy()))
        .unwrap();
    let f = FileRef::Event(Sequence::new(5).unwrap());
    let key = run.key(f);
    run.lose_write_answers(u32::MAX);
    let start = Instant::now();
    let e = run
        .perform(Request::CreateExclusive(f, b"maybe".to_vec()))
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(4), "{e}");
    assert_eq!(e.code(), Code::OutcomeUnknown, "{e}");
    assert_eq!(e.unknown_outcome_file(), Some(f));
    let text = e.to_string();
    for part in ["unknown", &key, "outcome"] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    assert!(text.contains(run.run_id().as_str()), "{text}");
    let beat = run.heartbeat(&lease, now_ts(), 1, None).unwrap_err();
    assert_eq!(beat.code(), Code::OutcomeUnknown, "{beat}");
    let del = run
        .perform(Request::Remove(f, lease_core::ops::Durability::Fsync))
        .unwrap_err();
    assert_eq!(del.code(), Code::OutcomeUnknown, "{del}");
    // Reads stay UNAVAILABLE-free and answer: the writes did land.
    run.lose_write_answers(0);
    assert_eq!(
        run.perform(Request::Read(f)).unwrap(),
        Response::Content(None),
        "the delete landed"
    );
}

/// Issue #31, a real lost quorum: the event's create is sent while two of three members
/// are stopped (SIGSTOP) and they are resumed within the operation's deadline. The append
/// ends `Created`, by a retry landing or adopting the first attempt, or `OUTCOME_UNKNOWN`,
/// never `UNAVAILABLE` (the write was sent); and the log holds the event at most once.
#[test]
fn an_append_sent_while_the_cluster_lost_quorum_is_created_or_outcome_unknown() {
    use lease_core::Code;
    use lease_core::ops::{Append, Operation, Request, Response, Step};
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    let mut cluster = Cluster::start(&bin);
    let o = EtcdOptions {
        call_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(8),
        connect_timeout: Duration::from_millis(500),
    };
    // Every call goes to member 0, the one left running.
    let auth = cluster.authority(&[0], "t", o);
    let run = auth.run(RunId::new("quorum").unwrap());
    let lease = run
        .claim(claim_params(&run, "owner-a", 1, fast_policy()))
        .unwrap();
    run.append(&lease, append_params("before", 0)).unwrap();
    let mut op = Append::new(&lease, append_params("in-flight", 1));
    let mut input = None;
    let outcome = loop {
        match op.next(input.take()) {
            Step::Io(req @ Request::CreateExclusive(FileRef::Event(_), _)) => {
                cluster.stop(1);
                cluster.stop(2);
                let resumed = Instant::now() + Duration::from_millis(2_000);
                let sender = &run;
                let sent = std::thread::scope(|s| {
                    let r = s.spawn(move || sender.perform(req));
                    std::thread::sleep(resumed.saturating_duration_since(Instant::now()));
                    cluster.resume(1);
                    cluster.resume(2);
                    r.join().unwrap()
                });
                match sent {
                    Ok(resp) => {
                        assert_eq!(resp, Response::Created, "our own event");
                        input = Some(resp);
                    }
                    Err(e) => break Err(e),
                }
            }
            Step::Io(req) => input = Some(run.perform(req).unwrap()),
            Step::Done(r) => break r.map_err(EtcdError::from),
        }
    };
    let found = events_of_type(&run, "in-flight");
    eprintln!("append in flight over a lost quorum: {outcome:?}, events {found:?}");
    match outcome {
        Ok(a) => assert_eq!(found, vec![a.sequence.get()], "the event, once"),
        Err(e) => {
            assert_eq!(e.code(), Code::OutcomeUnknown, "never UNAVAILABLE: {e}");
            assert!(found.len() <= 1, "{found:?}");
        }
    }
}
