//! run.json through open and release: the open and release steps in order, status
//! transitions, and generations that grow.

use crate::helpers::{epoch, fast, read_status, rt};
use lease_core::LeaseOps;
use lease_core::ops::Status;
use lease_core::{RunState, Timestamp};
use lease_fs::RunDir;
use lease_run::{Batch, FinalStatus, Run, StepName};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[test]
fn open_writes_running_steps_in_order_and_release_writes_done() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-a");
    let steps = Arc::new(Mutex::new(Vec::new()));
    let s2 = steps.clone();
    let mut opts = fast();
    opts.on_step = Some(Arc::new(move |s: StepName, _d: Duration| {
        s2.lock().unwrap().push(s)
    }));
    rt().block_on(async {
        let run = Run::open(&path, opts.clone()).await.unwrap();
        let st = read_status(&path);
        assert_eq!(st.status, RunState::Running);
        assert_eq!(st.generation, run.generation());
        assert!(st.holder.is_some());
        for d in ["store", "work", "tmp"] {
            assert!(path.join(d).is_dir());
        }
        let g1 = run.generation().get();
        run.release(FinalStatus::Done).await.unwrap();
        assert_eq!(read_status(&path).status, RunState::Done);
        let view = RunDir::open(&path)
            .unwrap()
            .status(Timestamp::from_unix_millis(1).unwrap(), false)
            .unwrap();
        assert_eq!(view.status, Status::Free);
        let run = Run::open(&path, opts).await.unwrap();
        assert!(run.generation().get() > g1);
        run.release(FinalStatus::Paused { wake_at: None })
            .await
            .unwrap();
        assert_eq!(read_status(&path).status, RunState::Paused);
    });
    let names: Vec<&str> = steps.lock().unwrap().iter().map(|s| s.as_str()).collect();
    assert_eq!(
        &names[..16],
        [
            "owner-lock",
            "read-status",
            "claim",
            "run.json",
            "heartbeat",
            "layout",
            "commands",
            "store",
            "seal",
            "stop-commands",
            "barrier",
            "seal-store",
            "final-status",
            "stop-heartbeat",
            "release-lease",
            "unlock"
        ]
    );
}

#[test]
fn status_transitions_across_open_release_and_reopen_and_the_generation_grows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run-i");
    rt().block_on(async {
        let mut gens = Vec::new();
        let wake = Timestamp::from_unix_millis(4_000_000_000_000).unwrap();
        let finals = [
            (
                FinalStatus::Paused {
                    wake_at: Some(wake),
                },
                RunState::Paused,
            ),
            (FinalStatus::Done, RunState::Done),
            (
                FinalStatus::Failed {
                    detail: "step 3 failed".into(),
                },
                RunState::Failed,
            ),
            (FinalStatus::Paused { wake_at: None }, RunState::Paused),
        ];
        let mut head = 0;
        for (i, (fin, state)) in finals.into_iter().enumerate() {
            let run = Run::open(&path, fast()).await.unwrap();
            let st = read_status(&path);
            assert_eq!(st.status, RunState::Running);
            assert_eq!(st.generation, run.generation());
            assert_eq!(st.sealed_sequence, None, "cleared while live");
            assert_eq!(st.detail, None);
            assert_eq!(run.store().head().unwrap(), head, "the store carries over");
            gens.push(run.generation().get());
            for _ in 0..=i {
                head = run
                    .commit(Batch::new().put("k", format!("{i}")))
                    .await
                    .unwrap();
            }
            if i == 1 {
                run.set_status(RunState::Running, Some("halfway".into()), None)
                    .await
                    .unwrap();
                assert_eq!(read_status(&path).detail.as_deref(), Some("halfway"));
            }
            run.release(fin.clone()).await.unwrap();
            let st = read_status(&path);
            assert_eq!(st.status, state);
            assert_eq!(st.sealed_sequence, Some(head));
            match fin {
                FinalStatus::Paused { wake_at } => assert_eq!(st.wake_at, wake_at),
                FinalStatus::Failed { detail } => assert_eq!(st.detail, Some(detail)),
                FinalStatus::Done => assert_eq!((st.wake_at, st.detail), (None, None)),
            }
            // The release epoch carries the seal: this store, its head, this generation.
            let rel = epoch(&path, run_gen(&gens) + 1);
            let seal = rel.seal.expect("sealed");
            assert_eq!(
                (seal.sequence, seal.generation.get()),
                (head, run_gen(&gens))
            );
        }
        assert!(gens.windows(2).all(|w| w[1] > w[0]), "{gens:?}");
        assert_eq!(gens, [1, 3, 5, 7]);
    });
}

fn run_gen(gens: &[u64]) -> u64 {
    *gens.last().unwrap()
}
