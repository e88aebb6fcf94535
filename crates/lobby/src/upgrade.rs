//! The binary upgrade (SIGUSR2, docs/SIGNALS.md): a new maitred takes over from the running
//! one, and no client notices.
//!
//! | step | old lobby                                         | new lobby                          |
//! |------|---------------------------------------------------|------------------------------------|
//! | 1    | SIGUSR2: starts the command it was started with, passing its listen sockets and one end of a `SOCK_SEQPACKET` pair | |
//! | 2    | serves as before                                  | takes the sockets, starts its workers |
//! | 3    |                                                   | `ready`: it serves                  |
//! | 4    | `MAINPID=` to systemd, then `main`; stops accepting | writes `--pid`, accepts too; `READY=1` after `main` |
//! | 5    | finishes its requests; each idle keep-alive connection goes over the pair with its state | puts each to sleep as its own |
//! | 6    | exits 0 once no connection is left                | serves alone                        |
//!
//! A new maitred that exits, or does not say `ready` within `READY_WITHIN`, is stopped and the
//! old one goes on serving; the log says why.
//!
//! The variable names below are read by the CLI (`maitred.cli`), which checks the sockets and
//! matches them to its `--bind` addresses.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use socket2::SockRef;
use tokio::io::unix::AsyncFd;
use tokio::sync::Semaphore;

use crate::config::BindAddress;
use crate::connection::{Peer, ProxyStage, Site};
use crate::hibernation::{Sleeper, StreamKind};
use crate::log::{debug, info, warning, warning_limited};
use crate::spawn::{self, seqpacket_pair};
use crate::{notify, Lobby};

/// The descriptor of the new lobby's end of the pair.
pub const UPGRADE_CHANNEL_VARIABLE: &str = "MAITRED_UPGRADE_FD";
/// The listen sockets passed, comma-separated descriptor numbers.
pub const UPGRADE_LISTENERS_VARIABLE: &str = "MAITRED_LISTEN_FDS";
/// How long the new maitred may take to start its workers and say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long handing one connection over may block before it is closed instead.
const HANDOVER_SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// The longest message: a connection's state with its server name.
const MAX_MESSAGE: usize = 4096;
const READY: &[u8] = b"ready";
/// The old lobby's answer to `ready`, once it has told systemd (MAINPID=) that the new one is
/// the service's main process: only then may the new one notify (READY=1, STATUS=) itself.
const MAIN: &[u8] = b"main";

/// How this lobby came to be, and how it would start its successor.
pub struct Succession {
    /// The command line this maitred was started with, interpreter first.
    pub command: Vec<String>,
    /// The directory it was started in (before `--chdir`).
    pub directory: PathBuf,
    /// `--pid`, written with the new lobby's pid when it takes over.
    pub pid_file: Option<PathBuf>,
    /// When this lobby is itself an upgrade: its end of the pair with the lobby it replaces,
    pub predecessor: Option<OwnedFd>,
    /// and the listen sockets that lobby passed, each for the --bind address it listens on.
    pub inherited: Vec<(BindAddress, OwnedFd)>,
}

/// Why an upgrade did not happen.
#[derive(Debug)]
pub enum UpgradeError {
    Start(io::Error),
    Exited(std::process::ExitStatus),
    NotReady,
    Channel(io::Error),
}

impl std::fmt::Display for UpgradeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpgradeError::Start(e) => write!(f, "cannot start the new maitred: {e}"),
            UpgradeError::Exited(status) => match (status.code(), status.signal()) {
                (Some(code), _) => write!(f, "the new maitred exited with code {code} before it was ready"),
                (None, Some(signal)) => write!(f, "the new maitred was killed by signal {signal} before it was ready"),
                _ => write!(f, "the new maitred ended before it was ready"),
            },
            UpgradeError::NotReady => {
                write!(f, "the new maitred was not ready within {} s; it was stopped", READY_WITHIN.as_secs())
            }
            UpgradeError::Channel(e) => write!(f, "the channel to the new maitred failed: {e}"),
        }
    }
}

/// A new maitred that has been started and has not yet said it is ready.
pub(crate) struct Candidate {
    child: Child,
    channel: AsyncFd<OwnedFd>,
    started: Instant,
}

impl Candidate {
    /// Starts `succession.command` with the listen sockets `listeners` and its end of a new pair.
    pub(crate) fn start(succession: &Succession, listeners: &[RawFd]) -> Result<Candidate, UpgradeError> {
        let (ours, theirs) = seqpacket_pair().map_err(UpgradeError::Start)?;
        let theirs_raw = theirs.as_raw_fd();
        let mut inherited = listeners.to_vec();
        inherited.push(theirs_raw);
        let listed = listeners.iter().map(|fd| fd.to_string()).collect::<Vec<_>>().join(",");
        let mut command = spawn::command_keeping(&succession.command, inherited).map_err(UpgradeError::Start)?;
        command
            .current_dir(&succession.directory)
            .env(UPGRADE_CHANNEL_VARIABLE, theirs_raw.to_string())
            .env(UPGRADE_LISTENERS_VARIABLE, listed)
            // The watchdog is for whichever process is the service's main one; the new lobby
            // becomes it with MAINPID= (sd_watchdog_enabled(3) then applies it to itself).
            .env_remove("WATCHDOG_PID")
            .stdin(Stdio::null());
        let child = command.spawn().map_err(UpgradeError::Start)?;
        drop(theirs);
        // Reads use MSG_DONTWAIT, so the socket itself may stay blocking.
        let channel = maitred_sys::reactor::register(ours).map_err(UpgradeError::Channel)?;
        Ok(Candidate { child, channel, started: Instant::now() })
    }

    pub(crate) fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Waits until the new maitred says it is ready; then it is the successor. On any failure
    /// the new maitred has been stopped and reaped.
    pub(crate) async fn ready(&mut self) -> Result<(), UpgradeError> {
        let deadline = tokio::time::Instant::from_std(self.started + READY_WITHIN);
        let heard = tokio::time::timeout_at(deadline, receive(&self.channel, &mut VecDeque::new())).await;
        let failure = match heard {
            Ok(Ok(Some(message))) if message == READY => return Ok(()),
            Ok(Ok(Some(message))) => UpgradeError::Channel(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected message {:?}", String::from_utf8_lossy(&message)),
            )),
            Ok(Ok(None)) => match self.exit_status(Duration::from_secs(1)) {
                Some(status) => return Err(UpgradeError::Exited(status)),
                None => UpgradeError::Channel(io::Error::new(io::ErrorKind::UnexpectedEof, "it closed the channel")),
            },
            Ok(Err(e)) => UpgradeError::Channel(e),
            Err(_) => UpgradeError::NotReady,
        };
        self.stop();
        Err(failure)
    }

    /// The exit status, if the process ends within `within`.
    fn exit_status(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + within;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(10)),
                _ => return None,
            }
        }
    }

    /// Stops a new maitred that will not take over: SIGTERM (it stops its workers), then
    /// SIGKILL if it lingers.
    pub(crate) fn stop(&mut self) {
        // Our own child, which has not been reaped.
        let _ = maitred_sys::process::kill(self.pid(), libc::SIGTERM);
        if self.exit_status(Duration::from_secs(10)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// Makes the ready candidate the successor: it owns the listen sockets now too.
    pub(crate) fn into_successor(self) -> Successor {
        let pid = self.pid();
        let channel = self.channel.into_inner();
        // Handing over is rare and each message is small: a blocking send, bounded, is simpler
        // than a queue, and the new lobby reads them as they come.
        let socket = SockRef::from(&channel);
        if let Err(e) =
            socket.set_nonblocking(false).and_then(|()| socket.set_write_timeout(Some(HANDOVER_SEND_TIMEOUT)))
        {
            warning!("the channel to the new maitred: {e}; idle connections may be closed instead of handed over");
        }
        // The child is not waited for: once this lobby exits, it is the service's main process.
        std::mem::forget(self.child);
        Successor { pid, channel, handed: std::cell::Cell::new(0) }
    }
}

/// The new lobby, serving; this one hands it its idle connections as it drains.
pub(crate) struct Successor {
    pub(crate) pid: i32,
    channel: OwnedFd,
    handed: std::cell::Cell<u64>,
}

impl Successor {
    /// Sends an idle connection, with what the new lobby needs to serve it as this one would.
    /// If it cannot be sent, it is closed, as a shutdown would. So is a connection under
    /// `--proxy-protocol`: the client its header named does not travel with the descriptor, and
    /// the new lobby would take the next request's first bytes for a header (the proxy opens a
    /// new connection, with its header).
    pub(crate) fn hand_over(&self, sleeper: Sleeper) {
        if sleeper.peer.proxy != ProxyStage::Off {
            debug!(
                "closing an idle PROXY protocol connection from {} instead of handing it over",
                sleeper.peer.display()
            );
            return;
        }
        let kind = match sleeper.kind {
            StreamKind::Tcp => "tcp",
            StreamKind::Unix => "unix",
        };
        let patience = sleeper.deadline.saturating_duration_since(Instant::now()).as_millis();
        let message =
            format!("{kind} {} {patience} {} {}", sleeper.answered, sleeper.site.server_port, sleeper.site.server_name);
        let sent = maitred_sys::fdpass::send_with_fd(
            self.channel.as_raw_fd(),
            &[IoSlice::new(message.as_bytes())],
            sleeper.socket.as_raw_fd(),
            0,
        );
        match sent {
            Ok(_) => self.handed.set(self.handed.get() + 1),
            Err(e) => {
                warning_limited!(
                    "closing an idle connection from {} instead of handing it over: {e}",
                    sleeper.peer.display()
                )
            }
        }
        // This lobby's copy of the socket closes here, and the connection's place with it.
    }

    /// Tells the new lobby that it is the service's main process now.
    pub(crate) fn confirm_main(&self) {
        if let Err(e) = maitred_sys::fdpass::send(self.channel.as_raw_fd(), &[IoSlice::new(MAIN)], 0) {
            warning!("cannot tell the new maitred that it is the main process: {e}");
        }
    }

    pub(crate) fn handed(&self) -> u64 {
        self.handed.get()
    }
}

/// In a new lobby: tells the lobby it replaces that it serves, and takes the idle connections
/// that lobby hands over until it closes the channel. Each is put to sleep here, with its
/// place under --max-connections; one that finds no place is closed.
pub(crate) async fn take_over(
    lobby: Rc<Lobby>,
    predecessor: OwnedFd,
    sites: Vec<Rc<Site>>,
    connections: Arc<Semaphore>,
) {
    if let Err(e) = maitred_sys::fdpass::send(predecessor.as_raw_fd(), &[IoSlice::new(READY)], 0) {
        warning!("cannot tell the maitred being replaced that this one is ready: {e}");
        return;
    }
    let channel = match maitred_sys::reactor::register(predecessor) {
        Ok(channel) => channel,
        Err(e) => {
            warning!("cannot take connections from the maitred being replaced: {e}");
            return;
        }
    };
    let mut fds = VecDeque::new();
    let mut taken = 0u64;
    loop {
        let message = match receive(&channel, &mut fds).await {
            Ok(Some(message)) => message,
            Ok(None) => break,
            Err(e) => {
                warning!("taking connections from the maitred being replaced failed: {e}");
                break;
            }
        };
        if message == MAIN {
            notify::watch(&lobby);
            notify::ready();
            continue;
        }
        let Some(socket) = fds.pop_front() else {
            warning_limited!("the maitred being replaced sent a connection without its socket");
            continue;
        };
        match adopt(&lobby, socket, &message, &sites, &connections) {
            Ok(()) => taken += 1,
            Err(why) => warning_limited!("closing a connection handed over by the maitred being replaced: {why}"),
        }
    }
    info!("took over {taken} idle connections from the maitred it replaced");
}

/// Puts one handed-over connection to sleep in this lobby.
fn adopt(
    lobby: &Lobby,
    socket: OwnedFd,
    message: &[u8],
    sites: &[Rc<Site>],
    connections: &Arc<Semaphore>,
) -> Result<(), String> {
    let text = std::str::from_utf8(message).map_err(|_| "its state is not text".to_string())?;
    let mut fields = text.splitn(5, ' ');
    let mut next = |what: &str| fields.next().ok_or_else(|| format!("its state has no {what}: {text:?}"));
    let kind = match next("kind")? {
        "tcp" => StreamKind::Tcp,
        "unix" => StreamKind::Unix,
        other => return Err(format!("unknown kind {other:?}")),
    };
    let number = |field: &str, what: &str| field.parse::<u64>().map_err(|_| format!("bad {what} {field:?}"));
    let answered = number(next("count")?, "count")?;
    let patience = Duration::from_millis(number(next("patience")?, "patience")?);
    let port = u16::try_from(number(next("port")?, "port")?).map_err(|_| "bad port".to_string())?;
    let name = next("server name")?;
    let permit = connections.clone().try_acquire_owned().map_err(|_| "no place under --max-connections".to_string())?;
    // A connection that began with a PROXY header is never handed over (`hand_over`).
    let peer = Peer::new(SockRef::from(&socket).peer_addr().ok().and_then(|addr| addr.as_socket()), false);
    let site = sites
        .iter()
        .find(|site| site.server_port == port && site.server_name == name)
        .cloned()
        .unwrap_or_else(|| Rc::new(Site { server_name: name.to_string(), server_port: port }));
    lobby.hibernation.put(Sleeper { socket, kind, peer, site, permit, answered, deadline: Instant::now() + patience });
    Ok(())
}

/// The next message on the pair, and the descriptors that came with it; None at its end.
async fn receive(channel: &AsyncFd<OwnedFd>, fds: &mut VecDeque<OwnedFd>) -> io::Result<Option<Vec<u8>>> {
    let mut buf = BytesMut::with_capacity(MAX_MESSAGE);
    loop {
        let mut ready = channel.readable().await?;
        match ready.try_io(|inner| {
            maitred_sys::fdpass::recv_into(inner.as_raw_fd(), &mut buf, fds, libc::MSG_DONTWAIT)
                .map_err(io::Error::from)
        }) {
            Ok(Ok(0)) => return Ok(None),
            Ok(Ok(_)) => return Ok(Some(buf.to_vec())),
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}
