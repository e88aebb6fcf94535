//! Reading frames off a channel, less the channel: where the frame at the front of the bytes
//! received so far ends, and how much room to make in the buffer before reading more. The
//! lobby's `Channel::read_frame`, the worker's `WorkerChannel` and the fuzz targets all read
//! frames through [`FrameReader`], so what the fuzzer and the tests check is what both ends do.

use bytes::{Bytes, BytesMut};

use super::{FrameHeader, WireError, HEADER_LEN, MAX_PAYLOAD};

/// The most room one read makes for the rest of a frame: room for the whole of any frame but
/// a WebSocket message. A WebSocket message's header may announce up to 64 MiB
/// ([`MAX_WS_MESSAGE`](super::MAX_WS_MESSAGE)); past this much, its room grows read by read
/// as its bytes come, so that eight bytes of header cannot make a reader allocate 64 MiB for
/// bytes that may never come. Every other frame still gets all its room before its first read,
/// so a request or a response takes no more reads than if the whole length were reserved.
pub const MOST_ROOM_PER_READ: usize = HEADER_LEN + MAX_PAYLOAD;

/// How one end sizes the room it makes before a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadRoom {
    /// This much while the frame at the front has not announced its length, then the rest of
    /// the frame and no more.
    ReadSizeThenRest(usize),
    /// At least this much, or the rest of the frame at the front when that is more.
    AtLeast(usize),
}

/// How an end of the channel reads frames: the header check, the split after
/// `HEADER_LEN + len`, and the room each read makes (never more than the end's read size or
/// [`MOST_ROOM_PER_READ`], whichever is larger). It holds no bytes: each end keeps its buffer
/// its own way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameReader {
    room: ReadRoom,
}

impl FrameReader {
    /// The lobby's: 16 KiB until a frame's header has come, then the rest of the frame (up to
    /// [`MOST_ROOM_PER_READ`]). A buffer whose spare room already fits the rest of a frame is
    /// read into as it is: making more room there would reallocate it and copy the part of the
    /// frame it holds.
    pub const LOBBY: FrameReader = FrameReader { room: ReadRoom::ReadSizeThenRest(16 * 1024) };

    /// The worker's: at least 64 KiB, so that one `recvmsg` usually takes a whole request.
    pub const WORKER: FrameReader = FrameReader { room: ReadRoom::AtLeast(64 * 1024) };

    /// The frame at the front of `unread` once all of it has come: its header, and its length
    /// with the header, where the next frame starts. An error is a header no frame has.
    pub fn whole_frame(unread: &[u8]) -> Result<Option<(FrameHeader, usize)>, WireError> {
        let Some(header) = unread.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let header = FrameHeader::decode(header)?;
        let len = HEADER_LEN + header.len as usize;
        Ok((unread.len() >= len).then_some((header, len)))
    }

    /// Takes the frame at the front of `buf` once all of it has come: its header, and its
    /// payload, which shares `buf`'s memory rather than being copied out of it.
    pub fn take_frame(buf: &mut BytesMut) -> Result<Option<(FrameHeader, Bytes)>, WireError> {
        let Some((header, len)) = Self::whole_frame(buf)? else {
            return Ok(None);
        };
        let mut frame = buf.split_to(len);
        Ok(Some((header, frame.split_off(HEADER_LEN).freeze())))
    }

    /// How much spare room the buffer should have before the next read, `unread` being the
    /// bytes received and not yet taken as frames.
    pub fn room_for_next_read(&self, unread: &[u8]) -> Result<usize, WireError> {
        let rest_of_frame = match unread.first_chunk::<HEADER_LEN>() {
            Some(header) => {
                let len = HEADER_LEN + FrameHeader::decode(header)?.len as usize;
                Some(len.saturating_sub(unread.len()).min(MOST_ROOM_PER_READ))
            }
            None => None,
        };
        Ok(match (self.room, rest_of_frame) {
            (ReadRoom::ReadSizeThenRest(read_size), None) => read_size,
            (ReadRoom::ReadSizeThenRest(_), Some(rest)) => rest,
            (ReadRoom::AtLeast(read_size), rest) => rest.unwrap_or(0).max(read_size),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Kind, MAX_WS_MESSAGE};

    fn header(kind: Kind, len: usize) -> [u8; HEADER_LEN] {
        FrameHeader::new(kind, 0, len).unwrap().encode()
    }

    #[test]
    fn a_frame_is_whole_once_its_announced_payload_has_come() {
        let frame = [header(Kind::ResponseBody, 3).as_slice(), b"abc", b"next"].concat();
        for cut in 0..HEADER_LEN + 3 {
            assert_eq!(FrameReader::whole_frame(&frame[..cut]), Ok(None), "cut at {cut}");
        }
        let expected = FrameHeader { kind: Kind::ResponseBody, flags: 0, len: 3 };
        assert_eq!(FrameReader::whole_frame(&frame), Ok(Some((expected, HEADER_LEN + 3))));
        assert_eq!(FrameReader::whole_frame(&[99, 0, 0, 0, 0, 0, 0, 0]), Err(WireError::UnknownKind(99)));
    }

    #[test]
    fn taking_a_frame_leaves_the_next_in_the_buffer() {
        let mut buf = BytesMut::from([header(Kind::ResponseBody, 3).as_slice(), b"abc", b"next"].concat().as_slice());
        let (header, payload) = FrameReader::take_frame(&mut buf).unwrap().unwrap();
        assert_eq!((header.kind, payload.as_ref()), (Kind::ResponseBody, &b"abc"[..]));
        assert_eq!(buf.as_ref(), b"next");
        assert_eq!(FrameReader::take_frame(&mut buf), Ok(None));
    }

    #[test]
    fn each_end_makes_room_for_a_read_of_its_size_then_for_the_rest_of_the_frame() {
        let frame = [header(Kind::ResponseBody, 70_000).as_slice(), &[0; 60_000]].concat();
        assert_eq!(FrameReader::LOBBY.room_for_next_read(b""), Ok(16 * 1024));
        assert_eq!(FrameReader::LOBBY.room_for_next_read(&frame[..5]), Ok(16 * 1024));
        assert_eq!(FrameReader::LOBBY.room_for_next_read(&frame[..HEADER_LEN + 1000]), Ok(69_000));
        assert_eq!(FrameReader::WORKER.room_for_next_read(b""), Ok(64 * 1024));
        assert_eq!(FrameReader::WORKER.room_for_next_read(&frame[..HEADER_LEN + 1000]), Ok(69_000));
        assert_eq!(FrameReader::WORKER.room_for_next_read(&frame), Ok(64 * 1024));
    }

    #[test]
    fn the_largest_frame_but_a_websocket_message_gets_all_its_room_at_once() {
        let frame = header(Kind::Request, MAX_PAYLOAD);
        assert_eq!(FrameReader::LOBBY.room_for_next_read(&frame), Ok(MAX_PAYLOAD));
        assert_eq!(FrameReader::WORKER.room_for_next_read(&frame), Ok(MAX_PAYLOAD));
    }

    #[test]
    fn a_websocket_message_gets_its_room_as_its_bytes_come() {
        for reader in [FrameReader::LOBBY, FrameReader::WORKER] {
            let largest = header(Kind::WsMessage, 1 + MAX_WS_MESSAGE);
            assert_eq!(reader.room_for_next_read(&largest), Ok(MOST_ROOM_PER_READ));
        }
        // Of a 3 MiB message, 1 MiB has come, then all but 100 bytes.
        let mut message = [header(Kind::WsMessage, 3 << 20).as_slice(), &[0; 1 << 20]].concat();
        assert_eq!(FrameReader::LOBBY.room_for_next_read(&message), Ok(MOST_ROOM_PER_READ));
        message.resize(HEADER_LEN + (3 << 20) - 100, 0);
        assert_eq!(FrameReader::LOBBY.room_for_next_read(&message), Ok(100));
        assert_eq!(FrameReader::WORKER.room_for_next_read(&message), Ok(64 * 1024));
    }

    #[test]
    fn making_room_for_a_read_checks_the_header() {
        let header = [99, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(FrameReader::LOBBY.room_for_next_read(&header), Err(WireError::UnknownKind(99)));
        assert_eq!(FrameReader::WORKER.room_for_next_read(&header), Err(WireError::UnknownKind(99)));
    }
}
