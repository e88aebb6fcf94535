//! The worker supervisor: starts the workers through the zygote, replaces those that are lost,
//! answers the signals (docs/SIGNALS.md), and stops the workers at the end.
//!
//! Workers are numbered by the lobby (the `SLOT` of the zygote's `spawn`, never reused) and
//! belong to a generation: the set that serves, or the set a reload (SIGHUP) is starting. A
//! reload's workers are held, ready but seated at nothing, until the whole set has loaded the
//! application; then in one step they serve and the old ones retire, each after the requests it
//! holds. If one of them fails, the reload is abandoned and the old set never stopped serving.

use std::collections::HashMap;
use std::future::poll_fn;
use std::os::fd::{OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::health;
use crate::hooks::{HookFailed, HookThread, LobbyHook};
use crate::log::{self, debug, error, info, warning};
use crate::notify;
use crate::recycle::{recycles, Recycle};
use crate::scoreboard::{Card, ExitReason, Phase};
use crate::upgrade::{Candidate, Succession, Successor};
use crate::worker::{self, Channel, Gone, Seat};
use crate::zygote::{self, Report, Zygote};
use crate::{Config, Lobby, StartupError};

/// How long the zygote gets to exit once its control channel is closed.
const ZYGOTE_EXIT_WAIT: Duration = Duration::from_secs(5);
/// First pause before re-spawning a worker whose application failed to load, doubled each time.
const REBOOT_BACKOFF: Duration = Duration::from_millis(500);
const MAX_REBOOT_BACKOFF: Duration = Duration::from_secs(30);
/// During a shutdown, how often the supervisor looks whether requests wait in the queue with
/// fewer workers than it should have (one was lost, and was not replaced while none waited).
const DRAIN_CHECK: Duration = Duration::from_millis(100);
/// With the worker_int hook, how long workers sent SIGQUIT have to run it and exit before the
/// lobby stops them itself.
const QUIT_GRACE: Duration = Duration::from_secs(1);
const QUIT_POLL: Duration = Duration::from_millis(10);

/// The config file read again for a SIGHUP: the lobby's new settings, and the names of the
/// settings that changed but cannot change without a new lobby (they keep their values).
pub struct Reread {
    pub config: Config,
    pub kept: Vec<String>,
}

/// Reads the config file again (the CLI's, in Python); Err is one line for the log. It runs on
/// a thread of its own, off the event loop.
pub type Rereader = Arc<dyn Fn() -> Result<Reread, String> + Send + Sync>;

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
    fn name(self) -> &'static str {
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
    async fn next(&mut self) -> Sig {
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

/// A worker the supervisor knows of, from the `spawn` it asked for to the end of its task.
pub(crate) struct WorkerEntry {
    /// What it shares with its task; its card holds its generation, pid and readiness.
    seat: Rc<Seat>,
    task: Option<JoinHandle<()>>,
    /// Why it was told to retire.
    retired_for: Option<ExitReason>,
}

impl WorkerEntry {
    fn generation(&self) -> u64 {
        self.seat.card.generation
    }

    /// None until the zygote has forked it.
    fn pid(&self) -> Option<i32> {
        self.seat.card.pid.get()
    }

    /// It has loaded the application.
    fn ready(&self) -> bool {
        self.seat.card.ready.get()
    }
}

/// A reload under way.
struct Reload {
    /// The new workers' generation, once they are asked for (after the config file is read).
    generation: Option<u64>,
    /// When the new workers must all be ready.
    deadline: Option<Instant>,
    /// Another SIGHUP came meanwhile: a reload follows this one.
    again: bool,
}

/// How serving ended.
pub(crate) enum Stop {
    /// SIGTERM, SIGINT, or a fatal error: requests under way are finished.
    Graceful,
    /// SIGQUIT: workers are stopped at once.
    Immediate,
    /// SIGUSR2: a new maitred serves; this one finishes its requests and hands it the rest.
    Upgrade(Successor),
}

/// How the start ended, when the workers did not all become ready.
pub(crate) enum BootEnd {
    Failed(StartupError),
    /// A signal asked the server to stop.
    Stopped,
}

pub(crate) struct Supervisor {
    pub(crate) lobby: Rc<Lobby>,
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
    /// Each forked worker's age (its slot + 1), by pid, until the zygote reports its exit.
    ages: HashMap<i32, usize>,
    /// SIGUSR2 came and its pre_exec hook is running.
    pre_exec_running: bool,
}

impl Supervisor {
    pub(crate) fn new(
        lobby: Rc<Lobby>,
        events_tx: mpsc::UnboundedSender<Event>,
        signals: Signals,
        rereader: Option<Rereader>,
        succession: Rc<Succession>,
        listeners: Vec<RawFd>,
        hooks: Option<HookThread>,
    ) -> Supervisor {
        let target = lobby.config.workers;
        Supervisor {
            lobby,
            events_tx,
            signals,
            rereader,
            workers: HashMap::new(),
            next_id: 0,
            generation: 1,
            next_generation: 2,
            target,
            reload: None,
            boot_failures: 0,
            deferred: Vec::new(),
            succession,
            listeners,
            candidate: None,
            reload_zygote: None,
            hooks,
            ages: HashMap::new(),
            pre_exec_running: false,
        }
    }

    /// The hook thread, to be finished once the server has stopped.
    pub(crate) fn take_hooks(&mut self) -> Option<HookThread> {
        self.hooks.take()
    }

    /// Queues a lobby hook, if the config file has hooks.
    fn hook(&self, hook: LobbyHook) {
        if let Some(hooks) = &self.hooks {
            hooks.call(hook);
        }
    }

    /// Queues a lobby hook, and the event `then` makes of its result once it has run. False
    /// when the config file has no hooks: then there is nothing to wait for.
    fn hook_then(&self, hook: LobbyHook, then: impl FnOnce(Result<(), HookFailed>) -> Event + Send + 'static) -> bool {
        let Some(hooks) = &self.hooks else { return false };
        let events = self.events_tx.clone();
        hooks.call_then(hook, move |result| {
            let _ = events.send(then(result));
        });
        true
    }

    /// The zygote `zygote` reports that worker `pid` exited: the child_exit hook.
    fn child_exited(&mut self, zygote: i32, pid: i32) {
        if let Some(age) = self.ages.remove(&pid) {
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

    /// Starts every worker and waits until all are ready, then for the when_ready hook; the
    /// first failure ends the start, and so does SIGTERM, SIGINT or SIGQUIT. Other signals wait
    /// until the server serves.
    pub(crate) async fn boot(&mut self, events: &mut mpsc::UnboundedReceiver<Event>) -> Result<(), BootEnd> {
        // Held until all are ready, so that a --max-worker-lifetime counts from when they serve.
        for _ in 0..self.target {
            let id = self.add_worker(self.generation, Phase::Hold);
            if let Err(e) = self.lobby.zygotes.serving().control.spawn(id, self.target).await {
                // The zygote is gone; its last report (a preload failure) says why.
                debug!("cannot ask the zygote for worker {id}: {e}");
                break;
            }
        }
        let mut ready = 0;
        let deadline = Instant::now() + self.lobby.config.timeout;
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
                    self.lobby.config.app,
                    self.lobby.config.timeout.as_secs_f64()
                ));
            };
            match event {
                Some(Event::Report(_, Report::Spawned { slot, pid, channel })) => self.start_worker(slot, pid, channel),
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

    /// Records a worker about to be asked for, and returns its number.
    fn add_worker(&mut self, generation: u64, phase: Phase) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        let card = Rc::new(Card::new(generation, phase));
        self.lobby.scoreboard.add(id, card.clone());
        self.workers.insert(id, WorkerEntry { seat: Seat::new(card), task: None, retired_for: None });
        id
    }

    /// Asks the zygote for a new worker of `generation`, after `pause`.
    fn spawn(&mut self, generation: u64, phase: Phase, pause: Duration) {
        let id = self.add_worker(generation, phase);
        // A reload's workers come from its own zygote, when it has one (--preload).
        let zygote = match &self.reload_zygote {
            Some(zygote) if self.pending_generation() == Some(generation) => zygote.clone(),
            _ => self.lobby.zygotes.serving(),
        };
        let target = self.target;
        tokio::task::spawn_local(async move {
            tokio::time::sleep(pause).await;
            if let Err(e) = zygote.control.spawn(id, target).await {
                error!("cannot ask the zygote for a worker: {e}");
            }
        });
    }

    fn start_worker(&mut self, id: usize, pid: i32, channel: OwnedFd) {
        self.ages.insert(pid, id + 1);
        let Some(entry) = self.workers.get_mut(&id) else { return };
        entry.seat.card.pid.set(Some(pid));
        let lobby = self.lobby.clone();
        let events = self.events_tx.clone();
        let tell = self.events_tx.clone();
        let recycle = Recycle::new(
            &lobby.settings(),
            pid,
            Box::new(move |reason, detail| {
                let _ = tell.send(Event::Recycling { id, pid, reason, detail });
            }),
        );
        let seat = entry.seat.clone();
        let task = tokio::task::spawn_local(async move {
            let gone = match Channel::new(channel) {
                Err(e) => Gone::Lost(ExitReason::Crash, format!("unusable channel: {e}")),
                Ok(mut channel) => match worker::await_ready(&mut channel).await {
                    Err(gone) => gone,
                    Ok(()) => {
                        let _ = events.send(Event::Ready { id, pid });
                        worker::serve(lobby, pid, channel, recycle, seat).await
                    }
                },
            };
            let _ = events.send(Event::Gone { id, pid, gone });
        });
        if let Some(old) = entry.task.replace(task) {
            old.abort();
        }
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
                    let settings = self.lobby.settings();
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

    /// Acts on a signal while serving; Some when it asks the server to stop.
    async fn on_signal(&mut self, sig: Sig) -> Option<Stop> {
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
    async fn quit_workers(&self) {
        if !self.lobby.interrupt_workers {
            return;
        }
        let mut left = Vec::new();
        for pid in self.workers.values().filter_map(WorkerEntry::pid) {
            left.push(health::ProcStat::open(pid));
            if let Err(e) = self.lobby.zygotes.kill(pid, libc::SIGQUIT).await {
                error!("could not ask the zygote to pass SIGQUIT to worker {pid}: {e}");
            }
        }
        let deadline = Instant::now() + QUIT_GRACE;
        while left.iter().any(health::ProcStat::is_alive) && Instant::now() < deadline {
            tokio::time::sleep(QUIT_POLL).await;
        }
    }

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
            candidate.stop();
        }
        let all_closed = connections.acquire_many(max_connections as u32);
        tokio::pin!(all_closed);
        let timer = tokio::time::sleep(deadline);
        tokio::pin!(timer);
        let mut checks = tokio::time::interval(DRAIN_CHECK);
        loop {
            tokio::select! {
                biased;
                _ = &mut all_closed => return true,
                _ = &mut timer => {
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
            Event::Report(from, Report::Spawned { slot, pid, channel }) => match self.workers.get(&slot) {
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
                    self.start_worker(slot, pid, channel);
                }
                _ => {
                    // Its reload was abandoned before the zygote forked it.
                    debug!("worker {pid} is no longer wanted; stopping it");
                    self.ages.insert(pid, slot + 1);
                    drop(channel);
                    if from == self.lobby.zygotes.serving().pid {
                        let _ = self.lobby.zygotes.kill(pid, libc::SIGKILL).await;
                    }
                }
            },
            Event::Report(from, Report::Exited { pid, how }) => {
                info!("worker {pid} exited ({how})");
                self.child_exited(from, pid);
            }
            Event::Report(from, Report::PreloadFailed(message)) if self.is_reload_zygote(from) => {
                self.abandon_reload(&format!("the new zygote could not load the application: {message}")).await;
            }
            Event::Report(_, Report::PreloadFailed(message)) => return Err(format!("the zygote failed: {message}")),
            Event::ZygoteGone(from, reason) if from == self.lobby.zygotes.serving().pid => {
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
                if !*self.lobby.shutdown.borrow() {
                    self.start_candidate();
                }
            }
            // Only the start waits for when_ready.
            Event::WhenReady(_) => {}
        }
        Ok(())
    }

    async fn on_gone(&mut self, id: usize, pid: i32, gone: Gone) {
        self.lobby.scoreboard.remove(id);
        let Some(entry) = self.workers.remove(&id) else {
            debug!("worker {pid}, no longer wanted, is gone: {gone:?}");
            return;
        };
        let exit = match &gone {
            Gone::Lost(reason, _) => Some(*reason),
            Gone::BootFailed(_) => Some(ExitReason::BootFailed),
            Gone::Retired => entry.retired_for,
        };
        if let Some(reason) = exit {
            self.lobby.scoreboard.exited(reason);
        }
        if self.pending_generation() == Some(entry.generation()) {
            let reason = match gone {
                Gone::BootFailed(message) => format!("a new worker could not load the application: {message}"),
                Gone::Lost(_, detail) => format!("new worker {pid} lost: {detail}"),
                Gone::Retired => format!("new worker {pid} was retired"),
            };
            self.abandon_reload(&reason).await;
            return;
        }
        if let Some(reason) = entry.retired_for {
            let why = retirement(reason);
            match gone {
                // Its one line was logged when it began to retire.
                Gone::Retired if reason.is_recycling() => debug!("worker {pid} retired ({why})"),
                Gone::Retired => info!("worker {pid} retired ({why})"),
                Gone::Lost(_, detail) => error!("worker {pid} lost while retiring ({why}): {detail}"),
                Gone::BootFailed(message) => info!("worker {pid} retired ({why}) before it had loaded: {message}"),
            }
            return;
        }
        let replaced = self.wants_more();
        let replacing = if replaced { "; starting a replacement" } else { "" };
        let pause = match gone {
            Gone::Retired => {
                info!("worker {pid} retired{replacing}");
                Duration::ZERO
            }
            Gone::Lost(_, detail) => {
                error!("worker {pid} lost: {detail}{replacing}");
                Duration::ZERO
            }
            Gone::BootFailed(message) => {
                self.boot_failures += 1;
                let pause = REBOOT_BACKOFF.saturating_mul(1 << self.boot_failures.min(8)).min(MAX_REBOOT_BACKOFF);
                if replaced {
                    error!(
                        "a new worker could not load the application: {message}; retrying in {} s",
                        pause.as_secs_f64()
                    );
                } else {
                    error!("a new worker could not load the application: {message}");
                }
                pause
            }
        };
        self.balance(pause).await;
    }

    /// A worker retires for recycling: the spare takes its place, and a new spare is started.
    async fn on_recycling(&mut self, id: usize, pid: i32, reason: ExitReason, detail: &str) {
        if self.workers.get(&id).is_none_or(|entry| entry.retired_for.is_some()) {
            // Retired already (a reload, SIGTTOU): its place is taken care of.
            debug!("retiring worker {pid}: {detail}");
            return;
        }
        self.retire(&[id], reason);
        let successor = match self.spare().map(|spare| &self.workers[&spare]) {
            _ if !self.wants_more() => String::new(),
            Some(spare) => match (spare.ready(), spare.pid()) {
                (true, Some(spare)) => format!("; the spare worker {spare} takes its place"),
                _ => "; the spare worker, still loading, takes its place".into(),
            },
            None => "; starting a replacement".into(),
        };
        info!("retiring worker {pid}: {detail}{successor}");
        self.balance(Duration::ZERO).await;
    }

    /// The serving generation's spare: ready, or loading, and seated at nothing until it takes
    /// the place of a worker that retires or is lost.
    fn spare(&self) -> Option<usize> {
        self.workers
            .iter()
            .find(|(_, w)| w.generation() == self.generation && w.seat.phase() == Phase::Hold)
            .map(|(id, _)| *id)
    }

    /// The serving generation's workers that serve (not the spare, not those retiring), by
    /// number, oldest first.
    fn serving(&self) -> Vec<usize> {
        let mut ids: Vec<usize> = self
            .workers
            .iter()
            .filter(|(_, w)| w.generation() == self.generation && w.seat.phase() == Phase::Serve)
            .map(|(id, _)| *id)
            .collect();
        ids.sort();
        ids
    }

    /// Whether `balance` would start a worker now: fewer serve than the target, and the server
    /// is not shutting down, or it is with requests waiting (or no worker left to take them).
    fn wants_more(&self) -> bool {
        let serving = self.serving().len();
        if serving >= self.target {
            return false;
        }
        !*self.lobby.shutdown.borrow() || self.lobby.seating.queued() > 0 || serving == 0
    }

    /// Starts or retires workers of the serving generation until `target` serve, the spare
    /// first taking a missing worker's place; then starts a spare if recycling wants one.
    async fn balance(&mut self, pause: Duration) {
        let serving = self.serving();
        if self.wants_more() {
            let mut missing = self.target - serving.len();
            if let Some(spare) = self.spare() {
                self.workers[&spare].seat.serve();
                missing -= 1;
            }
            for _ in 0..missing {
                self.spawn(self.generation, Phase::Serve, pause);
            }
        } else if serving.len() > self.target && !*self.lobby.shutdown.borrow() {
            // Those still loading go first, the newest first; then the oldest, as gunicorn does.
            let mut doomed: Vec<usize> = serving.iter().rev().copied().filter(|id| !self.workers[id].ready()).collect();
            doomed.extend(serving.iter().copied().filter(|id| self.workers[id].ready()));
            doomed.truncate(serving.len() - self.target);
            self.retire(&doomed, ExitReason::ScaleDown);
        }
        if recycles(&self.lobby.settings()) && self.spare().is_none() && !*self.lobby.shutdown.borrow() {
            self.spawn(self.generation, Phase::Hold, pause);
        }
    }

    /// Tells workers to retire: each answers the requests it holds, then its channel is closed
    /// and it exits. The offers they had not received go back to the queue, in its order.
    fn retire(&mut self, ids: &[usize], why: ExitReason) {
        let mut recalled = Vec::new();
        for id in ids {
            if let Some(entry) = self.workers.get_mut(id) {
                entry.retired_for = Some(why);
                recalled.extend(entry.seat.retire());
            }
        }
        recalled.sort_by_key(|job| job.enqueued_at);
        self.lobby.seating.requeue_front(recalled);
    }

    fn is_reload_zygote(&self, pid: i32) -> bool {
        self.reload_zygote.as_ref().is_some_and(|zygote| zygote.pid == pid)
    }

    fn pending_generation(&self) -> Option<u64> {
        self.reload.as_ref().and_then(|reload| reload.generation)
    }

    /// SIGHUP: reads the config file again if there is one, then starts a new set of workers.
    fn begin_reload(&mut self) {
        if let Some(reload) = &mut self.reload {
            reload.again = true;
            info!("SIGHUP: a reload is under way; another follows once it is done");
            return;
        }
        notify::reloading();
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

    async fn on_reread(&mut self, result: Result<Reread, String>) {
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
    async fn apply(&mut self, config: Config, kept: &[String]) {
        if !kept.is_empty() {
            warning!(
                "SIGHUP: the config file changes {}, which a reload cannot change: kept as they were until an \
                 upgrade (a new lobby)",
                kept.join(", ")
            );
        }
        let old = self.lobby.settings();
        if config.workers != old.workers {
            // A count set by SIGTTIN and SIGTTOU stays, unless the file sets a new one.
            self.target = config.workers;
        }
        if config.log_level != old.log_level {
            log::set_level(config.log_level);
            if let Err(e) = self.lobby.zygotes.serving().control.set_log_level(config.log_level).await {
                error!("cannot tell the zygote the new log level: {e}");
            }
        }
        self.lobby.set_settings(config);
    }

    /// Asks the zygote for a full set of new workers, held until all are ready.
    fn start_generation(&mut self) {
        let generation = self.next_generation;
        self.next_generation += 1;
        let settings = self.lobby.settings();
        if let Some(reload) = &mut self.reload {
            reload.generation = Some(generation);
            reload.deadline = Some(Instant::now() + settings.timeout);
        }
        if self.lobby.config.preload {
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
    async fn switch_if_ready(&mut self) {
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
            let old = self.lobby.zygotes.replace(zygote);
            self.lobby.zygotes.retire(old);
        }
        self.generation = generation;
        self.lobby.scoreboard.generation.set(generation);
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
    async fn abandon_reload(&mut self, reason: &str) {
        let Some(reload) = self.reload.take() else { return };
        error!("SIGHUP: reload abandoned: {reason}; the old workers keep serving");
        if !*self.lobby.shutdown.borrow() {
            notify::ready();
        }
        let zygote = self.reload_zygote.take();
        if let Some(generation) = reload.generation {
            let ids: Vec<usize> =
                self.workers.iter().filter(|(_, w)| w.generation() == generation).map(|(id, _)| *id).collect();
            for id in ids {
                self.lobby.scoreboard.remove(id);
                let Some(entry) = self.workers.remove(&id) else { continue };
                // A ready one closes its channel and exits; one still loading is killed.
                entry.seat.retire();
                if !entry.ready() {
                    let pid = entry.pid();
                    if let Some(task) = entry.task {
                        task.abort();
                    }
                    if let Some(pid) = pid {
                        let control =
                            zygote.as_ref().map_or_else(|| self.lobby.zygotes.serving().control, |z| z.control.clone());
                        let _ = control.kill(pid, libc::SIGKILL).await;
                    }
                }
            }
        }
        if let Some(zygote) = zygote {
            self.lobby.zygotes.retire(zygote);
        }
        if reload.again && !*self.lobby.shutdown.borrow() {
            self.begin_reload();
        }
    }

    /// SIGUSR1: the lobby reopens its logs, and asks the zygote to reopen its own and the
    /// workers' (logrotate without copytruncate: the files were renamed, new ones take their
    /// paths).
    async fn reopen_logs(&self) {
        let mut reopened = Vec::new();
        if let Some(path) = &self.lobby.config.error_logfile {
            log::reopen_error_log(path);
            reopened.push(format!("the error log {path}"));
        }
        if let Some(path) = log::reopen_access_log() {
            reopened.push(format!("the access log {path}"));
        }
        if let Err(e) = self.lobby.zygotes.serving().control.reopen_logs().await {
            error!("SIGUSR1: cannot ask the zygote to reopen its log: {e}");
        }
        if reopened.is_empty() {
            info!("SIGUSR1: no log file to reopen (the logs go to standard streams)");
        } else {
            info!("SIGUSR1: reopened {}; the zygote and the workers reopen theirs", reopened.join(" and "));
        }
    }

    /// Closes every worker's channel, so each exits once it has nothing to do; with `kill`,
    /// workers still busy are killed first.
    /// Returns the pids of the workers stopped.
    pub(crate) async fn stop_workers(&mut self, kill: bool) -> Vec<i32> {
        let mut pids = Vec::new();
        self.lobby.scoreboard.clear();
        for (_, worker) in self.workers.drain() {
            let Some(pid) = worker.pid() else { continue };
            if kill {
                let _ = self.lobby.zygotes.kill(pid, libc::SIGKILL).await;
            }
            if let Some(task) = worker.task {
                task.abort();
            }
            pids.push(pid);
        }
        pids
    }
}

/// Why a worker retires, as the log says it.
fn retirement(reason: ExitReason) -> &'static str {
    match reason {
        ExitReason::Reload => "reload",
        ExitReason::ScaleDown => "SIGTTOU",
        _ => "recycled",
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

/// Closes the control channel (the zygote then exits once its workers have) and reaps it,
/// and any zygote a reload retired. If one is stuck, it and the workers it was asked to stop
/// are killed, so that nothing outlives the server.
pub(crate) async fn close_control_and_reap(lobby: Rc<Lobby>, workers: &[i32]) {
    // Tasks not yet dropped may still hold the Lobby, so shut the socket rather than wait
    // for the last reference to close it.
    let serving = lobby.zygotes.serving();
    serving.control.close();
    let mut left = lobby.zygotes.retired();
    left.push(serving.pid);
    drop(lobby);
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
