//! Client connections, in every state of their life (docs/DESIGN.md, "The life of a
//! connection"): waiting for a request, reading it (`read.rs`, with the PROXY header and the
//! forwarded headers of `proxies.rs` and the head budget of `heads.rs`), queued and answered
//! (`task.rs`), writing the answer (`write.rs`), and asleep between requests (`asleep.rs`,
//! woken by `wake.rs`). `states.rs` counts them by state; `peer.rs` says what a connection is.
//!
//! It may import the queue (`seating`: a request goes in as a `Job`, its answer comes back
//! through the spool), the logs and the shared context (`Lobby`); never the workers or their
//! supervision, which it meets only through the queue.

pub(crate) mod asleep;
pub(crate) mod heads;
pub(crate) mod peer;
pub(crate) mod proxies;
mod read;
pub(crate) mod states;
pub(crate) mod task;
pub(crate) mod wake;
mod write;

use maitred_protocol::RequestError;

/// Why a connection stops reading requests.
enum Stop {
    /// The client closed, the connection idled out, or the lobby is shutting down.
    Quietly,
    /// The request is refused with this status and reason; the connection closes after it.
    Refuse(u16, String),
}

impl From<RequestError> for Stop {
    fn from(e: RequestError) -> Stop {
        Stop::Refuse(e.status(), e.to_string())
    }
}
