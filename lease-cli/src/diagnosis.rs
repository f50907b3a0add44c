//! Rendering of lease-core's one diagnosis ([`lease_core::diagnose`]) as `runlease`
//! text: each [`Next`] as the command or step an operator types, each [`Finding`] as its
//! detail line. What a fact means is decided in lease-core; this module only words it.

use crate::holder::held_description;
use crate::text::{Quoting, command_line, human_ms, quote_word, shell_path_as};
use lease_core::diagnose::{Finding, NamedStore, Next, RunJsonFacts, Subject};
use lease_core::ops::StatusView;
use serde_json::Value;
use std::path::Path;

/// Temp files younger than this are never removed by `doctor --clean-temp`.
pub use lease_run::diagnosis::TEMP_MIN_AGE_SECS;

/// `run.json` as `status` prints it (its `run_status` value, ops/inspect.rs), as diagnosis
/// facts.
pub fn run_json_facts(v: &Value) -> RunJsonFacts {
    match v["status"].as_str() {
        None => RunJsonFacts::Absent,
        Some("invalid") => RunJsonFacts::Invalid {
            message: v["detail"]
                .as_str()
                .unwrap_or("run.json is invalid")
                .to_string(),
        },
        Some(status) => RunJsonFacts::Written {
            failed: status == "failed",
            generation: v["generation"].as_u64().unwrap_or(0),
            detail: v["detail"].as_str().map(str::to_string),
        },
    }
}

/// A next step as the operator does it, for the run folder `dir`, in the `--json` form
/// ([`Quoting::Sh`]) and without `--authority` (doctor's steps: doctor is folder-only).
pub fn render_next(next: &Next, dir: &Path) -> String {
    render_next_as(next, dir, None, Quoting::Sh)
}

/// A next step as the operator does it: a sentence whose command, where the step is one,
/// is [`next_argv`]'s vector (the same `--authority`, the same `--` before the run
/// folder) written by [`command_line`] with quoting `q`; nothing taken from a record or a
/// path is pasted into it as shell text.
pub fn render_next_as(next: &Next, dir: &Path, authority: Option<&str>, q: Quoting) -> String {
    let cmd = || {
        next_argv(next, dir, authority)
            .map(|argv| command_line(&argv, q))
            .unwrap_or_default()
    };
    // A path in prose (no `--` can protect it there): `shell_path`'s form, `./` before a
    // leading `-`.
    let path = |p: &Path| shell_path_as(p, q);
    let store = lease_core::layout::STORE_FILE;
    match next {
        Next::Claim => format!("claim it (runlease run {} -- COMMAND)", path(dir)),
        Next::Init => format!(
            "it is not a run and `runlease run` refuses it (RUN_FOLDER_FOREIGN): {} lays a run out beside what is there (changing nothing that exists), or use a new folder",
            cmd()
        ),
        Next::Wait => "wait, or ask the owner to release".into(),
        Next::WaitForLease => "wait: its etcd lease is alive (the cluster still hears the owner), whatever this host's wall clock says of its heartbeat; a takeover would be refused (76, TAKEOVER_ACTIVE_REFUSED) until that lease expires, stale_after after the owner's last keep-alive (then `runlease status` names the next step); or ask the owner to release".into(),
        Next::Takeover { .. } | Next::Retire | Next::CleanTemp | Next::Prune => cmd(),
        Next::ObserveAgain => format!("{} (observe again)", cmd()),
        Next::DoctorDoNotTakeOver => format!("{}; do not take over", cmd()),
        Next::DoctorBeforeRun => format!(
            "{} (the next `runlease run` would refuse this run; doctor names why)",
            cmd()
        ),
        Next::RepairRecord => {
            "repair or restore the named file by hand (keep a copy); do not take over".into()
        }
        Next::RepairRunJson => "repair or restore the named file by hand (keep a copy); `runlease run` refuses the run until then".into(),
        Next::RepairCommandRecord => "repair or restore the named file by hand (keep a copy; its command may still run: check its pid); `runlease run` refuses the run until then".into(),
        Next::RestoreLease => "restore lease/ from a backup (keep a copy of what is there now); `runlease run` refuses the run until then".into(),
        Next::VerifyAndRestore => format!(
            "{} names the first broken link; restore the files from a backup or archive the run",
            cmd()
        ),
        Next::RestoreStore => format!(
            "restore {store} from the copy the lease chain names (keep what is there now); `runlease run` refuses the run until then"
        ),
        Next::MoveStoreAside => format!(
            "move {} out of the run (keep it if it matters: it was created for another run, and this run's lease chain names no store); the next `runlease run` creates a new one",
            path(&dir.join(store))
        ),
        Next::CheckClocks => "check time synchronization on both hosts (PROTOCOL.md §10)".into(),
        Next::PowerLossOrRestoreEvents => "after a power loss this is expected (an event that was never acknowledged vanished; PROTOCOL.md §13); otherwise the log's tail was deleted: restore events/ from a backup".into(),
        Next::StopOrRemoveRecord => "stop the named process yourself if it is this run's old command, or remove the record if it is not (runlease never signals a process it cannot prove it started); `runlease run` refuses the run until then".into(),
        Next::MoveStrays => "move them out of the run folder by hand (every reader ignores them)".into(),
        // Paths are data: each quoted as a word, so the commands are safe to paste.
        Next::InspectCgroup { path: cg } => {
            let procs_file = quote_word(&format!("{cg}/cgroup.procs"), q);
            let cg = quote_word(cg, q);
            format!(
                "nothing is refused over it, and runlease never signals or removes it. If it is a leftover of this run, as its owner (or root): list its processes (cat -- {procs_file}), stop them yourself, then remove it (rmdir -- {cg}, which fails while it has members); otherwise leave it"
            )
        }
        Next::MoveCommandRecordsAside => {
            let commands = dir.join(lease_core::Dir::Commands.path());
            let aside = std::path::PathBuf::from(format!("{}.commands-aside", dir.display()));
            format!(
                "check that no command of the run still runs (ps -eo pid,args), then move the records out of the run (mv -- {} {}); `runlease run` refuses the run until then",
                quote_word(&commands.display().to_string(), q),
                quote_word(&aside.display().to_string(), q)
            )
        }
        Next::RepairFirst(then) => format!(
            "repair the error finding(s) first (takeover and retire refuse until then), then: {}",
            render_next_as(then, dir, authority, q)
        ),
        Next::WaitTempFiles => format!(
            "nothing now: they are younger than {TEMP_MIN_AGE_SECS} s, so a writer may still be using them (a clean-up removes none of them); if they are still there after that, {} removes them",
            command_line(
                &next_argv(&Next::CleanTemp, dir, authority).unwrap_or_default(),
                q
            )
        ),
        Next::Nothing => "nothing to do".into(),
        // A step added to lease-core before this renderer learns it: say its name.
        other => format!("{other:?}"),
    }
}

/// A next step as an argument vector a script can run as it is (`runlease`, the global
/// `--authority` when the lease is not in the run folder, the subcommand, its options,
/// then `--` and the run folder, so a folder named like an option is never read as one),
/// or `None` when the step is no single `runlease` command (wait, claim with a command of
/// your own, a repair by hand, or "repair first"). The sentence of the same step
/// ([`render_next_as`]) is written from this vector.
pub fn next_argv(next: &Next, dir: &Path, authority: Option<&str>) -> Option<Vec<String>> {
    // (subcommand and options, whether the lease's authority applies)
    let (head, with_authority): (Vec<String>, bool) = match next {
        Next::Takeover {
            owner_id,
            heartbeat_at,
        } => (
            vec![
                "takeover".into(),
                "--expect-owner".into(),
                owner_id.clone(),
                "--expect-heartbeat".into(),
                heartbeat_at.clone(),
            ],
            true,
        ),
        Next::ObserveAgain => (vec!["status".into()], true),
        Next::Retire => (vec!["retire".into()], true),
        Next::VerifyAndRestore => (vec!["verify".into()], true),
        // doctor, prune and init work on the run folder itself: no authority.
        Next::DoctorDoNotTakeOver | Next::DoctorBeforeRun => (vec!["doctor".into()], false),
        Next::CleanTemp => (vec!["doctor".into(), "--clean-temp".into()], false),
        Next::Prune => (vec!["prune".into()], false),
        Next::Init => (vec!["init".into()], false),
        _ => return None,
    };
    let mut argv = vec!["runlease".to_string()];
    if let (true, Some(url)) = (with_authority, authority) {
        argv.push("--authority".into());
        argv.push(url.to_string());
    }
    argv.extend(head);
    argv.push("--".into());
    argv.push(dir.display().to_string());
    Some(argv)
}

/// A finding's detail line.
pub fn render_detail(f: &Finding, view: &StatusView) -> String {
    match &f.subject {
        Subject::Run => format!("run is {}; nothing to repair", view.status.name()),
        Subject::TempFiles { total, old } => format!(
            "{total} temp file(s) (.tmp-*), {old} older than {TEMP_MIN_AGE_SECS} s; they never count, they only use space"
        ),
        Subject::Message(m) => m.clone(),
        Subject::Owner => held_description(view).0,
        Subject::FutureHeartbeat { head, ahead_ms } => format!(
            "the last heartbeat ({}) is {} ahead of this host's clock",
            head.heartbeat_at(),
            human_ms(*ahead_ms)
        ),
        Subject::StampAhead { head, ahead_ms } => format!(
            "the last heartbeat (generation {}, #{}) carries a monotonic stamp {} ahead of this host's own clock, which it names: no process on this clock wrote it, so the beat file was edited; it is ignored (the wall clock advises and a takeover watches the record first)",
            head.generation(),
            head.heartbeat_count(),
            human_ms(i64::try_from(*ahead_ms).unwrap_or(i64::MAX))
        ),
        Subject::TornHeartbeat { head } => torn_beat_text(head),
        Subject::ShortTail(t) => short_tail_text(t),
        Subject::StrayEpochs(g) => format!(
            "epochs below the checkpoint floor remain: {:?}",
            g.iter().map(|g| g.get()).collect::<Vec<_>>()
        ),
        Subject::StoreMissing { generation, named } => {
            let named = match named {
                NamedStore::Sealed {
                    sequence,
                    generation,
                    store_id,
                } => format!(
                    "sealed at sequence {sequence} by generation {generation} (store id {store_id})"
                ),
                NamedStore::Floor { floor, generation } => {
                    format!("a store floor of {floor} recorded by generation {generation}")
                }
            };
            format!(
                "{} is missing, but epoch {generation} names a store: {named}",
                lease_core::layout::STORE_FILE
            )
        }
        Subject::StoreRefused { generation, detail } => {
            format!("the last `runlease run` (generation {generation}) refused the store: {detail}")
        }
        Subject::OpenCutoff(open) => format!(
            "epoch {} ({}) superseded generation {}, but its cutoff ({}) was never written (a crash between the two, or the change of owner is writing it now): generation {}'s events read `pending`, neither counted nor refused, until the next change of owner finalizes the cutoff first (PROTOCOL §7.0 GATE)",
            open.by,
            lease_core::FileRef::Epoch(open.by).path(),
            open.retired,
            lease_core::FileRef::Cutoff(open.retired).path(),
            open.retired
        ),
        Subject::CgroupLeftAlone(cg) => format!(
            "cgroup {} (owned by uid {}, generation {} by its name, {} member(s){}) is named like this run's, but {}: it is not proved this run's own, so it is left alone",
            cg.path,
            cg.uid,
            cg.generation,
            cg.members.len(),
            if cg.members.is_empty() {
                String::new()
            } else {
                format!(
                    ": {}",
                    cg.members
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
            cg.why
        ),
        Subject::StrayNames(names) => format!(
            "{} name(s) no reader uses: {}",
            names.len(),
            names.join(", ")
        ),
        other => format!("{other:?}"),
    }
}

/// A short event log's finding text.
pub fn short_tail_text(t: &lease_core::ops::ShortTail) -> String {
    let by = match t.by_cutoff_of {
        Some(g) => format!("the finalized cutoff of generation {g}"),
        None => "the checkpoint".to_string(),
    };
    format!(
        "the event log ends at sequence {} but {by} names events through {}",
        t.tail, t.named
    )
}

/// A torn heartbeat file (PROTOCOL §4, OQ-6), for doctor's finding and status's line.
pub fn torn_beat_text(head: &lease_core::ops::Head) -> String {
    format!(
        "{} is torn (no valid heartbeat slot: a power loss while a `local` owner wrote its first beat, which is never fsynced, leaves the file empty or cut short); liveness is judged as if owner {} had not beaten since its claim at {}, until its next heartbeat writes a whole slot",
        lease_core::FileRef::Beat(head.generation()).path(),
        head.epoch.owner_id,
        head.epoch.claimed_at
    )
}
