//! The lobby's life: boot (privileges dropped once the sockets are bound, the workers started
//! and ready), serve (accepting, the diagnoses and the stats listener running, a binary
//! upgrade's connections taken over), drain (no new connections, the queue emptied within
//! `--graceful-timeout`, idle connections closed or handed to a new maitred) and exit.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;

use crate::client::context::Context as Connections;
use crate::client::peer::Site;
use crate::client::tls::certificates::Certificates;
use crate::client::wake;
use crate::config::{BindAddress, Config};
use crate::listen::accept::{accept_backlog, accept_loop, announce, Acceptor};
use crate::listen::bind::{self, Listener};
use crate::listen::cap::{CapWatch, Descriptors};
use crate::lobby::{new_lobby, Lobby};
use crate::log::{self, error, info, warning};
use crate::observe::{diagnosis, idle_cpus, server};
use crate::process::hooks::{HookThread, ServerHooks};
use crate::process::upgrade::handover::Successor;
use crate::process::upgrade::{takeover, Succession};
use crate::process::watchdog::Watchdog;
use crate::process::zygote::{Control, Zygote};
use crate::process::{notify, orphans, privileges};
use crate::supervise::boot::BootEnd;
use crate::supervise::signals::Signals;
use crate::supervise::stop::close_control_and_reap;
use crate::supervise::{read_control, Event, Rereader, Stop, Supervisor};

use crate::StartupError;

/// How long the lobby waits, as it exits, for the server hooks still queued (child_exit …) to
/// run, before the CLI calls on_exit.
const HOOKS_FINISH_WAIT: Duration = Duration::from_secs(5);

pub(crate) async fn until_stopped(
    config: Config,
    control: OwnedFd,
    zygote_pid: i32,
    rereader: Option<Rereader>,
    mut succession: Succession,
    hooks: Option<ServerHooks>,
    watchdog: Option<Watchdog>,
) -> Result<i32, StartupError> {
    // First, so that no signal the lobby acts on can end it by its default action.
    let signals = Signals::install()?;
    let (descriptors, max_connections) = connection_cap(&config);
    // What a binary upgrade passed for an address this lobby no longer binds stays open,
    // unused, until the lobby exits.
    let mut inherited = std::mem::take(&mut succession.inherited);
    let (listeners, stats_listener) = bind_listeners(&config, &mut inherited)?;
    let tls = take_what_needs_root(&config, &listeners, &stats_listener)?;
    let control = Control::new(control).map_err(|e| StartupError(format!("control channel: {e}")))?;
    let first_zygote = Zygote { pid: zygote_pid, control: Rc::new(control) };
    maitred_sys::process::waited_for(zygote_pid);
    orphans::reap_if_init();
    let (shutdown_tx, shutdown) = watch::channel(false);
    let (lobby, hook_thread) = new_lobby(config, &first_zygote, shutdown, tls, hooks, watchdog)?;
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let background = Background {
        control_reader: tokio::task::spawn_local(read_control(first_zygote, events_tx.clone())),
        watcher: tokio::task::spawn_local(wake::watch(lobby.client.clone())),
    };
    // A new lobby started by a binary upgrade speaks to systemd once it is the main process.
    if succession.predecessor.is_none() {
        notify::watch(lobby.standing());
    }
    let predecessor = succession.predecessor.take();
    let pid_file = succession.pid_file.clone();
    // The stats listener goes to a new maitred too: it could not bind the address meanwhile.
    let listener_fds = listeners.iter().chain(&stats_listener).map(|l| l.socket.as_raw_fd()).collect();
    let mut supervisor = Supervisor::new(
        lobby.supervised(),
        events_tx,
        signals,
        rereader,
        Rc::new(succession),
        listener_fds,
        hook_thread,
    );

    if let Err(end) = supervisor.boot(&mut events).await {
        tear_down(lobby, supervisor, background, false).await;
        remove_socket_files(listeners.iter().filter_map(|l| l.unix_path.as_ref()));
        return match end {
            BootEnd::Failed(e) => Err(e),
            BootEnd::Stopped => {
                info!("shutdown complete");
                Ok(0)
            }
        };
    }

    let mut serving = start_serving(&lobby, &listeners, stats_listener, &descriptors, max_connections)?;
    info!(
        "serving {} with {} workers (pids {}); at most {max_connections} connections",
        lobby.config.app,
        lobby.config.workers,
        supervisor.pids()
    );
    match predecessor {
        Some(predecessor) => take_over_from(&lobby, predecessor, pid_file.as_deref(), &serving),
        None => notify::ready(),
    }

    let mut exit_code = 0;
    let stop = match supervisor.run(&mut events).await {
        Ok(stop) => stop,
        Err(reason) => {
            error!("{reason}; shutting down");
            exit_code = 1;
            Stop::Graceful
        }
    };
    let (graceful, successor) = announce_stop(&lobby.client, stop, &shutdown_tx);
    stop_accepting(&lobby, &mut serving, listeners, graceful, successor.is_some()).await;
    let drained = drain(&lobby, &mut supervisor, &mut events, &serving, graceful, successor).await;
    tear_down(lobby, supervisor, background, !drained).await;
    info!("shutdown complete");
    Ok(exit_code)
}

/// The descriptor limit raised as far as it goes, and the connections it leaves room for:
/// --max-connections, or less when the limit allows fewer.
fn connection_cap(config: &Config) -> (Descriptors, usize) {
    // A reload holds two sets of workers for a moment. An ASGI worker's seats
    // (--worker-connections) are not counted: the zygote tells ASGI from WSGI only later
    // (docs/ASGI.md, "Seats", says what they take).
    let descriptors = Descriptors::raise(2 * config.workers * config.threads, config.max_connections);
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
    (descriptors, max_connections)
}

/// The --bind listeners and the --stats one, each on the socket a binary upgrade passed for
/// its address when there is one.
fn bind_listeners(
    config: &Config,
    inherited: &mut Vec<(BindAddress, OwnedFd)>,
) -> Result<(Vec<Listener>, Option<Listener>), StartupError> {
    let mut take_inherited = |address: &BindAddress| {
        inherited.iter().position(|(bound, _)| bound == address).map(|i| inherited.swap_remove(i).1)
    };
    let listeners = config
        .binds
        .iter()
        .map(|address| bind::bind(address, config.backlog, take_inherited(address)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(StartupError)?;
    let stats_listener = config
        .stats
        .as_ref()
        .map(|address| bind::bind(address, None, take_inherited(address)))
        .transpose()
        .map_err(StartupError)?;
    Ok((listeners, stats_listener))
}

/// Opens the access log and reads the certificate, then drops root (--user, --group): the
/// listen sockets are bound by then, and this is all that is left needing it.
fn take_what_needs_root(
    config: &Config,
    listeners: &[Listener],
    stats_listener: &Option<Listener>,
) -> Result<Option<Certificates>, StartupError> {
    if let Some(target) = &config.access_logfile {
        log::open_access_log(target).map_err(|e| StartupError(format!("cannot open access log {target}: {e}")))?;
    }
    // The key may be readable by root only, as nginx's often is.
    let tls = config
        .tls
        .as_ref()
        .map(|tls| Certificates::load(tls, config.http.http1, config.http.http2))
        .transpose()
        .map_err(StartupError)?;
    if let Some(certificates) = &tls {
        info!("TLS with the certificate in {}", certificates.certfile().display());
    }
    // Everything that needs root is done: the listen sockets are bound, the logs open and the
    // certificate read.
    if let Some(credentials) = &config.drop_to {
        let unix_sockets = listeners.iter().chain(stats_listener).filter_map(|l| l.unix_path.clone());
        let logs = [&config.access_logfile, &config.error_logfile].into_iter().flatten().filter(|path| *path != "-");
        let paths: Vec<_> = unix_sockets.chain(logs.map(PathBuf::from)).collect();
        privileges::drop_to(credentials, &paths).map_err(|e| StartupError(e.to_string()))?;
    }
    Ok(tls)
}

/// The tasks that run from the start to the end whatever happens between: the reading of the
/// zygote's reports and the watch over hibernating connections.
struct Background {
    control_reader: JoinHandle<()>,
    watcher: JoinHandle<()>,
}

/// What serving holds once the workers are ready, until the drain is over.
struct Serving {
    connections: Arc<Semaphore>,
    max_connections: usize,
    sites: Vec<Rc<Site>>,
    accepting: Vec<JoinHandle<()>>,
    diagnosing: JoinHandle<()>,
    stats_path: Option<PathBuf>,
}

/// Starts accepting on every listener, the diagnoses, and the stats listener.
fn start_serving(
    lobby: &Lobby,
    listeners: &[Listener],
    stats_listener: Option<Listener>,
    descriptors: &Descriptors,
    max_connections: usize,
) -> Result<Serving, StartupError> {
    let connections = Arc::new(Semaphore::new(max_connections));
    let cap = Rc::new(CapWatch::new(max_connections, descriptors, lobby.client.shutdown.clone()));
    let sites: Vec<Rc<Site>> = listeners
        .iter()
        .zip(&lobby.config.binds)
        .map(|(l, address)| {
            let tls = lobby.config.tls.is_some() && !lobby.config.plain_binds.contains(address);
            Rc::new(Site { server_name: l.server_name.clone(), server_port: l.server_port, tls })
        })
        .collect();
    let accepting: Vec<JoinHandle<()>> = listeners
        .iter()
        .zip(&sites)
        .map(|(listener, site)| {
            announce(listener, site.tls);
            let accept = Acceptor::new(listener).map_err(|e| StartupError(format!("{}: {e}", listener.display)))?;
            let accepting = accept_loop(lobby.client.clone(), accept, site.clone(), connections.clone(), cap.clone());
            Ok(tokio::task::spawn_local(accepting))
        })
        .collect::<Result<_, StartupError>>()?;
    idle_cpus::note_at_start();
    lobby.observed.diagnoses.watch_listeners(listeners);
    let diagnosing =
        tokio::task::spawn_local(diagnosis::watch(lobby.observed.clone(), connections.clone(), max_connections));
    let stats_path = stats_listener.as_ref().and_then(|listener| listener.unix_path.clone());
    if let Some(listener) = stats_listener {
        info!("stats at {}/metrics, {0}/status.json and {0}/", listener.display);
        let serving = server::serve(lobby.observed.clone(), listener, max_connections);
        tokio::task::spawn_local(serving);
    }
    Ok(Serving { connections, max_connections, sites, accepting, diagnosing, stats_path })
}

/// A new maitred of a binary upgrade, serving: it names itself in the pid file and takes over
/// the connections of the one it replaces.
fn take_over_from(lobby: &Lobby, predecessor: OwnedFd, pid_file: Option<&Path>, serving: &Serving) {
    // The pid file names this lobby only once it serves: a new maitred that fails to
    // start leaves the running one's pid there.
    if let Some(path) = pid_file {
        if let Err(e) = std::fs::write(path, format!("{}\n", std::process::id())) {
            warning!("cannot write the pid file {}: {e}", path.display());
        }
    }
    let handover = takeover::take_over(
        lobby.client.hibernation.clone(),
        lobby.standing(),
        predecessor,
        serving.sites.clone(),
        serving.connections.clone(),
    );
    tokio::task::spawn_local(handover);
}

/// Tells systemd, and every connection, that the lobby stops; for an upgrade, the new maitred
/// becomes the main process first, and the connections' successor. Returns whether the stop is
/// graceful (requests under way are finished), and the new maitred, for an upgrade.
fn announce_stop(client: &Connections, stop: Stop, shutdown_tx: &watch::Sender<bool>) -> (bool, Option<Rc<Successor>>) {
    let graceful = !matches!(stop, Stop::Immediate);
    let successor = match stop {
        Stop::Upgrade(successor) => {
            // Before the shutdown is announced, so that no connection closes for it.
            notify::main_pid(successor.pid);
            successor.confirm_main();
            let successor = Rc::new(successor);
            client.hand_over_to(successor.clone());
            Some(successor)
        }
        _ => {
            notify::stopping();
            None
        }
    };
    let _ = shutdown_tx.send(true);
    (graceful, successor)
}

/// Ends the accept loops and closes the listeners; without a new maitred to take them, a
/// graceful stop first accepts what waits in their queues, and their socket files go.
async fn stop_accepting(
    lobby: &Lobby,
    serving: &mut Serving,
    listeners: Vec<Listener>,
    graceful: bool,
    handing_over: bool,
) {
    // A drain empties the queue with fewer and fewer workers: nothing to diagnose. And the
    // copies of the listen sockets go, so that they close with the listeners below.
    serving.diagnosing.abort();
    lobby.observed.diagnoses.stop_watching();
    for task in &serving.accepting {
        task.abort();
    }
    for task in &mut serving.accepting {
        // Aborted accept loops give back the connection permit they were holding.
        let _ = task.await;
    }
    if !handing_over {
        if graceful {
            let taken: usize = listeners
                .iter()
                .zip(&serving.sites)
                .map(|(l, site)| accept_backlog(&lobby.client, l, site, &serving.connections))
                .sum();
            if taken > 0 {
                info!("accepted {taken} connections still waiting in the listen queue");
            }
        }
        // The new maitred listens on the same sockets, files included.
        remove_socket_files(listeners.iter().filter_map(|l| l.unix_path.as_ref()).chain(&serving.stats_path));
    }
}

/// Waits for the connections to close, within --graceful-timeout when the stop is graceful,
/// handing idle ones to a new maitred if there is one. Returns whether all closed in time.
async fn drain(
    lobby: &Lobby,
    supervisor: &mut Supervisor,
    events: &mut mpsc::UnboundedReceiver<Event>,
    serving: &Serving,
    graceful: bool,
    successor: Option<Rc<Successor>>,
) -> bool {
    let deadline = if graceful { lobby.config.graceful_timeout } else { Duration::ZERO };
    let in_use = serving.max_connections - serving.connections.available_permits();
    info!(
        "shutting down: no new connections; {in_use} open ({} of them idle long enough to hibernate), {} requests \
         queued; waiting up to {} s",
        lobby.client.hibernation.sleeping(),
        lobby.client.seating.queued(),
        deadline.as_secs_f64()
    );
    let drained = supervisor.drain(events, &serving.connections, serving.max_connections, deadline).await;
    if let Some(successor) = successor {
        info!("handed {} idle connections to the new maitred (pid {})", successor.handed(), successor.pid);
        // Closing the channel tells the new lobby that no more come.
        lobby.client.stop_handing_over();
    }
    drained
}

/// The end of both exits, a boot that failed or stopped and a drain: the workers stopped
/// (killed when `kill`), the zygote's channel closed and the zygote reaped, and the server
/// hooks still queued run.
async fn tear_down(lobby: Lobby, mut supervisor: Supervisor, background: Background, kill: bool) {
    let workers = supervisor.stop_workers(kill).await;
    lobby.worker.seating.clear();
    background.control_reader.abort();
    background.watcher.abort();
    let hooks = supervisor.take_hooks();
    drop(supervisor);
    let zygotes = lobby.worker.zygotes.clone();
    drop(lobby);
    close_control_and_reap(zygotes, &workers).await;
    finish_hooks(hooks);
}

fn remove_socket_files<'a>(paths: impl Iterator<Item = &'a PathBuf>) {
    for path in paths {
        let _ = std::fs::remove_file(path);
    }
}

/// Lets the lobby's hooks still queued run before the lobby returns (the CLI calls on_exit
/// then), for a bounded time.
fn finish_hooks(hooks: Option<HookThread>) {
    if let Some(hooks) = hooks {
        if !hooks.finish(HOOKS_FINISH_WAIT) {
            warning!(
                "the server hooks were still running {} s after the server stopped; not waiting for them",
                HOOKS_FINISH_WAIT.as_secs()
            );
        }
    }
}
