//! Failover: a standby's first acknowledged commit after the owner's death.

use crate::figures::{Figure, Unit, push};
use crate::support::{fast_policy, median, open_run, opts, put, release_run};
use crate::{Cfg, cluster};
use lease_run::{Acquire, Batch, Run, Wait};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The standby's acquire progress, timestamped (to tell where a failover's time goes).
#[derive(Clone, Default)]
struct Trace(Arc<std::sync::Mutex<Vec<(Instant, String)>>>);

impl lease_run::AcquireObserver for Trace {
    fn progress(&mut self, p: lease_run::Progress<'_>) {
        let what = match p {
            lease_run::Progress::Waiting { held, .. } => format!("held ({})", held.code),
            lease_run::Progress::Unavailable { error, .. } => {
                format!("unavailable ({})", error.code())
            }
            lease_run::Progress::Watching { watched, .. } => {
                format!("watching {} ms", watched.as_millis())
            }
            _ => "other".into(),
        };
        if let Ok(mut v) = self.0.lock() {
            v.push((Instant::now(), what));
        }
    }
}

pub(crate) fn failover(
    cluster: &cluster::Cluster,
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    cfg: &Cfg,
    figures: &mut Vec<Figure>,
) {
    let policy = fast_policy();
    let (mut total, mut owned) = (Vec::new(), Vec::new());
    for r in 0..cfg.failovers() {
        let prefix = format!("b-fail-{r}");
        let o = opts(cluster, &prefix, policy);
        let a = dir.join(format!("fail-{r}-a")).join("job");
        let b = dir.join(format!("fail-{r}-b")).join("job");
        // Host A on a runtime of its own, which dies with it.
        let rt_a = tokio::runtime::Runtime::new().expect("runtime of host A");
        let run_a = open_run(&rt_a, &a, o.clone());
        let batches: Vec<Batch> = (0..100).map(|i| put(format!("k{i}"))).collect();
        run_a
            .store()
            .commit_group(&batches)
            .expect("host A commits");
        // Host B: a standby already waiting to take over when A goes stale.
        std::fs::create_dir_all(&b).expect("host B's folder");
        let trace = Trace::default();
        let standby = rt.spawn({
            let (b, o, mut trace) = (b.clone(), o.clone(), trace.clone());
            async move {
                let (run, _) = Run::acquire(
                    &b,
                    Acquire::TakeoverWhenStale,
                    Wait::Until(Instant::now() + Duration::from_secs(60)),
                    o,
                    &mut trace,
                )
                .await
                .expect("host B takes over");
                let at = Instant::now();
                run.commit(put("after".into()))
                    .await
                    .expect("host B's first commit");
                (run, at, Instant::now())
            }
        });
        // Let B see A alive first (a standby watching a fresh owner).
        std::thread::sleep(Duration::from_millis(800));
        let died = Instant::now();
        run_a.suspend_heartbeats();
        std::mem::forget(run_a);
        rt_a.shutdown_background();
        let (run_b, at, committed) = rt.block_on(standby).expect("standby task");
        if let Ok(events) = trace.0.lock() {
            // What the standby reported after A's death.
            let shown: Vec<String> = events
                .iter()
                .filter(|(t, _)| *t >= died)
                .map(|(t, what)| format!("{} ms {what}", t.duration_since(died).as_millis()))
                .collect();
            eprintln!(
                "engine_store failover {r}: standby after A's death: {}",
                shown.join(", ")
            );
        }
        let head = run_b.store().head().expect("head");
        assert_eq!(head, 101, "host B sees A's 100 commits and its own");
        total.push(committed.duration_since(died).as_secs_f64() * 1e6);
        owned.push(at.duration_since(died).as_secs_f64() * 1e6);
        release_run(rt, run_b);
    }
    eprintln!(
        "engine_store failover ({} rounds): death -> first commit on B {:?} ms; death -> B owns {:?} ms",
        total.len(),
        total.iter().map(|x| (x / 1e3).round()).collect::<Vec<_>>(),
        owned.iter().map(|x| (x / 1e3).round()).collect::<Vec<_>>()
    );
    let stale = policy.stale_after().as_secs_f64() * 1e6;
    push(
        figures,
        Figure {
            key: "failover",
            what: "owner's death to the first commit on the new host (median)".into(),
            median: median(total),
            baseline: "stale_after",
            baseline_median: stale,
            unit: Unit::Us,
            target: None,
            target_min: None,
        },
    );
    push(
        figures,
        Figure {
            key: "failover_owned",
            what: "owner's death to the new host's acquire returning (median)".into(),
            median: median(owned),
            baseline: "stale_after",
            baseline_median: stale,
            unit: Unit::Us,
            target: None,
            target_min: None,
        },
    );
}
