//! The start: every worker of the first generation, held until all have loaded the
//! application, then the when_ready hook; the first failure ends it.

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::signals::Sig;
use super::{Event, Supervisor};
use crate::log::{debug, info};
use crate::process::hooks::{HookFailed, LobbyHook};
use crate::process::zygote::Report;
use crate::worker::scoreboard::Phase;
use crate::worker::seat::Gone;
use crate::StartupError;

/// How the start ended, when the workers did not all become ready.
pub(crate) enum BootEnd {
    Failed(StartupError),
    /// A signal asked the server to stop.
    Stopped,
}

impl Supervisor {
    /// Starts every worker and waits until all are ready, then for the when_ready hook; the
    /// first failure ends the start, and so does SIGTERM, SIGINT or SIGQUIT. Other signals wait
    /// until the server serves.
    pub(crate) async fn boot(&mut self, events: &mut mpsc::UnboundedReceiver<Event>) -> Result<(), BootEnd> {
        // Held until all are ready, so that a --max-worker-lifetime counts from when they serve.
        let settings = self.worker.settings();
        for _ in 0..self.target {
            let id = self.add_worker(self.generation, Phase::Hold);
            if let Err(e) = self.worker.zygotes.serving().control.spawn(id, self.target, &settings).await {
                // The zygote is gone; its last report (a preload failure) says why.
                debug!("cannot ask the zygote for worker {id}: {e}");
                break;
            }
        }
        let mut ready = 0;
        let deadline = Instant::now() + self.config.timeout;
        // Asked for once every worker is ready; like gunicorn's, it may take as long as it takes.
        let mut awaiting_when_ready = false;
        let failed = |message: String| Err(BootEnd::Failed(StartupError(message)));
        loop {
            if ready >= self.target && !awaiting_when_ready {
                if !self.hook_then(LobbyHook::WhenReady, Event::WhenReady) {
                    break;
                }
                awaiting_when_ready = true;
            }
            let next = async {
                if awaiting_when_ready {
                    Ok(events.recv().await)
                } else {
                    tokio::time::timeout_at(deadline, events.recv()).await
                }
            };
            let event = tokio::select! {
                event = next => event,
                sig = self.signals.next() => {
                    if matches!(sig, Sig::Terminate | Sig::Interrupt | Sig::Quit) {
                        info!("{}: stopping before the workers were ready", sig.name());
                        return Err(BootEnd::Stopped);
                    }
                    if !self.deferred.contains(&sig) {
                        self.deferred.push(sig);
                    }
                    continue;
                }
            };
            let Ok(event) = event else {
                return failed(format!(
                    "workers did not finish loading {} within --timeout ({} s)",
                    self.config.app,
                    self.config.timeout.as_secs_f64()
                ));
            };
            match event {
                Some(Event::Report(_, Report::Spawned { slot, pid, channels })) => {
                    self.start_worker(slot, pid, channels)
                }
                Some(Event::Report(_, Report::PreloadFailed(message))) => return failed(message),
                Some(Event::Report(from, Report::Exited { pid, .. })) => self.child_exited(from, pid),
                Some(Event::WhenReady(Ok(()))) => break,
                Some(Event::WhenReady(Err(HookFailed))) => {
                    return failed("the when_ready hook raised an exception (its traceback is in the error log)".into())
                }
                Some(Event::Ready { id, .. }) => {
                    if let Some(worker) = self.workers.get_mut(&id) {
                        worker.seat.card.ready.set(true);
                    }
                    ready += 1;
                }
                Some(Event::Gone { gone: Gone::BootFailed(message), .. }) => return failed(message),
                Some(Event::Gone { pid, gone, .. }) => {
                    return failed(format!("worker {pid} failed to start: {gone:?}"))
                }
                Some(Event::ZygoteGone(_, reason)) => return failed(format!("{reason} before the workers were ready")),
                // Held workers serve nothing, so none is recycled yet; no reload has begun.
                Some(
                    Event::Reread(_)
                    | Event::ReloadFailed(_)
                    | Event::Recycling { .. }
                    | Event::Reloading
                    | Event::PreExecDone,
                ) => {}
                None => return failed("the supervisor lost its event channel".into()),
            }
        }
        for worker in self.workers.values() {
            worker.seat.serve();
        }
        Ok(())
    }
}
