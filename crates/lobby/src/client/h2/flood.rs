//! The floods of control frames the h2 crate does not end: SETTINGS and PING frames, each of
//! which asks for an acknowledgement. The crate answers them one at a time and stops reading
//! while an answer waits, so they cost little memory, but a client can keep the lobby busy
//! answering them for ever. Past `CONTROL_FRAMES_PER_SECOND` of either kind, `guard.rs` cuts the
//! connection with GOAWAY (ENHANCE_YOUR_CALM) and one log line naming the kind.

use std::time::{Duration, Instant};

use super::reasons::Http2Refusal;
use super::{ACK, PING, SETTINGS};

/// SETTINGS frames, and PING frames (not their acknowledgements), a client may send within a
/// second, of each. A browser sends a few SETTINGS at the start and a PING now and then.
const CONTROL_FRAMES_PER_SECOND: u32 = 256;

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

/// The log line's words for a flood `ControlFrames::count` found.
pub(super) fn described(flood: Http2Refusal) -> String {
    let kind = if flood == Http2Refusal::SettingsFlood { "SETTINGS" } else { "PING" };
    format!("it sent more than {CONTROL_FRAMES_PER_SECOND} {kind} frames within a second (a {kind} flood)")
}

/// SETTINGS and PING frames counted, each kind against its budget.
pub(super) struct ControlFrames {
    settings: Budget,
    pings: Budget,
}

impl ControlFrames {
    pub(super) fn new() -> ControlFrames {
        ControlFrames { settings: Budget::new(), pings: Budget::new() }
    }

    /// Counts the frame with this header; the flood, once the client has flooded.
    pub(super) fn count(&mut self, kind: u8, flags: u8) -> Option<Http2Refusal> {
        match kind {
            _ if flags & ACK != 0 => None,
            SETTINGS if self.settings.spend() => Some(Http2Refusal::SettingsFlood),
            PING if self.pings.spend() => Some(Http2Refusal::PingFlood),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use maitred_protocol::PREFACE;

    use super::*;
    use crate::client::h2::frames::{frame, Frames, Piece};

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
}
