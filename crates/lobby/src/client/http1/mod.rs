//! HTTP/1.x connections, from their first request to their close: the connection's task
//! (`task.rs`: the wait between requests, the queue, the keep-alive or the sleep), reading a
//! request (`read.rs`, with the PROXY header and a plain connection's first bytes), its client
//! watched for leaving while it waits (`watch.rs`), writing its answer (`write.rs`), and a
//! WebSocket, from its handshake (an HTTP/1.1 upgrade) to its close (`websocket/`).
//!
//! It translates HTTP/1.1's wire format into the exchange (`client/exchange.rs`: what a
//! request is, whatever protocol brought it) and back; it never imports HTTP/2's files. A plain
//! connection that opens with HTTP/2's preface goes back to `client/opening.rs` as `NotHttp1`,
//! which hands it to `client/h2/`.

mod pump;
mod read;
mod task;
mod watch;
mod websocket;
mod write;

use std::rc::Rc;
use std::time::Instant;

use bytes::BytesMut;
use maitred_protocol::{Opening, RequestDecoder};
use tokio::sync::OwnedSemaphorePermit;

use crate::client::context::Context;
use crate::client::peer::{Peer, Site};
use crate::client::states::{ConnectionState, StateMark};

/// A connection's task, in whatever it is doing. Its `impl` is spread over files by concern:
/// `task.rs` (the life between requests, and the queue), `watch.rs` (the client while its
/// request waits and its answer streams), `read.rs` and `write.rs`, `websocket/`.
pub(super) struct Connection<S> {
    context: Rc<Context>,
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

impl<S> Connection<S> {
    /// A connection about to wait for its first request (`answered` 0), or its next one after
    /// hibernating; `task.rs`'s `run` serves it.
    pub(super) fn new(
        context: &Rc<Context>,
        stream: S,
        peer: Peer,
        site: Rc<Site>,
        permit: OwnedSemaphorePermit,
        answered: u64,
    ) -> Connection<S> {
        Connection {
            context: context.clone(),
            stream,
            peer,
            site,
            permit,
            buf: BytesMut::new(),
            decoder: RequestDecoder::new(context.limits()),
            answered,
            request_started: Instant::now(),
            mark: context.connection_states.mark(ConnectionState::Idle),
        }
    }

    /// What a connection that is not HTTP/1.x's hands back, all that was read of it included.
    fn not_http1(self, opening: Opening) -> NotHttp1<S> {
        let Connection { context, stream, peer, site, permit, buf, .. } = self;
        NotHttp1 { context, stream, buf, peer, site, permit, opening }
    }
}

/// A plain connection that opened with other bytes than an HTTP/1.x request's: HTTP/2's
/// preface, or (where only HTTP/2 is spoken) neither protocol's.
pub(super) struct NotHttp1<S> {
    pub context: Rc<Context>,
    pub stream: S,
    /// What was read of it, the preface's first bytes among them.
    pub buf: BytesMut,
    pub peer: Peer,
    pub site: Rc<Site>,
    pub permit: OwnedSemaphorePermit,
    /// `Opening::Http2` or `Opening::InvalidPreface`.
    pub opening: Opening,
}
