//! The worker supervisor: starts the workers through the zygote, replaces those that are lost,
//! answers the signals, and stops the workers at the end.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;

use crate::log::{debug, error, info, warning};
use crate::worker::{self, Channel, Gone};
use crate::zygote::Report;
use crate::{Config, Lobby, StartupError};

/// How long the zygote gets to exit once its control channel is closed.
const ZYGOTE_EXIT_WAIT: Duration = Duration::from_secs(5);
/// First pause before re-spawning a worker whose application failed to load, doubled each time.
const REBOOT_BACKOFF: Duration = Duration::from_millis(500);
const MAX_REBOOT_BACKOFF: Duration = Duration::from_secs(30);

/// What the supervisor hears from the worker tasks and the zygote.
pub(crate) enum Event {
    Report(Report),
    ZygoteGone(String),
    Ready { slot: usize, pid: i32 },
    Gone { slot: usize, pid: i32, gone: Gone },
}

pub(crate) async fn read_control(lobby: Rc<Lobby>, events: mpsc::UnboundedSender<Event>) {
    loop {
        let event = match lobby.control.receive().await {
            Ok(Some(report)) => Event::Report(report),
            Ok(None) => Event::ZygoteGone("the zygote exited".into()),
            Err(e) => Event::ZygoteGone(format!("the control channel failed: {e}")),
        };
        let last = matches!(event, Event::ZygoteGone(_));
        if events.send(event).is_err() || last {
            return;
        }
    }
}

/// The running workers, by slot.
pub(crate) struct WorkerEntry {
    pid: i32,
    task: JoinHandle<()>,
}

pub(crate) struct Supervisor {
    pub(crate) lobby: Rc<Lobby>,
    pub(crate) events_tx: mpsc::UnboundedSender<Event>,
    pub(crate) workers: HashMap<usize, WorkerEntry>,
    /// Consecutive application load failures since the last worker became ready.
    pub(crate) boot_failures: u32,
}

impl Supervisor {
    pub(crate) fn pids(&self) -> String {
        let mut pids: Vec<i32> = self.workers.values().map(|w| w.pid).collect();
        pids.sort();
        pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
    }

    /// Starts every worker and waits until all are ready; the first failure ends the start.
    pub(crate) async fn boot(&mut self, events: &mut mpsc::UnboundedReceiver<Event>) -> Result<(), StartupError> {
        for slot in 0..self.lobby.config.workers {
            if let Err(e) = self.lobby.control.spawn(slot).await {
                // The zygote is gone; its last report (a preload failure) says why.
                debug!("cannot ask the zygote for worker {slot}: {e}");
                break;
            }
        }
        let mut ready = 0;
        let deadline = tokio::time::Instant::now() + self.lobby.config.timeout;
        while ready < self.lobby.config.workers {
            let event = tokio::time::timeout_at(deadline, events.recv()).await.map_err(|_| {
                StartupError(format!(
                    "workers did not finish loading {} within --timeout ({} s)",
                    self.lobby.config.app,
                    self.lobby.config.timeout.as_secs_f64()
                ))
            })?;
            match event {
                Some(Event::Report(Report::Spawned { slot, pid, channel })) => self.start_worker(slot, pid, channel),
                Some(Event::Report(Report::PreloadFailed(message))) => return Err(StartupError(message)),
                Some(Event::Report(Report::Exited { .. })) => {}
                Some(Event::Ready { .. }) => ready += 1,
                Some(Event::Gone { gone: Gone::BootFailed(message), .. }) => return Err(StartupError(message)),
                Some(Event::Gone { pid, gone, .. }) => {
                    return Err(StartupError(format!("worker {pid} failed to start: {gone:?}")))
                }
                Some(Event::ZygoteGone(reason)) => {
                    return Err(StartupError(format!("{reason} before the workers were ready")))
                }
                None => return Err(StartupError("the supervisor lost its event channel".into())),
            }
        }
        Ok(())
    }

    fn start_worker(&mut self, slot: usize, pid: i32, channel: OwnedFd) {
        let lobby = self.lobby.clone();
        let events = self.events_tx.clone();
        let retire_after = retire_after(&lobby.config);
        let task = tokio::task::spawn_local(async move {
            let gone = match Channel::new(channel) {
                Err(e) => Gone::Lost(format!("unusable channel: {e}")),
                Ok(mut channel) => match worker::await_ready(&mut channel).await {
                    Err(gone) => gone,
                    Ok(()) => {
                        let _ = events.send(Event::Ready { slot, pid });
                        worker::serve(lobby, pid, channel, retire_after).await
                    }
                },
            };
            let _ = events.send(Event::Gone { slot, pid, gone });
        });
        if let Some(old) = self.workers.insert(slot, WorkerEntry { pid, task }) {
            old.task.abort();
        }
    }

    /// Serves until a signal asks to stop. Ok(graceful?) for a signal, Err for a fatal loss.
    pub(crate) async fn run(&mut self, events: &mut mpsc::UnboundedReceiver<Event>) -> Result<bool, String> {
        let mut terminate = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
        let mut interrupt = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
        let mut quit = signal(SignalKind::quit()).map_err(|e| e.to_string())?;
        loop {
            tokio::select! {
                _ = terminate.recv() => { info!("SIGTERM: graceful shutdown"); return Ok(true) }
                _ = interrupt.recv() => { info!("SIGINT: graceful shutdown"); return Ok(true) }
                _ = quit.recv() => { info!("SIGQUIT: immediate shutdown"); return Ok(false) }
                event = events.recv() => match event {
                    Some(event) => self.handle(event).await?,
                    None => return Err("the supervisor lost its event channel".into()),
                }
            }
        }
    }

    /// Waits until every connection has closed or `deadline` passes, still replacing lost
    /// workers so that queued requests get served. Returns whether everything finished.
    pub(crate) async fn drain(
        &mut self,
        events: &mut mpsc::UnboundedReceiver<Event>,
        connections: &Arc<Semaphore>,
        max_connections: usize,
        deadline: Duration,
    ) -> bool {
        let all_closed = connections.acquire_many(max_connections as u32);
        tokio::pin!(all_closed);
        let timer = tokio::time::sleep(deadline);
        tokio::pin!(timer);
        loop {
            tokio::select! {
                biased;
                _ = &mut all_closed => return true,
                _ = &mut timer => return false,
                event = events.recv() => match event {
                    Some(event) => {
                        if let Err(reason) = self.handle(event).await {
                            error!("{reason}");
                            return false;
                        }
                    }
                    None => return false,
                }
            }
        }
    }

    async fn handle(&mut self, event: Event) -> Result<(), String> {
        match event {
            Event::Report(Report::Spawned { slot, pid, channel }) => {
                info!("booting worker {pid} (slot {slot})");
                self.start_worker(slot, pid, channel);
            }
            Event::Report(Report::Exited { pid, how }) => info!("worker {pid} exited ({how})"),
            Event::Report(Report::PreloadFailed(message)) => return Err(format!("the zygote failed: {message}")),
            Event::ZygoteGone(reason) => return Err(format!("{reason}; no worker can be replaced")),
            Event::Ready { slot, pid } => {
                debug!("worker {pid} (slot {slot}) is ready");
                self.boot_failures = 0;
            }
            Event::Gone { slot, pid, gone } => {
                if self.workers.get(&slot).is_some_and(|w| w.pid == pid) {
                    self.workers.remove(&slot);
                }
                let pause = match gone {
                    Gone::Retired => {
                        info!("worker {pid} retired after --max-requests; starting a replacement");
                        Duration::ZERO
                    }
                    Gone::Lost(reason) => {
                        error!("worker {pid} lost: {reason}; starting a replacement");
                        Duration::ZERO
                    }
                    Gone::BootFailed(message) => {
                        self.boot_failures += 1;
                        let pause =
                            REBOOT_BACKOFF.saturating_mul(1 << self.boot_failures.min(8)).min(MAX_REBOOT_BACKOFF);
                        error!(
                            "a new worker could not load the application: {message}; retrying in {} s",
                            pause.as_secs_f64()
                        );
                        pause
                    }
                };
                if !*self.lobby.shutdown.borrow() {
                    self.respawn(slot, pause);
                }
            }
        }
        Ok(())
    }

    fn respawn(&self, slot: usize, pause: Duration) {
        let lobby = self.lobby.clone();
        tokio::task::spawn_local(async move {
            tokio::time::sleep(pause).await;
            if let Err(e) = lobby.control.spawn(slot).await {
                error!("cannot ask the zygote for a worker: {e}");
            }
        });
    }

    /// Closes every worker's channel, so each exits once it has nothing to do; with `kill`,
    /// workers still busy are killed first.
    /// Returns the pids of the workers stopped.
    pub(crate) async fn stop_workers(&mut self, kill: bool) -> Vec<i32> {
        let mut pids = Vec::new();
        for (_, worker) in self.workers.drain() {
            if kill {
                let _ = self.lobby.control.kill(worker.pid, libc::SIGKILL).await;
            }
            worker.task.abort();
            pids.push(worker.pid);
        }
        pids
    }
}

/// A worker's request budget under `--max-requests` and `--max-requests-jitter`.
fn retire_after(config: &Config) -> Option<u64> {
    if config.max_requests == 0 {
        return None;
    }
    let jitter = match config.max_requests_jitter {
        0 => 0,
        spread => std::collections::hash_map::RandomState::new().build_hasher().finish() % (spread + 1),
    };
    Some(config.max_requests + jitter)
}

/// Closes the control channel (the zygote then exits once its workers have) and reaps it.
/// If the zygote is stuck, it and the workers it was asked to stop are killed, so that
/// nothing outlives the server.
pub(crate) async fn close_control_and_reap(lobby: Rc<Lobby>, zygote_pid: i32, workers: &[i32]) {
    // Tasks not yet dropped may still hold the Lobby, so shut the socket rather than wait
    // for the last reference to close it.
    lobby.control.close();
    drop(lobby);
    let deadline = tokio::time::Instant::now() + ZYGOTE_EXIT_WAIT;
    loop {
        let mut status = 0;
        let reaped = unsafe { libc::waitpid(zygote_pid, &mut status, libc::WNOHANG) };
        if reaped != 0 {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            warning!("the zygote {zygote_pid} did not exit; killing it and its workers");
            unsafe {
                libc::kill(zygote_pid, libc::SIGKILL);
                for &pid in workers {
                    libc::kill(pid, libc::SIGKILL);
                }
                libc::waitpid(zygote_pid, &mut status, 0);
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
