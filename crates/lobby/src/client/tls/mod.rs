//! A TLS connection's stream: rustls over the client's socket, read and written by the
//! connection's task like a plain stream (docs/TLS.md).
//!
//! Writes cannot go to the socket directly as plain answers do (`write.rs`, sendfile(2)):
//! they go through rustls, `S::ENCRYPTED` tells `write.rs` so. A hibernating TLS connection
//! keeps its rustls session (keys and sequence numbers) and nothing else: its plaintext and
//! record buffers are empty once the answer is written, and are given back then.

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use rustls::ServerConnection;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};

pub(crate) mod certificates;
pub(super) mod encrypted;

use certificates::subject_of;

use super::peer::{ClientStream, StreamKind, TlsAbout};

/// A client socket with its TLS session, the handshake done (`handshake.rs`).
pub struct TlsStream<S> {
    io: S,
    session: Box<ServerConnection>,
    about: TlsAbout,
}

impl<S: ClientStream> TlsStream<S> {
    pub fn new(io: S, session: Box<ServerConnection>) -> TlsStream<S> {
        let about = TlsAbout {
            version: match session.protocol_version() {
                Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
                Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
                _ => "-",
            },
            cipher: session.negotiated_cipher_suite().and_then(|suite| suite.suite().as_str()).unwrap_or("-"),
            // rustls has verified the chain against --ca-certs: the first is the client's.
            client_subject: session
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|certificate| subject_of(certificate))
                .map(Into::into),
        };
        TlsStream { io, session, about }
    }

    /// Sends what rustls holds for the client, as far as the socket takes it now.
    fn poll_flush_tls(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.session.wants_write() {
            let mut io = SyncIo { io: &mut self.io, cx };
            match self.session.write_tls(&mut io) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: ClientStream> AsyncRead for TlsStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match this.session.reader().read(buf.initialize_unfilled()) {
                Ok(n) => {
                    // 0: the client sent close_notify.
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // The socket closed without close_notify: a truncation attack is not possible
                // on HTTP/1.1's framing, so it is an end like any other (gunicorn's
                // suppress_ragged_eofs).
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Poll::Ready(Ok(())),
                Err(e) => return Poll::Ready(Err(e)),
            }
            // Alerts and session tickets go out whenever the client is read.
            if let Poll::Ready(Err(e)) = this.poll_flush_tls(cx) {
                return Poll::Ready(Err(e));
            }
            let mut io = SyncIo { io: &mut this.io, cx };
            match this.session.read_tls(&mut io) {
                Ok(0) => return Poll::Ready(Ok(())),
                Ok(_) => {
                    if let Err(e) = this.session.process_new_packets() {
                        // The alert saying why, if the socket takes it.
                        let _ = this.poll_flush_tls(cx);
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl<S: ClientStream> AsyncWrite for TlsStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        loop {
            // rustls takes plaintext up to its buffer limit (64 KiB of records unsent).
            let taken = this.session.writer().write(data)?;
            let flushed = this.poll_flush_tls(cx)?;
            if taken > 0 || data.is_empty() {
                return Poll::Ready(Ok(taken));
            }
            ready!(flushed);
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_flush_tls(cx))?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        this.session.send_close_notify();
        ready!(this.poll_flush_tls(cx))?;
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

impl<S: ClientStream> AsFd for TlsStream<S> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.io.as_fd()
    }
}

impl<S: ClientStream> AsRawFd for TlsStream<S> {
    fn as_raw_fd(&self) -> RawFd {
        self.io.as_raw_fd()
    }
}

impl<S: ClientStream> ClientStream for TlsStream<S> {
    const KIND: StreamKind = S::KIND;
    const ENCRYPTED: bool = true;

    fn into_fd(self) -> io::Result<OwnedFd> {
        self.io.into_fd()
    }

    fn into_sleeping(self) -> io::Result<(OwnedFd, Option<Box<ServerConnection>>)> {
        Ok((self.io.into_fd()?, Some(self.session)))
    }

    /// Ready too when rustls holds plaintext already read from the socket (a pipelined
    /// request), or the client's close_notify: the socket itself would not say so.
    fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.session.wants_read() {
            return Poll::Ready(Ok(()));
        }
        self.io.poll_read_ready(cx)
    }

    fn holds_input(&self) -> bool {
        !self.session.wants_read()
    }

    fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.io.poll_write_ready(cx)
    }

    fn try_io<R>(&self, interest: Interest, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        self.io.try_io(interest, f)
    }

    fn tls(&self) -> Option<&TlsAbout> {
        Some(&self.about)
    }
}

/// The socket as std's `Read` and `Write` for rustls: WouldBlock when it would wait, with the
/// task registered to be woken.
pub(super) struct SyncIo<'a, 'b, S> {
    pub(super) io: &'a mut S,
    pub(super) cx: &'a mut Context<'b>,
}

impl<S: AsyncRead + Unpin> Read for SyncIo<'_, '_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut buf = ReadBuf::new(buf);
        match Pin::new(&mut *self.io).poll_read(self.cx, &mut buf) {
            Poll::Ready(Ok(())) => Ok(buf.filled().len()),
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl<S: AsyncWrite + Unpin> Write for SyncIo<'_, '_, S> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match Pin::new(&mut *self.io).poll_write(self.cx, data) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match Pin::new(&mut *self.io).poll_write_vectored(self.cx, bufs) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
