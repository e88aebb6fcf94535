//! The lobby's end of a worker's channel (docs/PROTOCOL.md, section 2): whole frames in, with
//! the descriptors that came along, and whole frames out. Its reading of answers from the
//! shared region is in `answers.rs`.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use maitred_wire::{FrameHeader, FrameReader};
use tokio::io::unix::AsyncFd;
use tokio::sync::Notify;

/// A received frame: its header, its payload, and its descriptor if it carried one.
pub struct Frame {
    pub header: FrameHeader,
    pub payload: Bytes,
    pub fd: Option<OwnedFd>,
}

/// What the lobby keeps to read one worker's answers, in its `Channel`.
pub(super) struct AnswerReader {
    /// The bell the worker rings (`LOBBY_BELL`).
    pub(super) bell: AsyncFd<OwnedFd>,
    /// The last ring record was `ON_CHANNEL` for this request: the next frame comes on the
    /// channel. Kept here, not in a local, because the caller may drop `Channel::next_answer`
    /// (answers.rs) at any await (a timeout, a client that leaves) and call it again.
    pub(super) on_channel: Option<u32>,
    pub(super) buf: BytesMut,
    /// Wakes the reader when the lobby, about to park, finds an answer its worker has not rung
    /// for (`answers.rs`, `look_before_parking`).
    pub(super) woken: Rc<Notify>,
}

impl AnswerReader {
    /// A new reader and its bell, registered with the lobby's reactor.
    pub(super) fn new() -> io::Result<AnswerReader> {
        let bell = maitred_sys::reactor::register(maitred_sys::bell::new()?)?;
        Ok(AnswerReader { bell, on_channel: None, buf: BytesMut::new(), woken: Rc::new(Notify::new()) })
    }
}

/// The lobby's end of a worker channel.
pub struct Channel {
    pub(super) socket: AsyncFd<OwnedFd>,
    buf: BytesMut,
    fds: VecDeque<OwnedFd>,
    /// Reading answers from the shared region (`answers.rs`).
    pub(super) answers: AnswerReader,
}

impl Channel {
    pub fn new(fd: OwnedFd) -> io::Result<Channel> {
        socket2::SockRef::from(&fd).set_nonblocking(true)?;
        let socket = maitred_sys::reactor::register(fd)?;
        Ok(Channel { socket, buf: BytesMut::new(), fds: VecDeque::new(), answers: AnswerReader::new()? })
    }

    /// The next whole frame; None at a clean end-of-file between frames.
    pub async fn read_frame(&mut self) -> io::Result<Option<Frame>> {
        loop {
            if let Some((header, payload)) = FrameReader::take_frame(&mut self.buf).map_err(invalid)? {
                let fd = if header.has_fd() {
                    Some(
                        self.fds
                            .pop_front()
                            .ok_or_else(|| invalid("a frame announced a descriptor that did not come"))?,
                    )
                } else {
                    None
                };
                return Ok(Some(Frame { header, payload, fd }));
            }
            self.buf.reserve(FrameReader::LOBBY.room_for_next_read(&self.buf).map_err(invalid)?);
            if self.fill().await? == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the worker closed its channel inside a frame"))
                };
            }
        }
    }

    async fn fill(&mut self) -> io::Result<usize> {
        loop {
            let mut ready = self.socket.readable().await?;
            let room = self.buf.spare_capacity_mut().len();
            let fds_before = self.fds.len();
            let read = ready.try_io(|socket| {
                Ok(maitred_sys::fdpass::recv_into(socket.as_raw_fd(), &mut self.buf, &mut self.fds, 0)?)
            });
            match read {
                Ok(Ok(n)) => {
                    // A Unix stream read stops short only when the socket is empty (or at a
                    // message carrying descriptors). Knowing it is empty saves the read that
                    // would otherwise find out, once per request, when the worker goes idle.
                    if n > 0 && n < room && self.fds.len() == fds_before {
                        ready.clear_ready();
                    }
                    return Ok(n);
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Sends a whole frame, with `fd` attached to its first byte when given.
    pub async fn send(&self, frame: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        send_whole(&self.socket, frame, fd).await
    }

    /// The channel's socket again, registered apart, for writing while this end reads (an ASGI
    /// worker's channel: `mux.rs`).
    pub(super) fn writer(&self) -> io::Result<AsyncFd<OwnedFd>> {
        maitred_sys::reactor::register(self.socket.get_ref().try_clone()?)
    }

    /// Waits until the worker writes or closes while it should be idle.
    pub(super) async fn closed_while_idle(&self) -> io::Result<()> {
        if !self.buf.is_empty() {
            return Ok(());
        }
        loop {
            let mut ready = self.socket.readable().await?;
            // Readiness can be stale (left over from the last frame); a peek tells.
            let peeked = ready.try_io(|socket| maitred_sys::socket::peek(socket.as_fd()).map(drop));
            match peeked {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }
}

/// A breach of the protocol by the worker (answers.rs uses it too).
pub(super) fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Sends a whole frame on a channel's `socket`, with `fd` attached to its first byte when given.
pub(super) async fn send_whole(socket: &AsyncFd<OwnedFd>, frame: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut sent = 0;
    while sent < frame.len() {
        let mut ready = socket.writable().await?;
        let bufs = [IoSlice::new(&frame[sent..])];
        let attached = if sent == 0 { fd } else { None };
        let result = ready.try_io(|socket| match attached {
            Some(fd) => Ok(maitred_sys::fdpass::send_with_fd(socket.as_raw_fd(), &bufs, fd.as_raw_fd(), 0)?),
            None => Ok(maitred_sys::fdpass::send(socket.as_raw_fd(), &bufs, 0)?),
        });
        match result {
            Ok(Ok(n)) => sent += n,
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}
