//! What the world reads off itself: fingerprints, the head, operations run on a fork.

use super::{RUN_JSON, World, WorldLiveness, hash128, run_id};
use lease_core::ops::{Operation, Request, Response, Step};
use lease_core::*;
use lease_fs::fs::Fs;
use lease_fs::run_dir::{Exec, prim_response, start_request};
use std::collections::BTreeMap;

impl World {
    pub(crate) fn liveness(&self) -> WorldLiveness {
        WorldLiveness {
            boot: self.boot,
            live: self
                .actors
                .iter()
                .map(|a| (a.pid(), a.start_time()))
                .collect(),
            now_ms: self.now,
        }
    }

    /// The hand-corruption as the state knows it: the number of epochs when it happened.
    pub(crate) fn corrupted(&self) -> Option<usize> {
        self.ghost
            .is_corrupted()
            .then_some(self.ghost.epochs_at_corruption)
    }

    pub(crate) fn fingerprint(&self) -> u128 {
        let g = &self.ghost;
        hash128(&format!(
            "{}|{:?}|{}|{}|{:?}|{:?}|{:?}|{:?}|{}|{}|{}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{}|{}|{:?}",
            self.fs.fingerprint(),
            self.actors,
            self.now,
            self.boot,
            g.acked,
            g.refused,
            g.late,
            g.granted,
            g.max_granted,
            g.max_head,
            self.power_losses_left,
            self.time_jumps_left,
            self.corrupt_left,
            self.corrupted(),
            self.running,
            self.preemptions_left,
            self.beats_ok,
            g.writer,
            g.rolled_back,
            self.copies_left,
            self.rollbacks_left,
            self.lease_copy.as_ref().map(|(_, h)| *h)
        ))
    }

    /// What `check` depends on besides the head bookkeeping.
    pub(crate) fn check_key(&self) -> u128 {
        // Every ghost field `check_state` reads: a cached "ok" must not hide, say, a
        // granted generation that lost its epoch.
        hash128(&format!(
            "{}|{}|{}|{:?}|{:?}|{:?}|{:?}|{:?}|{}|{:?}|{}|{}|{:?}|{:?}|{:?}",
            self.fs.fingerprint(),
            self.now,
            self.boot,
            self.ghost.acked,
            self.ghost.refused,
            self.ghost.late,
            self.corrupted(),
            self.ghost.writer,
            self.ghost.rolled_back,
            self.ghost.granted,
            self.ghost.epochs_at_corruption,
            self.ghost.head_at_corruption,
            self.ghost.linked,
            self.ghost.cutoff_linked,
            self.ghost.durable_beats
        ))
    }

    pub(crate) fn head(&self) -> u64 {
        self.fs
            .list("lease/epochs")
            .unwrap_or_default()
            .iter()
            .filter_map(|n| Dir::Epochs.parse_name(n))
            .filter_map(|f| match f {
                FileRef::Epoch(g) => Some(g.get()),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    pub(crate) fn epoch_count(&self) -> usize {
        self.fs
            .list("lease/epochs")
            .unwrap_or_default()
            .iter()
            .filter(|n| Dir::Epochs.parse_name(n).is_some())
            .count()
    }

    /// Run an operation to completion on a fork (observations for starting operations and
    /// for checking invariants never change the explored state).
    pub(crate) fn observe<O: Operation>(&self, op: &mut O) -> Result<O::Output, LeaseError> {
        let fs = self.fs.fork();
        let live = self.liveness();
        let mut input = None;
        loop {
            match op.next(input.take()) {
                Step::Io(req) => {
                    let exec = match start_request(&fs, &live, req, |d| {
                        if d.is_empty() {
                            ".tmp-observer".into()
                        } else {
                            format!("{d}/.tmp-observer")
                        }
                    }) {
                        Ok(e) => e,
                        Err((op, p, e)) => {
                            return Err(LeaseError::ArgumentInvalid {
                                what: "io",
                                reason: format!("{op} {p}: {e}"),
                            });
                        }
                    };
                    input = Some(match exec {
                        Exec::Ready(r) => r,
                        Exec::Prim(prim, _) => {
                            let kind = prim.kind();
                            match prim.run(&fs) {
                                Ok(o) => prim_response(kind, o),
                                Err(e) => {
                                    return Err(LeaseError::ArgumentInvalid {
                                        what: "io",
                                        reason: e.to_string(),
                                    });
                                }
                            }
                        }
                    });
                }
                Step::Done(r) => return r,
            }
        }
    }

    /// One request on a fork, through `start_request` and `PrimOp` as an actor makes it.
    pub(crate) fn perform(&self, req: Request) -> Result<Response, String> {
        let fs = self.fs.fork();
        let live = self.liveness();
        let exec = start_request(&fs, &live, req, |d| format!("{d}/.tmp-observer"))
            .map_err(|(op, p, e)| format!("{op} {p}: {e}"))?;
        Ok(match exec {
            Exec::Ready(r) => r,
            Exec::Prim(prim, _) => {
                let kind = prim.kind();
                prim_response(kind, prim.run(&fs).map_err(|e| e.to_string())?)
            }
        })
    }

    /// The generation that last wrote `run.json` (`None`: none, or not a record).
    pub(crate) fn run_json_generation(&self) -> Option<u64> {
        let bytes = self.fs.read(RUN_JSON, 1 << 16).ok().flatten()?;
        decode_for::<RunStatus>(&run_id(), &bytes)
            .ok()
            .map(|r| r.generation.get())
    }

    /// Rollback evidence as a claim, takeover or retirement gathers it before it acts
    /// (lease-run's admission rule): the head (the highest epoch), the generation that
    /// wrote `run.json`, the newest event's generation (`CountEvents`, then that event
    /// read), judged by `lease_core::rollback::rollback_evidence`. The model has no store.
    pub(crate) fn rollback_evidence(&self) -> Option<lease_core::rollback::Evidence> {
        let head = self.head();
        let newest = match self.perform(Request::CountEvents) {
            Ok(Response::EventCount { highest, .. }) => Sequence::new(highest),
            _ => None,
        };
        let newest_gen =
            newest.and_then(|s| match self.perform(Request::Read(FileRef::Event(s))) {
                Ok(Response::Content(Some(b))) => decode_for::<Event>(&run_id(), &b)
                    .ok()
                    .map(|e| e.generation.get()),
                _ => None,
            });
        lease_core::rollback::rollback_evidence(head, self.run_json_generation(), newest_gen, None)
    }

    /// Every file below `lease/` (live), by path: what a copy of the folder holds.
    pub(crate) fn lease_files(&self) -> BTreeMap<String, Vec<u8>> {
        self.fs
            .snapshot_live()
            .into_iter()
            .filter(|(p, _)| p.starts_with("lease/"))
            .collect()
    }
}
