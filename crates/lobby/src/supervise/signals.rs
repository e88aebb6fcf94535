//! The signals the lobby acts on while it serves (docs/SIGNALS.md), except SIGHUP (`reload.rs`)
//! and the stop itself (`stop.rs`): SIGTTIN and SIGTTOU change the number of workers, SIGUSR1
//! reopens the logs, SIGUSR2 starts a binary upgrade (`mod.rs`), SIGQUIT stops at once.

use std::future::poll_fn;
use std::task::Poll;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::time::Instant;

use super::workers::WorkerEntry;
use super::{Stop, Supervisor};
use crate::log::{self, error, info};
use crate::process::hooks::LobbyHook;
use crate::worker::health;
use crate::StartupError;

/// With the worker_int hook, how long workers sent SIGQUIT have to run it and exit before the
/// lobby stops them itself.
const QUIT_GRACE: Duration = Duration::from_secs(1);
const QUIT_POLL: Duration = Duration::from_millis(10);

/// The signals the lobby acts on. SIGWINCH is not among them: its default action is to be
/// ignored, which is what maitred wants (docs/SIGNALS.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sig {
    Terminate,
    Interrupt,
    Quit,
    Hangup,
    User1,
    User2,
    MoreWorkers,
    FewerWorkers,
}

impl Sig {
    pub(super) fn name(self) -> &'static str {
        match self {
            Sig::Terminate => "SIGTERM",
            Sig::Interrupt => "SIGINT",
            Sig::Quit => "SIGQUIT",
            Sig::Hangup => "SIGHUP",
            Sig::User1 => "SIGUSR1",
            Sig::User2 => "SIGUSR2",
            Sig::MoreWorkers => "SIGTTIN",
            Sig::FewerWorkers => "SIGTTOU",
        }
    }
}

/// The lobby's handlers for every signal it acts on, installed before anything else so that
/// none of them can end the process by its default action.
pub(crate) struct Signals {
    streams: Vec<(Sig, Signal)>,
}

impl Signals {
    pub(crate) fn install() -> Result<Signals, StartupError> {
        let kinds = [
            (Sig::Terminate, SignalKind::terminate()),
            (Sig::Interrupt, SignalKind::interrupt()),
            (Sig::Quit, SignalKind::quit()),
            (Sig::Hangup, SignalKind::hangup()),
            (Sig::User1, SignalKind::user_defined1()),
            (Sig::User2, SignalKind::user_defined2()),
            (Sig::MoreWorkers, SignalKind::from_raw(libc::SIGTTIN)),
            (Sig::FewerWorkers, SignalKind::from_raw(libc::SIGTTOU)),
        ];
        let streams = kinds
            .into_iter()
            .map(|(sig, kind)| {
                signal(kind)
                    .map(|stream| (sig, stream))
                    .map_err(|e| StartupError(format!("cannot handle {}: {e}", sig.name())))
            })
            .collect::<Result<_, _>>()?;
        Ok(Signals { streams })
    }

    /// The next signal received (one of several of the same kind in a row).
    pub(super) async fn next(&mut self) -> Sig {
        poll_fn(|cx| {
            for (sig, stream) in &mut self.streams {
                if let Poll::Ready(Some(())) = stream.poll_recv(cx) {
                    return Poll::Ready(*sig);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// `1 worker`, `3 workers`
fn workers(count: usize) -> String {
    if count == 1 {
        "1 worker".into()
    } else {
        format!("{count} workers")
    }
}

impl Supervisor {
    /// Acts on a signal while serving; Some when it asks the server to stop.
    pub(super) async fn on_signal(&mut self, sig: Sig) -> Option<Stop> {
        match sig {
            Sig::Terminate | Sig::Interrupt => {
                info!("{}: graceful shutdown", sig.name());
                return Some(Stop::Graceful);
            }
            Sig::Quit => {
                info!("SIGQUIT: immediate shutdown");
                self.quit_workers().await;
                return Some(Stop::Immediate);
            }
            Sig::Hangup => self.begin_reload(),
            Sig::User1 => self.reopen_logs().await,
            Sig::User2 => self.begin_upgrade(),
            Sig::MoreWorkers => {
                self.target += 1;
                info!("SIGTTIN: {} (one more)", workers(self.target));
                self.hook(LobbyHook::WorkersChanged { new: self.target, old: self.target - 1 });
                self.balance(Duration::ZERO).await;
            }
            Sig::FewerWorkers if self.target == 1 => {
                info!("SIGTTOU: already at one worker, the fewest; ignored");
            }
            Sig::FewerWorkers => {
                self.target -= 1;
                info!("SIGTTOU: {} (one fewer)", workers(self.target));
                self.hook(LobbyHook::WorkersChanged { new: self.target, old: self.target + 1 });
                self.balance(Duration::ZERO).await;
            }
        }
        None
    }

    /// SIGQUIT with the worker_int hook set: as gunicorn's master does, every worker gets
    /// SIGQUIT, runs the hook and exits; those still there after `QUIT_GRACE` are killed with
    /// the rest when the workers are stopped.
    pub(super) async fn quit_workers(&self) {
        if !self.interrupt_workers {
            return;
        }
        let mut left = Vec::new();
        for pid in self.workers.values().filter_map(WorkerEntry::pid) {
            left.push(health::ProcStat::open(pid));
            if let Err(e) = self.worker.zygotes.kill(pid, libc::SIGQUIT).await {
                error!("could not ask the zygote to pass SIGQUIT to worker {pid}: {e}");
            }
        }
        let deadline = Instant::now() + QUIT_GRACE;
        while left.iter().any(health::ProcStat::is_alive) && Instant::now() < deadline {
            tokio::time::sleep(QUIT_POLL).await;
        }
    }

    /// SIGUSR1: the lobby reopens its logs, and asks the zygote to reopen its own and the
    /// workers' (logrotate without copytruncate: the files were renamed, new ones take their
    /// paths).
    pub(super) async fn reopen_logs(&self) {
        let mut reopened = Vec::new();
        if let Some(path) = &self.config.error_logfile {
            log::reopen_error_log(path);
            reopened.push(format!("the error log {path}"));
        }
        if let Some(path) = log::reopen_access_log() {
            reopened.push(format!("the access log {path}"));
        }
        if let Err(e) = self.worker.zygotes.serving().control.reopen_logs().await {
            error!("SIGUSR1: cannot ask the zygote to reopen its log: {e}");
        }
        if reopened.is_empty() {
            info!("SIGUSR1: no log file to reopen (the logs go to standard streams)");
        } else {
            info!("SIGUSR1: reopened {}; the zygote and the workers reopen theirs", reopened.join(" and "));
        }
    }
}
