//! Watches the frames of a connection as the bytes go by (frame headers only: nothing is
//! copied or held but a GOAWAY's few bytes), both ways.
//!
//! Read: the floods the h2 crate does not end, SETTINGS and PING frames, counted against their
//! budgets (`flood.rs`); past one, the connection is cut with GOAWAY (ENHANCE_YOUR_CALM) and one
//! log line naming the kind, and reads nothing more. The frames are followed by their headers
//! (`frames.rs`).
//!
//! Written: the debug data of a GOAWAY the h2 crate sends for a flood it found itself
//! (`too_many_resets`, `too_many_continuations`, …), which is the only place the crate names
//! the flood: the error it returns has lost it. `mod.rs` reads it when the connection ends.
//! And the HEADERS frames: each answers a stream the lobby answered (`send.rs` says so before
//! it hands the crate the head), but for the 431 the crate answers by itself to a stream whose
//! header list decodes past the limit (short of four times it, where it ends the connection).
//! That stream never reaches the lobby, and the frame going by is the only sign of it.
//!
//! Both ways: what a connection must keep to hibernate (`sleep.rs`'s `Ledger`). On a connection
//! woken from hibernation, it also leaves out the two frames its new h2 connection must not send
//! (`Unsent`), and turns frames the client sends late for the old connection's streams into
//! frames of no known type, which the new one passes by (RFC 9113 5.5); so too the ACK of the
//! SETTINGS the lobby writes itself before a connection sleeps (`NO_TABLE`).

use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::flood::{self, ControlFrames};
use super::frames::{Frames, Header, Piece, FRAME_HEADER, TYPE_AT};
use super::reasons::Http2Refusal;
use super::sleep::{Ledger, Unsent, NO_TABLE};
use super::{Asleep, Shared, GOAWAY, HEADERS, PREFACE};

/// A frame type no specification defines, which a receiver ignores: what a stale frame becomes.
const NO_TYPE: u8 = 0xfa;
/// A GOAWAY's payload before its debug data: the last stream's id and the error code.
const GOAWAY_FIXED: usize = 8;
/// Of a GOAWAY's debug data, what is kept: the h2 crate's words are a few dozen bytes.
const DEBUG_DATA_KEPT: usize = 64;

pub(super) struct Guarded<T> {
    io: T,
    shared: Rc<Shared>,
    read: Frames,
    control: ControlFrames,
    written: Frames,
    /// The client flooded: nothing more is read.
    stopped: bool,
    ledger: Ledger,
    unsent: Unsent,
    /// The last write found the socket full: the h2 crate holds bytes it could not write.
    write_blocked: bool,
    /// The first bytes of a frame header that ended a read, held back until the header is
    /// whole (only while frames are hidden from the h2 crate: `Ledger::hides`).
    held: Vec<u8>,
    /// Bytes the lobby writes itself, before the h2 crate's next.
    owed: Vec<u8>,
}

impl<T> Guarded<T> {
    pub(super) fn new(io: T, shared: Rc<Shared>, woken: Option<&Asleep>) -> Guarded<T> {
        Guarded {
            io,
            shared,
            read: Frames::new(PREFACE.len()),
            control: ControlFrames::new(),
            written: Frames::new(0),
            stopped: false,
            ledger: Ledger::new(woken),
            unsent: if woken.is_some() { Unsent::for_woken() } else { Unsent::default() },
            write_blocked: false,
            held: Vec::new(),
            owed: Vec::new(),
        }
    }

    pub(super) fn get_ref(&self) -> &T {
        &self.io
    }

    pub(super) fn into_inner(self) -> T {
        self.io
    }

    /// What the connection keeps to hibernate, if it can now: between frames both ways, with
    /// nothing left to write. If only the client's HPACK table is in the way, `NO_TABLE` is
    /// written (its ACK, later, lets the connection sleep).
    pub(super) fn asleep(&mut self) -> Option<Asleep>
    where
        T: AsyncWrite + Unpin,
    {
        let quiet = self.read.between_frames() && self.written.between_frames() && self.held.is_empty();
        if !quiet || self.write_blocked || self.stopped || self.unsent.any() || !self.owed.is_empty() {
            return None;
        }
        let asleep = self.ledger.asleep();
        if asleep.is_none() && self.ledger.drop_table() {
            self.owed.extend_from_slice(&NO_TABLE);
            // Written now if the socket takes it, else before the h2 crate's next bytes.
            let _ = self.pay_owed(&mut Context::from_waker(std::task::Waker::noop()));
        }
        asleep
    }

    /// Writes what the lobby itself owes the client (`NO_TABLE`): Ready once all is written.
    fn pay_owed(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>
    where
        T: AsyncWrite + Unpin,
    {
        while !self.owed.is_empty() {
            let n = std::task::ready!(Pin::new(&mut self.io).poll_write(cx, &self.owed))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.owed.drain(..n);
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    /// Follows what was written: keeps the payload of GOAWAY frames for the connection's end,
    /// tells the connection of a head it did not write, and keeps the ledger.
    fn wrote(&mut self, mut bytes: &[u8]) {
        let (shared, ledger) = (&self.shared, &mut self.ledger);
        let mut goaway = false;
        self.written.follow(&mut bytes, |piece| match piece {
            Piece::Header { kind, flags, stream, length, .. } => {
                goaway = kind == GOAWAY;
                if goaway {
                    shared.goaway_sent.borrow_mut().clear();
                }
                if kind == HEADERS && !shared.head_written(stream) {
                    shared.header_list_refused(stream);
                }
                ledger.wrote_header(kind, flags, stream, length) || goaway
            }
            Piece::Payload(payload) if goaway => {
                let mut kept = shared.goaway_sent.borrow_mut();
                let room = (GOAWAY_FIXED + DEBUG_DATA_KEPT).saturating_sub(kept.len());
                kept.extend_from_slice(&payload[..payload.len().min(room)]);
                true
            }
            Piece::Payload(payload) => {
                ledger.wrote_payload(payload);
                true
            }
        });
    }

    /// Of bytes the h2 crate would write on a woken connection, while a frame it must not send
    /// is awaited: how many to write, and how many to leave out, from the start. The crate
    /// writes whole frames from its buffer, so a header is seen whole before any of it is
    /// written, and a frame left out is whole at the start of what it writes next.
    fn unsent_split(&mut self, data: &[u8]) -> (usize, usize) {
        if self.written.have > 0 {
            return (data.len(), 0);
        }
        let mut at = self.written.skip;
        while at + FRAME_HEADER <= data.len() {
            let header = Header::parse(data[at..at + FRAME_HEADER].try_into().expect("a whole header"));
            let end = at + FRAME_HEADER + header.length;
            if self.unsent.is_unsent(header.kind, header.flags, header.stream) {
                if at > 0 {
                    return (at, 0);
                }
                if end <= data.len() {
                    self.unsent.left_out(header.kind, header.flags);
                    return (0, end);
                }
            }
            at = end;
        }
        (data.len(), 0)
    }
}

/// The debug data of the last GOAWAY written, from what `Guarded` kept of its payload.
pub(super) fn debug_data(goaway_payload: &[u8]) -> &[u8] {
    goaway_payload.get(GOAWAY_FIXED..).unwrap_or_default()
}

impl<T> Guarded<T> {
    /// Follows the bytes just read, `bytes[..]` of which the first `held` were held back from the
    /// last read: counts SETTINGS and PING frames (the flood, once the client has flooded), keeps
    /// the ledger, and turns stale frames into frames of no type. Returns how many bytes, at the
    /// end, begin a frame header and are held back (only on a woken connection).
    fn scan(&mut self, bytes: &mut [u8]) -> (Option<Http2Refusal>, usize) {
        let (control, ledger) = (&mut self.control, &mut self.ledger);
        let (mut flood, mut stale) = (None, Vec::new());
        let mut rest: &[u8] = bytes;
        self.read.follow(&mut rest, |piece| match piece {
            Piece::Header { kind, flags, stream, length, end } => {
                flood = flood.or(control.count(kind, flags));
                if ledger.hides(kind, flags, stream) {
                    stale.push(end - FRAME_HEADER + TYPE_AT);
                    return false;
                }
                ledger.read_header(kind, flags, stream, length)
            }
            Piece::Payload(payload) => {
                ledger.read_payload(payload);
                true
            }
        });
        for at in stale {
            bytes[at] = NO_TYPE;
        }
        let held = if self.ledger.hiding() { self.read.have } else { 0 };
        if held > 0 {
            // Read again, whole, with the next bytes.
            self.read.have = 0;
        }
        (flood, held)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Guarded<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.stopped {
            // The connection's task is woken by the cut, and closes.
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let mut held = std::mem::take(&mut this.held);
        let fits = held.len().min(buf.remaining());
        buf.put_slice(&held[..fits]);
        let read = if fits < held.len() {
            // Room for some only (the h2 crate reads into 8 KiB or more): the rest next time.
            this.held = held.split_off(fits);
            Poll::Ready(Ok(()))
        } else {
            match Pin::new(&mut this.io).poll_read(cx, buf) {
                // Held bytes are bytes read.
                Poll::Pending if !held.is_empty() => Poll::Ready(Ok(())),
                read => read,
            }
        };
        if !read.is_ready() {
            return read;
        }
        let end = buf.filled().len();
        let (flood, keep_back) = this.scan(&mut buf.filled_mut()[before..]);
        if keep_back > 0 && keep_back < end - before {
            let mut back = buf.filled()[end - keep_back..].to_vec();
            back.append(&mut this.held);
            this.held = back;
            buf.set_filled(end - keep_back);
        } else if keep_back > 0 {
            // Nothing else came: the end of the stream, or a header that will not be whole.
            this.read.have = keep_back;
        }
        if let Some(flood) = flood {
            this.stopped = true;
            this.shared.cut(flood, flood::described(flood));
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Guarded<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        if !self.owed.is_empty() {
            std::task::ready!(self.pay_owed(cx))?;
        }
        let mut data = data;
        if self.unsent.any() {
            let (write, leave_out) = self.unsent_split(data);
            if leave_out > 0 {
                return Poll::Ready(Ok(leave_out));
            }
            data = &data[..write];
        }
        let written = Pin::new(&mut self.io).poll_write(cx, data);
        self.write_blocked = written.is_pending();
        if let Poll::Ready(Ok(n)) = written {
            self.wrote(&data[..n]);
        }
        written
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.unsent.any() || !self.owed.is_empty() {
            // One buffer at a time, each split as `poll_write` splits it.
            let first = bufs.iter().find(|buf| !buf.is_empty()).map_or(&[][..], |buf| &buf[..]);
            return self.poll_write(cx, first);
        }
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.write_blocked = written.is_pending();
        if let Poll::Ready(Ok(n)) = written {
            let mut left = n;
            for buf in bufs {
                let taken = left.min(buf.len());
                self.wrote(&buf[..taken]);
                left -= taken;
            }
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::super::frames::frame;
    use super::*;

    #[test]
    fn a_goaways_payload_is_kept_through_writes_cut_anywhere() {
        let mut frames = Frames::new(0);
        let mut goaway = [0, 0, 0, 1, 0, 0, 0, 11].to_vec();
        goaway.extend_from_slice(b"too_many_resets");
        let mut bytes = frame(0x0, 0, &[7; 100]);
        bytes.extend(frame(GOAWAY, 0, &goaway));
        let mut kept = Vec::new();
        for chunk in bytes.chunks(7) {
            let mut chunk = chunk;
            frames.follow(&mut chunk, |piece| match piece {
                Piece::Header { kind, .. } => kind == GOAWAY,
                Piece::Payload(payload) => {
                    kept.extend_from_slice(payload);
                    true
                }
            });
        }
        assert_eq!(debug_data(&kept), b"too_many_resets");
    }
}
