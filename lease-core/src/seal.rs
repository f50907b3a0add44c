//! The seal check: is a store at least as far as the lease chain says it must be?

use crate::error::LeaseError;
use crate::ids::{Generation, RunId};
use crate::records::{EpochRecord, Seal};

/// What the run layer observed of its store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreState {
    /// The identity created with the store.
    pub store_id: String,
    /// Its last committed sequence.
    pub head: u64,
}

/// Check a store against the newest seal and the store floor recorded in the chain.
///
/// - A seal for a different store id: `STORE_IDENTITY_MISMATCH` (a restored or foreign copy
///   never passes as the sealed store, whatever its head).
/// - `head < seal.sequence`: `STORE_BEHIND_SEAL`.
/// - `head < floor` (the highest head any change of owner recorded; it survives crashes,
///   which leave no seal): `STORE_BEHIND_SEAL` with `what = "floor"`.
pub fn check_seal(
    run: &RunId,
    seal: Option<&Seal>,
    floor: Option<(u64, Generation)>,
    store: &StoreState,
) -> Result<(), LeaseError> {
    if let Some(seal) = seal {
        // mutant seal_identity_ignored: the seal's store id is not compared (§7.12).
        if seal.store_id.as_str() != store.store_id
            && !crate::mutant::mutant("seal_identity_ignored")
        {
            return Err(LeaseError::StoreIdentityMismatch {
                run: run.to_string(),
                sealed: seal.store_id.to_string(),
                found: store.store_id.clone(),
            });
        }
        // mutant seal_sequence_ignored: a store behind its seal passes (§7.12).
        if store.head < seal.sequence && !crate::mutant::mutant("seal_sequence_ignored") {
            return Err(LeaseError::StoreBehindSeal {
                run: run.to_string(),
                store_id: store.store_id.clone(),
                head: store.head,
                what: "seal",
                required: seal.sequence,
                generation: seal.generation,
            });
        }
    }
    if let Some((required, generation)) = floor {
        // mutant floor_check_skipped: a store behind the chain's floor passes (§7.12).
        if store.head < required && !crate::mutant::mutant("floor_check_skipped") {
            return Err(LeaseError::StoreBehindSeal {
                run: run.to_string(),
                store_id: store.store_id.clone(),
                head: store.head,
                what: "floor",
                required,
                generation,
            });
        }
    }
    Ok(())
}

/// The seal and floor that apply after `epoch` (the head the opener replaced): the seal of
/// a released epoch, and the store floor carried along the chain.
pub fn seal_of(epoch: &EpochRecord) -> (Option<&Seal>, Option<(u64, Generation)>) {
    (
        epoch.seal.as_ref(),
        epoch.store_floor.map(|f| (f, epoch.generation)),
    )
}

/// The seal and floor a new owner must check its store against, from its own epoch and
/// the epoch its claim or takeover replaced (`own.generation − 1`, if it could be read).
///
/// - The seal is the replaced epoch's (only a released epoch has one).
/// - The floor is the highest of the own epoch's `store_floor` (which already folds in the
///   replaced epoch's floor, its seal and, after a takeover or retirement, the store head
///   the superseded owner reported in its last heartbeat; PROTOCOL.md §7.1) and the
///   replaced epoch's own floor (for an epoch written by an older writer that did not fold).
///
/// A `replaced` epoch of another generation than `own − 1` is ignored.
pub fn requirements<'a>(
    own: &'a EpochRecord,
    replaced: Option<&'a EpochRecord>,
) -> (Option<&'a Seal>, Option<(u64, Generation)>) {
    let replaced =
        replaced.filter(|r| r.generation.get().checked_add(1) == Some(own.generation.get()));
    let (seal, replaced_floor) = replaced.map_or((None, None), seal_of);
    let own_floor = own.store_floor.map(|f| (f, own.generation));
    let floor = match (own_floor, replaced_floor) {
        (Some(a), Some(b)) => Some(if b.0 > a.0 { b } else { a }),
        (a, b) => a.or(b),
    };
    (seal, floor)
}

/// What the lease chain requires of the store an owner opens: the seal and the floor
/// ([`requirements`]), as one value. Obtained from the chain ([`Requirements::from_chain`])
/// or, explicitly, for a store used without any lease chain ([`Requirements::no_chain`]):
/// so "no seal, no floor" is never an accident of passing `None, None`.
///
/// ```
/// use lease_core::seal::Requirements;
/// let r = Requirements::no_chain();
/// assert!(r.seal().is_none() && r.floor().is_none() && r.names_no_store());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirements {
    seal: Option<Seal>,
    floor: Option<(u64, Generation)>,
}

impl Requirements {
    /// What the owner of `own` must check: from its own epoch and the one its claim or
    /// takeover replaced ([`requirements`]).
    pub fn from_chain(own: &EpochRecord, replaced: Option<&EpochRecord>) -> Requirements {
        let (seal, floor) = requirements(own, replaced);
        Requirements {
            seal: seal.cloned(),
            floor,
        }
    }

    /// The seal and floor as found elsewhere (an authority that read them itself).
    pub fn new(seal: Option<Seal>, floor: Option<(u64, Generation)>) -> Requirements {
        Requirements { seal, floor }
    }

    /// No lease chain at all: the store is used on its own (lease-sqlite without a run,
    /// tests). Nothing is required of it. A run layer never uses this: its chain decides.
    pub fn no_chain() -> Requirements {
        Requirements {
            seal: None,
            floor: None,
        }
    }

    /// The seal the store must match, if any.
    pub fn seal(&self) -> Option<&Seal> {
        self.seal.as_ref()
    }

    /// The floor the store's head must reach (with the generation that recorded it).
    pub fn floor(&self) -> Option<(u64, Generation)> {
        self.floor
    }

    /// Whether the chain names no store yet (no seal, no floor above 0): the only case in
    /// which a run layer may create a new store.
    pub fn names_no_store(&self) -> bool {
        self.seal.is_none() && self.floor.is_none_or(|(f, _)| f == 0)
    }

    /// [`check_seal`] against these requirements.
    pub fn check(&self, run: &RunId, store: &StoreState) -> Result<(), LeaseError> {
        check_seal(run, self.seal.as_ref(), self.floor, store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Identity;

    fn run() -> RunId {
        RunId::new("r").unwrap()
    }

    #[test]
    fn seal_check_refuses_a_store_behind_its_seal() {
        let seal = Seal {
            store_id: Identity::new("s1").unwrap(),
            sequence: 10,
            generation: Generation::new(3).unwrap(),
        };
        let ok = StoreState {
            store_id: "s1".into(),
            head: 10,
        };
        assert!(check_seal(&run(), Some(&seal), None, &ok).is_ok());
        let behind = StoreState {
            store_id: "s1".into(),
            head: 9,
        };
        let e = check_seal(&run(), Some(&seal), None, &behind).unwrap_err();
        assert_eq!(e.code().as_str(), "STORE_BEHIND_SEAL");
        let other = StoreState {
            store_id: "s2".into(),
            head: 99,
        };
        let e = check_seal(&run(), Some(&seal), None, &other).unwrap_err();
        assert_eq!(e.code().as_str(), "STORE_IDENTITY_MISMATCH");
        let floor = check_seal(
            &run(),
            None,
            Some((5, Generation::FIRST)),
            &StoreState {
                store_id: "x".into(),
                head: 4,
            },
        );
        assert_eq!(floor.unwrap_err().code().as_str(), "STORE_BEHIND_SEAL");
    }

    fn g(n: u64) -> Generation {
        Generation::new(n).unwrap()
    }

    /// Epoch `n` with `store_floor` and, if given, the seal of its release.
    fn epoch(n: u64, store_floor: Option<u64>, seal: Option<Seal>) -> EpochRecord {
        let id = |s: &str| Identity::new(s).unwrap();
        EpochRecord {
            run_id: run(),
            generation: g(n),
            prev_hash: None,
            state: if seal.is_some() {
                crate::records::EpochState::Released
            } else {
                crate::records::EpochState::Active
            },
            owner_id: id("owner"),
            holder: crate::records::Holder {
                host: id("host"),
                boot_id: id("boot"),
                pid: 1,
                start_time: 1,
            },
            claimed_at: crate::time::Timestamp::EPOCH,
            policy: crate::policy::TimingPolicy::default(),
            retired: None,
            seal,
            store_floor,
            cutoff_hash: None,
        }
    }

    /// Store `s1`'s seal at `sequence`, written by generation 1.
    fn seal_at(sequence: u64) -> Seal {
        Seal {
            store_id: Identity::new("s1").unwrap(),
            sequence,
            generation: g(1),
        }
    }

    /// The requirements of a new owner: the replaced epoch's seal, and the higher of the
    /// two floors with the generation that recorded it (a tie names the own epoch, which
    /// folds the replaced floor in).
    #[test]
    fn requirements_take_the_replaced_seal_and_the_higher_floor() {
        let seal = seal_at(4);
        let replaced = epoch(1, Some(7), Some(seal.clone()));
        let r = Requirements::from_chain(&epoch(2, Some(3), None), Some(&replaced));
        assert_eq!(r.seal(), Some(&seal));
        assert_eq!(r.floor(), Some((7, g(1))));
        assert!(!r.names_no_store());
        let floor_with_own =
            |own| Requirements::from_chain(&epoch(2, Some(own), None), Some(&replaced)).floor();
        assert_eq!(floor_with_own(9), Some((9, g(2))));
        assert_eq!(floor_with_own(7), Some((7, g(2))));
    }

    /// Only no seal and no floor above 0 names no store.
    #[test]
    fn names_no_store_only_without_a_seal_or_a_floor_above_zero() {
        let seal = seal_at(0);
        assert!(Requirements::no_chain().names_no_store());
        assert!(Requirements::new(None, Some((0, g(1)))).names_no_store());
        assert!(!Requirements::new(None, Some((1, g(1)))).names_no_store());
        assert!(!Requirements::new(Some(seal), None).names_no_store());
    }

    #[test]
    fn requirements_check_the_store_against_their_seal_and_floor() {
        let store = |head| StoreState {
            store_id: "s1".into(),
            head,
        };
        let behind = |e: &LeaseError, seal_or_floor: &str, at: u64| {
            matches!(e, LeaseError::StoreBehindSeal { what, required, .. }
                if *what == seal_or_floor && *required == at)
        };
        let floor = Requirements::new(None, Some((5, g(2))));
        assert_eq!(floor.check(&run(), &store(5)), Ok(()));
        let e = floor.check(&run(), &store(4)).unwrap_err();
        assert!(behind(&e, "floor", 5), "{e:?}");
        let seal = seal_at(3);
        let sealed = Requirements::new(Some(seal), None);
        let e = sealed.check(&run(), &store(2)).unwrap_err();
        assert!(behind(&e, "seal", 3), "{e:?}");
    }
}
