//! A request's body, whole, whatever protocol brought it: in memory up to the caller's bound,
//! past it in an unlinked temporary file (as nginx's client_body_temp), whose descriptor takes a
//! place under --max-connections. HTTP/1.1 (`http1/read.rs`) and HTTP/2 (`h2/stream.rs`) fill it; the
//! `Job` carries it to a worker (`exchange.rs`).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, IoSlice, Write};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use tokio::net::unix::pipe;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::Stop;
use crate::seating::body_files::BodyFile;

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
        file: BodyFile,
        len: u64,
        unwritten: Vec<Bytes>,
        descriptor: OwnedSemaphorePermit,
    },
    /// Streaming to its worker as it arrives (`http1/pump.rs`), `len` bytes in all: the
    /// pipe's read end goes with the job, its write end (`Streamed`) stays with the connection.
    Streaming {
        reader: BodyFile,
        len: u64,
        descriptor: OwnedSemaphorePermit,
    },
}

/// A body of known length streams to its worker, through a pipe, when its memory share
/// filled at least this fast (bytes a second: 256 KiB within 8 ms): a client that fast keeps
/// up with most applications reading it, and the body's reading and the application's overlap
/// instead of following each other. A slower one is spooled whole first, as every body was
/// (S1). A 512 MiB upload, hashed: 453 MB/s spooled, 930 MB/s streamed, and the lobby's CPU per
/// GiB from 1.3 s to 0.32 s (docs/LIMITS.md, "A fast upload streams"; loopback curl's first
/// 256 KiB came in 0.6 ms).
pub(super) const STREAM_PACE: f64 = 32e6;

/// The connection's end of a streaming body's pipe, and what it has read of the body that is
/// not in the pipe yet, in order.
pub(super) struct Streamed {
    pub(super) pipe: pipe::Sender,
    pub(super) pending: VecDeque<Bytes>,
}

impl Body {
    /// An empty body, in a file from the start when `expected` is past `memory` bytes.
    /// A body that may stream (`would_stream`) starts in memory, as a small one does.
    pub(super) fn for_length(
        expected: Option<u64>,
        memory: usize,
        may_stream: bool,
        descriptors: &Arc<Semaphore>,
    ) -> Result<Body, Stop> {
        match expected {
            Some(len) if len > memory as u64 && !may_stream => {
                let (file, descriptor) = spill_file(descriptors)?;
                Ok(Body::File { file, len: 0, unwritten: Vec::new(), descriptor })
            }
            Some(len) => Ok(Body::Memory(Vec::with_capacity(len.min(memory as u64) as usize))),
            None => Ok(Body::Memory(Vec::new())),
        }
    }

    /// Whether the body, `expected` bytes in all, streams now that `arriving` more bytes take
    /// it past its memory share, `elapsed` after it began (`STREAM_PACE`).
    pub(super) fn would_stream(
        &self,
        expected: Option<u64>,
        arriving: usize,
        memory: usize,
        elapsed: Duration,
    ) -> bool {
        let (Body::Memory(held), Some(expected)) = (self, expected) else { return false };
        let filled = held.len() + arriving;
        expected > memory as u64 && filled > memory && elapsed.as_secs_f64() * STREAM_PACE <= filled as f64
    }

    /// The body becomes a stream of `len` bytes: what memory held, then `data`, go first. Its
    /// pipe takes a place under --max-connections, as a spill file would; None (the body stays
    /// as it was) when no place is free.
    pub(super) fn stream(
        &mut self,
        data: &Bytes,
        len: u64,
        descriptors: &Arc<Semaphore>,
    ) -> Result<Option<Streamed>, Stop> {
        let Ok(descriptor) = descriptors.clone().try_acquire_owned() else { return Ok(None) };
        let Body::Memory(held) = self else { unreachable!("only a body in memory starts to stream") };
        let (reader, writer, _) = maitred_sys::pipe::body_pipe().map_err(|e| pipe_failed(&e))?;
        let pipe = pipe::Sender::from_owned_fd(writer).map_err(|e| pipe_failed(&e))?;
        let held = Bytes::from(std::mem::take(held));
        *self = Body::Streaming { reader: BodyFile::pipe_end(reader), len, descriptor };
        Ok(Some(Streamed { pipe, pending: VecDeque::from([held, data.clone()]) }))
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
            write_pieces(&mut *file, unwritten).map_err(|e| spill_failed(&e))?;
        }
        Ok(())
    }

    pub(super) fn len(&self) -> u64 {
        match self {
            Body::Memory(bytes) => bytes.len() as u64,
            Body::File { len, .. } | Body::Streaming { len, .. } => *len,
        }
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
fn spill_file(descriptors: &Arc<Semaphore>) -> Result<(BodyFile, OwnedSemaphorePermit), Stop> {
    let descriptor = descriptors.clone().try_acquire_owned().map_err(|_| {
        Stop::Refuse(
            503,
            "every descriptor under --max-connections is in use: no temporary file for this request body".into(),
        )
    })?;
    let file = BodyFile::new().map_err(|e| spill_failed(&e))?;
    Ok((file, descriptor))
}

fn pipe_failed(e: &io::Error) -> Stop {
    Stop::Refuse(500, format!("could not make the pipe to stream the request body through: {e}"))
}

fn spill_failed(e: &io::Error) -> Stop {
    Stop::Refuse(500, format!("could not buffer the request body in a temporary file: {e}"))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek};

    use bytes::Bytes;

    use super::write_pieces;

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
}
