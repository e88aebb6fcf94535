//! The worker supervisor: starts the workers through the zygote, replaces those that are lost,
//! answers the signals (docs/SIGNALS.md), and stops the workers at the end.
//!
//! Workers are numbered by the lobby (the `SLOT` of the zygote's `spawn`, never reused) and
//! belong to a generation: the set that serves, or the set a reload (SIGHUP) is starting. A
//! reload's workers are held, ready but seated at nothing, until the whole set has loaded the
//! application; then in one step they serve and the old ones retire, each after the requests it
//! holds. If one of them fails, the reload is abandoned and the old set never stopped serving.
//!
//! Here: the supervisor's state, its event loop and the events it hears. Its other work is
//! spread over files by concern, each an `impl Supervisor`: `boot.rs` (the start), `workers.rs`
//! (starting, replacing, retiring and recycling workers), `reload.rs` (SIGHUP), `signals.rs`
//! (every other signal), `stop.rs` (the drain and the end); `oom.rs` is what the memory cgroup says of a lost worker.
//! The zygote that forks the workers, and its control channel, are the process's
//! (`process/zygote.rs`).
//!
//! It may import the workers (`worker`), the process's own life (`process`: upgrade, hooks,
//! notify, the zygotes), the logs, the settings and the connections' context (a reload gives
//! them new settings and reads their certificate again; the drain waits for those busy);
//! never the connections' own code.

pub(crate) mod boot;
mod oom;
mod reload;
pub(crate) mod signals;
pub(crate) mod stop;
mod workers;

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::client::context::Context as Connections;
use crate::config::Config;
use crate::log::{debug, error, info};
use crate::process::hooks::{HookFailed, HookThread, LobbyHook};
use crate::process::upgrade::handover::{Candidate, Successor};
use crate::process::upgrade::Succession;
use crate::process::zygote::{Report, Zygote};
use crate::worker::context::Context as Workers;
use crate::worker::scoreboard::{Card, ExitReason, Phase, Scoreboard};
use crate::worker::seat::Gone;
use oom::OomWatch;
use reload::Reload;
pub use reload::{Reread, Rereader};
use signals::{Sig, Signals};
use workers::WorkerEntry;

/// How serving ended.
pub(crate) enum Stop {
    /// SIGTERM, SIGINT, or a fatal error: requests under way are finished.
    Graceful,
    /// SIGQUIT: workers are stopped at once.
    Immediate,
    /// SIGUSR2: a new maitred serves; this one finishes its requests and hands it the rest.
    Upgrade(Successor),
}

/// What the supervisor hears from the worker tasks, the zygote and the config re-read.
pub(crate) enum Event {
    /// A report from the zygote with this pid.
    Report(i32, Report),
    /// The zygote with this pid closed its channel, or the channel failed.
    ZygoteGone(i32, String),
    Ready {
        id: usize,
        pid: i32,
    },
    /// The worker's task retires it (recycling); the detail is one line for the log.
    Recycling {
        id: usize,
        pid: i32,
        reason: ExitReason,
        detail: String,
    },
    Gone {
        id: usize,
        pid: i32,
        gone: Gone,
    },
    Reread(Box<Result<Reread, String>>),
    /// A reload could not go on; the reason.
    ReloadFailed(String),
    /// The when_ready hook has run.
    WhenReady(Result<(), HookFailed>),
    /// The on_reload hook has run: the reload's workers may start.
    Reloading,
    /// The pre_exec hook has run: the new maitred of a SIGUSR2 may start.
    PreExecDone,
}

pub(crate) async fn read_control(zygote: Zygote, events: mpsc::UnboundedSender<Event>) {
    loop {
        let event = match zygote.control.receive().await {
            Ok(Some(report)) => Event::Report(zygote.pid, report),
            Ok(None) => Event::ZygoteGone(zygote.pid, "the zygote exited".into()),
            Err(e) => Event::ZygoteGone(zygote.pid, format!("the control channel failed: {e}")),
        };
        let last = matches!(event, Event::ZygoteGone(..));
        if events.send(event).is_err() || last {
            return;
        }
    }
}

/// A worker the zygote forked, until it reports the worker's exit.
struct Forked {
    /// Its slot + 1, for the child_exit hook.
    age: usize,
    /// Its card, for the last RSS sampled; None for one no longer wanted when it was forked.
    card: Option<Rc<Card>>,
}

/// What the supervisor is handed besides its own state.
pub(crate) struct Context {
    /// The settings as the lobby started; those a reload changes are the workers' `settings`.
    pub config: Rc<Config>,
    /// What each worker's tasks are started with.
    pub worker: Rc<Workers>,
    /// The connections: a reload gives them new settings and reads their certificate again,
    /// and the drain waits for those busy.
    pub client: Rc<Connections>,
    pub scoreboard: Rc<Scoreboard>,
    /// The worker_int hook is set: SIGQUIT goes on to the workers before they are stopped.
    pub interrupt_workers: bool,
}

pub(crate) struct Supervisor {
    config: Rc<Config>,
    pub(crate) worker: Rc<Workers>,
    client: Rc<Connections>,
    scoreboard: Rc<Scoreboard>,
    interrupt_workers: bool,
    events_tx: mpsc::UnboundedSender<Event>,
    signals: Signals,
    rereader: Option<Rereader>,
    workers: HashMap<usize, WorkerEntry>,
    next_id: usize,
    /// The generation that serves; a reload's is the next.
    generation: u64,
    next_generation: u64,
    /// How many workers should serve: `--workers`, changed by SIGTTIN and SIGTTOU.
    target: usize,
    reload: Option<Reload>,
    /// Consecutive application load failures since the last worker became ready.
    boot_failures: u32,
    /// Signals that came during the start, acted on once the server serves.
    deferred: Vec<Sig>,
    /// How to start a new maitred for SIGUSR2, and the listen sockets it gets.
    succession: Rc<Succession>,
    listeners: Vec<RawFd>,
    /// A new maitred started by SIGUSR2, until it is ready or has failed.
    candidate: Option<Candidate>,
    /// A reload's own zygote (--preload), until its workers serve or the reload is abandoned.
    reload_zygote: Option<Zygote>,
    /// Runs the config file's server hooks, when it has any.
    hooks: Option<HookThread>,
    /// Each forked worker, by pid, until the zygote reports its exit.
    forked: HashMap<i32, Forked>,
    /// The OOM kills the memory cgroup counted, given to the workers lost.
    oom: OomWatch,
    /// SIGUSR2 came and its pre_exec hook is running.
    pre_exec_running: bool,
}

impl Supervisor {
    pub(crate) fn new(
        context: Context,
        events_tx: mpsc::UnboundedSender<Event>,
        signals: Signals,
        rereader: Option<Rereader>,
        succession: Rc<Succession>,
        listeners: Vec<RawFd>,
        hooks: Option<HookThread>,
    ) -> Supervisor {
        let Context { config, worker, client, scoreboard, interrupt_workers } = context;
        Supervisor {
            target: config.workers,
            config,
            worker,
            client,
            scoreboard,
            interrupt_workers,
            events_tx,
            signals,
            rereader,
            workers: HashMap::new(),
            next_id: 0,
            generation: 1,
            next_generation: 2,
            reload: None,
            boot_failures: 0,
            deferred: Vec::new(),
            succession,
            listeners,
            candidate: None,
            reload_zygote: None,
            hooks,
            forked: HashMap::new(),
            oom: OomWatch::new(),
            pre_exec_running: false,
        }
    }

    /// The hook thread, to be finished once the server has stopped.
    pub(crate) fn take_hooks(&mut self) -> Option<HookThread> {
        self.hooks.take()
    }

    /// Queues a lobby hook, if the config file has hooks.
    pub(super) fn hook(&self, hook: LobbyHook) {
        if let Some(hooks) = &self.hooks {
            hooks.call(hook);
        }
    }

    /// Queues a lobby hook, and the event `then` makes of its result once it has run. False
    /// when the config file has no hooks: then there is nothing to wait for.
    pub(super) fn hook_then(
        &self,
        hook: LobbyHook,
        then: impl FnOnce(Result<(), HookFailed>) -> Event + Send + 'static,
    ) -> bool {
        let Some(hooks) = &self.hooks else { return false };
        let events = self.events_tx.clone();
        hooks.call_then(hook, move |result| {
            let _ = events.send(then(result));
        });
        true
    }

    /// The zygote `zygote` reports that worker `pid` exited: the child_exit hook.
    pub(super) fn child_exited(&mut self, zygote: i32, pid: i32) {
        if let Some(Forked { age, .. }) = self.forked.remove(&pid) {
            self.hook(LobbyHook::ChildExit { pid, age, zygote });
        }
    }

    /// The pids of the workers that serve, in order.
    pub(crate) fn pids(&self) -> String {
        let mut pids: Vec<i32> = self
            .workers
            .values()
            .filter(|w| w.generation() == self.generation && w.seat.phase() == Phase::Serve)
            .filter_map(|w| w.pid())
            .collect();
        pids.sort();
        pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
    }

    /// Serves until a signal asks to stop, or a new maitred takes over. Err for a fatal loss.
    pub(crate) async fn run(&mut self, events: &mut mpsc::UnboundedReceiver<Event>) -> Result<Stop, String> {
        // The spare, when recycling wants one.
        self.balance(Duration::ZERO).await;
        for sig in std::mem::take(&mut self.deferred) {
            if let Some(stop) = self.on_signal(sig).await {
                return Ok(stop);
            }
        }
        loop {
            let reload_deadline = self.reload.as_ref().and_then(|reload| reload.deadline);
            tokio::select! {
                sig = self.signals.next() => {
                    if let Some(stop) = self.on_signal(sig).await {
                        return Ok(stop);
                    }
                }
                event = events.recv() => match event {
                    Some(event) => self.handle(event).await?,
                    None => return Err("the supervisor lost its event channel".into()),
                },
                ready = async { self.candidate.as_mut().expect("checked").ready().await }, if self.candidate.is_some() => {
                    let candidate = self.candidate.take().expect("checked");
                    match ready {
                        Ok(()) => {
                            info!("SIGUSR2: the new maitred (pid {}) is ready; this one hands over to it", candidate.pid());
                            return Ok(Stop::Upgrade(candidate.into_successor()));
                        }
                        Err(e) => error!("SIGUSR2: {e}; this maitred goes on serving"),
                    }
                }
                _ = tokio::time::sleep_until(reload_deadline.unwrap_or_else(Instant::now)), if reload_deadline.is_some() => {
                    let settings = self.worker.settings();
                    let reason = format!(
                        "the new workers did not finish loading {} within --timeout ({} s)",
                        settings.app,
                        settings.timeout.as_secs_f64()
                    );
                    self.abandon_reload(&reason).await;
                }
            }
        }
    }

    /// SIGUSR2: starts a new maitred, which takes over once it says it is ready (`run`).
    fn begin_upgrade(&mut self) {
        if let Some(candidate) = &self.candidate {
            info!("SIGUSR2: the new maitred (pid {}) is still starting; ignored", candidate.pid());
            return;
        }
        if self.pre_exec_running {
            info!("SIGUSR2: the pre_exec hook is still running; ignored");
            return;
        }
        // The new maitred starts once pre_exec has run, as gunicorn's execs after it.
        self.pre_exec_running = self.hook_then(LobbyHook::PreExec, |_| Event::PreExecDone);
        if !self.pre_exec_running {
            self.start_candidate();
        }
    }

    /// Starts the new maitred of a SIGUSR2.
    fn start_candidate(&mut self) {
        match Candidate::start(&self.succession, &self.listeners) {
            Ok(candidate) => {
                info!(
                    "SIGUSR2: binary upgrade: started `{}` (pid {}); it takes over once its workers are ready",
                    self.succession.command.join(" "),
                    candidate.pid()
                );
                self.candidate = Some(candidate);
            }
            Err(e) => error!("SIGUSR2: {e}; this maitred goes on serving"),
        }
    }

    async fn handle(&mut self, event: Event) -> Result<(), String> {
        match event {
            Event::Report(from, Report::Spawned { slot, pid, channels }) => match self.workers.get(&slot) {
                Some(entry) if entry.pid().is_none() => {
                    let reload = self.reload.as_ref().and_then(|reload| reload.generation) == Some(entry.generation());
                    let role = if reload {
                        " for the reload"
                    } else if entry.seat.phase() == Phase::Hold {
                        " as the spare"
                    } else {
                        ""
                    };
                    info!("booting worker {pid}{role}");
                    self.start_worker(slot, pid, channels);
                }
                _ => {
                    // Its reload was abandoned before the zygote forked it.
                    debug!("worker {pid} is no longer wanted; stopping it");
                    self.forked.insert(pid, Forked { age: slot + 1, card: None });
                    drop(channels);
                    if from == self.worker.zygotes.serving().pid {
                        let _ = self.worker.zygotes.kill(pid, libc::SIGKILL).await;
                    }
                }
            },
            Event::Report(from, Report::Exited { pid, how }) => self.on_exited(from, pid, how),
            Event::Report(from, Report::PreloadFailed(message)) if self.is_reload_zygote(from) => {
                self.abandon_reload(&format!("the new zygote could not load the application: {message}")).await;
            }
            Event::Report(_, Report::PreloadFailed(message)) => return Err(format!("the zygote failed: {message}")),
            Event::ZygoteGone(from, reason) if from == self.worker.zygotes.serving().pid => {
                return Err(format!("{reason}; no worker can be replaced"))
            }
            Event::ZygoteGone(from, reason) if self.is_reload_zygote(from) => {
                self.abandon_reload(&format!("the new zygote: {reason}")).await;
            }
            Event::ZygoteGone(from, reason) => debug!("retired zygote {from}: {reason}"),
            Event::Ready { id, pid } => {
                let Some(entry) = self.workers.get_mut(&id) else { return Ok(()) };
                entry.seat.card.ready.set(true);
                let generation = entry.generation();
                if generation == self.generation {
                    debug!("worker {pid} is ready");
                    self.boot_failures = 0;
                } else if self.pending_generation() == Some(generation) {
                    debug!("worker {pid} is ready for the reload");
                    self.switch_if_ready().await;
                }
            }
            Event::Recycling { id, pid, reason, detail } => self.on_recycling(id, pid, reason, &detail).await,
            Event::Gone { id, pid, gone } => self.on_gone(id, pid, gone).await,
            Event::Reread(result) => self.on_reread(*result).await,
            Event::ReloadFailed(reason) => self.abandon_reload(&reason).await,
            Event::Reloading => {
                if self.reload.as_ref().is_some_and(|reload| reload.generation.is_none()) {
                    self.start_generation();
                }
            }
            Event::PreExecDone => {
                self.pre_exec_running = false;
                if !*self.worker.shutdown.borrow() {
                    self.start_candidate();
                }
            }
            // Only the start waits for when_ready.
            Event::WhenReady(_) => {}
        }
        Ok(())
    }
}
