//! Who replaced an owner ([`Superseded`]), read from the epoch after its generation: what a
//! fenced owner reports ("taken over by generation N …"), typed, so no caller above
//! lease-run reads the chain for it.

use crate::authority::LeaseAuthority;
use lease_core::LeaseOps;
use lease_core::{Generation, Holder, Identity, Observation, RetireReason, Timestamp};

/// The epoch that superseded an owner's generation: a takeover of a stale owner or the
/// retirement of a dead one ([`superseded_by`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Superseded {
    /// The superseding generation (the owner's + 1).
    pub generation: Generation,
    /// Why the owner was superseded (`TakenOver` or `Dead`).
    pub reason: RetireReason,
    /// The replacer's owner id.
    pub owner_id: Identity,
    /// The replacer's process.
    pub holder: Holder,
    /// When the replacer wrote its epoch (its own wall clock).
    pub at: Timestamp,
    /// What the replacer judged before it wrote: the owner's last beat and, for a
    /// takeover, how long it watched that beat unchanged (issue #19).
    pub observed: Option<Observation>,
}

/// Who superseded generation `g` of the run behind `auth`: the epoch `g + 1`, if it retired
/// `g` as taken over or dead. `None` when there is none (an owner that fenced itself on a
/// lapse nobody acted on yet, or a release), when it cannot be read, or when it is not a
/// record this run accepts (it is reported, not trusted). Read-only: one read.
pub fn superseded_by(auth: &dyn LeaseAuthority, g: Generation) -> Option<Superseded> {
    let next = Generation::new(g.get().checked_add(1)?)?;
    let e = auth.read_epoch(next).ok()??;
    let retired = e.retired.filter(|r| r.generation == g)?;
    if !matches!(retired.reason, RetireReason::TakenOver | RetireReason::Dead) {
        return None;
    }
    Some(Superseded {
        generation: e.generation,
        reason: retired.reason,
        owner_id: e.owner_id,
        holder: e.holder,
        at: e.claimed_at,
        observed: retired.observed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::FolderAuthority;
    use lease_core::ops::{ClaimParams, Expectation, ReleaseParams, RetireParams};
    use lease_core::{LeaseOps, TimingPolicy, Transport};
    use lease_fs::{RunDir, this_holder};
    use std::sync::Arc;

    fn id(s: &str) -> Identity {
        Identity::new(s).unwrap()
    }

    /// A retired owner is superseded (dead, by whom, what was judged); a released one and
    /// the head itself are not.
    #[test]
    fn the_epoch_after_a_generation_says_who_superseded_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = Arc::new(RunDir::create(&tmp.path().join("sup")).unwrap());
        let auth = FolderAuthority(dir.clone());
        let now = crate::clock::wall_now().unwrap();
        let me = this_holder().unwrap();
        let claim = |owner: &str, holder: Holder| ClaimParams {
            run_id: auth.run_id().clone(),
            owner_id: id(owner),
            holder,
            policy: TimingPolicy::default(),
            now,
            store_floor: None,
        };
        // Generation 1, released as 2: nobody superseded 1.
        let l1 = auth.claim(claim("a", me.clone())).unwrap();
        let g2 = auth
            .release(ReleaseParams {
                lease: l1.clone(),
                now,
                seal: None,
            })
            .unwrap();
        assert_eq!(superseded_by(&auth, l1.generation), None);
        assert_eq!(superseded_by(&auth, g2), None, "the head: nothing after it");
        // Generation 3 held by a process that has exited, retired as dead by 4.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let l3 = auth
            .claim(claim(
                "b",
                Holder {
                    pid,
                    start_time: 1,
                    ..me.clone()
                },
            ))
            .unwrap();
        let head = auth.status(now, true).unwrap().head.unwrap();
        let r = auth
            .retire(RetireParams {
                run_id: auth.run_id().clone(),
                owner_id: id("retirer"),
                holder: me.clone(),
                policy: TimingPolicy::default(),
                now,
                expect: Some(Expectation::of(&head)),
            })
            .unwrap();
        let s = superseded_by(&auth, l3.generation).expect("retired");
        assert_eq!(s.generation, r.generation);
        assert_eq!(s.reason, RetireReason::Dead);
        assert_eq!(s.owner_id, id("retirer"));
        assert_eq!(s.holder, me);
        assert!(
            s.observed.is_some(),
            "the retirement recorded what it judged"
        );

        // A forged epoch after the head (hand-written, not a record of this run) names
        // nobody: it is reported by verify and doctor, never trusted here.
        let head = auth.status(now, false).unwrap().head.unwrap().generation();
        let forged = format!("lease/epochs/{:020}.json", head.get() + 1);
        std::fs::write(
            tmp.path().join("sup").join(&forged),
            br#"{"schema":"runlease/epoch/1","run_id":"other"}"#,
        )
        .unwrap();
        assert_eq!(superseded_by(&auth, head), None, "{forged}");
    }
}
