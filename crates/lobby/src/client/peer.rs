//! What a connection is, whatever state it is in: its stream, who is on the other end, and
//! the listener it came through. A leaf: it imports nothing of the lobby's.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::task::{Context, Poll};

use rustls::ServerConnection;
use tokio::io::{AsyncRead, AsyncWrite, Interest};

/// What kind of stream a sleeper is, to wake it as the same.
#[derive(Clone, Copy)]
pub enum StreamKind {
    Tcp,
    Unix,
}

/// A client stream: TCP or Unix, plain or with TLS (`tls/`).
pub trait ClientStream: AsyncRead + AsyncWrite + AsFd + AsRawFd + Unpin + 'static {
    const KIND: StreamKind;
    /// Bytes written must go through the stream, not to the socket (`http1/write.rs`).
    const ENCRYPTED: bool = false;
    /// Leaves the event loop, keeping the connection open.
    fn into_fd(self) -> io::Result<OwnedFd>;
    /// Leaves the event loop to hibernate: the socket, and the TLS session if there is one.
    fn into_sleeping(self) -> io::Result<(OwnedFd, Option<Box<ServerConnection>>)>
    where
        Self: Sized,
    {
        Ok((self.into_fd()?, None))
    }
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    /// Input the stream holds of its own, which the socket's readiness does not show: a TLS
    /// session's plaintext already decrypted (a pipelined request), or its peer's close_notify.
    fn holds_input(&self) -> bool {
        false
    }
    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
    fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R>;
    /// What the TLS handshake settled, for the environ and the access log; None: plain.
    fn tls(&self) -> Option<&TlsAbout> {
        None
    }
}

/// What a TLS connection's handshake settled.
#[derive(Clone)]
pub struct TlsAbout {
    /// `TLSv1.3` or `TLSv1.2`.
    pub version: &'static str,
    /// The cipher suite, by rustls's (IANA's) name.
    pub cipher: &'static str,
    /// The verified client certificate's subject, RFC 4514 (SSL_CLIENT_S_DN).
    pub client_subject: Option<Box<str>>,
}

macro_rules! client_stream {
    ($t:ty, $kind:expr) => {
        impl ClientStream for $t {
            const KIND: StreamKind = $kind;
            fn into_fd(self) -> io::Result<OwnedFd> {
                Ok(self.into_std()?.into())
            }
            fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                <$t>::poll_read_ready(self, cx)
            }
            fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                <$t>::poll_write_ready(self, cx)
            }
            fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
                <$t>::try_io(self, interest, f)
            }
        }
    };
}
client_stream!(tokio::net::TcpStream, StreamKind::Tcp);
client_stream!(tokio::net::UnixStream, StreamKind::Unix);

/// Who is on the other end, for the environ and the logs: an address for TCP, none for a
/// Unix socket. Kept as the socket address, not as text, so that it costs a hibernating
/// connection no allocation of its own.
pub struct Peer {
    /// The socket's peer; once a PROXY header has been read, the client it named.
    pub addr: Option<SocketAddr>,
    pub proxy: ProxyStage,
}

/// Where a connection stands with the PROXY protocol (`--proxy-protocol`, docs/PROXIES.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyStage {
    /// Off when the connection was accepted: the peer is the client.
    Off,
    /// The connection must begin with a PROXY header, which has not been read yet.
    Awaited,
    /// The header has been read.
    Read,
}

impl Peer {
    pub fn new(addr: Option<SocketAddr>, proxy_protocol: bool) -> Peer {
        Peer { addr, proxy: if proxy_protocol { ProxyStage::Awaited } else { ProxyStage::Off } }
    }

    pub(crate) fn display(&self) -> String {
        match self.addr {
            Some(addr) => format!("{}:{}", addr.ip(), addr.port()),
            None => "unix socket".into(),
        }
    }
}

/// The listener a connection came through.
pub struct Site {
    pub server_name: String,
    pub server_port: u16,
    /// It speaks TLS (docs/TLS.md): a connection's handshake comes first (`handshake.rs`).
    pub tls: bool,
}
