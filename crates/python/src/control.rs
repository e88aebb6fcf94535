//! The zygote's side of its control channel to the lobby, in the words crates/wire's `zygote`
//! spells for both sides: the orders python/maitred/zygote.py reads, as tuples it can match,
//! and the reports it sends, as the bytes of one message each.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use maitred_wire::zygote::{Exit, Order, Report};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

/// One order from the lobby: `("spawn", slot, workers, threads)`, `("kill", pid, signal)`,
/// `("reopen",)` or `("level", name)`. ValueError, saying what came, for anything else.
#[pyfunction]
fn zygote_order<'py>(py: Python<'py>, message: &[u8]) -> PyResult<Bound<'py, PyTuple>> {
    match Order::decode(message).map_err(|malformed| PyValueError::new_err(malformed.to_string()))? {
        Order::Spawn { slot, workers, threads } => ("spawn", slot, workers, threads).into_pyobject(py),
        Order::Kill { pid, signal } => ("kill", pid, signal).into_pyobject(py),
        Order::Reopen => ("reopen",).into_pyobject(py),
        Order::Level(name) => ("level", name).into_pyobject(py),
    }
}

/// `spawned`: the worker for `slot` is `pid` (its channels go with the message).
#[pyfunction]
fn report_spawned(slot: usize, pid: i32) -> Vec<u8> {
    Report::Spawned { slot, pid }.encode().into_bytes()
}

/// `exited`: worker `pid` has, with `wait_status` as os.waitpid gave it.
#[pyfunction]
fn report_exited(pid: i32, wait_status: i32) -> Vec<u8> {
    let status = ExitStatus::from_raw(wait_status);
    let how = match status.signal() {
        Some(signal) => Exit::Signal(signal),
        None => Exit::Code(status.code().unwrap_or_default()),
    };
    Report::Exited { pid, how }.encode().into_bytes()
}

/// `failed`: the zygote cannot make workers, and says why before it exits.
#[pyfunction]
fn report_failed(why: &str) -> Vec<u8> {
    Report::Failed(why.to_owned()).encode().into_bytes()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(zygote_order, m)?)?;
    m.add_function(wrap_pyfunction!(report_spawned, m)?)?;
    m.add_function(wrap_pyfunction!(report_exited, m)?)?;
    m.add_function(wrap_pyfunction!(report_failed, m)?)?;
    Ok(())
}
