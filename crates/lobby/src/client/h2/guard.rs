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

use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::reasons::Http2Refusal;
use super::{Shared, GOAWAY, HEADERS, PING, PREFACE, SETTINGS};

/// SETTINGS frames, and PING frames (not their acknowledgements), a client may send within a
/// second, of each. A browser sends a few SETTINGS at the start and a PING now and then.
const CONTROL_FRAMES_PER_SECOND: u32 = 256;
const FRAME_HEADER: usize = 9;
const ACK: u8 = 0x1;
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
}

impl<T> Guarded<T> {
    pub(super) fn new(io: T, shared: Rc<Shared>) -> Guarded<T> {
        Guarded {
            io,
            shared,
            read: Frames::new(PREFACE.len()),
            control: ControlFrames::new(),
            written: Frames::new(0),
            stopped: false,
        }
    }

    /// Follows what was written: keeps the payload of GOAWAY frames for the connection's end,
    /// and tells the connection of a head it did not write.
    fn wrote(&mut self, mut bytes: &[u8]) {
        let shared = &self.shared;
        self.written.follow(&mut bytes, |piece| match piece {
            Piece::Header { kind, stream, .. } => {
                if kind == GOAWAY {
                    shared.goaway_sent.borrow_mut().clear();
                }
                if kind == HEADERS && !shared.head_written(stream) {
                    shared.header_list_refused(stream);
                }
                kind == GOAWAY
            }
            Piece::Payload(payload) => {
                let mut kept = shared.goaway_sent.borrow_mut();
                let room = (GOAWAY_FIXED + DEBUG_DATA_KEPT).saturating_sub(kept.len());
                kept.extend_from_slice(&payload[..payload.len().min(room)]);
                true
            }
        });
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
    },
    /// Some of the payload of a frame whose header was answered `true`.
    Payload(&'a [u8]),
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

    /// Shows `look` each frame header in `bytes`, and the payload of those it answers `true`.
    fn follow(&mut self, bytes: &mut &[u8], mut look: impl FnMut(Piece<'_>) -> bool) {
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
            let [l0, l1, l2, kind, flags, s0, s1, s2, s3] = self.header;
            self.skip = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
            // The stream identifier's reserved high bit is ignored (RFC 9113 4.1).
            let stream = u32::from_be_bytes([s0, s1, s2, s3]) & 0x7fff_ffff;
            self.showing = look(Piece::Header { kind, flags, stream });
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

    /// Counts the frames whose headers are in bytes just read; the flood, once the client has
    /// flooded.
    fn scan(&mut self, frames: &mut Frames, mut bytes: &[u8]) -> Option<Http2Refusal> {
        let mut flood = None;
        frames.follow(&mut bytes, |piece| {
            if let Piece::Header { kind, flags, .. } = piece {
                let found = match kind {
                    _ if flags & ACK != 0 => None,
                    SETTINGS if self.settings.spend() => Some(Http2Refusal::SettingsFlood),
                    PING if self.pings.spend() => Some(Http2Refusal::PingFlood),
                    _ => None,
                };
                flood = flood.or(found);
            }
            false
        });
        flood
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
        let read = Pin::new(&mut this.io).poll_read(cx, buf);
        let flood = if read.is_ready() { this.control.scan(&mut this.read, &buf.filled()[before..]) } else { None };
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
        let written = Pin::new(&mut self.io).poll_write(cx, data);
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
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
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
            assert_eq!(control.scan(&mut frames, std::slice::from_ref(byte)), None);
        }
        assert_eq!(control.scan(&mut frames, &frame(SETTINGS, 0, &[])), Some(Http2Refusal::SettingsFlood));
        assert_eq!(control.scan(&mut frames, &frame(PING, 0, &[0; 8])), Some(Http2Refusal::PingFlood));
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
