//! permessage-deflate (RFC 7692) for a WebSocket's connection: the offer taken from the
//! handshake, the client's compressed messages inflated before tungstenite reads them, and the
//! worker's messages compressed as they are written.
//!
//! No compression state lives in a connection: the lobby answers every offer with
//! `server_no_context_takeover` and `client_no_context_takeover`, so that each message is
//! compressed and inflated whole, on its own, by one compressor and one decompressor of the
//! lobby's thread for all. An open WebSocket costs the same memory with compression as without;
//! what a compressed message holds while it is inflated is bounded by `--ws-max-size`
//! (docs/LIMITS.md).
//!
//! tungstenite 0.30 has no extensions, and fails a frame with RSV1 set. `Inflating` sits under
//! it: it passes every frame through as it came, but gathers the frames of a compressed message
//! and hands tungstenite one plain frame with the inflated message instead, so that tungstenite
//! still checks everything else (masking, opcodes, control frames, UTF-8, the closing
//! handshake).

use std::cell::RefCell;
use std::io::{self, Cursor};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use maitred_protocol::RequestHead;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::{Frame, FrameHeader};

/// What a compressed message's payload ends with once its sender has removed it (RFC 7692,
/// 7.2.1): the empty stored block of a sync flush.
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// How many bytes the lobby reads from the client at least, and at most, at a time while it
/// looks for frames.
const READ_CHUNK: usize = 16 * 1024;
const READ_MAX: usize = 256 * 1024;

/// A buffer larger than this is let go once it is empty, rather than kept for the next message:
/// an idle WebSocket holds no memory of its largest message.
const KEPT_CAPACITY: usize = 64 * 1024;

/// The permessage-deflate the lobby agreed to: the client may compress its messages, and the
/// lobby compresses its own with a window of at most `window_bits`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Deflate {
    /// The client's `server_max_window_bits`; None: it asked for none (15).
    pub window_bits: Option<u8>,
}

impl Deflate {
    /// The first permessage-deflate offer of `Sec-WebSocket-Extensions` that the lobby can
    /// take (RFC 7692, 5 and 7.1); an offer with a parameter it does not know, twice the same,
    /// or a bad value is declined, as the RFC asks, and the next one is looked at.
    pub fn negotiate(head: &RequestHead) -> Option<Deflate> {
        let values = head.headers.iter().filter(|(name, _)| name.eq_ignore_ascii_case(b"sec-websocket-extensions"));
        values.flat_map(|(_, value)| value.split(|&b| b == b',')).find_map(offer)
    }

    /// The `Sec-WebSocket-Extensions` field of the 101 that accepts it.
    pub fn response_field(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(
            b"Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover; client_no_context_takeover",
        );
        if let Some(bits) = self.window_bits {
            out.extend_from_slice(format!("; server_max_window_bits={bits}").as_bytes());
        }
        out.extend_from_slice(b"\r\n");
    }

    /// A message of the worker's, compressed as one frame with RSV1 set (RFC 7692, 6.1).
    pub fn compressed_frame(&self, text: bool, data: &[u8]) -> Frame {
        let payload = compress(data, self.window_bits.unwrap_or(15));
        let opcode = OpCode::Data(if text { Data::Text } else { Data::Binary });
        let mut frame = Frame::message(payload, opcode, true);
        frame.header_mut().rsv1 = true;
        frame
    }
}

/// One offer (`permessage-deflate; param; param=value`), if the lobby takes it.
fn offer(text: &[u8]) -> Option<Deflate> {
    let mut parts = text.split(|&b| b == b';').map(<[u8]>::trim_ascii);
    if !parts.next()?.eq_ignore_ascii_case(b"permessage-deflate") {
        return None;
    }
    let mut seen: Vec<&[u8]> = Vec::new();
    let mut window_bits = None;
    for param in parts {
        let (name, value) = match param.iter().position(|&b| b == b'=') {
            Some(at) => (param[..at].trim_ascii(), Some(unquoted(param[at + 1..].trim_ascii()))),
            None => (param, None),
        };
        if seen.contains(&name) {
            return None;
        }
        seen.push(name);
        match (name, value) {
            // The lobby takes no context over, whether asked to or not.
            (b"server_no_context_takeover" | b"client_no_context_takeover", None) => {}
            // zlib cannot compress with a window of 8 bits (256 bytes): such an offer is declined.
            (b"server_max_window_bits", Some(value)) => window_bits = Some(bits(value).filter(|&b| b >= 9)?),
            // The lobby inflates with the largest window, which reads any smaller one.
            (b"client_max_window_bits", None) => {}
            (b"client_max_window_bits", Some(value)) => _ = bits(value)?,
            _ => return None,
        }
    }
    Some(Deflate { window_bits })
}

fn unquoted(value: &[u8]) -> &[u8] {
    value.strip_prefix(b"\"").and_then(|v| v.strip_suffix(b"\"")).unwrap_or(value)
}

/// A window size's bits: 8 to 15, in decimal without a leading zero (RFC 7692, 7.1.2).
fn bits(value: &[u8]) -> Option<u8> {
    match value {
        [d] if (b'8'..=b'9').contains(d) => Some(d - b'0'),
        [b'1', d] if (b'0'..=b'5').contains(d) => Some(10 + d - b'0'),
        _ => None,
    }
}

thread_local! {
    /// The lobby's compressors, one per window size in use, each reset after every message.
    static COMPRESSORS: RefCell<Vec<(u8, Compress)>> = const { RefCell::new(Vec::new()) };
    /// The lobby's decompressor, reset after every message.
    static DECOMPRESSOR: RefCell<Option<Decompress>> = const { RefCell::new(None) };
}

/// `data` compressed on its own, the tail taken off (RFC 7692, 7.2.1). The fastest level: the
/// lobby's one thread compresses for every connection.
fn compress(data: &[u8], window_bits: u8) -> Vec<u8> {
    COMPRESSORS.with_borrow_mut(|compressors| {
        let at = match compressors.iter().position(|(bits, _)| *bits == window_bits) {
            Some(at) => at,
            None => {
                compressors
                    .push((window_bits, Compress::new_with_window_bits(Compression::fast(), false, window_bits)));
                compressors.len() - 1
            }
        };
        let compressor = &mut compressors[at].1;
        compressor.reset();
        let mut out = Vec::with_capacity(data.len() / 2 + 64);
        loop {
            let consumed = compressor.total_in() as usize;
            let status = compressor
                .compress_vec(&data[consumed..], &mut out, FlushCompress::Sync)
                .expect("deflate takes any input");
            // A sync flush is done once every byte is in and the output has room left over.
            if compressor.total_in() as usize == data.len() && out.len() < out.capacity() {
                break;
            }
            debug_assert!(matches!(status, Status::Ok | Status::BufError));
            out.reserve(out.capacity().max(64));
        }
        if out.ends_with(&TAIL) {
            out.truncate(out.len() - TAIL.len());
        }
        out
    })
}

/// Why a compressed message fails its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// It inflates, or its compressed frames add up, past `--ws-max-size` (1009).
    TooBig,
    /// Its frames or its data break RFC 7692 or RFC 6455 (1002).
    Broken(&'static str),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::TooBig => f.write_str("a compressed message inflates past the largest message"),
            Refused::Broken(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for Refused {}

impl Refused {
    /// The refusal an I/O error from `Inflating` carries, if it is one.
    pub fn of(error: &io::Error) -> Option<Refused> {
        error.get_ref()?.downcast_ref::<Refused>().copied()
    }
}

/// The room left before an inflated message for a frame header (RFC 6455, 5.2: 14 bytes at most).
const HEADER_ROOM: usize = 14;

/// `compressed` inflated, `TAIL` appended, into at most `max_size` bytes, after `room` zeros.
fn inflate(compressed: &[u8], room: usize, max_size: usize) -> Result<Vec<u8>, Refused> {
    let max_size = max_size + room;
    DECOMPRESSOR.with_borrow_mut(|decompressor| {
        let decompressor = decompressor.get_or_insert_with(|| Decompress::new(false));
        decompressor.reset(false);
        let mut out = Vec::with_capacity((room + compressed.len() * 2).min(max_size + 1));
        out.resize(room, 0);
        for input in [compressed, &TAIL[..]] {
            let start = decompressor.total_in();
            loop {
                let consumed = (decompressor.total_in() - start) as usize;
                let status = decompressor
                    .decompress_vec(&input[consumed..], &mut out, FlushDecompress::Sync)
                    .map_err(|_| Refused::Broken("a compressed message is not valid deflate data"))?;
                if out.len() > max_size {
                    return Err(Refused::TooBig);
                }
                let done = (decompressor.total_in() - start) as usize == input.len();
                if status == Status::StreamEnd || (done && out.len() < out.capacity()) {
                    break;
                }
                // Room for more, one byte past the largest message at most: a deflate bomb
                // costs no more than an honest message.
                out.reserve((out.capacity().max(1024)).min(max_size + 1 - out.len()));
            }
        }
        Ok(out)
    })
}

/// The client's side of a WebSocket's stream, under tungstenite: with permessage-deflate, each
/// compressed message reaches tungstenite inflated, as one plain frame; without, bytes go
/// straight through, and a read that fills tungstenite's small buffer is followed by larger
/// ones (`Ahead`).
pub(super) struct Inflating<S> {
    stream: S,
    frames: Option<Box<Frames>>,
    ahead: Ahead,
}

/// How many bytes a read takes at most once tungstenite's buffer has been filled: a large
/// message is read this much at a time, and copied to tungstenite's buffer from here.
const AHEAD_READ: usize = 64 * 1024;

/// Reads for tungstenite without permessage-deflate. tungstenite reads into a buffer it keeps
/// for the WebSocket's life, at most its size at a time, however long the frame it reads
/// (`read_buffer_size`): 4 KiB of it was a quarter of an open WebSocket's memory at 5,000 of
/// them, and a smaller one would read a large message in as many small reads. So tungstenite's
/// buffer is small, a read goes straight into it while messages fit, and once one fills it
/// (more is likely waiting) the next reads take up to `AHEAD_READ` into a buffer of their own,
/// let go once tungstenite has taken everything.
#[derive(Default)]
struct Ahead {
    /// Read, not yet given to tungstenite.
    read: BytesMut,
    /// The last read filled the buffer it was given.
    filled: bool,
}

impl Ahead {
    fn poll_read<S: AsyncRead + Unpin>(
        &mut self,
        stream: &mut S,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.read.is_empty() && !self.filled {
            let room = buf.remaining();
            let before = buf.filled().len();
            ready!(Pin::new(stream).poll_read(cx, buf))?;
            self.filled = room > 0 && buf.filled().len() - before == room;
            return Poll::Ready(Ok(()));
        }
        if self.read.is_empty() {
            self.read.reserve(AHEAD_READ);
            match tokio_util::io::poll_read_buf(Pin::new(stream), cx, &mut self.read) {
                Poll::Ready(read) => self.filled = read? == AHEAD_READ,
                // Nothing more waits: the buffer goes, and the next read is straight again.
                Poll::Pending => {
                    *self = Ahead::default();
                    return Poll::Pending;
                }
            }
        }
        let take = self.read.len().min(buf.remaining());
        buf.put_slice(&self.read.split_to(take));
        if self.read.is_empty() {
            self.read = BytesMut::new();
        }
        Poll::Ready(Ok(()))
    }
}

impl<S> Inflating<S> {
    /// `early`: what the client sent right after its handshake. Without permessage-deflate it
    /// goes to tungstenite itself, and is given back.
    pub fn new(stream: S, deflate: Option<Deflate>, early: Vec<u8>, max_size: usize) -> (Inflating<S>, Vec<u8>) {
        match deflate {
            None => (Inflating { stream, frames: None, ahead: Ahead::default() }, early),
            Some(_) => {
                let frames = Frames { raw: BytesMut::from(&early[..]), max_size, ..Frames::default() };
                (Inflating { stream, frames: Some(Box::new(frames)), ahead: Ahead::default() }, Vec::new())
            }
        }
    }
}

/// The frames of a connection with permessage-deflate, on their way to tungstenite.
#[derive(Default)]
struct Frames {
    /// Read from the client, not yet looked at.
    raw: BytesMut,
    /// For tungstenite.
    out: BytesMut,
    /// Bytes of the frame being passed through still to come.
    passing: u64,
    /// The compressed message being gathered: its opcode and its payload so far.
    gathering: Option<(OpCode, Vec<u8>)>,
    /// A frame header tungstenite will refuse came: everything goes through from then on.
    straight: bool,
    max_size: usize,
}

impl Frames {
    /// Moves what `raw` holds, frame by frame, to `out`; Ok(false) when a frame needs more.
    fn step(&mut self) -> Result<bool, Refused> {
        if self.straight || self.passing > 0 {
            let take = if self.straight { self.raw.len() } else { self.raw.len().min(self.passing as usize) };
            self.out.extend_from_slice(&self.raw.split_to(take));
            self.passing -= if self.straight { 0 } else { take as u64 };
            return Ok(take > 0);
        }
        let mut cursor = Cursor::new(&self.raw[..]);
        let (header, length) = match FrameHeader::parse(&mut cursor) {
            Ok(Some(parsed)) => parsed,
            Ok(None) => return Ok(false),
            Err(_) => {
                self.straight = true;
                return Ok(true);
            }
        };
        let header_len = cursor.position() as usize;
        let data = matches!(header.opcode, OpCode::Data(Data::Text | Data::Binary));
        let continues = header.opcode == OpCode::Data(Data::Continue);
        let compressed = (header.rsv1 && data && self.gathering.is_none()) || (continues && self.gathering.is_some());
        if !compressed {
            if data && self.gathering.is_some() {
                return Err(Refused::Broken("a new message came before a compressed one ended"));
            }
            // tungstenite judges it, RSV1 and all.
            self.out.extend_from_slice(&self.raw.split_to(header_len));
            self.passing = length;
            return Ok(true);
        }
        if header.rsv1 && continues {
            return Err(Refused::Broken("RSV1 is set on a continuation frame"));
        }
        let Some(mask) = header.mask else { return Err(Refused::Broken("an unmasked frame from the client")) };
        let gathered = self.gathering.as_ref().map_or(0, |(_, payload)| payload.len());
        if length > (self.max_size - gathered.min(self.max_size)) as u64 {
            return Err(Refused::TooBig);
        }
        if self.raw.len() < header_len + length as usize {
            self.raw.reserve(header_len + length as usize - self.raw.len());
            return Ok(false);
        }
        self.raw.advance(header_len);
        let mut payload = self.raw.split_to(length as usize);
        unmask(&mut payload, mask);
        if !header.is_final {
            let (_, gathered) = self.gathering.get_or_insert_with(|| (header.opcode, Vec::new()));
            gathered.extend_from_slice(&payload);
        } else {
            // A message in one frame, the most common, is inflated where it lies.
            let (opcode, compressed) = match self.gathering.take() {
                Some((opcode, mut gathered)) => {
                    gathered.extend_from_slice(&payload);
                    (opcode, gathered)
                }
                None => (header.opcode, Vec::new()),
            };
            let compressed = if compressed.is_empty() { &payload[..] } else { &compressed[..] };
            // Inflated behind room for the plain frame's header, which goes right before it:
            // the message is not copied again.
            let mut message = inflate(compressed, HEADER_ROOM, self.max_size)?;
            let length = (message.len() - HEADER_ROOM) as u64;
            // Masked with a zero key, which leaves the payload as it is: tungstenite requires a
            // client's frames to be masked.
            let plain = FrameHeader { opcode, mask: Some([0; 4]), ..FrameHeader::default() };
            let start = HEADER_ROOM - plain.len(length);
            plain.format(length, &mut &mut message[start..HEADER_ROOM]).expect("the header has its room");
            let mut frame = BytesMut::from(Bytes::from(message));
            frame.advance(start);
            if self.out.is_empty() {
                self.out = frame;
            } else {
                self.out.extend_from_slice(&frame);
            }
        }
        Ok(true)
    }

    /// Gives tungstenite what `out` holds, up to `buf`'s room.
    fn give(&mut self, buf: &mut ReadBuf<'_>) {
        let take = self.out.len().min(buf.remaining());
        buf.put_slice(&self.out.split_to(take));
        if self.out.is_empty() && self.out.capacity() > KEPT_CAPACITY {
            self.out = BytesMut::new();
        }
        if self.raw.is_empty() && self.raw.capacity() > KEPT_CAPACITY {
            self.raw = BytesMut::new();
        }
    }
}

/// Takes a client's mask off a payload (RFC 6455, 5.3), four bytes at a time.
fn unmask(payload: &mut [u8], mask: [u8; 4]) {
    let key = u32::from_ne_bytes(mask);
    let mut words = payload.chunks_exact_mut(4);
    for word in &mut words {
        let unmasked = u32::from_ne_bytes([word[0], word[1], word[2], word[3]]) ^ key;
        word.copy_from_slice(&unmasked.to_ne_bytes());
    }
    for (byte, key) in words.into_remainder().iter_mut().zip(mask) {
        *byte ^= key;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Inflating<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(frames) = this.frames.as_deref_mut() else { return this.ahead.poll_read(&mut this.stream, cx, buf) };
        loop {
            if !frames.out.is_empty() {
                frames.give(buf);
                return Poll::Ready(Ok(()));
            }
            if frames.step().map_err(io::Error::other)? {
                continue;
            }
            // Read into the room `raw` has (a frame being gathered reserved its length), within
            // READ_MAX, so that what is zeroed first stays small.
            let start = frames.raw.len();
            frames.raw.reserve(READ_CHUNK);
            let room = (frames.raw.capacity() - start).min(READ_MAX);
            frames.raw.resize(start + room, 0);
            let mut chunk = ReadBuf::new(&mut frames.raw[start..]);
            let polled = Pin::new(&mut this.stream).poll_read(cx, &mut chunk);
            let read = chunk.filled().len();
            frames.raw.truncate(start + read);
            ready!(polled)?;
            if read == 0 {
                // The end: tungstenite hears it as the client's.
                return Poll::Ready(Ok(()));
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Inflating<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, bytes: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, bytes)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offers_are_taken_or_declined_as_rfc_7692_says() {
        let take = |text: &str| offer(text.as_bytes());
        assert_eq!(take("permessage-deflate"), Some(Deflate { window_bits: None }));
        assert_eq!(
            take("permessage-deflate; client_no_context_takeover; client_max_window_bits"),
            Some(Deflate { window_bits: None })
        );
        assert_eq!(take("permessage-deflate; server_max_window_bits=10"), Some(Deflate { window_bits: Some(10) }));
        assert_eq!(take("permessage-deflate; server_max_window_bits=\"9\""), Some(Deflate { window_bits: Some(9) }));
        for declined in [
            "x-webkit-deflate-frame",
            "permessage-deflate; server_max_window_bits=8",
            "permessage-deflate; server_max_window_bits=16",
            "permessage-deflate; server_max_window_bits=010",
            "permessage-deflate; server_max_window_bits",
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover",
            "permessage-deflate; client_max_window_bits=7",
            "permessage-deflate; something_else",
        ] {
            assert_eq!(take(declined), None, "{declined}");
        }
    }

    #[test]
    fn a_compressed_message_inflates_back_and_a_bomb_is_too_big() {
        let message = b"Hello, hello, hello, hello, hello!".repeat(100);
        for bits in [9, 12, 15] {
            let compressed = compress(&message, bits);
            assert!(compressed.len() < message.len() / 10);
            assert_eq!(inflate(&compressed, 0, message.len()).as_deref(), Ok(&message[..]));
        }
        assert_eq!(inflate(&compress(&message, 15), 0, message.len() - 1), Err(Refused::TooBig));
        assert_eq!(inflate(&compress(b"", 15), 3, 0).as_deref(), Ok(&[0, 0, 0][..]));
        assert!(matches!(inflate(b"\xff\xff\xff", 0, 100), Err(Refused::Broken(_))));
    }

    fn client_frame(first: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [1, 2, 3, 4];
        let mut out = vec![first, 0x80 | payload.len() as u8];
        out.extend_from_slice(&mask);
        out.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, k)| b ^ k));
        out
    }

    fn run(frames: &mut Frames, input: &[u8]) -> Result<Vec<u8>, Refused> {
        frames.raw.extend_from_slice(input);
        while frames.step()? {}
        Ok(frames.out.split().to_vec())
    }

    #[test]
    fn compressed_fragments_become_one_plain_frame_and_others_pass_as_they_came() {
        let message = b"fragmented and compressed, fragmented and compressed".to_vec();
        let compressed = compress(&message, 15);
        let (one, two) = compressed.split_at(compressed.len() / 2);
        let ping = client_frame(0x89, b"ping");
        let mut input = client_frame(0x41, one); // text, RSV1, not final
        input.extend_from_slice(&ping);
        input.extend_from_slice(&client_frame(0x80, two)); // continuation, final
        let plain = client_frame(0x82, b"plain");
        input.extend_from_slice(&plain);
        let mut expected = ping.clone();
        FrameHeader { opcode: OpCode::Data(Data::Text), mask: Some([0; 4]), ..FrameHeader::default() }
            .format(message.len() as u64, &mut expected)
            .unwrap();
        expected.extend_from_slice(&message);
        expected.extend_from_slice(&plain);
        // Whole, and a byte at a time.
        let mut frames = Frames { max_size: 1000, ..Frames::default() };
        assert_eq!(run(&mut frames, &input), Ok(expected.clone()));
        let mut frames = Frames { max_size: 1000, ..Frames::default() };
        let mut out = Vec::new();
        for byte in &input {
            out.extend(run(&mut frames, &[*byte]).unwrap());
        }
        assert_eq!(out, expected);
    }

    #[test]
    fn a_compressed_message_that_breaks_the_rules_is_refused() {
        let compressed = compress(b"abc", 15);
        let refused = |input: Vec<u8>, max_size: usize| run(&mut Frames { max_size, ..Frames::default() }, &input);
        let mut new_message_inside = client_frame(0x41, &compressed);
        new_message_inside.extend_from_slice(&client_frame(0x81, b"x"));
        assert!(matches!(refused(new_message_inside, 100), Err(Refused::Broken(_))));
        let mut rsv1_on_continuation = client_frame(0x41, &compressed);
        rsv1_on_continuation.extend_from_slice(&client_frame(0xc0, &compressed));
        assert!(matches!(refused(rsv1_on_continuation, 100), Err(Refused::Broken(_))));
        let mut unmasked = vec![0xc1, compressed.len() as u8];
        unmasked.extend_from_slice(&compressed);
        assert!(matches!(refused(unmasked, 100), Err(Refused::Broken(_))));
        assert_eq!(refused(client_frame(0xc1, &compress(&[b'a'; 500], 15)), 499), Err(Refused::TooBig));
    }
}

#[cfg(test)]
mod ahead_tests {
    use super::*;

    /// A client's bytes, served as far as each read's room goes; Pending once all are read.
    struct Client {
        bytes: Vec<u8>,
        at: usize,
        reads: usize,
    }

    impl AsyncRead for Client {
        fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            if self.at == self.bytes.len() {
                return Poll::Pending;
            }
            let take = buf.remaining().min(self.bytes.len() - self.at);
            buf.put_slice(&self.bytes[self.at..self.at + take]);
            self.at += take;
            self.reads += 1;
            Poll::Ready(Ok(()))
        }
    }

    /// Reads everything `client` has, in reads of tungstenite's buffer's size, until Pending.
    fn read_all(ahead: &mut Ahead, client: &mut Client) -> Vec<u8> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut got = Vec::new();
        loop {
            let mut room = [0u8; 512];
            let mut buf = ReadBuf::new(&mut room);
            match ahead.poll_read(client, &mut cx, &mut buf) {
                Poll::Ready(result) => {
                    result.unwrap();
                    got.extend_from_slice(buf.filled());
                }
                Poll::Pending => return got,
            }
        }
    }

    #[test]
    fn small_messages_are_read_straight_and_a_large_one_in_large_reads() {
        let mut ahead = Ahead::default();
        let mut small = Client { bytes: vec![7; 38], at: 0, reads: 0 };
        assert_eq!(read_all(&mut ahead, &mut small), small.bytes);
        assert_eq!(small.reads, 1);
        let large: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let mut client = Client { bytes: large.clone(), at: 0, reads: 0 };
        assert_eq!(read_all(&mut ahead, &mut client), large, "every byte, in order");
        // One read of 512 bytes fills tungstenite's buffer; the rest come 64 KiB at a time.
        assert_eq!(client.reads, 1 + (large.len() - 512).div_ceil(AHEAD_READ), "reads of the large message");
        assert_eq!(ahead.read.capacity(), 0, "an idle WebSocket holds no buffer of its own");
        assert!(!ahead.filled, "the next read goes straight to tungstenite's buffer");
    }
}
