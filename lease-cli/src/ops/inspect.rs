//! `status`, `list` and `init`: read a run (or a folder of runs) and say what it is.

use crate::common::{
    CliError, Lease, Out, human_ms, open_lease, status_human, status_json, wall_now,
};
use lease_core::Code;
use lease_core::ops::StatusView;
use lease_run::Authority as RunAuthority;
use serde_json::{Value, json};
use std::path::Path;

/// Read one run's status (liveness probed).
fn read_status(dir: &Path, authority: &RunAuthority) -> Result<(Lease, StatusView), CliError> {
    let run = open_lease(dir, authority, None)?;
    if let Some(f) = &run.folder {
        // run.json and owner.lock of another uid or open to others: refused (77), not read.
        f.check_root_files()?;
    }
    // A lease folder whose layout is refused reads as `invalid` with that refusal (a state,
    // a finding and a repair), not only an error (issue #28).
    let view = lease_run::admission::status_view(&*run.auth, wall_now()?, true)?;
    Ok((run, view))
}

/// A command record whose live process cannot be proved ours (PROTOCOL §11.1).
struct Unproven {
    file: String,
    pid: u32,
    why: String,
}

/// The command records `status` reports: those the next `runlease run` would refuse over
/// (`RUN_COMMAND_UNPROVEN`). Reads `/proc` only; signals nothing.
fn unproven_commands(
    run: &lease_run::folder::RunDir,
) -> Result<Vec<Unproven>, lease_run::RunError> {
    Ok(lease_run::audit_commands(run)?
        .into_iter()
        .filter_map(|a| match a.state {
            lease_run::CommandState::Unproven { why } => Some(Unproven {
                file: a.file,
                pid: a.pid,
                why,
            }),
            _ => None,
        })
        .collect())
}

/// `status`'s state of a folder that is not a run (issue #28: it said `free`).
const NOT_A_RUN: &str = "not_a_run";

/// Why a folder is not a run, and what `runlease init` would refuse of it.
struct NotARun {
    /// `RUN_FOLDER_FOREIGN`.
    code: Code,
    /// Why `runlease run` refuses it (names what is there).
    message: String,
    /// What `runlease init`, the next step otherwise, would refuse (`CODE: message`).
    init_refused: Option<String>,
}

/// Whether the folder of `run` is not a run and `runlease run` refuses it
/// (`RUN_FOLDER_FOREIGN`: not empty and no `lease/epochs/`, or `.`, `..`, `/`), as lease-fs
/// judges it for `run` (`adoption_refusal_held`), and what `init` would refuse of it
/// (`init_refusal_held`: its own checks before writing). Read-only. An empty folder is a
/// run to be: `run` makes it one, so it stays `free` with the claim as its next step.
fn not_a_run(run: &Lease, facts: &crate::common::FolderFacts) -> Option<NotARun> {
    // Judged only where status judged the folder free (a run is never refused so).
    facts.adoption_refusal.as_ref()?;
    let f = run.folder.as_deref()?;
    let e = f.adoption_refusal_held().ok()??;
    Some(NotARun {
        code: e.code(),
        message: e.to_string(),
        init_refused: f.init_refusal_held().map(|e| e.code().prefixed(&e)),
    })
}

/// The next step when `runlease init` would refuse the folder too: a repair by hand.
fn init_refused_step(refused: &str) -> String {
    format!(
        "it is not a run and `runlease run` refuses it (RUN_FOLDER_FOREIGN); `runlease init` would refuse it too ({refused}): move that out of the way (or make it yours and private), or use a new folder"
    )
}

/// [`status_human`]'s lines for a folder that is not a run: the state says so, the reason
/// replaces "never claimed", and the next step says what `init` would refuse (escaped for
/// the terminal by `Out::line`, as every line).
fn not_a_run_human(lines: &mut [String], dir: &Path, n: &NotARun) {
    if let Some(first) = lines.first_mut() {
        *first = format!("{}: not a run", dir.display());
    }
    for l in lines.iter_mut() {
        if l.starts_with("  generation ") {
            *l = format!("  {:<11}{}", "why", n.code.prefixed(&n.message));
        } else if let (true, Some(refused)) = (l.starts_with("  next "), &n.init_refused) {
            *l = format!("  {:<11}{}", "next", init_refused_step(refused));
        }
    }
}

/// `runlease status DIR...`: exit 0 when every status could be read (an invalid run is a
/// status, printed, not a failure); otherwise the exit code of the first run that could
/// not be read.
pub fn status(
    dirs: &[std::path::PathBuf],
    authority: &RunAuthority,
    out: Out,
) -> Result<i32, CliError> {
    let mut exit = 0;
    for (i, dir) in dirs.iter().enumerate() {
        match read_status(dir, authority) {
            Ok((run, view)) => {
                // The records shown and the admission rule's judgement of them share one
                // scan of /proc (issue #29).
                let (unproven, facts) = lease_run::one_proc_scan(|| {
                    (
                        run.folder.as_deref().map(unproven_commands),
                        run.folder_facts(&view),
                    )
                });
                let not_a_run = not_a_run(&run, &facts);
                if out.json {
                    let url = authority.url();
                    let mut v = status_json(
                        dir,
                        run.run_id().as_str(),
                        &view,
                        run.run_status(),
                        &facts,
                        url.as_deref(),
                    );
                    if let Some(n) = &not_a_run {
                        v["state"] = json!(NOT_A_RUN);
                        v["error"] = json!({"code": n.code, "message": n.message});
                        if let Some(refused) = &n.init_refused {
                            v["next_step"] = json!(init_refused_step(refused));
                            v["next_step_argv"] = Value::Null;
                        }
                    }
                    if let Some(u) = &unproven {
                        v["unproven_commands"] = match u {
                            Ok(list) => json!(
                                list.iter()
                                    .map(|a| json!({"file": a.file, "pid": a.pid, "why": a.why}))
                                    .collect::<Vec<_>>()
                            ),
                            Err(e) => json!({"error": e.code().prefixed(e)}),
                        };
                    }
                    out.json_line(&v);
                } else {
                    if i > 0 {
                        out.line("");
                    }
                    let mut lines = status_human(dir, &view, &run.run_status(), &facts);
                    if let Some(n) = &not_a_run {
                        not_a_run_human(&mut lines, dir, n);
                    }
                    for l in lines {
                        out.line(&l);
                    }
                    match &unproven {
                        Some(Ok(list)) => {
                            for a in list {
                                out.line(&format!(
                                    "  unproven: {} names live pid {}, which runlease cannot prove it started ({}); it is left alone, and the next `runlease run` refuses until you stop that process yourself (if it is this run's old command) or remove the record (if it is not)",
                                    a.file, a.pid, a.why
                                ));
                            }
                        }
                        Some(Err(e)) => {
                            out.line(&format!("  command records: {}", e.code().prefixed(e)));
                        }
                        None => {}
                    }
                }
            }
            Err(e) => {
                let e = e.with_extra(json!({"run": dir.display().to_string()}));
                e.report(&out);
                if exit == 0 {
                    exit = e.exit;
                }
            }
        }
    }
    Ok(exit)
}

/// `runlease init DIR`: make DIR a run explicitly (an existing non-empty folder too); on a
/// run it only adds missing layout folders. Refuses (77) before any write when DIR, an
/// existing layout folder, `run.json` or `owner.lock` is not ours or open to others.
pub fn init(dir: &Path, out: Out) -> Result<i32, CliError> {
    let done = crate::common::init_run(dir, true)?;
    let run_id = done.run.run_id().to_string();
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/init/1",
            "ok": true,
            "run": dir.display().to_string(),
            "run_id": run_id,
            "found": done.found.name(),
            "created": done.created,
        }));
    } else {
        let what = match done.found {
            lease_run::folder::Found::Missing => "created the run folder",
            lease_run::folder::Found::Empty => "made the empty folder a run",
            lease_run::folder::Found::Run => "already a run",
            lease_run::folder::Found::Foreign => {
                "made the existing folder a run (what was there is untouched)"
            }
        };
        let created = if done.created.is_empty() {
            "nothing created".to_string()
        } else {
            format!("created {}", done.created.join(", "))
        };
        out.line(&format!(
            "{}: {what} (run id {run_id}; {created})",
            dir.display()
        ));
    }
    Ok(0)
}

/// `runlease list FOLDER`: one row per immediate subfolder holding a `lease/epochs/` folder.
pub fn list(folder: &Path, out: Out) -> Result<i32, CliError> {
    let entries = std::fs::read_dir(folder).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            CliError::of(
                Code::RunNotFound,
                format!("folder {} does not exist", folder.display()),
            )
        } else if e.kind() == std::io::ErrorKind::NotADirectory {
            CliError::usage(format!(
                "{} is not a folder: list takes the folder that holds run folders",
                folder.display()
            ))
        } else {
            CliError::of(
                Code::IoError,
                format!("cannot list {}: {e}", folder.display()),
            )
        }
    })?;
    let mut dirs: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        // Never follow symlinks: a run folder that is a symlink is refused anyway. A run
        // holds `lease/epochs/` (`RunDir::init`'s test), looked up beneath the folder.
        .filter(|p| lease_run::folder::is_run_folder(p).unwrap_or(false))
        .collect();
    dirs.sort();
    if !out.json {
        out.line(&format!(
            "{:<24} {:<8} {:>5} {:<36} {:<16} {:>7} {:>14}",
            "RUN", "STATE", "GEN", "OWNER", "HOST", "PID", "HEARTBEAT AGE"
        ));
    }
    for dir in &dirs {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match read_status(dir, &RunAuthority::RunFolder) {
            Ok((run, view)) => {
                if out.json {
                    out.json_line(&status_json(
                        dir,
                        run.run_id().as_str(),
                        &view,
                        run.run_status(),
                        &run.folder_facts(&view),
                        None,
                    ));
                    continue;
                }
                let h = view.head.as_ref();
                let active = h.is_some_and(|h| h.is_active());
                out.line(&format!(
                    "{:<24} {:<8} {:>5} {:<36} {:<16} {:>7} {:>14}",
                    name,
                    view.status.name(),
                    h.map_or("-".into(), |h| h.generation().to_string()),
                    h.filter(|_| active)
                        .map_or("-".into(), |h| h.epoch.owner_id.to_string()),
                    h.filter(|_| active)
                        .map_or("-".into(), |h| h.epoch.holder.host.to_string()),
                    h.filter(|_| active)
                        .map_or("-".into(), |h| h.epoch.holder.pid.to_string()),
                    view.judged_age_ms().map_or("-".into(), human_ms),
                ));
            }
            Err(e) => {
                if out.json {
                    out.json_line(&json!({
                        "schema": "runlease/cli/error/1",
                        "ok": false,
                        "run": dir.display().to_string(),
                        "code": e.code,
                        "message": e.message,
                        "exit_code": e.exit,
                    }));
                } else {
                    out.line(&format!("{name:<24} error    {}: {}", e.code, e.message));
                }
            }
        }
    }
    if dirs.is_empty() && !out.json {
        out.line(&format!("(no runs below {})", folder.display()));
    }
    Ok(0)
}
