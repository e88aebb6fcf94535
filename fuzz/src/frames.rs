//! `lobby_frames` and `worker_frames`: the frames of the worker channel (docs/PROTOCOL.md,
//! section 2), read by each end.
//!
//! Neither end's reading can be called without a socket: the lobby's is `Channel::read_frame`
//! and `decode_part` in crates/lobby/src/worker/{channel,relay}.rs (async, over a registered
//! descriptor), the
//! worker's is `WorkerChannel::next_request`, `take_from_slot` and `take_request` in
//! crates/python/src/channel/receive.rs (inside the pyo3 module, which only links into a Python
//! process). Both are thin loops around crates/wire: `FrameHeader::decode`, the payload
//! decoders and `Reader`. So the targets run the real crates/wire decoders inside a copy of
//! each loop that keeps its buffer arithmetic (what it reserves, where it slices) and drops the
//! I/O; a change to either loop must be mirrored here (docs/FUZZING.md).
//!
//! Properties: no panic; the same events whether the stream arrives whole, a byte at a time
//! or cut into reads of every size; no read reserves more than [`MOST_RESERVED`] (the copies
//! check the amount instead of allocating it, which would only slow the fuzzer); every
//! header and payload that decodes encodes back to the same bytes (the reserved header bytes
//! aside); a request's inline body is the end of its payload, where the worker slices it.

use std::mem;

use bytes::{Bytes, BytesMut};
use maitred_wire::{decode_cancel, FileRange, FrameHeader, Kind, Request, ResponseHead, WireError, HEADER_LEN};

use crate::{pieces, Input};

/// The most either loop may reserve for one frame: well above the largest frame the protocol
/// allows (a 1 MiB payload), far below what a length field taken as is could ask (4 GiB).
pub const MOST_RESERVED: usize = 16 << 20;

/// A header that decodes is the one `FrameHeader::new` makes from its fields, and encodes
/// back to its bytes, less the two reserved ones (which `decode` ignores).
fn check_header(bytes: &[u8; HEADER_LEN], header: &FrameHeader) {
    assert_eq!(FrameHeader::new(header.kind, header.flags, header.len as usize), Ok(*header), "{bytes:?}");
    let mut canonical = *bytes;
    canonical[2..4].fill(0);
    assert_eq!(header.encode(), canonical);
}

fn check_reserve(n: usize) {
    assert!(n <= MOST_RESERVED, "a frame header makes the reader reserve {n} bytes");
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

/// The lobby's end: `Channel`'s buffer and `read_frame`, in crates/lobby/src/worker/channel.rs.
struct LobbyChannel {
    buf: BytesMut,
}

impl LobbyChannel {
    /// `read_frame` up to the point where it would read the socket: the next whole frame, or
    /// None with room reserved for the rest.
    fn next_frame(&mut self) -> Result<Option<(FrameHeader, Bytes)>, WireError> {
        if self.buf.len() >= HEADER_LEN {
            let mut head = [0u8; HEADER_LEN];
            head.copy_from_slice(&self.buf[..HEADER_LEN]);
            let header = FrameHeader::decode(&head)?;
            check_header(&head, &header);
            let total = HEADER_LEN + header.len as usize;
            if self.buf.len() >= total {
                let mut frame = self.buf.split_to(total);
                let payload = frame.split_off(HEADER_LEN).freeze();
                return Ok(Some((header, payload)));
            }
            // It reserves the rest of the frame (checked here rather than allocated).
            check_reserve(total - self.buf.len());
        }
        Ok(None)
    }
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
    let mut channel = LobbyChannel { buf: BytesMut::new() };
    let mut events = Vec::new();
    for piece in pieces {
        channel.buf.extend_from_slice(piece);
        loop {
            let (header, payload) = match channel.next_frame() {
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
    events.push(LobbyEvent::Closed { inside_frame: !channel.buf.is_empty() });
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

/// `READ_SIZE` and `HAND_OVER_BODY` in channel/receive.rs.
const READ_SIZE: usize = 64 * 1024;
const HAND_OVER_BODY: usize = 16 * 1024;

/// What the worker made of the lobby's frames.
#[derive(Clone, Debug, PartialEq, Eq)]
enum WorkerEvent {
    Cancel(u32),
    Region,
    Bell,
    LobbyBell,
    Request {
        http_minor: u8,
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

    fn buffered_header(&self) -> Result<Option<FrameHeader>, String> {
        let Some(bytes) = self.inbox[self.inbox_start..].first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let header = FrameHeader::decode(bytes).map_err(|e| format!("the lobby sent a bad frame: {e}"))?;
        check_header(bytes, &header);
        Ok(Some(header))
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
    /// after the CANCEL, REGION and BELL frames before it (which it handles), or how many bytes
    /// are missing.
    fn next_request(&mut self, events: &mut Vec<WorkerEvent>) -> Result<Result<FrameAt, usize>, String> {
        loop {
            let available = self.inbox.len() - self.inbox_start;
            let mut missing = HEADER_LEN.saturating_sub(available);
            if let Some(header) = self.buffered_header()? {
                let len = HEADER_LEN + header.len as usize;
                if available >= len {
                    let frame = FrameAt { header, start: self.inbox_start, end: self.inbox_start + len };
                    match header.kind {
                        Kind::Request => return Ok(Ok(frame)),
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
                    continue;
                }
                missing = len - available;
            }
            return Ok(Err(missing));
        }
    }

    /// `take_request`, without the environ (which needs Python): the request, its inline body
    /// cut out of the inbox where channel/receive.rs cuts it.
    fn take_request(&mut self, frame: FrameAt) -> Result<WorkerEvent, String> {
        let body_in_file = frame.header.has_fd();
        let payload = &self.inbox[frame.start + HEADER_LEN..frame.end];
        let request = Request::decode_payload(payload, body_in_file)
            .map_err(|e| format!("the lobby sent a bad REQUEST frame: {e}"))?;
        if request.http_minor > 1 {
            return Err(format!("a REQUEST frame has HTTP minor version {}", request.http_minor));
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
            http_minor: request.http_minor,
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
        let header = slot
            .first_chunk::<HEADER_LEN>()
            .map(FrameHeader::decode)
            .transpose()
            .map_err(|e| format!("the lobby queued a bad frame: {e}"))?
            .filter(|header| HEADER_LEN + header.len as usize == slot.len());
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
        let missing = loop {
            let frame = match channel.next_request(&mut events) {
                Ok(Ok(frame)) => frame,
                Ok(Err(missing)) => break missing,
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
        };
        // The read: compact, reserve (checked here rather than allocated), receive.
        channel.compact();
        check_reserve(missing.max(READ_SIZE));
        channel.inbox.extend_from_slice(piece);
    }
    // What is buffered after the last read.
    loop {
        let frame = match channel.next_request(&mut events) {
            Ok(Ok(frame)) => frame,
            Ok(Err(_)) => break,
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
