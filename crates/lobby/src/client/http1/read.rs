//! Reading a request completely: the PROXY header a connection may begin with, the head
//! within `--header-timeout` and `--max-head-memory`, then the body to its end, in memory or,
//! past `BODY_MEMORY_LIMIT`, in a temporary file (S1: only whole requests reach the queue).

use std::io;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{BufMut, BytesMut};
use maitred_protocol::{choose_protocol, decode_proxy_header, BodyLength, Event, Opening, ProxyHeader, RequestHead};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::sleep_until;

use super::Connection;
use crate::client::body::{Body, Streamed, BODY_READ_MOST};
use crate::client::exchange::BodyPace;
use crate::client::peer::{ClientStream, ProxyStage};
use crate::client::proxies::{self, Origin};
use crate::client::Stop;
use crate::log::debug;

/// Bodies up to this size travel inline in the `REQUEST` frame; larger ones are spilled to an
/// unlinked temporary file whose descriptor the worker reads. (An HTTP/2 stream's limit is
/// lower, `h2/stream.rs`: one connection carries many bodies at once.)
const BODY_MEMORY_LIMIT: usize = 256 * 1024;

/// Reads take at least this much free room; most request heads fit in one.
pub(super) const READ_CHUNK: usize = 4 * 1024;

/// A request whose body streams to its worker (`pump.rs`): its pipe, its pace, and the bytes
/// received so far.
pub(super) struct Pumping {
    pub(super) streamed: Streamed,
    pub(super) pace: BodyPace,
    pub(super) received: u64,
    /// The socket's `SO_RCVLOWAT` as the pump set it (0: not set; the kernel's is 1).
    pub(super) low_water: u32,
}

impl<S: ClientStream> Connection<S> {
    /// Reads one whole request: its head, then its body to the end; or, for a fast upload, its
    /// head and what pumps the rest of its body to its worker (boxed: the connection's future
    /// holds the result while it waits between requests, and M1 measured 80 bytes more a held
    /// connection for it inline). The client it comes from
    /// is settled with its head, so that a contradiction is refused before the body is read.
    pub(super) async fn next_request(&mut self) -> Result<(RequestHead, Origin, Body, Option<Box<Pumping>>), Stop> {
        if self.peer.proxy == ProxyStage::Awaited {
            self.read_proxy_header().await?;
        }
        let head = self.read_head().await?;
        let origin = proxies::origin(self.peer.addr, &head.headers, &self.context.settings().forwarding)
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
        let mut body = Body::for_length(expected, BODY_MEMORY_LIMIT, expected.is_some(), &descriptors)?;
        let config = self.context.settings();
        let mut pace = BodyPace::new(config.header_timeout, config.body_min_rate);
        let mut room = READ_CHUNK;
        // A chunked body streams to an ASGI application, which reads it to its end record, and
        // to a WSGI one unless `--wsgi-chunked-body whole` promised it the CONTENT_LENGTH that
        // only a whole body has (docs/PROXIES.md); a WebSocket handshake's body is refused whole.
        let chunked_streams =
            (config.wsgi_chunked_streams || self.context.websockets.asgi()) && !super::websocket::asks_websocket(&head);
        loop {
            match self.decoder.decode(&mut self.buf)? {
                Some(Event::Data(data)) => {
                    if body.would_stream(expected, chunked_streams, data.len(), BODY_MEMORY_LIMIT, pace.elapsed())
                        && self.context.seating.seats_soon()
                    {
                        let received = body.len() + data.len() as u64;
                        if let Some(streamed) = body.stream(&data, expected, &descriptors)? {
                            let of = expected.map_or_else(|| "a chunked body's".into(), |len| format!("{len}"));
                            debug!(
                                "{} {}: its body streams to its worker ({received} of {of} bytes came in {:.1} ms)",
                                String::from_utf8_lossy(&head.method),
                                String::from_utf8_lossy(&head.target),
                                pace.elapsed().as_secs_f64() * 1000.0
                            );
                            return Ok((
                                head,
                                origin,
                                body,
                                Some(Box::new(Pumping { streamed, pace, received, low_water: 0 })),
                            ));
                        }
                    }
                    body.push(data, BODY_MEMORY_LIMIT, &descriptors)?;
                }
                Some(Event::End { .. }) => {
                    body.finish().await?;
                    // Read whole: the read buffer goes while the request is answered (a stream
                    // may last hours), unless it holds the client's next request. The wait for
                    // that next request takes a buffer of its own anyway (`task.rs`).
                    if self.buf.is_empty() {
                        self.buf = BytesMut::new();
                    }
                    return Ok((head, origin, body, None));
                }
                Some(Event::Head(_)) => unreachable!("the decoder yields End before the next Head"),
                None => {
                    body.flush().await?;
                    tokio::select! {
                        read = self.read_body(room) => match read {
                            Ok(0) | Err(_) => return Err(Stop::Quietly),
                            Ok(n) => {
                                pace.arrived();
                                room = next_body_room(room, n);
                            }
                        },
                        _ = sleep_until(pace.deadline(body.len()).into()) => {
                            return Err(Stop::Refuse(408, pace.missed(body.len())));
                        }
                    }
                }
            }
        }
    }

    /// What a plain connection speaks, from the bytes already read (crates/protocol's
    /// opening.rs). None when more must be read first (`read_opening`): its PROXY header is
    /// due, or its first bytes could still be either protocol's.
    pub(super) fn protocol_chosen(&self) -> Option<Result<Opening, Stop>> {
        if self.peer.proxy == ProxyStage::Awaited {
            return None;
        }
        self.chosen().map(http1_refused)
    }

    fn chosen(&self) -> Option<Opening> {
        let protocols = &self.context.protocols;
        choose_protocol(&self.buf, protocols.http1, protocols.http2)
    }

    /// `protocol_chosen`, once the PROXY header and enough bytes have been read, within
    /// `--header-timeout`.
    pub(super) async fn read_opening(&mut self) -> Result<Opening, Stop> {
        if self.peer.proxy == ProxyStage::Awaited {
            self.read_proxy_header().await?;
        }
        let deadline = tokio::time::Instant::now() + self.context.settings().header_timeout;
        loop {
            if let Some(opening) = self.chosen() {
                return http1_refused(opening);
            }
            match tokio::time::timeout_at(deadline, self.read_more()).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return Err(Stop::Quietly),
            }
        }
    }

    /// Reads the PROXY header the connection must begin with, from a peer in
    /// `--proxy-allow-from` (any Unix-socket peer, as under gunicorn), within
    /// `--header-timeout`; the client it names becomes the peer.
    pub(super) async fn read_proxy_header(&mut self) -> Result<(), Stop> {
        let settings = self.context.settings();
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
            let ticket = ticket.get_or_insert_with(|| self.context.heads.ticket());
            self.make_room();
            ticket.hold(self.buf.capacity());
            let deadline = started + self.context.settings().header_timeout;
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
    pub(super) async fn read_body(&mut self, room: usize) -> io::Result<usize> {
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
pub(super) fn next_body_room(room: usize, read: usize) -> usize {
    if read >= room {
        (room * 2).min(BODY_READ_MOST)
    } else if read < room / 2 {
        (room / 2).max(READ_CHUNK)
    } else {
        room
    }
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

/// Where `--http-protocols` leaves HTTP/1.x out, an HTTP/1.x request is refused in HTTP/1.1
/// (505, which its client understands).
fn http1_refused(opening: Opening) -> Result<Opening, Stop> {
    match opening {
        Opening::Http1NotSpoken => Err(Stop::Refuse(
            505,
            "this server speaks HTTP/2 only (--http-protocols h2): open with the HTTP/2 preface \
             (curl --http2-prior-knowledge)"
                .into(),
        )),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::{next_body_room, READ_CHUNK};
    use crate::client::body::BODY_READ_MOST;

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
