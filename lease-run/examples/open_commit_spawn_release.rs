//! lease-run: open a run, commit to its store, run a command with the builder, release;
//! then a second owner that stalls past its self-fence deadline (its runtime blocked, as
//! a paused process would be): the watchdog kills its command, the command's wait reports
//! the fence, and a commit is refused.
//!
//! Run: `cargo run -p lease-run --example open_commit_spawn_release`

use lease_run::{Batch, FinalStatus, HeartbeatDurability, OpenOptions, Run, TimingPolicy};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One thread: blocking it stops the heartbeat task (the watchdog thread goes on).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("job");

        // 1. Open, commit, run a command, release.
        let run = Run::open(&path, OpenOptions::default()).await?;
        let seq = run
            .commit(Batch::new().put("step/1", "done").log("step 1"))
            .await?;
        let out = run
            .command("sh")
            .args([
                "-c",
                "echo generation $RUNLEASE_GENERATION of $RUNLEASE_RUN",
            ])
            .output()
            .await?;
        print!("command said: {}", String::from_utf8_lossy(&out.stdout));
        println!(
            "committed sequence {seq} as generation {}",
            run.generation()
        );
        run.release(FinalStatus::Done).await?;

        // 2. A fast policy (heartbeat 100 ms, self-fence 300 ms, stale 1 s), a command, and a
        //    stall of the whole runtime for 1 s.
        let opts = OpenOptions {
            policy: TimingPolicy::from_millis(100, 300, 1_000, HeartbeatDurability::Local)?,
            ..OpenOptions::default()
        };
        let run = Run::open(&path, opts).await?;
        let mut cmd = run.command("sleep").arg("30").spawn().await?;
        std::thread::sleep(Duration::from_secs(1)); // the runtime (and its heartbeat) stalls
        let waited = cmd.wait().await;
        match &waited {
            Err(e) if e.is_fenced() => println!("the command's wait: {e}"),
            other => panic!("expected the fence, got {other:?}"),
        }
        let refused = run
            .commit(Batch::new().put("step/2", "late"))
            .await
            .expect_err("a fenced owner commits nothing");
        println!("commit after the fence: {refused}");
        assert!(refused.is_fenced());
        // Release reports the fence and writes nothing; the run is then stale, and the next
        // owner takes it over (or, this process being alive, waits for staleness).
        let e = run.release(FinalStatus::Done).await.expect_err("fenced");
        assert!(e.is_fenced());
        println!("release: {e}");
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
