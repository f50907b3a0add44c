//! Throughput through the store socket: 1, 8 and 32 clients against direct commits.

use crate::figures::{Figure, Unit, push};
use crate::support::{median, open_run, opts, put, release_run};
use crate::{CLIENTS, Cfg, cluster};
use lease_core::TimingPolicy;
use lease_run::store_socket::{SOCKET_VAR, StoreClient};
use lease_run::{INCARNATION_VAR, Run};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Instant;

struct Socket {
    socket: String,
    run_name: String,
    generation: u64,
    secret: String,
}

impl Socket {
    fn of(rt: &tokio::runtime::Runtime, run: &Run) -> Socket {
        let env: BTreeMap<String, String> = rt.block_on(async {
            let out = run.command("env").output().await.expect("run `env`");
            assert!(out.status.success(), "`env` failed: {:?}", out.status);
            String::from_utf8(out.stdout)
                .expect("UTF-8 environment")
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        });
        let var = |k: &str| {
            env.get(k)
                .cloned()
                .unwrap_or_else(|| panic!("the command's environment lacks {k}"))
        };
        Socket {
            socket: var(SOCKET_VAR),
            run_name: var("RUNLEASE_RUN"),
            generation: var("RUNLEASE_GENERATION").parse().expect("generation"),
            secret: var(INCARNATION_VAR),
        }
    }

    fn client(&self) -> StoreClient {
        StoreClient::connect(&self.socket, &self.run_name, self.generation, &self.secret)
            .expect("connect to the store socket")
    }

    /// `k` clients, `n / k` commits each, all at once; commits/s.
    fn round(&self, k: usize, n: usize) -> f64 {
        let each = n / k;
        let start = Arc::new(Barrier::new(k + 1));
        let threads: Vec<_> = (0..k)
            .map(|i| {
                let mut c = self.client();
                let start = start.clone();
                let batch = put(format!("socket/{i}"));
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..each {
                        c.commit(&batch).expect("socket commit");
                    }
                })
            })
            .collect();
        start.wait();
        let t = Instant::now();
        for th in threads {
            th.join().expect("client thread");
        }
        (each * k) as f64 / t.elapsed().as_secs_f64()
    }
}

pub(crate) fn throughput(
    cluster: &cluster::Cluster,
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    cfg: &Cfg,
    figures: &mut Vec<Figure>,
) {
    let run = open_run(
        rt,
        &dir.join("tput").join("job"),
        opts(cluster, "b-tput", TimingPolicy::default()),
    );
    let sock = Socket::of(rt, &run);
    let store = run.store();
    let direct = |n: usize| {
        let b = put("direct".into());
        let t = Instant::now();
        for _ in 0..n {
            store.commit(&b).expect("direct commit");
        }
        n as f64 / t.elapsed().as_secs_f64()
    };
    sock.round(1, 16);
    let per_s = sock.round(1, 64);
    let n = ((per_s * cfg.round_target().as_secs_f64()) as usize).clamp(64, 20_000) / 32 * 32;
    let rounds = cfg.rounds();
    let mut samples: [Vec<f64>; 4] = Default::default();
    for r in 0..rounds {
        for j in 0..4 {
            let which = (r + j) % 4;
            samples[which].push(match which {
                0 => direct(n),
                w => sock.round(CLIENTS[w - 1], n),
            });
        }
    }
    let [d, s1, s8, s32] = samples.map(median);
    eprintln!(
        "engine_store throughput ({rounds} rounds of {n} commits, medians): direct {d:.0}/s; socket 1 / 8 / 32 clients {s1:.0} / {s8:.0} / {s32:.0} commits/s"
    );
    let tp = |key, what: &str, m, bname, b, target_min| Figure {
        key,
        what: what.to_string(),
        median: m,
        baseline: bname,
        baseline_median: b,
        unit: Unit::PerS,
        target: None,
        target_min,
    };
    push(
        figures,
        tp(
            "socket_1_commits_per_s",
            "1 client through the store socket (no concurrency to group)",
            s1,
            "direct_commits_per_s",
            d,
            None,
        ),
    );
    push(
        figures,
        tp(
            "socket_8_commits_per_s",
            "8 concurrent clients through the store socket",
            s8,
            "socket_1_commits_per_s",
            s1,
            None,
        ),
    );
    push(
        figures,
        tp(
            "group_commit_32_vs_1",
            "32 concurrent clients through the store socket (group commits)",
            s32,
            "socket_1_commits_per_s",
            s1,
            Some(5.0),
        ),
    );
    release_run(rt, run);
}
