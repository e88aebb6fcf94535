//! The worker's end of its channel to the lobby (docs/PROTOCOL.md, section 2), and the
//! `start_response` callable that belongs to each request it receives.
//!
//! The per-request work that does not need the application runs here, in Rust: reading the
//! `REQUEST` frame, building the environ, checking the status and headers, framing the
//! response. The Python loop in `maitred.worker` only calls the application and hands over
//! what it returns.
//!
//! This file holds [`WorkerChannel`]'s state and the methods Python calls; `start_response` holds
//! [`StartResponse`].
//! The rest of the type's `impl` lies in the other files of this folder, by concern: `receive`
//! (what the lobby sends), `respond` (framing the application's response), `file` (an answer
//! that ends with a file the lobby sends itself), `ring` (writing it into the shared region's
//! answer ring), `link` (writing to the socket) and `errors` (the
//! exceptions, and what becomes of each failure), `evented` (the channel as an event loop serves
//! it: nothing waits) and `websocket` (a WebSocket's events and frames). They import
//! what they share from here (the type) and the exceptions from `errors`, never one
//! another otherwise; `errors` and `link` import nothing from here.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::path::PathBuf;

use maitred_shm::WorkerEnd;
use maitred_wire::{Kind, Ready, READY_ASGI};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::body::RequestBody;
use crate::environ::latin1;
use crate::response::{bytes_arg, latin1_bytes, HeaderText, Phase, Response};

mod errors;
mod evented;
mod file;
mod link;
mod mux;
mod receive;
mod respond;
mod ring;
mod start_response;
mod websocket;

use errors::one_line;
pub use errors::{ChannelClosed, ChannelError, UnsendablePath};
use link::Link;
pub use mux::Exchange;
use mux::Exchanges;
use receive::{Interface, Next};
pub use start_response::StartResponse;

/// An answer frame of request `id` waiting, evented, for room in the ring (`ring`).
struct Waiting {
    id: u32,
    /// What goes into the ring: the frame, or the `ON_CHANNEL` record of `on_channel`'s.
    record: Vec<u8>,
    /// The frame that goes on the socket once its record is in the ring, and the descriptor it
    /// passes (a copy, as the application may close its own meanwhile).
    on_channel: Option<(Vec<u8>, Option<OwnedFd>)>,
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
    /// The worker's end of its shared region and its bell, once the lobby has sent them: the
    /// requests come through the region's slots (docs/PROTOCOL.md, section 3).
    region: Option<WorkerEnd>,
    bell: Option<OwnedFd>,
    /// The lobby's bell, which the worker rings after writing an answer while the lobby sleeps.
    lobby_bell: Option<OwnedFd>,
    /// Where the request taken from a slot is copied.
    slot_frame: Vec<u8>,
    /// The slot taken last held the place of a request that comes on the channel.
    on_channel: bool,
    /// The id of the request taken last, which a `CANCEL` for it names.
    request_id: u32,
    /// Served by an event loop (ASGI): nothing waits; see `evented`.
    evented: bool,
    /// Evented, the worker has said that it sleeps (waiting for a request, or for room in the
    /// ring) and left the flag set for the event loop's wait.
    asleep: bool,
    /// Evented, answer frames that found the ring full, oldest first: they go before any later
    /// frame.
    backlog: VecDeque<Waiting>,
    /// Evented, what the event loop gave (`ring_later`) to be asked, after an answer was
    /// written, whether to ring the lobby's bell at once or leave it to the loop (`ring`).
    ring_later: Option<Py<PyAny>>,
    /// An answer was written and the lobby's bell waits for `ring`.
    ring_owed: bool,
    /// The lobby closed the channel (end-of-file was read).
    closed: bool,
    /// Evented: the requests in progress, each with what the lobby said about it (`mux`).
    exchanges: Exchanges,
    /// Evented: the requests that got news since the event loop last asked (`route`).
    told: Vec<u32>,
    /// The request in progress is a WebSocket (the `REQUEST` had the `WEBSOCKET` flag).
    websocket: bool,
    /// Where frame heads are encoded.
    out: Vec<u8>,
    response: Response,
    /// Counts requests, so that a `start_response` kept from an earlier one is refused.
    generation: u64,
    body: Option<Py<RequestBody>>,
    method: Vec<u8>,
    target: Vec<u8>,
    http_version: u8,
}

#[pymethods]
impl WorkerChannel {
    #[new]
    #[pyo3(signature = (fd, base_environ, evented = false))]
    fn new(fd: RawFd, base_environ: Bound<'_, PyDict>, evented: bool) -> PyResult<WorkerChannel> {
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
        // The caller hands the descriptor over; from here on the channel owns it. It waits in
        // blocking calls (detached from the interpreter), and programs the application runs
        // must not inherit it.
        let fd = maitred_sys::fd::adopt(fd)?;
        maitred_sys::fd::set_blocking_cloexec(fd.as_fd())?;
        Ok(WorkerChannel {
            link: Link { fd, broken: false },
            base_environ: base_environ.unbind(),
            script_name,
            inbox: Vec::new(),
            inbox_start: 0,
            fds: VecDeque::new(),
            region: None,
            bell: None,
            lobby_bell: None,
            slot_frame: Vec::new(),
            on_channel: false,
            request_id: 0,
            evented,
            asleep: false,
            backlog: VecDeque::new(),
            ring_later: None,
            ring_owed: false,
            closed: false,
            exchanges: Exchanges::new(),
            told: Vec::new(),
            websocket: false,
            out: Vec::new(),
            response: Response::new(),
            generation: 0,
            body: None,
            method: Vec::new(),
            target: Vec::new(),
            http_version: 1,
        })
    }

    /// Sends `READY` with this process's id.
    /// An evented channel's `READY` says that the worker runs an ASGI application, which takes
    /// WebSocket requests (docs/PROTOCOL.md, section 5).
    fn ready(&mut self, py: Python<'_>) -> PyResult<()> {
        let flags = if self.evented { READY_ASGI } else { 0 };
        let ready = Ready { pid: std::process::id(), flags };
        self.send_control(py, Kind::Ready, &ready.encode_payload())
    }

    /// Sends `BOOT_FAILED` with `message` on one line.
    fn boot_failed(&mut self, py: Python<'_>, message: &str) -> PyResult<()> {
        self.send_control(py, Kind::BootFailed, one_line(message).as_bytes())
    }

    /// Waits (detached from the interpreter) for the next `REQUEST` and returns
    /// `(environ, start_response)`, or None when the lobby closed the channel.
    fn receive<'py>(slf: &Bound<'py, Self>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let py = slf.py();
        let mut guard = slf.borrow_mut();
        let this = &mut *guard;
        if this.evented {
            return Err(PyRuntimeError::new_err("an evented channel receives with receive_scope()"));
        }
        if this.response.phase != Phase::Complete {
            return Err(PyRuntimeError::new_err("receive() was called before the current response was complete"));
        }
        this.release_body(py);
        let frame = match this.next_request(py, true)? {
            Next::Request(frame) => frame,
            Next::Closed => return Ok(None),
            Next::Pending => unreachable!("a channel that waits is never pending"),
        };
        let environ = this.take_request(py, frame, Interface::Wsgi)?;
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
    /// itself (`file`). The count is the application's Content-Length (less what `write`
    /// sent), or all that remains.
    fn send_file(&mut self, py: Python<'_>, fd: RawFd, offset: u64, available: u64) -> PyResult<()> {
        self.send_file_range(py, fd, offset, available)
    }

    /// ASGI's `http.response.pathsend`: ends the response with the regular file at `path`,
    /// which the lobby sends itself as it does `send_file`'s (`file`). `UnsendablePath` when it
    /// cannot be opened or is not a regular file.
    fn send_path(&mut self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        self.send_whole_file(py, &path)
    }

    /// The application failed, or its client went away. Before the head went out, the client
    /// gets a 500 instead; after, `RESPONSE_ABORT` with `message` cuts its connection; after
    /// the response was complete, nothing is sent.
    fn fail(&mut self, py: Python<'_>, message: &str) -> PyResult<()> {
        self.fail_with(py, 500, b"Internal Server Error", message)
    }

    /// The request ran past --timeout and its task was cancelled: the client gets a 504 when
    /// the head has not gone out, and its connection is cut otherwise.
    fn timed_out(&mut self, py: Python<'_>, message: &str) -> PyResult<()> {
        self.fail_with(py, 504, b"Gateway Timeout", message)
    }

    // What an event loop calls (ASGI; `evented`). Each of these returns without waiting.

    /// The descriptors an event loop watches for this channel: `(channel, bell)`; the bell is
    /// None until the lobby has sent it, after the first look.
    fn watched(&self) -> (RawFd, Option<RawFd>) {
        self.watched_fds()
    }

    /// The next request as `(scope, body)`: an ASGI HTTP scope (with a copy of `state`, the
    /// lifespan's, when given) and the body to read in pieces. None when there is none yet: the
    /// worker has said that it sleeps, and the event loop waits for `watched()`. None too once
    /// the lobby closed the channel (`closed`). `state` is None when the application has no
    /// lifespan state. The channel itself is read only when `channel_readable`: the event loop
    /// found it so.
    fn receive_scope<'py>(
        &mut self,
        py: Python<'py>,
        state: Option<Bound<'py, PyDict>>,
        channel_readable: bool,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.take_scope(py, state, channel_readable)
    }

    /// The event loop found the bell readable: silences it. Then look (`receive_scope`, `look`,
    /// `flush`) as when the channel is readable.
    fn bell_rang(&self) -> PyResult<()> {
        self.hear_bell()
    }

    /// Reads what the channel holds, without waiting, into the news of the requests it names:
    /// `(ids, closed)`, the ids of the requests that got news since the last call (a `CANCEL`,
    /// `HOLD`, `GO`, a WebSocket's message), and whether the lobby has closed the channel
    /// (finish what is in progress, then stop).
    fn route(&mut self, py: Python<'_>) -> PyResult<(Vec<u32>, bool)> {
        self.check_evented()?;
        self.wake()?;
        self.route_news(py)
    }

    /// `route` after the look for requests: the news that look read off the channel (the rest
    /// of a large `WS_MESSAGE`, which the socket no longer shows as readable), sorted, leaving
    /// the flag that look set for the lobby's ring as it is.
    fn route_after_take(&mut self, py: Python<'_>) -> PyResult<(Vec<u32>, bool)> {
        self.check_evented()?;
        self.route_news(py)
    }

    /// Makes `exchange` the request the next calls are about (`start`, `send`, `ws_*`,
    /// `flush`, `fail`, `timed_out`, `cancelled`, `held`), until `leave`.
    fn enter(&mut self, exchange: &Bound<'_, Exchange>) -> PyResult<()> {
        self.check_evented()?;
        if self.response.phase != Phase::Complete || self.body.is_some() {
            return Err(PyRuntimeError::new_err("an exchange was entered while another was"));
        }
        let mut exchange = exchange.borrow_mut();
        if exchange.entered {
            return Err(PyRuntimeError::new_err("an exchange was entered twice"));
        }
        exchange.entered = true;
        self.swap_request(&mut exchange.state);
        Ok(())
    }

    /// Puts what `enter` took back into `exchange`.
    fn leave(&mut self, exchange: &Bound<'_, Exchange>) -> PyResult<()> {
        let mut exchange = exchange.borrow_mut();
        if !exchange.entered {
            return Err(PyRuntimeError::new_err("an exchange was left that had not been entered"));
        }
        exchange.entered = false;
        self.swap_request(&mut exchange.state);
        Ok(())
    }

    /// The request of `exchange` (not entered) has ended: its news is dropped and its body
    /// released.
    fn end(&mut self, py: Python<'_>, exchange: &Bound<'_, Exchange>) {
        self.end_exchange(py, &mut exchange.borrow_mut());
    }

    /// Whether the lobby cancelled the request entered (its client left, or --timeout).
    #[getter]
    fn cancelled(&mut self) -> bool {
        self.response.phase == Phase::Cancelled || self.news().is_some_and(|news| news.cancelled)
    }

    /// Whether the lobby holds the answer of the request entered (`HOLD`): its `send` waits
    /// until `GO`.
    #[getter]
    fn held(&mut self) -> bool {
        self.news().is_some_and(|news| news.held)
    }

    /// Writes the answer frames that found the ring full. True when none is left; False when
    /// the ring is full again: wait for `watched()`, then call again. Raises
    /// `ClientDisconnected` once the lobby has cancelled the request.
    fn flush(&mut self, py: Python<'_>) -> PyResult<bool> {
        self.flush_backlog(py)
    }

    /// From now on, the first answer written after each `ring()` asks `callback` (with no
    /// argument) whether to ring the lobby's bell at once. False: the event loop calls `ring()`
    /// once its turn's callbacks have run, so that the answers of one turn wake the lobby once.
    fn ring_later(&mut self, callback: Py<PyAny>) -> PyResult<()> {
        self.check_evented()?;
        self.ring_later = Some(callback);
        Ok(())
    }

    /// Rings the lobby's bell for the answers written since the last `ring()`, if it sleeps and
    /// has not read them meanwhile: a lobby about to park reads the answers not rung for, and
    /// then sleeps on the seat for its next request's answer, for which this ring would be a
    /// wake for nothing.
    fn ring(&mut self) -> PyResult<()> {
        if std::mem::take(&mut self.ring_owed) && !self.region.as_ref().is_some_and(WorkerEnd::all_read) {
            self.ring_lobby_if_asleep()?;
        }
        Ok(())
    }

    /// The event loop's heartbeat, `lag` seconds late: published in the region's header, where
    /// the lobby's admission reads it (docs/ASGI.md, "Streams and admission").
    fn beat(&self, lag: f64) {
        if let Some(region) = &self.region {
            region.beat(std::time::Duration::try_from_secs_f64(lag).unwrap_or_default());
        }
    }

    /// Answer frames wait for room in the ring: `flush()` them before sending more.
    #[getter]
    fn backlogged(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// The lobby has closed the channel.
    #[getter]
    fn closed(&self) -> bool {
        self.closed
    }

    /// The next event of the WebSocket in progress, as ASGI's `websocket.receive` or
    /// `websocket.disconnect` message; None when none has come yet (wait for `watched()`).
    fn ws_receive<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        self.next_ws_event(py)
    }

    /// ASGI's `websocket.accept`: `WS_ACCEPT` with the subprotocol (or None) and extra headers.
    #[pyo3(signature = (subprotocol, headers))]
    fn ws_accept(&mut self, py: Python<'_>, subprotocol: Option<&str>, headers: &Bound<'_, PyAny>) -> PyResult<()> {
        self.accept_ws(py, subprotocol.unwrap_or(""), headers)
    }

    /// ASGI's `websocket.send`: `data` as a text (str) or binary (bytes) message.
    fn ws_send(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        self.send_ws(py, data)
    }

    /// ASGI's `websocket.close`, and the end of every WebSocket request: `WS_CLOSE`. Before
    /// `ws_accept`, the lobby answers 403.
    fn ws_close(&mut self, py: Python<'_>, code: u16, reason: &str) -> PyResult<()> {
        self.close_ws(py, code, reason)
    }

    /// ASGI's `http.response.start`: `status` as `"200 OK"` and `headers` as (name, value)
    /// pairs of bytes, checked as `start_response` checks WSGI's.
    fn start(&mut self, py: Python<'_>, status: &Bound<'_, PyAny>, headers: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.response.phase != Phase::AwaitingStart {
            return Err(PyRuntimeError::new_err("http.response.start was sent twice"));
        }
        self.response.start(status, headers, HeaderText::Bytes)?;
        self.response.say_hop_by_hop_dropped(py, &self.method, &self.target)
    }

    /// ASGI's `http.response.body`: `data`, and with `more_body` false the end of the response.
    fn send(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>, more_body: bool) -> PyResult<()> {
        if self.response.phase == Phase::AwaitingStart {
            return Err(PyRuntimeError::new_err("http.response.body was sent before http.response.start"));
        }
        self.send_chunk(py, bytes_arg(data)?, !more_body, false)
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
        line.extend_from_slice(match self.http_version {
            maitred_wire::HTTP_1_0 => b" HTTP/1.0",
            maitred_wire::HTTP_1_1 => b" HTTP/1.1",
            _ => b" HTTP/2",
        });
        latin1(py, &line)
    }
}
