//! The marker of a simulated crash: the error the simulated file system (`sim`, feature
//! `sim`) returns after its crash point, which the durable primitives carry through their
//! state machine unchanged. Always compiled: the primitives recognise it whether or not the
//! simulator is built.

use std::{fmt, io};

/// The payload of the error every call returns once a crash point is reached.
#[derive(Debug)]
pub(crate) struct SimulatedCrash;

impl fmt::Display for SimulatedCrash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("simulated crash")
    }
}

impl std::error::Error for SimulatedCrash {}

/// Whether `err` is the error a `SimFs` returns after its crash point (see
/// `SimFs::crash_after`), as opposed to an injected fault or a real failure.
pub fn is_simulated_crash(err: &io::Error) -> bool {
    err.get_ref()
        .is_some_and(|e| e.downcast_ref::<SimulatedCrash>().is_some())
}
