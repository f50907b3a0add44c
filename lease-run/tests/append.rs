//! `Run::append` (issue #34): events as the owner, behind the self-fence check; a fenced
//! owner appends nothing; arguments that are not a word or not JSON are refused before
//! anything is written.

mod support;

use lease_core::ops::Standing;
use lease_run::{FinalStatus, LeaseOps, Run};
use std::time::Duration;
use support::fast;

fn counted(run: &Run) -> usize {
    run.authority()
        .read_events(None)
        .unwrap()
        .events
        .iter()
        .filter(|e| e.standing == Standing::Authoritative)
        .count()
}

#[test]
fn an_owner_appends_until_it_is_fenced_and_then_nothing() {
    #[derive(serde::Serialize)]
    struct Step {
        name: &'static str,
        n: u32,
    }
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("events");
    // One thread: blocking it stops the heartbeat task (the watchdog thread goes on).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let a = run
            .append("step", Step { name: "load", n: 1 })
            .await
            .unwrap();
        run.append("step", "plain").await.unwrap();
        assert_eq!(counted(&run), 2);
        let e = run
            .authority()
            .read_events(None)
            .unwrap()
            .events
            .into_iter()
            .find(|e| e.event.sequence == a.sequence)
            .unwrap();
        assert_eq!(e.event.payload, serde_json::json!({"name": "load", "n": 1}));

        // Refused before anything: a type that is not a word, a payload that is not JSON.
        let e = run.append("-rf", 1).await.unwrap_err();
        assert_eq!(e.code().as_str(), "ARGUMENT_INVALID", "{e}");
        let bad: std::collections::BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        let e = run.append("step", bad).await.unwrap_err();
        assert_eq!(e.code().as_str(), "ARGUMENT_INVALID", "{e}");
        assert_eq!(counted(&run), 2);

        // The runtime stalls past the self-fence deadline: nothing more is written.
        std::thread::sleep(Duration::from_millis(600)); // heartbeat 100 ms, self-fence 300 ms
        let e = run.append("step", "late").await.unwrap_err();
        assert!(e.is_fenced(), "{e}");
        assert_eq!(counted(&run), 2, "a fenced owner appended nothing");
        assert!(
            run.release(FinalStatus::Done)
                .await
                .unwrap_err()
                .is_fenced()
        );
    });
}
