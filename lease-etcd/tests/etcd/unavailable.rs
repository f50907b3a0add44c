//! A cluster that cannot serve: unreachable (`UNAVAILABLE` in time) or full (`ETCD_NOSPACE`).

use crate::cluster::{Cluster, SERIAL, etcd_binary};
use crate::{claim_params, fast_policy, holder, id, lock_serial, now_ts, opts};
use lease_core::{LeaseOps, RunId};
use lease_etcd::{AuthorityAddr, EtcdAuthority, EtcdOptions};
use std::time::{Duration, Instant};

#[test]
fn unreachable_cluster_is_unavailable_within_the_deadline() {
    // Serialized with the cluster tests: the port below is free only once released, and a
    // cluster starting meanwhile could take it and answer.
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // Nothing listens on this port (bound and released): every call fails fast or times
    // out, and the operation ends by its deadline with UNAVAILABLE (69), never a hang.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = AuthorityAddr::parse(&format!("etcd://127.0.0.1:{port}/t")).unwrap();
    let o = EtcdOptions {
        call_timeout: Duration::from_millis(200),
        op_timeout: Duration::from_millis(1_000),
        connect_timeout: Duration::from_millis(200),
    };
    let start = Instant::now();
    let err = match EtcdAuthority::connect(&addr, o) {
        Err(e) => e,
        Ok(auth) => {
            let run = auth.run(RunId::new("nowhere").unwrap());
            run.claim(lease_core::ops::ClaimParams {
                run_id: run.run_id().clone(),
                owner_id: id("owner-a"),
                holder: holder(1),
                policy: fast_policy(),
                now: now_ts(),
                store_floor: None,
            })
            .unwrap_err()
        }
    };
    let took = start.elapsed();
    assert_eq!(err.code().as_str(), "UNAVAILABLE", "{err}");
    assert!(err.to_string().contains("nowhere") || err.to_string().contains("connect"));
    assert!(
        took < Duration::from_secs(3),
        "took {took:?} with a 1 s deadline"
    );
}
/// lease-run calls the authority from `tokio::task::spawn_blocking` (as it calls
/// `RunDir`); the private runtime of `EtcdAuthority` must work there, and be dropped there.
#[test]
fn the_blocking_api_works_inside_spawn_blocking_of_another_runtime() {
    // Serialized with the cluster tests: the port below is free only once released, and a
    // cluster starting meanwhile could take it and answer.
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let code = rt.block_on(async move {
        tokio::task::spawn_blocking(move || {
            let addr = AuthorityAddr::parse(&format!("etcd://127.0.0.1:{port}/t")).unwrap();
            let o = EtcdOptions {
                call_timeout: Duration::from_millis(100),
                op_timeout: Duration::from_millis(300),
                connect_timeout: Duration::from_millis(100),
            };
            match EtcdAuthority::connect(&addr, o) {
                Err(e) => e.code().as_str(),
                Ok(auth) => {
                    let run = auth.run(RunId::new("inside").unwrap());
                    run.status(now_ts(), false).unwrap_err().code().as_str()
                }
            }
        })
        .await
        .expect("no panic inside spawn_blocking")
    });
    assert_eq!(code, "UNAVAILABLE");
}
/// Issue #31: a full cluster (its NOSPACE alarm raised by `--quota-backend-bytes`) is
/// `ETCD_NOSPACE`, with a message that names the alarm and the fix, not `UNAVAILABLE` (a
/// retry only adds refused writes). The owner's heartbeat gets that code too.
#[test]
fn a_full_cluster_is_etcd_nospace_naming_the_alarm_and_the_fix() {
    use lease_core::Code;
    let Some(bin) = etcd_binary() else { return };
    let _serial = lock_serial();
    // 4 MiB: a few hundred-KiB writes fill it.
    let cluster = Cluster::start_with(&bin, &["--quota-backend-bytes", "4194304"]);
    let policy = fast_policy();
    let auth = cluster.authority(&[0, 1, 2], "t", opts());
    let owner = auth.run(RunId::new("full").unwrap());
    let lease = owner
        .claim(claim_params(&owner, "owner-a", 1, policy))
        .unwrap();
    owner.heartbeat(&lease, now_ts(), 1, None).unwrap();
    // Another run fills the cluster until it refuses.
    let e = cluster.fill("t-filler");
    assert_eq!(e.code(), Code::EtcdNoSpace, "{e}");
    let text = e.to_string();
    for part in [
        "NOSPACE",
        "out of space",
        "etcdctl alarm disarm",
        "etcdctl defrag",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
    let beat = owner.heartbeat(&lease, now_ts(), 2, None).unwrap_err();
    assert_eq!(beat.code(), Code::EtcdNoSpace, "{beat}");
}
