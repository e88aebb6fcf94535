//! Client connections, in every state of their life (docs/DESIGN.md, "The life of a
//! connection"): waiting for a request, reading it (`read.rs`, with the PROXY header and the
//! forwarded headers of `proxies.rs` and the head budget of `heads.rs`), queued and answered
//! (`task.rs`), its client watched for leaving meanwhile (`watch.rs`), writing the answer
//! (`write.rs`), and asleep between requests (`asleep.rs`,
//! woken by `wake.rs`); a WebSocket, from its handshake to its close (`websocket/`). `states.rs`
//! counts them by state; `peer.rs` says what a connection is. A TLS listener's connections begin
//! with a handshake (`handshake.rs`), and are then read and written through rustls (`tls/`, with
//! its certificate). A connection whose client speaks HTTP/2 (chosen by
//! ALPN in `handshake.rs`, or by its preface on a plain listener in `task.rs`) is served by
//! `h2/` instead, each of its streams a request like an HTTP/1.1 one. What a request is,
//! whichever of the two brought it, is written once in `exchange.rs` (its body's pace, the
//! `Job`, the --queue-timeout 503, the drain after a refusal) and `body.rs` (its body, in memory
//! or a file).
//!
//! It may import the queue (`seating`: a request goes in as a `Job`, its answer comes back
//! through the spool), the logs and the shared context (`Lobby`); never the workers or their
//! supervision, which it meets only through the queue.

pub(crate) mod asleep;
mod body;
mod exchange;
pub(crate) mod h2;
pub(crate) mod handshake;
pub(crate) mod heads;
mod opening;
pub(crate) mod peer;
pub(crate) mod proxies;
mod read;
pub(crate) mod states;
pub(crate) mod task;
pub(crate) mod tls;
pub(crate) mod wake;
mod watch;
mod websocket;
mod write;

use std::rc::Rc;
use std::time::Instant;

use bytes::BytesMut;
use maitred_protocol::{RequestDecoder, RequestError};
use tokio::sync::OwnedSemaphorePermit;

use crate::lobby::Lobby;
use peer::{Peer, Site};
use states::StateMark;

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

/// A connection's task, in whatever it is doing. Its `impl` is spread over files by concern:
/// `task.rs` (the life between requests, and the queue), `watch.rs` (the client while its
/// request waits and its answer streams), `read.rs` and `write.rs`.
struct Connection<S> {
    lobby: Rc<Lobby>,
    stream: S,
    peer: Peer,
    site: Rc<Site>,
    /// Its place under --max-connections, given back when the connection closes.
    permit: OwnedSemaphorePermit,
    buf: BytesMut,
    decoder: RequestDecoder,
    /// Requests answered so far: a shutdown closes idle connections that have had one (once
    /// they have been idle for `HIBERNATE_AFTER`), but lets a new connection send its first
    /// request.
    answered: u64,
    /// When the current request's head began to be read, for the access log's request time.
    request_started: Instant,
    /// Its place in `maitred_connections`.
    mark: StateMark,
}
