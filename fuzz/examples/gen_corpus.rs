//! Regenerate the seed corpus `fuzz/corpus/<target>/` with the real encoders and step
//! machines (so the seeds stay valid when a record format changes):
//!
//! ```sh
//! cargo run --manifest-path fuzz/Cargo.toml --example gen_corpus
//! ```
//!
//! It replaces the files it writes and leaves any others alone.

use lease_core::mem::MemDisk;
use lease_core::ops::{
    Append, AppendParams, Claim, ClaimParams, Expectation, Heartbeat, LivenessEvidence, OwnedLease,
    Release, ReleaseParams, StatusView, Takeover, TakeoverParams, TakeoverTrigger,
};
use lease_core::{
    Checkpoint, CommandRecord, Digest, FileRef, Generation, Holder, RunState, RunStatus,
    TakeoverIntent, TakeoverMode, TimingPolicy, encode,
};
use lease_run::Batch;
use lease_run::store_socket::{MAX_FRAME, Op, commit_op, write_frame};
use runlease_fuzz::fixtures::{LiveMode, holder, id, run_id, t};
use runlease_fuzz::folder::{Entry, Folder, Name, Persist};
use std::path::Path;

fn alive(h: &Holder) -> LivenessEvidence {
    LiveMode::Alive.evidence(h)
}

fn claim(d: &mut MemDisk, owner: &str, pid: u32, now: u64) -> OwnedLease {
    d.run(
        &mut Claim::new(ClaimParams {
            run_id: run_id(),
            owner_id: id(owner),
            holder: holder(pid),
            policy: TimingPolicy::default(),
            now: t(now),
            store_floor: None,
        }),
        &alive,
    )
    .expect("claim")
}

fn append(d: &mut MemDisk, l: &OwnedLease, n: u64, now: u64) {
    d.run(
        &mut Append::new(
            l,
            AppendParams {
                event_type: id("step.done"),
                payload: serde_json::json!({"n": n}),
                now: t(now),
                tail_hint: None,
            },
        ),
        &alive,
    )
    .expect("append");
}

fn beat(d: &mut MemDisk, l: &OwnedLease, n: u64, now: u64) {
    d.run(
        &mut Heartbeat::new(l, t(now), n).expect("heartbeat"),
        &alive,
    )
    .expect("heartbeat");
}

fn takeover(d: &mut MemDisk, owner: &str, pid: u32, now: u64) -> OwnedLease {
    let view = d
        .run(&mut StatusView::read(run_id(), t(now), false), &alive)
        .expect("status");
    let head = view.head.expect("a head");
    d.run(
        &mut Takeover::new(TakeoverParams {
            run_id: run_id(),
            owner_id: id(owner),
            holder: holder(pid),
            policy: TimingPolicy::default(),
            now: t(now),
            expect: Expectation::of(&head),
            trigger: TakeoverTrigger::Operator {
                watched_unchanged_ms: lease_core::ghost::simulated_watch(
                    &Expectation::of(&head),
                    t(now),
                ),
            },
        }),
        &alive,
    )
    .expect("takeover")
}

fn release(d: &mut MemDisk, l: &OwnedLease, now: u64) {
    d.run(
        &mut Release::new(ReleaseParams {
            lease: l.clone(),
            now: t(now),
            seal: None,
        }),
        &alive,
    )
    .expect("release");
}

/// An owner with a heartbeat and two events.
fn active_run() -> MemDisk {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "owner-a", 101, 0);
    beat(&mut d, &l, 1, 1_000);
    append(&mut d, &l, 1, 1_500);
    append(&mut d, &l, 2, 2_000);
    d
}

/// Owner a, taken over by b after 30 s, b appends: two generations and a cutoff.
fn taken_over_run() -> MemDisk {
    let mut d = active_run();
    let l = takeover(&mut d, "owner-b", 102, 30_000);
    append(&mut d, &l, 3, 31_000);
    d
}

/// Claimed, one event, released.
fn released_run() -> MemDisk {
    let mut d = MemDisk::new();
    let l = claim(&mut d, "owner-a", 101, 0);
    append(&mut d, &l, 1, 500);
    release(&mut d, &l, 1_000);
    d
}

fn write(root: &Path, target: &str, name: &str, bytes: &[u8]) {
    let dir = root.join(target);
    std::fs::create_dir_all(&dir).expect("mkdir corpus");
    std::fs::write(dir.join(name), bytes).expect("write seed");
}

fn decode_records_seeds(root: &Path) {
    let d = taken_over_run();
    let g1 = Generation::new(1).expect("1");
    let g2 = Generation::new(2).expect("2");
    let pick = |f: FileRef| d.files.get(&f).cloned().expect("file of the scenario");
    // No operation writes an intent since issue #19 (the takeover's epoch holds its
    // observation), but old runs keep theirs and every reader must still decode one.
    let intent = encode(&TakeoverIntent {
        run_id: run_id(),
        generation: g2,
        expected_generation: g1,
        expected_owner_id: id("owner-a"),
        expected_heartbeat_at: t(1_000),
        expected_heartbeat_count: 1,
        taker_owner_id: id("owner-b"),
        taker_holder: holder(102),
        requested_at: t(30_000),
        mode: TakeoverMode::Operator,
    })
    .expect("intent");
    let epoch1 = pick(FileRef::Epoch(g1));
    let checkpoint = encode(&Checkpoint {
        run_id: run_id(),
        floor_generation: g2,
        floor_epoch_hash: Digest::of(&pick(FileRef::Epoch(g2))),
        through_sequence: 2,
        through_hash: Some(Digest::of(&pick(FileRef::Event(
            lease_core::Sequence::new(2).expect("2"),
        )))),
        not_authoritative: vec![2],
        unjudged_from: None,
        created_at: t(40_000),
        created_by: id("pruner"),
    })
    .expect("checkpoint");
    let status = encode(&RunStatus {
        run_id: run_id(),
        status: RunState::Paused,
        generation: g2,
        sealed_sequence: None,
        wake_at: Some(t(90_000)),
        holder: Some(holder(102)),
        heartbeat_at: Some(t(31_000)),
        updated_at: t(31_000),
        detail: Some("waiting \"quoted\" \u{e9}\n".into()),
    })
    .expect("run status");
    let command = encode(&CommandRecord {
        run_id: run_id(),
        generation: g2,
        pid: 777,
        pgid: 777,
        start_time: 123_456,
        boot_id: id("boot-a"),
        argv: vec!["/bin/sh".into(), "-c".into(), "echo hi".into()],
        started_at: t(31_500),
        incarnation: Some(CommandRecord::incarnation_digest(
            &run_id(),
            g2,
            "fuzz-secret",
        )),
        cgroup: Some(lease_core::CommandCgroup {
            id: 4242,
            uid: 1000,
        }),
        mark: None,
    })
    .expect("command");
    let seeds: [(&str, Vec<u8>); 8] = [
        ("epoch-1-active", epoch1),
        ("epoch-2-taken-over", pick(FileRef::Epoch(g2))),
        ("heartbeat", pick(FileRef::Beat(g1))),
        (
            "event-2",
            pick(FileRef::Event(lease_core::Sequence::new(2).expect("2"))),
        ),
        ("retirement", pick(FileRef::Cutoff(g1))),
        ("takeover-intent", intent),
        ("checkpoint", checkpoint),
        ("run-status", status),
    ];
    for (name, bytes) in seeds {
        write(root, "decode_records", name, &bytes);
    }
    write(root, "decode_records", "command", &command);
}

fn parse_names_seeds(root: &Path) {
    for (name, s) in [
        ("epoch", "00000000000000000042.json"),
        ("intent", "00000000000000000042-00000000deadbeef.json"),
        ("command", "00000000000000000042-1234.json"),
        ("temp", ".tmp-00000000000000000001.json"),
        ("escape", "../00000000000000000001.json"),
        ("max", "18446744073709551615.json"),
    ] {
        write(root, "parse_names", name, s.as_bytes());
    }
}

fn read_folder_seeds(root: &Path) {
    let seeds = [
        (
            "empty",
            Folder::from_mem(&MemDisk::new(), 0, LiveMode::Alive),
        ),
        (
            "active-fresh",
            Folder::from_mem(&active_run(), 0, LiveMode::Alive),
        ),
        (
            "active-stale-dead",
            Folder::from_mem(&active_run(), 1, LiveMode::Dead),
        ),
        (
            "taken-over",
            Folder::from_mem(&taken_over_run(), 1, LiveMode::Alive),
        ),
        (
            "released",
            Folder::from_mem(&released_run(), 2, LiveMode::Unknown),
        ),
    ];
    for (name, f) in &seeds {
        write(root, "read_folder", name, &f.encode());
    }
    // Raw names, a lost heartbeat, a torn event and files where folders belong.
    let mut f = Folder::from_mem(&active_run(), 1, LiveMode::Dead);
    f.tear = true;
    for e in &mut f.entries {
        match e.dir {
            1 => e.persist = Persist::DataLost,
            5 if matches!(e.name, Name::Typed { num: 2, .. }) => e.persist = Persist::DataLost,
            _ => {}
        }
    }
    let raw = |dir: u8, name: &str, bytes: &[u8]| Entry {
        dir,
        name: Name::Raw(name.into()),
        persist: Persist::Durable,
        bytes: bytes.to_vec(),
    };
    f.entries
        .push(raw(0, ".tmp-00000000000000000002.json", b"{}\n"));
    f.entries
        .push(raw(5, "00000000000000000003.json.bak", b"x"));
    f.entries.push(raw(7, "commands", b"not a folder"));
    f.entries
        .push(raw(2, "00000000000000000001.json/x", b"a folder"));
    write(root, "read_folder", "strays-and-torn", &f.encode());
}

/// One action of the transitions input.
fn act(actor: u8, code: u8, p: u8) -> [u8; 2] {
    [(code << 4) | actor, p]
}

fn transitions_seeds(root: &Path) {
    const CLAIM: u8 = 0;
    const BEAT: u8 = 1;
    const TAKEOVER: u8 = 3;
    const RETIRE: u8 = 4;
    const RELEASE: u8 = 5;
    let start = |a, k| act(a, 7, k);
    let step = |a| act(a, 0, 0);
    let run = |a| act(a, 6, 0);
    let appnd = |a| act(a, 10, 0);
    let wait = |quarter_secs| act(0, 11, quarter_secs);
    let crash = |a| act(a, 12, 0);
    let corrupt = |which: u8| act(0, 13, which * 8);
    let drain = act(0, 14, 0);

    let mut seeds: Vec<(&str, u8, Vec<[u8; 2]>)> = vec![
        (
            "owner-lifecycle",
            0,
            vec![
                start(0, CLAIM),
                run(0),
                start(0, BEAT),
                run(0),
                appnd(0),
                run(0),
                appnd(0),
                run(0),
                wait(8),
                start(0, BEAT),
                run(0),
                start(0, RELEASE),
                run(0),
                start(1, CLAIM),
                run(1),
            ],
        ),
        (
            "takeover-race-fenced-append",
            0,
            vec![
                start(0, CLAIM),
                run(0),
                appnd(0),
                run(0),
                wait(120),
                start(1, TAKEOVER),
                appnd(0),
                step(1),
                step(0),
                step(1),
                step(0),
                step(1),
                step(0),
                step(1),
                step(0),
                step(1),
                step(0),
                step(1),
                step(0),
                drain,
                start(0, BEAT),
                run(0),
            ],
        ),
        (
            "crash-retire-reclaim",
            1,
            vec![
                start(0, CLAIM),
                run(0),
                appnd(0),
                run(0),
                crash(0),
                start(2, RETIRE),
                run(2),
                start(1, CLAIM),
                run(1),
                appnd(1),
                run(1),
                start(0, CLAIM),
                run(0),
            ],
        ),
        (
            "corrupt-then-claims",
            0,
            vec![
                start(0, CLAIM),
                run(0),
                start(0, BEAT),
                run(0),
                corrupt(1),
                wait(120),
                start(1, TAKEOVER),
                run(1),
                start(1, CLAIM),
                run(1),
                start(1, RETIRE),
                run(1),
                start(0, BEAT),
                run(0),
                corrupt(0),
                start(1, CLAIM),
                run(1),
                crash(0),
                start(1, RETIRE),
                run(1),
            ],
        ),
        (
            "concurrent-claims-appends",
            1,
            vec![
                start(0, CLAIM),
                start(1, CLAIM),
                start(2, CLAIM),
                step(0),
                step(1),
                step(2),
                step(0),
                step(1),
                step(2),
                step(0),
                step(1),
                step(2),
                drain,
                appnd(0),
                appnd(1),
                appnd(2),
                step(0),
                step(1),
                step(2),
                step(0),
                step(1),
                step(2),
                drain,
                wait(200),
                start(1, TAKEOVER),
                start(2, TAKEOVER),
                step(1),
                step(2),
                step(1),
                step(2),
                step(1),
                step(2),
                drain,
            ],
        ),
    ];
    // A long mixed run (600 bytes): libFuzzer does not grow inputs far past its largest seed
    // within a short smoke run, so this one sets the scale.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n) as u8
    };
    let mut long = Vec::new();
    for _ in 0..300 {
        let a = rnd(3);
        long.push(match rnd(100) {
            0..=49 => step(a),
            50..=61 => start(a, rnd(6)),
            62..=69 => appnd(a),
            70..=77 => run(a),
            78..=85 => wait(rnd(200)),
            86..=89 => crash(a),
            90..=91 => corrupt(rnd(2)),
            _ => drain,
        });
    }
    seeds.push(("long-mixed", 1, long));
    for (name, first, acts) in seeds {
        let mut bytes = vec![first];
        for a in acts {
            bytes.extend_from_slice(&a);
        }
        write(root, "transitions", name, &bytes);
    }
}

/// A request as the client writes it after the handshake (protocol 2: the operation
/// alone, no secret and no generation).
fn request(op: Op) -> Vec<u8> {
    serde_json::to_vec(&op).expect("request")
}

fn store_wire_seeds(root: &Path) {
    let batch = Batch::new()
        .put("step/1", "done")
        .put("bin", vec![0u8, 0xff, 0x0a])
        .delete("old")
        .log("step 1")
        .log(Vec::new());
    let mut connection = Vec::new();
    for op in [
        Op::Get {
            key: "step/1".into(),
        },
        Op::Release,
    ] {
        write_frame(&mut connection, &request(op)).expect("frame");
    }
    let oversized = u32::try_from(MAX_FRAME + 1).expect("u32");
    let mut oversized = oversized.to_be_bytes().to_vec();
    oversized.extend_from_slice(b"{}");
    let seeds: [(&str, Vec<u8>); 9] = [
        ("commit-puts-deletes-log", request(commit_op(&batch))),
        (
            "list",
            request(Op::List {
                prefix: "step/".into(),
                after: Some("step/1".into()),
                limit: Some(100),
            }),
        ),
        (
            "log",
            request(Op::Log {
                since: 5,
                max: Some(10),
            }),
        ),
        ("head", request(Op::Head)),
        // Hex of either case is accepted and goes back on the wire in lowercase.
        (
            "commit-uppercase-hex",
            br#"{"v":1,"secret":"fuzz-secret","generation":3,"op":"commit","writes":[{"put":"k","value":"DEADbeef"}],"log":["4F4B"]}"#.to_vec(),
        ),
        (
            "commit-not-hex",
            br#"{"v":1,"secret":"fuzz-secret","generation":3,"op":"commit","writes":[{"put":"k","value":"6g69"},{"delete":"old"}],"log":["686"]}"#.to_vec(),
        ),
        // One connection: a framed get, then a framed release.
        ("frames-get-release", connection),
        ("frame-oversized-length", oversized),
        ("empty", Vec::new()),
    ];
    for (name, bytes) in seeds {
        write(root, "store_wire", name, &bytes);
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    decode_records_seeds(&root);
    parse_names_seeds(&root);
    read_folder_seeds(&root);
    transitions_seeds(&root);
    store_wire_seeds(&root);
    for (target, check) in runlease_fuzz::TARGETS {
        let dir = root.join(target);
        let mut n = 0;
        for e in std::fs::read_dir(&dir).expect("corpus dir") {
            let bytes = std::fs::read(e.expect("entry").path()).expect("seed");
            check(&bytes);
            n += 1;
        }
        println!("{target}: {n} seeds in {}", dir.display());
    }
}
