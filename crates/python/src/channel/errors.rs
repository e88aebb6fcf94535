//! What becomes of a failure on the channel: the exceptions the worker raises to Python, and
//! the conversions the channel's other files use to raise them.
//!
//! Imports no other file of the channel; of this crate, only `sys` (for `RecvError`).

use std::io;

use maitred_wire::WireError;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyValueError};
use pyo3::prelude::*;

use maitred_sys::fdpass::RecvError;

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
    ClientDisconnected,
    PyOSError,
    "The client of the response being sent has gone away (the lobby sent CANCEL), so the body cannot be delivered. Raised by the body write that found it out, and by every later one; errno is EPIPE, as for a write to a closed connection."
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
