//! PROTOCOL §5.1, "Bad files named like records": a directory, symlink, FIFO, socket,
//! device or oversize file named like a record gets one typed error and one code
//! (`RUN_LAYOUT_INVALID`, 65) from every adapter primitive (Read, Exists, List,
//! CountEvents, and so TAIL) in every folder, and so from every command; nothing blocks on
//! a FIFO and every refusal leaves the disk as it was.

use lease_core::LeaseOps;
use lease_core::canonical::MAX_RECORD_BYTES;
use lease_core::ops::{AppendParams, ClaimParams, Request};
use lease_core::*;
use lease_fs::{FsError, RunDir, this_holder};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// The kinds of entry that are not a record file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bad {
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    Oversize,
}

const ALL_BAD: [Bad; 6] = [
    Bad::Directory,
    Bad::Symlink,
    Bad::Fifo,
    Bad::Socket,
    Bad::CharDevice,
    Bad::Oversize,
];

/// Make `bad` at `root/rel` (its folder exists). `false` if this process cannot make it
/// (a device without `CAP_MKNOD`).
fn plant(root: &Path, rel: &str, bad: Bad) -> bool {
    let p = root.join(rel);
    match bad {
        Bad::Directory => std::fs::create_dir(&p).unwrap(),
        // A symlink to a regular file that holds bytes: it must not be followed.
        Bad::Symlink => {
            std::fs::write(root.join("target"), b"{}\n").unwrap();
            std::os::unix::fs::symlink(root.join("target"), &p).unwrap();
        }
        Bad::Fifo => rustix::fs::mknodat(
            rustix::fs::CWD,
            &p,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap(),
        Bad::Socket => {
            // The socket file stays after the listener is dropped.
            drop(std::os::unix::net::UnixListener::bind(&p).unwrap());
        }
        Bad::CharDevice => {
            let made = rustix::fs::mknodat(
                rustix::fs::CWD,
                &p,
                rustix::fs::FileType::CharacterDevice,
                rustix::fs::Mode::from_raw_mode(0o600),
                rustix::fs::makedev(1, 3),
            );
            if made.is_err() {
                eprintln!("cannot mknod a device here (no CAP_MKNOD): device case skipped");
                return false;
            }
        }
        Bad::Oversize => {
            std::fs::write(&p, vec![b' '; MAX_RECORD_BYTES + 1]).unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
        }
    }
    true
}

/// Every entry below `root`: relative path → (file type, size of regular files).
fn tree(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let md = std::fs::symlink_metadata(e.path()).unwrap();
            let rel = e.path().strip_prefix(root).unwrap().display().to_string();
            if md.is_dir() {
                todo.push(e.path());
            }
            out.insert(rel, format!("{:?} {}", md.file_type(), md.len()));
        }
    }
    out
}

/// Run `f` on another thread; fail (instead of hanging) if it takes over 20 s.
fn in_time<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: blocked (a FIFO was opened blocking?)"))
}

fn t(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(1_796_169_600_000 + ms).unwrap()
}

fn id(s: &str) -> Identity {
    Identity::new(s).unwrap()
}

fn g(n: u64) -> Generation {
    Generation::new(n).unwrap()
}

fn seq(n: u64) -> Sequence {
    Sequence::new(n).unwrap()
}

/// One record name in every folder that holds records.
fn one_of_each() -> Vec<(Dir, FileRef)> {
    vec![
        (Dir::Epochs, FileRef::Epoch(g(9))),
        (Dir::Beats, FileRef::Beat(g(9))),
        (Dir::Cutoffs, FileRef::Cutoff(g(9))),
        (
            Dir::Intents,
            FileRef::Intent {
                generation: g(9),
                nonce: 0xab,
            },
        ),
        (Dir::Checkpoints, FileRef::Checkpoint(g(9))),
        (Dir::Events, FileRef::Event(seq(9))),
        (
            Dir::Commands,
            FileRef::Command {
                generation: g(9),
                pid: 4242,
            },
        ),
    ]
}

/// The error is the one classification: `RUN_LAYOUT_INVALID`, naming the run and the file.
fn assert_not_a_record(what: &str, e: &FsError, path: &str) {
    assert_eq!(e.code(), Code::RunLayoutInvalid, "{what}: {e}");
    assert!(
        matches!(e, FsError::LayoutInvalid { path: p, .. } if p == path),
        "{what}: {e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("run r") && msg.contains(path), "{what}: {msg}");
    assert!(msg.contains("named like a record"), "{what}: {msg}");
}

// PROTOCOL §5.1 (bad files named like records), §5.2
#[test]
fn each_bad_file_in_each_folder_gets_the_same_code_from_each_primitive() {
    let mut cases = 0;
    for bad in ALL_BAD {
        for (dir, f) in one_of_each() {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().join("r");
            let run = RunDir::create(&root).unwrap();
            run.fs().ensure_dir(dir.path()).unwrap();
            let path = f.path();
            if !plant(&root, &path, bad) {
                continue;
            }
            let before = tree(&root);
            let what = format!("{bad:?} as {path}");
            let mut requests = vec![Request::Read(f), Request::Exists(f), Request::List(dir)];
            if dir == Dir::Events {
                requests.push(Request::CountEvents);
            }
            let run = std::sync::Arc::new(run);
            for req in requests {
                let label = format!("{what}, {req:?}");
                let r = run.clone();
                let e = in_time(&label, move || r.perform(req)).unwrap_err();
                assert_not_a_record(&label, &e, &path);
                cases += 1;
            }
            assert_eq!(tree(&root), before, "{what}: a refusal changed the disk");
        }
    }
    assert!(cases >= 5 * 7 * 3, "only {cases} cases ran");
}

fn claim(run: &RunDir) -> Result<lease_core::ops::OwnedLease, FsError> {
    run.claim(ClaimParams {
        run_id: run.run_id().clone(),
        owner_id: id("owner"),
        holder: this_holder().unwrap(),
        policy: TimingPolicy::default(),
        now: t(0),
        store_floor: None,
    })
}

fn params(n: u64) -> AppendParams {
    AppendParams {
        event_type: id("step"),
        payload: serde_json::json!({ "n": n }),
        now: t(n),
        tail_hint: None,
    }
}

// PROTOCOL §5.1, §7.6, §13: one rule for the log
#[test]
fn a_bad_file_in_the_log_stops_verify_events_and_append_alike() {
    for bad in ALL_BAD {
        // Events 1 and 2 exist; the bad entry is named `event 3`, where both TAIL (from
        // nothing: it probes 1, then 3) and the guard of an append with a hint (it probes 3
        // before creating 3) meet it.
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("r");
        let run = RunDir::create(&root).unwrap();
        let lease = claim(&run).unwrap();
        run.append(&lease, params(1)).unwrap();
        run.append(&lease, params(2)).unwrap();
        let path = FileRef::Event(seq(3)).path();
        if !plant(&root, &path, bad) {
            continue;
        }
        let before = tree(&root);
        let what = format!("{bad:?}");
        let run = std::sync::Arc::new(run);
        let r = run.clone();
        let e = in_time("verify", move || r.verify()).unwrap_err();
        assert_not_a_record(&format!("{what}: verify"), &e, &path);
        let r = run.clone();
        let e = in_time("events", move || r.read_events(None)).unwrap_err();
        assert_not_a_record(&format!("{what}: events"), &e, &path);
        // This RunDir holds the hint (2, hash): the hint probe meets `event 3`.
        let (r, l) = (run.clone(), lease.clone());
        let e = in_time("append", move || r.append(&l, params(3))).unwrap_err();
        assert_not_a_record(&format!("{what}: append with a hint"), &e, &path);
        // A fresh handle has no hint: TAIL meets it.
        let fresh = RunDir::open(&root).unwrap();
        let l = lease.clone();
        let e = in_time("append", move || fresh.append(&l, params(3))).unwrap_err();
        assert_not_a_record(&format!("{what}: append by TAIL"), &e, &path);
        assert_eq!(tree(&root), before, "{what}: a refusal changed the disk");
    }
}

// PROTOCOL §5.1, §7.0 OBSERVE
#[test]
fn a_bad_file_among_the_epochs_stops_claim_status_and_verify_alike() {
    for bad in ALL_BAD {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("r");
        let run = RunDir::create(&root).unwrap();
        let lease = claim(&run).unwrap();
        run.release(lease_core::ops::ReleaseParams {
            lease,
            now: t(10),
            seal: None,
        })
        .unwrap();
        // Epochs 1 (claim) and 2 (release); the bad entry is named `epoch 3`, which
        // OBSERVE's listing takes for the head.
        let path = FileRef::Epoch(g(3)).path();
        if !plant(&root, &path, bad) {
            continue;
        }
        let before = tree(&root);
        let what = format!("{bad:?}");
        let run = std::sync::Arc::new(run);
        let r = run.clone();
        let e = in_time("claim", move || claim(&r)).unwrap_err();
        assert_not_a_record(&format!("{what}: claim"), &e, &path);
        let r = run.clone();
        let e = in_time("status", move || r.status(t(20), false)).unwrap_err();
        assert_not_a_record(&format!("{what}: status"), &e, &path);
        let r = run.clone();
        let e = in_time("verify", move || r.verify()).unwrap_err();
        assert_not_a_record(&format!("{what}: verify"), &e, &path);
        assert_eq!(tree(&root), before, "{what}: a refusal changed the disk");
    }
}

// PROTOCOL §5.1 (what it is, before whose it is), §2 Trust
#[test]
fn what_a_bad_entry_is_is_judged_before_whom_it_belongs_to() {
    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("not root: cannot chown to another uid, skipped");
        return;
    }
    let nobody = rustix::process::Uid::from_raw(65534);
    for bad in [Bad::Directory, Bad::Fifo, Bad::Oversize] {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("r");
        let run = std::sync::Arc::new(RunDir::create(&root).unwrap());
        run.fs().ensure_dir(Dir::Events.path()).unwrap();
        let f = FileRef::Event(seq(1));
        let path = f.path();
        plant(&root, &path, bad);
        rustix::fs::chownat(
            rustix::fs::CWD,
            root.join(&path),
            Some(nobody),
            None,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap();
        for req in [Request::Read(f), Request::Exists(f), Request::CountEvents] {
            let label = format!("{bad:?} of another uid, {req:?}");
            let r = run.clone();
            let e = in_time(&label, move || r.perform(req)).unwrap_err();
            assert_not_a_record(&label, &e, &path);
        }
    }
    // A regular record of another uid stays `RUN_NOT_OWNED` (77) for what reads or probes
    // it, and is never read.
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("r");
    let run = RunDir::create(&root).unwrap();
    let lease = claim(&run).unwrap();
    run.append(&lease, params(1)).unwrap();
    let path = FileRef::Event(seq(1)).path();
    rustix::fs::chownat(
        rustix::fs::CWD,
        root.join(&path),
        Some(nobody),
        None,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
    for req in [
        Request::Read(FileRef::Event(seq(1))),
        Request::Exists(FileRef::Event(seq(1))),
    ] {
        let e = run.perform(req.clone()).unwrap_err();
        assert_eq!(e.code(), Code::RunNotOwned, "{req:?}: {e}");
    }
}
