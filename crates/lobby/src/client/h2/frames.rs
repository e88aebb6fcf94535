//! Frames followed through a byte stream cut anywhere, by their headers (RFC 9113 4.1): only
//! the payloads asked for are shown, and nothing is copied or held but the header being read.
//! A leaf: `guard.rs` follows a connection's frames both ways with it.

pub(super) const FRAME_HEADER: usize = 9;
/// Where a frame header says its type.
pub(super) const TYPE_AT: usize = 3;

/// What `Frames::follow` shows of the bytes.
pub(super) enum Piece<'a> {
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
pub(super) struct Header {
    pub(super) length: usize,
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) stream: u32,
}

impl Header {
    pub(super) fn parse(bytes: [u8; FRAME_HEADER]) -> Header {
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
pub(super) struct Frames {
    /// Bytes of the preface, then of the current frame's payload, still to pass.
    pub(super) skip: usize,
    /// Whether the payload being passed is shown.
    showing: bool,
    /// The frame header being read, and how much of it has come.
    header: [u8; FRAME_HEADER],
    pub(super) have: usize,
}

impl Frames {
    pub(super) fn new(preface: usize) -> Frames {
        Frames { skip: preface, showing: false, header: [0; FRAME_HEADER], have: 0 }
    }

    pub(super) fn between_frames(&self) -> bool {
        self.skip == 0 && self.have == 0
    }

    /// Shows `look` each frame header in `bytes`, and the payload of those it answers `true`.
    pub(super) fn follow(&mut self, bytes: &mut &[u8], mut look: impl FnMut(Piece<'_>) -> bool) {
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

/// A frame with this type, flags and payload, on stream 0.
#[cfg(test)]
pub(super) fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags, 0, 0, 0, 0];
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::h2::HEADERS;

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
