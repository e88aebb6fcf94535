//! The floods the h2 crate does not end: SETTINGS and PING frames, each of which asks for an
//! acknowledgement. The crate answers them one at a time and stops reading while an answer
//! waits, so they cost little memory, but a client can keep the lobby busy answering them for
//! ever. This reads the frame headers as the bytes go by (nothing is copied or held) and counts
//! those frames; past `CONTROL_FRAMES_PER_SECOND`, the connection is cut with GOAWAY
//! (ENHANCE_YOUR_CALM) and one log line, and reads nothing more.

use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, ReadBuf};

use super::{Shared, PREFACE};

/// SETTINGS and PING frames (not their acknowledgements) a client may send within a second. A
/// browser sends a few SETTINGS at the start and a PING now and then.
const CONTROL_FRAMES_PER_SECOND: u32 = 256;
const FRAME_HEADER: usize = 9;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const ACK: u8 = 0x1;

pub(super) struct Guarded<T> {
    io: T,
    shared: Rc<Shared>,
    counter: ControlFrames,
    /// The client flooded: nothing more is read.
    stopped: bool,
}

impl<T> Guarded<T> {
    pub(super) fn new(io: T, shared: Rc<Shared>) -> Guarded<T> {
        Guarded { io, shared, counter: ControlFrames::new(), stopped: false }
    }
}

/// Follows the frames through the bytes read, counting SETTINGS and PING frames.
struct ControlFrames {
    /// Bytes of the preface, then of the current frame's payload, still to pass unread.
    skip: usize,
    /// The frame header being read, and how much of it has come.
    header: [u8; FRAME_HEADER],
    have: usize,
    window_start: Instant,
    in_window: u32,
}

impl ControlFrames {
    fn new() -> ControlFrames {
        ControlFrames {
            skip: PREFACE.len(),
            header: [0; FRAME_HEADER],
            have: 0,
            window_start: Instant::now(),
            in_window: 0,
        }
    }

    /// Follows the frames through bytes just read; true once the client has flooded.
    fn scan(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (FRAME_HEADER - self.have).min(bytes.len());
            self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
            self.have += n;
            bytes = &bytes[n..];
            if self.have < FRAME_HEADER {
                break;
            }
            self.have = 0;
            let [l0, l1, l2, kind, flags, ..] = self.header;
            self.skip = usize::from(l0) << 16 | usize::from(l1) << 8 | usize::from(l2);
            if matches!(kind, SETTINGS | PING) && flags & ACK == 0 && self.count() {
                return true;
            }
        }
        false
    }

    fn count(&mut self) -> bool {
        let now = Instant::now();
        if now.duration_since(self.window_start) > Duration::from_secs(1) {
            self.window_start = now;
            self.in_window = 0;
        }
        self.in_window += 1;
        self.in_window > CONTROL_FRAMES_PER_SECOND
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
        if read.is_ready() && this.counter.scan(&buf.filled()[before..]) {
            this.stopped = true;
            this.shared.cut(format!(
                "it sent more than {CONTROL_FRAMES_PER_SECOND} SETTINGS and PING frames within a second (a flood)"
            ));
        }
        read
    }
}

write_through!(Guarded);

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
        let mut guard = ControlFrames::new();
        let mut bytes = PREFACE.to_vec();
        for _ in 0..CONTROL_FRAMES_PER_SECOND {
            bytes.extend(frame(PING, 0, &[0; 8]));
            bytes.extend(frame(PING, ACK, &[0; 8]));
            bytes.extend(frame(0x0, 0, &[7; 100]));
        }
        // Byte by byte: headers and payloads split anywhere are followed.
        for byte in &bytes {
            assert!(!guard.scan(std::slice::from_ref(byte)));
        }
        assert!(guard.scan(&frame(SETTINGS, 0, &[])));
    }
}
