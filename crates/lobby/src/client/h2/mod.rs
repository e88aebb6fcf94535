//! HTTP/2 connections (docs/HTTP2.md), spoken with the h2 crate beside HTTP/1.1's own code: a
//! TLS connection whose client chose `h2` by ALPN (`handshake.rs`), or a plain one that opened
//! with HTTP/2's preface (`opening.rs` looks at the bytes it read first). Each stream is a request
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
//! connection's end says so in one log line naming what the client did, and counts it
//! (`maitred_http2_refused_total`, `maitred_http2_goaways_total`; `reasons.rs`).

/// The write side of a wrapper that replays (`rewound.rs`) what its stream `io` reads: passed
/// through as it is.
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

mod ended;
mod flood;
mod frames;
mod guard;
mod head;
pub(super) mod kept;
mod preface;
pub(crate) mod reasons;
mod rewound;
mod send;
mod sleep;
mod stream;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use h2::server::SendResponse;
use h2::{Reason, SendStream};
use maitred_protocol::{MAX_HEAD_SIZE, PREFACE};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{sleep_until, Instant};

use super::peer::{ClientStream, Peer, Site, TlsAbout};
use super::states::ConnectionState;
use super::HIBERNATE_AFTER;
use crate::client::context::Context;
use crate::log::{self, debug};
use kept::Http2Sleep as Asleep;
pub(super) use preface::refuse_preface;
use reasons::{GoawayReason, Http2Refusal, StreamStage};
use rewound::Rewound;
use sleep::Lent;

/// Frame types (RFC 9113 6), for the frames the lobby watches go by (`guard.rs`, `sleep.rs`) or writes
/// itself (`preface.rs`).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
/// The flag of a SETTINGS or PING frame that acknowledges one.
const ACK: u8 = 0x1;

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
/// Heads handed to the h2 crate and not yet seen written that a connection remembers, in
/// `--http2-max-concurrent-streams`: more than its streams can be answering at once.
const HEADS_REMEMBERED_PER_STREAM: usize = 4;
/// Streams the lobby reset for the client's errors; past it, GOAWAY (ENHANCE_YOUR_CALM).
const LOCAL_ERROR_RESETS: usize = 256;
/// Bounds of the h2 crate's own, which it does not export, for the log lines: the empty DATA
/// frames it takes (`MAX_RECV_EMPTY_DATA_FRAMES`), and how many times
/// SETTINGS_MAX_HEADER_LIST_SIZE a header block may decode to before it ends the connection
/// (`MAX_HEADER_LIST_ABUSE_MULTIPLIER`), in h2 0.4.20, the version Cargo.toml pins; the test
/// below reads them from the crate's source.
const H2_EMPTY_DATA_FRAMES: usize = 100;
const H2_HEADER_LIST_ABUSE_FACTOR: usize = 4;

/// What a connection's streams share with it.
struct Shared {
    context: Rc<Context>,
    site: Rc<Site>,
    /// The client, as the socket (or its PROXY header) says.
    peer: Option<SocketAddr>,
    peer_text: String,
    tls: Option<TlsAbout>,
    /// --max-connections, from which a body's or an answer's temporary file takes a place.
    descriptors: Arc<Semaphore>,
    /// Streams being served.
    open: Cell<usize>,
    /// Set by a stream whose client took nothing for --send-timeout, or by `guard.rs` for a
    /// flood: what the client did, and the line's words for it. The connection closes.
    cut: RefCell<Option<(Http2Refusal, String)>>,
    /// The connection has ended (or is being cut): its streams' resets are its end's, not
    /// resets their client sent.
    ended: Cell<bool>,
    /// The payload of the last GOAWAY the h2 crate wrote (`guard.rs`): its debug data names the
    /// flood the crate found.
    goaway_sent: RefCell<Vec<u8>>,
    /// Streams whose head the lobby handed to the h2 crate and `guard.rs` has not yet seen
    /// written: a few, one per stream being answered.
    heads_coming: RefCell<Vec<u32>>,
    /// Told when a stream ends or asks for the cut.
    changed: Notify,
}

impl Shared {
    fn stream_ended(&self) {
        self.open.set(self.open.get() - 1);
        self.changed.notify_one();
    }

    /// A stream its client reset (RST_STREAM), unless the connection's end reset it.
    fn client_reset(&self, stage: StreamStage) {
        if !self.ended.get() {
            self.context.counts.http2_stream_reset(stage);
        }
    }

    fn cut(&self, refusal: Http2Refusal, why: String) {
        self.cut.borrow_mut().get_or_insert((refusal, why));
        self.changed.notify_one();
    }

    /// Hands a stream's head to the h2 crate, telling `guard.rs` to expect it written. A head
    /// the crate then drops unwritten (its stream reset meanwhile) is forgotten once enough
    /// newer ones wait: the crate writes heads in the order given.
    fn send_head(
        &self,
        respond: &mut SendResponse<Bytes>,
        head: http::Response<()>,
        end_of_stream: bool,
    ) -> Result<SendStream<Bytes>, h2::Error> {
        let stream = u32::from(respond.stream_id());
        {
            let mut coming = self.heads_coming.borrow_mut();
            let remembered = HEADS_REMEMBERED_PER_STREAM * self.context.settings().http.max_concurrent_streams as usize;
            if coming.len() >= remembered {
                coming.remove(0);
            }
            coming.push(stream);
        }
        let sent = respond.send_response(head, end_of_stream);
        if sent.is_err() {
            self.head_written(stream);
        }
        sent
    }

    /// A HEADERS frame for `stream` was written (or will not be): whether it was a head the
    /// lobby handed over.
    fn head_written(&self, stream: u32) -> bool {
        let mut coming = self.heads_coming.borrow_mut();
        let Some(at) = coming.iter().position(|&id| id == stream) else { return false };
        coming.swap_remove(at);
        true
    }

    /// The h2 crate answered a stream 431 by itself (`guard.rs` saw it go by): its header list
    /// decoded past the 64 KiB a head may have, short of the four times that end the connection.
    /// One line and the count, as the lobby's own refusals have (`send::refuse`).
    fn header_list_refused(&self, stream: u32) {
        log::info_limited!(
            "431 to {} (HTTP/2): stream {stream}'s header list decodes past the {MAX_HEAD_SIZE} bytes a head may \
             have (an HPACK bomb, or fields too large); the h2 crate answered 431 and reset the stream",
            self.peer_text
        );
        self.context.counts.refused(431);
        self.context.counts.answered_http2();
    }
}

/// Serves an HTTP/2 connection from its preface on, to its close or until it is quiet enough
/// to hibernate (the caller spawns it as the connection's task, `client/opening.rs`): `first`,
/// the bytes already read from it, are read again.
pub(super) fn serve_new<S: ClientStream>(
    context: &Rc<Context>,
    stream: S,
    first: BytesMut,
    peer: Peer,
    site: Rc<Site>,
    permit: OwnedSemaphorePermit,
) -> impl Future<Output = Option<Quiet<S>>> {
    let idle_deadline = Instant::now() + context.settings().header_timeout;
    connection(context, stream, first, site, None, Ended { peer, permit, idle_deadline })
}

/// Wakes a hibernating HTTP/2 connection (`sleep.rs`): its client spoke, its time is up, or the
/// lobby is stopping. A new h2 connection goes on where the old one stopped.
pub(super) fn serve_woken<S: ClientStream>(
    context: &Rc<Context>,
    stream: S,
    peer: Peer,
    site: Rc<Site>,
    permit: OwnedSemaphorePermit,
    asleep: Asleep,
    deadline: std::time::Instant,
) -> impl Future<Output = Option<Quiet<S>>> {
    let preamble = asleep.preamble();
    connection(context, stream, preamble, site, Some(asleep), Ended { peer, permit, idle_deadline: deadline.into() })
}

/// A connection without a stream, quiet long enough to hibernate (`HIBERNATE_AFTER`): what its
/// `Sleeper` is made of.
pub(super) struct Quiet<S> {
    pub context: Rc<Context>,
    pub stream: S,
    pub peer: Peer,
    pub site: Rc<Site>,
    pub permit: OwnedSemaphorePermit,
    /// Whether it has served a stream (1) or not (0), as a `Sleeper` counts its requests.
    pub answered: u64,
    /// When it closes if the client says nothing.
    pub deadline: std::time::Instant,
    pub kept: Asleep,
}

/// The connection's stream as the h2 crate has it, and as the task takes it back to hibernate.
type Io<S> = Guarded<Rewound<S>>;
use guard::Guarded;

fn connection<S: ClientStream>(
    context: &Rc<Context>,
    stream: S,
    first: BytesMut,
    site: Rc<Site>,
    woken: Option<Asleep>,
    end: Ended,
) -> impl Future<Output = Option<Quiet<S>>> {
    let shared = Rc::new(Shared {
        context: context.clone(),
        site,
        peer: end.peer.addr,
        peer_text: end.peer.display(),
        tls: stream.tls().cloned(),
        descriptors: end.permit.semaphore().clone(),
        open: Cell::new(0),
        cut: RefCell::new(None),
        ended: Cell::new(false),
        goaway_sent: RefCell::new(Vec::new()),
        heads_coming: RefCell::new(Vec::new()),
        changed: Notify::new(),
    });
    let io = Guarded::new(Rewound::new(first, stream), shared.clone(), woken.as_ref());
    serve(shared, io, end)
}

/// What the connection's task holds for its end: to hibernate, the rest of a `Quiet`.
struct Ended {
    peer: Peer,
    permit: OwnedSemaphorePermit,
    /// When the connection closes without a stream: --header-timeout before its first,
    /// --keep-alive after each.
    idle_deadline: Instant,
}

/// A stream the client opened: its request, and where its answer goes.
type Incoming = (http::Request<h2::RecvStream>, SendResponse<Bytes>);

/// What woke the connection's task.
enum Event {
    Accepted(Option<Result<Box<Incoming>, h2::Error>>),
    Shutdown,
    Idle,
    Hibernate,
    Changed,
}

async fn serve<S: ClientStream>(shared: Rc<Shared>, io: Io<S>, end: Ended) -> Option<Quiet<S>> {
    let context = shared.context.clone();
    let Ended { peer, permit, idle_deadline } = end;
    // The connection counts in `maitred_connections` while it has no stream; with streams, its
    // streams count, each as the request it is (`stream.rs`), so that the queue's requests and
    // the connections waiting for them stay one to one.
    let mut mark = Some(context.connection_states.mark(ConnectionState::Reading));
    let settings = context.settings();
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
    let (io, slot) = Lent::new(io);
    let mut connection = match tokio::time::timeout(settings.header_timeout, builder.handshake::<_, Bytes>(io)).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(e)) => {
            log::info_limited!("HTTP/2 connection from {} failed at its start: {e}", shared.peer_text);
            return None;
        }
        Err(_) => {
            log::info_limited!(
                "closed the HTTP/2 connection from {}: its preface did not arrive within --header-timeout",
                shared.peer_text
            );
            return None;
        }
    };
    if let Some(mark) = mark.as_mut() {
        mark.set(ConnectionState::Idle);
    }
    let mut shutdown = context.shutdown.clone();
    let mut going_away = false;
    let mut cut = false;
    let mut served = false;
    let mut idle_deadline = Some(idle_deadline);
    let mut hibernate_at = Some(Instant::now() + HIBERNATE_AFTER);
    loop {
        let event = tokio::select! {
            accepted = connection.accept() => Event::Accepted(accepted.map(|stream| stream.map(Box::new))),
            _ = shutdown.wait_for(|stopping| *stopping), if !going_away => Event::Shutdown,
            _ = sleep_until(idle_deadline.unwrap_or_else(Instant::now)), if idle_deadline.is_some() && !going_away => Event::Idle,
            _ = sleep_until(hibernate_at.unwrap_or_else(Instant::now)), if hibernate_at.is_some() && !going_away => Event::Hibernate,
            _ = shared.changed.notified() => Event::Changed,
        };
        match event {
            Event::Accepted(None) => {
                shared.ended.set(true);
                break;
            }
            Event::Accepted(Some(Ok(incoming))) => {
                let (request, respond) = *incoming;
                shared.open.set(shared.open.get() + 1);
                idle_deadline = None;
                hibernate_at = None;
                served = true;
                mark = None;
                tokio::task::spawn_local(stream::serve(shared.clone(), request, respond));
            }
            Event::Accepted(Some(Err(e))) => {
                shared.ended.set(true);
                // A connection the lobby cut has had its line already.
                if !cut {
                    ended::ended(&shared, &e);
                }
                break;
            }
            Event::Shutdown if shared.open.get() > 0 => {
                // GOAWAY: no new stream; those open are answered, within --graceful-timeout.
                debug!("HTTP/2 connection from {}: GOAWAY for the shutdown", shared.peer_text);
                connection.graceful_shutdown();
                context.counts.http2_goaway(GoawayReason::Shutdown);
                going_away = true;
            }
            // Without a stream there is nothing to finish: GOAWAY with the last stream taken,
            // and the close, without waiting for the client to answer the graceful GOAWAY's PING
            // (a stream it sent meanwhile is one it knows it may send again).
            Event::Shutdown => {
                debug!("HTTP/2 connection from {} idle at a shutdown: GOAWAY", shared.peer_text);
                connection.abrupt_shutdown(Reason::NO_ERROR);
                context.counts.http2_goaway(GoawayReason::Shutdown);
                going_away = true;
            }
            Event::Idle => {
                debug!("HTTP/2 connection from {} idle past its timeout: GOAWAY", shared.peer_text);
                connection.abrupt_shutdown(Reason::NO_ERROR);
                context.counts.http2_goaway(GoawayReason::Idle);
                going_away = true;
            }
            Event::Hibernate => {
                let asleep =
                    slot.borrow_mut().as_mut().filter(|io| io.get_ref().is_drained()).and_then(Guarded::asleep);
                match (asleep, idle_deadline) {
                    (Some(asleep), Some(deadline)) if !connection.has_streams() => {
                        drop(connection);
                        let io = slot.borrow_mut().take().expect("lent to the h2 crate, which is gone");
                        return Some(Quiet {
                            context: context.clone(),
                            stream: io.into_inner().into_inner(),
                            peer,
                            site: shared.site.clone(),
                            permit,
                            answered: u64::from(served),
                            deadline: deadline.into_std(),
                            kept: asleep,
                        });
                    }
                    // Not quiet yet (or a client that keeps its windows low): later.
                    _ => hibernate_at = Some(Instant::now() + HIBERNATE_AFTER),
                }
            }
            Event::Changed => {
                if let Some((refusal, why)) = shared.cut.borrow_mut().take() {
                    shared.ended.set(true);
                    log::info_limited!(
                        "HTTP/2 connection from {} refused: {why}; GOAWAY ENHANCE_YOUR_CALM, connection closed",
                        shared.peer_text
                    );
                    context.counts.http2_refused(refusal);
                    connection.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
                    going_away = true;
                    cut = true;
                }
                if shared.open.get() == 0 {
                    mark.get_or_insert_with(|| context.connection_states.mark(ConnectionState::Idle));
                    let now = Instant::now();
                    idle_deadline = Some(now + context.settings().keep_alive);
                    hibernate_at = Some(now + HIBERNATE_AFTER);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::{H2_EMPTY_DATA_FRAMES, H2_HEADER_LIST_ABUSE_FACTOR};

    /// The source folder of the h2 crate this build uses, as cargo has it.
    fn h2_source() -> PathBuf {
        let metadata = Command::new(env!("CARGO"))
            .args(["metadata", "--format-version", "1", "--offline", "--manifest-path"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .output()
            .expect("cargo metadata runs");
        assert!(metadata.status.success(), "{}", String::from_utf8_lossy(&metadata.stderr));
        let metadata: serde_json::Value = serde_json::from_slice(&metadata.stdout).expect("cargo metadata's JSON");
        let h2 = metadata["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .find(|package| package["name"] == "h2")
            .expect("h2 among the packages");
        let manifest = PathBuf::from(h2["manifest_path"].as_str().expect("h2's manifest path"));
        manifest.parent().expect("h2's folder").join("src")
    }

    /// The value of `const NAME: usize = N;` in `file`.
    fn usize_const(file: &Path, name: &str) -> usize {
        let source = std::fs::read_to_string(file).expect("h2's source");
        let line = source
            .lines()
            .find(|line| line.contains(&format!("const {name}: usize = ")))
            .unwrap_or_else(|| panic!("{name} is no longer in {}", file.display()));
        let value = line.rsplit("= ").next().expect("a value").trim_end_matches(';');
        value.parse().unwrap_or_else(|_| panic!("{name}'s value: {line}"))
    }

    #[test]
    fn the_h2_crate_s_private_bounds_are_those_the_log_lines_name() {
        let src = h2_source();
        assert_eq!(usize_const(&src.join("proto/mod.rs"), "MAX_RECV_EMPTY_DATA_FRAMES"), H2_EMPTY_DATA_FRAMES);
        assert_eq!(
            usize_const(&src.join("frame/headers.rs"), "MAX_HEADER_LIST_ABUSE_MULTIPLIER"),
            H2_HEADER_LIST_ABUSE_FACTOR
        );
    }
}
