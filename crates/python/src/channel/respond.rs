//! The application's response, framed for the lobby: the head with the first body bytes,
//! body frames of at most `MAX_BODY_PER_FRAME`, and the Content-Length the application
//! declared held to.
//!
//! Imports the type from `mod.rs` and `errors` of the channel's files, and
//! `response` of this crate. Before each body frame it calls `check_cancel` (in `receive`); it
//! writes through the channel's `link`.

use std::io::IoSlice;

use maitred_wire::{FrameHeader, Kind, FLAG_END, HEADER_LEN};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use super::errors::{client_disconnected, wire_error};
use super::ring::Aside;
use super::WorkerChannel;
use crate::response::bytes_arg;
use crate::response::Phase;

fn excess_error(excess: usize, declared: u64) -> PyErr {
    PyValueError::new_err(format!(
        "the application produced {excess} more bytes than its Content-Length {declared}; they were dropped"
    ))
}

impl WorkerChannel {
    /// Sends `READY` or `BOOT_FAILED`, which go on the socket: they come before the region.
    pub(super) fn send_control(&mut self, py: Python<'_>, kind: Kind, payload: &[u8]) -> PyResult<()> {
        let header = FrameHeader::new(kind, 0, payload.len()).map_err(wire_error)?.encode();
        self.link.write_all(py, &mut [IoSlice::new(&header), IoSlice::new(payload)])
    }

    /// Sends one frame of the answer.
    pub(super) fn send_frame(&mut self, py: Python<'_>, kind: Kind, flags: u8, payload: &[u8]) -> PyResult<()> {
        let header = FrameHeader::new(kind, flags, payload.len()).map_err(wire_error)?.encode();
        self.send_answer(py, &[&header, payload], Aside::No)
    }

    /// Sends the pending head with the first `body` bytes.
    pub(super) fn send_head(
        &mut self,
        py: Python<'_>,
        end: bool,
        added_length: Option<u64>,
        body: &[u8],
    ) -> PyResult<()> {
        let flags = if end { FLAG_END } else { 0 };
        let most = self.max_body_per_frame();
        let split = body.len() > most || {
            self.response.encode_head(&mut self.out, flags, added_length, body.len()).map_err(wire_error)?;
            // With the head, the body makes a frame larger than a body frame may be.
            !body.is_empty() && self.out.len() - HEADER_LEN + body.len() > most
        };
        if split {
            self.send_head(py, false, added_length, b"")?;
            return self.send_body_frames(py, end, body);
        }
        let head = std::mem::take(&mut self.out);
        let sent = self.send_answer(py, &[&head, body], Aside::No);
        self.out = head;
        sent
    }

    pub(super) fn send_body_frames(&mut self, py: Python<'_>, end: bool, mut body: &[u8]) -> PyResult<()> {
        loop {
            let piece = body.len().min(self.max_body_per_frame());
            let last = piece == body.len();
            let flags = if end && last { FLAG_END } else { 0 };
            self.send_frame(py, Kind::ResponseBody, flags, &body[..piece])?;
            body = &body[piece..];
            if last {
                return Ok(());
            }
        }
    }
    /// Sends one piece of the application's body. `last`: nothing follows it. `flush_head`:
    /// send the head even when `data` is empty (a `write` call).
    pub(super) fn send_chunk(&mut self, py: Python<'_>, data: &[u8], last: bool, flush_head: bool) -> PyResult<()> {
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

    pub(super) fn respond_with<'py>(
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
}
