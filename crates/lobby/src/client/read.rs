//! Reading a request completely: the PROXY header a connection may begin with, the head
//! within `--header-timeout` and `--max-head-memory`, then the body to its end, in memory or,
//! past `BODY_MEMORY_LIMIT`, in a temporary file (S1: only whole requests reach the queue).

use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use maitred_protocol::{decode_proxy_header, BodyLength, Event, ProxyHeader, RequestHead};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::sleep_until;

use super::peer::{ClientStream, ProxyStage};
use super::proxies::{self, Origin};
use super::{Connection, Stop};

/// Bodies up to this size travel inline in the `REQUEST` frame; larger ones are spilled to an
/// unlinked temporary file whose descriptor the worker reads. (An HTTP/2 stream's limit is
/// lower, `h2/stream.rs`: one connection carries many bodies at once.)
const BODY_MEMORY_LIMIT: usize = 256 * 1024;

/// Reads take at least this much free room; most request heads fit in one.
pub(super) const READ_CHUNK: usize = 4 * 1024;

/// The most a body read takes at once. A body's reads start at `READ_CHUNK` and double each time
/// one fills its room, so a fast upload is read (and spilled) in pieces of this size while a
/// slow one, whose reads never fill 4 KiB, holds no more than a head does. At 4 KiB a 512 MiB
/// upload took 131,588 reads and as many writes to its file, and the lobby 0.86 s of CPU.
const BODY_READ_MOST: usize = 256 * 1024;

/// A complete request body.
pub(super) enum Body {
    Memory(Vec<u8>),
    /// Spilled to an unlinked temporary file, whose descriptor takes a place under
    /// --max-connections as a connection does, until the answer is written. `unwritten` holds
    /// the pieces one read brought, as the decoder cut them from the read buffer, until `flush`
    /// writes them with one writev(2): a chunked body's chunks, each a decoder event, are one
    /// call (curl's 64 KiB chunks: four to a 256 KiB read), and no byte is copied on the way.
    /// (Gathered into one Vec first, each byte was copied once more in the lobby: 512 MiB more
    /// memcpy an upload of that size.)
    File {
        file: File,
        len: u64,
        unwritten: Vec<Bytes>,
        descriptor: OwnedSemaphorePermit,
    },
}

impl Body {
    /// An empty body, in a file from the start when `expected` is past `memory` bytes.
    pub(super) fn for_length(expected: Option<u64>, memory: usize, descriptors: &Arc<Semaphore>) -> Result<Body, Stop> {
        match expected {
            Some(len) if len > memory as u64 => {
                let (file, descriptor) = spill_file(descriptors)?;
                Ok(Body::File { file, len: 0, unwritten: Vec::new(), descriptor })
            }
            Some(len) => Ok(Body::Memory(Vec::with_capacity(len as usize))),
            None => Ok(Body::Memory(Vec::new())),
        }
    }

    /// Appends `data`, moving the body to a file once it passes `memory` bytes; pieces for the
    /// file wait for `flush`.
    pub(super) fn push(&mut self, data: Bytes, memory: usize, descriptors: &Arc<Semaphore>) -> Result<(), Stop> {
        if let Body::Memory(bytes) = self {
            if bytes.len() + data.len() <= memory {
                bytes.extend_from_slice(&data);
                return Ok(());
            }
            let (file, descriptor) = spill_file(descriptors)?;
            let held = Bytes::from(std::mem::take(bytes));
            *self = Body::File { file, len: held.len() as u64, unwritten: vec![held], descriptor };
        }
        if let Body::File { len, unwritten, .. } = self {
            *len += data.len() as u64;
            unwritten.push(data);
        }
        Ok(())
    }

    /// Writes what `push` left for the file: before the next read waits, and at the body's end.
    pub(super) fn flush(&mut self) -> Result<(), Stop> {
        if let Body::File { file, unwritten, .. } = self {
            write_pieces(file, unwritten).map_err(|e| spill_failed(&e))?;
        }
        Ok(())
    }

    pub(super) fn len(&self) -> u64 {
        match self {
            Body::Memory(bytes) => bytes.len() as u64,
            Body::File { len, .. } => *len,
        }
    }
}

impl<S: ClientStream> Connection<S> {
    /// Reads one whole request: its head, then its body to the end. The client it comes from
    /// is settled with its head, so that a contradiction is refused before the body is read.
    pub(super) async fn next_request(&mut self) -> Result<(RequestHead, Origin, Body), Stop> {
        if self.peer.proxy == ProxyStage::Awaited {
            self.read_proxy_header().await?;
        }
        let head = self.read_head().await?;
        let origin = proxies::origin(self.peer.addr, &head.headers, &self.lobby.settings().forwarding)
            .map_err(|e| Stop::Refuse(400, e.to_string()))?;
        if head.expect_continue && !matches!(head.body, BodyLength::Empty) {
            self.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.map_err(|_| Stop::Quietly)?;
        }
        let expected = match head.body {
            BodyLength::Length(n) => Some(n),
            BodyLength::Empty => Some(0),
            BodyLength::Chunked => None,
        };
        let descriptors = self.permit.semaphore().clone();
        let mut body = Body::for_length(expected, BODY_MEMORY_LIMIT, &descriptors)?;
        let started = Instant::now();
        let mut gap_started = started;
        let config = self.lobby.settings();
        let mut room = READ_CHUNK;
        loop {
            match self.decoder.decode(&mut self.buf)? {
                Some(Event::Data(data)) => body.push(data, BODY_MEMORY_LIMIT, &descriptors)?,
                Some(Event::End { .. }) => {
                    body.flush()?;
                    // Read whole: the read buffer goes while the request is answered (a stream
                    // may last hours), unless it holds the client's next request. The wait for
                    // that next request takes a buffer of its own anyway (`task.rs`).
                    if self.buf.is_empty() {
                        self.buf = BytesMut::new();
                    }
                    return Ok((head, origin, body));
                }
                Some(Event::Head(_)) => unreachable!("the decoder yields End before the next Head"),
                None => {
                    body.flush()?;
                    let gap_deadline = gap_started + config.header_timeout;
                    // Each byte received earns 1/--body-min-rate s more, after a first
                    // --header-timeout: a body trickled slower than that ends however steady it is.
                    let rate_deadline = (config.body_min_rate > 0).then(|| {
                        started
                            + config.header_timeout
                            + std::time::Duration::from_secs_f64(body.len() as f64 / config.body_min_rate as f64)
                    });
                    let deadline = rate_deadline.map_or(gap_deadline, |rate| rate.min(gap_deadline));
                    tokio::select! {
                        read = self.read_body(room) => match read {
                            Ok(0) | Err(_) => return Err(Stop::Quietly),
                            Ok(n) => {
                                gap_started = Instant::now();
                                room = next_body_room(room, n);
                            }
                        },
                        _ = sleep_until(deadline.into()) => {
                            let reason = if rate_deadline.is_some_and(|rate| rate < gap_deadline) {
                                format!(
                                    "the request body arrived slower than --body-min-rate ({} bytes/s): {} bytes in {:.0} s",
                                    config.body_min_rate,
                                    body.len(),
                                    started.elapsed().as_secs_f64()
                                )
                            } else {
                                "the request body stalled for longer than --header-timeout".into()
                            };
                            return Err(Stop::Refuse(408, reason));
                        }
                    }
                }
            }
        }
    }

    /// Reads the PROXY header the connection must begin with, from a peer in
    /// `--proxy-allow-from` (any Unix-socket peer, as under gunicorn), within
    /// `--header-timeout`; the client it names becomes the peer.
    pub(super) async fn read_proxy_header(&mut self) -> Result<(), Stop> {
        let settings = self.lobby.settings();
        let Some(versions) = settings.proxy_protocol else {
            // A reload turned it off after this connection was accepted.
            self.peer.proxy = ProxyStage::Off;
            return Ok(());
        };
        if let Some(addr) = self.peer.addr.filter(|addr| !settings.proxy_allow_ips.allows(addr.ip())) {
            return Err(Stop::Refuse(
                400,
                format!(
                    "{} is not in --proxy-allow-from, and this server takes only PROXY protocol connections",
                    addr.ip()
                ),
            ));
        }
        let deadline = Instant::now() + settings.header_timeout;
        loop {
            match decode_proxy_header(&self.buf, versions).map_err(|e| Stop::Refuse(400, e.to_string()))? {
                Some((header, len)) => {
                    let _ = self.buf.split_to(len);
                    if let ProxyHeader::Proxied { client, .. } = header {
                        self.peer.addr = Some(client);
                    }
                    self.peer.proxy = ProxyStage::Read;
                    return Ok(());
                }
                None => tokio::select! {
                    read = self.read_more() => match read {
                        Ok(0) | Err(_) => return Err(Stop::Quietly),
                        Ok(_) => {}
                    },
                    _ = sleep_until(deadline.into()) => {
                        return Err(Stop::Refuse(400, "the PROXY protocol header did not arrive within --header-timeout".into()));
                    }
                },
            }
        }
    }

    /// Reads up to a request head, which must arrive within `--header-timeout`.
    /// Its buffer counts against --max-head-memory meanwhile (`heads.rs`).
    async fn read_head(&mut self) -> Result<RequestHead, Stop> {
        let started = Instant::now();
        let mut ticket = None;
        loop {
            match self.decoder.decode(&mut self.buf)? {
                Some(Event::Head(head)) => {
                    self.request_started = started;
                    return Ok(head);
                }
                Some(_) => unreachable!("the decoder yields a Head first"),
                None => {}
            }
            // Most heads arrive whole in their first read and never need a ticket.
            let ticket = ticket.get_or_insert_with(|| self.lobby.heads.ticket());
            self.make_room();
            ticket.hold(self.buf.capacity());
            let deadline = started + self.lobby.settings().header_timeout;
            tokio::select! {
                read = self.read_more() => match read {
                    Ok(0) | Err(_) => return Err(Stop::Quietly),
                    Ok(_) => {}
                },
                _ = sleep_until(deadline.into()) => {
                    return Err(Stop::Refuse(408, "the request head did not arrive within --header-timeout".into()));
                }
                _ = ticket.evicted() => {
                    return Err(Stop::Refuse(
                        408,
                        "the memory for incomplete request heads (--max-head-memory) is full; the oldest are refused first"
                            .into(),
                    ));
                }
            }
        }
    }

    pub(super) async fn read_more(&mut self) -> io::Result<usize> {
        self.make_room();
        self.stream.read_buf(&mut self.buf).await
    }

    /// Reads body bytes into at most `room` bytes of free space (the decoder has taken what the
    /// buffer held before, so the buffer's allocation is reused once that has been written).
    async fn read_body(&mut self, room: usize) -> io::Result<usize> {
        if self.buf.capacity() - self.buf.len() < room {
            self.buf.reserve(room);
        }
        let free = self.buf.capacity() - self.buf.len();
        let mut limited = (&mut self.buf).limit(room.min(free).max(1));
        self.stream.read_buf(&mut limited).await
    }

    /// Makes room in the buffer for the next read: it grows geometrically for a large head or
    /// body.
    fn make_room(&mut self) {
        if self.buf.capacity() - self.buf.len() < READ_CHUNK / 2 {
            self.buf.reserve(READ_CHUNK.max(self.buf.len()));
        }
    }
}

/// The room for a body's next read after one of `read` bytes into `room`: twice as much once a
/// read fills it, up to `BODY_READ_MOST`; back to half when a read takes less than half, so a
/// client that slows down gives the memory back.
fn next_body_room(room: usize, read: usize) -> usize {
    if read >= room {
        (room * 2).min(BODY_READ_MOST)
    } else if read < room / 2 {
        (room / 2).max(READ_CHUNK)
    } else {
        room
    }
}

/// Writes `pieces` to `file` whole, in as few writev(2) calls as the file takes, and empties it.
fn write_pieces(file: &mut File, pieces: &mut Vec<Bytes>) -> io::Result<()> {
    let mut first = 0;
    loop {
        // Past the pieces written whole (or empty from the start).
        while first < pieces.len() && pieces[first].is_empty() {
            first += 1;
        }
        if first == pieces.len() {
            break;
        }
        let slices: Vec<IoSlice<'_>> = pieces[first..].iter().map(|piece| IoSlice::new(piece)).collect();
        let mut written = match file.write_vectored(&slices) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while written > 0 {
            let piece = &mut pieces[first];
            let taken = written.min(piece.len());
            piece.advance(taken);
            written -= taken;
            if piece.is_empty() {
                first += 1;
            }
        }
    }
    pieces.clear();
    Ok(())
}

/// A temporary file for a request body, and its place under --max-connections.
fn spill_file(descriptors: &Arc<Semaphore>) -> Result<(File, OwnedSemaphorePermit), Stop> {
    let descriptor = descriptors.clone().try_acquire_owned().map_err(|_| {
        Stop::Refuse(
            503,
            "every descriptor under --max-connections is in use: no temporary file for this request body".into(),
        )
    })?;
    let file = tempfile::tempfile().map_err(|e| spill_failed(&e))?;
    Ok((file, descriptor))
}

fn spill_failed(e: &io::Error) -> Stop {
    Stop::Refuse(500, format!("could not buffer the request body in a temporary file: {e}"))
}

/// One read attempt that does not wait: Pending when nothing is there, and then the stream
/// is registered to wake `cx` when there is.
pub(super) fn read_now<S: AsyncRead + Unpin>(
    stream: &mut S,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<io::Result<usize>> {
    tokio_util::io::poll_read_buf(std::pin::Pin::new(stream), cx, buf)
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek};

    use bytes::Bytes;

    use super::{next_body_room, write_pieces, BODY_READ_MOST, READ_CHUNK};

    #[test]
    fn pieces_reach_the_file_whole_and_in_order_past_one_writev_s_most() {
        // 3,000 pieces, past IOV_MAX (1,024): writev takes them in several calls. Empty ones
        // among them (none ends the write early), and pieces of every size from 0 to 999.
        let pieces: Vec<Bytes> =
            (0..3000u32).map(|i| Bytes::from(vec![(i % 251) as u8; (i as usize * 7) % 1000])).collect();
        let expected: Vec<u8> = pieces.iter().flat_map(|piece| piece.iter().copied()).collect();
        let mut file = tempfile::tempfile().expect("a temporary file");
        let mut unwritten = pieces.clone();
        write_pieces(&mut file, &mut unwritten).expect("written");
        assert!(unwritten.is_empty());
        let mut written = Vec::new();
        file.rewind().expect("rewound");
        file.read_to_end(&mut written).expect("read back");
        assert_eq!(written, expected);
        // Nothing to write is no call that fails.
        write_pieces(&mut file, &mut vec![Bytes::new()]).expect("nothing written");
    }

    #[test]
    fn a_fast_body_reads_in_ever_larger_pieces_up_to_the_most() {
        let mut room = READ_CHUNK;
        let mut rooms = vec![room];
        while room < BODY_READ_MOST {
            room = next_body_room(room, room);
            rooms.push(room);
        }
        assert_eq!(rooms, [4, 8, 16, 32, 64, 128, 256].map(|kib| kib * 1024));
        assert_eq!(next_body_room(BODY_READ_MOST, BODY_READ_MOST), BODY_READ_MOST);
    }

    #[test]
    fn a_body_that_slows_gives_its_room_back_and_a_slow_one_never_grows() {
        assert_eq!(next_body_room(BODY_READ_MOST, 1460), BODY_READ_MOST / 2);
        assert_eq!(next_body_room(READ_CHUNK, 1460), READ_CHUNK);
        // Half full or more: the room is about right.
        assert_eq!(next_body_room(64 * 1024, 40 * 1024), 64 * 1024);
    }
}
