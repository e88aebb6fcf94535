//! Client connections, in every state of their life (docs/DESIGN.md, "The life of a
//! connection"), by protocol: HTTP/1.x in `http1/` (waiting for a request, reading it, queued
//! and answered, its client watched for leaving meanwhile, writing the answer; a WebSocket, from
//! its handshake to its close), HTTP/2 in `h2/`, each of its streams a request like an HTTP/1.1
//! one. The two never import each other: what a request is, whichever of the two brought it,
//! is written once in `exchange.rs` (its body's pace, the `Job`, the --queue-timeout 503, its
//! count and access line, the drain after a refusal) and `body.rs` (its body, in memory or a
//! file), and they meet in `opening.rs`, which says which serves a connection (ALPN, or a plain
//! connection's first bytes) and hands it from one to the other.
//!
//! Beside them, what both use: the PROXY header's and the forwarded headers' client
//! (`proxies.rs`), the memory of incomplete heads (`heads.rs`), asleep between requests
//! (`asleep.rs`, woken by `wake.rs`), the counts by state (`states.rs`), what a connection is
//! (`peer.rs`). A TLS listener's connections begin with a handshake (`handshake.rs`), and are
//! then read and written through rustls (`tls/`, with its certificate).
//!
//! It may import the queue (`seating`: a request goes in as a `Job`, its answer comes back
//! through the spool) and the logs; each task is handed what it needs in `context.rs` (the
//! settings of the exchange, the queue, the budgets, where an idle connection goes) and counts
//! into `counts.rs`. Never the workers or their supervision, which it meets only through the
//! queue.

pub(crate) mod asleep;
mod body;
pub(crate) mod context;
pub(crate) mod counts;
mod exchange;
pub(crate) mod h2;
pub(crate) mod handshake;
pub(crate) mod heads;
mod http1;
pub(crate) mod opening;
pub(crate) mod peer;
pub(crate) mod proxies;
pub(crate) mod states;
pub(crate) mod tls;
pub(crate) mod wake;

use std::time::Duration;

use maitred_protocol::RequestError;

/// How long a connection waits in its task, in either protocol, before it hibernates
/// (`asleep.rs`).
pub const HIBERNATE_AFTER: Duration = Duration::from_millis(500);

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
