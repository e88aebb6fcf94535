//! HTTP/2 connections (docs/HTTP2.md), spoken with the h2 crate beside HTTP/1.1's own code: a
//! TLS connection whose client chose `h2` by ALPN (`handshake.rs`), or a plain one that opened
//! with HTTP/2's preface (`task.rs` looks at the bytes it read first). Each stream is a request
//! like an HTTP/1.1 one (`stream.rs`, with its head checked in `head.rs`): read whole, queued as
//! a `Job`, answered through the spool. The queue and the workers never learn the protocol.
//!
//! The connection's task (`serve`) drives the h2 connection: it accepts streams, each served by
//! a task of its own, sends GOAWAY at a shutdown or a binary upgrade (an HTTP/2 connection is
//! never handed over: it finishes its streams here) and after `--keep-alive` without a stream,
//! and closes when a stream's client took nothing for `--send-timeout`. What a client may make
//! it hold is bounded by the settings below; the h2 crate refuses the floods it knows
//! (rapid reset, CONTINUATION, headers past the list size, too many locally reset streams,
//! empty DATA frames) with GOAWAY, `guard.rs` those it does not (SETTINGS and PING), and the
//! connection's end says so in one log line.

/// The write side of a wrapper that watches (`guard.rs`) or replays (`rewound.rs`) what its
/// stream `io` reads: passed through as it is.
macro_rules! write_through {
    ($wrapper:ident) => {
        impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for $wrapper<T> {
            fn poll_write(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                data: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.io).poll_write(cx, data)
            }

            fn poll_flush(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.io).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
            }

            fn poll_write_vectored(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.io.is_write_vectored()
            }
        }
    };
}

mod guard;
mod head;
mod rewound;
mod send;
mod stream;

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use h2::Reason;
use maitred_protocol::MAX_HEAD_SIZE;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{sleep_until, Instant};

use super::peer::{Peer, Site, TlsAbout};
use super::states::ConnectionState;
use crate::lobby::Lobby;
use crate::log::{self, debug};
pub(super) use rewound::Rewound;

/// The client connection preface (RFC 9113 3.4).
pub(super) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// What a stream may send before the lobby has taken its bytes: its body goes on to the
/// request's buffer or file as it comes, and each byte taken opens the window again.
const STREAM_WINDOW: u32 = 256 * 1024;
/// The same for the whole connection: a few streams' bodies arrive at full speed together.
const CONNECTION_WINDOW: u32 = 1024 * 1024;
/// Answer bytes the h2 crate holds per stream for a client that reads slowly; the rest waits in
/// the answer's spool, as an HTTP/1.1 answer's does.
const SEND_BUFFER: usize = 64 * 1024;
/// Streams the client opened and reset before the lobby accepted them; past it, GOAWAY
/// (ENHANCE_YOUR_CALM): the rapid reset attack (CVE-2023-44487).
const PENDING_ACCEPT_RESETS: usize = 20;
/// Streams the lobby reset for the client's errors; past it, GOAWAY (ENHANCE_YOUR_CALM).
const LOCAL_ERROR_RESETS: usize = 256;

/// Whether a plain connection's first bytes are HTTP/2's preface, or its beginning: "PRI " is
/// no method any HTTP/1.1 client sends (RFC 9113 3.4 reserves it), and four bytes come in one
/// segment.
pub(super) fn opens_with_preface(first: &[u8]) -> bool {
    let n = first.len().min(PREFACE.len());
    n >= 4 && first[..n] == PREFACE[..n]
}

/// What a connection's streams share with it.
struct Shared {
    lobby: Rc<Lobby>,
    site: Rc<Site>,
    /// The client, as the socket (or its PROXY header) says.
    peer: Option<SocketAddr>,
    peer_text: String,
    tls: Option<TlsAbout>,
    /// --max-connections, from which a body's or an answer's temporary file takes a place.
    descriptors: Arc<Semaphore>,
    /// Streams being served.
    open: Cell<usize>,
    /// Set by a stream whose client took nothing for --send-timeout: the connection closes.
    cut: RefCell<Option<String>>,
    /// Told when a stream ends or asks for the cut.
    changed: Notify,
}

impl Shared {
    fn stream_ended(&self) {
        self.open.set(self.open.get() - 1);
        self.changed.notify_one();
    }

    fn cut(&self, why: String) {
        self.cut.borrow_mut().get_or_insert(why);
        self.changed.notify_one();
    }
}

/// Serves an HTTP/2 connection from its preface on, in a task of its own.
pub(super) fn start<T>(
    lobby: &Rc<Lobby>,
    io: T,
    peer: &Peer,
    site: Rc<Site>,
    permit: OwnedSemaphorePermit,
    tls: Option<TlsAbout>,
) where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let shared = Rc::new(Shared {
        lobby: lobby.clone(),
        site,
        peer: peer.addr,
        peer_text: peer.display(),
        tls,
        descriptors: permit.semaphore().clone(),
        open: Cell::new(0),
        cut: RefCell::new(None),
        changed: Notify::new(),
    });
    let io = guard::Guarded::new(io, shared.clone());
    tokio::task::spawn_local(serve(shared, io, permit));
}

/// A stream the client opened: its request, and where its answer goes.
type Incoming = (http::Request<h2::RecvStream>, h2::server::SendResponse<Bytes>);

/// What woke the connection's task.
enum Event {
    Accepted(Option<Result<Box<Incoming>, h2::Error>>),
    Shutdown,
    Idle,
    Changed,
}

async fn serve<T: AsyncRead + AsyncWrite + Unpin + 'static>(shared: Rc<Shared>, io: T, _permit: OwnedSemaphorePermit) {
    let lobby = shared.lobby.clone();
    let mut mark = lobby.connection_states.mark(ConnectionState::Reading);
    let settings = lobby.settings();
    let mut builder = h2::server::Builder::new();
    builder
        .max_concurrent_streams(settings.http.max_concurrent_streams)
        // An HTTP/1.1 head is at most 64 KiB: so is an HTTP/2 one, however well it compresses
        // (the HPACK bomb). Past it, the h2 crate answers 431 and resets the stream.
        .max_header_list_size(MAX_HEAD_SIZE as u32)
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_send_buffer_size(SEND_BUFFER)
        .max_pending_accept_reset_streams(PENDING_ACCEPT_RESETS)
        .max_local_error_reset_streams(Some(LOCAL_ERROR_RESETS));
    let mut connection = match tokio::time::timeout(settings.header_timeout, builder.handshake::<T, Bytes>(io)).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(e)) => {
            return log::info_limited!("HTTP/2 connection from {} failed at its start: {e}", shared.peer_text)
        }
        Err(_) => {
            return log::info_limited!(
                "closed the HTTP/2 connection from {}: its preface did not arrive within --header-timeout",
                shared.peer_text
            )
        }
    };
    mark.set(ConnectionState::Idle);
    let mut shutdown = lobby.shutdown.clone();
    let mut going_away = false;
    let mut cut = false;
    // Before its first stream a connection has --header-timeout, as an HTTP/1.1 one has for
    // its first request; then --keep-alive between streams.
    let mut idle_deadline = Some(Instant::now() + settings.header_timeout);
    loop {
        let event = tokio::select! {
            accepted = connection.accept() => Event::Accepted(accepted.map(|stream| stream.map(Box::new))),
            _ = shutdown.wait_for(|stopping| *stopping), if !going_away => Event::Shutdown,
            _ = sleep_until(idle_deadline.unwrap_or_else(Instant::now)), if idle_deadline.is_some() && !going_away => Event::Idle,
            _ = shared.changed.notified() => Event::Changed,
        };
        match event {
            Event::Accepted(None) => break,
            Event::Accepted(Some(Ok(incoming))) => {
                let (request, respond) = *incoming;
                shared.open.set(shared.open.get() + 1);
                idle_deadline = None;
                mark.set(ConnectionState::Awaiting);
                tokio::task::spawn_local(stream::serve(shared.clone(), request, respond));
            }
            Event::Accepted(Some(Err(e))) => {
                // A connection the lobby cut has had its line already.
                if !cut {
                    ended(&shared, &e);
                }
                break;
            }
            Event::Shutdown if shared.open.get() > 0 => {
                // GOAWAY: no new stream; those open are answered, within --graceful-timeout.
                debug!("HTTP/2 connection from {}: GOAWAY for the shutdown", shared.peer_text);
                connection.graceful_shutdown();
                going_away = true;
            }
            // Without a stream there is nothing to finish: GOAWAY with the last stream taken,
            // and the close, without waiting for the client to answer the graceful GOAWAY's PING
            // (a stream it sent meanwhile is one it knows it may send again).
            Event::Shutdown | Event::Idle => {
                debug!("HTTP/2 connection from {} idle at a shutdown or past its timeout: GOAWAY", shared.peer_text);
                connection.abrupt_shutdown(Reason::NO_ERROR);
                going_away = true;
            }
            Event::Changed => {
                if let Some(why) = shared.cut.borrow_mut().take() {
                    log::info_limited!("HTTP/2 connection from {} cut: {why}", shared.peer_text);
                    connection.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
                    going_away = true;
                    cut = true;
                }
                if shared.open.get() == 0 {
                    mark.set(ConnectionState::Idle);
                    idle_deadline = Some(Instant::now() + lobby.settings().keep_alive);
                }
            }
        }
    }
}

/// One line for a connection that ended in an error: the client's (a protocol error, a flood
/// the h2 crate refused) at info, rate-limited; a socket that failed or closed, or a GOAWAY
/// without an error (either side's), at debug.
fn ended(shared: &Shared, e: &h2::Error) {
    if e.is_io() || (e.is_go_away() && e.reason() == Some(Reason::NO_ERROR)) {
        debug!("HTTP/2 connection from {} ended: {e}", shared.peer_text);
    } else {
        log::info_limited!("HTTP/2 connection from {} closed: {e}", shared.peer_text);
    }
}
