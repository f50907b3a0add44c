//! Where the lease lives: the run folder (lease-fs's `RunDir`, the default) or, with the
//! cargo feature `etcd`, an etcd cluster (lease-etcd's `EtcdRun`).
//!
//! [`LeaseAuthority`] is the set of lease operations lease-run (and the `runlease` CLI)
//! needs; `run/` has one code path over it. `run.json`, the command records, the kernel
//! owner lock and the cgroup stay in the run folder whatever the authority. The store
//! follows the lease into an engine ([`LeaseAuthority::commits_in_engine`], issue #32):
//! with etcd every commit is a record etcd creates under its guard, and the run folder
//! keeps only a view of them.
//!
//! With etcd, "dead" is judged by the owner's etcd lease (lease-etcd's liveness probe),
//! not by probing a pid, and every heartbeat is bounded by the self-fence deadline: a hung
//! cluster makes the owner fence, never hang.

use crate::error::RunError;
#[cfg(feature = "etcd")]
use lease_core::ops::{OwnedLease, TakeoverParams};
use lease_core::ops::{Request, Response};
use lease_core::{RunId, TailHint, Transport};
use lease_fs::RunDir;
use std::time::{Duration, Instant};

/// Which authority holds a run's lease ([`crate::OpenOptions::authority`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Authority {
    /// The run folder itself (`lease/`, `events/`, ... beside `run.json`): the default.
    #[default]
    RunFolder,
    /// An etcd cluster (`etcd://host:port[,host:port...]/prefix`); the run's keys are
    /// `/<prefix>/<run id>/...`, the run id being the run folder's name.
    #[cfg(feature = "etcd")]
    Etcd(lease_etcd::AuthorityAddr),
}

impl Authority {
    /// Parse an `etcd://host:port[,host:port...]/prefix` address (`AUTHORITY_INVALID`,
    /// 64, naming what is wrong).
    #[cfg(feature = "etcd")]
    pub fn parse_etcd(text: &str) -> Result<Authority, RunError> {
        Ok(Authority::Etcd(lease_etcd::AuthorityAddr::parse(text)?))
    }

    /// The value passed to commands as `RUNLEASE_AUTHORITY` (the `etcd://` URL), `None`
    /// for the run folder.
    pub fn url(&self) -> Option<String> {
        match self {
            Authority::RunFolder => None,
            #[cfg(feature = "etcd")]
            Authority::Etcd(addr) => Some(etcd_url(addr)),
        }
    }

    /// The lease of run `run_id` under this authority. `folder` is used for
    /// [`Authority::RunFolder`] (it *is* the authority then). With etcd a connection is
    /// made with the deadlines of `EtcdLease::options`: an operation of an open or
    /// release step ends by `step_deadline / 2`, so it answers `UNAVAILABLE` (69) before
    /// the step's own `STEP_TIMEOUT`; one attempt of one call by at most half of that and
    /// of `self_fence_after` (so a heartbeat can still retry another member before the
    /// self-fence deadline, which bounds every heartbeat). Blocking.
    pub fn connect(
        &self,
        folder: std::sync::Arc<RunDir>,
        run_id: RunId,
        step_deadline: Duration,
        self_fence_after: Duration,
    ) -> Result<std::sync::Arc<dyn LeaseAuthority>, RunError> {
        let _ = (&run_id, step_deadline, self_fence_after);
        match self {
            Authority::RunFolder => Ok(std::sync::Arc::new(FolderAuthority(folder))),
            #[cfg(feature = "etcd")]
            Authority::Etcd(addr) => Ok(std::sync::Arc::new(EtcdLease::connect(
                addr,
                run_id,
                EtcdLease::options(step_deadline, self_fence_after),
            )?)),
        }
    }
}

/// The `etcd://host:port,.../prefix` form of an address (as given, endpoints in order).
#[cfg(feature = "etcd")]
pub fn etcd_url(addr: &lease_etcd::AuthorityAddr) -> String {
    let hosts: Vec<&str> = addr
        .endpoints
        .iter()
        .map(|e| e.strip_prefix("http://").unwrap_or(e))
        .collect();
    format!("etcd://{}/{}", hosts.join(","), addr.prefix)
}

/// The lease of one run, whichever authority holds it: a lease-core [`Transport`] with
/// lease-run's error type and an [`Instant`] as the bound of an operation, so every
/// operation of [`lease_core::LeaseOps`] (claim ... prune, written once in lease-core)
/// runs on it. The implementations only carry requests and hooks: [`FolderAuthority`]
/// (lease-fs's `RunDir`) and, with feature `etcd`, [`EtcdLease`].
///
/// Every call blocks; the etcd implementation may be called from async code too (each
/// call runs on a thread of its own, see `EtcdLease`). The folder ignores the bound (the
/// caller bounds the blocking call); etcd answers `UNAVAILABLE` by it at the latest.
pub trait LeaseAuthority:
    Transport<Error = RunError, Bound = Instant> + Send + Sync + std::fmt::Debug
{
    /// `run folder` or the `etcd://` URL, for messages.
    fn describe(&self) -> String;

    /// The run folder, when it is the authority (for the temp-file collection of
    /// [`crate::compact`]); `None` for etcd.
    fn folder(&self) -> Option<&RunDir> {
        None
    }

    /// Whether the run's store is committed in this authority (docs/PROTOCOL.md §18): an
    /// engine (etcd) creates every commit as a guarded record and the local SQLite file
    /// is only a view (`store/view.sqlite`); the run folder keeps `store/run.sqlite`.
    fn commits_in_engine(&self) -> bool {
        false
    }
}

/// The run folder as the authority ([`Authority::RunFolder`]): lease-fs's `RunDir`
/// transport with its errors as [`RunError`]s.
#[derive(Debug, Clone)]
pub struct FolderAuthority(pub std::sync::Arc<RunDir>);

impl Transport for FolderAuthority {
    type Error = RunError;
    type Bound = Instant;
    fn run_id(&self) -> &RunId {
        self.0.run_id()
    }
    fn default_bound(&self) -> Instant {
        // Unused by the folder: each request is one blocking call.
        Instant::now()
    }
    fn execute(&self, req: Request, _bound: Instant) -> Result<Response, RunError> {
        Ok(Transport::execute(&*self.0, req, ())?)
    }
    fn tail_hint(&self) -> &TailHint {
        Transport::tail_hint(&*self.0)
    }
    fn begin(&self) -> Result<(), RunError> {
        Ok(Transport::begin(&*self.0)?)
    }
    fn clock_domain(&self) -> Option<lease_core::Identity> {
        Transport::clock_domain(&*self.0)
    }
}

impl LeaseAuthority for FolderAuthority {
    fn describe(&self) -> String {
        "run folder".into()
    }
    fn folder(&self) -> Option<&RunDir> {
        Some(&self.0)
    }
}

/// A run's lease in etcd ([`Authority::Etcd`]): lease-etcd's `EtcdRun` behind
/// [`LeaseAuthority`].
///
/// lease-etcd blocks on a private runtime, which panics when done on an async worker
/// thread, and its runtime may not be dropped there either. So every call here runs on a
/// scoped thread of its own (callable from async code; callers still use
/// `spawn_blocking` so the runtime is not blocked), and dropping hands the connection to a
/// plain thread.
#[cfg(feature = "etcd")]
pub struct EtcdLease {
    run: Option<lease_etcd::EtcdRun>,
    authority: Option<lease_etcd::EtcdAuthority>,
    url: String,
    run_id: RunId,
}

#[cfg(feature = "etcd")]
impl std::fmt::Debug for EtcdLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLease")
            .field("url", &self.url)
            .field("run_id", &self.run_id)
            .finish()
    }
}

#[cfg(feature = "etcd")]
impl EtcdLease {
    /// The deadlines for open/release steps of `step_deadline` and heartbeats of an
    /// owner that self-fences after `self_fence_after`: an etcd operation ends by
    /// `step_deadline / 2`; one attempt of one call by the least of half of that, half of
    /// `self_fence_after` and 1 s. (Heartbeats take their overall deadline from the
    /// self-fence deadline.)
    pub fn options(step_deadline: Duration, self_fence_after: Duration) -> lease_etcd::EtcdOptions {
        let op = (step_deadline / 2).max(Duration::from_millis(10));
        let call = (op / 2)
            .min(self_fence_after / 2)
            .min(Duration::from_secs(1))
            .max(Duration::from_millis(10));
        lease_etcd::EtcdOptions {
            call_timeout: call,
            op_timeout: op,
            connect_timeout: call,
        }
    }

    /// Connect to the cluster at `addr` for run `run_id` (see [`EtcdLease::options`]).
    pub fn connect(
        addr: &lease_etcd::AuthorityAddr,
        run_id: RunId,
        opts: lease_etcd::EtcdOptions,
    ) -> Result<EtcdLease, RunError> {
        let (a, r) = (addr.clone(), run_id.clone());
        let (authority, run) = std::thread::scope(|s| {
            s.spawn(move || {
                let authority = lease_etcd::EtcdAuthority::connect(&a, opts)?;
                let run = authority.run(r);
                Ok::<_, lease_etcd::EtcdError>((authority, run))
            })
            .join()
            .map_err(|_| RunError::Internal("the etcd connect thread panicked".into()))
        })??;
        Ok(EtcdLease {
            run: Some(run),
            authority: Some(authority),
            url: etcd_url(addr),
            run_id,
        })
    }

    /// The lease-etcd handle.
    pub fn etcd_run(&self) -> &lease_etcd::EtcdRun {
        self.run.as_ref().expect("present until drop")
    }

    /// Run `f` on the handle on a scoped thread (see the type's docs).
    fn on_thread<T: Send>(
        &self,
        f: impl FnOnce(&lease_etcd::EtcdRun) -> Result<T, lease_etcd::EtcdError> + Send,
    ) -> Result<T, RunError> {
        let run = self.etcd_run();
        std::thread::scope(|s| {
            s.spawn(|| f(run)).join().map_err(|_| {
                RunError::Internal(format!("an etcd call thread panicked ({})", self.url))
            })
        })?
        .map_err(RunError::from)
    }
}

#[cfg(feature = "etcd")]
impl Drop for EtcdLease {
    fn drop(&mut self) {
        let (run, authority) = (self.run.take(), self.authority.take());
        // Its runtime must not be dropped on an async worker thread.
        let _ = std::thread::Builder::new()
            .name("lease-etcd-drop".into())
            .spawn(move || drop((run, authority)));
    }
}

#[cfg(feature = "etcd")]
impl Transport for EtcdLease {
    type Error = RunError;
    type Bound = Instant;
    fn run_id(&self) -> &RunId {
        &self.run_id
    }
    fn default_bound(&self) -> Instant {
        self.etcd_run().default_bound()
    }
    fn execute(&self, req: Request, bound: Instant) -> Result<Response, RunError> {
        self.on_thread(|r| r.execute(req, bound))
    }
    fn tail_hint(&self) -> &TailHint {
        self.etcd_run().tail_hint()
    }
    fn before_takeover(&self, p: &TakeoverParams, bound: Instant) -> Result<(), RunError> {
        self.on_thread(|r| r.before_takeover(p, bound))
    }
    fn acquired(&self, lease: &OwnedLease, bound: Instant) -> Result<(), RunError> {
        self.on_thread(|r| r.acquired(lease, bound))
    }
    fn before_heartbeat(&self, lease: &OwnedLease, bound: Instant) -> Result<(), RunError> {
        self.on_thread(|r| r.before_heartbeat(lease, bound))
    }
    fn released(&self, lease: &OwnedLease) {
        let _ = self.on_thread(|r| {
            r.released(lease);
            Ok(())
        });
    }
}

#[cfg(feature = "etcd")]
impl LeaseAuthority for EtcdLease {
    fn describe(&self) -> String {
        self.url.clone()
    }
    fn commits_in_engine(&self) -> bool {
        true
    }
}

#[cfg(all(test, feature = "etcd"))]
mod tests {
    use super::*;

    #[test]
    fn etcd_urls_round_trip_and_step_deadlines_split() {
        let url = "etcd://127.0.0.1:2379,node-2:2380/runlease/prod";
        let addr = lease_etcd::AuthorityAddr::parse(url).unwrap();
        assert_eq!(etcd_url(&addr), url);
        assert_eq!(Authority::Etcd(addr).url().as_deref(), Some(url));
        assert_eq!(Authority::RunFolder.url(), None);
        let o = EtcdLease::options(Duration::from_secs(10), Duration::from_secs(15));
        assert_eq!(o.op_timeout, Duration::from_secs(5));
        assert_eq!(o.call_timeout, Duration::from_secs(1));
        let o = EtcdLease::options(Duration::from_millis(1000), Duration::from_secs(15));
        assert_eq!(o.op_timeout, Duration::from_millis(500));
        assert_eq!(o.call_timeout, Duration::from_millis(250));
        let o = EtcdLease::options(Duration::from_secs(10), Duration::from_millis(900));
        assert_eq!(o.call_timeout, Duration::from_millis(450));
    }
}
