//! What the lobby sends the worker: the receive buffer and the descriptors that came with it,
//! the offer sockets, `CANCEL` while a response is in progress, and each `REQUEST` frame,
//! turned into an environ and a `wsgi.input`.
//!
//! Imports the type from `mod.rs` and `errors` of the channel's files; of this crate, `body`,
//! `environ`, `response` (the response's phase, which a `CANCEL` ends) and `sys` for the system
//! calls.

use std::io;
use std::mem;
use std::os::fd::AsRawFd;

use maitred_wire::{FrameHeader, Kind, Request, HEADER_LEN, OFFER_MAX};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::errors::{channel_error, client_disconnected, recv_error, socket_error, ChannelError};
use super::WorkerChannel;
use crate::body::RequestBody;
use crate::environ;
use crate::response::Phase;
use maitred_sys::fd::wait_readable_either;
use maitred_sys::fdpass::{recv_into, RecvError};

/// The receive buffer grows by at least this much, so that one `recvmsg` usually takes a
/// whole request.
const READ_SIZE: usize = 64 * 1024;

/// An inline body at least this large keeps the receive buffer it arrived in rather than
/// being copied out of it.
const HAND_OVER_BODY: usize = 16 * 1024;

/// The most offer sockets a worker takes (the lobby sends three).
const MAX_OFFER_SOCKETS: usize = 8;

/// Where a complete frame lies in the receive buffer.
pub(super) struct FrameAt {
    header: FrameHeader,
    start: usize,
    end: usize,
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

impl WorkerChannel {
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
    pub(super) fn next_request(&mut self, py: Python<'_>) -> PyResult<Option<FrameAt>> {
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
            // The worker waits in poll(2), not in recvmsg(2): a thread blocked in recvmsg on a
            // Unix socket sleeps on the socket's one wait queue, where the peer reading what this
            // side sent earlier wakes it too (room to write again), for nothing: once per request,
            // as the lobby reads each response while the worker waits for the next request
            // (docs/PERFORMANCE.md). Only a wait that may block lets other Python threads run
            // meanwhile.
            let ready = if wait {
                py.detach(|| wait_readable_either(channel, offers, true))
            } else {
                wait_readable_either(channel, offers, false)
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
                match recv_into(channel, &mut self.inbox, &mut self.fds, libc::MSG_DONTWAIT) {
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
        match recv_into(fd, &mut self.inbox, &mut self.fds, libc::MSG_DONTWAIT) {
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
    pub(super) fn check_cancel(&mut self) -> PyResult<()> {
        if self.inbox.len() - self.inbox_start < HEADER_LEN {
            self.compact();
            self.inbox.reserve(HEADER_LEN);
            let fd = self.link.fd.as_raw_fd();
            match recv_into(fd, &mut self.inbox, &mut self.fds, libc::MSG_DONTWAIT) {
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
    pub(super) fn take_request<'py>(&mut self, py: Python<'py>, frame: FrameAt) -> PyResult<Bound<'py, PyDict>> {
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
