//! The channel served by an event loop (ASGI): nothing here waits. Where a worker without an
//! event loop sleeps in poll(2) (for a request, for room in the answer ring), an evented
//! channel says that it sleeps, leaves the flag set and returns; the event loop watches the
//! channel and the bell, and calls back when either is readable (docs/PROTOCOL.md, section 4).
//!
//! Imports the type from `mod.rs`, `errors`, and `receive` (the request, the wait, `CANCEL`)
//! of the channel's files; `response` of this crate.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use maitred_wire::Kind;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::errors::{client_disconnected, one_line, socket_error};
use super::receive::{Interface, Next};
use super::WorkerChannel;
use crate::response::Phase;

impl WorkerChannel {
    pub(super) fn check_evented(&self) -> PyResult<()> {
        if !self.evented {
            return Err(PyRuntimeError::new_err("this channel waits; it was not made for an event loop"));
        }
        Ok(())
    }

    /// The event loop heard the bell: silences it, so that the loop's next wait sleeps.
    pub(super) fn hear_bell(&self) -> PyResult<()> {
        if let Some(bell) = &self.bell {
            maitred_sys::bell::silence(bell.as_fd())
                .map_err(|error| socket_error("silencing the bell failed", error))?;
        }
        Ok(())
    }

    /// Before a look: takes back the flag that said the worker sleeps, so that the look starts
    /// awake. A bell the lobby rang meanwhile is heard by the event loop (`hear_bell`).
    pub(super) fn wake(&mut self) -> PyResult<()> {
        if self.asleep {
            self.asleep = false;
            if let Some(region) = self.ready_region() {
                region.sleep_cancelled();
            }
        }
        Ok(())
    }

    /// The next request's scope and body, or None when there is none yet (or the lobby closed
    /// the channel: `closed`); see `next_request` for `channel_readable`.
    pub(super) fn take_scope<'py>(
        &mut self,
        py: Python<'py>,
        state: Option<Bound<'py, PyDict>>,
        channel_readable: bool,
    ) -> PyResult<Option<Bound<'py, PyTuple>>> {
        self.check_evented()?;
        if self.response.phase != Phase::Complete {
            return Err(PyRuntimeError::new_err("a request was taken before the current response was complete"));
        }
        self.wake()?;
        self.release_body(py);
        let frame = match self.next_request(py, channel_readable)? {
            Next::Request(frame) => frame,
            Next::Closed | Next::Pending => return Ok(None),
        };
        let scope = self.take_request(py, frame, Interface::Asgi(state))?;
        self.response.begin(self.method == b"HEAD");
        let body = self.body.as_ref().expect("take_request keeps the body").clone_ref(py);
        let exchange = Bound::new(py, self.new_exchange())?;
        Ok(Some(PyTuple::new(py, [scope.into_any(), body.into_bound(py).into_any(), exchange.into_any()])?))
    }

    /// The descriptors the event loop watches: the channel, and the bell once it has come.
    pub(super) fn watched_fds(&self) -> (RawFd, Option<RawFd>) {
        (self.link.fd.as_raw_fd(), self.bell.as_ref().map(|bell| bell.as_raw_fd()))
    }

    /// Evented: writes what waits in the backlog; see `write_backlog`.
    pub(super) fn flush_backlog(&mut self, py: Python<'_>) -> PyResult<bool> {
        self.check_evented()?;
        if self.backlog.is_empty() {
            return Ok(true);
        }
        self.wake()?;
        // Nobody is left to read them: the lobby drops the answers of cancelled requests. The
        // others' frames, an ended request's last ones too, go as they are.
        let exchanges = &self.exchanges;
        self.backlog.retain(|waiting| !exchanges.get(&waiting.id).is_some_and(|news| news.cancelled));
        if self.response.phase == Phase::Cancelled || self.news().is_some_and(|news| news.cancelled) {
            self.response.phase = Phase::Cancelled;
            return Err(client_disconnected());
        }
        self.write_backlog(py)
    }

    /// Ends the response with the worker's own `status` in place of the application's, when its
    /// head has not gone out; otherwise cuts it off with `RESPONSE_ABORT`.
    pub(super) fn fail_with(&mut self, py: Python<'_>, status: u16, reason: &[u8], message: &str) -> PyResult<()> {
        match self.response.phase {
            Phase::AwaitingStart | Phase::HeadPending => {
                let body = format!("{status} {}\n", String::from_utf8_lossy(reason));
                self.response.set_own_head(status, reason, body.as_bytes());
                let body = if self.response.has_body() { body.as_bytes() } else { b"" };
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
}
