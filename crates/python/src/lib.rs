//! `maitred._native`: the lobby's entry point (`serve`) and the worker's per-request path
//! (`WorkerChannel`, whose `receive` returns each request's environ and `start_response`).
//!
//! The modules import one another in one direction only: `channel` (a folder) uses `body`,
//! `environ` and `response`; `body`, `control`, `environ`, `response` and `serve` import no
//! module of this crate (the parent's `ClientDisconnected` aside). Raw system calls are `maitred_sys`'s: the one `unsafe` block here is a CPython API
//! call (`environ::latin1`), allowed where it stands.

#![deny(unsafe_code)]

use pyo3::create_exception;
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;

mod body;
mod channel;
mod control;
mod environ;
mod response;
mod scope;
mod serve;

// Shared by `channel` (a response's client gone) and `body` (a streaming body cut short).
create_exception!(
    maitred._native,
    ClientDisconnected,
    PyOSError,
    "The client has gone away: the lobby sent CANCEL, so the body of the response being sent cannot be delivered, or it stopped a request body that was streaming in. Raised by the write (or read) that found it out, and by every later one; errno is EPIPE, as for a write to a closed connection."
);

// PyO3 declares a module safe without the GIL unless told otherwise, and maitred has never
// been tested without it: on a free-threaded CPython (built from source there; the abi3 wheel
// does not install on one), importing this module turns the GIL back on, with CPython's
// RuntimeWarning, rather than run the worker's channels and the lobby's entry point unserialised.
// The abi3 build targets 3.10, whose modules have no such declaration, so the wheel is unchanged.
#[pymodule(gil_used = true)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    serve::register(m)?;
    control::register(m)?;
    m.add_class::<channel::WorkerChannel>()?;
    m.add_class::<channel::StartResponse>()?;
    m.add_class::<channel::Exchange>()?;
    m.add_class::<body::RequestBody>()?;
    m.add("ChannelError", m.py().get_type::<channel::ChannelError>())?;
    m.add("ChannelClosed", m.py().get_type::<channel::ChannelClosed>())?;
    m.add("ClientDisconnected", m.py().get_type::<ClientDisconnected>())?;
    m.add("UnsendablePath", m.py().get_type::<channel::UnsendablePath>())?;
    m.add("ASGI_VERSION", scope::ASGI_VERSION)?;
    Ok(())
}
