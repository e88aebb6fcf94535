//! `wsgi.input`: the request body, from the frame's bytes, from the file the lobby passed, or
//! from the pipe it streams through while its client sends it (the lobby's
//! `client/http1/pump.rs`): bare when its length is known, in records (maitred_wire's
//! `BodyRecords`) when it is not: an ASGI worker's `receive()` takes what has come, a WSGI
//! application's reads wait for what they asked for.
//!
//! Imports `sys` of this crate, for `pread`, and the crate's `ClientDisconnected`.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use maitred_wire::BodyRecords;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

use crate::ClientDisconnected;
use pyo3::types::{PyBytes, PyList};

/// How much of a body file one refill reads ahead for `readline`.
const READ_AHEAD: usize = 64 * 1024;

/// The largest read of a body in records that goes straight into its bytes object: the
/// bytes object is made before its length is known, so a larger read (or a read of all) is
/// gathered first, rather than made whole at a size the body may never reach.
const RECORDS_READ_AT_ONCE: usize = 1024 * 1024;

/// The request body as PEP 3333's input stream: `read`, `readline`, `readlines`, iteration.
/// Every method returns `b""` once the body is exhausted.
///
/// Bytes are served from `buf[pos..end]` first, then from the body file (if any) at
/// `file_pos`; `readline` refills `buf` from the file. The channel releases the body when the
/// next request arrives, so a reference the application kept cannot pin a spilled file.
#[pyclass(module = "maitred._native")]
pub struct RequestBody {
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    file: Option<OwnedFd>,
    /// The file is a pipe: read in order, and may end short when its client goes.
    pipe: bool,
    /// The pipe's reads no longer wait (an ASGI worker's `read_ready` made it so).
    nonblocking: bool,
    file_pos: u64,
    file_len: u64,
    /// A pipe of records: a chunked body, whose length is known only at its end record.
    records: Option<BodyRecords>,
    released: bool,
}

impl RequestBody {
    /// A body that travelled in the frame: `buf[start..end]`. Taking the whole buffer lets the
    /// channel hand over its receive buffer instead of copying a large body.
    pub fn inline(buf: Vec<u8>, start: usize, end: usize) -> RequestBody {
        RequestBody {
            buf,
            pos: start,
            end,
            file: None,
            pipe: false,
            nonblocking: false,
            file_pos: 0,
            file_len: 0,
            records: None,
            released: false,
        }
    }

    /// A chunked body streaming in records through `pipe`: read by `read_ready` (an ASGI
    /// worker) or by the reads that wait (a WSGI one), whose length is known only at its end.
    pub fn in_records(pipe: OwnedFd) -> RequestBody {
        RequestBody { records: Some(BodyRecords::default()), ..RequestBody::in_file(pipe, 0) }
    }

    /// A body of `len` bytes in `file`, read with `pread` from offset 0; or, when `file` is a
    /// pipe, read from it as the lobby streams the body in.
    pub fn in_file(file: OwnedFd, len: u64) -> RequestBody {
        let pipe = maitred_sys::pipe::is_pipe(file.as_fd());
        RequestBody {
            buf: Vec::new(),
            pos: 0,
            end: 0,
            file: Some(file),
            pipe,
            nonblocking: false,
            file_pos: 0,
            file_len: len,
            records: None,
            released: false,
        }
    }

    /// Frees the memory and closes the file; later reads raise `ValueError`.
    pub fn release(&mut self) {
        self.buf = Vec::new();
        self.pos = 0;
        self.end = 0;
        self.file = None;
        self.file_len = self.file_pos;
        self.released = true;
    }

    fn check_open(&self) -> PyResult<()> {
        if self.released {
            return Err(PyValueError::new_err("wsgi.input of a finished request was read"));
        }
        Ok(())
    }

    fn buffered(&self) -> usize {
        self.end - self.pos
    }

    fn remaining(&self) -> u64 {
        self.buffered() as u64 + (self.file_len - self.file_pos)
    }

    /// The number of bytes a read of `size` returns: all that is left when `size` is negative
    /// or absent, as io streams do. A body in records has no known rest: `size` or all of it.
    fn clamp(&self, size: Option<i64>) -> usize {
        let remaining = if self.records.is_some() { u64::MAX } else { self.remaining() };
        let wanted = match size {
            Some(size) if size >= 0 => remaining.min(size as u64),
            _ => remaining,
        };
        usize::try_from(wanted).unwrap_or(usize::MAX)
    }

    /// Fills `dst` from the file at `file_pos`, detached from the interpreter.
    fn read_file_into(&mut self, py: Python<'_>, dst: &mut [u8]) -> PyResult<()> {
        let file = self.file.as_ref().map(AsFd::as_fd).expect("only a file body has bytes past its buffer");
        let pipe = self.pipe;
        let mut filled = 0;
        while filled < dst.len() {
            let offset = self.file_pos + filled as u64;
            let rest = &mut dst[filled..];
            let read = py.detach(|| {
                if pipe {
                    maitred_sys::pipe::read(file, rest)
                } else {
                    maitred_sys::fd::pread(file.as_raw_fd(), rest, offset)
                }
            });
            match read {
                Ok(0) if pipe => {
                    self.file_pos += filled as u64;
                    return Err(body_cut_short(self.file_pos, Some(self.file_len)));
                }
                Ok(0) => {
                    return Err(PyOSError::new_err(format!(
                        "the request body file ended at byte {offset} of {}",
                        self.file_len
                    )))
                }
                Ok(n) => filled += n,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => py.check_signals()?,
                Err(error) => return Err(error.into()),
            }
        }
        self.file_pos += filled as u64;
        Ok(())
    }

    /// Reads more of the file into `buf` after the unread bytes (of a body in records, what
    /// its next read brings); false when the file is done.
    fn refill(&mut self, py: Python<'_>) -> PyResult<bool> {
        let room = if self.records.is_some() {
            READ_AHEAD
        } else {
            (self.file_len - self.file_pos).min(READ_AHEAD as u64) as usize
        };
        if room == 0 || self.records.as_ref().is_some_and(BodyRecords::ended) {
            return Ok(false);
        }
        self.buf.drain(..self.pos);
        self.buf.truncate(self.end - self.pos);
        self.pos = 0;
        let start = self.buf.len();
        self.buf.resize(start + room, 0);
        let mut buf = std::mem::take(&mut self.buf);
        let result = if self.records.is_some() {
            self.record_bytes_into(py, &mut buf[start..]).map(|read| read.unwrap_or(0))
        } else {
            self.read_file_into(py, &mut buf[start..]).map(|()| room)
        };
        buf.truncate(start + *result.as_ref().unwrap_or(&0));
        self.buf = buf;
        self.end = self.buf.len();
        result.map(|read| read > 0)
    }

    /// The next bytes of a body in records, into `dst` (not empty): how many, 0 once its end
    /// record is read, None when its pipe, made not to wait, has nothing yet. A read takes a
    /// record's bytes and the next header after them at once (a header alone, with no bytes
    /// after it yet, takes another). Detached from the interpreter, for a read that waits.
    fn record_bytes_into(&mut self, py: Python<'_>, dst: &mut [u8]) -> PyResult<Option<usize>> {
        debug_assert!(!dst.is_empty(), "a read of records into no room would look like the end");
        let file = self.file.as_ref().map(AsFd::as_fd).expect("a body in records has its pipe until it is released");
        let records = self.records.as_mut().expect("only a body in records is read by its records");
        loop {
            let (data, header) = records.plan(dst.len());
            if data + header == 0 {
                return Ok(Some(0));
            }
            let read = {
                let mut into =
                    [io::IoSliceMut::new(&mut dst[..data]), io::IoSliceMut::new(records.header_room(header))];
                py.detach(|| maitred_sys::pipe::read_vectored(file, &mut into))
            };
            match read {
                Ok(0) => return Err(body_cut_short(self.file_pos, None)),
                Ok(n) => {
                    let body = records.read(data, n);
                    // What has come so far is all that is known of the body's length.
                    self.file_pos += body as u64;
                    self.file_len = self.file_pos;
                    if body > 0 {
                        return Ok(Some(body));
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => py.check_signals()?,
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Fills `dst` with a body in records: the bytes `readline` read ahead, then the pipe's,
    /// waiting for them; short only where the body ends.
    fn fill_from_records(&mut self, py: Python<'_>, dst: &mut [u8]) -> PyResult<usize> {
        let mut filled = dst.len().min(self.buffered());
        dst[..filled].copy_from_slice(&self.buf[self.pos..self.pos + filled]);
        self.pos += filled;
        while filled < dst.len() {
            match self.record_bytes_into(py, &mut dst[filled..])? {
                Some(0) => break,
                Some(read) => filled += read,
                None => unreachable!("a WSGI application's pipe is never made not to wait"),
            }
        }
        Ok(filled)
    }

    /// Up to `count` bytes of a body in records, fewer only at its end: read into the bytes
    /// object itself when `count` is one read's worth (a copy only for the last read, which
    /// ends short), gathered first when it is more or all.
    fn read_records<'py>(&mut self, py: Python<'py>, count: usize) -> PyResult<Bound<'py, PyBytes>> {
        if count <= RECORDS_READ_AT_ONCE {
            let mut filled = 0;
            let bytes = PyBytes::new_with(py, count, |dst| {
                filled = self.fill_from_records(py, dst)?;
                Ok(())
            })?;
            return Ok(if filled == count { bytes } else { PyBytes::new(py, &bytes.as_bytes()[..filled]) });
        }
        let mut gathered = Vec::new();
        while gathered.len() < count {
            let start = gathered.len();
            let room = (count - start).min(RECORDS_READ_AT_ONCE);
            gathered.resize(start + room, 0);
            let filled = self.fill_from_records(py, &mut gathered[start..])?;
            gathered.truncate(start + filled);
            if filled < room {
                break;
            }
        }
        Ok(PyBytes::new(py, &gathered))
    }

    fn take<'py>(&mut self, py: Python<'py>, count: usize) -> PyResult<Bound<'py, PyBytes>> {
        let from_buf = count.min(self.buffered());
        PyBytes::new_with(py, count, |dst| {
            dst[..from_buf].copy_from_slice(&self.buf[self.pos..self.pos + from_buf]);
            if count > from_buf {
                self.read_file_into(py, &mut dst[from_buf..])?;
            }
            self.pos += from_buf;
            Ok(())
        })
    }
}

#[pymethods]
impl RequestBody {
    /// A streaming body's pipe, for an ASGI worker's loop to wait on (`read_ready`); None for a
    /// body that is all there (in memory or in a file).
    #[getter]
    fn pipe(&self) -> Option<i32> {
        self.file.as_ref().filter(|_| self.pipe && !self.released).map(AsRawFd::as_raw_fd)
    }

    /// What the pipe has now, up to `size` bytes, without waiting: None when nothing has come
    /// yet. `ClientDisconnected` when the body ended short: its client went.
    fn read_ready<'py>(&mut self, py: Python<'py>, size: usize) -> PyResult<Option<Bound<'py, PyBytes>>> {
        self.check_open()?;
        let count = self.clamp(Some(size as i64));
        if !self.pipe || count == 0 {
            return self.take(py, count).map(Some);
        }
        let file = self.file.as_ref().map(AsFd::as_fd).expect("a pipe body has its pipe until it is released");
        if !self.nonblocking {
            maitred_sys::pipe::set_nonblocking(file)?;
            self.nonblocking = true;
        }
        let mut piece = vec![0; count];
        if self.records.is_some() {
            return Ok(self.record_bytes_into(py, &mut piece)?.map(|read| PyBytes::new(py, &piece[..read])));
        }
        match maitred_sys::pipe::read(file, &mut piece) {
            Ok(0) => Err(body_cut_short(self.file_pos, Some(self.file_len))),
            Ok(n) => {
                self.file_pos += n as u64;
                Ok(Some(PyBytes::new(py, &piece[..n])))
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Whether more of the body is to come (an ASGI worker's `more_body`).
    #[getter]
    fn more(&self) -> bool {
        self.remaining() > 0 || self.records.as_ref().is_some_and(|records| !records.ended())
    }

    /// Up to `size` bytes; all the rest when `size` is negative, None or absent.
    #[pyo3(signature = (size = None))]
    fn read<'py>(&mut self, py: Python<'py>, size: Option<i64>) -> PyResult<Bound<'py, PyBytes>> {
        self.check_open()?;
        let count = self.clamp(size);
        if self.records.is_some() {
            return self.read_records(py, count);
        }
        self.take(py, count)
    }

    /// One line including its `\n`, at most `size` bytes of it.
    #[pyo3(signature = (size = None))]
    fn readline<'py>(&mut self, py: Python<'py>, size: Option<i64>) -> PyResult<Bound<'py, PyBytes>> {
        self.check_open()?;
        let limit = self.clamp(size);
        let mut searched = 0;
        loop {
            let window = self.buffered().min(limit);
            if let Some(at) = self.buf[self.pos + searched..self.pos + window].iter().position(|&b| b == b'\n') {
                return self.take(py, searched + at + 1);
            }
            searched = window;
            if window == limit || !self.refill(py)? {
                return self.take(py, window);
            }
        }
    }

    /// The remaining lines; stops after the line that brings the total to `hint` bytes.
    #[pyo3(signature = (hint = None))]
    fn readlines<'py>(&mut self, py: Python<'py>, hint: Option<i64>) -> PyResult<Bound<'py, PyList>> {
        let lines = PyList::empty(py);
        let mut total = 0usize;
        loop {
            let line = self.readline(py, None)?;
            let len = line.as_bytes().len();
            if len == 0 {
                return Ok(lines);
            }
            lines.append(line)?;
            total += len;
            if matches!(hint, Some(hint) if hint > 0 && total >= hint as usize) {
                return Ok(lines);
            }
        }
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let line = self.readline(py, None)?;
        Ok((!line.as_bytes().is_empty()).then_some(line))
    }
}

/// A streaming body's pipe ended before its last byte (of `len`; None: a chunked body's end
/// record): the lobby stopped it, because its client went or missed the body's pace (and had
/// its 408).
fn body_cut_short(at: u64, len: Option<u64>) -> PyErr {
    let of = len.map_or_else(|| "a chunked body".to_string(), |len| len.to_string());
    ClientDisconnected::new_err((
        libc::EPIPE,
        format!("the request body ended at byte {at} of {of}: its client stopped sending it"),
    ))
}
