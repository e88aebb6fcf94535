//! An answer that ends with a file the lobby sends itself, with sendfile(2): WSGI's
//! `wsgi.file_wrapper` (a descriptor the application opened) and ASGI's `http.response.pathsend`
//! (a path the worker opens). Either way the body is one `RESPONSE_FILE` frame that passes the
//! descriptor with an offset and a count (docs/PROTOCOL.md, section 2), and none of its bytes
//! cross the worker.
//!
//! Imports the type from `mod.rs`, `errors`, and `ring` (how a frame with a descriptor travels)
//! of the channel's files; `response` of this crate.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use maitred_wire::{FileRange, FrameHeader, Kind, FLAG_END, FLAG_FD, HEADER_LEN};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use super::errors::{client_disconnected, one_line, wire_error, UnsendablePath};
use super::ring::Aside;
use super::WorkerChannel;
use crate::response::Phase;

impl WorkerChannel {
    /// Ends the response with the bytes of the open file `fd` from `offset`, of which
    /// `available` remain. The count is the application's Content-Length (less what it sent
    /// already), or all that remains, which then becomes the answer's Content-Length.
    pub(super) fn send_file_range(&mut self, py: Python<'_>, fd: RawFd, offset: u64, available: u64) -> PyResult<()> {
        // A bad descriptor must fail here, as the application's error, not in sendmsg, where
        // it would look like the channel's.
        maitred_sys::fd::check_open(fd)?;
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
            self.send_answer(py, &[&frame], Aside::Passing(fd))?;
        }
        self.response.add_produced(count);
        self.response.phase = Phase::Complete;
        Ok(())
    }

    /// ASGI's `http.response.pathsend`: ends the response with the whole regular file at `path`.
    /// The descriptor is closed on return: the lobby holds its own copy, passed with the frame.
    pub(super) fn send_whole_file(&mut self, py: Python<'_>, path: &Path) -> PyResult<()> {
        match self.response.phase {
            // As a body before its head is (`send`), the application's error; checked before
            // the path is opened, so that the error says what is wrong.
            Phase::AwaitingStart => {
                Err(PyRuntimeError::new_err("http.response.pathsend was sent before http.response.start"))
            }
            Phase::Complete => {
                Err(PyRuntimeError::new_err("http.response.pathsend was sent after the response was complete"))
            }
            Phase::Cancelled => Err(client_disconnected()),
            Phase::HeadPending | Phase::HeadSent => {
                let (file, size) = open_regular_file(path)?;
                self.send_file_range(py, file.as_raw_fd(), 0, size)
            }
        }
    }
}

/// `path` opened for reading, with its size, when it is a regular file; `UnsendablePath` saying
/// why not otherwise.
fn open_regular_file(path: &Path) -> PyResult<(File, u64)> {
    // One line for the log, whatever the path holds (a client's %0A, decoded by a framework).
    let unsendable = |why: String| UnsendablePath::new_err(one_line(&format!("{}: {why}", path.display())));
    // O_NONBLOCK: opening a FIFO for reading would wait for a writer, and the event loop with
    // it; the reads of a regular file, the lobby's sendfile(2) among them, ignore the flag.
    // std opens with O_CLOEXEC: programs the application runs do not inherit the file.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|error| unsendable(format!("cannot be opened: {error}")))?;
    let metadata = file.metadata().map_err(|error| unsendable(format!("fstat failed: {error}")))?;
    let kind = metadata.file_type();
    if kind.is_file() {
        return Ok((file, metadata.len()));
    }
    let what = if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else {
        "of an unknown type"
    };
    Err(unsendable(format!("is {what}, not a regular file")))
}
