//! Which protocol serves a connection, and the hand-over between the two (docs/HTTP2.md,
//! "Where it is spoken"). A TLS connection's client chose by ALPN (`handshake.rs`). A plain
//! one's first bytes say (crates/protocol's opening.rs): HTTP/1.1's task reads them, as it
//! reads a request, and hands back a connection that opened with HTTP/2's preface, which goes
//! on in `h2/`. A sleeping connection wakes in the protocol it slept in. HTTP/1.1 (`http1/`) and
//! HTTP/2 (`h2/`) meet only here.

use std::rc::Rc;

use bytes::BytesMut;
use maitred_protocol::Opening;
use tokio::sync::OwnedSemaphorePermit;

use super::asleep::Sleeper;
use super::h2;
use super::http1::{Connection, NotHttp1};
use super::peer::{ClientStream, Peer, Site, StreamKind};
use super::tls::TlsStream;
use crate::client::context::Context;
use crate::log::debug;

/// Serves an HTTP/1.x connection, or a plain one whose protocol its first bytes will say, from
/// its first request (`answered` 0) or after hibernating.
pub fn start<S: ClientStream>(
    context: &Rc<Context>,
    stream: S,
    peer: Peer,
    site: Rc<Site>,
    permit: OwnedSemaphorePermit,
    answered: u64,
) {
    let connection = Connection::new(context, stream, peer, site, permit, answered);
    tokio::task::spawn_local(async move {
        if let Some(handed) = connection.run().await {
            Box::pin(hand_over(handed)).await;
        }
    });
}

/// A plain connection that opened with HTTP/2's preface goes on in HTTP/2's task; one that
/// opened with neither protocol's bytes gets HTTP/2's connection error.
async fn hand_over<S: ClientStream>(handed: NotHttp1<S>) {
    let NotHttp1 { context, stream, buf, peer, site, permit, opening } = handed;
    match opening {
        Opening::Http2 => start_http2(&context, stream, buf, peer, site, permit),
        _ => h2::refuse_preface(&context, stream, buf, &peer).await,
    }
}

/// Serves an HTTP/2 connection from its preface on (`first`: the bytes of it already read), in a
/// task of its own.
pub(super) fn start_http2<S: ClientStream>(
    context: &Rc<Context>,
    stream: S,
    first: BytesMut,
    peer: Peer,
    site: Rc<Site>,
    permit: OwnedSemaphorePermit,
) {
    let serving = h2::serve_new(context, stream, first, peer, site, permit);
    tokio::task::spawn_local(async move {
        if let Some(quiet) = serving.await {
            hibernate_http2(quiet);
        }
    });
}

/// An HTTP/2 connection quiet long enough leaves its task for the lobby's epoll set, its state
/// kept in its `Sleeper`; it is never handed to a new maitred (`Sleeper::can_move`).
fn hibernate_http2<S: ClientStream>(quiet: h2::Quiet<S>) {
    let h2::Quiet { context, stream, peer, site, permit, answered, deadline, kept } = quiet;
    match stream.into_sleeping() {
        Ok((socket, tls)) => context.hibernation.put(Sleeper {
            socket,
            kind: S::KIND,
            peer,
            site,
            permit,
            answered,
            deadline,
            tls,
            http2: Some(kept),
        }),
        Err(e) => debug!("closing an idle HTTP/2 connection that cannot hibernate: {e}"),
    }
}

/// Wakes a hibernating connection whose client has spoken (or closed).
pub fn resume(context: &Rc<Context>, sleeper: Sleeper) {
    let Sleeper { socket, kind, peer, site, permit, answered, tls, http2, deadline } = sleeper;
    if let Some(asleep) = http2 {
        fn woken<S: ClientStream>(
            context: &Rc<Context>,
            stream: S,
            peer: Peer,
            site: Rc<Site>,
            permit: OwnedSemaphorePermit,
            asleep: h2::kept::Http2Sleep,
            deadline: std::time::Instant,
        ) {
            let serving = h2::serve_woken(context, stream, peer, site, permit, asleep, deadline);
            tokio::task::spawn_local(async move {
                if let Some(quiet) = serving.await {
                    hibernate_http2(quiet);
                }
            });
        }
        let started = match (kind, tls) {
            (StreamKind::Tcp, None) => tokio::net::TcpStream::from_std(socket.into())
                .map(|stream| woken(context, stream, peer, site, permit, asleep, deadline)),
            (StreamKind::Unix, None) => tokio::net::UnixStream::from_std(socket.into())
                .map(|stream| woken(context, stream, peer, site, permit, asleep, deadline)),
            (StreamKind::Tcp, Some(session)) => tokio::net::TcpStream::from_std(socket.into())
                .map(|stream| woken(context, TlsStream::new(stream, session), peer, site, permit, asleep, deadline)),
            (StreamKind::Unix, Some(session)) => tokio::net::UnixStream::from_std(socket.into())
                .map(|stream| woken(context, TlsStream::new(stream, session), peer, site, permit, asleep, deadline)),
        };
        if let Err(e) = started {
            debug!("could not wake an idle HTTP/2 connection: {e}");
        }
        return;
    }
    let started = match (kind, tls) {
        (StreamKind::Tcp, None) => tokio::net::TcpStream::from_std(socket.into())
            .map(|stream| start(context, stream, peer, site, permit, answered)),
        (StreamKind::Unix, None) => tokio::net::UnixStream::from_std(socket.into())
            .map(|stream| start(context, stream, peer, site, permit, answered)),
        (StreamKind::Tcp, Some(session)) => tokio::net::TcpStream::from_std(socket.into())
            .map(|stream| start(context, TlsStream::new(stream, session), peer, site, permit, answered)),
        (StreamKind::Unix, Some(session)) => tokio::net::UnixStream::from_std(socket.into())
            .map(|stream| start(context, TlsStream::new(stream, session), peer, site, permit, answered)),
    };
    if let Err(e) = started {
        debug!("could not wake an idle connection: {e}");
    }
}
