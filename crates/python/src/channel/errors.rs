//! What becomes of a failure on the channel: the exceptions the worker raises to Python, the
//! conversions the channel's other files use to raise them, and the one line a failure is told
//! to the lobby in.
//!
//! Imports no other file of the channel; of this crate, only `sys` (for `RecvError`) and the
//! crate's `ClientDisconnected`, which `body` raises too.

use std::io;

use maitred_wire::WireError;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyValueError};
use pyo3::prelude::*;

use maitred_sys::fdpass::RecvError;

use crate::ClientDisconnected;

create_exception!(
    maitred._native,
    ChannelError,
    PyException,
    "The channel to the lobby failed: a write failed, the lobby closed it inside a frame, or a frame broke the protocol. The worker cannot go on."
);

create_exception!(
    maitred._native,
    ChannelClosed,
    ChannelError,
    "The lobby closed its end of the channel while the worker was writing: it has retired this worker or gone away."
);

create_exception!(
    maitred._native,
    UnsendablePath,
    PyOSError,
    "The path of an http.response.pathsend cannot be sent: it cannot be opened, or it is not a regular file. The message names the path and why; the answer is a 500."
);

pub(super) fn client_disconnected() -> PyErr {
    ClientDisconnected::new_err((libc::EPIPE, "the client has gone away"))
}

pub(super) fn channel_error(what: &str, error: impl std::fmt::Display) -> PyErr {
    ChannelError::new_err(format!("{what}: {error}"))
}

/// A failed socket call: `ChannelClosed` when the lobby has let go of the channel.
pub(super) fn socket_error(what: &str, error: io::Error) -> PyErr {
    match error.kind() {
        io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
            ChannelClosed::new_err(format!("{what}: {error}"))
        }
        _ => channel_error(what, error),
    }
}

pub(super) fn recv_error(error: RecvError) -> PyErr {
    match error {
        RecvError::Os(error) => socket_error("reading from the lobby failed", error),
        RecvError::DescriptorsTruncated => {
            ChannelError::new_err("more file descriptors arrived than a frame can carry")
        }
    }
}

pub(super) fn wire_error(error: WireError) -> PyErr {
    PyValueError::new_err(error.to_string())
}

/// A message for `BOOT_FAILED` or `RESPONSE_ABORT` is one line of at most this many bytes.
const MAX_MESSAGE: usize = 4096;

/// `message` on one line, cut (at a character boundary) to `MAX_MESSAGE` bytes.
pub(super) fn one_line(message: &str) -> String {
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
