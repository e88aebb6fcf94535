//! Frames exchanged between the maitred lobby and its workers (docs/PROTOCOL.md), and the
//! words of the lobby's control channel to its zygote (`zygote`).
//!
//! Pure encoding and decoding: no sockets, no file descriptors. Callers move bytes and
//! pass descriptors themselves; this crate only says what the bytes mean, where each frame
//! ends and how much room to make for the next read ([`FrameReader`]).

use std::fmt;

mod fields;
mod frame_reader;
mod ids;
mod ready;
mod records;
mod request;
mod response;
mod websocket;
pub mod zygote;

pub use fields::{HeaderPairs, Reader, Writer};
pub use frame_reader::{FrameReader, MOST_ROOM_PER_READ};
pub use ids::{cancel_frame, decode_cancel, id_frame, split_request_id, ID_LEN};
pub use ready::Ready;
pub use records::{record_header, BodyRecords, END_RECORD, RECORD_HEADER_LEN};
pub use request::{Request, HTTP_1_0, HTTP_1_1, HTTP_2};
pub use response::{FileRange, ResponseHead};
pub use websocket::{WsAccept, WsClosing, WsData, WsOpcode};

/// Every frame starts with this many bytes of header.
pub const HEADER_LEN: usize = 8;

/// The most body bytes one response frame carries: a worker splits a larger chunk, so that
/// the lobby never holds more than this of one answer to read one frame (docs/LIMITS.md).
pub const MAX_BODY_PER_FRAME: usize = 256 * 1024;

/// The largest payload of any frame, either way: a body share, or a request's inline body
/// (at most 256 KiB) with its head (at most 64 KiB), and room for a response's headers.
pub const MAX_PAYLOAD: usize = 1024 * 1024;

/// The largest WebSocket message either way (`WS_MESSAGE`, `WS_SEND`, after their opcode byte):
/// the ceiling of `--ws-max-size`. A message travels whole, as ASGI hands it over.
pub const MAX_WS_MESSAGE: usize = 64 << 20;

/// Flag: this frame is the last of a response.
pub const FLAG_END: u8 = 1;
/// Flag: one file descriptor travels with this frame.
pub const FLAG_FD: u8 = 2;
/// Flag on a `REQUEST`: a WebSocket opening handshake the lobby has validated (section 5).
pub const FLAG_WEBSOCKET: u8 = 4;
/// Flag on a `REQUEST` with `FLAG_FD`: its body's length is not known (a chunked upload), and
/// its pipe carries it in records (`BodyRecords`); the frame's body length is 0.
pub const FLAG_RECORDS: u8 = 8;

/// `READY` flag: the worker runs an ASGI application and takes WebSocket requests.
pub const READY_ASGI: u8 = 1;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Ready = 1,
    BootFailed = 2,
    ResponseHead = 3,
    ResponseBody = 4,
    ResponseFile = 5,
    ResponseAbort = 6,
    /// The application accepts a WebSocket: subprotocol and extra headers for the `101`.
    WsAccept = 7,
    /// A message the application sends on its WebSocket.
    WsSend = 8,
    /// The application closes its WebSocket (or refuses it, before `WS_ACCEPT`); always `END`.
    WsClose = 9,
    Request = 16,
    /// The lobby no longer wants the answer to the request whose id is its 4-byte payload.
    Cancel = 17,
    /// The worker's shared region (crates/shm), a memfd passed with the frame.
    Region = 19,
    /// The eventfd that wakes the worker when it sleeps with nothing to do, passed with the frame.
    Bell = 20,
    /// In a request slot, in place of a request too large for one or with a body file: that
    /// request comes on the channel, next, as a `REQUEST` frame. In the answer ring, in place of
    /// an answer frame too large for it or with a descriptor: that frame comes on the channel.
    OnChannel = 21,
    /// The eventfd the worker rings to wake the lobby when it has written an answer while the
    /// lobby sleeps, passed with the frame.
    LobbyBell = 22,
    /// A whole message from the WebSocket's client, on the channel: the request's `u32` id,
    /// then a `WsData` payload.
    WsMessage = 23,
    /// The WebSocket's client connection is closed (or the lobby closed it), on the channel:
    /// the request's `u32` id, then a `WsClosing` payload.
    WsClosed = 24,
    /// To an ASGI worker: the answer to the request whose id is its 4-byte payload waits for a
    /// slow client; the request's `send` awaits `GO` (docs/PROTOCOL.md, section 4).
    Hold = 25,
    /// To an ASGI worker: the request whose id is its 4-byte payload may send again.
    Go = 26,
    /// In the answer ring, from an ASGI worker: the WebSocket the record names has as many
    /// unread messages as it queues; the lobby reads no more from its client until `WS_GO`.
    WsHold = 10,
    /// In the answer ring: the WebSocket the record names has room for messages again.
    WsGo = 11,
}

impl Kind {
    /// The largest payload a frame of this kind may have.
    pub const fn max_payload(self) -> usize {
        match self {
            Kind::WsSend => 1 + MAX_WS_MESSAGE,
            Kind::WsMessage => ID_LEN + 1 + MAX_WS_MESSAGE,
            _ => MAX_PAYLOAD,
        }
    }

    fn from_u8(value: u8) -> Option<Kind> {
        Some(match value {
            1 => Kind::Ready,
            2 => Kind::BootFailed,
            3 => Kind::ResponseHead,
            4 => Kind::ResponseBody,
            5 => Kind::ResponseFile,
            6 => Kind::ResponseAbort,
            7 => Kind::WsAccept,
            8 => Kind::WsSend,
            9 => Kind::WsClose,
            10 => Kind::WsHold,
            11 => Kind::WsGo,
            16 => Kind::Request,
            17 => Kind::Cancel,
            19 => Kind::Region,
            20 => Kind::Bell,
            21 => Kind::OnChannel,
            22 => Kind::LobbyBell,
            23 => Kind::WsMessage,
            24 => Kind::WsClosed,
            25 => Kind::Hold,
            26 => Kind::Go,
            _ => return None,
        })
    }
}

/// The fixed 8-byte start of every frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: Kind,
    pub flags: u8,
    pub len: u32,
}

impl FrameHeader {
    pub fn new(kind: Kind, flags: u8, len: usize) -> Result<FrameHeader, WireError> {
        if len > kind.max_payload() {
            return Err(WireError::TooLarge(len));
        }
        Ok(FrameHeader { kind, flags, len: len as u32 })
    }

    pub fn is_end(&self) -> bool {
        self.flags & FLAG_END != 0
    }

    pub fn has_fd(&self) -> bool {
        self.flags & FLAG_FD != 0
    }

    pub const fn encode(&self) -> [u8; HEADER_LEN] {
        let len = self.len.to_le_bytes();
        [self.kind as u8, self.flags, 0, 0, len[0], len[1], len[2], len[3]]
    }

    pub fn decode(bytes: &[u8; HEADER_LEN]) -> Result<FrameHeader, WireError> {
        let kind = Kind::from_u8(bytes[0]).ok_or(WireError::UnknownKind(bytes[0]))?;
        let len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        if len as usize > kind.max_payload() {
            return Err(WireError::TooLarge(len as usize));
        }
        Ok(FrameHeader { kind, flags: bytes[1], len })
    }
}

/// Why a frame could not be encoded or decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    UnknownKind(u8),
    /// The payload ended before the named field.
    Truncated(&'static str),
    /// A field is longer than its length prefix can say.
    FieldTooLong(&'static str, usize),
    /// A payload is longer than a frame can carry.
    TooLarge(usize),
    /// The payload had bytes left after its last field.
    TrailingBytes(usize),
    /// A field holds a value it cannot have.
    BadValue(&'static str, u8),
    /// A frame of this kind has a payload of another length.
    BadLength(&'static str, usize),
    /// A text field is not UTF-8.
    NotUtf8(&'static str),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::UnknownKind(kind) => write!(f, "unknown frame kind {kind}"),
            WireError::Truncated(field) => write!(f, "frame ends inside field '{field}'"),
            WireError::FieldTooLong(field, len) => {
                write!(f, "field '{field}' is {len} bytes, more than its length prefix allows")
            }
            WireError::TooLarge(len) => write!(f, "payload of {len} bytes does not fit in a frame"),
            WireError::TrailingBytes(n) => write!(f, "{n} unexpected bytes after the last field"),
            WireError::BadValue(field, value) => write!(f, "field '{field}' cannot be {value}"),
            WireError::BadLength(kind, len) => write!(f, "a {kind} frame cannot have a {len}-byte payload"),
            WireError::NotUtf8(field) => write!(f, "field '{field}' is not UTF-8"),
        }
    }
}

impl std::error::Error for WireError {}

/// Builds one whole frame whose payload `write` appends in place, so the payload is never
/// copied to get its length into the header.
pub fn build_frame(
    kind: Kind,
    flags: u8,
    write: impl FnOnce(&mut Vec<u8>) -> Result<(), WireError>,
) -> Result<Vec<u8>, WireError> {
    let mut frame = vec![0u8; HEADER_LEN];
    write(&mut frame)?;
    let header = FrameHeader::new(kind, flags, frame.len() - HEADER_LEN)?;
    frame[..HEADER_LEN].copy_from_slice(&header.encode());
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::SCHEME_CLIENT_SUBJECT;
    use bytes::BytesMut;

    fn sample_request(inline_body: &[u8]) -> Request<'_> {
        Request {
            http_version: 1,
            method: b"POST",
            target: b"/a%20b?x=1",
            peer_addr: b"127.0.0.1",
            peer_port: 40000,
            server_name: b"localhost",
            server_port: 8000,
            https: true,
            client_subject: None,
            headers: vec![(b"Host", b"example.org"), (b"X-Empty", b"")],
            body_len: 5,
            inline_body,
        }
    }

    #[test]
    fn header_round_trips() {
        let header = FrameHeader::new(Kind::ResponseBody, FLAG_END | FLAG_FD, 70000).unwrap();
        let decoded = FrameHeader::decode(&header.encode()).unwrap();
        assert_eq!(decoded, header);
        assert!(decoded.is_end() && decoded.has_fd());
    }

    #[test]
    fn unknown_kind_is_an_error() {
        assert_eq!(FrameHeader::decode(&[99, 0, 0, 0, 0, 0, 0, 0]), Err(WireError::UnknownKind(99)));
    }

    #[test]
    fn request_round_trips_with_inline_body() {
        let request = sample_request(b"hello");
        let mut payload = Vec::new();
        request.encode_payload(&mut payload).unwrap();
        assert_eq!(Request::decode_payload(&payload, false).unwrap(), request);
    }

    #[test]
    fn request_with_body_in_file_has_no_inline_bytes() {
        let request = sample_request(b"");
        let mut payload = Vec::new();
        request.encode_payload(&mut payload).unwrap();
        let decoded = Request::decode_payload(&payload, true).unwrap();
        assert_eq!(decoded.body_len, 5);
        assert!(decoded.inline_body.is_empty());
        assert_eq!(Request::decode_payload(&payload, false), Err(WireError::Truncated("body")));
    }

    #[test]
    fn a_payload_over_the_frame_limit_is_refused_both_ways() {
        assert_eq!(FrameHeader::new(Kind::ResponseBody, 0, MAX_PAYLOAD + 1), Err(WireError::TooLarge(MAX_PAYLOAD + 1)));
        let mut bytes = FrameHeader::new(Kind::ResponseBody, 0, MAX_PAYLOAD).unwrap().encode();
        assert!(FrameHeader::decode(&bytes).is_ok());
        bytes[4..8].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_le_bytes());
        assert_eq!(FrameHeader::decode(&bytes), Err(WireError::TooLarge(MAX_PAYLOAD + 1)));
    }

    #[test]
    fn built_frame_announces_its_payload_length() {
        let frame = build_frame(Kind::ResponseBody, FLAG_END, |out| {
            out.extend_from_slice(b"abc");
            Ok(())
        })
        .unwrap();
        let header = FrameHeader::decode(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(header, FrameHeader { kind: Kind::ResponseBody, flags: FLAG_END, len: 3 });
        assert_eq!(&frame[HEADER_LEN..], b"abc");
    }

    #[test]
    fn truncated_request_names_the_missing_field() {
        let mut payload = Vec::new();
        sample_request(b"hello").encode_payload(&mut payload).unwrap();
        assert_eq!(Request::decode_payload(&payload[..3], false), Err(WireError::Truncated("method")));
    }

    #[test]
    fn a_url_scheme_with_unknown_bits_is_refused() {
        let mut payload = Vec::new();
        sample_request(b"hello").encode_payload(&mut payload).unwrap();
        // The flag follows the version, the method, the target, the peer and the server.
        let at = 1 + (2 + 4) + (2 + 10) + (2 + 9) + 2 + (2 + 9) + 2;
        assert_eq!(payload[at], 1);
        payload[at] = 4;
        assert_eq!(Request::decode_payload(&payload, false), Err(WireError::BadValue("url scheme", 4)));
    }

    #[test]
    fn a_client_subject_round_trips_after_the_scheme() {
        let mut request = sample_request(b"hello");
        request.client_subject = Some(b"CN=alice,O=Example");
        let mut payload = Vec::new();
        request.encode_payload(&mut payload).unwrap();
        assert_eq!(Request::decode_payload(&payload, false).unwrap(), request);
        let at = 1 + (2 + 4) + (2 + 10) + (2 + 9) + 2 + (2 + 9) + 2;
        assert_eq!(payload[at], 1 | SCHEME_CLIENT_SUBJECT);
    }

    #[test]
    fn response_head_round_trips_with_first_body_bytes() {
        let head = ResponseHead { status: 404, reason: b"Not Found", headers: vec![(b"Content-Type", b"text/plain")] };
        let mut payload = Vec::new();
        head.encode_payload(&mut payload).unwrap();
        payload.extend_from_slice(b"missing");
        let (decoded, body) = ResponseHead::decode_payload(&payload).unwrap();
        assert_eq!(decoded, head);
        assert_eq!(body, b"missing");
    }

    #[test]
    fn overlong_field_is_refused() {
        let long = vec![b'a'; 70000];
        let head = ResponseHead { status: 200, reason: &long, headers: vec![] };
        assert_eq!(head.encode_payload(&mut Vec::new()), Err(WireError::FieldTooLong("reason", 70000)));
    }

    #[test]
    fn file_range_round_trips() {
        let range = FileRange { offset: 10, count: 1 << 40 };
        assert_eq!(FileRange::decode_payload(&range.encode_payload()).unwrap(), range);
    }

    #[test]
    fn a_cancel_names_its_request() {
        let frame = cancel_frame(0x0102_0304);
        let header = FrameHeader::decode(frame[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(header, FrameHeader { kind: Kind::Cancel, flags: 0, len: 4 });
        assert_eq!(decode_cancel(&frame[HEADER_LEN..]), Ok(0x0102_0304));
        assert_eq!(decode_cancel(&[1, 2, 3]), Err(WireError::BadLength("CANCEL", 3)));
    }

    /// Section 5's frames, each as it is decoded, for comparing runs.
    #[derive(Clone, Debug, PartialEq, Eq)]
    enum Decoded {
        Ready(Ready),
        Accept(Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>),
        Data(Kind, WsOpcode, Vec<u8>),
        Closing(Kind, bool, u16, String),
    }

    fn decode_ws(header: FrameHeader, payload: &[u8]) -> Result<Decoded, WireError> {
        Ok(match header.kind {
            Kind::Ready => Decoded::Ready(Ready::decode_payload(payload)?),
            Kind::WsAccept => {
                let accept = WsAccept::decode_payload(payload)?;
                let headers = accept.headers.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
                Decoded::Accept(accept.subprotocol.to_vec(), headers)
            }
            Kind::WsSend | Kind::WsMessage => {
                let payload = if header.kind == Kind::WsMessage { named(payload)? } else { payload };
                let data = WsData::decode_payload(payload)?;
                Decoded::Data(header.kind, data.opcode, data.data.to_vec())
            }
            Kind::WsClose | Kind::WsClosed => {
                let payload = if header.kind == Kind::WsClosed { named(payload)? } else { payload };
                let closing = WsClosing::decode_payload(payload)?;
                Decoded::Closing(header.kind, header.is_end(), closing.code, closing.reason.to_string())
            }
            other => panic!("not a section 5 frame: {other:?}"),
        })
    }

    /// The payload after the request id of a lobby -> worker WebSocket frame, which must be
    /// `WS_REQUEST_ID`.
    fn named(payload: &[u8]) -> Result<&[u8], WireError> {
        let (id, rest) = split_request_id(payload)?;
        assert_eq!(id, WS_REQUEST_ID);
        Ok(rest)
    }

    const WS_REQUEST_ID: u32 = 0x0102_0304;

    /// The frames of a stream that arrives in `reads`, read as the lobby's channel reads them
    /// (`FrameReader::LOBBY`'s room before each read, `take_frame`), and the bytes left over.
    fn lobby_reads(reads: &[&[u8]]) -> (Vec<Decoded>, usize) {
        let mut buf = BytesMut::new();
        let mut decoded = Vec::new();
        for read in reads {
            buf.reserve(FrameReader::LOBBY.room_for_next_read(&buf).unwrap());
            buf.extend_from_slice(read);
            while let Some((header, payload)) = FrameReader::take_frame(&mut buf).unwrap() {
                decoded.push(decode_ws(header, &payload).unwrap());
            }
        }
        (decoded, buf.len())
    }

    /// The same, read as the worker reads them: `FrameReader::WORKER`'s room before each read,
    /// `whole_frame` on the bytes after those consumed.
    fn worker_reads(reads: &[&[u8]]) -> (Vec<Decoded>, usize) {
        let mut inbox = Vec::new();
        let mut consumed = 0;
        let mut decoded = Vec::new();
        for read in reads {
            inbox.drain(..consumed);
            consumed = 0;
            inbox.reserve(FrameReader::WORKER.room_for_next_read(&inbox).unwrap());
            inbox.extend_from_slice(read);
            while let Some((header, len)) = FrameReader::whole_frame(&inbox[consumed..]).unwrap() {
                decoded.push(decode_ws(header, &inbox[consumed + HEADER_LEN..consumed + len]).unwrap());
                consumed += len;
            }
        }
        (decoded, inbox.len() - consumed)
    }

    fn ws_stream() -> Vec<u8> {
        let mut stream = Vec::new();
        let ready = Ready { pid: 4242, flags: READY_ASGI };
        stream.extend(
            build_frame(Kind::Ready, 0, |out| {
                out.extend_from_slice(&ready.encode_payload());
                Ok(())
            })
            .unwrap(),
        );
        let accept = WsAccept { subprotocol: b"chat", headers: vec![(b"Set-Cookie", b"a=b"), (b"X-Empty", b"")] };
        stream.extend(build_frame(Kind::WsAccept, 0, |out| accept.encode_payload(out)).unwrap());
        for (kind, opcode, data) in [
            (Kind::WsMessage, WsOpcode::Text, "h\u{e9}llo".as_bytes()),
            (Kind::WsSend, WsOpcode::Binary, &[0, 255, 13, 10][..]),
            (Kind::WsSend, WsOpcode::Text, b""),
        ] {
            stream.extend(
                build_frame(kind, 0, |out| {
                    if kind == Kind::WsMessage {
                        out.extend_from_slice(&WS_REQUEST_ID.to_le_bytes());
                    }
                    WsData { opcode, data }.encode_payload(out);
                    Ok(())
                })
                .unwrap(),
            );
        }
        for (kind, flags, code, reason) in
            [(Kind::WsClosed, 0, 1005, ""), (Kind::WsClose, FLAG_END, 1000, "bye \u{2713}")]
        {
            stream.extend(
                build_frame(kind, flags, |out| {
                    if kind == Kind::WsClosed {
                        out.extend_from_slice(&WS_REQUEST_ID.to_le_bytes());
                    }
                    WsClosing { code, reason }.encode_payload(out);
                    Ok(())
                })
                .unwrap(),
            );
        }
        stream
    }

    #[test]
    fn websocket_frames_decode_the_same_whole_byte_by_byte_and_split_at_every_offset() {
        let bytes = ws_stream();
        let expected = vec![
            Decoded::Ready(Ready { pid: 4242, flags: READY_ASGI }),
            Decoded::Accept(
                b"chat".to_vec(),
                vec![(b"Set-Cookie".to_vec(), b"a=b".to_vec()), (b"X-Empty".to_vec(), vec![])],
            ),
            Decoded::Data(Kind::WsMessage, WsOpcode::Text, "h\u{e9}llo".as_bytes().to_vec()),
            Decoded::Data(Kind::WsSend, WsOpcode::Binary, vec![0, 255, 13, 10]),
            Decoded::Data(Kind::WsSend, WsOpcode::Text, vec![]),
            Decoded::Closing(Kind::WsClosed, false, 1005, String::new()),
            Decoded::Closing(Kind::WsClose, true, 1000, "bye \u{2713}".into()),
        ];
        for (end, reads) in [("lobby", lobby_reads as fn(&[&[u8]]) -> _), ("worker", worker_reads)] {
            assert_eq!(reads(&[&bytes]), (expected.clone(), 0), "the {end} fed it whole");
            let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
            assert_eq!(reads(&bytewise), (expected.clone(), 0), "the {end} fed it byte by byte");
            for at in 0..=bytes.len() {
                let (first, second) = bytes.split_at(at);
                assert_eq!(reads(&[first, second]), (expected.clone(), 0), "the {end} fed it split at {at}");
            }
        }
    }

    #[test]
    fn a_websocket_message_may_pass_the_frame_limit_up_to_its_own() {
        // A WS_MESSAGE names its request first (4 bytes); a WS_SEND's record does.
        for (kind, most) in [(Kind::WsMessage, ID_LEN + 1 + MAX_WS_MESSAGE), (Kind::WsSend, 1 + MAX_WS_MESSAGE)] {
            let header = FrameHeader::new(kind, 0, most).unwrap();
            assert_eq!(FrameHeader::decode(&header.encode()), Ok(header));
            let mut bytes = header.encode();
            bytes[4..8].copy_from_slice(&(most as u32 + 1).to_le_bytes());
            assert_eq!(FrameHeader::decode(&bytes), Err(WireError::TooLarge(most + 1)));
        }
        assert_eq!(FrameHeader::new(Kind::WsAccept, 0, MAX_PAYLOAD + 1), Err(WireError::TooLarge(MAX_PAYLOAD + 1)));
    }

    #[test]
    fn a_bare_ready_has_no_flags_and_a_longer_one_is_refused() {
        assert_eq!(Ready::decode_payload(&7u32.to_le_bytes()), Ok(Ready { pid: 7, flags: 0 }));
        assert!(!Ready::decode_payload(&7u32.to_le_bytes()).unwrap().asgi());
        assert!(Ready::decode_payload(&[7, 0, 0, 0, READY_ASGI]).unwrap().asgi());
        assert_eq!(Ready::decode_payload(&[7, 0, 0]), Err(WireError::Truncated("pid")));
        assert_eq!(Ready::decode_payload(&[7, 0, 0, 0, 1, 0]), Err(WireError::TrailingBytes(1)));
    }

    #[test]
    fn every_truncated_websocket_head_names_its_field() {
        let mut accept = Vec::new();
        WsAccept { subprotocol: b"chat", headers: vec![(b"A", b"b")] }.encode_payload(&mut accept).unwrap();
        for at in 0..accept.len() {
            assert!(matches!(WsAccept::decode_payload(&accept[..at]), Err(WireError::Truncated(_))), "cut at {at}");
        }
        assert_eq!(WsAccept::decode_payload(&[accept.as_slice(), b"x"].concat()), Err(WireError::TrailingBytes(1)));
        assert_eq!(WsData::decode_payload(&[]), Err(WireError::Truncated("opcode")));
        assert_eq!(WsClosing::decode_payload(&[0xe8]), Err(WireError::Truncated("close code")));
    }

    #[test]
    fn websocket_payloads_with_values_they_cannot_have_are_refused() {
        // Opcodes other than text and binary are the lobby's business (control frames).
        for opcode in [0, 3, 8, 9, 10] {
            assert_eq!(WsData::decode_payload(&[opcode, b'a']), Err(WireError::BadValue("opcode", opcode)));
        }
        assert_eq!(WsData::decode_payload(&[1, 0xff]), Err(WireError::NotUtf8("text message")));
        assert_eq!(WsData::decode_payload(&[2, 0xff]).unwrap().data, &[0xff]);
        assert_eq!(WsClosing::decode_payload(&[0xe8, 0x03, 0xc3]), Err(WireError::NotUtf8("close reason")));
        assert_eq!(WsClosing::decode_payload(&[0xe8, 0x03]), Ok(WsClosing { code: 1000, reason: "" }));
    }
}
