//! The store socket's connection caps (issue #29), in a process of its own because it
//! lowers its own `RLIMIT_NOFILE`: under a soft limit of 200 the owner serves at most a
//! quarter of what is left after its reserve (authenticated) and a sixteenth of it
//! (unauthenticated); the connection over the cap is refused with the run named, and the
//! heartbeat keeps beating throughout.

use lease_run::INCARNATION_VAR;
use lease_run::store_socket::{SOCKET_VAR, StoreClient};
use lease_run::{FinalStatus, Run};
use lease_sqlite::Batch;
use std::collections::BTreeMap;
use std::time::Duration;

mod support;
use support::{fast, rt};

#[test]
fn connections_are_capped_below_the_descriptor_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut lim = getrlimit(Resource::Nofile);
    lim.current = Some(200);
    setrlimit(Resource::Nofile, lim).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("job");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let out = run.command("env").output().await.unwrap();
        let env: BTreeMap<String, String> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let g = run.generation().get();
        let run_name = path.display().to_string();
        let (held, refusal) = tokio::task::spawn_blocking(move || {
            let connect = || {
                StoreClient::connect(
                    &env[SOCKET_VAR],
                    &env["RUNLEASE_RUN"],
                    g,
                    &env[INCARNATION_VAR],
                )
            };
            let mut held = Vec::new();
            let refusal = loop {
                match connect() {
                    Ok(c) => held.push(c),
                    Err(e) => break e,
                }
                assert!(held.len() <= 64, "no cap under a limit of 200");
            };
            // Every one that got in is served, and one more gets in once one is closed.
            for c in &mut held {
                c.head().unwrap();
            }
            held.pop();
            let mut again = connect().unwrap();
            again.commit(&Batch::new().put("k", "v")).unwrap();
            (held.len() + 1, refusal)
        })
        .await
        .unwrap();
        // 200 - (descriptors open at start) - 128, a quarter: 10 to 16 for this process.
        assert!((8..=16).contains(&held), "{held} connections served");
        assert_eq!(
            refusal.code().as_str(),
            "STORE_REQUEST_REFUSED",
            "{refusal}"
        );
        let msg = refusal.to_string();
        assert!(msg.contains(&format!("run {run_name}")), "{msg}");
        assert!(
            msg.contains(&format!("already serves {held} connections")),
            "{msg}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            run.last_heartbeat_failure().is_none(),
            "the heartbeat never failed"
        );
        run.release(FinalStatus::Done).await.unwrap();
    });
}
