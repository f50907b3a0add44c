//! The committer: it gathers queued writes into one group commit, stamps it with the
//! generation, makes it durable with one beat, and answers each writer.

use super::state::*;
use crate::authority::LeaseAuthority;
use crate::error::RunError;
use crate::run::heartbeat::beat;
use crate::run::{RunStore, Shared};
use crate::store_socket::Answer;
use lease_core::Code;
use lease_core::ops::OwnedLease;
use lease_sqlite::Batch;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The longest a group waits for more commits (see [`Gatherer`]).
pub const GATHER_MAX: Duration = Duration::from_millis(1);

/// The committer: group commits, one group at a time (see the module docs).
pub(super) async fn committer(
    mut rx: mpsc::Receiver<Queued>,
    auth: Arc<dyn LeaseAuthority>,
    shared: Arc<Shared>,
    lease: OwnedLease,
) {
    let store = RunStore {
        shared: shared.clone(),
    };
    let mut gatherer = Gatherer::default();
    while let Some(first) = rx.recv().await {
        // Step 2 (module docs): what is queued, then the regulars missing from it.
        let mut group = vec![first];
        take_queued(&mut rx, &mut group);
        gatherer.gather(&mut rx, &mut group).await;
        let started = Instant::now();
        let (batches, replies): (Vec<Batch>, Vec<Reply>) =
            group.into_iter().map(|r| (r.batch, r.reply)).unzip();
        // Step 3: one store transaction (the fencing check, one WAL fsync); once it
        // returned the group is durable in the store and the slot's head is at or above
        // its last sequence.
        let s = store.clone();
        let committed = tokio::task::spawn_blocking(move || s.commit_group(&batches))
            .await
            .unwrap_or_else(|e| Err(RunError::Io(format!("commit task failed: {e}"))));
        // With the store in the engine (issue #32) a commit is acknowledged once the
        // engine created its record: no floor to cover, no beat.
        let in_engine = shared.engine.get().is_some();
        match committed {
            Err(e) => answer(replies, std::iter::repeat(refusal(&e))),
            Ok(seqs) if in_engine => answer(replies, seqs.iter().map(|s| ok(&shared, *s))),
            // Step 4: one durable heartbeat, begun after step 3 returned, so the head it
            // reads under the beat lock covers the whole group. Step 5: the answers, only
            // once it is fsynced, with the outcome of this group's own beat.
            Ok(seqs) => match beat(&auth, &shared, &lease, true).await {
                Ok(()) => answer(replies, seqs.iter().map(|s| ok(&shared, *s))),
                Err(e) => {
                    let refused = not_covered(&auth, &shared, &seqs, &e);
                    answer(replies, std::iter::repeat(refused));
                }
            },
        }
        gatherer.last = started.elapsed();
    }
}

/// Move what is already queued into `group` (up to [`MAX_GROUP`]).
pub(super) fn take_queued(rx: &mut mpsc::Receiver<Queued>, group: &mut Vec<Queued>) {
    while group.len() < MAX_GROUP {
        match rx.try_recv() {
            Ok(r) => group.push(r),
            Err(_) => break,
        }
    }
}

/// The gathering window of group commit (issue #33). A group takes what is queued, then
/// waits only for the **regulars** missing from it: the connections that were in one of
/// the two groups before (a command that commits back to back is answered, and sends its
/// next commit while this group forms), unless the group before was formed so long ago
/// that they had time to come and did not. It waits at most as long as the last group's
/// store commit and covering beat took, and never more than [`GATHER_MAX`]; it stops as
/// soon as every regular is in. So a lone command never waits (the only regular is its
/// own connection, already in the group), and neither does a group when nobody else
/// committed lately; a command left alone right after others stopped waits for them at
/// most twice (they stop being regulars after two groups without them). Without the
/// wait, K commands fall into cohorts that alternate, and groups stay near K/2 (issue #20's
/// figures): each cohort's answers go out just as the other's group starts.
#[derive(Default)]
pub(super) struct Gatherer {
    /// Each regular connection and the number of the last group it was in.
    regulars: HashMap<u64, u64>,
    /// The number of the group being formed.
    group: u64,
    /// When the group before was formed.
    formed: Option<Instant>,
    /// How long the group before took to commit and cover (a window of zero before the
    /// first).
    last: Duration,
}

impl Gatherer {
    /// Add the regulars missing from `group` as they arrive, within the window.
    async fn gather(&mut self, rx: &mut mpsc::Receiver<Queued>, group: &mut Vec<Queued>) {
        let (n, now) = (self.group, Instant::now());
        self.group += 1;
        let window = self.last.min(GATHER_MAX);
        if self
            .formed
            .is_some_and(|t| now - t > self.last + GATHER_MAX)
        {
            // The regulars had time to come back and did not: wait for nobody.
            self.regulars.clear();
        } else {
            self.regulars.retain(|_, last| *last + 2 >= n);
        }
        self.note(n, group);
        // A connection has at most one commit queued, so the regulars count the commits
        // this group can expect.
        let expected = self.regulars.len().min(MAX_GROUP);
        if group.len() < expected && !window.is_zero() {
            // tokio's timers tick in whole milliseconds: the window is a sleep on a
            // blocking thread (left to finish on its own if the regulars come first).
            let mut timer = tokio::task::spawn_blocking(move || std::thread::sleep(window));
            while group.len() < expected {
                tokio::select! {
                    biased;
                    r = rx.recv() => match r {
                        Some(r) => {
                            let from = group.len();
                            group.push(r);
                            take_queued(rx, group);
                            self.note(n, &group[from..]);
                        }
                        None => break,
                    },
                    _ = &mut timer => break,
                }
            }
        }
        self.formed = Some(Instant::now());
    }

    /// `requests` are in group `n`.
    fn note(&mut self, n: u64, requests: &[Queued]) {
        for r in requests {
            self.regulars.insert(r.from, n);
        }
    }
}

/// Send each reply its answer, in order (`commit_group` gives one sequence per batch).
pub(super) fn answer(replies: Vec<Reply>, answers: impl IntoIterator<Item = Answer>) {
    for (reply, a) in replies.into_iter().zip(answers) {
        let _ = reply.send(a);
    }
}

/// A commit's acknowledgement.
pub(super) fn ok(shared: &Shared, seq: u64) -> Answer {
    Answer {
        ok: true,
        seq: Some(seq),
        generation: Some(shared.generation.get()),
        ..Answer::default()
    }
}

/// The answer to commits `seqs` that are in the store when the durable heartbeat that
/// was to cover them failed with `e`.
pub(super) fn not_covered(
    auth: &Arc<dyn LeaseAuthority>,
    shared: &Shared,
    seqs: &[u64],
    e: &RunError,
) -> Answer {
    let (first, last) = (
        seqs.first().copied().unwrap_or(0),
        seqs.last().copied().unwrap_or(0),
    );
    if shared.is_fenced() {
        let io = RunError::Io(format!(
            "run {}: commits {first}..={last} are in the store but the heartbeat that makes them part of the floor failed ({}); they are not acknowledged",
            shared.run,
            e.code().prefixed(e)
        ));
        refusal(&shared.check_live().err().unwrap_or(io))
    } else if auth.folder().is_none() {
        // The etcd cluster did not take the beat (issue #31): the commits
        // are in the store, and whether the floor covers them is unknown
        // (a later beat of this owner covers them; a replacer records the
        // floor it last saw). Not a plain failure: a client retrying it
        // blindly would commit the batch twice.
        Answer::refused(
            Code::OutcomeUnknown,
            format!(
                "run {}: commits {first}..={last} are in the store (generation {}), but the durable heartbeat that puts them under the lease's floor did not succeed ({}), so whether a replacing owner's floor covers them is unknown; do not commit them again blindly: `runlease store log` shows them",
                shared.run,
                shared.generation,
                e.code().prefixed(e)
            ),
        )
    } else {
        refusal(&RunError::Io(format!(
            "run {}: commits {first}..={last} are in the store but the heartbeat that makes them part of the floor failed ({}); they are not acknowledged",
            shared.run,
            e.code().prefixed(e)
        )))
    }
}
