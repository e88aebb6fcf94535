//! `lobby_frames` and `worker_frames`: the frames of the worker channel (docs/PROTOCOL.md,
//! section 2), read by each end.
//!
//! Neither end's reading can be called without a socket: the lobby's is `Channel::read_frame`
//! and `decode_part` in crates/lobby/src/worker/{channel,relay}.rs (async, over a registered
//! descriptor), the worker's is `WorkerChannel::next_request`, `take_from_slot` and
//! `take_request` in crates/python/src/channel/receive.rs (inside the pyo3 module, which only
//! links into a Python process). What both do with the bytes is crates/wire's, and the targets
//! call the same code: `FrameReader` (the header check, the split after `HEADER_LEN + len`, the
//! room each read makes), `FrameHeader::decode`, the payload decoders and `Reader`. Around it,
//! they keep a copy of what each loop does with a whole frame (the lobby's `decode_part`, the
//! worker's kind checks and where it cuts the inline body) and drop the I/O; a change there
//! must be mirrored here (docs/FUZZING.md).
//!
//! Properties: no panic; the same events whether the stream arrives whole, a byte at a time
//! or cut into reads of every size; no read makes room for more than [`MOST_RESERVED`]
//! however long a frame its header announces (the room is checked rather than allocated,
//! which would only slow the fuzzer); every header and payload that decodes encodes back to
//! the same bytes (the reserved header bytes aside); a request's inline body is the end of its
//! payload, where the worker slices it.

use std::mem;

use bytes::{Bytes, BytesMut};
use maitred_wire::{
    decode_cancel, FileRange, FrameHeader, FrameReader, Kind, Request, ResponseHead, WireError, HEADER_LEN, MAX_PAYLOAD,
};

use crate::{pieces, Input};

/// The most room a reader may make before one read: that of the largest frame but a WebSocket
/// message, whose header may announce 64 MiB. Room for more has to wait for the bytes, so that
/// one header cannot make a reader allocate what the stream never sends.
pub const MOST_RESERVED: usize = HEADER_LEN + MAX_PAYLOAD;

/// A header that decodes is the one `FrameHeader::new` makes from its fields, and encodes
/// back to its bytes, less the two reserved ones (which `decode` ignores).
fn check_header(bytes: &[u8], header: &FrameHeader) {
    let bytes: &[u8; HEADER_LEN] = bytes.first_chunk().expect("a whole header");
    assert_eq!(FrameHeader::new(header.kind, header.flags, header.len as usize), Ok(*header), "{bytes:?}");
    let mut canonical = *bytes;
    canonical[2..4].fill(0);
    assert_eq!(header.encode(), canonical);
}

/// The room a reader makes before a read, `unread` being the bytes it holds and has not taken
/// as frames (all of which it has checked).
fn check_room(reader: FrameReader, unread: &[u8]) {
    let room = reader.room_for_next_read(unread).expect("a header the reader took");
    assert!(room <= MOST_RESERVED, "a frame header makes the reader reserve {room} bytes");
}

/// What the lobby made of the worker's frames.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LobbyEvent {
    Ready,
    BootFailed(String),
    Head {
        status: u16,
        reason: Bytes,
        headers: Vec<(Bytes, Bytes)>,
        body: Bytes,
        end: bool,
    },
    Body {
        data: Bytes,
        end: bool,
    },
    File {
        offset: u64,
        count: u64,
        end: bool,
    },
    Abort,
    /// The worker broke the protocol: the lobby kills it.
    Broken(String),
    /// The stream ended; `inside_frame`: in the middle of one.
    Closed {
        inside_frame: bool,
    },
}

/// `read_frame` up to the point where it would read the socket: the next whole frame from the
/// lobby's buffer, its header checked.
fn next_frame(buf: &mut BytesMut) -> Result<Option<(FrameHeader, Bytes)>, WireError> {
    let header_bytes = buf.first_chunk::<HEADER_LEN>().copied();
    let frame = FrameReader::take_frame(buf)?;
    if let (Some((header, _)), Some(bytes)) = (&frame, header_bytes) {
        check_header(&bytes, header);
    }
    Ok(frame)
}

/// `decode_part` in crates/lobby/src/worker/relay.rs, with the descriptor of an `FD` frame taken as
/// having come with it.
fn decode_part(header: FrameHeader, payload: Bytes) -> Result<LobbyEvent, String> {
    let end = header.is_end();
    match header.kind {
        Kind::ResponseHead => {
            let (head, body) = ResponseHead::decode_payload(&payload).map_err(|e| e.to_string())?;
            let mut again = Vec::new();
            head.encode_payload(&mut again).expect("a decoded head encodes");
            again.extend_from_slice(body);
            assert_eq!(again, payload, "RESPONSE_HEAD decoded and encoded again");
            // Bytes::slice_ref panics on a slice from elsewhere.
            let slice = |s: &[u8]| payload.slice_ref(s);
            Ok(LobbyEvent::Head {
                status: head.status,
                reason: slice(head.reason),
                headers: head.headers.iter().map(|(n, v)| (slice(n), slice(v))).collect(),
                body: slice(body),
                end,
            })
        }
        Kind::ResponseBody => Ok(LobbyEvent::Body { data: payload, end }),
        Kind::ResponseFile => {
            let range = FileRange::decode_payload(&payload).map_err(|e| e.to_string())?;
            assert_eq!(range.encode_payload().as_slice(), payload.as_ref(), "RESPONSE_FILE encoded again");
            if !header.has_fd() {
                return Err("RESPONSE_FILE without a descriptor".into());
            }
            Ok(LobbyEvent::File { offset: range.offset, count: range.count, end })
        }
        Kind::ResponseAbort => Ok(LobbyEvent::Abort),
        other => Err(format!("unexpected {other:?} frame during a response")),
    }
}

/// The lobby reading a worker's stream that arrives in `pieces`: `await_ready`, then the
/// parts of responses, until the worker breaks the protocol or the stream ends.
fn lobby_reads<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Vec<LobbyEvent> {
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    for piece in pieces {
        check_room(FrameReader::LOBBY, &buf);
        buf.extend_from_slice(piece);
        loop {
            let (header, payload) = match next_frame(&mut buf) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    events.push(LobbyEvent::Broken(e.to_string()));
                    return events;
                }
            };
            let event = if events.is_empty() {
                // await_ready
                match header.kind {
                    Kind::Ready => LobbyEvent::Ready,
                    Kind::BootFailed => {
                        events.push(LobbyEvent::BootFailed(String::from_utf8_lossy(&payload).trim().to_string()));
                        return events;
                    }
                    other => LobbyEvent::Broken(format!("sent {other:?} before READY")),
                }
            } else {
                decode_part(header, payload).unwrap_or_else(LobbyEvent::Broken)
            };
            let broken = matches!(event, LobbyEvent::Broken(_));
            events.push(event);
            if broken {
                return events;
            }
        }
    }
    check_room(FrameReader::LOBBY, &buf);
    events.push(LobbyEvent::Closed { inside_frame: !buf.is_empty() });
    events
}

/// The fuzz target for the lobby's end: two bytes choosing how the stream is cut into reads,
/// then the bytes a worker sent.
pub fn lobby_frames(data: &[u8]) {
    let mut input = Input::new(data);
    let seed = input.u16();
    let stream = input.data();
    let whole = lobby_reads([stream]);
    assert_eq!(lobby_reads(stream.chunks(1)), whole, "byte by byte vs whole");
    assert_eq!(lobby_reads(pieces(stream, seed)), whole, "in reads (seed {seed}) vs whole");
}

/// The worker's receive buffer: `inbox`, `inbox_start` and the loops that use them in
/// crates/python/src/channel/receive.rs.
struct WorkerChannel {
    inbox: Vec<u8>,
    inbox_start: usize,
    /// Whether REGION, BELL and LOBBY_BELL came (each may come once).
    region: bool,
    bell: bool,
    lobby_bell: bool,
}

/// `HAND_OVER_BODY` in channel/receive.rs.
const HAND_OVER_BODY: usize = 16 * 1024;

/// What the worker made of the lobby's frames.
#[derive(Clone, Debug, PartialEq, Eq)]
enum WorkerEvent {
    Cancel(u32),
    Region,
    Bell,
    LobbyBell,
    Request {
        http_version: u8,
        method: Vec<u8>,
        target: Vec<u8>,
        peer: (Vec<u8>, u16),
        server: (Vec<u8>, u16),
        https: bool,
        headers: Vec<(Vec<u8>, Vec<u8>)>,
        body_len: u64,
        /// None when the body comes in a file.
        inline_body: Option<Vec<u8>>,
    },
    /// A `ChannelError`: the worker cannot go on.
    Broken(String),
    Closed {
        inside_frame: bool,
    },
}

/// Where a whole frame lies in the inbox.
struct FrameAt {
    header: FrameHeader,
    start: usize,
    end: usize,
}

impl WorkerChannel {
    fn new() -> WorkerChannel {
        WorkerChannel { inbox: Vec::new(), inbox_start: 0, region: false, bell: false, lobby_bell: false }
    }

    /// `buffered_frame`: the first unconsumed frame, when all of it has arrived.
    fn buffered_frame(&self) -> Result<Option<FrameAt>, String> {
        let unread = &self.inbox[self.inbox_start..];
        let frame = FrameReader::whole_frame(unread).map_err(|e| format!("the lobby sent a bad frame: {e}"))?;
        Ok(frame.map(|(header, len)| {
            check_header(unread, &header);
            FrameAt { header, start: self.inbox_start, end: self.inbox_start + len }
        }))
    }

    fn compact(&mut self) {
        if self.inbox_start > 0 {
            self.inbox.drain(..self.inbox_start);
            self.inbox_start = 0;
        }
    }

    fn consume_through(&mut self, end: usize) {
        self.inbox_start = end;
        if self.inbox_start >= self.inbox.len() {
            self.inbox.clear();
            self.inbox_start = 0;
        }
    }

    /// `next_request` up to the point where it would wait: a whole `REQUEST` (taken as the one
    /// whose place the worker took in a slot: the lobby queues that place only after the frame),
    /// after the CANCEL, REGION and BELL frames before it (which it handles), or None when no
    /// whole frame is buffered.
    fn next_request(&mut self, events: &mut Vec<WorkerEvent>) -> Result<Option<FrameAt>, String> {
        while let Some(frame) = self.buffered_frame()? {
            let header = frame.header;
            match header.kind {
                Kind::Request => return Ok(Some(frame)),
                Kind::Cancel => {
                    // check_cancel_frame
                    if header.flags != 0 {
                        return Err("a CANCEL frame with flags".into());
                    }
                    let id = decode_cancel(&self.inbox[frame.start + HEADER_LEN..frame.end])
                        .map_err(|e| format!("the lobby sent a bad CANCEL frame: {e}"))?;
                    events.push(WorkerEvent::Cancel(id));
                }
                // open_region, take_bell, take_lobby_bell: setup_descriptor
                Kind::Region | Kind::Bell | Kind::LobbyBell => {
                    let (again, event) = match header.kind {
                        Kind::Region => (&mut self.region, WorkerEvent::Region),
                        Kind::Bell => (&mut self.bell, WorkerEvent::Bell),
                        _ => (&mut self.lobby_bell, WorkerEvent::LobbyBell),
                    };
                    if !(header.has_fd() && header.len == 0 && !*again) {
                        return Err(format!("a bad {:?} frame", header.kind));
                    }
                    *again = true;
                    events.push(event);
                }
                other => {
                    return Err(format!(
                        "a {other:?} frame; a worker only receives REQUEST, CANCEL, REGION, BELL and LOBBY_BELL"
                    ))
                }
            }
            self.consume_through(frame.end);
        }
        Ok(None)
    }

    /// `take_request`, without the environ (which needs Python): the request, its inline body
    /// cut out of the inbox where channel/receive.rs cuts it.
    fn take_request(&mut self, frame: FrameAt) -> Result<WorkerEvent, String> {
        let body_in_file = frame.header.has_fd();
        let payload = &self.inbox[frame.start + HEADER_LEN..frame.end];
        let request = Request::decode_payload(payload, body_in_file)
            .map_err(|e| format!("the lobby sent a bad REQUEST frame: {e}"))?;
        if request.http_version > maitred_wire::HTTP_2 {
            return Err(format!("a REQUEST frame has an unknown HTTP version byte {}", request.http_version));
        }
        let mut again = Vec::new();
        request.encode_payload(&mut again).expect("a decoded request encodes");
        assert_eq!(again, payload, "REQUEST decoded and encoded again");
        let inline_len = request.inline_body.len();
        if body_in_file {
            assert_eq!(inline_len, 0, "an inline body beside a body file");
        } else {
            assert_eq!(inline_len as u64, request.body_len, "an inline body of the wrong length");
        }
        // channel/receive.rs takes the inline body as the last inline_len bytes of the frame.
        let tail = &payload[payload.len() - inline_len..];
        assert!(std::ptr::eq(tail, request.inline_body), "the inline body is not the end of the payload");
        let mut event = WorkerEvent::Request {
            http_version: request.http_version,
            method: request.method.to_vec(),
            target: request.target.to_vec(),
            peer: (request.peer_addr.to_vec(), request.peer_port),
            server: (request.server_name.to_vec(), request.server_port),
            https: request.https,
            headers: request.headers.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect(),
            body_len: request.body_len,
            inline_body: None,
        };
        let body = if body_in_file {
            None
        } else if inline_len >= HAND_OVER_BODY && frame.end == self.inbox.len() {
            let buf = mem::take(&mut self.inbox);
            Some(buf[frame.end - inline_len..frame.end].to_vec())
        } else {
            Some(self.inbox[frame.end - inline_len..frame.end].to_vec())
        };
        if let WorkerEvent::Request { inline_body, .. } = &mut event {
            *inline_body = body;
        }
        self.consume_through(frame.end);
        Ok(event)
    }

    /// `take_from_slot` once the slot is copied out: one whole REQUEST frame without a
    /// descriptor, or the place of one on the channel; then `take_request` from that copy.
    fn take_from_slot(slot: &[u8]) -> Result<Option<WorkerEvent>, String> {
        let header = FrameReader::whole_frame(slot)
            .map_err(|e| format!("the lobby queued a bad frame: {e}"))?
            .filter(|(_, len)| *len == slot.len())
            .map(|(header, _)| header);
        match header {
            Some(header) if header.kind == Kind::Request && !header.has_fd() => {
                let mut copy = WorkerChannel { inbox: slot.to_vec(), ..WorkerChannel::new() };
                copy.take_request(FrameAt { header, start: 0, end: slot.len() }).map(Some)
            }
            Some(header) if header.kind == Kind::OnChannel && header.len == 0 => Ok(None),
            _ => {
                Err(format!("the lobby queued {} bytes that are not one whole REQUEST frame or ON_CHANNEL", slot.len()))
            }
        }
    }
}

/// The worker reading a lobby's stream that arrives in `pieces`, receiving one request after
/// another until the lobby breaks the protocol or the stream ends.
fn worker_reads<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Vec<WorkerEvent> {
    let mut channel = WorkerChannel::new();
    let mut events = Vec::new();
    for piece in pieces {
        loop {
            let frame = match channel.next_request(&mut events) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    events.push(WorkerEvent::Broken(e));
                    return events;
                }
            };
            match channel.take_request(frame) {
                Ok(event) => events.push(event),
                Err(e) => {
                    events.push(WorkerEvent::Broken(e));
                    return events;
                }
            }
        }
        // read_available: the room (checked here rather than made), compact, receive.
        check_room(FrameReader::WORKER, &channel.inbox[channel.inbox_start..]);
        channel.compact();
        channel.inbox.extend_from_slice(piece);
    }
    // What is buffered after the last read.
    loop {
        let frame = match channel.next_request(&mut events) {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                events.push(WorkerEvent::Broken(e));
                return events;
            }
        };
        match channel.take_request(frame) {
            Ok(event) => events.push(event),
            Err(e) => {
                events.push(WorkerEvent::Broken(e));
                return events;
            }
        }
    }
    events.push(WorkerEvent::Closed { inside_frame: channel.inbox.len() > channel.inbox_start });
    events
}

/// The fuzz target for the worker's end: two bytes choosing how the stream is cut into
/// reads, then the bytes the lobby sent. The same bytes are also taken as the contents of a
/// request slot.
pub fn worker_frames(data: &[u8]) {
    let mut input = Input::new(data);
    let seed = input.u16();
    let stream = input.data();
    let whole = worker_reads([stream]);
    assert_eq!(worker_reads(stream.chunks(1)), whole, "byte by byte vs whole");
    assert_eq!(worker_reads(pieces(stream, seed)), whole, "in reads (seed {seed}) vs whole");
    // A slot's request is accepted only as the one REQUEST the stream would have read first.
    if let Ok(Some(taken)) = WorkerChannel::take_from_slot(stream) {
        assert_eq!(whole.first(), Some(&taken), "a slot vs the same bytes on the channel");
        assert_eq!(whole.len(), 2, "a slot of more than one frame");
    }
}
