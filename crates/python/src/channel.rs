//! The worker's end of its channel to the lobby (docs/PROTOCOL.md, section 2), and the
//! `start_response` callable that belongs to each request it receives.
//!
//! The per-request work that does not need the application runs here, in Rust: reading the
//! `REQUEST` frame, building the environ, checking the status and headers, framing the
//! response. The Python loop in `maitred.worker` only calls the application and hands over
//! what it returns.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use maitred_wire::{
    FileRange, FrameHeader, Kind, Request, WireError, FLAG_END, FLAG_FD, HEADER_LEN, MAX_BODY_PER_FRAME, OFFER_MAX,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};

use crate::body::RequestBody;
use crate::environ::{self, latin1};
use crate::response::{latin1_bytes, Phase, Response, ERROR_BODY};
use crate::sys::{self, RecvError};

create_exception!(
    maitred._native,
    ChannelError,
    PyException,
    "The channel to the lobby failed: a write failed, the lobby closed it inside a frame, or a frame broke the protocol. The worker cannot go on."
);

/// The receive buffer grows by at least this much, so that one `recvmsg` usually takes a
/// whole request.
const READ_SIZE: usize = 64 * 1024;

/// An inline body at least this large keeps the receive buffer it arrived in rather than
/// being copied out of it.
const HAND_OVER_BODY: usize = 16 * 1024;

/// The most offer sockets a worker takes (the lobby sends three).
const MAX_OFFER_SOCKETS: usize = 8;

/// A message for `BOOT_FAILED` or `RESPONSE_ABORT` is one line of at most this many bytes.
const MAX_MESSAGE: usize = 4096;

create_exception!(
    maitred._native,
    ChannelClosed,
    ChannelError,
    "The lobby closed its end of the channel while the worker was writing: it has retired this worker or gone away."
);

create_exception!(
    maitred._native,
    ClientDisconnected,
    PyOSError,
    "The client of the response being sent has gone away (the lobby sent CANCEL), so the body cannot be delivered. Raised by the body write that found it out, and by every later one; errno is EPIPE, as for a write to a closed connection."
);

fn client_disconnected() -> PyErr {
    ClientDisconnected::new_err((libc::EPIPE, "the client has gone away"))
}

fn channel_error(what: &str, error: impl std::fmt::Display) -> PyErr {
    ChannelError::new_err(format!("{what}: {error}"))
}

/// A failed socket call: `ChannelClosed` when the lobby has let go of the channel.
fn socket_error(what: &str, error: io::Error) -> PyErr {
    match error.kind() {
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
            ChannelClosed::new_err(format!("{what}: {error}"))
        }
        _ => channel_error(what, error),
    }
}

fn recv_error(error: RecvError) -> PyErr {
    match error {
        RecvError::Os(error) => socket_error("reading from the lobby failed", error),
        RecvError::DescriptorsTruncated => {
            ChannelError::new_err("more file descriptors arrived than a frame can carry")
        }
    }
}

/// A `CANCEL` is its header alone: a payload or a descriptor would be out of step with
/// everything after it.
fn check_cancel_frame(header: &FrameHeader) -> PyResult<()> {
    if header.len != 0 || header.flags != 0 {
        return Err(ChannelError::new_err(format!(
            "the lobby sent a CANCEL frame with flags {} and a {}-byte payload; it has neither",
            header.flags, header.len
        )));
    }
    Ok(())
}

fn wire_error(error: WireError) -> PyErr {
    PyValueError::new_err(error.to_string())
}

/// `message` on one line, cut (at a character boundary) to `MAX_MESSAGE` bytes.
fn one_line(message: &str) -> String {
    let mut line: String = message.split(['\r', '\n']).filter(|part| !part.is_empty()).collect::<Vec<_>>().join(" ");
    if line.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
    }
    line
}

fn excess_error(excess: usize, declared: u64) -> PyErr {
    PyValueError::new_err(format!(
        "the application produced {excess} more bytes than its Content-Length {declared}; they were dropped"
    ))
}

fn bytes_arg<'a>(data: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    match data.cast::<PyBytes>() {
        Ok(bytes) => Ok(bytes.as_bytes()),
        Err(_) => {
            let kind = data.get_type().name()?;
            Err(PyTypeError::new_err(format!("the response body must be bytes, and the application gave {kind}")))
        }
    }
}

/// The socket itself. Once a write fails the stream may hold half a frame, so every later
/// write fails too rather than send the lobby garbage.
struct Link {
    fd: OwnedFd,
    broken: bool,
}

impl Link {
    /// Writes all of `bufs`. The first attempt does not wait and keeps the interpreter: the
    /// lobby reads promptly, so the socket usually has room. Waiting happens detached.
    fn write_all(&mut self, py: Python<'_>, mut bufs: &mut [IoSlice<'_>]) -> PyResult<()> {
        if self.broken {
            return Err(ChannelError::new_err("an earlier write to the lobby failed"));
        }
        let fd = self.fd.as_raw_fd();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        let mut left = total;
        let mut wait = false;
        while left > 0 {
            let result = if wait {
                let pending: &[IoSlice<'_>] = bufs;
                py.detach(|| sys::send(fd, pending, 0))
            } else {
                sys::send(fd, bufs, libc::MSG_DONTWAIT)
            };
            match result {
                Ok(n) => {
                    IoSlice::advance_slices(&mut bufs, n);
                    left -= n;
                    wait = true;
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => wait = true,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {
                    // A signal handler that raises leaves the frame unfinished.
                    if let Err(raised) = py.check_signals() {
                        self.broken = left < total;
                        return Err(raised);
                    }
                }
                Err(error) => {
                    self.broken = true;
                    return Err(socket_error("writing to the lobby failed", error));
                }
            }
        }
        Ok(())
    }

    /// Writes `frame` with `passed` attached to its first byte.
    fn write_with_fd(&mut self, py: Python<'_>, frame: &[u8], passed: RawFd) -> PyResult<()> {
        if self.broken {
            return Err(ChannelError::new_err("an earlier write to the lobby failed"));
        }
        let fd = self.fd.as_raw_fd();
        loop {
            match py.detach(|| sys::send_with_fd(fd, &[IoSlice::new(frame)], passed, 0)) {
                Ok(n) => return self.write_all(py, &mut [IoSlice::new(&frame[n..])]),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => py.check_signals()?,
                Err(error) => {
                    self.broken = true;
                    return Err(socket_error("passing a file to the lobby failed", error));
                }
            }
        }
    }
}

/// Where a complete frame lies in the receive buffer.
struct FrameAt {
    header: FrameHeader,
    start: usize,
    end: usize,
}

/// The worker's end of the channel: `WorkerChannel(fd, base_environ)`. It owns `fd` (and
/// closes it when collected); `base_environ` holds the keys every request shares, and its
/// `SCRIPT_NAME` is the mount point stripped from each path.
#[pyclass(module = "maitred._native")]
pub struct WorkerChannel {
    link: Link,
    base_environ: Py<PyDict>,
    script_name: Vec<u8>,
    /// Received bytes; those before `inbox_start` are consumed.
    inbox: Vec<u8>,
    inbox_start: usize,
    /// Received descriptors not yet given to a frame, oldest first.
    fds: VecDeque<OwnedFd>,
    /// The worker's ends of its offer sockets, once the lobby has sent them, and which of them
    /// the next offer comes on (they take turns).
    offers: Vec<OwnedFd>,
    offer_turn: usize,
    /// Where frame heads are encoded.
    out: Vec<u8>,
    response: Response,
    /// Counts requests, so that a `start_response` kept from an earlier one is refused.
    generation: u64,
    body: Option<Py<RequestBody>>,
    method: Vec<u8>,
    target: Vec<u8>,
    http_minor: u8,
}

impl WorkerChannel {
    fn send_frame(&mut self, py: Python<'_>, kind: Kind, flags: u8, payload: &[u8]) -> PyResult<()> {
        let header = FrameHeader::new(kind, flags, payload.len()).map_err(wire_error)?.encode();
        self.link.write_all(py, &mut [IoSlice::new(&header), IoSlice::new(payload)])
    }

    /// Sends the pending head with the first `body` bytes.
    fn send_head(&mut self, py: Python<'_>, end: bool, added_length: Option<u64>, body: &[u8]) -> PyResult<()> {
        if body.len() > MAX_BODY_PER_FRAME {
            self.send_head(py, false, added_length, b"")?;
            return self.send_body_frames(py, end, body);
        }
        let flags = if end { FLAG_END } else { 0 };
        self.response.encode_head(&mut self.out, flags, added_length, body.len()).map_err(wire_error)?;
        self.link.write_all(py, &mut [IoSlice::new(&self.out), IoSlice::new(body)])
    }

    fn send_body_frames(&mut self, py: Python<'_>, end: bool, mut body: &[u8]) -> PyResult<()> {
        loop {
            let piece = body.len().min(MAX_BODY_PER_FRAME);
            let last = piece == body.len();
            let flags = if end && last { FLAG_END } else { 0 };
            self.send_frame(py, Kind::ResponseBody, flags, &body[..piece])?;
            body = &body[piece..];
            if last {
                return Ok(());
            }
        }
    }

    /// The header of the first unconsumed frame, once all of it has arrived.
    fn buffered_header(&self) -> PyResult<Option<FrameHeader>> {
        let Some(bytes) = self.inbox[self.inbox_start..].first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        let header = FrameHeader::decode(bytes).map_err(|error| channel_error("the lobby sent a bad frame", error))?;
        Ok(Some(header))
    }

    /// Moves the unconsumed bytes to the front of the receive buffer, before reading more.
    fn compact(&mut self) {
        if self.inbox_start > 0 {
            self.inbox.drain(..self.inbox_start);
            self.inbox_start = 0;
        }
    }

    /// Marks the received bytes before `end` as consumed.
    fn consume_through(&mut self, end: usize) {
        self.inbox_start = end;
        if self.inbox_start >= self.inbox.len() {
            self.inbox.clear();
            self.inbox_start = 0;
        }
    }

    /// The next `REQUEST`: one on the channel first, then one offered on the offer socket,
    /// then whichever of the two comes first (docs/PROTOCOL.md, section 3). None when the
    /// lobby closed the channel.
    fn next_request(&mut self, py: Python<'_>) -> PyResult<Option<FrameAt>> {
        // The first look does not wait: under load the next request is usually there already.
        let mut wait = false;
        loop {
            let available = self.inbox.len() - self.inbox_start;
            let mut missing = HEADER_LEN.saturating_sub(available);
            if let Some(header) = self.buffered_header()? {
                let len = HEADER_LEN + header.len as usize;
                if available >= len {
                    let frame = FrameAt { header, start: self.inbox_start, end: self.inbox_start + len };
                    match header.kind {
                        // It crossed the end of the response it was about, which had nothing
                        // left to stop.
                        Kind::Cancel => check_cancel_frame(&header)?,
                        Kind::Offers => self.take_offer_socket(&header)?,
                        _ => return Ok(Some(frame)),
                    }
                    self.consume_through(frame.end);
                    continue;
                }
                missing = len - available;
            }
            // An offer is a whole frame, never the rest of one already begun on the channel.
            let between_frames = available == 0;
            let channel = self.link.fd.as_raw_fd();
            let offers = self.offers.get(self.offer_turn).filter(|_| between_frames).map(|fd| fd.as_raw_fd());
            // Only a wait that may block lets other Python threads run meanwhile.
            let ready = if wait {
                py.detach(|| sys::wait_readable(channel, offers, true))
            } else {
                sys::wait_readable(channel, offers, false)
            };
            let (channel_ready, offer_ready) = match ready {
                Ok(ready) => ready,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {
                    py.check_signals()?;
                    continue;
                }
                Err(error) => return Err(socket_error("waiting for a request failed", error)),
            };
            wait = true;
            // The channel before the offer socket: the lobby offers a request only after
            // sending the one before it, so when both are readable the channel's comes first.
            if channel_ready {
                self.compact();
                self.inbox.reserve(missing.max(READ_SIZE));
                match sys::recv_into(channel, &mut self.inbox, &mut self.fds, libc::MSG_DONTWAIT) {
                    Ok(0) if self.inbox.is_empty() => return Ok(None),
                    Ok(0) => return Err(ChannelError::new_err("the lobby closed the channel inside a frame")),
                    Ok(_) => {}
                    Err(RecvError::Os(error))
                        if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) =>
                    {
                        py.check_signals()?
                    }
                    Err(error) => return Err(recv_error(error)),
                }
            } else if offer_ready {
                if let Some(frame) = self.receive_offer()? {
                    return Ok(Some(frame));
                }
            }
        }
    }

    /// Each `OFFERS` frame hands over the worker's end of an offer socket.
    fn take_offer_socket(&mut self, header: &FrameHeader) -> PyResult<()> {
        let fd = match (header.has_fd(), header.len) {
            (true, 0) if self.offers.len() < MAX_OFFER_SOCKETS => self.fds.pop_front(),
            _ => None,
        };
        let fd = fd.ok_or_else(|| {
            ChannelError::new_err(format!(
                "the lobby sent an OFFERS frame without a descriptor, with a payload, or more than {MAX_OFFER_SOCKETS}"
            ))
        })?;
        self.offers.push(fd);
        Ok(())
    }

    /// A `REQUEST` offered on the offer socket, if one is waiting; it lands in the (empty)
    /// receive buffer like one read from the channel.
    fn receive_offer(&mut self) -> PyResult<Option<FrameAt>> {
        let Some(offers) = self.offers.get(self.offer_turn) else {
            return Ok(None);
        };
        let fd = offers.as_raw_fd();
        self.compact();
        self.inbox.reserve(OFFER_MAX);
        let start = self.inbox.len();
        match sys::recv_into(fd, &mut self.inbox, &mut self.fds, libc::MSG_DONTWAIT) {
            // The lobby let go of this worker's offers: it is retiring it or shutting down.
            Ok(0) => {
                self.offers.clear();
                Ok(None)
            }
            Ok(n) => {
                let header = self.buffered_header()?.filter(|header| HEADER_LEN + header.len as usize == n);
                match header {
                    Some(header) if header.kind == Kind::Request => {
                        self.offer_turn = (self.offer_turn + 1) % self.offers.len();
                        Ok(Some(FrameAt { header, start, end: start + n }))
                    }
                    _ => Err(ChannelError::new_err(format!(
                        "the lobby offered {n} bytes that are not one whole REQUEST frame"
                    ))),
                }
            }
            Err(RecvError::Os(error))
                if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) =>
            {
                Ok(None)
            }
            Err(error) => Err(recv_error(error)),
        }
    }

    /// Before a body frame of a response whose head is out: if the lobby has sent `CANCEL`,
    /// consumes it, marks the response cancelled and fails with `ClientDisconnected`. Never
    /// waits, and costs at most one nonblocking `recvmsg` (none when a header is buffered).
    /// Nothing but a `CANCEL` may arrive while a response is in progress.
    fn check_cancel(&mut self) -> PyResult<()> {
        if self.inbox.len() - self.inbox_start < HEADER_LEN {
            self.compact();
            self.inbox.reserve(HEADER_LEN);
            let fd = self.link.fd.as_raw_fd();
            match sys::recv_into(fd, &mut self.inbox, &mut self.fds, libc::MSG_DONTWAIT) {
                // At end-of-file too: a lobby retiring this worker lets it finish the response.
                Ok(_) => {}
                Err(RecvError::Os(error))
                    if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) =>
                {
                    return Ok(())
                }
                Err(error) => return Err(recv_error(error)),
            }
        }
        let Some(header) = self.buffered_header()? else {
            return Ok(());
        };
        if header.kind != Kind::Cancel {
            return Err(ChannelError::new_err(format!(
                "the lobby sent a {:?} frame while a response was in progress; only CANCEL may come then",
                header.kind
            )));
        }
        check_cancel_frame(&header)?;
        self.consume_through(self.inbox_start + HEADER_LEN);
        self.response.phase = Phase::Cancelled;
        Err(client_disconnected())
    }

    /// Turns the `REQUEST` frame at `frame` into a new environ and consumes it.
    fn take_request<'py>(&mut self, py: Python<'py>, frame: FrameAt) -> PyResult<Bound<'py, PyDict>> {
        if frame.header.kind != Kind::Request {
            return Err(ChannelError::new_err(format!(
                "the lobby sent a {:?} frame; a worker only receives REQUEST frames",
                frame.header.kind
            )));
        }
        let body_file = if frame.header.has_fd() {
            Some(self.fds.pop_front().ok_or_else(|| {
                ChannelError::new_err("a REQUEST frame has the FD flag but no file descriptor came with it")
            })?)
        } else {
            None
        };
        let payload = &self.inbox[frame.start + HEADER_LEN..frame.end];
        let request = Request::decode_payload(payload, body_file.is_some())
            .map_err(|error| channel_error("the lobby sent a bad REQUEST frame", error))?;
        if request.http_minor > 1 {
            return Err(ChannelError::new_err(format!(
                "a REQUEST frame has HTTP minor version {}",
                request.http_minor
            )));
        }
        self.method.clear();
        self.method.extend_from_slice(request.method);
        self.target.clear();
        self.target.extend_from_slice(request.target);
        self.http_minor = request.http_minor;

        let environ = self.base_environ.bind(py).copy()?;
        environ::fill(&environ, &self.script_name, &request)?;
        let inline_len = request.inline_body.len();
        let body_len = request.body_len;
        let body = match body_file {
            Some(file) => RequestBody::in_file(file, body_len),
            None if inline_len >= HAND_OVER_BODY && frame.end == self.inbox.len() => {
                RequestBody::inline(mem::take(&mut self.inbox), frame.end - inline_len, frame.end)
            }
            None => RequestBody::inline(self.inbox[frame.end - inline_len..frame.end].to_vec(), 0, inline_len),
        };
        self.consume_through(frame.end);
        let body = Py::new(py, body)?;
        environ.set_item(intern!(py, "wsgi.input"), &body)?;
        self.body = Some(body);
        Ok(environ)
    }

    /// Sends one piece of the application's body. `last`: nothing follows it. `flush_head`:
    /// send the head even when `data` is empty (a `write` call).
    fn send_chunk(&mut self, py: Python<'_>, data: &[u8], last: bool, flush_head: bool) -> PyResult<()> {
        let phase = self.response.phase;
        match phase {
            // PEP 3333 lets the application call start_response as late as its first
            // non-empty chunk; empty ones before it are nothing to send.
            Phase::AwaitingStart if data.is_empty() && !last => return Ok(()),
            Phase::AwaitingStart => {
                return Err(PyRuntimeError::new_err(if last {
                    "the application returned without calling start_response()"
                } else {
                    "the application produced body bytes before calling start_response()"
                }))
            }
            Phase::Cancelled => return Err(client_disconnected()),
            Phase::Complete => {
                return match self.response.length_to_match() {
                    Some(declared) if !data.is_empty() => Err(excess_error(data.len(), declared)),
                    _ => Ok(()),
                };
            }
            Phase::HeadPending | Phase::HeadSent => {}
        }
        let mut data = data;
        let mut excess = None;
        let mut complete = last;
        if let Some(declared) = self.response.length_to_match() {
            let room = declared - self.response.produced();
            if data.len() as u64 > room {
                if phase == Phase::HeadPending {
                    return Err(PyValueError::new_err(format!(
                        "the application's body is longer than its Content-Length {declared}"
                    )));
                }
                excess = Some(excess_error(data.len() - room as usize, declared));
                data = &data[..room as usize];
            }
            let total = self.response.produced() + data.len() as u64;
            if last && total < declared {
                return Err(PyValueError::new_err(format!(
                    "the application's body ended after {total} bytes, short of its Content-Length {declared}"
                )));
            }
            complete |= total == declared;
        }
        let payload = if self.response.has_body() { data } else { b"" };
        match phase {
            Phase::HeadPending if data.is_empty() && !complete && !flush_head => return Ok(()),
            Phase::HeadPending => {
                let added = if complete { self.response.added_length(data.len() as u64) } else { None };
                self.send_head(py, complete, added, payload)?;
            }
            _ if payload.is_empty() && !complete => {}
            _ => {
                self.check_cancel()?;
                self.send_body_frames(py, complete, payload)?
            }
        }
        self.response.add_produced(data.len() as u64);
        self.response.phase = if complete { Phase::Complete } else { Phase::HeadSent };
        // The client has its Content-Length worth; the application still hears of its error.
        excess.map_or(Ok(()), Err)
    }

    fn respond_with<'py>(
        &mut self,
        py: Python<'py>,
        len: usize,
        mut chunks: impl Iterator<Item = Bound<'py, PyAny>>,
    ) -> PyResult<()> {
        if len == 1 {
            let only = chunks.next().expect("one chunk");
            return self.send_chunk(py, bytes_arg(&only)?, true, false);
        }
        let mut body = Vec::new();
        for chunk in chunks {
            body.extend_from_slice(bytes_arg(&chunk)?);
        }
        self.send_chunk(py, &body, true, false)
    }

    fn check_generation(&self, generation: u64) -> PyResult<()> {
        if generation != self.generation {
            return Err(PyRuntimeError::new_err("start_response() or write() of a finished request was called"));
        }
        Ok(())
    }

    /// The previous request's body is released when the next one arrives (or the channel
    /// closes): an application that kept `wsgi.input` cannot keep a spilled file open.
    fn release_body(&mut self, py: Python<'_>) {
        if let Some(body) = self.body.take() {
            if let Ok(mut body) = body.bind(py).try_borrow_mut() {
                body.release();
            }
        }
    }
}

#[pymethods]
impl WorkerChannel {
    #[new]
    fn new(fd: RawFd, base_environ: Bound<'_, PyDict>) -> PyResult<WorkerChannel> {
        if fd < 0 {
            return Err(PyValueError::new_err(format!("invalid channel descriptor {fd}")));
        }
        let script_name = match base_environ.get_item("SCRIPT_NAME")? {
            None => Vec::new(),
            Some(value) => {
                let text = value
                    .cast::<PyString>()
                    .map_err(|_| PyTypeError::new_err("SCRIPT_NAME in the base environ must be a str"))?;
                latin1_bytes(text)?
                    .ok_or_else(|| PyValueError::new_err(format!("SCRIPT_NAME {text} is not latin-1")))?
                    .into_owned()
            }
        };
        // SAFETY: the caller hands the descriptor over; from here on the channel owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        sys::prepare_channel(fd.as_raw_fd())?;
        Ok(WorkerChannel {
            link: Link { fd, broken: false },
            base_environ: base_environ.unbind(),
            script_name,
            inbox: Vec::new(),
            inbox_start: 0,
            fds: VecDeque::new(),
            offers: Vec::new(),
            offer_turn: 0,
            out: Vec::new(),
            response: Response::new(),
            generation: 0,
            body: None,
            method: Vec::new(),
            target: Vec::new(),
            http_minor: 1,
        })
    }

    /// Sends `READY` with this process's id.
    fn ready(&mut self, py: Python<'_>) -> PyResult<()> {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        self.send_frame(py, Kind::Ready, 0, &pid.to_le_bytes())
    }

    /// Sends `BOOT_FAILED` with `message` on one line.
    fn boot_failed(&mut self, py: Python<'_>, message: &str) -> PyResult<()> {
        self.send_frame(py, Kind::BootFailed, 0, one_line(message).as_bytes())
    }

    /// Waits (detached from the interpreter) for the next `REQUEST` and returns
    /// `(environ, start_response)`, or None when the lobby closed the channel.
    fn receive<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let py = slf.py();
        let mut guard = slf.borrow_mut();
        let this = &mut *guard;
        if this.response.phase != Phase::Complete {
            return Err(PyRuntimeError::new_err("receive() was called before the current response was complete"));
        }
        this.release_body(py);
        let Some(frame) = this.next_request(py)? else {
            return Ok(None);
        };
        let environ = this.take_request(py, frame)?;
        this.generation += 1;
        this.response.begin(this.method == b"HEAD");
        let start_response = StartResponse { channel: slf.clone().unbind(), generation: this.generation };
        let start_response = Bound::new(py, start_response)?;
        Ok(Some(PyTuple::new(py, [environ.into_any(), start_response.into_any()])?))
    }

    /// Sends one chunk the application's iterable yielded. An empty chunk sends nothing. Raises
    /// `ClientDisconnected` once the lobby has cancelled the response.
    fn send_body(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        self.send_chunk(py, bytes_arg(data)?, false, false)
    }

    /// The application's iterable is exhausted: ends the response.
    fn finish(&mut self, py: Python<'_>) -> PyResult<()> {
        self.send_chunk(py, b"", true, false)
    }

    /// Sends a list or tuple of chunks, the whole body, as one piece: with the head not sent
    /// yet, the whole response is one frame, with a Content-Length when the application gave
    /// none.
    fn respond(&mut self, py: Python<'_>, chunks: &Bound<'_, PyAny>) -> PyResult<()> {
        if let Ok(list) = chunks.cast::<PyList>() {
            self.respond_with(py, list.len(), list.iter())
        } else {
            let tuple = chunks.cast::<PyTuple>()?;
            self.respond_with(py, tuple.len(), tuple.iter())
        }
    }

    /// Ends the response with the bytes of the open file `fd` from `offset`, of which
    /// `available` remain: a `RESPONSE_FILE` frame that passes `fd`, so the lobby sends them
    /// itself. The count is the application's Content-Length (less what `write` sent), or all
    /// that remains.
    fn send_file(&mut self, py: Python<'_>, fd: RawFd, offset: u64, available: u64) -> PyResult<()> {
        // A bad descriptor must fail here, as the application's error, not in sendmsg, where
        // it would look like the channel's.
        sys::check_open(fd)?;
        let count = match self.response.length_to_match() {
            Some(declared) => {
                let wanted = declared.saturating_sub(self.response.produced());
                if wanted > available {
                    return Err(PyValueError::new_err(format!(
                        "the application's Content-Length {declared} needs {wanted} more bytes, but its file has {available} after offset {offset}"
                    )));
                }
                wanted
            }
            None => available,
        };
        match self.response.phase {
            Phase::AwaitingStart => {
                return Err(PyRuntimeError::new_err("the application returned without calling start_response()"))
            }
            Phase::Complete if count > 0 => {
                return Err(PyValueError::new_err("the application returned a file after its body was complete"))
            }
            Phase::Complete => return Ok(()),
            Phase::Cancelled => return Err(client_disconnected()),
            Phase::HeadPending => {
                let end = count == 0 || !self.response.has_body();
                let added = self.response.added_length(count);
                self.send_head(py, end, added, b"")?;
            }
            Phase::HeadSent if count == 0 || !self.response.has_body() => {
                self.check_cancel()?;
                self.send_body_frames(py, true, b"")?
            }
            Phase::HeadSent => self.check_cancel()?,
        }
        if count > 0 && self.response.has_body() {
            let mut frame = [0u8; HEADER_LEN + FileRange::PAYLOAD_LEN];
            let header =
                FrameHeader::new(Kind::ResponseFile, FLAG_END | FLAG_FD, FileRange::PAYLOAD_LEN).map_err(wire_error)?;
            frame[..HEADER_LEN].copy_from_slice(&header.encode());
            frame[HEADER_LEN..].copy_from_slice(&FileRange { offset, count }.encode_payload());
            self.link.write_with_fd(py, &frame, fd)?;
        }
        self.response.add_produced(count);
        self.response.phase = Phase::Complete;
        Ok(())
    }

    /// The application failed, or its client went away. Before the head went out, the client
    /// gets a 500 instead; after, `RESPONSE_ABORT` with `message` cuts its connection; after
    /// the response was complete, nothing is sent.
    fn fail(&mut self, py: Python<'_>, message: &str) -> PyResult<()> {
        match self.response.phase {
            Phase::AwaitingStart | Phase::HeadPending => {
                self.response.set_error_head();
                let body = if self.response.has_body() { ERROR_BODY } else { b"" };
                self.send_head(py, true, None, body)?;
                self.response.phase = Phase::Complete;
                Ok(())
            }
            Phase::HeadSent | Phase::Cancelled => {
                self.response.phase = Phase::Complete;
                self.send_frame(py, Kind::ResponseAbort, 0, one_line(message).as_bytes())
            }
            Phase::Complete => Ok(()),
        }
    }

    /// The status of the current request's answer, `(code, reason)`: the application's, or
    /// the worker's 500 when it answered in the application's place. For the post_request hook.
    #[getter]
    fn status<'py>(&self, py: Python<'py>) -> PyResult<(u16, Bound<'py, PyString>)> {
        let (code, reason) = self.response.status();
        Ok((code, latin1(py, reason)?))
    }

    /// The current request's line, e.g. `GET /x?y HTTP/1.1`, for the error log.
    #[getter]
    fn request_line<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyString>> {
        let mut line = Vec::with_capacity(self.method.len() + self.target.len() + 10);
        line.extend_from_slice(&self.method);
        line.push(b' ');
        line.extend_from_slice(&self.target);
        line.extend_from_slice(if self.http_minor == 0 { b" HTTP/1.0" } else { b" HTTP/1.1" });
        latin1(py, &line)
    }
}

/// The `start_response` of one request (PEP 3333). Calling it checks the status and headers
/// at once, so a bad header fails inside the application, where its traceback is useful.
#[pyclass(module = "maitred._native")]
pub struct StartResponse {
    channel: Py<WorkerChannel>,
    generation: u64,
}

#[pymethods]
impl StartResponse {
    #[pyo3(signature = (status, headers, exc_info = None))]
    fn __call__<'py>(
        slf: &Bound<'py, Self>,
        status: &Bound<'py, PyAny>,
        headers: &Bound<'py, PyAny>,
        exc_info: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        {
            let me = slf.borrow();
            let mut channel = me.channel.bind(py).borrow_mut();
            channel.check_generation(me.generation)?;
            match exc_info.filter(|info| !info.is_none()) {
                // The head is out: the application's error cannot become a new status, so it
                // propagates (PEP 3333, "The start_response() Callable").
                Some(info) if channel.response.head_sent() => {
                    let error = info.get_item(1)?;
                    let traceback = info.get_item(2)?;
                    let error =
                        if traceback.is_none() { error } else { error.call_method1("with_traceback", (traceback,))? };
                    return Err(PyErr::from_value(error));
                }
                Some(_) => {}
                None if channel.response.phase != Phase::AwaitingStart => {
                    return Err(PyRuntimeError::new_err(
                        "start_response() was called twice; a second call must pass exc_info",
                    ));
                }
                None => {}
            }
            channel.response.start(status, headers)?;
        }
        slf.getattr(intern!(py, "write"))
    }

    /// PEP 3333's `write()`: sends `data` (and the head, the first time) before returning.
    /// Raises `ClientDisconnected` (an `OSError`) once the client has gone away.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut channel = self.channel.bind(py).borrow_mut();
        channel.check_generation(self.generation)?;
        if channel.response.phase == Phase::AwaitingStart {
            return Err(PyRuntimeError::new_err("write() was called before start_response()"));
        }
        channel.send_chunk(py, bytes_arg(data)?, false, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_become_one_bounded_line() {
        assert_eq!(one_line("ValueError: bad\r\nsecond line\n"), "ValueError: bad second line");
        let long = "é".repeat(MAX_MESSAGE);
        let cut = one_line(&long);
        assert!(cut.len() <= MAX_MESSAGE && cut.len() > MAX_MESSAGE - 2);
        assert!(cut.chars().all(|c| c == 'é'));
    }
}
