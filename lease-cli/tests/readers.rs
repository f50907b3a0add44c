//! Issue #28, "readers say what is not authoritative" and "next steps that loop":
//!
//! - `store get/list/log` on a store rewound behind its seal refuse with 65
//!   (`STORE_BEHIND_SEAL`) naming doctor, whose finding has the same code; nothing written;
//! - an open cutoff (a crash between a release's epoch and its cutoff) is reported by
//!   `doctor` (`OPEN_CUTOFF`) with the step that closes it, and `events` says why the
//!   released owner's events are pending and what settles them; the step settles them;
//! - doctor's next steps make progress: `--clean-temp` is named only when it removes a temp
//!   file, and `prune` (for `STRAY_EPOCHS`) removes the strays below the floor;
//! - doctor's human `next:` line is pasteable (a path with a control character is `$'...'`).

mod common;

use common::*;
use lease_core::LeaseOps;
use lease_core::ops::{AppendParams, ClaimParams, ReleaseParams};
use lease_core::{Holder, Identity, Timestamp, TimingPolicy};
use lease_fs::RunDir;
use lease_run::{Batch, FinalStatus, OpenOptions, Run};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn ts(ms: u64) -> Timestamp {
    Timestamp::from_unix_millis(ms).unwrap()
}

/// Open `dir` as its owner, commit one batch putting `key`, and release (sealing).
fn commit_and_release(dir: &Path, key: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let run = Run::open(dir, OpenOptions::default()).await.unwrap();
        run.commit(Batch::new().put(key, "v").log(key))
            .await
            .unwrap();
        run.release(FinalStatus::Done).await.unwrap();
    });
}

fn codes(v: &[Value]) -> Vec<String> {
    v.iter()
        .map(|f| f["code"].as_str().unwrap().to_string())
        .collect()
}

fn finding<'a>(v: &'a [Value], code: &str) -> &'a Value {
    v.iter()
        .find(|f| f["code"] == code)
        .unwrap_or_else(|| panic!("no {code}: {v:?}"))
}

fn argv_of(f: &Value) -> Option<Vec<String>> {
    f["next_step_argv"]
        .as_array()
        .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
}

/// Run an argument vector `runlease ...` as it is.
fn run_argv(argv: &[String]) -> std::process::Output {
    assert_eq!(argv[0], "runlease");
    let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
    runlease(&args)
}

/// A store rewound behind its seal on a free run: every reader refuses with 65
/// `STORE_BEHIND_SEAL`, names doctor, and prints no value; doctor reports the finding of
/// the same code; nothing in the folder changes. Without the check, `store get` printed
/// the rewound value with exit 0.
#[test]
fn store_readers_refuse_a_store_behind_its_seal_and_name_doctor() {
    let (tmp, dir) = scratch();
    let run = dir.join("job");
    commit_and_release(&run, "first");
    let copy = tmp.path().join("old.sqlite");
    std::fs::copy(run.join("store/run.sqlite"), &copy).unwrap();
    commit_and_release(&run, "second");
    let d = run.to_str().unwrap();
    // Whole: it reads.
    let o = runlease(&["store", "get", d, "second"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    // Rewound to the copy from before the second commit: behind the second seal.
    std::fs::copy(&copy, run.join("store/run.sqlite")).unwrap();
    let before = tree(&dir);
    for args in [
        vec!["store", "get", d, "first"],
        vec!["store", "list", d, ""],
        vec!["store", "log", d],
        vec!["store", "get", "--json", d, "first"],
    ] {
        let o = runlease(&args);
        assert_eq!(o.status.code(), Some(65), "{args:?}: {}", text(&o.stderr));
        let err = text(&o.stderr);
        assert!(err.contains("STORE_BEHIND_SEAL"), "{args:?}: {err}");
        assert!(err.contains("runlease doctor"), "{args:?}: {err}");
        if args.contains(&"--json") {
            let v = json_lines(&o);
            assert_eq!(v.len(), 1, "{v:?}");
            assert_eq!(v[0]["code"], "STORE_BEHIND_SEAL", "{v:?}");
        } else {
            assert!(o.stdout.is_empty(), "{args:?}: {}", text(&o.stdout));
        }
        assert_eq!(tree(&dir), before, "{args:?} wrote");
    }
    let f = json_lines(&runlease(&["doctor", "--json", d]));
    assert!(
        codes(&f).contains(&"STORE_BEHIND_SEAL".to_string()),
        "{f:?}"
    );
    assert_eq!(tree(&dir), before);
}

/// Claim `dir` as `owner` (holder: this process), append `n` events, and release it; then
/// remove the cutoff the release wrote: the state a crash between the release's epoch and
/// its cutoff leaves (PROTOCOL §9). Returns the released generation.
fn released_with_open_cutoff(dir: &Path, owner: &str, n: u64) -> u64 {
    let run = RunDir::open(dir).unwrap();
    let policy =
        TimingPolicy::from_millis(1000, 3000, 10_000, lease_core::HeartbeatDurability::Local)
            .unwrap();
    let holder: Holder = lease_fs::this_holder().unwrap();
    let lease = run
        .claim(ClaimParams {
            run_id: run.run_id().clone(),
            owner_id: Identity::new(owner).unwrap(),
            holder,
            policy,
            now: ts(now_ms()),
            store_floor: None,
        })
        .unwrap();
    for i in 0..n {
        run.append(
            &lease,
            AppendParams {
                event_type: Identity::new("step").unwrap(),
                payload: serde_json::json!(i),
                now: ts(now_ms()),
                tail_hint: None,
            },
        )
        .unwrap();
    }
    let g = lease.generation.get();
    run.release(ReleaseParams {
        lease,
        now: ts(now_ms()),
        seal: None,
    })
    .unwrap();
    std::fs::remove_file(dir.join("lease/cutoffs").join(format!("{g:020}.json"))).unwrap();
    g
}

/// A crash between a release's epoch and its cutoff: `events` says why the released
/// owner's acknowledged events are pending and what settles them, `doctor` reports
/// `OPEN_CUTOFF` with the step `status` names (a claim), nothing is written by either, and
/// that step settles the events (they count).
#[test]
fn an_open_cutoff_is_reported_with_the_step_that_closes_it() {
    let (_tmp, dir) = scratch();
    let run = dir.join("job");
    let d = run.to_str().unwrap();
    let o = runlease(&["init", "--", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let g = released_with_open_cutoff(&run, "writer", 2);
    let before = tree(&dir);

    let ev = json_lines(&runlease(&["events", "--json", d]));
    assert_eq!(ev.len(), 2, "{ev:?}");
    for e in &ev {
        assert_eq!(e["authority"], "pending", "{e}");
        assert_eq!(e["superseded_by"], g + 1, "{e}");
    }
    let human = text(&runlease(&["events", d]).stdout);
    assert!(
        human.contains(&format!("superseded by generation {}", g + 1))
            && human.contains("OPEN_CUTOFF")
            && human.contains("next change of owner"),
        "{human}"
    );

    let f = json_lines(&runlease(&["doctor", "--json", d]));
    assert_eq!(codes(&f), ["OPEN_CUTOFF"], "{f:?}");
    assert_eq!(f[0]["severity"], "warning");
    let detail = f[0]["detail"].as_str().unwrap();
    assert!(
        detail.contains(&format!("superseded generation {g}")) && detail.contains("pending"),
        "{detail}"
    );
    assert!(
        f[0]["next_step"].as_str().unwrap().contains("runlease run"),
        "{f:?}"
    );
    let s = status_json(&run);
    assert_eq!(s["state"], "free", "{s}");
    // status shows it too, with the file, and the step that closes it.
    assert_eq!(s["open_cutoff"]["retired"], g, "{s}");
    assert_eq!(s["open_cutoff"]["by"], g + 1, "{s}");
    let human = text(&runlease(&["status", d]).stdout);
    assert!(
        human.contains("cutoff") && human.contains("open") && human.contains("lease/cutoffs/"),
        "{human}"
    );
    assert_eq!(tree(&dir), before, "events, doctor and status wrote");

    // The step: a claim (here `runlease run`) finalizes the cutoff first; the events count.
    let o = runlease(&["run", "-q", d, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let ev = json_lines(&runlease(&["events", "--json", d]));
    assert!(ev.iter().all(|e| e["authority"] == "counts"), "{ev:?}");
    let f = json_lines(&runlease(&["doctor", "--json", d]));
    assert_eq!(codes(&f), ["OK"], "{f:?}");
    assert!(status_json(&run)["open_cutoff"].is_null());
}

/// `ORPHAN_TEMP_FILES` names `doctor --clean-temp` only when it removes a file: a young
/// temp file alone gets no command (it named the clean-up, which removed nothing, and the
/// same step came back); once old, the named step removes it and doctor is OK.
#[test]
fn the_temp_file_step_is_named_only_when_it_removes_something() {
    let (_tmp, dir) = scratch();
    let run = dir.join("job");
    let d = run.to_str().unwrap();
    assert_eq!(
        runlease(&["run", "-q", d, "--", "true"]).status.code(),
        Some(0)
    );
    let temp = run.join("lease/epochs/.tmp-1-1-000000001");
    std::fs::write(&temp, b"x").unwrap();
    let f = json_lines(&runlease(&["doctor", "--json", d]));
    let t = finding(&f, "ORPHAN_TEMP_FILES");
    assert_eq!(argv_of(t), None, "{t}");
    assert!(
        t["next_step"].as_str().unwrap().starts_with("nothing now"),
        "{t}"
    );
    // Old: the step is the clean-up, and it works.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&temp)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let f = json_lines(&runlease(&["doctor", "--json", d]));
    let argv = argv_of(finding(&f, "ORPHAN_TEMP_FILES")).unwrap();
    assert_eq!(argv[1..3], ["doctor", "--clean-temp"], "{argv:?}");
    let o = run_argv(&argv);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(!temp.exists());
    let f = json_lines(&runlease(&["doctor", "--json", d]));
    assert_eq!(codes(&f), ["OK"], "{f:?}");
}

/// `STRAY_EPOCHS` names `prune`, and that step removes the strays below the floor even
/// when there is nothing to compact (it said "nothing to prune" and left them).
#[test]
fn the_stray_epochs_step_removes_them() {
    let (_tmp, dir) = scratch();
    let run = dir.join("job");
    let d = run.to_str().unwrap();
    for _ in 0..4 {
        assert_eq!(
            runlease(&["run", "-q", d, "--", "true"]).status.code(),
            Some(0)
        );
    }
    let e1 = std::fs::read(epoch_file(&run, 1)).unwrap();
    let o = runlease(&["prune", "--json", "--keep", "2", "--", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(!epoch_file(&run, 1).exists());
    // A stray below the floor (a prune's lost removal).
    std::fs::write(epoch_file(&run, 1), e1).unwrap();
    let f = json_lines(&runlease(&["doctor", "--json", d]));
    let argv = argv_of(finding(&f, "STRAY_EPOCHS")).unwrap();
    assert_eq!(argv[1], "prune", "{argv:?}");
    let o = run_argv(&argv);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(!epoch_file(&run, 1).exists(), "{}", text(&o.stdout));
    assert!(
        text(&o.stdout).contains("removed 1 stray"),
        "{}",
        text(&o.stdout)
    );
    let f = json_lines(&runlease(&["doctor", "--json", d]));
    assert_eq!(codes(&f), ["OK"], "{f:?}");
}

/// doctor's human `next:` line is written for a terminal: a run folder whose path holds a
/// newline and an ESC is one `$'...'` word, nothing a terminal acts on is printed, and
/// bash reads the line back as exactly the JSON `next_step_argv` (it was the `--json`
/// quoting, with the raw control characters inside single quotes).
#[test]
fn doctors_human_next_line_is_pasteable() {
    if Command::new("bash").arg("-c").arg("true").status().is_err() {
        return;
    }
    let (tmp, _) = scratch();
    let parent = tmp.path().join("new\nline\u{1b}[31m");
    std::fs::create_dir(&parent).unwrap();
    let run = parent.join("job");
    let d = run.to_str().unwrap();
    assert_eq!(runlease(&["init", "--", d]).status.code(), Some(0));
    // A dead owner here: doctor names `retire`.
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let r = RunDir::open(&run).unwrap();
    r.claim(ClaimParams {
        run_id: r.run_id().clone(),
        owner_id: Identity::new("gone").unwrap(),
        holder: Holder {
            pid,
            ..lease_fs::this_holder().unwrap()
        },
        policy: TimingPolicy::from_millis(100, 300, 1000, lease_core::HeartbeatDurability::Local)
            .unwrap(),
        now: ts(now_ms()),
        store_floor: None,
    })
    .unwrap();
    let f = json_lines(&runlease(&["doctor", "--json", d]));
    let argv = argv_of(finding(&f, "DEAD_OWNER")).unwrap();
    assert_eq!(argv[1], "retire", "{argv:?}");
    let human = text(&runlease(&["doctor", d]).stdout);
    assert!(
        !human.contains('\u{1b}') && !human.contains("new\nline"),
        "{human:?}"
    );
    let next = human
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("next:"))
        .map(str::trim)
        .find(|l| l.starts_with("runlease retire"))
        .unwrap_or_else(|| panic!("no retire step: {human}"));
    assert!(next.contains("$'"), "{next}");
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "printf '%s\\0' runlease {}",
            next.strip_prefix("runlease ").unwrap()
        ))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let mut words: Vec<String> = String::from_utf8(o.stdout)
        .unwrap()
        .split('\0')
        .map(String::from)
        .collect();
    assert_eq!(words.pop().as_deref(), Some(""));
    assert_eq!(words, argv, "{next:?}");
}
