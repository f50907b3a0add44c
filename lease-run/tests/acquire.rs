//! `Run::acquire`: a held run is refused with a typed `Held` (who, code, next step), a
//! bounded wait gives up with how long it waited, and a released run is claimed. Also
//! `Run::open`'s own preflight: a run.json written beyond the lease chain is CHAIN_BROKEN
//! and the refusal writes nothing (PROTOCOL §7.1, §12).

use lease_core::Code;
use lease_run::{Acquire, AcquireError, Acquired, FinalStatus, NextStep, OpenOptions, Run, Wait};
use std::time::{Duration, Instant};

mod support;
use support::{fast_patient as fast, rt};

#[test]
fn a_held_run_is_refused_with_its_holder_and_next_step_and_a_released_one_is_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let (first, how) = Run::acquire(&path, Acquire::Claim, Wait::No, fast(), &mut ())
            .await
            .expect("a new run is claimed");
        assert_eq!(how, Acquired::Claimed);

        // Held by a live owner (its kernel lock is held by this very process).
        let err = Run::acquire(&path, Acquire::ClaimOrReplace, Wait::No, fast(), &mut ())
            .await
            .unwrap_err();
        let AcquireError::Held(held) = err else {
            panic!("expected Held, got {err:?}")
        };
        assert_eq!(held.code, Code::RunAlreadyActive);
        assert_eq!(held.next, NextStep::Wait);
        assert!(held.lock_only, "the owner lock answered first");
        assert_eq!(held.gave_up_after, None);
        let head = held.view.head.as_ref().expect("the holder is named");
        assert_eq!(head.epoch.owner_id, first.lease().owner_id);

        // A bounded wait gives up, and says after how long.
        let t0 = Instant::now();
        let err = Run::acquire(
            &path,
            Acquire::Claim,
            Wait::Until(t0 + Duration::from_millis(400)),
            fast(),
            &mut (),
        )
        .await
        .unwrap_err();
        let AcquireError::Held(held) = err else {
            panic!("expected Held, got {err:?}")
        };
        let waited = held.gave_up_after.expect("gave up after waiting");
        assert!(waited >= Duration::from_millis(400), "{waited:?}");

        first.release(FinalStatus::Done).await.unwrap();
        let (second, how) = Run::acquire(&path, Acquire::Claim, Wait::No, fast(), &mut ())
            .await
            .expect("a released run is claimed");
        assert_eq!(how, Acquired::Claimed);
        assert_eq!(second.lease().generation.get(), 3);
        second.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn an_observer_that_says_stop_stops_before_anything_is_claimed() {
    struct Stop;
    impl lease_run::AcquireObserver for Stop {
        fn proceed(&mut self) -> bool {
            false
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    std::fs::create_dir(&path).unwrap();
    rt().block_on(async {
        let err = Run::acquire(&path, Acquire::Claim, Wait::Forever, fast(), &mut Stop)
            .await
            .unwrap_err();
        assert!(matches!(err, AcquireError::Stopped), "{err:?}");
    });
    assert!(
        !path.join("lease/epochs").exists()
            || std::fs::read_dir(path.join("lease/epochs"))
                .unwrap()
                .count()
                == 0,
        "nothing was claimed"
    );
}

#[test]
fn open_refuses_a_run_json_written_beyond_the_lease_chain_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        run.release(FinalStatus::Done).await.unwrap();
        // The chain is lost (restored from an older copy: empty), run.json stays.
        let epochs = path.join("lease/epochs");
        for e in std::fs::read_dir(&epochs).unwrap() {
            std::fs::remove_file(e.unwrap().path()).unwrap();
        }
        let before = std::fs::read(path.join("run.json")).unwrap();
        let err = Run::open(&path, fast()).await.unwrap_err();
        assert_eq!(err.code(), Code::ChainBroken, "{err}");
        assert!(
            err.to_string()
                .contains("run.json was written by generation"),
            "{err}"
        );
        assert_eq!(
            std::fs::read_dir(&epochs).unwrap().count(),
            0,
            "no epoch was created"
        );
        assert_eq!(std::fs::read(path.join("run.json")).unwrap(), before);
    });
}

/// Issue #31: the owner id an acquire claims as is the caller's when given (and one
/// drawn once for all attempts otherwise), so an attempt that finds its own earlier claim
/// (an answer lost) adopts it.
#[test]
fn an_acquire_claims_as_the_owner_id_it_was_given() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    let me = lease_core::Identity::new("run-given-owner").unwrap();
    rt().block_on(async {
        let o = OpenOptions {
            owner_id: Some(me.clone()),
            ..fast()
        };
        let (run, _) = Run::acquire(&path, Acquire::Claim, Wait::No, o, &mut ())
            .await
            .unwrap();
        assert_eq!(run.lease().owner_id, me);
        run.release(FinalStatus::Done).await.unwrap();
        let (run, _) = Run::acquire(&path, Acquire::Claim, Wait::No, fast(), &mut ())
            .await
            .unwrap();
        assert_ne!(run.lease().owner_id, me, "a fresh one otherwise");
        assert!(run.lease().owner_id.as_str().starts_with("run-"));
        run.release(FinalStatus::Done).await.unwrap();
    });
}
