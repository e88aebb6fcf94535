//! A fast upload's body on its way to the worker that already has its request: from the
//! client, through a pipe whose read end the worker reads (`client/body.rs` decides which
//! bodies stream). On a plain connection, with no body bytes waiting in the read buffer, the
//! bytes go by `splice(2)`: the socket's pages move into the pipe, never copied through the
//! lobby. Over TLS they are read, decrypted, and written to the pipe. A chunked body goes in
//! records (maitred_wire's `BodyRecords`): what a read brought is one, and the rest of a large
//! chunk another, its header written first and its bytes spliced.
//!
//! The body keeps its pace (`exchange::BodyPace`) while the pipe has room: a client that stalls
//! gets its 408, and the worker's read the end of a body cut short. While the pipe is full the
//! worker sets the pace, and no deadline runs. Bytes that came but are under the socket's
//! low-water mark (`LOW_WATER`) are looked for at the deadline, and count as the client's.

use std::future::poll_fn;
use std::io::{self, IoSlice};

use bytes::{Buf, Bytes, BytesMut};
use maitred_protocol::Event;
use maitred_sys::pipe::BODY_PIPE_SIZE;
use maitred_wire::{record_header, END_RECORD, RECORD_HEADER_LEN};
use tokio::io::{AsyncWriteExt, Interest};
use tokio::time::sleep_until;

use super::read::{next_body_room, Pumping, READ_CHUNK};
use super::Connection;
use crate::client::body::Streamed;
use crate::client::peer::ClientStream;
use crate::client::Stop;

/// How much of a body of known length must have come before its socket wakes the lobby to
/// splice it (`SO_RCVLOWAT`; less for the body's last bytes). Woken at each arrival, the lobby
/// spliced 19 KB at the mean (a 512 MiB upload: 21,534 splices, 1,027 of them finding nothing,
/// 1,185 waits in epoll, under strace); with this mark, 33 KB (9,926, 96 and 296): the pipe's
/// room, not the client's pace, sets the size. Not for a chunked body, whose rest is unknown.
const LOW_WATER: u64 = 256 * 1024;

/// The least of a chunk's rest that is spliced into its pipe rather than read: past it, a
/// splice and a record header cost less than copying the bytes in and out of the lobby. A
/// client's small chunks are read whole, many to a read, as before.
const CHUNK_SPLICE_LEAST: u64 = 16 * 1024;

impl<S: ClientStream> Connection<S> {
    /// Moves the rest of a streaming body into its pipe, to its end; the read buffer is left
    /// holding whatever the client sent after it (a pipelined request).
    pub(super) async fn pump_body(&mut self, pumping: &mut Pumping) -> Result<(), Stop> {
        let mut room = READ_CHUNK;
        loop {
            match self.decoder.decode(&mut self.buf)? {
                Some(Event::Data(data)) => {
                    pumping.received += data.len() as u64;
                    pumping.streamed.pending.push_back(data);
                    continue;
                }
                Some(Event::End { .. }) => {
                    // The next request's head wakes the lobby at its first byte, as any does.
                    self.set_low_water(pumping, 1);
                    let end = pumping.streamed.records.then_some(END_RECORD);
                    write_pending(&mut pumping.streamed, end).await.map_err(|_| worker_left())?;
                    if self.buf.is_empty() {
                        self.buf = BytesMut::new();
                    }
                    return Ok(());
                }
                Some(Event::Head(_)) => unreachable!("the decoder yields End before the next Head"),
                None => {}
            }
            let records = pumping.streamed.records;
            // What the socket has of the body goes by splice, a pipe's worth at most; a chunk's
            // rest only when it is worth a call of its own (smaller ones are read).
            let splice = self
                .decoder
                .body_left(&self.buf)
                .filter(|&left| !S::ENCRYPTED && (!records || left >= CHUNK_SPLICE_LEAST))
                .map(|left| left.min(BODY_PIPE_SIZE as u64));
            // A chunk's spliced rest is one record, whose header goes before its bytes, with
            // what was read before it.
            let header = splice.filter(|_| records).map(|len| record_header(len as u32));
            if write_pending(&mut pumping.streamed, header).await.map_err(|_| worker_left())? {
                // Waiting for the worker to make room is no gap of the client's.
                pumping.pace.arrived();
            }
            match splice {
                Some(mut todo) => {
                    while todo > 0 {
                        let moved = self.splice_body(pumping, todo).await?;
                        self.decoder.body_moved(moved);
                        pumping.received += moved;
                        todo -= moved;
                    }
                    // A read after a chunk takes its end and the next one's size, and as little
                    // of its bytes as may be, so that they are spliced too.
                    room = READ_CHUNK;
                }
                None => {
                    tokio::select! {
                        read = self.read_body(room) => match read {
                            Ok(0) | Err(_) => return Err(Stop::Quietly),
                            Ok(n) => {
                                pumping.pace.arrived();
                                room = next_body_room(room, n);
                            }
                        },
                        _ = sleep_until(pumping.pace.deadline(pumping.received).into()) => {
                            return Err(Stop::Refuse(408, pumping.pace.missed(pumping.received)));
                        }
                    }
                }
            }
        }
    }

    /// Splices what the socket has of the body's `left` bytes into the pipe, once both are
    /// ready: the pipe's room is awaited without a deadline, the client's bytes within the
    /// body's pace. Returns how many moved (never 0: a client that closed is `Quietly`).
    async fn splice_body(&mut self, pumping: &mut Pumping, left: u64) -> Result<u64, Stop> {
        if !pumping.streamed.records {
            self.set_low_water(pumping, left.min(LOW_WATER) as u32);
        }
        let pipe = &pumping.streamed.pipe;
        loop {
            pipe.writable().await.map_err(|_| worker_left())?;
            let late = tokio::select! {
                ready = poll_fn(|cx| self.stream.poll_read_ready(cx)) => {
                    ready.map_err(|_| Stop::Quietly)?;
                    false
                }
                _ = sleep_until(pumping.pace.deadline(pumping.received).into()) => true,
            };
            let most = usize::try_from(left).unwrap_or(usize::MAX).min(maitred_sys::pipe::BODY_PIPE_SIZE);
            let socket = self.stream.as_fd();
            let pipe_fd = std::os::fd::AsFd::as_fd(pipe);
            match maitred_sys::pipe::splice_into_pipe(socket, pipe_fd, most) {
                Ok(0) => return Err(Stop::Quietly),
                Ok(moved) => {
                    pumping.pace.arrived();
                    return Ok(moved as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && late => {
                    return Err(Stop::Refuse(408, pumping.pace.missed(pumping.received)));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Either side may have been the one not ready: the one that is not is
                    // told so, and waited for again.
                    let (readable, room) =
                        maitred_sys::pipe::splice_blocked_on(socket, pipe_fd).map_err(|_| Stop::Quietly)?;
                    if !readable {
                        let _ =
                            self.stream.try_io(Interest::READABLE, || Err::<(), _>(io::ErrorKind::WouldBlock.into()));
                    }
                    if !room {
                        let _ = pipe.try_io(|| Err::<(), _>(io::ErrorKind::WouldBlock.into()));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Err(worker_left()),
                Err(_) => return Err(Stop::Quietly),
            }
        }
    }

    /// Sets the socket's low-water mark to `bytes` if it is not that already (0 in `Pumping`:
    /// never set, the kernel's 1). A socket that refuses it keeps waking at each arrival.
    fn set_low_water(&mut self, pumping: &mut Pumping, bytes: u32) {
        if pumping.low_water.max(1) != bytes {
            let _ = maitred_sys::socket::set_receive_low_water(self.stream.as_fd(), bytes);
            pumping.low_water = bytes;
        }
    }
}

/// Writes what the connection has read of the body into its pipe, as bare bytes or, for a
/// chunked body, as one record, then `then` (a chunked body's next record header, or its end):
/// one `writev(2)`, most often. True when there was something to write.
async fn write_pending(streamed: &mut Streamed, then: Option<[u8; RECORD_HEADER_LEN]>) -> io::Result<bool> {
    let pending = &mut streamed.pending;
    pending.retain(|piece| !piece.is_empty());
    if streamed.records && !pending.is_empty() {
        // A read's pieces, with what memory held at the start: at most 512 KiB.
        let len = u32::try_from(pending.iter().map(Bytes::len).sum::<usize>()).expect("a record under 4 GiB");
        pending.push_front(Bytes::copy_from_slice(&record_header(len)));
    }
    pending.extend(then.map(|header| Bytes::copy_from_slice(&header)));
    if pending.is_empty() {
        return Ok(false);
    }
    while !pending.is_empty() {
        let slices: Vec<IoSlice<'_>> = pending.iter().map(|piece| IoSlice::new(piece)).collect();
        let mut written = streamed.pipe.write_vectored(&slices).await?;
        if written == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while let Some(piece) = pending.front_mut() {
            if piece.len() > written {
                piece.advance(written);
                break;
            }
            written -= piece.len();
            pending.pop_front();
        }
    }
    Ok(true)
}

/// The worker closed its end of the pipe: its request ended before its body did (it answered
/// early, or it was lost). The connection ends; the answer, if any, was already taken.
fn worker_left() -> Stop {
    Stop::Quietly
}
