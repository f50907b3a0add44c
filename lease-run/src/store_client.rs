//! The store socket as a command uses it (issue #29): a command of a run opened with
//! [`crate::OpenOptions::serve_store`] finds the owner's socket in [`SOCKET_VAR`], and
//! [`StoreClient`] reads and commits through the owner, every write stamped with the
//! owner's generation (a fenced owner's socket refuses). The handshake and the frames
//! behind it are the crate's own (`store_socket`, PROTOCOL's store socket section).
//!
//! ```no_run
//! use lease_run::store_client::StoreClient;
//! use lease_run::Batch;
//! # fn main() -> Result<(), lease_run::RunError> {
//! // Inside a command started by an owner that serves its store:
//! let mut client = StoreClient::from_env()?.expect("started by a serving owner");
//! let seq = client.commit(&Batch::new().put("step/2", "done"))?;
//! println!("committed {seq} as generation {}", client.generation());
//! # Ok(()) }
//! ```

pub use crate::store_socket::{
    Answer, Op, SOCKET_VAR, ServedRun, StoreClient, WireCommit, WireDoc, WireWrite,
};
