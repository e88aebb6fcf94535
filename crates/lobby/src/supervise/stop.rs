//! The end: how serving stopped, the drain (requests finish within --graceful-timeout while
//! lost workers are still replaced), stopping the workers, and reaping the zygote.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};

use super::signals::Sig;
use super::{Event, Supervisor};
use crate::log::{error, info, warning};
use crate::process::zygote::{self, Zygotes};

/// How long the zygote gets to exit once its control channel is closed.
const ZYGOTE_EXIT_WAIT: Duration = Duration::from_secs(5);

/// How long the streams ended at a stop's --graceful-timeout have to finish (the last bytes
/// written, WebSockets' closing handshakes) before their workers are stopped.
const STREAMS_END_WAIT: Duration = Duration::from_secs(2);

/// During a shutdown, how often the supervisor looks whether requests wait in the queue with
/// fewer workers than it should have (one was lost, and was not replaced while none waited).
const DRAIN_CHECK: Duration = Duration::from_millis(100);

/// Closes the control channel (the zygote then exits once its workers have) and reaps it,
/// and any zygote a reload retired. If one is stuck, it and the workers it was asked to stop
/// are killed, so that nothing outlives the server.
pub(crate) async fn close_control_and_reap(zygotes: Rc<Zygotes>, workers: &[i32]) {
    // Tasks not yet dropped may still hold the zygotes, so shut the socket rather than wait
    // for the last reference to close it.
    let serving = zygotes.serving();
    serving.control.close();
    let mut left = zygotes.retired();
    left.push(serving.pid);
    drop(zygotes);
    let deadline = tokio::time::Instant::now() + ZYGOTE_EXIT_WAIT;
    loop {
        left.retain(|pid| !zygote::reaped(*pid));
        if left.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            for &zygote in &left {
                warning!("the zygote {zygote} did not exit; killing it and its workers");
                // The workers the zygote was told to stop are not reaped yet: it has not exited.
                let _ = maitred_sys::process::kill(zygote, libc::SIGKILL);
                for &pid in workers {
                    let _ = maitred_sys::process::kill(pid, libc::SIGKILL);
                }
                maitred_sys::process::wait(zygote);
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// How often a shutdown looks whether every connection has closed.
const CLOSED_CHECK: Duration = Duration::from_millis(10);

/// Once every place under --max-connections is free: every connection closed, and every
/// temporary file of a request body gone. It looks rather than acquires: a waiter for the
/// permits would be handed each one released before anyone else, and a connection the drain
/// lets finish could no longer take one for a body it must spill (a 1 MiB upload got 503 during
/// every drain).
async fn all_places_free(connections: &Semaphore, max_connections: usize) {
    let mut checks = tokio::time::interval(CLOSED_CHECK);
    while connections.available_permits() < max_connections {
        checks.tick().await;
    }
}

impl Supervisor {
    /// Waits until every connection has closed or `deadline` passes, still replacing lost
    /// workers while requests wait in the queue. Returns whether everything finished; SIGQUIT
    /// ends the wait at once.
    pub(crate) async fn drain(
        &mut self,
        events: &mut mpsc::UnboundedReceiver<Event>,
        connections: &Arc<Semaphore>,
        max_connections: usize,
        deadline: Duration,
    ) -> bool {
        self.abandon_reload("a shutdown began").await;
        if let Some(mut candidate) = self.candidate.take() {
            info!("stopping the new maitred (pid {}) that SIGUSR2 started: a shutdown began", candidate.pid());
            candidate.stop().await;
        }
        let all_closed = all_places_free(connections, max_connections);
        tokio::pin!(all_closed);
        let timer = tokio::time::sleep(deadline);
        tokio::pin!(timer);
        let mut checks = tokio::time::interval(DRAIN_CHECK);
        loop {
            tokio::select! {
                biased;
                _ = &mut all_closed => return true,
                _ = &mut timer => {
                    // Connections left idle are no request unfinished: those a new maitred could
                    // not take (TLS, PROXY protocol), or whose client has not sent a first one.
                    if self.client.connection_states.busy() == 0 {
                        let idle = max_connections - connections.available_permits();
                        info!("--graceful-timeout passed; closing the {idle} connections left, all idle");
                        return true;
                    }
                    if (self.worker.streams.open() > 0 || self.worker.websockets.open() > 0)
                        && self.end_streams(&mut all_closed).await
                    {
                        return true;
                    }
                    warning!("--graceful-timeout passed with requests unfinished; stopping their workers");
                    return false;
                }
                sig = self.signals.next() => match sig {
                    Sig::Quit => {
                        info!("SIGQUIT: stopping at once, during the graceful shutdown");
                        self.quit_workers().await;
                        return false;
                    }
                    Sig::User1 => self.reopen_logs().await,
                    other => info!("{}: ignored during the shutdown", other.name()),
                },
                event = events.recv() => match event {
                    Some(event) => {
                        if let Err(reason) = self.handle(event).await {
                            error!("{reason}");
                            return false;
                        }
                    }
                    None => return false,
                },
                _ = checks.tick() => self.balance(Duration::ZERO).await,
            }
        }
    }

    /// Ends the streams still open, each cleanly for its client (an HTTP/1.1 answer's chunked
    /// terminator, an HTTP/2 stream's END_STREAM, a WebSocket's Close 1001), and gives their
    /// connections up to `STREAMS_END_WAIT` to close (docs/SIGNALS.md). True: every connection
    /// closed, so nothing was left unfinished.
    async fn end_streams(&self, all_closed: &mut (impl std::future::Future + Unpin)) -> bool {
        let (streams, websockets) = (&self.worker.streams, &self.worker.websockets);
        info!(
            "--graceful-timeout passed with {} streams and {} WebSockets open; ending the streams and closing the \
             WebSockets (1001)",
            streams.open(),
            websockets.open()
        );
        streams.end_all();
        websockets.go_away();
        tokio::time::timeout(STREAMS_END_WAIT, all_closed).await.is_ok()
    }

    /// Closes every worker's channel, so each exits once it has nothing to do; with `kill`,
    /// workers still busy are killed first.
    /// Returns the pids of the workers stopped.
    pub(crate) async fn stop_workers(&mut self, kill: bool) -> Vec<i32> {
        let mut pids = Vec::new();
        self.scoreboard.clear();
        for (_, worker) in self.workers.drain() {
            let Some(pid) = worker.pid() else { continue };
            if kill {
                let _ = self.worker.zygotes.kill(pid, libc::SIGKILL).await;
            }
            if let Some(task) = worker.task {
                task.abort();
            }
            pids.push(pid);
        }
        pids
    }
}
