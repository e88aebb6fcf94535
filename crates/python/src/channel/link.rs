//! The socket itself, as the channel writes to it: whole frames, without and with a
//! descriptor attached, waiting detached from the interpreter when the socket is full.
//!
//! Imports `errors` of the channel's files, and `sys` for the system calls.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use pyo3::prelude::*;

use super::errors::{socket_error, ChannelError};
use maitred_sys::fdpass::{send, send_with_fd};

/// The socket itself. Once a write fails the stream may hold half a frame, so every later
/// write fails too rather than send the lobby garbage.
pub(super) struct Link {
    pub(super) fd: OwnedFd,
    pub(super) broken: bool,
}

impl Link {
    /// Writes all of `bufs`. The first attempt does not wait and keeps the interpreter: the
    /// lobby reads promptly, so the socket usually has room. Waiting happens detached.
    pub(super) fn write_all(&mut self, py: Python<'_>, mut bufs: &mut [IoSlice<'_>]) -> PyResult<()> {
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
                py.detach(|| send(fd, pending, 0))
            } else {
                send(fd, bufs, libc::MSG_DONTWAIT)
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
    pub(super) fn write_with_fd(&mut self, py: Python<'_>, frame: &[u8], passed: RawFd) -> PyResult<()> {
        if self.broken {
            return Err(ChannelError::new_err("an earlier write to the lobby failed"));
        }
        let fd = self.fd.as_raw_fd();
        loop {
            match py.detach(|| send_with_fd(fd, &[IoSlice::new(frame)], passed, 0)) {
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
