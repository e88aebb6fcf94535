//! Requests: the decoder's state machine and what it hands out.

use bytes::{Buf, Bytes, BytesMut};

use crate::chunked::chunk_line;
use crate::error::{quoted, ErrorKind, RequestError, Section};
use crate::fields::{FieldLine, FieldScanner, FieldSpan};
use crate::head::{HeadScanner, ParsedHead};
use crate::{BodyLength, Limits, Version};

/// A request line and header section.
///
/// Every `Bytes` is a slice of one buffer holding the head as it arrived: nothing is copied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    /// A token, case preserved (methods are case-sensitive).
    pub method: Bytes,
    /// Visible ASCII: a path (`/...`), an absolute URI or `*` (OPTIONS only).
    pub target: Bytes,
    pub version: Version,
    /// Field names as received (case preserved), values with surrounding whitespace removed,
    /// in order, repeated names kept apart.
    pub headers: Vec<(Bytes, Bytes)>,
    pub body: BodyLength,
    /// Whether the connection may carry another request after this one: HTTP/1.1 unless
    /// `Connection: close`; HTTP/1.0 only with `Connection: keep-alive` (and no `close`).
    pub keep_alive: bool,
    /// The client waits for `100 Continue` before sending the body: an HTTP/1.1 request with
    /// `Expect: 100-continue` and a body. (HTTP/1.0 expectations are ignored, RFC 9110
    /// §10.1.1; without a body there is nothing to wait for.)
    pub expect_continue: bool,
}

/// What the decoder found in the bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A request head; body data (if any) and `End` follow.
    Head(RequestHead),
    /// Body bytes, with the chunked coding removed. Never empty.
    Data(Bytes),
    /// The request is complete. Trailer fields (chunked bodies only) are checked like header
    /// fields and handed over separately; they are never merged into the head.
    End { trailers: Vec<(Bytes, Bytes)> },
}

/// Decodes the requests of one connection, in order.
///
/// Feed it the connection's bytes in a `BytesMut`, appending as they arrive, and call
/// [`decode`](RequestDecoder::decode) until it returns `Ok(None)`. The decoder takes bytes
/// off the front of the buffer as it uses them and leaves the rest; a head stays in the
/// buffer until it is complete, so the buffer must not be touched in between.
///
/// Whether bytes arrive one at a time or all at once, the events and errors are the same
/// (body data may come in different pieces).
pub struct RequestDecoder {
    limits: Limits,
    state: State,
    /// Whether the request being decoded lets the connection carry another one.
    keep_alive: bool,
    /// Chunk data announced so far in the request being decoded, for `Limits::max_body`.
    body_received: u64,
}

enum State {
    /// Between requests. Empty lines (CRLF) here are skipped, as RFC 9112 §2.2 allows.
    Idle,
    Head(HeadScanner),
    /// A body of known length (0 for none); `End` once nothing remains.
    Body {
        remaining: u64,
    },
    /// Before a chunk-size line; `scanned` says how far it has been searched.
    ChunkSize {
        scanned: usize,
    },
    ChunkData {
        remaining: u64,
    },
    /// After chunk data, before its CRLF.
    ChunkEnd,
    Trailers {
        scanner: FieldScanner,
        fields: Vec<FieldSpan>,
    },
    /// The last request was not keep-alive: whatever follows it is never read.
    Closed,
    Failed(RequestError),
}

impl RequestDecoder {
    pub fn new(limits: Limits) -> RequestDecoder {
        RequestDecoder { limits, state: State::Idle, keep_alive: false, body_received: 0 }
    }

    /// Takes what it can from `buf` (consuming the bytes it used) and returns the next event,
    /// or `Ok(None)` if it needs more bytes. After `End` the decoder is ready for the next
    /// request on the same connection: the rest of `buf` is that request (pipelining).
    ///
    /// After the `End` of a request that is not keep-alive, the decoder returns `Ok(None)`
    /// for good and leaves `buf` alone: nothing a client sends after `Connection: close` (or
    /// after an HTTP/1.0 request) is a request.
    ///
    /// After an error the decoder returns that same error for good.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Event>, RequestError> {
        match self.step(buf) {
            Ok(event) => Ok(event),
            Err(kind) => {
                let error = RequestError::new(kind);
                self.state = State::Failed(error.clone());
                Err(error)
            }
        }
    }

    /// The peer closed the connection: `Ok` between requests (or after a complete one), an
    /// error naming what was cut short otherwise. Nothing needs to be answered either way.
    pub fn finish(&self) -> Result<(), RequestError> {
        match &self.state {
            State::Idle | State::Closed | State::Body { remaining: 0 } => Ok(()),
            State::Head(_) => Err(RequestError::new(ErrorKind::IncompleteHead)),
            State::Body { .. }
            | State::ChunkSize { .. }
            | State::ChunkData { .. }
            | State::ChunkEnd
            | State::Trailers { .. } => Err(RequestError::new(ErrorKind::IncompleteBody)),
            State::Failed(error) => Err(error.clone()),
        }
    }

    /// True when no request is in progress: not a byte of the next request has been seen
    /// (empty lines before it do not count), or the connection is done. The lobby frees the
    /// buffers of idle keep-alive connections, and closes them silently on timeout where a
    /// connection inside a request gets a 408.
    pub fn is_idle(&self) -> bool {
        matches!(self.state, State::Idle | State::Closed)
    }

    /// The bytes a body of known length, or the chunk being read of a chunked one, still has
    /// to come, once the buffer has none of them: what may be moved past the decoder (the
    /// lobby's `splice` of a streamed body) and then told with
    /// [`body_moved`](RequestDecoder::body_moved). None between chunks, between requests, or
    /// while the buffer still holds body bytes to decode.
    pub fn body_left(&self, buf: &BytesMut) -> Option<u64> {
        match self.state {
            State::Body { remaining } | State::ChunkData { remaining } if remaining > 0 && buf.is_empty() => {
                Some(remaining)
            }
            _ => None,
        }
    }

    /// `n` bytes of the body, at most [`body_left`](RequestDecoder::body_left), went past the
    /// decoder; once none is left, the next `decode` says `End` (or, of a chunk, reads the
    /// chunk's end and the next chunk's size).
    pub fn body_moved(&mut self, n: u64) {
        if let State::Body { remaining } | State::ChunkData { remaining } = &mut self.state {
            debug_assert!(n <= *remaining, "{n} bytes moved past a body with {remaining} left");
            *remaining -= n.min(*remaining);
        }
        if let State::ChunkData { remaining: 0 } = self.state {
            self.state = State::ChunkEnd;
        }
    }

    fn step(&mut self, buf: &mut BytesMut) -> Result<Option<Event>, ErrorKind> {
        loop {
            match &mut self.state {
                State::Idle => {
                    while buf.starts_with(b"\r\n") {
                        buf.advance(2);
                    }
                    match buf.first() {
                        None => return Ok(None),
                        Some(b'\n') => return Err(ErrorKind::BareLf),
                        Some(b'\r') => match buf.get(1) {
                            None => return Ok(None),
                            Some(_) => return Err(ErrorKind::BareCr),
                        },
                        Some(_) => self.state = State::Head(HeadScanner::new()),
                    }
                }
                State::Head(scanner) => {
                    let Some(parsed) = scanner.advance(buf, &self.limits)? else {
                        return Ok(None);
                    };
                    let head = self.start_request(parsed, buf);
                    return Ok(Some(Event::Head(head)));
                }
                State::Body { remaining: 0 } => return Ok(Some(self.end_request(Vec::new()))),
                State::Body { remaining } | State::ChunkData { remaining } => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = usize::try_from(*remaining).map_or(buf.len(), |remaining| remaining.min(buf.len()));
                    *remaining -= n as u64;
                    if let State::ChunkData { remaining: 0 } = self.state {
                        self.state = State::ChunkEnd;
                    }
                    return Ok(Some(Event::Data(buf.split_to(n).freeze())));
                }
                State::ChunkSize { scanned } => {
                    let Some((size, line_len)) = chunk_line(buf, scanned)? else {
                        return Ok(None);
                    };
                    buf.advance(line_len);
                    self.state = if size == 0 {
                        State::Trailers {
                            scanner: FieldScanner::new(Section::Trailers, 0, 0, &self.limits),
                            fields: Vec::new(),
                        }
                    } else {
                        self.count_body(size)?;
                        State::ChunkData { remaining: size }
                    };
                }
                State::ChunkEnd => {
                    match (buf.first(), buf.get(1)) {
                        (None, _) | (Some(b'\r'), None) => return Ok(None),
                        (Some(b'\r'), Some(b'\n')) => buf.advance(2),
                        _ => return Err(ErrorKind::MissingChunkTerminator),
                    }
                    self.state = State::ChunkSize { scanned: 0 };
                }
                State::Trailers { scanner, fields } => match scanner.next_line(buf)? {
                    None => return Ok(None),
                    Some(FieldLine::Field(span)) => {
                        check_trailer(&buf[span.name.clone()])?;
                        fields.push(span);
                    }
                    Some(FieldLine::End { end }) => {
                        let section = buf.split_to(end).freeze();
                        let trailers = fields.iter().map(|span| field(&section, span)).collect();
                        return Ok(Some(self.end_request(trailers)));
                    }
                },
                State::Closed => return Ok(None),
                State::Failed(error) => return Err(error.kind().clone()),
            }
        }
    }

    /// Takes the complete head off the buffer and sets up for its body. The head is copied out
    /// rather than split off, so that it holds only its own bytes: a request is kept for as long
    /// as its answer lasts, a stream's for hours, and a head split off the connection's read
    /// buffer would keep the whole buffer (4 KiB at least) alive that long.
    fn start_request(&mut self, parsed: ParsedHead, buf: &mut BytesMut) -> RequestHead {
        let head = Bytes::copy_from_slice(&buf[..parsed.len]);
        buf.advance(parsed.len);
        self.keep_alive = parsed.keep_alive;
        self.body_received = 0;
        self.state = match parsed.body {
            BodyLength::Empty => State::Body { remaining: 0 },
            BodyLength::Length(n) => State::Body { remaining: n },
            BodyLength::Chunked => State::ChunkSize { scanned: 0 },
        };
        RequestHead {
            method: head.slice(parsed.method),
            target: head.slice(parsed.target),
            version: parsed.version,
            headers: parsed.fields.iter().map(|span| field(&head, span)).collect(),
            body: parsed.body,
            keep_alive: parsed.keep_alive,
            expect_continue: parsed.expect_continue,
        }
    }

    /// Counts a chunk against `Limits::max_body` as soon as its size is known.
    fn count_body(&mut self, chunk: u64) -> Result<(), ErrorKind> {
        self.body_received = self.body_received.saturating_add(chunk);
        match self.limits.max_body {
            Some(limit) if self.body_received > limit => Err(ErrorKind::BodyTooLarge { limit }),
            _ => Ok(()),
        }
    }

    fn end_request(&mut self, trailers: Vec<(Bytes, Bytes)>) -> Event {
        self.state = if self.keep_alive { State::Idle } else { State::Closed };
        Event::End { trailers }
    }
}

fn field(section: &Bytes, span: &FieldSpan) -> (Bytes, Bytes) {
    (section.slice(span.name.clone()), section.slice(span.value.clone()))
}

/// Fields that control framing, routing or the connection are refused in trailers: they
/// must be acted on before the body (RFC 9110 §6.5.1), and a hop that merges trailers into
/// the head would act on them late.
fn check_trailer(name: &[u8]) -> Result<(), ErrorKind> {
    const FORBIDDEN: [&[u8]; 10] = [
        b"content-length",
        b"transfer-encoding",
        b"trailer",
        b"host",
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"upgrade",
        b"expect",
    ];
    if FORBIDDEN.iter().any(|forbidden| name.eq_ignore_ascii_case(forbidden)) {
        return Err(ErrorKind::ForbiddenTrailer { name: quoted(name) });
    }
    Ok(())
}
