//! The spawn builder (`Run::command`, issue #18): `OsStr` arguments, environment, working
//! directory, standard streams, `try_wait`, `kill`, `output`, the run's own variables, and a
//! fence reported by `wait`.

use crate::helpers::{fast, rt};
use lease_run::{FinalStatus, Run};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[test]
fn the_builder_passes_bytes_env_cwd_and_streams_and_sets_the_runs_variables() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("builder");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        // A non-UTF-8 argument arrives byte for byte.
        let odd = OsStr::from_bytes(b"caf\xe9");
        let out = run
            .command("sh")
            .arg("-c")
            .arg(r#"printf '%s|' "$1" "$PWD" "$KEEP" "${GONE-unset}" "$RUNLEASE_RUN" "$RUNLEASE_GENERATION" "$RUNLEASE_OWNER"; echo err >&2"#)
            .arg("sh")
            .arg(odd)
            .current_dir(dir.path())
            .env("KEEP", "kept")
            .env("GONE", "x")
            .env_remove("GONE")
            // The run's own variables cannot be overridden by the caller.
            .env("RUNLEASE_RUN", "/elsewhere")
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let want = [
            b"caf\xe9".to_vec(),
            dir.path().canonicalize().unwrap().as_os_str().as_bytes().to_vec(),
            b"kept".to_vec(),
            b"unset".to_vec(),
            path.as_os_str().as_bytes().to_vec(),
            run.generation().get().to_string().into_bytes(),
            run.lease().owner_id.as_str().as_bytes().to_vec(),
        ]
        .join(&b'|');
        assert_eq!(out.stdout, [want, b"|".to_vec()].concat());
        assert_eq!(out.stderr, b"err\n");

        // Piped stdin and stdout, one by one.
        let mut cmd = run
            .command("cat")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .await
            .unwrap();
        let mut stdin = cmd.stdin.take().unwrap();
        stdin.write_all(b"through the gate\n").await.unwrap();
        drop(stdin);
        let mut got = String::new();
        cmd.stdout
            .take()
            .unwrap()
            .read_to_string(&mut got)
            .await
            .unwrap();
        assert_eq!(got, "through the gate\n");
        assert!(cmd.wait().await.unwrap().success());

        // try_wait while it runs, kill reaches its whole group (a grandchild too).
        let mut cmd = run
            .command("sh")
            .args(["-c", "sleep 30 & wait"])
            .stdin(Stdio::null())
            .spawn()
            .await
            .unwrap();
        assert!(cmd.try_wait().unwrap().is_none());
        let pgid = cmd.pid();
        tokio::time::sleep(Duration::from_millis(100)).await;
        cmd.kill().await.unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while lease_run::procs::scan()
            .into_iter()
            .any(|p| p.pgrp == pgid && !p.zombie)
        {
            assert!(std::time::Instant::now() < deadline, "the group outlived kill");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(cmd.try_wait().unwrap().is_some());
        run.release(FinalStatus::Done).await.unwrap();
    });
}

#[test]
fn a_command_killed_by_the_fence_waits_with_the_fence() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fenced-wait");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let mut cmd = run.command("sleep").arg("30").spawn().await.unwrap();
        run.suspend_heartbeats();
        let e = tokio::time::timeout(Duration::from_secs(5), cmd.wait())
            .await
            .expect("the fence killed it")
            .unwrap_err();
        assert!(e.is_fenced(), "{e}");
        assert!(e.to_string().contains("the lease lapsed"), "{e}");
        let e = run.release(FinalStatus::Done).await.unwrap_err();
        assert!(e.is_fenced());
    });
}

#[test]
fn an_empty_program_is_refused_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty-program");
    rt().block_on(async {
        let run = Run::open(&path, fast()).await.unwrap();
        let e = run.command("").spawn().await.unwrap_err();
        assert_eq!(e.code().as_str(), "ARGUMENT_INVALID");
        assert!(std::fs::read_dir(path.join("commands")).map_or(true, |mut d| d.next().is_none()));
        run.release(FinalStatus::Done).await.unwrap();
    });
}
