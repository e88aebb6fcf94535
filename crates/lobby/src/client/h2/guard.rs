//! Watches the frames of a connection as the bytes go by (frame headers only: nothing is
//! copied or held but a GOAWAY's few bytes), both ways.
//!
//! Read: the floods the h2 crate does not end, SETTINGS and PING frames, each of which asks for
//! an acknowledgement. The crate answers them one at a time and stops reading while an answer
//! waits, so they cost little memory, but a client can keep the lobby busy answering them for
//! ever. Past `CONTROL_FRAMES_PER_SECOND` of either kind, the connection is cut with GOAWAY
//! (ENHANCE_YOUR_CALM) and one log line naming the kind, and reads nothing more.
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
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::reasons::Http2Refusal;
use super::sleep::{Ledger, Unsent, NO_TABLE};
use super::{Asleep, Shared, ACK, GOAWAY, HEADERS, PING, PREFACE, SETTINGS};

/// SETTINGS frames, and PING frames (not their acknowledgements), a client may send within a
/// second, of each. A browser sends a few SETTINGS at the start and a PING now and then.
const CONTROL_FRAMES_PER_SECOND: u32 = 256;
const FRAME_HEADER: usize = 9;
/// Where a frame header says its type.
const TYPE_AT: usize = 3;
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

/// What `Frames::follow` shows of the bytes.
enum Piece<'a> {
    Header {
        kind: u8,
        flags: u8,
        stream: u32,
        length: usize,
        /// Where in the bytes given to `follow` the header ended.
        end: usize,
    },
    /// Some of the payload of a frame whose header was answered `true`.
    Payload(&'a [u8]),
}

/// A frame header's fields (RFC 9113 4.1).
struct Header {
    length: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl Header {
    fn parse(bytes: [u8; FRAME_HEADER]) -> Header {
        let [l0, l1, l2, kind, flags, s0, s1, s2, s3] = bytes;
        Header {
            length: usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2),
            kind,
            flags,
            // The stream identifier's reserved high bit is ignored.
            stream: u32::from_be_bytes([s0, s1, s2, s3]) & 0x7fff_ffff,
        }
    }
}

/// Follows frames through a byte stream cut anywhere.
struct Frames {
    /// Bytes of the preface, then of the current frame's payload, still to pass.
    skip: usize,
    /// Whether the payload being passed is shown.
    showing: bool,
    /// The frame header being read, and how much of it has come.
    header: [u8; FRAME_HEADER],
    have: usize,
}

impl Frames {
    fn new(preface: usize) -> Frames {
        Frames { skip: preface, showing: false, header: [0; FRAME_HEADER], have: 0 }
    }

    fn between_frames(&self) -> bool {
        self.skip == 0 && self.have == 0
    }

    /// Shows `look` each frame header in `bytes`, and the payload of those it answers `true`.
    fn follow(&mut self, bytes: &mut &[u8], mut look: impl FnMut(Piece<'_>) -> bool) {
        let given = bytes.len();
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                if self.showing {
                    look(Piece::Payload(&bytes[..n]));
                }
                self.skip -= n;
                *bytes = &bytes[n..];
                continue;
            }
            let n = (FRAME_HEADER - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            *bytes = &bytes[n..];
            if self.have < FRAME_HEADER {
                break;
            }
            self.have = 0;
            let Header { length, kind, flags, stream } = Header::parse(self.header);
            self.skip = length;
            let end = given - bytes.len();
            self.showing = look(Piece::Header { kind, flags, stream, length, end });
        }
    }
}

/// A kind of frame the client may not flood, and how many came within the current second.
struct Budget {
    window_start: Instant,
    in_window: u32,
}

impl Budget {
    fn new() -> Budget {
        Budget { window_start: Instant::now(), in_window: 0 }
    }

    /// Counts one frame; true once past the budget.
    fn spend(&mut self) -> bool {
        let now = Instant::now();
        if now.duration_since(self.window_start) > Duration::from_secs(1) {
            self.window_start = now;
            self.in_window = 0;
        }
        self.in_window += 1;
        self.in_window > CONTROL_FRAMES_PER_SECOND
    }
}

/// SETTINGS and PING frames counted, each kind against its budget.
struct ControlFrames {
    settings: Budget,
    pings: Budget,
}

impl ControlFrames {
    fn new() -> ControlFrames {
        ControlFrames { settings: Budget::new(), pings: Budget::new() }
    }

    /// Counts the frame with this header; the flood, once the client has flooded.
    fn count(&mut self, kind: u8, flags: u8) -> Option<Http2Refusal> {
        match kind {
            _ if flags & ACK != 0 => None,
            SETTINGS if self.settings.spend() => Some(Http2Refusal::SettingsFlood),
            PING if self.pings.spend() => Some(Http2Refusal::PingFlood),
            _ => None,
        }
    }
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
            let kind = if flood == Http2Refusal::SettingsFlood { "SETTINGS" } else { "PING" };
            this.shared.cut(
                flood,
                format!("it sent more than {CONTROL_FRAMES_PER_SECOND} {kind} frames within a second (a {kind} flood)"),
            );
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
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags, 0, 0, 0, 0];
        out.extend_from_slice(payload);
        out
    }

    /// Follows bytes read as `Guarded::scan` does for the floods: the first flood found.
    fn flood(frames: &mut Frames, control: &mut ControlFrames, mut bytes: &[u8]) -> Option<Http2Refusal> {
        let mut flood = None;
        frames.follow(&mut bytes, |piece| {
            if let Piece::Header { kind, flags, .. } = piece {
                flood = flood.or(control.count(kind, flags));
            }
            false
        });
        flood
    }

    #[test]
    fn pings_past_the_budget_are_a_flood_acks_and_other_frames_are_not() {
        let (mut frames, mut control) = (Frames::new(PREFACE.len()), ControlFrames::new());
        let mut bytes = PREFACE.to_vec();
        for _ in 0..CONTROL_FRAMES_PER_SECOND {
            bytes.extend(frame(PING, 0, &[0; 8]));
            bytes.extend(frame(PING, ACK, &[0; 8]));
            bytes.extend(frame(SETTINGS, 0, &[]));
            bytes.extend(frame(0x0, 0, &[7; 100]));
        }
        // Byte by byte: headers and payloads split anywhere are followed.
        for byte in &bytes {
            assert_eq!(flood(&mut frames, &mut control, std::slice::from_ref(byte)), None);
        }
        assert_eq!(flood(&mut frames, &mut control, &frame(SETTINGS, 0, &[])), Some(Http2Refusal::SettingsFlood));
        assert_eq!(flood(&mut frames, &mut control, &frame(PING, 0, &[0; 8])), Some(Http2Refusal::PingFlood));
    }

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

    #[test]
    fn each_headers_frames_stream_is_seen_whole_byte_by_byte_and_split_anywhere() {
        let mut bytes = frame(HEADERS, 0x5, &[0x88]);
        bytes[5..9].copy_from_slice(&1u32.to_be_bytes());
        let mut second = frame(HEADERS, 0x4, &[0x88; 3]);
        // The reserved bit set: still stream 3.
        second[5..9].copy_from_slice(&(3u32 | 1 << 31).to_be_bytes());
        bytes.extend(frame(0x0, 0, &[7; 20]));
        bytes.extend(second);
        for size in 1..=bytes.len() {
            let mut frames = Frames::new(0);
            let mut seen = Vec::new();
            for chunk in bytes.chunks(size) {
                let mut chunk = chunk;
                frames.follow(&mut chunk, |piece| {
                    if let Piece::Header { kind: HEADERS, stream, .. } = piece {
                        seen.push(stream);
                    }
                    false
                });
            }
            assert_eq!(seen, [1, 3], "in chunks of {size}");
        }
    }
}
