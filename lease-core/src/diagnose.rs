//! One diagnosis of a run, without I/O: what is wrong, how bad it is, and the next step.
//!
//! The layers that read a run (lease-run's preflight, `runlease status` and
//! `runlease doctor`) gather [`Facts`] (a status view, what `run.json` says, the outcome of
//! a verify, the command records' audit, the store file's presence, temp files and stray
//! names) and hand them to [`diagnose`] or [`next_step`]. The decision of what each fact
//! means lives here once; the callers only gather facts and render the typed [`Finding`]s
//! and [`Next`] steps (a CLI as commands, a library as it likes).
//!
//! ```
//! use lease_core::diagnose::{diagnose, next_step, Facts, FindingCode, Next};
//! use lease_core::ops::{Status, StatusView};
//!
//! let free = StatusView {
//!     status: Status::Free,
//!     head: None,
//!     age_ms: None,
//!     mono_age_ms: None,
//!     mono_ahead_ms: None,
//!     liveness: None,
//!     authority_lease: None,
//! };
//! let facts = Facts::of_view(free);
//! assert_eq!(next_step(&facts), Next::Claim);
//! let findings = diagnose(&facts);
//! assert_eq!(findings.len(), 1);
//! assert_eq!(findings[0].code, FindingCode::Ok);
//! ```

//!
//! One module a job: `facts` (what the gatherer hands in), `finding` (the typed answer),
//! `next` (the one next step and the judgements the findings share); here, [`diagnose`]
//! itself.

mod facts;
mod finding;
mod next;

pub use facts::{
    CgroupLeftAlone, CommandFacts, Facts, OpenCutoff, RunJsonFacts, VerifyFacts, open_cutoff_of,
};
pub use finding::{Finding, FindingCode, NamedStore, Next, Severity, Subject};
pub use next::{
    STORE_REFUSALS, chain_behind, named_store, next_for_view, next_step, store_refusal,
};

use crate::code::Code;
use crate::ops::Status;
use next::{FUTURE_MS, run_json_ahead};

/// Every finding, in a fixed order; `[OK]` when there is none. A stale or dead owner's
/// next step is prefixed by "repair first" while an error finding stands, because a
/// replacement verifies the run and refuses until then.
pub fn diagnose(facts: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut push = |code, severity, subject, next| {
        out.push(Finding {
            code,
            severity,
            subject,
            next,
        })
    };
    let (temps, old) = facts.temp_files;
    if temps > 0 {
        // A next step makes progress (issue #28): the clean-up removes only temp files
        // older than the grace, so with none it would remove nothing and this finding and
        // step would come back unchanged. Name it only when it removes something.
        push(
            FindingCode::OrphanTempFiles,
            Severity::Warning,
            Subject::TempFiles { total: temps, old },
            if old > 0 {
                Next::CleanTemp
            } else {
                Next::WaitTempFiles
            },
        );
    }
    let view = &facts.view;
    let mut invalid_message = None;
    match &view.status {
        Status::Invalid(e) => {
            let message = e.code().prefixed(e);
            invalid_message = Some(message.clone());
            push(
                FindingCode::InvalidRecord,
                Severity::Error,
                Subject::Message(message),
                Next::RepairRecord,
            );
        }
        Status::Stale => push(
            FindingCode::StaleOwner,
            Severity::Warning,
            Subject::Owner,
            next_for_view(view),
        ),
        Status::Dead => push(
            FindingCode::DeadOwner,
            Severity::Warning,
            Subject::Owner,
            Next::Retire,
        ),
        Status::Free | Status::Active => {}
    }
    if let Some(msg) = run_json_ahead(facts) {
        push(
            FindingCode::BrokenChain,
            Severity::Error,
            Subject::Message(msg),
            Next::RestoreLease,
        );
    }
    if let Some(h) = view.head.as_ref().filter(|h| h.torn_beat.is_some()) {
        // Liveness only: the head reads as if it never beat; the owner's next heartbeat
        // replaces the file, and a replacement still needs the watch (status names it).
        push(
            FindingCode::TornHeartbeat,
            Severity::Warning,
            Subject::TornHeartbeat {
                head: Box::new(h.clone()),
            },
            Next::Nothing,
        );
    }
    if let (Some(h), Some(ahead_ms)) = (&view.head, view.mono_ahead_ms) {
        push(
            FindingCode::StampAhead,
            Severity::Warning,
            Subject::StampAhead {
                head: Box::new(h.clone()),
                ahead_ms,
            },
            Next::Nothing,
        );
    }
    if let (Some(h), Some(age)) = (&view.head, view.age_ms) {
        if h.is_active() && age < -FUTURE_MS {
            push(
                FindingCode::FutureHeartbeat,
                Severity::Warning,
                Subject::FutureHeartbeat {
                    head: Box::new(h.clone()),
                    ahead_ms: -age,
                },
                Next::CheckClocks,
            );
        }
    }
    match &facts.verify {
        VerifyFacts::NotChecked => {}
        VerifyFacts::Held(r) => {
            if let Some(t) = &r.short_tail {
                push(
                    FindingCode::EventLogShort,
                    Severity::Warning,
                    Subject::ShortTail(t.clone()),
                    Next::PowerLossOrRestoreEvents,
                );
            }
            if !r.strays.is_empty() {
                push(
                    FindingCode::StrayEpochs,
                    Severity::Warning,
                    Subject::StrayEpochs(r.strays.clone()),
                    Next::Prune,
                );
            }
        }
        VerifyFacts::Failed { code, message } => {
            if matches!(code, Code::ChainBroken | Code::EventLogGap) {
                push(
                    FindingCode::BrokenChain,
                    Severity::Error,
                    Subject::Message(message.clone()),
                    Next::VerifyAndRestore,
                );
            } else if invalid_message.as_deref() != Some(message.as_str()) {
                push(
                    FindingCode::InvalidRecord,
                    Severity::Error,
                    Subject::Message(message.clone()),
                    Next::RepairRecord,
                );
            }
        }
    }
    if let RunJsonFacts::Invalid { message } = &facts.run_json {
        push(
            FindingCode::InvalidRecord,
            Severity::Error,
            Subject::Message(message.clone()),
            Next::RepairRunJson,
        );
    }
    match &facts.commands {
        CommandFacts::NotChecked | CommandFacts::Clean => {}
        CommandFacts::Unproven { message } => push(
            FindingCode::CommandUnproven,
            Severity::Error,
            Subject::Message(message.clone()),
            Next::StopOrRemoveRecord,
        ),
        CommandFacts::Invalid { message } => push(
            FindingCode::InvalidRecord,
            Severity::Error,
            Subject::Message(message.clone()),
            Next::RepairCommandRecord,
        ),
        CommandFacts::OverLimit { message } => push(
            FindingCode::CommandRecordsOverLimit,
            Severity::Error,
            Subject::Message(message.clone()),
            Next::MoveCommandRecordsAside,
        ),
    }
    for cg in &facts.cgroups_left_alone {
        push(
            FindingCode::CgroupNotProven,
            Severity::Warning,
            Subject::CgroupLeftAlone(cg.clone()),
            Next::InspectCgroup {
                path: cg.path.clone(),
            },
        );
    }
    if let (Some(h), Some(false)) = (&view.head, facts.store_present) {
        if let Some(named) = named_store(&h.epoch) {
            push(
                FindingCode::StoreMissing,
                Severity::Error,
                Subject::StoreMissing {
                    generation: h.generation(),
                    named,
                },
                Next::RestoreStore,
            );
        }
    }
    let refused = store_refusal(&facts.run_json);
    if let (
        Some(code),
        RunJsonFacts::Written {
            generation, detail, ..
        },
    ) = (refused, &facts.run_json)
    {
        let dup =
            code == Code::StoreMissing && out.iter().any(|f| f.code == FindingCode::StoreMissing);
        if !dup {
            out.push(Finding {
                code: FindingCode::StoreRefused(code),
                severity: Severity::Error,
                subject: Subject::StoreRefused {
                    generation: *generation,
                    detail: detail.clone().unwrap_or_default(),
                },
                // A store of another run where the chain names none: nothing to restore;
                // moving it aside lets the next open create this run's own.
                next: if code == Code::StoreIdentityMismatch
                    && view
                        .head
                        .as_ref()
                        .is_none_or(|h| named_store(&h.epoch).is_none())
                {
                    Next::MoveStoreAside
                } else {
                    Next::RestoreStore
                },
            });
        }
    }
    // What the next claim refuses that no finding above reports (a bad file named like a
    // record in a folder verify does not read, a record named above the head): an error,
    // with its own repair.
    if let Some((code, message)) = &facts.claim_refusal {
        let reported = out.iter().any(|f| match &f.subject {
            Subject::Message(m) => m == message,
            _ => false,
        });
        // run.json ahead of the chain is reported above in its own words; the admission
        // rule's refusal says the same.
        let ahead = *code == Code::ChainBroken && run_json_ahead(facts).is_some();
        let store_reported = out.iter().any(|f| {
            matches!(
                f.code,
                FindingCode::StoreMissing | FindingCode::StoreRefused(_)
            )
        });
        if !reported && !ahead && *code != Code::RunCommandUnproven {
            let (code, next) = match *code {
                Code::ChainBroken | Code::EventLogGap => {
                    (FindingCode::BrokenChain, Next::RestoreLease)
                }
                // A store of another run where the chain names none: nothing to restore;
                // moving it aside lets the next open create this run's own.
                Code::StoreIdentityMismatch
                    if view
                        .head
                        .as_ref()
                        .is_none_or(|h| named_store(&h.epoch).is_none()) =>
                {
                    (
                        FindingCode::StoreRefused(Code::StoreIdentityMismatch),
                        Next::MoveStoreAside,
                    )
                }
                c @ (Code::StoreBehindSeal
                | Code::StoreIdentityMismatch
                | Code::StoreMissing
                | Code::StoreCorrupt) => (FindingCode::StoreRefused(c), Next::RestoreStore),
                Code::RunNotOwned => (FindingCode::NotOwned, Next::RepairRecord),
                Code::RunCommandRecordsOverLimit => (
                    FindingCode::CommandRecordsOverLimit,
                    Next::MoveCommandRecordsAside,
                ),
                _ => (FindingCode::InvalidRecord, Next::RepairRecord),
            };
            let dup = matches!(code, FindingCode::StoreRefused(_)) && store_reported;
            if !dup {
                out.push(Finding {
                    code,
                    severity: Severity::Error,
                    subject: Subject::Message(message.clone()),
                    next,
                });
            }
        }
    }
    if let Some(open) = &facts.open_cutoff {
        // The step that closes it is the next change of owner, which finalizes the cutoff
        // before it extends the chain (PROTOCOL §7.0 GATE): the step `status` names for
        // the run (a claim of a free run, a retirement, a takeover), or, while an error
        // finding stands (every writer refuses), that step after the repair; with a live
        // owner (it took over and its cutoff write was lost), its release does.
        let next = match next_step(facts) {
            Next::DoctorBeforeRun | Next::DoctorDoNotTakeOver => {
                Next::RepairFirst(Box::new(next_for_view(view)))
            }
            n => n,
        };
        out.push(Finding {
            code: FindingCode::OpenCutoff,
            severity: Severity::Warning,
            subject: Subject::OpenCutoff(open.clone()),
            next,
        });
    }
    if !facts.stray_names.is_empty() {
        out.push(Finding {
            code: FindingCode::StrayNames,
            severity: Severity::Warning,
            subject: Subject::StrayNames(facts.stray_names.clone()),
            next: Next::MoveStrays,
        });
    }
    if out.iter().any(|f| f.severity == Severity::Error) {
        for f in out
            .iter_mut()
            .filter(|f| matches!(f.code, FindingCode::StaleOwner | FindingCode::DeadOwner))
        {
            f.next = Next::RepairFirst(Box::new(f.next.clone()));
        }
    }
    if let Some(message) = &facts.adoption_refusal {
        out.push(Finding {
            code: FindingCode::FolderForeign,
            severity: Severity::Warning,
            subject: Subject::Message(message.clone()),
            next: Next::Init,
        });
    }
    if out.is_empty() {
        out.push(Finding {
            code: FindingCode::Ok,
            severity: Severity::Ok,
            subject: Subject::Run,
            next: Next::Nothing,
        });
    }
    out
}
