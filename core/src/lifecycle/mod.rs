//! A communicator's life beyond one init and one destroy: `split(color, key)` into
//! sub-communicators (`split.rs`), `shrink(exclude)` to carry on without failed ranks
//! (`shrink.rs`), and init that does not block the caller (`pending.rs`). Abort is
//! `Comm::abort` over the transport's peer table (`transport::peers`).

mod pending;
mod shrink;
mod split;

pub use pending::{InitState, PendingComm};
pub use shrink::ShrinkMode;
pub use split::OCCL_SPLIT_NOCOLOR;
