//! The maitred lobby: the one process that owns the listen sockets, accepts connections,
//! reads requests completely, queues them in one FIFO and seats each at an idle worker.
//! See docs/DESIGN.md for why it is shaped this way.

mod config;
mod connection;
mod heads;
mod hibernation;
mod listen;
mod log;
mod offer;
mod seating;
mod spool;
mod worker;
mod zygote;

use std::cell::Cell;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use maitred_protocol::Limits;
use socket2::{SockAddr, Socket};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore, TryAcquireError};
use tokio::task::{JoinHandle, LocalSet};

pub use config::{BindAddress, Config};
pub use log::Level;

use crate::connection::{Peer, Site};
use crate::hibernation::Hibernation;
use crate::listen::{Acceptor, Listener};
use crate::log::{debug, error, error_limited, info, info_limited, warning};
use crate::seating::Seating;
use crate::worker::{Channel, Gone};
use crate::zygote::{Control, Report};

/// Why the server could not start: one line for the operator.
#[derive(Debug)]
pub struct StartupError(pub String);

impl std::fmt::Display for StartupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Descriptors kept back from `--max-connections`' default for listeners, workers, logs and
/// spilled bodies.
const RESERVED_FDS: u64 = 64;
/// Descriptors the lobby holds for each worker: its channel, both ends of each offer socket,
/// and a file it may be passing.
const FDS_PER_WORKER: u64 = 2 + 2 * offer::SOCKETS as u64;
/// How long the zygote gets to exit once its control channel is closed.
const ZYGOTE_EXIT_WAIT: Duration = Duration::from_secs(5);
/// First pause before re-spawning a worker whose application failed to load, doubled each time.
const REBOOT_BACKOFF: Duration = Duration::from_millis(500);
const MAX_REBOOT_BACKOFF: Duration = Duration::from_secs(30);
/// How long the lobby waits, as it exits, for its logs to write what they hold.
const LOG_FLUSH_WAIT: Duration = Duration::from_secs(1);
/// Pauses after accept(2) fails for want of descriptors or memory: the first, doubled after
/// each failure in a row up to the last.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// An episode at `--max-connections` ends once the lobby has not been at the cap for this long.
const CAP_QUIET: Duration = Duration::from_secs(1);

/// What the connection and worker tasks share.
pub(crate) struct Lobby {
    pub config: Config,
    pub limits: Limits,
    pub seating: Seating,
    pub control: Control,
    /// Turns true once a shutdown has begun.
    pub shutdown: watch::Receiver<bool>,
    /// Keep-alive connections idle long enough to give up their tasks.
    pub hibernation: Hibernation,
    /// Answer bytes waiting in temporary files for slow clients (`--max-spill-total`).
    pub spill_budget: Rc<spool::SpillBudget>,
    /// Incomplete request heads' memory (`--max-head-memory`).
    pub heads: Rc<heads::HeadBudget>,
}

/// What the supervisor hears from the worker tasks and the zygote.
enum Event {
    Report(Report),
    ZygoteGone(String),
    Ready { slot: usize, pid: i32 },
    Gone { slot: usize, pid: i32, gone: Gone },
}

/// Runs the lobby until a shutdown completes. Returns the process exit code.
pub fn run(config: Config, control: OwnedFd, zygote_pid: i32) -> Result<i32, StartupError> {
    log::set_level(config.log_level);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| StartupError(format!("cannot start the event loop: {e}")))?;
    let local = LocalSet::new();
    let result = local.block_on(&runtime, supervise(config, control, zygote_pid));
    // Tasks still holding connections are dropped here, after every worker was stopped.
    drop(local);
    log::flush(LOG_FLUSH_WAIT);
    result
}

async fn supervise(config: Config, control: OwnedFd, zygote_pid: i32) -> Result<i32, StartupError> {
    let descriptors = Descriptors::raise(config.workers, config.max_connections);
    let max_connections = match config.max_connections {
        None => descriptors.room,
        Some(wanted) if wanted > descriptors.room => {
            warning!(
                "--max-connections {wanted} is more than the descriptor limit allows: of its {} (ulimit -n), {} are \
                 kept for listeners, workers, logs and files; using --max-connections {}. Raise the limit (ulimit \
                 -n, systemd's LimitNOFILE=) to {} to allow {wanted}",
                descriptors.limit,
                descriptors.reserved,
                descriptors.room,
                wanted as u64 + descriptors.reserved
            );
            descriptors.room
        }
        Some(wanted) => wanted,
    };
    let listeners = config
        .binds
        .iter()
        .map(|bind| listen::bind(bind, config.backlog))
        .collect::<Result<Vec<_>, _>>()
        .map_err(StartupError)?;
    if let Some(target) = &config.access_logfile {
        log::open_access_log(target).map_err(|e| StartupError(format!("cannot open access log {target}: {e}")))?;
    }
    let control = Control::new(control).map_err(|e| StartupError(format!("control channel: {e}")))?;
    let (shutdown_tx, shutdown) = watch::channel(false);
    let limits = Limits {
        max_request_line: config.limit_request_line,
        max_headers: config.limit_request_fields,
        max_header_size: config.limit_request_field_size,
        max_body: config.max_body,
    };
    let hibernation = Hibernation::new().map_err(|e| StartupError(format!("cannot watch idle connections: {e}")))?;
    let spill_budget = Rc::new(spool::SpillBudget::new(config.max_spill_total));
    let heads = heads::HeadBudget::new(config.max_head_memory);
    let lobby = Rc::new(Lobby {
        config,
        limits,
        seating: Seating::default(),
        control,
        shutdown,
        hibernation,
        spill_budget,
        heads,
    });
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let control_reader = tokio::task::spawn_local(read_control(lobby.clone(), events_tx.clone()));
    let watcher = tokio::task::spawn_local(hibernation::watch(lobby.clone()));
    let mut supervisor = Supervisor { lobby: lobby.clone(), events_tx, workers: HashMap::new(), boot_failures: 0 };

    if let Err(e) = supervisor.boot(&mut events).await {
        let workers = supervisor.stop_workers(false).await;
        control_reader.abort();
        watcher.abort();
        drop(supervisor);
        close_control_and_reap(lobby, zygote_pid, &workers).await;
        return Err(e);
    }

    let connections = Arc::new(Semaphore::new(max_connections));
    let cap = Rc::new(CapWatch::new(max_connections, &descriptors, lobby.shutdown.clone()));
    let sites: Vec<Rc<Site>> = listeners
        .iter()
        .map(|l| Rc::new(Site { server_name: l.server_name.clone(), server_port: l.server_port }))
        .collect();
    let accepting: Vec<JoinHandle<()>> = listeners
        .iter()
        .zip(&sites)
        .map(|(listener, site)| {
            announce(listener);
            let accept = Acceptor::new(listener).map_err(|e| StartupError(format!("{}: {e}", listener.display)))?;
            let accepting = accept_loop(lobby.clone(), accept, site.clone(), connections.clone(), cap.clone());
            Ok(tokio::task::spawn_local(accepting))
        })
        .collect::<Result<_, StartupError>>()?;
    info!(
        "serving {} with {} workers (pids {}); at most {max_connections} connections",
        lobby.config.app,
        lobby.config.workers,
        supervisor.pids()
    );

    let mut exit_code = 0;
    let graceful = supervisor.run(&mut events).await;
    let graceful = match graceful {
        Ok(graceful) => graceful,
        Err(reason) => {
            error!("{reason}; shutting down");
            exit_code = 1;
            true
        }
    };

    let _ = shutdown_tx.send(true);
    for task in &accepting {
        task.abort();
    }
    for task in accepting {
        // Aborted accept loops give back the connection permit they were holding.
        let _ = task.await;
    }
    if graceful {
        let taken: usize =
            listeners.iter().zip(&sites).map(|(l, site)| accept_backlog(&lobby, l, site, &connections)).sum();
        if taken > 0 {
            info!("accepted {taken} connections still waiting in the listen queue");
        }
    }
    for listener in listeners {
        if let Some(path) = &listener.unix_path {
            let _ = std::fs::remove_file(path);
        }
    }
    let deadline = if graceful { lobby.config.graceful_timeout } else { Duration::ZERO };
    let in_use = max_connections - connections.available_permits();
    info!(
        "shutting down: no new connections; {in_use} open ({} of them idle long enough to hibernate), {} requests \
         queued; waiting up to {} s",
        lobby.hibernation.sleeping(),
        lobby.seating.queued(),
        deadline.as_secs_f64()
    );
    let drained = supervisor.drain(&mut events, &connections, max_connections, deadline).await;
    if !drained {
        warning!("--graceful-timeout passed with requests unfinished; stopping their workers");
    }
    let workers = supervisor.stop_workers(!drained).await;
    lobby.seating.clear();
    control_reader.abort();
    watcher.abort();
    drop(supervisor);
    close_control_and_reap(lobby, zygote_pid, &workers).await;
    info!("shutdown complete");
    Ok(exit_code)
}

/// Logs a listen address with the backlog the kernel granted (S2).
fn announce(listener: &Listener) {
    info!("listening at {} (backlog {})", listener.display, listener.backlog_granted);
    if listener.backlog_granted < listener.backlog_requested {
        warning!(
            "--backlog {} is capped by net.core.somaxconn to {}; raise it with `sysctl -w net.core.somaxconn={}`",
            listener.backlog_requested,
            listener.backlog_granted,
            listener.backlog_requested
        );
    }
}

/// The descriptor limit, and how many connections it leaves room for.
struct Descriptors {
    /// The soft RLIMIT_NOFILE, after raising it.
    limit: u64,
    /// Kept for listeners, workers, logs and files.
    reserved: u64,
    room: usize,
}

impl Descriptors {
    /// Raises the soft descriptor limit as far as `wanted` connections need (all the way to
    /// the hard limit when none is asked for), and leaves room for everything else.
    fn raise(workers: usize, wanted: Option<usize>) -> Descriptors {
        let reserved = RESERVED_FDS + FDS_PER_WORKER * workers as u64;
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit and setrlimit read or write one rlimit.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                // An unlimited hard limit still stops at the kernel's fs.nr_open.
                let ceiling = limit.rlim_max.min(nr_open());
                let target = wanted.map_or(ceiling, |n| (n as u64).saturating_add(reserved).min(ceiling));
                if limit.rlim_cur < target {
                    let raised = libc::rlimit { rlim_cur: target, rlim_max: limit.rlim_max };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                        limit = raised;
                    }
                }
            }
        }
        let room = limit.rlim_cur.saturating_sub(reserved).clamp(1, Semaphore::MAX_PERMITS as u64 / 2) as usize;
        Descriptors { limit: limit.rlim_cur, reserved, room }
    }
}

/// The soft descriptor limit as it is now.
fn fd_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes one rlimit.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    limit.rlim_cur
}

/// The most descriptors a process may have (`fs.nr_open`), or no bound if the kernel does not say.
fn nr_open() -> u64 {
    std::fs::read_to_string("/proc/sys/fs/nr_open").ok().and_then(|text| text.trim().parse().ok()).unwrap_or(u64::MAX)
}

/// The episodes at `--max-connections`, when the lobby stops accepting and the kernel's listen
/// queue holds new connections: one warning as one begins, one line as it ends.
struct CapWatch {
    cap: usize,
    /// The descriptor limit, and whether it is what holds the cap down.
    fd_limit: u64,
    /// What the descriptor limit would allow.
    room: usize,
    fd_bound: bool,
    shutdown: watch::Receiver<bool>,
    /// When the current episode began.
    since: Cell<Option<Instant>>,
    /// When an accept loop was last at the cap.
    last_full: Cell<Instant>,
    /// Accept loops waiting for a connection to close.
    waiting: Cell<usize>,
}

impl CapWatch {
    fn new(cap: usize, descriptors: &Descriptors, shutdown: watch::Receiver<bool>) -> CapWatch {
        CapWatch {
            cap,
            fd_limit: descriptors.limit,
            room: descriptors.room,
            fd_bound: cap >= descriptors.room,
            shutdown,
            since: Cell::new(None),
            last_full: Cell::new(Instant::now()),
            waiting: Cell::new(0),
        }
    }

    /// Waits for a place under the cap; None once the semaphore is closed.
    async fn place(self: &Rc<Self>, connections: &Arc<Semaphore>) -> Option<OwnedSemaphorePermit> {
        match connections.clone().try_acquire_owned() {
            Ok(permit) => return Some(permit),
            Err(TryAcquireError::Closed) => return None,
            Err(TryAcquireError::NoPermits) => {}
        }
        let now = Instant::now();
        self.last_full.set(now);
        if self.since.get().is_none() {
            self.since.set(Some(now));
            let advice = if self.fd_bound {
                format!("The descriptor limit (ulimit -n {}) allows no more: raise it to accept more", self.fd_limit)
            } else {
                format!(
                    "The descriptor limit (ulimit -n {}) would allow {}: raise --max-connections to accept more",
                    self.fd_limit, self.room
                )
            };
            warning!(
                "at --max-connections ({} connections open): not accepting until one closes; the kernel holds new \
                 connections in the --backlog until then. {advice}",
                self.cap
            );
            tokio::task::spawn_local(self.clone().watch());
        }
        self.waiting.set(self.waiting.get() + 1);
        let permit = connections.clone().acquire_owned().await;
        self.waiting.set(self.waiting.get() - 1);
        self.last_full.set(Instant::now());
        permit.ok()
    }

    /// Ends the episode once the cap has not been reached for `CAP_QUIET`.
    async fn watch(self: Rc<Self>) {
        loop {
            let quiet_at = self.last_full.get() + CAP_QUIET;
            if *self.shutdown.borrow() {
                self.since.set(None);
                return;
            }
            if self.waiting.get() == 0 && Instant::now() >= quiet_at {
                let lasted = self.last_full.get() - self.since.take().unwrap_or(self.last_full.get());
                info!(
                    "accepting again: below --max-connections ({}) after {:.1} s at it",
                    self.cap,
                    lasted.as_secs_f64()
                );
                return;
            }
            let wake = if self.waiting.get() > 0 { Instant::now() + CAP_QUIET } else { quiet_at };
            tokio::time::sleep_until(wake.into()).await;
        }
    }
}

async fn accept_loop(
    lobby: Rc<Lobby>,
    listener: Acceptor,
    site: Rc<Site>,
    connections: Arc<Semaphore>,
    cap: Rc<CapWatch>,
) {
    // accept(2) failures in a row, since when, and the pause after the last one.
    let mut failures = 0u64;
    let mut failing_since = Instant::now();
    let mut pause = Duration::ZERO;
    loop {
        // At the cap the lobby stops accepting; the kernel's queue holds the rest.
        let Some(permit) = cap.place(&connections).await else { return };
        match listener.accept().await {
            Ok((socket, peer)) => {
                if failures > 0 {
                    info_limited!(
                        "accepting on {} again after {failures} failed accepts in {:.1} s",
                        listener.display(),
                        failing_since.elapsed().as_secs_f64()
                    );
                    failures = 0;
                    pause = Duration::ZERO;
                }
                start_connection(&lobby, &site, permit, socket, &peer)
            }
            // The connection was reset or its network went away before it was taken: the
            // next one may be fine (accept(2), "Error handling").
            Err(e) if is_connection_error(&e) => debug!("accept on {}: {e}", listener.display()),
            Err(e) => {
                // Out of descriptors (EMFILE, ENFILE) or memory: the pending connection stays
                // queued. Try again after a pause, doubled each time, rather than spin.
                if failures == 0 {
                    failing_since = Instant::now();
                }
                failures += 1;
                pause = (pause * 2).clamp(ACCEPT_BACKOFF, MAX_ACCEPT_BACKOFF);
                drop(permit);
                let open = cap.cap - connections.available_permits();
                error_limited!(
                    "accept on {} failed: {e}; {open} connections open, descriptor limit {} (ulimit -n); retrying in \
                     {} ms ({failures} in a row)",
                    listener.display(),
                    fd_limit(),
                    pause.as_millis()
                );
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// accept(2) errors that concern only the connection being taken, not the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EINTR
                | libc::EPROTO
                | libc::EPERM
                | libc::ENETDOWN
                | libc::ENOPROTOOPT
                | libc::EHOSTDOWN
                | libc::ENONET
                | libc::EHOSTUNREACH
                | libc::EOPNOTSUPP
                | libc::ENETUNREACH
        )
    )
}

/// Takes the connections that finished their handshake but were not accepted yet, so that
/// a shutdown resets none of them: the kernel would reset them when the socket closes.
fn accept_backlog(lobby: &Rc<Lobby>, listener: &Listener, site: &Rc<Site>, connections: &Arc<Semaphore>) -> usize {
    let mut taken = 0;
    while let Ok(permit) = connections.clone().try_acquire_owned() {
        let Ok((socket, peer)) = listener.socket.accept4(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) else { break };
        start_connection(lobby, site, permit, socket, &peer);
        taken += 1;
    }
    taken
}

/// Gives an accepted, non-blocking socket its connection task.
fn start_connection(lobby: &Rc<Lobby>, site: &Rc<Site>, permit: OwnedSemaphorePermit, socket: Socket, peer: &SockAddr) {
    let fd = OwnedFd::from(socket);
    let started = match peer.as_socket() {
        // TCP_NODELAY comes from the listener (listen::bind).
        Some(addr) => tokio::net::TcpStream::from_std(fd.into()).map(|stream| {
            connection::start(lobby, stream, Peer(Some(addr)), site.clone(), permit, 0);
        }),
        None => tokio::net::UnixStream::from_std(fd.into()).map(|stream| {
            connection::start(lobby, stream, Peer(None), site.clone(), permit, 0);
        }),
    };
    if let Err(e) = started {
        error_limited!("cannot take an accepted connection: {e}");
    }
}

async fn read_control(lobby: Rc<Lobby>, events: mpsc::UnboundedSender<Event>) {
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
struct WorkerEntry {
    pid: i32,
    task: JoinHandle<()>,
}

struct Supervisor {
    lobby: Rc<Lobby>,
    events_tx: mpsc::UnboundedSender<Event>,
    workers: HashMap<usize, WorkerEntry>,
    /// Consecutive application load failures since the last worker became ready.
    boot_failures: u32,
}

impl Supervisor {
    fn pids(&self) -> String {
        let mut pids: Vec<i32> = self.workers.values().map(|w| w.pid).collect();
        pids.sort();
        pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
    }

    /// Starts every worker and waits until all are ready; the first failure ends the start.
    async fn boot(&mut self, events: &mut mpsc::UnboundedReceiver<Event>) -> Result<(), StartupError> {
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
    async fn run(&mut self, events: &mut mpsc::UnboundedReceiver<Event>) -> Result<bool, String> {
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
    async fn drain(
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
    async fn stop_workers(&mut self, kill: bool) -> Vec<i32> {
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
async fn close_control_and_reap(lobby: Rc<Lobby>, zygote_pid: i32, workers: &[i32]) {
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
