//! Rendering of lease-core's one diagnosis ([`lease_core::diagnose`]) as `runlease`
//! text: each [`Next`] as the command or step an operator types, each [`Finding`] as its
//! detail line. What a fact means is decided in lease-core; this module only words it.

use crate::common::{held_description, human_ms, shell_path};
use lease_core::diagnose::{Finding, NamedStore, Next, RunJsonFacts, Subject};
use lease_core::ops::StatusView;
use serde_json::Value;
use std::path::Path;

/// Temp files younger than this are never removed by `doctor --clean-temp`.
pub use lease_run::diagnosis::TEMP_MIN_AGE_SECS;

/// `run.json` as [`crate::common::run_status_json`] prints it, as diagnosis facts.
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

/// A next step as the operator does it, for the run folder `dir`.
pub fn render_next(next: &Next, dir: &Path) -> String {
    let d = shell_path(dir);
    let store = lease_core::layout::STORE_FILE;
    match next {
        Next::Claim => format!("claim it (runlease run {d} -- COMMAND)"),
        Next::Init => format!(
            "it is not a run and `runlease run` refuses it (RUN_FOLDER_FOREIGN): runlease init {d} lays a run out beside what is there (changing nothing that exists), or use a new folder"
        ),
        Next::Wait => "wait, or ask the owner to release".into(),
        Next::WaitForLease => "wait: its etcd lease is alive (the cluster still hears the owner), whatever this host's wall clock says of its heartbeat; a takeover would be refused (76, TAKEOVER_ACTIVE_REFUSED) until that lease expires, stale_after after the owner's last keep-alive (then `runlease status` names the next step); or ask the owner to release".into(),
        Next::Takeover {
            owner_id,
            heartbeat_at,
        } => format!(
            "runlease takeover {d} --expect-owner {owner_id} --expect-heartbeat {heartbeat_at}"
        ),
        Next::ObserveAgain => format!("runlease status {d} (observe again)"),
        Next::Retire => format!("runlease retire {d}"),
        Next::DoctorDoNotTakeOver => format!("runlease doctor {d}; do not take over"),
        Next::DoctorBeforeRun => format!(
            "runlease doctor {d} (the next `runlease run` would refuse this run; doctor names why)"
        ),
        Next::RepairRecord => {
            "repair or restore the named file by hand (keep a copy); do not take over".into()
        }
        Next::RepairRunJson => "repair or restore the named file by hand (keep a copy); `runlease run` refuses the run until then".into(),
        Next::RepairCommandRecord => "repair or restore the named file by hand (keep a copy; its command may still run: check its pid); `runlease run` refuses the run until then".into(),
        Next::RestoreLease => "restore lease/ from a backup (keep a copy of what is there now); `runlease run` refuses the run until then".into(),
        Next::VerifyAndRestore => format!(
            "runlease verify {d} names the first broken link; restore the files from a backup or archive the run"
        ),
        Next::RestoreStore => format!(
            "restore {store} from the copy the lease chain names (keep what is there now); `runlease run` refuses the run until then"
        ),
        Next::MoveStoreAside => format!(
            "move {d}/{store} out of the run (keep it if it matters: it was created for another run, and this run's lease chain names no store); the next `runlease run` creates a new one"
        ),
        Next::CleanTemp => format!("runlease doctor {d} --clean-temp"),
        Next::Prune => format!("runlease prune {d}"),
        Next::CheckClocks => "check time synchronization on both hosts (PROTOCOL.md §10)".into(),
        Next::PowerLossOrRestoreEvents => "after a power loss this is expected (an event that was never acknowledged vanished; PROTOCOL.md §13); otherwise the log's tail was deleted: restore events/ from a backup".into(),
        Next::StopOrRemoveRecord => "stop the named process yourself if it is this run's old command, or remove the record if it is not (runlease never signals a process it cannot prove it started); `runlease run` refuses the run until then".into(),
        Next::MoveStrays => "move them out of the run folder by hand (every reader ignores them)".into(),
        Next::RepairFirst(then) => format!(
            "repair the error finding(s) first (takeover and retire refuse until then), then: {}",
            render_next(then, dir)
        ),
        Next::Nothing => "nothing to do".into(),
        // A step added to lease-core before this renderer learns it: say its name.
        other => format!("{other:?}"),
    }
}

/// A next step as an argument vector a script can run as it is (`runlease`, the global
/// `--authority` when the lease is not in the run folder, the subcommand and its
/// arguments), or `None` when the step is no single `runlease` command (wait, claim with a
/// command of your own, a repair by hand, or "repair first").
pub fn next_argv(next: &Next, dir: &Path, authority: Option<&str>) -> Option<Vec<String>> {
    let d = dir.display().to_string();
    let tail: Vec<String> = match next {
        Next::Takeover {
            owner_id,
            heartbeat_at,
        } => vec![
            "takeover".into(),
            d,
            "--expect-owner".into(),
            owner_id.clone(),
            "--expect-heartbeat".into(),
            heartbeat_at.clone(),
        ],
        Next::ObserveAgain => vec!["status".into(), d],
        Next::Retire => vec!["retire".into(), d],
        // doctor, verify and prune work on the run folder itself.
        Next::DoctorDoNotTakeOver | Next::DoctorBeforeRun => {
            return Some(vec!["runlease".into(), "doctor".into(), d]);
        }
        Next::CleanTemp => {
            return Some(vec![
                "runlease".into(),
                "doctor".into(),
                d,
                "--clean-temp".into(),
            ]);
        }
        Next::Prune => return Some(vec!["runlease".into(), "prune".into(), d]),
        // A folder step: no authority.
        Next::Init => return Some(vec!["runlease".into(), "init".into(), d]),
        Next::VerifyAndRestore => vec!["verify".into(), d],
        _ => return None,
    };
    let mut argv = vec!["runlease".to_string()];
    if let Some(url) = authority {
        argv.push("--authority".into());
        argv.push(url.to_string());
    }
    argv.extend(tail);
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
