//! End-to-end tests of the run lifecycle with real child processes.
//!
//! One module per job: `helpers` (options, runtimes, records, helper-process plumbing),
//! `status`, `open`, `fence`, `reap`, `store` and `cgroups`. `helper_process` stays here, at
//! the crate root, so the helper processes the tests start (this binary re-run with
//! `--exact helper_process`) keep finding it under that name.

mod cgroups;
mod command;
mod fence;
mod helpers;
mod open;
mod reap;
mod status;
mod store;

use helpers::{HELPER, args, daemon_argv, fast, rt, wait_for_pid};
use lease_run::{Batch, FinalStatus, Run};
use std::path::PathBuf;
use std::time::Duration;

/// Not a test by itself: the body of helper processes started by the other tests.
#[test]
fn helper_process() {
    let Ok(mode) = std::env::var(HELPER) else {
        return;
    };
    let path = PathBuf::from(std::env::var("LEASE_RUN_TEST_PATH").unwrap());
    rt().block_on(async move {
        match mode.as_str() {
            // A refusal is told to the test as `REFUSED <CODE>` on stdout, exit 1.
            "open-once" => match Run::open(&path, fast()).await {
                Ok(_) => std::process::exit(0),
                Err(e) => {
                    eprintln!("helper: {e}");
                    println!("REFUSED {}", e.code().as_str());
                    std::process::exit(1)
                }
            },
            "open-hold" => match Run::open(&path, fast()).await {
                Ok(run) => {
                    println!("OPENED {}", run.generation());
                    // Hold until the test closes stdin (after the other open has ended),
                    // so a slow start of the other process cannot find the run released.
                    tokio::task::spawn_blocking(|| {
                        let mut sink = Vec::new();
                        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
                    })
                    .await
                    .unwrap();
                    run.release(FinalStatus::Done).await.unwrap();
                    std::process::exit(0)
                }
                Err(e) => {
                    eprintln!("helper: {e}");
                    println!("REFUSED {}", e.code().as_str());
                    std::process::exit(1)
                }
            },
            "owner-exit-on-fence" => {
                let mut opts = fast();
                opts.exit_on_fence = true;
                let run = Run::open(&path, opts).await.unwrap();
                for argv in [
                    args(&["sleep", "30"]),
                    args(&["sh", "-c", "sleep 30 & sleep 30"]),
                ] {
                    let cmd = run.spawn(&argv, &[]).await.unwrap();
                    println!("PID {}", cmd.pid());
                }
                // Let the watchdog see the children's descendants (100 ms scans).
                tokio::time::sleep(Duration::from_millis(300)).await;
                println!("READY");
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            "owner-commits" => {
                let run = Run::open(&path, fast()).await.unwrap();
                for i in 0..5 {
                    let seq = run
                        .commit(Batch::new().put(format!("doc/{i}"), "v"))
                        .await
                        .unwrap();
                    println!("ACK {seq}");
                }
                // Several heartbeats (100 ms) carry the head after the last commit.
                tokio::time::sleep(Duration::from_millis(400)).await;
                println!("READY");
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            "owner-with-daemon" => {
                let run = Run::open(&path, fast()).await.unwrap();
                let pidfile = path.parent().unwrap().join("daemon.pid");
                let mut cmd = run.spawn(&daemon_argv(&pidfile), &[]).await.unwrap();
                assert!(cmd.wait().await.unwrap().success());
                println!("DAEMON {}", wait_for_pid(&pidfile));
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            "owner-with-command" => {
                let run = Run::open(&path, fast()).await.unwrap();
                let argv: Vec<String> = ["sh", "-c", "trap '' TERM; sleep 30"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
                let cmd = run.spawn(&argv, &[]).await.unwrap();
                println!("PID {}", cmd.pid());
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            _ => panic!("unknown helper mode"),
        }
    });
}
