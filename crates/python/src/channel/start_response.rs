//! PEP 3333's `start_response` and `write()` of one request of the channel: they check the
//! status and headers at once, and refuse a call for a request that has ended.

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;

use super::WorkerChannel;
use crate::response::{bytes_arg, HeaderText, Phase};

impl WorkerChannel {
    fn check_generation(&self, generation: u64) -> PyResult<()> {
        if generation != self.generation {
            return Err(PyRuntimeError::new_err("start_response() or write() of a finished request was called"));
        }
        Ok(())
    }
}

/// The `start_response` of one request (PEP 3333). Calling it checks the status and headers
/// at once, so a bad header fails inside the application, where its traceback is useful.
#[pyclass(module = "maitred._native")]
pub struct StartResponse {
    pub(super) channel: Py<WorkerChannel>,
    pub(super) generation: u64,
}

#[pymethods]
impl StartResponse {
    #[pyo3(signature = (status, headers, exc_info = None))]
    fn __call__<'py>(
        slf: &Bound<'py, Self>,
        status: &Bound<'py, PyAny>,
        headers: &Bound<'py, PyAny>,
        exc_info: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        {
            let me = slf.borrow();
            let mut channel = me.channel.bind(py).borrow_mut();
            channel.check_generation(me.generation)?;
            match exc_info.filter(|info| !info.is_none()) {
                // The head is out: the application's error cannot become a new status, so it
                // propagates (PEP 3333, "The start_response() Callable").
                Some(info) if channel.response.head_sent() => {
                    let error = info.get_item(1)?;
                    let traceback = info.get_item(2)?;
                    let error =
                        if traceback.is_none() { error } else { error.call_method1("with_traceback", (traceback,))? };
                    return Err(PyErr::from_value(error));
                }
                Some(_) => {}
                None if channel.response.phase != Phase::AwaitingStart => {
                    return Err(PyRuntimeError::new_err(
                        "start_response() was called twice; a second call must pass exc_info",
                    ));
                }
                None => {}
            }
            channel.response.start(status, headers, HeaderText::Str)?;
            channel.response.say_hop_by_hop_dropped(py, &channel.method, &channel.target)?;
        }
        slf.getattr(intern!(py, "write"))
    }

    /// PEP 3333's `write()`: sends `data` (and the head, the first time) before returning.
    /// Raises `ClientDisconnected` (an `OSError`) once the client has gone away.
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut channel = self.channel.bind(py).borrow_mut();
        channel.check_generation(self.generation)?;
        if channel.response.phase == Phase::AwaitingStart {
            return Err(PyRuntimeError::new_err("write() was called before start_response()"));
        }
        channel.send_chunk(py, bytes_arg(data)?, false, true)
    }
}
