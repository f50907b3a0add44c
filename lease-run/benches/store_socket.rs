//! The run's store served over its socket (issue #20), beside the direct library path,
//! measured on one run in one process (`cargo xtask bench` prints the ratios).
//!
//! **Setup.** One run (`Run::open` with the default options, so it serves its store on an
//! abstract Unix socket) in a temp folder under the system temp folder (the real disk, not
//! tmpfs: the figures are fsync-bound). The owner lives on a two-worker tokio runtime kept
//! alive for the whole bench; the clients and the direct commits are blocking calls made
//! from the bench's own threads, never inside the runtime. The socket, run, generation and
//! secret a client needs are read from the environment of a real command of the run (`env`),
//! as `tests/store_socket.rs` does.
//!
//! **criterion.** `store_socket/direct_commit`: one `run.store().commit` of a 100-byte put
//! (the store's transaction, one WAL fsync, no heartbeat). `store_socket/socket_commit`: the
//! same batch through one `StoreClient`, sequentially (the request, the owner's group commit
//! of one batch, its durable heartbeat carrying the new head, the answer: two fsyncs).
//!
//! **Throughput, by hand and interleaved.** Each round times, one after another on the
//! same run, `n` direct commits back to back (the baseline) and `n` socket commits made by
//! K = 1, 8 and 32 clients at once (each its own thread and connection, `n / K` commits
//! each, connected before the clock starts); the order of the four rotates from round to
//! round. `n` is calibrated once so a round of one client takes about 0.75 s. The medians of
//! commits/s over `RUNLEASE_BENCH_SOCKET_ROUNDS` rounds (else `RUNLEASE_BENCH_ROUNDS`;
//! default 5, 3 with `RUNLEASE_BENCH_QUICK`)
//! go to the JSON file `RUNLEASE_BENCH_STORE_SOCKET` names (default
//! `target/bench/store_socket.json` in the workspace), with the group ratios (32 and 8
//! clients against 1; the target: 32 clients at least 5x one), and to stderr.
//! Under `cargo test --benches` (no `--bench` argument) one short round runs and nothing is
//! written.

use criterion::{Criterion, criterion_group, criterion_main};
use lease_run::store_socket::{SOCKET_VAR, StoreClient};
use lease_run::{FinalStatus, INCARNATION_VAR, OpenOptions, Run};
use lease_sqlite::Batch;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// The value of every put: about 100 bytes.
const VALUE: [u8; 100] = [b'v'; 100];
/// Client counts of the throughput rounds.
const CLIENTS: [usize; 3] = [1, 8, 32];
/// Wall time a one-client round is calibrated to.
const ROUND_TARGET: Duration = Duration::from_millis(750);

/// The owner (on its runtime) and what a client needs to connect.
struct Owner {
    rt: tokio::runtime::Runtime,
    run: Run,
    socket: String,
    run_name: String,
    generation: u64,
    secret: String,
    _dir: tempfile::TempDir,
}

impl Owner {
    fn open() -> Owner {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let dir = tempfile::Builder::new()
            .prefix("runlease-store-socket-")
            .tempdir_in(std::env::temp_dir())
            .expect("scratch folder");
        let path = dir.path().join("run");
        let (run, env) = rt.block_on(async {
            let run = Run::open(&path, OpenOptions::default())
                .await
                .expect("open the run");
            // The variables a command of the run is given, read from a real command.
            let out = run.command("env").output().await.expect("run `env`");
            assert!(out.status.success(), "`env` failed: {:?}", out.status);
            let env: BTreeMap<String, String> = String::from_utf8(out.stdout)
                .expect("UTF-8 environment")
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            (run, env)
        });
        let var = |k: &str| {
            env.get(k)
                .cloned()
                .unwrap_or_else(|| panic!("the command's environment lacks {k}"))
        };
        Owner {
            socket: var(SOCKET_VAR),
            run_name: var("RUNLEASE_RUN"),
            generation: var("RUNLEASE_GENERATION").parse().expect("generation"),
            secret: var(INCARNATION_VAR),
            run,
            rt,
            _dir: dir,
        }
    }

    fn client(&self) -> StoreClient {
        StoreClient::connect(&self.socket, &self.run_name, self.generation, &self.secret)
            .expect("connect to the store socket")
    }

    fn release(self) {
        let Owner { rt, run, .. } = self;
        rt.block_on(run.release(FinalStatus::Done))
            .expect("release the run");
    }
}

fn put(key: String) -> Batch {
    Batch::new().put(key, VALUE.to_vec())
}

/// `n` direct commits back to back; commits/s.
fn direct(owner: &Owner, n: usize) -> f64 {
    let store = owner.run.store();
    let batch = put("direct".into());
    let t = Instant::now();
    for _ in 0..n {
        store.commit(&batch).expect("direct commit");
    }
    n as f64 / t.elapsed().as_secs_f64()
}

/// `k` clients, each on its own thread and connection, `n / k` socket commits each, all at
/// once; commits/s (the clock runs from the moment every client is connected until the
/// last one is done).
fn socket(owner: &Owner, k: usize, n: usize) -> f64 {
    let each = n / k;
    let start = Arc::new(Barrier::new(k + 1));
    let threads: Vec<_> = (0..k)
        .map(|i| {
            let mut c = owner.client();
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The throughput rounds (see the module docs); writes the JSON unless `test_mode`.
fn throughput(owner: &Owner, test_mode: bool) {
    let quick = std::env::var_os("RUNLEASE_BENCH_QUICK").is_some();
    let rounds: usize = if test_mode {
        1
    } else {
        // Its own variable first: `cargo xtask bench` runs every bench in one `cargo bench`,
        // where RUNLEASE_BENCH_ROUNDS is lease-fs's interleaved rounds.
        std::env::var("RUNLEASE_BENCH_SOCKET_ROUNDS")
            .or_else(|_| std::env::var("RUNLEASE_BENCH_ROUNDS"))
            .ok()
            .and_then(|r| r.parse().ok())
            .filter(|&r| r > 0)
            .unwrap_or(if quick { 3 } else { 5 })
    };
    let n = if test_mode {
        32
    } else {
        // Calibrate: one client, 64 commits (after 16 unmeasured); a multiple of 32 so
        // every K divides it.
        socket(owner, 1, 16);
        let per_s = socket(owner, 1, 64);
        let n = (per_s * ROUND_TARGET.as_secs_f64()) as usize;
        n.clamp(64, 20_000) / 32 * 32
    };
    // [direct, K = 1, 8, 32]
    let mut samples: [Vec<f64>; 4] = Default::default();
    for r in 0..rounds {
        for j in 0..4 {
            let which = (r + j) % 4;
            let per_s = match which {
                0 => direct(owner, n),
                w => socket(owner, CLIENTS[w - 1], n),
            };
            samples[which].push(per_s);
        }
    }
    let [direct, s1, s8, s32] = samples.map(median);
    eprintln!(
        "store_socket throughput ({rounds} rounds of {n} commits each, medians): direct {direct:.0}/s; socket 1 client {s1:.0}/s, 8 clients {s8:.0}/s ({:.2}x), 32 clients {s32:.0}/s ({:.2}x; target >= 5x)",
        s8 / s1,
        s32 / s1
    );
    if test_mode {
        return;
    }
    let out = std::env::var_os("RUNLEASE_BENCH_STORE_SOCKET")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
            crate_dir
                .parent()
                .unwrap_or(crate_dir)
                .join("target/bench/store_socket.json")
        });
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d).expect("create the JSON's folder");
    }
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    let json = serde_json::json!({
        "direct_commits_per_s": r2(direct),
        "socket_1_commits_per_s": r2(s1),
        "socket_8_commits_per_s": r2(s8),
        "socket_32_commits_per_s": r2(s32),
        "group_ratio_32_vs_1": r2(s32 / s1),
        "group_ratio_8_vs_1": r2(s8 / s1),
        "rounds": rounds,
        "commits_per_round": n,
    });
    std::fs::write(&out, format!("{json}\n")).expect("write the JSON");
    eprintln!("store_socket: wrote {}", out.display());
}

fn store_socket(c: &mut Criterion) {
    let owner = Owner::open();
    let test_mode = !std::env::args().any(|a| a == "--bench");
    {
        let mut g = c.benchmark_group("store_socket");
        let store = owner.run.store();
        let batch = put("direct".into());
        g.bench_function("direct_commit", |b| {
            b.iter(|| store.commit(&batch).expect("direct commit"))
        });
        let mut client = owner.client();
        let batch = put("socket/0".into());
        g.bench_function("socket_commit", |b| {
            b.iter(|| client.commit(&batch).expect("socket commit"))
        });
        g.finish();
    }
    throughput(&owner, test_mode);
    owner.release();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = store_socket
}
criterion_main!(benches);
