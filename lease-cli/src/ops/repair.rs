//! `verify`, `doctor` and `prune`: check the chains, diagnose (lease-core decides, this words it), compact.

use crate::common::{
    CliError, Out, cli_identity, open_lease, run_status_json, shell_path, wall_now,
};
use crate::diagnosis::{
    TEMP_MIN_AGE_SECS, render_detail, render_next, run_json_facts, short_tail_text,
};
use lease_core::Code;
use lease_core::Dir;
use lease_core::LeaseOps;
use lease_core::diagnose::{CommandFacts, Facts, VerifyFacts, diagnose};
use lease_core::ops::{PruneParams, Status};
use lease_run::Authority as RunAuthority;
use serde_json::json;
use std::path::Path;

/// One doctor finding as printed.
struct Finding {
    code: &'static str,
    severity: &'static str,
    detail: String,
    next: String,
}

/// `runlease verify DIR`: both hash chains; 65 on `CHAIN_BROKEN`/`EVENT_LOG_GAP`/invalid
/// records.
pub fn verify(dir: &Path, authority: &RunAuthority, out: Out) -> Result<i32, CliError> {
    let opened = open_lease(dir, authority, None)?;
    let run = &*opened.auth;
    let r = run.verify()?;
    let strays: Vec<u64> = r.strays.iter().map(|g| g.get()).collect();
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/verify/1",
            "ok": true,
            "run": dir.display().to_string(),
            "epochs": r.epochs,
            "events": r.events,
            "floor": r.floor.map(|g| g.get()),
            "strays": strays,
            "short_tail": r.short_tail.as_ref().map(|t| json!({
                "named": t.named,
                "by_cutoff_of": t.by_cutoff_of.map(|g| g.get()),
                "tail": t.tail,
            })),
        }));
    } else {
        out.line(&format!(
            "{}: ok: {} epochs and {} events checked{}{}{}",
            dir.display(),
            r.epochs,
            r.events,
            r.floor
                .map(|f| format!(", checkpoint floor {f}"))
                .unwrap_or_default(),
            if strays.is_empty() {
                String::new()
            } else {
                format!(
                    ", stray epochs below the floor: {strays:?} (runlease prune {} removes them)",
                    shell_path(dir)
                )
            },
            r.short_tail
                .as_ref()
                .map(|t| format!(
                    "; note: {} (runlease doctor {} says what it means)",
                    short_tail_text(t),
                    shell_path(dir)
                ))
                .unwrap_or_default()
        ));
    }
    Ok(0)
}

/// One line for verify's `short_tail`: the log ends before a sequence the chain names.
/// Count `.tmp-*` files (total, older than the grace) in the run's protocol folders.
fn count_temp_files(fs: &dyn lease_fs::fs::Fs) -> (usize, usize) {
    let (mut total, mut old) = (0, 0);
    for d in Dir::ALL.iter().map(|d| d.path()).chain([""]) {
        // Beneath the held root; a missing or refused folder has nothing to count.
        let mut temps = Vec::new();
        let listed = fs.for_each_name(d, &mut |name| {
            if name.starts_with(lease_fs::primitives::TEMP_PREFIX) {
                temps.push(lease_fs::fs::join(d, name));
            }
        });
        if listed.is_err() {
            continue;
        }
        for t in temps {
            total += 1;
            if fs
                .age_secs(&t)
                .ok()
                .flatten()
                .is_some_and(|a| a >= TEMP_MIN_AGE_SECS)
            {
                old += 1;
            }
        }
    }
    (total, old)
}

/// `runlease doctor DIR [--clean-temp]`: findings with stable codes and one next step each.
/// Exit 0 unless a finding is a data error (`INVALID_RECORD`, `BROKEN_CHAIN`: 65).
pub fn doctor(dir: &Path, clean_temp: bool, out: Out) -> Result<i32, CliError> {
    let run = crate::common::open_run(dir)?;
    // Refused (77) before anything is read or removed, like every other subcommand.
    run.check_root_files()?;

    let mut cleaned = None;
    if clean_temp {
        cleaned = Some(run.clean_temp_files(TEMP_MIN_AGE_SECS)?);
    }
    // Gather the facts (reads only); lease-core's diagnosis decides what they mean.
    let view = run.status(wall_now()?, true)?;
    let mut facts = Facts::of_view(view.clone());
    facts.temp_files = count_temp_files(&**run.fs());
    facts.verify = match run.verify() {
        Ok(r) => VerifyFacts::Held(r),
        Err(e)
            if matches!(
                e.code(),
                Code::ChainBroken
                    | Code::EventLogGap
                    | Code::RecordInvalid
                    | Code::SchemaUnsupported
            ) =>
        {
            VerifyFacts::Failed {
                code: e.code(),
                message: e.to_string(),
            }
        }
        Err(e) => return Err(e.into()),
    };
    // run.json (written by `runlease run`): reported when unreadable, never repaired.
    facts.run_json = run_json_facts(&run_status_json(&run));
    // Command records (read by the next `runlease run` to reap a killed incarnation's
    // commands): one it cannot read, or one naming a process it cannot prove, refuses
    // the run.
    facts.commands = match crate::common::check_command_records(&run) {
        Ok(()) => CommandFacts::Clean,
        Err(e) if e.code == Code::RunCommandUnproven.as_str() => CommandFacts::Unproven {
            message: format!("{}: {}", e.code, e.message),
        },
        Err(e) if e.exit != 65 => return Err(e),
        Err(e) => CommandFacts::Invalid {
            message: format!("{}: {}", e.code, e.message),
        },
    };
    // The store is never opened: its owner holds it exclusively, and opening a WAL
    // database may run SQLite's recovery, a write, which doctor never does. Its presence
    // is looked at beneath the held root, without following a symlink.
    facts.store_present = run.fs().exists(lease_core::layout::STORE_FILE).ok();
    facts.stray_names = run.stray_names()?;
    let findings: Vec<_> = diagnose(&facts)
        .iter()
        .map(|f| Finding {
            code: f.code.as_str(),
            severity: f.severity.as_str(),
            detail: render_detail(f, &view),
            next: render_next(&f.next, dir),
        })
        .collect();
    let exit = if findings.iter().any(|f| f.severity == "error") {
        65
    } else {
        0
    };
    if let Some(n) = cleaned {
        if out.json {
            out.json_line(&json!({
                "schema": "runlease/cli/doctor/1",
                "run": dir.display().to_string(),
                "code": "TEMP_FILES_REMOVED",
                "severity": "info",
                "detail": format!("removed {n} temp file(s) older than {TEMP_MIN_AGE_SECS} s"),
                "count": n,
                "next_step": null,
            }));
        } else {
            out.line(&format!(
                "removed {n} temp file(s) older than {TEMP_MIN_AGE_SECS} s"
            ));
        }
    }
    for f in &findings {
        if out.json {
            out.json_line(&json!({
                "schema": "runlease/cli/doctor/1",
                "run": dir.display().to_string(),
                "code": f.code,
                "severity": f.severity,
                "detail": f.detail,
                "next_step": f.next,
            }));
        } else {
            out.line(&format!("{:<18} {}", f.code, f.detail));
            out.line(&format!("{:<18} next: {}", "", f.next));
        }
    }
    Ok(exit)
}

/// `runlease prune DIR [--keep N]`.
pub fn prune(dir: &Path, authority: &RunAuthority, keep: u64, out: Out) -> Result<i32, CliError> {
    let opened = open_lease(dir, authority, None)?;
    let run = &*opened.auth;
    // Refuse an invalid head up front, even when there would be nothing to prune: bad
    // input on disk is reported, never passed over with exit 0.
    if let Status::Invalid(e) = run.status(wall_now()?, false)?.status {
        return Err(e.into());
    }
    let r = run.prune(PruneParams {
        run_id: run.run_id().clone(),
        keep,
        by: cli_identity("prune"),
        now: wall_now()?,
    })?;
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/prune/1",
            "ok": true,
            "run": dir.display().to_string(),
            "keep": keep.max(2),
            "floor": r.floor.map(|g| g.get()),
            "removed": r.removed,
        }));
    } else {
        match r.floor {
            Some(f) => out.line(&format!(
                "{}: checkpoint floor {f}; removed {} file(s)",
                dir.display(),
                r.removed
            )),
            None => out.line(&format!(
                "{}: nothing to prune (at most {} generations)",
                dir.display(),
                keep.max(2)
            )),
        };
    }
    Ok(0)
}
