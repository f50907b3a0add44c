//! The inspection and repair subcommands, one module per job: [`inspect`] (status, list,
//! init), [`replace`] (takeover, retire), [`release`](mod@release), [`log`] (append, events) and
//! [`repair`] (verify, doctor, prune) and [`store`] (store get, list, log). `run` is `crate::run`.

mod inspect;
mod log;
mod release;
mod repair;
mod replace;
pub(crate) mod store;

pub use inspect::{init, list, status};
pub use log::{AppendOpts, append, events};
pub use release::{ReleaseOpts, release};
pub use repair::{doctor, prune, verify};
pub use replace::{TakeoverOpts, retire, takeover};
pub use store::{WriteRequest, store_get, store_list, store_log, store_write};
