//! `verify`, `doctor` and `prune`: check the chains, diagnose (lease-core decides, this words it), compact.

use crate::diagnosis::{
    TEMP_MIN_AGE_SECS, next_argv, render_detail, render_next, render_next_as, short_tail_text,
};
use crate::error::CliError;
use crate::open::{open_lease, open_run};
use crate::output::Out;
use crate::stamps::{cli_identity, wall_now};
use crate::text::{Quoting, shell_path};
use lease_core::LeaseOps;
use lease_core::diagnose::diagnose;
use lease_core::ops::PruneParams;
use lease_run::Authority as RunAuthority;
use serde_json::json;
use std::path::Path;

/// One doctor finding as printed.
struct Finding {
    code: &'static str,
    severity: &'static str,
    detail: String,
    /// The next step for `--json` (`next_step`: POSIX quoting, [`Quoting::Sh`]).
    next: String,
    /// The next step for a terminal, to be pasted ([`Quoting::Terminal`]: a word with a
    /// control or bidi character as `$'...'`), from the same vector.
    next_human: String,
    next_argv: Option<Vec<String>>,
}

/// `runlease verify DIR`: both hash chains, and the folder's layout as every writer judges
/// it (`lease_run::admission::check_layout`); 65 on `CHAIN_BROKEN`/`EVENT_LOG_GAP`/invalid
/// records/`RUN_LAYOUT_INVALID`, 77 on a file that is not ours.
pub fn verify(dir: &Path, authority: &RunAuthority, out: Out) -> Result<i32, CliError> {
    let opened = open_lease(dir, authority, None)?;
    let run = &*opened.auth;
    let r = run.verify()?;
    // What every writer refuses in the folder's layout, verify refuses too (issue #28: it
    // said ok for a folder in lease/intents/, a FIFO in commands/, lease/intents a file).
    if let Some(folder) = &opened.folder {
        lease_run::admission::check_layout(folder)?;
    }
    // And a chain that is whole but rolled back (run.json or the newest event ahead of it):
    // every writer refuses it, so verify does not call it ok.
    opened.refuse_rolled_back()?;
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

/// `runlease doctor DIR [--clean-temp]`: findings with stable codes and one next step each.
/// Exit 0 unless a finding is a data error (`INVALID_RECORD`, `BROKEN_CHAIN`: 65).
pub fn doctor(dir: &Path, clean_temp: bool, out: Out) -> Result<i32, CliError> {
    let run = open_run(dir)?;
    // Refused (77) before anything is read or removed, like every other subcommand.
    run.check_root_files()?;

    let mut cleaned = None;
    if clean_temp {
        cleaned = Some(run.clean_temp_files(TEMP_MIN_AGE_SECS)?);
    }
    // lease-run gathers the facts (reads only); lease-core's diagnosis decides what they
    // mean; this only words them.
    let facts = lease_run::diagnosis::gather_facts(&run, wall_now()?)?;
    let view = &facts.view;
    let findings: Vec<_> = diagnose(&facts)
        .iter()
        .map(|f| Finding {
            code: f.code.as_str(),
            severity: f.severity.as_str(),
            detail: render_detail(f, view),
            next: render_next(&f.next, dir),
            next_human: render_next_as(&f.next, dir, None, Quoting::Terminal),
            // doctor is folder-only: no --authority to carry.
            next_argv: next_argv(&f.next, dir, None),
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
                "next_step_argv": null,
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
                "next_step_argv": f.next_argv,
            }));
        } else {
            out.line(&format!("{:<18} {}", f.code, f.detail));
            out.line(&format!("{:<18} next: {}", "", f.next_human));
        }
    }
    Ok(exit)
}

/// `runlease prune DIR [--keep N]`.
pub fn prune(dir: &Path, authority: &RunAuthority, keep: u64, out: Out) -> Result<i32, CliError> {
    let opened = open_lease(dir, authority, None)?;
    let run = &*opened.auth;
    // Refuse an invalid head up front, even when there would be nothing to prune: bad
    // input on disk is reported, never passed over with exit 0. Nor on a rolled-back chain
    // (issue #28: the admission rule's rollback evidence): it would fold older cutoffs
    // into a checkpoint and remove what shows what happened.
    opened.refuse_rolled_back()?;
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
            None if r.removed > 0 => out.line(&format!(
                "{}: nothing to compact (at most {} generations above the checkpoint floor); removed {} stray file(s) below the floor",
                dir.display(),
                keep.max(2),
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
