//! The lease, the event log and the run folder on disk: lease-core's operations driven
//! over an [`Fs`].

mod adopt;
mod liveness;
mod request;

use crate::error::FsError;
use crate::fs::Fs;
use crate::primitives;
use lease_core::ops::{Request, Response};
use lease_core::{Dir, FileRef, Identity, RunId, TailHint, Transport};
use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use adopt::{Found, Initialized, run_id_held, run_id_of};
pub use liveness::{Liveness, ProcLiveness, boottime_ns, this_holder};
pub use request::{Exec, prim_response, start_request};

/// A run folder: the lease, the event log and the records, driven through an [`Fs`].
///
/// Every protocol operation re-checks first that the run root is still the directory that
/// was opened. The struct caches nothing that could go stale except which directories
/// exist and the tail of the event log (a hint, verified on use).
pub struct RunDir {
    fs: Arc<dyn Fs>,
    /// The same file system as `fs` when it is the real disk: the held root.
    real: Option<Arc<crate::real::RealFs>>,
    run_id: RunId,
    root: PathBuf,
    liveness: Arc<dyn Liveness>,
    dirs: Mutex<HashSet<&'static str>>,
    tail: TailHint,
}

impl std::fmt::Debug for RunDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunDir")
            .field("run_id", &self.run_id)
            .field("root", &self.root)
            .finish()
    }
}

/// The folders of a run's layout (parents first), created by [`RunDir::init`]. A folder
/// holding `lease/epochs/` is a run.
pub const LAYOUT_DIRS: [&str; 11] = [
    "lease",
    "lease/epochs",
    "lease/beats",
    "lease/cutoffs",
    "lease/intents",
    "lease/checkpoints",
    "events",
    "commands",
    "store",
    "work",
    "tmp",
];

impl RunDir {
    /// Open an existing run folder on the real disk. Fails at once (no retry) with
    /// `RUN_NOT_FOUND` if it does not exist.
    ///
    /// The folder is opened once (`O_NOFOLLOW|O_DIRECTORY`: a symlink as its last
    /// component is refused) and held; everything after goes through that descriptor
    /// ([`RunDir::real_fs`] hands it on).
    pub fn open(path: &Path) -> Result<RunDir, FsError> {
        let named = run_id_of(path)?;
        let fs = crate::real::RealFs::open(path).map_err(|e| open_error(&named, path, e))?;
        let run_id = run_id_held(path, &fs)?;
        Ok(RunDir::in_real(Arc::new(fs), run_id))
    }

    /// Open a run folder, creating it (and missing parents, 0700) if it does not exist.
    pub fn create(path: &Path) -> Result<RunDir, FsError> {
        let named = run_id_of(path)?;
        let fs = crate::real::RealFs::create(path).map_err(|e| open_error(&named, path, e))?;
        let run_id = run_id_held(path, &fs)?;
        Ok(RunDir::in_real(Arc::new(fs), run_id))
    }

    /// A run over the held root `fs` (opened by [`crate::RealFs::open`], or a
    /// [`crate::RealFs::try_clone`] of one): the liveness probe looks at the owner lock
    /// beneath that descriptor. Its path is `fs`'s, as given when opened.
    pub fn in_real(fs: Arc<crate::real::RealFs>, run_id: RunId) -> RunDir {
        let liveness = Arc::new(ProcLiveness::in_root(&fs));
        let root = fs.root_path().to_path_buf();
        let mut dir = RunDir::with_fs(fs.clone(), run_id, &root, liveness);
        dir.real = Some(fs);
        dir
    }

    /// The held root on the real disk, when this run was opened there (`None` over a
    /// simulated file system): how a step that needs the folder of its own (the owner
    /// lock, the store folder, an owner's open) reaches the very directory this one
    /// opened, without looking its path up again.
    pub fn real_fs(&self) -> Option<&Arc<crate::real::RealFs>> {
        self.real.as_ref()
    }

    /// Judge the root files runlease reads (`run.json`, `owner.lock`) when present: owned
    /// by us, no group/other bits (`RUN_NOT_OWNED`, 77, naming the file). Reads nothing.
    pub fn check_root_files(&self) -> Result<(), FsError> {
        for f in [
            FileRef::RunStatus.path(),
            crate::lock::LOCK_FILE.to_string(),
        ] {
            self.fs.exists(&f).map_err(|e| self.io("stat", &f, e))?;
        }
        Ok(())
    }

    /// A run over any [`Fs`] (the simulated one in tests) with the given liveness probe.
    pub fn with_fs(
        fs: Arc<dyn Fs>,
        run_id: RunId,
        root: &Path,
        liveness: Arc<dyn Liveness>,
    ) -> RunDir {
        RunDir {
            fs,
            real: None,
            run_id,
            root: root.to_path_buf(),
            liveness,
            dirs: Mutex::new(HashSet::new()),
            tail: TailHint::new(),
        }
    }

    /// Replace the liveness probe (e.g. after taking the owner lock).
    pub fn set_liveness(&mut self, liveness: Arc<dyn Liveness>) {
        self.liveness = liveness;
    }

    /// The run id.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The run folder's path as given when opened.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file system it runs on.
    pub fn fs(&self) -> &Arc<dyn Fs> {
        &self.fs
    }

    fn io(&self, op: &'static str, path: &str, e: io::Error) -> FsError {
        FsError::io(self.run_id.as_str(), op, path, e)
    }

    fn ensure_dir_of(&self, f: FileRef) -> Result<(), FsError> {
        let Some(dir) = f.dir() else { return Ok(()) };
        let path = dir.path();
        if self.dirs.lock().map(|d| d.contains(path)).unwrap_or(false) {
            return Ok(());
        }
        self.fs
            .ensure_dir(path)
            .map_err(|e| self.io("mkdir", path, e))?;
        if let Ok(mut d) = self.dirs.lock() {
            d.insert(path);
        }
        Ok(())
    }

    /// Carry out one request of a lease-core operation ([`Transport::execute`]): the
    /// directory of a created or replaced file is made on first use, reads make their one
    /// system call, writes step their primitive ([`start_request`]).
    fn execute_request(&self, req: Request) -> Result<Response, FsError> {
        if let Request::CreateExclusive(f, _) | Request::WriteBeat { file: f, .. } = &req {
            self.ensure_dir_of(*f)?;
        }
        let exec = start_request(&*self.fs, &*self.liveness, req, primitives::temp_path)
            .map_err(|(op, path, e)| self.io(op, &path, e))?;
        match exec {
            Exec::Ready(r) => Ok(r),
            Exec::Prim(prim, path) => {
                let kind = prim.kind();
                let outcome = prim.run(&*self.fs).map_err(|e| {
                    let op = match kind {
                        primitives::PrimKind::CreateExclusive => "create",
                        primitives::PrimKind::Replace => "replace",
                        primitives::PrimKind::WriteBeat => "write heartbeat",
                        primitives::PrimKind::Remove => "remove",
                    };
                    self.io(op, &path, e)
                })?;
                Ok(prim_response(kind, outcome))
            }
        }
    }

    /// Re-check that the root is still the directory opened ([`Transport::begin`]).
    fn check_root_unchanged(&self) -> Result<(), FsError> {
        self.fs.check_root().map_err(|e| {
            // `check_root` reports a changed root as a plain `Other` error without an OS
            // error code; anything else is an I/O failure of the check itself.
            if e.kind() == io::ErrorKind::Other
                && e.raw_os_error().is_none()
                && !crate::crash::is_simulated_crash(&e)
            {
                FsError::RootChanged {
                    path: self.root.display().to_string(),
                    detail: e.to_string(),
                }
            } else {
                self.io("check run root", "", e)
            }
        })
    }

    /// Remove orphaned temp files older than `min_age_secs` from every protocol folder, the
    /// root and `store/` ([`primitives::clean_temp_files`]: only our temp names, only regular
    /// files of the effective uid, never through a symlink).
    pub fn clean_temp_files(&self, min_age_secs: u64) -> Result<usize, FsError> {
        let mut n = 0;
        // `store/` holds the temp files of a store creation that crashed before its link.
        for dir in Dir::ALL.iter().map(|d| d.path()).chain(["", "store"]) {
            n += primitives::clean_temp_files(&*self.fs, dir, min_age_secs)
                .map_err(|e| self.io("clean", dir, e))?;
        }
        Ok(n)
    }

    /// Names in protocol folders that are neither valid names nor temp files (for doctor).
    pub fn stray_names(&self) -> Result<Vec<String>, FsError> {
        let mut out = Vec::new();
        for dir in Dir::ALL {
            // Streamed: only the strays are kept, not every name of a long log.
            self.fs
                .for_each_name(dir.path(), &mut |name| {
                    if dir.parse_name(name).is_none() && !primitives::is_temp_name(name) {
                        out.push(crate::fs::join(dir.path(), name));
                    }
                })
                .map_err(|e| self.io("list", dir.path(), e))?;
        }
        Ok(out)
    }
}

/// The run folder as a lease-core [`Transport`]: every operation of [`lease_core::LeaseOps`]
/// (claim ... prune) runs on it. Operations are not bounded here (`Bound = ()`): each
/// request is one blocking system call or primitive, and callers that need a deadline
/// run the call on a thread of their own.
impl Transport for RunDir {
    type Error = FsError;
    type Bound = ();
    fn run_id(&self) -> &RunId {
        &self.run_id
    }
    fn default_bound(&self) {}
    fn execute(&self, req: Request, _bound: ()) -> Result<Response, FsError> {
        self.execute_request(req)
    }
    fn tail_hint(&self) -> &TailHint {
        &self.tail
    }
    fn begin(&self) -> Result<(), FsError> {
        self.check_root_unchanged()
    }
    fn clock_domain(&self) -> Option<Identity> {
        self.liveness.clock_domain()
    }
}

pub(crate) fn open_error(run: &RunId, path: &Path, e: io::Error) -> FsError {
    if e.kind() == io::ErrorKind::NotFound {
        FsError::RunNotFound {
            path: path.display().to_string(),
        }
    } else {
        FsError::io(
            run.as_str(),
            "open run folder",
            &path.display().to_string(),
            e,
        )
    }
}
