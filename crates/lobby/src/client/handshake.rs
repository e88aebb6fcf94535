//! A TLS listener's connection before its first request: the handshake, bounded like a
//! request head (docs/TLS.md). It must finish within `--header-timeout`, and its buffers
//! count against `--max-head-memory` meanwhile; a client that sends plain HTTP gets a 400
//! saying so, in plain HTTP, and one rate-limited log line. Then the connection's task
//! begins (`http1/`, through `opening.rs`), reading and writing through rustls (`tls/`); or, when the client
//! chose `h2` by ALPN, an HTTP/2 connection's (`h2/`).

use std::future::poll_fn;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use maitred_protocol::write_error_response;
use rustls::{ServerConfig, ServerConnection};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{sleep_until, Instant};

use super::exchange::{self, http_date, Linger};
use super::opening;
use super::peer::{ClientStream, Peer, Site};
use super::states::ConnectionState;
use super::tls::{SyncIo, TlsStream};
use crate::client::context::Context as Connections;
use crate::log::{self, debug};

/// What a handshake holds, counted against `--max-head-memory`: rustls's record buffer for
/// a full record (16 KiB and its header) and the server's first flight, about 4 KiB.
const HANDSHAKE_MEMORY: usize = 24 * 1024;
/// The first byte of a TLS record carrying a handshake message (RFC 8446, 5.1).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// How long, and how much input, a client refused for plain HTTP is drained before the close,
/// so that the kernel does not reset the refusal away.
const LINGER: Linger = Linger { time: Duration::from_secs(1), bytes: 64 * 1024 };

/// Starts a TLS connection: its handshake, then its task.
pub fn start<S: ClientStream>(
    context: &Rc<Connections>,
    io: S,
    peer: Peer,
    site: Rc<Site>,
    permit: OwnedSemaphorePermit,
) {
    tokio::task::spawn_local(handshake(context.clone(), io, peer, site, permit));
}

/// Why a handshake did not finish.
enum Failure {
    /// The client closed, or its socket failed.
    Closed,
    /// It sent an HTTP request line: it speaks plain HTTP.
    PlainHttp,
    /// Its first byte is neither TLS nor HTTP.
    NotTls(u8),
    Tls(rustls::Error),
}

async fn handshake<S: ClientStream>(
    context: Rc<Connections>,
    mut io: S,
    peer: Peer,
    site: Rc<Site>,
    permit: OwnedSemaphorePermit,
) {
    let Some(certificates) = &context.tls else {
        return debug!("closing a connection to a TLS listener: TLS is not configured");
    };
    let _mark = context.connection_states.mark(ConnectionState::Reading);
    let deadline = Instant::now() + context.settings().header_timeout;
    let ticket = context.heads.ticket();
    ticket.hold(HANDSHAKE_MEMORY);
    let outcome = tokio::select! {
        outcome = shake(&mut io, certificates.config()) => outcome,
        _ = sleep_until(deadline) => {
            return log::info_limited!(
                "closed the connection from {}: its TLS handshake did not finish within --header-timeout",
                peer.display()
            );
        }
        _ = ticket.evicted() => {
            return log::info_limited!(
                "closed the connection from {} during its TLS handshake: the memory for incomplete request heads \
                 (--max-head-memory) is full; the oldest are refused first",
                peer.display()
            );
        }
    };
    drop(ticket);
    match outcome {
        Ok(session) => {
            // The client chose by ALPN; one that offered nothing gets HTTP/1.1, or HTTP/2 when
            // --http-protocols leaves HTTP/1.1 out.
            let http2 = match session.alpn_protocol() {
                Some(protocol) => protocol == b"h2",
                None => !context.protocols.http1,
            };
            let stream = TlsStream::new(io, session);
            if http2 {
                opening::start_http2(&context, stream, BytesMut::new(), peer, site, permit);
            } else {
                opening::start(&context, stream, peer, site, permit, 0);
            }
        }
        Err(Failure::PlainHttp) => {
            let reason = "this port speaks HTTPS: plain HTTP was sent to a TLS listener";
            log::info_limited!("400 to {}: {reason}", peer.display());
            context.counts.refused(400);
            refuse_plain(&mut io, reason).await;
        }
        Err(Failure::NotTls(byte)) => log::info_limited!(
            "closed the connection from {} to a TLS listener: its first byte 0x{byte:02x} begins no TLS handshake",
            peer.display()
        ),
        Err(Failure::Tls(e)) => log::info_limited!("TLS handshake with {} failed: {e}", peer.display()),
        Err(Failure::Closed) => debug!("the client {} left during its TLS handshake", peer.display()),
    }
}

/// Reads the client's first byte, then runs the handshake to its end.
async fn shake<S: ClientStream>(io: &mut S, config: Arc<ServerConfig>) -> Result<Box<ServerConnection>, Failure> {
    let mut first = [0u8; 1];
    match io.read(&mut first).await {
        Ok(1) => {}
        _ => return Err(Failure::Closed),
    }
    match first[0] {
        TLS_HANDSHAKE_RECORD => {}
        // Every HTTP method is a token, in practice in capitals (GET, POST, ...).
        byte if byte.is_ascii_uppercase() => return Err(Failure::PlainHttp),
        byte => return Err(Failure::NotTls(byte)),
    }
    let mut session = Box::new(ServerConnection::new(config).map_err(Failure::Tls)?);
    session.read_tls(&mut &first[..]).map_err(|_| Failure::Closed)?;
    poll_fn(|cx| drive(io, &mut session, cx)).await?;
    Ok(session)
}

/// Moves the handshake on as far as the client allows: sends what rustls has for it, reads
/// what it sent. Ready once the handshake is done and its last flight (and session tickets)
/// written.
fn drive<S: ClientStream>(
    io: &mut S,
    session: &mut ServerConnection,
    cx: &mut Context<'_>,
) -> Poll<Result<(), Failure>> {
    loop {
        while session.wants_write() {
            match session.write_tls(&mut SyncIo { io: &mut *io, cx: &mut *cx }) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(_) => return Poll::Ready(Err(Failure::Closed)),
            }
        }
        if !session.is_handshaking() {
            return Poll::Ready(Ok(()));
        }
        match session.read_tls(&mut SyncIo { io: &mut *io, cx: &mut *cx }) {
            Ok(0) => return Poll::Ready(Err(Failure::Closed)),
            Ok(_) => {
                if let Err(e) = session.process_new_packets() {
                    // The alert saying why, if the socket takes it now.
                    let _ = session.write_tls(&mut SyncIo { io: &mut *io, cx: &mut *cx });
                    return Poll::Ready(Err(Failure::Tls(e)));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
            Err(_) => return Poll::Ready(Err(Failure::Closed)),
        }
    }
}

/// Answers a plain HTTP client 400 in plain HTTP, then drains what it still sends for a
/// moment, so that the close does not reset the answer away before the client reads it.
async fn refuse_plain<S: ClientStream>(io: &mut S, reason: &str) {
    let mut out = Vec::new();
    write_error_response(&mut out, 400, reason, &http_date(), false, None);
    if io.write_all(&out).await.is_ok() {
        exchange::linger(io, LINGER).await;
    }
}
