//! A reload (SIGHUP): the config file read again, a full new generation of workers held until
//! all are ready, then the switch; or the reload abandoned, the old workers never stopped.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{read_control, Event, Supervisor};
use crate::config::Config;
use crate::log::{self, error, info, warning};
use crate::process::hooks::LobbyHook;
use crate::process::notify;
use crate::process::zygote::Zygote;
use crate::worker::scoreboard::{ExitReason, Phase};

/// The config file read again for a SIGHUP: the lobby's new settings, and the names of the
/// settings that changed but cannot change without a new lobby (they keep their values).
pub struct Reread {
    pub config: Config,
    pub kept: Vec<String>,
}

/// Reads the config file again (the CLI's, in Python); Err is one line for the log. It runs on
/// a thread of its own, off the event loop.
pub type Rereader = Arc<dyn Fn() -> Result<Reread, String> + Send + Sync>;

/// A reload under way.
pub(super) struct Reload {
    /// The new workers' generation, once they are asked for (after the config file is read).
    pub(super) generation: Option<u64>,
    /// When the new workers must all be ready.
    pub(super) deadline: Option<Instant>,
    /// Another SIGHUP came meanwhile: a reload follows this one.
    pub(super) again: bool,
}

impl Supervisor {
    pub(super) fn is_reload_zygote(&self, pid: i32) -> bool {
        self.reload_zygote.as_ref().is_some_and(|zygote| zygote.pid == pid)
    }

    pub(super) fn pending_generation(&self) -> Option<u64> {
        self.reload.as_ref().and_then(|reload| reload.generation)
    }

    /// SIGHUP: reads the config file again if there is one, then starts a new set of workers.
    pub(super) fn begin_reload(&mut self) {
        if let Some(reload) = &mut self.reload {
            reload.again = true;
            info!("SIGHUP: a reload is under way; another follows once it is done");
            return;
        }
        notify::reloading();
        // New handshakes use the renewed certificate; open connections keep their keys.
        if let Some(certificates) = &self.client.tls {
            match certificates.reload() {
                Ok(()) => info!("SIGHUP: read the certificate in {} again", certificates.certfile().display()),
                Err(e) => error!("SIGHUP: {e}; the certificate in use stays"),
            }
        }
        self.reload = Some(Reload { generation: None, deadline: None, again: false });
        match self.rereader.clone() {
            Some(rereader) => {
                info!("SIGHUP: reloading: reading the config file again");
                let events = self.events_tx.clone();
                // The config file is Python, run by the CLI's interpreter: off the event loop.
                tokio::task::spawn_blocking(move || {
                    log::block_terminal_signals();
                    let _ = events.send(Event::Reread(Box::new(rereader())));
                });
            }
            None => self.start_generation(),
        }
    }

    pub(super) async fn on_reread(&mut self, result: Result<Reread, String>) {
        if self.reload.as_ref().is_none_or(|reload| reload.generation.is_some()) {
            return; // abandoned meanwhile
        }
        match result {
            Err(message) => {
                let reason = format!("{message}; the settings stay as they were");
                self.abandon_reload(&reason).await;
            }
            Ok(Reread { config, kept }) => {
                let old = self.target;
                self.apply(config, &kept).await;
                // As gunicorn's reload does, whether the number changed or not.
                self.hook(LobbyHook::WorkersChanged { new: self.target, old });
                if !self.hook_then(LobbyHook::OnReload, |_| Event::Reloading) {
                    self.start_generation();
                }
            }
        }
    }

    /// Takes the settings of a config file read again.
    pub(super) async fn apply(&mut self, config: Config, kept: &[String]) {
        if !kept.is_empty() {
            warning!(
                "SIGHUP: the config file changes {}, which a reload cannot change: kept as they were until an \
                 upgrade (a new lobby)",
                kept.join(", ")
            );
        }
        let old = self.worker.settings();
        if config.workers != old.workers {
            // A count set by SIGTTIN and SIGTTOU stays, unless the file sets a new one.
            self.target = config.workers;
        }
        if config.log_level != old.log_level {
            log::set_level(config.log_level);
            if let Err(e) = self.worker.zygotes.serving().control.set_log_level(config.log_level).await {
                error!("cannot tell the zygote the new log level: {e}");
            }
        }
        // Connections and workers take them from their next request on.
        self.worker.seating.configure(config.overload_policy());
        self.client.reconfigure(config.client_settings());
        self.worker.settings.set(config);
    }

    /// Asks the zygote for a full set of new workers, held until all are ready.
    pub(super) fn start_generation(&mut self) {
        let generation = self.next_generation;
        self.next_generation += 1;
        let settings = self.worker.settings();
        if let Some(reload) = &mut self.reload {
            reload.generation = Some(generation);
            reload.deadline = Some(Instant::now() + settings.timeout);
        }
        if self.config.preload {
            // The application was imported by the zygote: only a fresh one imports it anew.
            match Zygote::start(&self.succession.command, &self.succession.directory) {
                Ok(zygote) => {
                    info!(
                        "SIGHUP: reloading {} with --preload: started a new zygote (pid {})",
                        settings.app, zygote.pid
                    );
                    tokio::task::spawn_local(read_control(zygote.clone(), self.events_tx.clone()));
                    self.reload_zygote = Some(zygote);
                }
                Err(e) => {
                    // Abandoned as soon as the event is handled (this is not async).
                    let _ = self.events_tx.send(Event::ReloadFailed(format!("cannot start a new zygote: {e}")));
                    return;
                }
            }
        }
        info!(
            "SIGHUP: reloading {}: starting {} new workers; the old ones serve until all of them are ready",
            settings.app, self.target
        );
        for _ in 0..self.target {
            self.spawn(generation, Phase::Hold, Duration::ZERO);
        }
    }

    /// Once every worker of the reload is ready: they serve, and the old ones retire.
    pub(super) async fn switch_if_ready(&mut self) {
        let Some(generation) = self.pending_generation() else { return };
        let mut new: Vec<usize> =
            self.workers.iter().filter(|(_, w)| w.generation() == generation).map(|(id, _)| *id).collect();
        if !new.iter().all(|id| self.workers[id].ready()) {
            return;
        }
        new.sort();
        let old: Vec<usize> = self
            .workers
            .iter()
            .filter(|(_, w)| w.generation() != generation && w.seat.phase() != Phase::Retire)
            .map(|(id, _)| *id)
            .collect();
        let old_pids = self.pids();
        // Retired first: the offers they had not received go back to the front of the queue,
        // where the new workers find them first.
        self.retire(&old, ExitReason::Reload);
        for id in &new {
            self.workers[id].seat.serve();
        }
        if let Some(zygote) = self.reload_zygote.take() {
            // The old zygote exits once the old workers have answered what they hold.
            let old = self.worker.zygotes.replace(zygote);
            self.worker.zygotes.retire(old);
        }
        self.generation = generation;
        self.scoreboard.generation.set(generation);
        self.boot_failures = 0;
        info!(
            "SIGHUP: reloaded: {} new workers serve (pids {}); the old ones (pids {old_pids}) retire once they have \
             answered the requests they hold",
            new.len(),
            self.pids()
        );
        let again = self.reload.take().is_some_and(|reload| reload.again);
        notify::ready();
        // SIGTTIN or SIGTTOU may have come during the reload.
        self.balance(Duration::ZERO).await;
        if again {
            self.begin_reload();
        }
    }

    /// Gives up a reload under way: its workers are stopped, the old ones never stopped serving.
    pub(super) async fn abandon_reload(&mut self, reason: &str) {
        let Some(reload) = self.reload.take() else { return };
        error!("SIGHUP: reload abandoned: {reason}; the old workers keep serving");
        if !*self.worker.shutdown.borrow() {
            notify::ready();
        }
        let zygote = self.reload_zygote.take();
        if let Some(generation) = reload.generation {
            let ids: Vec<usize> =
                self.workers.iter().filter(|(_, w)| w.generation() == generation).map(|(id, _)| *id).collect();
            for id in ids {
                self.scoreboard.remove(id);
                let Some(entry) = self.workers.remove(&id) else { continue };
                // A ready one closes its channel and exits; one still loading is killed.
                entry.seat.retire();
                if !entry.ready() {
                    let pid = entry.pid();
                    if let Some(task) = entry.task {
                        task.abort();
                    }
                    if let Some(pid) = pid {
                        let control = zygote
                            .as_ref()
                            .map_or_else(|| self.worker.zygotes.serving().control, |z| z.control.clone());
                        let _ = self.worker.zygotes.kill_through(&control, pid, libc::SIGKILL).await;
                    }
                }
            }
        }
        if let Some(zygote) = zygote {
            self.worker.zygotes.retire(zygote);
        }
        if reload.again && !*self.worker.shutdown.borrow() {
            self.begin_reload();
        }
    }
}
