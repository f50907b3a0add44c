//! `append` and `events`: write an event as the owner, read the log with each event's authority.

use crate::error::CliError;
use crate::open::open_lease;
use crate::output::Out;
use crate::stamps::wall_now;
use crate::text::{Quoting, command_line};
use lease_core::Code;
use lease_core::LeaseOps;
use lease_core::ops::{AppendParams, OwnedLease, Standing, Status};
use lease_core::{FileRef, Generation, Identity};
use lease_run::{Authority as RunAuthority, LeaseAuthority};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// Options of `runlease append`.
#[derive(Debug, Clone)]
pub struct AppendOpts {
    /// `--type`.
    pub event_type: String,
    /// `--payload` (JSON text).
    pub payload: Option<String>,
    /// `--generation` / `RUNLEASE_GENERATION`.
    pub generation: Option<u64>,
    /// `--owner` / `RUNLEASE_OWNER`.
    pub owner: Option<String>,
}

/// The owner's token (generation and owner id) from the flags or the environment.
pub(super) fn token(
    generation: Option<u64>,
    owner: Option<&String>,
) -> Result<(Generation, Identity), CliError> {
    let generation = generation
        .ok_or_else(|| {
            CliError::usage(
                "no generation: pass --generation or run under `runlease run` (RUNLEASE_GENERATION)",
            )
        })
        .and_then(|g| {
            Generation::new(g).ok_or_else(|| CliError::usage("--generation must be at least 1"))
        })?;
    let owner = owner.cloned().ok_or_else(|| {
        CliError::usage("no owner: pass --owner or run under `runlease run` (RUNLEASE_OWNER)")
    })?;
    Ok((generation, Identity::arg("owner id", owner)?))
}

/// Check that `(generation, owner)` is the run's current, active head and return the
/// lease that owner holds (its identity is the epoch on disk). A generation that does not
/// exist is a usage error (64); a superseded, released or foreign generation is `FENCED`
/// (75), with `nothing` saying what was not done.
pub(super) fn owned_head(
    run: &dyn LeaseAuthority,
    generation: Generation,
    owner: &Identity,
    nothing: &str,
) -> Result<(OwnedLease, lease_core::ops::Head), CliError> {
    let view = run.status(wall_now()?, false)?;
    if let Status::Invalid(e) = view.status {
        return Err(e.into());
    }
    let fenced = |detail: String| {
        CliError::of(
            Code::Fenced,
            format!(
                "run {}: generation {generation} is fenced: {detail}; {nothing}",
                run.run_id()
            ),
        )
    };
    let head = match &view.head {
        // Planted mutant `append_unfenced` (issue #31; with lease-core's two guards): a
        // deposed generation's append is not refused here.
        Some(h) if lease_core::mutant::mutant("append_unfenced") => h.clone(),
        None => {
            return Err(CliError::usage(format!(
                "run {} was never claimed: generation {generation} does not exist",
                run.run_id()
            )));
        }
        Some(h) if h.generation() < generation => {
            return Err(CliError::usage(format!(
                "generation {generation} does not exist (the head is {})",
                h.generation()
            )));
        }
        Some(h) if h.generation() > generation => {
            return Err(fenced(format!(
                "the run is at generation {}",
                h.generation()
            )));
        }
        Some(h) if !h.is_active() => {
            return Err(fenced("it was released".into()));
        }
        Some(h) if h.epoch.owner_id != *owner => {
            return Err(fenced(format!(
                "its owner is {}, not {owner}",
                h.epoch.owner_id
            )));
        }
        Some(h) => h.clone(),
    };
    let lease = OwnedLease {
        run_id: run.run_id().clone(),
        generation,
        owner_id: owner.clone(),
        holder: head.epoch.holder.clone(),
        policy: head.epoch.policy,
        epoch_hash: head.hash.clone(),
    };
    Ok((lease, head))
}

/// `runlease append DIR --type T`: append one event as the current owner (the token comes
/// from `RUNLEASE_GENERATION`/`RUNLEASE_OWNER`). Exit 0 only when the event is durable and
/// authoritative; 75 when the generation is fenced.
///
/// First the run is verified as `runlease verify` checks it, the log from its newest
/// verified-prefix mark on (PROTOCOL §13.1, issue #33): whatever verify rejects there (a
/// gap, a broken link, an unreadable record, a directory or FIFO named like an event, an
/// event below the mark that no longer hashes to what the mark recorded), append refuses
/// with the same code and writes nothing. The walk reads about [`lease_core::ops::MARK_EVERY`]
/// events at most, whatever the log's length: each append that walked that many leaves a
/// new mark once its event counts. Tampering further below the mark is `verify`'s and
/// `doctor`'s to find.
pub fn append(
    dir: &Path,
    authority: &RunAuthority,
    o: &AppendOpts,
    out: Out,
) -> Result<i32, CliError> {
    let (generation, owner) = token(o.generation, o.owner.as_ref())?;
    let event_type = Identity::arg("event type", o.event_type.clone())?;
    let payload: Value = match &o.payload {
        None => Value::Null,
        // Strict: a repeated key or a number that cannot be kept exactly is refused, never
        // merged or rounded into the durable event.
        Some(text) => lease_core::canonical::parse_json_strict(text)
            .map_err(|e| CliError::usage(format!("--payload: {e}")))?,
    };
    let opened = open_lease(dir, authority, None)?;
    let run = &*opened.auth;
    // One rule for the log: what `runlease verify` rejects after the newest
    // verified-prefix mark, append refuses, same code (PROTOCOL §13.1: what lies below the
    // mark is `verify`'s and `doctor`'s to find; the walk does not grow with the log).
    let checked = run
        .verify_tail()
        .map_err(|e| CliError::from(e).with_hint("nothing was appended"))?;
    let now = wall_now()?;
    // Act as that owner: the append's own pre- and post-checks decide whether it counts.
    let (lease, _) = owned_head(run, generation, &owner, "nothing was appended")?;
    let appended = run
        .append(
            &lease,
            AppendParams {
                event_type: event_type.clone(),
                payload,
                now,
                tail_hint: None,
            },
        )
        .map_err(|e| match e.unknown_outcome_file() {
            Some(FileRef::Event(seq)) if e.code() == Code::OutcomeUnknown => {
                append_outcome_unknown(dir, authority, &e, seq, generation, &event_type)
            }
            _ => CliError::from(e),
        })?;
    // The event counts: leave the mark the check made due (best-effort: a failure only
    // makes the next check walk further).
    if let Some((s, h)) = checked.mark_due() {
        let _ = run.write_mark(s, h, owner.clone(), now);
    }
    if let Some(by) = appended.superseded_by {
        eprintln!(
            "runlease: warning: event {} counts, but generation {generation} was superseded by generation {by} meanwhile: stop writing",
            appended.sequence
        );
    }
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/append/1",
            "ok": true,
            "run": dir.display().to_string(),
            "sequence": appended.sequence.get(),
            "hash": appended.hash.to_string(),
            "generation": generation.get(),
            "type": event_type.to_string(),
            "superseded_by": appended.superseded_by.map(|g| g.get()),
        }));
    } else {
        out.line(&appended.sequence.to_string());
    }
    Ok(0)
}

/// An append whose event create was sent to the etcd cluster and not answered
/// (`OUTCOME_UNKNOWN`, 71, issue #31): the event at `seq` may or may not be in the log, so
/// the error names the run, the sequence and the command that tells (`runlease events`,
/// quoted word by word, with the same `--authority`), not "retry": a blind retry appends
/// a second event. With `--json` the command is also `next_step` / `next_step_argv`.
fn append_outcome_unknown(
    dir: &Path,
    authority: &RunAuthority,
    e: &lease_run::RunError,
    seq: lease_core::Sequence,
    generation: Generation,
    event_type: &Identity,
) -> CliError {
    let mut argv = vec!["runlease".to_string()];
    if let Some(url) = authority.url() {
        argv.extend(["--authority".to_string(), url]);
    }
    argv.extend(["events", "--json", "--"].map(String::from));
    argv.push(dir.display().to_string());
    CliError::of(
        Code::OutcomeUnknown,
        format!(
            "run {}: event {seq} ({}) may or may not have been appended: {e}",
            dir.display(),
            FileRef::Event(seq).path()
        ),
    )
    .with_hint(format!(
        "do not append it again blindly; look first: `{}` lists the log: if sequence {seq} is there with type {event_type}, generation {generation} and this payload, it was appended (its `authoritative` field says whether it counts); if it is not, append it again",
        command_line(&argv, Quoting::Terminal)
    ))
    .with_extra(json!({
        "sequence": seq.get(),
        "next_step": command_line(&argv, Quoting::Sh),
        "next_step_argv": argv,
    }))
}

/// Why a `pending` event of generation `g` is pending, and the step that settles it
/// (issue #28: `events` said only "not finalized"). Pending means: epoch `g` is active and
/// not the head, and no cutoff for it exists, so the epoch above it, `g + 1` (the only one
/// that can supersede `g`: §4's chain rules), superseded it and its cutoff was never
/// written (a crash between the two, or the change of owner is writing it now). Only the
/// head's superseded generation can be pending (one further down is `CHAIN_BROKEN`), and
/// the next change of owner finalizes it before it extends the chain (PROTOCOL §7.0 GATE).
fn pending_text(g: lease_core::Generation) -> String {
    let by = g.get().saturating_add(1);
    format!(
        "not counted yet: generation {g} was superseded by generation {by}, and its cutoff ({}) was never written (a crash between the two, or it is being written now); the next change of owner finalizes it first and settles this event (the step `runlease status` names; `runlease doctor` reports OPEN_CUTOFF)",
        FileRef::Cutoff(g).path()
    )
}

/// The authority of an event of generation `g`: a short code and a human phrase.
fn authority_text(a: &Standing, g: lease_core::Generation) -> (&'static str, String) {
    match a {
        Standing::Authoritative => ("counts", "counts".into()),
        Standing::PastCutoff { cutoff } => (
            "past_cutoff",
            format!("does not count: past its generation's cutoff {cutoff}"),
        ),
        Standing::Pending => ("pending", pending_text(g)),
        Standing::NotOwner => (
            "not_owner",
            "does not count: not written by its generation's owner".into(),
        ),
        Standing::FreeGeneration => (
            "free_generation",
            "does not count: its generation had no owner".into(),
        ),
        Standing::UnknownGeneration => (
            "unknown_generation",
            "does not count: no such generation".into(),
        ),
        Standing::ExcludedByCheckpoint => (
            "excluded_by_checkpoint",
            "does not count: excluded by the checkpoint".into(),
        ),
    }
}

fn print_event(je: &lease_core::ops::JudgedEvent, out: &Out) -> bool {
    let e = &je.event;
    let (code, text) = authority_text(&je.standing, e.generation);
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/event/1",
            "sequence": e.sequence.get(),
            "generation": e.generation.get(),
            "owner_id": e.owner_id.to_string(),
            "type": e.event_type.to_string(),
            "timestamp": e.timestamp.to_string(),
            "payload": e.payload,
            "hash": je.hash.to_string(),
            "authoritative": je.standing.counts(),
            "authority": code,
            "cutoff": match je.standing { Standing::PastCutoff { cutoff } => Some(cutoff), _ => None },
            // For `pending`: the generation that superseded the event's (its cutoff is
            // due; the next change of owner writes it).
            "superseded_by": match je.standing {
                Standing::Pending => e.generation.get().checked_add(1),
                _ => None,
            },
        }))
    } else {
        let mark = if je.standing.counts() { ' ' } else { '!' };
        out.line(&format!(
            "{mark}{:>6}  {}  gen {:<4} {:<20} {}  [{}]",
            e.sequence, e.timestamp, e.generation, e.event_type, e.payload, text
        ))
    }
}

/// Print the events of `run` after sequence `*last` (all of them from 0), in order, with
/// their authority, moving `*last` to the last one printed. The log is streamed: one event
/// in memory at a time. `false` once stdout is gone (a closed pipe).
fn print_events_after(
    run: &dyn lease_run::LeaseAuthority,
    last: &mut u64,
    out: &Out,
) -> Result<bool, CliError> {
    let seen = *last;
    let mut stdout_gone = false;
    run.for_each_event(&mut |je| {
        if je.event.sequence.get() <= seen {
            return true;
        }
        if !print_event(je, out) {
            stdout_gone = true;
            return false;
        }
        *last = je.event.sequence.get();
        true
    })?;
    Ok(!stdout_gone)
}

/// `runlease events DIR [--follow]`: every event with its authority (non-authoritative
/// events are shown, marked `!`, never hidden). Read-only: pending cutoffs are not
/// finalized.
pub fn events(
    dir: &Path,
    authority: &RunAuthority,
    follow: bool,
    out: Out,
) -> Result<i32, CliError> {
    let opened = open_lease(dir, authority, None)?;
    let run = &*opened.auth;
    // On a rolled-back chain the verdicts would be read against a head that handed out
    // generations already given (an event its writer was told does not count would show
    // `counts`): refused, 65, as every writer refuses it (issue #28).
    opened.refuse_rolled_back()?;
    // Streamed: one event in memory at a time, whatever the log's length.
    let mut last = 0u64;
    if !print_events_after(run, &mut last, &out)? {
        return Ok(0);
    }
    if last == 0 && !out.json && !follow {
        out.line("(no events)");
    }
    if !follow {
        return Ok(0);
    }
    // Polls every 500 ms. On a run folder an idle poll is one `stat` of the next event's
    // name; only when it exists is the whole log re-read and re-judged (the judgment of
    // already printed events is not re-printed if it changes). Over etcd every poll reads.
    // The `stat` is made beneath the held run root, like every other read.
    let folder = match authority {
        RunAuthority::RunFolder => opened.folder.clone(),
        #[allow(unreachable_patterns)]
        _ => None,
    };
    loop {
        std::thread::sleep(Duration::from_millis(500));
        if let Some(f) = &folder {
            let next = lease_core::Sequence::new(last + 1).map(|s| FileRef::Event(s).path());
            if next.is_some_and(|p| !f.fs().exists(&p).unwrap_or(false)) {
                continue;
            }
        }
        if !print_events_after(run, &mut last, &out)? {
            return Ok(0);
        }
    }
}

#[cfg(all(test, feature = "etcd"))]
mod tests {
    use super::*;

    /// Issue #31: an append whose event create the etcd cluster did not answer is
    /// `OUTCOME_UNKNOWN` (71), naming the run, the event's sequence and the `runlease
    /// events` command that tells whether it is there, quoted so a shell runs exactly its
    /// argument vector (a folder with a space and a quote in its name).
    #[test]
    fn an_append_of_unknown_outcome_names_the_sequence_and_the_command_that_tells() {
        let seq = lease_core::Sequence::new(7).unwrap();
        let url = "etcd://127.0.0.1:2379/runs";
        let authority = RunAuthority::parse_etcd(url).unwrap();
        let dir = Path::new("/tmp/it's my run");
        let e = lease_run::RunError::Etcd(lease_etcd::EtcdError::OutcomeUnknown {
            run: "it's my run".into(),
            op: "txn",
            key: "/runs/it's my run/events/00000000000000000007.json".into(),
            file: Some(FileRef::Event(seq)),
            detail: "no answer within 500 ms".into(),
        });
        assert_eq!(e.unknown_outcome_file(), Some(FileRef::Event(seq)));
        let g = Generation::new(3).unwrap();
        let c = append_outcome_unknown(
            dir,
            &authority,
            &e,
            seq,
            g,
            &Identity::arg("t", "step").unwrap(),
        );
        assert_eq!(c.code, Code::OutcomeUnknown);
        assert_eq!(c.exit, 71);
        for part in [
            "/tmp/it's my run",
            "event 7",
            "events/00000000000000000007.json",
            "may or may not",
            "do not append it again blindly",
            "type step, generation 3",
            "`authoritative`",
        ] {
            assert!(c.message.contains(part), "{part:?} missing: {}", c.message);
        }
        let v = c.json();
        assert_eq!(v["sequence"], 7);
        let argv: Vec<String> = serde_json::from_value(v["next_step_argv"].clone()).unwrap();
        assert_eq!(
            argv,
            [
                "runlease",
                "--authority",
                url,
                "events",
                "--json",
                "--",
                "/tmp/it's my run"
            ]
        );
        let line = v["next_step"].as_str().unwrap();
        assert_eq!(shlex::split(line).unwrap(), argv, "{line}");
        assert!(c.message.contains(line), "{}", c.message);
    }
}
