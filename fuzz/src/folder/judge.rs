//! The checks: every operation on the folder materialized in a [`MemDisk`] and in a
//! [`SimFs`] through [`RunDir`], each judged against what the protocol allows.

use super::drive::*;
use super::input::Folder;
use crate::fixtures::{id, run_id};
use lease_core::LeaseOps;
use lease_core::ops::{
    Append, Claim, Expectation, Heartbeat, OwnedLease, ReadEvents, Release, ReleaseParams, Retire,
    Status, StatusView, Takeover, Verify,
};
use lease_core::{Holder, LeaseError};

pub(super) fn judge_mem(folder: &Folder) -> (Summary, Expectation, Option<OwnedLease>) {
    let now = folder.now();
    let live = folder.live;
    let c = callers();
    let base = folder.mem_disk();

    // Read-only operations, on one copy that must stay unchanged.
    let mut d = base.clone();
    let status = run_mem(
        "status",
        &mut d,
        &mut StatusView::read(run_id(), now, true),
        live,
    );
    let status_np = run_mem(
        "status",
        &mut d,
        &mut StatusView::read(run_id(), now, false),
        live,
    );
    let events = run_mem("read", &mut d, &mut ReadEvents::new(run_id(), None), live);
    let verify = run_mem("verify", &mut d, &mut Verify::new(run_id()), live);
    assert!(
        d.files == base.files,
        "a read-only operation (status, read without finalize, verify) changed the folder"
    );

    let view = status.as_ref().ok();
    let view_np = status_np.as_ref().ok();
    if let (Some(a), Some(b)) = (view, view_np) {
        assert_eq!(a.head, b.head, "the probe changed the observed head");
    }
    let expect = expectation(&base, view_np);
    let forged = forged_lease(view_np);

    let claim = run_mem(
        "claim",
        &mut base.clone(),
        &mut Claim::new(params_claim(&c, now)),
        live,
    );
    // As `LeaseOps::claim` does (the adapters' path, which the SimFs side takes): a claim
    // refused over a holder the probing status proves dead says to retire it.
    let claim = claim.map_err(|e| {
        lease_core::ops::refine_claim_refusal(e, || {
            view.is_some_and(|v| v.status == lease_core::ops::Status::Dead)
        })
    });
    let takeover = run_mem(
        "takeover",
        &mut base.clone(),
        &mut Takeover::new(params_takeover(&c, now, expect.clone())),
        live,
    );
    let retire = run_mem(
        "retire",
        &mut base.clone(),
        &mut Retire::new(params_retire(&c, now)),
        live,
    );
    let fin = run_mem(
        "finalizing read",
        &mut base.clone(),
        &mut ReadEvents::new(run_id(), Some((id("fuzz-reader"), now))),
        live,
    );

    // Ownership changes: what the status allowed, and exactly the next generation.
    let head = view_np.and_then(|v| v.head.as_ref());
    let next = head.map_or(1, |h| h.generation().get().saturating_add(1));
    let adopts = |who: &(lease_core::Identity, Holder)| {
        head.is_some_and(|h| h.is_active() && h.epoch.owner_id == who.0 && h.epoch.holder == who.1)
    };
    let invalid = matches!(view_np.map(|v| &v.status), Some(Status::Invalid(_)) | None);
    // A claim or takeover (`op`) by `who` that succeeded: over a valid record and, unless it
    // adopted `who`'s own active lease, from the one status that allows it (`from`) to
    // exactly the next generation.
    let new_owner = |op: &str,
                     got: &Result<OwnedLease, LeaseError>,
                     who: &(lease_core::Identity, Holder),
                     from: Status| {
        if let Ok(l) = got {
            assert!(!invalid, "a {op} succeeded over an invalid record");
            if !adopts(who) {
                assert!(
                    view_np.map(|v| &v.status) == Some(&from),
                    "a {op} succeeded on a run that is {:?}",
                    view_np.map(|v| v.status.name())
                );
                assert_eq!(l.generation.get(), next, "a {op} skipped a generation");
            }
        }
    };
    new_owner("claim", &claim, &c.claimer, Status::Free);
    new_owner("takeover", &takeover, &c.taker, Status::Stale);
    if let Ok(r) = &retire {
        assert!(!invalid, "a retirement succeeded over an invalid record");
        assert!(
            matches!(view.map(|v| &v.status), Some(Status::Dead)),
            "a retirement succeeded on a run that is {:?}",
            view.map(|v| v.status.name())
        );
        assert_eq!(
            r.generation.get(),
            next,
            "a retirement skipped a generation"
        );
        assert_eq!(Some(r.retired), head.map(|h| h.generation()));
    }

    // The head's owner: heartbeat, release, and an append that must count if acknowledged.
    let (mut hb, mut ap, mut rel) = (
        Err("no lease".to_string()),
        Err("no lease".to_string()),
        Err("no lease".to_string()),
    );
    if let Some(l) = &forged {
        match Heartbeat::new(l, now, 1) {
            Ok(mut op) => {
                hb = outcome(
                    &run_mem("heartbeat", &mut base.clone(), &mut op, live),
                    |_| "ok".into(),
                );
            }
            Err(e) => hb = Err(e.code().into()),
        }
        rel = outcome(
            &run_mem(
                "release",
                &mut base.clone(),
                &mut Release::new(ReleaseParams {
                    lease: l.clone(),
                    now,
                    seal: None,
                }),
                live,
            ),
            |g| g.to_string(),
        );
        let mut d = base.clone();
        let appended = run_mem(
            "append",
            &mut d,
            &mut Append::new(l, append_params(now)),
            live,
        );
        if let Ok(a) = &appended {
            let after = run_mem(
                "read after append",
                &mut d,
                &mut ReadEvents::new(run_id(), Some((id("fuzz-reader"), now))),
                live,
            );
            if verify.is_ok()
                && let Ok(v) = &after
            {
                let counts = v
                    .events
                    .iter()
                    .any(|e| e.event.sequence == a.sequence && e.standing.counts());
                assert!(
                    counts,
                    "append of event {} returned success but the event does not count: {:?}",
                    a.sequence,
                    v.events
                        .iter()
                        .find(|e| e.event.sequence == a.sequence)
                        .map(|e| &e.standing)
                );
            }
        }
        ap = outcome(&appended, |a| a.sequence.to_string());
    }

    let summary = Summary {
        status: outcome(&status, status_str),
        status_no_probe: outcome(&status_np, status_str),
        events: outcome(&events, events_str),
        verify: outcome(&verify, |r| {
            format!("{} epochs {} events", r.epochs, r.events)
        }),
        claim: outcome(&claim, |l| l.generation.to_string()),
        takeover: outcome(&takeover, |l| l.generation.to_string()),
        retire: outcome(&retire, |r| r.generation.to_string()),
        finalizing_read: outcome(&fin, events_str),
        heartbeat: hb,
        append: ap,
        release: rel,
    };
    (summary, expect, forged)
}

pub(super) fn judge_sim(
    folder: &Folder,
    expect: Expectation,
    forged: Option<&OwnedLease>,
) -> Summary {
    let now = folder.now();
    let live = folder.live;
    let c = callers();

    // The folder is materialized once; every operation that may write gets its own fork
    // (a deep copy: `SimFs` is deterministic, so a fork is the same file system a fresh
    // `folder.sim_fs()` would build, at a fraction of the cost).
    let base = folder.sim_fs();
    let fs = base.fork();
    let before = fs.snapshot_live();
    let rd = run_dir(&fs, live);
    let status = rd.status(now, true);
    let status_np = rd.status(now, false);
    let events = rd.read_events(None);
    let verify = rd.verify();
    let _ = rd.stray_names();
    assert!(
        fs.snapshot_live() == before,
        "a read-only operation (status, read without finalize, verify) changed the SimFs"
    );

    // Orphan cleanup removes temp files only.
    let fresh = base.fork();
    let kept = fresh.snapshot_live();
    let _ = run_dir(&fresh, live).clean_temp_files(0);
    let after = fresh.snapshot_live();
    for (path, bytes) in &kept {
        let name = lease_fs::fs::split(path).1;
        if !name.starts_with(lease_core::layout::TEMP_PREFIX) {
            assert_eq!(
                after.get(path),
                Some(bytes),
                "temp cleanup removed or changed {path}"
            );
        }
    }

    let fresh = || run_dir(&base.fork(), live);
    let claim = fresh().claim(params_claim(&c, now));
    let takeover = fresh().takeover(params_takeover(&c, now, expect));
    let retire = fresh().retire(params_retire(&c, now));
    let fin = fresh().read_events(Some((id("fuzz-reader"), now)));
    let (mut hb, mut ap, mut rel) = (
        Err("no lease".to_string()),
        Err("no lease".to_string()),
        Err("no lease".to_string()),
    );
    if let Some(l) = forged {
        hb = fs_outcome("heartbeat", &fresh().heartbeat(l, now, 1, None), |_| {
            "ok".into()
        });
        rel = fs_outcome(
            "release",
            &fresh().release(lease_core::ops::ReleaseParams {
                lease: l.clone(),
                now,
                seal: None,
            }),
            |g| g.to_string(),
        );
        let p = append_params(now);
        ap = fs_outcome(
            "append",
            &fresh().append(
                l,
                lease_core::ops::AppendParams {
                    event_type: p.event_type,
                    payload: p.payload,
                    now,
                    tail_hint: None,
                },
            ),
            |a| a.sequence.to_string(),
        );
    }
    Summary {
        status: fs_outcome("status", &status, status_str),
        status_no_probe: fs_outcome("status", &status_np, status_str),
        events: fs_outcome("read", &events, events_str),
        verify: fs_outcome("verify", &verify, |r| {
            format!("{} epochs {} events", r.epochs, r.events)
        }),
        claim: fs_outcome("claim", &claim, |l| l.generation.to_string()),
        takeover: fs_outcome("takeover", &takeover, |l| l.generation.to_string()),
        retire: fs_outcome("retire", &retire, |r| r.generation.to_string()),
        finalizing_read: fs_outcome("finalizing read", &fin, events_str),
        heartbeat: hb,
        append: ap,
        release: rel,
    }
}
