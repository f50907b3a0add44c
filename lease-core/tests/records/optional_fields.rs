//! Optional fields, absent when empty and never `null`: the heartbeat's `store_head` and
//! `mono`, the epoch's `retired.observed` and `cutoff_hash`, the checkpoint's `through_hash`
//! and `unjudged_from`, and the command record's `incarnation`, `cgroup` and `mark`.

use lease_core::*;

/// The heartbeat's `store_head` has one form per value: absent for `None` (so beats written
/// before the field existed decode byte for byte), a plain integer for `Some`; an explicit
/// `null` is not canonical and is rejected.
#[test]
fn heartbeat_store_head_is_absent_when_empty_and_never_null() {
    let old_beat = b"{\"count\":3,\"generation\":2,\"heartbeat_at\":\"2026-12-02T00:00:00.000Z\",\"owner_id\":\"o\",\"run_id\":\"r\",\"version\":\"runlease/heartbeat/1\"}\n";
    let rec: HeartbeatRecord = decode(old_beat).unwrap();
    assert_eq!(rec.store_head, None);
    assert_eq!(encode(&rec).unwrap(), old_beat.to_vec());

    let with = HeartbeatRecord {
        store_head: Some(17),
        ..rec.clone()
    };
    let bytes = encode(&with).unwrap();
    assert!(
        String::from_utf8(bytes.clone())
            .unwrap()
            .contains("\"store_head\":17,")
    );
    assert_eq!(decode::<HeartbeatRecord>(&bytes).unwrap(), with);

    let null = "{\"count\":3,\"generation\":2,\"heartbeat_at\":\"2026-12-02T00:00:00.000Z\",\"owner_id\":\"o\",\"run_id\":\"r\",\"store_head\":null,\"version\":\"runlease/heartbeat/1\"}\n";
    assert!(null.contains("\"store_head\":null"), "{null}");
    let e = decode::<HeartbeatRecord>(null.as_bytes()).unwrap_err();
    assert_eq!(e.code().as_str(), "RECORD_INVALID");
}

/// The heartbeat's `mono` stamp (issue #17, the same-clock rule) is absent when empty, like
/// `store_head`: beats written before it existed keep their bytes, `null` is not canonical,
/// and a stamp is an object with exactly a clock name and a reading.
#[test]
fn heartbeat_mono_is_absent_when_empty_and_never_null() {
    let old_beat = b"{\"count\":3,\"generation\":2,\"heartbeat_at\":\"2026-12-02T00:00:00.000Z\",\"owner_id\":\"o\",\"run_id\":\"r\",\"version\":\"runlease/heartbeat/1\"}\n";
    let rec: HeartbeatRecord = decode(old_beat).unwrap();
    assert_eq!(rec.mono, None);
    assert_eq!(encode(&rec).unwrap(), old_beat.to_vec());
    let with = HeartbeatRecord {
        mono: Some(MonoStamp {
            clock: Identity::new("b/time:[1]").unwrap(),
            ns: 5_000_000_123,
        }),
        ..rec.clone()
    };
    let bytes = encode(&with).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(
        text.contains("\"mono\":{\"clock\":\"b/time:[1]\",\"ns\":5000000123},"),
        "{text}"
    );
    assert_eq!(decode::<HeartbeatRecord>(&bytes).unwrap(), with);
    for bad in [
        "\"mono\":null,",
        "\"mono\":{\"clock\":\"b\"},",
        "\"mono\":{\"clock\":\"b\",\"ns\":1,\"x\":2},",
        "\"mono\":{\"clock\":\"\",\"ns\":1},",
    ] {
        let forged = String::from_utf8(old_beat.to_vec())
            .unwrap()
            .replace("\"owner_id\"", &format!("{bad}\"owner_id\""));
        let e = decode::<HeartbeatRecord>(forged.as_bytes()).unwrap_err();
        assert_eq!(e.code().as_str(), "RECORD_INVALID", "{forged}");
    }
}

/// A stamp ages only on the clock it names, and never from the future.
#[test]
fn a_mono_stamp_ages_only_on_its_own_clock() {
    let clock = Identity::new("boot-a/time:[1]").unwrap();
    let other = Identity::new("boot-a/time:[2]").unwrap();
    let m = MonoStamp {
        clock: clock.clone(),
        ns: 10_000_000_000,
    };
    assert_eq!(m.age_ms_on(Some(&clock), 12_500_999_999), Some(2_500));
    assert_eq!(m.age_ms_on(Some(&clock), 10_000_000_000), Some(0));
    // Another time namespace of the same boot, no clock, a reading before the stamp.
    assert_eq!(m.age_ms_on(Some(&other), 12_500_000_000), None);
    assert_eq!(m.age_ms_on(None, 12_500_000_000), None);
    assert_eq!(m.age_ms_on(Some(&clock), 9_999_999_999), None);
}

/// The epoch's `retired.observed` (issue #19: what a takeover or retirement judged, once a
/// separate intent file) is absent when empty, so older epochs keep their bytes; `null` is
/// not canonical; and it must match the reason: never on a release, `operator`/`automatic`
/// with a watch on a takeover, `retire_dead` without one on a retirement.
#[test]
fn retired_observed_is_absent_when_empty_and_matches_its_reason() {
    let old = "{\"claimed_at\":\"2026-12-02T00:00:00.000Z\",\"generation\":3,\"holder\":{\"boot_id\":\"b\",\"host\":\"h\",\"pid\":7,\"start_time\":9},\"owner_id\":\"t\",\"policy\":{\"heartbeat_durability\":\"local\",\"heartbeat_ms\":5000,\"self_fence_after_ms\":15000,\"stale_after_ms\":20000},\"prev_hash\":\"HASH\",\"retired\":{\"generation\":2,\"owner_id\":\"o\",\"reason\":\"taken_over\"},\"run_id\":\"r\",\"seal\":null,\"state\":\"active\",\"store_floor\":null,\"version\":\"runlease/epoch/1\"}\n"
        .replace("HASH", &"b".repeat(64));
    let epoch: EpochRecord = decode(old.as_bytes()).unwrap();
    assert_eq!(epoch.retired.as_ref().unwrap().observed, None);
    assert_eq!(encode(&epoch).unwrap(), old.as_bytes().to_vec());
    let observed = |mode, watched_ms| Observation {
        heartbeat_at: epoch.claimed_at,
        heartbeat_count: 4,
        watched_ms,
        mode,
    };
    let with = |reason, state, o: Observation| {
        let mut e = epoch.clone();
        e.state = state;
        let r = e.retired.as_mut().unwrap();
        r.reason = reason;
        if reason == RetireReason::Released {
            r.owner_id = e.owner_id.clone();
        }
        r.observed = Some(o);
        e
    };
    let taken = with(
        RetireReason::TakenOver,
        EpochState::Active,
        observed(TakeoverMode::Automatic, Some(21_000)),
    );
    let text = String::from_utf8(encode(&taken).unwrap()).unwrap();
    assert!(text.contains("\"observed\":{"), "{text}");
    assert_eq!(decode::<EpochRecord>(text.as_bytes()).unwrap(), taken);
    let dead = with(
        RetireReason::Dead,
        EpochState::Retired,
        observed(TakeoverMode::RetireDead, None),
    );
    assert_eq!(
        decode::<EpochRecord>(&encode(&dead).unwrap()).unwrap(),
        dead
    );
    let null = old.replace(
        "\"reason\":\"taken_over\"",
        "\"observed\":null,\"reason\":\"taken_over\"",
    );
    assert_eq!(
        decode::<EpochRecord>(null.as_bytes())
            .unwrap_err()
            .code()
            .as_str(),
        "RECORD_INVALID"
    );
    for (why, bad) in [
        (
            "a release observed nothing",
            with(
                RetireReason::Released,
                EpochState::Released,
                observed(TakeoverMode::Operator, Some(21_000)),
            ),
        ),
        (
            "a takeover without a watch",
            with(
                RetireReason::TakenOver,
                EpochState::Active,
                observed(TakeoverMode::Operator, None),
            ),
        ),
        (
            "a takeover in retire_dead mode",
            with(
                RetireReason::TakenOver,
                EpochState::Active,
                observed(TakeoverMode::RetireDead, Some(21_000)),
            ),
        ),
        (
            "a retirement with a watch",
            with(
                RetireReason::Dead,
                EpochState::Retired,
                observed(TakeoverMode::RetireDead, Some(1)),
            ),
        ),
        (
            "a retirement in operator mode",
            with(
                RetireReason::Dead,
                EpochState::Retired,
                observed(TakeoverMode::Operator, None),
            ),
        ),
    ] {
        assert_eq!(
            encode(&bad).unwrap_err().code().as_str(),
            "RECORD_INVALID",
            "{why}"
        );
    }
}

/// The epoch's `cutoff_hash` and the checkpoint's `through_hash` (issue #17) are absent
/// when empty, like `store_head`: records written before they existed decode byte for byte,
/// `null` is not canonical, and a `cutoff_hash` below generation 3 (no cutoff of
/// generation − 2 to bind) is refused.
#[test]
fn cutoff_hash_and_through_hash_are_absent_when_empty_and_never_null() {
    let old_cp = "{\"created_at\":\"2026-12-02T00:00:00.000Z\",\"created_by\":\"p\",\"floor_epoch_hash\":\"HASH\",\"floor_generation\":4,\"not_authoritative\":[],\"run_id\":\"r\",\"through_sequence\":2,\"version\":\"runlease/checkpoint/1\"}\n"
        .replace("HASH", &"a".repeat(64));
    let cp: Checkpoint = decode(old_cp.as_bytes()).unwrap();
    assert_eq!(cp.through_hash, None);
    assert_eq!(cp.unjudged_from, None, "absent: every event judged");
    assert_eq!(encode(&cp).unwrap(), old_cp.as_bytes().to_vec());
    let with = Checkpoint {
        through_hash: Some(cp.floor_epoch_hash.clone()),
        ..cp.clone()
    };
    let text = String::from_utf8(encode(&with).unwrap()).unwrap();
    assert!(text.contains("\"through_hash\":\""), "{text}");
    assert_eq!(decode::<Checkpoint>(text.as_bytes()).unwrap(), with);
    let null = old_cp.replace(
        "\"through_sequence\"",
        "\"through_hash\":null,\"through_sequence\"",
    );
    assert_eq!(
        decode::<Checkpoint>(null.as_bytes())
            .unwrap_err()
            .code()
            .as_str(),
        "RECORD_INVALID"
    );
    let empty_log = Checkpoint {
        through_sequence: 0,
        ..with.clone()
    };
    assert_eq!(
        encode(&empty_log).unwrap_err().code().as_str(),
        "RECORD_INVALID",
        "through_hash without an event"
    );
    // unjudged_from (issue #30): written only when set, within 1..=through_sequence.
    let pending = Checkpoint {
        unjudged_from: Some(2),
        ..cp.clone()
    };
    let text = String::from_utf8(encode(&pending).unwrap()).unwrap();
    assert!(text.contains("\"unjudged_from\":2"), "{text}");
    assert_eq!(decode::<Checkpoint>(text.as_bytes()).unwrap(), pending);
    for bad in [Some(0), Some(3)] {
        let c = Checkpoint {
            unjudged_from: bad,
            ..cp.clone()
        };
        assert_eq!(
            encode(&c).unwrap_err().code().as_str(),
            "RECORD_INVALID",
            "{bad:?}"
        );
    }

    let old_epoch = "{\"claimed_at\":\"2026-12-02T00:00:00.000Z\",\"generation\":3,\"holder\":{\"boot_id\":\"b\",\"host\":\"h\",\"pid\":7,\"start_time\":9},\"owner_id\":\"o\",\"policy\":{\"heartbeat_durability\":\"local\",\"heartbeat_ms\":5000,\"self_fence_after_ms\":15000,\"stale_after_ms\":20000},\"prev_hash\":\"HASH\",\"retired\":{\"generation\":2,\"owner_id\":\"o\",\"reason\":\"released\"},\"run_id\":\"r\",\"seal\":null,\"state\":\"released\",\"store_floor\":null,\"version\":\"runlease/epoch/1\"}\n"
        .replace("HASH", &"b".repeat(64));
    let epoch: EpochRecord = decode(old_epoch.as_bytes()).unwrap();
    assert_eq!(epoch.cutoff_hash, None);
    assert_eq!(encode(&epoch).unwrap(), old_epoch.as_bytes().to_vec());
    let bound = EpochRecord {
        cutoff_hash: Some(cp.floor_epoch_hash.clone()),
        ..epoch.clone()
    };
    let text = String::from_utf8(encode(&bound).unwrap()).unwrap();
    assert!(text.contains("\"cutoff_hash\":\""), "{text}");
    assert_eq!(decode::<EpochRecord>(text.as_bytes()).unwrap(), bound);
    let null = String::from_utf8(encode(&epoch).unwrap())
        .unwrap()
        .replace("\"generation\"", "\"cutoff_hash\":null,\"generation\"");
    assert_eq!(
        decode::<EpochRecord>(null.as_bytes())
            .unwrap_err()
            .code()
            .as_str(),
        "RECORD_INVALID"
    );
    let low = EpochRecord {
        generation: Generation::new(2).unwrap(),
        retired: Some(RetiredOwner {
            generation: Generation::FIRST,
            ..epoch.retired.clone().unwrap()
        }),
        ..bound
    };
    assert_eq!(encode(&low).unwrap_err().code().as_str(), "RECORD_INVALID");
}

/// A command record without an incarnation digest (written before issue #15) has no
/// `incarnation` key at all; `"incarnation":null` is not canonical; a record's `pgid` must
/// be its `pid`.
#[test]
fn command_incarnation_is_absent_when_empty_and_never_null() {
    let rec = CommandRecord {
        run_id: RunId::new("r").unwrap(),
        generation: Generation::new(1).unwrap(),
        pid: 42,
        pgid: 42,
        start_time: 7,
        boot_id: Identity::new("b").unwrap(),
        argv: vec!["x".into()],
        started_at: Timestamp::from_unix_millis(0).unwrap(),
        incarnation: None,
        cgroup: None,
        mark: None,
    };
    let bytes = encode(&rec).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(!text.contains("incarnation"), "{text}");
    assert_eq!(decode::<CommandRecord>(&bytes).unwrap(), rec);
    let null = text.replacen("\"pgid\"", "\"incarnation\":null,\"pgid\"", 1);
    assert!(decode::<CommandRecord>(null.as_bytes()).is_err(), "{null}");
    let other_group = text.replacen("\"pgid\":42", "\"pgid\":43", 1);
    let e = decode::<CommandRecord>(other_group.as_bytes()).unwrap_err();
    assert!(e.to_string().contains("own process group"), "{e}");
    let with = CommandRecord {
        incarnation: Some(CommandRecord::incarnation_digest(
            &rec.run_id,
            rec.generation,
            "s",
        )),
        ..rec.clone()
    };
    assert_eq!(
        decode::<CommandRecord>(&encode(&with).unwrap()).unwrap(),
        with
    );
    // Issue #29: the cgroup identity, absent when `None` (checked above: no `cgroup` key
    // in `text`), round-trips; `null` is not canonical; id 0 (no inode) and 1 (the root
    // cgroup) are refused.
    assert!(!text.contains("cgroup"), "{text}");
    let cg = CommandRecord {
        cgroup: Some(lease_core::CommandCgroup { id: 9, uid: 1000 }),
        ..rec.clone()
    };
    let cg_text = String::from_utf8(encode(&cg).unwrap()).unwrap();
    assert!(
        cg_text.contains("\"cgroup\":{\"id\":9,\"uid\":1000}"),
        "{cg_text}"
    );
    assert_eq!(decode::<CommandRecord>(cg_text.as_bytes()).unwrap(), cg);
    let null = text.replacen("\"pgid\"", "\"cgroup\":null,\"pgid\"", 1);
    assert!(decode::<CommandRecord>(null.as_bytes()).is_err(), "{null}");
    for bad in ["0", "1"] {
        let t = cg_text.replacen("\"id\":9", &format!("\"id\":{bad}"), 1);
        let e = decode::<CommandRecord>(t.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("cgroup.id"), "{e}");
    }
    // Issue #29: the mark, absent when `None` (no `mark` key in `text`), round-trips
    // beside a digest and only named after it; without a digest, or named otherwise, it is
    // refused; its content is bound to the run, the generation and the digest.
    assert!(!text.contains("\"mark\""), "{text}");
    let digest = CommandRecord::incarnation_digest(&rec.run_id, rec.generation, "s");
    let marked = CommandRecord {
        incarnation: Some(digest.clone()),
        mark: Some(lease_core::CommandMark {
            name: lease_core::CommandMark::name_for(&digest),
            dev: 1,
            ino: 4_294_967_295,
        }),
        ..rec.clone()
    };
    assert!(lease_core::CommandMark::name_for(&digest).starts_with("runlease-inc-"));
    assert_eq!(lease_core::CommandMark::name_for(&digest).len(), 13 + 16);
    let marked_bytes = encode(&marked).unwrap();
    assert_eq!(decode::<CommandRecord>(&marked_bytes).unwrap(), marked);
    let no_digest = CommandRecord {
        incarnation: None,
        ..marked.clone()
    };
    assert!(
        encode(&no_digest).is_err()
            || decode::<CommandRecord>(&encode(&no_digest).unwrap()).is_err()
    );
    let marked_text = String::from_utf8(marked_bytes).unwrap();
    let renamed = marked_text.replacen("runlease-inc-", "runlease-inx-", 1);
    let e = decode::<CommandRecord>(renamed.as_bytes()).unwrap_err();
    assert!(e.to_string().contains("mark.name"), "{e}");
    let null = text.replacen("\"pgid\"", "\"mark\":null,\"pgid\"", 1);
    assert!(decode::<CommandRecord>(null.as_bytes()).is_err(), "{null}");
    assert_ne!(
        lease_core::CommandMark::content(&rec.run_id, rec.generation, &digest),
        lease_core::CommandMark::content(&RunId::new("q").unwrap(), rec.generation, &digest)
    );
    // The digest is bound to the run and the generation.
    assert_ne!(
        CommandRecord::incarnation_digest(&rec.run_id, rec.generation, "s"),
        CommandRecord::incarnation_digest(&RunId::new("q").unwrap(), rec.generation, "s")
    );
    assert_ne!(
        CommandRecord::incarnation_digest(&rec.run_id, rec.generation, "s"),
        CommandRecord::incarnation_digest(&rec.run_id, Generation::new(2).unwrap(), "s")
    );
}
