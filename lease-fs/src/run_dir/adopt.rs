//! Adopting a folder as a run: what an existing folder is (a run, empty, foreign), the one
//! place a run folder is laid out ([`RunDir::init`]), and a run's id from its path.

use super::{LAYOUT_DIRS, RunDir, open_error};
use crate::error::FsError;
use crate::fs::Fs;
use lease_core::canonical::MAX_RECORD_BYTES;
use lease_core::{FileRef, RunId};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// What `runlease run` would refuse of the folder `fs` holds, opened at `path`
/// ([`RunDir::adoption_refusal`]): a foreign folder, or an empty one that is the current
/// folder, one of its parents or `/`.
fn adoption_refusal_in(
    path: &Path,
    fs: &crate::real::RealFs,
    run_id: &RunId,
) -> Result<Option<FsError>, FsError> {
    Ok(match judge_existing(path, fs, run_id)? {
        Judged::Foreign(refusal) => Some(refusal),
        Judged::Empty if is_special_folder(path, fs) => Some(special_refusal(path)),
        Judged::Run | Judged::Empty => None,
    })
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
        adoption_refusal_in(path, &fs, &run_id)
    }

    /// [`RunDir::adoption_refusal`] of this opened folder, judged through its held root
    /// (no second lookup of its path); `None` over a simulated file system.
    pub fn adoption_refusal_held(&self) -> Result<Option<FsError>, FsError> {
        let Some(fs) = &self.real else {
            return Ok(None);
        };
        adoption_refusal_in(&self.root, fs, &self.run_id)
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
}
