//! The lobby as PID 1, a container's command: the kernel gives it every orphan of its PID
//! namespace (an application's subprocess whose parent exited, a double fork, a worker's
//! children once the worker is gone), and only it can reap them. Outside PID 1 an init above
//! maitred reaps orphans, and the lobby reaps nothing but its own children, each by its pid.

use tokio::signal::unix::{signal, SignalKind};

use crate::log::{debug, warning};

/// As PID 1, reaps every child that exits, for as long as the lobby runs; elsewhere nothing.
/// The zygotes' and a new maitred's statuses are kept for the code that waits for each of
/// them (maitred_sys::process::waited_for).
pub(crate) fn reap_if_init() {
    if !maitred_sys::process::is_init() {
        return;
    }
    let mut exits = match signal(SignalKind::child()) {
        Ok(exits) => exits,
        Err(e) => {
            warning!("maitred is PID 1 but cannot handle SIGCHLD ({e}): orphans it adopts stay zombies");
            return;
        }
    };
    debug!("maitred is PID 1: it reaps every orphan it adopts");
    tokio::task::spawn_local(async move {
        // Children that exited before the handler was installed are reaped by the first pass.
        loop {
            let reaped = maitred_sys::process::reap_any();
            if reaped > 0 {
                debug!("reaped {reaped} adopted processes");
            }
            if exits.recv().await.is_none() {
                return;
            }
        }
    });
}
