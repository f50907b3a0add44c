//! lease-run: the run's store served to its commands (issue #20). The owner opens a run
//! and starts this very program again as its command; the command commits a batch through
//! the owner's socket, reads it back and exits; the owner reads what the command wrote and
//! releases. Then a request stamped with another generation (a leftover command of an
//! older owner) is refused `FENCED` before it reaches the store, and once the owner has
//! released, nobody answers at all.
//!
//! Run: `cargo run -p lease-run --example served_store`

use lease_run::store_client::{SOCKET_VAR, StoreClient};
use lease_run::{Batch, FinalStatus, INCARNATION_VAR, OpenOptions, Run};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(1).as_deref() == Some("--as-command") {
        return command();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("job");
        let run = Run::open(&path, OpenOptions::default()).await?;
        println!(
            "owner: generation {}, serving {}",
            run.generation(),
            run.store_socket().unwrap_or("nothing")
        );

        // The command: this program again, with the run's variables (socket, secret, ...).
        let out = run
            .command(std::env::current_exe()?)
            .arg("--as-command")
            .output()
            .await?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc = run.store().get("step/1")?.expect("the command's commit");
        println!(
            "owner reads step/1 = {:?} (commit {})",
            String::from_utf8_lossy(&doc.value),
            doc.updated_seq
        );

        // A leftover command of an older generation, holding this run's socket and secret
        // (here: read from a command's environment), is refused before the store.
        let env = run.command("env").output().await?;
        let env = String::from_utf8(env.stdout)?;
        let var = |k: &str| {
            env.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .map(str::to_string)
                .ok_or(format!("{k} not in the command's environment"))
        };
        let (socket, run_dir, secret) = (
            var(SOCKET_VAR)?,
            var("RUNLEASE_RUN")?,
            var(INCARNATION_VAR)?,
        );
        let g = run.generation().get();
        let stale = tokio::task::spawn_blocking({
            let (socket, run_dir, secret) = (socket.clone(), run_dir.clone(), secret.clone());
            move || {
                StoreClient::connect(&socket, &run_dir, g - 1, &secret)?
                    .commit(&Batch::new().put("step/1", "overwritten"))
            }
        })
        .await?
        .expect_err("a request of another generation is refused");
        println!("a request stamped generation {}: {stale}", g - 1);
        assert!(stale.is_fenced());
        assert_eq!(run.store().get("step/1")?.unwrap().value, b"done");

        run.release(FinalStatus::Done).await?;
        // Released: the socket is gone, so a late command's request reaches no one.
        let gone = StoreClient::connect(&socket, &run_dir, g, &secret).expect_err("released");
        println!("after the release: {gone}");
        assert!(gone.is_fenced());
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}

/// The command's side: commit through the owner, read back.
fn command() -> Result<(), Box<dyn std::error::Error>> {
    let mut store = StoreClient::from_env()?.ok_or("not started by a serving owner")?;
    let seq = store.commit(&Batch::new().put("step/1", "done").log("step 1 done"))?;
    let back = store.get("step/1")?.ok_or("the commit is not readable")?;
    println!(
        "command: committed sequence {seq} as generation {}, read back {:?}",
        store.generation(),
        String::from_utf8_lossy(&back.value)
    );
    Ok(())
}
