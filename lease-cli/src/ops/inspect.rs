//! `status`, `list` and `init`: read a run (or a folder of runs) and say what it is; and
//! how one run's status is rendered (`status_json`, `status_human`: `status` and `list`).

use crate::diagnosis::{next_argv, render_next_as, run_json_facts, torn_beat_text};
use crate::error::CliError;
use crate::holder::{age_clock, age_human, policy_human, policy_json};
use crate::open::{Lease, init_run, open_lease};
use crate::output::Out;
use crate::stamps::wall_now;
use crate::text::{Quoting, human_ms};
use lease_core::ops::{Expectation, Head, Status, StatusView};
use lease_core::{Code, EpochState};
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
fn not_a_run(run: &Lease, facts: &FolderFacts) -> Option<NotARun> {
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
                        folder_facts(&run, &view),
                    )
                });
                let not_a_run = not_a_run(&run, &facts);
                if out.json {
                    let url = authority.url();
                    let mut v = status_json(
                        dir,
                        run.run_id().as_str(),
                        &view,
                        run_status(&run),
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
                    let mut lines = status_human(dir, &view, &run_status(&run), &facts);
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
    let done = init_run(dir, true)?;
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
                        run_status(&run),
                        &folder_facts(&run, &view),
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
                    // The error object of every subcommand, naming the run (as `status`).
                    out.json_line(
                        &e.with_extra(json!({"run": dir.display().to_string()}))
                            .json(),
                    );
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

/// What `status` knows of the run folder beyond the lease, for its next step.
#[derive(Debug, Clone, Default)]
pub struct FolderFacts {
    /// Whether `store/run.sqlite` exists (`None`: no folder here, or not looked at).
    pub store_present: Option<bool>,
    /// What the next claim would refuse before writing (`lease_run::diagnosis::claim_refusal`).
    pub claim_refusal: Option<(lease_core::Code, String)>,
    /// What `runlease run` would refuse of the folder itself (`RUN_FOLDER_FOREIGN`).
    pub adoption_refusal: Option<String>,
    /// The head's cutoff, due but never written (`None`: none open, or not looked at).
    pub open_cutoff: Option<lease_core::diagnose::OpenCutoff>,
}

/// What `status` looks at in the folder of `run` beyond the lease, for its next step
/// ([`FolderFacts`]); nothing when there is no folder here.
pub fn folder_facts(run: &Lease, view: &StatusView) -> FolderFacts {
    let Some(f) = run.folder.as_ref() else {
        return FolderFacts::default();
    };
    // Whether `store/run.sqlite` exists (beneath the held root, without following a
    // symlink): a store the chain names but this folder lacks makes the next
    // `runlease run` refuse (`STORE_MISSING`) before it claims.
    let store_present = f.fs().exists(lease_core::layout::STORE_FILE).ok();
    // What the next claim or replacement would refuse before writing (its preflight,
    // the verify walk, records above the head): only when the next step would be one
    // (a free, stale or dead run), so polling a live owner stays cheap. An I/O error
    // here leaves it unknown; the claim itself reports it.
    let claim_refusal = match view.status {
        Status::Free | Status::Stale | Status::Dead => {
            lease_run::diagnosis::claim_refusal(f, view).ok().flatten()
        }
        _ => None,
    };
    // A folder `runlease run` would refuse as not a run (RUN_FOLDER_FOREIGN): its next
    // step is `runlease init`, not a claim that would be refused.
    let adoption_refusal = match view.status {
        Status::Free => lease_run::diagnosis::adoption_refusal(f),
        _ => None,
    };
    // The head's cutoff, due but never written (a crash between a release's,
    // takeover's or retirement's epoch and its cutoff): shown, since the released
    // owner's acknowledged events read `pending` until the next change of owner
    // finalizes it (issue #28). One existence check, where the lease lives.
    let open_cutoff = view.head.as_ref().and_then(|h| {
        lease_core::diagnose::open_cutoff_of(&h.epoch, |g| {
            !matches!(
                lease_core::LeaseOps::perform(
                    &*run.auth,
                    lease_core::ops::Request::Exists(lease_core::FileRef::Cutoff(g))
                ),
                Ok(lease_core::ops::Response::Exists(false))
            )
        })
    });
    FolderFacts {
        store_present,
        claim_refusal,
        adoption_refusal,
        open_cutoff,
    }
}

/// [`run_status_json`] of the folder of `run`, `null` when there is no folder here.
pub fn run_status(run: &Lease) -> Value {
    run.folder
        .as_ref()
        .map_or(Value::Null, |f| run_status_json(f))
}

/// Name of an epoch state.
pub fn epoch_state_name(s: EpochState) -> &'static str {
    match s {
        EpochState::Active => "active",
        EpochState::Released => "released",
        EpochState::Retired => "retired",
    }
}

/// The next step `status` prints: lease-core's [`next_step`](lease_core::diagnose::next_step)
/// for the view and `run.json` (a free run the next `runlease run` would refuse needs
/// doctor first), worded as a command.
pub fn status_next_step(
    view: &StatusView,
    dir: &Path,
    run_status: &Value,
    folder: &FolderFacts,
) -> String {
    render_next_as(
        &status_next(view, run_status, folder),
        dir,
        None,
        Quoting::Terminal,
    )
}

/// lease-core's one next step for what `status` read (`folder`: [`folder_facts`]).
fn status_next(
    view: &StatusView,
    run_status: &Value,
    folder: &FolderFacts,
) -> lease_core::diagnose::Next {
    let mut facts = lease_core::diagnose::Facts::of_view(view.clone());
    facts.run_json = run_json_facts(run_status);
    facts.store_present = folder.store_present;
    facts.claim_refusal = folder.claim_refusal.clone();
    facts.adoption_refusal = folder.adoption_refusal.clone();
    lease_core::diagnose::next_step(&facts)
}

/// What `run.json` says (written by `runlease run` through lease-run: `running`, `paused`,
/// `done`, `failed` and the writer's generation), as the `run_status` JSON value: `null`
/// when there is none; `status: "invalid"` with the error (naming the file) as `detail`
/// when it cannot be read or decoded (reported, never repaired).
pub fn run_status_json(run: &lease_run::folder::RunDir) -> Value {
    match lease_run::diagnosis::read_run_json(run) {
        Ok(None) => Value::Null,
        Ok(Some(r)) => json!({
            "status": match r.status {
                lease_core::RunState::Running => "running",
                lease_core::RunState::Paused => "paused",
                lease_core::RunState::Done => "done",
                lease_core::RunState::Failed => "failed",
            },
            "generation": r.generation.get(),
            "detail": r.detail,
            "sealed_sequence": r.sealed_sequence,
            "updated_at": r.updated_at.to_string(),
        }),
        Err(detail) => json!({"status": "invalid", "generation": null, "detail": detail,
                              "sealed_sequence": null, "updated_at": null}),
    }
}

/// One human line for [`run_status_json`]'s value (`None` when there is no `run.json`).
pub fn run_status_human(v: &Value) -> Option<String> {
    let st = v.get("status")?.as_str()?;
    let mut line = st.to_string();
    if let Some(g) = v["generation"].as_u64() {
        line.push_str(&format!(" (generation {g}"));
        if let Some(seq) = v["sealed_sequence"].as_u64() {
            line.push_str(&format!(", store sealed at {seq}"));
        }
        line.push(')');
    }
    if let Some(d) = v["detail"].as_str() {
        line.push_str(&format!(": {d}"));
    }
    Some(line)
}

/// The status of one run as a JSON object (schema `runlease/cli/status/1`); `run_status`
/// is [`run_status_json`]'s value.
/// `authority` is the `--authority` URL when the lease is not in the run folder (it goes
/// into `next_step_argv`).
pub fn status_json(
    dir: &Path,
    run_id: &str,
    view: &StatusView,
    run_status: Value,
    folder: &FolderFacts,
    authority: Option<&str>,
) -> Value {
    let head = view.head.as_ref();
    let active = head.is_some_and(Head::is_active);
    let expect = head.filter(|h| h.is_active()).map(Expectation::of);
    let next = status_next(view, &run_status, folder);
    let (liveness, dead) = match &view.liveness {
        None => (Value::Null, Value::Null),
        Some(Ok(())) => (json!("definitely dead"), json!(true)),
        Some(Err(why)) => (json!(why), json!(false)),
    };
    let error = match &view.status {
        Status::Invalid(e) => {
            json!({"code": e.code(), "message": e.to_string()})
        }
        _ => Value::Null,
    };
    json!({
        "schema": "runlease/cli/status/1",
        "run": dir.display().to_string(),
        "run_id": run_id,
        "state": view.status.name(),
        "generation": head.map(|h| h.generation().get()),
        "epoch_state": head.map(|h| epoch_state_name(h.epoch.state)),
        "owner_id": head.map(|h| h.epoch.owner_id.to_string()),
        "host": head.map(|h| h.epoch.holder.host.to_string()),
        "boot_id": head.map(|h| h.epoch.holder.boot_id.to_string()),
        "pid": head.map(|h| h.epoch.holder.pid),
        "since": head.map(|h| h.epoch.claimed_at.to_string()),
        "heartbeat_at": head.filter(|_| active).map(|h| h.heartbeat_at().to_string()),
        "heartbeat_age_ms": view.judged_age_ms(),
        "heartbeat_age_clock": age_clock(view),
        "heartbeat_count": head.filter(|_| active).map(Head::heartbeat_count),
        "heartbeat_torn": head.filter(|_| active).map(|h| h.torn_beat.is_some()),
        "policy": head.map(|h| policy_json(&h.epoch.policy)),
        "dead": dead,
        "liveness": liveness,
        "expect_owner": expect.as_ref().map(|e| e.owner_id.to_string()),
        "expect_heartbeat": expect.as_ref().map(|e| e.heartbeat_at.to_string()),
        "expect_generation": expect.as_ref().and_then(|e| e.generation).map(|g| g.get()),
        "expect_count": expect.as_ref().and_then(|e| e.heartbeat_count),
        "next_step": render_next_as(&next, dir, authority, Quoting::Sh),
        "next_step_argv": next_argv(&next, dir, authority),
        "error": error,
        "run_status": run_status,
        "open_cutoff": folder.open_cutoff.as_ref().map(|o| json!({
            "retired": o.retired.get(),
            "by": o.by.get(),
            "file": lease_core::FileRef::Cutoff(o.retired).path(),
        })),
    })
}

/// The status of one run as aligned human lines (`run_status`: [`run_status_json`]).
pub fn status_human(
    dir: &Path,
    view: &StatusView,
    run_status: &Value,
    folder: &FolderFacts,
) -> Vec<String> {
    let mut l = vec![format!("{}: {}", dir.display(), view.status.name())];
    let mut row = |k: &str, v: String| l.push(format!("  {k:<11}{v}"));
    if let Some(mut line) = run_status_human(run_status) {
        // `running` for a generation the chain has moved past (its owner crashed, or a
        // replacement died before rewriting run.json): say so (PROTOCOL §4: out of date).
        let head = view.head.as_ref().map(|h| h.generation().get());
        if let (Some("running"), Some(g), Some(h)) = (
            run_status["status"].as_str(),
            run_status["generation"].as_u64(),
            head,
        ) {
            if g < h {
                line.push_str(&format!(
                    " (out of date: the lease chain moved on to generation {h}; the state below is the chain's)"
                ));
            }
        }
        row("run.json", line);
    }
    match &view.head {
        None => {
            if let Status::Invalid(e) = &view.status {
                row("error", e.code().prefixed(e));
            } else {
                row("generation", "none (never claimed)".into());
            }
        }
        Some(h) => {
            let e = &h.epoch;
            row(
                "generation",
                format!("{} ({})", h.generation(), epoch_state_name(e.state)),
            );
            if h.is_active() {
                row("owner", e.owner_id.to_string());
                row(
                    "holder",
                    format!(
                        "host {}, pid {}, boot {}",
                        e.holder.host, e.holder.pid, e.holder.boot_id
                    ),
                );
                row("since", e.claimed_at.to_string());
                row(
                    "heartbeat",
                    format!(
                        "{} (age {}, #{})",
                        h.heartbeat_at(),
                        age_human(view),
                        h.heartbeat_count()
                    ),
                );
                if h.torn_beat.is_some() {
                    row("", torn_beat_text(h));
                }
                row("policy", policy_human(&e.policy));
                match &view.liveness {
                    Some(Ok(())) => row("liveness", "definitely dead".into()),
                    Some(Err(why)) => row("liveness", format!("not proven dead: {why}")),
                    None => {}
                }
            } else {
                let what = match e.state {
                    EpochState::Retired => "retired a dead owner",
                    _ => "released",
                };
                row(
                    "last",
                    format!("{what} by {} at {}", e.owner_id, e.claimed_at),
                );
            }
        }
    }
    if let Some(o) = &folder.open_cutoff {
        row(
            "cutoff",
            format!(
                "open: generation {}'s cutoff ({}) was never written after generation {} replaced it (a crash in between); its events read pending until the next change of owner (the step below) finalizes it",
                o.retired,
                lease_core::FileRef::Cutoff(o.retired).path(),
                o.by
            ),
        );
    }
    row("next", status_next_step(view, dir, run_status, folder));
    l
}
