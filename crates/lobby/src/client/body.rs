//! A request's body, whole, whatever protocol brought it: in memory up to the caller's bound,
//! past it in an unlinked temporary file (as nginx's client_body_temp), whose descriptor takes a
//! place under --max-connections. HTTP/1.1 (`http1/read.rs`) and HTTP/2 (`h2/stream.rs`) fill it; the
//! `Job` carries it to a worker (`exchange.rs`).

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::unix::pipe;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

use super::Stop;
use crate::seating::body_files::{self, BodyFile};

/// A complete request body.
pub(super) enum Body {
    Memory(Vec<u8>),
    /// Spilled to an unlinked temporary file, whose descriptor takes a place under
    /// --max-connections as a connection does, until the answer is written. `unwritten` holds
    /// the pieces one read brought, as the decoder cut them from the read buffer, until `flush`
    /// hands them to the spooler thread, which writes them with one writev(2): a chunked body's
    /// chunks, each a decoder event, are one call (curl's 64 KiB chunks: four to a 256 KiB
    /// read), and no byte is copied on the way. (Gathered into one Vec first, each byte was
    /// copied once more in the lobby: 512 MiB more memcpy an upload of that size.) `writing`
    /// is the outcome of the pieces the spooler has: one read's at a time, so a body holds at
    /// most two reads' bytes in memory. `spooled` is the spooler's duplicate of the file's
    /// descriptor, made at the first flush (None: not made yet, or it could not be, and the
    /// pieces are written here).
    File {
        file: BodyFile,
        len: u64,
        unwritten: Vec<Bytes>,
        spooled: Option<Arc<File>>,
        writing: Option<oneshot::Receiver<io::Result<()>>>,
        descriptor: OwnedSemaphorePermit,
    },
    /// Streaming to its worker as it arrives (`http1/pump.rs`), `len` bytes in all (None: a
    /// chunked body, which its pipe carries in records, maitred_wire's `BodyRecords`): the
    /// pipe's read end goes with the job, its write end (`Streamed`) stays with the connection.
    Streaming {
        reader: BodyFile,
        len: Option<u64>,
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

/// The most an HTTP/1.1 body read takes at once (`http1/read.rs`), and the most bytes of a
/// spooled body handed to the spooler thread at once from HTTP/2's frames. A body's reads start
/// at `READ_CHUNK` and double each time one fills its room, so a fast upload is read (and
/// spilled) in pieces of this size while a slow one, whose reads never fill 4 KiB, holds no
/// more than a head does. At 4 KiB a 512 MiB
/// upload took 131,588 reads and as many writes to its file, and the lobby 0.86 s of CPU.
pub(super) const BODY_READ_MOST: usize = 256 * 1024;

/// The connection's end of a streaming body's pipe, and what it has read of the body that is
/// not in the pipe yet, in order; `records`: the body is chunked, and goes in records.
pub(super) struct Streamed {
    pub(super) pipe: pipe::Sender,
    pub(super) pending: VecDeque<Bytes>,
    pub(super) records: bool,
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
                Ok(Body::File { file, len: 0, unwritten: Vec::new(), spooled: None, writing: None, descriptor })
            }
            Some(len) => Ok(Body::Memory(Vec::with_capacity(len.min(memory as u64) as usize))),
            None => Ok(Body::Memory(Vec::new())),
        }
    }

    /// Whether the body, `expected` bytes in all (None: chunked, which streams only when
    /// `chunked_streams`), streams now that `arriving` more bytes take it past its memory share,
    /// `elapsed` after it began (`STREAM_PACE`).
    pub(super) fn would_stream(
        &self,
        expected: Option<u64>,
        chunked_streams: bool,
        arriving: usize,
        memory: usize,
        elapsed: Duration,
    ) -> bool {
        let Body::Memory(held) = self else { return false };
        let filled = held.len() + arriving;
        expected.map_or(chunked_streams, |expected| expected > memory as u64)
            && filled > memory
            && elapsed.as_secs_f64() * STREAM_PACE <= filled as f64
    }

    /// The body becomes a stream of `len` bytes (None: chunked, in records): what memory held,
    /// then `data`, go first. Its pipe takes a place under --max-connections, as a spill file
    /// would; None (the body stays as it was) when no place is free.
    pub(super) fn stream(
        &mut self,
        data: &Bytes,
        len: Option<u64>,
        descriptors: &Arc<Semaphore>,
    ) -> Result<Option<Streamed>, Stop> {
        let Ok(descriptor) = descriptors.clone().try_acquire_owned() else { return Ok(None) };
        let Body::Memory(held) = self else { unreachable!("only a body in memory starts to stream") };
        let (reader, writer, _) = maitred_sys::pipe::body_pipe().map_err(|e| pipe_failed(&e))?;
        let pipe = pipe::Sender::from_owned_fd(writer).map_err(|e| pipe_failed(&e))?;
        let held = Bytes::from(std::mem::take(held));
        *self = Body::Streaming { reader: BodyFile::pipe_end(reader), len, descriptor };
        Ok(Some(Streamed { pipe, pending: VecDeque::from([held, data.clone()]), records: len.is_none() }))
    }

    /// Whether the body streams in records: chunked, its length unknown (`FLAG_RECORDS`).
    pub(super) fn in_records(&self) -> bool {
        matches!(self, Body::Streaming { len: None, .. })
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
            *self = Body::File {
                file,
                len: held.len() as u64,
                unwritten: vec![held],
                spooled: None,
                writing: None,
                descriptor,
            };
        }
        if let Body::File { len, unwritten, .. } = self {
            *len += data.len() as u64;
            unwritten.push(data);
        }
        Ok(())
    }

    /// Hands what `push` left for the file to the spooler thread, once the spooler has written
    /// what it had: before the next read waits, which then runs while the spooler writes.
    pub(super) async fn flush(&mut self) -> Result<(), Stop> {
        if let Body::File { file, unwritten, spooled, writing, .. } = self {
            if let Some(previous) = writing.take() {
                written(previous).await?;
            }
            if unwritten.is_empty() {
                return Ok(());
            }
            // No duplicate to be had (at the descriptor limit): written here, as before.
            if spooled.is_none() {
                *spooled = file.try_clone().ok().map(Arc::new);
            }
            let mut pieces = std::mem::take(unwritten);
            if let Some(spooled) = spooled {
                match body_files::write_later(spooled, pieces) {
                    Ok(outcome) => {
                        *writing = Some(outcome);
                        return Ok(());
                    }
                    Err(unsent) => pieces = unsent,
                }
            }
            body_files::write_pieces(file, &mut pieces).map_err(|e| spill_failed(&e))?;
        }
        Ok(())
    }

    /// `flush`, once what `push` left is at least `BODY_READ_MOST` bytes: HTTP/2's DATA frames
    /// (16 KiB each, most often) go to the spooler in batches the size of an HTTP/1.1 read's.
    pub(super) async fn flush_batch(&mut self) -> Result<(), Stop> {
        if let Body::File { unwritten, .. } = self {
            if unwritten.iter().map(Bytes::len).sum::<usize>() < BODY_READ_MOST {
                return Ok(());
            }
        }
        self.flush().await
    }

    /// Waits until everything `push` took is in the file: at the body's end.
    pub(super) async fn finish(&mut self) -> Result<(), Stop> {
        self.flush().await?;
        if let Body::File { spooled, writing, .. } = self {
            if let Some(last) = writing.take() {
                written(last).await?;
            }
            // A duplicate's close frees nothing: the body's own descriptor holds the file.
            *spooled = None;
        }
        Ok(())
    }

    pub(super) fn len(&self) -> u64 {
        match self {
            Body::Memory(bytes) => bytes.len() as u64,
            Body::File { len, .. } | Body::Streaming { len: Some(len), .. } => *len,
            // Not known until it ends: the worker reads its records to their end.
            Body::Streaming { len: None, .. } => 0,
        }
    }
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

/// The spooler's outcome for pieces it was given.
async fn written(outcome: oneshot::Receiver<io::Result<()>>) -> Result<(), Stop> {
    match outcome.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(spill_failed(&e)),
        Err(_) => Err(spill_failed(&io::Error::other("the spooler thread stopped"))),
    }
}

fn pipe_failed(e: &io::Error) -> Stop {
    Stop::Refuse(500, format!("could not make the pipe to stream the request body through: {e}"))
}

fn spill_failed(e: &io::Error) -> Stop {
    Stop::Refuse(500, format!("could not buffer the request body in a temporary file: {e}"))
}
