//! The lease, the event log and the run folder on disk: lease-core's operations driven
//! over an [`Fs`].

use crate::error::FsError;
use crate::fs::Fs;
use crate::primitives;
use lease_core::canonical::MAX_RECORD_BYTES;
use lease_core::ops::{
    AuthorityLease, Durability, LivenessEvidence, LockEvidence, ProcessState, Request, Response,
};
use lease_core::{Dir, FileRef, Holder, Identity, RunId, TailHint, Transport};
use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Gathers liveness evidence about a recorded holder (see `lease_core::ops::definitely_dead`).
pub trait Liveness: Send + Sync {
    /// Evidence about `holder`.
    fn probe(&self, holder: &Holder) -> LivenessEvidence;

    /// The answer to [`Request::Monotonic`]: this process's `CLOCK_BOOTTIME` in ns (it keeps
    /// counting while the machine sleeps, so a suspended taker's window shows its pause).
    /// A simulation overrides it with its own clock.
    fn monotonic_ns(&self) -> u64 {
        boottime_ns()
    }

    /// The name of the clock [`Liveness::monotonic_ns`] reads (see
    /// [`crate::probe::clock_domain`]); a simulation names its own.
    fn clock_domain(&self) -> Option<Identity> {
        crate::probe::clock_domain()
    }
}

/// `CLOCK_BOOTTIME` in nanoseconds (0 if the clock cannot be read: a window then reads as
/// empty, never as a pause).
pub fn boottime_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Liveness on this machine: boot id, `/proc/<pid>/stat` start time and the run's kernel
/// owner lock.
#[derive(Debug, Clone)]
pub struct ProcLiveness {
    root: PathBuf,
    /// The held descriptor of the run root, when the run was opened: the owner lock is
    /// probed in it (`openat`), never by looking `root` up again.
    held: Option<Arc<rustix::fd::OwnedFd>>,
    /// Set when the caller itself holds the owner lock (it took it, so no other live
    /// process on this boot does).
    self_holds_lock: bool,
}

impl ProcLiveness {
    /// Probe liveness for the run at `root` (the owner lock looked up by that path at
    /// each probe; a run already opened uses [`ProcLiveness::in_root`]).
    pub fn new(root: impl Into<PathBuf>) -> ProcLiveness {
        ProcLiveness {
            root: root.into(),
            held: None,
            self_holds_lock: false,
        }
    }

    /// Probe liveness for the run whose root `fs` holds: the owner lock is probed beneath
    /// that descriptor.
    pub fn in_root(fs: &crate::real::RealFs) -> ProcLiveness {
        ProcLiveness {
            root: fs.root_path().to_path_buf(),
            held: Some(fs.root_shared()),
            self_holds_lock: false,
        }
    }

    /// The caller holds the run's owner lock: report it free for any other holder.
    pub fn holding_lock(mut self) -> ProcLiveness {
        self.self_holds_lock = true;
        self
    }
}

impl Liveness for ProcLiveness {
    fn probe(&self, holder: &Holder) -> LivenessEvidence {
        let observer_boot_id = crate::probe::boot_id()
            .ok()
            .and_then(|b| Identity::new(b).ok())
            .unwrap_or_else(|| {
                Identity::new("unknown-boot").unwrap_or_else(|_| holder.boot_id.clone())
            });
        let process = match crate::probe::live_process_start_time(holder.pid) {
            Ok(None) => ProcessState::Gone,
            Ok(Some(start_time)) => ProcessState::Running { start_time },
            Err(_) => ProcessState::Unknown,
        };
        let owner_lock = if self.self_holds_lock {
            LockEvidence::Free
        } else {
            let probed = match &self.held {
                Some(fd) => {
                    use rustix::fd::AsFd;
                    crate::lock::probe_owner_lock_at(fd.as_fd(), &self.root)
                }
                None => crate::lock::probe_owner_lock(&self.root),
            };
            match probed {
                Ok(true) => LockEvidence::Free,
                Ok(false) => LockEvidence::Held,
                Err(_) => LockEvidence::Unknown,
            }
        };
        LivenessEvidence {
            observer_boot_id,
            process,
            owner_lock,
            lease: AuthorityLease::NotKept,
        }
    }
}

/// The identity of this process as a lease holder.
///
/// The host name must be a *word* ([`Identity::check_word`]: every record refuses another
/// holder host, `RECORD_INVALID`), so a host whose name breaks that rule is refused here,
/// before anything is written, with `ARGUMENT_INVALID` naming the host and the rule,
/// instead of a claim that fails while encoding its record.
pub fn this_holder() -> Result<Holder, FsError> {
    let (host, boot, pid, start) =
        crate::probe::current_holder_parts().map_err(|e| FsError::Io {
            run: "?".into(),
            op: "probe self",
            path: "/proc/self/stat".into(),
            source: e,
        })?;
    let ident = |what: &'static str, v: String| Identity::arg(what, v).map_err(FsError::from);
    Ok(Holder {
        host: holder_host(host)?,
        boot_id: ident("boot id", boot)?,
        pid,
        start_time: start,
    })
}

/// This host's name as a holder host: a word, or `ARGUMENT_INVALID` naming it.
fn holder_host(host: String) -> Result<Identity, FsError> {
    Identity::word("host name", host).map_err(|e| {
        FsError::from(lease_core::LeaseError::ArgumentInvalid {
            what: "host name",
            reason: format!(
                "this host's name cannot be recorded as a lease holder: {}; nothing was written. Rename the host (hostname(1)): every RFC 1123 host name is such a word",
                e.reason()
            ),
        })
    })
}

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

/// What [`RunDir::init`] judges of an existing folder before its first write: every
/// existing layout folder and the root files runlease reads.
fn judge_before_init(fs: &crate::real::RealFs, rid: &str) -> Result<(), FsError> {
    for d in LAYOUT_DIRS {
        fs.check_dir(d)
            .map_err(|e| FsError::io(rid, "open", d, e))?;
    }
    for f in [
        FileRef::RunStatus.path(),
        crate::lock::LOCK_FILE.to_string(),
    ] {
        fs.exists(&f).map_err(|e| FsError::io(rid, "stat", &f, e))?;
    }
    Ok(())
}

/// `.`, `..`, `/`: the folder we stand in or one holding it, judged on the held root by
/// identity (a walk up from the current folder by descriptor), never on a second lookup
/// of the path.
fn is_special_folder(path: &Path, fs: &crate::real::RealFs) -> bool {
    fs.is_cwd_or_ancestor() || path.parent().is_none()
}

fn special_refusal(path: &Path) -> FsError {
    FsError::FolderForeign {
        path: path.display().to_string(),
        detail: format!(
            "it is the current folder, one of its parents or / (after resolving the path) and not a run yet; such a folder becomes a run only explicitly, and nothing was written: `runlease init {}` (or `runlease run --init`), or name a new folder",
            path.display()
        ),
    }
}

/// What an existing folder is, for [`RunDir::init`] and [`RunDir::adoption_refusal`].
enum Judged {
    Run,
    Empty,
    /// Not empty and not a run: the refusal `init` makes without `explicit`.
    Foreign(FsError),
}

fn judge_existing(
    path: &Path,
    fs: &crate::real::RealFs,
    run_id: &RunId,
) -> Result<Judged, FsError> {
    let io = |op: &'static str, p: &str, e: io::Error| FsError::io(run_id.as_str(), op, p, e);
    if fs
        .has_run_marker()
        .map_err(|e| io("stat", "lease/epochs", e))?
        || names_this_run(fs, run_id)
    {
        return Ok(Judged::Run);
    }
    let mut names = fs.list("").map_err(|e| io("list", "", e))?;
    if names.is_empty() || only_empty_layout(fs, "", &names) {
        // Empty, or an `init` that has not finished: interrupted by a crash, or another
        // `runlease run` of the same new folder creating it right now (its `lease/` exists
        // before its `lease/epochs/`). Nothing of anyone else's is in it, so laying it out
        // goes on.
        return Ok(Judged::Empty);
    }
    names.sort();
    let shown: Vec<_> = names.iter().take(5).map(String::as_str).collect();
    let more = if names.len() > 5 { ", ..." } else { "" };
    Ok(Judged::Foreign(FsError::FolderForeign {
        path: path.display().to_string(),
        detail: format!(
            "the folder exists, is not empty ({} {}: {}{more}) and is not a run (it has no lease/epochs/ folder); runlease never adopts a folder it did not create, and nothing was written. If it really should become a run, `runlease init {}` (or `runlease run --init`) lays the run out beside what is there, changing no existing mode; otherwise use a new or empty folder",
            names.len(),
            if names.len() == 1 { "entry" } else { "entries" },
            shown.join(", "),
            path.display()
        ),
    }))
}

/// Whether every name in folder `dir` (listed: `names`) is a layout folder of
/// [`LAYOUT_DIRS`] holding nothing but, recursively, other empty layout folders: what an
/// unfinished [`RunDir::init`] leaves. Anything else (a file, a non-layout name, content,
/// a name that cannot be listed as a folder) is not.
fn only_empty_layout(fs: &crate::real::RealFs, dir: &str, names: &[String]) -> bool {
    names.iter().all(|n| {
        let path = crate::fs::join(dir, n);
        LAYOUT_DIRS.contains(&path.as_str())
            && fs
                .list(&path)
                .is_ok_and(|inner| only_empty_layout(fs, &path, &inner))
    })
}

/// Whether the root holds a `run.json` that is this run's `RunStatus` record (a run whose
/// `lease/` was deleted or lost is still a run: `runlease run` must report its broken chain,
/// not treat it as a foreign folder). An untrusted or unreadable file is not read as one.
fn names_this_run(fs: &crate::real::RealFs, run_id: &RunId) -> bool {
    let p = FileRef::RunStatus.path();
    matches!(fs.exists(&p), Ok(true))
        && fs
            .read(&p, MAX_RECORD_BYTES)
            .ok()
            .flatten()
            .is_some_and(|b| lease_core::decode_for::<lease_core::RunStatus>(run_id, &b).is_ok())
}

/// What [`RunDir::init`] found at the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Nothing: the folder (and missing parents) was created.
    Missing,
    /// An empty folder.
    Empty,
    /// A run already (it holds `lease/epochs/`).
    Run,
    /// A non-empty folder that was not a run (laid out because the caller said so).
    Foreign,
}

impl Found {
    /// Its name in output (`missing`, `empty`, `run`, `foreign`).
    pub fn name(self) -> &'static str {
        match self {
            Found::Missing => "missing",
            Found::Empty => "empty",
            Found::Run => "run",
            Found::Foreign => "foreign",
        }
    }
}

/// The result of [`RunDir::init`].
#[derive(Debug)]
pub struct Initialized {
    /// The run, opened.
    pub run: RunDir,
    /// What was there before.
    pub found: Found,
    /// The layout folders it created (relative paths), in order.
    pub created: Vec<&'static str>,
}

/// The run id of a run folder: its last path component.
pub fn run_id_of(path: &Path) -> Result<RunId, FsError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // `.` or a trailing `..` have no usable name: resolve it lexically (`std::path::absolute`
    // keeps `..`; the current folder's name is the kernel's, from `getcwd`). No lookup of
    // the path: a run that is opened takes its name from the held root instead
    // ([`run_id_held`]).
    let name = if !plain_last_component(path) {
        let resolved = std::path::absolute(path).ok().map(|abs| {
            let mut out = PathBuf::new();
            for c in abs.components() {
                match c {
                    std::path::Component::ParentDir => {
                        out.pop();
                    }
                    std::path::Component::CurDir => {}
                    other => out.push(other),
                }
            }
            out
        });
        resolved
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default()
    } else {
        name
    };
    Ok(RunId::new(name)?)
}

/// Whether the last component of `path` is a plain name (not `.`, `..` or none): then it
/// is the name of the folder an `O_NOFOLLOW` open of `path` opens.
fn plain_last_component(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy());
    !(name.is_none_or(|n| n.is_empty() || n == "." || n == "..") || path.ends_with(".."))
}

/// The run id of the run folder `fs` holds, opened at `path`: the last component of
/// `path` when it is a plain name (the open refused a symlink there, so it names the held
/// folder), else (`.`, `…/..`) the held folder's own name as the kernel has it
/// ([`crate::RealFs::held_name`]), falling back to [`run_id_of`]. Never a second lookup
/// of `path`.
pub fn run_id_held(path: &Path, fs: &crate::real::RealFs) -> Result<RunId, FsError> {
    if !plain_last_component(path) {
        if let Some(name) = fs
            .held_name()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        {
            return Ok(RunId::new(name)?);
        }
    }
    run_id_of(path)
}

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

    /// What `runlease run` ([`RunDir::init`] without `explicit`) would refuse of the folder
    /// `path`, read only (nothing is created or written): `Some(RUN_FOLDER_FOREIGN)` for an
    /// existing folder that is not empty and not a run, or that is the current folder, one
    /// of its parents or `/` and not a run; `None` when `run` would use it (a run, an
    /// empty folder, a missing one). `status` uses it so its next step works when run.
    pub fn adoption_refusal(path: &Path) -> Result<Option<FsError>, FsError> {
        let named = run_id_of(path)?;
        let fs = match crate::real::RealFs::open(path) {
            Ok(fs) => fs,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(open_error(&named, path, e)),
        };
        let run_id = run_id_held(path, &fs)?;
        let judged = judge_existing(path, &fs, &run_id)?;
        Ok(match judged {
            Judged::Foreign(refusal) => Some(refusal),
            Judged::Empty if is_special_folder(path, &fs) => Some(special_refusal(path)),
            Judged::Run | Judged::Empty => None,
        })
    }

    /// [`RunDir::adoption_refusal`] of this opened folder, judged through its held root
    /// (no second lookup of its path); `None` over a simulated file system.
    pub fn adoption_refusal_held(&self) -> Result<Option<FsError>, FsError> {
        let Some(fs) = &self.real else {
            return Ok(None);
        };
        Ok(match judge_existing(&self.root, fs, &self.run_id)? {
            Judged::Foreign(refusal) => Some(refusal),
            Judged::Empty if is_special_folder(&self.root, fs) => Some(special_refusal(&self.root)),
            Judged::Run | Judged::Empty => None,
        })
    }

    /// What `runlease init` ([`RunDir::init`] with `explicit`) would refuse of this opened
    /// folder once adopted, read only, by the very checks it makes before its first write:
    /// an existing layout folder ([`LAYOUT_DIRS`]) that is a symlink or not a folder
    /// (`RUN_LAYOUT_INVALID`-class refusals naming it), or that is not ours or open to
    /// others, and `run.json` or `owner.lock` not ours or open to others (`RUN_NOT_OWNED`,
    /// 77). `None` when it would lay the run out, or over a simulated file system. The root
    /// itself was judged when this folder was opened. `status` names it for a folder that
    /// is not a run, whose next step would otherwise be `init`.
    pub fn init_refusal_held(&self) -> Option<FsError> {
        judge_before_init(self.real.as_ref()?, self.run_id.as_str()).err()
    }

    /// Make `path` a run, or open it if it is one, for `runlease run` and `runlease init`:
    /// the one place a run folder is adopted.
    ///
    /// - A missing folder is created (and missing parents, 0700); an empty one is used.
    /// - A folder is **a run** when it holds a folder `lease/epochs/` (every claim creates
    ///   it, and so does this function), or a `run.json` that decodes as this run's record
    ///   (its `lease/` was lost); it is opened as it is (with `explicit`, missing layout
    ///   folders are added).
    /// - Any other existing folder (not empty, not a run), and the current folder, one of
    ///   its parents or `/` (after resolving the path) unless it is a run already, is
    ///   refused with `RUN_FOLDER_FOREIGN` (64) before anything is written, unless
    ///   `explicit` (the operator said so: `runlease init`, `run --init`).
    ///
    /// The root is judged first (owned by the effective uid, not group/other writable, else
    /// `RUN_NOT_OWNED`, 77), then every existing layout folder ([`LAYOUT_DIRS`]) and the
    /// root files runlease reads (`run.json`, `owner.lock`), all before the first write; only
    /// then are the missing layout folders created (0700, whatever the umask; not for a run
    /// unless `explicit`). No existing folder's mode is ever changed.
    pub fn init(path: &Path, explicit: bool) -> Result<Initialized, FsError> {
        let named = run_id_of(path)?;
        // The folder is opened (or created) once and held; it is judged, laid out and
        // returned through that descriptor, never looked up by path again.
        let (fs, created_root) =
            crate::real::RealFs::create_reporting(path).map_err(|e| open_error(&named, path, e))?;
        let run_id = run_id_held(path, &fs)?;
        let special = !created_root && is_special_folder(path, &fs);
        let rid = run_id.as_str();
        let io = |op: &'static str, p: &str, e: io::Error| FsError::io(rid, op, p, e);
        let found = if created_root {
            Found::Missing
        } else {
            match judge_existing(path, &fs, &run_id)? {
                Judged::Run => Found::Run,
                Judged::Empty => Found::Empty,
                Judged::Foreign(_) if explicit => Found::Foreign,
                Judged::Foreign(refusal) => return Err(refusal),
            }
        };
        if special && !explicit && found != Found::Run {
            return Err(special_refusal(path));
        }
        // Judge everything that exists before the first write.
        judge_before_init(&fs, rid)?;
        // A run is used as it is by `run` (its folders appear on first use, and a run whose
        // chain is gone must be reported, not repaired); `init` completes it.
        let mut created = Vec::new();
        if found != Found::Run || explicit {
            for d in LAYOUT_DIRS {
                if fs.ensure_dir(d).map_err(|e| io("mkdir", d, e))? {
                    created.push(d);
                }
            }
        }
        let run = RunDir::in_real(Arc::new(fs), run_id);
        Ok(Initialized {
            run,
            found,
            created,
        })
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
                && !crate::sim::is_simulated_crash(&e)
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

/// How one request is carried out.
#[derive(Debug, Clone)]
pub enum Exec {
    /// Answered by exactly one system call, already made.
    Ready(Response),
    /// Carried out by a primitive, one system call per step (with the target's path).
    Prim(primitives::PrimOp, String),
}

/// Start carrying out `req` on `fs`: read-only requests make their one system call now;
/// writes return the primitive to step. `tmp` names a temp file in a directory. Shared by
/// `RunDir`'s [`Transport::execute`] and the model checker, so both run the same order of calls.
/// Directories must exist (RunDir creates them on first use).
pub fn start_request(
    fs: &dyn Fs,
    liveness: &dyn Liveness,
    req: Request,
    tmp: impl FnOnce(&str) -> String,
) -> Result<Exec, (&'static str, String, io::Error)> {
    Ok(match req {
        // Every name that parses is judged as a record file (PROTOCOL §5.1: a directory,
        // symlink, FIFO, socket, device or oversize file named like a record is
        // `RUN_LAYOUT_INVALID`, the same error `Read` and `Exists` give for it).
        Request::List(dir) => {
            let mut refs = Vec::new();
            fs.list_records(
                dir.path(),
                MAX_RECORD_BYTES,
                &|n| dir.parse_name(n).is_some(),
                &mut |n| refs.extend(dir.parse_name(n)),
            )
            .map_err(|e| ("list", dir.path().to_string(), e))?;
            Exec::Ready(Response::Listing(refs))
        }
        Request::CountEvents => {
            // Streamed: no list of names is built, whatever the log's length.
            let (mut count, mut highest) = (0u64, 0u64);
            fs.list_records(
                Dir::Events.path(),
                MAX_RECORD_BYTES,
                &|n| Dir::Events.parse_name(n).is_some(),
                &mut |n| {
                    if let Some(FileRef::Event(s)) = Dir::Events.parse_name(n) {
                        count += 1;
                        highest = highest.max(s.get());
                    }
                },
            )
            .map_err(|e| ("list", Dir::Events.path().to_string(), e))?;
            Exec::Ready(Response::EventCount { count, highest })
        }
        Request::Read(f) => {
            let p = f.path();
            let content = fs.read(&p, MAX_RECORD_BYTES).map_err(|e| ("read", p, e))?;
            Exec::Ready(Response::Content(content))
        }
        Request::Exists(f) => {
            let p = f.path();
            let exists = fs
                .exists_record(&p, MAX_RECORD_BYTES)
                .map_err(|e| ("stat", p, e))?;
            Exec::Ready(Response::Exists(exists))
        }
        Request::CreateExclusive(f, bytes) => {
            let p = f.path();
            let t = tmp(crate::fs::split(&p).0);
            Exec::Prim(primitives::PrimOp::create_exclusive(&p, bytes, t), p)
        }
        Request::WriteBeat {
            file,
            seq,
            record,
            durability,
        } => {
            let p = file.path();
            let t = tmp(crate::fs::split(&p).0);
            // On a file system that can lose unsynced writes while the owner lives (NFS,
            // SMB, FUSE, …: `fstype`), every beat is made durable whatever the policy says
            // (PROTOCOL §5.3): a `local` beat lost there would make a live owner look stale.
            let durable = durability == Durability::Fsync || fs.loses_unsynced_writes();
            let prim =
                primitives::PrimOp::write_beat(&p, seq, &record, durable, t).map_err(|e| {
                    (
                        "write heartbeat",
                        p.clone(),
                        io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
                    )
                })?;
            Exec::Prim(prim, p)
        }
        Request::Remove(f, d) => {
            let p = f.path();
            Exec::Prim(primitives::PrimOp::remove(&p, d == Durability::Fsync), p)
        }
        Request::ProbeLiveness(h) => Exec::Ready(Response::Liveness(liveness.probe(&h))),
        // One `fsync` of the directory: every entry it holds now (the record the operation
        // read among them; its data was fsynced by its creator before the link) survives a
        // power loss from here on (PROTOCOL §7.0 SYNC).
        Request::SyncDir(dir) => {
            fs.fsync_dir(dir.path())
                .map_err(|e| ("fsync", dir.path().to_string(), e))?;
            Exec::Ready(Response::Done)
        }
        Request::Monotonic => Exec::Ready(Response::Monotonic(liveness.monotonic_ns())),
        // The engine-committed store (PROTOCOL §18) needs a create and a check of the
        // epochs made one atomic step, which a run folder cannot give: refused, nothing
        // written. A run folder keeps its store in SQLite (§2); the shared-disk record log
        // of issue #32 is not built yet.
        Request::CreateGuarded { file, .. } => {
            return Err((
                "create guarded",
                file.path(),
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    "a run folder cannot create a file and check the epochs in one atomic step; the engine-committed store needs an engine (--authority etcd://...)",
                ),
            ));
        }
        Request::ReplaceGuarded { file, .. } => {
            return Err((
                "replace guarded",
                file.path(),
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    "a run folder cannot replace a file and check the epochs in one atomic step; the run folder's run.json is written under the owner's checks instead",
                ),
            ));
        }
        Request::ReadStoreRecords { .. } => {
            return Err((
                "read store records",
                Dir::StoreLog.path().to_string(),
                io::Error::new(
                    io::ErrorKind::Unsupported,
                    "a run folder has no engine-committed store log; its store is store/run.sqlite",
                ),
            ));
        }
    })
}

/// The response to a finished primitive.
pub fn prim_response(kind: primitives::PrimKind, outcome: bool) -> Response {
    match (kind, outcome) {
        (primitives::PrimKind::CreateExclusive, true) => Response::Created,
        (primitives::PrimKind::CreateExclusive, false) => Response::AlreadyExists,
        _ => Response::Done,
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

#[cfg(test)]
mod holder_host_tests {
    use super::*;

    #[test]
    fn a_host_name_that_is_no_word_is_argument_invalid_naming_it() {
        assert_eq!(
            holder_host("vm-1.example".into()).unwrap().as_str(),
            "vm-1.example"
        );
        for bad in ["bad host", "-x", "a;b", "\u{202e}x"] {
            let e = holder_host(bad.into()).unwrap_err();
            assert_eq!(e.code(), lease_core::Code::ArgumentInvalid, "{bad}: {e}");
            let m = e.to_string();
            assert!(
                m.contains(&format!("{bad:?}")) && m.contains("host name"),
                "{m}"
            );
        }
    }
}
