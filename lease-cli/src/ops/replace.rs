//! `takeover` and `retire`: replace a stale or dead owner from the command line.

use crate::diagnosis::next_argv;
use crate::error::{CliError, name_folder};
use crate::holder::held_description;
use crate::output::{Out, Progress};
use crate::stamps::{new_owner_id, wall_now};
use crate::text::{Quoting, command_line, human_duration, human_ms};
use lease_core::Code;
use lease_core::diagnose::Next;
use lease_core::ops::Expectation;
use lease_core::{Generation, Identity};
use lease_run::replace::{Observed, Replacer, RunJsonUpdate};
use lease_run::{Authority as RunAuthority, RunError};
use serde_json::{Value, json};
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

/// Options of `runlease takeover`.
#[derive(Debug, Clone)]
pub struct TakeoverOpts {
    /// `--expect-owner`.
    pub expect_owner: Option<String>,
    /// `--expect-heartbeat`.
    pub expect_heartbeat: Option<String>,
    /// `--expect-generation`.
    pub expect_generation: Option<u64>,
    /// `--expect-count`.
    pub expect_count: Option<u64>,
    /// `--yes`.
    pub yes: bool,
}

/// The command of a step named in a hint, as an operator pastes it: diagnosis's vector
/// for it (`--` before the run folder, `--authority` where it applies), quoted word by
/// word; nothing from a record or the path is pasted as shell text.
fn pasted(next: &Next, dir: &Path, authority: &RunAuthority) -> String {
    next_argv(next, dir, authority.url().as_deref())
        .map(|argv| command_line(&argv, Quoting::Terminal))
        .unwrap_or_default()
}

/// The replacer `open` gives for `dir` and the owner it observes (liveness probed, the run
/// verified: lease-run's [`Replacer::observe`]): an invalid record names the repair, a free
/// run is a race (`free_why` says what there is not to do). First this host as the holder
/// the replacement records (ARGUMENT_INVALID for a host name no record may hold), before
/// anything is opened or watched.
fn observe_owner(
    dir: &Path,
    authority: &RunAuthority,
    open: fn(&Path, &RunAuthority) -> Result<Replacer, RunError>,
    free_why: &str,
) -> Result<(Replacer, Observed), CliError> {
    lease_run::folder::this_holder().map_err(CliError::from)?;
    let r = open(dir, authority).map_err(|e| name_folder(dir, e))?;
    match r.observe(wall_now()?) {
        Ok(Some(o)) => Ok((r, o)),
        // Nothing to replace, and retrying changes nothing: not a race (75, "retry").
        Ok(None) => Err(CliError::of(
            Code::RunNotHeld,
            format!("run {} is free: {free_why}", r.lease().run_id()),
        )),
        Err(e @ RunError::Lease(_))
            if matches!(e.code(), Code::RecordInvalid | Code::SchemaUnsupported) =>
        {
            Err(CliError::from(e).with_hint(format!(
                "nothing may replace the owner until the record is repaired: {}",
                pasted(&Next::DoctorDoNotTakeOver, dir, &RunAuthority::RunFolder)
            )))
        }
        Err(e) => Err(e.into()),
    }
}

/// `runlease takeover DIR`: exact operator takeover of a stale owner; the CLI becomes the
/// owner for an instant and releases at once, so the run is free for the next `run`.
pub fn takeover(
    dir: &Path,
    authority: &RunAuthority,
    o: &TakeoverOpts,
    out: Out,
) -> Result<i32, CliError> {
    // The arguments first: a malformed one is 64 before anything is opened or read.
    let given = given_expectation(o, dir, authority)?;
    let (r, observed) = observe_owner(
        dir,
        authority,
        Replacer::for_takeover,
        "there is no owner to take over (claim it with runlease run)",
    )?;
    let (view, head) = (&observed.view, &observed.head);
    let (desc, held) = held_description(view);
    if !out.json {
        out.info(&format!("observed {}: {desc}", dir.display()));
    }
    if given.is_none() && !o.yes {
        eprint!(
            "runlease: take over owner {} (heartbeat {}, age {})? [y/N] ",
            head.epoch.owner_id,
            head.heartbeat_at(),
            view.judged_age_ms().map_or("?".into(), human_ms)
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
            return Err(CliError::of(
                Code::Aborted,
                "takeover not confirmed; nothing was changed",
            ));
        }
    }
    // An authority that vouches for the owner (etcd: its etcd lease is alive) refuses the
    // takeover whatever the watch sees: say so now instead of after stale_after.
    if view.lease_alive() {
        return Err(CliError::of(
            Code::TakeoverActiveRefused,
            format!(
                "run {}: generation {} (owner {}) is alive by the authority (its etcd lease has not expired); nothing was written",
                r.lease().run_id(),
                head.generation(),
                head.epoch.owner_id
            ),
        )
        .with_hint("wait until its etcd lease expires (runlease status names the step), or ask the owner to release"));
    }
    // The owner is stale only once its record stayed unchanged for its stale_after on this
    // host's own clock (PROTOCOL §10): no other host's wall clock decides, so this watches.
    // A beat stamped on this host's own clock (same boot and time namespace) has been
    // unchanged since its stamp, so the watch starts there (PROTOCOL §10, the same-clock rule).
    let needed = head.epoch.policy.stale_after();
    // An expectation that does not match what was observed is refused at the watch's first
    // read (TAKEOVER_RACE): announce no watch then.
    let will_watch = given.as_ref().is_none_or(|e| e.mismatch(head).is_none());
    if !out.json && will_watch {
        match view.mono_age_ms {
            Some(age) => {
                let age = std::time::Duration::from_millis(age);
                out.info(&format!(
                    "generation {}'s beat was written {} ago on this host's clock (same boot); a takeover needs it unchanged for more than {}{}",
                    head.generation(),
                    human_duration(age),
                    human_duration(needed),
                    if age > needed {
                        String::new()
                    } else {
                        format!(": watching for {} more", human_duration(needed - age))
                    }
                ));
            }
            None => out.info(&format!(
                "watching generation {}'s record for {} on this host's clock: a takeover needs it unchanged that long",
                head.generation(),
                human_duration(needed)
            )),
        }
    }
    let mut line = Progress::new(out);
    let show = |watched, needed| {
        line.show(&format!(
            "watched unchanged for {} of {}",
            human_duration(watched),
            human_duration(needed)
        ))
    };
    // The operator's expectation is a compare token: any field that differs is
    // TAKEOVER_RACE (observe again). Without one, the watch continues this process's own
    // look: a record changed since is an owner that is alive (76).
    let watched = match &given {
        Some(expect) => r.watch(expect, show),
        None => r.watch_observed(&observed, show),
    };
    line.clear();
    let (expect, watched) = watched.map_err(|e| {
        let code = e.code();
        let err = CliError::from(e);
        if code == Code::TakeoverActiveRefused {
            err.with_hint(
                "the owner wrote its record while watched: it is alive; wait, or ask it to release",
            )
        } else if code == Code::TakeoverRace && given.is_some() {
            err.with_hint(format!(
                "observe again (`{}` prints expect_owner and expect_heartbeat), then take over what it shows",
                command_line(&status_argv(dir, authority), Quoting::Terminal)
            ))
        } else {
            err
        }
    })?;
    let taken = r.takeover_and_release(
        &observed,
        expect,
        watched,
        new_owner_id()?,
        lease_run::wall_now,
    )?;
    note_run_json(&taken.run_json, out);
    let cutoff = taken.cutoff;
    let preempted = taken.preempted.clone();
    let released = taken.released.map_err(|e| {
        CliError::from(e).with_hint(format!(
            "the takeover itself succeeded (generation {}); the old owner is fenced",
            taken.generation
        ))
    })?;
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/takeover/1",
            "ok": true,
            "run": dir.display().to_string(),
            "taken_over": held.get("holder").cloned().unwrap_or(Value::Null),
            "generation": taken.generation.get(),
            "released_as": released.get(),
            "cutoff": cutoff,
            "preempted": preempted.is_some(),
            "state": "free",
        }));
    } else {
        out.line(&format!(
            "took over {} from owner {} (generation {}, last heartbeat {}) as generation {}, then released it as generation {}: the run is free",
            dir.display(),
            head.epoch.owner_id,
            head.generation(),
            head.heartbeat_at(),
            taken.generation,
            released
        ));
        if let Some(c) = cutoff {
            out.line(&format!(
                "events of the old owner count through sequence {c}; anything it writes later is fenced and never counts"
            ));
        }
        if let Some(p) = &preempted {
            out.line(&format!(
                "note: owner {} heartbeat after this takeover's last look: it was alive, and runs on until its next heartbeat fences it (at most {} ms, its self-fence)",
                p.owner_id, p.self_fence_after_ms
            ));
        }
    }
    Ok(0)
}

/// `runlease [--authority URL] status --json -- DIR`, as a vector.
fn status_argv(dir: &Path, authority: &RunAuthority) -> Vec<String> {
    let mut status = vec!["runlease".to_string()];
    if let Some(url) = authority.url() {
        status.extend(["--authority".to_string(), url]);
    }
    status.extend(["status", "--json", "--"].map(String::from));
    status.push(dir.display().to_string());
    status
}

/// The operator's expectation from `--expect-*` (`None`: none given, so `--yes` or the
/// prompt decides), judged before any I/O: every malformed or incomplete one is 64. The
/// owner id must be a word (`lease_core::Identity::word`: the form every record's owner
/// id has, so anything else can never match), the heartbeat a protocol timestamp, the
/// generation at least 1; `--expect-generation` and `--expect-count` only refine
/// `--expect-owner` with `--expect-heartbeat`. Without any, a caller that is not on a
/// terminal must say `--yes`.
fn given_expectation(
    o: &TakeoverOpts,
    dir: &Path,
    authority: &RunAuthority,
) -> Result<Option<Expectation>, CliError> {
    match (&o.expect_owner, &o.expect_heartbeat) {
        (Some(owner), Some(hb)) => {
            let owner_id = Identity::word("--expect-owner", owner.clone())
                .map_err(|e| CliError::usage(e.to_string()))?;
            let heartbeat_at = lease_core::Timestamp::parse(hb)
                .map_err(|e| CliError::usage(format!("--expect-heartbeat: {e}")))?;
            let generation = match o.expect_generation {
                None => None,
                Some(g) => Some(Generation::new(g).ok_or_else(|| {
                    CliError::usage("--expect-generation: generations start at 1")
                })?),
            };
            Ok(Some(Expectation {
                generation,
                owner_id,
                heartbeat_at,
                heartbeat_count: o.expect_count,
            }))
        }
        (None, None) => {
            if o.expect_generation.is_some() || o.expect_count.is_some() {
                return Err(CliError::usage(
                    "--expect-generation and --expect-count refine --expect-owner with --expect-heartbeat; pass those too",
                ));
            }
            let interactive = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
            if !o.yes && !interactive {
                return Err(CliError::usage(format!(
                    "not a terminal: pass --expect-owner and --expect-heartbeat with the values `{}` printed (expect_owner, expect_heartbeat), or --yes to take over exactly what is observed now",
                    command_line(&status_argv(dir, authority), Quoting::Terminal)
                )));
            }
            Ok(None)
        }
        _ => Err(CliError::usage(
            "--expect-owner and --expect-heartbeat go together",
        )),
    }
}

/// `runlease retire DIR`: retire a definitely-dead owner (same boot, process gone, owner
/// lock free). Takes the owner lock first if it can.
pub fn retire(dir: &Path, authority: &RunAuthority, out: Out) -> Result<i32, CliError> {
    // lease-run takes the owner lock first on a run folder (so "dead" is judged holding
    // it); etcd judges by the owner's etcd lease.
    let (r, observed) = observe_owner(
        dir,
        authority,
        Replacer::for_retire,
        "there is no owner to retire (claim it with runlease run)",
    )?;
    let (view, head) = (&observed.view, &observed.head);
    let retired = r
        .retire(&observed, new_owner_id()?, wall_now()?)
        .map_err(|e| {
            let code = e.code();
            let err = CliError::from(e);
            if code == Code::RetireRefusedNotDead {
                let next = if view.lease_alive() {
                    "its etcd lease is alive: wait for it to expire (stale_after after the owner's last keep-alive), then retire".into()
                } else if view.is_stale() {
                    // The same vector `status` names for a stale owner (owner id and time
                    // quoted as words, `--` before the folder).
                    let takeover = Next::Takeover {
                        owner_id: head.epoch.owner_id.to_string(),
                        heartbeat_at: head.heartbeat_at().to_string(),
                    };
                    format!("it is stale: {}", pasted(&takeover, dir, authority))
                } else {
                    "wait for it to become stale, then take over".into()
                };
                err.with_hint(next)
            } else {
                err
            }
        })?;
    drop(r);
    note_run_json(&retired.run_json, out);
    if out.json {
        out.json_line(&json!({
            "schema": "runlease/cli/retire/1",
            "ok": true,
            "run": dir.display().to_string(),
            "retired_generation": retired.retired.get(),
            "retired_owner": head.epoch.owner_id.to_string(),
            "generation": retired.generation.get(),
            "cutoff": retired.cutoff,
            "state": "free",
        }));
    } else {
        out.line(&format!(
            "retired dead owner {} (generation {}, pid {} on {}) as generation {}: the run is free; its events through sequence {} count",
            head.epoch.owner_id,
            retired.retired,
            head.epoch.holder.pid,
            head.epoch.holder.host,
            retired.generation,
            retired.cutoff
        ));
    }
    Ok(0)
}

/// Say on stderr when a replacement left `run.json` as it was (lease-run's
/// [`RunJsonUpdate::Left`]): the chain changed the owner all the same, and `status` reads
/// the owner from the chain.
fn note_run_json(update: &RunJsonUpdate, out: Out) {
    if let RunJsonUpdate::Left { why } = update {
        out.info(&format!(
            "run.json was not updated ({why}); it is out of date until the next `runlease run` writes it (status reads the owner from the lease chain)"
        ));
    }
}
