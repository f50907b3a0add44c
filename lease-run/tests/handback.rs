//! Issue #17, "never half-acts": `Run::open` refuses before the claim whatever its preflight
//! can see (the log exactly as `verify` judges it, names above the head, the store the
//! chain names), leaving every file as it was; a failure after the claim hands the run back
//! (released with the seal, `run.json` `failed`), so the run is free and the next open
//! proceeds; and a replacement from outside (`Replacer`) rewrites `run.json` so it never
//! says `running` for a generation that lost the lease, including after a crash between
//! the chain change and that rewrite.

use lease_core::diagnose::{FindingCode, Next, Severity, diagnose, next_step};
use lease_core::ops::{AppendParams, Expectation, Status, TakeoverTrigger};
use lease_core::{
    Code, EpochState, Generation, Holder, Identity, LeaseOps, RunState, RunStatus, decode, encode,
};
use lease_fs::RunDir;
use lease_run::replace::{Replacer, RunJsonUpdate};
use lease_run::{Authority, Batch, FinalStatus, OpenOptions, Run, StepName};
use std::collections::BTreeMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

mod support;
use support::{fast, now_ts, rt};

fn name(g: u64) -> String {
    format!("{g:020}.json")
}

/// Every entry below `dir`: its kind, and a regular file's bytes (`owner.lock` and the
/// store's files excluded: the open takes the lock, and `store/` is lease-sqlite's).
fn tree(dir: &Path) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                out.insert(rel, "dir".into());
                walk(root, &p, out);
            } else if ft.is_fifo() {
                out.insert(rel, "fifo".into());
            } else if !rel.starts_with("store") && rel != Path::new("owner.lock") {
                out.insert(
                    rel,
                    String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into(),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn read_status(path: &Path) -> RunStatus {
    decode(&std::fs::read(path.join("run.json")).unwrap()).unwrap()
}

fn view(path: &Path) -> lease_core::ops::StatusView {
    RunDir::open(path).unwrap().status(now_ts(), false).unwrap()
}

/// A run released twice (generation 4 is the free head), with `events` events by its
/// owners and one commit in its store, so the chain names a sealed store.
fn used_run(path: &Path, events: u64) {
    rt().block_on(async {
        let run = Run::open(path, fast()).await.unwrap();
        for i in 0..events {
            run.authority()
                .append(
                    run.lease(),
                    AppendParams {
                        event_type: Identity::new("step").unwrap(),
                        payload: serde_json::json!(i),
                        now: now_ts(),
                        tail_hint: None,
                    },
                )
                .unwrap();
        }
        run.commit(Batch::new().put("k", "v")).await.unwrap();
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
        let run = Run::open(path, fast()).await.unwrap();
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
    });
    assert_eq!(view(path).head.unwrap().generation().get(), 4);
}

fn open_err(path: &Path, opts: OpenOptions) -> lease_run::RunError {
    rt().block_on(Run::open(path, opts)).unwrap_err()
}

fn open_and_release(path: &Path) -> u64 {
    rt().block_on(async {
        let run = Run::open(path, fast()).await.unwrap();
        let g = run.generation().get();
        assert_eq!(run.store().head().unwrap(), 1, "the store kept its commit");
        run.release(FinalStatus::Done).await.unwrap();
        g
    })
}

fn mkfifo(p: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        p,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
}

/// One rule for the log: whatever `verify` rejects, the open refuses before claiming,
/// with verify's code, and every file stays as it was. Each hostile name is then removed
/// (or the record restored) and the open proceeds.
#[test]
fn the_open_refuses_what_verify_rejects_with_its_code_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("log");
    used_run(&path, 2);
    let ev = |s: u64| path.join("events").join(name(s));
    let original_1 = std::fs::read(ev(1)).unwrap();
    type Damage<'a> = Box<dyn Fn(&Path) + 'a>;
    let cases: Vec<(&str, Damage, Damage)> = vec![
        (
            "a directory named like event 5 (a gap)",
            Box::new(|_| std::fs::create_dir(ev(5)).unwrap()),
            Box::new(|_| std::fs::remove_dir(ev(5)).unwrap()),
        ),
        (
            "a directory named like the next event",
            Box::new(|_| std::fs::create_dir(ev(3)).unwrap()),
            Box::new(|_| std::fs::remove_dir(ev(3)).unwrap()),
        ),
        (
            "a FIFO named like the next event",
            Box::new(|_| mkfifo(&ev(3))),
            Box::new(|_| std::fs::remove_file(ev(3)).unwrap()),
        ),
        (
            "an extra event leaving a gap",
            Box::new(|_| std::fs::copy(ev(2), ev(5)).map(|_| ()).unwrap()),
            Box::new(|_| std::fs::remove_file(ev(5)).unwrap()),
        ),
        (
            "an event edited by hand (the next link breaks)",
            Box::new(|_| {
                let t = String::from_utf8(original_1.clone()).unwrap();
                std::fs::write(ev(1), t.replace("\"payload\":0", "\"payload\":9")).unwrap();
            }),
            Box::new(|_| std::fs::write(ev(1), &original_1).unwrap()),
        ),
        (
            "a directory in place of an old epoch",
            Box::new(|p| {
                let e = p.join("lease/epochs").join(name(1));
                std::fs::rename(&e, p.join("epoch-1.saved")).unwrap();
                std::fs::create_dir(&e).unwrap();
            }),
            Box::new(|p| {
                let e = p.join("lease/epochs").join(name(1));
                std::fs::remove_dir(&e).unwrap();
                std::fs::rename(p.join("epoch-1.saved"), &e).unwrap();
            }),
        ),
    ];
    for (what, damage, repair) in &cases {
        damage(&path);
        let verify = RunDir::open(&path).unwrap().verify().unwrap_err();
        let before = tree(&path);
        let e = open_err(&path, fast());
        assert_eq!(
            e.code(),
            verify.code(),
            "{what}: open {e} / verify {verify}"
        );
        assert_eq!(
            tree(&path),
            before,
            "{what}: the refused open changed files"
        );
        repair(&path);
        assert_eq!(view(&path).status, Status::Free, "{what}");
    }
    // Nothing was used up by the refusals: the next claim is generation 5.
    assert_eq!(open_and_release(&path), 5);
}

/// A heartbeat, cutoff or command record named for a generation above the head (no crash
/// leaves one) is refused before the claim (`RUN_LAYOUT_INVALID`, naming it, unless verify
/// rejects it first: then verify's code), whatever its type; nothing changes; once it is
/// moved out the open proceeds.
#[test]
fn names_above_the_head_are_refused_before_the_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("above");
    used_run(&path, 0);
    let beat5 = path.join("lease/beats").join(name(5));
    let cutoff5 = path.join("lease/cutoffs").join(name(5));
    let command6 = path.join("commands").join(format!("{:020}-4242.json", 6));
    for d in ["commands", "lease/beats", "lease/cutoffs"] {
        std::fs::create_dir_all(path.join(d)).unwrap();
    }
    type Make<'a> = Box<dyn Fn() + 'a>;
    let cases: Vec<(&Path, Make)> = vec![
        (&beat5, Box::new(|| std::fs::create_dir(&beat5).unwrap())),
        (
            &beat5,
            Box::new(|| std::fs::write(&beat5, b"{}\n").unwrap()),
        ),
        (&beat5, Box::new(|| mkfifo(&beat5))),
        (
            &cutoff5,
            Box::new(|| std::fs::write(&cutoff5, b"x").unwrap()),
        ),
        (
            &command6,
            Box::new(|| std::fs::write(&command6, command_record(&path, 6, 4242)).unwrap()),
        ),
    ];
    for (stray, make) in &cases {
        make();
        let before = tree(&path);
        // A cutoff is a record verify reads: its rejection (same code) comes first.
        let want = match RunDir::open(&path).unwrap().verify() {
            Err(v) => v.code(),
            Ok(_) => Code::RunLayoutInvalid,
        };
        let e = open_err(&path, fast());
        assert_eq!(e.code(), want, "{}: {e}", stray.display());
        let rel = stray.strip_prefix(&path).unwrap().display().to_string();
        assert!(e.to_string().contains(&rel), "{e}");
        assert_eq!(tree(&path), before, "{}", stray.display());
        if stray.is_dir() {
            std::fs::remove_dir(stray).unwrap();
        } else {
            std::fs::remove_file(stray).unwrap();
        }
    }
    assert_eq!(open_and_release(&path), 5);
}

/// A valid command record of generation `g` for `pid` (a process that is gone).
fn command_record(path: &Path, g: u64, pid: u32) -> Vec<u8> {
    let run_id = lease_core::RunId::new(path.file_name().unwrap().to_str().unwrap()).unwrap();
    encode(&lease_core::CommandRecord {
        run_id,
        generation: Generation::new(g).unwrap(),
        pid,
        pgid: pid,
        start_time: 1,
        boot_id: Identity::new(lease_fs::probe::boot_id().unwrap()).unwrap(),
        argv: vec!["true".into()],
        started_at: now_ts(),
        incarnation: None,
        cgroup: None,
        mark: None,
    })
    .unwrap()
}

/// The store the chain names, missing from the folder: refused before the claim
/// (`STORE_MISSING`), nothing written, no generation used; status's next step is doctor
/// (not "claim it"), and doctor says STORE_MISSING.
#[test]
fn a_missing_named_store_is_refused_before_the_claim_and_status_says_doctor() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("nostore");
    used_run(&path, 0);
    let store = path.join("store/run.sqlite");
    std::fs::rename(&store, tmp.path().join("saved.sqlite")).unwrap();
    let before = tree(&path);
    let e = open_err(&path, fast());
    assert_eq!(e.code(), Code::StoreMissing, "{e}");
    assert!(e.to_string().contains("nothing was claimed"), "{e}");
    assert_eq!(tree(&path), before);
    assert_eq!(view(&path).head.unwrap().generation().get(), 4);
    let dir = RunDir::open(&path).unwrap();
    let facts = lease_run::diagnosis::gather_facts(&dir, now_ts()).unwrap();
    assert_eq!(next_step(&facts), Next::DoctorBeforeRun);
    assert!(
        diagnose(&facts)
            .iter()
            .any(|f| f.code == FindingCode::StoreMissing)
    );
    std::fs::rename(tmp.path().join("saved.sqlite"), &store).unwrap();
    assert_eq!(open_and_release(&path), 5);
}

/// What a test injects once, from the step callback, right after `after`.
struct Fault {
    after: StepName,
    inject: Box<dyn Fn(&Path) + Send + Sync>,
}

fn with_fault(path: &Path, fault: Fault) -> OpenOptions {
    let fired = Arc::new(AtomicBool::new(false));
    let p = path.to_path_buf();
    let fault = Arc::new(fault);
    OpenOptions {
        on_step: Some(Arc::new(move |step, _| {
            if step == fault.after && !fired.swap(true, Ordering::SeqCst) {
                (fault.inject)(&p);
            }
        })),
        ..fast()
    }
}

/// Make `rel` a directory (its file saved beside the run, to be put back by `restore`).
fn dir_in_place_of(p: &Path, rel: &str) {
    let f = p.join(rel);
    if f.exists() {
        std::fs::rename(
            &f,
            p.with_extension(format!("saved-{}", rel.replace('/', "-"))),
        )
        .unwrap();
    }
    std::fs::create_dir(&f).unwrap();
}

fn restore(p: &Path, rel: &str) {
    let f = p.join(rel);
    if f.is_dir() {
        std::fs::remove_dir(&f).unwrap();
    } else {
        std::fs::remove_file(&f).unwrap();
    }
    let saved = p.with_extension(format!("saved-{}", rel.replace('/', "-")));
    if saved.exists() {
        std::fs::rename(saved, &f).unwrap();
    }
}

/// A failure at each step after the claim hands the run back: the open fails with the
/// step's error, the head is a release of that generation carrying the seal of the store
/// the chain names (the same store id, so the binding is never dropped), `run.json` says
/// `failed` with the code where it can be written, and once the fault is repaired the next
/// open proceeds with the store intact. (The `heartbeat` step does not touch the disk and
/// has no fault to inject.)
#[test]
fn a_failure_after_the_claim_at_every_step_hands_the_run_back() {
    let cases: Vec<(&str, Fault, &str, Code)> = vec![
        (
            "run.json",
            Fault {
                after: StepName::Claim,
                inject: Box::new(|p| dir_in_place_of(p, "run.json")),
            },
            "run.json",
            Code::RunLayoutInvalid,
        ),
        (
            "layout",
            Fault {
                after: StepName::Heartbeat,
                inject: Box::new(|p| {
                    std::fs::remove_dir(p.join("work")).unwrap();
                    std::fs::write(p.join("work"), b"not a folder").unwrap();
                }),
            },
            "work",
            Code::RunLayoutInvalid,
        ),
        (
            "commands",
            Fault {
                after: StepName::Layout,
                inject: Box::new(|p| {
                    std::fs::create_dir_all(p.join("commands")).unwrap();
                    std::fs::write(
                        p.join("commands").join(format!("{:020}-4242.json", 1)),
                        b"{}\n",
                    )
                    .unwrap()
                }),
            },
            "commands/00000000000000000001-4242.json",
            Code::RecordInvalid,
        ),
        (
            "store",
            Fault {
                after: StepName::Commands,
                inject: Box::new(|p| dir_in_place_of(p, "store/run.sqlite")),
            },
            "store/run.sqlite",
            Code::StoreCorrupt,
        ),
    ];
    for (step, fault, repair, want) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("back");
        used_run(&path, 1);
        let sealed = view(&path).head.unwrap().epoch.seal.unwrap();
        let mut opts = with_fault(&path, fault);
        // The store step opens the store only when told to open it eagerly (issue #33:
        // lazily, a store spoiled after the preflight is the first access's error, see
        // lifecycle's `a_deferred_store_that_cannot_be_opened_...`).
        opts.lazy_store = step != "store";
        let e = open_err(&path, opts);
        assert_eq!(e.code(), want, "{step}: {e}");
        // Handed back: free, released by generation 5 as 6, with the named store's seal.
        let v = view(&path);
        assert_eq!(v.status, Status::Free, "{step}");
        let head = v.head.unwrap();
        assert_eq!(
            (head.generation().get(), head.epoch.state),
            (6, EpochState::Released),
            "{step}"
        );
        let seal = head.epoch.seal.expect("released with the seal");
        assert_eq!(
            seal.store_id, sealed.store_id,
            "{step}: the binding is kept"
        );
        assert_eq!(seal.generation.get(), 5, "{step}");
        assert!(seal.sequence >= 1, "{step}");
        if path.join("run.json").is_file() {
            let st = read_status(&path);
            assert_eq!((st.status, st.generation.get()), (RunState::Failed, 5));
            assert!(st.detail.unwrap().starts_with(want.as_str()), "{step}");
        }
        restore(&path, repair);
        if step == "layout" {
            std::fs::create_dir(path.join("work")).unwrap();
        }
        assert_eq!(open_and_release(&path), 7, "{step}");
    }
}

/// A foreign store in place of the sealed one: refused before the claim (issue #28: the
/// admission rule reads the store without writing, under the owner lock, against the
/// seal the chain names), so no generation is used up and nothing is written, not even
/// a `-wal`; the sealed store, put back, opens as the next generation.
#[test]
fn a_foreign_store_is_refused_before_the_claim_writing_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("seal");
    let other = tmp.path().join("other");
    used_run(&path, 0);
    used_run(&other, 0);
    let store = path.join("store/run.sqlite");
    std::fs::rename(&store, tmp.path().join("mine.sqlite")).unwrap();
    std::fs::copy(other.join("store/run.sqlite"), &store).unwrap();
    let before_head = view(&path).head.unwrap();
    let before = std::fs::read_dir(path.join("store")).unwrap().count();
    let run_json = std::fs::read(path.join("run.json")).unwrap();
    let e = open_err(&path, fast());
    assert_eq!(e.code(), Code::StoreIdentityMismatch, "{e}");
    let head = view(&path).head.unwrap();
    assert_eq!(
        head.generation(),
        before_head.generation(),
        "a claim was made"
    );
    assert_eq!(head.epoch.state, EpochState::Released);
    assert_eq!(
        std::fs::read_dir(path.join("store")).unwrap().count(),
        before
    );
    assert!(!path.join("store/run.sqlite-wal").exists());
    assert_eq!(std::fs::read(path.join("run.json")).unwrap(), run_json);
    std::fs::rename(tmp.path().join("mine.sqlite"), &store).unwrap();
    assert_eq!(open_and_release(&path), 5);
}

/// A holder whose process is gone (same boot), so liveness calls its owner dead.
fn dead_holder() -> Holder {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    Holder {
        pid,
        ..lease_fs::this_holder().unwrap()
    }
}

/// Claim generation `head + 1` as an owner that is already dead, and write `run.json`
/// `running` for it, as a `runlease run` killed with SIGKILL leaves the run.
fn dead_owner(path: &Path) -> Generation {
    let dir = RunDir::open(path).unwrap();
    let lease = dir
        .claim(lease_core::ops::ClaimParams {
            run_id: dir.run_id().clone(),
            owner_id: Identity::new("killed-owner").unwrap(),
            holder: dead_holder(),
            policy: fast().policy,
            now: now_ts(),
            store_floor: None,
        })
        .unwrap();
    let rec = RunStatus {
        run_id: dir.run_id().clone(),
        status: RunState::Running,
        generation: lease.generation,
        sealed_sequence: None,
        wake_at: None,
        holder: Some(lease.holder.clone()),
        heartbeat_at: Some(now_ts()),
        updated_at: now_ts(),
        detail: None,
    };
    std::fs::write(path.join("run.json"), encode(&rec).unwrap()).unwrap();
    lease.generation
}

/// `runlease retire`'s path: run.json is rewritten `failed` as the retirement's
/// generation, and doctor and status agree with it (free, nothing to repair).
#[test]
fn a_retirement_rewrites_run_json_as_its_generation() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("retire");
    used_run(&path, 0);
    let g = dead_owner(&path);
    let r = Replacer::for_retire(&path, &Authority::RunFolder).unwrap();
    let observed = r.observe(now_ts()).unwrap().expect("an owner to retire");
    assert_eq!(observed.view.status, Status::Dead);
    let retired = r
        .retire(&observed, Identity::new("retirer").unwrap(), now_ts())
        .unwrap();
    drop(r);
    assert_eq!(retired.retired, g);
    assert_eq!(
        retired.run_json,
        RunJsonUpdate::Written {
            generation: retired.generation
        }
    );
    let st = read_status(&path);
    assert_eq!(
        (st.status, st.generation),
        (RunState::Failed, retired.generation)
    );
    assert!(st.detail.unwrap().contains("retired"));
    let dir = RunDir::open(&path).unwrap();
    let facts = lease_run::diagnosis::gather_facts(&dir, now_ts()).unwrap();
    assert_eq!(next_step(&facts), Next::Claim);
    assert!(
        diagnose(&facts).iter().all(|f| f.severity == Severity::Ok),
        "{:?}",
        diagnose(&facts)
    );
    assert_eq!(open_and_release(&path), retired.generation.get() + 1);
}

/// `runlease takeover`'s path: run.json is rewritten `failed` as the takeover's
/// generation before the release, so it never says `running` for the owner that lost the
/// lease (which, fenced, writes nothing more).
#[test]
fn a_takeover_rewrites_run_json_before_it_releases() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("takeover");
    used_run(&path, 0);
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let g = run.generation();
        run.suspend_heartbeats();
        tokio::time::sleep(Duration::from_millis(1300)).await;
        let p = path.clone();
        let taken = tokio::task::spawn_blocking(move || {
            let r = Replacer::for_takeover(&p, &Authority::RunFolder).unwrap();
            let observed = r.observe(now_ts()).unwrap().expect("a stale owner");
            assert_eq!(observed.view.status, Status::Stale);
            let (expect, watched) = r
                .watch(&Expectation::of(&observed.head), |_, _| {})
                .unwrap();
            r.takeover_and_release(
                &observed,
                expect,
                watched,
                Identity::new("operator").unwrap(),
                lease_run::wall_now,
            )
            .unwrap()
        })
        .await
        .unwrap();
        assert_eq!(taken.generation.get(), g.get() + 1);
        assert_eq!(
            taken.run_json,
            RunJsonUpdate::Written {
                generation: taken.generation
            }
        );
        assert_eq!(taken.released.unwrap().get(), g.get() + 2);
        // The fenced owner's release writes nothing.
        let e = run.release(FinalStatus::Done).await.unwrap_err();
        assert_eq!(e.code(), Code::Fenced);
        let st = read_status(&path);
        assert_eq!(
            (st.status, st.generation.get()),
            (RunState::Failed, g.get() + 1)
        );
        assert!(st.detail.unwrap().contains("taken over"));
    });
    assert_eq!(view(&path).status, Status::Free);
    open_and_release(&path);
}

/// Crashes between a replacement's chain change and its `run.json` rewrite: (a) the chain
/// retired the owner but run.json still says `running` for it (and a temp file of the
/// interrupted rewrite lies beside it); (b) a takeover wrote run.json but died before its
/// release. In both, status and doctor explain the run from the chain, and the next step
/// they print works.
#[test]
fn a_crash_between_the_owner_change_and_run_json_is_explained_and_recovers() {
    // (a) retired by the chain only.
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("crash-a");
    used_run(&path, 0);
    let g = dead_owner(&path);
    let dir = RunDir::open(&path).unwrap();
    let head = dir.status(now_ts(), true).unwrap().head.unwrap();
    dir.retire(lease_core::ops::RetireParams {
        run_id: dir.run_id().clone(),
        owner_id: Identity::new("retirer").unwrap(),
        holder: lease_fs::this_holder().unwrap(),
        policy: fast().policy,
        now: now_ts(),
        expect: Some(Expectation::of(&head)),
    })
    .unwrap();
    std::fs::write(path.join(".tmp-1-0-000000000"), b"half a run.json").unwrap();
    assert_eq!(read_status(&path).status, RunState::Running);
    assert_eq!(read_status(&path).generation, g);
    let facts = lease_run::diagnosis::gather_facts(&dir, now_ts()).unwrap();
    assert_eq!(facts.view.status, Status::Free);
    assert_eq!(next_step(&facts), Next::Claim);
    let findings = diagnose(&facts);
    assert!(
        findings
            .iter()
            .all(|f| f.code == FindingCode::OrphanTempFiles),
        "{findings:?}"
    );
    let next = open_and_release(&path);
    assert_eq!(next, g.get() + 2);
    assert_eq!(read_status(&path).generation.get(), next);

    // (b) taken over, run.json written, the taker died before its release.
    let path = tmp.path().join("crash-b");
    used_run(&path, 0);
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        run.suspend_heartbeats();
        tokio::time::sleep(Duration::from_millis(1300)).await;
        let dir = RunDir::open(&path).unwrap();
        let head = dir.status(now_ts(), false).unwrap().head.unwrap();
        let taker = dir
            .takeover(lease_core::ops::TakeoverParams {
                run_id: dir.run_id().clone(),
                owner_id: Identity::new("operator").unwrap(),
                holder: dead_holder(),
                policy: fast().policy,
                now: now_ts(),
                expect: Expectation::of(&head),
                // Heartbeats suspended 1300 ms ago: the record has not changed since.
                trigger: TakeoverTrigger::Operator {
                    watched_unchanged_ms: 1300,
                },
            })
            .unwrap();
        let mut st = read_status(&path);
        st.status = RunState::Failed;
        st.generation = taker.generation;
        st.detail = Some("taken over".into());
        std::fs::write(path.join("run.json"), encode(&st).unwrap()).unwrap();
        let _ = run.release(FinalStatus::Done).await;
    });
    let dir = RunDir::open(&path).unwrap();
    let facts = lease_run::diagnosis::gather_facts(&dir, now_ts()).unwrap();
    assert_eq!(facts.view.status, Status::Dead, "the taker is gone");
    assert_eq!(next_step(&facts), Next::Retire);
    drop(dir);
    let r = Replacer::for_retire(&path, &Authority::RunFolder).unwrap();
    let observed = r.observe(now_ts()).unwrap().unwrap();
    let retired = r
        .retire(&observed, Identity::new("retirer").unwrap(), now_ts())
        .unwrap();
    assert!(matches!(retired.run_json, RunJsonUpdate::Written { .. }));
    drop(r);
    open_and_release(&path);
}

/// An unreadable run.json is reported, never repaired, and refuses a replacement as it
/// refuses a claim (issue #28, one admission rule): without it, whether the lease chain
/// was rolled back cannot be told. Nothing is written; once it is repaired by hand the
/// retirement goes ahead.
#[test]
fn an_unreadable_run_json_refuses_a_replacement_as_it_refuses_a_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("badjson");
    used_run(&path, 0);
    dead_owner(&path);
    std::fs::write(path.join("run.json"), b"{not json\n").unwrap();
    let head = view(&path).head.unwrap();
    let r = Replacer::for_retire(&path, &Authority::RunFolder).unwrap();
    let e = r.observe(now_ts()).unwrap_err();
    assert_eq!(e.code(), Code::RecordInvalid, "{e}");
    assert!(e.to_string().contains("run.json"), "{e}");
    drop(r);
    assert_eq!(
        std::fs::read(path.join("run.json")).unwrap(),
        b"{not json\n"
    );
    assert_eq!(view(&path).head.unwrap().generation(), head.generation());
    let e = open_err(&path, fast());
    assert_eq!(e.code(), Code::RecordInvalid, "the claim: {e}");
    // Repaired by hand (moved out of the run): the retirement goes ahead.
    std::fs::remove_file(path.join("run.json")).unwrap();
    let r = Replacer::for_retire(&path, &Authority::RunFolder).unwrap();
    let observed = r.observe(now_ts()).unwrap().unwrap();
    r.retire(&observed, Identity::new("retirer").unwrap(), now_ts())
        .unwrap();
    drop(r);
    assert_eq!(view(&path).status, Status::Free);
}
