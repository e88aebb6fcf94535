//! What the lobby sends the worker: the shared region and its two bells, each request (taken from
//! the region's slots, or read from the channel when a slot says it comes there), `CANCEL`
//! while a response is in progress, and each `REQUEST` frame turned into an environ and a
//! `wsgi.input`.
//!
//! Imports the type from `mod.rs` and `errors` of the channel's files; of this crate, `body`,
//! `environ`, `response` (the response's phase, which a `CANCEL` ends) and `sys` for the system
//! calls.

use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd};

use maitred_shm::{Awaiting, Region, WorkerEnd};
use maitred_wire::{decode_cancel, FrameHeader, FrameReader, Kind, Request, FLAG_RECORDS, FLAG_WEBSOCKET, HEADER_LEN};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::errors::{channel_error, client_disconnected, recv_error, socket_error, ChannelError};
use super::WorkerChannel;
use crate::body::RequestBody;
use crate::environ;
use crate::response::Phase;
use crate::scope;
use maitred_sys::fd::wait_readable_either;
use maitred_sys::fdpass::{recv_into, RecvError};

/// An inline body at least this large keeps the buffer it arrived in rather than being copied
/// out of it.
const HAND_OVER_BODY: usize = 16 * 1024;

/// Where a complete `REQUEST` frame lies: in the receive buffer, or in the copy of a slot.
pub(super) struct FrameAt {
    header: FrameHeader,
    start: usize,
    end: usize,
    from_slot: bool,
}

/// What one look at the channel found.
pub(super) enum Received {
    Bytes,
    Nothing,
    Closed,
    /// Not waiting (an evented channel), neither the channel nor the bell was ready.
    Pending,
}

/// What a request becomes: a WSGI environ, or an ASGI scope (with the lifespan's state, if
/// any, to copy into it).
pub(super) enum Interface<'py> {
    Wsgi,
    Asgi(Option<Bound<'py, PyDict>>),
}

/// What `next_request` found.
pub(super) enum Next {
    Request(FrameAt),
    /// The lobby closed the channel, between requests.
    Closed,
    /// Evented: nothing yet; the event loop waits for the bell or the channel.
    Pending,
}

impl WorkerChannel {
    /// The first unconsumed frame, when all of it has arrived: its header and where it ends.
    pub(super) fn buffered_frame(&self) -> PyResult<Option<(FrameHeader, usize)>> {
        let frame = FrameReader::whole_frame(&self.inbox[self.inbox_start..])
            .map_err(|error| channel_error("the lobby sent a bad frame", error))?;
        Ok(frame.map(|(header, len)| (header, self.inbox_start + len)))
    }

    /// Moves the unconsumed bytes to the front of the receive buffer, before reading more.
    fn compact(&mut self) {
        if self.inbox_start > 0 {
            self.inbox.drain(..self.inbox_start);
            self.inbox_start = 0;
        }
    }

    /// Marks the received bytes before `end` as consumed.
    pub(super) fn consume_through(&mut self, end: usize) {
        self.inbox_start = end;
        if self.inbox_start >= self.inbox.len() {
            self.inbox.clear();
            self.inbox_start = 0;
        }
    }

    /// The next `REQUEST` (docs/PROTOCOL.md, section 3): the oldest in the region's slots, or,
    /// when that slot holds only its place, the one on the channel. With none, the worker says
    /// it sleeps, looks again, and waits for its bell or the channel; an evented channel does
    /// not wait but returns `Next::Pending`, its flag left set for the event loop's wait, and
    /// reads the channel first only when `channel_readable` (the event loop found it so).
    pub(super) fn next_request(&mut self, py: Python<'_>, channel_readable: bool) -> PyResult<Next> {
        let wait = !self.evented;
        loop {
            // Whole frames at the front of the receive buffer, each in its turn.
            while let Some((header, end)) = self.buffered_frame()? {
                match header.kind {
                    Kind::Request if self.on_channel => {
                        self.on_channel = false;
                        return Ok(Next::Request(FrameAt { header, start: self.inbox_start, end, from_slot: false }));
                    }
                    // Its place in the slots has not been taken yet.
                    Kind::Request => break,
                    // What names a request of an event loop's goes to that request's news.
                    _ if self.evented => {
                        self.route_frame(py, &header, end)?;
                    }
                    // It crossed the end of the response it was about, which had nothing left
                    // to stop.
                    Kind::Cancel => {
                        self.check_cancel_frame(&header, end)?;
                    }
                    Kind::Region => self.open_region(&header)?,
                    Kind::Bell => self.take_bell(&header)?,
                    Kind::LobbyBell => self.take_lobby_bell(&header)?,
                    other => {
                        return Err(ChannelError::new_err(format!(
                            "the lobby sent a {other:?} frame; a worker only receives REQUEST, CANCEL, REGION, BELL and LOBBY_BELL"
                        )))
                    }
                }
                self.consume_through(end);
            }
            if self.on_channel {
                // The request whose place was taken is on the channel, whole or still coming.
                match self.wait_and_read(py, wait)? {
                    Received::Closed => {
                        return Err(ChannelError::new_err("the lobby closed the channel before a request it had sent"))
                    }
                    Received::Pending => return Ok(Next::Pending),
                    Received::Bytes | Received::Nothing => continue,
                }
            }
            if let Some(frame) = self.take_from_slot()? {
                return Ok(Next::Request(frame));
            }
            if self.on_channel {
                continue;
            }
            // Nothing to do: say so, look once more, and sleep until the bell or the channel.
            if let Some(region) = self.ready_region() {
                region.prepare_to_sleep(Awaiting::Request);
                if region.has_request() {
                    // A bell rung meanwhile is silenced at the next sleep, which it cuts short.
                    region.sleep_cancelled();
                    continue;
                }
            }
            // An evented channel looked at for its bell, or at the end of a request, is not
            // read: the event loop watches it (level-triggered), and calls back on its next wait
            // for whatever it holds. Under load that is one recvmsg(2) a request fewer, each of
            // which found nothing (docs/PERFORMANCE.md).
            let received = if wait || channel_readable { self.wait_and_read(py, wait)? } else { Received::Pending };
            if let Received::Pending = received {
                // The event loop waits for the bell or the channel; the flag stays set until
                // it has.
                self.asleep = self.ready_region().is_some();
                return Ok(Next::Pending);
            }
            if let Some(region) = self.ready_region() {
                region.sleep_cancelled();
            }
            if let Received::Closed = received {
                self.closed = true;
                if self.inbox_start == self.inbox.len() {
                    return Ok(Next::Closed);
                }
                return Err(ChannelError::new_err("the lobby closed the channel inside a frame"));
            }
        }
    }

    /// The region, once both bells have come too: the lobby sends all three before any request,
    /// but the later ones may arrive after the first has been read, and the worker answers
    /// through the region (`ring`), which needs the lobby's bell.
    pub(super) fn ready_region(&self) -> Option<&WorkerEnd> {
        self.region.as_ref().filter(|_| self.bell.is_some() && self.lobby_bell.is_some())
    }

    /// The request in the oldest queued slot, copied out. Its place alone sets `on_channel`.
    fn take_from_slot(&mut self) -> PyResult<Option<FrameAt>> {
        if self.ready_region().is_none() {
            return Ok(None);
        }
        self.slot_frame.clear();
        let taken = self
            .region
            .as_ref()
            .expect("the region, ready")
            .take_next(&mut self.slot_frame)
            .map_err(|error| channel_error("the shared region is corrupt", error))?;
        let Some(taken) = taken else { return Ok(None) };
        self.request_id = taken.id;
        let header = FrameReader::whole_frame(&self.slot_frame)
            .map_err(|error| channel_error("the lobby queued a bad frame", error))?
            .filter(|(_, len)| *len == self.slot_frame.len())
            .map(|(header, _)| header);
        match header {
            Some(header) if header.kind == Kind::Request && !header.has_fd() => {
                Ok(Some(FrameAt { header, start: 0, end: self.slot_frame.len(), from_slot: true }))
            }
            Some(header) if header.kind == Kind::OnChannel && header.len == 0 => {
                self.on_channel = true;
                Ok(None)
            }
            _ => Err(ChannelError::new_err(format!(
                "the lobby queued {} bytes that are not one whole REQUEST frame or ON_CHANNEL",
                self.slot_frame.len()
            ))),
        }
    }

    /// Waits (detached from the interpreter) until the channel or the bell is readable, silences
    /// the bell, and reads what the channel holds. Without `wait` (an evented channel, whose
    /// bell the event loop hears), only reads the channel: `Pending` when it holds nothing.
    pub(super) fn wait_and_read(&mut self, py: Python<'_>, wait: bool) -> PyResult<Received> {
        if !wait {
            return Ok(match self.read_available()? {
                Received::Nothing => Received::Pending,
                other => other,
            });
        }
        let channel = self.link.fd.as_raw_fd();
        let bell = self.bell.as_ref().map(|bell| bell.as_raw_fd());
        // The worker waits in poll(2), not in recvmsg(2): a thread blocked in recvmsg on a
        // Unix socket sleeps on the socket's one wait queue, where the peer reading what this
        // side sent earlier wakes it too (room to write again), for nothing: once per request,
        // as the lobby reads each response while the worker waits for the next request
        // (docs/PERFORMANCE.md). Other Python threads run meanwhile.
        let (channel_ready, bell_ready) = match py.detach(|| wait_readable_either(channel, bell, true)) {
            Ok(ready) => ready,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {
                py.check_signals()?;
                return Ok(Received::Nothing);
            }
            Err(error) => return Err(socket_error("waiting for a request failed", error)),
        };
        if bell_ready {
            if let Some(bell) = &self.bell {
                maitred_sys::bell::silence(bell.as_fd())
                    .map_err(|error| socket_error("silencing the bell failed", error))?;
            }
        }
        if !channel_ready {
            // A signal that came while poll was returning for the bell interrupted no system
            // call: its handler runs here, or not until the next request.
            py.check_signals()?;
            return Ok(Received::Nothing);
        }
        let received = self.read_available()?;
        if let Received::Nothing = received {
            py.check_signals()?;
        }
        Ok(received)
    }

    /// One nonblocking read of what the channel holds.
    pub(super) fn read_available(&mut self) -> PyResult<Received> {
        let room = FrameReader::WORKER
            .room_for_next_read(&self.inbox[self.inbox_start..])
            .map_err(|error| channel_error("the lobby sent a bad frame", error))?;
        self.compact();
        self.inbox.reserve(room);
        match recv_into(self.link.fd.as_raw_fd(), &mut self.inbox, &mut self.fds, libc::MSG_DONTWAIT) {
            Ok(0) => Ok(Received::Closed),
            Ok(_) => Ok(Received::Bytes),
            Err(RecvError::Os(error))
                if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) =>
            {
                Ok(Received::Nothing)
            }
            Err(error) => Err(recv_error(error)),
        }
    }

    /// `REGION`, `BELL` or `LOBBY_BELL`, each once.
    pub(super) fn take_setup(&mut self, header: &FrameHeader) -> PyResult<()> {
        match header.kind {
            Kind::Region => self.open_region(header),
            Kind::Bell => self.take_bell(header),
            _ => self.take_lobby_bell(header),
        }
    }

    /// `REGION` hands over the shared region, once.
    fn open_region(&mut self, header: &FrameHeader) -> PyResult<()> {
        let file = self.setup_descriptor(header, "REGION", self.region.is_some())?;
        let region = Region::open(file).map_err(|error| channel_error("the shared region cannot be used", error))?;
        self.region = Some(WorkerEnd::new(region));
        Ok(())
    }

    /// `BELL` hands over the eventfd the lobby rings when this worker sleeps, once.
    fn take_bell(&mut self, header: &FrameHeader) -> PyResult<()> {
        self.bell = Some(self.setup_descriptor(header, "BELL", self.bell.is_some())?);
        Ok(())
    }

    /// `LOBBY_BELL` hands over the eventfd this worker rings when the lobby sleeps, once.
    fn take_lobby_bell(&mut self, header: &FrameHeader) -> PyResult<()> {
        self.lobby_bell = Some(self.setup_descriptor(header, "LOBBY_BELL", self.lobby_bell.is_some())?);
        Ok(())
    }

    /// The descriptor a `REGION`, `BELL` or `LOBBY_BELL` frame brings: it has one, no payload, and comes once.
    fn setup_descriptor(&mut self, header: &FrameHeader, kind: &str, again: bool) -> PyResult<std::os::fd::OwnedFd> {
        let fd = match (header.has_fd(), header.len, again) {
            (true, 0, false) => self.fds.pop_front(),
            _ => None,
        };
        fd.ok_or_else(|| {
            ChannelError::new_err(format!(
                "the lobby sent a {kind} frame without a descriptor, with a payload, or a second time"
            ))
        })
    }

    /// A `CANCEL` carries a request id and nothing else.
    pub(super) fn check_cancel_frame(&self, header: &FrameHeader, end: usize) -> PyResult<u32> {
        if header.flags != 0 {
            return Err(ChannelError::new_err(format!("the lobby sent a CANCEL frame with flags {}", header.flags)));
        }
        decode_cancel(&self.inbox[end - header.len as usize..end])
            .map_err(|error| channel_error("the lobby sent a bad CANCEL frame", error))
    }

    /// Before a body frame of a response whose head is out: if the lobby has sent `CANCEL` for
    /// this request, consumes it, marks the response cancelled and fails with
    /// `ClientDisconnected`. One for an earlier request, which crossed the end of its response,
    /// is skipped. Never waits, and costs at most one nonblocking `recvmsg` (none when a frame
    /// is buffered). Nothing but a `CANCEL` may arrive while a response is in progress.
    pub(super) fn check_cancel(&mut self) -> PyResult<()> {
        if self.evented {
            // The loop's watch of the channel is its one reader: it sorts every frame into the
            // news of its request and tells that request's task. A read here would sort frames
            // for other requests, whose tasks nobody would tell, and drain the socket the watch
            // waits on: they would wait for the channel's next bytes (the 300 WebSockets'
            // lost echoes of issue 47).
            if self.news().is_some_and(|news| news.cancelled) {
                self.response.phase = Phase::Cancelled;
                return Err(client_disconnected());
            }
            return Ok(());
        }
        if self.buffered_frame()?.is_none() {
            // At end-of-file too: a lobby retiring this worker lets it finish the response.
            self.read_available()?;
        }
        while let Some((header, end)) = self.buffered_frame()? {
            if header.kind != Kind::Cancel {
                return Err(ChannelError::new_err(format!(
                    "the lobby sent a {:?} frame while a response was in progress; only CANCEL may come then",
                    header.kind
                )));
            }
            let id = self.check_cancel_frame(&header, end)?;
            self.consume_through(end);
            if id == self.request_id {
                self.response.phase = Phase::Cancelled;
                return Err(client_disconnected());
            }
        }
        Ok(())
    }

    /// Turns the `REQUEST` frame at `frame` into a new WSGI environ, or an ASGI scope, and
    /// consumes it. The environ holds the body as `wsgi.input`; the scope does not, and the
    /// caller takes the body from `self.body`.
    pub(super) fn take_request<'py>(
        &mut self,
        py: Python<'py>,
        frame: FrameAt,
        interface: Interface<'py>,
    ) -> PyResult<Bound<'py, PyDict>> {
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
        let buffer = if frame.from_slot { &mut self.slot_frame } else { &mut self.inbox };
        let payload = &buffer[frame.start + HEADER_LEN..frame.end];
        let request = Request::decode_payload(payload, body_file.is_some())
            .map_err(|error| channel_error("the lobby sent a bad REQUEST frame", error))?;
        self.websocket = frame.header.flags & FLAG_WEBSOCKET != 0;
        if self.websocket && matches!(interface, Interface::Wsgi) {
            return Err(ChannelError::new_err("the lobby sent a WebSocket to a WSGI worker"));
        }
        if request.http_version > maitred_wire::HTTP_2 {
            return Err(ChannelError::new_err(format!(
                "a REQUEST frame has an unknown HTTP version byte {}",
                request.http_version
            )));
        }
        self.method.clear();
        self.method.extend_from_slice(request.method);
        self.target.clear();
        self.target.extend_from_slice(request.target);
        self.http_version = request.http_version;

        let records = frame.header.flags & FLAG_RECORDS != 0;
        if records && body_file.is_none() {
            return Err(ChannelError::new_err("the lobby sent a body in records without its pipe"));
        }
        let wsgi = matches!(interface, Interface::Wsgi);
        let environ = match interface {
            Interface::Wsgi => {
                let environ = self.base_environ.bind(py).copy()?;
                environ::fill(&environ, &self.script_name, &request, records)?;
                environ
            }
            Interface::Asgi(state) => scope::build(py, &self.script_name, &request, self.websocket, state.as_ref())?,
        };
        let inline_len = request.inline_body.len();
        let body_len = request.body_len;
        let body = match body_file {
            Some(pipe) if records => RequestBody::in_records(pipe),
            Some(file) => RequestBody::in_file(file, body_len),
            None if inline_len >= HAND_OVER_BODY && frame.end == buffer.len() => {
                RequestBody::inline(mem::take(buffer), frame.end - inline_len, frame.end)
            }
            None => RequestBody::inline(buffer[frame.end - inline_len..frame.end].to_vec(), 0, inline_len),
        };
        if !frame.from_slot {
            self.consume_through(frame.end);
        }
        let body = Py::new(py, body)?;
        if wsgi {
            environ.set_item(intern!(py, "wsgi.input"), &body)?;
        }
        self.body = Some(body);
        Ok(environ)
    }

    /// The previous request's body is released when the next one arrives (or the channel
    /// closes): an application that kept `wsgi.input` cannot keep a spilled file open.
    pub(super) fn release_body(&mut self, py: Python<'_>) {
        if let Some(body) = self.body.take() {
            if let Ok(mut body) = body.bind(py).try_borrow_mut() {
                body.release();
            }
        }
    }
}
