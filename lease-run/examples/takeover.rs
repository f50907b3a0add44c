//! lease-run: replace an owner that crashed mid-run. A first owner process opens the run,
//! commits, starts a long command and is killed with SIGKILL (no release, its command left
//! running). The next owner asks [`Run::acquire`] to claim or replace: the dead owner is
//! proved dead (this boot, its process gone, the kernel owner lock free) and retired, the
//! command it left is proved to be that run's (its incarnation's mark) and stopped before
//! the new owner starts anything, and every acknowledged commit is still in the store.
//! Then the new owner releases.
//!
//! Run: `cargo run -p lease-run --example takeover`
//!
//! It uses lease-run alone (and tokio, whose runtime every async lease-run call runs on).

use lease_run::{Acquire, Acquired, Batch, FinalStatus, OpenOptions, Run, Wait};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if let [_, role, path] = args.as_slice()
        && role == "first-owner"
    {
        return rt.block_on(first_owner(Path::new(path)));
    }

    // A run folder of our own, by absolute path (lease-run refuses a relative one).
    let base = std::env::temp_dir().join(format!("runlease-takeover-{}", std::process::id()));
    std::fs::create_dir_all(&base)?;
    let path: PathBuf = base.join("job");

    // 1. The first owner, in a process of its own: it tells us the pid of its command
    //    once it has committed, then we kill it as a crash would (SIGKILL: no release).
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "first-owner",
            path.to_str().ok_or("temp path is not UTF-8")?,
        ])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
    let command_pid: u32 = line
        .trim()
        .strip_prefix("command ")
        .ok_or("bad line")?
        .parse()?;
    child.kill()?;
    child.wait()?;
    println!(
        "first owner {} killed; its command {command_pid} still runs",
        child.id()
    );
    assert!(
        alive(command_pid),
        "the crashed owner's command outlives it"
    );

    // 2. The next owner: claim, or replace a dead (or stale) owner.
    let (run, how) = rt.block_on(Run::acquire(
        &path,
        Acquire::ClaimOrReplace,
        Wait::No,
        OpenOptions::default(),
        &mut (),
    ))?;
    match &how {
        Acquired::RetiredDead { from } => {
            println!(
                "retired the dead owner of generation {}; now generation {}",
                from.generation(),
                run.generation()
            )
        }
        other => panic!("expected the dead owner to be retired, got {other:?}"),
    }
    // The open stopped the command the dead owner left, before it returned.
    assert!(!alive(command_pid), "the leftover command was stopped");
    println!("the leftover command {command_pid} was proved the run's and stopped");
    // Nothing acknowledged was lost.
    let doc = run.store().get("progress/1")?.ok_or("progress/1 lost")?;
    assert_eq!(doc.value, b"step 1 done");
    println!("progress/1 = {:?}", String::from_utf8_lossy(&doc.value));
    rt.block_on(run.release(FinalStatus::Done))?;
    std::fs::remove_dir_all(&base)?;
    Ok(())
}

/// The first owner: open, commit, start a command that would run for ten minutes, say
/// so, and wait to be killed.
async fn first_owner(path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let run = Run::open(path, OpenOptions::default()).await?;
    run.commit(Batch::new().put("progress/1", "step 1 done"))
        .await?;
    let cmd = run.command("sleep").arg("600").spawn().await?;
    println!("command {}", cmd.pid());
    std::future::pending::<()>().await;
    Ok(())
}

/// Whether `pid` is a live process (a zombie is not).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}
