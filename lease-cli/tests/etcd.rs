//! `runlease --authority etcd://...` end to end against a real 3-member etcd cluster: run
//! (the command appends an event through the inherited RUNLEASE_AUTHORITY), status, events
//! and verify with the same JSON shapes and exit codes as with the run folder; a second
//! owner refused (76); folder-only subcommands refused (64); an unreachable cluster (69);
//! an owner whose wall clock is off but whose etcd lease lives waited for, not taken over.
#![cfg(feature = "etcd")]

mod common;
// Each test crate uses a part of the harness.
#[allow(dead_code)]
#[path = "../../lease-etcd/tests/cluster/mod.rs"]
mod cluster;

use cluster::{Cluster, SERIAL, etcd_binary};
use common::{FAST, cmd, json_lines, text, tree, wait_exit};
use rustix::process::Signal;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

fn url(cluster: &Cluster, prefix: &str) -> String {
    let eps: Vec<String> = cluster.members.iter().map(|m| m.endpoint()).collect();
    format!("etcd://{}/{prefix}", eps.join(","))
}

/// `runlease --authority URL ARGS...`.
fn rl(authority: &str, args: &[&str]) -> Output {
    let mut all = vec!["--authority", authority];
    all.extend_from_slice(args);
    cmd(&all).output().expect("spawn runlease")
}

#[test]
fn run_status_append_events_verify_over_etcd() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(bin) = etcd_binary() else { return };
    let cluster = Cluster::start(&bin);
    let a = url(&cluster, "cli-e2e");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("job");
    let d = dir.to_str().unwrap();

    // The command appends through the RUNLEASE_AUTHORITY it inherits.
    let mut args = vec!["--json", "run", d];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(&[
        "--",
        "sh",
        "-c",
        r#"test -n "$RUNLEASE_AUTHORITY" && runlease append "$RUNLEASE_RUN" --type step.done --payload '{"n":1}'"#,
    ]);
    let o = rl(&a, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let lines = json_lines(&o);
    assert_eq!(lines[0]["schema"], "runlease/cli/run/1");
    assert_eq!(lines[0]["event"], "owned");
    assert_eq!(lines[0]["generation"], 1);
    let released = lines.last().unwrap();
    assert_eq!(released["event"], "released");
    assert_eq!(released["released_as"], 2);
    assert_eq!(released["command_exit"], 0);

    // Only the lease moved: run.json and the store are in the folder, no lease file.
    let files = tree(&dir);
    assert!(
        !files
            .iter()
            .any(|(name, bytes)| name.starts_with("lease/") && bytes != b"dir"),
        "{:?}",
        files.keys()
    );
    assert!(dir.join("run.json").exists());

    // status through the environment variable this time.
    let o = cmd(&["status", "--json", d])
        .env("RUNLEASE_AUTHORITY", &a)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let st = json_lines(&o).remove(0);
    assert_eq!(st["schema"], "runlease/cli/status/1");
    assert_eq!(st["state"], "free");
    assert_eq!(st["generation"], 2);
    assert_eq!(st["epoch_state"], "released");
    assert_eq!(st["run_status"]["status"], "done");
    assert_eq!(st["run_id"], "job");

    let o = rl(&a, &["events", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let ev = json_lines(&o);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["schema"], "runlease/cli/event/1");
    assert_eq!(ev[0]["type"], "step.done");
    assert_eq!(ev[0]["payload"]["n"], 1);
    assert_eq!(ev[0]["authority"], "counts");

    let o = rl(&a, &["verify", "--json", d]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v = json_lines(&o).remove(0);
    assert_eq!(
        (v["epochs"].as_u64(), v["events"].as_u64()),
        (Some(2), Some(1))
    );

    // The folder does not have to exist on the observing host (run.json: null).
    let elsewhere = tmp.path().join("other-host").join("job");
    let o = rl(&a, &["status", "--json", elsewhere.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let st = json_lines(&o).remove(0);
    assert_eq!(
        (st["state"].as_str(), st["generation"].as_u64()),
        (Some("free"), Some(2))
    );
    assert!(st["run_status"].is_null());

    // An append with a superseded token: FENCED, 75, as with the folder.
    let o = rl(
        &a,
        &[
            "append",
            "--json",
            d,
            "--type",
            "late",
            "--generation",
            "1",
            "--owner",
            "x",
        ],
    );
    assert_eq!(o.status.code(), Some(75), "{}", text(&o.stderr));
    assert_eq!(json_lines(&o)[0]["code"], "FENCED");

    // prune works on the chain in etcd.
    let o = rl(&a, &["prune", "--json", d, "--keep", "2"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(json_lines(&o)[0]["schema"], "runlease/cli/prune/1");
}

#[test]
fn a_held_run_is_refused_with_76_from_another_folder() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(bin) = etcd_binary() else { return };
    let cluster = Cluster::start(&bin);
    let a = url(&cluster, "cli-held");
    let tmp = tempfile::tempdir().unwrap();
    let host_a = tmp.path().join("a").join("job");
    let host_b = tmp.path().join("b").join("job");
    let mut args = vec!["--authority", a.as_str(), "run", host_a.to_str().unwrap()];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(&["--", "sleep", "30"]);
    let mut owner = cmd(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    loop {
        let o = rl(&a, &["status", "--json", host_b.to_str().unwrap()]);
        if json_lines(&o)
            .first()
            .is_some_and(|s| s["state"] == "active")
        {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "never active");
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = rl(
        &a,
        &["--json", "run", host_b.to_str().unwrap(), "--", "true"],
    );
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    let e = json_lines(&o).remove(0);
    assert_eq!(e["code"], "RUN_ALREADY_ACTIVE");
    assert_eq!(e["holder"]["generation"], 1);
    // A takeover of a fresh owner: refused, 76.
    let o = rl(
        &a,
        &["--json", "takeover", host_b.to_str().unwrap(), "--yes"],
    );
    assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
    assert_eq!(json_lines(&o)[0]["code"], "TAKEOVER_ACTIVE_REFUSED");
    // SIGTERM is forwarded to the command; the run is released.
    common::signal(owner.id(), Signal::TERM);
    let st = wait_exit(&mut owner, Duration::from_secs(10));
    assert_eq!(st.code(), Some(128 + 15));
    let o = rl(&a, &["status", "--json", host_b.to_str().unwrap()]);
    assert_eq!(json_lines(&o)[0]["state"], "free");
}

#[test]
fn folder_only_subcommands_and_bad_addresses_exit_64() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("job");
    let a = "etcd://127.0.0.1:1/p";
    for args in [
        vec!["--json", "doctor", d.to_str().unwrap()],
        vec!["--json", "list", tmp.path().to_str().unwrap()],
    ] {
        let o = rl(a, &args);
        assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
        assert_eq!(json_lines(&o)[0]["code"], "AUTHORITY_UNSUPPORTED");
    }
    let o = rl(
        "etcd://127.0.0.1:2379",
        &["--json", "status", d.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(64), "{}", text(&o.stderr));
    assert_eq!(json_lines(&o)[0]["code"], "AUTHORITY_INVALID");
    // Refused before anything is touched.
    assert!(!d.exists());
}

#[test]
fn an_unreachable_cluster_exits_69() {
    // Serialized with the cluster tests: the port below is free only once released, and a
    // cluster starting meanwhile could take it and answer.
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let a = format!("etcd://127.0.0.1:{port}/p");
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("job");
    let t = Instant::now();
    let o = rl(&a, &["--json", "status", d.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(69), "{}", text(&o.stderr));
    let e = json_lines(&o).remove(0);
    assert_eq!(
        (e["code"].as_str(), e["exit_code"].as_i64()),
        (Some("UNAVAILABLE"), Some(69))
    );
    // The CLI's etcd operations end by 5 s.
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    let mut args = vec!["--json", "run", d.to_str().unwrap()];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(&["--", "true"]);
    let o = rl(&a, &args);
    assert_eq!(o.status.code(), Some(69), "{}", text(&o.stderr));
    assert_eq!(json_lines(&o)[0]["code"], "UNAVAILABLE");
}

#[test]
fn release_from_the_command_and_retire_of_a_killed_owner_over_etcd() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(bin) = etcd_binary() else { return };
    let cluster = Cluster::start(&bin);
    let a = url(&cluster, "cli-release");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("job");
    let d = dir.to_str().unwrap();

    // `runlease release` inside the command asks its `runlease run` over the store socket, which
    // releases in etcd; the command runs on without the lease.
    let mut args = vec!["--json", "run", d];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(&["--", "sh", "-c", "runlease release --json && sleep 0.3"]);
    let o = rl(&a, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let lines = json_lines(&o);
    let rel = lines
        .iter()
        .find(|l| l["schema"] == "runlease/cli/release/1")
        .expect("release object");
    assert_eq!(
        (rel["how"].as_str(), rel["released_as"].as_u64()),
        (Some("owner"), Some(2))
    );
    assert_eq!(lines.last().unwrap()["on_request"], true);

    // A kill -9ed owner: dead once its etcd lease (stale_after 1 s) expired; retire frees.
    // Its guard is killed with it (otherwise it kills the command by the self-fence
    // deadline, issue #31), so the command is left for the next owner to reap.
    let pidfile = tmp.path().join("pid");
    let mut args = vec!["--authority", a.as_str(), "run", d];
    args.extend_from_slice(&FAST);
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    args.extend_from_slice(&["--", "sh", "-c", script.as_str()]);
    let mut owner = cmd(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = common::read_pid(&pidfile);
    common::crash_with_guard(&mut owner);
    // Refused while the etcd lease lives (76), then retired.
    let t = Instant::now();
    let mut refused = 0;
    loop {
        let o = rl(&a, &["--json", "retire", d]);
        match o.status.code() {
            Some(0) => {
                let r = json_lines(&o).remove(0);
                assert_eq!(r["schema"], "runlease/cli/retire/1");
                assert_eq!(r["state"], "free");
                break;
            }
            Some(76) => refused += 1,
            other => panic!("{other:?}: {}", text(&o.stderr)),
        }
        assert!(t.elapsed() < Duration::from_secs(10), "never retired");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(refused > 0, "retired before the etcd lease could expire");
    // The next run on this boot kills the killed owner's command from its record.
    assert!(common::alive(child));
    let mut args = vec!["run", d];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(&["--", "true"]);
    let o = rl(&a, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(!common::alive(child));
}

/// The wall clock now, as a protocol timestamp, shifted by `skew_ms` (an owner whose clock
/// runs slow or fast).
fn skewed_now(skew_ms: i64) -> lease_core::Timestamp {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    lease_core::Timestamp::from_unix_millis((ms + skew_ms) as u64).unwrap()
}

/// An owner on another host (its own holder, never this one), whose wall clock is
/// `skew_ms` off, beating every 100 ms through the library as `runlease run` would: its
/// etcd lease stays alive while its records are dated by its wrong clock.
struct SkewedOwner {
    run: std::sync::Arc<lease_etcd::EtcdRun>,
    lease: lease_core::ops::OwnedLease,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    beats: Option<std::thread::JoinHandle<Result<u64, String>>>,
}

impl SkewedOwner {
    fn start(cluster: &Cluster, prefix: &str, run: &str, skew_ms: i64) -> SkewedOwner {
        use lease_core::LeaseOps;
        let opts = lease_etcd::EtcdOptions {
            call_timeout: Duration::from_millis(500),
            op_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_millis(500),
        };
        let handle = std::sync::Arc::new(
            cluster
                .authority(&[0, 1, 2], prefix, opts)
                .run(lease_core::RunId::new(run).unwrap()),
        );
        let id = |s: &str| lease_core::Identity::new(s).unwrap();
        let holder = lease_core::Holder {
            host: id("far-host"),
            boot_id: id("far-boot"),
            pid: 4242,
            start_time: 7,
        };
        // Beat 250 ms, self-fence after 1 s, stale after 2 s (the etcd lease's time to
        // live): short, with room for a beat delayed on a loaded machine.
        let policy = lease_core::TimingPolicy::from_millis(
            250,
            1_000,
            2_000,
            lease_core::HeartbeatDurability::Local,
        )
        .unwrap();
        let lease = handle
            .claim(lease_core::ops::ClaimParams {
                run_id: handle.run_id().clone(),
                owner_id: id(&format!("skewed-{run}")),
                holder,
                policy,
                now: skewed_now(skew_ms),
                store_floor: None,
            })
            .expect("claim");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (r, l, s) = (handle.clone(), lease.clone(), stop.clone());
        let beats = std::thread::spawn(move || {
            let (mut count, mut ok) = (0, 0);
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                count += 1;
                match r.heartbeat(&l, skewed_now(skew_ms), count, None) {
                    Ok(()) => ok += 1,
                    // A slow cluster answer is retried by the next beat, as lease-run does
                    // (`OUTCOME_UNKNOWN`: the beat was sent and not answered in time).
                    Err(e) if e.code() == "UNAVAILABLE" || e.code() == "OUTCOME_UNKNOWN" => {}
                    Err(e) => return Err(format!("beat {count}: {e}")),
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Ok(ok)
        });
        SkewedOwner {
            run: handle,
            lease,
            stop,
            beats: Some(beats),
        }
    }

    /// Stop beating (as a crashed or SIGSTOPped owner would): its etcd lease expires
    /// stale_after after its last keep-alive.
    fn stop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let beats = self.beats.take().unwrap().join().unwrap();
        assert!(beats.expect("no beat was refused") > 0);
    }

    /// Whether its etcd lease is alive now.
    fn lease_alive(&self) -> bool {
        self.run
            .owner_lease_ttl(self.lease.generation)
            .expect("lease ttl")
            .is_some()
    }
}

/// `status --json`'s next step as an argument vector (null: none).
fn argv_of(s: &serde_json::Value) -> Option<Vec<String>> {
    s["next_step_argv"]
        .as_array()
        .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
}

// Issue #17: with etcd, "alive" is the owner's etcd lease, not a wall clock. An owner whose
// clock runs 60 s slow (beats dated a minute ago) or fast (dated a minute ahead) while it
// keeps its etcd lease alive is active, and `status` names waiting, with why: a takeover
// would be refused (76) until that lease expires. Once it expired (the owner stopped),
// the step `status --json` names is run as it is and succeeds.
#[test]
fn an_owner_whose_etcd_lease_lives_is_waited_for_whatever_its_clock_says() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(bin) = etcd_binary() else { return };
    let cluster = Cluster::start(&bin);
    let prefix = "cli-skew";
    let a = url(&cluster, prefix);
    let tmp = tempfile::tempdir().unwrap();
    for (run, skew_ms) in [("slow", -60_000i64), ("fast", 60_000)] {
        // The run folder is on the owner's host, not this one.
        let dir = tmp.path().join(run);
        let d = dir.to_str().unwrap();
        let mut owner = SkewedOwner::start(&cluster, prefix, run, skew_ms);
        std::thread::sleep(Duration::from_millis(300));
        assert!(owner.lease_alive());
        let o = rl(&a, &["status", "--json", d]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let s = json_lines(&o).remove(0);
        let age = s["heartbeat_age_ms"].as_i64().unwrap();
        assert!(age.abs() > 50_000, "{run}: the wall clock's view: {s}");
        assert_eq!(s["state"], "active", "{run}: {s}");
        assert_eq!(s["dead"], false, "{run}: {s}");
        assert!(argv_of(&s).is_none(), "{run}: waiting is no command: {s}");
        let next = s["next_step"].as_str().unwrap();
        assert!(
            next.starts_with("wait") && next.contains("etcd lease is alive") && next.contains("76"),
            "{run}: {s}"
        );
        assert!(
            s["liveness"].as_str().unwrap().contains("etcd lease"),
            "{run}: {s}"
        );
        // The human form says the same.
        let o = rl(&a, &["status", d]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let human = text(&o.stdout);
        assert!(human.contains(": active"), "{human}");
        assert!(human.contains("next       wait"), "{human}");
        // What waiting avoids: the takeover the wall clock would suggest is refused, 76.
        let o = rl(&a, &["--json", "takeover", d, "--yes"]);
        assert_eq!(o.status.code(), Some(76), "{}", text(&o.stderr));
        assert_eq!(json_lines(&o)[0]["code"], "TAKEOVER_ACTIVE_REFUSED");
        // At once, from the authority's word, not after watching the record.
        assert!(
            json_lines(&o)[0]["message"]
                .as_str()
                .unwrap_or("")
                .contains("its etcd lease has not expired"),
            "{}",
            text(&o.stdout)
        );

        // The owner stops beating; while its etcd lease lives, status still names no
        // takeover; once it expired the owner is dead, and the step named is run as is.
        owner.stop();
        let t = Instant::now();
        let s = loop {
            let alive_before = owner.lease_alive();
            let o = rl(&a, &["status", "--json", d]);
            assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
            let s = json_lines(&o).remove(0);
            if alive_before && owner.lease_alive() {
                assert_eq!(s["state"], "active", "{run}: {s}");
                assert!(argv_of(&s).is_none(), "{run}: {s}");
            }
            if s["state"] != "active" {
                break s;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "never expired: {s}");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(s["state"], "dead", "{run}: {s}");
        let argv = argv_of(&s).unwrap_or_else(|| panic!("{run}: no step: {s}"));
        assert_eq!(argv[..3], ["runlease", "--authority", a.as_str()], "{s}");
        let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
        let o = cmd(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{argv:?}: {}", text(&o.stderr));
        let o = rl(&a, &["status", "--json", d]);
        assert_eq!(json_lines(&o)[0]["state"], "free", "{run}");
    }
}

// Issue #31: a SIGSTOPped owner's watchdog thread is stopped with it, and with etcd the
// next owner (here from another folder, as from another host) may claim as soon as the
// stopped owner's etcd lease expired. The owner's guard process kills the command by the
// self-fence deadline while the owner is still stopped, so it is gone before the next
// owner claims; resumed, the stopped owner fences itself and exits 75.
#[test]
fn a_stopped_owners_command_is_gone_before_the_next_owner_claims_over_etcd() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(bin) = etcd_binary() else { return };
    let cluster = Cluster::start(&bin);
    let a = url(&cluster, "cli-guard");
    let tmp = tempfile::tempdir().unwrap();
    let host_a = tmp.path().join("a").join("job");
    let host_b = tmp.path().join("b").join("job");
    let pidfile = tmp.path().join("pid");
    let err = tmp.path().join("owner.err");
    let script = format!("echo $$ > '{}'; exec sleep 60", pidfile.display());
    let mut args = vec!["--authority", a.as_str(), "run", host_a.to_str().unwrap()];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(&["--", "sh", "-c", script.as_str()]);
    let mut owner = cmd(&args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let child = common::read_pid(&pidfile);
    let t = Instant::now();
    while !std::fs::read(format!("/proc/{child}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep\0"))
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the command never ran sleep"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    common::signal(owner.id(), Signal::STOP);
    let stopped = Instant::now();
    // FAST: self-fence after 500 ms.
    while common::alive(child) {
        if stopped.elapsed() > Duration::from_millis(500) + Duration::from_secs(3) {
            common::signal(child, Signal::KILL);
            common::signal(owner.id(), Signal::KILL);
            panic!(
                "the command still runs {} ms after its owner was stopped: {}",
                stopped.elapsed().as_millis(),
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let owner_state = lease_fs::probe::read_stat(owner.id())
        .ok()
        .flatten()
        .map(|s| s.state);
    assert_eq!(
        owner_state,
        Some('T'),
        "the owner was resumed before its command died"
    );

    // The next owner claims once the stopped owner's etcd lease expired (refused, 76, until
    // then); the old command was gone before.
    let mut args = vec!["run", host_b.to_str().unwrap(), "--retire-dead"];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(&["--", "true"]);
    let t = Instant::now();
    loop {
        let o = rl(&a, &args);
        match o.status.code() {
            Some(0) => break,
            Some(76) => {}
            other => panic!("{other:?}: {}", text(&o.stderr)),
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "the next owner never claimed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    common::signal(owner.id(), Signal::CONT);
    let st = wait_exit(&mut owner, Duration::from_secs(15));
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!(st.code(), Some(75), "{stderr}");
}

/// Issue #32: the store follows the lease. Values a command commits on host A's folder are
/// read back with `store get`, `list` and `log` through a path on host B where no folder
/// exists (the run id is the folder's name; nothing is created), while A's next owner holds
/// the run too, and by a new owner's command on host B. A run the engine has no record of
/// is `STORE_MISSING` (65), not an empty store.
#[test]
fn store_reads_over_etcd_come_from_the_engine_on_any_host() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(bin) = etcd_binary() else { return };
    let cluster = Cluster::start(&bin);
    let a = url(&cluster, "cli-store");
    let tmp = tempfile::tempdir().unwrap();
    let on_a = tmp.path().join("host-a").join("job");
    let on_b = tmp.path().join("host-b").join("job");
    std::fs::create_dir_all(on_a.parent().unwrap()).unwrap();
    std::fs::create_dir_all(on_b.parent().unwrap()).unwrap();
    let (da, db) = (on_a.to_str().unwrap(), on_b.to_str().unwrap());

    let mut args = vec!["run", da];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(&[
        "--",
        "sh",
        "-c",
        r#"runlease store put "$RUNLEASE_RUN" cfg/model small && runlease store put "$RUNLEASE_RUN" cfg/size 3 && runlease store delete "$RUNLEASE_RUN" cfg/size"#,
    ]);
    let o = rl(&a, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));

    let check_reads = |why: &str| {
        let o = rl(&a, &["store", "get", db, "cfg/model"]);
        assert_eq!(o.status.code(), Some(0), "{why}: {}", text(&o.stderr));
        assert_eq!(text(&o.stdout), "small", "{why}");
        let o = rl(&a, &["store", "get", db, "cfg/size"]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{why}: deleted: {}",
            text(&o.stderr)
        );
        let o = rl(&a, &["--json", "store", "list", db, "cfg/"]);
        assert_eq!(o.status.code(), Some(0), "{why}: {}", text(&o.stderr));
        let docs = json_lines(&o);
        assert_eq!(docs.len(), 1, "{why}: {docs:?}");
        assert_eq!(
            (docs[0]["key"].as_str(), docs[0]["value"].as_str()),
            (Some("cfg/model"), Some("small")),
            "{why}"
        );
        let o = rl(&a, &["--json", "store", "log", db]);
        assert_eq!(o.status.code(), Some(0), "{why}: {}", text(&o.stderr));
        let seqs: Vec<u64> = json_lines(&o)
            .iter()
            .map(|c| c["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, [1, 2, 3], "{why}");
    };
    check_reads("a free run");
    assert!(!on_b.exists(), "a read made host B's folder");

    // While an owner on host A holds the run, readers elsewhere still read the engine.
    let mut args = vec!["run", da];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(&["--", "sleep", "30"]);
    let mut held = cmd(&["--authority", &a])
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        let o = rl(&a, &["--json", "status", db]);
        let s = json_lines(&o);
        if s.first().is_some_and(|s| s["state"] == "active") {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "never active: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    check_reads("a run held on host A");
    common::signal(held.id(), Signal::TERM);
    wait_exit(&mut held, Duration::from_secs(10));

    // A new owner on host B reads the same values through its own socket.
    let mut args = vec!["run", db];
    args.extend_from_slice(&FAST);
    args.extend_from_slice(&[
        "--wait",
        "10s",
        "--",
        "sh",
        "-c",
        r#"test "$(runlease store get "$RUNLEASE_RUN" cfg/model)" = small"#,
    ]);
    let o = rl(&a, &args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));

    // A run the engine never saw.
    let other = tmp.path().join("host-b").join("jbo");
    let o = rl(
        &a,
        &[
            "--json",
            "store",
            "get",
            other.to_str().unwrap(),
            "cfg/model",
        ],
    );
    assert_eq!(o.status.code(), Some(65), "{}", text(&o.stderr));
    assert_eq!(json_lines(&o)[0]["code"], "STORE_MISSING");
    assert!(!other.exists());
}
