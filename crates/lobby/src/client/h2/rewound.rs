//! A plain connection handed to HTTP/2 after its first bytes were read (`opening.rs` reads them
//! to tell the preface from an HTTP/1.1 request): those bytes are read again first. Or one woken
//! from hibernation, whose new h2 connection first reads what the old one had been told
//! (`sleep.rs`).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, ReadBuf};

pub(in crate::client) struct Rewound<S> {
    first: BytesMut,
    io: S,
}

impl<S> Rewound<S> {
    pub(in crate::client) fn new(first: BytesMut, io: S) -> Rewound<S> {
        Rewound { first, io }
    }

    /// Whether the bytes to read again have all been read.
    pub(in crate::client) fn is_drained(&self) -> bool {
        self.first.is_empty()
    }

    pub(in crate::client) fn into_inner(self) -> S {
        self.io
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewound<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.first.is_empty() {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let n = this.first.len().min(buf.remaining());
        buf.put_slice(&this.first.split_to(n));
        if this.first.is_empty() {
            // The read buffer's capacity goes back now, not with the connection.
            this.first = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }
}

write_through!(Rewound);
