//! Accepting connections: one accept(2) per connection from each listener, under
//! `--max-connections`, and the connections still in the listen queue when a shutdown begins.

use std::cell::Cell;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::{SockAddr, SockRef, Socket};
use tokio::io::unix::AsyncFd;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::bind::Listener;
use super::cap::{fd_limit, CapWatch};
use crate::client::context::Context;
use crate::client::peer::{Peer, Site};
use crate::client::{handshake, opening};
use crate::log::{debug, error_limited, info, info_limited, warning};

/// Pauses after accept(2) fails for want of descriptors or memory: the first, doubled after
/// each failure in a row up to the last.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Logs a listen address with the backlog the kernel granted (S2).
pub(crate) fn announce(listener: &Listener, tls: bool) {
    let display = match tls {
        true if listener.display.starts_with("http://") => listener.display.replacen("http://", "https://", 1),
        true => format!("{} (TLS)", listener.display),
        false => listener.display.clone(),
    };
    info!("listening at {display} (backlog {})", listener.backlog_granted);
    if listener.backlog_granted < listener.backlog_requested {
        warning!(
            "--backlog {} is capped by net.core.somaxconn to {}; raise it with `sysctl -w net.core.somaxconn={}`",
            listener.backlog_requested,
            listener.backlog_granted,
            listener.backlog_requested
        );
    }
}

/// A listen socket on the event loop: accepts one connection per accept(2) call.
///
/// tokio's readiness is edge-triggered, so a plain accept loop calls accept(2) until it fails
/// with EAGAIN: two calls per connection at low load, the pattern S3 counts. For TCP the
/// lobby instead reads the accept queue's depth (TCP_INFO on a listener) once the connections
/// it knew of are taken and other tasks have run, takes that many, and waits for readiness
/// when it is empty. Unix sockets have no such reading and keep the plain loop. (The queue's
/// fill is watched apart from this, by `observe/diagnosis.rs`, also while nothing is accepted.)
pub struct Acceptor {
    socket: AsyncFd<OwnedFd>,
    /// The listener's address, for the log.
    display: String,
    /// Connections known to be queued; no need to look at the queue again until they are taken.
    known_queued: Cell<u32>,
    /// TCP: read the queue's depth before the next accept(2), rather than find it empty that way.
    look_first: Cell<bool>,
    is_tcp: bool,
}

impl Acceptor {
    pub fn new(listener: &Listener) -> io::Result<Acceptor> {
        let socket = listener.socket.try_clone()?;
        let is_tcp = socket.local_addr()?.as_socket().is_some();
        let socket = maitred_sys::reactor::register(socket.into())?;
        Ok(Acceptor {
            socket,
            display: listener.display.clone(),
            known_queued: Cell::new(0),
            look_first: Cell::new(false),
            is_tcp,
        })
    }

    pub fn display(&self) -> &str {
        &self.display
    }

    /// The next connection, non-blocking and close-on-exec, with the peer's address.
    pub async fn accept(&self) -> io::Result<(Socket, SockAddr)> {
        loop {
            if self.is_tcp && self.look_first.replace(false) {
                // Let the connections just taken start first: under load, more have queued
                // by then, and they are taken without waiting for the event loop to report them.
                tokio::task::yield_now().await;
                let mut ready = self.socket.readable().await?;
                match maitred_sys::socket::listen_queue_depth(self.socket.get_ref().as_fd()) {
                    Ok(0) => {
                        ready.clear_ready();
                        continue;
                    }
                    Ok(queued) => self.known_queued.set(queued),
                    // Not knowing, look with accept(2), as a plain loop would.
                    Err(_) => {}
                }
            }
            let mut ready = self.socket.readable().await?;
            match ready
                .try_io(|socket| SockRef::from(socket.get_ref()).accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC))
            {
                Ok(Ok(accepted)) => {
                    let known = self.known_queued.get().saturating_sub(1);
                    self.known_queued.set(known);
                    self.look_first.set(known == 0);
                    return Ok(accepted);
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => self.known_queued.set(0),
            }
        }
    }
}

pub(crate) async fn accept_loop(
    context: Rc<Context>,
    listener: Acceptor,
    site: Rc<Site>,
    connections: Arc<Semaphore>,
    cap: Rc<CapWatch>,
) {
    // accept(2) failures in a row, since when, and the pause after the last one.
    let mut failures = 0u64;
    let mut failing_since = Instant::now();
    let mut pause = Duration::ZERO;
    loop {
        // At the cap the lobby stops accepting; the kernel's queue holds the rest.
        let Some(permit) = cap.place(&connections).await else { return };
        match listener.accept().await {
            Ok((socket, peer)) => {
                if failures > 0 {
                    info_limited!(
                        "accepting on {} again after {failures} failed accepts in {:.1} s",
                        listener.display(),
                        failing_since.elapsed().as_secs_f64()
                    );
                    failures = 0;
                    pause = Duration::ZERO;
                }
                start_connection(&context, &site, permit, socket, &peer)
            }
            // The connection was reset or its network went away before it was taken: the
            // next one may be fine (accept(2), "Error handling").
            Err(e) if is_connection_error(&e) => debug!("accept on {}: {e}", listener.display()),
            Err(e) => {
                // Out of descriptors (EMFILE, ENFILE) or memory: the pending connection stays
                // queued. Try again after a pause, doubled each time, rather than spin.
                if failures == 0 {
                    failing_since = Instant::now();
                }
                failures += 1;
                pause = (pause * 2).clamp(ACCEPT_BACKOFF, MAX_ACCEPT_BACKOFF);
                drop(permit);
                let open = cap.cap - connections.available_permits();
                error_limited!(
                    "accept on {} failed: {e}; {open} connections open, descriptor limit {} (ulimit -n); retrying in \
                     {} ms ({failures} in a row)",
                    listener.display(),
                    fd_limit(),
                    pause.as_millis()
                );
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// accept(2) errors that concern only the connection being taken, not the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EINTR
                | libc::EPROTO
                | libc::EPERM
                | libc::ENETDOWN
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::EOPNOTSUPP
                | libc::ENETUNREACH
        )
    )
}

/// Takes the connections that finished their handshake but were not accepted yet, so that
/// a shutdown resets none of them: the kernel would reset them when the socket closes.
pub(crate) fn accept_backlog(
    context: &Rc<Context>,
    listener: &Listener,
    site: &Rc<Site>,
    connections: &Arc<Semaphore>,
) -> usize {
    let mut taken = 0;
    while let Ok(permit) = connections.clone().try_acquire_owned() {
        let Ok((socket, peer)) = listener.socket.accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) else { break };
        start_connection(context, site, permit, socket, &peer);
        taken += 1;
    }
    taken
}

/// Gives an accepted, non-blocking socket its connection task.
fn start_connection(
    context: &Rc<Context>,
    site: &Rc<Site>,
    permit: OwnedSemaphorePermit,
    socket: Socket,
    peer: &SockAddr,
) {
    let fd = OwnedFd::from(socket);
    let proxy_protocol = context.settings().proxy_protocol.is_some();
    let started = match (peer.as_socket(), site.tls) {
        // TCP_NODELAY comes from the listener (listen::bind).
        (Some(addr), false) => tokio::net::TcpStream::from_std(fd.into()).map(|stream| {
            opening::start(context, stream, Peer::new(Some(addr), proxy_protocol), site.clone(), permit, 0);
        }),
        (None, false) => tokio::net::UnixStream::from_std(fd.into()).map(|stream| {
            opening::start(context, stream, Peer::new(None, proxy_protocol), site.clone(), permit, 0);
        }),
        // The CLI refuses --proxy-protocol with TLS.
        (Some(addr), true) => tokio::net::TcpStream::from_std(fd.into()).map(|stream| {
            handshake::start(context, stream, Peer::new(Some(addr), false), site.clone(), permit);
        }),
        (None, true) => tokio::net::UnixStream::from_std(fd.into()).map(|stream| {
            handshake::start(context, stream, Peer::new(None, false), site.clone(), permit);
        }),
    };
    if let Err(e) = started {
        error_limited!("cannot take an accepted connection: {e}");
    }
}
