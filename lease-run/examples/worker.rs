//! lease-run: a tokio worker as an operator runs it. It owns a run, records its progress
//! in the run's store, runs a child command, and on SIGTERM passes the signal on to the
//! child, lets it finish, and releases the run (`Run::release_on_signals`). Then a second
//! owner whose runtime stalls past its self-fence deadline (as a paused process would):
//! the watchdog thread kills its child, the child's wait reports the fence, and the store
//! refuses its commit, so nothing a replaced owner writes counts.
//!
//! Run: `cargo run -p lease-run --example worker`
//!
//! It uses lease-run alone (and tokio, whose runtime every async lease-run call runs on).

use lease_run::{
    Batch, FinalStatus, HeartbeatDurability, OpenOptions, Run, RunState, Served, TimingPolicy,
};
use std::time::Duration;
use tokio::signal::unix::SignalKind;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let base = std::env::temp_dir().join(format!("runlease-worker-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    let path = base.join("job"); // absolute: lease-run refuses a relative path
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;

    // 1. The worker: progress in the store, a child, SIGTERM turned into a release.
    let served = rt.block_on(async {
        let run = Run::open(&path, OpenOptions::default()).await?;
        run.release_on_signals(
            &[SignalKind::terminate(), SignalKind::interrupt()],
            async |run| {
                run.commit(Batch::new().put("progress", "started")).await?;
                // The child traps TERM and exits 0 (a clean shutdown).
                let mut child = run
                    .command("sh")
                    .args(["-c", "trap 'exit 0' TERM; sleep 30 & wait"])
                    .spawn()
                    .await?;
                // Stand-in for `kill -TERM <worker>` from an operator or a supervisor.
                let me = std::process::id();
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    let _ = std::process::Command::new("kill")
                        .args(["-TERM", &me.to_string()])
                        .status();
                });
                let st = child.wait().await?;
                println!("the child got the worker's SIGTERM and exited: {st}");
                run.commit(Batch::new().put("progress", "stopped on TERM"))
                    .await?;
                Ok(FinalStatus::Paused { wake_at: None })
            },
        )
        .await
    })?;
    assert_eq!(served, Served::Signalled(15));
    let status: lease_run::RunStatus = lease_run::decode(&std::fs::read(path.join("run.json"))?)?;
    assert_eq!(status.status, RunState::Paused);
    println!(
        "released after SIGTERM: run.json says {:?}, store sealed at {:?}",
        status.status, status.sealed_sequence
    );

    // 2. A second owner that stalls: heartbeat 100 ms, self-fence 300 ms, stale 1 s.
    rt.block_on(async {
        let opts = OpenOptions {
            policy: TimingPolicy::from_millis(100, 300, 1_000, HeartbeatDurability::Local)?,
            ..OpenOptions::default()
        };
        let run = Run::open(&path, opts).await?;
        let progress = run.store().get("progress")?.ok_or("progress lost")?;
        assert_eq!(progress.value, b"stopped on TERM");
        let mut child = run.command("sleep").arg("30").spawn().await?;
        std::thread::sleep(Duration::from_secs(1)); // the whole runtime stalls
        let waited = child.wait().await;
        match &waited {
            Err(e) if e.is_fenced() => println!("the child's wait: {e}"),
            other => panic!("expected the fence, got {other:?}"),
        }
        let refused = run
            .commit(Batch::new().put("progress", "late"))
            .await
            .expect_err("a fenced owner commits nothing");
        assert!(refused.is_fenced());
        println!("commit after the fence: {refused}");
        // Release reports the fence and writes nothing.
        let e = run.release(FinalStatus::Done).await.expect_err("fenced");
        assert!(e.is_fenced());
        Ok::<(), Box<dyn std::error::Error>>(())
    })?;
    std::fs::remove_dir_all(&base)?;
    Ok(())
}
